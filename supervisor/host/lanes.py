"""The lanes: a channel's agents each with a queue and one turn at a time, under one nursery.

Theory of operation
-------------------

A channel has one worker per agent (a *lane*: its queue in the ledger, one turn at a time),
so different agents of a channel work at once. A message is stamped by the ledger and given
its seq by the store in one synchronous step (:meth:`Lanes.accept`), so their orders agree.
A worker takes the next message (the ledger drops what a stop made stale), begins the turn
in the store — the dequeue and the turn's row in one commit, awaited before the point of no
return — and runs it: the turn the agent's adapter declares (``runs``), retried once without
its session if the CLI forgot it.

Before each turn the worker asks its :class:`~supervisor.host.ownership.Ownership` whether
this host runs the channel (always, alone; in a fleet, while it holds the lease) and for the
fencing token every write of the turn carries.

Then it waits for a slot (:class:`~supervisor.host.capacity.Capacity`: the host's
``max_turns``, its agent's ``max_concurrent``, memory) *before* it takes its message: a
waiting turn is a queued message of the ledger, which a stop drops like any other (and the
stop wakes the wait, in its own step). A lane is offered for a slot as its message is
accepted, so lanes wait in the order their messages came. The ledger's ``may_start`` at the
spawn stays the point of no return; no await of admission sits between it and the spawn.

Hand-offs: a turn stores its entries through a store port that routes each ``message``
entry of the agent's (:meth:`Lanes.hand_off`) in the same synchronous step that stores it —
no checkpoint between "the ledger lets the entry be kept" and "the routed message is
accepted", so a stop lands either before both (nothing stored, nothing routed) or after
both (the routed message is queued under the old generation and dropped by the stop).

A lane whose agent's or channel's daily budget is spent (:mod:`supervisor.core.daily`: the
lanes' :attr:`Lanes.daily`, today's stored spend at start plus each turn as it ends) does not
take its next message either: before it asks for a slot, it says once, in a status entry,
which messages wait and why, gives back its place in the slot queue, and sleeps until the next
00:00 UTC (a Trio deadline) or until :meth:`Lanes.wake_daily` — a ``budget reset``, a stop (whose
record drops the waiting messages as it drops any queued one), a take-back, a shutdown.

The lanes keep every built turn (:attr:`Lanes.turns`, and :meth:`Lanes.built` by id): the
stopper's one kill step finds them there.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from adapters import get_adapter

from ..config.settings import AgentConfig, Config
from ..core.account import unfinished
from ..core.catchup import Missed, catch_up_prompt
from ..core.counters import Metrics
from ..core.daily import DailySpent, DailyTally, seconds_to_midnight, utc_day
from ..core.ledger import QueuedMessage, StopLedger, TurnTicket
from ..core.results import INTERRUPT_NOTICE, NUDGE_TEXT, Accepted, plan_cancelled_text, stop_notice_text
from ..core.router import route
from ..core.usage import TurnRecord, usage_entry
from ..procs.cgroup import TurnCgroup
from ..procs.hooks import Hooks
from ..procs.netns import holder_pids
from ..procs.registry import ProcessRegistry
from ..procs.tree import ProcessTree, reap_if_child, reap_orphans, wait_pid_exit
from ..store.store import Draft, Dropped, Fenced, Pending, QueuedRow, Store, StoreError
from ..turns.acp import AcpTurn
from ..turns.pool import AcpAgentPool
from ..turns.ports import RunningTurn, TurnPorts, new_turn_id, retry_without_session
from ..turns.process import Turn
from .capacity import Capacity
from .ownership import Ownership

log = logging.getLogger("corral")
#: How many messages done with stay known to this host (see ``Lanes.known``): many more than a
#: fleet's pick-up can read in the time one of them takes to be dequeued and run.
KNOWN_DONE_KEPT = 10_000


@dataclass(frozen=True, slots=True)
class Interruption:
    """What the notice of an interrupted turn says: the message that interrupted it, and what it dropped."""

    by: int
    """The interrupting message's seq."""
    dropped: tuple[int, ...]
    """The entries of the lane's queued messages it dropped."""
    plan: list[dict[str, str]] | None = None
    """The agent's plan it cancelled (stored with its record), said in the transcript before
    the notice as a stop says it ("Plan cancelled"), so no page keeps it shown as live."""


@dataclass(slots=True)
class _Message:
    """The payload the ledger carries for a queued message."""

    agent: str
    author: str
    text: str
    committed: Pending | None
    """The message's own write (None: restored messages are already stored)."""
    begun: Pending | None = None
    """The dequeue and the turn's row, stored before the point of no return."""
    hops: int = 0
    """Agent-to-agent hand-offs behind it."""
    routed_from: int | None = None
    """The entry it repeats when it has none of its own (a hand-off's source, or the entry of a
    message sent to several agents, for the second and later): its catch-up leaves it out."""
    seen_before: int | None = None
    """The last message the agent had taken up before this one (its catch-up starts after it)."""
    accepted_at: float | None = None
    """When its entry was accepted (wall clock; None: not known): the queue shows its age."""


class _TurnStore:
    """The store as a turn sees it: an agent's ``message`` entry is handed off as it is stored.

    In a fleet every write of a turn carries the fencing token its host held when the turn
    began (``fences``): a host that lost the channel's lease stores nothing more for it."""

    def __init__(
        self, store: Store, hand_off: Callable[[str, str, str, str, int], None],
        fences: Mapping[str, tuple[str, int]], fence: Callable[[str], int | None],
    ) -> None:
        self._store = store
        self._hand_off = hand_off
        self._fences = fences
        """Each running turn's channel and token (by turn id)."""
        self._fence = fence
        """The token this host last held for a channel (kept after the lease is lost)."""

    @property
    def store_id(self) -> str:
        """The store's id."""
        return self._store.store_id

    def submit_entry(
        self, channel: str, author: str, kind: str, text: str, *, turn: str | None = None, generation: int = 0,
        meta: Mapping[str, object] | None = None,
    ) -> Pending:
        """Store the entry; route it on in the same step if it is an agent's message."""
        fence = self._fences[turn][1] if turn is not None and turn in self._fences else None
        pending = self._store.submit_entry(
            channel, author, kind, text, turn=turn, generation=generation, meta=meta, fence=fence
        )
        # A run cut off by a stop is saved, never routed on: the stop ends the hand-offs too (line 12).
        cut_off = meta is not None and "cut_off" in meta
        if kind == "message" and turn is not None and pending.entry is not None and author.startswith("agent:") \
                and not cut_off:
            self._hand_off(channel, turn, author, text, pending.entry.seq)
        return pending

    def show_draft(self, draft: Draft) -> None:
        """Show a draft to this host's followers (never stored, so never fenced)."""
        self._store.show_draft(draft)

    def save_session(self, channel: str, agent: str, session_id: str | None, cwd: str) -> Pending:
        """The agent's session id for the channel."""
        return self._store.save_session(channel, agent, session_id, cwd, fence=self._fence(channel))

    def save_todos(self, channel: str, agent: str, items: list[dict[str, str]]) -> Pending:
        """The agent's plan for the channel."""
        return self._store.save_todos(channel, agent, items, fence=self._fence(channel))

    def record_usage(self, record: TurnRecord) -> Pending:
        """What the ended turn spent."""
        return self._store.record_usage(record)

    def turn_spawned(self, turn_id: str, pid: int, started: int | None) -> Pending:
        """The turn's process, on its row."""
        channel, fence = self._fences.get(turn_id, ("", None))
        return self._store.turn_spawned(turn_id, pid, started, channel=channel, fence=fence)


class Lanes:
    """Every lane's worker and turn (see the module's theory)."""

    def __init__(
        self, config: Config, store: Store, ledger: StopLedger, nursery: trio.Nursery, *, registry: ProcessRegistry,
        ownership: Ownership, hooks: Hooks, reap_adopted: bool,
        make_ports: Callable[[_TurnStore, Callable[[ProcessTree], None]], TurnPorts], capacity: Capacity,
        metrics: Metrics,
    ) -> None:
        self._config = config
        self._store = store
        self._ledger = ledger
        self._nursery = nursery
        self._registry = registry
        self._ownership = ownership
        self._hooks = hooks
        self.reap_adopted = reap_adopted
        """Every child of this process is corral's: reap dead adoptees after each turn."""
        self._reap_scheduled = False
        self.workers: set[tuple[str, str]] = set()
        """``(channel, agent)`` lanes with a worker."""
        self.turns: dict[tuple[str, str], RunningTurn] = {}
        """The built turn of each ``(channel, agent)`` lane."""
        self._by_id: dict[str, RunningTurn] = {}
        """The same turns, by turn id."""
        self.hops: dict[str, int] = {}
        """Each current turn's message's hop count (its hand-offs go one further)."""
        self.fences: dict[str, tuple[str, int]] = {}
        """Each running turn's channel and the fencing token its lease had when it began."""
        self.known: set[int] = set()
        """Seqs of the messages this host's ledger holds or has held lately (a fleet picks up
        only others): a message done with (its turn ended, or a stop dropped it) leaves it
        :data:`KNOWN_DONE_KEPT` messages later (:meth:`done_with`), so it holds what is queued
        and running plus a bounded tail, not every message of the daemon's life."""
        self._done: deque[int] = deque()
        """The seqs done with, oldest first: each leaves ``known`` once it is that far back."""
        self.idle: dict[str, trio.Event] = {}
        self.interruptions: dict[str, Interruption] = {}
        """Turns an interrupting message has made stale, by id: their notice is owed at their end."""
        self.closing = False
        """Shutting down: no new worker starts, and a worker takes no next message."""
        self.capacity = capacity
        """Admission: how many turns (and idle ACP agents) at once, fairly, within memory."""
        self.metrics = metrics
        self.daily = DailyTally()
        """Today's spend per agent and per channel, that the daily budgets are asked against."""
        self.hold_usage: Callable[[RunningTurn], bool] = lambda turn: False
        """Asked at a turn's end that has a usage row: True if the stop that ended it takes the row,
        to store it in its notice's commit (the stopper's; a stop-all's 200 rows then cost no
        commit of their own). False: the row is submitted at once."""
        self._daily_waits: dict[tuple[str, str], trio.Event] = {}
        """Lanes waiting for a spent daily budget: a reset, a stop or midnight sets the event."""
        self.acp = AcpAgentPool(nursery, on_gone=capacity.gone)
        """The persistent ACP agent processes, one per (channel, agent); closed on shutdown."""
        self.ports = make_ports(_TurnStore(store, self.hand_off, self.fences, ownership.fence), self.adopt_background)

    def accept(
        self, channel: str, targets: tuple[str, ...], author: str, text: str, *, nudge: bool, hops: int = 0,
        also: Callable[[Any, int], None] | None = None,
        origin: str | None = None, meta: Mapping[str, object] | None = None, delivery: str | None = None,
    ) -> _Acceptance:
        """``also``: more to do in the message's own transaction (a resend marks its original)."""
        # Stamping (ledger) and seq (store) happen in one synchronous step: their orders agree.
        # ``origin``: the outside event it comes from (a bridge's), stored in the message's transaction.
        generation = self._ledger.generation(channel)
        pending = self._store.accept_message(
            channel, targets[0] if targets else None, author, text, generation=generation, nudge=nudge, to=targets,
            hops=hops, also=also, origin=origin, meta=meta, delivery=delivery,
        )
        assert pending.entry is not None
        seq = pending.entry.seq
        human = author.startswith("human:")
        first = targets[0] if targets else ""
        ahead = len(self._ledger.queued(channel, first)) + (1 if self._ledger.current_turn(channel, first) else 0)
        step = self._store.seq_step
        for i, target in enumerate(targets):  # the store gave the targets the seqs after the first (+ i steps)
            payload = _Message(target, author, text, pending, hops=hops, routed_from=seq if i else None,
                               accepted_at=pending.entry.ts)
            self.known.add(seq + i * step)
            self._ledger.accept(
                channel, target, seq + i * step, human=human, nudge=nudge, payload=payload, hops=hops,
                routed=author.startswith("agent:"), entry=seq if i else None,
            )
            self.ensure_worker(channel, target)
        return _Acceptance(Accepted(seq, channel, first, generation, ahead, targets), pending)

    def hand_off(self, channel: str, turn_id: str, author: str, text: str, source: int) -> None:
        """(Synchronous, in the step that stored it) route an agent's message entry on."""
        agent = author.removeprefix("agent:")
        decision = route(
            text, author=agent, hops=self.hops.get(turn_id, 0), members=self._config.members(channel),
            may_route=self._ledger.may_route(channel, from_human=False, turn_id=turn_id),
            max_hops=self._config.hop_limit(channel),
        )
        generation = self._ledger.generation(channel)  # the producing turn's: it is not stale
        if decision.targets:
            seqs, pending = self._store.accept_routed(
                channel, decision.targets, author, text, generation=generation, hops=decision.hops, source=source
            )
            for target, seq in zip(decision.targets, seqs, strict=True):
                payload = _Message(target, author, text, pending, hops=decision.hops, routed_from=source,
                                   accepted_at=time.time())
                self.known.add(seq)
                self._ledger.accept(channel, target, seq, human=False, payload=payload, hops=decision.hops, routed=True,
                                    entry=source)
                self.ensure_worker(channel, target)
            log.info("[%s %s] %s handed off to %s (hop %d)", channel, turn_id, agent, decision.targets, decision.hops)
        status = decision.status()
        if status is not None:
            self._store.submit_entry(channel, "system", "status", status, turn=turn_id, generation=generation)

    def ensure_worker(self, channel: str, agent: str) -> None:
        lane = (channel, agent)
        if lane not in self.workers and not self.closing:
            self.workers.add(lane)
            self._nursery.start_soon(self._worker, channel, agent, name=f"corral-worker:{channel}:{agent}")
            self.capacity.offer(channel, agent)  # (now: lanes wait in the order their messages came)

    async def _worker(self, channel: str, agent: str) -> None:
        """Run one lane's queued messages one turn at a time; exit when idle."""
        try:
            while not self.closing:
                if not await self._ownership.take(channel, agent):
                    # Another host runs the channel: its messages wait in the store's queue for
                    # it (one whose write failed was refused), not here.
                    self.known.difference_update(m.id for m in self._ledger.queued(channel, agent))
                    self._ledger.forget_queue(channel, agent)
                    break
                if not self._ledger.queued(channel, agent):
                    break
                spent = self.daily_spent(channel, agent)
                if spent is not None:
                    await self._wait_daily(channel, agent, spent)
                    continue
                # Wait for a slot with the message still queued: a stop drops it as any queued
                # message (and wakes this wait); then look at the queue again.
                if not await self.capacity.admit(channel, agent):
                    continue
                try:
                    if self._hooks.admitted is not None:
                        await self._hooks.admitted(channel, agent)
                    if not await self._admitted_turn(channel, agent):
                        break
                finally:
                    self.capacity.release(channel, agent, resident=self.acp.get((channel, agent)) is not None)
        finally:
            self.capacity.forget(channel, agent)
            self.workers.discard((channel, agent))
            event = self.idle.pop(channel, None)
            if event is not None:
                event.set()

    def daily_spent(self, channel: str, agent: str) -> DailySpent | None:
        """The lane's daily budget that is spent today, if one is."""
        agent_limits, channel_limits = self._config.daily_limits(channel, agent)
        if not (agent_limits.any or channel_limits.any):
            return None
        return self.daily.spent(channel, agent, agent_limits=agent_limits, channel_limits=channel_limits,
                                day=utc_day())

    async def _wait_daily(self, channel: str, agent: str, spent: DailySpent) -> None:
        """Leave the lane's messages queued, say so once, and sleep until midnight or a wake."""
        lane = (channel, agent)
        self.capacity.forget(channel, agent)  # (a slot this lane cannot use is another's)
        waiting = [m.entry_seq for m in self._ledger.queued(channel, agent)]
        self._store.submit_entry(channel, "system", "status", spent.waiting_text(waiting),
                                 generation=self._ledger.generation(channel),
                                 meta={"daily_budget": spent.as_json(), "agent": agent, "waiting": waiting})
        log.info("[%s] %s waits: %s's daily budget is spent (%s)", channel, agent, spent.name, spent.amounts)
        event = self._daily_waits[lane] = trio.Event()
        try:
            with trio.move_on_after(seconds_to_midnight(time.time())):
                await event.wait()
        finally:
            if self._daily_waits.get(lane) is event:
                del self._daily_waits[lane]

    def wake_daily(self, channel: str | None = None, agent: str | None = None) -> None:
        """(Synchronous) wake the lanes waiting for a daily budget: every one, a channel's, or one."""
        for (ch, a), event in list(self._daily_waits.items()):
            if (channel is None or ch == channel) and (agent is None or a == agent):
                event.set()

    def daily_reason(self, channel: str, agent: str) -> str | None:
        """Why a lane's first message waits, if a daily budget holds it (``corral queue``)."""
        if (channel, agent) not in self._daily_waits:
            return None
        spent = self.daily_spent(channel, agent)
        return None if spent is None else f"{spent.scope} {spent.name}'s daily budget is spent ({spent.amounts} today)"

    async def _admitted_turn(self, channel: str, agent: str) -> bool:
        """Take the lane's next message and run its turn; False: nothing was left to take."""
        take = self._ledger.take(channel, agent, new_turn_id())
        if take.dropped:
            self._store.dequeue([m.id for m in take.dropped])
        if take.ticket is None:
            return False
        message = take.ticket.message.payload
        assert isinstance(message, _Message), "the supervisor queues only its own payloads"
        message.seen_before = self._store.seen(channel, agent)
        token = self._ownership.fence(channel)
        if token is not None:
            self.fences[take.ticket.turn_id] = (channel, token)
        # Dequeue and the turn's row in one commit, awaited before the point of no return
        # (in a fleet: under the lease's token, checked in that commit).
        message.begun = self._store.begin_turn(
            take.ticket.turn_id, channel, message.agent, take.ticket.generation, take.ticket.message.id,
            fence=token,
        )
        self.hops[take.ticket.turn_id] = message.hops
        self.metrics.turns_begun[agent] += 1
        try:
            if self._hooks.took is not None:
                await self._hooks.took(channel, take.ticket.turn_id)
            try:
                await self._run_turn(channel, take.ticket, message)
            except Exception as exc:  # noqa: BLE001 - a bug in one turn must not stop the others
                await self._contain(channel, take.ticket, exc)
        finally:
            self.hops.pop(take.ticket.turn_id, None)
            self.fences.pop(take.ticket.turn_id, None)
            self.metrics.turns_ended[agent] += 1
            self.done_with((take.ticket.message.id,))
        return True

    def done_with(self, seqs: Iterable[int]) -> None:
        """These messages are over (run, or dropped by a stop's stored record): each stays in
        ``known`` for :data:`KNOWN_DONE_KEPT` more messages done (a fleet's pick-up that read
        the store's queue before the message was dequeued still skips it), then leaves."""
        for seq in seqs:
            self._done.append(seq)
        while len(self._done) > KNOWN_DONE_KEPT:
            self.known.discard(self._done.popleft())

    def requeue(self, rows: Sequence[QueuedRow], *, taken_up: bool = False) -> None:
        """Queue stored messages in the ledger. ``taken_up``: another host accepted them, under
        its own view of the generation; they carry the channel's current one here instead (a
        stop's record deletes every row queued before it, so a row still stored came after)."""
        for row in rows:
            self.known.add(row.seq)
            payload = _Message(row.agent, row.author, row.text, None, hops=row.hops, routed_from=row.routed_from,
                               accepted_at=row.ts)
            generation = self._ledger.generation(row.channel) if taken_up else row.generation
            self._ledger.requeue(
                row.channel,
                QueuedMessage(row.seq, generation, row.author.startswith("human:"), row.nudge, payload,
                              agent=row.agent, hops=row.hops, routed=row.author.startswith("agent:"),
                              entry=row.routed_from),
            )
            self.ensure_worker(row.channel, row.agent)

    async def _prompt(self, channel: str, ticket: TurnTicket, message: _Message) -> str:
        """The message's text, after what the agent missed in the channel since its last turn."""
        if message.routed_from is None and (message.author == "system" or ticket.message.nudge):
            return message.text
        config = self._config
        rows, total = await self._store.missed(
            channel, message.agent, after=message.seen_before, before=ticket.message.id, skip=message.routed_from,
            limit=config.catch_up_entries,
        )
        return catch_up_prompt(
            [Missed(a, t) for a, t in rows], message.text, author=message.author, earlier=total - len(rows),
            max_entries=config.catch_up_entries, max_bytes=config.catch_up_bytes,
        )

    def _place(self, lane: tuple[str, str], turn: RunningTurn) -> None:
        self.turns[lane] = turn
        self._by_id[turn.turn_id] = turn

    def built(self, channel: str, turn_id: str) -> RunningTurn | None:
        """The channel's turn of that id, if it is built (None: not yet, parked after its take, or over)."""
        turn = self._by_id.get(turn_id)
        return turn if turn is not None and turn.channel == channel else None

    def forget(self, channel: str) -> None:
        """The channel's queued messages no longer count as held here (another host has them);
        its lanes waiting for a slot wake (and find their queue gone once the ledger forgets it)."""
        self.known.difference_update(m.id for m in self._ledger.queued(channel))
        self.capacity.drop(channel)
        self.wake_daily(channel)

    def _new_turn(self, channel: str, ticket: TurnTicket, agent: AgentConfig, prompt: str) -> RunningTurn:
        """The turn the agent's adapter runs: a prompt to its persistent agent, or a process of its own."""
        if get_adapter(agent.adapter).runs == "persistent":
            return AcpTurn(self.ports, self.acp, channel, ticket, agent, prompt)
        return Turn(self.ports, channel, ticket, agent, prompt)

    async def _run_turn(self, channel: str, ticket: TurnTicket, message: _Message) -> None:
        agent = self._config.agents.get(message.agent)
        turn_id = ticket.turn_id
        if agent is None:  # a restored message for an agent removed from the config
            why = f"agent {message.agent!r} is no longer configured"
            await self._end_turn_early(channel, turn_id, ticket.generation, why)
            return
        lane = (channel, agent.name)
        turn = self._new_turn(channel, ticket, agent, message.text)
        self._place(lane, turn)
        try:
            if message.committed is not None:
                try:
                    await message.committed.committed()
                except StoreError:
                    turn.done.set()
                    self._ledger.end_turn(channel, turn_id, ok=False, unfinished_todos=0)
                    return
            if message.begun is not None:
                try:
                    await message.begun.committed()
                except Dropped:
                    # (A fleet) a stop dropped the row while it was being taken up here, or
                    # another host's stop did: the message never runs, and nothing is said
                    # (the stop's record marked it dropped).
                    self._ledger.unbegin(channel, turn_id)
                    turn.done.set()
                    turn.stop_reason = "dropped"  # (no turn row to end)
                    log.info("[%s %s] not started: a stop dropped its message", channel, turn_id)
                    return
                except Fenced as exc:
                    # (A fleet) the lease moved before the turn began: the message stays
                    # queued for the new owner, and this host stores nothing for the channel.
                    self.known.discard(ticket.message.id)
                    self._ledger.end_turn(channel, turn_id, ok=False, unfinished_todos=0)
                    turn.done.set()
                    turn.stop_reason = "lease lost"
                    log.warning("[%s %s] not started: %s", channel, turn_id, exc)
                    return
                except StoreError as exc:
                    # Not recorded, not started: a turn nobody could find after a crash
                    # must not run. The message stays queued in the store, and no longer
                    # counts as held here: a fleet's next pick-up (a lease retaken after a
                    # stale token, a heartbeat) queues it again instead of skipping it.
                    self.known.discard(ticket.message.id)
                    turn.done.set()
                    self._ledger.end_turn(channel, turn_id, ok=False, unfinished_todos=0)
                    log.error("[%s %s] the turn could not be recorded, so it did not start: %s", channel, turn_id, exc)
                    try:
                        await self._store.append(
                            channel, "system", "error",
                            f"This message did not run: corral could not record its turn ({exc.__cause__ or exc}). "
                            "It stays queued and runs after corral restarts.",
                            turn=turn_id, generation=ticket.generation,
                        )
                    except StoreError:
                        pass
                    return
            # What the agent missed goes first (the turn has not started: it reads its prompt then).
            turn.prompt = await self._prompt(channel, ticket, message)
            session_id, _ = self._store.session(channel, agent.name)
            outcome = await turn.run(session_id)
            retry_decision = retry_without_session(outcome, session_id, stale=self._ledger.is_stale(channel, turn_id))
            if retry_decision is not None and turn.cwd is not None:
                self._store.save_session(channel, agent.name, None, turn.cwd)
                self._store.submit_entry(
                    channel, "system", "status", retry_decision.status, turn=turn_id, generation=ticket.generation
                )
                retry = self._new_turn(channel, ticket, agent, turn.prompt)
                self._place(lane, retry)
                turn.done.set()
                turn = retry
                outcome = await retry.run(None)
            items = self._store.todos(channel, agent.name)
            decision = self._ledger.end_turn(
                channel, turn_id, ok=outcome.ok, unfinished_todos=unfinished(items), max_nudges=agent.limits.max_nudges
            )
            if decision.interrupted:
                self._interrupted(channel, turn)  # (before the worker takes the interrupting message)
            if decision.nudge:
                # It carries the hops of the message it follows: nudges never reset a chain.
                self.accept(
                    channel, (agent.name,), "system", NUDGE_TEXT.format(n=unfinished(items)), nudge=True,
                    hops=message.hops,
                )
        finally:
            if self.turns.get(lane) is turn:
                del self.turns[lane]
            if self._by_id.get(turn_id) is turn:
                del self._by_id[turn_id]
            turn.done.set()
            # A stopped turn's row is ended by its stop's notice, a shut-down one's by the
            # shutdown's, a lost one's by the host that takes the channel over. An interrupted
            # one's notice (this lane's) ended it already, unless the turn failed before it
            # was owed: ending it again is a no-op, and a row left running would be taken
            # for a crash's at the next start.
            if turn.stop_reason is None or turn.stop_reason == "interrupt":
                self._store.end_turn(turn_id)
            self._record_usage(turn)
            self.reap_adoptees()

    def _record_usage(self, turn: RunningTurn) -> None:
        """Store (and count) what a turn that ran spent, stopped or not: ``corral usage`` and the
        daily sums read it."""
        record = turn.outcome.record
        if record is None:
            return  # (it never ran: its teardown did not take its account)
        self.daily.add(record)  # (in this step: the lane's next take asks it)
        self.metrics.spent(turn.agent.name, (record.input_tokens, record.output_tokens, record.cache_read_tokens,
                                              record.cache_write_tokens), record.tool_calls, record.cost,
                            record.currency, record.budget)
        if not self.hold_usage(turn):
            self.store_usage(turn)

    def store_usage(self, turn: RunningTurn) -> None:
        """The turn's ``turn_usage`` row, once: submitted before any entry that shows it (the
        store commits in the order submitted), or at its end where none does (a stop that
        ended the turn holds it for its notice's commit: :attr:`hold_usage`)."""
        if turn.outcome.record is not None and not turn.outcome.stored:
            self._store.record_usage(turn.outcome.record)
            turn.outcome.stored = True

    def usage_before_notice(self, channel: str, turn: RunningTurn) -> Pending | None:
        """The line of what an ended turn spent, submitted right before the notice that ends
        it (a stop's, an interrupt's, a shutdown's: the turn was silenced, so its own end
        entry was not made): None if it never ran or its CLI reported no usage."""
        record = turn.outcome.record
        made = usage_entry(record, turn.outcome.usage) if record is not None else None
        if made is None:
            return None
        text, meta = made
        self.store_usage(turn)
        return self._store.submit_entry(channel, "system", "status", text, turn=turn.turn_id,
                                        generation=turn.generation, meta=meta)

    def _interrupted(self, channel: str, turn: RunningTurn) -> None:
        """The notice of a turn an interrupting message ended, submitted in the step its end is
        decided: after everything of it, before anything of the message that interrupted it."""
        info = self.interruptions.pop(turn.turn_id, None)
        report = turn.outcome.report
        meta: dict[str, object] = {
            "interrupted": turn.turn_id, "agent": turn.agent.name, "killed": list(report.killed),
            "swept": list(report.swept),
        }
        if info is not None:
            meta["interrupted_by"] = info.by
            if info.dropped:
                meta["dropped_entries"] = list(info.dropped)
        if info is not None and info.plan is not None:
            self._store.submit_entry(
                channel, "system", "todos", plan_cancelled_text(turn.agent.name), generation=turn.generation,
                meta={"todos": info.plan, "agent": turn.agent.name},
            )
        text = stop_notice_text(INTERRUPT_NOTICE, len(info.dropped) if info else 0)
        self.usage_before_notice(channel, turn)
        # The notice and the turn's row ended, in one transaction (as a stop's and a shutdown's).
        self._store.submit_turn_notice(channel, text, turn=turn.turn_id, generation=turn.generation, meta=meta)

    async def _contain(self, channel: str, ticket: TurnTicket, exc: Exception) -> None:
        """A turn failed in corral itself: log it, say so, and free the channel."""
        log.exception("[%s %s] internal error", channel, ticket.turn_id, exc_info=exc)
        if self._ledger.current_turn(channel, ticket.agent) == ticket.turn_id:
            self._ledger.end_turn(channel, ticket.turn_id, ok=False, unfinished_todos=0)
        try:
            await self._store.append(
                channel, "system", "error", f"Internal error in corral: {exc!r} (see the daemon's log).",
                turn=ticket.turn_id, generation=ticket.generation,
            )
        except StoreError:
            pass

    async def _end_turn_early(self, channel: str, turn_id: str, generation: int, why: str) -> None:
        self._ledger.end_turn(channel, turn_id, ok=False, unfinished_todos=0)
        self._store.end_turn(turn_id)
        await self._store.append(channel, "system", "error", why, turn=turn_id, generation=generation)

    def reap_adoptees(self) -> None:
        """Reap dead children that re-parented to this (subreaper) process, when it owns them all.

        One pass serves every turn that ends in the same scheduling round: a stop-all ends
        hundreds at once, and each pass reads every child's /proc entry.
        """
        if self.reap_adopted and not self._reap_scheduled:
            self._reap_scheduled = True
            self._nursery.start_soon(self._reap_pass)

    async def _reap_pass(self) -> None:
        await trio.lowlevel.checkpoint()
        self._reap_scheduled = False
        self.reap_now()

    def reap_now(self) -> None:
        if self.reap_adopted and self._registry.spawning == 0:
            reaped = reap_orphans(self._registry.leader_pids() | self.acp.pids() | holder_pids())
            if reaped:
                log.debug("reaped adopted processes %s", reaped)

    def adopt_background(self, tree: ProcessTree) -> None:
        """Keep a normal turn's background processes, and reap any that become ours."""
        for pid in tree.background():
            self._nursery.start_soon(self._reap_when_gone, pid)
        if tree.cgroup is not None:
            self._nursery.start_soon(self._remove_when_empty, tree.cgroup)

    async def _remove_when_empty(self, cgroup: TurnCgroup) -> None:
        if await cgroup.wait_empty(float("inf")):
            cgroup.remove()

    async def _reap_when_gone(self, pid: int) -> None:
        if await wait_pid_exit(pid):
            reap_if_child(pid)


@dataclass(slots=True)
class _Acceptance:
    accepted: Accepted
    pending: Pending

    async def accepted_now(self) -> Accepted:
        await self.pending.committed()
        return self.accepted
