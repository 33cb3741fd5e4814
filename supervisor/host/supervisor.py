"""The supervisor: one object that composes corral's parts and does little itself.

Theory of operation
-------------------

:class:`Supervisor` is the face an embedding program, the control API and the daemon use
(``send``, ``stop``, ``stop_all``, ``wait_idle``, ``entries``, ``follow``, ``status``,
``shutdown``, ``restore``, ``recover``). Behind it, under one nursery:

* the **ledger** (:class:`~supervisor.core.ledger.StopLedger`: pure, every stop decision) and
  the **store** (every write, group-committed);
* the **lanes** (:mod:`.lanes`): accepting messages, hand-offs between agents, a worker per
  (channel, agent), running each turn;
* the **stopper** (:mod:`.stopper`): a stop's record, its kill, its notice, and the one kill
  step a stop, a lost lease and a shutdown share — no checkpoint from a decision to its
  signal;
* the **ownership** (:mod:`.ownership`): who runs a channel — this host alone
  (:class:`~supervisor.host.ownership.SingleHost`), or the holder of its lease in a fleet
  (:class:`~supervisor.host.fleet_ownership.FleetOwnership`); the lanes and the stopper ask it and never
  check which.

The supervisor checks a request (a usable channel name, message, author), routes it to its
part and answers; the rest is the parts'.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, overload

import trio

from ..config.preflight import passwd_home, private_of
from ..config.settings import AgentConfig, Config
from ..core import paging
from ..core.budget import turn_cost
from ..core.counters import Metrics
from ..core.daily import utc_day
from ..core.errors import ShuttingDown, UsageError
from ..core.ledger import EditOutcome, QueueEdit, StopLedger
from ..core.netpolicy import Policy
from ..core.queue import (
    LaneFacts,
    QueueEditResult,
    QueueFull,
    depth_decision,
    edit_text,
    idempotency_origin,
    queue_view,
    refusal,
)
from ..core.restart import check_resend, resend_targets, reset_refusal, reset_text
from ..core.results import (
    DELIVERIES,
    HOST_LOST_NOTICE,
    MAX_CHANNEL_CHARS,
    MAX_MESSAGE_BYTES,
    NUDGE_TEXT,
    SHUTDOWN_NOTICE,
    STOP_NOTICE,
    STOP_SLACK,
    Accepted,
    StopResult,
    UnknownChannel,
)
from ..core.router import AddressError, address, near_misses
from ..core.text import BadText, check_message
from ..core.usage import sum_by_day, turn_record, usage_line
from ..fleet.fleet import Fleet
from ..net.proxy import NetworkService
from ..procs.cgroup import CgroupRoot, cgroup2_mount, open_root
from ..procs.covers import CoverWatch, open_cover_watch
from ..procs.files import private_folder
from ..procs.hooks import Hooks
from ..procs.memory import read_memory
from ..procs.netns import NetnsPool
from ..procs.peers import PeerFacts, PeerRefusal, judge_peer, own_pid_namespace
from ..procs.registry import ProcessRegistry
from ..procs.sandbox import Sandbox, instances_folder, open_sandbox
from ..procs.teardown import CollectorPause
from ..procs.tree import (
    MarkerScanner,
    ProcessTree,
    is_child_subreaper,
    set_child_subreaper,
    spawn,
)
from ..store.store import Draft, Entry, Store, StoreError, open_store
from ..turns.ports import Places, RunningTurn, TurnBudgets, TurnPorts
from .capacity import Capacity
from .delivery import Delivery
from .disk import DiskGuard
from .fleet_ownership import FleetOwnership
from .lanes import Lanes, _TurnStore
from .ownership import Ownership, SingleHost
from .recovery import Recovery, recover
from .stopper import Stopper

__all__ = [
    "HOST_LOST_NOTICE", "MAX_CHANNEL_CHARS", "MAX_MESSAGE_BYTES", "NUDGE_TEXT", "SHUTDOWN_NOTICE", "STOP_NOTICE",
    "STOP_SLACK", "Accepted", "StopResult", "Supervisor", "UnknownChannel", "check_channel", "open_supervisor",
]

log = logging.getLogger("corral")


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
        covers: CoverWatch | None = None,
        network: NetworkService | None = None,
    ) -> None:
        hooks = hooks or Hooks()
        self.config = config
        self.sandbox = sandbox
        """What every turn starts behind (:mod:`supervisor.procs.sandbox`)."""
        self.covers = covers
        """The watch that ends a turn whose cover was replaced on the host (:mod:`supervisor.procs.covers`)."""
        self.network = network
        """The proxy turns under a network policy reach the network through (:mod:`supervisor.net.proxy`)."""
        self.cgroups = cgroups
        """The store's cgroup subtree (a cgroup per turn), or None: the sweep fallback."""
        self.started = time.time()
        self.recovered: Recovery | None = None
        """What the last start recovered from an abrupt end of the previous owner."""
        self._own_pid_ns = own_pid_namespace()
        self._refused_turns: set[str] = set()
        """Turns whose processes the control socket has refused (logged once per turn)."""
        self._refused_unknown_at = -60.0
        """When a peer that is not a turn's was last logged as refused (at most once a minute)."""
        mount = cgroup2_mount() if cgroups is not None else None
        self._cgroup_subtree = (
            "/" + str(cgroups.path.relative_to(mount))
            if cgroups is not None and mount is not None and cgroups.path.is_relative_to(mount) else None
        )
        """That subtree as ``/proc/PID/cgroup`` names it (what a control-socket peer is checked against)."""
        self._resending: set[int] = set()
        """Seqs of dropped messages being sent again right now (a second resend is refused)."""
        self._keys: dict[str, trio.Event] = {}
        """Idempotency keys (as origins) being sent right now: a second send of one waits for the first."""
        self._stored_channels: set[str] = set()
        """Channels found in the store that the ledger has not seen in this run."""
        self._store = store
        self._nursery = nursery
        self._ledger = StopLedger(max_nudges=config.limits.max_nudges)
        self._registry = ProcessRegistry(self._ledger, recording=lambda channel: self._stopper.recording(channel))
        # A subreaper adopts every escaped descendant of a turn, so the marker scan need
        # not read the whole of /proc: only this process's descendants.
        self.scanner = MarkerScanner(
            within=os.getpid() if subreaper else None, elsewhere=lambda wanted: self._registry.leader_pids()
        )
        self._places = Places(config.state_dir, store.session)
        self.disk = (DiskGuard(config.state_dir, config.server.disk_reserve, turns=lambda: self._lanes.turns.values())
                     if config.server.disk_reserve else None)
        """The reserve on the state folder's disk and its guard (:mod:`.disk`); None: off."""
        refusal = self.disk.refusal if self.disk is not None else None
        fleet = FleetOwnership(config, store, self._ledger, nursery) if store.host is not None else None
        self._ownership: Ownership = fleet if fleet is not None else SingleHost()
        self.fleet: Fleet | None = self._ownership.fleet
        """This host's leases, when the store is shared by a fleet (PostgreSQL with a host)."""

        def ports(turn_store: _TurnStore, adopt_background: Any) -> TurnPorts:
            return TurnPorts(
                ledger=self._ownership.turn_ledger(self._ledger), store=turn_store, registry=self._registry,
                scanner=self.scanner, spawn=hooks.spawn or spawn, places=self._places, cgroups=cgroups,
                sandbox=sandbox, adopt_background=adopt_background, preparing=hooks.preparing,
                covers=covers, refusal=refusal, network=network,
                budgets=TurnBudgets(config.turn_limits, config.prices,
                                    lambda channel, turn_id, spent: self._stopper.budget_stop(channel, turn_id, spent),
                                    config.usage_currency),
            )

        self._capacity = Capacity(
            config, nursery, read=hooks.memory or read_memory, close_resident=lambda key: self._lanes.acp.close(key)
        )
        """Admission: how many turns (and idle ACP agents) at once, fairly, within memory."""
        self.metrics = Metrics()
        """Turns and stops counted since start (``GET /metrics``)."""
        self._lanes = Lanes(
            config, store, self._ledger, nursery, registry=self._registry, ownership=self._ownership, hooks=hooks,
            reap_adopted=subreaper and owns_children, make_ports=ports, capacity=self._capacity, metrics=self.metrics,
        )
        self._stopper = Stopper(
            config, store, self._ledger, registry=self._registry, lanes=self._lanes, ownership=self._ownership,
            cgroups=cgroups, collector=CollectorPause() if owns_children else contextlib.nullcontext(),
            nursery=nursery,
        )
        self._delivery = Delivery(store, self._ledger, self._lanes, self._stopper)
        if fleet is not None:
            fleet.attach(self._lanes, self._stopper, self._delivery.take_up)

    @property
    def reap_adopted(self) -> bool:
        """Every child of this process is corral's: dead adoptees are reaped after each turn."""
        return self._lanes.reap_adopted

    def reap_adoptees(self) -> None:
        """Reap dead children that re-parented to this (subreaper) process, when it owns them all."""
        self._lanes.reap_adoptees()

    def adopt_background(self, tree: ProcessTree) -> None:
        """Keep a normal turn's background processes, and reap any that become ours."""
        self._lanes.adopt_background(tree)

    # ------------------------------------------------------------ places

    def agent_home(self, agent: str, channel: str) -> Path:
        """The private HOME of an agent in a channel (its CLI writes its state there)."""
        return self._places.agent_home(agent, channel)

    def judge_peer(self, facts: PeerFacts) -> PeerRefusal | None:
        """Refuse a control-socket peer that is a process of a turn, another user's, or one that
        cannot be identified (see :mod:`supervisor.procs.peers`); logged once per turn; else None."""
        refusal = judge_peer(facts, own_uid=os.geteuid(), subtree=self._cgroup_subtree,
                             store_id=self._store.store_id, own_pid_ns=self._own_pid_ns,
                             group_socket=self.config.server.socket_group is not None
                             or bool(self.config.server.socket_mode & 0o066))
        if refusal is None:
            return None
        if refusal.turn is None:
            now = time.monotonic()
            if now - self._refused_unknown_at >= 60:  # a peer that keeps trying cannot flood the log
                self._refused_unknown_at = now
                log.warning("refused the control socket to pid %d: %s", facts.pid, refusal.message)
        elif refusal.turn not in self._refused_turns:
            self._refused_turns.add(refusal.turn)
            log.warning("refused the control socket to a process of turn %s (pid %d)", refusal.turn, facts.pid)
        return refusal

    def channel_cwd(self, channel: str, agent: AgentConfig) -> Path:
        """The fixed working directory of this channel and agent (created on first use)."""
        return self._places.channel_cwd(channel, agent)

    # ------------------------------------------------------------ sending

    async def send(
        self, channel: str, text: str, *, agent: str | None = None, to: Sequence[str] | None = None,
        author: str = "human:user", delivery: str | None = None, idempotency_key: str | None = None,
    ) -> Accepted:
        """Store and queue a message; returns once it is committed.

        It goes to ``agent`` and ``to`` if given, else to the agents it @mentions, else to
        the channel's default agent. ``author`` is ``human:NAME``, ``agent:NAME`` (a
        configured agent: another bot posting for it; while the channel rests its message
        is stored but goes to no one) or ``system``. ``delivery`` (a human's message):
        ``"queue"`` (after the running turn), ``"interrupt"`` (instead of it: the turn is
        stopped, and the queue before the message dropped) or ``"steer"`` (into it, where the
        agent can take it; else queued, and ``fallback`` says why); None: the channel's or
        agent's ``delivery`` setting, else ``"queue"`` (see :mod:`.delivery`).

        ``idempotency_key``: a send retried with the same key by the same author within
        ``[server] idempotency_window`` answers the first acceptance again (``replayed``) and
        queues nothing; the key is stored with the message, in its transaction, so this holds
        across a restart and through any host of a fleet.

        Raises :class:`UsageError` for bad input, :class:`QueueFull` when the channel's
        ``max_queued`` refuses it, and :class:`StoreError` if it could not be stored (then it
        will not run either).
        """
        if idempotency_key is not None:
            accepted = await self._idempotent(
                channel, author, idempotency_key,
                lambda origin, also: self._send(channel, text, agent=agent, to=to, author=author, origin=origin,
                                                delivery=delivery, also=also))
        else:
            accepted = await self._send(channel, text, agent=agent, to=to, author=author, origin=None,
                                        delivery=delivery)
        if agent is not None or to or accepted.replayed:
            return accepted
        went = ", ".join(accepted.to) or "no agent"
        members = self.config.members(channel)
        hints = tuple(f"@{word} names no agent of this channel (did you mean @{close}?); it went to {went}"
                      for word, close in near_misses(text, members or self.config.agents))
        return replace(accepted, hints=hints) if hints else accepted

    async def send_from(
        self, origin: str, channel: str, text: str, *, to: Sequence[str] | None = None, author: str = "human:user",
        delivery: str | None = None,
    ) -> Accepted:
        """:meth:`send` for a message from an outside event (a chat bridge's): ``origin`` names the
        event and is stored with the message, in its transaction, so one event is accepted at
        most once (a second fails to commit: :class:`StoreError`); :meth:`origin_seq` tells
        whether it was."""
        if not isinstance(origin, str) or not origin or origin.startswith("api-key:"):
            raise UsageError("an origin is a non-empty string naming the outside event (not starting 'api-key:')")
        return await self._send(channel, text, agent=None, to=to, author=author, origin=origin, delivery=delivery)

    async def _idempotent(
        self, channel: str, author: str, key: str,
        send: Callable[[str, Callable[[Any, int], None] | None], Any],
    ) -> Accepted:
        """Send once per (author, key) within the window: a repeat answers the first acceptance."""
        check_channel(channel)
        origin = idempotency_origin(author, key)
        window = self.config.server.idempotency_window
        while (running := self._keys.get(origin)) is not None:
            await running.wait()  # (the same key, sent right now: its answer is this one's)
        found = await self._store.origin_at(origin)
        if found is not None and found[0] and time.time() - found[1] < window:
            return await self._replay(found[0])
        expired = found is not None  # (its row is replaced in the new message's transaction)
        self._keys[origin] = done = trio.Event()
        try:
            also = (lambda db, _seq: Store.forget_origin(db, origin)) if expired else None
            try:
                accepted: Accepted = await send(origin, also)
            except StoreError:
                again = await self._store.origin_at(origin)  # (another host accepted it first)
                if again is not None and again[0]:
                    return await self._replay(again[0])
                raise
            return accepted
        finally:
            del self._keys[origin]
            done.set()

    async def _replay(self, seq: int) -> Accepted:
        """The acceptance of the message ``seq`` as it was first answered (``replayed``)."""
        entry = await self._store.entry(seq)
        if entry is None:
            raise UsageError(f"the idempotency key names message {seq}, which is no longer stored; use a new key")
        meta = entry.meta
        first = str(meta.get("agent") or "")
        to = tuple(meta.get("to") or ((first,) if first else ()))
        ahead = sum(1 for m in self._ledger.queued(entry.channel, first) if m.entry_seq < seq) if first else 0
        return Accepted(seq, entry.channel, first, entry.generation, ahead, to,
                        delivery=str(meta.get("delivery") or "queue"), replayed=True)

    async def _send(
        self, channel: str, text: str, *, agent: str | None, to: Sequence[str] | None, author: str,
        origin: str | None, also: Callable[[Any, int], None] | None = None, delivery: str | None = None,
    ) -> Accepted:
        """:meth:`send`'s checks and acceptance (``also``: more, in the message's transaction)."""
        if delivery is not None and delivery not in DELIVERIES:
            close = difflib.get_close_matches(str(delivery), DELIVERIES, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(DELIVERIES)}"
            raise UsageError(f"unknown delivery {delivery!r}; {hint}")
        if self._lanes.closing:
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
        wanted = delivery or (self.config.delivery(channel, targets[0]) if targets else "queue")
        if wanted != "queue" and not author.startswith("human:"):
            if delivery is not None:
                raise UsageError(f"only a human's message may {delivery}: {author!r} is not one")
            wanted = "queue"  # (a configured default applies to people, not to other bots)
        fallback = None
        if wanted != "queue" and targets and await self._ownership.deliver_elsewhere(channel):
            # (A fleet) another host runs the channel: its owner carries the delivery out as it
            # takes the message up (the queue row says which), and its notice says what it did.
            return replace(await self._lanes.accept(
                channel, targets, author, text, nudge=False, hops=hops, origin=origin, also=also,
                meta={"delivery": wanted}, delivery=wanted,
            ).accepted_now(), delivery=wanted)
        if wanted == "interrupt" and targets:
            return await self._delivery.interrupt(
                channel, targets, author, text, hops=hops, origin=origin, also=also
            )
        busy = False
        if wanted == "steer" and targets:
            turn, fallback, busy = self._delivery.steerable(channel, targets)
            if turn is not None:
                steered = await self._delivery.steer(channel, turn, author, text, origin=origin, also=also)
                if isinstance(steered, Accepted):
                    return steered
                fallback = steered
        dropped = self._make_room(channel, targets)  # (no await from here to the accept: the depth holds)
        accepted = await self._lanes.accept(
            channel, targets, author, text, nudge=False, hops=hops, origin=origin, also=also,
            meta={"delivery": wanted, "fallback": fallback} if fallback is not None else None,
        ).accepted_now()
        if dropped:
            accepted = replace(accepted, dropped=dropped)
        if fallback is None:
            return replace(accepted, delivery=wanted) if wanted == "queue" or not targets else accepted
        if busy:
            await self._store.append(
                channel, "system", "status", f"Not steered ({fallback}): message {accepted.seq} is queued instead.",
                generation=accepted.generation,
            )
        return replace(accepted, fallback=fallback)

    def _make_room(self, channel: str, targets: Sequence[str]) -> tuple[int, ...]:
        """The channel's ``max_queued`` policy for a message about to wait in ``targets``' lanes
        (synchronous, in the accept's step): raise :class:`QueueFull`, or take back the oldest
        waiting messages (each said in the transcript) and return their entries."""
        limit, when_full = self.config.queue_limit(channel)
        if limit is None:
            return ()
        waiting = [m.entry_seq for m in self._ledger.queued(channel)]
        joining = sum(1 for t in targets if self._ledger.is_busy(channel, t) or (channel, t) in self._lanes.workers)
        decision = depth_decision(waiting, joining, limit, when_full)
        if decision.refuse:
            raise QueueFull(channel, len(waiting), limit)
        for entry in decision.drop:
            edit = self._ledger.take_back(channel, entry)
            if edit.outcome is EditOutcome.DONE:
                self._record_edit(edit, "system", f"seq {entry} dropped: channel {channel!r} was full "
                                                  f"(max_queued = {limit}, when_full = \"drop_oldest\")")
        return decision.drop

    # ------------------------------------------------------------ the queue

    async def queue(self, channel: str) -> dict[str, Any]:
        """The channel's waiting messages, lane by lane: each one's place, author, agent, age and
        why it waits (behind the running turn, an earlier message, for a slot), and each lane's turn."""
        await self.require_channel(channel)
        waiting = self._capacity.waiting()
        lanes = []
        for agent in self._ledger.lanes(channel):
            rows = []
            for m in self._ledger.queued(channel, agent):
                payload = m.payload
                author = getattr(payload, "author", "")
                text = getattr(payload, "text", "")
                rows.append((m.id, m.entry_seq, author, text, getattr(payload, "accepted_at", None)))
            turn_id = self._ledger.current_turn(channel, agent)
            built = self._lanes.turns.get((channel, agent))
            stopping = (turn_id is not None and self._ledger.is_stale(channel, turn_id)) or (
                built is not None and built.stop_reason is not None and not built.done.is_set())
            lanes.append(LaneFacts(agent, rows, turn_id, stopping, waiting.get((channel, agent)),
                                   rests=self._lanes.daily_reason(channel, agent)))
        return queue_view(channel, lanes, time.time())

    async def cancel(self, channel: str, seq: int, *, author: str = "human:user") -> QueueEditResult:
        """Take the queued message ``seq`` back (every agent's copy of it): it never starts a
        turn, recorded as "seq N taken back by NAME" in the same transaction as the dequeue.

        A message a turn took already is not taken back: :class:`QueueEditRefused` with code
        ``running`` names the turn (``corral stop`` ends it); ``not_queued`` when it waits nowhere."""
        return await self._edit(channel, seq, author, "take_back")

    async def move_first(self, channel: str, seq: int, *, author: str = "human:user") -> QueueEditResult:
        """Move the queued message ``seq`` to the front of its agent's lane (of each agent's it
        went to), recorded as "seq N moved first by NAME" in the same transaction; refused
        as :meth:`cancel` is."""
        return await self._edit(channel, seq, author, "move_first")

    async def _edit(self, channel: str, seq: int, author: str, action: str) -> QueueEditResult:
        if self._lanes.closing:
            raise ShuttingDown("corral is shutting down")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= 0:
            raise UsageError(f"seq must be a positive whole number (a queued message's, as `corral queue` shows), "
                             f"got {seq!r}")
        self._check_author(author)
        await self.require_channel(channel)
        # Decided and submitted in one step: no turn can take the message in between.
        edit = (self._ledger.take_back if action == "take_back" else self._ledger.move_first)(channel, seq)
        if edit.outcome is not EditOutcome.DONE:
            stale = [t for _, t in edit.running if self._ledger.is_stale(channel, t)]
            raise refusal(action, channel, seq, edit.running, stale)
        pending = self._record_edit(edit, author, edit_text(action, seq, author, len(edit.messages)))
        try:
            record = await pending.committed()
        except StoreError:
            self._ledger.undo_edit(edit)
            for agent in {m.agent for m in edit.messages}:
                if self._ledger.queued(channel, agent):
                    self._lanes.ensure_worker(channel, agent)
            raise
        assert record is not None
        log.info("[%s] %s", channel, record.text)
        return QueueEditResult(channel, seq, action, tuple(m.id for m in edit.messages),
                               tuple(dict.fromkeys(m.agent for m in edit.messages)), record.seq, author,
                               tuple(t for _, t in edit.running))

    def _record_edit(self, edit: QueueEdit, by: str, text: str) -> Any:
        """Submit an edit's record (in the ledger's step) and wake lanes a take-back emptied."""
        pending = self._store.submit_queue_edit(
            edit.channel, edit.action, edit.seq, [m.id for m in edit.messages], text, by=by,
            generation=edit.generation,
        )
        if edit.action == "take_back":
            for agent in {m.agent for m in edit.messages}:
                if not self._ledger.queued(edit.channel, agent):
                    self._capacity.drop_lane(edit.channel, agent)
                    self._lanes.wake_daily(edit.channel, agent)
        return pending

    # ------------------------------------------------------------ bridges' bookkeeping

    async def origin_seq(self, origin: str) -> int | None:
        """The seq of the message accepted from ``origin`` (0: marked handled); None: never seen."""
        return await self._store.origin_seq(origin)

    async def mark_origin(self, origin: str) -> None:
        """Record that ``origin`` was handled without a message (a chat command); once committed."""
        await self._store.mark_origin(origin).committed()

    async def cursor(self, key: str) -> str | None:
        """A value a bridge keeps across restarts (a sync token, the last entry it posted)."""
        return await self._store.cursor(key)

    async def save_cursor(self, key: str, value: str) -> None:
        """Store a bridge's value; returns once it is committed."""
        await self._store.save_cursor(key, value).committed()

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

    # ------------------------------------------------------------ stopping

    async def stop(self, channel: str | None = None) -> StopResult:
        """Stop one channel (or every busy channel); returns when the stop is complete."""
        if channel is None:
            return await self.stop_all()
        await self.require_channel(channel)
        started, cpu = trio.current_time(), time.process_time()
        result = await self._ownership.stop_elsewhere(channel, started, cpu)
        if result is None:
            result = await self._stopper.stop(channel, started, cpu)
        self.metrics.stopped(result.ok, result.elapsed_ms)
        return result

    async def stop_all(self) -> StopResult:
        """Stop every channel that has work; the result lists each."""
        result = await self._stopper.stop_all()
        self.metrics.stopped(result.ok, result.elapsed_ms)
        return result

    # ------------------------------------------------------------ starting over, sending again

    async def reset(self, channel: str, *, agent: str | None = None, stop: bool = False) -> Entry:
        """Start ``channel`` over for ``agent`` (None: every agent with a conversation there):
        forget their session ids and plans, recorded as an entry (returned once committed).
        A live ACP agent of theirs there is ended too (it holds the session it loaded).

        Never while one of them runs a turn there: :class:`ChannelBusy` says which, unless
        ``stop``, which stops the channel first (see :mod:`..core.restart`).
        """
        if self._lanes.closing:
            raise ShuttingDown("corral is shutting down")
        await self.require_channel(channel)
        if agent is not None and agent not in self.config.agents:
            close = difflib.get_close_matches(agent, sorted(self.config.agents), n=1)
            raise UsageError(f"unknown agent {agent!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
        stopped = False
        if stop and self._reset_refusal(channel, agent) is not None:
            result = await self.stop(channel)
            if not result.ok:
                raise UsageError(f"the stop before the reset failed: {result.error}; nothing was reset")
            stopped = True
        agents = [agent] if agent is not None else self._conversations(channel)
        for name in agents:
            if self._reset_refusal(channel, name) is None:
                await self._lanes.acp.close((channel, name))
        refusal = self._reset_refusal(channel, agent)  # (again, after the awaits: a turn may have begun)
        if refusal is not None:
            raise refusal
        pending = self._store.reset_conversation(
            channel, agents, reset_text(agents, stopped=stopped), generation=self._ledger.generation(channel),
        )
        entry = await pending.committed()
        assert entry is not None
        log.info("[%s] reset for %s%s", channel, ", ".join(agents) or "no agent", " after a stop" if stopped else "")
        return entry

    def _reset_refusal(self, channel: str, agent: str | None) -> Exception | None:
        running = self._ledger.current_turns(channel)
        return reset_refusal(channel, {a: t for a, t in running.items() if agent is None or a == agent})

    def _conversations(self, channel: str) -> list[str]:
        """The agents that have a session id or a plan in ``channel``, or have worked there."""
        named = set(self._store.sessions_by_channel().get(channel, {}))
        return sorted(named | set(self._store.todo_agents(channel)) | set(self._ledger.lanes(channel)))

    async def resend(self, channel: str, seq: int) -> Accepted:
        """Send again, once, the person's message ``seq`` that a stop dropped: same text, author
        and agents. Raises :class:`UsageError` when it was not dropped, or was sent again already."""
        await self.require_channel(channel)
        rows = await self._store.entries(channel, after=max(seq - 1, 0), limit=1)
        entry = rows[0] if rows and rows[0].seq == seq else None
        found = None if entry is None else {"kind": entry.kind, "author": entry.author, "meta": entry.meta}
        check_resend(channel, seq, found, in_flight=seq in self._resending)  # (no await since: one wins)
        assert entry is not None
        self._resending.add(seq)
        meta = dict(entry.meta)
        try:
            accepted = await self._send(
                channel, entry.text, agent=None, to=resend_targets(meta) or None, author=entry.author, origin=None,
                also=lambda db, new_seq: Store.mark_resent(db, seq, meta, new_seq),
            )
        finally:
            self._resending.discard(seq)
        log.info("[%s] message %d sent again as %d", channel, seq, accepted.seq)
        return accepted

    # ------------------------------------------------------------ observing

    async def wait_idle(self, channel: str, timeout: float | None = None) -> bool:
        """Wait until the channel runs no turn and has nothing queued; False on timeout."""
        await self.require_channel(channel)
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            while any(lane[0] == channel for lane in self._lanes.workers) or self._ledger.is_busy(channel):
                event = self._lanes.idle.setdefault(channel, trio.Event())
                await event.wait()
            return True
        return False

    async def require_channel(self, channel: str) -> None:
        """Raise :class:`UnknownChannel` unless ``channel`` has existed (a bad name: :class:`UsageError`).

        A channel exists once the ledger has seen it in this run or the store holds an
        entry of it; the store is asked only when the ledger has not seen it.
        """
        check_channel(channel)
        if channel in self._ledger.names or channel in self._stored_channels:
            return
        if await self._store.has_entries(channel):
            self._stored_channels.add(channel)
            self._ledger.know((channel,))  # (stored since the restart, by another host: status lists it)
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

    async def entries(self, channel: str, after: int = 0, limit: int = 10_000, newest: bool = False) -> list[Entry]:
        """Committed entries of a channel after ``after``, at most ``limit``, oldest first
        (``newest``: the newest ``limit`` of them, as ``tail -n`` shows)."""
        await self.require_channel(channel)
        return await self._store.entries(channel, after=after, limit=limit, newest=newest)

    def _running_usage(self, turn: RunningTurn) -> dict[str, Any]:
        """What a running turn has spent so far, as ``status`` shows it: tokens, tool calls,
        its cost (a decimal's text, or None: not known) against its budgets, and ``line``,
        all of it as a person reads it (:func:`~supervisor.core.usage.usage_line`)."""
        so_far = turn.usage_so_far()
        limits = self.config.turn_limits(turn.channel, turn.agent.name)
        cost = turn_cost(so_far, self.config.prices, limits.currency)
        currency = self.config.usage_currency(turn.channel, turn.agent.name)  # (as its end entry will say)
        shown = cost if currency == limits.currency else turn_cost(so_far, self.config.prices, currency)
        line = usage_line(turn_record(turn.turn_id, turn.channel, turn.agent.name, "", so_far, cost=shown,
                                      currency=currency))
        return {"tokens": so_far.tokens, "tool_calls": so_far.tool_calls, "line": line,
                "cost": None if cost is None else str(cost), "currency": limits.currency,
                "max_turn_tokens": limits.max_turn_tokens,
                "max_turn_cost": None if limits.max_turn_cost is None else str(limits.max_turn_cost),
                "max_turn_tool_calls": limits.max_turn_tool_calls}

    async def usage(self, channel: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """What turns spent, summed per UTC day, channel and agent, from day ``since``
        (``YYYY-MM-DD``; None: today) on: :func:`~supervisor.core.usage.sum_by_day`."""
        day = since if since is not None else time.strftime("%Y-%m-%d", time.gmtime())
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", day):
            raise UsageError(f"since must be a day, YYYY-MM-DD, got {day[:40]!r}")
        return sum_by_day(await self._store.usage(channel, day))

    def budget_reset(self, name: str | None = None) -> dict[str, Any]:
        """Forget today's spend of the channel or agent ``name`` (None: every one), so its daily
        budget starts again; its waiting lanes take their messages now. Kept in this daemon's
        memory only: a restart counts the day's stored turns again (the budget is spent again)."""
        if name is not None and name not in self.config.agents and name not in self.config.channels:
            raise UsageError(f"no channel or agent is called {name[:80]!r}")
        reset = self._lanes.daily.reset(name)
        if name is None:
            self._lanes.wake_daily()
        else:
            self._lanes.wake_daily(channel=name)
            self._lanes.wake_daily(agent=name)
        log.info("daily budget reset: %s", ", ".join(reset) or "nothing was spent")
        return {"reset": reset, "day": utc_day()}

    def session(self, channel: str, agent: str) -> str | None:
        """The agent's session id in the channel (the next turn resumes it), if any."""
        return self._store.session(channel, agent)[0]

    def todos(self, channel: str, agent: str) -> list[dict[str, str]]:
        """The agent's plan in the channel, as last stored."""
        return self._store.todos(channel, agent)

    def channels_with_queue(self) -> list[str]:
        """Channels with messages waiting (after a restart: what was restored)."""
        return sorted(c for c in self._ledger.busy_channels() if self._ledger.queue_size(c))

    async def last_seq(self) -> int:
        """The seq of the newest committed entry (0: none)."""
        return await self._store.last_seq()

    async def flush(self) -> None:
        """Wait until every write accepted so far is committed (a failure is not raised here)."""
        await self._store.flush()

    def _groups(self) -> tuple[set[str], set[str]]:
        """The busy channels for a ``status`` page: running (or stopping) and queued, disjoint;
        every other channel of ``self._ledger.names`` is idle. A turn the ledger has ended may
        still be in ``Lanes.turns`` (ending): its channel counts as running. The cost is the
        busy channels', not the host's (the ledger keeps them as sets)."""
        running = {channel for channel, _ in self._lanes.turns}
        running.update(self._ledger.running_channels())
        queued = {name for name in self._ledger.busy_channels() if name not in running}
        return running, queued

    def _channel_status(self, name: str, waiting: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
        """One channel as ``status`` shows it (see :meth:`status`)."""
        agents: dict[str, Any] = {}
        for agent in self._ledger.lanes(name):
            turn = self._lanes.turns.get((name, agent))
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
                "waiting": waiting.get((name, agent)),
                "turn": None
                if turn is None
                else {
                    "id": turn.turn_id,
                    "agent": turn.agent.name,
                    "phase": phase.value if phase is not None else "ending",
                    "pid": turn.tree.pid if turn.tree else None,
                    "started": turn.started_at,
                    "usage": self._running_usage(turn),
                },
            }
        first = next((a["turn"] for a in agents.values() if a["turn"] is not None), None)
        sessions = {a: sid for a in self.config.agents if (sid := self._store.session(name, a)[0])}
        return {
            "generation": self._ledger.generation(name),
            "queued": len(self._ledger.queued(name)),
            "rests": self._ledger.rests(name),
            "members": list(self.config.members(name)),
            "sessions": sessions,
            "turn": first,
            "agents": agents,
        }

    def status(self, *, after: str | None = None, limit: int | None = None, idle: bool = False) -> dict[str, Any]:
        """Agents, channels, and per channel each agent's state, at this instant.

        ``channels`` holds a page of them (:mod:`~supervisor.core.paging`): busy ones first
        (running, then queued), then — with ``idle``, or when the whole host fits in the page —
        the idle ones, at most ``limit`` channels and about 56 KB of JSON; ``limit`` None
        lists every channel (the daemon's own readers). ``channel_counts`` counts every
        channel by group, ``idle_listed`` says whether idle ones are listed, and ``next`` is
        the cursor (``after``) of the next page, or None on the last.

        A channel's ``agents`` maps each agent that has had work there to ``{"state",
        "queued", "waiting", "turn"}``: state ``idle``, ``queued`` (nothing running, ``queued`` > 0;
        ``waiting`` then says its place in the admission queue and why it waits, or None),
        ``running`` (``turn`` says which and since when) or ``stopping`` (a stop is tearing
        its turn down). ``turn`` and ``queued`` at the channel's level are kept for
        single-agent readers: the first running turn, and every lane's queue together.
        """
        waiting = self._capacity.waiting()
        running, queued = self._groups()
        names = self._ledger.names
        chosen = paging.plan(running, queued, names, after=after,
                             limit=limit if limit is not None else max(1, len(names)),
                             idle=idle or limit is None, bounded=limit is not None)
        channels: dict[str, Any] = {}
        following: str | None = None
        size, last = 0, (0, "")
        for n, key in enumerate(chosen.keys):
            if n == chosen.limit:
                following = paging.cursor(last)
                break
            shown = self._channel_status(key[1], waiting)
            if limit is not None:
                size += len(json.dumps(shown)) + len(json.dumps(key[1])) + 2
                if channels and size > paging.MAX_PAGE_BYTES:
                    following = paging.cursor(last)
                    break
            channels[key[1]], last = shown, key
        return {
            "pid": os.getpid(),
            "started": self.started,
            "uptime": time.time() - self.started,
            "config": str(self.config.path) if self.config.path else None,
            "store": self.config.store_name,
            "agents": {
                name: {"adapter": a.adapter, "command": list(a.command), "model": a.model,
                       "network": self._network_status(a.network, implicit=a.network_implicit)}
                for name, a in self.config.agents.items()
            },
            "channels": channels,
            "channel_counts": chosen.counts,
            "idle_listed": chosen.idle_listed,
            "next": following,
            "running": len(self._lanes.turns),
            "shutting_down": self._lanes.closing,
            "capacity": self._capacity.status(),
            "recovered": self.recovered.to_json() if self.recovered is not None else None,
            "sandbox": self.sandbox.describe(),
            "fleet": self._ownership.status(),
        }

    def summary(self) -> dict[str, Any]:
        """What ``/metrics`` and the service manager's status line read, without building every
        channel's state: running turns and waiting lanes by agent, channels by group, the
        running channels' names, the queue's depth."""
        running = Counter(agent for _, agent in self._lanes.turns)
        waiting_lanes = self._capacity.waiting()
        waiting = Counter(agent for _, agent in waiting_lanes)
        running_channels, queued_channels = self._groups()
        total = len(self._ledger.names)
        counts = {"running": len(running_channels), "queued": len(queued_channels),
                  "idle": total - len(running_channels) - len(queued_channels), "total": total}
        queued = sum(self._ledger.queue_size(name) for name in self._ledger.busy_channels())
        return {
            "agents": list(self.config.agents),
            "running_by_agent": dict(running),
            "waiting_by_agent": dict(waiting),
            "channels_running": len({c for c, _ in self._lanes.turns}),
            "channels_waiting": len({c for c, _ in waiting_lanes}),
            "channel_counts": counts,
            "running_channels": sorted(running_channels),
            "queued": queued,
            "running": len(self._lanes.turns),
            "shutting_down": self._lanes.closing,
            "capacity": self._capacity.status(),
        }

    def _network_status(self, policy: Policy, *, implicit: bool = False) -> dict[str, object]:
        """An agent's network for ``status``: its policy, whether it is enforced here, and
        whether the config left it unsaid (``implicit``: the adapter's or corral's default)."""
        enforced = policy.kind in ("host", "none") or (self.sandbox.active and self.network is not None)
        return {**policy.describe(), "enforced": enforced, "implicit": implicit}

    # ------------------------------------------------------------ restart and shutdown

    async def restore(self) -> int:
        """Re-queue what a previous run accepted but never ran; returns how many."""
        # Today's spend first: a lane whose daily budget is spent keeps its restored messages queued.
        self._lanes.daily.add_all(await self._store.usage(None, utc_day()))
        for channel, state in (await self._store.load_channel_states()).items():
            self._ledger.restore(channel, state.generation, rests=state.rests, stopped=state.stopped)
        # Every stored channel by name (one indexed query), so status counts and pages them;
        # the ledger keeps no state for one until it has some.
        self._ledger.know(await self._store.channels())
        rows = await self._store.load_queue()
        self._lanes.requeue(rows)
        return len(rows)

    async def shutdown(self) -> None:
        """End every running turn as "interrupted by a restart"; keep queues, todos, sessions.

        Stops in progress are not interrupted: they finish (each within its own budget), so
        their callers get their results and their notices are stored.
        """
        await self._stopper.shutdown()

    async def recover(self) -> Recovery:
        """Before serving: end the previous owner's orphans and close its turns on the record."""
        grace = max((a.limits.stop_grace for a in self.config.agents.values()), default=self.config.limits.stop_grace)
        self.recovered = await recover(self._store, grace, STOP_NOTICE, self.cgroups)
        return self.recovered


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
            private = private_of(config, cgroups.path if cgroups is not None else None)
            sandbox = await trio.to_thread.run_sync(
                partial(open_sandbox, config.server.sandbox, private, bwrap=config.server.bwrap,
                        instances=instances_folder(os.environ.get("HOME") or passwd_home()), store_id=store.store_id))
            covers = open_cover_watch() if sandbox.active else None
            network = None
            if sandbox.active and any(a.network.proxied for a in config.agents.values()):
                netns_pool = NetnsPool(nursery)
                network = NetworkService(nursery, netns_pool)
                if network.available is not None:
                    log.warning("network policies cannot be enforced: %s", network.available)
            sup = Supervisor(
                config, store, nursery, hooks, cgroups=cgroups, sandbox=sandbox, subreaper=subreaper,
                owns_children=owns_children, covers=covers, network=network,
            )
            if cgroups is not None and cgroups.watcher is not None:
                nursery.start_soon(cgroups.watcher.run, name="corral-cgroup-watcher")
            if covers is not None:
                nursery.start_soon(covers.run, name="corral-cover-watch")
            if sup.disk is not None:
                await trio.to_thread.run_sync(sup.disk.take)
                nursery.start_soon(sup.disk.run, name="corral-disk-guard")
            # Orphans of an abrupt end die before anything is re-queued or served.
            await sup.recover()
            await sup.restore()
            await sup._ownership.serve(nursery)
            try:
                yield sup
            finally:
                with trio.CancelScope(shield=True):
                    await sup.shutdown()
                    await sup._ownership.close()
                    if network is not None:
                        await netns_pool.aclose()
                nursery.cancel_scope.cancel()
                if sup.cgroups is not None:
                    sup.cgroups.close()
                if sup.disk is not None:
                    sup.disk.close()
    finally:
        if restore_subreaper:
            set_child_subreaper(False)
