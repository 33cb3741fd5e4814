"""A soak: one daemon driven at random for a given time, its resources sampled each minute.

Run from the repository root: ``.venv/bin/python -m scripts.soak [--minutes M] [--channels N]
[--clients C] [--seed S] [--sample SECONDS]`` (``nice -n 10`` on a shared machine).

A real ``corral run`` daemon with the demo agent (sandboxed if the host allows, as configured
by default). ``--clients`` clients each pick, at random and without pause, one of: a plain
send (a short reply, a ``stream 1`` run of drafts, or a ``long 2`` tool), a stop, an
interrupting send, a steered send, a follow (``events?drafts=1`` read for up to 2 s, then
closed), a read of the newest entries, or ``status``. Every minute (``--sample``) the daemon's
RSS, open descriptors, threads and Trio tasks are sampled; the tasks are counted by an
instrument the daemon runs under when this script starts it (``--wrap``, below).

After the load: every channel waited for, the clients' kept-alive connections closed, then the
idle daemon sampled again, with its descriptors by kind against the ones before the load. Printed: the
samples, what each figure did after the first minutes (the *warm* sample: the third, or the
last if there are fewer) and the idle descriptors before and after the load.

The daemon is started by :func:`wrap`: corral's
own CLI, with ``trio.run`` given an instrument that counts living tasks, written to TASKS_FILE
every second by a thread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio

from scripts._api import AsyncAPI, api_path
from scripts._bench import DEMO_CONFIG, REPO, Daemon, short_tmp, sweep_leftovers

#: What a client does, and how often (weights).
ACTIONS = {"send": 30, "stop": 15, "interrupt": 10, "steer": 10, "follow": 10, "read": 15, "status": 10}


@dataclass
class Sample:
    """One sample of the daemon's resources."""

    t: float
    rss_mib: float
    fds: int
    threads: int
    tasks: int
    label: str = ""

    def row(self) -> str:
        """The sample as a line of the report."""
        return (f"{self.t / 60:6.1f} min  RSS {self.rss_mib:6.1f} MiB  fds {self.fds:4d}  threads {self.threads:3d}"
                f"  tasks {self.tasks:5d}  {self.label}")


def sample(daemon: Daemon, tasks_file: Path, started: float, label: str = "") -> Sample:
    """The daemon's RSS, descriptors, threads and tasks now."""
    proc = psutil.Process(daemon.pid)
    try:
        tasks = int(tasks_file.read_text() or -1)
    except (OSError, ValueError):
        tasks = -1
    return Sample(time.monotonic() - started, proc.memory_info().rss / 2**20, proc.num_fds(), proc.num_threads(),
                  tasks, label)


def descriptors(pid: int) -> Counter[str]:
    """The daemon's open descriptors by what they are (``socket``, ``pipe``, ``anon_inode:[pidfd]``, a
    path's folder), so what grew is named."""
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/"):
            kinds[os.path.dirname(target)] += 1
        elif target.startswith("anon_inode:"):
            kinds[target] += 1
        else:
            kinds[target.split(":", 1)[0]] += 1  # (socket:[inode], pipe:[inode])
    return kinds


class Soak:
    """The clients' shared state and counts."""

    def __init__(self, api: AsyncAPI, channels: list[str], rng: random.Random, deadline: float) -> None:
        self.api, self.channels, self.rng, self.deadline = api, channels, rng, deadline
        self.counts: dict[str, int] = dict.fromkeys(ACTIONS, 0)
        self.errors: list[str] = []

    async def client(self) -> None:
        """Random actions until the deadline."""
        names, weights = list(ACTIONS), list(ACTIONS.values())
        while time.monotonic() < self.deadline:
            action = self.rng.choices(names, weights)[0]
            channel = self.rng.choice(self.channels)
            try:
                await getattr(self, action)(channel)
                self.counts[action] += 1
            except (httpx.HTTPError, KeyError, ValueError) as exc:  # (the report counts and shows each)
                self.errors.append(f"{action} {channel}: {exc!r}")

    async def _post(self, channel: str, text: str, delivery: str | None = None) -> None:
        body: dict[str, Any] = {"text": text, **({"delivery": delivery} if delivery else {})}
        r = await self.api.http.post(api_path("send", channel), json=body)
        r.raise_for_status()

    async def send(self, channel: str) -> None:
        await self._post(channel, self.rng.choice(["hello", "stream 1 please", "long 2 please"]))

    async def interrupt(self, channel: str) -> None:
        await self._post(channel, "hello again", "interrupt")

    async def steer(self, channel: str) -> None:
        await self._post(channel, "and this too", "steer")

    async def stop(self, channel: str) -> None:
        r = await self.api.http.post(api_path("stop", channel))
        if r.status_code not in (200, 404, 500):  # (404: a channel not made yet; 500: a failed stop, reported)
            r.raise_for_status()

    async def read(self, channel: str) -> None:
        r = await self.api.http.get(api_path("entries", channel), params={"limit": 50, "newest": 1})
        if r.status_code != 404:  # (a channel not made yet)
            r.raise_for_status()

    async def status(self, channel: str) -> None:
        r = await self.api.http.get("/v1/status")
        r.raise_for_status()

    async def follow(self, channel: str) -> None:
        with trio.move_on_after(self.rng.uniform(0.1, 2.0)):
            async with self.api.http.stream("GET", api_path("follow", channel),
                                            params={"drafts": 1, "after": 0}) as stream:
                if stream.status_code == 404:
                    return
                async for _ in stream.aiter_lines():
                    pass


async def main_async(minutes: float, channels: int, clients: int, seed: int, every: float) -> int:
    folder = short_tmp("corral-soak-")
    tasks_file = folder / "tasks"
    config = DEMO_CONFIG
    # (the daemon's cwd is its folder: the repository put on its path by hand)
    boot = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from scripts.soak import wrap; "
            "wrap(sys.argv[1], sys.argv[2:])")
    command = [sys.executable, "-c", boot, str(tasks_file)]
    daemon = Daemon(folder, config, command=command)
    samples: list[Sample] = []
    started = time.monotonic()
    api = AsyncAPI(daemon.socket, timeout=None)
    names = [f"soak-{i}" for i in range(channels)]
    soak = Soak(api, names, random.Random(seed), started + minutes * 60)
    grown: Counter[str] = Counter()
    try:
        await trio.sleep(1.5)  # (the task count is written each second)
        samples.append(sample(daemon, tasks_file, started, "idle, before the load"))
        idle_fds, idle_kinds = samples[-1].fds, descriptors(daemon.pid)
        print(samples[-1].row(), flush=True)
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(soak.client)
            while time.monotonic() < soak.deadline:
                await trio.sleep(min(every, max(0.0, soak.deadline - time.monotonic())))
                samples.append(sample(daemon, tasks_file, started, "load"))
                print(samples[-1].row(), flush=True)
        for name in names:
            r = await api.http.post(api_path("wait", name), params={"timeout": 120})
            if r.status_code == 404:
                continue
            if not r.json()["idle"]:
                soak.errors.append(f"{name} not idle 120 s after the load")
        # The clients' kept-alive connections closed first: they are the clients' descriptors, not a leak.
        await api.aclose()
        await trio.sleep(2.0)  # (an idle sample: the daemon saw the connections close, the last writes done)
        samples.append(sample(daemon, tasks_file, started, "idle, after the load"))
        print(samples[-1].row(), flush=True)
        grown = descriptors(daemon.pid)
        grown.subtract(idle_kinds)
    finally:
        await api.aclose()
        daemon.stop()
        left = sweep_leftovers(str(folder))
    load = samples[1:-1]
    warm = load[min(2, len(load) - 1)] if load else samples[0]
    last, after = (load[-1] if load else samples[0]), samples[-1]
    print(f"actions: {json.dumps(soak.counts)}; errors: {len(soak.errors)}; left alive: {len(left)}")
    for error in soak.errors[:10]:
        print(f"  error: {error}")
    rss = [s.rss_mib for s in load] or [samples[0].rss_mib]
    print(f"RSS after warm-up ({warm.t / 60:.1f} min) {warm.rss_mib:.1f} MiB -> last under load {last.rss_mib:.1f}"
          f" MiB (+{last.rss_mib - warm.rss_mib:.1f}), max {max(rss):.1f}, median {statistics.median(rss):.1f};"
          f" idle after {after.rss_mib:.1f} MiB")
    print(f"fds idle before {idle_fds} / after {after.fds} (max under load {max(s.fds for s in samples)});"
          f" threads {warm.threads} -> {last.threads} (idle after {after.threads});"
          f" tasks {warm.tasks} -> {last.tasks} (idle before {samples[0].tasks}, after {after.tasks})")
    print("descriptors more than before the load, by kind: "
          + (", ".join(f"{kind} {n:+d}" for kind, n in sorted(grown.items()) if n) or "none"))
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 1 if soak.errors or left else 0


def wrap(tasks_file: str, argv: list[str]) -> None:
    """Run corral's CLI with ``argv``, its ``trio.run`` counting living tasks into ``tasks_file``."""

    class Count(trio.abc.Instrument):
        def __init__(self) -> None:
            self.alive = 0

        def task_spawned(self, task: trio.lowlevel.Task) -> None:
            self.alive += 1

        def task_exited(self, task: trio.lowlevel.Task) -> None:
            self.alive -= 1

    count = Count()
    real_run = trio.run

    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs["instruments"] = [*kwargs.get("instruments", ()), count]
        return real_run(*args, **kwargs)

    def write() -> None:
        while True:
            Path(tasks_file).write_text(str(count.alive))
            time.sleep(1.0)

    trio.run = run  # type: ignore[assignment]  # (this process only: the daemon's CLI)
    threading.Thread(target=write, daemon=True).start()
    from supervisor.cli import main as corral

    sys.argv = ["corral", *argv]
    corral()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load lasts (default 10)")
    parser.add_argument("--channels", type=int, default=20, help="channels (default 20)")
    parser.add_argument("--clients", type=int, default=4, help="clients acting at once (default 4)")
    parser.add_argument("--seed", type=int, default=2026, help="the random seed (default 2026)")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples (default 60)")
    args = parser.parse_args()
    return trio.run(main_async, args.minutes, args.channels, args.clients, args.seed, args.sample)


if __name__ == "__main__":
    sys.exit(main())
