#!/usr/bin/env python
"""What a turn limit costs and saves: one burst of messages to as many channels, run with
``[server] max_turns``, against the same burst's turns run back to back and all at once.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_capacity``
(``--channels N``, default 100; ``--limit N``, default 4; ``--think S``, the seconds each
turn waits as if on a model API, default 0.25). Each run is an embedded supervisor in a
fresh folder, whose agent is a small Python program that sleeps ``--think`` seconds and
answers; the three runs go in the order back to back, limited, all at once.

* **back to back** (``max_turns = 1``): the floor the other rows are measured against. With
  a limit of L, the ideal wall time is that floor over L.
* **limited** (``max_turns = L``): wall time from the first send to the last turn's end, as a
  ratio to floor / L (target: at most 1.5 x); each channel's wait, from its message's
  acceptance to its turn's take, p95 against the ideal ``(N / L) x`` one turn's time (target:
  at most 1.5 x: the order is fair, nobody waits much longer than their place says); the
  largest number of turns alive at a sampled moment (must be at most L).
* **all at once** (``max_turns`` high): wall time, and the peak memory of all agents, against
  the limited run's (what the limit saves).

Peak RSS is sampled every 20 ms as the sum of the resident sizes of this process's
descendants (the agents, their sandboxes' helpers included); turns alive are counted by the
``CORRAL_TURN`` marker on their processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import trio

from scripts._bench import MARKER, pct, short_tmp
from supervisor import open_supervisor
from supervisor.config.settings import parse_config
from supervisor.testing import Hooks

AGENT = ("import json, os, time; time.sleep(float(os.environ['THINK'])); "
         "print(json.dumps({'type': 'result', 'text': 'ok'}))")


def _rss() -> tuple[int, int]:
    """The summed RSS of this process's descendants, and how many turns they belong to (by
    the marker every process of a turn carries)."""
    total = 0
    turns = set()
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
            turn = child.environ().get(MARKER)
        except psutil.Error:
            continue
        if turn is not None:
            turns.add(turn)
    return total, len(turns)


async def burst(folder: Path, channels: int, max_turns: int, think: float) -> dict[str, Any]:
    folder.mkdir(parents=True)
    config = parse_config({
        "server": {"socket": "corral.sock", "max_turns": max_turns},
        "store": {"path": "corral.db"},
        "agents": {"a": {"adapter": "generic", "command": [sys.executable, "-c", AGENT],
                         "env": {"THINK": str(think)}}},
    }, file=str(folder / "corral.toml"), base=folder)
    accepted: dict[str, float] = {}
    waits: list[float] = []

    async def took(channel: str, turn_id: str) -> None:
        waits.append((time.perf_counter() - accepted[channel]) * 1000)

    peak_rss = peak_agents = 0
    async with open_supervisor(config, hooks=Hooks(took=took)) as sup:
        names = [f"c{i:04}" for i in range(channels)]

        async def sample(scope: trio.CancelScope) -> None:
            nonlocal peak_rss, peak_agents
            with scope:
                while True:
                    rss, agents = await trio.to_thread.run_sync(_rss)
                    peak_rss, peak_agents = max(peak_rss, rss), max(peak_agents, agents)
                    await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            nursery.start_soon(sample, scope)
            t0 = time.perf_counter()
            for name in names:
                accepted[name] = time.perf_counter()
                await sup.send(name, "hi")
            for name in names:
                assert await sup.wait_idle(name, timeout=600)
            wall = time.perf_counter() - t0
            scope.cancel()
        answered = 0
        for name in names:
            answered += sum(1 for e in await sup.entries(name) if e.text == "ok")
    assert answered == channels, f"{answered} of {channels} turns answered"
    return {"wall": wall, "waits": waits, "peak_rss": peak_rss, "peak_agents": peak_agents}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = short_tmp("corral-cap-")
    serial = await burst(root / "serial", args.channels, 1, args.think)
    limited = await burst(root / "limited", args.channels, args.limit, args.think)
    at_once = await burst(root / "at-once", args.channels, max(args.channels, 1000), args.think)
    return {"serial": serial, "limited": limited, "at_once": at_once}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--channels", type=int, default=100)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--think", type=float, default=0.25)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    found = trio.run(run, args)
    serial, limited, at_once = found["serial"], found["limited"], found["at_once"]
    n, lim = args.channels, args.limit
    turn = serial["wall"] / n
    ideal_wall = serial["wall"] / lim
    ideal_wait = n / lim * turn * 1000
    wall_ratio = limited["wall"] / ideal_wall
    p95 = pct(limited["waits"], 0.95)
    wait_ratio = p95 / ideal_wait
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({
            "channels": n, "limit": lim, "think": args.think, "load": load,
            "serial_s": serial["wall"], "limited_s": limited["wall"], "at_once_s": at_once["wall"],
            "wall_ratio": wall_ratio, "p95_wait_ms": p95, "wait_ratio": wait_ratio,
            "peak_agents_limited": limited["peak_agents"], "peak_agents_at_once": at_once["peak_agents"],
            "peak_rss_limited": limited["peak_rss"], "peak_rss_at_once": at_once["peak_rss"],
        }))
    else:
        mib = 1024 * 1024
        print(f"{n} messages to {n} channels, each turn thinking {args.think:g} s, load {load:.1f}:")
        print(f"  back to back (max_turns 1, floor)  {serial['wall']:7.2f} s ({turn * 1000:.0f} ms a turn)")
        print(f"  limited (max_turns {lim})           {limited['wall']:7.2f} s = {wall_ratio:.2f} x floor/{lim} "
              f"(target 1.5 x: {'met' if wall_ratio <= 1.5 else 'missed'})")
        print(f"  all at once                        {at_once['wall']:7.2f} s")
        print(f"  limited: per-channel wait median {statistics.median(limited['waits']):.0f} ms, p95 {p95:.0f} ms "
              f"= {wait_ratio:.2f} x the ideal {ideal_wait:.0f} ms (target 1.5 x: "
              f"{'met' if wait_ratio <= 1.5 else 'missed'})")
        print(f"  agents alive at most: limited {limited['peak_agents']} (limit {lim}), "
              f"all at once {at_once['peak_agents']}")
        print(f"  peak RSS of all agents: limited {limited['peak_rss'] / mib:.0f} MiB, "
              f"all at once {at_once['peak_rss'] / mib:.0f} MiB "
              f"({at_once['peak_rss'] / max(1, limited['peak_rss']):.1f} x)")
    return 0 if limited["peak_agents"] <= lim else 1


if __name__ == "__main__":
    sys.exit(main())
