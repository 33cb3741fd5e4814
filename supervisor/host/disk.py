"""The disk a turn writes on, kept from filling up under the store (issue 41.7).

A turn's HOME and working folder live in corral's state folder, on the file system that
usually holds the store too: a turn that fills its HOME fills the store's disk, and then
every channel's writes fail ("could not store: disk full"). Nothing of a turn's own bounds
the bytes it writes there (a quota is the operator's, docs/security.md), so corral keeps a
reserve of its own:

* **A reserve file** (``disk.reserve`` in the state folder, ``[server] disk_reserve`` bytes,
  allocated with ``posix_fallocate``) holds that much of the file system while the supervisor
  runs (it is removed when the supervisor ends).
* **A guard** (:class:`DiskGuard`, a task of the supervisor's nursery) reads the file system's
  free space every :data:`INTERVAL` seconds. Below the reserve's size (:func:`judge`, pure),
  every running turn is ended at once — its tree killed in that step, with corral's words —
  and *then* the reserve file is let go, so the notices and every other channel's writes have
  the room it held. While the disk stays low no turn starts (:meth:`DiskGuard.refusal` says
  why, with the fix); once twice the reserve is free again, the reserve is taken back and
  turns run.

A writer faster than one poll may still fill the disk to its last byte in between; the
reserve file is what makes the store's next writes succeed anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal, Protocol

import trio

log = logging.getLogger("corral")

#: Seconds between two reads of the free space.
INTERVAL = 0.25
#: The reserve file's name, in the state folder.
RESERVE_NAME = "disk.reserve"

Verdict = Literal["ok", "low", "recovered", "still low"]


def judge(free: int, reserve: int, *, low: bool) -> Verdict:
    """What ``free`` bytes say (pure): ``low`` when they fall below the reserve's size (the
    turns end), ``recovered`` once twice the reserve is free again after that (the reserve is
    taken back), ``still low`` in between; ``ok`` otherwise."""
    if not low:
        return "low" if free < reserve else "ok"
    return "recovered" if free >= 2 * reserve else "still low"


class EndsEarly(Protocol):
    """A running turn, as the guard ends it."""

    def end_early(self, why: str) -> None:
        """Kill the turn's tree now and end it with ``why``."""
        ...


def low_text(folder: Path, reserve: int) -> str:
    """A turn's last words when the guard ended it."""
    return (f"Turn ended: the disk holding corral's state ({folder}) fell below {_size(reserve)} free "
            "(server.disk_reserve), so corral ended the running turns before the store ran out of room. "
            "Fix: free space on that disk (a turn's HOME or working folder may hold what filled it).")


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


class DiskGuard:
    """The reserve and the guard of one supervisor (see the module's docstring)."""

    def __init__(
        self, folder: Path, reserve: int, *, turns: Callable[[], Iterable[EndsEarly]],
        free: Callable[[Path], int] | None = None,
    ) -> None:
        self.folder = folder
        self.reserve = reserve
        self._turns = turns
        self._free = free or free_bytes
        self.low = False
        """The disk fell below the reserve and has not recovered: no turn starts."""
        self._file = folder / RESERVE_NAME

    def refusal(self) -> str | None:
        """Why a turn may not start now (the disk is low), else None."""
        if not self.low:
            return None
        return (f"the disk holding corral's state ({self.folder}) has less than {_size(self.reserve)} free "
                f"(server.disk_reserve) — fix: free space on it; turns run again once {_size(2 * self.reserve)} "
                "are free")

    def take(self) -> bool:
        """Allocate the reserve file (at the start, and once the disk has recovered)."""
        try:
            fd = os.open(self._file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.warning("cannot make the disk reserve %s (%s): a turn that fills that disk fills the store's",
                        self._file, exc)
            return False
        try:
            os.posix_fallocate(fd, 0, self.reserve)
            return True
        except OSError as exc:
            os.ftruncate(fd, 0)
            log.warning("cannot reserve %s on %s (%s)", _size(self.reserve), self.folder, exc)
            return False
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the reserve's room back to the file system (for the store's next writes)."""
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self._file, 0)

    def close(self) -> None:
        """The supervisor ends: the reserve file goes (a start after a ``kill -9`` reuses it)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file)

    def check(self) -> Verdict:
        """One read of the free space, and what it decides, carried out: ``low`` ends every
        running turn in this step (no checkpoint), then lets the reserve go."""
        try:
            free = self._free(self.folder)
        except OSError:
            return "ok"
        verdict = judge(free, self.reserve, low=self.low)
        if verdict == "low":
            self.low = True
            why = low_text(self.folder, self.reserve)
            ended = 0
            for turn in list(self._turns()):
                turn.end_early(why)
                ended += 1
            self.release()
            log.error("the disk holding %s has %d bytes free, under the reserve of %s: ended %d turn(s), released "
                      "the reserve; no turn starts until %s are free", self.folder, free, _size(self.reserve), ended,
                      _size(2 * self.reserve))
        elif verdict == "recovered":
            self.low = not self.take()
            if not self.low:
                log.info("the disk holding %s has room again: turns run", self.folder)
        return verdict

    async def run(self) -> None:
        """Check every :data:`INTERVAL` seconds until cancelled."""
        while True:
            self.check()
            await trio.sleep(INTERVAL)


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding ``folder``."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize
