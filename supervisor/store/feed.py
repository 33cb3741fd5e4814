"""The store's feed: what followers are shown, once each, in commit order.

Theory of operation
-------------------

* **One store**: the writer hands every committed batch's entries here (:meth:`Feed.committed`),
  in commit order, which is seq order; a follower reads what is stored past its resume point, then
  takes the live ones, skipping any it has already read. A follower that falls 10,000 entries
  behind is dropped from the live feed and reads from the database again.
* **A fleet** goes by commit positions (``entries.pos``): this host's entries are shown at once
  when they come right after what followers were shown; otherwise (another host committed in
  between, :meth:`Feed.others_committed`) the task :meth:`Feed.show_others` reads every entry past
  that point back from the database, in order, so only what is committed is shown and every
  follower sees one order. A resume point is a seq; its position is looked up.
* **Drafts** (live output, never stored) go to the followers that asked for them, in the order
  shown relative to the commits; a follower too far behind skips a draft rather than re-reading.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Literal, Protocol, TypeVar, overload

import trio

from ..core.records import Draft, Entry
from . import statements
from .engines import Engine, StoreError

log = logging.getLogger("corral.store")
T = TypeVar("T")

#: How many other hosts' entries a fleet host reads back for its followers at a time.
_SHOW_BATCH = 1000


class Reads(Protocol):
    """Runs a read in the store's thread (its failures as :class:`StoreError`)."""

    async def __call__(self, read: Callable[[], T], /) -> T: ...


class _Subscription:
    def __init__(self, channel: str | None, *, drafts: bool = False) -> None:
        self.channel = channel
        self.drafts = drafts
        self.send, self.receive = trio.open_memory_channel[Entry | Draft](10_000)
        self.overflowed = False


class Feed:
    """The followers of a store on ``db`` (reads run by ``read``); ``fleet``: a fleet host's,
    every entry up to commit position ``shown`` already committed before it opened."""

    def __init__(self, db: Engine, read: Reads, *, fleet: bool, shown: int = 0) -> None:
        self._db, self._read, self._fleet = db, read, fleet
        self._subs: dict[str | None, set[_Subscription]] = defaultdict(set)
        self._shown = shown
        """(A fleet) the commit position up to which followers have been shown every entry."""
        self._behind = trio.Event()
        """(A fleet) set when another host committed entries (or this host's came out of turn)."""

    def committed(self, entries: list[Entry]) -> None:
        """A batch's entries are committed: show them to followers."""
        if self._fleet:
            self._show_own(entries)
            return
        for entry in entries:
            self._publish(entry)

    def others_committed(self, last: int | None = None) -> None:
        """(A fleet) another host's commit placed entries up to position ``last`` (its notice;
        None: maybe, a heartbeat's look for notices lost): :meth:`show_others` reads them."""
        if last is None or last > self._shown:
            self._behind.set()

    async def show_others(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """(A fleet, a task) show this host's followers what other hosts commit, in commit
        order, read back from the database (so only what is committed is shown)."""
        task_status.started()
        while True:
            await self._behind.wait()
            self._behind = trio.Event()
            try:
                await self._show_committed()
            except StoreError as exc:
                log.warning("could not read other hosts' entries for followers (the next notice or"
                            " heartbeat tries again): %s", exc)

    async def _show_committed(self) -> None:
        if not any(self._subs.values()):
            # Nobody to show them to: only how far they go (a follower to come reads the database).
            self._shown = max(self._shown, await self._read(lambda: statements.top_position(self._db)))
            return
        while True:
            rows = await self._read(functools.partial(statements.placed_after, self._db, self._shown, _SHOW_BATCH))
            for entry in rows:
                assert entry.pos is not None
                if entry.pos > self._shown:
                    self._publish(entry)
                    self._shown = entry.pos
            if len(rows) < _SHOW_BATCH:
                return

    def _show_own(self, entries: list[Entry]) -> None:
        """(A fleet) this host's committed entries: shown now if they come right after what
        followers were shown; else other hosts' commits came between, and the reader shows
        everything from there in order."""
        fresh = [e for e in entries if e.pos is not None and e.pos > self._shown]
        if not fresh:
            return
        if not any(self._subs.values()):
            self._shown = max(self._shown, fresh[-1].pos or 0)  # (a follower to come reads from the database)
        elif fresh[0].pos == self._shown + 1:
            for entry in fresh:
                self._publish(entry)
            self._shown = fresh[-1].pos or 0
        else:
            self._behind.set()

    def _publish(self, entry: Entry) -> None:
        for key in (entry.channel, None):
            for sub in list(self._subs.get(key, ())):
                try:
                    sub.send.send_nowait(entry)
                except trio.WouldBlock:
                    sub.overflowed = True
                    sub.send.close()
                    self._subs[key].discard(sub)

    def show_draft(self, draft: Draft) -> None:
        """Hand ``draft`` to the live followers that asked for drafts; nothing is written.

        A follower too far behind to take it skips it (the next draft of the run carries
        everything before it, and the entry that saves the run follows in any case): a draft
        never makes a follower re-read the database the way a full queue of entries does."""
        for key in (draft.channel, None):
            for sub in list(self._subs.get(key, ())):
                if sub.drafts:
                    try:
                        sub.send.send_nowait(draft)
                    except trio.WouldBlock:
                        pass

    @overload
    def follow(
        self, channel: str | None, after: int = 0, *, drafts: Literal[False] = False
    ) -> AsyncIterator[Entry]: ...

    @overload
    def follow(self, channel: str | None, after: int = 0, *, drafts: bool) -> AsyncIterator[Entry | Draft]: ...

    async def follow(
        self, channel: str | None, after: int = 0, *, drafts: bool = False
    ) -> AsyncIterator[Entry | Draft]:
        """As :meth:`.Store.follow`."""
        column = "pos" if self._fleet else "seq"
        floor = await self._read(lambda: statements.position(self._db, after)) if self._fleet else after

        def key(entry: Entry) -> int:
            return (entry.pos or 0) if self._fleet else entry.seq

        while True:
            sub = _Subscription(channel, drafts=drafts)
            self._subs[channel].add(sub)
            try:
                for entry in await self._rows(channel, column, floor, 100_000):
                    if key(entry) > floor:
                        yield entry
                        floor = key(entry)
                async for item in sub.receive:
                    if isinstance(item, Draft):
                        yield item
                    elif key(item) > floor:
                        yield item
                        floor = key(item)
            finally:
                self._subs[channel].discard(sub)
                sub.send.close()
            if not sub.overflowed:
                return
            # A follower that fell 10,000 entries behind re-reads from the database.

    async def entries(self, channel: str | None, *, after: int, limit: int, newest: bool) -> list[Entry]:
        """As :meth:`.Store.entries`."""
        if not self._fleet:
            return await self._rows(channel, "seq", after, limit, newest)
        floor = await self._read(lambda: statements.position(self._db, after))
        return await self._rows(channel, "pos", floor, limit, newest)

    async def _rows(
        self, channel: str | None, column: str, after: int, limit: int, newest: bool = False
    ) -> list[Entry]:
        return await self._read(lambda: statements.entries(self._db, channel, column, after, limit, newest))
