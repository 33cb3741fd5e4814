#!/usr/bin/env python
"""End-to-end figures of a real ``corral run`` daemon with the bundled demo agent.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_daemon`` (``--quick`` for a
small fast run).
It starts its own daemon(s) in a temporary folder, measures, stops them, and checks that no
process of any turn (found by the ``CORRAL_TURN`` marker) is left behind.

Figures:

* **first entry**: for 1 / 50 / 200 channels, one message per channel sent at once through
  the control API (Unix socket, HTTP), the time from each ``send`` returning to the first
  entry of the agent's turn reaching a follower of that channel (an SSE stream opened
  before the send). The reference is the demo agent's bare start-up: the time to its first
  stdout line when it is run directly, alone and N at once.
* **RSS** of the daemon process (peak while the row ran, and after it).
* **idle**: CPU seconds and wake-ups (context switches of every thread) per second of a
  daemon holding 100 channels that each completed one turn, with no client connected.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import trio

from scripts._api import AsyncAPI
from scripts._bench import (
    DEMO_AGENT,
    DIRECT_MARKER,
    MARKER,
    Daemon,
    demo_env,
    short_tmp,
    spread,
    sweep_leftovers,
)

#: The first-entry target on top of the agent's own start-up.
FIRST_ENTRY_SLACK_MS = 50.0


# ---------------------------------------------------------------- the reference: bare start-up


def agent_env(home: Path, marker: str) -> dict[str, str]:
    """The demo agent's environment under the supervisor, with this script's own marker."""
    return {**demo_env(home), DIRECT_MARKER: marker}


async def bare_startup(home: Path, n: int) -> list[float]:
    """Start the demo agent ``n`` times at once, directly; ms from spawn to its first stdout line."""
    times: list[float] = []

    async def one(i: int) -> None:
        started = time.perf_counter()
        proc = await trio.lowlevel.open_process(
            [sys.executable, str(DEMO_AGENT), f"hello {i}"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=agent_env(home, f"bench-bare-{i}"), cwd=str(home), start_new_session=True,
        )
        assert proc.stdout is not None
        buf = b""
        while b"\n" not in buf:
            chunk = await proc.stdout.receive_some(4096)
            if not chunk:
                break
            buf += chunk
        times.append((time.perf_counter() - started) * 1000)
        while await proc.stdout.receive_some(4096):
            pass
        await proc.wait()
        await proc.stdout.aclose()

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return times


# ---------------------------------------------------------------- rows


@dataclass
class LatencyRow:
    """One row of the first-entry table."""

    channels: int
    first_entry_ms: list[float] = field(default_factory=list)
    """Client side: send returned -> first agent entry read from the follower's stream."""
    from_issue_ms: list[float] = field(default_factory=list)
    """Client side: send issued -> first agent entry (includes the send's own round trip)."""
    daemon_side_ms: list[float] = field(default_factory=list)
    """Daemon clocks: the agent entry's ts minus the human message's ts."""
    send_ms: list[float] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    bare_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def latency_row(daemon: Daemon, n: int, tag: str) -> LatencyRow:
    """Send one message to each of ``n`` fresh channels at once; time the first agent entry."""
    row = LatencyRow(n)
    proc = psutil.Process(daemon.pid)
    row.rss_before = row.rss_peak = proc.memory_info().rss
    api = AsyncAPI(daemon.socket, timeout=None, keepalive=None)
    channels = [f"{tag}-{i}" for i in range(n)]
    sent_at: dict[str, float] = {}
    issued_at: dict[str, float] = {}
    first_at: dict[str, float] = {}
    human_ts: dict[str, float] = {}
    agent_ts: dict[str, float] = {}
    connected = 0
    all_connected = trio.Event()
    done_sampling = trio.Event()

    async def follow(channel: str) -> None:
        nonlocal connected
        async with contextlib.AsyncExitStack() as stack:
            async with api.connecting:
                entries = await stack.enter_async_context(api.events(channel))
            connected += 1
            if connected == n:
                all_connected.set()
            async for entry in entries:
                now = time.perf_counter()
                if entry["author"].startswith("human:"):
                    human_ts[channel] = entry["ts"]
                elif entry["author"].startswith("agent:"):
                    first_at[channel] = now
                    agent_ts[channel] = entry["ts"]
                    return

    async def send(channel: str) -> None:
        async with api.connecting:
            t0 = issued_at[channel] = time.perf_counter()
            await api.send(channel, f"hello from {channel}")
            sent_at[channel] = time.perf_counter()
        row.send_ms.append((sent_at[channel] - t0) * 1000)

    async def sample_rss() -> None:
        while not done_sampling.is_set():
            try:
                row.rss_peak = max(row.rss_peak, proc.memory_info().rss)
            except psutil.Error:
                return
            with trio.move_on_after(0.05):
                await done_sampling.wait()

    try:
        async with trio.open_nursery() as outer:
            outer.start_soon(sample_rss)
            with trio.move_on_after(120) as limit:
                async with trio.open_nursery() as nursery:
                    for channel in channels:
                        nursery.start_soon(follow, channel)
                    await all_connected.wait()
                    async with trio.open_nursery() as senders:
                        for channel in channels:
                            senders.start_soon(send, channel)
                async def wait(channel: str) -> None:
                    async with api.connecting:
                        await api.wait(channel, 60)

                async with trio.open_nursery() as waiters:
                    for channel in channels:
                        waiters.start_soon(wait, channel)
            done_sampling.set()
        if limit.cancelled_caught:
            row.errors.append(f"timed out after 120 s ({connected} of {n} followers connected)")
    finally:
        await api.aclose()
    for channel in channels:
        if channel in first_at and channel in sent_at:
            row.first_entry_ms.append((first_at[channel] - sent_at[channel]) * 1000)
            row.from_issue_ms.append((first_at[channel] - issued_at[channel]) * 1000)
        if channel in agent_ts and channel in human_ts:
            row.daemon_side_ms.append((agent_ts[channel] - human_ts[channel]) * 1000)
    missing = n - len(row.first_entry_ms)
    if missing:
        row.errors.append(f"{missing} channel(s) never showed an agent entry")
    row.rss_after = proc.memory_info().rss
    row.bare_ms = await bare_startup(daemon.folder / "bare-home", n)
    return row


@dataclass
class IdleRow:
    """Idle cost of a daemon with completed channels."""

    channels: int
    seconds: float
    cpu_s: float = 0.0
    switches: int = 0
    threads_before: int = 0
    threads_after: int = 0
    exited: list[str] = field(default_factory=list)
    per_thread: list[tuple[str, int]] = field(default_factory=list)
    rss: int = 0


def thread_switches(pid: int) -> dict[str, tuple[str, int]]:
    """tid -> (thread name, voluntary + nonvoluntary context switches)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        total = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
        out[tid] = (fields["Name"].strip(), total)
    return out


async def idle_rows(daemon: Daemon, n: int, seconds: float) -> list[IdleRow]:
    """Complete one turn in each of ``n`` channels, disconnect, then watch the daemon idle for
    two windows: right after the last turn, and the one after it (steady state)."""
    api = AsyncAPI(daemon.socket, timeout=None, keepalive=None)
    try:
        async def one(i: int) -> None:
            async with api.connecting:
                await api.send(f"idle-{i}", "hello")
                await api.wait(f"idle-{i}", 60)

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
    finally:
        await api.aclose()  # no client connection stays open during the measurement
    rows = []
    proc = psutil.Process(daemon.pid)
    for _ in range(2):
        row = IdleRow(n, seconds)
        before, cpu0 = thread_switches(daemon.pid), proc.cpu_times()
        await trio.sleep(seconds)
        after, cpu1 = thread_switches(daemon.pid), proc.cpu_times()
        row.cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
        row.threads_before, row.threads_after = len(before), len(after)
        for tid, (name, total) in after.items():
            delta = total - before.get(tid, (name, 0))[1]
            row.switches += delta
            if delta:
                row.per_thread.append((f"{name}/{tid}", delta))
        row.exited = [f"{name}/{tid}" for tid, (name, _) in before.items() if tid not in after]
        row.rss = proc.memory_info().rss
        rows.append(row)
    return rows


# ---------------------------------------------------------------- main


def mib(n: int) -> str:
    """A byte count in MiB."""
    return f"{n / 1048576:6.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 and 10 channels, a 3 s idle window over 20 channels")
    args = parser.parse_args()
    sizes = (1, 10) if args.quick else (1, 50, 200)
    idle_channels, idle_seconds = (20, 3.0) if args.quick else (100, 20.0)

    root = short_tmp("cb-")
    home_prefix = str(root)
    failures: list[str] = []
    try:
        kind = "quick" if args.quick else "full"
        print(f"corral daemon benchmark ({kind}), {os.cpu_count()} CPU(s), Python {sys.version.split()[0]}")
        print("daemon: `corral run -c FILE` subprocess; demo agent (delay 0.01); client: httpx over the Unix socket")
        alone = trio.run(_bare_alone, root / "ref")
        print(f"\nreference: demo agent bare start-up (spawn -> first stdout line), alone, 10 runs: {spread(alone)}")
        ref = statistics.median(alone)

        print("\nfirst entry: send returned -> first agent entry read by a follower (SSE opened before the send);")
        print("all sends at once, but at most 64 connections opening at a time"
              " (the daemon's listen backlog is hypercorn's default 100)")
        folder = root / "a"
        folder.mkdir()
        daemon = Daemon(folder)
        try:
            for n in sizes:
                # One channel is one sample: take ten, one after the other.
                row = trio.run(latency_row, daemon, n, f"c{n}")
                for r in range(1, 10 if n == 1 else 1):
                    more = trio.run(latency_row, daemon, n, f"c{n}r{r}")
                    for name in ("first_entry_ms", "from_issue_ms", "daemon_side_ms", "send_ms", "bare_ms", "errors"):
                        getattr(row, name).extend(getattr(more, name))
                    row.rss_peak, row.rss_after = max(row.rss_peak, more.rss_peak), more.rss_after
                target = ref + FIRST_ENTRY_SLACK_MS
                bare_med = statistics.median(row.bare_ms)
                med = statistics.median(row.first_entry_ms) if row.first_entry_ms else float("nan")
                print(f"  {n:>3} channel(s){' x10 rounds' if n == 1 else ''}: {spread(row.first_entry_ms)}")
                print(f"       send issued -> first entry:                 {spread(row.from_issue_ms)}")
                print(f"       daemon clock (agent entry ts - message ts): {spread(row.daemon_side_ms)}")
                print(f"       send round trip (returns once committed):   {spread(row.send_ms)}")
                print(f"       bare start-up, {n:>3} agents at once:          {spread(row.bare_ms)}")
                verdict = "meets" if med <= target else "MISSES"
                print(f"       target: median <= {FIRST_ENTRY_SLACK_MS:.0f} ms + start-up alone ({ref:.1f})"
                      f" = {target:.1f} ms -> {verdict};"
                      f" vs start-up of {n} at once: median {med - bare_med:+.1f} ms over it")
                print(f"       daemon RSS: before {mib(row.rss_before)}, peak {mib(row.rss_peak)},"
                      f" after {mib(row.rss_after)}")
                for e in row.errors:
                    print(f"       ERROR: {e}")
                    failures.append(f"{n} channels: {e}")
        finally:
            code = daemon.stop()
            if code != 0:
                failures.append(f"daemon exited with {code}")

        print(f"\nidle: a fresh daemon with {idle_channels} channels that each completed one turn,"
              f" no client connected, two windows of {idle_seconds:g} s")
        folder = root / "b"
        folder.mkdir()
        daemon = Daemon(folder)
        try:
            idles = trio.run(idle_rows, daemon, idle_channels, idle_seconds)
        finally:
            daemon.stop()
        for title, idle in zip(("right after the last turn", "the next window (steady state)"), idles, strict=True):
            print(f"  {title}:")
            share = idle.cpu_s / idle_seconds * 100
            print(f"    CPU: {idle.cpu_s * 1000:.1f} ms = {share:.3f} % of a core   (target: ~0)")
            rate = idle.switches / idle_seconds
            print(f"    wake-ups: {idle.switches} context switches = {rate:.2f}/s over all threads   (target: 0)")
            print(f"    threads: {idle.threads_before} -> {idle.threads_after}; RSS {mib(idle.rss)}")
            if idle.per_thread:
                busiest = sorted(idle.per_thread, key=lambda x: -x[1])
                print("    by thread: " + ", ".join(f"{name} {d}" for name, d in busiest))
            if idle.exited:
                names = sorted({name.split("/")[0].rstrip("0123456789 ") for name in idle.exited})
                print(f"    {len(idle.exited)} thread(s) exited in the window"
                      f" ({', '.join(names)}: Trio's idle worker threads"
                      " time out after 10 s); their own switches are not counted")
    finally:
        left = sweep_leftovers(home_prefix)
        if left:
            failures.append(f"{len(left)} process(es) of turns left behind: {left[:5]}")
        print(f"\nleftover processes ({MARKER} / {DIRECT_MARKER} marker, HOME under {root}): {len(left)}")
        shutil.rmtree(root, ignore_errors=True)
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        return 1
    return 0


async def _bare_alone(home: Path) -> list[float]:
    times = []
    for _ in range(10):
        times += await bare_startup(home, 1)
    return times


if __name__ == "__main__":
    sys.exit(main())
