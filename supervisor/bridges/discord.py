"""Discord: a small client of the Gateway (v10, a WebSocket over wsproto on Trio's own streams)
and of the REST API (v10, over httpx, which runs on Trio).

Why not discord.py: it is an asyncio framework and corral is Trio, and the bridge needs one
Gateway connection and six REST routes. The tests check their fake Discord server against
discord.py, so the fake speaks the API as Discord's most used client library reads it.

* **The Gateway**: ``Hello`` (op 10) gives the heartbeat interval; the first heartbeat goes
  after ``interval * jitter``, the next each interval, each with the last sequence number; a
  heartbeat whose ``ACK`` (op 11) has not come by the next one means a zombie connection:
  closed (not with 1000, which would end the session) and resumed. A heartbeat the server
  asks for (op 1) goes at once. ``Identify`` (op 2) names the intents the bridge needs
  (:data:`INTENTS`, MESSAGE_CONTENT among them: a privileged intent, enabled in the Developer
  Portal); a session's ``session_id``, last ``seq`` and ``resume_gateway_url`` are the bridge's
  cursor, so a dropped socket, a ``Reconnect`` (op 7), a zombie and a restart of the bridge
  all ``Resume`` (op 6) at the resume URL and get what was missed. ``Invalid Session`` (op 9)
  waits 1 to 5 s (Discord's advice) and resumes (``d: true``) or identifies anew; a new session
  of a bridge that had read messages before (the cursor keeps the newest message id) reads
  back, by REST, what the bridged channels got after it (a restart after Discord stopped
  keeping the session). Close codes:
  :func:`after_close` says which end the bridge (a refused token, disallowed intents), which
  start a new session (4007, 4009) and which resume. The Gateway is read by one task with no
  nursery: the heartbeat's deadline bounds each read (a generator must not yield inside a
  cancel scope), so a heartbeat due while the runner handles a batch goes as soon as it asks
  for the next one.
* **Origins**: a message is ``CHANNEL:MESSAGE_ID`` (what a button press or a reaction names),
  a press ``iINTERACTION_ID``, a reaction ``rCHANNEL:MESSAGE:USER:EMOJI``: each runs once across
  a resume (which replays events) and a restart.
* **Stop**: ``!stop``, 🛑 as a reaction, and the **Stop button** (a component on the running
  turn's status message; its press, an interaction, is answered as it is read with a deferred
  update, type 6, well inside Discord's 3 s, whoever pressed). A channel shows one Stop button:
  taken off when a newer one is posted, when the turn's saved answer is, or when a stop's or
  interrupt's notice is. ``!new``, ``!interrupt TEXT``, ``!steer TEXT`` are the core's. A
  message a stop dropped is named back with a **🔁 Send again** button.
* **Text is plain**: every post and edit sends ``allowed_mentions: {"parse": []}`` (nobody
  is notified, whatever the text says) and ``@everyone``, ``@here``, ``<@id>`` and ``<@&role>``
  get a zero-width space so they do not even render as mentions; link embeds are suppressed.
  Long text is split into messages of 2000 characters (Discord's limit, counted here in UTF-16
  units as Discord's clients count); an edit shows the first 2000 and a final edit posts the
  rest after it. Posts carry a ``nonce`` with ``enforce_nonce``, so a post retried after a lost
  answer is shown once (Discord returns the first).
* **Rates**: Discord's per-route buckets, as its ``X-RateLimit-*`` headers describe them (a
  bucket with nothing left waits for its reset before the next request), the 50 requests a
  second global limit, and a ``429``'s ``retry_after`` (its bucket, or everything for a global
  one) waited and the request made again.
* **The token** is read from ``token_file`` (hidden from every turn by the sandbox); it goes in
  the ``Authorization`` header and the ``Identify`` payload, never in a URL.

Errors: a connection failure, a timeout, a 5xx and a 429 past its retries are
:class:`.platform.Transient`; any other error (400, 401, 403, 404) is :class:`.platform.Refused`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError

from .core import (
    ENDINGS,
    RESEND_REACTION,
    STOP_REACTION,
    Edit,
    Inbound,
    Post,
    React,
    Reacted,
    Said,
    Unreadable,
    safe,
    split_by,
    utf16_units,
)
from .kinds import DISCORD_API
from .platform import Batch, Refused, Transient

if TYPE_CHECKING:
    from ..config.settings import BridgeConfig

log = logging.getLogger("corral.bridges.discord")

#: Discord's limit on one message's content.
MAX_TEXT = 2000
#: The Gateway intents the bridge identifies with: GUILDS, GUILD_MESSAGES,
#: GUILD_MESSAGE_REACTIONS, DIRECT_MESSAGES, DIRECT_MESSAGE_REACTIONS, MESSAGE_CONTENT
#: (privileged: enabled in the Developer Portal, else the Gateway closes with 4014).
#: Interactions (button presses) need none.
INTENTS = (1 << 0) | (1 << 9) | (1 << 10) | (1 << 12) | (1 << 13) | (1 << 15)
GATEWAY_QUERY = "v=10&encoding=json"
#: The Stop button's and the Send-again button's ``custom_id``.
STOP_ID = "corral:stop"
RESEND_ID = "corral:resend"
STOP_ROW = [{"type": 1, "components": [{"type": 2, "style": 4, "label": "Stop", "emoji": {"name": STOP_REACTION},
                                        "custom_id": STOP_ID}]}]
RESEND_ROW = [{"type": 1, "components": [{"type": 2, "style": 2, "label": "Send again",
                                          "emoji": {"name": RESEND_REACTION}, "custom_id": RESEND_ID}]}]
_RESEND_HINT = f"React {RESEND_REACTION} to send it again."
#: Nobody is notified by what the bridge posts, whatever its text says.
NO_MENTIONS = {"parse": [], "replied_user": False}
#: Message flags: SUPPRESS_EMBEDS (a link an agent writes does not unfurl).
FLAGS = 1 << 2
#: The notices that end a turn: the channel's Stop button goes with them.
#: Discord's global limit: requests a second from one bot.
GLOBAL_RATE = 50
#: How often one request is made again after a 429 before it is a Transient for the runner.
RETRIES_429 = 5
#: A new session reads back what was said while the bridge was away: at most this many pages
#: of 100 messages a channel.
CATCH_UP_PAGES = 10
#: Invalid Session (op 9): Discord asks for a random wait of 1 to 5 s before the next try.
INVALID_SESSION_WAIT = (1.0, 5.0)
_ZWSP = "\u200b"
_MESSAGE_TYPES = (0, 19)  # (DEFAULT and REPLY: the rest are system messages — joins, pins, boosts)


def neutral(text: str) -> str:
    """``text`` with ``@everyone``, ``@here``, user (``<@id>``, ``<@!id>``) and role (``<@&id>``)
    mentions broken by a zero-width space: ``allowed_mentions`` already keeps them from
    notifying anyone; this keeps them from rendering as mentions too."""
    text = re.sub(r"@(everyone|here)\b", "@" + _ZWSP + r"\1", text)
    return re.sub(r"<@([!&]?\d+)>", "<@" + _ZWSP + r"\1>", text)


# ------------------------------------------------------------------ the session (pure)


@dataclass(slots=True)
class Session:
    """What a Gateway session is resumed with, and the newest message read (what a new session
    catches up after): the bridge's cursor, as one line."""

    session_id: str
    seq: int
    resume_url: str
    last_message: int = 0

    def cursor(self) -> str:
        return f"{self.session_id} {self.seq} {self.resume_url} {self.last_message}"

    @staticmethod
    def parse(cursor: str | None) -> Session | None:
        """The session a saved cursor names (None for none, or for one written otherwise)."""
        parts = (cursor or "").split(" ")
        if len(parts) == 3:
            parts.append("0")
        if (len(parts) != 4 or not parts[1].isdigit() or not parts[2].startswith(("ws://", "wss://"))
                or not parts[3].isdigit()):
            return None
        return Session(parts[0], int(parts[1]), parts[2], int(parts[3]))


#: Close codes after which the bridge cannot go on (what to fix), by Discord's Gateway docs.
FATAL_CLOSES = {
    4004: "the token is refused (authentication failed)",
    4010: "invalid shard",
    4011: "sharding required: the bot is in too many guilds for one connection",
    4012: "invalid API version",
    4013: "invalid intents",
    4014: "disallowed intents: enable the Message Content intent (Bot → Privileged Gateway Intents) in the "
          "Developer Portal",
}
#: Close codes after which the session cannot be resumed: a new one is identified.
NEW_SESSION_CLOSES = {4007: "invalid seq", 4009: "session timed out"}


def after_close(code: int | None) -> str:
    """What a close of the Gateway means: ``"fatal"``, ``"identify"`` (a new session) or
    ``"resume"`` (every other code, a plain close, a dropped socket)."""
    if code in FATAL_CLOSES:
        return "fatal"
    if code in NEW_SESSION_CLOSES:
        return "identify"
    return "resume"


# ------------------------------------------------------------------ rate limits (decisions)


@dataclass(slots=True)
class _Bucket:
    remaining: int = 1
    reset_at: float = 0.0


@dataclass(slots=True)
class RateLimits:
    """Discord's buckets as its headers describe them: a route (method, path with its major
    parameter) is found in a bucket once a response names it; the global limit beside."""

    routes: dict[str, str] = field(default_factory=dict)
    buckets: dict[str, _Bucket] = field(default_factory=dict)
    global_until: float = 0.0
    sent: deque[float] = field(default_factory=deque)

    def _bucket(self, route: str, major: str) -> _Bucket | None:
        bucket = self.routes.get(route)
        return self.buckets.get(f"{bucket}:{major}") if bucket is not None else None

    def wait_until(self, route: str, major: str, now: float) -> float:
        """When a request on ``route`` may go (``now`` if at once)."""
        at = max(now, self.global_until)
        while self.sent and self.sent[0] <= now - 1.0:
            self.sent.popleft()
        if len(self.sent) >= GLOBAL_RATE:
            at = max(at, self.sent[0] + 1.0)
        bucket = self._bucket(route, major)
        if bucket is not None and bucket.remaining <= 0 and bucket.reset_at > now:
            at = max(at, bucket.reset_at)
        return at

    def sending(self, now: float) -> None:
        self.sent.append(now)

    def update(self, route: str, major: str, headers: Mapping[str, str], now: float) -> None:
        """A response's ``X-RateLimit-*`` headers, read."""
        name = headers.get("x-ratelimit-bucket")
        if name is None:
            return
        self.routes[route] = name
        bucket = self.buckets.setdefault(f"{name}:{major}", _Bucket())
        try:
            bucket.remaining = int(headers.get("x-ratelimit-remaining", "1"))
            bucket.reset_at = now + float(headers.get("x-ratelimit-reset-after", "0"))
        except ValueError:
            pass

    def limited(self, route: str, major: str, retry_after: float, is_global: bool, now: float) -> None:
        """A 429: its bucket (or, global, every request) waits ``retry_after`` seconds."""
        if is_global:
            self.global_until = max(self.global_until, now + retry_after)
            return
        name = self.routes.get(route, f"?{route}")
        self.routes[route] = name
        bucket = self.buckets.setdefault(f"{name}:{major}", _Bucket())
        bucket.remaining, bucket.reset_at = 0, max(bucket.reset_at, now + retry_after)


# ------------------------------------------------------------------ the WebSocket


class _Closed(Exception):
    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"closed ({code} {reason})".replace(" )", ")"))
        self.code = code


class _Socket:
    """One WebSocket client connection: wsproto over a Trio stream; JSON text frames."""

    def __init__(self, stream: trio.abc.Stream, ws: WSConnection) -> None:
        self.stream, self.ws = stream, ws
        self._text: list[str] = []
        self._events: deque[Any] = deque()

    @classmethod
    async def open(cls, url: str) -> _Socket:
        parts = urlsplit(url)
        secure = parts.scheme == "wss"
        host, port = parts.hostname or "", parts.port or (443 if secure else 80)
        stream: trio.abc.Stream
        if secure:
            stream = await trio.open_ssl_over_tcp_stream(host, port, https_compatible=True)
        else:
            stream = await trio.open_tcp_stream(host, port)
        ws = WSConnection(ConnectionType.CLIENT)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        await stream.send_all(ws.send(Request(host=parts.netloc, target=target)))
        socket = cls(stream, ws)
        while True:
            event = await socket._next()
            if isinstance(event, AcceptConnection):
                return socket
            if isinstance(event, RejectConnection | RejectData):
                await stream.aclose()
                raise _Closed(None, f"the gateway refused the WebSocket ({getattr(event, 'status_code', '?')})")

    async def _next(self) -> Any:
        while not self._events:
            data = await self.stream.receive_some(65536)  # (atomic: a cancelled read loses nothing)
            if not data:
                raise _Closed(None, "the connection was dropped")
            self.ws.receive_data(bytes(data))
            self._events.extend(self.ws.events())
        return self._events.popleft()

    async def receive(self) -> dict[str, Any]:
        """The next payload; :class:`_Closed` when the server closes or drops the connection."""
        while True:
            event = await self._next()
            if isinstance(event, TextMessage):
                self._text.append(event.data)
                if event.message_finished:
                    text, self._text = "".join(self._text), []
                    payload = json.loads(text)
                    if isinstance(payload, dict):
                        return payload
            elif isinstance(event, BytesMessage):
                raise _Closed(None, "a binary frame (the bridge asks for no compression)")
            elif isinstance(event, Ping):
                await self.stream.send_all(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                try:
                    await self.stream.send_all(self.ws.send(event.response()))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                await self.stream.aclose()
                raise _Closed(event.code, event.reason or "")

    async def send(self, payload: Mapping[str, Any]) -> None:
        await self.stream.send_all(self.ws.send(TextMessage(json.dumps(safe(dict(payload))))))

    async def close(self, code: int) -> None:
        """Close (a code other than 1000 keeps the session resumable)."""
        with trio.move_on_after(2) as scope:
            scope.shield = True
            try:
                await self.stream.send_all(self.ws.send(CloseConnection(code=code)))
            except Exception:  # noqa: BLE001 (closing a socket that is already gone)
                pass
            await self.stream.aclose()


# ------------------------------------------------------------------ the platform


class DiscordPlatform:
    """One bot's connection: the Gateway for what happens, REST for what it posts."""

    kind = "discord"
    can_edit = True
    idempotent_posts = True  # (a nonce with enforce_nonce: Discord shows a repeated post once)

    def __init__(self, config: BridgeConfig) -> None:
        options = config.options
        self.config = config
        self.token_file = options["token_file"]
        self.api = str(options.get("api_url", DISCORD_API)).rstrip("/")
        self.http = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_keepalive_connections=4))
        self.token = ""
        self.bot_id = ""
        self.username = ""
        self.gateway = ""
        self.scope = "0"
        self.session: Session | None = None
        self.last_message = 0
        """The newest message id read (a snowflake: ids grow with time, across channels)."""
        self.channels: set[str] = set()
        self._sessions_read = False
        """Whether :attr:`session` is the live one (else the runner's saved cursor is)."""
        self.limits = RateLimits()
        self.socket: _Socket | None = None
        self._button: dict[str, tuple[str, str | None]] = {}
        """Channel → the message that shows its Stop button, and that message's turn."""
        self._progress: dict[str, list[str]] = {}
        """Op key → the messages of it already sent (a post retried part-way resumes there)."""

    # ---------------------------------------------------------- REST

    async def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                   major: str = "", route: str | None = None) -> Any:
        """One REST request, waiting for its bucket and through 429s; its JSON (None for a 204),
        or :class:`Transient` / :class:`Refused` (the one place REST errors are read)."""
        route = route or f"{method} {re.sub(r'[0-9]{5,}', '#', path) if major else path}"
        for _ in range(RETRIES_429 + 1):
            at = self.limits.wait_until(route, major, trio.current_time())
            if at > trio.current_time():
                await trio.sleep_until(at)
            self.limits.sending(trio.current_time())
            try:
                reply = await self.http.request(
                    method, f"{self.api}{path}", json=safe(dict(body)) if body is not None else None,
                    headers={"Authorization": f"Bot {self.token}", "User-Agent": "DiscordBot (corral, 0.1)"})
            except httpx.TransportError as exc:
                raise Transient(f"{method} {path}: {type(exc).__name__}: {exc or 'no answer'}") from None
            self.limits.update(route, major, reply.headers, trio.current_time())
            try:
                data = reply.json() if reply.content else None
            except ValueError:
                data = None
            if reply.status_code == 429:
                found = data if isinstance(data, dict) else {}
                after = found.get("retry_after", reply.headers.get("retry-after", "1"))
                try:
                    wait = float(after)
                except (TypeError, ValueError):
                    wait = 1.0
                is_global = bool(found.get("global")) or reply.headers.get("x-ratelimit-global") == "true"
                log.warning("discord: %s %s: rate limited (429, %s, retry after %.2f s)", method, path,
                            "global" if is_global else f"bucket {self.limits.routes.get(route, 'not yet named')}", wait)
                self.limits.limited(route, major, wait, is_global, trio.current_time())
                continue
            if reply.status_code < 300:
                return data
            what = f"{data.get('code', '')} {data.get('message', '')}".strip() if isinstance(data, dict) else ""
            if reply.status_code >= 500:
                raise Transient(f"{method} {path}: {reply.status_code} {what}".rstrip())
            if isinstance(data, dict) and isinstance(data.get("errors"), dict):
                what += f" {json.dumps(data['errors'])[:300]}"
            raise Refused(f"{method} {path}: {reply.status_code} {what}".rstrip())
        raise Transient(f"{method} {path}: still rate limited after {RETRIES_429} waits")

    # ---------------------------------------------------------- Platform

    async def connect(self) -> None:
        self.token = self.token_file.read_text().strip()
        try:
            me = await self.call("GET", "/users/@me")
            gateway = await self.call("GET", "/gateway/bot")
        except Refused as exc:
            raise Refused(f"the token in {self.token_file} is refused ({exc})") from None
        if not isinstance(me, dict) or not me.get("bot"):
            raise Refused(f"the token in {self.token_file} is not a bot's (GET /users/@me: {me!r})")
        if not isinstance(gateway, dict) or not str(gateway.get("url", "")).startswith(("ws://", "wss://")):
            raise Transient(f"GET /gateway/bot: no gateway URL in {gateway!r}")
        self.bot_id, self.username = str(me.get("id")), str(me.get("username", ""))
        self.gateway = str(gateway["url"]).rstrip("/")
        log.info("discord: bridge %s is %s (%s)", self.config.name, self.username, self.bot_id)

    async def rooms(self, configured: Mapping[str, str]) -> dict[str, str]:
        return {room: channel for room, channel in configured.items() if await self.join(room)}

    async def join(self, room: str) -> bool:
        """A channel is bridged if the bot can see it: a server's admin invites the bot (docs/bridges.md)."""
        try:
            await self.call("GET", f"/channels/{room}", major=room)
        except Refused as exc:
            log.error("discord: the bot cannot see the channel %s (%s): invite it to the server, with View Channel "
                      "there; it is not bridged", room, exc)
            return False
        self.channels.add(room)
        return True

    async def events(self, cursor: str | None) -> AsyncIterator[Batch]:
        if not self._sessions_read:  # (a restart: the saved session is resumed, and what was missed comes)
            self.session, self._sessions_read = Session.parse(cursor), True
            self.last_message = self.session.last_message if self.session is not None else 0
        resuming = self.session is not None
        url = self.session.resume_url if self.session is not None else self.gateway
        try:
            self.socket = socket = await _Socket.open(f"{url}/?{GATEWAY_QUERY}")
        except (OSError, trio.TooSlowError, _Closed) as exc:
            raise Transient(f"gateway {url}: {exc}") from None
        try:
            async for batch in self._read(socket, resuming):
                yield batch
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, RemoteProtocolError, ValueError) as exc:
            # (a send on a dropped connection, a frame or JSON the protocol cannot read: resumed)
            raise Transient(f"gateway: {type(exc).__name__}: {exc}; resuming") from None
        except _Closed as exc:
            what = after_close(exc.code)
            if what == "fatal":
                raise Refused(f"the gateway closed the connection: {FATAL_CLOSES[exc.code or 0]} ({exc.code})"
                              ) from None
            if what == "identify":
                self.session = None
            raise Transient(f"gateway {exc}; {'resuming' if self.session else 'identifying anew'}") from None
        finally:
            self.socket = None
            await socket.close(4000)

    async def _read(self, socket: _Socket, resuming: bool) -> AsyncIterator[Batch]:
        hello = await socket.receive()
        if hello.get("op") != 10 or not isinstance(hello.get("d"), dict):
            raise Transient(f"gateway: expected Hello (op 10), got {hello!r}"[:200])
        interval = float(hello["d"].get("heartbeat_interval", 41250)) / 1000
        if resuming and self.session is not None:
            await socket.send({"op": 6, "d": {"token": self.token, "session_id": self.session.session_id,
                                              "seq": self.session.seq}})
        else:
            await socket.send({"op": 2, "d": {"token": self.token, "intents": INTENTS,
                                              "properties": {"os": "linux", "browser": "corral", "device": "corral"}}})
        beat_at = trio.current_time() + interval * random.random()  # (jitter: not every client at once)
        acked, held = True, False
        while True:
            payload: dict[str, Any] | None = None
            with trio.move_on_at(beat_at):
                payload = await socket.receive()
            if payload is None and not acked and held:
                # The runner held the generator past the heartbeat's deadline: its ACK may be
                # waiting unread. A short grace to read it before calling the connection a zombie.
                held, beat_at = False, trio.current_time() + min(interval, 5.0)
                continue
            if payload is None or payload.get("op") == 1:  # (a heartbeat due, or asked for)
                if payload is None and not acked:
                    raise Transient(f"gateway: no heartbeat ACK in {interval:g} s (a zombie connection); resuming")
                await socket.send({"op": 1, "d": self.session.seq if self.session else None})
                acked, beat_at = False, trio.current_time() + interval
                continue
            op = payload.get("op")
            if op == 11:
                acked = True
            elif op == 7:
                raise Transient("gateway: the server asked for a reconnect (op 7); resuming")
            elif op == 9:
                if payload.get("d") is not True:
                    self.session = None
                raise Transient(f"gateway: invalid session (op 9); {'resuming' if self.session else 'identifying'}",
                                retry_after=random.uniform(*INVALID_SESSION_WAIT))
            elif op == 0:
                batch = await self._dispatch(payload)
                if batch is not None:
                    yield batch
                    held = held or trio.current_time() > beat_at

    async def _dispatch(self, payload: Mapping[str, Any]) -> Batch | None:
        kind, data, seq = payload.get("t"), payload.get("d"), payload.get("s")
        if not isinstance(data, dict):
            data = {}
        caught_up: list[Inbound] = []
        if kind == "READY":
            self.session = Session(str(data.get("session_id")), 0,
                                   str(data.get("resume_gateway_url") or self.gateway).rstrip("/"))
            log.info("discord: bridge %s: a new gateway session", self.config.name)
            if self.last_message:  # (a session that could not be resumed: what was said meanwhile, read back)
                caught_up = await self._catch_up()
        elif kind == "RESUMED":
            log.info("discord: bridge %s: the gateway session resumed", self.config.name)
        event: Inbound | None = None
        if kind == "MESSAGE_CREATE":
            event = self._message(data)
        elif kind == "MESSAGE_REACTION_ADD":
            event = self._reaction(data)
        elif kind == "INTERACTION_CREATE":
            event = await self._interaction(data)
        if isinstance(seq, int) and self.session is not None:
            self.session.seq = max(self.session.seq, seq)
        if self.session is not None:
            self.session.last_message = self.last_message
        cursor = self.session.cursor() if self.session is not None else None
        if kind in ("READY", "RESUMED"):
            return Batch(tuple(caught_up), cursor)
        return Batch((event,), cursor) if event is not None else None

    async def _catch_up(self) -> list[Inbound]:
        """The messages of the bridged channels after the newest one read, oldest first (the
        store's origins make those the runner had handled a no-op)."""
        found: list[Inbound] = []
        after = self.last_message
        for room in sorted(self.channels):
            newest = after
            for _ in range(CATCH_UP_PAGES):
                try:
                    page = await self.call("GET", f"/channels/{room}/messages?after={newest}&limit=100", major=room)
                except Refused as exc:
                    log.warning("discord: what was said in %s while the bridge was away cannot be read: %s", room, exc)
                    break
                messages = sorted((m for m in page or [] if isinstance(m, dict) and str(m.get("id", "")).isdigit()),
                                  key=lambda m: int(m["id"]))
                for message in messages:
                    inbound = self._message(message)
                    if inbound is not None:
                        found.append(inbound)
                if len(messages) < 100:
                    break
                newest = int(messages[-1]["id"])
        if found:
            log.info("discord: bridge %s: %d message(s) said while it was away, read back", self.config.name,
                     len(found))
        return found

    def _message(self, message: Mapping[str, Any]) -> Inbound | None:
        author = message.get("author") or {}
        if not isinstance(author, dict) or author.get("bot") or message.get("webhook_id"):
            return None  # (bots' speech, this bot's included: answering one is how loops start)
        if message.get("type", 0) not in _MESSAGE_TYPES:
            return None
        room, who = str(message.get("channel_id")), str(author.get("id"))
        event = f"{room}:{message.get('id')}"
        if str(message.get("id", "")).isdigit():
            self.last_message = max(self.last_message, int(message["id"]))
        text = str(message.get("content") or "")
        # (a message that starts by mentioning the bot: the rest is what was said to it)
        text = re.sub(rf"^<@!?{re.escape(self.bot_id)}>\s*", "", text)
        mentions = tuple(str(u.get("id")) for u in message.get("mentions") or [] if isinstance(u, dict))
        if not text.strip():
            if message.get("attachments") or message.get("sticker_items"):
                return Unreadable(room, event, who, "agents read text messages, not an attachment or a sticker")
            log.warning("discord: a message in %s has no content: enable the Message Content intent in the "
                        "Developer Portal (Bot → Privileged Gateway Intents)", room)
            return Unreadable(room, event, who, "the bridge could not read the message's text")
        return Said(room, event, who, text, mentions)

    def _reaction(self, reaction: Mapping[str, Any]) -> Inbound | None:
        who = str(reaction.get("user_id"))
        member = reaction.get("member") or {}
        if who == self.bot_id or (isinstance(member, dict) and (member.get("user") or {}).get("bot")):
            return None
        emoji = reaction.get("emoji") or {}
        name = str(emoji.get("name") or "").replace("\ufe0f", "")
        key = name if not emoji.get("id") else f"{name}:{emoji['id']}"
        room, message = str(reaction.get("channel_id")), str(reaction.get("message_id"))
        return Reacted(room, f"r{room}:{message}:{who}:{key}", who, key, f"{room}:{message}")

    async def _interaction(self, interaction: Mapping[str, Any]) -> Inbound | None:
        if interaction.get("type") != 3:  # (a button press; the bridge registers no slash commands)
            return None
        # Answered first, whoever pressed: Discord shows "This interaction failed" after 3 s.
        try:
            await self.call("POST", f"/interactions/{interaction.get('id')}/{interaction.get('token')}/callback",
                            {"type": 6}, major=str(interaction.get("id")), route="POST /interactions/callback")
        except (Refused, Transient) as exc:  # (too old, after a restart: the press still counts)
            log.info("discord: a button press was not answered: %s", exc)
        user = (interaction.get("member") or {}).get("user") or interaction.get("user") or {}
        message = interaction.get("message") or {}
        custom = (interaction.get("data") or {}).get("custom_id")
        key = {STOP_ID: STOP_REACTION, RESEND_ID: RESEND_REACTION}.get(str(custom))
        if key is None or not isinstance(user, dict) or user.get("bot"):
            return None
        room = str(interaction.get("channel_id") or message.get("channel_id"))
        return Reacted(room, f"i{interaction.get('id')}", str(user.get("id")), key, f"{room}:{message.get('id')}")

    # ---------------------------------------------------------- posting

    def _nonce(self, key: str, part: int) -> str:
        return hashlib.sha256(f"{self.scope}:{key}:{part}".encode()).hexdigest()[:25]

    async def _send(self, room: str, text: str, nonce: str, *, reply_to: str | None = None,
                    components: list[Any] | None = None) -> str:
        body: dict[str, Any] = {"content": text, "allowed_mentions": NO_MENTIONS, "flags": FLAGS,
                                "nonce": nonce, "enforce_nonce": True}
        if reply_to is not None and reply_to.startswith(f"{room}:"):
            body["message_reference"] = {"message_id": reply_to.partition(":")[2], "fail_if_not_exists": False}
        if components is not None:
            body["components"] = components
        sent = await self.call("POST", f"/channels/{room}/messages", body, major=room)
        if not isinstance(sent, dict) or not sent.get("id"):
            raise Refused(f"POST /channels/{room}/messages: the answer is not a message: {sent!r}")
        return str(sent["id"])

    async def post(self, op: Post) -> str:
        text, components = op.text, None
        if op.notice and op.text.endswith(_RESEND_HINT):  # (a dropped message's answer: a button sends it again)
            text = op.text.removesuffix(_RESEND_HINT) + f"Press {RESEND_REACTION} to send it again."
            components = RESEND_ROW
        parts = split_by(neutral(text), MAX_TEXT, utf16_units)
        # The turn's first notice (its status message) carries its Stop button; one per channel.
        button = (op.notice and op.turn is not None and not op.ends
                  and self._button.get(op.room, ("", None))[1] != op.turn)
        done = self._progress.setdefault(op.key, [])
        try:
            for i, part in enumerate(parts[len(done):], start=len(done)):
                last = i == len(parts) - 1
                done.append(await self._send(op.room, part, self._nonce(op.key, i),
                                             reply_to=op.reply_to if i == 0 else None,
                                             components=STOP_ROW if button and last else
                                             components if i == 0 else None))
        except Refused:
            del self._progress[op.key]
            raise
        del self._progress[op.key]
        if button:  # (after the post: a stop's "Stopping…" is not kept waiting for the button's removal)
            await self._take_off(op.room)
            self._button[op.room] = (done[-1], op.turn)
        else:
            await self._unbutton(op.room, op.turn, op.text, saved=(op.seq is not None and not op.notice) or op.ends)
        return f"{op.room}:{done[0]}"

    async def edit(self, op: Edit, target: str) -> str:
        room, _, message = target.partition(":")
        parts = split_by(neutral(op.text), MAX_TEXT, utf16_units)
        await self._unbutton(op.room, op.turn, op.text, saved=op.final or op.ends)
        # (components left out of a PATCH stay as they are: the Stop button with them)
        await self.call("PATCH", f"/channels/{room}/messages/{message}",
                        {"content": parts[0], "allowed_mentions": NO_MENTIONS}, major=room)
        if op.final:  # (the saved text: what an edit cannot hold follows as messages)
            done = self._progress.setdefault(op.key, [])
            for i, part in enumerate(parts[1 + len(done):], start=1 + len(done)):
                done.append(await self._send(op.room, part, self._nonce(op.key, i)))
            del self._progress[op.key]
        return target

    async def _unbutton(self, room: str, turn: str | None, text: str, *, saved: bool) -> None:
        shown = self._button.get(room)
        if shown is not None and ((saved and turn == shown[1]) or (turn is None and text.startswith(ENDINGS))):
            await self._take_off(room)

    async def _take_off(self, room: str) -> None:
        shown = self._button.pop(room, None)
        if shown is None:
            return
        try:
            await self.call("PATCH", f"/channels/{room}/messages/{shown[0]}", {"components": []}, major=room)
        except (Refused, Transient) as exc:
            # Not retried: the post it follows is made. A button left on an ended turn stops
            # nothing more (the core judges a press on it).
            log.info("discord: the Stop button of %s:%s was not taken off: %s", room, shown[0], exc)

    async def react(self, op: React) -> str:
        room, _, message = op.target.partition(":")
        await self.call("PUT", f"/channels/{room}/messages/{message}/reactions/{quote(op.emoji)}/@me", major=room)
        return f"{op.target}:r"

    def server_of(self, sender: str) -> str | None:
        return None  # (Discord has one server: allowlist user ids)

    async def aclose(self) -> None:
        if self.socket is not None:
            await self.socket.close(4000)
        await self.http.aclose()
