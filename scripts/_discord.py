"""A fake Discord (REST v10 and the Gateway v10), real HTTP and WebSocket on 127.0.0.1, for the
Discord bridge's tests.

It speaks the API as Discord's developer docs describe it. REST under ``/api/v10``
(``Authorization: Bot TOKEN``): ``GET /users/@me``, ``/gateway``, ``/gateway/bot``,
``/channels/ID``; ``POST /channels/ID/messages`` (2000 characters at most, ``nonce`` with
``enforce_nonce`` returns the first message made with it, ``allowed_mentions`` kept as sent),
``PATCH`` of a message (fields left out stay), ``PUT`` of a reaction, and the interaction
callback (only within 3 s of the press, only once). Every answer carries the ``X-RateLimit-*``
headers of its bucket; a bucket past its limit answers ``429`` with ``retry_after`` (a fault
makes a global one). The Gateway (on the same port, ``?v=10&encoding=json``, optionally
``compress=zlib-stream``): Hello (op 10), Identify (op 2, its intents applied: no
MESSAGE_CONTENT, no content), Heartbeat / ACK (op 1 / 11), READY with a ``session_id`` and a
``resume_gateway_url``, Resume (op 6: the events after its ``seq`` again, then RESUMED, or
op 9), Reconnect (op 7), close codes. ``tests/test_bridge_discord.py`` checks all of it against
discord.py, a client no one here wrote.

One server (threads) serves a test module; each test has a bot of its own (a token). The human
side: :meth:`FakeBot.say`, :meth:`FakeBot.press`, :meth:`FakeBot.react`; faults:
:meth:`FakeBot.fail`, :meth:`FakeBot.reconnect`, :meth:`FakeBot.drop`.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import socket
import socketserver
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Ping, Request, TextMessage

GUILDS, GUILD_MESSAGES, GUILD_REACTIONS, DMS, DM_REACTIONS, MESSAGE_CONTENT = (
    1 << 0, 1 << 9, 1 << 10, 1 << 12, 1 << 13, 1 << 15)
HEARTBEAT_MS = 41250
_ids = itertools.count(1_100_000_000_000_000_001)


def snowflake() -> str:
    return str(next(_ids))


class ApiError(Exception):
    def __init__(self, status: int, code: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.body = status, {"code": code, "message": message, **extra}


@dataclass
class Fault:
    route: str  # "POST /channels/#/messages", "gateway"
    kind: str  # "429" | "global" | "500"
    retry_after: float = 1.0
    skip: int = 0


@dataclass
class GatewaySession:
    session_id: str
    intents: int
    seq: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    conn: _Gateway | None = None


@dataclass
class FakeBot:
    server: FakeDiscord
    token: str
    user: dict[str, Any]
    guild: str = field(default_factory=snowflake)
    channels: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, Any, float]] = field(default_factory=list)
    """(method, path, body, time) of every REST request."""
    faults: list[Fault] = field(default_factory=list)
    faulted: list[tuple[str, str, float]] = field(default_factory=list)
    sessions: dict[str, GatewaySession] = field(default_factory=dict)
    current: GatewaySession | None = None
    gateway_log: list[tuple[str, Any]] = field(default_factory=list)
    """What the bot's Gateway connections said: ("identify", d), ("resume", d), ("heartbeat", d), ("close", code)."""
    interactions: dict[str, tuple[str, float]] = field(default_factory=dict)
    answered: dict[str, tuple[Any, float]] = field(default_factory=dict)
    limit: tuple[int, float] = (50, 1.0)
    """(requests, seconds) of each message bucket (per channel)."""
    windows: dict[str, list[float]] = field(default_factory=dict)
    nonces: dict[str, str] = field(default_factory=dict)
    ack: bool = True
    lock: threading.RLock = field(default_factory=threading.RLock)

    # ------------------------------------------------------------ the human side

    def channel(self, kind: int = 0) -> str:
        """A new channel (0: a guild text channel, 1: a DM) the bot can see."""
        cid = snowflake()
        self.channels[cid] = {"id": cid, "type": kind, "name": f"c{cid[-4:]}", "position": 0,
                              "permission_overwrites": [], "nsfw": False, "parent_id": None,
                              **({"guild_id": self.guild} if kind == 0 else {"recipients": []})}
        return cid

    def _member(self, user: dict[str, Any]) -> dict[str, Any]:
        return {"user": user, "roles": [], "joined_at": "2026-01-01T00:00:00+00:00", "deaf": False, "mute": False,
                "flags": 0}

    def _new_message(self, channel: str, author: dict[str, Any], content: str, **extra: Any) -> dict[str, Any]:
        mentions = [{"id": m, "username": m, "discriminator": "0"} for m in re.findall(r"<@!?(\d+)>", content)]
        message = {"id": snowflake(), "channel_id": channel, "author": author, "content": content,
                   "timestamp": "2026-01-01T00:00:00+00:00", "edited_timestamp": None, "tts": False,
                   "mention_everyone": False, "mentions": mentions, "mention_roles": [], "attachments": [],
                   "embeds": [], "pinned": False, "type": 0, "flags": 0, "components": [], **extra}
        if "guild_id" in self.channels.get(channel, {}):
            message["guild_id"] = self.guild
        self.messages[message["id"]] = message
        return message

    def say(self, channel: str, user: dict[str, Any], content: str, **extra: Any) -> dict[str, Any]:
        """``user`` writes ``content`` in ``channel``: MESSAGE_CREATE."""
        with self.lock:
            message = self._new_message(channel, user, content, **extra)
            event = dict(message)
            if "guild_id" in message:
                event["member"] = {k: v for k, v in self._member(user).items() if k != "user"}
            self.dispatch("MESSAGE_CREATE", event)
            return message

    def press(self, channel: str, user: dict[str, Any], message_id: str, custom_id: str) -> str:
        """``user`` presses a button: INTERACTION_CREATE (type 3); returns the interaction's id."""
        with self.lock:
            iid, token = snowflake(), f"itoken{snowflake()}"
            self.interactions[iid] = (token, time.monotonic())
            interaction: dict[str, Any] = {
                "id": iid, "application_id": self.user["id"], "type": 3, "token": token, "version": 1,
                "channel_id": channel, "channel": self.channels.get(channel, {"id": channel, "type": 0}),
                "message": self.messages[message_id], "data": {"custom_id": custom_id, "component_type": 2},
                "app_permissions": "0", "locale": "en-US", "entitlements": [], "authorizing_integration_owners": {},
                "attachment_size_limit": 8388608,
            }
            if "guild_id" in self.channels.get(channel, {}):
                interaction["guild_id"], interaction["member"] = self.guild, {**self._member(user), "permissions": "0"}
                interaction["guild_locale"] = "en-US"
            else:
                interaction["user"] = user
            self.dispatch("INTERACTION_CREATE", interaction)
            return iid

    def react(self, channel: str, user: dict[str, Any], message_id: str, emoji: str) -> None:
        with self.lock:
            event: dict[str, Any] = {"user_id": user["id"], "channel_id": channel, "message_id": message_id,
                                     "emoji": {"id": None, "name": emoji}, "burst": False, "type": 0}
            if "guild_id" in self.channels.get(channel, {}):
                event["guild_id"], event["member"] = self.guild, self._member(user)
            self.dispatch("MESSAGE_REACTION_ADD", event)

    def sent(self, channel: str) -> list[dict[str, Any]]:
        """The bot's messages in ``channel``, as they stand, oldest first."""
        with self.lock:
            return [dict(m) for m in self.messages.values()
                    if m["channel_id"] == channel and m["author"]["id"] == self.user["id"]]

    def fail(self, route: str, kind: str, retry_after: float = 1.0, skip: int = 0) -> None:
        self.faults.append(Fault(route, kind, retry_after, skip))

    def expire(self) -> None:
        """Every session of the bot ends (Discord keeps one resumable for a short while only)."""
        with self.lock:
            self.sessions.clear()
            self.current = None

    def reconnect(self) -> None:
        """The Gateway asks the connected client to reconnect (op 7)."""
        conn = self.current.conn if self.current else None
        if conn is not None:
            conn.send({"op": 7, "d": None})

    def drop(self, code: int | None = None) -> None:
        """The Gateway closes the connection (``code``), or drops it with no close frame (None)."""
        conn = self.current.conn if self.current else None
        if conn is not None:
            conn.close(code)

    # ------------------------------------------------------------ the Gateway

    def dispatch(self, kind: str, data: dict[str, Any]) -> None:
        session = self.current
        if session is None:
            return
        intents = session.intents
        if kind == "MESSAGE_CREATE":
            dm = "guild_id" not in data
            if not intents & (DMS if dm else GUILD_MESSAGES):
                return
            if not intents & MESSAGE_CONTENT and not dm and self.user["id"] not in [m["id"] for m in data["mentions"]]:
                data = {**data, "content": "", "embeds": [], "attachments": [], "components": []}
        reactions = DM_REACTIONS if "guild_id" not in data else GUILD_REACTIONS
        if kind == "MESSAGE_REACTION_ADD" and not intents & reactions:
            return
        session.seq += 1
        payload = {"op": 0, "t": kind, "s": session.seq, "d": data}
        session.events.append(payload)
        if session.conn is not None:
            session.conn.send(payload)

    def gateway_payload(self, conn: _Gateway, payload: dict[str, Any]) -> None:
        op, data = payload.get("op"), payload.get("d")
        data = data if isinstance(data, dict) else {"seq": data}
        with self.lock:
            if op == 1:
                self.gateway_log.append(("heartbeat", data["seq"]))
                if self.ack:
                    conn.send({"op": 11})
            elif op == 2:
                self.gateway_log.append(("identify", data))
                if data.get("token") != self.token:
                    conn.close(4004)
                    return
                if data.get("intents", 0) & ~((1 << 26) - 1):
                    conn.close(4013)
                    return
                session = GatewaySession(f"s{snowflake()}", int(data.get("intents", 0)), conn=conn)
                if self.current is not None and self.current.conn is conn:
                    self.current.conn = None
                self.sessions[session.session_id], self.current, conn.session = session, session, session
                session.seq += 1
                ready = {"v": 10, "user": self.user, "guilds": [], "session_id": session.session_id,
                         "resume_gateway_url": self.server.gateway, "private_channels": [], "relationships": [],
                         "application": {"id": self.user["id"], "flags": 0}, "session_type": "normal",
                         "auth_session_id_hash": "x", "geo_ordered_rtc_regions": []}
                payload = {"op": 0, "t": "READY", "s": session.seq, "d": ready}
                session.events.append(payload)
                conn.send(payload)
            elif op == 6:
                self.gateway_log.append(("resume", data))
                found = self.sessions.get(str(data.get("session_id")))
                if data.get("token") != self.token:
                    conn.close(4004)
                    return
                if found is None or not isinstance(data.get("seq"), int) or data["seq"] > found.seq:
                    conn.send({"op": 9, "d": False})
                    return
                session = found
                if session.conn is not None and session.conn is not conn:
                    session.conn.close(None)
                session.conn, conn.session, self.current = conn, session, session
                for event in session.events:
                    if event["s"] > data["seq"]:
                        conn.send(event)
                session.seq += 1
                resumed = {"op": 0, "t": "RESUMED", "s": session.seq, "d": {}}
                session.events.append(resumed)
                conn.send(resumed)

    # ------------------------------------------------------------ REST

    def _bucket(self, method: str, path: str) -> tuple[str, str] | None:
        match = re.match(r"/channels/(\d+)/messages", path)
        if match and method in ("POST", "PATCH"):
            return "b-messages", match.group(1)
        match = re.match(r"/channels/(\d+)", path)
        if match:
            return f"b-{method.lower()}-channel", match.group(1)
        return None

    def rest(self, method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        with self.lock:
            now = time.monotonic()
            self.calls.append((method, path, body, now))
            route = f"{method} {re.sub(r'/[0-9]{5,}', '/#', path)}"
            extra: dict[str, str] = {}
            for fault in self.faults:
                if fault.route == route:
                    if fault.skip:
                        fault.skip -= 1
                        break
                    self.faults.remove(fault)
                    self.faulted.append((route, fault.kind, now))
                    if fault.kind == "500":
                        return 500, {"code": 0, "message": "500: Internal Server Error"}, {}
                    is_global = fault.kind == "global"
                    return 429, {"message": "You are being rate limited.", "retry_after": fault.retry_after,
                                 "global": is_global}, {
                        "Retry-After": str(math.ceil(fault.retry_after)),
                        "X-RateLimit-Scope": "global" if is_global else "user",
                        **({"X-RateLimit-Global": "true"} if is_global else {})}
            bucket = self._bucket(method, path)
            if bucket is not None:
                count, period = self.limit if bucket[0] == "b-messages" else (50, 1.0)
                window = [t for t in self.windows.get(":".join(bucket), []) if t > now - period]
                reset_after = (window[0] + period - now) if window else period
                if len(window) >= count:
                    self.faulted.append((route, "bucket", now))
                    return 429, {"message": "You are being rate limited.", "retry_after": round(reset_after, 3),
                                 "global": False}, {
                        "Retry-After": str(math.ceil(reset_after)), "X-RateLimit-Scope": "user",
                        **_limit_headers(bucket[0], count, 0, reset_after)}
                window.append(now)
                self.windows[":".join(bucket)] = window
                extra = _limit_headers(bucket[0], count, count - len(window), window[0] + period - now)
            if headers.get("authorization") != f"Bot {self.token}" and not path.startswith("/interactions/"):
                return 401, {"message": "401: Unauthorized", "code": 0}, extra
            try:
                status, answer = self._route(method, path, body, now, parse_qs(headers.get(":query", "")))
            except ApiError as exc:
                return exc.status, exc.body, extra
            return status, answer, extra

    def _route(self, method: str, path: str, body: Any, now: float, query: dict[str, list[str]]) -> tuple[int, Any]:
        if (method, path) == ("GET", "/users/@me"):
            return 200, self.user
        if (method, path) == ("GET", "/oauth2/applications/@me"):
            return 200, {"id": self.user["id"], "name": self.user["username"], "icon": None, "description": "",
                         "bot_public": False, "bot_require_code_grant": False, "verify_key": "0" * 64,
                         "owner": {"id": snowflake(), "username": "owner", "discriminator": "0", "avatar": None,
                                   "global_name": None}, "team": None, "flags": 1 << 19, "summary": "",
                         "rpc_origins": [], "bot": self.user}
        if (method, path) == ("GET", "/gateway"):
            return 200, {"url": self.server.gateway}
        if (method, path) == ("GET", "/gateway/bot"):
            return 200, {"url": self.server.gateway, "shards": 1,
                         "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0,
                                                 "max_concurrency": 1}}
        match = re.fullmatch(r"/channels/(\d+)(/messages(?:/(\d+))?(?:/reactions/([^/]+)/@me)?)?", path)
        if match:
            channel, messages, message_id, emoji = match.groups()
            if channel not in self.channels:
                raise ApiError(404, 10003, "Unknown Channel")
            if not messages and method == "GET":
                return 200, self.channels[channel]
            if message_id is None and method == "POST":
                return 200, self._post(channel, body)
            if message_id is None and method == "GET":  # (newest first, as Discord lists them)
                after, limit = int(query.get("after", ["0"])[0]), int(query.get("limit", ["50"])[0])
                found_ = [m for m in self.messages.values() if m["channel_id"] == channel and int(m["id"]) > after]
                return 200, sorted(found_, key=lambda m: int(m["id"]))[:limit][::-1]
            found = self.messages.get(message_id or "")
            if found is None or found["channel_id"] != channel:
                raise ApiError(404, 10008, "Unknown Message")
            if emoji is not None and method == "PUT":
                found.setdefault("reactions", []).append({"emoji": {"id": None, "name": unquote(emoji)}, "me": True})
                return 204, None
            if method == "PATCH" and emoji is None:
                if found["author"]["id"] != self.user["id"]:
                    raise ApiError(403, 50005, "Cannot edit a message authored by another user")
                if "content" in body:
                    _check_content(body["content"])
                    found["content"] = body["content"]
                    found["mentions"] = []
                for key in ("components", "allowed_mentions", "flags"):
                    if key in body:
                        found[key] = body[key]
                found["edited_timestamp"] = "2026-01-01T00:00:01+00:00"
                return 200, dict(found)
        match = re.fullmatch(r"/interactions/(\d+)/([^/]+)/callback", path)
        if match and method == "POST":
            iid, token = match.groups()
            known = self.interactions.get(iid)
            if known is None or known[0] != token or now - known[1] > 3.0:
                raise ApiError(404, 10062, "Unknown interaction")
            if iid in self.answered:
                raise ApiError(400, 40060, "Interaction has already been acknowledged.")
            if not isinstance(body, dict) or body.get("type") not in (4, 5, 6, 7, 9):
                raise ApiError(400, 50035, "Invalid Form Body")
            self.answered[iid] = (body, now)
            if query.get("with_response", [""])[0] in ("true", "1"):
                return 200, {"interaction": {"id": iid, "type": 3, "response_message_loading": False,
                                             "response_message_ephemeral": False}}
            return 204, None
        raise ApiError(404, 0, "404: Not Found")

    def _post(self, channel: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, 50035, "Invalid Form Body")
        content = body.get("content", "")
        _check_content(content)
        nonce = body.get("nonce")
        if nonce is not None and len(str(nonce)) > 25:
            raise ApiError(400, 50035, "Invalid Form Body",
                           errors={"nonce": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH"}]}})
        if body.get("enforce_nonce") and nonce is not None and f"{channel}:{nonce}" in self.nonces:
            return dict(self.messages[self.nonces[f"{channel}:{nonce}"]])
        extra = {k: body[k] for k in ("components", "allowed_mentions", "flags", "nonce") if k in body}
        reference = body.get("message_reference")
        if isinstance(reference, dict):
            extra["message_reference"] = {"message_id": reference.get("message_id"), "channel_id": channel}
            extra["type"] = 19
        message = self._new_message(channel, self.user, content, **extra)
        if nonce is not None:
            self.nonces[f"{channel}:{nonce}"] = message["id"]
        return dict(message)


def _check_content(content: Any) -> None:
    if not isinstance(content, str) or len(content.encode("utf-16-le")) // 2 > 2000:
        raise ApiError(400, 50035, "Invalid Form Body",
                       errors={"content": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                                                        "message": "Must be 2000 or fewer in length."}]}})


def _limit_headers(bucket: str, limit: int, remaining: int, reset_after: float) -> dict[str, str]:
    return {"X-RateLimit-Limit": str(limit), "X-RateLimit-Remaining": str(max(remaining, 0)),
            "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}", "X-RateLimit-Reset-After": f"{reset_after:.3f}",
            "X-RateLimit-Bucket": bucket}


class _Gateway:
    """One Gateway connection (a thread reads it; sends come from any thread)."""

    def __init__(self, sock: socket.socket, ws: WSConnection, bot_of: Any, compress: bool) -> None:
        self.sock, self.ws, self.bot_of = sock, ws, bot_of
        self.lock = threading.Lock()
        self.zlib = zlib.compressobj() if compress else None
        self.closed = False
        self.session: GatewaySession | None = None
        self.bot: FakeBot | None = None
        self.heartbeat_ms = HEARTBEAT_MS

    def send(self, payload: dict[str, Any]) -> None:
        from wsproto.events import BytesMessage

        with self.lock:
            if self.closed:
                return
            text = json.dumps(payload)
            if self.zlib is not None:
                data = self.zlib.compress(text.encode()) + self.zlib.flush(zlib.Z_SYNC_FLUSH)
                out = self.ws.send(BytesMessage(data))
            else:
                out = self.ws.send(TextMessage(text))
            try:
                self.sock.sendall(out)
            except OSError:
                self.closed = True

    def close(self, code: int | None) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if self.bot is not None:
                self.bot.gateway_log.append(("close", code))
            try:
                if code is not None:
                    self.sock.sendall(self.ws.send(CloseConnection(code=code)))
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.session is not None and self.session.conn is self:
            self.session.conn = None

    def serve(self) -> None:
        self.send({"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}})
        text: list[str] = []
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, TextMessage):
                    text.append(event.data)
                    if not event.message_finished:
                        continue
                    payload, text = json.loads("".join(text)), []
                    if self.bot is None and payload.get("op") in (2, 6):
                        self.bot = self.bot_of(str((payload.get("d") or {}).get("token")))
                        if self.bot is None:
                            self.close(4004)
                            return
                    if self.bot is not None:
                        self.bot.gateway_payload(self, payload)
                elif isinstance(event, Ping):
                    with self.lock:
                        self.sock.sendall(self.ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    if self.bot is not None:
                        self.bot.gateway_log.append(("client-close", event.code))
                    with self.lock:
                        try:
                            self.sock.sendall(self.ws.send(event.response()))
                        except Exception:  # noqa: BLE001
                            pass
                        self.closed = True
        if self.session is not None and self.session.conn is self:
            self.session.conn = None
        self.closed = True


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                data = sock.recv(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            if headers.get("upgrade", "").lower() == "websocket":
                self._websocket(sock, head + b"\r\n\r\n" + buffer, target)
                return
            length = int(headers.get("content-length", "0"))
            while len(buffer) < length:
                data = sock.recv(65536)
                if not data:
                    return
                buffer += data
            raw, buffer = buffer[:length], buffer[length:]
            status, answer, extra = self.server.fake.rest(method, target, raw, headers)
            payload = b"" if answer is None else json.dumps(answer).encode()
            reason = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
                      404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}[status]
            # (Discord answers through Google's front end, and says so: discord.py reads a 429 without
            # Via as Cloudflare's ban, not Discord's rate limit)
            out = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(payload)}", "Connection: keep-alive",
                   "Via: 1.1 google"]
            if answer is not None:
                out.append("Content-Type: application/json")
            out += [f"{k}: {v}" for k, v in extra.items()]
            sock.sendall(("\r\n".join(out) + "\r\n\r\n").encode() + payload)

    def _websocket(self, sock: socket.socket, data: bytes, target: str) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        ws.receive_data(data)
        request = next(e for e in ws.events() if isinstance(e, Request))
        query = parse_qs(urlsplit(request.target).query)
        if query.get("v") != ["10"] or query.get("encoding") != ["json"]:
            sock.sendall(ws.send(AcceptConnection()) + ws.send(CloseConnection(code=4012)))
            return
        sock.sendall(ws.send(AcceptConnection()))
        compress = query.get("compress") == ["zlib-stream"]
        conn = _Gateway(sock, ws, self.server.fake.bots.get, compress)
        conn.heartbeat_ms = self.server.fake.heartbeat_ms
        self.server.fake.connections.append(conn)
        conn.serve()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeDiscord


class FakeDiscord:
    """The server: REST at :attr:`url`, the Gateway at :attr:`gateway`."""

    def __init__(self) -> None:
        self.bots: dict[str, FakeBot] = {}
        self.connections: list[_Gateway] = []
        self.heartbeat_ms = HEARTBEAT_MS
        """What the next connections' Hello says."""
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/api/v10"
        self.gateway = f"ws://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-discord", daemon=True)
        self._thread.start()

    def bot(self) -> FakeBot:
        uid = snowflake()
        bot = FakeBot(self, f"MTE{uid}.fake.{snowflake()}",
                      {"id": uid, "username": f"corral{uid[-4:]}", "discriminator": "0", "global_name": None,
                       "avatar": None, "bot": True, "flags": 0})
        self.bots[bot.token] = bot
        return bot

    def rest(self, method: str, target: str, raw: bytes, headers: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        path = urlsplit(target).path
        if not path.startswith("/api/v10/"):
            return 404, {"message": "404: Not Found", "code": 0}, {}
        token = headers.get("authorization", "").removeprefix("Bot ")
        bot = self.bots.get(token)
        match = re.match(r"/api/v10/interactions/(\d+)/", path)
        if match:  # (the callback needs no token: the interaction's own is in its path)
            bot = next((b for b in self.bots.values() if match.group(1) in b.interactions), None)
        if bot is None:
            return 401, {"message": "401: Unauthorized", "code": 0}, {}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return 400, {"message": "400: Bad Request", "code": 50109}, {}
        headers = {**headers, ":query": urlsplit(target).query}
        return bot.rest(method, path.removeprefix("/api/v10"), body, headers)

    def close(self) -> None:
        for conn in self.connections:
            conn.close(None)
        self._server.shutdown()
        self._server.server_close()
