"""Which channels a page of ``status`` lists, and the cursor to the next page.

A host may hold 100,000 channels, nearly all of them idle; ``status`` answering every one's
state grew with each (1.7 MB of JSON at 10,000). A page lists busy channels first — running
(or stopping), then queued — then, when asked (``idle``), the idle ones, each group by name,
at most ``limit`` channels. The idle channels not listed are counted. The cursor names the
last channel listed with its group (``GROUP:NAME``, group 0 running, 1 queued, 2 idle), so
the next page starts after it in the same order; a channel that changes group between two
pages may be seen twice or not at all (the counts say how many there are now).

A host whose channels all fit in one page lists them all, idle ones too: a small host's
``status`` reads as it always did.

The page costs what is busy plus the page, not the host: the ledger keeps the busy channels
as a set (changed where a lane's turn or queue changes) and every channel's name in order
(:class:`~supervisor.core.names.SortedNames`), so the counts are three lengths and the idle
channels are read in order after the cursor, not sorted each call.

Pure code: the supervisor names its busy channels, this module picks the page.
"""

from __future__ import annotations

import heapq
from collections.abc import Set
from dataclasses import dataclass
from typing import Final

from .errors import UsageError
from .names import SortedNames

#: How many channels a page lists when the caller names no ``limit``.
DEFAULT_PAGE: Final = 200
#: The most a caller may ask for in one page.
MAX_PAGE: Final = 1000
#: The JSON a page's channels may take (the rest of ``status`` is small): a page stops
#: before it would pass this, whatever its ``limit``.
MAX_PAGE_BYTES: Final = 56 * 1024

RUNNING: Final = 0
QUEUED: Final = 1
IDLE: Final = 2
GROUPS: Final = ("running", "queued", "idle")

Key = tuple[int, str]


def parse_cursor(after: str | None) -> Key | None:
    """``GROUP:NAME`` as the page key it names (None: from the start); a bad one is a UsageError."""
    if after is None or after == "":
        return None
    group, sep, name = after.partition(":")
    if not sep or group not in ("0", "1", "2"):
        raise UsageError(f"after must be a cursor from a status page's `next` (GROUP:CHANNEL), got {after[:60]!r}")
    return int(group), name


def cursor(key: Key) -> str:
    """The cursor that starts the next page after ``key``."""
    return f"{key[0]}:{key[1]}"


@dataclass(frozen=True)
class PagePlan:
    """The channels to list, in order, and what the page says about the rest."""

    keys: tuple[Key, ...]
    """The candidates, in page order: more than fit (the caller stops at ``limit`` or the bytes)."""
    counts: dict[str, int]
    """Every channel of the host by group (``running``, ``queued``, ``idle``) and ``total``."""
    idle_listed: bool
    """The page lists idle channels (asked for, or the whole host fits in one page)."""
    limit: int


def plan(
    running: Set[str], queued: Set[str], names: SortedNames, *, after: str | None, limit: int, idle: bool,
    bounded: bool = True,
) -> PagePlan:
    """Pick a page: the first ``limit + 1`` channels after the cursor (one more than fits, so
    the caller knows whether a next page exists). ``running`` and ``queued`` are the busy
    channels (disjoint), ``names`` every channel of the host in name order; the idle ones are
    the rest. The cost is the busy channels' and the page's, not the host's: the idle ones
    are read from ``names`` after the cursor, skipping the busy. ``bounded`` False (the
    daemon's own readers, which want every channel) lifts :data:`MAX_PAGE`."""
    if not 1 <= limit <= (MAX_PAGE if bounded else limit):
        raise UsageError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    start = parse_cursor(after)
    total = len(names)
    counts = {"running": len(running), "queued": len(queued), "idle": total - len(running) - len(queued),
              "total": total}
    listed = idle or (start is None and total <= limit)
    want = limit + 1
    keys: list[Key] = []
    for group, members in ((RUNNING, running), (QUEUED, queued)):
        if start is not None and start[0] > group:
            continue
        floor = start[1] if start is not None and start[0] == group else None
        after_floor = (n for n in members if floor is None or n > floor)
        keys += ((group, n) for n in heapq.nsmallest(want - len(keys), after_floor))
        if len(keys) >= want:
            return PagePlan(tuple(keys), counts, listed, limit)
    if listed:
        floor = start[1] if start is not None and start[0] == IDLE else None
        for name in names.after(floor):
            if name in running or name in queued:
                continue
            keys.append((IDLE, name))
            if len(keys) >= want:
                break
    return PagePlan(tuple(keys), counts, listed, limit)
