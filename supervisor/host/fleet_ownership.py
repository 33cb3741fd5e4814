"""The fleet's answer to who runs a channel: the host holding its lease (:class:`FleetOwnership`).

Theory of operation
-------------------

A fleet (several hosts on one PostgreSQL store) runs a channel only on the host holding its
lease (:mod:`supervisor.fleet.fleet`). This is the supervisor's side of it, behind the
:class:`~supervisor.host.ownership.Ownership` port the lanes and the stopper ask:

* **Before a turn** (:meth:`FleetOwnership.take`) the host holds the lease: keeps it, or
  takes it if placement allows and it is free or expired. A channel new to this host (a new
  fencing token) is first taken over from the store (``_take_over``: its stop state, queue,
  plans, and what moves of its sessions); the turn waits until the lease of an owner taken
  by force has run out. Messages other hosts queued are taken up from the store under the
  current generation; whether a stop dropped one is the store's to say, not the seqs'
  (``begin_turn`` fails with ``Dropped``, and the lane is given back).
* **A stop through another host** asks the owner (``_stop_elsewhere``), which first waits
  for its own acquisition and take-over of the channel in flight (``_taken_over``): a
  decision on the state of before the store's read would move a generation the store has
  already passed. An owner silent for the lease has its lease taken by force; the stop is
  then carried out here, and answers ``ok: false`` while that host's processes cannot be
  confirmed dead (:meth:`FleetOwnership.unconfirmed`).
* **A lost lease** (the watchdog's local deadline, or a renewal that finds the row taken)
  kills the channel's turns at once, through the stopper's one kill step, with SIGKILL.
* **Orphans and queued work** the heartbeat finds are taken up in tasks of their own.
* **Placement by capacity.** Each heartbeat stores this host's room (free slots less the
  turns waiting for one: :meth:`~supervisor.host.capacity.Capacity.room`). Before a turn, a
  host with no room leaves a *free* channel to a live host that said it has room (the
  message stays in the store's queue; that host takes it up as unowned work), unless the
  lane already holds a slot here or the channel is pinned here; a host takes it when no
  other has room. After each heartbeat (:meth:`FleetOwnership._place`), a host with more
  turns waiting than slots gives back the leases of channels that only wait here — nothing
  of theirs runs — as many as the others have room, the last in its queue first: their
  rows stay in the store and the next owner takes them with a new token.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ..config.settings import Config
from ..core.ledger import OutputKind, StopLedger
from ..core.notices import Entries, Notice, Queued, Stop, Stopped, Stopping
from ..core.results import HOST_LOST_NOTICE, STOP_SLACK, StopResult
from ..fleet.fleet import Fleet, Found
from ..store.store import Store, StoreError
from ..turns.ports import TurnLedger

if TYPE_CHECKING:
    from .lanes import Lanes
    from .stopper import Stopper

log = logging.getLogger("corral")


class FleetOwnership:
    """This host's side of a fleet (see the module's theory). Give it its lanes and stopper with :meth:`attach`."""

    def __init__(self, config: Config, store: Store, ledger: StopLedger, nursery: trio.Nursery) -> None:
        assert store.host is not None, "a fleet's store names its host"
        self._config = config
        self._store = store
        self._ledger = ledger
        self._nursery = nursery
        self.fleet = Fleet(store, store.host, config.cluster.lease)
        """This host's leases."""
        self._last_token: dict[str, int] = {}
        """The token this host last held for each channel (kept when the lease is lost)."""
        self._taking_over: dict[str, trio.Event] = {}
        """Channels being taken over from the store right now (set when done)."""
        self._taking: set[str] = set()
        """Channels a heartbeat is taking up right now."""
        self._handing: set[str] = set()
        """Channels whose waiting work this host is giving to hosts with room."""
        self._answers: dict[str, _Answer] = {}
        """Stops this host asked other hosts to carry out, by request id."""
        self._unconfirmed: dict[str, dict[str, float]] = {}
        """Channels taken over from hosts whose turns there are not confirmed dead: those
        hosts and their heartbeats then (a host confirms by a later one: it kills first)."""

    def attach(self, lanes: Lanes, stopper: Stopper) -> None:
        """The lanes it queues taken-up work in, and the stopper it stops and kills through."""
        self._lanes = lanes
        self._stopper = stopper
        self.fleet.room = lanes.capacity.room

    # ------------------------------------------------------------ the port

    async def take(self, channel: str, agent: str) -> bool:
        """Hold the channel's lease before a turn; then wait out a forced takeover's old lease."""
        if not await self._own(channel, placing=agent):
            return False
        await self.fleet.wait_ready(channel)  # (taken by force: the old owner's lease runs out first)
        return True

    def fence(self, channel: str) -> int | None:
        """The token this host last held for the channel (kept after the lease is lost)."""
        return self._last_token.get(channel)

    def turn_ledger(self, ledger: StopLedger) -> TurnLedger:
        """The ledger, and at the point of no return the lease too."""
        return _LeasedLedger(ledger, self.fleet)

    async def stop_elsewhere(self, channel: str, started: float, cpu: float) -> StopResult | None:
        """None if this host runs the channel (it stops it itself); else the stop carried out by its owner."""
        if await self._own(channel):
            return None
        return await self._stop_elsewhere(channel, started, cpu)

    def status(self) -> dict[str, Any] | None:
        """This host, its lease, what it holds, the fleet's hosts and the pinned channels."""
        return {
            "host": self.fleet.host, "lease": self.fleet.lease, "held": self.fleet.held(),
            "hosts": self.fleet.view, "pinned": self._pinned_status(),
        }

    async def serve(self, nursery: trio.Nursery) -> None:
        """The notices' listener, then the heartbeat and its watchdog."""
        await nursery.start(self.fleet.listen, self._notice)
        await nursery.start(self.fleet.run, self._apply)

    async def close(self) -> None:
        """Give every lease back."""
        await self.fleet.release()

    # ------------------------------------------------------------ owning

    def _apply(self, found: Found) -> None:
        """(Synchronous, in the step the heartbeat or the watchdog returned it) act on what the
        fleet found: kill the turns of every lost lease first, then take up the orphans and
        the work queued elsewhere."""
        for channel, why in found.lost:
            self._lost(channel, why)
        if found.orphans or found.queued:
            self._orphans(list(found.orphans), list(found.queued))
        if found.beat:
            self._place()

    def _placed_elsewhere(self, channel: str) -> str | None:
        """The host the channel is pinned to, if it is not this one."""
        table = self._config.channels.get(channel)
        return table.host if table is not None and table.pinned_elsewhere(self.fleet.host) else None

    async def _own(self, channel: str, *, placing: str | None = None) -> bool:
        """(A fleet) hold the channel's lease before a turn: keep it, or take it if placement
        allows and it is free or expired; a channel new to this host (a new token) is first
        taken over from the store (its stop state, queue, plans, and what moves of its sessions).
        ``placing``: for work (the lane's agent, or "" for a channel's), not a stop: a free
        channel is left to another host when this one has no room and another has."""
        fleet = self.fleet
        if self._placed_elsewhere(channel) is not None or (placing is not None and channel in self._handing):
            return False  # (even if held: a stop may take a pinned channel's lease, never its turns)
        await self._taken_over(channel)
        if fleet.holds(channel):
            return True
        if placing is not None and self._no_room_here(channel, placing):
            log.info("[%s] left to a host with room: this one has none (%d)", channel, self._lanes.capacity.room())
            return False
        try:
            token = await fleet.acquire(channel)
        except StoreError as exc:
            log.error("[%s] could not take the channel's lease: %s", channel, exc)
            return False
        if token is None:
            return False
        if self._last_token.get(channel) != token:
            self._last_token[channel] = token
            await self._take_over(channel)
        return True

    def _no_room_here(self, channel: str, agent: str) -> bool:
        """Should a free channel be left to another host? Yes when this host has no room (no
        free slot for what waits) and another live host said it has, unless the lane already
        holds a slot here or the channel is pinned here. A host takes it when nobody else has room."""
        capacity = self._lanes.capacity
        if agent and capacity.admission.holds(channel, agent):
            return False
        table = self._config.channels.get(channel)
        if table is not None and table.host == self.fleet.host:
            return False
        return capacity.room() <= 0 and self.fleet.room_elsewhere() > 0

    def _place(self) -> None:
        """(After each heartbeat; synchronous) move waiting work to hosts with room: a channel
        held here with nothing running and its lanes waiting for a slot is given back, the last
        in this host's queue first, as many as this host has waiting beyond its free slots and
        the others have room. Its queue stays in the store, where a host with room takes it up
        (with a new token: the leases' fencing as for any move)."""
        fleet, capacity = self.fleet, self._lanes.capacity
        room, excess = fleet.room_elsewhere(), -capacity.room()
        if room <= 0 or excess <= 0 or self._lanes.closing:
            return
        busy = {channel for channel, _ in self._lanes.turns}
        moving: list[str] = []
        for channel, _ in reversed(list(capacity.waiting())):
            table = self._config.channels.get(channel)
            if (channel in moving or channel in busy or channel in self._handing or self._stopper.recording(channel)
                    or channel in self._stopper.stops or channel in self._taking or channel in self._taking_over
                    or not fleet.holds(channel) or self._ledger.current_turns(channel)
                    or (table is not None and table.host == fleet.host)):
                continue
            moving.append(channel)
            if len(moving) >= min(room, excess):
                break
        for channel in moving:
            self._handing.add(channel)
            self._lanes.forget(channel)  # (its waiters wake; queued again if retaken)
            self._ledger.lose(channel)  # (nothing runs: its queue is forgotten here, the store keeps it)
            log.info("[%s] its waiting work goes to a host with room (%d waiting beyond the slots here, "
                     "room for %d elsewhere)", channel, excess, room)
            self._nursery.start_soon(self._give_back, channel)

    async def _give_back(self, channel: str) -> None:
        try:
            await self.fleet.give_back(channel)
        except StoreError as exc:
            log.warning("[%s] could not give the lease back (it runs out instead): %s", channel, exc)
        finally:
            self._handing.discard(channel)

    async def _taken_over(self, channel: str) -> None:
        """(A fleet) wait for this host's acquisition of the channel's lease and its take-over
        from the store, if either is in flight: then the channel's state here is the store's
        (a stop decided before would move a generation the store has already passed)."""
        await self.fleet.settled(channel)
        taking = self._taking_over.get(channel)
        if taking is not None:
            await taking.wait()

    async def _take_over(self, channel: str) -> None:
        done = self._taking_over[channel] = trio.Event()
        try:
            await self._take_over_now(channel)
        finally:
            done.set()
            if self._taking_over.get(channel) is done:
                del self._taking_over[channel]

    async def _take_over_now(self, channel: str) -> None:
        found = await self._store.take_over(
            channel, here=lambda cwd: os.path.isdir(cwd), skip={t for t, _ in self._lanes.fences.items()},
            notice=HOST_LOST_NOTICE,
        )
        if found.state is not None:
            self._ledger.restore(channel, found.state.generation, rests=found.state.rests, stopped=found.state.stopped)
        self._ledger.adopt(channel)  # (what this host accepted meanwhile: its rows still stored decide)
        away = {h for _, _, h in found.ended if h is not None and h != self.fleet.host}
        if away:
            self._unconfirmed[channel] = {h: found.heartbeats.get(h, 0.0) for h in away}
        self._lanes.requeue([row for row in found.queue if row.seq not in self._lanes.known], taken_up=True)

    def _lost(self, channel: str, why: str) -> None:
        """(Synchronous, from what the fleet's watchdog or heartbeat found) this host lost the channel's
        lease: its turns are killed now, in this step, with SIGKILL and no grace (another
        host may begin the channel once the lease runs out in the database: nothing of this
        host's may be alive by then); its queue here is forgotten (the store keeps it)."""
        self._lanes.forget(channel)  # (queued again if retaken)
        decision = self._ledger.lose(channel)
        # No checkpoint from the decision to the last signal: the stopper's one kill step.
        self._stopper.kill(decision.turns, "lease lost", signal.SIGKILL)
        log.warning("[%s] lease lost (%s): killed turns %s", channel, why, [t for _, t in decision.turns])

    def _orphans(self, channels: list[str], queued: list[tuple[str, int]]) -> None:
        """(From the heartbeat) channels with work under an expired lease of another host, and
        messages other hosts queued for channels this host holds: take them up."""
        for channel in channels:
            if channel not in self._taking and self._placed_elsewhere(channel) is None and not self._lanes.closing:
                self._taking.add(channel)
                self._nursery.start_soon(self._take_orphan, channel)
        fresh = [channel for channel, seq in queued if seq not in self._lanes.known]
        for channel in dict.fromkeys(fresh):
            if channel not in self._taking and not self._lanes.closing:
                self._taking.add(channel)
                self._nursery.start_soon(self._take_orphan, channel)

    def _queued_elsewhere(self, channel: str) -> None:
        """(From the fleet's listener) another host queued a message for the channel: take it
        up now if this host runs the channel (holds its lease, or it is pinned here), not at
        the next heartbeat. The notice comes at the queue row's commit, so the row is there."""
        table = self._config.channels.get(channel)
        pinned_here = table is not None and table.host == self.fleet.host
        if (self.fleet.holds(channel) or pinned_here) and channel not in self._taking and not self._lanes.closing:
            self._taking.add(channel)
            self._nursery.start_soon(self._take_orphan, channel)

    async def _take_orphan(self, channel: str) -> None:
        try:
            if await self._own(channel, placing=""):
                await self.pick_up(channel)
                for agent in self._ledger.lanes(channel):  # (restored here before the lease was free)
                    if self._ledger.queued(channel, agent):
                        self._lanes.ensure_worker(channel, agent)
        except StoreError as exc:
            log.error("[%s] could not take the channel up: %s", channel, exc)
        finally:
            self._taking.discard(channel)

    async def pick_up(self, channel: str) -> None:
        rows = await self._store.load_queue(channel)
        self._lanes.requeue([row for row in rows if row.seq not in self._lanes.known], taken_up=True)

    def unconfirmed(self, channel: str) -> str | None:
        """(A fleet) why a stop of a channel taken over from a host cannot be called done:
        that host has not answered since, so its turn's processes may live on."""
        waiting = self._unconfirmed.get(channel)
        if waiting is None:
            return None
        seen = {h["host"]: h["heartbeat"] for h in self.fleet.view}
        silent = sorted(h for h, then in waiting.items() if seen.get(h, 0.0) <= then)
        if not silent:
            del self._unconfirmed[channel]  # each has beaten since: it killed its stale turns first
            return None
        last = max(waiting[h] for h in silent)
        when = time.strftime("%H:%M:%S", time.localtime(last)) if last else "it joined"
        return (f"host {', '.join(silent)} has not answered since {when}; "
                "its processes could not be confirmed dead")

    async def _stop_elsewhere(self, channel: str, started: float, cpu: float) -> StopResult:
        """(A fleet) a stop of a channel another host owns, or that is pinned elsewhere.

        The owner is asked through the fleet's notices and carries out the stop itself (its
        record, its kill, its notice, last); its result is the answer. If it does not answer
        within the lease, this host takes the lease by force (a new fencing token: the
        owner stores nothing more there, and kills its turns the moment it looks), takes
        the channel over from the store and stops it here: the record is stored, and the
        answer is ``ok: false`` while the silent host's processes cannot be confirmed dead.
        A pinned channel's lease is given back afterwards: it runs on its host again."""
        fleet = self.fleet
        try:
            owner = await self._owner(channel)
        except StoreError as exc:  # (this host is cut off: a takeover would only wait out its deadline too)
            result = StopResult(channel, self._ledger.generation(channel), ok=False,
                                error=f"the stop could not be stored: {exc.__cause__ or exc}; nothing was stopped")
            result.elapsed_ms = (trio.current_time() - started) * 1000
            return result
        if owner is not None and owner != fleet.host:
            request = secrets.token_hex(8)
            answer = self._answers[request] = _Answer()
            try:
                await fleet.notify(Stop(fleet.host, to=owner, channel=channel, id=request))
                with trio.move_on_after(fleet.lease):
                    await answer.heard.wait()  # it acknowledges at once, then tears its turns down
                grace = max((a.limits.stop_grace for a in self._config.agents.values()), default=0.0)
                if answer.heard.is_set():
                    with trio.move_on_after(grace + STOP_SLACK):
                        await answer.done.wait()
            except StoreError as exc:
                log.error("stop %r: could not ask host %s: %s", channel, owner, exc)
            finally:
                del self._answers[request]
            if answer.result is not None:
                result = answer.result
                result.elapsed_ms = (trio.current_time() - started) * 1000
                result.cpu_ms = (time.process_time() - cpu) * 1000
                log.info("stop %r: carried out by host %s in %.1f ms", channel, owner, result.elapsed_ms)
                return result
            log.warning("stop %r: host %s did not answer within %g s; taking the channel", channel, owner, fleet.lease)
        try:
            self._last_token[channel] = await fleet.force(channel)
            await self._take_over(channel)
        except StoreError as exc:
            result = StopResult(channel, self._ledger.generation(channel), ok=False,
                                error=f"the stop could not be stored: {exc.__cause__ or exc}; nothing was stopped")
            result.elapsed_ms = (trio.current_time() - started) * 1000
            return result
        decision = self._ledger.stop(channel)
        result = (await self._stopper.carry_out(self._stopper.record([decision]), started))[0]
        if self._placed_elsewhere(channel) is not None:
            with trio.CancelScope(shield=True):
                try:
                    await fleet.give_back(channel)
                except StoreError as exc:
                    log.warning("[%s] could not give the lease back (it runs out on its own): %s", channel, exc)
        result.cpu_ms = (time.process_time() - cpu) * 1000
        return result

    async def _acknowledge(self, asker: str, request: str) -> None:
        try:
            await self.fleet.notify(Stopping(self.fleet.host, to=asker, id=request))
        except StoreError as exc:
            log.warning("could not acknowledge host %s's stop: %s", asker, exc)

    async def _owner(self, channel: str) -> str | None:
        """The host whose lease on the channel has not run out, if any (StoreError: the
        database did not answer)."""
        for host in await self.fleet.hosts():
            if channel in host["channels"] and not host["channels"][channel]["expired"]:
                return str(host["host"])
        return None

    def _notice(self, notice: Notice) -> None:
        """(From the fleet's listener) another host's message row or commit, a stop for this
        host to carry out, or the answer to one this host asked another to carry out."""
        me = self.fleet.host
        match notice:
            case Queued() if notice.sender != me:
                self._queued_elsewhere(notice.channel)
            case Entries() if notice.sender != me:
                self._store.others_committed(notice.last)
            case Stop() if notice.to == me and not self._lanes.closing:
                self._nursery.start_soon(self._stop_for, notice.channel, notice.sender, notice.id)
            case Stopping() | Stopped() if notice.to == me and notice.id in self._answers:
                answer = self._answers[notice.id]
                answer.heard.set()
                if isinstance(notice, Stopped):
                    try:
                        answer.result = StopResult.from_json(notice.result)
                    except ValueError as exc:  # (the asker waits out its deadline, then takes the channel)
                        log.warning("host %s's answer to a stop is not a stop's result (%s); dropped", notice.sender,
                                    exc)
                        return
                    answer.done.set()

    async def _stop_for(self, channel: str, asker: str, request: str) -> None:
        """Carry out a stop another host was asked for, if this host owns the channel (else
        say nothing: the asker takes the channel when its wait runs out)."""
        await self._taken_over(channel)  # (the lease taken a moment ago: the asker read it first)
        if not self.fleet.holds(channel) or self._lanes.closing:
            return
        started, cpu = trio.current_time(), time.process_time()
        decision = self._ledger.stop(channel)
        batch = self._stopper.record([decision])
        self._nursery.start_soon(self._acknowledge, asker, request)  # (beside the stop: never before its kill)
        result = (await self._stopper.carry_out(batch, started))[0]
        result.cpu_ms = (time.process_time() - cpu) * 1000
        try:
            await self.fleet.notify(Stopped(self.fleet.host, to=asker, id=request, result=result.to_json()))
        except StoreError as exc:
            log.error("stop %r for host %s: carried out, but the answer could not be sent: %s", channel, asker, exc)

    def _pinned_status(self) -> dict[str, dict[str, Any]]:
        """Each pinned channel: its host, and whether it waits for that host (not alive)."""
        alive = {h["host"]: h["alive"] for h in self.fleet.view}
        return {
            name: {"host": table.host, "waiting": not alive.get(table.host, False)}
            for name, table in sorted(self._config.channels.items()) if table.host is not None
        }


class _LeasedLedger:
    """The ledger as a fleet's turn sees it: at the point of no return the channel's lease
    must be this host's too (its local deadline not passed)."""

    def __init__(self, ledger: StopLedger, fleet: Fleet) -> None:
        self._ledger = ledger
        self._fleet = fleet

    def may_start(self, channel: str, turn_id: str) -> bool:
        """The ledger's answer, and only while this host holds the lease."""
        if not self._fleet.holds(channel):
            log.warning("[%s %s] not started: this host does not hold the channel's lease", channel, turn_id)
            return False
        return self._ledger.may_start(channel, turn_id)

    def is_stale(self, channel: str, turn_id: str) -> bool:
        """The ledger's answer."""
        return self._ledger.is_stale(channel, turn_id)

    def keep_output(self, channel: str, turn_id: str, kind: OutputKind) -> bool:
        """The ledger's answer."""
        return self._ledger.keep_output(channel, turn_id, kind)


@dataclass(slots=True)
class _Answer:
    """Another host's answer to a stop this host asked it to carry out."""

    heard: trio.Event = field(default_factory=trio.Event)
    """The owner has acknowledged the stop (it is carrying it out)."""
    done: trio.Event = field(default_factory=trio.Event)
    result: StopResult | None = None
