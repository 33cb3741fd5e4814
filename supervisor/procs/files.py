"""Private folders and files: corral's state is its user's alone, whatever the umask.

Transcripts, agents' homes (their CLIs keep credentials there) and the files written for
agents must not be readable by other users of the machine. The daemon also sets umask 077,
but an embedding program keeps its own umask, so every folder and file corral creates gets
its mode explicitly, at creation (never a moment of looser mode), and the ones inside
corral's own folders are tightened if an older version left them looser.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path


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
        private_folder(target.parent, within=home)
        try:
            data = _read_regular(source)
        except OSError as exc:
            raise CredentialsUnreadable(
                f"its login file {source} cannot be read: {exc.strerror or exc} — fix: log in with the CLI in your "
                "own session again (it writes that file), or remove it from credentials"
            ) from None
        temporary = target.with_name(f".{target.name}.corral-{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o400)
        try:
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), 0o400)
                out.write(data)
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
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
    opened with ``O_NOFOLLOW``: a symlink an agent planted in its HOME is never written through.
    """
    private_folder(home / "tmp", within=state_dir if state_dir is not None and state_dir in home.parents else home)
    for rel, content in dict(files).items():
        path = Path(rel) if os.path.isabs(rel) else home / rel
        private_folder(path.parent, within=home if not os.path.isabs(rel) else None)
        private_file(path, content)
