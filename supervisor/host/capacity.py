"""The host's capacity: the Trio driver of :mod:`supervisor.core.admission`.

A lane's worker calls :meth:`Capacity.admit` before it takes its next message off the stop
ledger's queue, and :meth:`Capacity.release` when the turn has ended. The waiting message
stays in the ledger's queue the whole time, so a stop drops it exactly as it drops any queued
message; :meth:`Capacity.drop` (called in the stop's own synchronous step) only wakes the
channel's waiting workers, which look at their queue again. The stop ledger's ``may_start``
at the spawn stays the point of no return: admission is before the take, and no await of
this module sits between ``may_start`` and the spawn.

Every decision is the pure :class:`~supervisor.core.admission.Admission`'s; this module
reads memory (a few small files, synchronously, at most every :data:`READ_EVERY` seconds),
wakes the granted workers, closes the idle ACP agents a grant names (shielded), and re-reads
memory every :data:`RECHECK` seconds while a turn waits for memory (nothing else would
wake it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from ..config.settings import Config
from ..core.admission import Admission, Decision, Grant, Lane, Limits, MemoryReading, derive_max_turns
from ..procs.memory import read_memory

log = logging.getLogger("corral.capacity")

#: Seconds a memory reading is reused (a burst of offers reads once).
READ_EVERY = 0.2
#: Seconds between readings while a turn waits for memory.
RECHECK = 0.5

Reader = Callable[[float], MemoryReading | None]


@dataclass(slots=True)
class _Wait:
    woken: trio.Event = field(default_factory=trio.Event)
    granted: bool = False
    closing: tuple[Lane, ...] = ()


def limits_for(config: Config, reading: MemoryReading | None) -> tuple[Limits, str]:
    """The host's limits from the config; ``max_turns`` derived from memory where unset.
    Also says where ``max_turns`` came from: ``"config"`` or ``"memory"``."""
    server = config.server
    per_agent = {name: a.max_concurrent for name, a in config.agents.items() if a.max_concurrent is not None}
    if server.max_turns is not None:
        max_turns, source = server.max_turns, "config"
    else:
        available = reading.available if reading is not None else 0
        max_turns = derive_max_turns(available, server.memory_reserve, [a.estimate for a in config.agents.values()])
        source = "memory"
    return Limits(max_turns, server.memory_reserve, server.memory_pressure, per_agent), source


class Capacity:
    """Waiting for a slot, fairly. Make one per supervisor; see the module's docstring."""

    def __init__(
        self,
        config: Config,
        nursery: trio.Nursery,
        *,
        read: Reader = read_memory,
        close_resident: Callable[[Lane], Awaitable[object]] | None = None,
    ) -> None:
        self._config = config
        self._nursery = nursery
        self._read = read
        self._close_resident = close_resident
        self._reading: MemoryReading | None = read(trio.current_time())
        limits, self.source = limits_for(config, self._reading)
        self.admission = Admission(limits)
        self._waits: dict[Lane, _Wait] = {}
        self._closing: dict[Lane, trio.Event] = {}
        """Idle residents being closed for a grant: their own lane waits for the close."""
        self._rechecking = False
        log.info("at most %d turns at once (%s); memory reserve %d MiB", limits.max_turns,
                 "from the config" if self.source == "config" else "derived from memory", limits.memory_reserve >> 20)

    @property
    def limits(self) -> Limits:
        return self.admission.limits

    def room(self) -> int:
        """Free slots less the turns waiting for one (negative: more wait than fits now)."""
        return self.limits.max_turns - self.admission.used - len(self._waits)

    def _estimate(self, agent: str) -> int:
        found = self._config.agents.get(agent)
        return found.estimate if found is not None else 0

    def _memory(self) -> MemoryReading | None:
        now = trio.current_time()
        if self._reading is None or now - self._reading.at >= READ_EVERY:
            self._reading = self._read(now)
        return self._reading

    # ------------------------------------------------------------ the worker's side

    def offer(self, channel: str, agent: str) -> None:
        """Queue the lane for a slot now (synchronously, as its message is accepted, so that
        lanes wait in the order their messages came); its worker collects it with :meth:`admit`."""
        lane = (channel, agent)
        if lane not in self._waits:
            self._waits[lane] = _Wait()
            self.admission.offer(channel, agent, estimate=self._estimate(agent), now=trio.current_time())
            self._decide()

    async def admit(self, channel: str, agent: str) -> bool:
        """Wait for a slot for the lane's next turn (offering it first if :meth:`offer` has not).
        True: granted (call :meth:`release` when the turn is over, whatever happens); False: a
        stop (or a shutdown) dropped the wait, and the caller looks at its queue again.
        Cancelled, it leaves no slot behind."""
        lane = (channel, agent)
        self.offer(channel, agent)
        wait = self._waits[lane]
        if wait.woken.is_set() and lane not in self._closing:
            # Granted at once: no checkpoint, so a host with room runs a turn exactly as
            # it did before admission existed (the take follows in this same step).
            del self._waits[lane]
            return wait.granted
        try:
            await wait.woken.wait()
            closing = self._closing.get(lane)
            if closing is not None:
                await closing.wait()  # (its own resident was closed for another grant)
        except BaseException:
            self.forget(channel, agent)
            raise
        if self._waits.get(lane) is wait:
            del self._waits[lane]
        return wait.granted

    def forget(self, channel: str, agent: str) -> None:
        """The lane's worker ends without collecting its wait: withdraw it, or give back
        the slot it was granted."""
        wait = self._waits.pop((channel, agent), None)
        if wait is None:
            return
        if not wait.woken.is_set() and not wait.granted:
            self.admission.withdraw(channel, agent)
        elif wait.granted:
            self.release(channel, agent)

    def release(self, channel: str, agent: str, *, resident: bool = False) -> None:
        """The lane's turn is over (or never began); ``resident``: its ACP agent stays up."""
        self.admission.release(channel, agent, resident=resident, now=trio.current_time())
        self._decide()

    def gone(self, lane: Lane) -> None:
        """A resident ACP agent's process ended (idle timeout, death, close)."""
        if self.admission.gone(*lane):
            self._decide()

    def drop(self, channel: str) -> None:
        """A stop of ``channel`` (synchronous, in the stop's own step): wake its waiters."""
        self._wake_dropped(self.admission.drop(channel))

    def drop_lane(self, channel: str, agent: str) -> None:
        """The lane's queue was emptied by a take-back (in that step): wake its waiter, if it waits."""
        if self.admission.withdraw(channel, agent):
            self._wake_dropped(((channel, agent),))

    def drop_all(self) -> None:
        """A stop-all or a shutdown: wake every waiter."""
        self._wake_dropped(self.admission.drop_all())

    def _wake_dropped(self, lanes: tuple[Lane, ...]) -> None:
        for lane in lanes:
            self._waits[lane].woken.set()  # (collected by its worker's admit: False)
        if lanes:
            self._decide()

    # ------------------------------------------------------------ deciding

    def _decide(self) -> None:
        decision = self.admission.decide(self._memory(), trio.current_time())
        self._carry_out(decision)

    def _carry_out(self, decision: Decision) -> None:
        for grant in decision.grants:
            wait = self._waits[(grant.channel, grant.agent)]
            wait.granted = True
            if grant.close_first:
                wait.closing = grant.close_first
                for victim in grant.close_first:
                    self._closing.setdefault(victim, trio.Event())
                self._nursery.start_soon(self._close_then_go, grant, wait)
            else:
                wait.woken.set()
        if decision.recheck and not self._rechecking:
            self._rechecking = True
            self._nursery.start_soon(self._recheck)

    async def _close_then_go(self, grant: Grant, wait: _Wait) -> None:
        """Close the idle residents a grant names, unused longest first, then let it go."""
        try:
            with trio.CancelScope(shield=True):
                for victim in grant.close_first:
                    log.info("closing idle agent %s of %r: its slot goes to %s of %r",
                             victim[1], victim[0], grant.agent, grant.channel)
                    if self._close_resident is not None:
                        try:
                            await self._close_resident(victim)
                        except Exception:
                            log.exception("closing idle agent %s of %r failed", victim[1], victim[0])
        finally:
            for victim in grant.close_first:
                event = self._closing.pop(victim, None)
                if event is not None:
                    event.set()
            wait.woken.set()

    async def _recheck(self) -> None:
        try:
            while True:
                await trio.sleep(RECHECK)
                self._reading = None
                decision = self.admission.decide(self._memory(), trio.current_time())
                self._carry_out(decision)  # (this task is the one re-reading: no second starts)
                if not decision.recheck:
                    return
        finally:
            self._rechecking = False

    # ------------------------------------------------------------ reading

    def waiting(self) -> dict[Lane, dict[str, Any]]:
        """Each waiting lane's place in the queue (1: next), why it waits and for how long."""
        now = trio.current_time()
        return {
            (w.channel, w.agent): {"position": w.position, "why": w.why.value, "waited": round(now - w.since, 3)}
            for w in self.admission.waiting()
        }

    def status(self) -> dict[str, Any]:
        """What ``corral status``, the API and the dashboard show of the host's capacity."""
        limits = self.limits
        reading = self._reading
        per_agent: Mapping[str, int] = limits.per_agent
        return {
            "max_turns": limits.max_turns,
            "max_turns_from": self.source,
            "memory_reserve": limits.memory_reserve,
            "memory_pressure": limits.memory_pressure,
            "used": self.admission.used,
            "running": self.admission.running(),
            "residents": self.admission.residents(),
            "agents": {
                name: {"max_concurrent": per_agent.get(name), "running": self.admission.running(name)}
                for name in self._config.agents
            },
            "memory": None if reading is None else {
                "available": reading.available, "source": reading.source, "pressure": reading.pressure,
            },
            "waiting": [{"channel": c, "agent": a, **info} for (c, a), info in self.waiting().items()],
        }
