"""Private folders and files: corral's state is its user's alone, whatever the umask.

Transcripts, agents' homes (their CLIs keep credentials there) and the files written for
agents must not be readable by other users of the machine. The daemon also sets umask 077,
but an embedding program keeps its own umask, so every folder and file corral creates gets
its mode explicitly, at creation (never a moment of looser mode), and the ones inside
corral's own folders are tightened if an older version left them looser.

**An agent's HOME is the agent's.** It writes there freely, and may plant a symlink where the
daemon will next create a folder or a file (``$HOME/tmp`` pointing at any folder of the daemon's
user; a ``.claude`` pointing into another agent's hidden HOME). So what the daemon does inside
a HOME never follows a link: :func:`open_agent_folder` walks the path one component at a time
on directory descriptors, each opened ``O_NOFOLLOW | O_DIRECTORY`` relative to the one before,
makes a missing one 0700, tightens one with ``fchmod`` on its descriptor, and moves aside a link
or a file found where a folder must be (renamed to ``.NAME.corral-moved-<time>`` beside it,
never followed, never deleted). Files are then created, and credentials renamed into place,
relative to that verified descriptor (``openat`` with ``O_NOFOLLOW``, ``renameat``). The HOME
itself sits in corral's state folder, which no agent can write, and is opened ``O_NOFOLLOW``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

log = logging.getLogger("corral.files")


def private_folder(path: Path, *, within: Path | None = None) -> None:
    """Create ``path`` (and missing parents) mode 0700, whatever the umask.

    ``path`` and the folders between it and ``within`` (corral's own state folder, or an
    agent's home) are made 0700 even if they exist: they hold transcripts, agents' homes and
    credentials. Other existing folders (above ``within``, or all when it is None) are left
    as they are: they are the user's.
    """
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
    owned = missing if within is None else [path, *(p for p in path.parents if within in (p, *p.parents))]
    for folder in owned:
        if folder.stat().st_mode & 0o077:
            folder.chmod(0o700)


def private_file(path: Path, content: str) -> None:
    """Write ``path`` mode 0600 (tightened if it existed), without a moment of looser mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(content)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_agent_folder(home: Path, rel: str | Path) -> int:
    """A descriptor of the folder ``home/rel``, every component below ``home`` made a real
    folder, 0700, without following a symlink (see the module's docstring); the caller closes it.

    ``rel`` is relative (``..`` refused). A link or a non-folder in the way is moved aside.
    """
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts:
        raise ValueError(f"{rel} is not a path inside the agent's HOME")
    fd = os.open(home, _DIR_FLAGS)
    try:
        _tighten(fd)
        for name in parts:
            if name == ".":
                continue
            child = _open_or_make(fd, name)
            os.close(fd)
            fd = child
            _tighten(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_or_make(parent: int, name: str) -> int:
    """The folder ``name`` in ``parent``: made 0700 if missing; a link or file there moved aside."""
    for _ in range(3):  # an agent racing the daemon gets its entry moved aside again, not followed
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            aside = f".{name}.corral-moved-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
            os.rename(name, aside, src_dir_fd=parent, dst_dir_fd=parent)
            log.warning("moved %s aside to %s in an agent's HOME: corral makes a folder there and follows no link "
                        "an agent planted", name, aside)
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    raise OSError(errno.ELOOP, f"{name} in an agent's HOME keeps being replaced; not followed")


def _tighten(fd: int) -> None:
    if os.fstat(fd).st_mode & 0o077:
        os.fchmod(fd, 0o700)


def _write_at(folder: int, name: str, data: bytes, mode: int) -> None:
    """Create (or truncate) ``name`` in the folder ``folder`` with ``mode``, never through a link."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), mode)
        out.write(data)


class CredentialsUnreadable(Exception):
    """A login file named in ``credentials`` cannot be read now; the message has the fix."""


def place_credentials(home: Path, credentials: Iterable[tuple[Path, str]]) -> list[Path]:
    """Copy each login file (its source, its path relative to a HOME) into ``home``, fresh and
    read-only (0400, in 0700 folders); returns where each landed.

    A fresh copy per launch: a login the user renews in their own session reaches the next
    turn. Replaced by a rename, never written in place, so a turn that still holds the old
    copy open keeps reading a whole file. The source must be a regular file (not followed
    through a symlink to something else of the user's).
    """
    placed: list[Path] = []
    for source, rel in credentials:
        target = home / rel
        try:
            data = _read_regular(source)
        except OSError as exc:
            raise CredentialsUnreadable(
                f"its login file {source} cannot be read: {exc.strerror or exc} — fix: log in with the CLI in your "
                "own session again (it writes that file), or remove it from credentials"
            ) from None
        folder = open_agent_folder(home, Path(rel).parent)
        try:
            temporary = f".{target.name}.corral-{os.getpid()}"
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=folder)  # whatever an agent left there, a link too
                _write_at(folder, temporary, data, 0o400)
                os.replace(temporary, target.name, src_dir_fd=folder, dst_dir_fd=folder)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=folder)
                raise
        finally:
            os.close(folder)
        placed.append(target)
    return placed


def _read_regular(path: Path) -> bytes:
    with open(path, "rb") as source:  # (a symlink the user keeps there is followed: they named it)
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            raise OSError(0, "not a regular file", str(path))
        return source.read()


def write_home_files(home: Path, files: Mapping[str, str], *, state_dir: Path | None = None) -> None:
    """Write a launch's files under ``home`` (0600 in 0700 folders), and make its TMPDIR.

    The one path every agent's files take, a per-turn CLI's and a persistent ACP agent's
    alike. The folders from ``state_dir`` (corral's, which holds every HOME) down to ``home``
    are tightened too; without it only ``home`` and below are — never a folder above that is
    not corral's to change (counting parents up from a HOME once reached ``/``). A file is
    opened with ``O_NOFOLLOW``, and every folder inside HOME walked without following a link
    (:func:`open_agent_folder`): a symlink an agent planted in its HOME is never written,
    chmodded or created through.
    """
    private_folder(home, within=state_dir if state_dir is not None and state_dir in home.parents else home)
    os.close(open_agent_folder(home, "tmp"))
    for rel, content in dict(files).items():
        if os.path.isabs(rel) and not Path(rel).is_relative_to(home):
            private_folder(Path(rel).parent)  # (no adapter writes outside HOME; the user's path)
            private_file(Path(rel), content)
            continue
        inside = Path(rel).relative_to(home) if os.path.isabs(rel) else Path(rel)
        folder = open_agent_folder(home, inside.parent)
        try:
            _write_at(folder, inside.name, content.encode("utf-8"), 0o600)
        finally:
            os.close(folder)
