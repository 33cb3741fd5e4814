"""One turn of an ``adapter = "acp"`` agent: one ``session/prompt`` to a persistent agent process.

It plugs in where :class:`~supervisor.turns.process.Turn` does: the supervisor builds it, runs it in
its worker, cancels its :attr:`AcpTurn.scope` for a stop or a shutdown, waits for
:attr:`AcpTurn.done` and reads :attr:`AcpTurn.outcome`. It asks the ledger the same
questions through the same :class:`~supervisor.turns.process.TurnPorts` (``may_start`` at the point
of no return, ``is_stale``/``keep_output`` before every write) and stores what it says with
the same pure :class:`~supervisor.turns.process.TurnAccount`, so entries, sessions, plans, nudges and
the final answer follow the rules of every other turn.

Phases: *prepare* (the channel's folder, the agent's launch; the agent process is taken from
the :class:`~supervisor.turns.agents.AcpAgentPool` — started, or restarted with ``session/load`` of
the stored session id, before the point of no return: starting an agent calls no model);
*start* (the ledger is asked, then ``session/prompt`` is queued with no checkpoint between);
*stream* (``session/update`` events through the account: message chunks joined per run,
tool calls and results as ``tool`` entries, plans as ``todos``, permission decisions as
``status`` entries; thoughts are dropped by the connection); *finish* (shielded teardown).

The stop of an ACP turn (``stop_reason`` set and the scope cancelled by the supervisor, which
has already moved the generation, dropped the queue and cancelled the plan): the agent's
cancel sequence — ``session/cancel``, pending permissions answered ``cancelled``, up to
``acp_cancel_grace`` for the prompt's ``cancelled`` answer, then corral's kill of every
process the turn started (or of the agent's whole tree, if it did not answer: it restarts on
the next message). :attr:`AcpTurn.ended` says which. What the cancelled prompt still said is
dropped; only the session id is kept (it does not change mid-prompt).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Mapping

import trio

from adapters import Adapter, get_adapter
from adapters._base import Event, Result, Status, TurnRequest
from adapters.acp import AcpEvent, PermissionDecided, PermissionRequested, PromptEnded, acp_settings

from ..config.settings import AgentConfig
from ..core.account import Effect, Post, SavePlan, SaveSession, ShowDraft, TurnAccount
from ..core.ledger import OutputKind, TurnTicket
from ..procs.sandbox import SandboxRefused
from ..procs.tree import STORE_MARKER, KillReport, ProcessTree
from ..store.store import Draft, Pending, StoreError
from .agents import STOP_EXITED, AcpAgent, AcpAgentError, AcpAgentPool, AcpSpec, CancelReport, PromptStream
from .process import TurnLimit, TurnOutcome, TurnPorts

log = logging.getLogger("corral.turn")

#: Bound on the kill that follows a cancel (on top of the grace).
KILL_BUDGET = 5.0


def turn_event(event: AcpEvent) -> Event | None:
    """What an ACP event means to a turn's account (pure). ``None``: nothing to store."""
    if isinstance(event, PermissionDecided):
        return Status(event.describe())
    if isinstance(event, PromptEnded):
        if event.stop_reason == "end_turn":
            return Result("", ok=True)
        if event.stop_reason == STOP_EXITED:
            return None  # the stream said why first (an Error), the account has it
        if event.error:
            return Result(f"The agent failed: {event.error}", ok=False)
        return Result(f"The agent ended the turn: {event.stop_reason}.", ok=False)
    if isinstance(event, PermissionRequested):
        return None  # only with policy=False, which corral's turns never use
    if isinstance(event, Event):
        return event
    return None  # setup answers (Initialized, SessionReady, RequestFailed) are not turn output


def pool_key(channel: str, agent: str) -> tuple[str, str]:
    """The pool's key of a channel's agent: one persistent process per (channel, agent)."""
    return (channel, agent)


class AcpTurn:
    """One ACP agent handling one message. Created and driven by the supervisor."""

    def __init__(
        self, ports: TurnPorts, pool: AcpAgentPool, channel: str, ticket: TurnTicket, agent: AgentConfig, prompt: str
    ) -> None:
        self.ports = ports
        self.pool = pool
        self.channel = channel
        self.ticket = ticket
        self.turn_id = ticket.turn_id
        self.agent = agent
        self.adapter: Adapter = get_adapter(agent.adapter)
        self.settings = acp_settings(agent.options)
        self.prompt = prompt
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.outcome = TurnOutcome()
        self.started_at = time.time()
        self.stop_reason: str | None = None
        """'user' or 'shutdown' once the supervisor has stopped this turn."""
        self.cwd: str | None = None
        self.ended: str | None = None
        """How a stopped prompt ended: ``"cancelled"`` (the agent acknowledged the typed cancel)
        or ``"killed"`` (it did not, or died: its whole tree was killed). None: not stopped
        mid-prompt."""
        self.cancel_report: CancelReport | None = None
        self._agent: AcpAgent | None = None
        self._stream: PromptStream | None = None
        self._account = TurnAccount(self.author, self.turn_id)
        self._last: Pending | None = None

    # ------------------------------------------------------------ what the supervisor reads

    @property
    def author(self) -> str:
        """Who the turn's entries are by."""
        return f"agent:{self.agent.name}"

    @property
    def generation(self) -> int:
        """The generation the turn began under."""
        return self.ticket.generation

    @property
    def stop_grace(self) -> float:
        """The longest a stop of this turn takes: the cancel's grace, then the kill."""
        return self.settings.cancel_grace + KILL_BUDGET

    @property
    def tree(self) -> ProcessTree | None:
        """The agent process's tree (shared by every turn of this channel's agent)."""
        return self._agent.tree if self._agent is not None else None

    # ------------------------------------------------------------ writes (as Turn's)

    def _silenced(self) -> bool:
        return self.ports.ledger.is_stale(self.channel, self.turn_id)

    def _carry_out(self, effects: list[Effect]) -> None:
        """Submit the effects' writes; no checkpoint, so the ledger's answer still holds."""
        store = self.ports.store
        for effect in effects:
            if isinstance(effect, Post):
                self._post(effect.kind, effect.text, dict(effect.meta) if effect.meta is not None else None)
            elif isinstance(effect, SaveSession):
                if self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.SESSION):
                    assert self.cwd is not None
                    store.save_session(self.channel, self.agent.name, effect.session_id, self.cwd)
            elif isinstance(effect, SavePlan):
                store.save_todos(self.channel, self.agent.name, effect.items)
            elif isinstance(effect, ShowDraft):
                # An ACP chunk comes as one notification: shown as it comes.
                if self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.OTHER):
                    store.show_draft(Draft(self.channel, self.author, self.turn_id, effect.draft, effect.text,
                                           time.time()))
            else:
                log.warning("[%s %s] unparsed ACP line (%s): %.200s", self.channel, self.turn_id,
                            effect.reason, effect.line)

    def _post(self, kind: str, text: str, meta: dict[str, object] | None = None) -> None:
        if not self.ports.ledger.keep_output(self.channel, self.turn_id, OutputKind.OTHER):
            return
        self._last = self.ports.store.submit_entry(
            self.channel, self.author, kind, text, turn=self.turn_id, generation=self.generation, meta=meta
        )

    def cut_off(self, reason: str) -> None:
        """Save the open run of text as the stop (or shutdown) decision found it, marked as cut
        off by ``reason``: called in the step that decides, before the notice. Not asked of the
        ledger, which has just silenced the turn: this entry is the decision's own."""
        post = self._account.cut_off(reason)
        if post is None:
            return
        self._last = self.ports.store.submit_entry(
            self.channel, self.author, post.kind, post.text, turn=self.turn_id, generation=self.generation,
            meta=dict(post.meta) if post.meta is not None else None,
        )

    def _handle(self, event: AcpEvent) -> None:
        mapped = turn_event(event)
        if mapped is not None:
            self._carry_out(self._account.on_event(mapped, silenced=self._silenced(), now=trio.current_time()))

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
        except AcpAgentError as exc:
            self.outcome.error = f"{self.agent.name}: {exc}"
        except SandboxRefused as exc:
            self.outcome.error = f"could not start {self.agent.name}: {exc}"
        except OSError as exc:
            self.outcome.error = f"could not start {self.agent.name}: {exc.strerror or exc}"
        finally:
            with trio.CancelScope(shield=True):
                await self._teardown()
        return self.outcome

    def _spec(self, session_id: str | None) -> AcpSpec:
        places = self.ports.places
        home = places.agent_home(self.agent.name, self.channel)
        self.cwd = str(places.channel_cwd(self.channel, self.agent))
        request = TurnRequest(
            prompt="",
            channel=self.channel,
            turn_id=self.turn_id,
            agent=self.agent.name,
            command=self.agent.command,
            args=self.agent.args,
            session_id=session_id,
            model=self.agent.model,
            cwd=self.cwd,
            home=str(home),
            options=dict(self.agent.options),
            unattended=self.agent.unattended,
        )
        extra: Mapping[str, str] = {**self.agent.env, STORE_MARKER: self.ports.store.store_id}
        launch = self.adapter.build_launch(request)
        sandbox = self.ports.sandbox.prefix(
            self.agent.name, cwd=launch.cwd, home=str(home), writable=self.agent.sandbox_write,
            hidden=self.agent.sandbox_hide, network=self.agent.network,
            installation=(*self.agent.command, *self.agent.args),
        )
        return AcpSpec(
            launch,
            # Every process of the agent carries it: the cancel finds the turn's escapees by it
            # (and, like a turn id, it names the supervisor that started it).
            marker=f"t{os.getpid():x}-acp-{secrets.token_hex(4)}",
            home=str(home),
            extra_env=extra,
            session_cwd=self.cwd,
            saved_session=session_id,
            unattended=self.agent.unattended,
            restart_after_cancel=self.settings.restart_after_cancel,
            idle_timeout=self.settings.idle_timeout or float("inf"),
            sandbox=sandbox,
        )

    async def _prepare_and_stream(self, session_id: str | None) -> None:
        ports = self.ports
        spec = self._spec(session_id)
        agent = await self.pool.agent((self.channel, self.agent.name), spec)
        self._agent = agent
        if ports.preparing is not None:
            await ports.preparing(self.channel, self.turn_id)
        # From the agent's answer to the prompt: no checkpoint, so the ledger's answers hold.
        for notice in agent.notices:
            self._post("status", notice)
        agent.notices.clear()
        if agent.session_id is not None and agent.session_id != session_id:
            self._carry_out([SaveSession(agent.session_id)])
        # The point of no return: the ledger is asked, then the prompt is queued at once.
        if not ports.ledger.may_start(self.channel, self.turn_id):
            return
        self._stream = stream = agent.prompt(self.prompt)
        log.info("[%s %s] prompt to %s (agent pid %d)", self.channel, self.turn_id, self.agent.name, agent.pid)
        limits = self.agent.limits
        with trio.CancelScope() as turn_scope:
            if limits.turn_timeout:
                turn_scope.deadline = trio.current_time() + limits.turn_timeout
            while True:
                with trio.move_on_after(limits.stall_timeout or float("inf")) as stall:
                    try:
                        event = await stream.__anext__()
                    except StopAsyncIteration:
                        break
                if stall.cancelled_caught:
                    raise TurnLimit(f"Turn ended: no output for {limits.stall_timeout:g} s (stall_timeout).")
                self._handle(event)
                if self._last is not None and self._last.failed:
                    raise StoreError("an entry of this turn could not be stored")
        if turn_scope.cancelled_caught:
            raise TurnLimit(f"Turn ended: it ran longer than {limits.turn_timeout:g} s (turn_timeout).")

    async def _teardown(self) -> None:
        """Cancel a prompt still in flight (a stop, a limit, a failure), drop its leftovers,
        store the last words. Shielded; the same order every time."""
        stopped = self._silenced()
        self.outcome.stopped = stopped
        agent, stream = self._agent, self._stream
        try:
            if agent is not None and stream is not None and agent.busy:
                report = await agent.cancel(self.settings.cancel_grace)
                self.cancel_report = report
                self.ended = report.ended if report.ended != "idle" else None
                self.outcome.report = KillReport(killed=report.killed, survivors=report.survivors)
                for decision in report.decisions:  # answered "cancelled" by the stop: on record
                    self._handle(decision)
                stream.discard()  # the cancelled prompt's leftovers: only a session id is kept
                log.info("[%s %s] %s: prompt %s after the cancel, killed %s", self.channel, self.turn_id,
                         self.agent.name, self.ended, report.killed)
            elif agent is not None and stream is not None and not self.agent.limits.keep_background:
                # A normal turn's leftovers are swept too (what the prompt started and left).
                killed, survivors = await agent.sweep_turn(KILL_BUDGET)
                self.outcome.report = KillReport(swept=killed, survivors=survivors)
                if killed:
                    log.info("[%s %s] swept what the turn left running: %s", self.channel, self.turn_id, killed)
            self._carry_out(self._account.close_text(silenced=self._silenced()))
            if not self._silenced():
                words = self._account.last_words(self.outcome.error)
                self._carry_out(words.effects)
                self.outcome.ok = words.ok
                self.outcome.error = words.error
            if self._last is not None:
                try:
                    await self._last.committed()
                except StoreError as exc:
                    self.outcome.error = self.outcome.error or f"could not store the turn's output: {exc}"
        except StoreError as exc:
            self.outcome.error = self.outcome.error or f"could not store the turn's output: {exc}"
        finally:
            self.done.set()
