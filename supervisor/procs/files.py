"""Private folders and files: corral's state is its user's alone, whatever the umask.

Transcripts, agents' homes (their CLIs keep credentials there) and the files written for
agents must not be readable by other users of the machine. The daemon also sets umask 077,
but an embedding program keeps its own umask, so every folder and file corral creates gets
its mode explicitly, at creation (never a moment of looser mode), and the ones inside
corral's own folders are tightened if an older version left them looser.
"""

from __future__ import annotations

import os
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
