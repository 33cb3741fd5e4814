"""A cgroup v2 per turn: the kernel's own containment, so nothing a turn starts escapes.

Where a writable cgroup v2 hierarchy is available, each turn's CLI starts inside a cgroup of
its own, ``<base>/corral-<store id>/<turn id>``, *before it can fork*. Every descendant is
then in that cgroup whatever it does — ``setsid``, a double fork, a cleared environment —
and a stop ends them all exactly: the interrupt signal to the group and to every process
in ``cgroup.procs``, a grace while ``cgroup.events`` is watched for ``populated 0``, then
``1`` written to ``cgroup.kill`` (the kernel SIGKILLs every member, including those forking
at that instant), the watch again, and ``rmdir``. No ``/proc`` walk, no pid guessed.

**Where.** ``[server] cgroup = "auto"`` finds the cgroup2 mount in ``/proc/self/mountinfo``
(``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on hybrid hosts), takes this process's own
v2 cgroup (``0::/PATH`` in ``/proc/self/cgroup``: under systemd with ``Delegate=yes`` the
service's delegated subtree) and creates ``corral-<store id>`` in it; ``"off"`` never uses
cgroups; an absolute path names the parent of ``corral-<store id>`` explicitly. The store id
in the name is what keeps two corral instances on one machine out of each other's cgroups,
and what lets the next owner of a store find a dead owner's turn cgroups (:mod:`.recovery`).

**Spawning into it.** ``preexec_fn`` is unsafe with threads (corral has the store's), and
Python offers no ``CLONE_INTO_CGROUP``. So the turn starts as a tiny pre-exec step::

    /bin/sh -c 'echo 0 > "$1/cgroup.procs" || exit 126; shift; exec "$@"' sh CGDIR PROGRAM ARGS...

``echo`` is a shell builtin: the shell writes its *own* pid into the cgroup, then ``exec``\\ s
the target, which keeps the pid (so the process group, the pidfd and Trio's wait all stay the
leader's). The cgroup path and the argv are positional parameters: they are never parsed by
the shell, nor by an option parser. The program is resolved in the parent first (a missing
program fails the spawn with ``FileNotFoundError`` as before, not with a shell message).
Its cost, measured with ``python -m scripts.bench_stop --spawn`` (spawn of ``/bin/true`` until it
exits, 200 rounds, 2 shared cores, load 3.1): median 0.8 ms plain, 1.5 ms through the step —
one extra ``execve`` of ``dash``, 0.7 ms per turn, next to a CLI that takes 100 ms to seconds
to start. A ``clone3(CLONE_INTO_CGROUP)`` helper would save that but is a compiled binary to
build and ship; the shell is everywhere. Chosen: the shell step.

**Limits.** Per-agent ``memory_max`` and ``pids_max`` (by default 4G and 4096: one turn must not
starve the others) are written to each turn's cgroup where the ``memory`` / ``pids``
controllers can be enabled in ``cgroup.subtree_control`` down to it; otherwise that is logged
once and the turn runs without them. ``cgroup.max.descendants`` and ``cgroup.max.depth`` are
set on each turn's cgroup and on the store's subtree, so a turn cannot make thousands of
sub-cgroups; those a turn made are removed with it, deepest first (:func:`remove`), so they
never make a later ``rmdir`` fail with ``EBUSY``. A turn runs as the daemon's user, so where
it can reach the cgroup file system (no sandbox; a nested cgroup2 mount without
``nsdelegate``) it could rewrite these files: the sandbox keeps it out.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import signal
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from .memory import cgroup2_mount as cgroup2_mount
from .memory import own_cgroup as own_cgroup

log = logging.getLogger("corral.cgroup")

#: The prefix of a store's subtree; the store id follows.
SUBTREE_PREFIX = "corral-"
#: The pre-exec step that moves the shell into the cgroup ($1), then execs the rest.
ENTER_SCRIPT = 'echo 0 > "$1/cgroup.procs" || exit 126; shift; exec "$@"'
SHELL = "/bin/sh"

_IN_MODIFY = 0x00000002
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


class CgroupUnavailable(Exception):
    """No writable cgroup v2 hierarchy: the reason, and what would fix it."""


def _write(path: Path | str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_small(path: str) -> bytes:
    """The whole of a small kernel file (``/proc``, cgroupfs) in one ``read``; raises OSError.

    Plain ``os`` calls, not a buffered file object: a stop-all reads a few of these per
    turn, and ``open()`` costs half as much again as the read itself.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def read_procs(path: Path | str) -> list[int]:
    """The pids in a cgroup's ``cgroup.procs`` (empty if the cgroup is gone)."""
    try:
        return [int(x) for x in read_small(os.path.join(path, "cgroup.procs")).split()]
    except OSError:
        return []


def populated(path: Path | str) -> bool:
    """Does the cgroup (or a child of it) still hold a living process? False once it is gone."""
    try:
        data = read_small(os.path.join(path, "cgroup.events"))
    except OSError:
        return False
    at = data.find(b"populated ")
    return at >= 0 and data[at + 10 : at + 11] == b"1"


_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


class Watcher:
    """One inotify instance shared by every wait for a cgroup to empty.

    One, because closing an inotify fd waits for an SRCU grace period (milliseconds): an fd
    per wait made a stop-all of 50 spend 370 ms in ``close``. Each wait adds a watch on its
    ``cgroup.events`` (``IN_MODIFY``, raised on every change of ``populated``) and removes
    it after; :meth:`run`, one task, reads the events and wakes the waiters.
    """

    def __init__(self) -> None:
        fd = _lib().inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.fd = fd
        self._waiting: dict[int, trio.Event] = {}
        self._many: list[Changes] = []
        """Waits on several files at once (a stop-all's): woken by a change of any of them."""
        self._refs: dict[int, int] = {}
        self._running = False
        self._closed = False

    def add(self, path: str) -> int:
        """Watch ``path``; returns the watch descriptor."""
        wd: int = _lib().inotify_add_watch(self.fd, os.fsencode(path), _IN_MODIFY)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch({path}) failed")
        self._refs[wd] = self._refs.get(wd, 0) + 1
        return wd

    def remove(self, wd: int) -> None:
        """Stop watching (once the last wait on that file is over)."""
        self._refs[wd] -= 1
        if not self._refs[wd]:
            del self._refs[wd]
            self._waiting.pop(wd, None)
            _lib().inotify_rm_watch(self.fd, wd)  # fails harmlessly if the cgroup is gone

    def changed(self, wd: int) -> trio.Event:
        """An event set at the next change of the watched file."""
        return self._waiting.setdefault(wd, trio.Event())

    def changes(self) -> Changes:
        """Follow changes of a set of watched files (a stop-all's cgroups) until :meth:`forget`:
        one wake-up for the whole batch, and the watches that fired, so the waiter reads only
        the files that changed (not every file at every wake-up: that was O(n²) in a stop-all)."""
        changes = Changes()
        self._many.append(changes)
        return changes

    def forget(self, changes: Changes) -> None:
        """Stop following ``changes`` (from :meth:`changes`)."""
        self._many = [c for c in self._many if c is not changes]

    @property
    def running(self) -> bool:
        """Is :meth:`run` reading the events?"""
        return self._running

    async def run(self) -> None:
        """Read the events and wake each waiter; until cancelled. Closes the fd at the end."""
        self._running = True
        try:
            while True:
                await trio.lowlevel.wait_readable(self.fd)
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    continue
                at = 0
                seen = set()
                while at + 16 <= len(data):
                    wd, _, _, length = _EVENT.unpack_from(data, at)
                    at += 16 + length
                    seen.add(wd)
                    event = self._waiting.pop(wd, None)
                    if event is not None:
                        event.set()
                for changes in self._many:
                    fired = changes.wds.intersection(seen)
                    if fired:
                        changes.fired |= fired
                        changes.event.set()
        finally:
            self._running = False
            self.close()

    def close(self) -> None:
        """Close the inotify fd (once)."""
        if not self._closed:
            self._closed = True
            try:
                trio.lowlevel.notify_closing(self.fd)
            except RuntimeError:
                pass  # outside Trio: nobody can be waiting on it
            os.close(self.fd)


_EVENT = struct.Struct("iIII")


class Changes:
    """What :meth:`Watcher.changes` follows: the watches (``wds``, the waiter adds and
    discards), those that fired since :meth:`take`, and an event set when one fires."""

    __slots__ = ("event", "fired", "wds")

    def __init__(self) -> None:
        self.wds: set[int] = set()
        self.fired: set[int] = set()
        self.event = trio.Event()

    def take(self) -> set[int]:
        """The watches that fired since the last take; the event is renewed first, so a
        change from now on (after the caller's reads) wakes the next wait."""
        if self.event.is_set():
            self.event = trio.Event()
        fired, self.fired = self.fired, set()
        return fired


async def wait_empty(path: Path | str, deadline: float, watcher: Watcher | None = None) -> bool:
    """Wait until ``cgroup.events`` says ``populated 0`` (or the cgroup is gone); False at the deadline.

    The file is watched (inotify ``IN_MODIFY``), never polled in a loop: through ``watcher``
    when it is running, else through an inotify instance of this wait's own.
    """
    if not populated(path):
        return True
    events = os.path.join(path, "cgroup.events")
    own = watcher is None or not watcher.running
    try:
        if own:
            watcher = Watcher()
        assert watcher is not None
        wd = watcher.add(events)
    except OSError:
        if own and watcher is not None:
            watcher.close()
        return not populated(path)
    try:
        with trio.move_on_at(deadline):
            # Registered before each read of the file: a change after the read wakes us.
            while True:
                changed = watcher.changed(wd)
                if not populated(path):
                    return True
                if own:
                    await trio.lowlevel.wait_readable(watcher.fd)
                    try:
                        os.read(watcher.fd, 65536)
                    except BlockingIOError:
                        pass
                else:
                    await changed.wait()
        return not populated(path)
    finally:
        watcher.remove(wd)
        if own:
            watcher.close()


def kill_all(path: Path | str) -> None:
    """SIGKILL every process of the cgroup: ``cgroup.kill`` (Linux 5.14+), else pid by pid."""
    try:
        _write(os.path.join(path, "cgroup.kill"), "1")
        return
    except FileNotFoundError:
        if not os.path.isdir(path):
            return
    except OSError as exc:
        log.warning("cgroup.kill of %s failed (%s): killing its processes one by one", path, exc)
    for pid in read_procs(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


#: Sub-cgroups a turn may make below its own, and how deep (it needs none; a few do no harm).
TURN_DESCENDANTS = 32
TURN_DEPTH = 4


def remove(path: Path | str) -> bool:
    """``rmdir`` an empty cgroup and every sub-cgroup a turn made in it, deepest first; False
    (logged) if it cannot be removed yet (a process still in it)."""
    first = _rmdir(str(path), quiet=(errno.EBUSY, errno.ENOTEMPTY))
    if first is not None:
        return first
    # Children first: a cgroup file system folder holds only interface files and sub-cgroups.
    for folder, subfolders, _ in os.walk(path, topdown=False):
        for name in subfolders:
            if not _rmdir(os.path.join(folder, name)):
                return False
    return bool(_rmdir(str(path)))


def _rmdir(path: str, quiet: tuple[int, ...] = ()) -> bool | None:
    """``rmdir`` one cgroup: True once it is gone, False if it cannot be (logged), None for an
    errno of ``quiet`` (not logged: the caller has another way)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno in quiet:
            return None
        log.warning("cannot remove cgroup %s: %s", path, exc)
        return False
    return True


@dataclass(frozen=True, slots=True)
class TurnCgroup:
    """One turn's cgroup (a directory of the cgroup2 file system)."""

    path: str
    watcher: Watcher | None = None

    def procs(self) -> list[int]:
        """The pids in it now."""
        return read_procs(self.path)

    def kill(self) -> None:
        """SIGKILL everything in it (the kernel does it, forks included)."""
        kill_all(self.path)

    async def wait_empty(self, deadline: float) -> bool:
        """Wait for ``populated 0``; False at the deadline."""
        return await wait_empty(self.path, deadline, self.watcher)

    def populated(self) -> bool:
        """Does it still hold a living process?"""
        return populated(self.path)

    def remove(self) -> bool:
        """Remove it (it must be empty)."""
        return remove(self.path)


class CgroupRoot:
    """A store's subtree, ``<base>/corral-<store id>``, where its turns' cgroups are made."""

    def __init__(self, base: Path, store_id: str) -> None:
        self.base = base
        self.store_id = store_id
        self.path = base / f"{SUBTREE_PREFIX}{store_id}"
        self.controllers: frozenset[str] = frozenset()
        """Controllers enabled for the turns' cgroups (``memory``, ``pids``, where delegated)."""
        self.watcher: Watcher | None = None
        """Shared by the waits for its cgroups to empty, once someone runs it (:meth:`Watcher.run`)."""
        self._warned: set[str] = set()

    def setup(self) -> None:
        """Create the subtree (raises :class:`CgroupUnavailable`) and enable what controllers it may."""
        try:
            self.path.mkdir(exist_ok=True)
            probe = self.path / ".probe"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create cgroups in {self.base}: {exc.strerror or exc}") from None
        try:  # no turn's sub-cgroups nest deeper than this (a level the turns' own files cannot lift)
            _write(self.path / "cgroup.max.depth", str(TURN_DEPTH + 1))
        except OSError as exc:
            log.warning("cannot limit the depth of %s: %s", self.path, exc)
        enabled: set[str] = set()
        for name in ("memory", "pids"):
            try:
                for level in (self.base, self.path):
                    if name not in (level / "cgroup.subtree_control").read_text().split():
                        _write(level / "cgroup.subtree_control", f"+{name}")
                enabled.add(name)
            except OSError:
                continue
        self.controllers = frozenset(enabled)
        try:
            self.watcher = Watcher()
        except OSError as exc:
            log.warning("no shared inotify instance (%s): each wait for a cgroup to empty opens its own", exc)

    def create(self, turn_id: str, limits: Mapping[str, str | int | None] | None = None) -> TurnCgroup:
        """Make a turn's cgroup and apply the limits the delegated controllers allow."""
        path = self.path / turn_id
        path.mkdir()
        _write(path / "cgroup.max.descendants", str(TURN_DESCENDANTS))
        _write(path / "cgroup.max.depth", str(TURN_DEPTH))
        for key, value in (limits or {}).items():
            if value is None:
                continue
            controller = key.split("_")[0]
            if controller not in self.controllers:
                if controller not in self._warned:
                    self._warned.add(controller)
                    log.warning(
                        "%s (%s) cannot be applied: the %s controller is not delegated to %s; turns run "
                        "without it (docs/security.md: what bounds a turn)", key, value, controller, self.base,
                    )
                continue
            _write(path / key.replace("_", "."), str(value))
        return TurnCgroup(str(path), self.watcher)

    def leftovers(self) -> list[TurnCgroup]:
        """Every turn cgroup of this store that exists now (after an abrupt end: the dead owner's)."""
        try:
            return [TurnCgroup(str(p), self.watcher) for p in sorted(self.path.iterdir()) if p.is_dir()]
        except OSError:
            return []

    def close(self) -> None:
        """Remove every empty turn cgroup, then the store's subtree if nothing is left in it.

        A turn cgroup still holding processes (kept background ones) stays: the next start
        ends them. An empty one can be left by a kept process that ended during shutdown.
        """
        if self.watcher is not None and not self.watcher.running:
            self.watcher.close()
        for cgroup in self.leftovers():
            if not cgroup.populated():
                remove(cgroup.path)
        try:
            self.path.rmdir()
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EBUSY, errno.ENOENT):
                log.warning("cannot remove %s: %s", self.path, exc)


def open_root(setting: str, store_id: str) -> CgroupRoot | None:
    """The store's cgroup subtree as ``[server] cgroup`` says, or None for the sweep fallback.

    Logs which kill mechanism was chosen, and why.
    """
    if setting == "off":
        log.info("kill mechanism: sweep (cgroup = \"off\")")
        return None
    try:
        base = find_base(setting)
        root = CgroupRoot(base, store_id)
        root.setup()
    except CgroupUnavailable as exc:
        if setting != "auto":
            log.error("kill mechanism: sweep: cgroup = %r is not usable: %s", setting, exc)
        else:
            log.info("kill mechanism: sweep (no writable cgroup v2: %s)", exc)
        return None
    log.info(
        "kill mechanism: cgroup, turns in %s (limits: %s)",
        root.path, ", ".join(sorted(root.controllers)) or "none delegated",
    )
    return root


def find_base(setting: str) -> Path:
    """The folder under which ``corral-<store id>`` goes; raises :class:`CgroupUnavailable`."""
    if setting != "auto":
        base = Path(setting)
        problem = check_path(base)
        if problem:
            raise CgroupUnavailable(problem)
        return base
    mount = cgroup2_mount()
    if mount is None:
        raise CgroupUnavailable("no cgroup2 file system is mounted")
    own = own_cgroup()
    if own is None:
        raise CgroupUnavailable("this process has no cgroup v2 path in /proc/self/cgroup")
    base = mount / own.lstrip("/")
    if not os.access(base, os.W_OK):
        raise CgroupUnavailable(
            f"{base} (this process's own cgroup) is not writable; run under systemd with Delegate=yes"
        )
    return base


def check_path(base: Path) -> str | None:
    """What makes ``base`` unusable as an explicit ``[server] cgroup`` folder; None if usable."""
    if not base.is_absolute():
        return f"{base} is not an absolute path"
    if not (base / "cgroup.procs").is_file() or not (base / "cgroup.controllers").is_file():
        return f"{base} is not a folder of a cgroup2 file system"
    if not os.access(base, os.W_OK):
        return f"{base} is not writable by this user"
    return None


def resolve_program(program: str, path_env: str | None, cwd: str) -> str:
    """``program`` as the spawn will run it: found on ``PATH`` here, in the parent, so a
    missing one fails the spawn itself (``FileNotFoundError``), not a shell or a sandbox."""
    if os.sep not in program:
        found = shutil.which(program, path=path_env if path_env is not None else os.defpath)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        return found
    if not os.path.exists(os.path.join(cwd, program)):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return program


def entering_argv(cgroup: TurnCgroup, argv: tuple[str, ...], path_env: str | None, cwd: str) -> list[str]:
    """The argv that starts ``argv`` inside ``cgroup``: the shell step, then the program.

    The program is resolved here, in the parent, so a missing one fails the spawn itself.
    """
    program = resolve_program(argv[0], path_env, cwd)
    return [SHELL, "-c", ENTER_SCRIPT, "sh", cgroup.path, program, *argv[1:]]
