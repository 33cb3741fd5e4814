"""Slack: Socket Mode for events (a WebSocket the bridge opens: no public URL), the Web API for posting.

Why not slack_sdk or slack_bolt: their clients are threads or asyncio and corral is Trio, and
the bridge needs six methods (``auth.test``, ``apps.connections.open``, ``conversations.info``,
``chat.postMessage``, ``chat.update``, ``reactions.add``) and one WebSocket. The WebSocket is
wsproto (sans-I/O, already in corral's tree through Hypercorn) on a Trio stream; the Web API
is httpx, as Matrix's and Telegram's. The tests check their fake Slack against ``slack_sdk``.

* **Socket Mode**: ``apps.connections.open`` (the app-level token, ``xapp-``) gives a
  ``wss://`` URL; the bridge connects, waits for ``hello``, and reads envelopes. Every envelope
  is **acknowledged** (``{"envelope_id": …}``) as it is read, within Slack's 3 s whatever the
  runner is doing (a stop being awaited); Slack sends an unacknowledged one again (its
  ``retry_attempt`` counts), and an envelope id or event id already read on this connection
  is skipped. Across connections and restarts the origins make a repeat a no-op: a message is
  ``CHANNEL:TS`` (what a reaction or a button press names), a reaction ``eEVENT_ID``, a press
  ``bCHANNEL:TS:ACTION_TS``, a slash command ``cTRIGGER_ID``. A ``disconnect`` envelope (Slack
  refreshes connections every few hours), a dropped socket, or silence past
  :data:`SILENCE` (pings unanswered) opens a new connection.
* **Stop**: ``!stop``, ``/corral stop`` (a slash command), the **Stop button** (Block Kit, on
  the running turn's status message: a ``block_actions`` interaction, acknowledged as it is
  read), and the ``:octagonal_sign:`` reaction. A channel shows one Stop button: it is taken
  off (``chat.update`` without it) when a newer one is posted, when the turn's saved answer
  is, or when a stop's or interrupt's notice is. ``!new``, ``!interrupt``, ``!steer`` (and
  ``/corral new|interrupt|steer …``) are the core's commands. A message a stop dropped is named
  back with a **Send again** button (the core's 🔁, also the ``:repeat:`` reaction).
* **Text is plain**: ``mrkdwn`` off, ``parse = "none"``, no link names, no unfurls; ``&``,
  ``<`` and ``>`` are escaped as Slack asks, so an agent's ``<!channel>``, ``<!here>``,
  ``<@U…>`` or ``<https://…|a link>`` shows as typed and notifies no one, and ``@here`` /
  ``@channel`` / ``@everyone`` get a word joiner after the ``@``. What members write comes the
  other way: entities unescaped, ``<@U…>`` read as a mention. Long text is split into messages
  of at most :data:`MAX_TEXT` characters as sent (Slack's guidance; it truncates past 40,000);
  an edit shows the first part and a final edit posts the rest after it.
* **Threads** (``threads = true``): each conversation is a thread: a member's top-level
  message is answered in its own thread, a reply in a thread is answered there, and a turn's
  output goes to the thread of the channel's latest message (one corral channel per Slack
  channel: a thread is where its answers are read, not a session of its own).
* **Rates**: a ``429`` waits its ``Retry-After``; drafts are edited at most once per
  ``edit_interval``.
* **The tokens** are read from ``bot_token_file`` and ``app_token_file`` (hidden from every
  turn by the sandbox) and sent only in ``Authorization`` headers.

Errors (one place, :meth:`SlackPlatform.call`): a connection failure, a timeout, a 5xx, a 429,
``ratelimited`` and ``fatal_error`` are :class:`.platform.Transient`; any other ``ok: false``
(``invalid_auth``, ``channel_not_found``, ``not_in_channel``…) is :class:`.platform.Refused`.
"""

from __future__ import annotations

import html
import json
import logging
import re
import ssl
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import trio
import wsproto
import wsproto.events as ws

from .core import (
    ENDINGS,
    RESEND_REACTION,
    STOP_REACTION,
    Edit,
    Inbound,
    Invited,
    Post,
    React,
    Reacted,
    Said,
    Unreadable,
    safe,
    split_by,
)
from .kinds import SLACK_API
from .platform import Batch, Refused, Transient

if TYPE_CHECKING:
    from ..config.settings import BridgeConfig

log = logging.getLogger("corral.bridges.slack")

#: One message's text, in characters as sent (Slack recommends at most 4,000).
MAX_TEXT = 4000
#: A Block Kit section's text limit (the Stop button's message shows its text in one).
MAX_SECTION = 3000
STOP_ACTION = "corral_stop"
RESEND_ACTION = "corral_resend"
#: Reaction names (Slack's, without colons) → the core's keys.
REACTIONS = {"octagonal_sign": STOP_REACTION, "repeat": RESEND_REACTION}
EMOJI_NAMES = {v: k for k, v in REACTIONS.items()} | {"✅": "white_check_mark", "👀": "eyes"}
_RESEND_HINT = f"React {RESEND_REACTION} to send it again."
#: ``/corral WORD …`` → the core's command.
COMMANDS = {"stop": "!stop", "new": "!new", "interrupt": "!interrupt", "steer": "!steer"}
#: Seconds without a frame before a ping; twice that without one and the socket is given up.
PING_EVERY = 10.0
SILENCE = 2 * PING_EVERY
_WORD_JOINER = "\u2060"
_SEEN = 2048


def neutral(text: str) -> str:
    """``text`` as Slack shows it literally: ``&``, ``<``, ``>`` escaped (no ``<!channel>``,
    ``<@U…>`` or link can be formed), and ``@here``-style words broken by a word joiner."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"@(?=(here|channel|everyone)\b)", "@" + _WORD_JOINER, text, flags=re.IGNORECASE)


def _cost(ch: str) -> int:
    return {"&": 5, "<": 4, ">": 4}.get(ch, 1)


def split_message(text: str, limit: int = MAX_TEXT) -> list[str]:
    """``text`` in parts whose :func:`neutral` form is at most ``limit`` characters, cut at a
    line end where one is near (with room for a word joiner or two); whitespace-only parts are
    left out."""
    return split_by(text, limit, _cost, reserve=2)


def incoming(text: str) -> tuple[str, tuple[str, ...]]:
    """A member's message as written: Slack's entities unescaped, ``<@U…>`` read as mentions
    (and shown as ``@U…``), ``<url|label>`` as its label's URL."""
    mentions = tuple(dict.fromkeys(re.findall(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>", text)))
    text = re.sub(r"<@([UW][A-Z0-9]+)(?:\|[^>]*)?>", r"@\1", text)
    text = re.sub(r"<((?:https?|mailto):[^>|]+)(?:\|[^>]*)?>", r"\1", text)
    return html.unescape(text), mentions


def slash_text(text: str) -> str:
    """``/corral stop`` → ``!stop``; ``/corral anything else`` is a message."""
    word, space, rest = text.strip().partition(" ")
    command = COMMANDS.get(word.lower())
    return f"{command}{space}{rest}" if command is not None else text.strip()


def _blocks(text: str, action: str | None, label: str = "") -> list[dict[str, Any]]:
    section = text if len(text) <= MAX_SECTION else text[: MAX_SECTION - 1] + "…"
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "plain_text", "text": section}}]
    if action is not None:
        button: dict[str, Any] = {"type": "button", "action_id": action, "value": action,
                                  "text": {"type": "plain_text", "text": label}}
        if action == STOP_ACTION:
            button["style"] = "danger"
        blocks.append({"type": "actions", "block_id": action, "elements": [button]})
    return blocks


class _Socket:
    """One WebSocket client connection: wsproto over a Trio stream."""

    def __init__(self, stream: trio.abc.Stream, conn: wsproto.WSConnection) -> None:
        self.stream, self.conn = stream, conn
        self.texts: deque[str] = deque()
        self._partial: list[str] = []
        self.closed = False
        self.heard = trio.current_time()
        """When a frame last came (a pong too): what :data:`SILENCE` is measured from."""

    @classmethod
    async def open(cls, url: str) -> _Socket:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        try:
            if parts.scheme == "wss":
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    host, port, ssl_context=ssl.create_default_context(), https_compatible=True)
            else:
                stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise Transient(f"socket mode: {host}:{port}: {exc}") from None
        conn = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        socket = cls(stream, conn)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        await socket._write(conn.send(ws.Request(host=host, target=target)))
        while True:
            data = await socket._read()
            for event in conn.events():
                if isinstance(event, ws.AcceptConnection):
                    socket._feed()
                    return socket
                if isinstance(event, ws.RejectConnection):
                    await stream.aclose()
                    raise Transient(f"socket mode: the WebSocket was refused ({event.status_code})")
            if not data:
                raise Transient("socket mode: the server closed during the handshake")

    async def _write(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise Transient(f"socket mode: the socket dropped ({type(exc).__name__})") from None

    async def _read(self) -> bytes:
        try:
            data = bytes(await self.stream.receive_some(65536))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise Transient(f"socket mode: the socket dropped ({type(exc).__name__})") from None
        self.conn.receive_data(data or None)
        self.heard = trio.current_time()
        return data

    def _feed(self) -> list[bytes]:
        """Reads wsproto's events; returns what must be written back (pongs, the close)."""
        out: list[bytes] = []
        for event in self.conn.events():
            if isinstance(event, ws.TextMessage):
                self._partial.append(event.data)
                if event.message_finished:
                    self.texts.append("".join(self._partial))
                    self._partial = []
            elif isinstance(event, ws.Ping):
                out.append(self.conn.send(event.response()))
            elif isinstance(event, ws.CloseConnection):
                self.closed = True
                if self.conn.state == wsproto.connection.ConnectionState.REMOTE_CLOSING:
                    out.append(self.conn.send(event.response()))
        return out

    async def receive(self) -> str | None:
        """The next text message; None if nothing came for :data:`PING_EVERY` seconds (a ping
        is sent then). :class:`Transient` when the socket closes or drops."""
        while not self.texts:
            if self.closed:
                raise Transient("socket mode: the server closed the WebSocket")
            data = b""
            with trio.move_on_after(PING_EVERY) as idle:
                data = await self._read()
            if idle.cancelled_caught:
                await self._write(self.conn.send(ws.Ping(b"corral")))
                return None
            for reply in self._feed():
                await self._write(reply)
            if not data:
                raise Transient("socket mode: the socket dropped")
        return self.texts.popleft()

    async def send(self, text: str) -> None:
        await self._write(self.conn.send(ws.TextMessage(data=text)))

    async def aclose(self) -> None:
        # (shielded, so a cancelled bridge still closes it; bounded, so a dead peer does not hold it)
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            try:
                if self.conn.state == wsproto.connection.ConnectionState.OPEN:
                    await self.stream.send_all(self.conn.send(ws.CloseConnection(code=1000)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, wsproto.utilities.LocalProtocolError):
                pass
            await self.stream.aclose()


class SlackPlatform:
    """One Slack app's connection: Socket Mode in, the Web API out, as its bot user."""

    kind = "slack"
    can_edit = True
    idempotent_posts = False  # (chat.postMessage has no idempotency key: marked before it is made)

    def __init__(self, config: BridgeConfig) -> None:
        options = config.options
        self.config = config
        self.bot_token_file = options["bot_token_file"]
        self.app_token_file = options["app_token_file"]
        self.api = str(options.get("api_url", SLACK_API)).rstrip("/")
        self.threads = bool(options.get("threads", False))
        self.http = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_keepalive_connections=4))
        self.bot_token = self.app_token = ""
        self.user_id = self.bot_id = ""
        self.scope = "0"
        self.channels: set[str] = set()
        self._seen: deque[str] = deque(maxlen=_SEEN)
        self._thread: dict[str, str] = {}
        """Channel → the thread its answers go to (``threads = true``)."""
        self._thread_of: dict[str, str] = {}
        """``CHANNEL:TS`` of a member's message → its thread's root."""
        self._button: dict[str, tuple[str, str | None, str]] = {}
        """Channel → the message showing its Stop button: its ts, its turn, its text."""
        self._progress: dict[str, list[str]] = {}
        """Op key → the messages of it already sent (a retried post resumes, sends nothing twice)."""

    # ---------------------------------------------------------- the wire

    async def call(self, method: str, params: Mapping[str, Any], *, token: str | None = None) -> dict[str, Any]:
        """One Web API call; its answer, or :class:`Transient` / :class:`Refused` (the one place
        Web API errors are read)."""
        try:
            reply = await self.http.post(f"{self.api}/{method}", json=safe(dict(params)),
                                         headers={"Authorization": f"Bearer {token or self.bot_token}"})
        except httpx.TransportError as exc:
            raise Transient(f"{method}: {type(exc).__name__}: {exc or 'no answer'}") from None
        if reply.status_code == 429:
            header = reply.headers.get("retry-after", "")
            raise Transient(f"{method}: rate limited (429)", retry_after=float(header) if header.isdigit() else None)
        if reply.status_code >= 500:
            raise Transient(f"{method}: {reply.status_code}")
        try:
            data = reply.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise Refused(f"{method}: {reply.status_code}, and no Web API answer (is api_url Slack's?)")
        if data.get("ok") is True:
            return data
        error = str(data.get("error", "unknown_error"))
        if error in ("ratelimited", "fatal_error", "internal_error", "service_unavailable", "request_timeout"):
            raise Transient(f"{method}: {error}")
        raise Refused(f"{method}: {error}")

    # ---------------------------------------------------------- Platform

    async def connect(self) -> None:
        self.bot_token = self.bot_token_file.read_text().strip()
        self.app_token = self.app_token_file.read_text().strip()
        try:
            me = await self.call("auth.test", {})
        except Refused as exc:
            raise Refused(f"the bot token in {self.bot_token_file} is refused ({exc})") from None
        self.user_id, self.bot_id = str(me.get("user_id", "")), str(me.get("bot_id", ""))
        log.info("slack: bridge %s is %s (%s) in %s", self.config.name, me.get("user"), self.user_id, me.get("team"))

    async def rooms(self, configured: Mapping[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for room, channel in configured.items():
            if await self.join(room):
                out[room] = channel
        return out

    async def join(self, room: str) -> bool:
        """A channel is bridged if the bot can see it (``conversations.info``); a member invites it."""
        try:
            info = (await self.call("conversations.info", {"channel": room})).get("channel") or {}
        except Refused as exc:
            log.error("slack: the bot cannot see the channel %s (%s): invite the app to it (/invite @app); "
                      "it is not bridged", room, exc)
            return False
        if info.get("is_member") is False and not info.get("is_im"):
            log.warning("slack: the bot is not a member of %s: invite the app to it (/invite @app) to hear it", room)
        self.channels.add(room)
        return True

    async def events(self, cursor: str | None) -> AsyncIterator[Batch]:
        try:
            opened = await self.call("apps.connections.open", {}, token=self.app_token)
        except Refused as exc:
            raise Refused(f"the app-level token in {self.app_token_file} is refused ({exc}): it must be an "
                          "xapp- token with connections:write, and Socket Mode must be on") from None
        url = str(opened.get("url", ""))
        parts = urlsplit(url)
        if parts.scheme != "wss" and not (parts.scheme == "ws" and parts.hostname in ("127.0.0.1", "localhost", "::1")):
            raise Refused(f"apps.connections.open: not a wss:// URL: {url.split('?')[0]!r}")
        socket = await _Socket.open(url)
        try:
            while True:
                text = await socket.receive()
                if text is None:
                    if trio.current_time() - socket.heard >= SILENCE:  # (not even a pong for the last ping)
                        raise Transient(f"socket mode: nothing heard for {SILENCE:.0f} s")
                    continue
                try:
                    envelope = json.loads(text)
                except ValueError:
                    log.warning("slack: an envelope that is not JSON; skipped")
                    continue
                if not isinstance(envelope, dict):
                    continue
                kind = envelope.get("type")
                if kind == "hello":
                    log.info("slack: bridge %s listens (socket mode)", self.config.name)
                    yield Batch((), None)
                    continue
                if kind == "disconnect":
                    raise Transient(f"socket mode: Slack asked to reconnect ({envelope.get('reason')})", retry_after=0)
                envelope_id = envelope.get("envelope_id")
                if isinstance(envelope_id, str):  # acknowledged as read: within Slack's 3 s, whatever else waits
                    await socket.send(json.dumps({"envelope_id": envelope_id}))
                events = self._envelope(envelope)
                if events:
                    yield Batch(tuple(events), None)
        finally:
            await socket.aclose()

    def _first(self, key: str) -> bool:
        if key in self._seen:
            log.debug("slack: %s came again; skipped", key)
            return False
        self._seen.append(key)
        return True

    def _envelope(self, envelope: Mapping[str, Any]) -> list[Inbound]:
        envelope_id, payload = str(envelope.get("envelope_id")), envelope.get("payload")
        if not isinstance(payload, dict) or not self._first(f"v{envelope_id}"):
            return []
        kind = envelope.get("type")
        if kind == "events_api":
            event = payload.get("event")
            if not isinstance(event, dict) or not self._first(f"e{payload.get('event_id')}"):
                return []
            return self._event(event, str(payload.get("event_id")))
        if kind == "interactive" and payload.get("type") == "block_actions":
            user = (payload.get("user") or {}).get("id")
            container = payload.get("container") or {}
            channel = str(container.get("channel_id") or (payload.get("channel") or {}).get("id"))
            ts = str(container.get("message_ts") or (payload.get("message") or {}).get("ts"))
            out: list[Inbound] = []
            for action in payload.get("actions") or []:
                key = {STOP_ACTION: STOP_REACTION, RESEND_ACTION: RESEND_REACTION}.get(str(action.get("action_id")))
                if key is not None and isinstance(user, str):
                    out.append(Reacted(channel, f"b{channel}:{ts}:{action.get('action_ts')}", user, key,
                                       f"{channel}:{ts}"))
            return out
        if kind == "slash_commands":
            user, channel = payload.get("user_id"), str(payload.get("channel_id"))
            if not isinstance(user, str):
                return []
            return [Said(channel, f"c{payload.get('trigger_id') or envelope_id}", user,
                         slash_text(str(payload.get("text", ""))))]
        return []

    def _event(self, event: Mapping[str, Any], event_id: str) -> list[Inbound]:
        kind, user, channel = event.get("type"), event.get("user"), str(event.get("channel"))
        if kind == "message":
            subtype = event.get("subtype")
            if event.get("bot_id") or subtype in ("bot_message", "message_changed", "message_deleted") \
                    or user in (None, self.user_id):
                return []  # (bots' speech, this bot's included, and edits: answering them is how loops start)
            ts = str(event.get("ts"))
            root = str(event.get("thread_ts") or ts)
            self._thread_of[f"{channel}:{ts}"] = root
            self._thread[channel] = root
            if subtype == "file_share" or (event.get("files") and not event.get("text")):
                return [Unreadable(channel, f"{channel}:{ts}", str(user), "agents read text messages, not a file")]
            if subtype not in (None, "thread_broadcast"):
                return []  # (someone joined, the topic changed)
            text, mentions = incoming(str(event.get("text", "")))
            return [Said(channel, f"{channel}:{ts}", str(user), text, mentions)]
        if kind == "reaction_added" and isinstance(user, str) and user != self.user_id:
            item = event.get("item") or {}
            reaction = str(event.get("reaction", "")).split("::")[0]  # (skin tones)
            where = str(item.get("channel"))
            return [Reacted(where, f"e{event_id}", user, REACTIONS.get(reaction, f":{reaction}:"),
                            f"{where}:{item.get('ts')}")]
        if kind == "member_joined_channel" and user == self.user_id:
            return [Invited(channel, str(event.get("inviter", "")))]
        return []

    # ---------------------------------------------------------- posting

    def _target(self, event: str) -> tuple[str, str]:
        channel, _, ts = event.partition(":")
        return channel, ts

    def _thread_for(self, room: str, reply_to: str | None) -> str | None:
        if not self.threads:
            return None
        if reply_to is not None and reply_to in self._thread_of:
            return self._thread_of[reply_to]
        return self._thread.get(room)

    async def _send(self, room: str, text: str, *, thread: str | None, action: str | None = None,
                    label: str = "") -> str:
        params: dict[str, Any] = {"channel": room, "text": text, "mrkdwn": False, "parse": "none",
                                  "link_names": False, "unfurl_links": False, "unfurl_media": False}
        if thread is not None:
            params["thread_ts"] = thread
        if action is not None:
            params["blocks"] = _blocks(text, action, label)
        sent = await self.call("chat.postMessage", params)
        if not isinstance(sent.get("ts"), str):
            raise Refused(f"chat.postMessage: no ts in {sent!r}")
        return str(sent["ts"])

    async def post(self, op: Post) -> str:
        text, action, label = op.text, None, ""
        if op.notice and op.text.endswith(_RESEND_HINT):
            text = op.text.removesuffix(_RESEND_HINT) + f"Press {RESEND_REACTION} Send again to send it again."
            action, label = RESEND_ACTION, f"{RESEND_REACTION} Send again"
        parts = [neutral(part) for part in split_message(text)]
        button = (op.notice and op.turn is not None and not op.ends
                  and self._button.get(op.room, ("", None, ""))[1] != op.turn)
        thread = self._thread_for(op.room, op.reply_to)
        done = self._progress.setdefault(op.key, [])
        try:
            for i, part in enumerate(parts[len(done):], start=len(done)):
                last = i == len(parts) - 1
                if button and last:
                    done.append(await self._send(op.room, part, thread=thread, action=STOP_ACTION, label="🛑 Stop"))
                else:
                    done.append(await self._send(op.room, part, thread=thread, action=action if i == 0 else None,
                                                 label=label))
        except Refused:
            del self._progress[op.key]
            raise
        del self._progress[op.key]
        if button:
            await self._take_off(op.room)
            self._button[op.room] = (done[-1], op.turn, parts[-1])
        else:
            await self._unbutton(op.room, op.turn, op.text, saved=(op.seq is not None and not op.notice) or op.ends)
        return f"{op.room}:{done[0]}"

    async def edit(self, op: Edit, target: str) -> str:
        channel, ts = self._target(target)
        parts = [neutral(part) for part in split_message(op.text)]
        params: dict[str, Any] = {"channel": channel, "ts": ts, "text": parts[0], "parse": "none",
                                  "link_names": False}
        had = self._button.get(op.room)
        await self._unbutton(op.room, op.turn, op.text, saved=op.final or op.ends)
        if had is not None and had[0] == ts:  # (an update without blocks would show the old ones' text)
            keep = self._button.get(op.room, ("",))[0] == ts
            params["blocks"] = _blocks(parts[0], STOP_ACTION if keep else None, "🛑 Stop")
            if keep:
                self._button[op.room] = (ts, had[1], parts[0])
        await self.call("chat.update", params)
        if op.final:
            done = self._progress.setdefault(op.key, [])
            for part in parts[1 + len(done):]:
                done.append(await self._send(op.room, part, thread=self._thread_for(op.room, None)))
            del self._progress[op.key]
        return target

    async def _unbutton(self, room: str, turn: str | None, text: str, *, saved: bool) -> None:
        """Take the channel's Stop button off when its turn has ended."""
        shown = self._button.get(room)
        if shown is not None and ((saved and turn == shown[1]) or (turn is None and text.startswith(ENDINGS))):
            await self._take_off(room)

    async def _take_off(self, room: str) -> None:
        shown = self._button.pop(room, None)
        if shown is None:
            return
        ts, _, text = shown
        try:
            await self.call("chat.update", {"channel": room, "ts": ts, "text": text, "blocks": _blocks(text, None),
                                            "parse": "none", "link_names": False})
        except (Refused, Transient) as exc:
            # Not retried: the post it follows is made, and a retry would make it twice. A button
            # left on an ended turn stops nothing more (the core judges a press on it).
            log.info("slack: the Stop button of %s:%s was not taken off: %s", room, ts, exc)

    async def react(self, op: React) -> str:
        channel, ts = self._target(op.target)
        name = EMOJI_NAMES.get(op.emoji, "eyes")
        try:
            await self.call("reactions.add", {"channel": channel, "timestamp": ts, "name": name})
        except Refused as exc:
            if "already_reacted" not in str(exc):
                raise
        return f"{op.target}:r"

    def server_of(self, sender: str) -> str | None:
        return None  # (one workspace: allowlist user ids)

    async def aclose(self) -> None:
        await self.http.aclose()
