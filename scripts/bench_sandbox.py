#!/usr/bin/env python
"""What the sandbox costs: spawn to first output, and a stop, with the sandbox and without.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_sandbox`` (``--rounds N``,
default 200; ``--stops N``, default 40). Both rows alternate, round by round, so a drift of
the machine's speed falls on both alike; every figure is printed as a ratio to the unsandboxed
floor measured in the same run.

* **spawn to first output**: a program that prints one line and exits (``/bin/echo``),
  started the way a turn is — :func:`supervisor.procs.tree.spawn`, into a cgroup of its own where
  one is writable — with and without the sandbox prefix a turn gets
  (:meth:`supervisor.procs.sandbox.Sandbox.prefix`: the state folder, store, config and socket
  hidden, the turn's folder and HOME writable); time from the call to the first byte read.
  Target: the sandbox adds at most 5 ms to the median. A third row, alternating with both,
  is bwrap alone with its namespaces, ``/dev`` and ``/proc`` and nothing of corral's
  (:data:`~supervisor.procs.sandbox.BASE_ARGS`): the floor of any bwrap sandbox on this
  machine, so what corral's own steps add is read beside it.
* **stop-one**: an embedded supervisor running a ``sh`` agent with a ``sleep`` in its group
  and a ``setsid sleep`` (the lightest tree, so what is measured is corral), stopped mid-turn;
  time of ``Supervisor.stop``. Target: unchanged within noise.
* **the steps** (``--steps``): what each part of the sandbox costs, the variants in a random
  order each round: bwrap alone (corral's bundled one; the system's where installed) with
  corral's state hidden, then every HOME, ``/run/user``, ``/media``, ``/mnt`` out of sight
  too (what a turn gets), then behind the ``unshare`` step (private propagation, where the
  host's mounts propagate); and the plan itself (:meth:`~supervisor.procs.sandbox.Sandbox.plan`
  with the installation walk of a venv's Python), in the parent.
* **a replaced cover** (``--covers``): from ``os.replace`` over a covered file to the cover
  watch's call back (:mod:`supervisor.procs.covers`; the turn's kill follows in the same
  step): the window in which a turn could read the new file.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from scripts._bench import pct, short_tmp, spread
from supervisor import open_supervisor
from supervisor.config.settings import parse_config
from supervisor.procs.cgroup import open_root
from supervisor.procs.sandbox import BASE_ARGS, Sandbox, TurnGrants, open_sandbox, private_paths
from supervisor.procs.tree import spawn

LIGHT = "sleep 300 & setsid sleep 300 & echo ready; wait"


async def first_output(prefix: tuple[str, ...], folder: Path, cgroup: Any) -> float:
    t0 = time.perf_counter()
    proc = await spawn(("/bin/echo", "hi"), env={"PATH": os.defpath}, cwd=str(folder), stdin_pipe=False,
                       sandbox=prefix, **cgroup)
    assert proc.stdout is not None
    await proc.stdout.receive_some(1)
    took = (time.perf_counter() - t0) * 1000
    await proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()
    return took


def bench_spawn(folder: Path, rounds: int) -> tuple[list[float], list[float], list[float]]:
    state = folder / "corral.d"
    (state / "work").mkdir(parents=True)
    home = state / "home" / "a" / "c"
    (home / "tmp").mkdir(parents=True)
    (folder / "corral.db").write_text("")
    private = private_paths(state_dir=state, store_path=folder / "corral.db", store_url=None,
                            config_path=folder / "corral.toml", token_file=None, socket=folder / "corral.sock",
                            cgroup_subtree=None, agent_dirs={})
    sandbox = open_sandbox("required", private)
    prefix = sandbox.prefix(TurnGrants("a", cwd=str(folder), home=str(home)))
    assert sandbox.support.bwrap is not None
    bare = (sandbox.support.bwrap, *BASE_ARGS, "--chdir", str(folder), "--")
    root = open_root("auto", f"bench-sandbox-{os.getpid()}")
    plain: list[float] = []
    boxed: list[float] = []
    namespaces: list[float] = []

    async def run() -> None:
        for i in range(rounds + 5):  # 5 warm-up rounds, not counted
            for sample, words in ((plain, ()), (boxed, prefix), (namespaces, bare)):
                cg = root.create(f"s{i}-{len(words)}") if root is not None else None
                took = await first_output(words, folder, {"cgroup": cg} if cg is not None else {})
                if cg is not None:
                    await cg.wait_empty(trio.current_time() + 5)
                    cg.remove()
                if i >= 5:
                    sample.append(took)

    try:
        trio.run(run)
    finally:
        if root is not None:
            root.close()
    return plain, boxed, namespaces


def bench_steps(folder: Path, rounds: int) -> dict[str, list[float]]:
    """Spawn to first output behind each variant of the sandbox (see the module's docstring)."""
    state = folder / "corral.d"
    home = state / "home" / "a" / "c"
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    (state / "work").mkdir(parents=True, exist_ok=True)
    private = private_paths(state_dir=state, store_path=folder / "corral.db", store_url=None,
                            config_path=folder / "corral.toml", token_file=None, socket=folder / "corral.sock",
                            cgroup_subtree=None, agent_dirs={}, home=os.environ.get("HOME"))
    sandbox = open_sandbox("required", private)
    support = dataclasses.replace(sandbox.support, unshare=None)
    bare = dataclasses.replace(private, out_of_sight=())
    unshare = shutil.which("unshare")

    def prefix(priv: Any, sup: Any) -> tuple[str, ...]:
        return Sandbox("required", sup, priv).prefix(TurnGrants("a", cwd=str(folder), home=str(home)))

    variants: dict[str, tuple[str, ...]] = {
        "floor (no sandbox)": (),
        "bwrap, corral's state hidden": prefix(bare, support),
        "+ HOMEs, /run/user, /media, /mnt hidden": prefix(private, support),
    }
    if unshare:
        variants["+ the unshare step"] = prefix(private, dataclasses.replace(support, unshare=unshare))
    if os.access("/usr/bin/bwrap", os.X_OK):
        variants["the system's bwrap, corral's state hidden"] = prefix(
            bare, dataclasses.replace(support, bwrap="/usr/bin/bwrap"))
    samples: dict[str, list[float]] = {name: [] for name in variants}
    root = open_root("auto", f"bench-steps-{os.getpid()}")

    async def run() -> None:
        for i in range(rounds + 5):
            order = list(variants.items())
            random.shuffle(order)  # (a fixed order puts each variant always after the same one)
            for n, (name, words) in enumerate(order):
                cg = root.create(f"s{i}-{n}") if root is not None else None
                took = await first_output(words, folder, {"cgroup": cg} if cg is not None else {})
                if cg is not None:
                    await cg.wait_empty(trio.current_time() + 5)
                    cg.remove()
                if i >= 5:
                    samples[name].append(took)

    try:
        trio.run(run)
    finally:
        if root is not None:
            root.close()
    plans: list[float] = []
    for _ in range(200):
        t0 = time.perf_counter()
        sandbox.plan(TurnGrants("a", cwd=str(folder), home=str(home), program=sys.executable,
                                installation=(sys.executable, "-c", "pass"), path_env=os.defpath))
        plans.append((time.perf_counter() - t0) * 1000)
    samples["the plan, in the parent"] = plans
    return samples


def _seen_at(at: list[float], seen: trio.Event, _path: str) -> None:
    at.append(time.perf_counter())
    seen.set()


def bench_covers(folder: Path, rounds: int) -> list[float]:
    """Milliseconds from a rename over a watched file to the watch's call back, ``rounds`` times."""
    from supervisor.procs.covers import open_cover_watch

    target = folder / "corral.toml"
    target.write_text("old")
    watch = open_cover_watch()
    assert watch is not None, "no inotify here"
    took: list[float] = []

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            for _ in range(rounds):
                seen = trio.Event()
                at: list[float] = []
                watch.register([str(target)], partial(_seen_at, at, seen))
                (folder / "new").write_text("new")
                t0 = time.perf_counter()
                os.replace(folder / "new", target)
                await seen.wait()
                took.append((at[0] - t0) * 1000)
            nursery.cancel_scope.cancel()

    trio.run(run)
    return took


def bench_stop(folder: Path, stops: int) -> tuple[list[float], list[float]]:
    results: dict[str, list[float]] = {"off": [], "auto": []}

    async def one(mode: str, i: int) -> float:
        sub = folder / f"stop-{mode}-{i}"
        sub.mkdir()
        config = parse_config(
            {"server": {"sandbox": mode}, "store": {"path": "corral.db"},
             "agents": {"light": {"adapter": "generic", "command": ["sh", "-c", LIGHT], "stop_grace": 2}}},
            file=str(sub / "corral.toml"), base=sub,
        )
        async with open_supervisor(config) as sup:
            await sup.send("c", "go")
            with trio.fail_after(30):
                while not any(e.text == "ready" for e in await sup.entries("c")):
                    await trio.sleep(0.01)  # polling the transcript until the tree is up
            t0 = time.perf_counter()
            result = await sup.stop("c")
            took = (time.perf_counter() - t0) * 1000
            assert result.ok, result
        return took

    async def run() -> None:
        for i in range(stops):
            for mode in ("off", "auto"):
                results[mode].append(await one(mode, i))

    trio.run(run)
    return results["off"], results["auto"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="spawns of each kind (default 200)")
    parser.add_argument("--stops", type=int, default=40, help="stops of each kind (default 40)")
    parser.add_argument("--steps", action="store_true", help="what each step of the sandbox costs instead")
    parser.add_argument("--covers", action="store_true", help="rename over a covered file to the watch's call back")
    args = parser.parse_args()
    folder = short_tmp("corral-bsbx-")
    try:
        if args.covers:
            print(f"a replaced cover: rename to the watch's call back, {args.rounds} renames:")
            print(f"  {'rename -> call back':42} {spread(bench_covers(folder, args.rounds))}")
            return 0
        if args.steps:
            load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
            print(f"spawn to first output by step, {args.rounds} rounds each, in a random order, load {load}:")
            for name, sample in bench_steps(folder, args.rounds).items():
                print(f"  {name:42} {spread(sample)}")
            return 0
        return report(folder, args.rounds, args.stops)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report(folder: Path, rounds: int, stops: int) -> int:
    """Run both benchmarks in ``folder`` and print their figures; 1 if the spawn target is missed."""
    plain, boxed, namespaces = bench_spawn(folder, rounds)
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    added = statistics.median(boxed) - statistics.median(plain)
    own = statistics.median(boxed) - statistics.median(namespaces)
    print(f"spawn to first output, {rounds} rounds each, alternating, load {load}:")
    print(f"  without the sandbox (floor)  {spread(plain)}")
    print(f"  with the sandbox             {spread(boxed)}")
    print(f"  bwrap's namespaces alone     {spread(namespaces)}")
    print(f"  ratio to the floor: median {statistics.median(boxed) / statistics.median(plain):.2f} x, "
          f"p95 {pct(boxed, 0.95) / pct(plain, 0.95):.2f} x; the sandbox adds {added:.2f} ms to the median "
          f"(target <= 5 ms: {'met' if added <= 5 else 'MISSED'}), of which bwrap's own namespaces "
          f"{statistics.median(namespaces) - statistics.median(plain):.2f} ms and corral's steps {own:.2f} ms")
    off, on = bench_stop(folder, stops)
    print(f"stop-one of a light tree (sh + sleep + setsid sleep), {stops} stops each, alternating:")
    print(f"  without the sandbox (floor)  {spread(off)}")
    print(f"  with the sandbox             {spread(on)}")
    print(f"  ratio to the floor: median {statistics.median(on) / statistics.median(off):.2f} x, "
          f"p95 {pct(on, 0.95) / pct(off, 0.95):.2f} x")
    return 0 if added <= 5 else 1


if __name__ == "__main__":
    sys.exit(main())
