"""A set of channel names kept in name order, for paging a host's idle channels.

A host may know 100,000 channels; a ``status`` page lists the idle ones in name order after
a cursor. Sorting every name for each page cost more than the page itself, so the names are
kept sorted as they come: a new channel is one binary search and one insertion into a list
(a memory move of at most the list's pointers, microseconds at 100,000), a restart's names
are one sort, and a page starts with one binary search and reads on.

Pure code: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator


class SortedNames:
    """Names, each once, in ``str`` order (code point order, the order of ``sorted``)."""

    __slots__ = ("_members", "_order")

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._members: set[str] = set()
        self._order: list[str] = []
        self.update(names)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def add(self, name: str) -> None:
        """Add one name (a channel seen for the first time)."""
        if name not in self._members:
            self._members.add(name)
            bisect.insort(self._order, name)

    def update(self, names: Iterable[str]) -> None:
        """Add many names at once (a restart's): one sort, not one insertion each."""
        new = {n for n in names if n not in self._members}
        if not new:
            return
        self._members |= new
        if len(new) < 64:
            for name in new:
                bisect.insort(self._order, name)
        else:
            self._order.extend(new)
            self._order.sort()

    def after(self, name: str | None) -> Iterator[str]:
        """The names after ``name`` (None: from the first), in order, read lazily (read them
        before the next change: the page is built in one synchronous step)."""
        order = self._order
        start = 0 if name is None else bisect.bisect_right(order, name)
        return (order[i] for i in range(start, len(order)))
