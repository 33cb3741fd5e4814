"""A line reader for Trio byte streams, with a maximum line length.

Trio has no line reader. This one never holds more than ``max_line`` bytes of a line:
the excess of an over-long line is discarded and the line is reported as truncated, so a
CLI that prints a megabyte without a newline cannot exhaust the daemon's memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import trio

#: Default cap on one line of agent output.
MAX_LINE = 1 << 20


@dataclass(frozen=True, slots=True)
class Line:
    """One line without its newline; ``truncated`` if bytes past the cap were dropped."""

    data: bytes
    truncated: bool = False

    def text(self) -> str:
        """The line decoded as UTF-8; undecodable bytes become U+FFFD."""
        return self.data.decode("utf-8", errors="replace")


class LineSplitter:
    """The pure part: feed bytes in, get complete lines out."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._truncated = False

    def feed(self, data: bytes) -> list[Line]:
        """Add bytes; return every line they complete."""
        lines: list[Line] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._append(data[start:])
                return lines
            self._append(data[start:end])
            lines.append(self._take())
            start = end + 1

    def flush(self) -> list[Line]:
        """At end of stream: the last line if it had no newline."""
        if self._buf or self._truncated:
            return [self._take()]
        return []

    def _append(self, chunk: bytes) -> None:
        room = self.max_line - len(self._buf)
        if len(chunk) > room:
            self._buf += chunk[:room]
            self._truncated = True
        else:
            self._buf += chunk

    def _take(self) -> Line:
        data = bytes(self._buf)
        if data.endswith(b"\r"):
            data = data[:-1]
        line = Line(data, self._truncated)
        self._buf.clear()
        self._truncated = False
        return line


class LineReader:
    """Read lines from a Trio receive stream, a batch at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_line: int = MAX_LINE, chunk: int = 65536) -> None:
        self._stream = stream
        self._splitter = LineSplitter(max_line)
        self._chunk = chunk
        self.eof = False

    async def read_lines(self) -> list[Line]:
        """Wait for at least one complete line (or EOF); return every line available.

        Returns an empty list only at EOF.
        """
        while not self.eof:
            data = await self._stream.receive_some(self._chunk)
            if not data:
                self.eof = True
                return self._splitter.flush()
            lines = self._splitter.feed(bytes(data))
            if lines:
                return lines
        return []

    def read_ready(self, max_reads: int = 16) -> list[Line]:
        """Every line already in the pipe, without waiting (no checkpoint): read until it is
        empty, at EOF (then :attr:`eof` is set), or after ``max_reads`` chunks (a writer still
        alive may refill it forever). Only for a stream over a file descriptor, else nothing.

        A stopped turn's teardown drains its stdout once everything that could write is
        dead: this reads what is left, and the EOF, without a wake-up of the turn's task.
        """
        stream = self._stream
        if self.eof or not isinstance(stream, trio.lowlevel.FdStream):
            return []
        lines: list[Line] = []
        for _ in range(max_reads):
            try:
                data = os.read(stream.fileno(), self._chunk)  # the fd is non-blocking (FdStream)
            except BlockingIOError:
                break
            if not data:
                self.eof = True
                lines += self._splitter.flush()
                break
            lines += self._splitter.feed(data)
        return lines
