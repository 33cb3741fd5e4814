"""One turn of a per-turn CLI: an agent process of its own, from spawn to teardown.

Phases (on the skeleton of :mod:`.base`): *prepare* (folders, launch, the files written for
the CLI), *start* (the point of no return: the spawn, or the prompt written on stdin — the
ledger is asked right before each), *stream* (stdout lines through the adapter's parser into
the store), *finish* (teardown).

Steering: when the adapter can take a message mid-turn (its ``steer``) and the launch keeps
stdin open (``keep_stdin``), :meth:`Turn.steer` writes the encoded message on the open
stdin, through the one :class:`~supervisor.procs.stdin.AgentInput` the prompt went through
(so writes and the close are in order), asking the ledger right before the first byte. The
input closes when the parser reports the turn's ``Result`` (in the step that reads it) and,
at the latest, first thing in the teardown; a steer before the prompt is written, after the
close, or to a stale turn writes nothing and says why — the caller queues the message.
stdout is still read to its end: what the CLI answers after its first result belongs to the
turn.

The turn runs inside a cancel scope the supervisor owns: a stop cancels it. Teardown runs
shielded in ``finally`` and always does the same things in the same order: end the
process tree (interrupt, grace, SIGKILL, sweep), drain what the CLI was still flushing —
only until a deadline, since an escaped grandchild can hold the pipe open — keeping only
the session id if the turn was stopped, then report.

A turn sees the supervisor only through its :class:`~supervisor.turns.ports.TurnPorts`. What a
turn stores is decided by :class:`~supervisor.core.account.TurnAccount`, pure code from parser
events to :data:`~supervisor.core.account.Effect` values; the turn carries the effects out.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Protocol, runtime_checkable

import trio

from adapters import Launch, Parser, Result

from ..config.settings import AgentConfig
from ..core.account import Post, ShowDraft
from ..core.ledger import TurnTicket
from ..core.text import shown
from ..procs.files import place_credentials, write_home_files
from ..procs.lines import Line, LineReader
from ..procs.sandbox import exec_failure
from ..procs.stdin import CLOSED, AgentInput
from ..procs.tree import ProcessTree, wait_exited
from ..store.store import StoreError
from .base import BaseTurn
from .ports import TurnLimit, TurnPorts

log = logging.getLogger("corral.turn")

#: How long to keep reading a dead CLI's stdout for what it was still flushing.
DRAIN_SECONDS = 0.5
#: A run of whole lines of text (the generic protocol's) the agent has been quiet after this
#: long is stored as it is, rather than held until the next event.
TEXT_QUIET_SECONDS = 0.5
#: Why a steered message was not written, before the turn's start.
NOT_STARTED = "the turn has not started yet"
#: Longest stderr line kept in the log.
STDERR_LOG_CHARS = 2000


@runtime_checkable
class _LineTextRuns(Protocol):
    """A parser whose text deltas are whole lines (the generic protocol's)."""

    def end_text_run(self) -> None: ...


class Turn(BaseTurn):
    """One agent handling one message in a process of its own. Created and driven by the supervisor."""

    def __init__(self, ports: TurnPorts, channel: str, ticket: TurnTicket, agent: AgentConfig, prompt: str) -> None:
        super().__init__(ports, channel, ticket, agent, prompt)
        self._tree: ProcessTree | None = None
        self._parser: Parser | None = None
        self._reader: LineReader | None = None
        self._input: AgentInput | None = None
        """The process's stdin pipe, when the launch has one."""
        self._steerable = False
        """The prompt is written (or there was none) and the launch keeps the input open: a
        steered message may follow, until the input closes."""
        self._said = False
        """A line came on stdout or stderr (the program ran, or bwrap said why it could not)."""
        self._unstartable: str | None = None
        """corral's words for bwrap's own first (and only) stderr line: it could not run the program."""
        self._stdout_seen = False
        """A line came on stdout: the program ran (whatever order the two pipes are read in)."""
        self._stderr_done = trio.Event()
        """The stderr pump reached EOF (set in its ``finally``)."""
        self._printed = 0
        """Bytes of output lines read so far (stdout and stderr), against ``max_output``."""
        self._overflow: TurnLimit | None = None
        """Set once the output passed ``max_output``: the reason the turn is ended."""
        self._reading: trio.CancelScope | None = None
        """The stdout read, cancelled when stderr alone passes ``max_output``."""

    def _posted(self, post: Post) -> None:
        if post.meta and "draft" in post.meta and isinstance(self._parser, _LineTextRuns):
            self._parser.end_text_run()  # (a long run saved in pieces: the next piece is a new run)

    def _drafted(self, draft: ShowDraft) -> None:
        self._draft = draft  # (shown once per read: see _show)

    def _show(self) -> None:
        """Show the open run's latest draft, if a read added to it: once per read, since each
        draft carries the whole run (a burst of deltas is one draft, not one per delta)."""
        draft, self._draft = self._draft, None
        if draft is None or draft.draft != self._account.draft or not self._account.text:
            return  # (its run was saved meanwhile: the entry replaces it)
        self._show_draft(draft)

    @property
    def tree(self) -> ProcessTree | None:
        """The turn's process tree, once spawned."""
        return self._tree

    @tree.setter
    def tree(self, tree: ProcessTree | None) -> None:
        self._tree = tree

    @property
    def own_tree(self) -> ProcessTree | None:
        """Its own: a stop ends it, together with the other stopped turns' trees."""
        return self._tree

    # ------------------------------------------------------------ the turn

    async def _prepare_and_stream(self, session_id: str | None) -> None:
        ports = self.ports
        request = self._request(session_id)
        self._parser = self.adapter.new_parser(request)
        launch = self.adapter.build_launch(request)
        env = self._environment(launch, self.turn_id)
        await trio.to_thread.run_sync(
            partial(write_home_files, Path(request.home), launch.files, state_dir=ports.places.state_dir)
        )
        await trio.to_thread.run_sync(place_credentials, Path(request.home), self.agent.credentials)
        sandbox = self._sandbox(launch, request.home)
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
            assert process.stdin is not None
            self._input = AgentInput(process.stdin)
            await self._send_prompt(self._input, launch)
        await self._stream(process)

    async def _send_prompt(self, agent_input: AgentInput, launch: Launch) -> None:
        """Write the launch's stdin (a CLI's prompt: its point of no return, asked of the ledger
        right before the first byte), then close it unless the launch keeps it for steering."""
        written: str | None = None
        if launch.stdin:
            written = await agent_input.write(launch.stdin, self._may_start)
        if written is None and launch.keep_stdin:
            self._steerable = True
        else:
            await agent_input.aclose()

    def _may_start(self) -> str | None:
        return None if self.ports.ledger.may_start(self.channel, self.turn_id) else "the turn was stopped"

    def _may_steer(self) -> str | None:
        """Asked right before each write of a steered message (no checkpoint between)."""
        if self._silenced():
            return "the turn was stopped"
        if self._limited:
            return "the turn has ended"
        return None

    async def steer(self, text: str) -> str | None:
        """Write ``text`` to the running CLI as the adapter encodes it; None once written,
        else why not (the caller queues it). Nothing is written to a turn not yet started,
        stopped, whose input is closed, or whose process is gone."""
        encode = self.adapter.steer
        if encode is None:
            return await super().steer(text)
        agent_input = self._input
        if agent_input is None:
            return NOT_STARTED if self._tree is None else CLOSED
        if not self._steerable:
            return CLOSED if agent_input.closed else NOT_STARTED  # (or its prompt is being written)
        return await agent_input.write(encode(text), self._may_steer)

    def _close_input(self) -> None:
        """Close the input once the message being written (if any) is whole; no checkpoint."""
        if self._input is not None:
            self._input.close()

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
                    with trio.CancelScope() as self._reading:
                        failure = await self._read_stdout(reader)
                    failure = failure or self._overflow
                if failure is None:
                    await wait_exited(process)  # not reaped: the teardown may still signal its group
                    # What it wrote to stderr as it exited (bwrap's own "execvp" line among it) is
                    # read before the pump is cancelled: its EOF, or the drain's deadline (a kept
                    # background process may hold stderr open).
                    with trio.move_on_after(DRAIN_SECONDS):
                        await self._stderr_done.wait()
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
                if self._count(line):
                    return self._overflow
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
        try:
            await self._pump_stderr_lines(reader)
        finally:
            self._stderr_done.set()

    async def _pump_stderr_lines(self, reader: LineReader) -> None:
        parser = self._parser
        assert parser is not None
        while lines := await reader.read_lines():
            for line in lines:
                if self._overflow is not None or self._count(line):
                    continue  # drained, not logged nor parsed: the turn is being ended
                text = line.text()
                # An agent's stderr cannot forge corral's own log lines (nor drive the reader's terminal).
                log.info("[%s %s] stderr: %s", self.channel, self.turn_id, shown(text[:STDERR_LOG_CHARS], lines=False))
                if not self._said and self.tree is not None and self.tree.sandboxed:
                    self._unstartable = exec_failure(self.agent.name, text)
                self._said = True
                for event in parser.feed_stderr(text):
                    self._handle(event)
            self._show()

    async def _end(self) -> None:
        """End the tree (interrupt, grace, SIGKILL, sweep; or keep a normal turn's background),
        drain the leftovers, and tell the parser how the process ended."""
        ports = self.ports
        tree = self.tree
        interrupted = self.outcome.stopped or self.outcome.error is not None
        if self._input is not None:
            await self._input.aclose()  # first: no message may reach a turn being ended
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
            if (self._unstartable is not None and not self._stdout_seen and tree.process.returncode == 1
                    and self.outcome.error is None):
                # bwrap's own failure, before the program ran (a program that printed first is not).
                self.outcome.error = self._unstartable
            if self._parser is not None:
                for event in self._parser.finish(tree.process.returncode, interrupted=interrupted):
                    self._handle(event)

    async def _drain_leftovers(self, tree: ProcessTree) -> None:
        reader = self._reader
        if reader is None or reader.eof:
            return
        # Past max_output nothing more is stored: the leftovers are read and dropped.
        feed = self._feed if self._overflow is None else (lambda line: None)
        for line in reader.read_ready():  # what is there already, and the EOF: no wake-up
            feed(line)
        if reader.eof:
            return
        with trio.move_on_after(DRAIN_SECONDS):
            while lines := await reader.read_lines():
                for line in lines:
                    feed(line)

    def _count(self, line: Line) -> bool:
        """Count a line of output; True (and the turn's end decided) once past ``max_output``."""
        self._printed += len(line.data) + 1
        cap = self.agent.limits.max_output
        if cap is None or self._printed <= cap or self._overflow is not None:
            return self._overflow is not None
        self._overflow = TurnLimit(f"Turn ended: it printed more than {cap} bytes (max_output); "
                                   "the rest of its output was not stored.")
        if self._reading is not None:
            self._reading.cancel()  # (stderr passed it while stdout was quiet)
        return True

    def _feed(self, line: Line) -> None:
        assert self._parser is not None
        self._said = True
        self._stdout_seen = True
        for event in self._parser.feed(line.text()):
            if isinstance(event, Result):
                # The CLI's turn is over: a later message would start another (Claude Code
                # waits for more input until stdin closes), so it is queued instead.
                self._close_input()
            self._handle(event)
