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
  shown relative to the commits, **coalesced and paced per follower**: a follower holds at most
  one draft of each channel in its queue (a *slot*); a newer draft of the channel replaces the
  one in the slot (latest wins: each draft carries the whole run), so showing a draft costs a
  dictionary look-up per follower and never blocks the turn or another follower. The follower
  itself takes a slot's draft at most ``drafts_per_second`` times a second per channel (a
  generic cell rate: one draft ahead of the rate is let through, for the agent's own jitter);
  one that comes sooner is held back until it is due, still taking the newer drafts meanwhile.
  An entry of the channel closes the slot (a later draft opens a new one, after the entry):
  the slot's draft is dropped if the entry saves it, else shown before the entry. So what a
  follower is sent grows with its channels and the pace, not with the agents' deltas, and a
  slow follower skips drafts, never entries (a follower 10,000 entries behind re-reads the
  database, above).
"""

from __future__ import annotations

import functools
import heapq
import itertools
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
#: The most drafts of one channel a follower is sent a second (see the theory).
DRAFTS_PER_SECOND = 10.0


class Reads(Protocol):
    """Runs a read in the store's thread (its failures as :class:`StoreError`)."""

    async def __call__(self, read: Callable[[], T], /) -> T: ...


class _Slot:
    """A follower's place in its queue for one channel's newest draft (None: dropped)."""

    __slots__ = ("channel", "draft")

    def __init__(self, draft: Draft) -> None:
        self.channel = draft.channel
        self.draft: Draft | None = draft


class _Subscription:
    def __init__(self, channel: str | None, *, drafts: bool = False, per_second: float = DRAFTS_PER_SECOND) -> None:
        self.channel = channel
        self.drafts = drafts
        self.send, self.receive = trio.open_memory_channel[Entry | _Slot](10_000)
        self.overflowed = False
        self.slots: dict[str, _Slot] = {}
        """Each channel's open slot, queued or held back: a newer draft replaces its draft."""
        self.interval = 1.0 / per_second
        self.due: dict[str, float] = {}
        """Each channel's theoretical time of its next draft (the cell rate's), pruned when past."""

    def show(self, draft: Draft) -> None:
        """Put ``draft`` in its channel's slot (replacing the one there) or queue a new slot."""
        slot = self.slots.get(draft.channel)
        if slot is not None:
            slot.draft = draft
            return
        slot = _Slot(draft)
        try:
            self.send.send_nowait(slot)
        except trio.WouldBlock:
            return  # (too far behind: the draft is skipped, the entries are what count)
        self.slots[draft.channel] = slot

    def close_slot(self, entry: Entry) -> None:
        """An entry of the slot's channel is queued after it: a later draft goes after the entry;
        the slot's draft is dropped if the entry saves it."""
        slot = self.slots.pop(entry.channel, None)
        if slot is not None and slot.draft is not None and entry.meta.get("draft") == slot.draft.draft:
            slot.draft = None

    def take(self, slot: _Slot, now: float) -> Draft | None:
        """The slot's draft, sent now (its channel's next one due a cell later)."""
        if self.slots.get(slot.channel) is slot:
            del self.slots[slot.channel]
        draft, slot.draft = slot.draft, None
        if draft is not None:
            self.due[slot.channel] = max(self.due.get(slot.channel, now), now) + self.interval
            if len(self.due) > 2 * len(self.slots) + 64:
                self.due = {c: t for c, t in self.due.items() if t > now}
        return draft

    def held_until(self, slot: _Slot, now: float) -> float | None:
        """When the slot's draft is due, if not now (one cell of tolerance)."""
        due = self.due.get(slot.channel, now) - self.interval
        return due if due > now else None


class Feed:
    """The followers of a store on ``db`` (reads run by ``read``); ``fleet``: a fleet host's,
    every entry up to commit position ``shown`` already committed before it opened."""

    def __init__(
        self, db: Engine, read: Reads, *, fleet: bool, shown: int = 0, drafts_per_second: float = DRAFTS_PER_SECOND
    ) -> None:
        self._db, self._read, self._fleet = db, read, fleet
        self._drafts_per_second = drafts_per_second
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
                if sub.slots:
                    sub.close_slot(entry)
                try:
                    sub.send.send_nowait(entry)
                except trio.WouldBlock:
                    sub.overflowed = True
                    sub.send.close()
                    self._subs[key].discard(sub)

    def show_draft(self, draft: Draft) -> None:
        """Hand ``draft`` to the live followers that asked for drafts; nothing is written.

        Each follower's slot for the channel takes it, replacing an older draft not sent yet
        (see the theory): a follower too far behind skips it (the next draft of the run carries
        everything before it, and the entry that saves the run follows in any case); a draft
        never makes a follower re-read the database the way a full queue of entries does."""
        for key in (draft.channel, None):
            for sub in self._subs.get(key, ()):
                if sub.drafts:
                    sub.show(draft)

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
            sub = _Subscription(channel, drafts=drafts, per_second=self._drafts_per_second)
            self._subs[channel].add(sub)
            try:
                for entry in await self._rows(channel, column, floor, 100_000):
                    if key(entry) > floor:
                        yield entry
                        floor = key(entry)
                held: list[tuple[float, int, _Slot]] = []  # (due, order, slot): the drafts held back
                holding: dict[str, _Slot] = {}
                order = itertools.count()
                while True:
                    item: Entry | _Slot | None = None
                    try:
                        if held:
                            with trio.move_on_at(held[0][0]):
                                item = await sub.receive.receive()
                        else:
                            item = await sub.receive.receive()
                    except trio.EndOfChannel:
                        break
                    now = trio.current_time()
                    if item is None:  # the first held draft is due
                        _, _, slot = heapq.heappop(held)
                        if holding.get(slot.channel) is slot:
                            del holding[slot.channel]
                        if (draft := sub.take(slot, now)) is not None:
                            yield draft
                    elif isinstance(item, _Slot):
                        if (due := sub.held_until(item, now)) is not None:
                            heapq.heappush(held, (due, next(order), item))
                            holding[item.channel] = item
                        elif (draft := sub.take(item, now)) is not None:
                            yield draft
                    elif key(item) > floor:
                        # A draft held back from before the entry goes first (or is dropped, saved by it).
                        if (early := holding.pop(item.channel, None)) is not None \
                                and (draft := sub.take(early, now)) is not None:
                            yield draft
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
