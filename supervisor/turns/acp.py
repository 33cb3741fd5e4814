"""One turn of an ``adapter = "acp"`` agent: one ``session/prompt`` to a persistent agent process.

It is a :class:`~supervisor.turns.ports.RunningTurn` on the skeleton every turn shares
(:class:`~supervisor.turns.base.BaseTurn`): the supervisor builds it (its adapter declares
``runs = "persistent"``), runs it in its lane, cancels its scope for a stop or a shutdown,
waits for ``done`` and reads ``outcome``. It asks the ledger the same questions through the
same :class:`~supervisor.turns.ports.TurnPorts` (``may_start`` at the point of no return,
``is_stale``/``keep_output`` before every write) and stores what it says with the same pure
:class:`~supervisor.core.account.TurnAccount`, so entries, sessions, plans, nudges and the final
answer follow the rules of every other turn.

Phases: *prepare* (the channel's folder, the agent's launch; the agent process is taken from
the :class:`~supervisor.turns.pool.AcpAgentPool` — started, or restarted with ``session/load`` of
the stored session id, before the point of no return: starting an agent calls no model);
*start* (the ledger is asked, then ``session/prompt`` is queued with no checkpoint between);
*stream* (``session/update`` events through the account: message chunks joined per run,
tool calls and results as ``tool`` entries, plans as ``todos``, permission decisions as
``status`` entries; thoughts are dropped by the connection); *finish* (shielded teardown).

The stop of an ACP turn (``stop_reason`` set and the scope cancelled by the supervisor, which
has already moved the generation, dropped the queue and cancelled the plan): the agent's
cancel sequence — ``session/cancel`` and ``$/cancel_request``, pending permissions answered
``cancelled``, up to
``acp_cancel_grace`` for the prompt's ``cancelled`` answer, then corral's kill of every
process the turn started (or of the agent's whole tree, if it did not answer: it restarts on
the next message). :attr:`AcpTurn.ended` says which. What the cancelled prompt still said is
dropped; only the session id is kept (it does not change mid-prompt). So is the unread
rest of a prompt that did answer, when its turn stopped reading first (a limit, a failure, a
stop just after the answer): the agent's next prompt starts with a clean stream. A stop while the
agent is still starting (before the prompt) kills the half-started agent at once; the turn
reports those pids (:attr:`AcpTurn.startup`) and ``ended = "killed"``.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import ClassVar

import trio

from adapters import Event, Launch, Result, Status
from adapters.acp import AcpEvent, PermissionDecided, PermissionRequested, PromptEnded, acp_settings

from ..config.settings import AgentConfig
from ..core.account import SaveSession
from ..core.ledger import TurnTicket
from ..procs.sandbox import SandboxRefused
from ..procs.tree import KillReport, ProcessTree
from ..store.store import StoreError
from .agents import (
    STOP_EXITED,
    AcpAgent,
    AcpAgentError,
    CancelReport,
    PromptStream,
    StartupKill,
)
from .base import BaseTurn
from .pool import AcpAgentPool, AcpNetwork, AcpSpec
from .ports import TurnLimit, TurnPorts

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



class AcpTurn(BaseTurn):
    """One ACP agent handling one message. Created and driven by the supervisor."""

    own_errors: ClassVar[tuple[type[Exception], ...]] = (AcpAgentError,)

    def __init__(
        self, ports: TurnPorts, pool: AcpAgentPool, channel: str, ticket: TurnTicket, agent: AgentConfig, prompt: str
    ) -> None:
        super().__init__(ports, channel, ticket, agent, prompt)
        self.pool = pool
        self.settings = acp_settings(agent.options)
        self._printed = 0
        """Bytes of text this turn's events carried, against ``max_output``."""
        self.ended: str | None = None
        """How a stopped prompt ended: ``"cancelled"`` (the agent acknowledged the typed cancel)
        or ``"killed"`` (it did not, or died: its whole tree was killed). None: not stopped
        mid-prompt."""
        self.cancel_report: CancelReport | None = None
        self.startup = StartupKill()
        """What a stop (or failure) during the agent's start-up killed: the half-started agent."""
        self._agent: AcpAgent | None = None
        self._stream: PromptStream | None = None

    # ------------------------------------------------------------ what the supervisor reads

    @property
    def stop_grace(self) -> float:
        """The longest a stop of this turn takes: the cancel's grace, then the kill."""
        return self.settings.cancel_grace + KILL_BUDGET

    @property
    def tree(self) -> ProcessTree | None:
        """The agent process's tree (shared by every turn of this channel's agent)."""
        return self._agent.tree if self._agent is not None else None

    async def steer(self, text: str) -> str | None:
        """Hand ``text`` to the running prompt of an agent that takes one into a running turn
        (claude-agent-acp's prompt queueing: a second ``session/prompt`` the running one hands
        off to); the ledger is asked right before it is queued, with no checkpoint between."""
        agent = self._agent
        if agent is None or self._stream is None:
            return "the turn has not started yet"
        if self._silenced():
            return "the turn was stopped"
        why = agent.steer(text)
        if why is None:
            await agent.send_queued()  # (a stop from here on cancels both prompts: they go in order)
        return why

    def _handle(self, event: AcpEvent) -> None:
        mapped = turn_event(event)
        if mapped is not None:
            # What it would store counts against max_output, as a per-turn CLI's lines do.
            self._printed += sum(len(getattr(mapped, name, "") or "") for name in ("text", "preview", "line"))
            super()._handle(mapped)

    # ------------------------------------------------------------ the turn

    def _spec(self, session_id: str | None) -> AcpSpec:
        request = self._request(session_id, prompt="")
        launch = self.adapter.build_launch(request)
        network = self._acp_network(launch, request.home)
        return AcpSpec(
            launch,
            # Every process of the agent carries it: the cancel finds the turn's escapees by it
            # (and, like a turn id, it names the supervisor that started it).
            marker=f"t{os.getpid():x}-acp-{secrets.token_hex(4)}",
            home=request.home,
            extra_env=self._extra_env(),
            session_cwd=self.cwd,
            saved_session=session_id,
            unattended=self.agent.unattended,
            restart_after_cancel=self.settings.restart_after_cancel,
            usage_totals=self.settings.usage_totals,
            idle_timeout=self.settings.idle_timeout or float("inf"),
            sandbox=self._sandbox(launch, request.home) if network is None else (),
            network=network,
            state_dir=self.ports.places.state_dir,
            credentials=self.agent.credentials,
            start_timeout=self.settings.start_timeout,
            auth_method=self.settings.auth,
            startup=self.startup,
        )

    def _acp_network(self, launch: Launch, home: str) -> AcpNetwork | None:
        """Under a network policy, sandboxed: how the agent's process gets its namespace and
        proxy (opened with the process, closed when it ends: it outlives this turn)."""
        network, policy = self.ports.network, self.agent.network
        if not policy.proxied or not self.ports.sandbox.active:
            return None
        if network is None:
            raise SandboxRefused(f"network = {policy.label!r} needs the proxy, which is not running")
        owner = f"{self.agent.name}@{self.channel}"

        @asynccontextmanager
        async def opened() -> AsyncIterator[tuple[Mapping[str, str], tuple[str, ...]]]:
            net = await network.open(owner, policy)
            try:
                yield net.env, self._sandbox(launch, home, net)
            finally:
                await net.aclose()

        return opened

    async def _prepare_and_stream(self, session_id: str | None) -> None:
        ports = self.ports
        spec = self._spec(session_id)
        self._watch_covers()
        key = (self.channel, self.agent.name)
        watch = ports.covers
        idle = self.pool.get(key)
        if (watch is not None and idle is not None and idle.covers_epoch is not None
                and watch.replaced_after(idle.covers, idle.covers_epoch) is not None):
            # Started before a cover of its sandbox was replaced on the host: it sees the
            # new file, so it is closed, and this turn starts a fresh one.
            log.warning("[%s %s] closing %s: a file hidden from it was replaced on the host since it started",
                        self.channel, self.turn_id, self.agent.name)
            await self.pool.close(key)
        epoch = watch.epoch if watch is not None else 0
        agent = await self.pool.agent(key, spec)
        if agent.covers_epoch is None:
            agent.covers, agent.covers_epoch = self._covered, epoch
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
                cap = limits.max_output
                if cap is not None and self._printed > cap:
                    raise TurnLimit(f"Turn ended: it printed more than {cap} bytes (max_output); "
                                    "the rest of its output was not stored.")
        if turn_scope.cancelled_caught:
            raise TurnLimit(f"Turn ended: it ran longer than {limits.turn_timeout:g} s (turn_timeout).")

    async def _end(self) -> None:
        """Cancel a prompt still in flight (a stop, a limit, a failure) and drop its
        leftovers; after a normal end, sweep what the prompt left running. Then the agent
        this turn held is released to the pool's idle watch."""
        try:
            await self._end_prompt()
        finally:
            if self._agent is not None:
                self._agent.release()

    async def _end_prompt(self) -> None:
        agent, stream = self._agent, self._stream
        if stream is None and (self.startup.killed or self.startup.survivors):
            # Stopped (or failed) while the agent was starting: the start killed it at once.
            if self.outcome.stopped:
                self.ended = "killed"
            self.outcome.report = KillReport(killed=list(self.startup.killed), survivors=list(self.startup.survivors))
            log.info("[%s %s] %s: the agent was killed during its start-up: %s", self.channel, self.turn_id,
                     self.agent.name, self.startup.killed)
        elif agent is not None and stream is not None and agent.busy:
            report = await agent.cancel(self.settings.cancel_grace)
            self.cancel_report = report
            self.ended = report.ended if report.ended != "idle" else None
            self.outcome.report = KillReport(killed=report.killed, survivors=report.survivors)
            for decision in report.decisions:  # answered "cancelled" by the stop: on record
                self._handle(decision)
            stream.discard()  # the cancelled prompt's leftovers: only a session id is kept
            log.info("[%s %s] %s: prompt %s after the cancel, killed %s", self.channel, self.turn_id,
                     self.agent.name, self.ended, report.killed)
        elif agent is not None and stream is not None:
            # The prompt has its answer, but a turn that ended before reading its stream to
            # the end (a limit, a failure, a stop landing just after the answer) left the rest
            # queued: dropped here, or the next prompt's stream would start with it (and end
            # at this prompt's answer, leaving its own for the turn after).
            if left := stream.discard():
                log.info("[%s %s] dropped %d events of the prompt the turn did not read", self.channel,
                         self.turn_id, len(left))
            if not self.agent.limits.keep_background:
                # A normal turn's leftovers are swept too (what the prompt started and left).
                killed, survivors = await agent.sweep_turn(KILL_BUDGET)
                self.outcome.report = KillReport(swept=killed, survivors=survivors)
                if killed:
                    log.info("[%s %s] swept what the turn left running: %s", self.channel, self.turn_id, killed)
