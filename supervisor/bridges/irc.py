"""IRC: a client of RFC 1459/2812 over a Trio stream (TLS optional), no library.

IRC keeps the bridge interface honest: it has no event ids, no history, no edits and no
reactions. What follows from that:

* **Exactly once.** A server never redelivers a line, so each PRIVMSG arrives at most once;
  the bridge still gives it an origin (this connection's id and the line's number) so the
  store's rule is the same as Matrix's. A reconnect does not replay; a line sent while the
  bridge was away is not seen (IRC has no backlog).
* **Posts** are at most once (the room's cursor moves before the line is written: a crash
  between loses a line rather than repeating it). Long text is split into lines of at most
  400 bytes; an agent speaks as ``name: text`` through the bridge's nick, its name on every
  line (a bare second line could pass for a relayed human's), and its controls made visible.
* **No edits, no reactions**: drafts are not shown (the saved message is posted), status
  lines are posted once per turn (``verbose``: each one), and Stop is ``!stop`` only.
* **Who**: a sender is ``nick!user@host``; allowlists match it exactly or as a glob
  (``alice!*@example.org``); ``servers`` names hosts. A nick alone is spoofable on a network
  without services: allowlist full masks there.
"""

from __future__ import annotations

import logging
import secrets
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

import trio

from ..core.text import shown
from .core import Edit, Inbound, Post, React, Said, Unreadable, safe
from .platform import Batch, Refused, Transient

if TYPE_CHECKING:
    from ..config.settings import BridgeConfig

log = logging.getLogger("corral.bridges.irc")

#: Bytes of text in one PRIVMSG (the line's limit is 512 with the prefix and CRLF).
LINE_BYTES = 400
#: Lines written at once before pacing (servers disconnect a client that floods).
BURST = 5
PACE = 0.3


def split_lines(text: str, budget: int = LINE_BYTES) -> list[str]:
    """``text`` as PRIVMSG lines of at most ``budget`` bytes, controls made visible (an agent's
    ``\\x01`` would start a CTCP request in every client, ``\\x03`` recolour the room)."""
    out: list[str] = []
    for line in shown(safe(text).replace("\r", ""), indent=None).split("\n"):
        raw = line.encode("utf-8")
        while len(raw) > budget:
            cut = raw[:budget].decode("utf-8", errors="ignore")
            out.append(cut)
            raw = raw[len(cut.encode("utf-8")):]
        out.append(raw.decode("utf-8"))
    return [line if line else " " for line in out] or [" "]


def parse_line(line: str) -> tuple[str, str, list[str]]:
    """(prefix, command, params) of one IRC line."""
    prefix = ""
    if line.startswith(":"):
        prefix, _, line = line[1:].partition(" ")
    trailing = None
    if " :" in line:
        line, trailing = line.split(" :", 1)
    elif line.startswith(":"):
        line, trailing = "", line[1:]
    params = line.split()
    command = params.pop(0).upper() if params else ""
    if trailing is not None:
        params.append(trailing)
    return prefix, command, params


class IrcPlatform:
    """One IRC connection: the bridge's nick in every mapped channel."""

    kind = "irc"
    can_edit = False
    idempotent_posts = False

    def __init__(self, config: BridgeConfig) -> None:
        assert config.server is not None
        self.config = config
        host, _, port = config.server.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.nick = config.nick or "corral"
        self.stream: trio.abc.Stream | None = None
        self.connection = ""
        self.count = 0
        self.channels: dict[str, str] = {}
        self._buffer = b""
        self._sent_at: list[float] = []
        self._write_lock = trio.Lock()
        self.scope = "0"

    async def connect(self) -> None:
        try:
            stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
            if self.config.tls:
                stream = trio.SSLStream(stream, ssl.create_default_context(), server_hostname=self.host)
        except OSError as exc:
            raise Transient(f"cannot reach {self.host}:{self.port}: {exc}") from None
        self.stream = stream
        self._buffer = b""
        self.connection = secrets.token_hex(6)
        self.count = 0
        if self.config.password_file is not None:
            await self._write(f"PASS {self.config.password_file.read_text().strip()}")
        await self._write(f"NICK {self.nick}")
        await self._write(f"USER {self.nick} 0 * :corral bridge {self.config.name}")
        while True:
            prefix, command, params = await self._read()
            if command == "PING":
                await self._write(f"PONG :{params[-1] if params else ''}")
            elif command == "001":
                return
            elif command in ("432", "433", "436"):
                raise Refused(f"the nick {self.nick!r} is refused: {params[-1] if params else command}")
            elif command == "ERROR":
                raise Transient(f"the server closed the connection: {params[-1] if params else ''}")

    async def rooms(self, configured: Mapping[str, str]) -> dict[str, str]:
        self.channels = {room.lower(): channel for room, channel in configured.items()}
        for room in list(self.channels):
            await self.join(room)
        return dict(self.channels)

    async def join(self, room: str) -> bool:
        """Join and wait for the server's answer (a line said after it is then seen)."""
        await self._write(f"JOIN {room}")
        while True:
            prefix, command, params = await self._read()
            if command == "PING":
                await self._write(f"PONG :{params[-1] if params else ''}")
            elif command == "JOIN" and prefix.split("!")[0] == self.nick and params and params[0].lower() == room:
                return True
            elif command in ("403", "405", "471", "473", "474", "475", "476"):
                log.error("irc: cannot join %s: %s; it is not bridged", room, params[-1] if params else command)
                self.channels.pop(room, None)
                return False

    async def events(self, cursor: str | None) -> AsyncIterator[Batch]:
        if self.stream is None:  # a reconnect after a failure
            await self.connect()
            for room in list(self.channels):
                await self.join(room)
        yield Batch((), None)  # (listening: IRC has no backlog to read first)
        while True:
            prefix, command, params = await self._read()
            if command == "PING":
                await self._write(f"PONG :{params[-1] if params else ''}")
                continue
            if command == "ERROR":
                await self._drop()
                raise Transient(f"the server closed the connection: {params[-1] if params else ''}")
            if command in ("474", "473", "475", "471", "403"):
                log.error("irc: cannot join %s: %s", params[1] if len(params) > 1 else "?", params[-1])
                continue
            if command not in ("PRIVMSG", "NOTICE") or len(params) < 2 or "!" not in prefix:
                continue
            target, text = params[0].lower(), params[1]
            if command == "NOTICE" or target not in self.channels:
                continue  # (notices are bots' speech; a private message is not a room's)
            self.count += 1
            event = f"{self.connection}.{self.count}"
            inbound: Inbound
            if text.startswith("\x01"):  # CTCP (ACTION): read as text without its markers
                text = text.strip("\x01").removeprefix("ACTION ")
            if "\ufffd" in text:
                inbound = Unreadable(target, event, prefix, "the line is not valid UTF-8")
            else:
                inbound = Said(target, event, prefix, text)
            yield Batch((inbound,), None)

    async def post(self, op: Post) -> str:
        command = "NOTICE" if op.notice else "PRIVMSG"
        # Each line names its author: a bare second line could pass for someone else's message.
        head = f"{op.speaker}: " if op.speaker else ""
        text = op.text.removeprefix(head)
        for line in split_lines(text, LINE_BYTES - len(head.encode("utf-8"))):
            await self._write(f"{command} {op.room} :{head}{line}", paced=True)
        return f"{self.connection}.out.{op.key}"

    async def edit(self, op: Edit, target: str) -> str:
        raise Refused("IRC cannot edit a message")

    async def react(self, op: React) -> str:
        raise Refused("IRC has no reactions")

    def server_of(self, sender: str) -> str | None:
        _, at, host = sender.partition("@")
        return host if at else None

    async def aclose(self) -> None:
        if self.stream is not None:
            try:
                with trio.move_on_after(1):
                    await self._write("QUIT :corral bridge stopping")
            except Transient:
                pass
        await self._drop()

    async def _drop(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            await trio.aclose_forcefully(stream)

    async def _write(self, line: str, *, paced: bool = False) -> None:
        if self.stream is None:
            raise Transient("not connected")
        async with self._write_lock:
            if paced:
                now = trio.current_time()
                self._sent_at = [t for t in self._sent_at if t > now - BURST * PACE]
                if len(self._sent_at) >= BURST:
                    await trio.sleep_until(self._sent_at[0] + BURST * PACE)
                self._sent_at.append(trio.current_time())
            try:
                await self.stream.send_all(line.encode("utf-8", errors="replace")[:510] + b"\r\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.stream = None
                raise Transient(f"the connection broke: {exc}") from None

    async def _read(self) -> tuple[str, str, list[str]]:
        while b"\n" not in self._buffer:
            if self.stream is None:
                raise Transient("not connected")
            try:
                data = await self.stream.receive_some(4096)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.stream = None
                raise Transient(f"the connection broke: {exc}") from None
            if not data:
                self.stream = None
                raise Transient("the server closed the connection")
            self._buffer += data
            if len(self._buffer) > 64 * 1024:
                self._buffer = self._buffer[-8192:]
        raw, self._buffer = self._buffer.split(b"\n", 1)
        return parse_line(raw.rstrip(b"\r").decode("utf-8", errors="replace"))
