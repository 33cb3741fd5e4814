"""Real process trees through the supervisor (contract line 7): the whole tree dies.

A generic script agent builds the tree shapes real CLIs make — a same-group grandchild, a
setsid grandchild holding stdout open, a double-forked daemon, a tree that ignores SIGINT
and SIGTERM, a background process left behind by a normal turn — and each test checks
that no process of the turn is alive afterwards and that the stop result (or the turn's
kill report) lists what was killed and swept. Real time, generous ``fail_after``.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
import trio.testing
from conftest import PYTHON, make_config, turn_processes

from supervisor.host.supervisor import STOP_NOTICE, Supervisor, open_supervisor
from supervisor.procs.tree import TURN_MARKER, set_child_subreaper
from supervisor.procs.tree import spawn as real_spawn
from supervisor.testing import Hooks, host_pid
from supervisor.turns.process import DRAIN_SECONDS, Turn

SLOW = 20.0

#: Every test here runs with each kill mechanism: a cgroup per turn, and the sweep fallback.
pytestmark = pytest.mark.usefixtures("kill_mechanism")

# The agent is a file so its tool processes can be more copies of it, in other roles:
#   --sleep LABEL [FD]   print "LABEL PID NS" (or write "PID NS" to FD), then sleep
#   --child ROLE         start "--sleep grandchild" in the same group (ROLE=group) or in a
#                        new session with the turn's stdout (ROLE=setsid); print "child PID NS"
#   --daemon             double fork + setsid (stdio on /dev/null), wait until re-parented,
#                        print "daemon PID NS" through the first process, which exits
#   --escapee            the same, but keep the turn's stdout and exec with an environment
#                        that no longer carries the turn marker
# As the agent it prints "agent PID NS" first.
# A pid is reported with its pid namespace (NS, the inode of /proc/self/ns/pid): a sandboxed
# turn has a namespace of its own, where pids are not this process's (see ``reported``).
# As the agent (the prompt is its only argument), words steer it: ignore (SIGINT and
# SIGTERM ignored, inherited by its tools), child, setsid, daemon, escapee, bg (a setsid
# background process sharing stdout), exit (finish normally instead of sleeping), hold
# (before exiting, wait until the file "go" beside this script exists).
TREE_AGENT = r'''
import json, os, signal, subprocess, sys, time

NS = os.stat("/proc/self/ns/pid").st_ino

def say(*parts):
    print(*parts, flush=True)

def me_ident():
    return f"{os.getpid()} {NS}"

def me(*args, **kw):
    return subprocess.Popen([sys.executable, __file__, *args], **kw)

def escape(keep_stdout):
    r, w = os.pipe()
    if os.fork():
        os.close(w)
        say("escapee" if keep_stdout else "daemon", os.read(r, 64).decode())
        os._exit(0)
    os.setsid()
    middle = os.getpid()
    if os.fork():
        os._exit(0)
    while os.getppid() == middle:  # until the middle process is gone: escaped
        time.sleep(0.001)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in ((0, 2) if keep_stdout else (0, 1, 2)):
        os.dup2(null, fd)
    os.write(w, me_ident().encode())
    os.close(w)
    if keep_stdout:
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(3600)"], {})
    time.sleep(3600)

if sys.argv[1] == "--":  # the generic adapter's end of options, before the prompt
    del sys.argv[1]
role = sys.argv[1]
if role == "--sleep":
    if len(sys.argv) > 3:
        os.write(int(sys.argv[3]), me_ident().encode())
    else:
        say(sys.argv[2], me_ident())
    time.sleep(3600)
elif role == "--child":
    me("--sleep", "grandchild", start_new_session=sys.argv[2] == "setsid")
    say("child", me_ident())
    time.sleep(3600)
elif role in ("--daemon", "--escapee"):
    escape(role == "--escapee")
else:
    say("agent", me_ident())
    words = role.split()
    if "ignore" in words:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    if "child" in words:
        me("--child", "group")
    if "setsid" in words:
        me("--child", "setsid")
    if "daemon" in words:
        subprocess.run([sys.executable, __file__, "--daemon"], check=True)
    if "escapee" in words:
        subprocess.run([sys.executable, __file__, "--escapee"], check=True)
    if "bg" in words:
        r, w = os.pipe()
        me("--sleep", "bg", str(w), pass_fds=[w], start_new_session=True)
        os.close(w)
        say("bg", os.read(r, 64).decode())
    say("ready")
    if "exit" in words:
        go = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go")
        while "hold" in words and not os.path.exists(go):
            time.sleep(0.01)
        print(json.dumps({"type": "result", "text": "done"}), flush=True)
        sys.exit(0)
    time.sleep(3600)
'''


def is_subreaper() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int(0)
    assert libc.prctl(37, ctypes.byref(value), 0, 0, 0) == 0  # PR_GET_CHILD_SUBREAPER
    return bool(value.value)


@pytest.fixture
def subreaper_restored() -> Iterator[bool]:
    """Put the process-wide child-subreaper bit back as it was; yields what it was."""
    before = is_subreaper()
    try:
        yield before
    finally:
        set_child_subreaper(before)


@dataclass
class Recorder:
    """``Hooks.spawn``: the real spawner, remembering each turn (shielded like the real one).

    With ``park``, each spawn, its process started, waits for ``go`` before it returns (and so
    before its registration): ``parked`` is set meanwhile, with the leader's pid in ``pids``.
    """

    sup: Supervisor | None = None
    turns: list[Turn] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    park: bool = False
    parked: trio.Event = field(default_factory=trio.Event)
    go: trio.Event = field(default_factory=trio.Event)
    turn_ids: list[str] = field(default_factory=list)

    async def __call__(self, argv: tuple[str, ...], *, env: Any, cwd: str, stdin_pipe: bool, **kw: Any) -> trio.Process:
        with trio.CancelScope(shield=True):
            process = await real_spawn(argv, env=env, cwd=cwd, stdin_pipe=stdin_pipe, **kw)
            self.turn_ids.append(env[TURN_MARKER])
            if self.park:
                self.pids.append(process.pid)
                self.parked.set()
                await self.go.wait()
                self.pids.pop()
        assert self.sup is not None
        self.turns += [t for t in self.sup._lanes.turns.values() if t.turn_id == env[TURN_MARKER]]
        self.pids.append(process.pid)
        return process


@asynccontextmanager
async def running(
    folder: Path, *, subreaper: bool = False, sandbox: str = "auto", park: bool = False, **agent: Any
) -> AsyncIterator[tuple[Supervisor, Recorder]]:
    script = folder / "tree_agent.py"
    script.write_text(TREE_AGENT)
    config = make_config(folder, {"bot": {"adapter": "generic", "command": [PYTHON, str(script)], **agent}})
    config = replace(config, server=replace(config.server, sandbox=sandbox))
    recorder = Recorder(park=park)
    async with open_supervisor(config, subreaper=subreaper, hooks=Hooks(spawn=recorder)) as sup:
        recorder.sup = sup
        try:
            yield sup, recorder
        finally:
            recorder.go.set()  # a test that failed while a spawn is parked: the shutdown ends it


async def pids_of(sup: Supervisor, channel: str, *labels: str) -> dict[str, int]:
    """Wait for a "LABEL PID NS" line of each label; return the pids, as this process's."""
    return (await reported(sup, channel, *labels))[0]


async def reported(sup: Supervisor, channel: str, *labels: str) -> tuple[dict[str, int], int]:
    """Wait for a "LABEL PID NS" line of each label; return the pids, translated to this
    process's as each line arrives (the process is alive then), and the pid namespace."""
    found: dict[str, int] = {}
    namespaces: set[int] = set()
    ready = False
    with trio.fail_after(SLOW):
        async with aclosing(sup.follow(channel)) as entries:
            async for entry in entries:
                # The agent's plain lines arrive joined, one message per run of them.
                for line in entry.text.split("\n") if entry.kind == "message" else ():
                    parts = line.split()
                    if len(parts) == 3 and parts[0] in labels and parts[1].isdigit() and parts[2].isdigit():
                        found[parts[0]] = host_pid(int(parts[1]), int(parts[2]))
                        namespaces.add(int(parts[2]))
                    ready = ready or line == "ready"
                if ready and set(found) == set(labels):
                    assert len(namespaces) == 1, namespaces  # one turn, one namespace
                    return found, namespaces.pop()
                if entry.kind in ("error", "notice"):
                    raise AssertionError(f"the turn ended early: {entry.text}")
    raise AssertionError("the follow ended")


#: ``/proc/PID/stat``'s flag of a task in the kernel's exit path (``PF_EXITING``).
PF_EXITING = 0x4


def alive(pid: int) -> bool:
    """Can the process still run code? Not if it is gone, a zombie, or already in the kernel's
    exit path (PF_EXITING, set as ``do_exit`` begins: it never returns to user space). A SIGKILLed
    task leaves its cgroup before it is a zombie — bwrap's init, exiting, first waits in the
    kernel for its pid namespace's other processes to go — so under load a stop that returned
    once the turn's cgroup was empty could find it there for a moment (seen once in a full run)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0] not in (b"Z", b"X") and not int(fields[6]) & PF_EXITING


def descendants_of(pid: int) -> set[int]:
    return {p.pid for p in psutil.Process(pid).children(recursive=True)}


async def stop(sup: Supervisor, channel: str) -> Any:
    with trio.fail_after(SLOW):
        result = await sup.stop(channel)
    assert result.ok, result.error
    entries = await sup.entries(channel)
    assert entries[-1].kind == "notice" and entries[-1].text == STOP_NOTICE
    return result


async def wait_exit(pid: int) -> None:
    """Wait until a process that is not our child has exited on its own (pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with trio.fail_after(SLOW):
            await trio.lowlevel.wait_readable(fd)
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
    assert not alive(pid)


def sandbox_init(ns: int) -> int:
    """bwrap's init in the turn's pid namespace ``ns`` (pid 1 there), as this process's pid."""
    return host_pid(1, ns)


async def kill_and_wait(pid: int) -> None:
    """SIGKILL a process that is not our child and wait until it has exited (pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(SLOW):
            await trio.lowlevel.wait_readable(fd)
    finally:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
    assert not alive(pid)


# ---------------------------------------------------------------- trees
#
# Sandboxed (the default), the leader corral spawns is bwrap's monitor; inside the turn's pid
# namespace bwrap's init runs the agent. The tree a test expects killed is what it reads under
# the leader before the stop (monitor, init, agent and what the agent started), never a
# hard-coded layout.


async def test_tree_same_group_grandchild_dies_with_the_group(short_tmp: Path) -> None:
    async with running(short_tmp, stop_grace=2.0) as (sup, rec):
        await sup.send("ch", "child")
        pids = await pids_of(sup, "ch", "agent", "child", "grandchild")
        leader = rec.pids[0]
        tree = {leader} | descendants_of(leader)
        assert set(pids.values()) < tree
        assert {os.getpgid(p) for p in tree} == {leader}

        result = await stop(sup, "ch")

        assert tree <= set(result.killed)
        assert result.swept == []
        assert not any(alive(p) for p in tree)
        assert not turn_processes([rec.turns[0].turn_id])


async def test_tree_setsid_grandchild_holding_stdout_is_swept_promptly(short_tmp: Path) -> None:
    grace = 2.0
    async with running(short_tmp, stop_grace=grace) as (sup, rec):
        await sup.send("ch", "setsid")
        pids = await pids_of(sup, "ch", "agent", "child", "grandchild")
        leader = rec.pids[0]
        assert os.getsid(pids["grandchild"]) == pids["grandchild"] != leader  # its own session
        tree = {leader} | descendants_of(leader)
        group = {p for p in tree if os.getpgid(p) == leader}
        assert group == tree - {pids["grandchild"]}

        result = await stop(sup, "ch")

        # The leader and the child leave on SIGINT; the grandchild holding stdout is
        # found and killed without waiting for it to close the pipe.
        assert result.elapsed_ms < (grace + 1.0) * 1000
        assert group <= set(result.killed)
        assert pids["grandchild"] in result.swept
        assert not any(alive(p) for p in tree)
        assert not turn_processes([rec.turns[0].turn_id])


async def test_tree_stop_respects_the_drain_deadline_when_stdout_stays_open(short_tmp: Path) -> None:
    # A process that escaped before the stop *and* dropped the turn marker cannot be found
    # (no ancestry, no marker); it still holds the turn's stdout. The stop must not wait
    # for that pipe to close: it drains only until its deadline.
    # Unsandboxed: inside the sandbox's pid namespace an orphan re-parents to bwrap's init,
    # so nothing can leave the turn's ancestry (the sandboxed counterpart is below).
    grace = 1.0
    async with running(short_tmp, sandbox="off", stop_grace=grace) as (sup, rec):
        await sup.send("ch", "escapee")
        pids = await pids_of(sup, "ch", "escapee")
        holder = pids["escapee"]
        try:
            assert holder not in descendants_of(rec.pids[0])
            with trio.fail_after(SLOW):
                result = await sup.stop("ch")
            assert result.ok
            assert result.elapsed_ms < (grace + 3 * DRAIN_SECONDS + 1.0) * 1000
            assert not turn_processes([rec.turns[0].turn_id])
        finally:
            await kill_and_wait(holder)


async def test_tree_sandboxed_escapee_holding_stdout_stays_in_the_tree_and_dies_promptly(short_tmp: Path) -> None:
    # The same escape in the sandbox: double fork, setsid, marker dropped, stdout kept. Its
    # orphan re-parents to bwrap's init, inside the leader's tree, so the stop kills it and
    # returns within the same bound; nothing of the turn, the escapee included, is left.
    grace = 1.0
    async with running(short_tmp, stop_grace=grace) as (sup, rec):
        await sup.send("ch", "escapee")
        pids, ns = await reported(sup, "ch", "escapee")
        holder = pids["escapee"]
        try:
            assert psutil.Process(holder).ppid() == sandbox_init(ns)
            assert holder in descendants_of(rec.pids[0])
            with trio.fail_after(SLOW):
                result = await sup.stop("ch")
            assert result.ok
            assert result.elapsed_ms < (grace + 3 * DRAIN_SECONDS + 1.0) * 1000
            assert holder in set(result.killed) | set(result.swept)
            assert not alive(holder)
            assert not turn_processes([rec.turns[0].turn_id])
        finally:
            await kill_and_wait(holder)


@pytest.mark.parametrize("subreaper", [False, True], ids=["plain", "subreaper"])
async def test_tree_double_forked_daemon_is_found_by_its_marker(
    short_tmp: Path, subreaper: bool, subreaper_restored: bool
) -> None:
    # Unsandboxed: the premise is an orphan leaving the turn's ancestry (to the subreaper, or
    # to init). In the sandbox it re-parents to bwrap's init instead (the counterpart below).
    async with running(short_tmp, subreaper=subreaper, sandbox="off", stop_grace=2.0) as (sup, rec):
        await sup.send("ch", "daemon")
        daemon = (await pids_of(sup, "ch", "daemon"))["daemon"]
        leader = rec.pids[0]
        # Escaped before the stop: no longer a descendant of the turn's leader.
        assert daemon not in descendants_of(leader)
        assert os.getsid(daemon) != leader
        if subreaper:
            assert psutil.Process(daemon).ppid() == os.getpid()

        result = await stop(sup, "ch")

        assert daemon in result.swept
        assert leader in result.killed
        assert not alive(daemon)
        if subreaper:
            assert not psutil.pid_exists(daemon) or psutil.Process(daemon).ppid() != os.getpid()  # reaped
        assert not turn_processes([rec.turns[0].turn_id])
    # The bit is process-wide: an embedding program gets it back as it was.
    assert is_subreaper() == subreaper_restored


@pytest.mark.parametrize("subreaper", [False, True], ids=["plain", "subreaper"])
async def test_tree_sandboxed_double_forked_daemon_is_adopted_by_bwraps_init_and_dies(
    short_tmp: Path, subreaper: bool, subreaper_restored: bool
) -> None:
    # The same double fork in the sandbox: the daemon re-parents to bwrap's init (pid 1 of the
    # turn's namespace), never to this process, subreaper or not; the stop kills it (by the
    # tree or its marker), its init reaps it, and nothing of the turn is left.
    async with running(short_tmp, subreaper=subreaper, stop_grace=2.0) as (sup, rec):
        await sup.send("ch", "daemon")
        pids, ns = await reported(sup, "ch", "daemon")
        daemon, leader = pids["daemon"], rec.pids[0]
        init = sandbox_init(ns)
        assert psutil.Process(daemon).ppid() == init != os.getpid()
        assert {init, daemon} <= descendants_of(leader)
        assert os.getsid(daemon) != leader

        result = await stop(sup, "ch")

        assert daemon in result.swept
        assert init in result.killed
        assert not any(alive(p) for p in (leader, init, daemon))
        assert not psutil.pid_exists(daemon) or psutil.Process(daemon).ppid() != os.getpid()
        assert not turn_processes([rec.turns[0].turn_id])
    assert is_subreaper() == subreaper_restored


async def test_tree_ignoring_sigint_and_sigterm_still_dies(short_tmp: Path) -> None:
    grace = 0.5
    async with running(short_tmp, stop_grace=grace) as (sup, rec):
        await sup.send("ch", "ignore child")
        pids = await pids_of(sup, "ch", "agent", "child", "grandchild")
        leader = rec.pids[0]
        status = psutil.Process(pids["grandchild"]).as_dict(["status"])
        assert status["status"] != psutil.STATUS_ZOMBIE
        tree = {leader} | descendants_of(leader)
        assert set(pids.values()) < tree

        result = await stop(sup, "ch")

        assert result.elapsed_ms >= grace * 1000
        assert rec.turns[0].tree is not None and rec.turns[0].tree.process.returncode == -signal.SIGKILL
        assert tree <= set(result.killed)
        assert not any(alive(p) for p in tree)
        assert not turn_processes([rec.turns[0].turn_id])


# ---------------------------------------------------------------- a normal turn's leftovers


async def test_tree_normal_turn_background_process_is_swept(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, rec):
        # "hold": the agent finishes only once its pids are read (a pid it reports is its
        # namespace's, translated while the process lives; the sweep would end it).
        await sup.send("ch", "bg exit hold")
        bg = (await pids_of(sup, "ch", "bg"))["bg"]
        (short_tmp / "go").touch()
        assert await sup.wait_idle("ch", timeout=SLOW)

        turn = rec.turns[0]
        assert turn.outcome.ok and not turn.outcome.stopped
        assert bg in turn.outcome.report.swept
        assert not alive(bg)
        assert not turn_processes([turn.turn_id])
        assert (await sup.entries("ch"))[-1].text == "done"


async def test_tree_keep_background_leaves_it_alive(short_tmp: Path) -> None:
    async with running(short_tmp, keep_background=True) as (sup, rec):
        await sup.send("ch", "bg exit")
        pids, ns = await reported(sup, "ch", "bg")
        bg = pids["bg"]
        init = sandbox_init(ns)  # it stays while anything of its namespace runs
        try:
            # The background process holds stdout open: the turn still ends, after the
            # drain deadline, and leaves it running (with bwrap's init, its parent now).
            with trio.fail_after(SLOW):
                assert await sup.wait_idle("ch")
            turn = rec.turns[0]
            assert turn.outcome.ok and turn.outcome.report.swept == []
            assert alive(bg)
            assert sorted(p.pid for p in turn_processes([turn.turn_id])) == sorted([init, bg])
            assert (await sup.entries("ch"))[-1].text == "done"
        finally:
            await kill_and_wait(bg)
            await wait_exit(init)  # its last process gone, bwrap's init exits by itself
        assert not turn_processes([rec.turns[0].turn_id])


async def test_tree_stop_while_a_kept_background_turn_finishes_still_kills_its_tree(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # keep_background keeps a *finished* turn's leftovers, not a stopped turn's: a stop
    # that lands while the turn is finishing (parked here in its leftover drain, where a
    # background process holding stdout keeps it for up to the drain deadline) must still
    # leave nothing of the turn alive when it returns.
    parked, go = trio.Event(), trio.Event()
    original = Turn._drain_leftovers

    async def parking(self: Turn, tree: Any) -> None:
        parked.set()
        with trio.fail_after(SLOW):
            await go.wait()
        await original(self, tree)

    monkeypatch.setattr(Turn, "_drain_leftovers", parking)
    async with running(short_tmp, keep_background=True) as (sup, rec):
        await sup.send("ch", "bg exit")
        pids, ns = await reported(sup, "ch", "bg")
        bg = pids["bg"]
        init = sandbox_init(ns)
        try:
            with trio.fail_after(SLOW):
                await parked.wait()
            results = []

            async def stop() -> None:
                results.append(await sup.stop("ch"))

            with trio.fail_after(SLOW):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stop)
                    await trio.testing.wait_all_tasks_blocked()
                    go.set()
            result = results[0]
            assert result.ok and result.stopped_turns == [rec.turns[0].turn_id]
            assert bg in result.swept
            assert not alive(bg) and not alive(init)
            assert not turn_processes([rec.turns[0].turn_id])
            entries = await sup.entries("ch")
            assert entries[-1].kind == "notice" and not [e for e in entries if e.text == "done"]
        finally:
            if alive(bg):
                await kill_and_wait(bg)


# ---------------------------------------------------------------- a late registration, sandboxed
#
# A stop that lands while a turn's process is being spawned finds nothing to kill; the
# registration that follows kills the tree (contract line 6). Sandboxed, the leader is bwrap's
# monitor, its child bwrap's init (pid 1 of the turn's namespace), and the program the init's
# child. Each test parks the spawn once its process is started, stops the channel meanwhile,
# then lets the registration happen: first with the program running, then with the program
# already ended by itself (what the chaos trial of issue 39 saw: the monitor had exited 0, the
# registration's kill found only the init).


async def stop_while_parked(sup: Supervisor, rec: Recorder) -> Any:
    """Stop ``ch`` while its turn's spawn is parked, then let the spawn return (and register)."""
    results = []

    async def stop() -> None:
        results.append(await sup.stop("ch"))

    with trio.fail_after(SLOW):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop)
            await trio.testing.wait_all_tasks_blocked()
            assert sup._registry.get("ch", rec.turn_ids[0]) is None  # nothing to kill yet
            rec.go.set()
    assert await sup.wait_idle("ch", timeout=SLOW)
    result = results[0]
    assert result.ok, result.error
    assert (await sup.entries("ch"))[-1].text == STOP_NOTICE
    return result


def late_kill_log(caplog: pytest.LogCaptureFixture) -> str:
    """The registry's one line about the late registration it killed."""
    lines = [r.getMessage() for r in caplog.records if "registered for stopped turn" in r.getMessage()]
    assert len(lines) == 1, lines
    return lines[0]


def pids_in(line: str) -> set[int]:
    """The pids a registry line says were killed (``processes [..]``)."""
    if "processes [" not in line:
        return set()
    inner = line.split("processes [", 1)[1].split("]", 1)[0]
    return {int(p) for p in inner.split(", ") if p}


def program_runs(leader: int) -> bool:
    """Has the agent's program (not bwrap's init: a fork of bwrap, which since --args shows only its program after bwrap's own name) started under ``leader``?"""
    try:
        return any("tree_agent.py" in " ".join(argv := p.cmdline()) and "bwrap" not in os.path.basename(argv[0])
                   for p in psutil.Process(leader).children(recursive=True))
    except psutil.NoSuchProcess:  # one of them exec'ing or gone this instant: ask again
        return False


async def test_tree_late_registration_of_a_running_sandboxed_program_kills_its_namespace(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The program ignores SIGINT and the grace is long: only the registration's SIGKILL ends it.
    caplog.set_level("INFO", logger="corral.registry")
    async with running(short_tmp, park=True, stop_grace=60) as (sup, rec):
        await sup.send("ch", "ignore")
        with trio.fail_after(SLOW):
            await rec.parked.wait()
            leader = rec.pids[0]
            while not program_runs(leader):
                await trio.sleep(0.01)  # the program starting inside the sandbox: an outside event
        inside = descendants_of(leader)  # bwrap's init and the program
        assert len(inside) == 2

        result = await stop_while_parked(sup, rec)

        tree = rec.turns[0].tree
        assert tree is not None and tree.sandboxed
        assert tree.process.returncode == -signal.SIGKILL
        assert not any(alive(p) for p in {leader} | inside)
        assert set(result.killed) | set(result.swept) == {leader} | inside
        assert pids_in(late_kill_log(caplog)) == {leader} | inside
        assert not turn_processes([rec.turn_ids[0]])


async def test_tree_late_registration_after_the_sandboxed_program_ended_kills_what_it_left(
    short_tmp: Path, caplog: pytest.LogCaptureFixture, kill_mechanism: str
) -> None:
    # The program starts a background process and exits 0 before the spawn returns. bwrap's
    # monitor exits at once with that 0 (its init reports the program's status over an eventfd
    # the moment it reaps it), while the init stays for the background process: the
    # registration finds the leader gone and must still end the rest — and say which pids.
    caplog.set_level("INFO", logger="corral.registry")
    async with running(short_tmp, park=True) as (sup, rec):
        await sup.send("ch", "bg exit")
        with trio.fail_after(SLOW):
            await rec.parked.wait()
        leader = rec.pids[0]
        await wait_exit(leader)  # not reaped: Trio's process sees its status at the registration
        left = {p.pid for p in turn_processes([rec.turn_ids[0]])}
        assert len(left) == 2  # bwrap's init and the background process

        result = await stop_while_parked(sup, rec)

        tree = rec.turns[0].tree
        assert tree is not None and tree.process.returncode == 0  # the program's own status
        assert not any(alive(p) for p in left)
        assert not turn_processes([rec.turn_ids[0]])
        assert set(result.killed) | set(result.swept) == left
        line = late_kill_log(caplog)
        assert f"its leader {leader} had exited (status 0)" in line
        # The registration's kill named what the stop's result names. Without a cgroup it
        # knows nothing of a leader gone before it registered: its sweep ends the rest.
        assert pids_in(line) == (left if kill_mechanism == "cgroup" else set())
        assert kill_mechanism == "cgroup" or "the rest is its sweep's" in line


def test_tree_agent_compiles() -> None:
    compile(TREE_AGENT, "<tree agent>", "exec")

