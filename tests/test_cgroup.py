"""A cgroup v2 per turn (issue 11): nothing a turn starts escapes the stop, nor a restart.

Real processes throughout. The escapee is what no marker or tree walk can find: started by
the turn through ``env -i`` (no ``CORRAL_*`` variable), ``setsid`` (a session of its own) and
a double fork (re-parented away from the turn), its pid written to a file the test reads.
Tests that need a writable cgroup v2 skip, naming what is missing, where there is none.

Sandboxed (the default), a turn has a pid namespace of its own: pids are written with their
namespace (``PID NS``) and translated here, and an orphan re-parents to bwrap's init inside
it, never out of the turn's tree. The tests whose premise is an escapee out of the tree run
unsandboxed (``sandbox = "off"``), each beside a sandboxed counterpart.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import trio
import trio.testing
from conftest import PYTHON, DaemonProcess, cgroup_missing, make_config
from test_durable import entries, rows, until

from supervisor import Config, ConfigError, parse_config
from supervisor.host.supervisor import Supervisor, open_supervisor
from supervisor.procs.cgroup import ENTER_SCRIPT, CgroupRoot, Watcher, cgroup2_mount, open_root, own_cgroup
from supervisor.procs.tree import TURN_MARKER, ProcessTree, spawn
from supervisor.store.store import Entry
from supervisor.testing import host_pid, read_pid

SLOW = 30.0
MISSING = cgroup_missing()
needs_cgroup = pytest.mark.skipif(MISSING is not None, reason=f"no writable cgroup v2: {MISSING}")

# The agent (generic protocol: plain lines are messages). Its prompt is a pid file. First
# thing, it says which cgroup it runs in as it sees it (in the sandbox's cgroup namespace,
# whose root is the cgroup it started in), and its pid with its pid namespace; then it
# starts the escapee ("PID NS" in the pid file) and says "ready".
ESCAPING_AGENT = r"""
import os, subprocess, sys, time
pidfile = sys.argv[-1]
print("cgroup " + open("/proc/self/cgroup").read().strip().splitlines()[-1], os.getpid(),
      os.stat("/proc/self/ns/pid").st_ino, flush=True)
subprocess.run(
    ["env", "-i", "/usr/bin/setsid", "/bin/sh", "-c",
     'sleep 1000 </dev/null >/dev/null 2>&1 & echo "$! $(stat -L -c %i /proc/self/ns/pid)" > "$1.tmp"'
     ' && mv "$1.tmp" "$1"', "sh", pidfile],
    check=True,
)
while not os.path.exists(pidfile):
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(1000)
"""


def agent_config(folder: Path) -> dict[str, object]:
    script = folder / "escaping_agent.py"
    script.write_text(ESCAPING_AGENT)
    return {"adapter": "generic", "command": [PYTHON, str(script)], "stop_grace": 1.0}


def unsandboxed(config: Config) -> Config:
    """``config`` with ``[server] sandbox = "off"``."""
    return replace(config, server=replace(config.server, sandbox="off"))


def own_pid_ns() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def escapees() -> Iterator[list[int]]:
    """Pids of escapees: killed by pid at the end whatever happened (no marker finds them)."""
    found: list[int] = []
    yield found
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def read_escapee(pidfile: Path, escapees: list[int], leader: int, *, sandboxed: bool) -> int:
    words = pidfile.read_text().split()
    pid, ns = int(words[0]), int(words[1])
    assert (ns != own_pid_ns()) == sandboxed
    pid = host_pid(pid, ns)
    escapees.append(pid)
    proc = psutil.Process(pid)
    # It really escaped: no marker, a session of its own, re-parented away from the turn...
    assert TURN_MARKER not in proc.environ() and "CORRAL_STORE" not in proc.environ()
    assert os.getsid(pid) not in (leader, os.getsid(leader))
    below = {c.pid for c in psutil.Process(leader).children(recursive=True)}
    if sandboxed:
        # ...as far as a pid namespace lets it: to bwrap's init (pid 1 there), which is the
        # leader's (bwrap's monitor's) child; away from the agent it started from.
        init = host_pid(1, ns)
        assert proc.ppid() == init and [c.pid for c in psutil.Process(leader).children()] == [init]
    else:
        assert proc.ppid() != leader and pid not in below
    return pid


async def wait_text(sup: Supervisor, channel: str, prefix: str) -> Entry:
    with trio.fail_after(SLOW):
        async with aclosing(sup.follow(channel)) as stream:
            async for entry in stream:
                for line in entry.text.split("\n"):
                    if line.startswith(prefix):
                        return entry
    raise AssertionError("the follow ended")


# ---------------------------------------------------------------- in process


@needs_cgroup
async def test_cgroup_the_cli_runs_in_its_turns_cgroup_from_its_first_instruction(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"bot": agent_config(short_tmp)})
    async with open_supervisor(config) as sup:
        assert sup.cgroups is not None
        await sup.send("ch", str(short_tmp / "pid"))
        said = await wait_text(sup, "ch", "cgroup ")
        turn = said.turn
        assert turn is not None
        expected = "/" + str((sup.cgroups.path / turn).relative_to(cgroup2_mount() or "/"))
        # Its first instruction found it at the root of its cgroup namespace, which bwrap made
        # where it started (after the cgroup was joined); this process sees which cgroup that is.
        _, seen, pid, ns = said.text.split("\n")[0].split()
        assert seen == "0::/"
        agent = host_pid(int(pid), int(ns))
        assert Path(f"/proc/{agent}/cgroup").read_text().strip().splitlines()[-1] == f"0::{expected}"
        await wait_text(sup, "ch", "ready")
        os.kill(read_pid(short_tmp / "pid"), signal.SIGKILL)
        result = await sup.stop("ch")
        assert result.ok and result.kill == "cgroup"
        assert not (sup.cgroups.path / turn).exists()  # removed once empty


@needs_cgroup
@pytest.mark.parametrize("sandbox", ["off", "auto"])
async def test_cgroup_escapee_with_cleared_env_setsid_and_double_fork_is_dead_when_the_stop_returns(
    short_tmp: Path, escapees: list[int], sandbox: str
) -> None:
    # "off": the escapee leaves the turn's tree, as only an unsandboxed one can (in the
    # sandbox's pid namespace it re-parents to bwrap's init); "auto": the sandboxed one.
    config = make_config(short_tmp, {"bot": agent_config(short_tmp)})
    config = unsandboxed(config) if sandbox == "off" else config
    async with open_supervisor(config) as sup:
        await sup.send("ch", str(short_tmp / "pid"))
        ready = await wait_text(sup, "ch", "ready")
        escapee = read_escapee(short_tmp / "pid", escapees, sup.status()["channels"]["ch"]["turn"]["pid"],
                               sandboxed=sandbox != "off")
        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        assert not alive(escapee)
        assert result.ok and result.kill == "cgroup" and escapee in result.swept
        assert result.to_json()["kill"] == "cgroup"
        assert sup.cgroups is not None and not (sup.cgroups.path / str(ready.turn)).exists()


@needs_cgroup
async def test_cgroup_sweep_fallback_says_so_in_the_stop_result(short_tmp: Path, escapees: list[int]) -> None:
    # The same turn with cgroup = "off": the sweep cannot see the escapee (which is why the
    # cgroup exists); the result names the mechanism used. Unsandboxed: only there can the
    # escapee leave the turn's tree (the sandboxed counterpart is next).
    config = parse_config(
        {"server": {"cgroup": "off", "sandbox": "off"}, "agents": {"bot": agent_config(short_tmp)}}, base=short_tmp
    )
    async with open_supervisor(config) as sup:
        assert sup.cgroups is None
        await sup.send("ch", str(short_tmp / "pid"))
        await wait_text(sup, "ch", "ready")
        escapee = read_escapee(short_tmp / "pid", escapees, sup.status()["channels"]["ch"]["turn"]["pid"],
                               sandboxed=False)
        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        assert result.kill == "sweep"
        assert alive(escapee)  # the fallback's known limit


@needs_cgroup
async def test_cgroup_sweep_fallback_in_the_sandbox_still_kills_the_escapee(
    short_tmp: Path, escapees: list[int]
) -> None:
    # Sandboxed, the same escapee stays in the turn's pid namespace, under bwrap's init: the
    # sweep fallback (it says so) leaves nothing alive, the escapee included.
    agent = {**agent_config(short_tmp), "sandbox_write": [str(short_tmp)]}  # for its pid file
    config = parse_config({"server": {"cgroup": "off"}, "agents": {"bot": agent}}, base=short_tmp)
    async with open_supervisor(config) as sup:
        assert sup.cgroups is None
        await sup.send("ch", str(short_tmp / "pid"))
        await wait_text(sup, "ch", "ready")
        leader = sup.status()["channels"]["ch"]["turn"]["pid"]
        escapee = read_escapee(short_tmp / "pid", escapees, leader, sandboxed=True)
        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        assert result.ok and result.kill == "sweep"
        assert not alive(escapee) and not alive(leader)


@needs_cgroup
async def test_cgroup_spawn_passes_text_as_arguments_never_to_the_shell(short_tmp: Path) -> None:
    root = CgroupRoot(cgroup2_base(), "test-" + os.urandom(4).hex())
    root.setup()
    try:
        cgroup = root.create("t1")
        tricky = "$(touch pwned) `touch pwned2`; echo 'x' \"$1\" && exit 3"
        process = await spawn(
            ("printf", "%s|", tricky, "-n", "--", "$0"), env={"PATH": os.defpath}, cwd=str(short_tmp),
            stdin_pipe=False, cgroup=cgroup,
        )
        assert process.stdout is not None
        with trio.fail_after(SLOW):
            out = b""
            while chunk := await process.stdout.receive_some():
                out += chunk
            await process.wait()
        assert out.decode() == f"{tricky}|-n|--|$0|"
        assert process.returncode == 0 and not list(short_tmp.glob("pwned*"))
        assert cgroup.remove()
    finally:
        root.close()


@needs_cgroup
async def test_cgroup_spawn_of_a_missing_program_fails_the_spawn(short_tmp: Path) -> None:
    root = CgroupRoot(cgroup2_base(), "test-" + os.urandom(4).hex())
    root.setup()
    try:
        cgroup = root.create("t1")
        with pytest.raises(FileNotFoundError):
            await spawn(("no-such-program-corral",), env={"PATH": os.defpath}, cwd=str(short_tmp), stdin_pipe=False,
                        cgroup=cgroup)
        with pytest.raises(FileNotFoundError):
            await spawn(("./nope",), env={"PATH": os.defpath}, cwd=str(short_tmp), stdin_pipe=False, cgroup=cgroup)
        assert cgroup.remove()
    finally:
        root.close()


def cgroup2_base() -> Path:
    mount = cgroup2_mount()
    own = own_cgroup()
    assert mount is not None and own is not None
    return mount / own.lstrip("/")


def test_cgroup_limits_apply_where_the_controllers_are_delegated(short_tmp: Path) -> None:
    if MISSING is not None:
        pytest.skip(f"no writable cgroup v2: {MISSING}")
    base = cgroup2_base()
    available = (base / "cgroup.controllers").read_text().split()
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        pytest.skip(f"the {' and '.join(missing)} controller(s) are not enabled in cgroup v2 here ({base})")
    root = CgroupRoot(base, "test-" + os.urandom(4).hex())
    root.setup()
    try:
        cgroup = root.create("t1", {"memory_max": "64M", "pids_max": 32})
        assert (Path(cgroup.path) / "memory.max").read_text().strip() == str(64 << 20)
        assert (Path(cgroup.path) / "pids.max").read_text().strip() == "32"
        assert cgroup.remove()
    finally:
        root.close()


def test_cgroup_limits_without_the_controllers_are_logged_once_and_the_turn_runs(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if MISSING is not None:
        pytest.skip(f"no writable cgroup v2: {MISSING}")
    root = CgroupRoot(cgroup2_base(), "test-" + os.urandom(4).hex())
    root.setup()
    root.controllers = frozenset()  # as where nothing is delegated
    try:
        first = root.create("t1", {"memory_max": "64M", "pids_max": None})
        second = root.create("t2", {"memory_max": "64M", "pids_max": None})
        warned = [r.getMessage() for r in caplog.records if "not delegated" in r.getMessage()]
        assert len(warned) == 1 and "memory_max" in warned[0]
        assert first.remove() and second.remove()
    finally:
        root.close()


# ---------------------------------------------------------------- detection and config


HYBRID = """\
24 29 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 24 0:27 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
43 31 0:40 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory
"""


def test_cgroup_detection_reads_mountinfo_and_proc_cgroup() -> None:
    assert cgroup2_mount(HYBRID) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_mount("22 1 0:21 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n") == Path("/sys/fs/cgroup")
    assert cgroup2_mount(HYBRID.splitlines()[0]) is None
    assert own_cgroup("4:memory:/x\n0::/system.slice/corral.service\n") == "/system.slice/corral.service"
    assert own_cgroup("4:memory:/x\n") is None


def test_cgroup_config_accepts_auto_off_and_a_usable_path(short_tmp: Path) -> None:
    agents = {"demo": {"adapter": "demo"}}
    assert parse_config({"agents": agents}, base=short_tmp).server.cgroup == "auto"
    assert parse_config({"server": {"cgroup": "off"}, "agents": agents}, base=short_tmp).server.cgroup == "off"
    if MISSING is None:
        base = str(cgroup2_base())
        assert parse_config({"server": {"cgroup": base}, "agents": agents}, base=short_tmp).server.cgroup == base


def test_cgroup_config_rejects_an_unusable_path_with_the_fix(short_tmp: Path) -> None:
    agents = {"demo": {"adapter": "demo", "memory_max": "lots", "pids_max": 0}}
    with pytest.raises(ConfigError) as caught:
        parse_config({"server": {"cgroup": str(short_tmp)}, "agents": agents}, file="c.toml", base=short_tmp)
    problems = {p.key: p for p in caught.value.problems}
    assert "is not a folder of a cgroup2 file system" in problems["server.cgroup"].message
    assert "Delegate=yes" in problems["server.cgroup"].fix and '"auto"' in problems["server.cgroup"].fix
    assert "agents.demo.memory_max" in problems and "agents.demo.pids_max" in problems


def test_cgroup_corral_check_reports_an_unusable_path(short_tmp: Path) -> None:
    (short_tmp / "corral.toml").write_text(
        f'[server]\ncgroup = "{short_tmp}/nope"\n[agents.demo]\nadapter = "demo"\n'
    )
    out = subprocess.run([PYTHON, "-m", "supervisor.cli", "check", "-c", "corral.toml"], cwd=short_tmp,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "server.cgroup" in out.stderr + out.stdout and "cgroup2" in out.stderr + out.stdout


def test_cgroup_open_root_off_and_unusable_fall_back_to_the_sweep(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="corral.cgroup")
    assert open_root("off", "abc") is None
    assert open_root("/proc", "abc") is None
    messages = [r.getMessage() for r in caplog.records]
    assert any("kill mechanism: sweep" in m and "off" in m for m in messages)
    assert any("kill mechanism: sweep" in m and "not usable" in m for m in messages)
    assert ENTER_SCRIPT.count('"$1/cgroup.procs"') == 1


# ---------------------------------------------------------------- daemons: kill -9 and restart


def daemon_config(folder: Path) -> str:
    script = folder / "escaping_agent.py"
    script.write_text(ESCAPING_AGENT)
    return f"""
[server]
socket = "corral.sock"
cgroup = "auto"
[store]
path = "corral.db"
[agents.bot]
adapter = "generic"
command = [{json.dumps(PYTHON)}, {json.dumps(str(script))}]
stop_grace = 1.0
sandbox_write = [{json.dumps(str(folder))}]
"""


def store_cgroup(folder: Path) -> Path:
    ((store_id,),) = rows(folder, "SELECT value FROM meta WHERE key = 'store_id'")
    return cgroup2_base() / f"corral-{store_id}"


def start_turn(folder: Path, daemon: DaemonProcess, escapees: list[int]) -> tuple[str, int, int]:
    """A turn with an escapee, ready: (turn id, leader pid, escapee pid)."""
    daemon.cli("send", "ch", str(folder / "pid"), check=True)
    ready = until("ready", lambda: next((e for e in entries(folder) if e["text"].endswith("ready")), None))
    (leader,) = until("the leader's pid", lambda: rows(folder, "SELECT pid FROM turns WHERE pid IS NOT NULL"))
    return ready["turn"], leader[0], read_escapee(folder / "pid", escapees, leader[0], sandboxed=True)


@needs_cgroup
def test_cgroup_escapee_is_found_and_killed_after_kill_9_and_a_restart(short_tmp: Path, escapees: list[int]) -> None:
    daemon = DaemonProcess(short_tmp, daemon_config(short_tmp))
    restarted = None
    try:
        assert any("kill mechanism: cgroup" in line for line in daemon.log)
        turn, leader, escapee = start_turn(short_tmp, daemon, escapees)
        turn_cgroup = store_cgroup(short_tmp) / turn
        daemon.proc.kill()
        daemon.proc.wait()
        assert alive(leader) and alive(escapee) and turn_cgroup.is_dir()

        restarted = DaemonProcess(short_tmp, daemon_config(short_tmp))
        # Ready means serving: by then the turn's cgroup is empty and gone.
        assert not alive(escapee) and not alive(leader)
        assert not turn_cgroup.exists()
        status = json.loads(restarted.cli("--json", "status", check=True).stdout)
        assert status["recovered"]["cgroups"] == [turn]
        assert {leader, escapee} <= set(status["recovered"]["killed"])
    finally:
        if restarted is not None:
            assert restarted.stop() == 0
        daemon.stop()
    assert not store_cgroup(short_tmp).exists()  # an orderly exit removes the store's subtree


@needs_cgroup
def test_cgroup_two_stores_never_touch_each_others_cgroups(short_tmp: Path, escapees: list[int]) -> None:
    first, second = short_tmp / "a", short_tmp / "b"
    first.mkdir()
    second.mkdir()
    a = DaemonProcess(first, daemon_config(first))
    b = DaemonProcess(second, daemon_config(second))
    restarted = None
    try:
        turn_a, leader_a, escapee_a = start_turn(first, a, escapees)
        turn_b, leader_b, escapee_b = start_turn(second, b, escapees)
        cgroup_b = store_cgroup(second) / turn_b
        assert store_cgroup(first) != store_cgroup(second)
        a.proc.kill()
        a.proc.wait()

        restarted = DaemonProcess(first, daemon_config(first))
        assert not alive(leader_a) and not alive(escapee_a)
        # The other store's turn runs on, in its cgroup, untouched.
        assert alive(leader_b) and alive(escapee_b)
        members = {int(p) for p in (cgroup_b / "cgroup.procs").read_text().split()}
        assert cgroup_b.is_dir() and {leader_b, escapee_b} <= members
        status = json.loads(b.cli("--json", "status", check=True).stdout)
        assert status["channels"]["ch"]["turn"]["id"] == turn_b
        stopped = json.loads(b.cli("--json", "stop", "ch", check=True).stdout)
        assert stopped["ok"] and stopped["kill"] == "cgroup" and escapee_b in stopped["swept"]
        assert not alive(escapee_b) and not cgroup_b.exists()
    finally:
        if restarted is not None:
            assert restarted.stop() == 0
        a.stop()
        b.stop()


@needs_cgroup
def test_cgroup_close_removes_empty_turn_cgroups_and_keeps_populated_ones() -> None:
    root = CgroupRoot(cgroup2_base(), "test-" + os.urandom(4).hex())
    root.setup()
    empty, kept = root.create("t1"), root.create("t2")
    sleeper = subprocess.Popen(["/bin/sh", "-c", ENTER_SCRIPT, "sh", kept.path, "sleep", "60"])
    try:
        until("the sleeper in its cgroup", lambda: sleeper.pid in kept.procs())
        root.close()
        assert not Path(empty.path).exists()  # an empty one left behind (e.g. during a shutdown)
        assert Path(kept.path).is_dir() and root.path.is_dir()  # the next start ends it
    finally:
        sleeper.kill()
        sleeper.wait()
    until("the cgroup empty", lambda: not kept.populated())
    root.close()
    assert not root.path.exists()


@needs_cgroup
async def test_cgroup_a_turn_whose_cgroup_cannot_be_made_runs_and_stops_with_the_sweep(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(short_tmp, {"bot": agent_config(short_tmp)})
    async with open_supervisor(config) as sup:
        assert sup.cgroups is not None

        def refuse(turn_id: str, limits: object = None) -> None:
            raise PermissionError(13, "Permission denied")

        sup.cgroups.create = refuse  # type: ignore[method-assign,assignment]
        await sup.send("ch", str(short_tmp / "pid"))
        await wait_text(sup, "ch", "ready")
        os.kill(read_pid(short_tmp / "pid"), signal.SIGKILL)
        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        assert result.ok and result.kill == "sweep"
        assert any("falls back to the sweep" in r.getMessage() for r in caplog.records)


@needs_cgroup
async def test_cgroup_kill_right_after_the_spawn_ends_a_leader_not_yet_in_its_cgroup(short_tmp: Path) -> None:
    # A late registration is killed the moment the spawn returns, when the shell step may not
    # have entered the cgroup yet (it does so after exec). Modelled exactly: a leader that is
    # not in its (empty) cgroup; cgroup.kill alone would miss it and the agent would run.
    root = CgroupRoot(cgroup2_base(), "test-" + os.urandom(4).hex())
    root.setup()
    try:
        cgroup = root.create("t1")
        process = await spawn(("sleep", "60"), env={"PATH": os.defpath}, cwd=str(short_tmp), stdin_pipe=False)
        tree = ProcessTree(process, "t1", cgroup)
        assert process.pid not in cgroup.procs()
        tree.kill_group()
        with trio.fail_after(SLOW):
            await process.wait()
        assert process.returncode == -signal.SIGKILL
        assert cgroup.remove()
    finally:
        root.close()


async def test_watcher_changes_says_which_watched_files_changed(tmp_path: Path) -> None:
    """A stop-all's batch follows many ``cgroup.events`` at once and is told which changed,
    so it reads only those (inotify ``IN_MODIFY`` works on any file: plain ones here)."""
    files = [tmp_path / f"f{i}" for i in range(3)]
    for f in files:
        f.write_text("populated 1\n")
    watcher = Watcher()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher.run)
        changes = watcher.changes()
        wds = [watcher.add(str(f)) for f in files]
        changes.wds.update(wds[:2])  # the third is watched, but not followed by this batch
        files[2].write_text("populated 0\n")
        files[1].write_text("populated 0\n")
        with trio.fail_after(10):
            await changes.event.wait()
        await trio.testing.wait_all_tasks_blocked()  # every event of those writes read
        assert changes.take() == {wds[1]}
        assert not changes.event.is_set()  # renewed by take: the next change wakes the next wait
        files[0].write_text("populated 0\n")
        with trio.fail_after(10):
            await changes.event.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert changes.take() == {wds[0]}
        watcher.forget(changes)
        files[0].write_text("populated 1\n")
        await trio.testing.wait_all_tasks_blocked()
        assert changes.fired == set() and not changes.event.is_set()
        for wd in wds:
            watcher.remove(wd)
        nursery.cancel_scope.cancel()


def test_a_turns_sub_cgroups_are_bounded_and_removed_with_it() -> None:
    """Issue 41.7: a turn that makes sub-cgroups (3,000 made every later rmdir fail with EBUSY)
    gets at most TURN_DESCENDANTS of them, TURN_DEPTH deep, and they go with its cgroup."""
    from supervisor.procs.cgroup import TURN_DEPTH, TURN_DESCENDANTS

    if MISSING is not None:
        pytest.skip(f"no writable cgroup v2: {MISSING}")
    root = CgroupRoot(cgroup2_base(), "test-" + os.urandom(4).hex())
    root.setup()
    try:
        cgroup = root.create("t1")
        made, refused = 0, None
        for i in range(TURN_DESCENDANTS + 5):
            try:
                (Path(cgroup.path) / f"s{i}").mkdir()
                made += 1
            except OSError as exc:
                refused = exc.errno
                break
        assert made == TURN_DESCENDANTS and refused == errno.EAGAIN
        for i in range(1, made):
            (Path(cgroup.path) / f"s{i}").rmdir()
        deep, depth = Path(cgroup.path) / "s0", 1
        with pytest.raises(OSError) as too_deep:
            while depth <= TURN_DEPTH:
                deep = deep / f"d{depth}"
                deep.mkdir()
                depth += 1
        assert depth == TURN_DEPTH and too_deep.value.errno == errno.EAGAIN
        for i in range(1, made - TURN_DEPTH + 1):  # a wide tree beside the deep one: all of it goes
            (Path(cgroup.path) / f"w{i}").mkdir()
        assert cgroup.remove() and not Path(cgroup.path).exists()
    finally:
        root.close()
    assert not root.path.exists()


CGROUP_MAKER = r"""
import json, os, subprocess, sys
mount = next(l.split()[4] for l in open("/proc/self/mountinfo") if " - cgroup2 " in l)
own = mount + open("/proc/self/cgroup").read().split("0::", 1)[1].strip()
made = 0
for i in range(200):
    try:
        os.mkdir(os.path.join(own, f"s{i}"))
        made += 1
    except OSError:
        break
# A process of the turn in a sub-cgroup of its own, still running at the end of the turn.
child = subprocess.Popen(["sleep", "300"])
with open(os.path.join(own, "s0", "cgroup.procs"), "w") as fh:
    fh.write(str(child.pid))
print(json.dumps({"type": "result", "text": f"made {made}"}), flush=True)
"""


def test_a_turns_sub_cgroups_do_not_outlive_it(short_tmp: Path) -> None:
    """A hostile agent (no sandbox, which would keep it off the cgroup file system) makes all the
    sub-cgroups it can and leaves a process in one: it gets 32, the turn's end kills that
    process and removes every one, and the next turn runs and is removed the same way."""
    if MISSING is not None:
        pytest.skip(f"no writable cgroup v2: {MISSING}")
    config = f"""
[server]
socket = "corral.sock"
sandbox = "off"
[store]
path = "corral.db"
[agents.maker]
adapter = "generic"
command = [{json.dumps(PYTHON)}, "-c", {json.dumps(CGROUP_MAKER)}]
"""
    daemon = DaemonProcess(short_tmp, config)
    try:
        for _ in range(2):
            assert daemon.cli("send", "c", "go").returncode == 0
            assert daemon.cli("wait", "c", "--timeout", "60").returncode == 0
        texts = [json.loads(line)["text"] for line in daemon.cli("tail", "c", "--json").stdout.splitlines()]
        assert texts.count("made 32") == 2, texts
        said = next(line for line in daemon.log if "kill mechanism: cgroup, turns in " in line)
        subtree = Path(said.split("turns in ", 1)[1].split(" (limits", 1)[0])
        assert [p.name for p in subtree.iterdir() if p.is_dir()] == []  # every turn's cgroup is gone
        assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "300"]]
    finally:
        assert daemon.stop() == 0
    assert not any("cannot remove cgroup" in line for line in daemon.log), daemon.log


def test_a_spawn_the_kernel_refuses_says_the_real_cause_not_install_it(tmp_path: Path) -> None:
    """EAGAIN from fork (the user's process limit, used up by another turn's burst) is not a
    missing program: the error says so, and its fix is not "install it"."""
    from supervisor.turns.base import start_failure

    agent = make_config(tmp_path).agents["demo"]
    said = start_failure(agent, BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)))
    assert "install it" not in said and "process limit" in said and "pids_max" in said
    missing = start_failure(agent, FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/nope/cli"))
    assert "/nope/cli" in missing and "install it" in missing  # a missing program: as before


def test_every_agent_has_memory_and_pids_limits_by_default(tmp_path: Path) -> None:
    """Issue 41.7: a turn is bounded unless its config lifts the bound (``"max"``)."""
    config = parse_config({"defaults": {"agent": "a"}, "agents": {"a": {"adapter": "demo"},
                                      "b": {"adapter": "demo", "memory_max": "max", "pids_max": "max"}}},
                          base=tmp_path)
    assert config.agents["a"].cgroup_limits == {"memory_max": "4G", "pids_max": 4096}
    assert config.agents["b"].cgroup_limits == {"memory_max": None, "pids_max": None}
