"""What the supervisor answers (an accepted message, a stop's result) and the texts it stores."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import UsageError
from .fields import OMITTED_IF_NONE, ROUNDED, from_json, to_json

STOP_NOTICE = "Execution stopped by user."
INTERRUPT_NOTICE = "Interrupted by a new message."
#: How a message to a busy agent may be delivered (``queue``: after its turn; ``interrupt``:
#: instead of it; ``steer``: into it).
DELIVERIES = ("queue", "interrupt", "steer")
SHUTDOWN_NOTICE = "Task interrupted — corral was shut down. Send another message to continue."
HOST_LOST_NOTICE = (
    "Task interrupted — its host stopped answering and another host took the channel over. "
    "Send another message to continue."
)
RESTART_NOTICE = "Task interrupted — corral restarted. Send another message to continue."


def stop_notice_text(text: str, dropped: int) -> str:
    """A stop's notice, saying how many queued messages it dropped (issue: visible drops)."""
    if dropped == 1:
        return f"{text} 1 queued message was not run."
    if dropped > 1:
        return f"{text} {dropped} queued messages were not run."
    return text


def restart_notice_text(unfinished_todos: int) -> str:
    """The entry that closes a turn a crash cut short; with a plan left, what becomes of it.

    A crash is not a stop: the plan is kept, so the agent's next turn in the channel ends with
    corral's usual reminder of the unfinished tasks. Said here, so that it does not surprise.
    """
    if not unfinished_todos:
        return RESTART_NOTICE
    return (f"{RESTART_NOTICE} Its plan's {unfinished_todos} unfinished task(s) are kept (a crash is not a stop): "
            "after the agent's next turn here corral reminds it of them, up to max_nudges times; "
            "`corral stop` this channel to cancel them.")


def plan_cancelled_text(agent: str) -> str:
    """The ``todos`` entry a stop or an interrupt stores for the plan it cancelled (bridges and
    the dashboard show a plan as over by it)."""
    return f"Plan cancelled ({agent})."


NUDGE_TEXT = "You have {n} remaining task(s) in your plan. Please continue working on them."
MAX_MESSAGE_BYTES = 1 << 20
MAX_CHANNEL_CHARS = 200
#: What a stop may add on top of the grace period before it calls itself failed.
STOP_SLACK = 10.0


class UnknownChannel(UsageError):
    """A channel that has never existed (no entry, no queue, no turn): most likely a typo."""

    def __init__(self, channel: str, known: set[str]) -> None:
        self.channel = channel
        self.suggestions = tuple(difflib.get_close_matches(channel, sorted(known), n=3))
        hint = (
            f"did you mean {' or '.join(repr(c) for c in self.suggestions)}?"
            if self.suggestions
            else "send it a message first (a channel exists once it has one)"
        )
        super().__init__(f"unknown channel {channel!r}; {hint}")


@dataclass(frozen=True, slots=True)
class Accepted:
    """A message the supervisor has stored and queued."""

    seq: int
    channel: str
    agent: str
    """The first agent it went to ("" when it was stored only: an agent's post while the channel rests)."""
    generation: int
    queued: int
    """Messages ahead of it in the first agent's lane (including a running turn)."""
    to: tuple[str, ...] = ()
    """Every agent it went to (empty: stored only)."""
    hints: tuple[str, ...] = ()
    """What the sender may not have meant: a mention of no agent close to one (``@revewer``)."""
    delivery: str = "queue"
    """How it was delivered: ``queue``, ``interrupt`` (it replaced its lanes' work) or ``steer``
    (handed to the running turn)."""
    interrupted: tuple[str, ...] = ()
    """The turns it interrupted."""
    dropped: tuple[int, ...] = ()
    """The queued messages its interrupt dropped (never run; ``corral resend`` brings one back)."""
    steered: str | None = None
    """The turn it was handed to."""
    fallback: str | None = None
    """Why it was queued although it asked to interrupt or steer (in a fleet: carried by the owner)."""
    replayed: bool = False
    """A repeat of an idempotency key: the first acceptance answered again; nothing was queued now."""

    def to_json(self) -> dict[str, Any]:
        """As the API and ``corral send --json`` print it (every field, :func:`~supervisor.core.fields.to_json`)."""
        return to_json(self)


@dataclass(slots=True)
class StopResult:
    """What one channel's stop did."""

    channel: str | None
    generation: int
    repeat: bool = False
    stopped_turns: list[str] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    """Every stopped turn with its agent: ``{"agent", "turn", "killed", "swept"}``."""
    killed: list[int] = field(default_factory=list)
    swept: list[int] = field(default_factory=list)
    kill: str | None = None
    """How the turn's tree was ended: ``"cgroup"`` or ``"sweep"`` (None: nothing was running)."""
    ended: str | None = None
    """An ACP turn's prompt: ``"cancelled"`` (the agent acknowledged the typed cancel) or
    ``"killed"`` (it did not in time, or died: its whole tree was killed). None otherwise."""
    cpu_ms: float = field(default=0.0, metadata=ROUNDED)
    """corral's own CPU time (all its threads) from the call to the return (a stop-all: in total)."""
    dropped: int = 0
    notice_seq: int | None = None
    elapsed_ms: float = field(default=0.0, metadata=ROUNDED)
    ok: bool = True
    error: str | None = None
    channels: list[StopResult] | None = field(default=None, metadata=OMITTED_IF_NONE)

    def to_json(self) -> dict[str, Any]:
        """As the API and ``corral stop --json`` print it (every field, :func:`~supervisor.core.fields.to_json`)."""
        return to_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StopResult:
        """A result as :meth:`to_json` gave it (another fleet host's answer); ValueError if it is none."""
        return from_json(cls, data)
