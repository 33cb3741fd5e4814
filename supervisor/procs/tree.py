"""Spawning a turn's process and killing its whole tree.

A turn's CLI runs in a new session, so its process group is its own. The real CLIs run
their shell tools in *further* new sessions, so killing the group is not enough: after the
interrupt signal, a grace period and SIGKILL to the group, every remaining descendant of
the turn is found and killed. Descendants are found three ways, because each alone misses
some:

* a **snapshot** of the leader's descendants (pid + create time, so a reused pid is never
  killed), taken before signalling and again after — it sees setsid children that have
  not yet been orphaned;
* an **environment marker**, ``CORRAL_TURN=<turn id>``, every descendant inherits — it sees
  double-forked daemons that have already been re-parented;
* the **child subreaper** bit (daemon mode): orphans re-parent to corral rather than to
  init, so they stay reachable and are reaped by corral.

That sweep is the fallback. Where a cgroup v2 is writable, a turn runs in a cgroup of its
own (:mod:`supervisor.procs.cgroup`) and its tree is ended through it: the interrupt signal to the
group and to every pid in ``cgroup.procs``, the grace while the cgroup empties, then
``cgroup.kill`` and a watch for ``populated 0`` — nothing to find, so nothing escapes.

Only pids corral can prove are its own children are ever waited for; never ``waitpid(-1)``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import trio

from .cgroup import TurnCgroup, entering_argv, read_small, resolve_program
from .confine import open_process, sealed

log = logging.getLogger("corral.tree")

#: The variable every process of a turn inherits.
TURN_MARKER = "CORRAL_TURN"
#: The variable naming the store the turn belongs to: after an abrupt death the next owner
#: of that store finds its orphans by it, and never touches another corral's processes.
STORE_MARKER = "CORRAL_STORE"

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def set_child_subreaper(enabled: bool = True) -> bool:
    """Make orphaned descendants re-parent to this process. Process-wide; Linux only.

    Returns False (and logs) if the kernel refused.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    except (OSError, AttributeError) as exc:
        log.warning("cannot become a child subreaper: %s", exc)
        return False
    return True


def is_child_subreaper() -> bool:
    """Is this process a child subreaper now? False if the kernel cannot tell."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        value = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return bool(value.value)


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What one read of ``/proc/PID/stat`` says about a process."""

    state: str
    ppid: int
    pgid: int
    started: int
    """Start time in clock ticks since boot: with the pid, an identity no reuse can fake."""


def read_stat(pid: int) -> ProcStat | None:
    """Parse ``/proc/PID/stat`` (one read, no psutil); None if the process is gone."""
    try:
        raw = read_small(f"/proc/{pid}/stat")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return ProcStat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class ProcId:
    """A process identity that survives pid reuse: pid plus start time."""

    pid: int
    started: int

    def matches(self) -> bool:
        """Is this exact process still there (and not a zombie)?"""
        stat = read_stat(self.pid)
        return stat is not None and stat.started == self.started and stat.state != "Z"


def ident(pid: int) -> ProcId | None:
    """The identity of a living process ``pid``; None if it is gone or a zombie."""
    stat = read_stat(pid)
    if stat is None or stat.state == "Z":
        return None
    return ProcId(pid, stat.started)


def child_pids(pid: int) -> list[int]:
    """The direct children of ``pid``, read from ``/proc/PID/task/*/children``.

    Its cost follows the size of the tree, not of the machine (psutil's ``children()`` reads
    every process in ``/proc``). Falls back to psutil on kernels without those files.
    """
    if not _PROC_CHILDREN:
        try:
            return [c.pid for c in psutil.Process(pid).children()]
        except psutil.Error:
            return []
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                found.extend(int(x) for x in fh.read().split())
        except OSError:
            continue
    return found


_PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def descendant_pids(pid: int, *, prune: Collection[int] = ()) -> list[int]:
    """``pid``'s descendants, nearest first (a walk of the tree, not of ``/proc``).

    The subtrees under the pids in ``prune`` are not entered (nor are those pids listed).
    """
    found: list[int] = []
    seen = {pid, *prune}
    stack = [pid]
    while stack:
        for child in child_pids(stack.pop()):
            if child not in seen:
                seen.add(child)
                found.append(child)
                stack.append(child)
    return found


def descendants(pid: int, *, include_self: bool = True) -> set[ProcId]:
    """A snapshot of ``pid`` and its living descendants."""
    found: set[ProcId] = set()
    for candidate in ([pid] if include_self else []) + descendant_pids(pid):
        proc = ident(candidate)
        if proc is not None:
            found.add(proc)
    return found


def scan_markers(
    values: Iterable[str], *, within: int | None = None, prune: Collection[int] = (), marker: str = TURN_MARKER
) -> dict[str, set[ProcId]]:
    """Every process (other than this one) whose environment carries ``<marker>=<value>``
    (``CORRAL_TURN`` unless told otherwise).

    ``within``: look only among that pid's descendants — enough when this process is a child
    subreaper, since every escaped descendant of a turn re-parents to it; ``prune`` then
    skips whole subtrees accounted for otherwise: those of live turn leaders, which each
    tree's own snapshot walks (turn trees are disjoint, and an escapee re-parents to the
    subreaper, never into a leader's subtree). What is left to read is the escapees.
    Otherwise every process in ``/proc`` is read. Blocking; run it in a thread.
    """
    wanted = {f"{marker}={v}".encode(): v for v in values}
    found: dict[str, set[ProcId]] = {v: set() for v in wanted.values()}
    if not wanted:
        return found
    me = os.getpid()
    names = [str(p) for p in descendant_pids(within, prune=prune)] if within is not None else os.listdir("/proc")
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        for entry in env.split(b"\0"):
            value = wanted.get(entry)
            if value is not None:
                proc = ident(int(name))
                if proc is not None:
                    found[value].add(proc)
                break
    return found


class MarkerScanner:
    """Shares one ``/proc`` scan among every sweep that needs one at the same time.

    A stop-all of 200 turns must not read ``/proc`` 200 times: a sweep asks for a scan that
    began after its own kill, and all sweeps waiting at that moment share the next one.
    """

    def __init__(
        self, *, within: int | None = None, elsewhere: Callable[[set[str]], Collection[int]] | None = None
    ) -> None:
        self.within = within
        self.elsewhere = elsewhere
        """Given the markers wanted, the pids whose subtrees need no scan (live turn leaders,
        walked by their own trees' snapshots)."""
        """Scan only this pid's descendants (set when it is a child subreaper)."""
        self._wanted: set[str] = set()
        self._result: dict[str, set[ProcId]] = {}
        self._result_started = -1.0
        self._running: trio.Event | None = None

    async def scan(self, marker: str, *, not_before: float) -> set[ProcId]:
        """Processes carrying ``marker``, from a scan that started at or after ``not_before``."""
        self._wanted.add(marker)
        while True:
            if self._result_started >= not_before and marker in self._result:
                return self._result[marker]
            if self._running is not None:
                await self._running.wait()
                continue
            self._running = done = trio.Event()
            try:
                wanted = set(self._wanted)
                started = time.monotonic()
                prune = self.elsewhere(wanted) if self.elsewhere is not None and self.within is not None else ()
                result = await trio.to_thread.run_sync(
                    functools.partial(scan_markers, wanted, within=self.within, prune=prune)
                )
                self._result, self._result_started = result, started
                self._wanted -= wanted
            finally:
                self._running = None
                done.set()


def _pgid(pid: int) -> int | None:
    stat = read_stat(pid)
    return stat.pgid if stat is not None else None


def _in_group(proc: ProcId, pgid: int) -> bool:
    stat = read_stat(proc.pid)
    return stat is not None and stat.started == proc.started and stat.state != "Z" and stat.pgid == pgid


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False if the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError as exc:
        log.warning("cannot signal process group %d: %s", pgid, exc)
        return False


def kill_exact(ident: ProcId) -> bool:
    """SIGKILL this exact process (pid and create time); False if it is already gone."""
    if ident.pid == os.getpid() or not ident.matches():
        return False
    try:
        os.kill(ident.pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def waitable(pid: int | None = None) -> bool:
    """Is there a dead, unreaped child of this process — ``pid``, or any child (None)?

    Asked of the kernel without reaping anything (``waitid`` with ``WNOWAIT``): one system
    call, where a read of ``/proc/PID/stat`` takes three and a parse. A stop asks it of every
    process its tree had (nearly all are not this process's children: that answer is one
    ``ECHILD``), and the subreaper's pass asks it before it reads the children's list at all.
    """
    try:
        info = os.waitid(os.P_ALL if pid is None else os.P_PID, 0 if pid is None else pid,
                         os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return info is not None


def reap_if_child(pid: int) -> bool:
    """Reap ``pid`` if it is a dead child of this process. Never waits on any other pid."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


async def wait_pid_exit(pid: int) -> bool:
    """Wait until process ``pid`` exits, child or not, without reaping it.

    A pidfd turns readable when its process exits: no polling loop. Returns False at once
    if no pidfd can be opened (the process is already gone, or the kernel is too old).
    """
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
    return True


async def wait_gone(idents: Iterable[ProcId], deadline: float) -> set[ProcId]:
    """Wait until each process has exited (reaping our own children); return those still alive."""
    alive = set(idents)
    while True:
        for ident in list(alive):
            reap_if_child(ident.pid)
            if not ident.matches():
                alive.discard(ident)
        if not alive or trio.current_time() >= deadline:
            return alive
        with trio.move_on_at(deadline):
            await wait_pid_exit(next(iter(alive)).pid)


@dataclass(slots=True)
class KillReport:
    """What tearing a turn's tree down did."""

    killed: list[int] = field(default_factory=list)
    """Processes of the turn's group that were signalled while alive."""
    swept: list[int] = field(default_factory=list)
    """Descendants outside the group (or that outlived it) killed by the sweep."""
    survivors: list[int] = field(default_factory=list)
    """Processes that could not be confirmed dead: the stop failed for them."""
    returncode: int | None = None
    mechanism: str = "sweep"
    """How the tree was ended: ``"cgroup"`` (the turn's cgroup) or ``"sweep"`` (the fallback)."""


#: Variables an agent inherits from the daemon; everything else comes from its config.
INHERITED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME", "SHELL")


def scrubbed_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment an agent starts from: a short allow-list of the daemon's.

    An allow-list, not a deny-list: the daemon's ``NOTIFY_SOCKET``, ``WATCHDOG_*`` and
    ``LISTEN_*`` (an agent could tell systemd the service is ready, or take its sockets),
    corral's own ``CORRAL_*`` variables, and whatever secrets the daemon was started with
    never reach an agent. An agent gets more only by naming it in its ``env``.
    """
    return {k: v for k, v in base.items() if k in INHERITED_ENV or k.startswith("LC_")}


def agent_environment(
    launch_env: Mapping[str, str], *, home: str | None, marker: str, extra: Mapping[str, str] = {}
) -> dict[str, str]:
    """Every agent's environment (a per-turn CLI's and a persistent agent's alike): the
    scrubbed daemon's, HOME and TMPDIR if given, the launch's additions, ``extra`` (the
    agent's configured ``env``, and corral's store marker), and the ``CORRAL_TURN`` marker,
    last, so no configuration can remove it."""
    env = scrubbed_environment(os.environ)
    env.setdefault("PATH", os.defpath)
    if home is not None:
        env["HOME"] = home
        env["TMPDIR"] = str(Path(home) / "tmp")
    env.update(launch_env)
    env.update(extra)
    env[TURN_MARKER] = marker
    return env


async def spawn(
    argv: tuple[str, ...],
    *,
    env: Mapping[str, str],
    cwd: str,
    stdin_pipe: bool,
    cgroup: TurnCgroup | None = None,
    sandbox: Sequence[str] = (),
) -> trio.Process:
    """Start ``argv`` in a new session with piped stdout/stderr (inside ``cgroup`` if given,
    before the program runs: see :mod:`supervisor.procs.cgroup`; behind ``sandbox``, the argv
    of :meth:`supervisor.procs.sandbox.Sandbox.prefix`, if given: then inside the cgroup too,
    with bwrap's options and the seccomp filter passed in memfds), with a session keyring of
    its own (:mod:`supervisor.procs.confine`).

    The caller must register the result before its next checkpoint and kill it in a
    ``finally``: the spawn itself cannot be cancelled half-way.
    """
    with contextlib.ExitStack() as stack:
        fds: tuple[int, ...] = ()
        if sandbox:  # its options and seccomp filter handed over in memfds (see .confine)
            words, fds = stack.enter_context(sealed(sandbox))
            argv = (*words, resolve_program(argv[0], env.get("PATH"), cwd), *argv[1:])
        command = list(argv) if cgroup is None else entering_argv(cgroup, argv, env.get("PATH"), cwd)
        # (in a session keyring of its own: see .confine)
        return await open_process(command, stdin_pipe=stdin_pipe, cwd=cwd, env=env, pass_fds=fds)


async def wait_exited(process: trio.Process) -> None:
    """Wait until ``process`` has exited, without reaping it.

    An unreaped (zombie) leader keeps its pid, and with it the process group id, from being
    reused, so the group can still be signalled safely.
    """
    if process.returncode is None and not await wait_pid_exit(process.pid):
        await process.wait()


class ProcessTree:
    """One turn's process: its group, what is known of its descendants, and how to end them.

    ``interrupt`` and ``kill_group`` are synchronous so a stop can decide and signal with
    no checkpoint in between; ``terminate`` and ``sweep`` do the waiting.
    """

    def __init__(
        self, process: trio.Process, marker: str, cgroup: TurnCgroup | None = None, *, sandboxed: bool = False
    ) -> None:
        self.process = process
        self.sandboxed = sandboxed
        """Started behind the sandbox: the leader is bwrap's monitor, the program runs inside."""
        self.pgid = process.pid
        self.marker = marker
        self.cgroup = cgroup
        """The turn's own cgroup: then every stop goes through it, and no tree is walked."""
        self.known: set[ProcId] = descendants(process.pid) if cgroup is None else set()
        self.report = KillReport(mechanism="sweep" if cgroup is None else "cgroup")
        self._interrupted = False
        self._cgroup_killed = False
        self._members: dict[int, ProcStat | None] = {}
        """Cgroup path: every pid seen in the cgroup while signalling it, and its stat then."""
        self._leader: ProcStat | None = read_stat(process.pid)
        """The leader's stat at the spawn. Unreaped, it keeps its pid; a session leader, it
        keeps its group: a stop need not read it again (one read of 3 per light tree)."""
        self._ending = False
        """Its own teardown (``terminate`` or ``sweep``) has begun."""
        self._interrupt_swept: set[int] = set()
        """Sweep path, sandboxed: processes of other sessions the interrupt reached (reported swept)."""
        self._ended_by: trio.Event | None = None
        """Set once a batch that took over its ending (:meth:`hand_over`) is done with it."""

    @property
    def pid(self) -> int:
        """The leader's pid (also the group id)."""
        return self.process.pid

    @property
    def leader(self) -> ProcId | None:
        """The leader's identity, read at the spawn (None if it was gone already)."""
        stat = self._leader
        return ProcId(self.pid, stat.started) if stat is not None and stat.state != "Z" else None

    @property
    def interrupted(self) -> bool:
        """Has a stop (or timeout) signalled this tree?"""
        return self._interrupted

    def _remember(self) -> None:
        self.known |= descendants(self.pid)

    def _signal_cgroup(self, sig: int, *, group: bool) -> None:
        """Send ``sig`` to the group (while the leader is unreaped) and to every other process
        of the cgroup, once each; remember who was there for the report."""
        assert self.cgroup is not None
        # Who is there is read before anything is signalled: a process that dies of the
        # signal at once is still reported as killed.
        others = []
        unreaped = self.process.returncode is None
        procs = self.cgroup.procs()
        inside = group and sig != signal.SIGKILL and self._inside_started(procs)
        if inside:
            group = False  # the interrupt goes to the processes inside, not to bwrap's monitor
        for pid in procs:
            if pid not in self._members:
                self._members[pid] = self._stat(pid, unreaped)
            if not (group and self._in_group(pid)) and not (inside and pid == self.pid):
                others.append(pid)
        if group and unreaped:
            signal_group(self.pgid, sig)
        for pid in others:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def _stat(self, pid: int, unreaped: bool) -> ProcStat | None:
        """A member's stat now; the leader's from the spawn while it is unreaped (the same process)."""
        if pid == self.pid and unreaped and self._leader is not None:
            return self._leader
        return read_stat(pid)

    def hand_over(self, done: trio.Event) -> bool:
        """Let a batch end this tree (:mod:`supervisor.procs.teardown`): ``terminate`` and ``sweep``
        then wait for ``done`` instead. Only a cgroup tree whose own teardown has not begun."""
        if self.cgroup is None or self._ending or self._ended_by is not None:
            return False
        self._ended_by = done
        return True

    @property
    def handed_over(self) -> bool:
        """Does a batch end this tree?"""
        return self._ended_by is not None

    def interrupt(self, sig: int) -> None:
        """Snapshot the descendants, then send the interrupt signal to the group.

        With a cgroup: no snapshot, the signal goes to the group and to every process of the cgroup.
        Sandboxed (once its program runs): to every process inside instead, never to the
        leader, bwrap's monitor — it would die of it at once and end the CLI's grace.
        """
        if self.cgroup is not None:
            self._interrupted = True
            self._signal_cgroup(sig, group=True)
            return
        self._remember()
        self._interrupted = True
        inside = [p for p in self.known if p.pid != self.pid]
        if sig != signal.SIGKILL and self._inside_started([p.pid for p in inside]):
            # Reported as the group signal would be: the group (the leader with it: it ends
            # when the program does, or by the SIGKILL that follows) as killed, the processes
            # of other sessions inside — which the interrupt reaches too — as swept.
            running = [p for p in self.known if p.matches()]
            in_group = {p.pid for p in running if _in_group(p, self.pgid)} | {self.pid}  # read before any dies
            for ident in running:
                if ident.pid != self.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(ident.pid, sig)
            self.report.killed = sorted(set(self.report.killed) | in_group)
            self._interrupt_swept |= {p.pid for p in running} - in_group
            return
        living = [p.pid for p in self.known if _in_group(p, self.pgid)]
        if signal_group(self.pgid, sig):
            self.report.killed = sorted(set(self.report.killed) | set(living))

    def _inside_started(self, pids: Iterable[int]) -> bool:
        """A sandboxed tree whose program runs: besides the leader (bwrap's monitor, which an
        interrupt would kill at once, and the CLI's grace with it), at least bwrap's init and
        the program. Until then the group is signalled as usual: there is nothing to save.
        (Never asked of SIGKILL: with no grace to keep, the group gets it, monitor included.)"""
        return self.sandboxed and sum(1 for pid in pids if pid != self.pid) >= 2

    def kill_group(self) -> list[int]:
        """Snapshot again, then SIGKILL the whole group — while that is still safe.

        Once the leader is reaped its pid, and so the group id, may be reused by an unrelated
        process group; from then on only processes known by identity are killed (``sweep``).
        That is why nothing here reaps the leader before the sweep is over.

        Returns the processes this call found alive and killed — those its report then names
        (killed, or swept: of another group) — so a caller can say exactly what died. The
        leader is among them only if it was still running: sandboxed, bwrap's monitor exits
        as soon as its init reports the program's end, and its init may outlive it (for what
        the program left behind), so the kill may find the init and not the leader.
        """
        self._interrupted = True
        if self.cgroup is not None:
            found: list[int] = []
            if not self._cgroup_killed:
                # Once is enough: cgroup.kill also ends what forks while it runs.
                self._cgroup_killed = True
                unreaped = self.process.returncode is None
                for pid in self.cgroup.procs():
                    if pid not in self._members:
                        self._members[pid] = self._stat(pid, unreaped)
                        if self._members[pid] is not None:
                            found.append(pid)
                self.cgroup.kill()
            # Right after the spawn the leader may not be in its cgroup yet (the shell step
            # enters it after exec): cgroup.kill misses it, so its group is killed too, while
            # the unreaped leader still holds the group id.
            if self.process.returncode is None:
                if self.pid not in self._members:
                    self._members[self.pid] = self._stat(self.pid, True)
                    found.append(self.pid)
                signal_group(self.pgid, signal.SIGKILL)
            return sorted(found)
        if self.process.returncode is not None:
            return []
        self._remember()
        # Read before the signal, as the interrupt reads them: a process that dies of it at
        # once is still reported as killed.
        living = {p.pid for p in self.known if _in_group(p, self.pgid)} | {self.pid}
        if not signal_group(self.pgid, signal.SIGKILL):
            return []
        fresh = sorted(living - set(self.report.killed))
        self.report.killed = sorted(set(self.report.killed) | living)
        return fresh

    async def terminate(self, sig: int, grace: float) -> None:
        """Interrupt, wait up to ``grace`` for the leader to exit, then SIGKILL the group.

        With a cgroup: the same wait, then ``cgroup.kill`` — everything left in the cgroup.
        The grace is the leader's (the CLI that saves its session on the interrupt), not the
        cgroup's: a shell's background jobs ignore SIGINT (POSIX), and waiting for them to
        empty the cgroup would hold every such stop for the whole grace, for nothing.
        """
        if self._ended_by is not None:
            if not self._ended_by.is_set():
                await self._ended_by.wait()
            return
        self._ending = True
        if self.cgroup is not None:
            if not self._interrupted:
                self.interrupt(sig)
            if self.process.returncode is None:
                with trio.move_on_after(grace):
                    await wait_exited(self.process)
            self.kill_group()
            return
        if self.process.returncode is None:
            if not self._interrupted:
                self.interrupt(sig)
            with trio.move_on_after(grace):
                await wait_exited(self.process)
        self.kill_group()

    async def sweep(self, scanner: MarkerScanner, *, budget: float = 5.0) -> None:
        """Kill every remaining process of the turn, and wait until they are gone."""
        if self._ended_by is not None:
            if not self._ended_by.is_set():  # (no checkpoint when it is: nothing to wait for)
                await self._ended_by.wait()
            return
        self._ending = True
        deadline = trio.current_time() + budget
        if self.cgroup is not None:
            await self._end_cgroup(deadline)
            return
        killed: set[int] = set(self.report.killed)
        swept: set[int] = set(self._interrupt_swept)
        for _ in range(20):
            killed.update(self.kill_group())
            started = time.monotonic()
            candidates = set(self.known) | await scanner.scan(self.marker, not_before=started)
            self.known |= candidates
            hit = []
            for ident in candidates:
                in_group = _pgid(ident.pid) == self.pgid
                if kill_exact(ident):
                    hit.append(ident)
                    (killed if in_group else swept).add(ident.pid)
            if self.process.returncode is None:
                with trio.move_on_at(deadline):
                    await wait_exited(self.process)
            others = [h for h in hit if h.pid != self.pid]
            if not others or trio.current_time() >= deadline:
                break
            await wait_gone(others, deadline)
        survivors = await wait_gone([c for c in self.known if c.pid != self.pid], deadline)
        with trio.move_on_at(deadline):
            await self.process.wait()  # reap the leader last: its zombie held the group id
        if self.process.returncode is None:
            survivors.add(ProcId(self.pid, 0))
        self.report.killed = sorted(killed)
        self.report.swept = sorted(swept - killed)
        self.report.survivors = sorted({s.pid for s in survivors})
        self.report.returncode = self.process.returncode


    async def end_alone(self, grace: float, budget: float) -> None:
        """End a handed-over cgroup tree on its own after all (its batch failed): the leader's
        grace, then as :meth:`sweep` does. Its turn still waits for the batch to be done."""
        if self.process.returncode is None:
            with trio.move_on_after(grace):
                await wait_exited(self.process)
        await self._end_cgroup(trio.current_time() + budget)

    async def _end_cgroup(self, deadline: float) -> None:
        """``cgroup.kill``, wait for ``populated 0``, reap the leader (last), remove the cgroup."""
        assert self.cgroup is not None
        self.kill_group()
        emptied = await self.cgroup.wait_empty(deadline)
        self.reap_escapees()
        with trio.move_on_at(deadline):
            await self.process.wait()  # reap the leader last: its zombie held the group id
        self.close_cgroup(emptied)

    def reap_escapees(self) -> None:
        """Cgroup path, once it is empty: reap the members that re-parented to this subreaper
        (exactly those: same pid and start time, a zombie child of this process)."""
        me = os.getpid()
        for pid, then in self._members.items():
            if pid == self.pid or then is None or not waitable(pid):
                continue  # (most members never were this process's children: one ECHILD each)
            now = read_stat(pid)
            if now is not None and now.state == "Z" and now.ppid == me and now.started == then.started:
                reap_if_child(pid)

    def close_cgroup(self, emptied: bool) -> None:
        """Cgroup path, the leader reaped (or the deadline passed): remove the cgroup if
        nothing is left in it, and write the report."""
        assert self.cgroup is not None
        survivors = set(self.cgroup.procs()) if not emptied else set()
        if self.process.returncode is None:
            survivors.add(self.pid)
        if not survivors:
            self.cgroup.remove()
        self.report.killed = sorted(p for p in self._members if self._in_group(p))
        self.report.swept = sorted(p for p, st in self._members.items() if st is not None and st.pgid != self.pgid)
        self.report.survivors = sorted(survivors)
        self.report.returncode = self.process.returncode

    def _in_group(self, pid: int) -> bool:
        stat = self._members.get(pid)
        return stat is not None and stat.pgid == self.pgid

    def background(self) -> list[int]:
        """Processes the turn left running besides its (exited) leader."""
        if self.cgroup is not None:
            return [p for p in self.cgroup.procs() if p != self.pid]
        return [i.pid for i in self.known if i.pid != self.pid and i.matches()]


def reap_orphans(exclude: Iterable[int]) -> list[int]:
    """Reap dead children of this process that nobody else waits for (subreaper adoptees).

    A process re-parented to a subreaper and then dead on its own has no environment left
    to read, so no sweep can attribute it; it is reaped here, by pid, as a dead child.
    ``exclude`` holds the pids Trio waits for itself (live turn leaders). Only for a process
    whose every child is corral's: a host program's own children must not be reaped.
    """
    reaped: list[int] = []
    if not waitable():
        return reaped  # no dead child at all (the usual case): no list of children read
    skip = set(exclude)
    for pid in child_pids(os.getpid()):
        if pid not in skip and waitable(pid) and reap_if_child(pid):
            reaped.append(pid)
    return reaped
