"""The stopper: a stop's record, its kill, its notice — and the one kill step a lost lease and
shutdown share.

Theory of operation
-------------------

The stop path is httpcore's pool discipline applied to processes: the ledger decides
synchronously (generation moved, queue dropped, turn made stale); then ONE transaction
stores the stop's record — generation, the dequeue and mark of every dropped message, the
cancelled plan — so that a crash, a signal or a full disk after it can never undo the
stop (contract 17) (:meth:`Stopper.record`, in the step the ledger decided). Only once it
is committed is the kill applied (:meth:`Stopper.kill`: cancel the turn's scope, interrupt
signal to its group — no checkpoint between the decision and the signal); then the stop
waits for the turn's shielded teardown to reap the tree and drain its output, and stores
the notice, last. A record that cannot be stored fails the stop before anything is killed:
``ledger.abort_stop`` puts the channel back as it was.

A stop is channel-wide: one decision names every running turn of the channel; all of them
are signalled in one synchronous pass, waited for together, and then ONE notice is stored,
last. A stop-all is one batch of decisions with one record write, and its notices one more:
each channel's stop waits at a gate until every channel of the batch has ended its turns,
then all submit their notices in the same step, so the group commit stores them together.
A stopped turn's usage row (``turn_usage``) waits for its stop's notice and is submitted in
that step too (:meth:`Stopper._hold_usage`): a stop, or a stop-all of any size, is two commits.

:meth:`Stopper.kill` is the one kill step: a stop (the adapter's interrupt signal, then the
teardown's grace), a lost lease (SIGKILL, no grace: the channel is no longer this host's to
stop politely) and a shutdown (as a stop, but no generation moves and nothing is dropped)
all end their turns through it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from ..config.settings import Config
from ..core.account import cancelled
from ..core.budget import BudgetSpent, turn_cost
from ..core.ledger import QueuedMessage, StopDecision, StopLedger
from ..core.results import SHUTDOWN_NOTICE, STOP_NOTICE, STOP_SLACK, StopResult, plan_cancelled_text, stop_notice_text
from ..procs.cgroup import CgroupRoot
from ..procs.registry import ProcessRegistry
from ..procs.teardown import CollectorPause, TreeBatch
from ..store.store import Pending, StopRecord, Store, StoreError
from ..turns.ports import RunningTurn
from .lanes import Lanes
from .ownership import Ownership

log = logging.getLogger("corral")


class Stopper:
    """Every stop of this host, and the kill step (see the module's theory)."""

    def __init__(
        self, config: Config, store: Store, ledger: StopLedger, *, registry: ProcessRegistry, lanes: Lanes,
        ownership: Ownership, cgroups: CgroupRoot | None, collector: CollectorPause | contextlib.nullcontext[None],
        nursery: trio.Nursery | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._ledger = ledger
        self._registry = registry
        self._lanes = lanes
        self._ownership = ownership
        self._cgroups = cgroups
        self._collector = collector
        """Pauses the garbage collector during stops, where the process is corral's (see ``procs.teardown``)."""
        self.stops: dict[str, _StopInProgress] = {}
        """Stops between their decision and their end, by channel."""
        self._nursery = nursery
        """Where a stop no caller waits for (a spent budget's) is carried out."""
        self.budget_stops: list[StopResult] = []
        """The results of the budget stops carried out (the last few, for the log and the tests)."""
        lanes.hold_usage = self._hold_usage

    def recording(self, channel: str) -> bool:
        """Is the channel's stop's record being stored right now (the registry freezes a late registration)?"""
        progress = self.stops.get(channel)
        return progress is not None and not progress.recorded

    async def stop(self, channel: str, started: float, cpu: float) -> StopResult:
        """Stop one channel this host runs: decide (the generation moves now, the first act),
        submit the record in the same step, then carry it out."""
        decision = self._ledger.stop(channel)  # first act: the generation moves now
        result = (await self.carry_out(self.record([decision]), started))[0]
        result.cpu_ms = (time.process_time() - cpu) * 1000
        return result

    async def stop_all(self) -> StopResult:
        """Stop every channel that has work; the result lists each."""
        started, cpu = trio.current_time(), time.process_time()
        results = await self.carry_out(self.record(self._ledger.stop_all()), started)
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

    def budget_stop(self, channel: str, turn_id: str, spent: BudgetSpent) -> None:
        """A turn's budget ran out: the channel is stopped as a stop stops it (generation moved,
        queue dropped, record stored, tree killed, the plan cancelled), and its one notice is the
        budget's ("Stopped: this turn used 51,200 of its 50,000 tokens."). Decided and recorded
        in the caller's step — the turn's, the report that spent the budget — then carried out
        in the background: nobody waits for it."""
        assert self._nursery is not None, "a budget stop needs the supervisor's nursery"
        if self._ledger.is_stale(channel, turn_id):
            return  # (already stopped: that stop's notice is the one)
        batch = self.record([self._ledger.stop(channel)], notice=spent.notice, reason="budget")
        log.info("stop %r: turn %s spent its budget: %s", channel, turn_id, spent.notice)
        self._nursery.start_soon(self._carry_out_budget, batch, self._lanes.built(channel, turn_id), spent,
                                 trio.current_time())

    async def _carry_out_budget(
        self, batch: _StopBatch, turn: RunningTurn | None, spent: BudgetSpent, started: float,
    ) -> None:
        results = await self.carry_out(batch, started)
        self.budget_stops = [*self.budget_stops[-15:], *results]
        if turn is not None and turn.done.is_set():
            # How far past its budget the turn got before it was dead (docs/performance.md).
            usage = turn.outcome.usage
            limits = self._config.turn_limits(turn.channel, turn.agent.name)
            log.info("budget stop %r: turn %s at the decision: %s %s of %s; once dead: %d tokens, %d tool calls, "
                     "cost %s %s", turn.channel, turn.turn_id, spent.budget, spent.used, spent.limit, usage.tokens,
                     usage.tool_calls, turn_cost(usage, self._config.prices, limits.currency), limits.currency)

    def record(self, decisions: list[StopDecision], *, notice: str | None = None, reason: str = "user") -> _StopBatch:
        """Submit the record of every fresh stop as one write, in the step the ledger decided.

        The stop's seq is taken here too: on the server clock it precedes every message
        accepted after it, even those accepted while the turn winds down.
        """
        batch = _StopBatch(decisions, notice=notice, reason=reason)
        records = []
        for decision in decisions:
            if decision.repeat:
                continue
            self._lanes.capacity.drop(decision.channel)  # (its waiters wake to an emptied queue)
            self._lanes.wake_daily(decision.channel)  # (and those a spent daily budget holds)
            # What the stopped turns were still writing is saved as it stood, before the stop's
            # seq and so before its notice: the boundary is this decision (contract line 18).
            for _, turn_id in decision.stopped_turns:
                if (turn := self._lanes.built(decision.channel, turn_id)) is not None:
                    turn.cut_off("stop")
            seq = self._store.next_seq()
            plans = self._cancelled_plans(decision.channel)
            batch.seqs[decision.channel] = seq
            batch.plans[decision.channel] = plans
            batch.progress[decision.channel] = self.stops[decision.channel] = _StopInProgress(
                plans, frozenset(turn_id for _, turn_id in decision.stopped_turns))
            records.append(
                StopRecord(seq, decision.channel, decision.generation, tuple(m.id for m in decision.dropped),
                           tuple(turn_id for _, turn_id in decision.stopped_turns), plans)
            )
        batch.write = self._store.submit_stop_records(records) if records else None
        return batch

    async def carry_out(self, batch: _StopBatch, started: float) -> list[StopResult]:
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
                self._lanes.done_with(m.id for d in batch.decisions if not d.repeat for m in d.dropped)
            else:
                for decision in batch.decisions:
                    if not decision.repeat:
                        self._ledger.abort_stop(decision)
            # No checkpoint from here to the last signal: the kill follows the commit at once.
            for channel, progress in batch.progress.items():
                progress.recorded = True
                self._registry.settle(channel)
            fresh = [d for d in batch.decisions if not d.repeat]
            turns = {} if failure else {
                d.channel: self.kill(((d.channel, turn_id) for _, turn_id in d.stopped_turns), batch.reason)
                for d in fresh
            }
            together = self._end_together(turn for stopped in turns.values() for turn in stopped)
            results: list[StopResult | None] = [None] * len(batch.decisions)
            gate = _Gate(len(turns)) if len(turns) > 1 else None  # (a stop-all's notices: one commit)

            async def one(i: int, decision: StopDecision) -> None:
                if decision.repeat:
                    results[i] = await self._repeat(decision, started)
                elif failure is not None:
                    results[i] = self._failed(decision, batch.progress[decision.channel], failure, started)
                else:
                    results[i] = await self._complete(
                        decision, turns[decision.channel], started, batch.seqs[decision.channel],
                        batch.progress[decision.channel], batch.notice or STOP_NOTICE, gate,
                    )

            async with trio.open_nursery() as nursery:
                if together is not None:
                    nursery.start_soon(together.run)
                for i, decision in enumerate(batch.decisions):
                    nursery.start_soon(one, i, decision)
        done = [r for r in results if r is not None]
        assert len(done) == len(results), "every decision has its result"
        return done

    def _end_together(self, turns: Iterable[RunningTurn]) -> TreeBatch | None:
        """One batch ends the cgroup trees of the stopped turns, all at once (see ``procs.teardown``).

        An ACP turn's tree is its agent's, which outlives the turn: its stop is the agent's
        own cancel sequence, never this batch.
        """
        watcher = self._cgroups.watcher if self._cgroups is not None else None
        if watcher is None or not watcher.running:
            return None
        together = TreeBatch(watcher)
        for turn in turns:
            if turn.own_tree is not None:
                together.add(turn.own_tree, turn.stop_grace)
        return together if len(together) else None

    def _hold_usage(self, turn: RunningTurn) -> bool:
        """A turn this channel's stop ended, ending before its notice is submitted: its usage
        row waits for the notice and goes in the same commit (:meth:`_release_usage`)."""
        progress = self.stops.get(turn.channel)
        if progress is None or progress.noticed or turn.turn_id not in progress.turns:
            return False
        progress.usage.append(turn)
        return True

    def _release_usage(self, progress: _StopInProgress) -> None:
        """Submit the usage rows the stop held (right before its notice: one commit), and hold no more."""
        progress.noticed = True
        for turn in progress.usage:
            self._lanes.store_usage(turn)  # (once: a turn whose usage line was shown is stored already)
        progress.usage.clear()

    def _failed(self, decision: StopDecision, progress: _StopInProgress, error: str, started: float) -> StopResult:
        """The record could not be stored (the ledger's stop is undone); nothing was killed."""
        self._release_usage(progress)
        result = StopResult(decision.channel, decision.generation - 1, ok=False, error=error)
        result.elapsed_ms = (trio.current_time() - started) * 1000
        progress.finish(self.stops, decision.channel, result)
        log.error("stop %r: FAILED before killing anything: %s", decision.channel, error)
        return result

    async def _repeat(self, decision: StopDecision, started: float) -> StopResult:
        channel = decision.channel
        result = StopResult(channel, decision.generation, repeat=True)
        progress = self.stops.get(channel)
        if progress is not None:
            await progress.done.wait()
            if progress.result is not None and not progress.result.ok:
                result.ok, result.error = False, progress.result.error
                result.generation = progress.result.generation
        result.notice_seq = self._ledger.notice_seq(channel)
        result.elapsed_ms = (trio.current_time() - started) * 1000
        log.info("stop %r: repeat of generation %d, nothing to do", channel, decision.generation)
        return result

    def kill(
        self, turns: Iterable[tuple[str, str]], reason: str, sig: signal.Signals | None = None, *,
        cut_off: bool = False,
    ) -> list[RunningTurn]:
        """The one kill step, for a stop, a lost lease and a shutdown alike: every named
        ``(channel, turn id)`` that is built is told why it ends, its scope cancelled and its
        group signalled (``sig``, else its adapter's interrupt signal), all in one pass with
        no checkpoint from the decision to the last signal. A turn not built yet (parked
        after its take) is skipped: the ledger already says it is stale, so it never starts.
        ``cut_off``: first save what the turn was still writing, as it stood (a shutdown; a
        stop did so when it was recorded)."""
        killed: list[RunningTurn] = []
        for channel, turn_id in turns:
            turn = self._lanes.built(channel, turn_id)
            if turn is None:
                continue  # not built yet (parked after the take): it never starts
            if cut_off:
                turn.cut_off(reason)  # (its text so far, saved as it stood: contract line 18)
            turn.stop_reason = reason
            turn.scope.cancel()
            self._registry.interrupt(channel, turn_id, turn.adapter.interrupt_signal if sig is None else sig)
            killed.append(turn)
        return killed

    async def _complete(
        self, decision: StopDecision, turns: list[RunningTurn], started: float, stop_seq: int,
        progress: _StopInProgress, notice_text: str = STOP_NOTICE, gate: _Gate | None = None,
    ) -> StopResult:
        channel = decision.channel
        result = StopResult(channel, decision.generation, dropped=len(decision.dropped))
        built = {turn.turn_id: turn for turn in turns}
        try:
            # Every turn was signalled at once; their teardowns run in their own tasks, so
            # waiting on each in turn under one deadline waits for all of them together.
            budget = max((turn.stop_grace for turn in turns), default=0.0) + STOP_SLACK
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
                if stopped.adapter.runs == "persistent":
                    account["ended"] = stopped.ended
                    # With several ACP turns, one killed outright makes the stop "killed".
                    result.ended = "killed" if "killed" in (result.ended, stopped.ended) else stopped.ended
                if report.survivors:
                    result.ok = False
                    result.error = f"processes {report.survivors} could not be confirmed dead"
            silent = self._ownership.unconfirmed(channel)
            if silent is not None:
                result.ok = False
                result.error = silent
            if gate is not None:
                await gate.passed()  # (every channel of the stop-all is here: the notices go in one step)
            # What each turn spent, the plan's entries and the notice, last; the notice's commit
            # completes the record.
            spent = (self._lanes.usage_before_notice(channel, t) for t in turns if t.done.is_set())
            writes = [w for w in spent if w is not None]
            writes += self._plan_entries(channel, decision.generation, progress.plans)
            text = (
                stop_notice_text(notice_text, result.dropped) if result.ok else f"Stopping failed — {result.error}."
            )
            result.elapsed_ms = (trio.current_time() - started) * 1000
            final = result.to_json()
            self._release_usage(progress)  # (the stopped turns' usage rows: in the notice's commit)
            notice = self._store.submit_stop_notice(
                channel, text, stop_seq=stop_seq, turn=decision.stopped_turn, generation=decision.generation,
                result=final, turns=tuple(turn_id for _, turn_id in decision.stopped_turns),
                dropped_entries=dropped_entries(decision.dropped),
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
            self._release_usage(progress)  # (held rows are never lost, whatever failed)
            progress.finish(self.stops, channel, result)
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
            items = cancelled(self._store.todos(channel, agent))
            if items is not None:
                plans[agent] = items
        return plans

    def _plan_entries(self, channel: str, generation: int, plans: dict[str, list[dict[str, str]]]) -> list[Pending]:
        """The transcript's account of the cancelled plans (the plans were stored with the record)."""
        return [
            self._store.submit_entry(
                channel, "system", "todos", plan_cancelled_text(agent), generation=generation,
                meta={"todos": items, "agent": agent},
            )
            for agent, items in plans.items()
        ]

    async def shutdown(self) -> None:
        """End every running turn as "interrupted by a restart"; keep queues, todos, sessions.

        Stops in progress are not interrupted: they finish (each within its own budget), so
        their callers get their results and their notices are stored.
        """
        self._lanes.closing = True
        decision = self._ledger.shut_down()  # every running turn is silenced now
        self._lanes.capacity.drop_all()  # (waiting workers see the shutdown; their messages stay queued)
        self._lanes.wake_daily()
        # No checkpoint from the decision to the last signal.
        turns = self.kill(decision.turns, "shutdown", cut_off=True)
        async with trio.open_nursery() as nursery:
            for turn in turns:
                nursery.start_soon(self._finish_shutdown_turn, turn)
            for progress in list(self.stops.values()):
                nursery.start_soon(progress.done.wait)
        await self._lanes.acp.close_all()  # after the turns: each cancelled its own prompt first
        self._lanes.reap_now()

    async def _finish_shutdown_turn(self, turn: RunningTurn) -> None:
        with trio.move_on_after(turn.stop_grace + STOP_SLACK):
            await turn.done.wait()
        try:
            if turn.done.is_set():
                self._lanes.usage_before_notice(turn.channel, turn)
            await self._store.submit_turn_notice(
                turn.channel, SHUTDOWN_NOTICE, turn=turn.turn_id, generation=turn.generation
            ).committed()
        except StoreError as exc:
            log.error("could not store the shutdown notice in %r: %s", turn.channel, exc)


@dataclass(slots=True)
class _StopInProgress:
    """A stop between its decision and its end: repeats and shutdown wait for it."""

    plans: dict[str, list[dict[str, str]]]
    turns: frozenset[str] = frozenset()
    """The turns the stop ended: their usage rows wait for its notice (``Stopper._hold_usage``)."""
    usage: list[RunningTurn] = field(default_factory=list)
    noticed: bool = False
    """The notice is submitted (or the stop is over): a usage row ending later goes alone."""
    recorded: bool = False
    """The record's write is over (committed, or failed and the stop undone)."""
    done: trio.Event = field(default_factory=trio.Event)
    result: StopResult | None = None

    def finish(self, stops: dict[str, _StopInProgress], channel: str, result: StopResult) -> None:
        self.result = result
        self.done.set()
        if stops.get(channel) is self:
            del stops[channel]


class _Gate:
    """Opens once ``count`` tasks have reached it; each then goes on, in the same scheduling step."""

    def __init__(self, count: int) -> None:
        self._left = count
        self._open = trio.Event()

    async def passed(self) -> None:
        """Arrive, and wait until every one of them has."""
        self._left -= 1
        if self._left <= 0:
            self._open.set()
        await self._open.wait()


@dataclass(slots=True)
class _StopBatch:
    """The stops decided in one step (one, or a stop-all's) and their one record write."""

    decisions: list[StopDecision]
    notice: str | None = None
    """The notice instead of "Execution stopped by user." (a spent budget's)."""
    reason: str = "user"
    """Why the turns end (their ``stop_reason``): ``user``, or ``budget``."""
    seqs: dict[str, int] = field(default_factory=dict)
    plans: dict[str, dict[str, list[dict[str, str]]]] = field(default_factory=dict)
    progress: dict[str, _StopInProgress] = field(default_factory=dict)
    write: Pending | None = None


def dropped_entries(dropped: Iterable[QueuedMessage]) -> tuple[int, ...]:
    """The transcript entries of a stop's dropped messages (a second target's row names its entry)."""
    seqs = {getattr(m.payload, "routed_from", None) or m.id for m in dropped}
    return tuple(sorted(seqs))
