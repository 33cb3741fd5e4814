"""One turn: an agent handling one message, from preparation to teardown.

Phases: *prepare* (folders, launch), *start* (the point of no return: the spawn, or the
prompt written on stdin — the ledger is asked right before each), *stream* (stdout lines
through the adapter's parser into the store), *finish* (teardown).

The turn runs inside a cancel scope the supervisor owns: a stop cancels it. Teardown runs
shielded in ``finally`` and always does the same things in the same order: end the
process tree (interrupt, grace, SIGKILL, sweep), drain what the CLI was still flushing —
only until a deadline, since an escaped grandchild can hold the pipe open — keeping only
the session id if the turn was stopped, then report.

A turn sees the supervisor only through its :class:`TurnPorts`: the ledger's questions,
the store's few writes, the registry, the spawner and the places it runs in. What a turn
stores is decided by :class:`~supervisor.core.account.TurnAccount`, pure code from parser events to
:data:`~supervisor.core.account.Effect` values; :class:`Turn` carries the effects out.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol, runtime_checkable

import trio

from adapters import Adapter, get_adapter
from adapters._base import (
    Event,
    Launch,
    Parser,
    TurnRequest,
)

from ..config.settings import AgentConfig
from ..core.account import Effect, Post, SavePlan, SaveSession, ShowDraft, TurnAccount
from ..core.ledger import OutputKind, TurnTicket
from ..procs.cgroup import CgroupRoot
from ..procs.files import private_file, private_folder
from ..procs.hooks import Spawner, TurnHook
from ..procs.lines import Line, LineReader
from ..procs.registry import ProcessRegistry
from ..procs.sandbox import Sandbox, SandboxRefused
from ..procs.tree import (
    STORE_MARKER,
    TURN_MARKER,
    KillReport,
    MarkerScanner,
    ProcessTree,
    scrubbed_environment,
    wait_exited,
)
from ..store.store import Draft, Pending, StoreError

log = logging.getLogger("corral.turn")

#: How long to keep reading a dead CLI's stdout for what it was still flushing.
DRAIN_SECONDS = 0.5
#: A run of whole lines of text (the generic protocol's) the agent has been quiet after this
#: long is stored as it is, rather than held until the next event.
TEXT_QUIET_SECONDS = 0.5
#: Longest stderr line kept in the log.
STDERR_LOG_CHARS = 2000


class TurnLimit(Exception):
    """A stall or turn timeout ended the turn."""


def new_turn_id() -> str:
    """A unique turn id: ``t<supervisor pid>-<ms>-<random>`` (hex).

    The pid says which supervisor a stray process belongs to when several run on a host.
    """
    return f"t{os.getpid():x}-{time.time_ns() // 1_000_000:x}-{secrets.token_hex(3)}"


def channel_slug(channel: str) -> str:
    """A folder name for a channel: readable, safe, and unique (a short hash is appended)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", channel).strip("._")[:48] or "channel"
    return f"{safe}-{hashlib.sha256(channel.encode()).hexdigest()[:8]}"


@dataclass(slots=True)
class TurnOutcome:
    """How a turn ended."""

    ok: bool = False
    stopped: bool = False
    """Ended by a user stop (or shutdown): its leftovers are discarded."""
    error: str | None = None
    report: KillReport = field(default_factory=KillReport)
    stale_session: bool = False


@dataclass(frozen=True, slots=True)
class SessionRetry:
    """The CLI forgot the session: forget it too, say so, and run the turn once more without it."""

    status: str


def retry_without_session(outcome: TurnOutcome, session_id: str | None, *, stale: bool) -> SessionRetry | None:
    """Whether a turn that reported a stale session is run again without it (once)."""
    if outcome.stale_session and session_id and not outcome.stopped and not stale:
        return SessionRetry(f"Session {session_id} is gone; starting a new conversation.")
    return None


# ------------------------------------------------------------ ports


class TurnLedger(Protocol):
    """The ledger's questions a turn asks (all synchronous, all pure)."""

    def may_start(self, channel: str, turn_id: str) -> bool:
        """Asked at the point of no return."""
        ...

    def is_stale(self, channel: str, turn_id: str) -> bool:
        """A stop (or a shutdown) has silenced the turn."""
        ...

    def keep_output(self, channel: str, turn_id: str, kind: OutputKind) -> bool:
        """May this output of the turn be stored?"""
        ...


class TurnStore(Protocol):
    """The store's few writes a turn makes (each accepted at once, committed shortly)."""

    @property
    def store_id(self) -> str:
        """The store's id: every turn process carries it in its environment."""
        ...

    def submit_entry(
        self, channel: str, author: str, kind: str, text: str, *, turn: str | None = None, generation: int = 0,
        meta: Mapping[str, object] | None = None,
    ) -> Pending:
        """A transcript entry."""
        ...

    def save_session(self, channel: str, agent: str, session_id: str | None, cwd: str) -> Pending:
        """The agent's session id for the channel."""
        ...

    def save_todos(self, channel: str, agent: str, items: list[dict[str, str]]) -> Pending:
        """The agent's plan for the channel."""
        ...

    def turn_spawned(self, turn_id: str, pid: int, started: int | None) -> Pending:
        """The turn's process, on its row (recovery finds it by it after a crash)."""
        ...

    def show_draft(self, draft: Draft) -> None:
        """Show text being written to the channel's followers; nothing is stored."""
        ...


@dataclass(frozen=True, slots=True)
class Places:
    """Where agents run: a private HOME and a fixed working folder per channel and agent.

    One HOME per (agent, channel), not per agent: the real CLIs keep every session's
    transcript under HOME, and a turn in one channel must not read another channel's.
    """

    state_dir: Path
    sessions: Callable[[str, str], tuple[str | None, str | None]]
    """``(channel, agent) -> (session id, cwd)`` as stored."""

    def agent_home(self, agent: str, channel: str) -> Path:
        """The private HOME of an agent in a channel (its CLI writes its state there)."""
        return self.state_dir / "home" / agent / channel_slug(channel)

    def channel_cwd(self, channel: str, agent: AgentConfig) -> Path:
        """The fixed working directory of this channel and agent (created on first use).

        The real CLIs resume a session only from the directory it was started in.
        """
        _, saved = self.sessions(channel, agent.name)
        configured = Path(saved) if saved else agent.cwd
        if configured is not None:  # the user's folder: created if missing, never re-moded
            configured.mkdir(parents=True, exist_ok=True)
            return configured
        path = self.state_dir / "work" / agent.name / channel_slug(channel)
        private_folder(path, within=self.state_dir)
        return path


@dataclass(frozen=True, slots=True)
class TurnPorts:
    """Everything a turn uses of the supervisor's world, given at construction."""

    ledger: TurnLedger
    store: TurnStore
    registry: ProcessRegistry
    scanner: MarkerScanner
    spawn: Spawner
    places: Places
    cgroups: CgroupRoot | None
    """The store's cgroup subtree (a cgroup per turn), or None: the sweep fallback."""
    sandbox: Sandbox
    """What every turn's program starts behind (:mod:`supervisor.procs.sandbox`)."""
    adopt_background: Callable[[ProcessTree], None]
    """Keep a normal turn's background processes (``keep_background``), reaping them later."""
    preparing: TurnHook | None = None
    """A test's hook, awaited right before the point of no return."""


@runtime_checkable
class _LineTextRuns(Protocol):
    """A parser whose text deltas are whole lines (the generic protocol's)."""

    def end_text_run(self) -> None: ...


class Turn:
    """One agent handling one message. Created and driven by the supervisor."""

    def __init__(self, ports: TurnPorts, channel: str, ticket: TurnTicket, agent: AgentConfig, prompt: str) -> None:
        self.ports = ports
        self.channel = channel
        self.ticket = ticket
        self.turn_id = ticket.turn_id
        self.agent = agent
        self.adapter: Adapter = get_adapter(agent.adapter)
        self.prompt = prompt
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.tree: ProcessTree | None = None
        self.outcome = TurnOutcome()
        self.started_at = time.time()
        self.stop_reason: str | None = None
        """'user' or 'shutdown' once the supervisor has stopped this turn."""
        self.cwd: str | None = None
        """The working folder, once prepared (it is created then)."""
        self._account = TurnAccount(self.author, self.turn_id)
        self._last: Pending | None = None
        self._draft: ShowDraft | None = None
        """The open run's latest draft, not yet shown (shown once per read: see :meth:`_show`)."""
        self._parser: Parser | None = None
        self._reader: LineReader | None = None

    # ------------------------------------------------------------ helpers

    @property
    def author(self) -> str:
        """Who the turn's entries are by."""
        return f"agent:{self.agent.name}"

    @property
    def generation(self) -> int:
        """The generation the turn began under."""
        return self.ticket.generation

    def _silenced(self) -> bool:
        """Stopped by a user or by shutdown (the ledger says): nothing more of it may be stored."""
        return self.ports.ledger.is_stale(self.channel, self.turn_id)

    def _carry_out(self, effects: list[Effect]) -> None:
        """Submit the effects' writes; no checkpoint, so the ledger's answer still holds."""
        store = self.ports.store
        for effect in effects:
            if isinstance(effect, Post):
                self._post(effect.kind, effect.text, dict(effect.meta) if effect.meta is not None else None)
                if effect.meta and "draft" in effect.meta and isinstance(self._parser, _LineTextRuns):
                    self._parser.end_text_run()  # (a long run saved in pieces: the next piece is a new run)
            elif isinstance(effect, SaveSession):
                if self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.SESSION):
                    store.save_session(self.channel, self.agent.name, effect.session_id, self._cwd())
            elif isinstance(effect, SavePlan):
                store.save_todos(self.channel, self.agent.name, effect.items)
            elif isinstance(effect, ShowDraft):
                self._draft = effect
            else:
                log.warning(
                    "[%s %s] unparsed line (%s): %.200s", self.channel, self.turn_id, effect.reason, effect.line
                )

    def _show(self) -> None:
        """Show the open run's latest draft, if a read added to it: once per read, since each
        draft carries the whole run (a burst of deltas is one draft, not one per delta)."""
        draft, self._draft = self._draft, None
        if draft is None or draft.draft != self._account.draft or not self._account.text:
            return  # (its run was saved meanwhile: the entry replaces it)
        if self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.OTHER):
            self.ports.store.show_draft(
                Draft(self.channel, self.author, self.turn_id, draft.draft, draft.text, time.time())
            )

    def _post(self, kind: str, text: str, meta: dict[str, object] | None = None) -> None:
        """Submit an entry unless the turn is stale (ledger decides, no checkpoint before submit)."""
        if not self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.OTHER):
            return
        self._last = self.ports.store.submit_entry(
            self.channel, self.author, kind, text, turn=self.turn_id, generation=self.generation, meta=meta
        )

    def _flush_text(self) -> None:
        self._carry_out(self._account.close_text(silenced=self._silenced()))

    def cut_off(self, reason: str) -> None:
        """Save the open run of text as the stop (or shutdown) decision found it, marked as cut
        off by ``reason``: called in the step that decides, before the notice. Not asked of the
        ledger, which has just silenced the turn: this entry is the decision's own."""
        post = self._account.cut_off(reason)
        if post is None:
            return
        self._draft = None
        self._last = self.ports.store.submit_entry(
            self.channel, self.author, post.kind, post.text, turn=self.turn_id, generation=self.generation,
            meta=dict(post.meta) if post.meta is not None else None,
        )

    def _handle(self, event: Event) -> None:
        """Decide what the event adds (pure), then carry it out."""
        self._carry_out(self._account.on_event(event, silenced=self._silenced(), now=trio.current_time()))

    def _cwd(self) -> str:
        assert self.cwd is not None, "a turn's output comes only once it is prepared"
        return self.cwd

    # ------------------------------------------------------------ the turn

    async def run(self, session_id: str | None) -> TurnOutcome:
        """Run the turn to its end; never raises for the turn's own failures."""
        try:
            with self.scope:
                await self._prepare_and_stream(session_id)
        except TurnLimit as exc:
            self.outcome.error = str(exc)
        except StoreError as exc:
            self.outcome.error = f"could not store the turn's output: {exc}"
        except OSError as exc:
            self.outcome.error = f"could not start {self.agent.name}: {exc.strerror or exc}"
        except SandboxRefused as exc:
            self.outcome.error = f"could not start {self.agent.name}: {exc}"
        finally:
            with trio.CancelScope(shield=True):
                await self._teardown()
        return self.outcome

    async def _prepare_and_stream(self, session_id: str | None) -> None:
        ports = self.ports
        request = self._request(session_id)
        self._parser = self.adapter.new_parser(request)
        launch = self.adapter.build_launch(request)
        env = self._environment(launch)
        await trio.to_thread.run_sync(
            partial(_write_files, Path(request.home), launch.files, state_dir=ports.places.state_dir)
        )
        sandbox = ports.sandbox.prefix(
            self.agent.name, cwd=launch.cwd, home=request.home, writable=self.agent.sandbox_write,
            hidden=self.agent.sandbox_hide, network=self.agent.network,
            installation=(*(self.agent.command or self.adapter.default_command), *self.agent.args),
        )
        if ports.preparing is not None:
            await ports.preparing(self.channel, self.turn_id)
        # The point of no return: the ledger is asked, then the spawn follows at once.
        if not ports.ledger.may_start(self.channel, self.turn_id):
            return
        cgroup = None
        if ports.cgroups is not None:
            try:
                cgroup = ports.cgroups.create(self.turn_id, self.agent.cgroup_limits)
            except OSError as exc:  # e.g. the subtree was removed under us: the sweep still works
                log.warning(
                    "[%s %s] no cgroup for this turn (%s): its stop falls back to the sweep",
                    self.channel, self.turn_id, exc,
                )
        stdin_pipe = launch.stdin is not None
        with ports.registry.spawn_in_flight():
            try:
                if cgroup is None and not sandbox:  # (a test's spawner need not know either)
                    process = await ports.spawn(launch.argv, env=env, cwd=launch.cwd, stdin_pipe=stdin_pipe)
                else:
                    process = await ports.spawn(
                        launch.argv, env=env, cwd=launch.cwd, stdin_pipe=stdin_pipe, cgroup=cgroup, sandbox=sandbox
                    )
            except BaseException:
                if cgroup is not None:
                    cgroup.remove()
                raise
        # No checkpoint between the spawn returning and the registration: a stop that
        # landed during the spawn is seen here and the process dies at once.
        self.tree = ProcessTree(process, self.turn_id, cgroup, sandboxed=bool(sandbox))
        ports.registry.register(self.channel, self.turn_id, self.tree)
        leader = self.tree.leader
        ports.store.turn_spawned(self.turn_id, process.pid, leader.started if leader else None)
        log.info("[%s %s] started %s (pid %d)", self.channel, self.turn_id, self.agent.name, process.pid)
        if launch.stdin is not None:
            await self._write_stdin(process, launch.stdin)
        await self._stream(process)

    async def _write_stdin(self, process: trio.Process, data: bytes) -> None:
        assert process.stdin is not None
        try:
            if self.ports.ledger.may_start(self.channel, self.turn_id):
                await process.stdin.send_all(data)
        except trio.BrokenResourceError:
            pass
        finally:
            await process.stdin.aclose()

    async def _stream(self, process: trio.Process) -> None:
        limits = self.agent.limits
        assert process.stdout is not None
        reader = LineReader(process.stdout)
        self._reader = reader
        failure: Exception | None = None
        with trio.CancelScope() as turn_scope:
            if limits.turn_timeout:
                turn_scope.deadline = trio.current_time() + limits.turn_timeout
            async with trio.open_nursery() as nursery:
                drain = trio.CancelScope()
                nursery.start_soon(self._pump_stderr, process)
                nursery.start_soon(self._drain_after_exit, process, drain)
                with drain:
                    failure = await self._read_stdout(reader)
                if failure is None:
                    await wait_exited(process)  # not reaped: the teardown may still signal its group
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        if turn_scope.cancelled_caught:
            raise TurnLimit(f"Turn ended: it ran longer than {limits.turn_timeout:g} s (turn_timeout).")

    async def _read_stdout(self, reader: LineReader) -> Exception | None:
        """Feed stdout to the parser until EOF; return (not raise, we are in a nursery)
        the reason to end the turn early, if any."""
        stall_timeout = self.agent.limits.stall_timeout
        while True:
            with trio.move_on_after(stall_timeout or float("inf")) as stall:
                lines = await self._read_or_show_text(reader)
            if stall.cancelled_caught:
                return TurnLimit(f"Turn ended: no output for {stall_timeout:g} s (stall_timeout).")
            if not lines:
                return None
            for line in lines:
                if line.truncated:
                    log.warning("[%s %s] line over %d bytes truncated", self.channel, self.turn_id, len(line.data))
                self._feed(line)
            self._show()
            # Deltas stay buffered across reads: one contiguous run of them is one message,
            # stored when the next event (or the end of the turn) closes it.
            if self._last is not None and self._last.failed:
                return StoreError("an entry of this turn could not be stored")

    async def _read_or_show_text(self, reader: LineReader) -> list[Line]:
        """The next lines; a run of text the agent has gone quiet after is stored meanwhile,
        so an agent that says something and then works (or waits) shows it at once.

        Only for parsers whose runs are whole lines (they have ``end_text_run``): a model's
        token deltas may pause mid-sentence, and are held until the next event."""
        parser = self._parser
        if self._account.text and isinstance(parser, _LineTextRuns):
            with trio.move_on_after(TEXT_QUIET_SECONDS):
                return await reader.read_lines()  # cancel-safe: nothing is consumed on a cancel
            self._flush_text()
            parser.end_text_run()
        return await reader.read_lines()

    async def _drain_after_exit(self, process: trio.Process, drain: trio.CancelScope) -> None:
        """Once the CLI has exited, stop waiting for EOF after a deadline: an escaped
        descendant may hold stdout open forever."""
        await wait_exited(process)
        drain.deadline = trio.current_time() + DRAIN_SECONDS

    async def _pump_stderr(self, process: trio.Process) -> None:
        assert process.stderr is not None
        reader = LineReader(process.stderr, max_line=64 * 1024)
        parser = self._parser
        assert parser is not None
        while lines := await reader.read_lines():
            for line in lines:
                text = line.text()
                log.info("[%s %s] stderr: %s", self.channel, self.turn_id, text[:STDERR_LOG_CHARS])
                for event in parser.feed_stderr(text):
                    self._handle(event)
            self._show()

    async def _teardown(self) -> None:
        """End the tree, drain leftovers, report. Shielded; same order every time."""
        ports = self.ports
        tree = self.tree
        stopped = self._silenced()
        self.outcome.stopped = stopped
        interrupted = stopped or self.outcome.error is not None
        try:
            if tree is not None:
                if interrupted:
                    await tree.terminate(self.adapter.interrupt_signal, self.agent.limits.stop_grace)
                if interrupted or not self.agent.limits.keep_background:
                    await tree.sweep(ports.scanner)
                else:
                    await tree.process.wait()
                    ports.adopt_background(tree)
                await self._drain_leftovers(tree)
                if not interrupted and self._silenced():
                    # Stopped while finishing (the leftovers were being kept or drained):
                    # a stopped turn keeps nothing alive, whatever keep_background says.
                    self.outcome.stopped = True
                    await tree.sweep(ports.scanner)
                for stream in (tree.process.stdout, tree.process.stderr):
                    if isinstance(stream, trio.lowlevel.FdStream):
                        stream.close()  # no checkpoint (aclose has one): shielded, nothing to wait for
                    elif stream is not None:
                        await stream.aclose()
                self.outcome.report = tree.report
                ports.registry.release(self.channel, self.turn_id, tree)
            returncode = tree.process.returncode if tree else None
            if self._parser is not None and tree is not None:
                for event in self._parser.finish(returncode, interrupted=interrupted):
                    self._handle(event)
            self._flush_text()
            self.outcome.stale_session = self._account.stale_session
            if not self._silenced():
                self._finish_entries()
            if self._last is not None:
                try:
                    await self._last.committed()
                except StoreError as exc:
                    self.outcome.error = self.outcome.error or f"could not store the turn's output: {exc}"
        except StoreError as exc:
            self.outcome.error = self.outcome.error or f"could not store the turn's output: {exc}"
        finally:
            self.done.set()

    async def _drain_leftovers(self, tree: ProcessTree) -> None:
        reader = self._reader
        if reader is None or reader.eof:
            return
        for line in reader.read_ready():  # what is there already, and the EOF: no wake-up
            self._feed(line)
        if reader.eof:
            return
        with trio.move_on_after(DRAIN_SECONDS):
            while lines := await reader.read_lines():
                for line in lines:
                    self._feed(line)

    def _feed(self, line: Line) -> None:
        assert self._parser is not None
        for event in self._parser.feed(line.text()):
            self._handle(event)

    def _finish_entries(self) -> None:
        """The turn's last words: its final answer or the reason it failed."""
        words = self._account.last_words(self.outcome.error)
        self._carry_out(words.effects)
        self.outcome.ok = words.ok
        self.outcome.error = words.error

    # ------------------------------------------------------------ launch inputs

    def _request(self, session_id: str | None) -> TurnRequest:
        places = self.ports.places
        home = places.agent_home(self.agent.name, self.channel)
        self.cwd = str(places.channel_cwd(self.channel, self.agent))
        return TurnRequest(
            prompt=self.prompt,
            channel=self.channel,
            turn_id=self.turn_id,
            agent=self.agent.name,
            command=self.agent.command or self.adapter.default_command,
            args=self.agent.args,
            session_id=session_id,
            model=self.agent.model,
            cwd=self.cwd,
            home=str(home),
            options=dict(self.agent.options),
            unattended=self.agent.unattended,
        )

    def _environment(self, launch: Launch) -> dict[str, str]:
        home = self.ports.places.agent_home(self.agent.name, self.channel)
        env = scrubbed_environment(os.environ)
        env.setdefault("PATH", os.defpath)
        env["HOME"] = str(home)
        env["TMPDIR"] = str(home / "tmp")
        env.update(launch.env)
        env.update(self.agent.env)
        env[TURN_MARKER] = self.turn_id  # last, so no config can remove the markers
        env[STORE_MARKER] = self.ports.store.store_id
        return env


def _write_files(home: Path, files: Mapping[str, str], *, state_dir: Path | None = None) -> None:
    """Write a launch's files under ``home`` (0600 in 0700 folders), and make its TMPDIR.

    The folders from ``state_dir`` (corral's, which holds every HOME) down to ``home`` are
    tightened too; without it only ``home`` and below are — never a folder above that is
    not corral's to change (counting parents up from a HOME once reached ``/``).
    """
    private_folder(home / "tmp", within=state_dir if state_dir is not None and state_dir in home.parents else home)
    for rel, content in dict(files).items():
        path = Path(rel) if os.path.isabs(rel) else home / rel
        private_folder(path.parent, within=home if not os.path.isabs(rel) else None)
        private_file(path, content)
