"""A wake-up for every committed entry: what the dashboard's status stream and systemd's
``STATUS=`` line re-read the daemon's state on.

A turn's progress, a stop, a message: each commits an entry, so "an entry was committed"
is the one signal that the state may have changed. Wake-ups coalesce (the channel holds
one), so a burst of entries costs its reader one re-read, and an idle daemon wakes nobody.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

from ..host.supervisor import Supervisor


@contextlib.asynccontextmanager
async def open_commit_wakeups(sup: Supervisor) -> AsyncIterator[trio.MemoryReceiveChannel[None]]:
    """A channel that holds a wake-up once an entry (of any channel) is committed.

    Entries committed before the block began wake nothing; a wake-up not yet received stands
    for every commit since.
    """
    wake_send, wake = trio.open_memory_channel[None](1)
    newest = await sup.last_seq()

    async def watch() -> None:
        async with contextlib.aclosing(sup.follow(None, after=newest)) as entries:  # type: ignore[type-var]
            async for _entry in entries:
                with contextlib.suppress(trio.WouldBlock):
                    wake_send.send_nowait(None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        yield wake
        nursery.cancel_scope.cancel()
