"""The supervisor: channel workers, turns, and the stop path, under one nursery.

The stop path is httpcore's pool discipline applied to processes: the ledger decides
synchronously (generation moved, queue dropped, turn made stale), the kill decision is
applied in the same step (cancel the turn's scope, interrupt signal to its group — no
checkpoint in between), and only then does the stop wait: for the turn's shielded
teardown to reap the tree and drain its output, then it cancels the plan's todos and
stores the notice, last.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ._config import AgentConfig, Config
from ._files import private_folder
from ._ledger import QueuedMessage, StopDecision, StopLedger
from ._registry import ProcessRegistry
from ._store import Entry, Pending, QueuedRow, Store, StoreError, open_store
from ._text import BadText, check_message
from ._tree import (
    MarkerScanner,
    ProcessTree,
    is_child_subreaper,
    reap_if_child,
    reap_orphans,
    set_child_subreaper,
    wait_pid_exit,
)
from ._turn import Turn, channel_slug, new_turn_id, unfinished

log = logging.getLogger("corral")

STOP_NOTICE = "Execution stopped by user."
SHUTDOWN_NOTICE = "Task interrupted — daemon restarting. Send another message to continue."
NUDGE_TEXT = "You have {n} remaining task(s) in your plan. Please continue working on them."
MAX_MESSAGE_BYTES = 1 << 20
MAX_CHANNEL_CHARS = 200
#: What a stop may add on top of the grace period before it calls itself failed.
STOP_SLACK = 10.0


class UsageError(ValueError):
    """A request the supervisor refuses: unknown agent, oversized message, bad channel name."""


class ShuttingDown(RuntimeError):
    """The supervisor no longer accepts work."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """A message the supervisor has stored and queued."""

    seq: int
    channel: str
    agent: str
    generation: int
    queued: int
    """Messages ahead of it in the channel (including a running turn)."""

    def to_json(self) -> dict[str, Any]:
        """As the API and ``corral send --json`` print it."""
        return {"seq": self.seq, "channel": self.channel, "agent": self.agent, "generation": self.generation, "queued": self.queued}


@dataclass(slots=True)
class StopResult:
    """What one channel's stop did."""

    channel: str | None
    generation: int
    repeat: bool = False
    stopped_turns: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    swept: list[int] = field(default_factory=list)
    dropped: int = 0
    notice_seq: int | None = None
    elapsed_ms: float = 0.0
    ok: bool = True
    error: str | None = None
    channels: list[StopResult] | None = None

    def to_json(self) -> dict[str, Any]:
        """As the API and ``corral stop --json`` print it."""
        out: dict[str, Any] = {
            "channel": self.channel,
            "generation": self.generation,
            "repeat": self.repeat,
            "stopped_turns": self.stopped_turns,
            "killed": self.killed,
            "swept": self.swept,
            "dropped": self.dropped,
            "notice_seq": self.notice_seq,
            "elapsed_ms": round(self.elapsed_ms, 3),
            "ok": self.ok,
            "error": self.error,
        }
        if self.channels is not None:
            out["channels"] = [c.to_json() for c in self.channels]
        return out


@dataclass(slots=True)
class _Message:
    """The payload the ledger carries for a queued message."""

    agent: str
    author: str
    text: str
    committed: Any  # Pending | None (restored messages are already stored)


@dataclass(slots=True)
class Hooks:
    """Points where a test can park a turn to drive a race deterministically.

    Each is an optional ``async (channel, turn_id) -> None`` awaited at that point; ``spawn``
    replaces the spawner (same signature as :func:`supervisor._tree.spawn`). Production
    code passes none, and then no extra checkpoint exists.
    """

    took: Any = None
    """After the worker took a message off the queue, before the turn is built."""
    preparing: Any = None
    """Inside the turn, after the launch is built, right before the point of no return."""
    spawn: Any = None


class Supervisor:
    """Runs agents for channels. Make one with :func:`open_supervisor`."""

    def __init__(self, config: Config, store: Store, nursery: trio.Nursery, hooks: Hooks | None = None) -> None:
        self.hooks = hooks or Hooks()
        self.reap_adopted = False
        """Every child of this process is corral's: reap dead adoptees after each turn."""
        self.spawning = 0
        """Spawns in flight (their children exist before Trio can wait for them)."""
        self._reap_scheduled = False
        self.config = config
        self.store = store
        self.ledger = StopLedger(max_nudges=config.limits.max_nudges)
        self.registry = ProcessRegistry(self.ledger)
        self.scanner = MarkerScanner(elsewhere=lambda wanted: self.registry.leader_pids())
        self.started = time.time()
        self._nursery = nursery
        self._workers: set[str] = set()
        self._turns: dict[str, Turn] = {}
        self._stops: dict[str, trio.Event] = {}
        self._idle: dict[str, trio.Event] = {}
        self._closing = False

    # ------------------------------------------------------------ places

    def agent_home(self, agent: str) -> Path:
        """The private HOME of an agent (its CLI writes its state there)."""
        return self.config.state_dir / "home" / agent

    def channel_cwd(self, channel: str, agent: AgentConfig) -> Path:
        """The fixed working directory of this channel and agent (created on first use).

        The real CLIs resume a session only from the directory it was started in.
        """
        _, saved = self.store.session(channel, agent.name)
        configured = Path(saved) if saved else agent.cwd
        if configured is not None:  # the user's folder: created if missing, never re-moded
            configured.mkdir(parents=True, exist_ok=True)
            return configured
        path = self.config.state_dir / "work" / agent.name / channel_slug(channel)
        private_folder(path, within=self.config.state_dir)
        return path

    # ------------------------------------------------------------ sending

    async def send(self, channel: str, text: str, *, agent: str | None = None, author: str = "human:user") -> Accepted:
        """Store and queue a message; returns once it is committed.

        Raises :class:`UsageError` for bad input and :class:`StoreError` if it could not be
        stored (then it will not run either).
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
        if not (author.startswith("human:") and len(author) > 6) and author != "system":
            raise UsageError(f"author must be 'human:NAME', got {author!r}")
        try:
            agent_config = self.config.agent(agent)
        except KeyError:
            raise UsageError(f"unknown agent {agent!r}; configured: {', '.join(self.config.agents)}") from None
        return await self._accept(channel, agent_config.name, author, text, nudge=False).accepted_now()

    def _accept(self, channel: str, agent: str, author: str, text: str, *, nudge: bool) -> _Acceptance:
        # Stamping (ledger) and seq (store) happen in one synchronous step: their orders agree.
        generation = self.ledger.generation(channel)
        store = self.store

        def keep_queued(db: Any, seq: int) -> None:
            # In the entry's own transaction: stored and queued, or neither.
            store.queue_insert(db, QueuedRow(seq, channel, agent, author, text, generation, nudge))

        pending = store.submit_entry(
            channel, author, "message", text, generation=generation,
            meta={"agent": agent, **({"nudge": True} if nudge else {})}, also=keep_queued,
        )
        assert pending.entry is not None
        seq = pending.entry.seq
        ahead = len(self.ledger.queued(channel)) + (1 if self.ledger.current_turn(channel) else 0)
        self.ledger.accept(
            channel, seq, human=author.startswith("human:"), nudge=nudge, payload=_Message(agent, author, text, pending)
        )
        self._ensure_worker(channel)
        return _Acceptance(Accepted(seq, channel, agent, generation, ahead), pending)

    def _ensure_worker(self, channel: str) -> None:
        if channel not in self._workers and not self._closing:
            self._workers.add(channel)
            self._nursery.start_soon(self._worker, channel, name=f"corral-worker:{channel}")

    # ------------------------------------------------------------ workers and turns

    async def _worker(self, channel: str) -> None:
        """Run the channel's queued messages one turn at a time; exit when idle."""
        try:
            while not self._closing:
                take = self.ledger.take(channel, new_turn_id())
                if take.dropped:
                    self.store.dequeue([m.id for m in take.dropped])
                if take.ticket is None:
                    break
                message: _Message = take.ticket.message.payload  # type: ignore[assignment]
                self.store.dequeue([take.ticket.message.id])
                if self.hooks.took is not None:
                    await self.hooks.took(channel, take.ticket.turn_id)
                try:
                    await self._run_turn(channel, take.ticket, message)
                except Exception as exc:  # noqa: BLE001 - a bug in one turn must not stop the others
                    await self._contain(channel, take.ticket, exc)
        finally:
            self._workers.discard(channel)
            event = self._idle.pop(channel, None)
            if event is not None:
                event.set()

    async def _run_turn(self, channel: str, ticket: Any, message: _Message) -> None:
        agent = self.config.agents.get(message.agent)
        turn_id = ticket.turn_id
        if agent is None:  # a restored message for an agent removed from the config
            await self._end_turn_early(channel, turn_id, ticket.generation, f"agent {message.agent!r} is no longer configured")
            return
        turn = Turn(self, channel, ticket, agent, message.text)
        self._turns[channel] = turn
        try:
            if message.committed is not None:
                try:
                    await message.committed.committed()
                except StoreError:
                    turn.done.set()
                    self.ledger.end_turn(channel, turn_id, ok=False, unfinished_todos=0)
                    return
            session_id, _ = self.store.session(channel, agent.name)
            outcome = await turn.run(session_id)
            if outcome.stale_session and session_id and not outcome.stopped and not self.ledger.is_stale(channel, turn_id):
                # The CLI forgot the session: drop it and try once more without it.
                self.store.save_session(channel, agent.name, None, turn.cwd)
                self.store.submit_entry(
                    channel, "system", "status", f"Session {session_id} is gone; starting a new conversation.",
                    turn=turn_id, generation=ticket.generation,
                )
                retry = Turn(self, channel, ticket, agent, message.text)
                self._turns[channel] = retry
                turn.done.set()
                turn = retry
                outcome = await retry.run(None)
            items = self.store.todos(channel, agent.name)
            decision = self.ledger.end_turn(
                channel, turn_id, ok=outcome.ok, unfinished_todos=unfinished(items), max_nudges=agent.limits.max_nudges
            )
            if decision.nudge:
                self._accept(channel, agent.name, "system", NUDGE_TEXT.format(n=unfinished(items)), nudge=True)
        finally:
            if self._turns.get(channel) is turn:
                del self._turns[channel]
            turn.done.set()
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
        if self.reap_adopted and self.spawning == 0:
            reaped = reap_orphans(self.registry.leader_pids())
            if reaped:
                log.debug("reaped adopted processes %s", reaped)

    async def _contain(self, channel: str, ticket: Any, exc: Exception) -> None:
        """A turn failed in corral itself: log it, say so, and free the channel."""
        log.exception("[%s %s] internal error", channel, ticket.turn_id, exc_info=exc)
        if self.ledger.current_turn(channel) == ticket.turn_id:
            self.ledger.end_turn(channel, ticket.turn_id, ok=False, unfinished_todos=0)
        try:
            await self.store.append(
                channel, "system", "error", f"Internal error in corral: {exc!r} (see the daemon's log).",
                turn=ticket.turn_id, generation=ticket.generation,
            )
        except StoreError:
            pass

    async def _end_turn_early(self, channel: str, turn_id: str, generation: int, why: str) -> None:
        self.ledger.end_turn(channel, turn_id, ok=False, unfinished_todos=0)
        await self.store.append(channel, "system", "error", why, turn=turn_id, generation=generation)

    def adopt_background(self, tree: ProcessTree) -> None:
        """Keep a normal turn's background processes, and reap any that become ours."""
        for ident in tree.known:
            if ident.pid != tree.pid and ident.matches():
                self._nursery.start_soon(self._reap_when_gone, ident.pid)

    async def _reap_when_gone(self, pid: int) -> None:
        if await wait_pid_exit(pid):
            reap_if_child(pid)

    # ------------------------------------------------------------ stopping

    async def stop(self, channel: str | None = None) -> StopResult:
        """Stop one channel (or every busy channel); returns when the stop is complete."""
        if channel is None:
            return await self.stop_all()
        check_channel(channel)
        started = trio.current_time()
        decision = self.ledger.stop(channel)  # first act: the generation moves now
        # The stop's seq is taken in the same step: on the server clock it precedes every
        # message accepted after it, even those accepted while the turn winds down.
        stop_seq = None if decision.repeat else self.store.next_seq()
        turn = self._apply(decision, reason="user")
        return await self._complete(decision, turn, started, stop_seq)

    async def stop_all(self) -> StopResult:
        """Stop every channel that has work; the result lists each."""
        started = trio.current_time()
        decisions = self.ledger.stop_all()
        applied = [
            (d, None if d.repeat else self.store.next_seq(), self._apply(d, reason="user")) for d in decisions
        ]
        results: list[StopResult] = [None] * len(applied)  # type: ignore[list-item]

        async def one(i: int, decision: StopDecision, stop_seq: int | None, turn: Turn | None) -> None:
            results[i] = await self._complete(decision, turn, started, stop_seq)

        async with trio.open_nursery() as nursery:
            for i, (decision, stop_seq, turn) in enumerate(applied):
                nursery.start_soon(one, i, decision, stop_seq, turn)
        total = StopResult(channel=None, generation=0, channels=results)
        for r in results:
            total.stopped_turns += r.stopped_turns
            total.killed += r.killed
            total.swept += r.swept
            total.dropped += r.dropped
            total.ok = total.ok and r.ok
        total.error = "; ".join(r.error for r in results if r.error) or None
        total.elapsed_ms = (trio.current_time() - started) * 1000
        log.info("stop all: %d channel(s), killed %s, swept %s, %.1f ms", len(results), total.killed, total.swept, total.elapsed_ms)
        return total

    def _apply(self, decision: StopDecision, *, reason: str) -> Turn | None:
        """Carry out the kill decision at once: no checkpoint since the ledger decided."""
        if decision.repeat:
            return None
        if decision.dropped:
            self.store.dequeue([m.id for m in decision.dropped])
        turn = self._turns.get(decision.channel)
        if turn is None or turn.turn_id != decision.stopped_turn:
            return None
        turn.stop_reason = reason
        turn.scope.cancel()
        self.registry.interrupt(decision.channel, turn.turn_id, turn.adapter.interrupt_signal)
        return turn

    async def _complete(
        self, decision: StopDecision, turn: Turn | None, started: float, stop_seq: int | None = None
    ) -> StopResult:
        channel = decision.channel
        result = StopResult(channel, decision.generation, repeat=decision.repeat, dropped=len(decision.dropped))
        if decision.repeat:
            pending = self._stops.get(channel)
            if pending is not None:
                await pending.wait()
            result.notice_seq = self.ledger.notice_seq(channel)
            result.elapsed_ms = (trio.current_time() - started) * 1000
            log.info("stop %r: repeat of generation %d, nothing to do", channel, decision.generation)
            return result
        done = self._stops[channel] = trio.Event()
        try:
            if turn is not None:
                result.stopped_turns.append(turn.turn_id)
                budget = turn.agent.limits.stop_grace + STOP_SLACK
                with trio.move_on_after(budget):
                    await turn.done.wait()
                if not turn.done.is_set():
                    result.ok = False
                    result.error = f"turn {turn.turn_id} did not finish within {budget:g} s"
                report = turn.outcome.report
                result.killed, result.swept = list(report.killed), list(report.swept)
                if report.survivors:
                    result.ok = False
                    result.error = f"processes {report.survivors} could not be confirmed dead"
            elif decision.stopped_turn is not None:
                result.stopped_turns.append(decision.stopped_turn)
            # The cancelled plan, the notice and the stop's record go into one commit: they
            # are submitted back to back and awaited together.
            writes = self._cancel_todos(channel, decision.generation)
            text = STOP_NOTICE if result.ok else f"Stopping failed — {result.error}."
            if stop_seq is None:
                stop_seq = self.store.next_seq()
            notice = self.store.submit_entry(
                channel, "system", "notice", text, turn=decision.stopped_turn, generation=decision.generation,
                meta={"stop_seq": stop_seq, "ok": result.ok},
            )
            assert notice.entry is not None
            result.notice_seq = notice.entry.seq
            result.elapsed_ms = (trio.current_time() - started) * 1000
            writes += [notice, self.store.record_stop(stop_seq, channel, decision.generation, result.to_json())]
            for write in writes:
                await write.committed()
            # Only a stored notice may be named (to the caller, or to a repeat of this stop).
            self.ledger.notice_stored(channel, decision.generation, notice.entry.seq)
        except StoreError as exc:
            result.ok = False
            result.notice_seq = None
            result.error = f"the stop could not be stored: {exc}"
        finally:
            done.set()
            if self._stops.get(channel) is done:
                del self._stops[channel]
        result.elapsed_ms = (trio.current_time() - started) * 1000
        log.info(
            "stop %r: generation %d, turns %s, killed %s, swept %s, dropped %d, %.1f ms%s",
            channel, decision.generation, result.stopped_turns, result.killed, result.swept, result.dropped,
            result.elapsed_ms, "" if result.ok else f", FAILED: {result.error}",
        )
        return result

    def _cancel_todos(self, channel: str, generation: int) -> list[Pending]:
        """Mark the channel's unfinished todos cancelled; returns the writes to await."""
        writes: list[Pending] = []
        for agent in self.store.todo_agents(channel):
            items = self.store.todos(channel, agent)
            if not unfinished(items):
                continue
            for item in items:
                if item["status"] in ("pending", "in_progress"):
                    item["status"] = "cancelled"
            writes.append(self.store.save_todos(channel, agent, items))
            writes.append(
                self.store.submit_entry(
                    channel, "system", "todos", f"Plan cancelled ({agent}).", generation=generation,
                    meta={"todos": items, "agent": agent},
                )
            )
        return writes

    # ------------------------------------------------------------ observing

    async def wait_idle(self, channel: str, timeout: float | None = None) -> bool:
        """Wait until the channel runs no turn and has nothing queued; False on timeout."""
        check_channel(channel)
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            while channel in self._workers or self.ledger.is_busy(channel):
                event = self._idle.setdefault(channel, trio.Event())
                await event.wait()
            return True
        return False

    def follow(self, channel: str | None, after: int = 0) -> AsyncIterator[Entry]:
        """Committed entries of a channel after ``after``, then live ones as they commit."""
        return self.store.follow(channel, after)

    async def entries(self, channel: str, after: int = 0, limit: int = 10_000) -> list[Entry]:
        """Committed entries of a channel after ``after``."""
        return await self.store.entries(channel, after=after, limit=limit)

    def status(self) -> dict[str, Any]:
        """Agents, channels, running turns, at this instant."""
        channels: dict[str, Any] = {}
        sessions = self.store.sessions_by_channel()
        for name in sorted(self.ledger.channels()):
            turn = self._turns.get(name)
            phase = self.ledger.turn_phase(name)
            channels[name] = {
                "generation": self.ledger.generation(name),
                "queued": len(self.ledger.queued(name)),
                "sessions": sessions.get(name, {}),
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
        return {
            "pid": os.getpid(),
            "started": self.started,
            "uptime": time.time() - self.started,
            "config": str(self.config.path) if self.config.path else None,
            "store": str(self.config.store_path),
            "agents": {
                name: {"adapter": a.adapter, "command": list(a.command), "model": a.model}
                for name, a in self.config.agents.items()
            },
            "channels": channels,
            "running": sum(1 for c in channels.values() if c["turn"]),
            "shutting_down": self._closing,
        }

    # ------------------------------------------------------------ restart and shutdown

    async def restore(self) -> int:
        """Re-queue what a previous run accepted but never ran; returns how many."""
        for channel, generation in (await self.store.load_generations()).items():
            self.ledger.restore(channel, generation)
        rows = await self.store.load_queue()
        for row in rows:
            self.ledger.requeue(
                row.channel,
                QueuedMessage(row.seq, row.generation, row.author.startswith("human:"), row.nudge,
                              _Message(row.agent, row.author, row.text, None)),
            )
            self._ensure_worker(row.channel)
        return len(rows)

    async def shutdown(self) -> None:
        """End every running turn as "interrupted by a restart"; keep queues, todos, sessions."""
        self._closing = True
        turns = list(self._turns.values())
        for turn in turns:
            turn.stop_reason = "shutdown"
            turn.scope.cancel()
            if turn.tree is not None:
                turn.tree.interrupt(turn.adapter.interrupt_signal)
        async with trio.open_nursery() as nursery:
            for turn in turns:
                nursery.start_soon(self._finish_shutdown_turn, turn)
        self._reap_now()

    async def _finish_shutdown_turn(self, turn: Turn) -> None:
        with trio.move_on_after(turn.agent.limits.stop_grace + STOP_SLACK):
            await turn.done.wait()
        try:
            await self.store.append(turn.channel, "system", "notice", SHUTDOWN_NOTICE, turn=turn.turn_id, generation=turn.generation)
        except StoreError as exc:
            log.error("could not store the shutdown notice in %r: %s", turn.channel, exc)


@dataclass(slots=True)
class _Acceptance:
    accepted: Accepted
    pending: Any

    async def accepted_now(self) -> Accepted:
        await self.pending.committed()
        return self.accepted


def check_channel(channel: object) -> None:
    """Raise :class:`UsageError` unless ``channel`` is a usable channel name."""
    if not isinstance(channel, str) or not channel or len(channel) > MAX_CHANNEL_CHARS:
        raise UsageError(f"a channel is a name of 1 to {MAX_CHANNEL_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in channel):
        raise UsageError("a channel name cannot contain control characters")
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
        async with open_store(str(config.store_path)) as store:
            async with trio.open_nursery() as nursery:
                sup = Supervisor(config, store, nursery, hooks)
                sup.reap_adopted = bool(subreaper and owns_children)
                if subreaper:
                    # Every escaped descendant of a turn re-parents to this process, so the
                    # marker scan need not read the whole of /proc.
                    sup.scanner.within = os.getpid()
                await sup.restore()
                try:
                    yield sup
                finally:
                    with trio.CancelScope(shield=True):
                        await sup.shutdown()
                    nursery.cancel_scope.cancel()
    finally:
        if restore_subreaper:
            set_child_subreaper(False)
