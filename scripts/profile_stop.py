#!/usr/bin/env python
"""Where a stop-all spends corral's CPU: cProfile of one ``stop_all`` of N busy light turns.

Run it from the repository root as ``.venv/bin/python -m scripts.profile_stop`` (``--channels
N``, default 200; ``--kill cgroup|sweep``; ``--top K`` rows of each table). It runs an embedded
supervisor the way ``corral run`` does (child subreaper, owns its children), starts the
light tree of ``scripts.bench_stop`` (a shell, a ``sleep`` in its group and a ``setsid sleep``)
in every channel, waits until each says "tool running", then profiles one ``stop_all``:
wall time, the process's CPU (all threads: what the stop result's ``cpu_ms`` counts) and
the main thread's, and the functions by own time and by cumulative time. No HTTP, so
what is left is the stop path itself (the store's writer thread shows in the process CPU,
not in the profile, which covers the main thread only). ``--no-profile`` times it without
cProfile and shows the CPU of each kind of task instead; ``--one`` stops the channels one
at a time instead (the stop-one path: each stop's wall and CPU); ``--trio-floor`` measures what Trio
alone charges to cancel that many turn-shaped task groups, nothing else running.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
import trio.testing

from supervisor import open_supervisor, parse_config
from supervisor.store.store import Store


class TaskCpu(trio.abc.Instrument):
    """CPU (this thread's) and steps per task, by the task's name: which tasks a stop wakes, how often."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.steps: dict[str, int] = {}
        self._at: float | None = None

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._at = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._at is None:  # the step that added the instrument: begun before it
            return
        name = task.coro.cr_code.co_qualname if hasattr(task.coro, "cr_code") else task.name
        self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - self._at
        self.steps[name] = self.steps.get(name, 0) + 1


class GcTime:
    """Collections of the cyclic garbage collector, and the time they took."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.by_generation: dict[int, int] = {}
        self._at = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._at = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._at
            gen = info.get("generation", -1)
            self.by_generation[gen] = self.by_generation.get(gen, 0) + 1


class Counted:
    """Counts the writes submitted to the store (its writer's ``submit``), process-wide."""

    calls = 0
    _installed = False

    @classmethod
    def install(cls, store: Store) -> None:
        if cls._installed:
            return
        cls._installed = True
        writer = store._writer
        submit = writer.submit

        def counted(*args: Any, **kwargs: Any) -> Any:
            cls.calls += 1
            return submit(*args, **kwargs)

        writer.submit = counted  # type: ignore[method-assign]


LIGHT_SCRIPT = 'sleep 600 & setsid sleep 600 & echo "tool running"; wait'


async def run(channels: int, kill: str, top: int, profiling: bool = True, repeat: int = 1, one: bool = False) -> int:
    folder = Path(tempfile.mkdtemp(prefix="cp-", dir="/tmp"))
    config = parse_config(
        {
            "server": {"socket": "corral.sock", "cgroup": "auto" if kill == "cgroup" else "off"},
            "store": {"path": "corral.db"},
            "defaults": {"stop_grace": 2, "agent": "light"},
            "agents": {"light": {"adapter": "generic", "command": ["/bin/sh", "-c", LIGHT_SCRIPT, "sh"]}},
        },
        file=str(folder / "corral.toml"),
        base=folder,
    )
    per_turn: list[float] = []
    async with open_supervisor(config, subreaper=True, owns_children=True) as sup:
        if kill == "cgroup" and sup.cgroups is None:
            print("no writable cgroup v2 here: use --kill sweep")
            return 1
        for round_ in range(repeat):
            names = [f"p{round_}-{i}" for i in range(channels)]

            async def ready(channel: str) -> None:
                async for entry in sup.follow(channel):
                    if "tool running" in entry.text:
                        return

            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(ready, name)
                for name in names:
                    await sup.send(name, "go")
            print(f"{channels} light trees ready in {(time.perf_counter() - t0) * 1000:.0f} ms ({kill})")
            profile = cProfile.Profile()
            tasks = TaskCpu()
            wall, cpu, main, times = time.perf_counter(), time.process_time(), time.thread_time(), os.times()
            if profiling:
                profile.enable()
            else:
                trio.lowlevel.add_instrument(tasks)
            collections = GcTime()
            gc.callbacks.append(collections)
            store = sup._store
            commits, writes = store.commits, Counted.calls
            Counted.install(store)
            if one:  # each channel stopped in turn, one call at a time (the stop-one path)
                walls, cpus = [], []
                for name in names:
                    t1, c1 = time.perf_counter(), time.process_time()
                    result = await sup.stop(name)
                    walls.append((time.perf_counter() - t1) * 1000)
                    cpus.append((time.process_time() - c1) * 1000)
                print(f"stop-one x {channels}: wall median {statistics.median(walls):.2f} ms,"
                      f" p95 {sorted(walls)[int(0.95 * (len(walls) - 1))]:.2f}; CPU median"
                      f" {statistics.median(cpus):.3f} ms per stop; load {os.getloadavg()[0]:.2f}")
                result.stopped_turns = names  # (for the per-turn figures below: one turn a stop)
            else:
                result = await sup.stop_all()
            gc.callbacks.remove(collections)
            profile.disable()
            commits, writes = store.commits - commits, Counted.calls - writes
            if not profiling:
                trio.lowlevel.remove_instrument(tasks)
            wall = (time.perf_counter() - wall) * 1000
            cpu = (time.process_time() - cpu) * 1000
            main = (time.thread_time() - main) * 1000
            after = os.times()
            user, system = (after.user - times.user) * 1000, (after.system - times.system) * 1000
            turns = len(result.stopped_turns) or 1
            per_turn.append(cpu / turns)
            what = "stop-one, each in turn, of" if one else "stop-all of"
            print(
                f"{what} {turns} turns: {wall:.1f} ms wall, CPU {cpu:.1f} ms all threads"
                f" ({cpu / turns:.3f} ms per turn; user {user:.0f}, system {system:.0f}), {main:.1f} ms main thread;"
                f" ok={result.ok} kill={result.kill} killed={len(result.killed)} swept={len(result.swept)};"
                f" load {os.getloadavg()[0]:.2f}"
            )
            print(f"store commits during it: {commits} ({writes} writes)")
            print(f"garbage collections during it: {collections.count} (by generation {collections.by_generation}),"
                  f" {collections.seconds * 1000:.1f} ms; objects tracked: {len(gc.get_objects())}")
            if not profiling:
                total = sum(tasks.cpu.values()) * 1000
                print(f"task steps: {sum(tasks.steps.values())}, {total:.1f} ms in steps (instrumented), by task:")
                for name, spent in sorted(tasks.cpu.items(), key=lambda kv: -kv[1]):
                    print(f"  {spent * 1000:7.1f} ms {tasks.steps[name]:6d} steps  {name}")
            if profiling and os.environ.get("PROFILE_OUT"):
                profile.dump_stats(os.environ["PROFILE_OUT"])
            for order in ("tottime", "cumulative") if profiling else ():
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats(order).print_stats(top)
                print(f"\n---- by {order} (the main thread, under cProfile: slower than unprofiled)")
                print("\n".join(out.getvalue().splitlines()[6:]))
    if repeat > 1:
        print(f"CPU per stopped turn over {repeat} rounds: min {min(per_turn):.3f}, median"
              f" {statistics.median(per_turn):.3f} ms")
    return 0


async def trio_floor(channels: int, rounds: int = 4) -> int:
    """What Trio alone charges to cancel a turn-shaped task group: per "turn", a task blocked
    reading a pipe inside the nested cancel scopes a turn has, with two child tasks blocked on
    pipes of their own (the stderr pump, the exit watch). Each round cancels every turn's
    scope and waits until all have unwound; the first round pays for cold memory."""
    fds = [os.pipe() for _ in range(channels * 3)]
    for r, _ in fds:
        os.set_blocking(r, False)

    async def child(fd: int) -> None:
        await trio.lowlevel.wait_readable(fd)

    async def turn(i: int, scopes: list[trio.CancelScope], task_status: trio.TaskStatus[None]) -> None:
        scope = trio.CancelScope()
        scopes.append(scope)
        with scope, trio.CancelScope(), trio.move_on_after(1000):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(child, fds[3 * i + 1][0])
                nursery.start_soon(child, fds[3 * i + 2][0])
                task_status.started()
                await trio.lowlevel.wait_readable(fds[3 * i][0])

    for round_ in range(rounds):
        scopes: list[trio.CancelScope] = []
        async with trio.open_nursery() as nursery:
            for i in range(channels):
                await nursery.start(turn, i, scopes)
            await trio.testing.wait_all_tasks_blocked()
            cpu = time.thread_time()
            for scope in scopes:
                scope.cancel()
        cpu = (time.thread_time() - cpu) * 1e6 / channels
        print(f"round {round_ + 1}: cancel and unwind {cpu:.0f} us per turn (CPU)")
    for r, w in fds:
        os.close(r)
        os.close(w)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--channels", type=int, default=200)
    parser.add_argument("--kill", choices=("cgroup", "sweep"), default="cgroup")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--no-profile", action="store_true",
                        help="no cProfile: time the stop-all and show the CPU of each kind of task (an Instrument)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (fresh trees each), then min and median")
    parser.add_argument("--one", action="store_true",
                        help="stop the channels one at a time (the stop-one path), not with one stop-all")
    parser.add_argument("--trio-floor", action="store_true",
                        help="only what Trio alone charges to cancel N turn-shaped task groups")
    args = parser.parse_args()
    if args.trio_floor:
        return trio.run(trio_floor, args.channels)
    return trio.run(run, args.channels, args.kill, args.top, not args.no_profile, args.repeat, args.one)


if __name__ == "__main__":
    os.environ.pop("CORRAL_TURN", None)
    sys.exit(main())
