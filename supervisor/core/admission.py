"""Admission: which waiting turn may start next, and what must close first to make room.

Theory of operation
-------------------

A host holds only so much: a turn is an agent CLI of up to several hundred megabytes, and
a resident ACP agent stays up between turns. :class:`Admission` is the pure, synchronous
gate in front of every turn: it knows nothing of processes, Trio or ``/proc``. The driver
(``supervisor.host.capacity``) feeds it events and carries out what it decides.

A **lane** is ``(channel, agent)``, as in the stop ledger. Each lane has at most one turn,
so at most one **waiter** (a lane whose worker wants to start its next turn) and one
**slot**. A slot is either a running turn or a **resident**: an ACP agent process that
stays up idle after its turn. Both count against the limits.

The rules:

* ``offer(channel, agent, estimate)`` makes the lane wait. It never grants by itself:
  ``decide(reading, now)`` grants, in fair order, every waiter that fits, and says which
  idle residents to close first.
* **Fair order.** Channels take turns (round-robin): a channel that was just granted goes
  to the back of the rotation if it still waits. Within a channel, lanes go in the order
  they offered (FIFO). A channel keeps its place in the rotation until it is granted, so
  no channel starves behind a busy one.
* **Limits.** A waiter fits when the host has fewer than ``max_turns`` slots, its agent
  fewer than its ``max_concurrent``, and the memory reading leaves ``memory_reserve``
  free after this turn's estimate and the estimates of turns granted too recently for the
  reading to show them (``settle`` seconds), and memory pressure (PSI, where the kernel
  has it) is below ``memory_pressure``.
* A waiter held by its **agent's** limit is skipped this round (others of other agents
  may go; every later waiter of that agent is held by the same limit). A waiter held by
  the **host's** limits (turns, memory) ends the round: nobody behind it jumps ahead, so a
  large turn is never starved by a stream of small ones.
* **Residents.** A lane whose own resident is idle needs no new slot: its turn reuses
  it. When a waiter is held by a turn limit (the host's or its agent's) and an idle
  resident exists that would free it, the resident unused longest (of that agent, for an
  agent limit) is closed first: the grant names it in ``close_first``, and the driver
  lets the turn go once it is closed. Memory never evicts: a closing agent frees its
  memory only later, and the next reading will show it.
* ``drop(channel)`` is a stop: every waiter of the channel leaves the queue and is named
  in the answer (the driver wakes them with "dropped"). The waiter's message is a queued
  message of the stop ledger; the stop ledger drops that message in the same step, so
  a waiter never starts a turn for a message accepted before the stop. ``drop_all()``
  does the same for every channel (a stop-all, a shutdown).
* ``release(channel, agent, resident=...)`` ends a turn's slot, or keeps it as an idle
  resident; ``gone(channel, agent)`` says a resident's process has ended.

Violations (offering a lane twice, releasing a lane with no slot) raise
:class:`AdmissionError`: they are bugs in the driver.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Lane = tuple[str, str]
"""``(channel, agent)``."""

#: Seconds a granted turn is assumed invisible to a memory reading (its process is still
#: starting, so the reading does not show what it will hold).
SETTLE = 3.0

#: The smallest derived turn limit: a few dozen, so that turns waiting on a model API (most
#: of a turn's life) never idle a small machine.
MIN_DERIVED_TURNS = 32

#: What a turn is assumed to hold when nothing says (bytes): each adapter's own figure is its
#: data (``Adapter.memory_estimate``).
MIB = 1024 * 1024
FALLBACK_ESTIMATE = 256 * MIB


class AdmissionError(RuntimeError):
    """The driver broke the admission protocol; always a bug in the caller."""


class Why(enum.Enum):
    """Why a waiter waits."""

    TURN_LIMIT = "turn limit"
    AGENT_LIMIT = "agent limit"
    MEMORY = "memory"
    PRESSURE = "memory pressure"
    QUEUE = "behind others"


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """What the memory probe saw (``supervisor.procs.memory``)."""

    available: int
    """Bytes a new turn could use: the machine's MemAvailable, or the tightest headroom
    (``memory.max`` - ``memory.current``) of this process's cgroups where delegated."""
    at: float
    """When it was read (the driver's clock)."""
    pressure: float | None = None
    """PSI ``full avg10`` (percent of the last 10 s all tasks stalled on memory), or None."""
    source: str = "machine"
    """``"machine"`` (/proc/meminfo) or ``"cgroup"`` (this process's cgroup)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The host's limits (``[server] max_turns``, ``memory_reserve``, ``memory_pressure``)
    and each agent's ``max_concurrent`` (absent: only the host's limit)."""

    max_turns: int
    memory_reserve: int = 0
    memory_pressure: float = 100.0
    per_agent: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Grant:
    """A waiter that may start its turn now, once ``close_first`` are closed."""

    channel: str
    agent: str
    close_first: tuple[Lane, ...] = ()
    """Idle residents (ACP agents) to close before the turn goes, unused longest first."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to ``decide``: who goes, and whether the memory gate wants a new reading."""

    grants: tuple[Grant, ...] = ()
    recheck: bool = False
    """A waiter is held by memory: read memory again soon (nothing else will wake it)."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """One waiter, as ``status`` shows it."""

    channel: str
    agent: str
    position: int
    """1 = the next to go."""
    why: Why
    since: float


@dataclass(slots=True)
class _Waiter:
    agent: str
    estimate: int
    since: float
    why: Why = Why.QUEUE


@dataclass(slots=True)
class _Slot:
    estimate: int
    granted: float
    resident: bool = False
    """An idle resident (no turn running in it)."""
    last_used: float = 0.0
    has_resident: bool = False
    """The lane's ACP agent process is up (running a turn now, or idle)."""


def derive_max_turns(available: int, reserve: int, estimates: Iterable[int]) -> int:
    """The default ``max_turns``: what memory holds of the largest configured turn, and at
    least :data:`MIN_DERIVED_TURNS` (memory admission guards the rest)."""
    largest = max(estimates, default=FALLBACK_ESTIMATE) or FALLBACK_ESTIMATE
    return max(MIN_DERIVED_TURNS, max(0, available - reserve) // largest)


class Admission:
    """The admission queue and the host's slots. See the module's theory of operation."""

    def __init__(self, limits: Limits, *, settle: float = SETTLE) -> None:
        if limits.max_turns < 1 or any(n < 1 for n in limits.per_agent.values()):
            raise AdmissionError(f"limits must be at least 1: {limits}")
        self.limits = limits
        self.settle = settle
        self._rotation: deque[str] = deque()
        """Channels with waiters, in the order they get their next chance."""
        self._waiting: dict[str, dict[str, _Waiter]] = {}
        """Per channel, its waiters by agent, in the order they offered."""
        self._slots: dict[Lane, _Slot] = {}

    # ------------------------------------------------------------ reading

    @property
    def used(self) -> int:
        """Slots taken: running turns and residents."""
        return len(self._slots)

    def running(self, agent: str | None = None) -> int:
        """Running turns (not idle residents), of one agent or all."""
        return sum(1 for (_, a), s in self._slots.items() if not s.resident and agent in (None, a))

    def residents(self) -> int:
        """Idle residents."""
        return sum(1 for s in self._slots.values() if s.resident)

    def holds(self, channel: str, agent: str) -> bool:
        """Does the lane have a slot (a turn granted or running, or an idle resident)?"""
        return (channel, agent) in self._slots

    def is_waiting(self, channel: str, agent: str) -> bool:
        return agent in self._waiting.get(channel, {})

    def waiting(self) -> list[Waiting]:
        """Every waiter in the order it would go, with why it waits."""
        out: list[Waiting] = []
        for channel, agent, waiter in self._order():
            out.append(Waiting(channel, agent, len(out) + 1, waiter.why, waiter.since))
        return out

    def _order(self) -> Iterable[tuple[str, str, _Waiter]]:
        """Waiters in grant order: round by round, each channel's next lane in rotation."""
        queues = [(c, deque(self._waiting[c].items())) for c in self._rotation]
        while queues:
            rest = []
            for channel, queue in queues:
                agent, waiter = queue.popleft()
                yield channel, agent, waiter
                if queue:
                    rest.append((channel, queue))
            queues = rest

    # ------------------------------------------------------------ events

    def offer(self, channel: str, agent: str, *, estimate: int, now: float) -> None:
        """The lane's worker wants to start a turn: it waits until a ``decide`` grants it."""
        lane = (channel, agent)
        if self.is_waiting(channel, agent):
            raise AdmissionError(f"{lane} is already waiting")
        slot = self._slots.get(lane)
        if slot is not None and not slot.resident:
            raise AdmissionError(f"{lane} already runs a turn")
        queue = self._waiting.setdefault(channel, {})
        if not queue:
            self._rotation.append(channel)
        queue[agent] = _Waiter(agent, estimate, now)

    def withdraw(self, channel: str, agent: str) -> bool:
        """The waiter gave up (its worker was cancelled); was it waiting?"""
        queue = self._waiting.get(channel)
        if queue is None or queue.pop(agent, None) is None:
            return False
        if not queue:
            del self._waiting[channel]
            self._rotation.remove(channel)
        return True

    def drop(self, channel: str) -> tuple[Lane, ...]:
        """A stop of ``channel``: its waiters leave the queue (named, oldest first)."""
        queue = self._waiting.pop(channel, None)
        if queue is None:
            return ()
        self._rotation.remove(channel)
        return tuple((channel, agent) for agent in queue)

    def drop_all(self) -> tuple[Lane, ...]:
        """A stop of every channel, or a shutdown: every waiter leaves the queue."""
        dropped = tuple(lane for c in list(self._rotation) for lane in self.drop(c))
        return dropped

    def release(self, channel: str, agent: str, *, resident: bool = False, now: float = 0.0) -> None:
        """The lane's turn ended (or was never started after its grant). ``resident``: its
        ACP agent stays up, idle, and keeps the slot until ``gone`` or an eviction."""
        lane = (channel, agent)
        slot = self._slots.get(lane)
        if slot is None or slot.resident:
            raise AdmissionError(f"{lane} has no turn to release")
        if resident:
            slot.resident, slot.last_used, slot.has_resident = True, now, True
        else:
            del self._slots[lane]

    def gone(self, channel: str, agent: str) -> bool:
        """The lane's resident process ended (idle timeout, death, eviction): an idle
        resident's slot is freed; a running turn keeps its slot. Was a slot freed?"""
        lane = (channel, agent)
        slot = self._slots.get(lane)
        if slot is None:
            return False
        slot.has_resident = False
        if slot.resident:
            del self._slots[lane]
            return True
        return False

    # ------------------------------------------------------------ the decision

    def decide(self, reading: MemoryReading | None, now: float) -> Decision:
        """Grant every waiter that fits, in fair order (see the theory of operation)."""
        grants: list[Grant] = []
        limits = self.limits
        held_agents: set[str] = set()
        for queue in self._waiting.values():
            for waiter in queue.values():
                waiter.why = Why.QUEUE
        # The round: each pass over the rotation grants at most one lane per channel.
        progress = True
        while progress and self._rotation:
            progress = False
            for channel in list(self._rotation):
                queue = self._waiting[channel]
                agent, waiter = next(iter(queue.items()))
                if agent in held_agents:
                    waiter.why = Why.AGENT_LIMIT
                    continue
                lane = (channel, agent)
                own = self._slots.get(lane)
                reuse = own is not None and own.resident
                close: list[Lane] = []
                cap = limits.per_agent.get(agent)
                if cap is not None and not reuse and self._agent_slots(agent) >= cap:
                    victim = self._idle_resident(agent)
                    if victim is None:
                        waiter.why = Why.AGENT_LIMIT
                        held_agents.add(agent)
                        continue
                    close.append(victim)
                if not reuse and self.used - len(close) >= limits.max_turns:
                    victim = self._idle_resident(None, besides=close)
                    if victim is None:
                        self._held(Why.TURN_LIMIT)
                        return Decision(tuple(grants))
                    close.append(victim)
                memory = self._memory_holds(waiter.estimate, reading, now) if not reuse else None
                if memory is not None:
                    self._held(memory)
                    return Decision(tuple(grants), recheck=True)
                # Granted: the lane leaves the queue, the channel goes to the back of the rotation.
                for victim in close:
                    del self._slots[victim]
                if reuse:
                    assert own is not None
                    own.resident, own.granted = False, now
                else:
                    self._slots[lane] = _Slot(waiter.estimate, now)
                del queue[agent]
                self._rotation.remove(channel)
                if queue:
                    self._rotation.append(channel)
                else:
                    del self._waiting[channel]
                grants.append(Grant(channel, agent, tuple(close)))
                progress = True
        return Decision(tuple(grants))

    def _held(self, why: Why) -> None:
        """The round ended on a host limit: every waiter not held by its agent waits for it."""
        for queue in self._waiting.values():
            for waiter in queue.values():
                if waiter.why is not Why.AGENT_LIMIT:
                    waiter.why = why

    def _agent_slots(self, agent: str) -> int:
        return sum(1 for (_, a) in self._slots if a == agent)

    def _idle_resident(self, agent: str | None, besides: Iterable[Lane] = ()) -> Lane | None:
        """The idle resident unused longest (of ``agent``, if named)."""
        skip = set(besides)
        idle = [(s.last_used, lane) for lane, s in self._slots.items()
                if s.resident and lane not in skip and agent in (None, lane[1])
                and not self.is_waiting(*lane)]  # (a waiting lane would reuse it)
        return min(idle)[1] if idle else None

    def _memory_holds(self, estimate: int, reading: MemoryReading | None, now: float) -> Why | None:
        """Why memory holds a turn of ``estimate`` bytes back, or None if it may go."""
        if reading is None:
            return None
        if reading.pressure is not None and reading.pressure >= self.limits.memory_pressure:
            return Why.PRESSURE
        unseen = sum(s.estimate for s in self._slots.values()
                     if not s.resident and s.granted >= reading.at - self.settle)
        if reading.available - unseen - estimate < self.limits.memory_reserve:
            return Why.MEMORY
        return None
