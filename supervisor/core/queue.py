"""The queue in people's hands: what it shows, what an edit answers, the depth policy, the keys.

Theory of operation
-------------------

The queue itself is the ledger's (:class:`~supervisor.core.ledger.StopLedger`: a lane per
agent, each with its queued messages). This module holds the pure rest, none of it with I/O:

* :func:`queue_view` turns the ledger's lanes into what ``corral queue`` and the API show:
  each queued message with its place in its lane, its author, agent, age and why it waits
  (behind the running turn, behind an earlier message, for a slot, or next).
* :class:`QueueEditResult` is what taking one back (``cancel``) or moving one first
  (``move_first``) answers; :class:`QueueEditRefused` is the answer when the ledger found
  nothing queued (``not_queued``) or a turn that took it already (``running``: it is not
  taken back, and the answer names the stop that ends it).
* :func:`depth_decision` is the channel's ``max_queued`` policy: a message that would wait
  beyond the limit is refused (:class:`QueueFull`, the API's 429, with the depth) or makes
  room by dropping the oldest waiting messages — each dropped one said in the transcript,
  never a silent drop.
* :func:`idempotency_origin` names a send's ``Idempotency-Key`` as an origin (the bridges'
  exactly-once mechanism, stored with the message in its transaction), per author.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import CorralError, UsageError
from .fields import to_json

#: ``[channels.NAME] when_full`` values: refuse the new message, or drop the oldest waiting one.
WHEN_FULL = ("refuse", "drop_oldest")
#: ``[server] idempotency_window`` unless set: how long a key answers its first acceptance (24 h).
DEFAULT_IDEMPOTENCY_WINDOW = 24 * 3600.0
#: The longest idempotency key (an HTTP header value; a UUID is 36).
MAX_KEY_CHARS = 200
#: How much of a queued message's text the queue shows.
PREVIEW_CHARS = 120


class QueueEditRefused(CorralError, RuntimeError):
    """A take-back or move-first found nothing to edit; ``code`` says why (``running``: a
    turn took the message already, named in ``running``; ``not_queued``: it waits nowhere)."""

    def __init__(self, message: str, *, code: str, running: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.running = tuple(running)


class QueueFull(CorralError, RuntimeError):
    """The channel's queue holds ``max_queued`` waiting messages and its policy is ``refuse``."""

    def __init__(self, channel: str, depth: int, limit: int) -> None:
        super().__init__(
            f"channel {channel!r} has {depth} message(s) waiting, its limit (max_queued = {limit}); "
            f"nothing was queued — send it again once one has run (`corral queue {channel}` shows them), "
            "or take one back (`corral cancel`)"
        )
        self.channel = channel
        self.depth = depth
        self.limit = limit


@dataclass(frozen=True, slots=True)
class QueueEditResult:
    """What a queue edit did (``corral cancel``, ``corral first``, the API's answer)."""

    channel: str
    seq: int
    """The entry taken back (moved first)."""
    action: str
    """``take_back`` or ``move_first``."""
    rows: tuple[int, ...]
    """The queued messages edited (one per agent it went to)."""
    agents: tuple[str, ...]
    record: int
    """The seq of the entry that records it ("seq 14 taken back by alice")."""
    by: str
    running: tuple[str, ...] = ()
    """Turns of other agents that had taken the same message already (they run on)."""

    def to_json(self) -> dict[str, Any]:
        """As the API and ``--json`` print it."""
        return to_json(self)


@dataclass(frozen=True, slots=True)
class Waiting:
    """One queued message as the queue shows it."""

    seq: int
    """Its queue row (the entry's seq, or a later one for its second and further agents)."""
    entry: int
    """The transcript entry it is (what ``cancel`` and ``first`` take)."""
    place: int
    """1: next in its agent's lane."""
    agent: str
    author: str
    text: str
    """The start of its text (:data:`PREVIEW_CHARS`)."""
    age: float | None
    """Seconds since it was accepted (None: not known)."""
    why: str
    """Why it waits."""

    def to_json(self) -> dict[str, Any]:
        """As the API prints it."""
        return to_json(self)


@dataclass(frozen=True, slots=True)
class LaneFacts:
    """What :func:`queue_view` needs of one lane, at one instant."""

    agent: str
    queued: Sequence[tuple[int, int, str, str, float | None]]
    """``(seq, entry, author, text, accepted_at)`` of each queued message, in lane order."""
    turn: str | None = None
    """The running (or preparing) turn's id."""
    stopping: bool = False
    """A stop (or an interrupt) is tearing that turn down."""
    slot: Mapping[str, Any] | None = None
    """The lane's wait for a slot (capacity: ``position``, ``why``), or None."""
    rests: str | None = None
    """Why nothing of the lane may start for now (a spent budget, a rest), or None."""


def why_waiting(lane: LaneFacts, place: int, previous: int | None) -> str:
    """Why the message at ``place`` (1-based) of ``lane`` waits."""
    if place > 1:
        return f"behind seq {previous}"
    if lane.turn is not None:
        return f"behind {'the stopping' if lane.stopping else 'the running'} turn {lane.turn}"
    if lane.rests is not None:
        return lane.rests
    if lane.slot is not None:
        return f"for a slot ({lane.slot.get('why', 'behind others')}, place {lane.slot.get('position', '?')})"
    return "next: its turn is starting"


def queue_view(channel: str, lanes: Sequence[LaneFacts], now: float) -> dict[str, Any]:
    """The channel's queue as ``GET …/queue`` answers it: every waiting message, lane by lane,
    oldest accepted first within a lane's order, and each lane's running turn."""
    waiting: list[Waiting] = []
    for lane in lanes:
        previous: int | None = None
        for place, (seq, entry, author, text, at) in enumerate(lane.queued, start=1):
            preview = text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
            waiting.append(Waiting(seq, entry, place, lane.agent, author, preview,
                                   None if at is None else round(max(0.0, now - at), 3),
                                   why_waiting(lane, place, previous)))
            previous = entry
    return {
        "channel": channel,
        "depth": len(waiting),
        "queued": [w.to_json() for w in waiting],
        "running": {lane.agent: lane.turn for lane in lanes if lane.turn is not None},
    }


def edit_text(action: str, seq: int, by: str, rows: int) -> str:
    """The entry that records a queue edit: "seq 14 taken back by alice"."""
    who = by.removeprefix("human:")
    if action == "take_back":
        return f"seq {seq} taken back by {who}" + (f" ({rows} agents)" if rows > 1 else "")
    return f"seq {seq} moved first by {who}"


def refusal(action: str, channel: str, seq: int, running: Sequence[tuple[str, str]],
            stale: Sequence[str] = ()) -> QueueEditRefused:
    """The answer to an edit that found nothing queued of ``seq``: it runs, or waits nowhere."""
    verb = "taken back" if action == "take_back" else "moved first"
    if running:
        turns = ", ".join(f"{agent}'s turn {turn}" + (" (being stopped)" if turn in stale else "")
                          for agent, turn in running)
        return QueueEditRefused(
            f"message {seq} is not {verb}: it already runs ({turns}); to end it, stop the channel "
            f"(`corral stop {channel}`, POST /v1/channels/{{channel}}/stop)", code="running", running=running,
        )
    return QueueEditRefused(
        f"message {seq} is not queued in {channel!r} (it ran, was dropped or taken back, or is no message); "
        f"`corral queue {channel}` shows what waits", code="not_queued",
    )


@dataclass(frozen=True, slots=True)
class DepthDecision:
    """What the depth policy decides for a new message."""

    refuse: bool = False
    drop: tuple[int, ...] = field(default=())
    """Entries of the oldest waiting messages to take back first (``drop_oldest``)."""


def depth_decision(
    waiting: Sequence[int], joining: int, limit: int | None, when_full: str
) -> DepthDecision:
    """``waiting``: the entries of the channel's waiting messages, oldest first (one per row);
    ``joining``: how many rows of the new message will wait (its lanes that are busy).
    Over ``limit``: refuse, or drop the oldest entries until it fits."""
    if limit is None or joining == 0 or len(waiting) + joining <= limit:
        return DepthDecision()
    if when_full == "refuse" or joining > limit:
        return DepthDecision(refuse=True)
    excess = len(waiting) + joining - limit
    dropped: list[int] = []
    for entry in waiting:
        if len(dropped) >= excess:
            break
        if entry not in dropped:
            dropped.append(entry)
    return DepthDecision(drop=tuple(dropped))


def idempotency_origin(author: str, key: object) -> str:
    """The origin a send's idempotency key is stored as (one per author: another author's
    same key is another message). Raises :class:`UsageError` for an unusable key."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS \
            or any(not (33 <= ord(c) < 127) for c in key):
        raise UsageError(
            f"an idempotency key is 1 to {MAX_KEY_CHARS} printable ASCII characters without spaces "
            "(a UUID, say), got " + repr(key)[:60]
        )
    return f"api-key:{author}:{key}"
