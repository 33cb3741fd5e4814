"""Delivery: a message to a busy lane queued, interrupting its turn, or steering it.

Theory of operation
-------------------

A message names its **delivery** (``queue``, ``interrupt`` or ``steer``; else its agent's or
channel's ``delivery`` setting, else ``queue``). :class:`Delivery` carries out the two that
are not the lanes' ordinary acceptance:

* **interrupt** is a stop of the addressed agents' lanes, for this message. In ONE
  synchronous step: the ledger decides each lane (``StopLedger.interrupt``: its turn stale,
  its queue dropped), what each interrupted turn was still writing is saved as it stood
  (``cut_off("interrupt")``), and the message is accepted with the interrupt's record in its
  own transaction (the dropped messages dequeued and marked, the interrupted agents' plans
  cancelled): nothing can come between the decision and the message's place at the head of
  the lane. Only once that transaction is committed is the kill applied, through the
  stopper's one kill step (no checkpoint from the commit to the last signal). A record that
  cannot be stored undoes the interrupt (``StopLedger.abort_interrupt``) and the send fails:
  nothing was killed. The lane's worker runs the message once the interrupted turn has ended,
  and stores the notice "Interrupted by a new message." in the step it learns the turn has
  ended (``EndDecision.interrupted``), before it takes the next message: the notice follows
  everything of the interrupted turn and precedes everything of the new one. Messages
  queued in the lane before the interrupt are dropped, as by a stop, and named (the answer's
  ``dropped``, the notice's count); ``corral resend`` brings one back.
* **steer** hands the message to the running turn of its one addressed agent
  (``RunningTurn.steer``: the ledger is asked right before the first byte is written). Once
  written, the message is stored as a human message of that turn (``meta.steered``). Where the
  turn cannot take it (nothing running, not started yet, its input closed, stale, an agent
  that cannot be steered, a message to several agents) it is queued as an ordinary message,
  and the answer's ``fallback`` says why (with a ``status`` entry when a turn was running).

A stop after an interrupt supersedes it (the turn is the stop's, and the notice); an
interrupt after a stop finds nothing to interrupt (the turn is already the stop's) and only
puts its message first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..core.account import cancelled
from ..core.ledger import InterruptDecision, Phase, StopLedger
from ..core.results import Accepted
from ..store.store import QueuedRow, Store, StoreError
from ..turns.ports import RunningTurn
from .lanes import Interruption, Lanes
from .stopper import Stopper, dropped_entries

log = logging.getLogger("corral")

class Delivery:
    """Interrupts and steers (see the module's theory)."""

    def __init__(self, store: Store, ledger: StopLedger, lanes: Lanes, stopper: Stopper) -> None:
        self._store = store
        self._ledger = ledger
        self._lanes = lanes
        self._stopper = stopper

    async def interrupt(
        self, channel: str, targets: tuple[str, ...], author: str, text: str, *, hops: int, origin: str | None,
        also: Callable[[Any, int], None] | None,
    ) -> Accepted:
        """Stop the targets' lanes for this message and queue it first; returns once the
        record is committed and the kill signalled (the notice follows the teardown)."""
        # One synchronous step from the first decision to the message's acceptance.
        decisions = [self._ledger.interrupt(channel, target) for target in targets]
        plans = self._decided(channel, decisions)
        dropped = tuple(m.id for d in decisions for m in d.dropped)

        def record(db: Any, seq: int) -> None:
            self._store.record_interrupt(db, channel, seq, dropped, plans)
            if also is not None:
                also(db, seq)

        acceptance = self._lanes.accept(
            channel, targets, author, text, nudge=False, hops=hops, origin=origin, also=record,
            meta={"delivery": "interrupt"},
        )
        try:
            await acceptance.pending.committed()
        except StoreError:
            for decision in decisions:
                self._ledger.abort_interrupt(decision)
            raise
        accepted = acceptance.accepted
        interrupted = self._kill(channel, accepted.seq, decisions, plans)
        return replace(accepted, delivery="interrupt", interrupted=interrupted, dropped=dropped)

    def _decided(self, channel: str, decisions: list[InterruptDecision]) -> dict[str, list[dict[str, str]]]:
        """(In the decisions' step) what each interrupted turn was still writing, saved as it stood
        (before the message: contract line 18); the plans of their agents, cancelled."""
        plans: dict[str, list[dict[str, str]]] = {}
        for decision in decisions:
            if decision.turn_id is None:
                continue
            if (turn := self._lanes.built(channel, decision.turn_id)) is not None:
                turn.cut_off("interrupt")
            plan = cancelled(self._store.todos(channel, decision.agent))
            if plan is not None:
                plans[decision.agent] = plan
        return plans

    def _kill(
        self, channel: str, seq: int, decisions: list[InterruptDecision], plans: dict[str, list[dict[str, str]]],
    ) -> tuple[str, ...]:
        """(The record committed) the kill, at once: no checkpoint to the last signal."""
        for agent, items in plans.items():
            self._store.remember_todos(channel, agent, items)
        interrupted = []
        for decision in decisions:
            if decision.turn_id is None:
                continue
            self._lanes.interruptions[decision.turn_id] = Interruption(
                seq, dropped_entries(decision.dropped), plans.get(decision.agent),
            )
            interrupted.append(decision.turn_id)
        self._stopper.kill(((channel, turn_id) for turn_id in interrupted), "interrupt")
        dropped = [m.id for d in decisions for m in d.dropped]
        log.info("[%s] message %d interrupts %s, drops %s", channel, seq, interrupted or "nothing", dropped)
        return tuple(interrupted)

    async def take_up(self, row: QueuedRow) -> None:
        """(A fleet's owner) carry out the delivery of a message another host accepted for a
        channel this host runs, as it is taken up: an interrupt as above (its record in a
        transaction of its own, then the kill), a steer into the running turn (its queue row
        dequeued) or, where the turn cannot take it, queued as any message."""
        channel, agent = row.channel, row.agent
        plain = replace(row, delivery=None)
        if row.delivery == "interrupt":
            decisions = [self._ledger.interrupt(channel, agent)]  # one step to the requeue at the lane's head
            plans = self._decided(channel, decisions)
            self._lanes.requeue([plain], taken_up=True)
            dropped = tuple(m.id for m in decisions[0].dropped)
            try:
                await self._store.submit_interrupt(channel, row.seq, dropped, plans).committed()
            except StoreError as exc:
                self._ledger.abort_interrupt(decisions[0])
                log.error("[%s] message %d could not interrupt (%s): it is queued instead", channel, row.seq, exc)
                return
            self._kill(channel, row.seq, decisions, plans)
            return
        turn, why, busy = self.steerable(channel, (agent,))
        self._lanes.known.add(row.seq)  # (taken up: a second pick-up leaves it alone)
        if turn is not None:
            why = await turn.steer(row.text)
        if why is None:
            assert turn is not None
            await self._store.dequeue([row.seq]).committed()
            await self._store.append(
                channel, "system", "status", f"Message {row.seq} was steered into {agent}'s running turn.",
                turn=turn.turn_id, generation=turn.generation,
            )
            return
        self._lanes.requeue([plain], taken_up=True)
        if busy:
            await self._store.append(
                channel, "system", "status", f"Not steered ({why}): message {row.seq} is queued instead.",
                generation=self._ledger.generation(channel),
            )

    def steerable(self, channel: str, targets: tuple[str, ...]) -> tuple[RunningTurn | None, str | None, bool]:
        """The turn a steered message would go to, or why there is none (it is then queued), and
        whether the lane was busy (a fallback then says so in a ``status`` entry too)."""
        if len(targets) != 1:
            return None, "a message to several agents is queued for each", True
        agent = targets[0]
        turn = self._lanes.turns.get((channel, agent))
        if turn is None:
            return None, f"{agent} is not running a turn", self._ledger.is_busy(channel, agent)
        if self._ledger.is_stale(channel, turn.turn_id):
            return None, f"{agent}'s turn is being stopped", True
        if self._ledger.turn_phase(channel, agent) is not Phase.STARTED:
            return None, f"{agent}'s turn has not started yet", True
        return turn, None, True

    async def steer(
        self, channel: str, turn: RunningTurn, author: str, text: str, *, origin: str | None,
        also: Callable[[Any, int], None] | None,
    ) -> Accepted | str:
        """Hand the message to the turn; stored as its human message once written. A string: why not.

        ``origin`` (a bridge's event) is recorded in the entry's transaction, as for a queued message."""
        why = await turn.steer(text)
        if why is not None:
            return why

        def more(db: Any, seq: int) -> None:
            if origin is not None:
                self._store.record_origin(db, origin, seq)
            if also is not None:
                also(db, seq)

        meta: dict[str, object] = {"agent": turn.agent.name, "delivery": "steer", "steered": turn.turn_id}
        if origin is not None:
            meta["origin"] = origin
        entry = await self._store.append(
            channel, author, "message", text, turn=turn.turn_id, generation=turn.generation, meta=meta, also=more,
        )
        log.info("[%s %s] message %d steered into %s's turn", channel, turn.turn_id, entry.seq, turn.agent.name)
        return Accepted(entry.seq, channel, turn.agent.name, turn.generation, 0, (turn.agent.name,), delivery="steer",
                        steered=turn.turn_id)
