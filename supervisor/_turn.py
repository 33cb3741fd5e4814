"""One turn: an agent handling one message, from preparation to teardown.

Phases: *prepare* (folders, launch), *start* (the point of no return: the spawn, or the
prompt written on stdin — the ledger is asked right before each), *stream* (stdout lines
through the adapter's parser into the store), *finish* (teardown).

The turn runs inside a cancel scope the supervisor owns: a stop cancels it. Teardown runs
shielded in ``finally`` and always does the same things in the same order: end the
process tree (interrupt, grace, SIGKILL, sweep), drain what the CLI was still flushing —
only until a deadline, since an escaped grandchild can hold the pipe open — keeping only
the session id if the turn was stopped, then report.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from adapters import Adapter, get_adapter
from adapters._base import (
    Error,
    Event,
    Launch,
    Result,
    SessionId,
    StaleSession,
    Status,
    Text,
    Todos,
    ToolResult,
    ToolUse,
    TurnRequest,
    Unparsed,
)

from ._config import AgentConfig
from ._files import private_file, private_folder
from ._ledger import OutputKind, TurnTicket
from ._lines import Line, LineReader
from ._store import Pending, StoreError
from ._text import repair_text
from ._tree import STORE_MARKER, TURN_MARKER, KillReport, ProcessTree, ident, scrubbed_environment, spawn, wait_exited

if TYPE_CHECKING:
    from ._supervisor import Supervisor

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


class Turn:
    """One agent handling one message. Created and driven by the supervisor."""

    def __init__(self, sup: Supervisor, channel: str, ticket: TurnTicket, agent: AgentConfig, prompt: str) -> None:
        self.sup = sup
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
        self._text: list[str] = []
        self._streamed = ""
        self._last_message = ""
        self._last: Pending | None = None
        self._result: Result | None = None
        self._error: str | None = None
        self._parser: Any = None

    # ------------------------------------------------------------ helpers

    @property
    def author(self) -> str:
        """Who the turn's entries are by."""
        return f"agent:{self.agent.name}"

    @property
    def generation(self) -> int:
        """The generation the turn began under."""
        return self.ticket.generation

    def _stale(self) -> bool:
        return self.sup.ledger.is_stale(self.channel, self.turn_id)

    def _silenced(self) -> bool:
        """Stopped by a user (stale) or by shutdown: nothing more of it may be stored."""
        return self.stop_reason is not None or self._stale()

    def _post(self, kind: str, text: str, meta: dict[str, Any] | None = None) -> None:
        """Submit an entry unless the turn is stale (ledger decides, no checkpoint before submit)."""
        if self.stop_reason is not None or not self.sup.ledger.keep_output(self.channel, self.turn_id, OutputKind.OTHER):
            return
        self._last = self.sup.store.submit_entry(
            self.channel, self.author, kind, text, turn=self.turn_id, generation=self.generation, meta=meta
        )

    def _flush_text(self) -> None:
        if self._text:
            text = "".join(self._text)
            self._text.clear()
            self._streamed += text
            self._last_message = text
            self._post("message", text)

    def _handle(self, event: Event) -> None:
        """Map one parser event to the transcript, the session or the plan."""
        if isinstance(event, SessionId):
            if self.sup.ledger.keep_output(self.channel, self.turn_id, OutputKind.SESSION):
                self.sup.store.save_session(self.channel, self.agent.name, event.id, self.cwd)
            return
        if isinstance(event, Text) and event.delta:
            self._text.append(event.text)
            return
        self._flush_text()
        if isinstance(event, Text):
            self._streamed += event.text
            self._last_message = event.text
            self._post("message", event.text)
        elif isinstance(event, Status):
            self._post("status", event.text)
        elif isinstance(event, ToolUse):
            self._post("tool", f"{event.name}: {event.preview}", {"tool": event.name, "input": event.preview})
        elif isinstance(event, ToolResult):
            self._post("tool", f"→ {event.preview}", {"result": event.preview, "is_error": event.is_error})
        elif isinstance(event, Todos):
            if self._silenced():
                return
            # Repaired here, not only in the entry: the plan is saved as a write of its own.
            items = [{"content": repair_text(i.content), "status": i.status} for i in event.items]
            self.sup.store.save_todos(self.channel, self.agent.name, items)
            self._post("todos", _todo_summary(items), {"todos": items, "agent": self.agent.name})
        elif isinstance(event, Result):
            self._result = event
        elif isinstance(event, Error):
            self._error = event.text
            self._post("error", event.text)
        elif isinstance(event, StaleSession):
            self.outcome.stale_session = True
        elif isinstance(event, Unparsed):
            log.warning("[%s %s] unparsed line (%s): %.200s", self.channel, self.turn_id, event.reason, event.line)

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
        finally:
            with trio.CancelScope(shield=True):
                await self._teardown()
        return self.outcome

    async def _prepare_and_stream(self, session_id: str | None) -> None:
        sup = self.sup
        request = self._request(session_id)
        self._parser = self.adapter.new_parser(request)
        launch = self.adapter.build_launch(request)
        env = self._environment(launch)
        await trio.to_thread.run_sync(_write_files, Path(request.home), launch.files)
        if sup.hooks.preparing is not None:
            await sup.hooks.preparing(self.channel, self.turn_id)
        # The point of no return: the ledger is asked, then the spawn follows at once.
        if not sup.ledger.may_start(self.channel, self.turn_id):
            return
        spawner = sup.hooks.spawn or spawn
        cgroup = None
        if sup.cgroups is not None:
            try:
                cgroup = sup.cgroups.create(self.turn_id, self.agent.cgroup_limits)
            except OSError as exc:  # e.g. the subtree was removed under us: the sweep still works
                log.warning("[%s %s] no cgroup for this turn (%s): its stop falls back to the sweep", self.channel, self.turn_id, exc)
        sup.spawning += 1
        try:
            extra = {} if cgroup is None else {"cgroup": cgroup}
            process = await spawner(launch.argv, env=env, cwd=launch.cwd, stdin_pipe=launch.stdin is not None, **extra)
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            sup.spawning -= 1
        # No checkpoint between the spawn returning and the registration: a stop that
        # landed during the spawn is seen here and the process dies at once.
        self.tree = ProcessTree(process, self.turn_id, cgroup)
        sup.registry.register(self.channel, self.turn_id, self.tree)
        leader = ident(process.pid)
        sup.store.turn_spawned(self.turn_id, process.pid, leader.started if leader else None)
        log.info("[%s %s] started %s (pid %d)", self.channel, self.turn_id, self.agent.name, process.pid)
        if launch.stdin is not None:
            await self._write_stdin(process, launch.stdin)
        await self._stream(process)

    async def _write_stdin(self, process: trio.Process, data: bytes) -> None:
        assert process.stdin is not None
        try:
            if self.sup.ledger.may_start(self.channel, self.turn_id):
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
                for event in self._parser.feed(line.text()):
                    self._handle(event)
            # Deltas stay buffered across reads: one contiguous run of them is one message,
            # stored when the next event (or the end of the turn) closes it.
            if self._last is not None and self._last.failed:
                return StoreError("an entry of this turn could not be stored")

    async def _read_or_show_text(self, reader: LineReader) -> list[Line]:
        """The next lines; a run of text the agent has gone quiet after is stored meanwhile,
        so an agent that says something and then works (or waits) shows it at once.

        Only for parsers whose runs are whole lines (they have ``end_text_run``): a model's
        token deltas may pause mid-sentence, and are held until the next event."""
        end_run = getattr(self._parser, "end_text_run", None)
        if self._text and end_run is not None:
            with trio.move_on_after(TEXT_QUIET_SECONDS):
                return await reader.read_lines()  # cancel-safe: nothing is consumed on a cancel
            self._flush_text()
            end_run()
        return await reader.read_lines()

    async def _drain_after_exit(self, process: trio.Process, drain: trio.CancelScope) -> None:
        """Once the CLI has exited, stop waiting for EOF after a deadline: an escaped
        descendant may hold stdout open forever."""
        await wait_exited(process)
        drain.deadline = trio.current_time() + DRAIN_SECONDS

    async def _pump_stderr(self, process: trio.Process) -> None:
        assert process.stderr is not None
        reader = LineReader(process.stderr, max_line=64 * 1024)
        feed = getattr(self._parser, "feed_stderr", None)
        while lines := await reader.read_lines():
            for line in lines:
                text = line.text()
                log.info("[%s %s] stderr: %s", self.channel, self.turn_id, text[:STDERR_LOG_CHARS])
                if feed is not None:
                    for event in feed(text):
                        self._handle(event)

    async def _teardown(self) -> None:
        """End the tree, drain leftovers, report. Shielded; same order every time."""
        sup = self.sup
        tree = self.tree
        stopped = self._silenced()
        self.outcome.stopped = stopped
        interrupted = stopped or self.outcome.error is not None
        try:
            if tree is not None:
                if interrupted:
                    await tree.terminate(self.adapter.interrupt_signal, self.agent.limits.stop_grace)
                if interrupted or not self.agent.limits.keep_background:
                    await tree.sweep(sup.scanner)
                else:
                    await tree.process.wait()
                    sup.adopt_background(tree)
                await self._drain_leftovers(tree)
                if not interrupted and self._silenced():
                    # Stopped while finishing (the leftovers were being kept or drained):
                    # a stopped turn keeps nothing alive, whatever keep_background says.
                    self.outcome.stopped = True
                    await tree.sweep(sup.scanner)
                for stream in (tree.process.stdout, tree.process.stderr):
                    if stream is not None:
                        await stream.aclose()
                self.outcome.report = tree.report
                sup.registry.release(self.channel, self.turn_id, tree)
            returncode = tree.process.returncode if tree else None
            if self._parser is not None and tree is not None:
                for event in self._parser.finish(returncode, interrupted=interrupted):
                    self._handle(event)
            self._flush_text()
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
        reader = getattr(self, "_reader", None)
        if reader is None or reader.eof:
            return
        with trio.move_on_after(DRAIN_SECONDS):
            while lines := await reader.read_lines():
                for line in lines:
                    for event in self._parser.feed(line.text()):
                        self._handle(event)

    def _finish_entries(self) -> None:
        """The turn's last words: its final answer or the reason it failed."""
        if self.outcome.stale_session and self.outcome.error is None:
            return  # the supervisor retries without the session; that turn speaks for both
        if self.outcome.error:
            self._post("error", self.outcome.error)
            return
        result = self._result
        if result is not None and result.ok and self._error is None:
            # The final answer is often what was just streamed (or all of it): post it
            # only if the transcript does not already end with it.
            already = {self._last_message.strip(), self._streamed.strip()}
            if result.text and result.text.strip() not in already:
                self._post("message", result.text)
            self.outcome.ok = True
        elif result is not None and not result.ok:
            if result.text:
                self._post("error", result.text)
            self.outcome.error = result.text or "the agent reported a failure"
        else:
            self.outcome.error = self._error or "the agent ended without a result"

    # ------------------------------------------------------------ launch inputs

    def _request(self, session_id: str | None) -> TurnRequest:
        sup = self.sup
        home = sup.agent_home(self.agent.name)
        self.cwd = str(sup.channel_cwd(self.channel, self.agent))
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
        home = self.sup.agent_home(self.agent.name)
        env = scrubbed_environment(os.environ)
        env.setdefault("PATH", os.defpath)
        env["HOME"] = str(home)
        env["TMPDIR"] = str(home / "tmp")
        env.update(launch.env)
        env.update(self.agent.env)
        env[TURN_MARKER] = self.turn_id  # last, so no config can remove the markers
        env[STORE_MARKER] = self.sup.store.store_id
        return env


def _write_files(home: Path, files: dict[str, str] | Any) -> None:
    private_folder(home / "tmp", within=home.parent.parent)
    for rel, content in dict(files).items():
        path = Path(rel) if os.path.isabs(rel) else home / rel
        private_folder(path.parent, within=home if not os.path.isabs(rel) else None)
        private_file(path, content)


def _todo_summary(items: list[dict[str, str]]) -> str:
    marks = {"completed": "[x]", "in_progress": "[~]", "pending": "[ ]", "cancelled": "[-]"}
    return "; ".join(f"{marks.get(i['status'], '[?]')} {i['content']}" for i in items)


def unfinished(items: list[dict[str, str]]) -> int:
    """How many todos are pending or in progress."""
    return sum(1 for i in items if i.get("status") in ("pending", "in_progress"))
