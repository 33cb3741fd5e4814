"""An agent's stdin kept open for messages handed to its running turn ("steering").

Theory of operation
-------------------

A per-turn CLI that takes messages mid-turn (an adapter with ``steer``, a launch with
``keep_stdin``) keeps its stdin pipe open after the prompt. Three things write to it or end
it: the prompt (the turn's point of no return), each steered message, and the close (once
the CLI reports its result, or in the turn's teardown). One lock, held across a whole
message, puts them in order: two messages never interleave, and a close asked for while a
message is being written waits until that message is whole.

The rule of the point of no return holds for every message, not only the first: the
caller's ``refusal`` (the ledger's answer) is asked right before the first byte is written,
with no checkpoint between. Trio's ``send_all`` checkpoints before it writes, so the first
chunk goes out with a plain ``os.write`` on the descriptor (non-blocking: ``FdStream`` made
it so). When the pipe is full the writer waits until it is writable and asks again before
each further write, so a stop that lands while a long message waits for room ends it where
it is; a message cut so is the last the pipe carries (the input is closed after it: a half
line followed by another would be garbage to the agent).

A stream that is not a pipe's own descriptor (a test's wrapper of it) is written with its
``send_all`` after the question instead, and closed by :meth:`AgentInput.aclose`.

A write that cannot happen says why, as a string (the caller queues the message instead),
and never raises for it: the input closed, the agent gone (``EPIPE``), or the refusal's own
reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

#: Why a message was not written, when the input is closed (or closing).
CLOSED = "the agent's input is closed: its turn is ending"
#: Why a message was not written, when the agent's end of the pipe is gone.
GONE = "the agent's input is closed: its process has exited"


class AgentInput:
    """A turn's stdin pipe, written one whole message at a time; see the module's theory."""

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self._stream = stream
        self._pipe = stream if isinstance(stream, trio.lowlevel.FdStream) else None
        self._lock = trio.Lock()
        self._closing = False
        self._aborted = False
        self.written = 0
        """Bytes written so far (the prompt's and the steered messages')."""

    @property
    def closed(self) -> bool:
        """Closed, or to be closed once the message being written is whole: nothing more goes in."""
        return self._closing

    async def write(self, data: bytes, refusal: Callable[[], str | None]) -> str | None:
        """Write ``data`` whole: None once written, else why not (nothing, or — when a
        refusal came while the pipe was full — only a part of it was written).

        ``refusal`` is asked right before each write to the pipe, with no checkpoint between.
        """
        async with self._lock:  # (its checkpoint comes before the first question, never after)
            sent = 0
            try:
                while sent < len(data):
                    # A close asked for mid-message lets it finish; an abort does not.
                    if self._aborted or (self._closing and sent == 0):
                        return CLOSED
                    reason = refusal()
                    if reason is not None:
                        return reason
                    if self._pipe is None:
                        await self._stream.send_all(data)  # (a wrapper: its own checkpoints)
                        sent = len(data)
                        break
                    fd = self._pipe.fileno()
                    try:
                        sent += os.write(fd, memoryview(data)[sent:])
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(fd)
                    except BrokenPipeError:
                        self._closing = True
                        return GONE
                return None
            except trio.ClosedResourceError:  # aborted while it waited for room
                return CLOSED
            except trio.BrokenResourceError:  # (a wrapper's EPIPE)
                self._closing = True
                return GONE
            finally:
                self.written += sent
                if 0 < sent < len(data):
                    self._closing = True  # cut mid-message: nothing may follow the half line
                if self._closing:
                    self._close_pipe()

    def close(self) -> None:
        """Close now, or once the message being written is whole (synchronous: no checkpoint;
        a wrapper is only marked closed, and closed by :meth:`aclose`)."""
        self._closing = True
        if not self._lock.locked():
            self._close_pipe()

    def abort(self) -> None:
        """Close now, whatever is being written (a writer waiting for room is told so)."""
        self._closing = self._aborted = True
        self._close_pipe()

    async def aclose(self) -> None:
        """Close now, a wrapper too (a checkpoint: for the turn's own steps, not a decision's)."""
        self.abort()
        if self._pipe is None:
            await self._stream.aclose()

    def _close_pipe(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
