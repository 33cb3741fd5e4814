"""Drafts per follower: coalesced (latest wins), paced (at most N a second per channel), never
blocking the turn or another follower, and a slow follower skips drafts, never entries.

The store's feed alone, with no database (a follower's first read of stored entries finds
none) and Trio's mock clock: every wait is a parking point, every pace an exact time.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, TypeVar, cast

import trio
import trio.testing

from supervisor.core.records import Draft, Entry
from supervisor.store.engines import Engine
from supervisor.store.feed import DRAFTS_PER_SECOND, Feed

T = TypeVar("T")
_seqs = itertools.count(1)


class Gated:
    """The feed's reads: each follower's first read of stored entries (it is subscribed by
    then) parks until its gate opens, and finds nothing stored."""

    def __init__(self) -> None:
        self.gates: list[trio.Event] = []

    async def __call__(self, read: Callable[[], T], /) -> T:
        gate = trio.Event()
        self.gates.append(gate)
        await gate.wait()
        return cast(T, [])


def feed(per_second: float = DRAFTS_PER_SECOND) -> tuple[Feed, Gated]:
    """A single host's feed with nothing stored before, and its gated reads."""
    reads = Gated()
    return Feed(cast(Engine, None), reads, fleet=False, drafts_per_second=per_second), reads


def draft(text: str, channel: str = "c", run: str = "d1") -> Draft:
    """A draft of run ``run`` showing ``text``."""
    return Draft(channel, "agent:a", "t1", run, text, 0.0)


def entry(text: str, channel: str = "c", **meta: Any) -> Entry:
    """A committed entry."""
    return Entry(next(_seqs), channel, "agent:a", "message", text, "t1", 0, 0.0, meta)


class Follower:
    """A follower of ``channel`` with drafts, run in a task: subscribed at once, reading what it
    is sent (into ``got``) once its gate is opened; until then it parks, as a slow follower does."""

    def __init__(self, f: Feed, channel: str | None) -> None:
        self.items = cast(AsyncGenerator[Entry | Draft, None], f.follow(channel, drafts=True))
        self.got: list[Entry | Draft] = []

    def texts(self) -> list[str]:
        """What it was shown, as texts."""
        return [i.text for i in self.got]

    async def run(self) -> None:
        async with aclosing(self.items) as items:
            async for item in items:
                self.got.append(item)


async def start(
    nursery: trio.Nursery, f: Feed, reads: Gated, channel: str | None, *, reading: bool = True
) -> tuple[Follower, trio.Event]:
    """A follower subscribed (and reading, unless not ``reading``) and its gate."""
    follower = Follower(f, channel)
    nursery.start_soon(follower.run)
    await trio.testing.wait_all_tasks_blocked()
    gate = reads.gates[-1]
    if reading:
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
    return follower, gate


async def test_a_follower_is_sent_only_the_newest_draft_its_queue_holds(mock_clock: trio.testing.MockClock) -> None:
    f, reads = feed()
    async with trio.open_nursery() as nursery:
        follower, gate = await start(nursery, f, reads, "c", reading=False)
        for n in range(1, 101):  # a hundred deltas while it reads nothing: one slot, the last wins
            f.show_draft(draft("x" * n))
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert follower.texts() == ["x" * 100]
        f.show_draft(draft("y"))
        await trio.testing.wait_all_tasks_blocked()
        assert follower.texts() == ["x" * 100, "y"]
        nursery.cancel_scope.cancel()


async def test_drafts_are_paced_per_channel_and_one_held_back_takes_the_newer_text(
    mock_clock: trio.testing.MockClock,
) -> None:
    f, reads = feed(per_second=10)
    async with trio.open_nursery() as nursery:
        follower, _ = await start(nursery, f, reads, None)
        for text in ("a1", "a2", "a3"):  # a2: the one of tolerance ahead of the rate; a3 too soon
            f.show_draft(draft(text))
            await trio.testing.wait_all_tasks_blocked()
        assert follower.texts() == ["a1", "a2"]
        f.show_draft(draft("b1", channel="b"))  # another channel's pace is its own
        await trio.testing.wait_all_tasks_blocked()
        assert follower.texts() == ["a1", "a2", "b1"]
        f.show_draft(draft("a4"))  # replaces a3 in the held slot
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(0.099)
        await trio.testing.wait_all_tasks_blocked()
        assert follower.texts() == ["a1", "a2", "b1"]
        mock_clock.jump(0.001)  # 0.1 s after a1: due
        await trio.testing.wait_all_tasks_blocked()
        assert follower.texts() == ["a1", "a2", "b1", "a4"]
        nursery.cancel_scope.cancel()


async def test_a_steady_stream_faster_than_the_pace_is_sent_at_the_pace_ending_on_the_newest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    f, reads = feed(per_second=10)
    async with trio.open_nursery() as nursery:
        follower, _ = await start(nursery, f, reads, "c")
        for n in range(1, 201):  # 100 deltas a second for 2 s
            f.show_draft(draft(str(n)))
            await trio.sleep(0.01)
        await trio.sleep(1)
        texts = [int(t) for t in follower.texts()]
        # The pace over 2 s, plus the one of tolerance; in order; the last delta shown.
        assert 19 <= len(texts) <= 2 * 10 + 2, texts
        assert texts == sorted(texts) and texts[-1] == 200
        nursery.cancel_scope.cancel()


async def test_an_entry_drops_the_held_draft_it_saves_and_lets_an_earlier_one_go_first(
    mock_clock: trio.testing.MockClock,
) -> None:
    f, reads = feed(per_second=10)
    async with trio.open_nursery() as nursery:
        follower, _ = await start(nursery, f, reads, "c")
        for text in ("r1", "r1 more", "r1 all"):  # the third is held back
            f.show_draft(draft(text))
            await trio.testing.wait_all_tasks_blocked()
        saved = entry("r1 all", draft="d1")
        f.committed([saved])
        await trio.testing.wait_all_tasks_blocked()
        assert follower.got == [draft("r1"), draft("r1 more"), saved]  # the saved draft never shown after it
        f.show_draft(draft("r2", run="d2"))  # a new run's, held back (the pace)
        await trio.testing.wait_all_tasks_blocked()
        assert len(follower.got) == 3
        other = entry("a human's message")  # it saves nothing: the draft shown before it goes first
        f.committed([other])
        await trio.testing.wait_all_tasks_blocked()
        assert follower.got[3:] == [draft("r2", run="d2"), other]
        mock_clock.jump(1)
        await trio.testing.wait_all_tasks_blocked()
        assert len(follower.got) == 5  # (the held slot was taken: nothing shown twice)
        nursery.cancel_scope.cancel()


async def test_a_follower_that_reads_nothing_blocks_no_one_and_later_gets_every_entry(
    mock_clock: trio.testing.MockClock,
) -> None:
    f, reads = feed()
    async with trio.open_nursery() as nursery:
        stuck, gate = await start(nursery, f, reads, None, reading=False)
        live, _ = await start(nursery, f, reads, "c")
        saved, held = [], []
        for n in range(200):  # 200 runs of 50 deltas each in two channels, one left open
            for channel in ("c", "other"):
                for k in range(50):
                    f.show_draft(draft(f"{n}:{k}", channel=channel, run=f"{channel}{n}"))
                if channel == "c" and n % 2:
                    held.append(f"{n}:49")  # a run still open when the next entry comes
                    saved.append(entry("a tool call", channel=channel))
                else:
                    saved.append(entry(f"{n}:49", channel=channel, draft=f"{channel}{n}"))
                f.committed([saved[-1]])
            mock_clock.jump(1)
            await trio.testing.wait_all_tasks_blocked()
        # The live follower was shown its channel as it went: every entry, and the open runs' drafts.
        assert [i for i in live.got if isinstance(i, Entry)] == [e for e in saved if e.channel == "c"]
        assert [i.text for i in live.got if isinstance(i, Draft)] == held
        # The stuck one blocked nothing; once it reads, it has every entry, in order, and of the
        # 20,000 drafts at most one per channel between two entries: here only the open runs'.
        gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert [i for i in stuck.got if isinstance(i, Entry)] == saved
        assert [i.text for i in stuck.got if isinstance(i, Draft)] == held
        nursery.cancel_scope.cancel()
