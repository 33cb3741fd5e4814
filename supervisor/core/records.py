"""The store's value types: what a channel's transcript, queue and stops are made of. Pure.

An :class:`Entry` is one committed line of a transcript; a :class:`Draft` is live output
never stored; a :class:`QueuedRow` an accepted message not yet run; a :class:`StopRecord` what
a stop must have on disk before it kills anything; :class:`ChannelState` what a stop leaves on
a channel; :class:`TakeOver` what a fleet host finds for a channel it has just taken. The store
(:mod:`supervisor.store`) writes and reads them; the rest of corral, the pure core and the
bridges' decisions included, passes them around without importing the store (and Trio).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The kinds of a transcript entry.
KINDS = ("message", "status", "tool", "todos", "notice", "error")


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of a channel's transcript."""

    seq: int
    channel: str
    author: str
    kind: str
    text: str
    turn: str | None
    generation: int
    ts: float
    meta: Mapping[str, Any] = field(default_factory=dict)
    pos: int | None = None
    """(A fleet) its place in the commit order of every host's entries, once committed."""

    def to_json(self) -> dict[str, Any]:
        """The entry as the control API and ``--json`` print it."""
        return {
            "seq": self.seq,
            "channel": self.channel,
            "author": self.author,
            "kind": self.kind,
            "text": self.text,
            "turn": self.turn,
            "generation": self.generation,
            "ts": self.ts,
            "meta": dict(self.meta),
        }


@dataclass(frozen=True, slots=True)
class Draft:
    """Text an agent is writing now, shown to followers before it is saved: never stored.

    ``text`` is the whole unsaved run so far. The ``message`` entry that saves the run names
    this ``draft`` in its ``meta`` (``{"draft": ID}``, with ``"cut_off": "stop"`` when a stop
    saved it) and replaces it; a later draft of the same id replaces an earlier one."""

    channel: str
    author: str
    turn: str
    draft: str
    text: str
    ts: float

    def to_json(self) -> dict[str, Any]:
        """The draft as the control API's ``draft`` event and ``--json`` print it (no ``seq``:
        it has no place in the transcript)."""
        return {
            "kind": "draft",
            "draft": self.draft,
            "channel": self.channel,
            "author": self.author,
            "turn": self.turn,
            "text": self.text,
            "ts": self.ts,
        }


@dataclass(frozen=True, slots=True)
class QueuedRow:
    """An accepted message not yet run, as the store keeps it across restarts."""

    seq: int
    channel: str
    agent: str
    author: str
    text: str
    generation: int
    nudge: bool
    hops: int = 0
    """Agent-to-agent hand-offs behind it (0: a human's or a system message)."""
    routed_from: int | None = None
    """The seq of the entry it repeats, when it has none of its own: a hand-off's source
    entry, or the message's entry for its second and later targets."""
    delivery: str | None = None
    """(A fleet) ``interrupt`` or ``steer``, for the channel's owner to carry out as it takes
    the message up from another host; None: an ordinary queued message."""
    ts: float | None = field(default=None, compare=False)
    """When its entry was accepted (what the queue's ``age`` counts from; read from its entry,
    not part of the row's identity); None: not known."""


@dataclass(frozen=True, slots=True)
class ChannelState:
    """What a stop leaves on a channel, as stored: generation, routing rest, repeat window."""

    generation: int
    rests: bool
    stopped: bool



@dataclass(frozen=True, slots=True)
class StopRecord:
    """What one channel's stop must have on disk before it kills anything."""

    seq: int
    channel: str
    generation: int
    dropped: tuple[int, ...]
    """Seqs of the queued messages the stop drops: dequeued and marked."""
    stopped_turns: tuple[str, ...]
    """Every turn of the channel the stop ends (one per agent running)."""
    plans: Mapping[str, list[dict[str, str]]]
    """The cancelled plan, by agent."""



@dataclass(frozen=True, slots=True)
class TakeOver:
    """What a fleet host finds in the store for a channel it has just taken."""

    state: ChannelState | None
    queue: list[QueuedRow]
    todos: dict[str, list[dict[str, str]]]
    sessions: dict[str, tuple[str | None, str]]
    """By agent: the session id (None: it stayed with the last host) and its folder."""
    ended: list[tuple[str, int, str | None]]
    """The last owner's turns (id, generation, host) closed here with a notice: their
    processes are on that host, out of this one's reach."""
    heartbeats: dict[str, float]
    """Every host's last heartbeat at the take-over (the database's clock)."""
    seen: dict[str, int]
    """By agent: the last message it took up in the channel (on any host)."""


