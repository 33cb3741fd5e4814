"""One persistent ACP agent process, driven with Trio on corral's own process machinery.

Theory of operation
-------------------

:func:`open_acp_agent` spawns the agent (``_tree.spawn``: a new session, a scrubbed
environment carrying the ``CORRAL_TURN`` marker), registers it as a :class:`ProcessTree` with
no checkpoint in between, and runs ``initialize`` (an agent answering another protocol
version is refused), ``authenticate`` when the agent's ``acp_auth`` names a method, then
``session/new`` — or, for a saved id, ``session/resume`` (no replay) when the agent offers
it, else ``session/load``, falling back to ``session/new`` (with a notice) when neither
reopens it. A ``session/new`` refused with "Authentication required" says which methods the
agent offers and what configures each. Lines of stdout that are not JSON-RPC before the
session opens (a banner) are logged, bounded, and shown if the start fails. All protocol
decisions are :class:`adapters.acp.AcpConnection`'s; this module only moves bytes: one task
reads stdout lines into the connection, one keeps stderr's tail, and every write goes
through one lock.

The start is bounded (``start_timeout``: ``acp_start_timeout``). A start that does not
finish — a stop cancelled it, it failed, or it ran out of time — kills the half-started
agent's tree at once, with no close grace (a stop is waiting), and records what it killed
in the caller's :class:`StartupKill`, so the stop reports it. A started agent is ended by
:meth:`AcpAgent.close`: ``session/close`` first when the agent offers it, then stdin closed,
a grace to exit, and the kill and sweep of its tree.

A turn is :meth:`AcpAgent.prompt`: an async iterator of the connection's events ending with
:class:`~adapters.acp.PromptEnded`. At its start the agent's descendants are snapshotted
(pid + start ticks, and the boot-tick clock): what exists then — the agent, its MCP servers —
belongs to the agent, everything newer belongs to the turn.

:meth:`AcpAgent.cancel` is corral's stop rule for ACP: a typed ``session/cancel`` and
``$/cancel_request`` for the prompt first (pending permission requests answered
``cancelled``), up to ``grace`` seconds for the
prompt's answer, and then corral's own kill — always, because ACP only says an agent SHOULD
stop its tools and real ones leave them running:

* acknowledged in time (``ended="cancelled"``): every process the turn started is killed —
  descendants that were not in the snapshot, the process groups they lead (setsid ones
  included), and marked processes started since the turn began that escaped the tree — while
  the agent and what it started before stay alive for the next prompt;
* not acknowledged, or the agent died (``ended="killed"``): the agent's whole tree is killed
  and swept; the owner starts a fresh process, which resumes the session (``session/resume``
  or ``session/load``).

Output after the cancel is dropped by the connection, except a session id.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import signal
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import trio

from adapters import Error, Launch, Unparsed
from adapters.acp import (
    AUTH_REQUIRED,
    DEFAULT_START_TIMEOUT,
    AcpConnection,
    AcpEvent,
    Authenticated,
    Initialized,
    PermissionDecided,
    PromptEnded,
    RequestFailed,
    SessionClosed,
    SessionReady,
    auth_advice,
    auth_problem,
)

from ..core.text import shown
from ..procs.files import write_home_files
from ..procs.lines import LineReader
from ..procs.tree import (
    MarkerScanner,
    ProcessTree,
    ProcId,
    agent_environment,
    descendants,
    kill_exact,
    read_stat,
    scan_markers,
    signal_group,
    spawn,
    wait_gone,
)

log = logging.getLogger("corral.acp")

#: Default wait for the typed cancel's acknowledgement.
CANCEL_GRACE = 3.0
#: How long ``close`` lets the agent exit on its own after stdin is closed.
CLOSE_GRACE = 2.0
#: Default bound on start-up (initialize + session/new or load): node agents start slowly.
#: ``acp_start_timeout`` configures it per agent.
START_TIMEOUT = DEFAULT_START_TIMEOUT
#: How long ``close`` waits for the answer to ``session/close`` (within its grace).
SESSION_CLOSE_WAIT = 1.0
#: Lines of stdout that are not JSON-RPC, before the session is open, logged one by one (and
#: kept to explain a start that fails); the rest are counted. Each is cut to
#: :data:`NOISE_CHARS` characters.
NOISE_LINES = 5
NOISE_CHARS = 200
#: corral's ``stopReason`` when the agent process ended before answering the prompt.
STOP_EXITED = "exited"
#: stderr lines kept to explain an agent that died.
STDERR_TAIL = 20

_CLK_TCK = os.sysconf("SC_CLK_TCK")


class AcpAgentError(Exception):
    """The agent could not be started or used: it died, refused, or broke the protocol."""


def boot_ticks() -> int:
    """Now, in the clock ticks since boot that ``/proc/PID/stat`` start times use."""
    with open("/proc/uptime", "rb") as fh:
        return int(float(fh.read().split()[0]) * _CLK_TCK)



def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


@dataclass(slots=True)
class CancelReport:
    """What a cancel did: how the turn ended, when, and what was killed."""

    ended: Literal["cancelled", "killed", "idle"]
    """``cancelled``: the agent answered in time; ``killed``: it did not (or died), so its
    whole tree was killed; ``idle``: no prompt was in flight."""
    stop_reason: str | None = None
    acknowledged_after: float | None = None
    """Seconds from the cancel to the prompt's answer (None: no answer in time)."""
    dead_after: float = 0.0
    """Seconds from the cancel to every process of the turn confirmed dead."""
    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    decisions: list[PermissionDecided] = field(default_factory=list)
    """Permission requests answered ``cancelled`` by the cancel."""


@dataclass(slots=True)
class StartupKill:
    """What ended a half-started agent (a stop, a failure or the timeout during its start-up)
    killed: filled in by the start, read by the turn that waited for it (its stop's report)."""

    killed: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)

    def add(self, killed: Sequence[int], survivors: Sequence[int]) -> None:
        """Record one kill of a half-started process."""
        self.killed = sorted(set(self.killed) | set(killed))
        self.survivors = sorted(set(self.survivors) | set(survivors))


@dataclass(frozen=True, slots=True)
class _Exited:
    """Sentinel on the event channel: stdout reached EOF (the agent is gone)."""

    returncode: int | None


class AcpAgent:
    """A running ACP agent with one open session. Made by :func:`open_acp_agent`."""

    def __init__(
        self,
        launch: Launch,
        *,
        env: Mapping[str, str],
        marker: str,
        unattended: bool,
        session_cwd: str,
        tap: Callable[[str, bytes], None] | None = None,
        restart_after_cancel: bool = False,
        start_timeout: float = START_TIMEOUT,
        sandbox: Sequence[str] = (),
        auth_method: str | None = None,
        usage_totals: Literal["turn", "session"] = "turn",
    ) -> None:
        self.launch = launch
        self.auth_method = auth_method
        """``acp_auth``: the method ``authenticate`` is called with before the session opens."""
        self.sandbox = tuple(sandbox)
        """The argv the agent starts behind (:meth:`supervisor.procs.sandbox.Sandbox.prefix`), or ()."""
        self.restart_after_cancel = restart_after_cancel
        """Kill and restart (with session/load) even after an acknowledged cancel: for agents
        whose session is out of step after one (claude-agent-acp 0.23 answers the next prompt
        with the cancelled one's leftovers)."""
        self.start_timeout = start_timeout
        self.tap = tap
        """Called with ``("send" | "recv", line)`` for every line exchanged: captures, debugging."""
        self.env = dict(env)
        self.marker = marker
        self.session_cwd = session_cwd
        self.unattended = unattended
        self.usage_totals: Literal["turn", "session"] = usage_totals
        """What the agent's prompt answers' ``usage`` covers (:attr:`adapters.acp.Preset.usage_totals`)."""
        self.conn = AcpConnection(unattended=unattended, usage_totals=usage_totals)
        self.tree: ProcessTree | None = None
        self.covers: tuple[str, ...] = ()
        """The covers of its sandbox a replacement on the host would detach (its first turn
        records them: :mod:`supervisor.procs.covers`)."""
        self.covers_epoch: int | None = None
        """The cover watch's epoch when it was planned (None: not recorded yet)."""
        self.info: Initialized | None = None
        self.notices: list[str] = []
        """Things the owner should store as status entries (e.g. a session that could not load)."""
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self.noise: deque[str] = deque(maxlen=NOISE_LINES)
        """The first lines of stdout that were not JSON-RPC before the session opened."""
        self._noise_count = 0
        self.last_used = trio.current_time()
        self.holders = 0
        """Turns that hold it (:meth:`hold`): a held agent is never closed as idle."""
        self.idle_timeout = math.inf
        """Seconds idle after which the owner closes the agent (see :meth:`watch_idle`)."""
        self._idle_scope: trio.CancelScope | None = None
        self.dead = False
        self._send_events, self._events = trio.open_memory_channel[AcpEvent | _Exited](math.inf)
        self._write_lock = trio.Lock()
        self._prompt_done = trio.Event()
        self._exited = trio.Event()
        self._last_end: PromptEnded | None = None
        self._before: set[ProcId] = set()
        self._before_tick = 0
        self._scanner = MarkerScanner()
        self._nursery: trio.Nursery | None = None
        self._generation = 0
        """Counts agent processes: a reader of an earlier one must not touch this one's state."""
        self._saved_session: str | None = None

    # ------------------------------------------------------------ properties

    @property
    def pid(self) -> int:
        """The agent process's pid."""
        assert self.tree is not None
        return self.tree.pid

    @property
    def session_id(self) -> str | None:
        """The open session's id (save it: ``session/load`` resumes it in a fresh process)."""
        return self.conn.session_id

    @property
    def busy(self) -> bool:
        """Is a prompt in flight?"""
        return self.conn.prompt_id is not None

    def idle_for(self) -> float:
        """Seconds since the last prompt ended (0 while one is in flight)."""
        return 0.0 if self.busy else trio.current_time() - self.last_used

    # ------------------------------------------------------------ I/O plumbing

    async def _flush(self) -> None:
        async with self._write_lock:
            data = self.conn.data_to_send()
            if data and not self.dead:
                if self.tap is not None:
                    for line in data.splitlines():
                        self.tap("send", line)
                assert self.tree is not None and self.tree.process.stdin is not None
                try:
                    await self.tree.process.stdin.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    log.info("agent %d: stdin closed: %s", self.pid, exc)

    async def _read_stdout(self, generation: int, process: trio.Process) -> None:
        assert process.stdout is not None
        reader = LineReader(process.stdout)
        while generation == self._generation:
            lines = await reader.read_lines()
            if not lines or generation != self._generation:
                break
            for line in lines:
                if self.tap is not None:
                    self.tap("recv", line.data)
                for event in self.conn.receive(line.data):
                    if isinstance(event, PromptEnded):
                        self._last_end = event
                        self.last_used = trio.current_time()
                        self._prompt_done.set()
                        self._set_idle_deadline()
                    self._send_events.send_nowait(event)
            await self._flush()
        if generation != self._generation:
            return  # a restart replaced this process: its end is no news
        # EOF: the agent is gone (or closed stdout, which is as good as gone).
        with trio.move_on_after(1.0):
            await process.wait()
        if generation != self._generation:
            # Asked again after the wait: a restart (restart_after_cancel) may begin while this
            # reader reaps the process it replaces, and that exit (corral's own SIGKILL) would
            # then end the fresh process's start-up as "exited (status -9)".
            return
        self._exited.set()
        self._prompt_done.set()
        self._send_events.send_nowait(_Exited(process.returncode))

    async def _read_stderr(self, process: trio.Process) -> None:
        assert process.stderr is not None
        reader = LineReader(process.stderr, max_line=4096)
        while lines := await reader.read_lines():
            for line in lines:
                text = line.text()
                self.stderr_tail.append(text)
                log.debug("agent %d stderr: %s", process.pid, shown(text, lines=False))

    async def _until(self, *kinds: type) -> AcpEvent:
        """The next event of one of ``kinds`` (or RequestFailed); setup only, no prompt running.

        Lines that are not JSON-RPC (a banner, a log line on the wrong stream) are logged,
        bounded: :data:`NOISE_LINES` of them, cut to :data:`NOISE_CHARS`, then a count."""
        while True:
            event = await self._events.receive()
            if isinstance(event, _Exited):
                raise AcpAgentError(f"the agent exited (status {event.returncode}) during start-up: {self._why()}")
            if isinstance(event, Unparsed):
                self._noise(event)
            if isinstance(event, (*kinds, RequestFailed)):
                return event

    def _noise(self, event: Unparsed) -> None:
        self._noise_count += 1
        if self._noise_count <= NOISE_LINES:
            line = event.line if len(event.line) <= NOISE_CHARS else event.line[: NOISE_CHARS - 1] + "…"
            self.noise.append(line)
            log.warning("agent %d: stdout line during start-up is not JSON-RPC (%s): %r",
                        self.pid, event.reason, line)
        elif self._noise_count in (NOISE_LINES + 1, 100, 10_000):
            log.warning("agent %d: %d lines of stdout during start-up were not JSON-RPC (the rest not logged)",
                        self.pid, self._noise_count)

    def _set_idle_deadline(self) -> None:
        """Move the idle watch's deadline: none while a prompt runs or a turn holds the agent,
        else last use + timeout."""
        if self._idle_scope is not None:
            held = self.busy or self.holders > 0
            self._idle_scope.deadline = math.inf if held else self.last_used + self.idle_timeout

    def hold(self) -> None:
        """A turn has taken this agent (from the pool, synchronously as it is handed over): the
        idle watch does not close it until :meth:`release`, however long the turn's steps
        before its prompt take (a slow machine took an agent just started, or just due, from
        a turn about to prompt it)."""
        self.holders += 1
        self._set_idle_deadline()

    def release(self) -> None:
        """The turn that held it has ended: idle from now."""
        self.holders -= 1
        self.last_used = max(self.last_used, trio.current_time())
        self._set_idle_deadline()

    async def watch_idle(self, closing: trio.Event) -> bool:
        """Wait until ``closing`` is set (False) or the agent has been idle for
        :attr:`idle_timeout` (True). One Trio deadline, moved as prompts start and end: an
        idle agent costs no wake-ups until it is due."""
        while not closing.is_set():
            with trio.CancelScope() as scope:
                self._idle_scope = scope
                self._set_idle_deadline()
                await closing.wait()
            self._idle_scope = None
            if (not closing.is_set() and not self.busy and self.holders == 0
                    and self.idle_for() >= self.idle_timeout):
                return True
        return False

    def _why(self) -> str:
        why = " | ".join(self.stderr_tail) or "no output on stderr"
        if self.noise:
            why += f"; stdout that was not JSON-RPC: {' | '.join(self.noise)}"
        return why

    # ------------------------------------------------------------ start-up

    async def _start(self, nursery: trio.Nursery, saved_session: str | None) -> None:
        self._nursery = nursery
        self._generation += 1
        self.conn = AcpConnection(unattended=self.unattended, policy=self.conn.policy, usage_totals=self.usage_totals)
        self._send_events, self._events = trio.open_memory_channel[AcpEvent | _Exited](math.inf)
        self._exited = trio.Event()
        self._prompt_done = trio.Event()
        self.dead = False
        self.noise.clear()
        self._noise_count = 0
        process = await spawn(
            self.launch.argv, env=self.env, cwd=self.launch.cwd, stdin_pipe=True, sandbox=self.sandbox
        )
        # Registered before the next checkpoint.
        self.tree = ProcessTree(process, self.marker, sandboxed=bool(self.sandbox))
        nursery.start_soon(self._read_stdout, self._generation, process)
        nursery.start_soon(self._read_stderr, process)
        self.conn.initialize()
        await self._flush()
        event = await self._until(Initialized)
        if isinstance(event, RequestFailed):
            raise AcpAgentError(f"initialize failed: {event.reason} (code {event.code})")
        assert isinstance(event, Initialized)
        self.info = event
        if self.auth_method is not None:
            await self._authenticate(event, self.auth_method)
        if saved_session is not None and await self._reopen(saved_session):
            return
        self.conn.new_session(self.session_cwd)
        await self._flush()
        event = await self._until(SessionReady)
        if isinstance(event, RequestFailed):
            raise AcpAgentError(self._session_failed(event))

    async def _authenticate(self, info: Initialized, method_id: str) -> None:
        """``authenticate`` with the configured method, once it is known to be usable."""
        problem = auth_problem(method_id, info.auth_methods, self.env)
        if problem is not None:
            raise AcpAgentError(f"cannot authenticate: {problem}")
        self.conn.authenticate(method_id)
        await self._flush()
        event = await self._until(Authenticated)
        if isinstance(event, RequestFailed):
            raise AcpAgentError(f"authenticate with {method_id!r} failed: {event.reason} (code {event.code})")

    async def _reopen(self, saved: str) -> bool:
        """Reopen the saved session: ``session/resume`` (no replay) if the agent offers it,
        else (or if it fails) ``session/load``. Did one succeed? If not, a notice says why."""
        why: list[str] = []
        for method in ("session/resume", "session/load"):
            if method == "session/resume" and not self.conn.resume_session_supported:
                continue
            if method == "session/load" and not self.conn.load_session_supported:
                continue
            if method == "session/resume":
                self.conn.resume_session(saved, self.session_cwd)
            else:
                self.conn.load_session(saved, self.session_cwd)
            await self._flush()
            event = await self._until(SessionReady)
            if isinstance(event, SessionReady):
                return True
            assert isinstance(event, RequestFailed)
            why.append(f"{method}: {event.reason}" if method == "session/resume" else event.reason)
        if not why:
            self.notices.append(f"the agent cannot load sessions; session {saved} not resumed, a new one started")
        else:
            self.notices.append(f"could not load session {saved}: {'; '.join(why)}; a new one started")
        return False

    def _session_failed(self, event: RequestFailed) -> str:
        """Why ``session/new`` failed; for "Authentication required", what to configure."""
        text = f"session/new failed: {event.reason} (code {event.code})"
        if event.code == AUTH_REQUIRED:
            methods = self.info.auth_methods if self.info is not None else ()
            # A terminal method's args are appended to the agent's configured invocation.
            command = shlex.join(self.launch.argv)[:200] or "the agent"
            if self.auth_method is None:
                text += f"; {auth_advice(methods, command)}"
            else:
                text += f"; it still asks after authenticate with {self.auth_method!r}"
        return text

    async def ensure_running(self, startup: StartupKill | None = None) -> bool:
        """Before a prompt: if the agent process is gone (killed by a cancel, dead, closed),
        start a fresh one that resumes the session (``session/resume``, else ``session/load``).
        Did it restart?

        Raises :class:`AcpAgentError` if the fresh process cannot open a session. A fresh
        process that does not get there (a stop, a failure, the timeout) is killed at once,
        and what that killed is added to ``startup``.
        """
        if not (self.dead or self._exited.is_set()):
            return False
        assert self._nursery is not None
        if self.tree is not None and not self.dead:
            await self._kill_agent()
        saved = self.conn.session_id or self._saved_session
        self._saved_session = saved
        try:
            with trio.move_on_after(self.start_timeout) as scope:
                await self._start(self._nursery, saved)
            if scope.cancelled_caught:
                raise AcpAgentError(
                    f"the agent did not reopen its session within {self.start_timeout:g}s: {self._why()}"
                )
        except BaseException:
            # Half started (a stop, a failure, the timeout): no session to prompt. Kill it, so
            # the next call starts afresh instead of taking it for a running agent.
            with trio.CancelScope(shield=True):
                if self.tree is not None and not self.dead:
                    killed, survivors = await self._kill_agent()
                    if startup is not None:
                        startup.add(killed, survivors)
            raise
        self.last_used = trio.current_time()
        self._set_idle_deadline()
        return True

    # ------------------------------------------------------------ a turn

    def prompt(self, text: str) -> PromptStream:
        """Start a turn: snapshot the agent's processes, queue ``session/prompt``.

        Iterate the result for the turn's events; the last is a :class:`PromptEnded`.
        """
        if self.dead or self._exited.is_set():
            raise AcpAgentError("the agent process is gone; call ensure_running() first (it resumes with session/load)")
        self._before_tick = boot_ticks()
        self._before = descendants(self.pid)
        self._prompt_done = trio.Event()
        self._last_end = None
        self.conn.prompt(text)
        self._set_idle_deadline()
        return PromptStream(self)

    def steer(self, text: str) -> str | None:
        """Queue ``text`` into the turn in flight (an agent that takes a prompt into a running
        turn: ``conn.prompt_queueing``); None once queued (the caller flushes), else why not."""
        if not self.conn.prompt_queueing:
            return "the agent does not take a message into a running turn"
        if self.dead or self._exited.is_set():
            return "the agent process is gone"
        if not self.busy or self.conn.cancelling:
            return "no prompt in flight"
        self.conn.steer(text)
        return None

    async def send_queued(self) -> None:
        """Write what the connection has queued for the agent (a steer's prompt)."""
        await self._flush()

    async def cancel(self, grace: float = CANCEL_GRACE) -> CancelReport:
        """Stop the turn in flight: typed cancel, ``grace`` for its answer, then the kill."""
        started = trio.current_time()
        if not self.busy:
            return CancelReport("idle")
        decisions = [d for d in self.conn.cancel() if isinstance(d, PermissionDecided)]
        acked_after: float | None = None
        with trio.move_on_after(grace):
            await self._flush()
            await self._prompt_done.wait()
            if self._last_end is not None:
                acked_after = trio.current_time() - started
        if acked_after is not None and not self._exited.is_set():
            ended: Literal["cancelled", "killed"] = "cancelled"
            if self.restart_after_cancel:
                killed, survivors = await self._kill_agent()
            else:
                killed, survivors = await self._kill_turn_processes(started + grace + 5.0)
        else:
            killed, survivors = await self._kill_agent()
            ended = "killed"
        reason = self._last_end.stop_reason if self._last_end is not None else None
        report = CancelReport(ended, reason, acked_after, trio.current_time() - started, killed, survivors, decisions)
        log.info("agent %d: cancel %s after %.2fs, killed %s", self.pid, ended, report.dead_after, killed)
        return report

    async def sweep_turn(self, budget: float = 5.0) -> tuple[list[int], list[int]]:
        """After a prompt that ended on its own: kill what it started and left running (a
        normal turn's leftovers are swept, as for every turn). ``(killed, survivors)``."""
        if self.busy or self.dead or self._exited.is_set():
            return [], []
        return await self._kill_turn_processes(trio.current_time() + budget)

    def _turn_candidates(self, marked: set[ProcId]) -> set[ProcId]:
        """The processes the turn started: new descendants, and new marked escapees."""
        now = descendants(self.pid, include_self=False)
        fresh = {p for p in marked if p.started >= self._before_tick}
        return {p for p in now | fresh if p not in self._before and p.pid != self.pid}

    async def _kill_turn_processes(self, deadline: float) -> tuple[list[int], list[int]]:
        killed: set[int] = set()
        agent_pgid = self.pid
        pending: set[ProcId] = set()
        for _ in range(20):
            marked = (await trio.to_thread.run_sync(scan_markers, [self.marker]))[self.marker]
            # Decide and signal with no checkpoint in between; identities guard against reuse.
            candidates = self._turn_candidates(marked)
            log.debug("agent %d: the turn's processes: %s", self.pid, {p.pid: _cmdline(p.pid) for p in candidates})
            # Decide first (every living candidate), then signal: a group kill may end a
            # candidate before its own turn comes, and it was still killed by this stop.
            living = {proc: stat for proc in candidates if (stat := read_stat(proc.pid)) is not None}
            hit = [p for p, stat in living.items() if stat.started == p.started and stat.state != "Z"]
            for proc in hit:
                if living[proc].pgid == proc.pid and proc.pid != agent_pgid:
                    signal_group(proc.pid, signal.SIGKILL)  # a group the turn started: all of it
                kill_exact(proc)
                killed.add(proc.pid)
            if not hit:
                break
            pending |= set(hit)
            pending = await wait_gone(pending, deadline)
            if trio.current_time() >= deadline:
                break
        survivors = await wait_gone(pending, deadline)
        return sorted(killed), sorted(p.pid for p in survivors)

    async def _kill_agent(self) -> tuple[list[int], list[int]]:
        """Kill and sweep the agent's whole tree; the agent is dead from now on."""
        assert self.tree is not None
        self.dead = True
        if self.tree.process.returncode is None:
            self.tree.interrupt(signal.SIGKILL)  # snapshot, then the group: no grace left to give
        await self.tree.sweep(self._scanner)
        report = self.tree.report
        return sorted(set(report.killed) | set(report.swept)), report.survivors

    # ------------------------------------------------------------ the end

    async def close(self, grace: float = CLOSE_GRACE) -> list[int]:
        """End the agent: close its stdin, let it exit for ``grace``, then kill and sweep its tree.

        Returns the pids that outlived the sweep (empty when all is well).
        """
        if self.tree is None:
            return []
        process = self.tree.process
        if not self.dead and process.returncode is None and process.stdin is not None:
            with trio.move_on_after(grace):
                if self.conn.close_session() is not None:
                    # ``session/close`` (the agent advertised it): its work ends and its
                    # resources are freed by the agent itself, before stdin closes.
                    await self._flush()
                    with trio.move_on_after(min(grace, SESSION_CLOSE_WAIT)):
                        await self._closed_answer()
                async with self._write_lock:
                    await process.stdin.aclose()
                await self._exited.wait()
        _, survivors = await self._kill_agent()
        return survivors

    async def _closed_answer(self) -> None:
        """Wait for the answer to ``session/close`` (no prompt runs: the events are the setup's)."""
        while not self._exited.is_set():
            event = await self._events.receive()
            if isinstance(event, SessionClosed | RequestFailed | _Exited):
                if isinstance(event, RequestFailed):
                    log.info("agent %d: session/close failed: %s", self.pid, shown(event.reason, lines=False))
                return

    async def kill_unopened(self) -> tuple[list[int], list[int]]:
        """End an agent whose start did not finish: kill its tree at once (a stop is waiting,
        and there is no session to close). ``(killed, survivors)``."""
        if self.tree is None or self.dead:
            return [], []
        return await self._kill_agent()

    async def close_if_idle(self, timeout: float) -> bool:
        """Close the agent if no prompt ran for ``timeout`` seconds; did it?"""
        if self.busy or self.dead or self.idle_for() < timeout:
            return False
        await self.close()
        return True


class PromptStream:
    """The events of one turn (see :meth:`AcpAgent.prompt`); ends after :class:`PromptEnded`."""

    def __init__(self, agent: AcpAgent) -> None:
        self._agent = agent
        self._queue: deque[AcpEvent] = deque()
        self._done = False
        self._sent = False

    def __aiter__(self) -> PromptStream:
        return self

    def discard(self) -> list[AcpEvent]:
        """After a cancel has returned: take, without waiting, what the cancelled prompt left
        queued (its answer included), so the next prompt's stream starts clean. The caller
        keeps nothing of it but a session id (stop contract: leftovers are discarded)."""
        left = list(self._queue)
        self._queue.clear()
        while not self._done:
            try:
                event = self._agent._events.receive_nowait()
            except trio.WouldBlock:
                break
            if isinstance(event, _Exited | PromptEnded):
                self._done = True
            if not isinstance(event, _Exited):
                left.append(event)
        return left

    async def __anext__(self) -> AcpEvent:
        agent = self._agent
        if self._queue:
            return self._queue.popleft()
        if self._done:
            raise StopAsyncIteration
        if not self._sent:
            self._sent = True
            await agent._flush()
        while True:
            event = await agent._events.receive()
            if isinstance(event, _Exited):
                self._done = True
                cancelled = agent.conn.cancelling or agent.dead
                agent.conn.prompt_id = None
                agent.conn.cancelling = False
                ended = PromptEnded(
                    STOP_EXITED, cancelled=cancelled, error=f"the agent exited (status {event.returncode})"
                )
                if cancelled:
                    return ended
                self._queue.append(ended)
                return Error(f"the agent exited (status {event.returncode}) before ending the turn: {agent._why()}")
            if isinstance(event, PromptEnded):
                self._done = True
                return event
            if isinstance(event, SessionReady | Initialized | Authenticated | SessionClosed | RequestFailed):
                continue  # setup answers; a failed prompt is followed by its PromptEnded
            return event


@asynccontextmanager
async def open_acp_agent(
    launch: Launch,
    *,
    marker: str,
    home: str | None = None,
    extra_env: Mapping[str, str] = {},
    session_cwd: str | None = None,
    saved_session: str | None = None,
    unattended: bool = True,
    start_timeout: float = START_TIMEOUT,
    tap: Callable[[str, bytes], None] | None = None,
    restart_after_cancel: bool = False,
    sandbox: Sequence[str] = (),
    state_dir: Path | None = None,
    auth_method: str | None = None,
    startup: StartupKill | None = None,
    usage_totals: Literal["turn", "session"] = "turn",
) -> AsyncIterator[AcpAgent]:
    """Start an ACP agent and open a session; on exit, close it and sweep its tree.

    ``marker`` is the ``CORRAL_TURN`` value every process of the agent inherits (one per
    agent process, e.g. ``acp-<channel>-<agent>-<n>``). ``launch.files`` are written under
    ``home`` first. ``session_cwd`` (default: the launch's cwd, made absolute) is the
    session's working directory. ``sandbox`` is the argv the agent starts behind (its MCP
    servers and tools are inside with it). ``state_dir`` is corral's state folder, when
    ``home`` is inside it: its folders down to ``home`` are tightened too
    (:func:`~supervisor.procs.files.write_home_files`). ``auth_method`` is the method
    ``authenticate`` is called with before the session (``acp_auth``).

    A start that does not finish — cancelled by a stop, failed, or out of ``start_timeout`` —
    kills the agent's tree at once, with no grace (there is no session to close, and a stop
    is waiting), and adds what it killed to ``startup``.
    """
    if home is not None:
        await trio.to_thread.run_sync(
            partial(write_home_files, Path(home), dict(launch.files), state_dir=state_dir)
        )
    env = agent_environment(launch.env, home=home, marker=marker, extra=extra_env)
    agent = AcpAgent(
        launch,
        env=env,
        marker=marker,
        unattended=unattended,
        session_cwd=session_cwd or os.path.abspath(launch.cwd),
        tap=tap,
        restart_after_cancel=restart_after_cancel,
        start_timeout=start_timeout,
        sandbox=sandbox,
        auth_method=auth_method,
        usage_totals=usage_totals,
    )
    opened = False
    try:
        async with trio.open_nursery() as nursery:
            try:
                with trio.move_on_after(start_timeout) as start_scope:
                    await agent._start(nursery, saved_session)
                if start_scope.cancelled_caught:
                    raise AcpAgentError(f"the agent did not open a session within {start_timeout:g}s: {agent._why()}")
                opened = True
                yield agent
            finally:
                with trio.CancelScope(shield=True):
                    if opened:
                        await agent.close()
                    else:
                        killed, survivors = await agent.kill_unopened()
                        if startup is not None:
                            startup.add(killed, survivors)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The readers never raise, so a group holds the one error of the start or the body:
        # the caller sees it as itself, not wrapped.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
