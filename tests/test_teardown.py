"""A stop-all ends its cgroup trees in one batch (``supervisor/procs/teardown.py``), and pauses the
garbage collector where the process is corral's.

Real processes and real cgroups: each tree is the light one of ``scripts/bench_stop.py`` — a
shell (the leader), a ``sleep`` in its group and a ``setsid sleep`` in a session of its own.
The batch tests skip, naming what is missing, where no cgroup v2 is writable (the sweep path
has no batch: its trees end as before).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest
import trio
import trio.testing
from conftest import cgroup_missing, make_config

from supervisor.host.supervisor import open_supervisor
from supervisor.procs.cgroup import CgroupRoot, TurnCgroup, cgroup2_mount, own_cgroup
from supervisor.procs.teardown import CollectorPause, TreeBatch
from supervisor.procs.tree import ProcessTree, spawn

SLOW = 30.0
MISSING = cgroup_missing()
needs_cgroup = pytest.mark.skipif(MISSING is not None, reason=f"no writable cgroup v2: {MISSING}")

#: The light tree (its "ready" comes once the setsid one has its own session); ``trap '' INT``
#: first makes a leader (and its jobs) ignore the interrupt.
LIGHT = "sleep 600 & setsid sh -c 'echo ready; exec sleep 600' & wait"
STUBBORN = "trap '' INT; " + LIGHT


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@asynccontextmanager
async def cgroup_root() -> AsyncIterator[CgroupRoot]:
    """A store's subtree with its shared inotify watcher running, as ``open_supervisor`` has."""
    mount, own = cgroup2_mount(), own_cgroup()
    assert mount is not None and own is not None
    root = CgroupRoot(mount / own.lstrip("/"), "test-" + os.urandom(4).hex())
    root.setup()
    assert root.watcher is not None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(root.watcher.run)
            await trio.testing.wait_all_tasks_blocked()
            try:
                yield root
            finally:
                nursery.cancel_scope.cancel()
    finally:
        for cgroup in root.leftovers():  # a test that failed half-way: kill what it left
            cgroup.kill()
        root.close()


async def light_tree(root: CgroupRoot, name: str, script: str, cwd: Path) -> tuple[ProcessTree, list[int]]:
    """A tree started in a cgroup of its own, once it said "ready": the tree and its 3 pids
    (the leader, the sleep in its group, the setsid sleep: last)."""
    cgroup = root.create(name)
    process = await spawn(("/bin/sh", "-c", script), env={"PATH": os.defpath}, cwd=str(cwd), stdin_pipe=False,
                          cgroup=cgroup)
    tree = ProcessTree(process, name, cgroup)
    assert process.stdout is not None
    seen = b""
    with trio.fail_after(SLOW):
        while b"ready" not in seen:
            seen += await process.stdout.receive_some()
    pids = cgroup.procs()
    assert len(pids) == 3 and process.pid in pids
    pids.sort(key=lambda p: (p != process.pid, os.getsid(p) == p))
    assert os.getsid(pids[1]) == process.pid and os.getsid(pids[2]) == pids[2]
    return tree, pids


def close_streams(trees: list[ProcessTree]) -> None:
    for tree in trees:
        for stream in (tree.process.stdout, tree.process.stderr):
            if isinstance(stream, trio.lowlevel.FdStream):
                stream.close()


@needs_cgroup
async def test_batch_ends_every_tree_setsid_escapees_included_and_reports_each(short_tmp: Path) -> None:
    async with cgroup_root() as root:
        made = [await light_tree(root, f"t{i}", LIGHT, short_tmp) for i in range(3)]
        trees = [tree for tree, _ in made]
        batch = TreeBatch(root.watcher)  # type: ignore[arg-type]
        for tree in trees:
            tree.interrupt(signal.SIGINT)
            assert batch.add(tree, grace=10.0)
        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(batch.run)
                for tree in trees:  # each turn's own teardown waits for the batch
                    nursery.start_soon(tree.terminate, signal.SIGINT, 10.0)
        assert batch.done.is_set()
        for tree, pids in made:
            assert not any(alive(p) for p in pids), f"left alive: {[p for p in pids if alive(p)]}"
            report = tree.report
            assert report.mechanism == "cgroup"
            assert sorted(report.killed) == sorted(pids[:2])  # the leader and the sleep in its group
            assert report.swept == [pids[2]]  # the setsid sleep
            assert report.survivors == []
            assert tree.process.returncode is not None  # the leader is reaped
            assert tree.cgroup is not None and not Path(tree.cgroup.path).exists()
        # The turn's sweep after the batch is over waits for nothing and changes nothing.
        with trio.fail_after(1):
            await trees[0].sweep(None)  # type: ignore[arg-type]
        close_streams(trees)


@needs_cgroup
async def test_batch_gives_a_leader_its_grace_without_holding_the_others(short_tmp: Path) -> None:
    # ...nor their turns: each tree is released to its turn's teardown once it is over.
    async with cgroup_root() as root:
        stubborn, stubborn_pids = await light_tree(root, "stubborn", STUBBORN, short_tmp)
        quick = [await light_tree(root, f"q{i}", LIGHT, short_tmp) for i in range(2)]
        batch = TreeBatch(root.watcher)  # type: ignore[arg-type]
        grace = 3.0
        for tree in [stubborn] + [t for t, _ in quick]:
            tree.interrupt(signal.SIGINT)
            assert batch.add(tree, grace=grace)
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch.run)
            with trio.fail_after(SLOW):
                for tree, _ in quick:  # each turn's teardown is released as soon as its tree is over
                    await tree.terminate(signal.SIGINT, grace)
            # The quick trees are gone while the stubborn leader still has its grace.
            assert trio.current_time() < started + grace
            assert not batch.done.is_set() and alive(stubborn.pid)
            for tree, pids in quick:
                assert not any(alive(p) for p in pids) and tree.report.survivors == []
                assert tree.cgroup is not None and not Path(tree.cgroup.path).exists()
            with trio.fail_after(SLOW):
                await batch.done.wait()
        assert trio.current_time() >= started + grace
        assert stubborn.process.returncode == -signal.SIGKILL
        assert not any(alive(p) for p in stubborn_pids) and stubborn.report.survivors == []
        close_streams([stubborn] + [t for t, _ in quick])


@needs_cgroup
async def test_batch_survives_a_cgroup_that_will_not_empty(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with cgroup_root() as root:
        (stuck, stuck_pids), (fine, fine_pids) = [await light_tree(root, n, LIGHT, short_tmp) for n in ("s", "f")]
        assert stuck.cgroup is not None and fine.cgroup is not None
        kill = TurnCgroup.kill
        # A cgroup whose cgroup.kill does nothing: its shell exits of the interrupt, its
        # background jobs (which ignore SIGINT, as POSIX says) stay.
        monkeypatch.setattr(TurnCgroup, "kill", lambda self: None if self.path == stuck.cgroup.path else kill(self))
        batch = TreeBatch(root.watcher, budget=0.5)  # type: ignore[arg-type]
        for tree in (stuck, fine):
            tree.interrupt(signal.SIGINT)
            assert batch.add(tree, grace=5.0)
        with trio.fail_after(SLOW):
            await batch.run()
        left = sorted(stuck_pids[1:])
        assert stuck.report.survivors == left and all(alive(p) for p in left)
        assert Path(stuck.cgroup.path).is_dir()  # kept, so the next start ends what is in it
        assert fine.report.survivors == [] and not any(alive(p) for p in fine_pids)
        assert not Path(fine.cgroup.path).exists()
        monkeypatch.undo()
        close_streams([stuck, fine])


@needs_cgroup
async def test_batch_leaves_a_tree_whose_own_teardown_has_begun(short_tmp: Path) -> None:
    async with cgroup_root() as root:
        tree, pids = await light_tree(root, "t", LIGHT, short_tmp)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tree.terminate, signal.SIGINT, 5.0)
            await trio.testing.wait_all_tasks_blocked()
            batch = TreeBatch(root.watcher)  # type: ignore[arg-type]
            assert not batch.add(tree, grace=5.0) and len(batch) == 0
        with trio.fail_after(SLOW):
            await tree.sweep(None)  # type: ignore[arg-type]  # (a cgroup tree needs no scanner)
        assert not any(alive(p) for p in pids) and tree.report.survivors == []
        close_streams([tree])


class StepCounter(trio.abc.Instrument):
    """Counts task steps: each is a wake-up of a task, what a stop-all pays per turn."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


@needs_cgroup
async def test_stop_all_hands_every_cgroup_tree_to_one_batch_and_wakes_each_turn_a_few_times(
    short_tmp: Path,
) -> None:
    n = 20
    # The host's network: what is counted is the stop's batch of trees; a turn's network
    # (its proxy task and namespace holder, under the default) ends in steps of its own.
    config = make_config(short_tmp, {"light": {"adapter": "generic", "command": ["/bin/sh", "-c", LIGHT, "sh"],
                                               "network": "host"}})
    async with open_supervisor(config, subreaper=True, owns_children=True) as sup:
        assert sup.cgroups is not None
        for i in range(n):
            await sup.send(f"c{i}", "go")

        async def ready(channel: str) -> None:
            async for entry in sup.follow(channel):
                if entry.text == "ready":
                    return

        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(ready, f"c{i}")
        await trio.testing.wait_all_tasks_blocked()
        trees = [turn.tree for turn in sup._lanes.turns.values()]
        assert len(trees) == n and all(t is not None and t.cgroup is not None for t in trees)
        # What each stop must report, read from the real trees: the leader's group (sandboxed:
        # bwrap's monitor and init, the shell, its sleep) is killed, the setsid sleep swept.
        expected: dict[str, tuple[list[int], list[int]]] = {}
        for turn in sup._lanes.turns.values():
            assert turn.tree is not None
            leader = turn.tree.pid
            tree = [leader, *(c.pid for c in psutil.Process(leader).children(recursive=True))]
            group = sorted(p for p in tree if os.getpgid(p) == leader)
            expected[turn.channel] = (group, sorted(set(tree) - set(group)))
            assert len(expected[turn.channel][1]) == 1, expected  # the setsid sleep, alone
        counter = StepCounter()
        trio.lowlevel.add_instrument(counter)
        try:
            with trio.fail_after(SLOW):
                result = await sup.stop()
        finally:
            trio.lowlevel.remove_instrument(counter)
        assert all(t is not None and t.handed_over for t in trees)
        assert result.ok and len(result.channels or []) == n
        for r in result.channels or []:
            assert r.channel is not None
            assert r.kill == "cgroup" and (r.killed, r.swept) == expected[r.channel], r
        # Each turn used to end its own tree: 13.5-13.9 task steps per stopped turn (20 turns).
        # One batch, and a teardown that does not wait for what is already done: 8.7-9.8.
        assert counter.steps / n < 11.5, counter.steps


def test_collector_pause_nests_and_restores_what_it_found() -> None:
    pause = CollectorPause()
    was = gc.isenabled()
    try:
        gc.enable()
        with pause:
            assert not gc.isenabled()
            with pause:
                assert not gc.isenabled()
            assert not gc.isenabled()  # the outer stop is still going
        assert gc.isenabled()
        gc.disable()  # a program that runs with the collector off keeps it off
        with pause:
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("owns_children", [True, False])
async def test_a_stop_pauses_the_collector_only_where_the_process_is_corrals(
    short_tmp: Path, owns_children: bool, collector_on: None
) -> None:
    config = make_config(short_tmp, {"stubborn": {"adapter": "generic", "command": ["/bin/sh", "-c", STUBBORN, "sh"],
                                                  "stop_grace": 1.0}})
    async with open_supervisor(config, subreaper=owns_children, owns_children=owns_children) as sup:
        await sup.send("ch", "go")
        with trio.fail_after(SLOW):
            async for entry in sup.follow("ch"):
                if entry.text == "ready":
                    break
        during: list[bool] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.stop, "ch")
            await trio.testing.wait_all_tasks_blocked()  # the stop waits out the leader's grace
            assert "ch" in sup._stopper.stops
            during.append(gc.isenabled())
        assert during == [not owns_children]
        assert gc.isenabled()


@needs_cgroup
async def test_batch_that_fails_ends_each_tree_on_its_own(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with cgroup_root() as root:
        made = [await light_tree(root, f"t{i}", LIGHT, short_tmp) for i in range(2)]

        def no_epoll() -> None:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr("supervisor.procs.teardown.select.epoll", no_epoll)
        batch = TreeBatch(root.watcher)  # type: ignore[arg-type]
        for tree, _ in made:
            tree.interrupt(signal.SIGINT)
            assert batch.add(tree, grace=5.0)
        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(batch.run)
                for tree, _ in made:
                    nursery.start_soon(tree.terminate, signal.SIGINT, 5.0)
        for tree, pids in made:
            assert not any(alive(p) for p in pids)
            assert tree.report.survivors == [] and sorted(tree.report.killed) == sorted(pids[:2])
            assert tree.report.swept == [pids[2]]
            assert tree.cgroup is not None and not Path(tree.cgroup.path).exists()
        close_streams([tree for tree, _ in made])


@needs_cgroup
async def test_batch_reads_only_the_cgroups_that_changed_at_each_wake_up(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wake-up of the batch reads the ``cgroup.events`` of the trees just killed and of
    those whose watch fired, not of every tree still waiting (that was O(n²) in a stop-all)."""
    n = 16
    reads: list[str] = []
    real = TurnCgroup.populated

    def counted(self: TurnCgroup) -> bool:
        reads.append(self.path)
        return real(self)

    monkeypatch.setattr(TurnCgroup, "populated", counted)
    async with cgroup_root() as root:
        made = [await light_tree(root, f"r{i}", LIGHT, short_tmp) for i in range(n)]
        trees = [tree for tree, _ in made]
        batch = TreeBatch(root.watcher)  # type: ignore[arg-type]
        for tree in trees:
            tree.interrupt(signal.SIGINT)
            assert batch.add(tree, grace=10.0)
        with trio.fail_after(SLOW):
            await batch.run()
        for tree, pids in made:
            assert not any(alive(p) for p in pids)
            assert tree.report.survivors == [] and tree.process.returncode is not None
        # Once when killed, once when its cgroup says it emptied (at most a spurious one more).
        assert len(reads) <= 3 * n, len(reads)
        assert max(reads.count(path) for path in set(reads)) <= 3, sorted(reads)
        close_streams(trees)


@needs_cgroup
async def test_a_stop_does_not_read_the_unreaped_leaders_stat_again(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's stat is read once, at the spawn: unreaped, it is the same process, and a
    session leader keeps its group. A stop reads the others' only, once each; the report is unchanged."""
    import supervisor.procs.tree as tree_module

    async with cgroup_root() as root:
        tree, pids = await light_tree(root, "l0", LIGHT, short_tmp)
        assert tree.leader is not None and tree.leader.pid == pids[0]
        read: list[int] = []
        real = tree_module.read_stat

        def counted(pid: int) -> tree_module.ProcStat | None:
            read.append(pid)
            return real(pid)

        monkeypatch.setattr(tree_module, "read_stat", counted)
        tree.interrupt(signal.SIGINT)
        assert sorted(read) == sorted(pids[1:]), read  # not the leader's
        with trio.fail_after(SLOW):
            await tree.terminate(signal.SIGINT, 10.0)
            await tree.sweep(None)  # type: ignore[arg-type]
        # Each of the others once, when it was signalled: the reap of escapees after the
        # cgroup emptied asks the kernel (``waitable``: none of them is this process's child).
        assert sorted(read) == sorted(pids[1:]), read
        assert sorted(tree.report.killed) == sorted(pids[:2]) and tree.report.swept == [pids[2]]
        assert not any(alive(p) for p in pids) and tree.report.survivors == []
        close_streams([tree])


_REAP_PASS = """
import os, subprocess
import supervisor.procs.tree as tree
listed = []
real = tree.child_pids
tree.child_pids = lambda pid: listed.append(pid) or real(pid)
child = subprocess.Popen(["sleep", "30"])
assert tree.reap_orphans(()) == [] and listed == [], listed  # none dead: no list of children read
child.kill()
os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # (dead now, not reaped)
assert tree.reap_orphans(()) == [child.pid] and listed == [os.getpid()], listed
assert not tree.waitable()
print("ok")
"""


def test_the_subreapers_pass_reads_the_children_only_when_one_is_dead() -> None:
    """``reap_orphans`` runs after every turn; with no dead child (the usual case) it costs one
    ``waitid``, not a list of the children and a stat of each. In a process of its own, whose
    only child is the test's."""
    out = subprocess.run([sys.executable, "-c", _REAP_PASS], capture_output=True, text=True, timeout=SLOW,
                         cwd=Path(__file__).parent.parent)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
