"""The places a daemon will use, checked before it starts: ``corral check`` and ``corral run``.

The config's own rules (:mod:`.settings`) say whether it is well formed; these say whether
the socket, the store and the state folder can be used on this machine, now: a socket
path too long for ``AF_UNIX``, a folder under a regular file, on ``/proc`` or not writable,
a store path that is a folder, a damaged file or another program's database, a PostgreSQL
store without its driver or that does not answer (a connection is tried). Each answer is
a :class:`Problem` with the path and the fix. Nothing is created or changed here; what the
file system can only tell by trying is reported by ``corral run`` when it tries.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import sqlite3
from pathlib import Path

from ..core.netpolicy import Refused, configured_urls, decide, grant_for, local_urls, parse_address
from ..procs.sandbox import Network, NotStartable, Private, Sandbox, TurnGrants, private_paths, seen_as
from .settings import Config, Problem

#: ``sun_path`` is 108 bytes on Linux, one of them the terminating NUL.
MAX_SOCKET_BYTES = 107
_SQLITE_HEADER = b"SQLite format 3\x00"
#: Virtual file systems where nothing can be created, whatever the permissions say.
_VIRTUAL = (Path("/proc"), Path("/sys"))


def preflight(config: Config) -> list[Problem]:
    """Every problem with the socket, store and state paths of ``config`` (empty: all usable)."""
    file = str(config.path) if config.path else "<config>"
    problems: list[Problem] = []
    socket_path = config.server.socket
    if len(os.fsencode(socket_path)) > MAX_SOCKET_BYTES:
        problems.append(
            Problem(file, "server.socket",
                    f"{socket_path} is {len(os.fsencode(socket_path))} bytes,"
                    f" over the {MAX_SOCKET_BYTES} a Unix socket path may have",
                    'choose a shorter path, e.g. socket = "/run/corral/corral.sock"')
        )
    problems += _folder(file, "server.socket", socket_path.parent, socket_path)
    problems += _group(file, config.server.socket_group)
    if config.store_url is not None:
        problems += _postgres(file, config.store_url)
    else:
        problems += _folder(file, "store.path", config.store_path.parent, config.store_path)
        problems += _store(file, config.store_path)
    problems += _state(file, config.state_dir)
    return problems


def notes(config: Config) -> list[str]:
    """What ``corral check`` tells about a valid config that an operator must know (not problems)."""
    out = []
    store_dir = Path(os.path.realpath(config.store_path.parent)) if config.store_url is None else None
    for agent in config.agents.values():
        granted = [g for g in agent.sandbox_write if store_dir is not None and
                   (store_dir == Path(os.path.realpath(g)) or Path(os.path.realpath(g)) in store_dir.parents)]
        if granted:
            out.append(
                f"agents.{agent.name}.sandbox_write: {granted[0]} holds the store's folder {store_dir}: the "
                "sandbox covers the store's files, and a journal planted beside them is moved aside unread "
                "at the next start; without the sandbox the agent could write the store itself. Keep the "
                "store in a folder of its own for a wall that needs neither"
            )
        if agent.cwd is not None:
            out.append(
                f"agents.{agent.name}.cwd: {agent.cwd} is shared by every channel {agent.name} serves: a turn "
                "in one channel reads and changes what a turn in another wrote there, and turns of two "
                "channels may run in it at once (each keeps its own HOME and TMPDIR). Remove cwd for a "
                "folder per channel"
            )
    return out + budget_notes(config) + network_notes(config)


def budget_notes(config: Config) -> list[str]:
    """What ``corral check`` says of a token or money budget on an agent whose CLI reports its
    usage only at the end of a turn: the budget can act only then (tool calls and time still
    stop the turn mid-way)."""
    from adapters.acp import acp_settings  # (with the agents: only check and run read them)

    from ..core.budget import reporting

    out = []
    for agent in config.agents.values():
        served = [name for name, table in config.channels.items() if not table.agents or agent.name in table.agents]
        limits = [config.turn_limits(channel, agent.name) for channel in (*served, "")]
        if not any(lim.max_turn_tokens is not None or lim.max_turn_cost is not None for lim in limits):
            continue
        preset = acp_settings(agent.options).preset if agent.adapter == "acp" else None
        if reporting(agent.adapter, preset).tokens == "at_the_end":
            what = f"{agent.adapter} (preset {preset})" if preset else agent.adapter
            out.append(
                f"agents.{agent.name}: {what} reports what a turn used only when the turn ends, so its "
                "max_turn_tokens and max_turn_cost can stop a turn only then (one turn may go past them); "
                "max_turn_tool_calls, stall_timeout and turn_timeout still stop it mid-turn"
            )
    return out


def network_notes(config: Config) -> list[str]:
    """What ``corral check`` says of the default network, once per agent it concerns: an agent
    that names no ``network`` and whose ``env`` or options point its CLI at a loopback or
    private address the default refuses — with the line to add."""
    notes = []
    for agent in config.agents.values():
        if not agent.network_implicit or not agent.network.proxied:
            continue
        refused = []
        for url in local_urls(configured_urls(agent.env, agent.options)):
            grant = grant_for(url)
            host, _, port = grant.rpartition(":")
            address = parse_address(host)
            if address is None or isinstance(decide(agent.network, host, int(port), address), Refused):
                refused.append((url, grant))
        if refused:
            urls = ", ".join(url for url, _ in refused)
            grants = ", ".join(f'"{g}"' for g in dict.fromkeys(g for _, g in refused))
            notes.append(
                f"agents.{agent.name}: network is {agent.network.label!r} by default now (public addresses only), "
                f"and its config names {urls}, which that refuses. Add to [agents.{agent.name}]: "
                f"network_allow = [{grants}]  (or network = \"host\" for everything, as before)"
            )
    return notes


#: How long ``corral check`` waits for the PostgreSQL server to answer.
CONNECT_TIMEOUT = 5


def _postgres(file: str, url: str) -> list[Problem]:
    """The driver is installed, and the database answers (a connection, nothing read or written)."""
    from ..store.engines import redact

    try:
        import psycopg
    except ImportError:
        return [Problem(file, "store.url", "the store is on PostgreSQL, but its driver psycopg is not installed",
                        "pip install 'psycopg[binary]>=3.2' into corral's environment (the postgres extra of corral)")]
    try:
        psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT).close()
    except psycopg.Error as exc:
        cause = str(exc).split("\n", 1)[0].strip()
        return [Problem(file, "store.url", f"cannot connect to {redact(url)}: {cause}",
                        "start the PostgreSQL server, create the database and its user, or fix the URL")]
    return []


def _folder(file: str, key: str, folder: Path, path: Path) -> list[Problem]:
    """A folder that exists and is writable, or can be created (``path``: the file ``key`` names in it)."""
    fix = f"point {key} (now {path}) at a folder this user can write, or create it: mkdir -p {folder}"
    resolved = Path(os.path.abspath(folder))
    if any(resolved == v or v in resolved.parents for v in _VIRTUAL):
        # Nothing can be made there, so mkdir is no fix: only another path is.
        return [Problem(file, key, f"{folder} is on a virtual file system where nothing can be created",
                        f"point {key} (now {path}) at a folder this user can write, e.g. under /run or /var/lib")]
    existing = resolved
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [Problem(file, key, f"{folder} cannot be created: {existing} is a file, not a folder", fix)]
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == resolved else f"cannot be created: {existing} is not writable"
        return [Problem(file, key, f"{folder} {what} by this user", fix)]
    return []


def _group(file: str, name: str | None) -> list[Problem]:
    """The socket's group exists, and this user may give a file to it (root, or a member)."""
    if name is None:
        return []
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        return [Problem(file, "server.socket_group", f"there is no group {name!r} on this machine",
                        f"create it (groupadd {name}) and add the operators to it, or remove socket_group")]
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        return [Problem(file, "server.socket_group",
                        f"this user is not in the group {name!r}: it cannot give the socket to it",
                        f"usermod -aG {name} $(id -un) and log in again, or run corral as a member of {name}")]
    return []


def _store(file: str, path: Path) -> list[Problem]:
    """The store is absent (created at start), or a corral database."""
    if not path.exists():
        return []
    fix = "point [store] path at another file, or move this one away (a new store is created)"
    if path.is_dir():
        return [Problem(file, "store.path", f"{path} is a folder, not a database file",
                        f'give the file inside it, e.g. path = "{path / "corral.db"}"')]
    try:
        with path.open("rb") as f:
            header = f.read(len(_SQLITE_HEADER))
    except OSError as exc:
        return [Problem(file, "store.path", f"{path} cannot be read: {exc.strerror}",
                        f"chmod 600 {path}, as the user corral runs as")]
    if not header:
        return []  # an empty file becomes a new store
    if header != _SQLITE_HEADER:
        return [Problem(file, "store.path", f"{path} is not a database (damaged, or another kind of file)", fix)]
    # A rollback journal beside a WAL store is not corral's: a read-only open would refuse to
    # replay it and call the store damaged, and `corral run` moves it aside unread (the store
    # engine's quarantine), so the catalog is read from the file alone.
    planted = os.path.lexists(f"{path}-journal")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro{'&immutable=1' if planted else ''}", uri=True)
        try:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.Error as exc:
        return [Problem(file, "store.path", f"{path} is a damaged database: {exc}", fix)]
    if tables and "entries" not in tables:
        return [Problem(file, "store.path", f"{path} is another program's database (no corral tables)", fix)]
    return []


def _state(file: str, folder: Path) -> list[Problem]:
    """The agents' state folder beside the store: a writable folder, or creatable."""
    if folder.exists() and not folder.is_dir():
        return [Problem(file, "store.path", f"the state folder {folder} is a file",
                        f"move {folder} away; corral keeps agents' state there")]
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        return [Problem(file, "store.path", f"the state folder {folder} is not writable by this user",
                        f"chmod 700 {folder}, as the user corral runs as")]
    return []


def private_of(config: Config, cgroup_subtree: Path | None = None) -> Private:
    """corral's private paths for ``config`` (what no turn may see): the one list the daemon
    and ``corral check`` both plan from."""
    return private_paths(
        state_dir=config.state_dir, store_path=config.store_path, store_url=config.store_url,
        config_path=config.path, token_file=config.server.token_file, socket=config.server.socket,
        cgroup_subtree=cgroup_subtree,
        agent_dirs={a.name: a.cwd for a in config.agents.values() if a.cwd is not None},
        home=os.environ.get("HOME"), runtime_dir=os.environ.get("XDG_RUNTIME_DIR"), user_home=passwd_home(),
        secrets=[path for bridge in config.bridges.values() for path in (
            bridge.token_file, bridge.password_file, *bridge.secrets,
            *(a.token_file for a in bridge.agents.values()))
            if path is not None],
    )


def passwd_home() -> str | None:
    """The daemon user's HOME as the passwd database says (its environment's may differ)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return None


def sandbox_warnings(config: Config, sandbox: Sandbox) -> list[Problem]:
    """What the sandbox will do to each agent that its config may not expect (``corral check``):
    a program it cannot start inside, an ``env`` value or ``cwd`` naming a path its turns
    cannot see or cannot write, and corral's own files covered one by one inside a folder an
    agent is given (replacing one while a turn runs ends that turn: :mod:`..procs.covers`)."""
    file = str(config.path) if config.path else "<config>"
    found: list[Problem] = []
    if not sandbox.active:
        return found
    for agent in config.agents.values():
        prefix = f"agents.{agent.name}"
        home = config.state_dir / "home" / agent.name / "_"
        cwd = agent.cwd or config.state_dir / "work" / agent.name / "_"
        command = agent.command or _default_command(agent.adapter)
        path_env = agent.env.get("PATH", os.environ.get("PATH", os.defpath))
        network: Network = "none" if agent.network.kind == "none" else "proxied" if agent.network.proxied else "host"
        try:
            reach = sandbox.plan(TurnGrants(
                agent.name, cwd=str(cwd), home=str(home), writable=agent.sandbox_write,
                hidden=agent.sandbox_hide, network=network, installation=(*command, *agent.args),
                shown=agent.sandbox_show, program=command[0] if command else None, path_env=path_env,
            ))
        except NotStartable as exc:
            found.append(Problem(file, f"{prefix}.command", f"cannot be started inside the sandbox: {exc}",
                                 "see the fix named for each path"))
            continue
        for key, value in agent.env.items():
            if not value.startswith(("/", "~")) or ":" in value:
                continue
            path = Path(os.path.expanduser(value))
            view = seen_as(reach, path)
            if view == "hidden":
                found.append(Problem(file, f"{prefix}.env.{key}", f"{path} is hidden from its turns",
                                     f'let them read it: sandbox_show = ["{path}"], or write it: '
                                     f'sandbox_write = ["{path}"] in [{prefix}]'))
            elif view == "read-only":
                found.append(Problem(file, f"{prefix}.env.{key}", f"{path} is read-only in its turns",
                                     f'if the CLI writes there (a home, config or cache folder), grant it: '
                                     f'sandbox_write = ["{path}"] in [{prefix}]'))
        unseen = [entry for entry in path_env.split(os.pathsep) if os.path.isabs(entry) and os.path.isdir(entry)
                  and seen_as(reach, entry) == "hidden"]
        if unseen:
            found.append(Problem(
                file, f"{prefix}.env.PATH" if "PATH" in agent.env else prefix,
                f"its PATH has folders its turns cannot see ({', '.join(unseen)}): the tools there will not be found",
                f"let them in, read-only: sandbox_show = [{', '.join(json.dumps(e) for e in unseen)}]"
                f" in [{prefix}] (its own program is shown already)"))
        if agent.cwd is not None and seen_as(reach, agent.cwd) != "writable":
            found.append(Problem(file, f"{prefix}.cwd", f"{agent.cwd} is {seen_as(reach, agent.cwd)} in its turns",
                                 "choose a working folder outside corral's state"))
        given = [Path(p) for p in (*reach.writable, *reach.readable)]
        for covered in reach.hidden_files:
            holder = next((g for g in given if Path(covered).parent == g), None)
            if holder is not None and not covered.endswith(".sock"):
                found.append(Problem(
                    file, prefix, f"its turns see {holder}, which holds corral's {Path(covered).name}: it is covered, "
                    "and replacing it while a turn runs (sed -i, an editor's save, mv) ends that turn, a window of "
                    "about a millisecond in which the turn could read the new file",
                    f"keep corral's files in a folder of their own (e.g. {holder / 'corral'}/), which is hidden whole"))
    return found


def _default_command(adapter: str) -> tuple[str, ...]:
    from adapters import get_adapter  # (the adapters' table: loaded only when checking agents)

    try:
        return tuple(get_adapter(adapter).default_command)
    except Exception:  # noqa: BLE001 — an unknown adapter is the config's own problem, reported there
        return ()
