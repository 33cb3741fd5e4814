"""Loading and validating ``corral.toml`` into the frozen values of :mod:`.model`.

Every problem is collected — unknown keys (with a did-you-mean), wrong types, unknown
adapters, missing files — and reported together, each with the file, the key and the fix,
before anything starts. ``corral check`` runs exactly this. The model's names are re-exported
here, so ``from supervisor.config.settings import Config`` keeps working.
"""


from __future__ import annotations

import difflib
import functools
import os
import re
import shutil
import socket
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..core.budget import DEFAULT_CURRENCY, Price, TurnLimits, money_budget_refusal
from ..core.daily import DailyLimits
from ..core.netpolicy import HOST, Policy, PolicyError, configured_urls, parse_policy
from ..core.queue import DEFAULT_IDEMPOTENCY_WINDOW, WHEN_FULL
from ..core.results import DELIVERIES
from ..procs.sandbox import MODES, SandboxMode

if TYPE_CHECKING:
    from adapters import Adapter

from .model import (
    DEFAULT_CONFIG_NAME,
    DEFAULT_DISK_RESERVE,
    DEFAULT_LEASE,
    DEFAULT_MAX_HOPS,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MEMORY_MAX,
    DEFAULT_MEMORY_PRESSURE,
    DEFAULT_MEMORY_RESERVE,
    DEFAULT_NETWORK,
    DEFAULT_PIDS_MAX,
    DEFAULT_SOCKET_MODE,
    AgentConfig,
    BridgeAgent,
    BridgeConfig,
    ChannelConfig,
    ClusterConfig,
    Config,
    ConfigError,
    Limits,
    Problem,
    ServerConfig,
)

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "DEFAULT_DISK_RESERVE",
    "DEFAULT_LEASE",
    "DEFAULT_MAX_HOPS",
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_MEMORY_MAX",
    "DEFAULT_MEMORY_PRESSURE",
    "DEFAULT_MEMORY_RESERVE",
    "DEFAULT_NETWORK",
    "DEFAULT_PIDS_MAX",
    "DEFAULT_SOCKET_MODE",
    "AgentConfig",
    "BridgeAgent",
    "BridgeConfig",
    "ChannelConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "Limits",
    "Problem",
    "ServerConfig",
    "load_config",
    "load_server_config",
    "parse_config",
]

_TOP = {"server", "store", "defaults", "agents", "channels", "cluster", "bridges", "prices"}
#: A turn's budgets, in ``[agents.X]``, ``[channels.X]`` and ``[server]`` (the tightest applies).
_BUDGET = {"max_turn_tokens", "max_turn_cost", "max_turn_tool_calls"}
#: A day's budgets, in ``[agents.X]`` and ``[channels.X]`` (each applies on its own).
_DAILY = {"max_daily_tokens", "max_daily_cost"}
_PRICE = {"input", "output", "cache_read", "cache_write", "currency"}
_CLUSTER = {"host", "lease"}
_SERVER = {"socket", "tcp", "token_file", "socket_mode", "socket_group", "cgroup", "sandbox", "bwrap", "max_turns",
           "memory_reserve", "memory_pressure", "disk_reserve", "network", "network_allow",
           "idempotency_window"} | _BUDGET
_STORE = {"path", "url"}
_LIMIT_KEYS = {"stop_grace", "stall_timeout", "turn_timeout", "keep_background", "max_nudges", "memory_max", "pids_max",
               "max_output"}
_QUEUE_KEYS = {"max_queued", "when_full"}
_DEFAULTS = {"agent", "max_hops", "catch_up_entries", "catch_up_bytes"} | _LIMIT_KEYS | _QUEUE_KEYS
_CHANNEL = {"agents", "max_hops", "host", "delivery"} | _BUDGET | _DAILY | _QUEUE_KEYS
_AGENT = {"adapter", "command", "args", "env", "cwd", "model", "unattended", "sandbox_write", "sandbox_hide",
          "sandbox_show",
          "network", "network_allow", "credentials", "max_concurrent", "memory_estimate", "delivery"} \
    | _LIMIT_KEYS | _BUDGET | _DAILY


class _Checker:
    def __init__(self, file: str, base: Path) -> None:
        self.file = file
        self.base = base
        self.problems: list[Problem] = []

    def add(self, key: str, message: str, fix: str) -> None:
        self.problems.append(Problem(self.file, key, message, fix))

    def unknown(self, table: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                fix = f"did you mean {close[0]!r}?" if close else f"remove it; known keys: {', '.join(sorted(allowed))}"
                self.add(f"{prefix}{key}", "unknown key", fix)

    def table(self, data: Mapping[str, Any], key: str, prefix: str = "") -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            self.add(f"{prefix}{key}", f"expected a table, got {type(value).__name__}", f"write it as [{prefix}{key}]")
            return {}
        return value

    def string(self, data: Mapping[str, Any], key: str, prefix: str, default: str | None = None) -> str | None:
        value = data.get(key, default)
        if value is not None and not isinstance(value, str):
            self.add(f"{prefix}{key}", f"expected a string, got {value!r}", f'write {key} = "..."')
            return default
        return value

    def seconds(self, data: Mapping[str, Any], key: str, prefix: str, default: float) -> float:
        value = data.get(key, default)
        # ``not value >= 0`` also rejects NaN (valid TOML), which trio's timeouts refuse.
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            self.add(
                f"{prefix}{key}",
                f"expected a number of seconds (>= 0), got {value!r}",
                f"write {key} = {default:g}",
            )
            return default
        return float(value)

    def boolean(self, data: Mapping[str, Any], key: str, prefix: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            self.add(f"{prefix}{key}", f"expected true or false, got {value!r}",
                     f"write {key} = {str(default).lower()}")
            return default
        return value

    def count(self, data: Mapping[str, Any], key: str, prefix: str, default: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.add(f"{prefix}{key}", f"expected a whole number >= 0, got {value!r}", f"write {key} = {default}")
            return default
        return value

    def strings(self, data: Mapping[str, Any], key: str, prefix: str) -> tuple[str, ...] | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.add(f"{prefix}{key}", f"expected a list of strings, got {value!r}", f'write {key} = ["...", "..."]')
            return None
        return tuple(value)

    def folders(self, data: Mapping[str, Any], key: str, prefix: str, *, must_exist: bool) -> tuple[Path, ...]:
        """A list of paths (relative ones to the config's folder); with ``must_exist``, folders."""
        values = self.strings(data, key, prefix) or ()
        paths = tuple(self.path(v) for v in values)
        if must_exist:
            for path in paths:
                if not path.is_dir():
                    self.add(f"{prefix}{key}", f"{path} is not a folder",
                             f"mkdir -p {path}, or remove it from {key}")
        return paths

    def shown(self, data: Mapping[str, Any], prefix: str) -> tuple[Path, ...]:
        """``sandbox_show``: paths that exist (folders or files), relative ones to the config's folder."""
        paths = tuple(self.path(v) for v in self.strings(data, "sandbox_show", prefix) or ())
        for path in paths:
            if not path.exists():
                self.add(f"{prefix}sandbox_show", f"{path} does not exist",
                         "fix the path, or remove it from sandbox_show")
        return paths

    def credentials(self, data: Mapping[str, Any], prefix: str) -> tuple[tuple[Path, str], ...]:
        """``credentials``: files of the user's HOME, named ``~/REL`` (see :class:`AgentConfig`)."""
        key = f"{prefix}credentials"
        home = Path(os.path.expanduser("~"))
        found: list[tuple[Path, str]] = []
        for value in self.strings(data, "credentials", prefix) or ():
            if not value.startswith("~/"):
                self.add(key, f"{value!r} is not a path in your HOME written as ~/PATH",
                         'name the login file as it sits in your HOME, e.g. "~/.claude/.credentials.json"')
                continue
            path = home / value[2:]
            rel = os.path.normpath(value[2:])
            if rel.startswith("..") or os.path.isabs(rel) or rel in (".", ""):
                self.add(key, f"{value!r} leaves your HOME", 'name a file below it, e.g. "~/.codex/auth.json"')
            elif path.is_dir():
                self.add(key, f"{path} is a folder; only the files named are handed over",
                         f"name the login file in it instead (e.g. \"{value.rstrip('/')}/auth.json\")")
            elif not path.is_file():
                self.add(key, f"{path} does not exist (or is not a regular file)",
                         "log in with the CLI once in your own session (it writes that file), or fix the path")
            elif not os.access(path, os.R_OK):
                self.add(key, f"{path} is not readable by the user corral runs as",
                         "run corral as the user who logged in, or fix the file's owner")
            else:
                found.append((path, rel))
        return tuple(found)

    def path(self, value: str) -> Path:
        expanded = Path(os.path.expanduser(value))
        return expanded if expanded.is_absolute() else (self.base / expanded)

    def limits(self, data: Mapping[str, Any], prefix: str, base: Limits) -> Limits:
        return Limits(
            stop_grace=self.seconds(data, "stop_grace", prefix, base.stop_grace),
            stall_timeout=self.seconds(data, "stall_timeout", prefix, base.stall_timeout),
            turn_timeout=self.seconds(data, "turn_timeout", prefix, base.turn_timeout),
            keep_background=self.boolean(data, "keep_background", prefix, base.keep_background),
            max_nudges=self.count(data, "max_nudges", prefix, base.max_nudges),
            memory_max=self.memory(data, "memory_max", prefix, base.memory_max),
            pids_max=self.pids(data, "pids_max", prefix, base.pids_max),
            max_output=self.byte_count(data, "max_output", prefix, base.max_output),
        )

    def budget(self, data: Mapping[str, Any], prefix: str) -> TurnLimits:
        """``max_turn_tokens``, ``max_turn_cost`` (``0.50``, or ``"0.50 EUR"`` in another
        currency than dollars) and ``max_turn_tool_calls``; absent: no such budget."""
        cost, currency = self.money(data, "max_turn_cost", prefix, "0.50")
        return TurnLimits(self.limit(data, "max_turn_tokens", prefix, 200_000), cost,
                          self.at_least_zero(data, "max_turn_tool_calls", prefix, 50), currency)

    def daily(self, data: Mapping[str, Any], prefix: str) -> DailyLimits:
        """``max_daily_tokens`` and ``max_daily_cost`` (as ``max_turn_cost``); absent: none."""
        cost, currency = self.money(data, "max_daily_cost", prefix, "5")
        return DailyLimits(self.limit(data, "max_daily_tokens", prefix, 1_000_000), cost, currency)

    def money(self, data: Mapping[str, Any], key: str, prefix: str, example: str) -> tuple[Decimal | None, str]:
        """A money budget, ``key = 0.50`` (dollars) or ``key = "0.50 EUR"``: its amount (None:
        absent or wrong, said) and its currency."""
        cost, currency = None, DEFAULT_CURRENCY
        raw = data.get(key)
        if raw is not None:
            amount, _, named = str(raw).strip().partition(" ") if isinstance(raw, str) else (raw, "", "")
            cost = self.amount(amount, f"{prefix}{key}", f'write {key} = {example} (dollars), or '
                               f'{key} = "{example} EUR"', positive=True)
            if named.strip():
                currency = named.strip()
                if not re.fullmatch(r"[A-Z]{3}", currency):
                    self.add(f"{prefix}{key}", f"{currency!r} is not a currency code",
                             f'write {key} = "{example} EUR" (three capital letters), or a number for dollars')
                    cost = None
        return cost, currency

    def amount(self, value: object, key: str, fix: str, *, positive: bool = False) -> Decimal | None:
        """A sum of money: a TOML number or a string of digits, read exactly (``Decimal``)."""
        try:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise InvalidOperation
            found = Decimal(str(value))
        except InvalidOperation:
            found = None
        if found is None or not found.is_finite() or found < 0 or (positive and found == 0):
            self.add(key, f"expected an amount of money{' above 0' if positive else ' (>= 0)'}, got {value!r}", fix)
            return None
        return found

    def at_least_zero(self, data: Mapping[str, Any], key: str, prefix: str, example: int) -> int | None:
        """A whole number >= 0 (0: none at all); absent: None."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.add(f"{prefix}{key}", f"expected a whole number >= 0, got {value!r}",
                     f"write {key} = {example}, or remove it")
            return None
        return value

    def memory(self, data: Mapping[str, Any], key: str, prefix: str, default: str | None) -> str | None:
        value = data.get(key, default)
        if value is None or value == "max":
            return None
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not re.fullmatch(r"[1-9][0-9]*[KMGT]?", text):
            self.add(f"{prefix}{key}", f"expected bytes (a whole number, or with K, M, G or T), got {value!r}",
                     f'write {key} = "2G"')
            return default
        return text

    def byte_count(self, data: Mapping[str, Any], key: str, prefix: str, default: int | None) -> int | None:
        """Bytes (a whole number, or with K/M/G/T), ``"max"`` for none."""
        if key not in data:
            return default
        text = self.memory(data, key, prefix, None)
        if text is None:
            return default if data[key] != "max" else None
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
        return int(text[:-1]) * scale[text[-1]] if text[-1] in scale else int(text)

    def limit(self, data: Mapping[str, Any], key: str, prefix: str, example: int) -> int | None:
        """A limit of things at once: absent (None), or a whole number of at least 1."""
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.add(f"{prefix}{key}", f"expected a whole number >= 1, got {value!r}",
                     f"write {key} = {example} (or remove it{' for the default' if prefix == 'server.' else ''})")
            return None
        return value

    def size(self, data: Mapping[str, Any], key: str, prefix: str, example: str) -> int | None:
        """Bytes: a whole number, or a string with a unit ("512M", "2GiB"); absent: None."""
        from ..procs.memory import parse_bytes  # (no Trio: a client reads [server] too)

        value = data.get(key)
        if value is None:
            return None
        found = (value if isinstance(value, int) and not isinstance(value, bool) and value >= 0
                 else parse_bytes(value) if isinstance(value, str) else None)
        if found is None:
            self.add(f"{prefix}{key}", f"expected bytes (a whole number, or with K, M, G or T), got {value!r}",
                     f'write {key} = "{example}"')
        return found

    def pids(self, data: Mapping[str, Any], key: str, prefix: str, default: int | None) -> int | None:
        value = data.get(key, default)
        if value is None or value == "max":
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.add(f"{prefix}{key}", f"expected a whole number >= 1 (or \"max\"), got {value!r}",
                     f"write {key} = 512")
            return default
        return value


def _check_command(
    check: _Checker, argv: tuple[str, ...], key: str, explicit: bool, install: str | None = None,
) -> tuple[str, ...]:
    """``install``: the command that installs the adapter's CLI, said in the fix."""
    program = argv[0]
    how = f"install it ({install})" if install else "install it"
    if "/" in program:
        resolved = check.path(program)
        if not resolved.exists():
            check.add(key, f"{program!r} does not exist (looked at {resolved})", f"{how}, or give the right path")
        elif not os.access(resolved, os.X_OK):
            check.add(key, f"{resolved} is not executable", f"chmod +x {resolved}")
        return (str(resolved), *argv[1:])
    if shutil.which(program) is None:
        origin = "" if explicit else " (the adapter's default command)"
        check.add(
            key,
            f"{program!r}{origin} is not on PATH",
            f"{how}, or set command = [\"/path/to/it\"] on this agent",
        )
    return argv


def _store_url(check: _Checker, store: Mapping[str, Any]) -> str | None:
    """``[store] url``: a PostgreSQL URL, and not together with ``path``."""
    from ..store.engines import POSTGRES_SCHEMES, is_postgres

    url = check.string(store, "url", "store.")
    if url is None:
        return None
    if not is_postgres(url):
        check.add("store.url", f"expected a PostgreSQL URL ({' or '.join(POSTGRES_SCHEMES)}...), got {url[:20]!r}",
                  'write url = "postgresql://USER@HOST/DATABASE" (a socket folder: "postgresql:///corral?host=/run/'
                  'postgresql"), or use path = "corral.db" for SQLite')
        return None
    if "path" in store:
        check.add("store.url", "both [store] path and url are set: a store is a SQLite file or a PostgreSQL database",
                  "remove one: path for SQLite (the default), url for PostgreSQL")
        return None
    return url


def parse_config(data: Mapping[str, Any], *, file: str = "<config>", base: Path | None = None) -> Config:
    """Validate a parsed TOML document; raise :class:`ConfigError` listing every problem."""
    # Imported here: a client command reads only [server] and never needs the adapters.
    from adapters import KNOWN_ADAPTERS, get_adapter

    base = base or Path.cwd()
    check = _Checker(file, base)
    check.unknown(data, _TOP, "")
    server_config = _server(check, data)

    store = check.table(data, "store")
    check.unknown(store, _STORE, "store.")
    store_path = check.path(check.string(store, "path", "store.", "corral.db") or "corral.db")
    store_url = _store_url(check, store)

    defaults = check.table(data, "defaults")
    check.unknown(defaults, _DEFAULTS, "defaults.")
    limits = check.limits(defaults, "defaults.", Limits())

    agents_raw = check.table(data, "agents")
    agents: dict[str, AgentConfig] = {}
    for name, raw in agents_raw.items():
        prefix = f"agents.{name}."
        if not isinstance(raw, dict):
            check.add(f"agents.{name}", "expected a table", f"write it as [agents.{name}]")
            continue
        adapter_name = check.string(raw, "adapter", prefix)
        if adapter_name is None:
            check.add(f"{prefix}adapter", "missing", f'add adapter = "generic" (one of: {", ".join(KNOWN_ADAPTERS)})')
            continue
        if adapter_name not in KNOWN_ADAPTERS:
            close = difflib.get_close_matches(adapter_name, list(KNOWN_ADAPTERS), n=1)
            check.add(
                f"{prefix}adapter",
                f"unknown adapter {adapter_name!r}",
                f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(KNOWN_ADAPTERS)}",
            )
            continue
        adapter = get_adapter(adapter_name)
        check.unknown(raw, _AGENT | adapter.option_keys, prefix)
        command = check.strings(raw, "command", prefix)
        if command == ():
            check.add(f"{prefix}command", "is empty", 'write command = ["program", "arg"]')
            command = None
        # The adapter checks its own keys: the config knows none of them.
        checked = adapter.check_options({k: raw[k] for k in adapter.option_keys if k in raw})
        for problem in checked.problems:
            check.add(f"{prefix}{problem.key}", problem.message, problem.fix)
        if command is None and checked.command is not None:
            command = _check_command(check, checked.command, f"{prefix}{checked.command_key}", False)
        elif command is None and not adapter.default_command:
            if "command" not in raw and checked.command_key is None:
                what, fix = adapter.needs_command
                check.add(f"{prefix}command", f"the {adapter_name} adapter {what}", fix)
            command = ()
        elif command is not None:
            same = adapter.default_command[:1] == command[:1]  # (the CLI's own name: its install applies)
            command = _check_command(check, command, f"{prefix}command", True, adapter.install if same else None)
        else:
            command = _check_command(check, adapter.default_command, f"{prefix}adapter", False, adapter.install)
        env_raw = raw.get("env", {})
        if not isinstance(env_raw, dict) or not all(isinstance(v, str) for v in env_raw.values()):
            check.add(f"{prefix}env", f"expected a table of strings, got {env_raw!r}",
                      f'write [agents.{name}.env] with KEY = "value"')
            env_raw = {}
        if "HOME" in env_raw:
            check.add(f"{prefix}env.HOME",
                      "corral gives each (agent, channel) a HOME of its own (its sessions and settings stay in "
                      "their channel); one HOME for all would share them",
                      "remove HOME from env: hand login files over with credentials = [\"~/...\"], "
                      "share a folder with sandbox_write (or sandbox_show, read-only)")
            env_raw = {k: v for k, v in env_raw.items() if k != "HOME"}
        cwd_s = check.string(raw, "cwd", prefix)
        cwd = check.path(cwd_s) if cwd_s else None
        if cwd is not None and not cwd.is_dir():
            check.add(f"{prefix}cwd", f"{cwd} is not a directory",
                      f"mkdir -p {cwd}, or remove cwd to use a folder per channel")
        options = dict(checked.options)
        agents[name] = AgentConfig(
            name=name,
            adapter=adapter_name,
            command=command or (),
            args=check.strings(raw, "args", prefix) or (),
            env=dict(env_raw),
            cwd=cwd,
            model=check.string(raw, "model", prefix),
            limits=check.limits(raw, prefix, limits),
            unattended=check.boolean(raw, "unattended", prefix, True),
            options=options,
            sandbox_write=check.folders(raw, "sandbox_write", prefix, must_exist=True),
            sandbox_hide=check.folders(raw, "sandbox_hide", prefix, must_exist=False),
            sandbox_show=check.shown(raw, prefix),
            network=_network(check, raw, prefix, server_config, adapter, env_raw, options),
            network_implicit="network" not in raw and server_config.network is None,
            credentials=check.credentials(raw, prefix),
            max_concurrent=check.limit(raw, "max_concurrent", prefix, 4),
            memory_estimate=_estimate(check, raw, prefix),
            delivery=_delivery(check, raw, prefix),
            budget=check.budget(raw, prefix),
            daily=check.daily(raw, prefix),
        )

    default_agent = check.string(defaults, "agent", "defaults.")
    if not agents_raw:
        check.add("agents", "no agent is configured", 'add [agents.demo] with adapter = "demo"')
    elif default_agent is None:
        if len(agents_raw) == 1:
            default_agent = next(iter(agents_raw))
        else:
            check.add("defaults.agent", "several agents and no default",
                      f'add agent = "{next(iter(agents_raw))}" to [defaults]')
    elif default_agent not in agents_raw:
        close = difflib.get_close_matches(default_agent, list(agents_raw), n=1)
        check.add("defaults.agent", f"no agent is called {default_agent!r}",
                  f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(agents_raw)}")

    if store_url is None:
        _store_outside_working_folders(check, store_path, agents)
    channels = _channels(check, data, set(agents_raw))
    cluster = _cluster(check, data)
    if "cluster" in data and store_url is None:
        check.add("cluster", "a fleet shares one PostgreSQL store, and [store] url is not set",
                  'set [store] url = "postgresql://..." on every host, or remove [cluster]')
    for name, table in channels.items():
        if table.host is not None and store_url is None:
            check.add(f"channels.{name}.host", "pins the channel to a fleet host, and [store] url is not set",
                      'set [store] url = "postgresql://..." (a fleet), or remove host')
    bridges = _bridges(check, data, set(agents))
    prices = _prices(check, data)
    _budgets(check, server_config, channels, agents, prices)
    max_hops = check.count(defaults, "max_hops", "defaults.", DEFAULT_MAX_HOPS)
    catch_up_entries = check.count(defaults, "catch_up_entries", "defaults.", 20)
    catch_up_bytes = check.count(defaults, "catch_up_bytes", "defaults.", 16 * 1024)
    max_queued, when_full = _queue_policy(check, defaults, "defaults.")

    if check.problems:
        raise ConfigError(check.problems)
    return Config(
        path=None,
        server=server_config,
        store_path=store_path,
        state_dir=store_path.parent / (store_path.stem + ".d"),
        store_url=store_url,
        default_agent=default_agent or "",
        limits=limits,
        agents=agents,
        channels=channels,
        max_hops=max_hops,
        catch_up_entries=catch_up_entries,
        catch_up_bytes=catch_up_bytes,
        cluster=cluster,
        bridges=bridges,
        prices=prices,
        max_queued=max_queued,
        when_full=when_full or "refuse",
    )


def _store_outside_working_folders(check: _Checker, store_path: Path, agents: Mapping[str, AgentConfig]) -> None:
    """No agent's ``cwd`` may hold the store's folder: there an agent writes freely (a planted
    journal SQLite would replay over the store; a ``git clean`` or ``rm -rf`` of its folder)."""
    store_dir = Path(os.path.realpath(store_path.parent))
    for agent in agents.values():
        if agent.cwd is None:
            continue
        cwd = Path(os.path.realpath(agent.cwd))
        if cwd == store_dir or cwd in store_dir.parents:
            check.add(f"agents.{agent.name}.cwd",
                      f"{agent.cwd} holds the store's folder {store_dir}: the agent would write beside the "
                      "store (files SQLite replays over it at the next start, or a clean-up that deletes it)",
                      f'keep the store in a folder of its own outside it, e.g. [store] path = '
                      f'"{cwd.parent / (cwd.name + "-corral") / store_path.name}", or give the agent another cwd')


_BRIDGE_COMMON = {"type", "rooms", "admins", "users", "servers", "stoppers", "verbosity", "invites", "edit_interval",
                  "retry_max"}
_BRIDGE_AGENT = {"user", "token_file"}


def _bridges(check: _Checker, data: Mapping[str, Any], agent_names: set[str]) -> dict[str, BridgeConfig]:
    """``[bridges.NAME]`` tables: every key known, token files there, no room mapped twice."""
    from . import platforms  # (the entry points are read only for a config with bridges)

    out: dict[str, BridgeConfig] = {}
    seen_rooms: dict[tuple[str, str], str] = {}
    for name, raw in check.table(data, "bridges").items():
        prefix = f"bridges.{name}."
        if not isinstance(raw, dict):
            check.add(f"bridges.{name}", f"expected a table, got {type(raw).__name__}", f"write it as [bridges.{name}]")
            continue
        kind = check.string(raw, "type", prefix)
        if not kind:
            check.add(f"{prefix}type", "missing", f'write type = one of: {", ".join(platforms.known_types())}')
            continue
        try:
            spec = platforms.bridge_type(kind)
        except platforms.UnknownBridgeType as exc:
            check.add(f"{prefix}type", exc.message, exc.fix)
            continue
        check.unknown(raw, _BRIDGE_COMMON | spec.keys, prefix)
        rooms: dict[str, str] = {}
        rooms_raw = check.table(raw, "rooms", prefix)
        if not rooms_raw and not raw.get("invites"):
            check.add(f"{prefix}rooms", "no room is mapped to a channel",
                      f'add [bridges.{name}.rooms] with "!room:server" = "channel" (or invites = true)')
        for room, channel in rooms_raw.items():
            if not isinstance(channel, str) or not channel.strip():
                check.add(f"{prefix}rooms.{room}", f"expected a channel name, got {channel!r}",
                          f'write "{room}" = "general"')
                continue
            # Aliases and IRC channels are case-insensitive; a room written twice is one room.
            server = str(raw.get("homeserver") if kind == "matrix" else raw.get("server"))
            where = (server, room.lower() if kind == "irc" or room.startswith("#") else room)
            if where in seen_rooms:
                check.add(f"{prefix}rooms.{room}", f"the room is mapped twice (also in {seen_rooms[where]})",
                          "map each room to one channel, in one bridge")
                continue
            seen_rooms[where] = f"bridges.{name}.rooms"
            rooms[room] = channel
        names = {}
        for key in ("admins", "users", "servers", "stoppers"):
            names[key] = check.strings(raw, key, prefix)
        verbosity = check.string(raw, "verbosity", prefix, "normal") or "normal"
        if verbosity not in ("quiet", "normal", "verbose"):
            check.add(f"{prefix}verbosity", f"unknown verbosity {verbosity!r}", 'use "quiet", "normal" or "verbose"')
        if not names["admins"] and not names["users"] and not names["servers"]:
            check.add(f"{prefix}admins", "nobody may talk to the agents through this bridge",
                      'add admins = ["@you:server"] (and users or servers for everyone else)')
        common: dict[str, Any] = {
            "name": name, "type": kind, "rooms": rooms,
            "admins": names["admins"] or (), "users": names["users"] or (), "servers": names["servers"] or (),
            "stoppers": names["stoppers"], "verbosity": verbosity,
            "invites": check.boolean(raw, "invites", prefix, False),
            "edit_interval": check.seconds(raw, "edit_interval", prefix, 1.0),
            "retry_max": check.seconds(raw, "retry_max", prefix, 30.0),
        }
        if kind == "matrix":
            out[name] = _matrix_bridge(check, raw, prefix, agent_names, common)
        elif kind == "irc":
            out[name] = _irc_bridge(check, raw, prefix, common)
        else:  # (a platform of the registry's: its own check reads its keys)
            options, secrets, problems = platforms.platform_options(
                spec, raw, rooms, functools.partial(_secret_file, check, raw, prefix=prefix, required=False))
            for problem in problems:
                check.add(f"{prefix}{problem.key}", problem.message, problem.fix)
            out[name] = BridgeConfig(**common, options=options, secrets=secrets)
    return out


def _secret_file(check: _Checker, raw: Mapping[str, Any], key: str, prefix: str, *, required: bool) -> Path | None:
    value = check.string(raw, key, prefix)
    if value is None:
        if required:
            check.add(f"{prefix}{key}", "missing", f'write {key} = "path/to/a/file" holding the secret')
        return None
    path = check.path(value)
    if not path.is_file():
        check.add(f"{prefix}{key}", f"{path} does not exist" if not path.exists() else f"{path} is not a file",
                  f"put the secret in {path} (chmod 600), or fix the path")
    return path


def _matrix_bridge(
    check: _Checker, raw: Mapping[str, Any], prefix: str, agent_names: set[str], common: dict[str, Any]
) -> BridgeConfig:
    homeserver = check.string(raw, "homeserver", prefix)
    if not homeserver or not homeserver.startswith(("http://", "https://")):
        check.add(f"{prefix}homeserver", f"expected the homeserver's URL, got {homeserver!r}",
                  'write homeserver = "https://matrix.example.org"')
    user = check.string(raw, "user", prefix)
    if not user or not user.startswith("@") or ":" not in user:
        check.add(f"{prefix}user", f"expected the bridge's Matrix user id, got {user!r}",
                  'write user = "@corral:example.org"')
    token_file = _secret_file(check, raw, "token_file", prefix, required=True)
    agents: dict[str, BridgeAgent] = {}
    for agent, table in check.table(raw, "agents", prefix).items():
        where = f"{prefix}agents.{agent}."
        if agent not in agent_names:
            close = difflib.get_close_matches(agent, sorted(agent_names), n=1)
            check.add(f"{prefix}agents.{agent}", "names no configured agent",
                      f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(sorted(agent_names))}")
            continue
        if not isinstance(table, dict):
            check.add(f"{prefix}agents.{agent}", "expected a table",
                      f'write {agent} = {{ user = "@{agent}:server", token_file = "..." }}')
            continue
        check.unknown(table, _BRIDGE_AGENT, where)
        agent_user = check.string(table, "user", where)
        agent_token = _secret_file(check, table, "token_file", where, required=True)
        if not agent_user or not agent_user.startswith("@") or ":" not in agent_user:
            check.add(f"{where}user", f"expected the agent's Matrix user id, got {agent_user!r}",
                      f'write user = "@{agent}:example.org"')
        elif agent_token is not None:
            agents[agent] = BridgeAgent(agent_user, agent_token)
    for room in common["rooms"]:
        if not room.startswith(("!", "#")):
            check.add(f"{prefix}rooms.{room}", "is not a Matrix room id (!…) or alias (#…)",
                      'write "!abc:example.org" or "#room:example.org"')
    return BridgeConfig(**common, homeserver=homeserver, user=user, token_file=token_file, agents=agents)


def _irc_bridge(check: _Checker, raw: Mapping[str, Any], prefix: str, common: dict[str, Any]) -> BridgeConfig:
    server = check.string(raw, "server", prefix)
    host, _, port = (server or "").rpartition(":")
    if not host or not port.isdigit():
        check.add(f"{prefix}server", f"expected host:port, got {server!r}", 'write server = "irc.example.org:6697"')
    nick = check.string(raw, "nick", prefix, "corral") or "corral"
    for room in common["rooms"]:
        if not room.startswith(("#", "&")):
            check.add(f"{prefix}rooms.{room}", "is not an IRC channel (#…)", 'write "#general" = "general"')
    return BridgeConfig(
        **common, server=server, nick=nick, password_file=_secret_file(check, raw, "password_file", prefix,
                                                                         required=False),
        tls=check.boolean(raw, "tls", prefix, False),
    )


def _cluster(check: _Checker, data: Mapping[str, Any]) -> ClusterConfig:
    """``[cluster]``: a host name (a short printable name) and a lease of at least a second."""
    table = check.table(data, "cluster")
    check.unknown(table, _CLUSTER, "cluster.")
    host = check.string(table, "host", "cluster.") or socket.gethostname()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", host):
        check.add("cluster.host", f"expected a host name (letters, digits, '.', '_', '-'; 63 at most), got {host!r}",
                  'write host = "h1"')
        host = "invalid"
    lease = check.seconds(table, "lease", "cluster.", DEFAULT_LEASE)
    if "lease" in table and lease < 1:
        check.add("cluster.lease", f"expected at least 1 second, got {table['lease']!r}", "write lease = 10")
        lease = DEFAULT_LEASE
    return ClusterConfig(host, lease)


def _channels(check: _Checker, data: Mapping[str, Any], agent_names: set[str]) -> dict[str, ChannelConfig]:
    """``[channels.NAME]`` tables: members that are configured agents, once each; a hop limit."""
    channels: dict[str, ChannelConfig] = {}
    for name, raw in check.table(data, "channels").items():
        prefix = f"channels.{name}."
        if not isinstance(raw, dict):
            check.add(f"channels.{name}", "expected a table", f'write it as [channels.{name}] with agents = ["..."]')
            continue
        check.unknown(raw, _CHANNEL, prefix)
        members = check.strings(raw, "agents", prefix)
        host = check.string(raw, "host", prefix)
        if not members and host is not None and "agents" not in raw:
            members = ()  # (a table that only pins the channel: every agent may take it)
        elif not members:
            example = ", ".join(f'"{a}"' for a in sorted(agent_names)[:2]) or '"demo"'
            check.add(f"{prefix}agents", "missing or empty: a channel needs at least one agent",
                      f"write agents = [{example}] (the first is the channel's default agent)")
            continue
        ok = True
        for member in members:
            if member not in agent_names:
                ok = False
                close = difflib.get_close_matches(member, sorted(agent_names), n=1)
                check.add(f"{prefix}agents", f"no agent is called {member!r}",
                          f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(sorted(agent_names))}")
        if len(set(members)) != len(members):
            ok = False
            check.add(f"{prefix}agents", f"an agent is listed twice in {list(members)!r}", "list each agent once")
        max_hops = check.count(raw, "max_hops", prefix, DEFAULT_MAX_HOPS) if "max_hops" in raw else None
        if ok:
            max_queued, when_full = _queue_policy(check, raw, prefix)
            channels[name] = ChannelConfig(name, members, max_hops, host=host, delivery=_delivery(check, raw, prefix),
                                           budget=check.budget(raw, prefix), daily=check.daily(raw, prefix),
                                           max_queued=max_queued,
                                           when_full=when_full)
    return channels


def _prices(check: _Checker, data: Mapping[str, Any]) -> dict[str, Price]:
    """``[prices."MODEL"]``: ``input`` and ``output`` (and ``cache_read``, ``cache_write``) per
    million tokens, in ``currency`` (dollars unless it says)."""
    prices: dict[str, Price] = {}
    for model, raw in check.table(data, "prices").items():
        prefix = f'prices."{model}".'
        if not isinstance(raw, dict):
            check.add(f'prices."{model}"', "expected a table",
                      f'write [prices."{model}"] with input = 3.0 and output = 15.0 (per million tokens)')
            continue
        check.unknown(raw, _PRICE, prefix)
        figures: dict[str, Decimal | None] = {}
        for key in ("input", "output", "cache_read", "cache_write"):
            if key in raw:
                figures[key] = check.amount(raw[key], f"{prefix}{key}", f"write {key} = 3.0 (per million tokens)")
            elif key in ("input", "output"):
                check.add(f"{prefix}{key}", "missing", f"add {key} = 3.0 (the price per million tokens)")
        currency = check.string(raw, "currency", prefix, DEFAULT_CURRENCY) or DEFAULT_CURRENCY
        if not re.fullmatch(r"[A-Z]{3}", currency):
            check.add(f"{prefix}currency", f"{currency!r} is not a currency code", 'write currency = "USD"')
        input_, output = figures.get("input"), figures.get("output")
        if input_ is not None and output is not None:
            prices[model] = Price(input_, output, figures.get("cache_read"), figures.get("cache_write"), currency)
    return prices


def _budgets(
    check: _Checker, server: ServerConfig, channels: Mapping[str, ChannelConfig], agents: Mapping[str, AgentConfig],
    prices: Mapping[str, Price],
) -> None:
    """Every budget that can apply to an agent's turn holds together (one currency) and can be
    enforced: a money budget whose cost nobody can know is refused (fail closed, never ignored)."""
    from adapters.acp import acp_settings  # (with the agents; a client reads [server] only)

    for agent in agents.values():
        own = [(f"agents.{agent.name}", agent.budget), ("server", server.budget)]
        base = _combined(check, agent.budget, "server", server.budget, agent.name)
        # What can apply: the agent's and [server]'s, with or without each channel it may serve in.
        applying = [(own, base)] + [
            ([*own, (key, t.budget)], _combined(check, base, key, t.budget, agent.name))
            for t in channels.values() if not t.agents or agent.name in t.agents
            for key in (f"channels.{t.name}",)
        ]
        preset = acp_settings(agent.options).preset if agent.adapter == "acp" else None
        for sources, limits in applying:
            refusal = money_budget_refusal(agent.name, limits, adapter=agent.adapter, preset=preset,
                                           model=agent.model, prices=prices)
            if refusal is not None:
                where = next(key for key, b in sources if b.max_turn_cost == limits.max_turn_cost)
                message, _, fix = refusal.removeprefix(f"agents.{agent.name}: max_turn_cost ").partition(". Fix: ")
                check.add(f"{where}.max_turn_cost", message.replace("cannot be enforced", "cannot be enforced for "
                                                                    f"agent {agent.name}'s turns", 1), fix)
                break
        _daily_budgets(check, agent, [(f"channels.{t.name}", t) for t in channels.values()
                                      if not t.agents or agent.name in t.agents], base, prices, preset)


def _daily_budgets(
    check: _Checker, agent: AgentConfig, channels: list[tuple[str, ChannelConfig]], base: TurnLimits,
    prices: Mapping[str, Price], preset: str | None,
) -> None:
    """A daily money budget of the agent, or of a channel it may serve in, is refused as a
    turn's is when the agent's cost cannot be known (its turns would count as free), and it
    must be in the currency of the other money budgets of its turns (one cost is stored a turn)."""
    tables = [(f"agents.{agent.name}", agent.daily), *((key, t.daily) for key, t in channels)]
    for key, daily in tables:
        if daily.max_daily_cost is None:
            continue
        as_turn = TurnLimits(max_turn_cost=daily.max_daily_cost, currency=daily.currency)
        refusal = money_budget_refusal(agent.name, as_turn, adapter=agent.adapter, preset=preset,
                                       model=agent.model, prices=prices)
        if refusal is not None:
            message, _, fix = refusal.removeprefix(f"agents.{agent.name}: max_turn_cost ").partition(". Fix: ")
            check.add(f"{key}.max_daily_cost", message.replace("cannot be enforced", "cannot be enforced for "
                                                              f"agent {agent.name}'s turns", 1),
                      fix.replace("max_turn_cost", "max_daily_cost"))
            continue
        others = {base.currency} if base.max_turn_cost is not None else set()
        others |= {d.currency for k, d in tables if k != key and d.max_daily_cost is not None}
        if others - {daily.currency}:
            check.add(f"{key}.max_daily_cost", f"is in {daily.currency}, and another money budget of agent "
                      f"{agent.name}'s turns in {', '.join(sorted(others - {daily.currency}))}",
                      "write every max_turn_cost and max_daily_cost in one currency")


def _combined(check: _Checker, limits: TurnLimits, key: str, other: TurnLimits, agent: str) -> TurnLimits:
    """``limits`` with ``other`` (``key``'s table's) applied; two currencies are a problem."""
    try:
        return limits.tightest(other)
    except ValueError:
        check.add(f"{key}.max_turn_cost", f"is in {other.currency}, and another budget of agent {agent}'s turns "
                  f"in {limits.currency}: neither is tighter", "write every max_turn_cost in one currency")
        return limits


def _queue_policy(check: _Checker, raw: Mapping[str, Any], prefix: str) -> tuple[int | None, str | None]:
    """``max_queued`` (a whole number >= 0; absent: no limit of its own) and ``when_full``."""
    limit = check.count(raw, "max_queued", prefix, 10) if "max_queued" in raw else None
    when = check.string(raw, "when_full", prefix)
    if when is not None and when not in WHEN_FULL:
        close = difflib.get_close_matches(when, WHEN_FULL, n=1)
        check.add(f"{prefix}when_full", f"unknown when_full {when!r}",
                  f"did you mean {close[0]!r}?" if close else f"write one of: {', '.join(WHEN_FULL)}")
        when = None
    return limit, when


def _delivery(check: _Checker, raw: Mapping[str, Any], prefix: str) -> str | None:
    """``delivery``: one of :data:`~supervisor.core.results.DELIVERIES`."""
    value = check.string(raw, "delivery", prefix)
    if value is not None and value not in DELIVERIES:
        close = difflib.get_close_matches(value, DELIVERIES, n=1)
        check.add(f"{prefix}delivery", f"unknown delivery {value!r}",
                  f"did you mean {close[0]!r}?" if close else f"write one of: {', '.join(DELIVERIES)}")
        return None
    return value


def _server(check: _Checker, data: Mapping[str, Any]) -> ServerConfig:
    server = check.table(data, "server")
    check.unknown(server, _SERVER, "server.")
    socket_path = check.path(check.string(server, "socket", "server.", "corral.sock") or "corral.sock")
    tcp = check.string(server, "tcp", "server.")
    token_file_s = check.string(server, "token_file", "server.")
    token_file = check.path(token_file_s) if token_file_s else None
    if tcp is not None:
        host, _, port = tcp.rpartition(":")
        if host not in ("127.0.0.1", "localhost", "[::1]", "::1") or not port.isdigit():
            check.add("server.tcp", f"{tcp!r} is not a loopback address with a port", 'write tcp = "127.0.0.1:8765"')
        elif not 1 <= int(port) <= 65535:
            check.add("server.tcp", f"port {port} is out of range (1 to 65535)", f'write tcp = "{host}:8765"')
        if token_file is None:
            check.add("server.tcp", "a TCP listener needs a token", 'add token_file = "corral.token" to [server]')
    if token_file is not None:
        try:
            mode = token_file.stat().st_mode
        except OSError:
            check.add("server.token_file", f"{token_file} does not exist",
                      f"create it with a secret: (umask 077; openssl rand -hex 32 > {token_file})")
        else:
            if not stat.S_ISREG(mode):
                check.add("server.token_file", f"{token_file} is not a regular file",
                          "point token_file at a file holding the secret")
            elif mode & 0o077:
                check.add("server.token_file",
                          f"{token_file} is readable by other users (mode {stat.S_IMODE(mode):04o})",
                          f"chmod 600 {token_file}")
    socket_group = check.string(server, "socket_group", "server.")
    if socket_group == "":
        check.add("server.socket_group", "is empty", 'name a group, e.g. socket_group = "corral", or remove the key')
        socket_group = None
    cgroup = check.string(server, "cgroup", "server.", "auto") or "auto"
    if cgroup not in ("auto", "off"):
        from ..procs.cgroup import check_path as check_cgroup_path  # here: client commands never load trio

        problem = check_cgroup_path(Path(cgroup))
        if problem:
            check.add(
                "server.cgroup", problem,
                'name a folder of the cgroup2 mount this user may write (see "grep cgroup2 /proc/self/mountinfo"; '
                'under systemd: Delegate=yes), or write cgroup = "auto" (or "off" for the sweep)',
            )
    sandbox = check.string(server, "sandbox", "server.", "auto") or "auto"
    if sandbox not in MODES:
        check.add("server.sandbox", f"expected \"auto\", \"required\" or \"off\", got {sandbox!r}",
                  'write sandbox = "auto" (a sandbox where the machine allows), "required" or "off"')
        sandbox = "auto"
    bwrap_s = check.string(server, "bwrap", "server.")
    bwrap = str(check.path(bwrap_s)) if bwrap_s else None
    if bwrap is not None and not (os.path.isfile(bwrap) and os.access(bwrap, os.X_OK)):
        check.add("server.bwrap", f"{bwrap} is not an executable file",
                  "name bubblewrap's program (e.g. /usr/bin/bwrap), or remove bwrap to use the one corral ships")
    max_turns, memory_reserve, memory_pressure = _capacity(check, server)
    disk_reserve = check.size(server, "disk_reserve", "server.", "64M")
    idempotency_window = check.seconds(server, "idempotency_window", "server.", DEFAULT_IDEMPOTENCY_WINDOW)
    network, network_allow = _network_words(check, server, "server.")
    if network is not None:
        try:
            parse_policy(cast("str | tuple[str, ...]", network), network_allow, model_hosts=("x.invalid",))
        except PolicyError as exc:
            check.add("server.network", str(exc), 'write network = "internet" (public addresses only) or "host"')
            network = None
    return ServerConfig(
        socket=socket_path, tcp=tcp, token_file=token_file,
        socket_mode=_socket_mode(check, server), socket_group=socket_group, cgroup=cgroup,
        sandbox=cast(SandboxMode, sandbox), bwrap=bwrap, max_turns=max_turns, memory_reserve=memory_reserve,
        memory_pressure=memory_pressure, network=cast("str | tuple[str, ...] | None", network),
        network_allow=network_allow, disk_reserve=DEFAULT_DISK_RESERVE if disk_reserve is None else disk_reserve,
        budget=check.budget(server, "server."),
        idempotency_window=idempotency_window,
    )


def _capacity(check: _Checker, server: Mapping[str, Any]) -> tuple[int | None, int, float]:
    """``max_turns`` (>= 1), ``memory_reserve`` (below what this machine, or its cgroup,
    holds) and ``memory_pressure`` (a percentage above 0)."""
    from ..procs.memory import memory_total  # (no Trio: a client reads [server] too)

    max_turns = check.limit(server, "max_turns", "server.", 32)
    reserve = check.size(server, "memory_reserve", "server.", "512M")
    if reserve is not None:
        total = memory_total()
        if total is not None and reserve >= total:
            check.add("server.memory_reserve",
                      f"{server['memory_reserve']!r} is not less than this machine's memory ({_mib(total)})",
                      f'write memory_reserve = "512M" (at most a fraction of {_mib(total)}), or remove it')
            reserve = None
    pressure = server.get("memory_pressure", DEFAULT_MEMORY_PRESSURE)
    if isinstance(pressure, bool) or not isinstance(pressure, int | float) or not 0 < pressure <= 100:
        check.add("server.memory_pressure", f"expected a percentage above 0 and at most 100, got {pressure!r}",
                  f"write memory_pressure = {DEFAULT_MEMORY_PRESSURE:g} (100: never wait for pressure)")
        pressure = DEFAULT_MEMORY_PRESSURE
    return max_turns, DEFAULT_MEMORY_RESERVE if reserve is None else reserve, float(pressure)


def _estimate(check: _Checker, raw: Mapping[str, Any], prefix: str) -> int | None:
    value = check.size(raw, "memory_estimate", prefix, "400M")
    if value == 0:
        check.add(f"{prefix}memory_estimate", "expected more than 0 bytes", 'write memory_estimate = "400M"')
        return None
    return value


def _mib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n // 1024**2} MiB"


def _network_words(check: _Checker, table: Mapping[str, Any], prefix: str) -> tuple[object, tuple[str, ...]]:
    """A table's ``network`` (a word or a list of strings, None if absent) and ``network_allow``."""
    network = table.get("network")
    if isinstance(network, list):
        if not all(isinstance(v, str) for v in network):
            check.add(f"{prefix}network", f"expected a list of names, got {network!r}",
                      'write network = ["api.example.com", "*.example.org:443"]')
            network = None
        else:
            network = tuple(network)
    elif network is not None and not isinstance(network, str):
        check.add(f"{prefix}network", f"expected a string or a list, got {network!r}", 'write network = "internet"')
        network = None
    allow = check.strings(table, "network_allow", prefix) or ()
    return network, allow


def _network(
    check: _Checker, raw: Mapping[str, Any], prefix: str, server: ServerConfig,
    adapter: Adapter, env: Mapping[str, str], options: Mapping[str, Any],
) -> Policy:
    """An agent's ``network`` and ``network_allow`` (else ``[server]``'s, else what its adapter
    declares, else the default), parsed."""
    model_hosts = adapter.model_hosts
    network, allow = _network_words(check, raw, prefix)
    if network is None:
        network = next(word for word in (server.network, adapter.network, DEFAULT_NETWORK) if word is not None)
    if "network_allow" not in raw:
        allow = server.network_allow
    try:
        return parse_policy(cast("str | tuple[str, ...]", network), allow, model_hosts=model_hosts,
                            base_urls=configured_urls(env, options))
    except PolicyError as exc:
        key = "network_allow" if "network_allow" in str(exc) or _bad_grant(allow) else "network"
        check.add(f"{prefix}{key}", str(exc),
                  'write network = "internet" (public addresses), "model", "host", "none" or a list of names; '
                  'network_allow = ["127.0.0.1:8080", "10.0.0.0/8", "git.internal:443"]')
        return HOST if network == "host" else parse_policy("none")


def _bad_grant(allow: tuple[str, ...]) -> bool:
    try:
        parse_policy("none", allow)
    except PolicyError:
        return True
    return False


def _socket_mode(check: _Checker, server: Mapping[str, Any]) -> int:
    """``socket_mode``: an octal string; the owner can connect, other users cannot."""
    default = DEFAULT_SOCKET_MODE
    value = server.get("socket_mode")
    if value is None:
        return default
    text = value if isinstance(value, str) else ""
    digits = text.removeprefix("0o")
    if not digits or len(digits) > 4 or any(c not in "01234567" for c in digits):
        check.add(
            "server.socket_mode",
            f"expected an octal mode as a string, got {value!r}",
            'write socket_mode = "0660" (quoted)',
        )
        return default
    mode = int(digits, 8)
    if mode & ~0o770:
        check.add(
            "server.socket_mode", f"{text} lets every user on the machine (or a special bit) at the socket",
            'use at most "0660" and name the users\' group in socket_group',
        )
    elif mode & 0o600 != 0o600:
        check.add(
            "server.socket_mode",
            f"{text} does not let corral's own user read and write it",
            'write socket_mode = "0600" or "0660"',
        )
    return mode


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(str(file), "-", "the config file does not exist",
                                   "copy config.example.toml to it, or pass -c FILE")]) from None
    except OSError as exc:
        raise ConfigError([Problem(str(file), "-", f"cannot read it: {exc.strerror}",
                                   "check the path and its permissions")]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([Problem(str(file), "-", f"not valid TOML: {exc}",
                                   f"fix the syntax of {file} at that line")]) from None


def load_server_config(path: str | os.PathLike[str]) -> ServerConfig:
    """Read only ``[server]`` of a config file (paths resolved against its folder).

    What client commands need: a broken ``[agents]`` table or an agent binary missing from
    this PATH never blocks an emergency ``corral stop``. Raises :class:`ConfigError`.
    """
    file = Path(path)
    data = _read_toml(file)
    check = _Checker(str(file), file.resolve().parent)
    server = _server(check, data)
    if check.problems:
        raise ConfigError(check.problems)
    return server


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file; raise :class:`ConfigError` listing every problem."""
    file = Path(path)
    data = _read_toml(file)
    config = parse_config(data, file=str(file), base=file.resolve().parent)
    return replace(config, path=file.resolve())
