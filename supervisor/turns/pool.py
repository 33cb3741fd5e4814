"""The pool of persistent ACP agents: one process per (channel, agent), hosted by a task.

:class:`AcpAgentPool` starts an agent (:func:`.agents.open_acp_agent`) from its
:class:`AcpSpec` when a turn asks for it, restarts a gone one (the next process reopens the
saved session), closes one idle past its spec's timeout, and closes all on shutdown; the
agent process itself, its prompt and its cancel are :mod:`.agents`'.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import trio

from adapters import Launch

from ..procs.files import place_credentials
from .agents import START_TIMEOUT, AcpAgent, StartupKill, open_acp_agent

log = logging.getLogger("corral.acp")

@dataclass(frozen=True, slots=True)
class AcpSpec:
    """Everything needed to start one agent process (see :func:`open_acp_agent`)."""

    launch: Launch
    marker: str
    home: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    session_cwd: str | None = None
    saved_session: str | None = None
    """The session id stored for this (channel, agent), loaded by the first process."""
    unattended: bool = True
    restart_after_cancel: bool = False
    usage_totals: Literal["turn", "session"] = "turn"
    start_timeout: float = START_TIMEOUT
    idle_timeout: float = math.inf
    """Close the agent process after this long without a prompt (the next one starts it again)."""
    sandbox: tuple[str, ...] = ()
    """The argv the agent starts behind (:meth:`supervisor.procs.sandbox.Sandbox.prefix`), or ()."""
    state_dir: Path | None = None
    """corral's state folder, which holds ``home`` (its folders down to it are tightened)."""
    credentials: tuple[tuple[Path, str], ...] = ()
    """Login files copied, read-only, into ``home`` before each start (the agent's ``credentials``)."""
    auth_method: str | None = None
    """``acp_auth``: the method ``authenticate`` is called with before each session opens."""
    startup: StartupKill | None = None
    """Where a start that does not finish records what its kill ended (the waiting turn's)."""
    network: AcpNetwork | None = None
    """Under a network policy: opens the agent's namespace and proxy for as long as its
    process lives, giving the proxy variables and the sandbox prefix that enters it (which
    then replace ``sandbox``); None: ``sandbox`` as it is."""


AcpNetwork = Callable[[], AbstractAsyncContextManager[tuple[Mapping[str, str], tuple[str, ...]]]]
"""See :attr:`AcpSpec.network`."""


class AcpAgentPool:
    """Persistent ACP agents keyed by (channel, agent), each hosted by a task of one nursery.

    What a supervisor's turn needs: :meth:`agent` before a prompt (starts the process, or
    restarts a gone one with ``session/load``) and :meth:`close_all` on shutdown. A stop
    cancels the prompt on the turn's own agent (:meth:`AcpAgent.cancel`, from the turn's
    teardown), so other channels' agents are never touched. An agent idle for its spec's
    ``idle_timeout`` is closed by its own host task (a Trio deadline, no polling). Start it
    with ``pool = AcpAgentPool(nursery)``.
    """

    def __init__(self, nursery: trio.Nursery, *, on_gone: Callable[[tuple[str, str]], None] | None = None) -> None:
        self._nursery = nursery
        self._on_gone = on_gone
        """Told (synchronously) when an agent's process has ended for good: idle timeout, close, failure."""
        self._agents: dict[tuple[str, str], AcpAgent] = {}
        self._closers: dict[tuple[str, str], trio.Event] = {}
        self._gone: dict[tuple[str, str], trio.Event] = {}
        self._starting: dict[tuple[str, str], trio.Event] = {}

    def get(self, key: tuple[str, str]) -> AcpAgent | None:
        """The agent of ``key`` if one is up (no start): an idle one still holds a slot."""
        return self._agents.get(key)

    async def agent(self, key: tuple[str, str], spec: AcpSpec) -> AcpAgent:
        """The running agent of ``key``, started (or restarted with session/load) if needed,
        and held for the caller (:meth:`AcpAgent.hold`): the caller releases it when its turn
        ends."""
        while key in self._starting:
            await self._starting[key].wait()
        agent = self._agents.get(key)
        if agent is not None:
            agent.hold()  # before the await: the idle watch may be due meanwhile
            try:
                await agent.ensure_running(spec.startup)
            except BaseException:
                agent.release()
                raise
            return agent
        self._starting[key] = started = trio.Event()
        try:
            fresh: AcpAgent = await self._nursery.start(self._host, key, spec)
        finally:
            del self._starting[key]
            started.set()
        return fresh

    async def _host(self, key: tuple[str, str], spec: AcpSpec, task_status: trio.TaskStatus[AcpAgent]) -> None:
        close, gone = trio.Event(), trio.Event()
        if spec.home is not None and spec.credentials:
            await trio.to_thread.run_sync(place_credentials, Path(spec.home), spec.credentials)
        try:
            async with AsyncExitStack() as stack:
                extra_env, sandbox = spec.extra_env, spec.sandbox
                if spec.network is not None:  # the agent's network lives as long as its process
                    net_env, sandbox = await stack.enter_async_context(spec.network())
                    extra_env = {**extra_env, **net_env}
                agent = await stack.enter_async_context(open_acp_agent(
                    spec.launch,
                    marker=spec.marker,
                    home=spec.home,
                    extra_env=extra_env,
                    session_cwd=spec.session_cwd,
                    saved_session=spec.saved_session,
                    unattended=spec.unattended,
                    start_timeout=spec.start_timeout,
                    restart_after_cancel=spec.restart_after_cancel,
                    usage_totals=spec.usage_totals,
                    sandbox=sandbox,
                    state_dir=spec.state_dir,
                    auth_method=spec.auth_method,
                    startup=spec.startup,
                ))
                agent.idle_timeout = spec.idle_timeout
                self._agents[key], self._closers[key], self._gone[key] = agent, close, gone
                agent.hold()  # (for the caller of agent(), in the same step as the hand-over)
                task_status.started(agent)
                if await agent.watch_idle(close):
                    log.info("agent %s of %r: idle for %gs, closed", key[1], key[0], spec.idle_timeout)
                    # Forgotten before the close begins: the next message starts a fresh one.
                    del self._agents[key], self._closers[key], self._gone[key]
        finally:
            if self._agents.get(key) is not None and self._closers.get(key) is close:
                del self._agents[key], self._closers[key], self._gone[key]
            gone.set()
            if self._on_gone is not None:
                self._on_gone(key)

    async def close(self, key: tuple[str, str]) -> bool:
        """End the agent of ``key`` and its tree; was there one?"""
        close, gone = self._closers.get(key), self._gone.get(key)
        if close is None or gone is None:
            return False
        close.set()
        await gone.wait()
        return True

    def pids(self) -> set[int]:
        """The agent processes' pids (Trio waits for them: no reaper may take them)."""
        return {agent.tree.pid for agent in self._agents.values() if agent.tree is not None}

    async def close_all(self) -> None:
        """End every agent (shutdown), all at once."""
        async with trio.open_nursery() as nursery:
            for key in list(self._closers):
                nursery.start_soon(self.close, key)
