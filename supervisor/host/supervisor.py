"""The supervisor: channel workers, turns, and the stop path, under one nursery.

The stop path is httpcore's pool discipline applied to processes: the ledger decides
synchronously (generation moved, queue dropped, turn made stale); then ONE transaction
stores the stop's record — generation, the dequeue and mark of every dropped message, the
cancelled plan — so that a crash, a signal or a full disk after it can never undo the
stop (contract 17). Only once it is committed is the kill applied (cancel the turn's
scope, interrupt signal to its group — no checkpoint between the decision and the
signal); then the stop waits for the turn's shielded teardown to reap the tree and drain
its output, and stores the notice, last. A record that cannot be stored fails the stop
before anything is killed: ``ledger.abort_stop`` puts the channel back as it was.

A channel has one worker per agent (a lane: its queue, one turn at a time), so different
agents of a channel work at once. A stop is channel-wide: one decision names every running
turn of the channel; all of them are signalled in one synchronous pass, waited for
together, and then ONE notice is stored, last.

Hand-offs: a turn stores its entries through a store port that routes each ``message``
entry of the agent's (``_hand_off``) in the same synchronous step that stores it — no
checkpoint between "the ledger lets the entry be kept" and "the routed message is
accepted", so a stop lands either before both (nothing stored, nothing routed) or after
both (the routed message is queued under the old generation and dropped by the stop).

A fleet (``self.fleet``: several hosts on one PostgreSQL store) runs a channel only on the
host holding its lease (:mod:`supervisor.fleet.fleet`). A stop through another host asks the owner
(``_stop_elsewhere``), which first waits for its own acquisition and take-over of the
channel in flight (``_taken_over``): a decision on the state of before the store's read
would move a generation the store has already passed. Messages other hosts queued are taken
up from the store under the current generation; whether a stop dropped one is the store's
to say, not the seqs' (``begin_turn`` fails with ``Dropped``, and the lane is given back).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import trio

from ..config.settings import AgentConfig, Config
from ..core.account import unfinished
from ..core.catchup import Missed, catch_up_prompt
from ..core.errors import ShuttingDown, UsageError
from ..core.fields import OMITTED_IF_NONE, ROUNDED, from_json, to_json
from ..core.ledger import OutputKind, QueuedMessage, StopDecision, StopLedger, TurnTicket
from ..core.router import AddressError, address, route
from ..core.text import BadText, check_message
from ..fleet.fleet import Fleet
from ..fleet.notices import Entries, Notice, Queued, Stop, Stopped, Stopping
from ..procs.cgroup import CgroupRoot, TurnCgroup, cgroup2_mount, open_root
from ..procs.files import private_folder
from ..procs.hooks import Hooks
from ..procs.recovery import Recovery, recover, stop_notice_text
from ..procs.registry import ProcessRegistry
from ..procs.sandbox import Sandbox, open_sandbox, own_pid_namespace, peer_facts, private_paths, turn_of_peer
from ..procs.teardown import CollectorPause, TreeBatch
from ..procs.tree import (
    MarkerScanner,
    ProcessTree,
    is_child_subreaper,
    reap_if_child,
    reap_orphans,
    set_child_subreaper,
    spawn,
    wait_pid_exit,
)
from ..store.store import Draft, Dropped, Entry, Fenced, Pending, QueuedRow, StopRecord, Store, StoreError, open_store
from ..turns.acp import AcpTurn
from ..turns.agents import AcpAgentPool
from ..turns.process import Places, Turn, TurnPorts, new_turn_id, retry_without_session

log = logging.getLogger("corral")

STOP_NOTICE = "Execution stopped by user."
SHUTDOWN_NOTICE = "Task interrupted — corral was shut down. Send another message to continue."
HOST_LOST_NOTICE = (
    "Task interrupted — its host stopped answering and another host took the channel over. "
    "Send another message to continue."
)
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

    def save_session(self, channel: str, agent: str, session_id: str | None, cwd: str) -> Pending:
        """The agent's session id for the channel."""
        return self._store.save_session(channel, agent, session_id, cwd, fence=self._fence(channel))

    def save_todos(self, channel: str, agent: str, items: list[dict[str, str]]) -> Pending:
        """The agent's plan for the channel."""
        return self._store.save_todos(channel, agent, items, fence=self._fence(channel))

    def turn_spawned(self, turn_id: str, pid: int, started: int | None) -> Pending:
        """The turn's process, on its row."""
        channel, fence = self._fences.get(turn_id, ("", None))
        return self._store.turn_spawned(turn_id, pid, started, channel=channel, fence=fence)

    def show_draft(self, draft: Draft) -> None:
        """Show a draft to this host's followers (never stored, so never fenced)."""
        self._store.show_draft(draft)


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


class Supervisor:
    """Runs agents for channels. Make one with :func:`open_supervisor`."""

    def __init__(
        self,
        config: Config,
        store: Store,
        nursery: trio.Nursery,
        hooks: Hooks | None = None,
        *,
        cgroups: CgroupRoot | None = None,
        sandbox: Sandbox,
        subreaper: bool = False,
        owns_children: bool = False,
    ) -> None:
        self._hooks = hooks or Hooks()
        self.sandbox = sandbox
        """What every turn starts behind (:mod:`supervisor.procs.sandbox`)."""
        self._own_pid_ns = own_pid_namespace()
        self._refused_turns: set[str] = set()
        """Turns whose processes the control socket has refused (logged once per turn)."""
        self._collector = CollectorPause() if owns_children else contextlib.nullcontext()
        """Pauses the garbage collector during stops, where the process is corral's (see ``procs.teardown``)."""
        self.reap_adopted = subreaper and owns_children
        """Every child of this process is corral's: reap dead adoptees after each turn."""
        self._reap_scheduled = False
        self.config = config
        self._store = store
        self._ledger = StopLedger(max_nudges=config.limits.max_nudges)
        self._registry = ProcessRegistry(self._ledger, recording=self._recording)
        # A subreaper adopts every escaped descendant of a turn, so the marker scan need
        # not read the whole of /proc: only this process's descendants.
        self.scanner = MarkerScanner(
            within=os.getpid() if subreaper else None, elsewhere=lambda wanted: self._registry.leader_pids()
        )
        self.started = time.time()
        self._nursery = nursery
        self._workers: set[tuple[str, str]] = set()
        """``(channel, agent)`` lanes with a worker."""
        self._turns: dict[tuple[str, str], Turn | AcpTurn] = {}
        """The built turn of each ``(channel, agent)`` lane."""
        self._hops: dict[str, int] = {}
        """Each current turn's message's hop count (its hand-offs go one further)."""
        self._acp = AcpAgentPool(nursery)
        """The persistent ACP agent processes, one per (channel, agent); closed on shutdown."""
        self._stops: dict[str, _StopInProgress] = {}
        self.cgroups = cgroups
        """The store's cgroup subtree (a cgroup per turn), or None: the sweep fallback."""
        mount = cgroup2_mount() if cgroups is not None else None
        self._cgroup_subtree = (
            "/" + str(cgroups.path.relative_to(mount))
            if cgroups is not None and mount is not None and cgroups.path.is_relative_to(mount) else None
        )
        """That subtree as ``/proc/PID/cgroup`` names it (what a control-socket peer is checked against)."""
        self._places = Places(config.state_dir, store.session)
        self.fleet: Fleet | None = None
        """This host's leases, when the store is shared by a fleet (PostgreSQL with a host)."""
        if store.host is not None:
            self.fleet = Fleet(store, store.host, config.cluster.lease, on_lost=self._lost, on_orphans=self._orphans)
        self._fences: dict[str, tuple[str, int]] = {}
        """Each running turn's channel and the fencing token its lease had when it began."""
        self._last_token: dict[str, int] = {}
        """The token this host last held for each channel (kept when the lease is lost)."""
        self._known: set[int] = set()
        """Seqs of every message this host's ledger has held (a fleet picks up only others)."""
        self._taking_over: dict[str, trio.Event] = {}
        """(A fleet) channels being taken over from the store right now (set when done)."""
        self._taking: set[str] = set()
        """Channels a heartbeat is taking up right now."""
        self._answers: dict[str, _Answer] = {}
        """Stops this host asked other hosts to carry out, by request id."""
        self._unconfirmed: dict[str, dict[str, float]] = {}
        """Channels taken over from hosts whose turns there are not confirmed dead: those
        hosts and their heartbeats then (a host confirms by a later one: it kills first)."""
        self._ports = TurnPorts(
            ledger=self._ledger if self.fleet is None else _LeasedLedger(self._ledger, self.fleet),
            store=_TurnStore(store, self._hand_off, self._fences, self._last_token.get),
            registry=self._registry, scanner=self.scanner,
            spawn=self._hooks.spawn or spawn, places=self._places, cgroups=cgroups, sandbox=sandbox,
            adopt_background=self.adopt_background, preparing=self._hooks.preparing,
        )
        self.recovered: Recovery | None = None
        """What the last start recovered from an abrupt end of the previous owner."""
        self._idle: dict[str, trio.Event] = {}
        self._closing = False
        self._stored_channels: set[str] = set()
        """Channels found in the store that the ledger has not seen in this run."""

    def _recording(self, channel: str) -> bool:
        progress = self._stops.get(channel)
        return progress is not None and not progress.recorded

    # ------------------------------------------------------------ places

    def agent_home(self, agent: str, channel: str) -> Path:
        """The private HOME of an agent in a channel (its CLI writes its state there)."""
        return self._places.agent_home(agent, channel)

    def turn_of_peer(self, pid: int) -> str | None:
        """Is ``pid`` (a control-socket peer, by ``SO_PEERCRED``) a process of a turn? Which
        one (see :func:`supervisor.procs.sandbox.turn_of_peer`), logged once per turn; else None."""
        turn = turn_of_peer(peer_facts(pid), subtree=self._cgroup_subtree, store_id=self._store.store_id,
                            own_pid_ns=self._own_pid_ns)
        if turn is not None and turn not in self._refused_turns:
            self._refused_turns.add(turn)
            log.warning("refused the control socket to a process of turn %s (pid %d)", turn, pid)
        return turn

    def channel_cwd(self, channel: str, agent: AgentConfig) -> Path:
        """The fixed working directory of this channel and agent (created on first use)."""
        return self._places.channel_cwd(channel, agent)

    # ------------------------------------------------------------ sending

    async def send(
        self, channel: str, text: str, *, agent: str | None = None, to: Sequence[str] | None = None,
        author: str = "human:user",
    ) -> Accepted:
        """Store and queue a message; returns once it is committed.

        It goes to ``agent`` and ``to`` if given, else to the agents it @mentions, else to
        the channel's default agent. ``author`` is ``human:NAME``, ``agent:NAME`` (a
        configured agent: another bot posting for it; while the channel rests its message
        is stored but goes to no one) or ``system``. Raises :class:`UsageError` for bad
        input and :class:`StoreError` if it could not be stored (then it will not run either).
        """
        if self._closing:
            raise ShuttingDown("corral is shutting down")
        check_channel(channel)
        if not isinstance(text, str) or not text.strip():
            raise UsageError("the message text is empty")
        try:
            check_message(text)
            check_message(author, "the author")
        except BadText as exc:
            raise UsageError(str(exc)) from None
        if len(text.encode("utf-8", errors="replace")) > MAX_MESSAGE_BYTES:
            raise UsageError(f"the message is over {MAX_MESSAGE_BYTES} bytes")
        self._check_author(author)
        explicit = [*([agent] if agent is not None else []), *(to or ())]
        members = self.config.members(channel)
        try:
            targets = address(
                text, to=explicit, members=members, default=members[0] if members else self.config.default_agent,
                configured=self.config.agents,
            )
        except AddressError as exc:
            raise UsageError(str(exc)) from None
        hops = 0
        if author.startswith("agent:"):
            # Another bot speaking for an agent: a hand-off like any other, so it obeys the rest.
            sender = author.removeprefix("agent:")
            targets = tuple(t for t in targets if t != sender)
            if not self._ledger.may_route(channel, from_human=False):
                targets = ()
            hops = 1
        return await self._accept(channel, targets, author, text, nudge=False, hops=hops).accepted_now()

    def _check_author(self, author: str) -> None:
        if author == "system" or (author.startswith("human:") and len(author) > 6):
            return
        if author.startswith("agent:"):
            name = author.removeprefix("agent:")
            if name in self.config.agents:
                return
            close = difflib.get_close_matches(name, sorted(self.config.agents), n=1)
            hint = f"did you mean 'agent:{close[0]}'?" if close else f"configured: {', '.join(self.config.agents)}"
            raise UsageError(f"author {author!r} names no configured agent; {hint}")
        raise UsageError(f"author must be 'human:NAME', 'agent:NAME' or 'system', got {author!r}")

    def _accept(
        self, channel: str, targets: tuple[str, ...], author: str, text: str, *, nudge: bool, hops: int = 0
    ) -> _Acceptance:
        # Stamping (ledger) and seq (store) happen in one synchronous step: their orders agree.
        generation = self._ledger.generation(channel)
        pending = self._store.accept_message(
            channel, targets[0] if targets else None, author, text, generation=generation, nudge=nudge, to=targets,
            hops=hops,
        )
        assert pending.entry is not None
        seq = pending.entry.seq
        human = author.startswith("human:")
        first = targets[0] if targets else ""
        ahead = len(self._ledger.queued(channel, first)) + (1 if self._ledger.current_turn(channel, first) else 0)
        step = self._store.seq_step
        for i, target in enumerate(targets):  # the store gave the targets the seqs after the first (+ i steps)
            payload = _Message(target, author, text, pending, hops=hops, routed_from=seq if i else None)
            self._known.add(seq + i * step)
            self._ledger.accept(
                channel, target, seq + i * step, human=human, nudge=nudge, payload=payload, hops=hops,
                routed=author.startswith("agent:"),
            )
            self._ensure_worker(channel, target)
        return _Acceptance(Accepted(seq, channel, first, generation, ahead, targets), pending)

    def _hand_off(self, channel: str, turn_id: str, author: str, text: str, source: int) -> None:
        """(Synchronous, in the step that stored it) route an agent's message entry on."""
        agent = author.removeprefix("agent:")
        decision = route(
            text, author=agent, hops=self._hops.get(turn_id, 0), members=self.config.members(channel),
            may_route=self._ledger.may_route(channel, from_human=False, turn_id=turn_id),
            max_hops=self.config.hop_limit(channel),
        )
        generation = self._ledger.generation(channel)  # the producing turn's: it is not stale
        if decision.targets:
            seqs, pending = self._store.accept_routed(
                channel, decision.targets, author, text, generation=generation, hops=decision.hops, source=source
            )
            for target, seq in zip(decision.targets, seqs, strict=True):
                payload = _Message(target, author, text, pending, hops=decision.hops, routed_from=source)
                self._known.add(seq)
                self._ledger.accept(channel, target, seq, human=False, payload=payload, hops=decision.hops, routed=True)
                self._ensure_worker(channel, target)
            log.info("[%s %s] %s handed off to %s (hop %d)", channel, turn_id, agent, decision.targets, decision.hops)
        status = decision.status()
        if status is not None:
            self._store.submit_entry(channel, "system", "status", status, turn=turn_id, generation=generation)

    def _ensure_worker(self, channel: str, agent: str) -> None:
        lane = (channel, agent)
        if lane not in self._workers and not self._closing:
            self._workers.add(lane)
            self._nursery.start_soon(self._worker, channel, agent, name=f"corral-worker:{channel}:{agent}")

    # ------------------------------------------------------------ workers and turns

    async def _worker(self, channel: str, agent: str) -> None:
        """Run one lane's queued messages one turn at a time; exit when idle."""
        try:
            while not self._closing:
                if self.fleet is not None and not await self._own(channel):
                    # Another host runs the channel: its messages wait in the store's queue for
                    # it (one whose write failed was refused), not here.
                    self._known.difference_update(m.id for m in self._ledger.queued(channel, agent))
                    self._ledger.forget_queue(channel, agent)
                    break
                if self.fleet is not None:
                    await self.fleet.wait_ready(channel)  # (taken by force: the old owner's lease runs out first)
                take = self._ledger.take(channel, agent, new_turn_id())
                if take.dropped:
                    self._store.dequeue([m.id for m in take.dropped])
                if take.ticket is None:
                    break
                message = take.ticket.message.payload
                assert isinstance(message, _Message), "the supervisor queues only its own payloads"
                message.seen_before = self._store.seen(channel, agent)
                token = self._last_token.get(channel) if self.fleet is not None else None
                if token is not None:
                    self._fences[take.ticket.turn_id] = (channel, token)
                # Dequeue and the turn's row in one commit, awaited before the point of no return
                # (in a fleet: under the lease's token, checked in that commit).
                message.begun = self._store.begin_turn(
                    take.ticket.turn_id, channel, message.agent, take.ticket.generation, take.ticket.message.id,
                    fence=token,
                )
                self._hops[take.ticket.turn_id] = message.hops
                try:
                    if self._hooks.took is not None:
                        await self._hooks.took(channel, take.ticket.turn_id)
                    try:
                        await self._run_turn(channel, take.ticket, message)
                    except Exception as exc:  # noqa: BLE001 - a bug in one turn must not stop the others
                        await self._contain(channel, take.ticket, exc)
                finally:
                    self._hops.pop(take.ticket.turn_id, None)
                    self._fences.pop(take.ticket.turn_id, None)
        finally:
            self._workers.discard((channel, agent))
            event = self._idle.pop(channel, None)
            if event is not None:
                event.set()

    # ------------------------------------------------------------ the fleet

    def _placed_elsewhere(self, channel: str) -> str | None:
        """The host the channel is pinned to, if it is not this one."""
        table = self.config.channels.get(channel)
        assert self.fleet is not None
        return table.host if table is not None and table.pinned_elsewhere(self.fleet.host) else None

    async def _own(self, channel: str) -> bool:
        """(A fleet) hold the channel's lease before a turn: keep it, or take it if placement
        allows and it is free or expired; a channel new to this host (a new token) is first
        taken over from the store (its stop state, queue, plans, and what moves of its sessions)."""
        fleet = self.fleet
        assert fleet is not None
        if self._placed_elsewhere(channel) is not None:
            return False  # (even if held: a stop may take a pinned channel's lease, never its turns)
        await self._taken_over(channel)
        if fleet.holds(channel):
            return True
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

    async def _taken_over(self, channel: str) -> None:
        """(A fleet) wait for this host's acquisition of the channel's lease and its take-over
        from the store, if either is in flight: then the channel's state here is the store's
        (a stop decided before would move a generation the store has already passed)."""
        assert self.fleet is not None
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
            channel, here=lambda cwd: os.path.isdir(cwd), skip={t for t, _ in self._fences.items()},
            notice=HOST_LOST_NOTICE,
        )
        if found.state is not None:
            self._ledger.restore(channel, found.state.generation, rests=found.state.rests, stopped=found.state.stopped)
        self._ledger.adopt(channel)  # (what this host accepted meanwhile: its rows still stored decide)
        assert self.fleet is not None
        away = {h for _, _, h in found.ended if h is not None and h != self.fleet.host}
        if away:
            self._unconfirmed[channel] = {h: found.heartbeats.get(h, 0.0) for h in away}
        self._requeue([row for row in found.queue if row.seq not in self._known], taken_up=True)

    def _requeue(self, rows: Sequence[QueuedRow], *, taken_up: bool = False) -> None:
        """Queue stored messages in the ledger. ``taken_up``: another host accepted them, under
        its own view of the generation; they carry the channel's current one here instead (a
        stop's record deletes every row queued before it, so a row still stored came after)."""
        for row in rows:
            self._known.add(row.seq)
            payload = _Message(row.agent, row.author, row.text, None, hops=row.hops, routed_from=row.routed_from)
            generation = self._ledger.generation(row.channel) if taken_up else row.generation
            self._ledger.requeue(
                row.channel,
                QueuedMessage(row.seq, generation, row.author.startswith("human:"), row.nudge, payload,
                              agent=row.agent, hops=row.hops, routed=row.author.startswith("agent:")),
            )
            self._ensure_worker(row.channel, row.agent)

    def _lost(self, channel: str, why: str) -> None:
        """(Synchronous, from the fleet's watchdog or heartbeat) this host lost the channel's
        lease: its turns are killed now, in this step, with SIGKILL and no grace (another
        host may begin the channel once the lease runs out in the database: nothing of this
        host's may be alive by then); its queue here is forgotten (the store keeps it)."""
        self._known.difference_update(m.id for m in self._ledger.queued(channel))  # (queued again if retaken)
        decision = self._ledger.lose(channel)
        for lane, turn in list(self._turns.items()):
            if lane[0] == channel and (channel, turn.turn_id) in decision.turns:
                turn.stop_reason = "lease lost"
                turn.scope.cancel()
                self._registry.interrupt(channel, turn.turn_id, signal.SIGKILL)
        log.warning("[%s] lease lost (%s): killed turns %s", channel, why, [t for _, t in decision.turns])

    def _orphans(self, channels: list[str], queued: list[tuple[str, int]]) -> None:
        """(From the heartbeat) channels with work under an expired lease of another host, and
        messages other hosts queued for channels this host holds: take them up."""
        for channel in channels:
            if channel not in self._taking and self._placed_elsewhere(channel) is None and not self._closing:
                self._taking.add(channel)
                self._nursery.start_soon(self._take_orphan, channel)
        fresh = [channel for channel, seq in queued if seq not in self._known]
        for channel in dict.fromkeys(fresh):
            if channel not in self._taking and not self._closing:
                self._taking.add(channel)
                self._nursery.start_soon(self._take_orphan, channel)

    def _queued_elsewhere(self, channel: str) -> None:
        """(From the fleet's listener) another host queued a message for the channel: take it
        up now if this host runs the channel (holds its lease, or it is pinned here), not at
        the next heartbeat. The notice comes at the queue row's commit, so the row is there."""
        assert self.fleet is not None
        table = self.config.channels.get(channel)
        pinned_here = table is not None and table.host == self.fleet.host
        if (self.fleet.holds(channel) or pinned_here) and channel not in self._taking and not self._closing:
            self._taking.add(channel)
            self._nursery.start_soon(self._take_orphan, channel)

    async def _take_orphan(self, channel: str) -> None:
        try:
            if await self._own(channel):
                await self._pick_up(channel)
                for agent in self._ledger.lanes(channel):  # (restored here before the lease was free)
                    if self._ledger.queued(channel, agent):
                        self._ensure_worker(channel, agent)
        except StoreError as exc:
            log.error("[%s] could not take the channel up: %s", channel, exc)
        finally:
            self._taking.discard(channel)

    async def _pick_up(self, channel: str) -> None:
        rows = await self._store.load_queue(channel)
        self._requeue([row for row in rows if row.seq not in self._known], taken_up=True)

    async def _prompt(self, channel: str, ticket: TurnTicket, message: _Message) -> str:
        """The message's text, after what the agent missed in the channel since its last turn."""
        if message.routed_from is None and (message.author == "system" or ticket.message.nudge):
            return message.text
        config = self.config
        rows, total = await self._store.missed(
            channel, message.agent, after=message.seen_before, before=ticket.message.id, skip=message.routed_from,
            limit=config.catch_up_entries,
        )
        return catch_up_prompt(
            [Missed(a, t) for a, t in rows], message.text, author=message.author, earlier=total - len(rows),
            max_entries=config.catch_up_entries, max_bytes=config.catch_up_bytes,
        )

    async def _run_turn(self, channel: str, ticket: TurnTicket, message: _Message) -> None:
        agent = self.config.agents.get(message.agent)
        turn_id = ticket.turn_id
        if agent is None:  # a restored message for an agent removed from the config
            why = f"agent {message.agent!r} is no longer configured"
            await self._end_turn_early(channel, turn_id, ticket.generation, why)
            return
        lane = (channel, agent.name)
        turn: Turn | AcpTurn = (
            AcpTurn(self._ports, self._acp, channel, ticket, agent, message.text)
            if agent.adapter == "acp"
            else Turn(self._ports, channel, ticket, agent, message.text)
        )
        self._turns[lane] = turn
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
                    self._known.discard(ticket.message.id)
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
                    self._known.discard(ticket.message.id)
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
                retry = Turn(self._ports, channel, ticket, agent, turn.prompt)
                self._turns[lane] = retry
                turn.done.set()
                turn = retry
                outcome = await retry.run(None)
            items = self._store.todos(channel, agent.name)
            decision = self._ledger.end_turn(
                channel, turn_id, ok=outcome.ok, unfinished_todos=unfinished(items), max_nudges=agent.limits.max_nudges
            )
            if decision.nudge:
                # It carries the hops of the message it follows: nudges never reset a chain.
                self._accept(
                    channel, (agent.name,), "system", NUDGE_TEXT.format(n=unfinished(items)), nudge=True,
                    hops=message.hops,
                )
        finally:
            if self._turns.get(lane) is turn:
                del self._turns[lane]
            turn.done.set()
            if turn.stop_reason is None:
                self._store.end_turn(turn_id)
            self.reap_adoptees()

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
        self._reap_now()

    def _reap_now(self) -> None:
        if self.reap_adopted and self._registry.spawning == 0:
            reaped = reap_orphans(self._registry.leader_pids() | self._acp.pids())
            if reaped:
                log.debug("reaped adopted processes %s", reaped)

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

    # ------------------------------------------------------------ stopping

    async def stop(self, channel: str | None = None) -> StopResult:
        """Stop one channel (or every busy channel); returns when the stop is complete."""
        if channel is None:
            return await self.stop_all()
        await self.require_channel(channel)
        started, cpu = trio.current_time(), time.process_time()
        if self.fleet is not None and not await self._own(channel):
            return await self._stop_elsewhere(channel, started, cpu)
        decision = self._ledger.stop(channel)  # first act: the generation moves now
        result = (await self._stop(self._record([decision]), started))[0]
        result.cpu_ms = (time.process_time() - cpu) * 1000
        return result

    async def stop_all(self) -> StopResult:
        """Stop every channel that has work; the result lists each."""
        started, cpu = trio.current_time(), time.process_time()
        results = await self._stop(self._record(self._ledger.stop_all()), started)
        total = StopResult(channel=None, generation=0, channels=results)
        for r in results:
            total.stopped_turns += r.stopped_turns
            total.turns += r.turns
            total.killed += r.killed
            total.swept += r.swept
            total.kill = total.kill or r.kill
            total.dropped += r.dropped
            total.ok = total.ok and r.ok
        total.error = "; ".join(r.error for r in results if r.error) or None
        total.elapsed_ms = (trio.current_time() - started) * 1000
        total.cpu_ms = (time.process_time() - cpu) * 1000
        log.info(
            "stop all: %d channel(s), killed %s, swept %s, %.1f ms",
            len(results), total.killed, total.swept, total.elapsed_ms,
        )
        return total

    def _silent_hosts(self, channel: str) -> str | None:
        """(A fleet) why a stop of a channel taken over from a host cannot be called done:
        that host has not answered since, so its turn's processes may live on."""
        waiting = self._unconfirmed.get(channel)
        if waiting is None or self.fleet is None:
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
        assert fleet is not None
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
                grace = max((a.limits.stop_grace for a in self.config.agents.values()), default=0.0)
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
        result = (await self._stop(self._record([decision]), started))[0]
        if self._placed_elsewhere(channel) is not None:
            with trio.CancelScope(shield=True):
                try:
                    await fleet.give_back(channel)
                except StoreError as exc:
                    log.warning("[%s] could not give the lease back (it runs out on its own): %s", channel, exc)
        result.cpu_ms = (time.process_time() - cpu) * 1000
        return result

    async def _acknowledge(self, asker: str, request: str) -> None:
        assert self.fleet is not None
        try:
            await self.fleet.notify(Stopping(self.fleet.host, to=asker, id=request))
        except StoreError as exc:
            log.warning("could not acknowledge host %s's stop: %s", asker, exc)

    async def _owner(self, channel: str) -> str | None:
        """The host whose lease on the channel has not run out, if any (StoreError: the
        database did not answer)."""
        assert self.fleet is not None
        for host in await self.fleet.hosts():
            if channel in host["channels"] and not host["channels"][channel]["expired"]:
                return str(host["host"])
        return None

    def _notice(self, notice: Notice) -> None:
        """(From the fleet's listener) another host's message row or commit, a stop for this
        host to carry out, or the answer to one this host asked another to carry out."""
        assert self.fleet is not None
        me = self.fleet.host
        match notice:
            case Queued() if notice.sender != me:
                self._queued_elsewhere(notice.channel)
            case Entries() if notice.sender != me:
                self._store.others_committed(notice.last)
            case Stop() if notice.to == me and not self._closing:
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
        assert self.fleet is not None
        await self._taken_over(channel)  # (the lease taken a moment ago: the asker read it first)
        if not self.fleet.holds(channel) or self._closing:
            return
        started, cpu = trio.current_time(), time.process_time()
        decision = self._ledger.stop(channel)
        batch = self._record([decision])
        self._nursery.start_soon(self._acknowledge, asker, request)  # (beside the stop: never before its kill)
        result = (await self._stop(batch, started))[0]
        result.cpu_ms = (time.process_time() - cpu) * 1000
        try:
            await self.fleet.notify(Stopped(self.fleet.host, to=asker, id=request, result=result.to_json()))
        except StoreError as exc:
            log.error("stop %r for host %s: carried out, but the answer could not be sent: %s", channel, asker, exc)

    def _record(self, decisions: list[StopDecision]) -> _StopBatch:
        """Submit the record of every fresh stop as one write, in the step the ledger decided.

        The stop's seq is taken here too: on the server clock it precedes every message
        accepted after it, even those accepted while the turn winds down.
        """
        batch = _StopBatch(decisions)
        records = []
        for decision in decisions:
            if decision.repeat:
                continue
            # What the stopped turns were still writing is saved as it stood, before the stop's
            # seq and so before its notice: the boundary is this decision (contract line 18).
            for turn in self._decided(decision.channel, decision.stopped_turns):
                turn.cut_off("stop")
            seq = self._store.next_seq()
            plans = self._cancelled_plans(decision.channel)
            batch.seqs[decision.channel] = seq
            batch.plans[decision.channel] = plans
            batch.progress[decision.channel] = self._stops[decision.channel] = _StopInProgress(plans)
            records.append(
                StopRecord(seq, decision.channel, decision.generation, tuple(m.id for m in decision.dropped),
                           tuple(turn_id for _, turn_id in decision.stopped_turns), plans)
            )
        batch.write = self._store.submit_stop_records(records) if records else None
        return batch

    async def _stop(self, batch: _StopBatch, started: float) -> list[StopResult]:
        """Await the record, then kill, tear down and post the notices. Shielded: once the
        generation has moved, the stop is carried out (or undone) whatever the caller does."""
        with trio.CancelScope(shield=True), self._collector:
            failure: str | None = None
            if batch.write is not None:
                try:
                    await batch.write.committed()
                except StoreError as exc:
                    failure = f"the stop could not be stored: {exc.__cause__ or exc}; nothing was stopped"
            if failure is None:
                for channel, plans in batch.plans.items():
                    for agent, items in plans.items():
                        self._store.remember_todos(channel, agent, items)
            else:
                for decision in batch.decisions:
                    if not decision.repeat:
                        self._ledger.abort_stop(decision)
            # No checkpoint from here to the last signal: the kill follows the commit at once.
            for channel, progress in batch.progress.items():
                progress.recorded = True
                self._registry.settle(channel)
            fresh = [d for d in batch.decisions if not d.repeat]
            turns = {} if failure else {d.channel: self._apply(d, reason="user") for d in fresh}
            together = self._end_together(turn for stopped in turns.values() for turn in stopped)
            results: list[StopResult | None] = [None] * len(batch.decisions)

            async def one(i: int, decision: StopDecision) -> None:
                if decision.repeat:
                    results[i] = await self._repeat(decision, started)
                elif failure is not None:
                    results[i] = self._failed(decision, batch.progress[decision.channel], failure, started)
                else:
                    results[i] = await self._complete(
                        decision, turns[decision.channel], started, batch.seqs[decision.channel],
                        batch.progress[decision.channel],
                    )

            async with trio.open_nursery() as nursery:
                if together is not None:
                    nursery.start_soon(together.run)
                for i, decision in enumerate(batch.decisions):
                    nursery.start_soon(one, i, decision)
        done = [r for r in results if r is not None]
        assert len(done) == len(results), "every decision has its result"
        return done

    def _end_together(self, turns: Iterable[Turn | AcpTurn]) -> TreeBatch | None:
        """One batch ends the cgroup trees of the stopped turns, all at once (see ``procs.teardown``).

        An ACP turn's tree is its agent's, which outlives the turn: its stop is the agent's
        own cancel sequence, never this batch.
        """
        watcher = self.cgroups.watcher if self.cgroups is not None else None
        if watcher is None or not watcher.running:
            return None
        together = TreeBatch(watcher)
        for turn in turns:
            if isinstance(turn, Turn) and turn.tree is not None:
                together.add(turn.tree, turn.agent.limits.stop_grace)
        return together if len(together) else None

    def _failed(self, decision: StopDecision, progress: _StopInProgress, error: str, started: float) -> StopResult:
        """The record could not be stored (the ledger's stop is undone); nothing was killed."""
        result = StopResult(decision.channel, decision.generation - 1, ok=False, error=error)
        result.elapsed_ms = (trio.current_time() - started) * 1000
        progress.finish(self._stops, decision.channel, result)
        log.error("stop %r: FAILED before killing anything: %s", decision.channel, error)
        return result

    async def _repeat(self, decision: StopDecision, started: float) -> StopResult:
        channel = decision.channel
        result = StopResult(channel, decision.generation, repeat=True)
        progress = self._stops.get(channel)
        if progress is not None:
            await progress.done.wait()
            if progress.result is not None and not progress.result.ok:
                result.ok, result.error = False, progress.result.error
                result.generation = progress.result.generation
        result.notice_seq = self._ledger.notice_seq(channel)
        result.elapsed_ms = (trio.current_time() - started) * 1000
        log.info("stop %r: repeat of generation %d, nothing to do", channel, decision.generation)
        return result

    def _decided(self, channel: str, stopped: Iterable[tuple[str, str]]) -> list[Turn | AcpTurn]:
        """The built turns among a decision's ``(agent, turn id)`` pairs (one parked after its
        take is not built yet: it never starts)."""
        turns = []
        for agent, turn_id in stopped:
            turn = self._turns.get((channel, agent))
            if turn is not None and turn.turn_id == turn_id:
                turns.append(turn)
        return turns

    def _apply(self, decision: StopDecision, *, reason: str) -> list[Turn | AcpTurn]:
        """Carry out the kill decision at once, for every stopped turn of the channel in one
        pass (no checkpoint): cancel each turn's scope, signal its group."""
        turns: list[Turn | AcpTurn] = []
        for agent, turn_id in decision.stopped_turns:
            turn = self._turns.get((decision.channel, agent))
            if turn is None or turn.turn_id != turn_id:
                continue  # not built yet (parked after the take): it never starts
            turn.stop_reason = reason
            turn.scope.cancel()
            self._registry.interrupt(decision.channel, turn.turn_id, turn.adapter.interrupt_signal)
            turns.append(turn)
        return turns

    async def _complete(
        self, decision: StopDecision, turns: list[Turn | AcpTurn], started: float, stop_seq: int,
        progress: _StopInProgress,
    ) -> StopResult:
        channel = decision.channel
        result = StopResult(channel, decision.generation, dropped=len(decision.dropped))
        built = {turn.turn_id: turn for turn in turns}
        try:
            # Every turn was signalled at once; their teardowns run in their own tasks, so
            # waiting on each in turn under one deadline waits for all of them together.
            budget = max((_grace(turn) for turn in turns), default=0.0) + STOP_SLACK
            with trio.move_on_after(budget):
                for turn in turns:
                    await turn.done.wait()
            for agent, turn_id in decision.stopped_turns:
                result.stopped_turns.append(turn_id)
                account: dict[str, Any] = {"agent": agent, "turn": turn_id, "killed": [], "swept": []}
                result.turns.append(account)
                stopped = built.get(turn_id)
                if stopped is None:
                    continue
                if not stopped.done.is_set():
                    result.ok = False
                    result.error = f"turn {turn_id} ({agent}) did not finish within {budget:g} s"
                report = stopped.outcome.report
                account["killed"], account["swept"] = list(report.killed), list(report.swept)
                result.killed += report.killed
                result.swept += report.swept
                result.kill = result.kill or report.mechanism
                if isinstance(stopped, AcpTurn):
                    account["ended"] = stopped.ended
                    # With several ACP turns, one killed outright makes the stop "killed".
                    result.ended = "killed" if "killed" in (result.ended, stopped.ended) else stopped.ended
                if report.survivors:
                    result.ok = False
                    result.error = f"processes {report.survivors} could not be confirmed dead"
            silent = self._silent_hosts(channel)
            if silent is not None:
                result.ok = False
                result.error = silent
            # The plan's entries and the notice, last; the notice's commit completes the record.
            writes = self._plan_entries(channel, decision.generation, progress.plans)
            text = (
                stop_notice_text(STOP_NOTICE, result.dropped) if result.ok else f"Stopping failed — {result.error}."
            )
            result.elapsed_ms = (trio.current_time() - started) * 1000
            final = result.to_json()
            notice = self._store.submit_stop_notice(
                channel, text, stop_seq=stop_seq, turn=decision.stopped_turn, generation=decision.generation,
                result=final, turns=tuple(turn_id for _, turn_id in decision.stopped_turns),
            )
            assert notice.entry is not None
            result.notice_seq = notice.entry.seq
            writes.append(notice)
            for write in writes:
                await write.committed()
            # Only a stored notice may be named (to the caller, or to a repeat of this stop).
            self._ledger.notice_stored(channel, decision.generation, notice.entry.seq)
        except StoreError as exc:
            result.ok = False
            result.notice_seq = None
            result.error = (
                f"the stop was carried out and its record stored, but its notice could not be stored: "
                f"{exc.__cause__ or exc}"
            )
        finally:
            progress.finish(self._stops, channel, result)
        result.elapsed_ms = (trio.current_time() - started) * 1000
        log.info(
            "stop %r: generation %d, turns %s, killed %s, swept %s, dropped %d, %.1f ms%s",
            channel, decision.generation, result.stopped_turns, result.killed, result.swept, result.dropped,
            result.elapsed_ms, "" if result.ok else f", FAILED: {result.error}",
        )
        return result

    def _cancelled_plans(self, channel: str) -> dict[str, list[dict[str, str]]]:
        """The channel's plans with every unfinished todo cancelled (only plans that change)."""
        plans: dict[str, list[dict[str, str]]] = {}
        for agent in self._store.todo_agents(channel):
            items = self._store.todos(channel, agent)
            if not unfinished(items):
                continue
            for item in items:
                if item["status"] in ("pending", "in_progress"):
                    item["status"] = "cancelled"
            plans[agent] = items
        return plans

    def _plan_entries(self, channel: str, generation: int, plans: dict[str, list[dict[str, str]]]) -> list[Pending]:
        """The transcript's account of the cancelled plans (the plans were stored with the record)."""
        return [
            self._store.submit_entry(
                channel, "system", "todos", f"Plan cancelled ({agent}).", generation=generation,
                meta={"todos": items, "agent": agent},
            )
            for agent, items in plans.items()
        ]

    # ------------------------------------------------------------ observing

    async def wait_idle(self, channel: str, timeout: float | None = None) -> bool:
        """Wait until the channel runs no turn and has nothing queued; False on timeout."""
        await self.require_channel(channel)
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            while any(lane[0] == channel for lane in self._workers) or self._ledger.is_busy(channel):
                event = self._idle.setdefault(channel, trio.Event())
                await event.wait()
            return True
        return False

    async def require_channel(self, channel: str) -> None:
        """Raise :class:`UnknownChannel` unless ``channel`` has existed (a bad name: :class:`UsageError`).

        A channel exists once the ledger has seen it in this run or the store holds an
        entry of it; the store is asked only when the ledger has not seen it.
        """
        check_channel(channel)
        if channel in self._ledger.channels() or channel in self._stored_channels:
            return
        if await self._store.has_entries(channel):
            self._stored_channels.add(channel)
            return
        known = await self._store.channels() | set(self._ledger.channels())
        if channel not in known:  # (it may have been created while the store was asked)
            raise UnknownChannel(channel, known)

    @overload
    def follow(self, channel: str | None, after: int = 0, *, drafts: Literal[False] = False) -> AsyncIterator[Entry]:
        ...

    @overload
    def follow(self, channel: str | None, after: int = 0, *, drafts: bool) -> AsyncIterator[Entry | Draft]: ...

    def follow(self, channel: str | None, after: int = 0, *, drafts: bool = False) -> AsyncIterator[Entry | Draft]:
        """Committed entries of a channel after ``after``, then live ones as they commit.

        With ``drafts``, also the text agents are writing now, as :class:`Draft` values,
        before it is saved (never stored; the saved entry names the draft it replaces).
        A channel need not exist yet (subscribe, then send); call :meth:`require_channel`
        first to refuse a mistyped one, as the control API does.
        """
        return self._store.follow(channel, after, drafts=drafts)

    async def entries(self, channel: str, after: int = 0, limit: int = 10_000) -> list[Entry]:
        """Committed entries of a channel after ``after``."""
        await self.require_channel(channel)
        return await self._store.entries(channel, after=after, limit=limit)

    def session(self, channel: str, agent: str) -> str | None:
        """The agent's session id in the channel (the next turn resumes it), if any."""
        return self._store.session(channel, agent)[0]

    def todos(self, channel: str, agent: str) -> list[dict[str, str]]:
        """The agent's plan in the channel, as last stored."""
        return self._store.todos(channel, agent)

    def channels_with_queue(self) -> list[str]:
        """Channels with messages waiting (after a restart: what was restored)."""
        return [c for c in self._ledger.channels() if self._ledger.queued(c)]

    async def last_seq(self) -> int:
        """The seq of the newest committed entry (0: none)."""
        return await self._store.last_seq()

    async def flush(self) -> None:
        """Wait until every write accepted so far is committed (a failure is not raised here)."""
        await self._store.flush()

    def status(self) -> dict[str, Any]:
        """Agents, channels, and per channel each agent's state, at this instant.

        A channel's ``agents`` maps each agent that has had work there to ``{"state",
        "queued", "turn"}``: state ``idle``, ``queued`` (nothing running, ``queued`` > 0),
        ``running`` (``turn`` says which and since when) or ``stopping`` (a stop is tearing
        its turn down). ``turn`` and ``queued`` at the channel's level are kept for
        single-agent readers: the first running turn, and every lane's queue together.
        """
        channels: dict[str, Any] = {}
        sessions = self._store.sessions_by_channel()
        for name in sorted(self._ledger.channels()):
            agents: dict[str, Any] = {}
            for agent in self._ledger.lanes(name):
                turn = self._turns.get((name, agent))
                queued = len(self._ledger.queued(name, agent))
                phase = self._ledger.turn_phase(name, agent)
                if turn is not None and turn.stop_reason is not None and not turn.done.is_set():
                    state = "stopping"
                elif turn is not None or phase is not None:
                    state = "running"
                else:
                    state = "queued" if queued else "idle"
                agents[agent] = {
                    "state": state,
                    "queued": queued,
                    "turn": None
                    if turn is None
                    else {
                        "id": turn.turn_id,
                        "agent": turn.agent.name,
                        "phase": phase.value if phase is not None else "ending",
                        "pid": turn.tree.pid if turn.tree else None,
                        "started": turn.started_at,
                    },
                }
            first = next((a["turn"] for a in agents.values() if a["turn"] is not None), None)
            channels[name] = {
                "generation": self._ledger.generation(name),
                "queued": len(self._ledger.queued(name)),
                "rests": self._ledger.rests(name),
                "sessions": sessions.get(name, {}),
                "turn": first,
                "agents": agents,
            }
        return {
            "pid": os.getpid(),
            "started": self.started,
            "uptime": time.time() - self.started,
            "config": str(self.config.path) if self.config.path else None,
            "store": self.config.store_name,
            "agents": {
                name: {"adapter": a.adapter, "command": list(a.command), "model": a.model}
                for name, a in self.config.agents.items()
            },
            "channels": channels,
            "running": sum(1 for c in channels.values() for a in c["agents"].values() if a["turn"]),
            "shutting_down": self._closing,
            "recovered": self.recovered.to_json() if self.recovered is not None else None,
            "sandbox": self.sandbox.describe(),
            "fleet": None if self.fleet is None else {
                "host": self.fleet.host, "lease": self.fleet.lease, "held": self.fleet.held(),
                "hosts": self.fleet.view, "pinned": self._pinned_status(),
            },
        }

    def _pinned_status(self) -> dict[str, dict[str, Any]]:
        """Each pinned channel: its host, and whether it waits for that host (not alive)."""
        assert self.fleet is not None
        alive = {h["host"]: h["alive"] for h in self.fleet.view}
        return {
            name: {"host": table.host, "waiting": not alive.get(table.host, False)}
            for name, table in sorted(self.config.channels.items()) if table.host is not None
        }

    # ------------------------------------------------------------ restart and shutdown

    async def restore(self) -> int:
        """Re-queue what a previous run accepted but never ran; returns how many."""
        for channel, state in (await self._store.load_channel_states()).items():
            self._ledger.restore(channel, state.generation, rests=state.rests, stopped=state.stopped)
        rows = await self._store.load_queue()
        self._requeue(rows)
        return len(rows)

    async def shutdown(self) -> None:
        """End every running turn as "interrupted by a restart"; keep queues, todos, sessions.

        Stops in progress are not interrupted: they finish (each within its own budget), so
        their callers get their results and their notices are stored.
        """
        self._closing = True
        decision = self._ledger.shut_down()  # every running turn is silenced now
        turns = []
        built = {(c, t.turn_id): t for (c, _), t in self._turns.items()}
        for channel, turn_id in decision.turns:
            turn = built.get((channel, turn_id))
            if turn is None:
                continue  # not built yet (parked after the take): it never starts, as after a stop
            turn.cut_off("shutdown")  # (its text so far, saved as it stood: contract line 18)
            turn.stop_reason = "shutdown"
            turn.scope.cancel()
            self._registry.interrupt(channel, turn_id, turn.adapter.interrupt_signal)
            turns.append(turn)
        async with trio.open_nursery() as nursery:
            for turn in turns:
                nursery.start_soon(self._finish_shutdown_turn, turn)
            for progress in list(self._stops.values()):
                nursery.start_soon(progress.done.wait)
        await self._acp.close_all()  # after the turns: each cancelled its own prompt first
        self._reap_now()

    async def recover(self) -> Recovery:
        """Before serving: end the previous owner's orphans and close its turns on the record."""
        grace = max((a.limits.stop_grace for a in self.config.agents.values()), default=self.config.limits.stop_grace)
        self.recovered = await recover(self._store, grace, STOP_NOTICE, self.cgroups)
        return self.recovered

    async def _finish_shutdown_turn(self, turn: Turn | AcpTurn) -> None:
        with trio.move_on_after(_grace(turn) + STOP_SLACK):
            await turn.done.wait()
        try:
            await self._store.submit_turn_notice(
                turn.channel, SHUTDOWN_NOTICE, turn=turn.turn_id, generation=turn.generation
            ).committed()
        except StoreError as exc:
            log.error("could not store the shutdown notice in %r: %s", turn.channel, exc)


@dataclass(slots=True)
class _Answer:
    """Another host's answer to a stop this host asked it to carry out."""

    heard: trio.Event = field(default_factory=trio.Event)
    """The owner has acknowledged the stop (it is carrying it out)."""
    done: trio.Event = field(default_factory=trio.Event)
    result: StopResult | None = None


@dataclass(slots=True)
class _StopInProgress:
    """A stop between its decision and its end: repeats and shutdown wait for it."""

    plans: dict[str, list[dict[str, str]]]
    recorded: bool = False
    """The record's write is over (committed, or failed and the stop undone)."""
    done: trio.Event = field(default_factory=trio.Event)
    result: StopResult | None = None

    def finish(self, stops: dict[str, _StopInProgress], channel: str, result: StopResult) -> None:
        self.result = result
        self.done.set()
        if stops.get(channel) is self:
            del stops[channel]


@dataclass(slots=True)
class _StopBatch:
    """The stops decided in one step (one, or a stop-all's) and their one record write."""

    decisions: list[StopDecision]
    seqs: dict[str, int] = field(default_factory=dict)
    plans: dict[str, dict[str, list[dict[str, str]]]] = field(default_factory=dict)
    progress: dict[str, _StopInProgress] = field(default_factory=dict)
    write: Pending | None = None


@dataclass(slots=True)
class _Acceptance:
    accepted: Accepted
    pending: Pending

    async def accepted_now(self) -> Accepted:
        await self.pending.committed()
        return self.accepted


def _grace(turn: Turn | AcpTurn) -> float:
    """How long a stopped turn may take to end before its stop calls itself failed."""
    return turn.stop_grace if isinstance(turn, AcpTurn) else turn.agent.limits.stop_grace


def check_channel(channel: object) -> None:
    """Raise :class:`UsageError` unless ``channel`` is a usable channel name."""
    if not isinstance(channel, str) or not channel or len(channel) > MAX_CHANNEL_CHARS:
        raise UsageError(f"a channel is a name of 1 to {MAX_CHANNEL_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in channel):
        raise UsageError("a channel name cannot contain control characters")
    if channel in (".", ".."):
        raise UsageError(f"a channel name cannot be {channel!r} (a path segment of its own); choose another name")
    try:
        check_message(channel, "the channel name")
    except BadText as exc:
        raise UsageError(str(exc)) from None


@asynccontextmanager
async def open_supervisor(
    config: Config, *, subreaper: bool = False, owns_children: bool = False, hooks: Hooks | None = None
) -> AsyncIterator[Supervisor]:
    """Run a supervisor for the duration of the block.

    ``subreaper`` makes this process a child subreaper so escaped descendants of turns
    re-parent to it (process-wide: the daemon turns it on; an embedding program decides).
    ``owns_children`` says every child of this process is corral's (true of ``corral run``):
    then dead adoptees are reaped after each turn. A host with children of its own leaves it
    off, and its subreaper adoptees are reaped only when a sweep finds them alive.
    On exit every running turn is ended, its tree killed, and the store flushed.
    """
    private_folder(config.state_dir, within=config.state_dir)
    # The bit is process-wide: give it back as it was, or an embedding program keeps
    # adopting orphans (and their zombies) after the supervisor is gone.
    restore_subreaper = subreaper and not is_child_subreaper()
    if subreaper:
        subreaper = set_child_subreaper(True)
    try:
        host = config.cluster.host if config.store_url else None
        lease = config.cluster.lease
        async with open_store(config.store_location, host=host, lease=lease) as store, trio.open_nursery() as nursery:
            cgroups = open_root(config.server.cgroup, store.store_id)
            private = private_paths(
                state_dir=config.state_dir, store_path=config.store_path, store_url=config.store_url,
                config_path=config.path, token_file=config.server.token_file, socket=config.server.socket,
                cgroup_subtree=cgroups.path if cgroups is not None else None,
                agent_dirs={a.name: a.cwd for a in config.agents.values() if a.cwd is not None},
                home=os.environ.get("HOME"),
            )
            sandbox = await trio.to_thread.run_sync(open_sandbox, config.server.sandbox, private)
            sup = Supervisor(
                config, store, nursery, hooks, cgroups=cgroups, sandbox=sandbox, subreaper=subreaper,
                owns_children=owns_children,
            )
            if cgroups is not None and cgroups.watcher is not None:
                nursery.start_soon(cgroups.watcher.run, name="corral-cgroup-watcher")
            # Orphans of an abrupt end die before anything is re-queued or served.
            await sup.recover()
            await sup.restore()
            if sup.fleet is not None:
                await nursery.start(sup.fleet.listen, sup._notice)
                await nursery.start(sup.fleet.run)
            try:
                yield sup
            finally:
                with trio.CancelScope(shield=True):
                    await sup.shutdown()
                    if sup.fleet is not None:
                        await sup.fleet.release()
                nursery.cancel_scope.cancel()
                if sup.cgroups is not None:
                    sup.cgroups.close()
    finally:
        if restore_subreaper:
            set_child_subreaper(False)
