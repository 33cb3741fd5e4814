"""Covers that detach: a hidden path replaced on the host while a turn runs.

The sandbox hides a file (the config beside a project's files, the store's companions) by a
bind mount on it, and a folder (another agent's working folder, corral's state) by a tmpfs on
it: mounts on a *dentry*. When the host replaces that dentry — ``sed -i corral.toml``, an
editor's atomic save, ``mv token.new token``, ``rm -rf`` and ``mkdir`` of a folder — the
kernel detaches the mount in every other namespace, and a running turn sees the new file on
its read-only root. A turn's plan cannot prevent an edit made after its start, so corral
watches: every turn registers the paths its sandbox covers (:func:`.sandbox.detachable`, only
those whose folder the turn sees) before its program starts, and an inotify watch on their
folders (:class:`CoverWatch`) calls the turn back, in the same step the event is read, when
a file of one of their names appears (created, or renamed over it; a delete alone shows the turn
nothing, the path is gone, and the next create is seen); the turn's tree is killed there and then (no
checkpoint from the event to the signal) and the turn ends with corral's words. An idle
persistent agent asks :meth:`CoverWatch.replaced_after` before its next turn.

What it does not see: a folder *above* a covered path moved away and made again (its new
entries are not watched; the watch of the old one is dropped, and logged). What it does not
close: the time from the rename to the kill (the kernel's event, one read,
one signal: measured in the escape suite, well under a millisecond on a quiet machine) — a
turn that spins on the path may read the new file in it. The way to have no window at all is
a folder of corral's own for its files (``/etc/corral``, the state folder): a folder holding
only corral's files is hidden as a folder, and its cover never detaches. ``corral check``
says so for every file that is covered alone.

The event parser (:func:`parse_events`) is pure; :class:`CoverWatch` is the Trio side.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

log = logging.getLogger("corral")

IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
#: A name that appears in a folder (a file created, or renamed over another): what shows a
#: turn a new file where its cover was. (A delete alone shows it nothing: the path is gone.)
WATCHED = IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
_HEADER = struct.Struct("iIII")


@dataclass(frozen=True, slots=True)
class Touched:
    """What one inotify event says: ``name`` in the folder watched by ``wd`` changed, or the
    folder itself went (``name`` empty, ``whole``); ``overflow``: events were lost."""

    wd: int
    name: str
    whole: bool = False
    overflow: bool = False


def parse_events(data: bytes) -> list[Touched]:
    """The events of one ``read`` of an inotify descriptor (pure)."""
    found: list[Touched] = []
    at = 0
    while at + _HEADER.size <= len(data):
        wd, mask, _, length = _HEADER.unpack_from(data, at)
        raw = data[at + _HEADER.size: at + _HEADER.size + length]
        at += _HEADER.size + length
        name = os.fsdecode(raw.split(b"\0", 1)[0])
        if mask & IN_Q_OVERFLOW:
            found.append(Touched(wd, "", overflow=True))
        elif mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
            found.append(Touched(wd, "", whole=True))
        elif name:
            found.append(Touched(wd, name))
    return found


class _Registration:
    __slots__ = ("on_replaced", "paths")

    def __init__(self, paths: frozenset[str], on_replaced: Callable[[str], None]) -> None:
        self.paths = paths
        self.on_replaced = on_replaced


class CoverWatch:
    """One inotify descriptor for a supervisor: the folders of every running turn's covers.

    :meth:`register` before a spawn, :meth:`unregister` after its end; :meth:`run` (a task of
    the supervisor's nursery) reads the events and calls back, synchronously, every
    registration that covers a replaced path. A folder stays watched once added (a handful
    of folders for a supervisor's life: corral's files, its agents' folders)."""

    def __init__(self, fd: int, add_watch: Callable[[int, bytes, int], int]) -> None:
        self._fd = fd
        self._add_watch = add_watch
        self._folders: dict[str, int] = {}
        self._by_wd: dict[int, str] = {}
        self._registrations: set[_Registration] = set()
        self.epoch = 0
        """Counts the replacements seen (see :meth:`replaced_after`)."""
        self._replaced_at: dict[str, int] = {}

    def register(self, paths: Iterable[str], on_replaced: Callable[[str], None]) -> object:
        """Watch ``paths`` (covered by one turn's sandbox) until :meth:`unregister`; returns the
        token to unregister with. A folder that cannot be watched is logged: its covers may
        detach unseen."""
        wanted = frozenset(paths)
        for folder in {os.path.dirname(p) or "/" for p in wanted}:
            self._watch(folder)
        registration = _Registration(wanted, on_replaced)
        self._registrations.add(registration)
        return registration

    def unregister(self, token: object) -> None:
        """The turn has ended: no more calls for it."""
        self._registrations.discard(token)

    def replaced_after(self, paths: Iterable[str], epoch: int) -> str | None:
        """A path of ``paths`` replaced since :attr:`epoch` was ``epoch``, if any (a persistent
        agent started before it still sees the new file)."""
        return next((p for p in paths if self._replaced_at.get(p, -1) > epoch), None)

    def _watch(self, folder: str) -> None:
        if folder in self._folders:
            return
        wd = self._add_watch(self._fd, os.fsencode(folder), WATCHED)
        if wd < 0:
            err = ctypes.get_errno()
            log.warning("cannot watch %s for replaced covers (%s): a file hidden there and replaced while a turn "
                        "runs would not end that turn", folder, os.strerror(err))
            return
        self._folders[folder] = wd
        self._by_wd[wd] = folder

    def handle(self, events: Iterable[Touched]) -> list[str]:
        """Call back every registration that covers a replaced path; the paths replaced.
        Synchronous: the callbacks kill in this step."""
        replaced: set[str] = set()
        for event in events:
            if event.overflow:  # (events lost: every covered path may have been replaced)
                replaced |= {p for r in self._registrations for p in r.paths}
                continue
            folder = self._by_wd.get(event.wd)
            if folder is None:
                continue
            if event.whole:
                # The folder itself went (its covered entries went with it, covers and all):
                # nothing new shows through yet, but a folder made in its place is not seen.
                log.warning("%s was moved or deleted: a folder made in its place is not watched for replaced "
                            "covers", folder)
                del self._by_wd[event.wd]
                self._folders.pop(folder, None)
            else:
                replaced.add(os.path.join(folder, event.name))
        if not replaced:
            return []
        self.epoch += 1
        for path in replaced:
            self._replaced_at[path] = self.epoch
        for registration in list(self._registrations):
            hit = sorted(registration.paths & replaced)
            if hit:
                self._registrations.discard(registration)  # (once: the turn is ending)
                registration.on_replaced(hit[0])
        return sorted(replaced)

    async def run(self) -> None:
        """Read the events and handle them, until cancelled; the descriptor is closed then."""
        try:
            while True:
                await trio.lowlevel.wait_readable(self._fd)
                try:
                    data = os.read(self._fd, 64 * 1024)
                except BlockingIOError:
                    continue
                self.handle(parse_events(data))
        finally:
            os.close(self._fd)


def replaced_text(path: str) -> str:
    """What a turn ended for a replaced cover says (its last words, and the log's)."""
    return (f"Turn ended: {path} was replaced on the host while the turn ran (an edit saved, a file moved "
            "over it), and the sandbox's cover went with the old file; corral ended the turn so it could not "
            "read the new one. Fix: keep corral's files in a folder of their own (docs/security.md: what an "
            "operator's edit does).")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def open_cover_watch() -> CoverWatch | None:
    """A :class:`CoverWatch`, or None (logged) where inotify cannot be had."""
    try:
        libc = _libc()
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    except (OSError, AttributeError) as exc:
        log.warning("no inotify (%s): a file hidden from turns and replaced while one runs would not end it", exc)
        return None
    if fd < 0:
        err = ctypes.get_errno()
        log.warning("no inotify (%s): a file hidden from turns and replaced while one runs would not end it",
                    os.strerror(err or errno.ENOSYS))
        return None
    add = libc.inotify_add_watch
    add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    add.restype = ctypes.c_int
    return CoverWatch(fd, add)

