"""The ports a turn reaches the rest of corral through, and what every kind of turn is.

A turn sees the supervisor only through its :class:`TurnPorts`: the ledger's questions
(:class:`TurnLedger`), the store's few writes (:class:`TurnStore`), the registry, the spawner
and the :class:`Places` it runs in. The supervisor sees a turn only as a
:class:`RunningTurn`: it builds one, runs it in its lane, cancels its scope for a stop, a
lost lease or a shutdown, waits for ``done`` and reads ``outcome``. Both kinds of turn (a
per-turn CLI process, :mod:`.process`; a prompt to a persistent ACP agent, :mod:`.acp`) are
one, on one skeleton (:mod:`.base`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from adapters import Adapter

from ..config.settings import AgentConfig
from ..core.budget import BudgetSpent, Prices, TurnLimits
from ..core.ledger import OutputKind
from ..core.usage import TurnRecord, TurnUsage
from ..procs.cgroup import CgroupRoot
from ..procs.covers import CoverWatch
from ..procs.files import private_folder
from ..procs.hooks import Spawner, TurnHook
from ..procs.registry import ProcessRegistry
from ..procs.sandbox import Sandbox

if TYPE_CHECKING:
    from ..net.proxy import NetworkService
from ..procs.tree import KillReport, MarkerScanner, ProcessTree
from ..store.store import Draft, Pending


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
    usage: TurnUsage = field(default_factory=TurnUsage)
    """What the turn spent, as its CLI reported it (tokens, cost, tool calls, wall time)."""
    record: TurnRecord | None = None
    """The same, priced, as it is stored and shown (None: the turn never ran)."""
    stored: bool = False
    """Its record's write is submitted (once: by whoever shows it first, or at the turn's end)."""


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

    def record_usage(self, record: TurnRecord) -> Pending:
        """What the ended turn spent (``turn_usage``), stored before the entry that shows it."""
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
class TurnBudgets:
    """What turns may spend, and the stop a spent budget makes (:mod:`supervisor.core.budget`)."""

    limits: Callable[[str, str], TurnLimits]
    """``(channel, agent) -> TurnLimits``: the tightest budgets that apply to a turn."""
    prices: Prices
    """``[prices]``: for the money budget of a CLI that reports no cost."""
    spent: Callable[[str, str, BudgetSpent], None]
    """``(channel, turn id, what ran out)``: stop the channel as a stop does, with the budget's
    notice. Called in the step the budget is found spent, so the ledger decides in that step."""
    currency: Callable[[str, str], str] | None = None
    """``(channel, agent) -> the currency a turn's cost is stored and shown in`` (None: dollars)."""


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
    refusal: Callable[[], str | None] | None = None
    """Why no turn may start now, if so (the disk guard's: :mod:`supervisor.host.disk`)."""
    covers: CoverWatch | None = None
    """Where a turn registers the covers a replacement on the host would detach (sandboxed
    turns; :mod:`supervisor.procs.covers`)."""
    network: NetworkService | None = None
    """The proxy a turn under a network policy reaches the network through (None: no
    sandbox, so no policy can be enforced)."""
    budgets: TurnBudgets | None = None
    """The turns' budgets and the stop a spent one makes (None: no budgets)."""


class RunningTurn(Protocol):
    """A turn as the supervisor drives it, whatever runs it (a process of its own, or a
    persistent agent's prompt: the adapter's ``runs`` says which)."""

    channel: str
    turn_id: str
    agent: AgentConfig
    adapter: Adapter
    prompt: str
    """What the agent is asked (the supervisor puts what it missed first, before the run)."""
    scope: trio.CancelScope
    """Cancelled by a stop, a lost lease or a shutdown (with ``stop_reason`` set first)."""
    done: trio.Event
    """Set once the shielded teardown is over: nothing of the turn is alive."""
    outcome: TurnOutcome
    stop_reason: str | None
    """'user', 'shutdown', 'lease lost' or 'dropped' once the supervisor has ended the turn."""
    started_at: float
    cwd: str | None
    """The working folder, once prepared."""
    ended: str | None
    """How a stopped persistent agent's prompt ended (``cancelled`` or ``killed``); None otherwise."""

    def end_early(self, why: str) -> None:
        """Kill the turn's tree now and end it with ``why`` (a decision of corral's from outside it)."""
        ...

    @property
    def generation(self) -> int:
        """The generation the turn began under."""
        ...

    @property
    def stop_grace(self) -> float:
        """How long a stopped turn may take to end before its stop calls itself failed."""
        ...

    @property
    def tree(self) -> ProcessTree | None:
        """The process tree the turn runs in (a persistent agent's is shared by its turns)."""
        ...

    @property
    def own_tree(self) -> ProcessTree | None:
        """The tree a stop may end together with others' (``procs.teardown.TreeBatch``): the
        turn's own, once spawned. None for a persistent agent's turn: its tree outlives it,
        and its stop is the agent's own cancel sequence."""
        ...

    def cut_off(self, reason: str) -> None:
        """Save the open run of text as a stop (or shutdown) decision found it, in that step."""
        ...

    def usage_so_far(self) -> TurnUsage:
        """What the turn has spent so far, as its CLI has reported it."""
        ...

    def run(self, session_id: str | None) -> Awaitable[TurnOutcome]:
        """Run the turn to its end; never raises for the turn's own failures."""
        ...

    def steer(self, text: str) -> Awaitable[str | None]:
        """Hand ``text`` (a human's message) to the running turn, mid-turn: None once it is
        written to the agent, else why it could not be (not started, input closed, stale,
        an agent that cannot take one) — the caller then queues the message. The ledger is
        asked right before the first byte is written, with no checkpoint between."""
        ...
