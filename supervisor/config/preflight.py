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
import os
import sqlite3
from pathlib import Path

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
    return out


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
