"""A fake Slack, real HTTP and WebSocket on 127.0.0.1, for the Slack bridge's tests.

It speaks the Web API as https://api.slack.com/web documents it: ``POST /api/METHOD`` with
the token in ``Authorization: Bearer`` (or a ``token`` parameter), JSON or form-encoded
bodies (a form's ``blocks`` is a JSON string: what slack_sdk sends); answers ``{"ok": true,
…}`` or ``{"ok": false, "error": "…"}`` with HTTP 200, and a rate limit as HTTP 429 with
``Retry-After``. ``apps.connections.open`` takes only an app-level token (``xapp-``) and
gives a WebSocket URL; the socket speaks Socket Mode as documented: ``hello`` first, then
envelopes (``events_api``, ``interactive``, ``slash_commands``) each with an
``envelope_id`` the client must acknowledge with ``{"envelope_id": …}``; an unacknowledged
envelope is sent again on the next connection with ``retry_attempt`` one more and
``retry_reason`` ``"timeout"``. The bot's own posts come back as ``message`` events with
its ``bot_id`` (as Slack sends them to an app subscribed to ``message.channels``).
``tests/test_slack_fake.py`` checks all of it against slack_sdk, Slack's own client.

One server (threads) serves every test; each test has an app of its own (its tokens), so
nothing of one test reaches another. The human side: :meth:`FakeApp.say`,
:meth:`FakeApp.press`, :meth:`FakeApp.react`, :meth:`FakeApp.slash`; faults:
:meth:`FakeApp.fail` (a 429 with ``Retry-After``, a 500), :meth:`FakeApp.drop_socket`.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

import wsproto
import wsproto.events as ws

#: Form parameters that are JSON as sent.
JSON_FORM = {"blocks", "attachments", "metadata"}


class ApiError(Exception):
    """An ``ok: false`` answer."""


@dataclass
class Fault:
    kind: str
    retry_after: int
    skip: int


@dataclass
class FakeApp:
    """One Slack app installed in a workspace: its bot user, its channels, its socket."""

    fake: FakeSlack
    n: int
    bot_token: str
    app_token: str
    user_id: str
    bot_id: str
    channels: dict[str, dict[str, Any]] = field(default_factory=dict)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    faults: dict[str, deque[Fault]] = field(default_factory=dict)
    faulted: list[tuple[str, str, float]] = field(default_factory=list)
    unacked: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Envelope id → envelope, until acknowledged."""
    outbox: deque[dict[str, Any]] = field(default_factory=deque)
    acked: dict[str, float] = field(default_factory=dict)
    """Envelope id → when it was acknowledged (monotonic)."""
    delivered: dict[str, float] = field(default_factory=dict)
    connections: int = 0
    tickets: set[str] = field(default_factory=set)
    drop: bool = False
    deaf: bool = False
    """The socket answers no ping (a connection gone dead somewhere between)."""
    pings: int = 0
    _clock: float = 0.0
    _wake: tuple[int, int] = field(default_factory=os.pipe)
    """Written to when something is to be sent: the socket's thread wakes at once (no polling delay)."""

    def wake(self) -> None:
        os.write(self._wake[1], b"x")

    def channel(self, channel: str, name: str | None = None, member: bool = True) -> dict[str, Any]:
        with self.fake.lock:
            self.channels[channel] = {"id": channel, "name": name or channel.lower(), "is_channel": True,
                                      "is_member": member, "is_archived": False}
            self.messages.setdefault(channel, [])
        return self.channels[channel]

    def _ts(self) -> str:
        self._clock = max(self._clock + 0.000001, time.time())
        return f"{self._clock:.6f}"

    def _envelope(self, kind: str, payload: dict[str, Any], accepts: bool = False) -> dict[str, Any]:
        envelope: dict[str, Any] = {
            "envelope_id": f"env-{self.n}-{next(self.fake.count)}", "type": kind, "payload": payload,
            "accepts_response_payload": accepts, "retry_attempt": 0, "retry_reason": ""}
        with self.fake.lock:
            self.unacked[envelope["envelope_id"]] = envelope
            self.outbox.append(envelope)
        self.wake()
        return envelope

    def _event(self, event: dict[str, Any]) -> dict[str, Any]:
        return self._envelope("events_api", {
            "token": "verification", "team_id": "T0FAKE", "api_app_id": f"A{self.n}", "type": "event_callback",
            "event": event, "event_id": f"Ev{self.n:04d}{next(self.fake.count):06d}", "event_time": int(time.time()),
        })

    def say(self, channel: str, user: str, text: str, thread_ts: str | None = None, **extra: Any) -> dict[str, Any]:
        """A member writes ``text``; returns the message (its ``ts``)."""
        with self.fake.lock:
            message = {"type": "message", "user": user, "text": text, "ts": self._ts(), "team": "T0FAKE", **extra}
            if thread_ts is not None:
                message["thread_ts"] = thread_ts
            self.messages.setdefault(channel, []).append(message)
        self._event({**message, "channel": channel, "event_ts": message["ts"], "channel_type": "channel"})
        return message

    def press(self, channel: str, user: str, ts: str, action_id: str) -> dict[str, Any]:
        """A member presses the button ``action_id`` of the message ``ts`` (a ``block_actions``)."""
        message = self.message(channel, ts)
        action = {"type": "button", "action_id": action_id, "block_id": action_id, "value": action_id,
                  "text": {"type": "plain_text", "text": "button"}, "action_ts": self._ts()}
        return self._envelope("interactive", {
            "type": "block_actions", "user": {"id": user, "username": user.lower(), "team_id": "T0FAKE"},
            "api_app_id": f"A{self.n}", "token": "verification", "trigger_id": f"{next(self.fake.count)}.fake",
            "team": {"id": "T0FAKE"}, "channel": {"id": channel, "name": self.channels[channel]["name"]},
            "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False},
            "message": message, "actions": [action], "response_url": f"{self.fake.url}/respond",
        }, accepts=True)

    def react(self, channel: str, user: str, ts: str, name: str) -> dict[str, Any]:
        """A member adds the reaction ``:name:`` to the message ``ts``."""
        return self._event({"type": "reaction_added", "user": user, "reaction": name, "item_user": self.user_id,
                            "item": {"type": "message", "channel": channel, "ts": ts}, "event_ts": self._ts()})

    def slash(self, channel: str, user: str, command: str, text: str) -> dict[str, Any]:
        """A member types ``/command text``."""
        return self._envelope("slash_commands", {
            "token": "verification", "team_id": "T0FAKE", "channel_id": channel, "user_id": user,
            "command": command, "text": text, "api_app_id": f"A{self.n}",
            "trigger_id": f"{next(self.fake.count)}.fake", "response_url": f"{self.fake.url}/respond",
        }, accepts=True)

    def redeliver(self, envelope: dict[str, Any]) -> None:
        """Slack sends ``envelope`` again (as it does when an ack did not reach it)."""
        with self.fake.lock:
            again = {**envelope, "retry_attempt": envelope.get("retry_attempt", 0) + 1, "retry_reason": "timeout"}
            self.unacked[again["envelope_id"]] = again
            self.outbox.append(again)
        self.wake()

    def fail(self, method: str, kind: str, retry_after: int = 1, skip: int = 0) -> None:
        """The next call of ``method`` (after ``skip`` more) fails: ``"429"`` or ``"500"``."""
        with self.fake.lock:
            self.faults.setdefault(method, deque()).append(Fault(kind, retry_after, skip))

    def drop_socket(self) -> None:
        """The socket mode connection goes dead (closed with no close frame)."""
        with self.fake.lock:
            self.drop = True
        self.wake()

    def message(self, channel: str, ts: str) -> dict[str, Any]:
        with self.fake.lock:
            for message in self.messages.get(channel, []):
                if message["ts"] == ts:
                    return message
        raise KeyError(ts)

    def sent(self, channel: str) -> list[dict[str, Any]]:
        """The bot's messages in ``channel``, in order, as they stand now."""
        with self.fake.lock:
            return [dict(m) for m in self.messages.get(channel, []) if m.get("bot_id") == self.bot_id]

    # ---------------------------------------------------------- Web API

    def api(self, method: str, token: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "apps.connections.open":
            if token != self.app_token:
                raise ApiError("not_allowed_token_type")
            ticket = f"t{self.n}-{next(self.fake.count)}"
            self.tickets.add(ticket)
            return {"url": f"ws://127.0.0.1:{self.fake.port}/link/?ticket={ticket}&app_id=A{self.n}"}
        if token != self.bot_token:
            raise ApiError("not_allowed_token_type" if token == self.app_token else "invalid_auth")
        if method == "auth.test":
            return {"url": "https://fake.slack.com/", "team": "Fake", "user": "corral", "team_id": "T0FAKE",
                    "user_id": self.user_id, "bot_id": self.bot_id, "is_enterprise_install": False}
        if method == "conversations.info":
            return {"channel": dict(self._channel(params))}
        if method == "chat.postMessage":
            channel = self._channel(params)
            if not channel["is_member"]:
                raise ApiError("not_in_channel")
            if not params.get("text") and not params.get("blocks"):
                raise ApiError("no_text")
            message: dict[str, Any] = {"type": "message", "user": self.user_id, "bot_id": self.bot_id,
                                       "text": str(params.get("text", "")), "ts": self._ts(), "team": "T0FAKE"}
            for key in ("blocks", "thread_ts"):
                if params.get(key):
                    message[key] = params[key]
            self.messages[channel["id"]].append(message)
            # (the app hears its own message, as one subscribed to message.channels does)
            self._event({**message, "channel": channel["id"], "event_ts": message["ts"], "channel_type": "channel"})
            return {"channel": channel["id"], "ts": message["ts"], "message": dict(message)}
        if method == "chat.update":
            channel = self._channel(params)
            message = self._own(channel["id"], str(params.get("ts")))
            if "text" in params:
                message["text"] = str(params["text"])
            if "blocks" in params:  # (left out, the blocks are kept; [] takes them away)
                message["blocks"] = params["blocks"] or []
            message["edited"] = {"user": self.user_id, "ts": self._ts()}
            return {"channel": channel["id"], "ts": message["ts"], "text": message["text"], "message": dict(message)}
        if method == "reactions.add":
            channel = self._channel(params)
            target = next((m for m in self.messages[channel["id"]] if m["ts"] == params.get("timestamp")), None)
            if target is None:
                raise ApiError("message_not_found")
            users = target.setdefault("reactions", {}).setdefault(str(params.get("name")), [])
            if self.user_id in users:
                raise ApiError("already_reacted")
            users.append(self.user_id)
            return {}
        raise ApiError("unknown_method")

    def _channel(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self.channels.get(str(params.get("channel")))
        if channel is None:
            raise ApiError("channel_not_found")
        return channel

    def _own(self, channel: str, ts: str) -> dict[str, Any]:
        for message in self.messages[channel]:
            if message["ts"] == ts:
                if message.get("bot_id") != self.bot_id:
                    raise ApiError("cant_update_message")
                return message
        raise ApiError("message_not_found")


class FakeSlack:
    """The server: ``url + "/api"`` is what the bridge's ``api_url`` names."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.apps: dict[str, FakeApp] = {}
        self.count = itertools.count(1)
        self.closing = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path.rstrip("/") == "/link":
                    fake.socket_mode(self, parse_qs(url.query).get("ticket", [""])[0])
                    self.close_connection = True
                    return
                self._answer(404, {"ok": False, "error": "not_found"})

            def do_POST(self) -> None:
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                method = url.path.removeprefix("/api/")
                status, answer, headers = fake.handle(method, self.headers, url.query, body)
                self._answer(status, answer, headers)

            def _answer(self, status: int, answer: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(raw)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except OSError:
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-slack", daemon=True)
        self.thread.start()

    def app(self) -> FakeApp:
        """A new app (its own tokens, bot user and channels)."""
        n = next(self.count)
        app = FakeApp(self, n, f"xoxb-{n}-fake-bot", f"xapp-1-A{n}-fake-app", f"UBOT{n:04d}", f"B{n:04d}")
        with self.lock:
            self.apps[app.bot_token] = self.apps[app.app_token] = app
        return app

    def handle(self, method: str, headers: Any, query: str,
               body: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        kind = headers.get("Content-Type", "")
        try:
            if kind.startswith("application/json"):
                params = json.loads(body or b"{}")
            else:
                params = {}
                for key, value in parse_qsl(query) + parse_qsl(body.decode()):
                    params[key] = json.loads(value) if key in JSON_FORM else value
        except ValueError:
            return 200, {"ok": False, "error": "invalid_json"}, {}
        token = (headers.get("Authorization") or "").removeprefix("Bearer ").strip() or str(params.pop("token", ""))
        with self.lock:
            app = self.apps.get(token)
            if app is None:
                return 200, {"ok": False, "error": "not_authed" if not token else "invalid_auth"}, {}
            app.calls.append((method, params, time.monotonic()))
            faults = app.faults.get(method)
            fault = None
            if faults and faults[0].skip:
                faults[0].skip -= 1
            elif faults:
                fault = faults.popleft()
            if fault is not None:
                app.faulted.append((method, fault.kind, time.monotonic()))
                if fault.kind == "429":
                    return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(fault.retry_after)}
                return 500, {"ok": False, "error": "internal_error"}, {}
            try:
                return 200, {"ok": True, **app.api(method, token, params)}, {}
            except ApiError as exc:
                return 200, {"ok": False, "error": str(exc)}, {}

    def socket_mode(self, handler: BaseHTTPRequestHandler, ticket: str) -> None:
        """One Socket Mode connection, in its handler's thread, until it closes or drops."""
        with self.lock:
            app = next((a for a in self.apps.values() if ticket in a.tickets), None)
            if app is not None:
                app.tickets.discard(ticket)
        conn = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        request = f"GET {handler.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in handler.headers.items())
        conn.receive_data((request + "\r\n").encode("latin-1"))
        sock: socket.socket = handler.connection
        for event in conn.events():
            if isinstance(event, ws.Request):
                if app is None:
                    sock.sendall(conn.send(ws.RejectConnection(status_code=401)))
                    return
                sock.sendall(conn.send(ws.AcceptConnection()))
        assert app is not None
        with self.lock:
            app.connections += 1
            app.drop = False
            # What was never acknowledged comes again, before anything new.
            again = [{**e, "retry_attempt": e["retry_attempt"] + 1, "retry_reason": "timeout"}
                     for e in app.unacked.values() if e["envelope_id"] in app.delivered]
            queued = {e["envelope_id"] for e in app.outbox}
            app.outbox.extendleft(reversed([e for e in again if e["envelope_id"] not in queued]))
        hello = {"type": "hello", "num_connections": 1, "connection_info": {"app_id": f"A{app.n}"},
                 "debug_info": {"host": "fake", "approximate_connection_time": 18060}}
        sock.settimeout(5)
        try:
            sock.sendall(conn.send(ws.TextMessage(json.dumps(hello))))
            while not self.closing:
                with self.lock:
                    if app.drop:
                        sock.shutdown(socket.SHUT_RDWR)
                        return
                    out = list(app.outbox)
                    app.outbox.clear()
                    for envelope in out:
                        app.delivered[envelope["envelope_id"]] = time.monotonic()
                for envelope in out:
                    sock.sendall(conn.send(ws.TextMessage(json.dumps(envelope))))
                readable, _, _ = select.select([sock.fileno(), app._wake[0]], [], [], 0.5)
                if app._wake[0] in readable:
                    os.read(app._wake[0], 4096)
                if sock.fileno() not in readable:
                    continue
                data = sock.recv(65536)
                conn.receive_data(data or None)
                for event in conn.events():
                    if isinstance(event, ws.TextMessage):
                        try:
                            ack = json.loads(event.data)
                        except ValueError:
                            continue
                        with self.lock:
                            if isinstance(ack, dict) and app.unacked.pop(str(ack.get("envelope_id")), None) is not None:
                                app.acked[str(ack["envelope_id"])] = time.monotonic()
                    elif isinstance(event, ws.Ping):
                        with self.lock:
                            app.pings += 1
                        if not app.deaf:
                            sock.sendall(conn.send(event.response()))
                    elif isinstance(event, ws.CloseConnection):
                        if conn.state == wsproto.connection.ConnectionState.REMOTE_CLOSING:
                            sock.sendall(conn.send(event.response()))
                        return
                if not data:
                    return
        except OSError:
            return

    def close(self) -> None:
        with self.lock:
            self.closing = True
            for app in self.apps.values():
                app.wake()
        self.httpd.shutdown()
        self.httpd.server_close()
