#!/usr/bin/env python
"""End-to-end figures of a real ``corral run`` daemon with the bundled demo agent.

Run it as ``.venv/bin/python scripts/bench_daemon.py`` (``--quick`` for a small fast run).
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
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio

REPO = Path(__file__).resolve().parent.parent
DEMO_AGENT = REPO / "adapters" / "demo_agent.py"
MARKER = "CORRAL_TURN"
#: The marker of agents this script starts directly. Not CORRAL_TURN on purpose: the test
#: suite's autouse fixture kills (and fails on) any new CORRAL_TURN process on the machine.
DIRECT_MARKER = "CORRAL_BENCH_TREE"
#: The first-entry target on top of the agent's own start-up.
FIRST_ENTRY_SLACK_MS = 50.0

CONFIG = """
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[defaults]
stop_grace = 2
[agents.demo]
adapter = "demo"
delay = 0.01
"""


# ---------------------------------------------------------------- helpers shared by the rows


def corral_command() -> list[str]:
    """``corral`` from this virtualenv (or ``python -m supervisor.cli`` if not installed)."""
    exe = Path(sys.executable).with_name("corral")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "supervisor.cli"]


def short_tmp(prefix: str) -> Path:
    """A temporary folder with a short path: a Unix socket path must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


class Daemon:
    """A ``corral run -c FILE`` subprocess in its own session, ready once it logged so."""

    def __init__(self, folder: Path, config_text: str = CONFIG) -> None:
        self.folder = folder
        self.socket = folder / "corral.sock"
        assert len(os.fsencode(self.socket)) < 108, self.socket
        (folder / "corral.toml").write_text(config_text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        self.proc = subprocess.Popen(
            [*corral_command(), "run", "-c", str(folder / "corral.toml")],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.log_path = folder / "daemon.log"
        log = self.log_path.open("w")
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 60
        while True:
            line = self.proc.stderr.readline()
            log.write(line)
            if not line:
                log.close()
                raise RuntimeError(f"the daemon exited before it was ready; see {self.log_path}")
            if "ready on" in line:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not become ready within 60 s")
        # Keep draining its log so a chatty daemon never blocks on a full pipe.
        self._drain = threading.Thread(target=self._copy_log, args=(log,), daemon=True)
        self._drain.start()

    def _copy_log(self, log: Any) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            log.write(line)
        log.close()

    @property
    def pid(self) -> int:
        """The daemon's pid."""
        return self.proc.pid

    def stop(self) -> int:
        """SIGTERM and wait for the orderly shutdown (SIGKILL after 60 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(timeout=5)
        return self.proc.returncode


def marker_processes(home_prefix: str, variable: str = MARKER) -> list[tuple[int, str, str]]:
    """Living processes carrying the turn marker whose HOME lies under ``home_prefix``.

    The HOME scope keeps the scan to this script's own turns: other programs on the machine
    may run corral turns of their own. Returns ``(pid, marker value, command line)``.
    """
    found = []
    me = os.getpid()
    key, home = f"{variable}=".encode(), f"HOME={home_prefix}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state == b"Z":
            continue
        marker = next((e[len(key):] for e in env if e.startswith(key)), None)
        if marker is None or not any(e.startswith(home) for e in env):
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:100]
        except OSError:
            cmd = "?"
        found.append((int(name), marker.decode(errors="replace"), cmd))
    return found


def kill_leftovers(found: Iterable[tuple[int, str, str]]) -> None:
    """SIGKILL processes this script started (found by its own marker scan) and wait."""
    procs = []
    for pid, _, _ in found:
        try:
            proc = psutil.Process(pid)
            proc.kill()
            procs.append(proc)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


class ForeignTests:
    """Notes test runs of this project in this pid namespace while the script runs.

    The suite's autouse fixture (tests/conftest.py, ``no_leftover_turn_processes``) SIGKILLs
    every new ``CORRAL_TURN`` process on the machine, this script's included: a turn killed
    "from nowhere" (status -9) while such a run was active is most likely its doing.
    """

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}
        self._ns = os.readlink("/proc/self/ns/pid")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in self.seen:
                    continue
                try:
                    with open(f"/proc/{name}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
                    if "pytest" in cmd and "unshare" not in cmd and os.readlink(f"/proc/{name}/ns/pid") == self._ns:
                        self.seen[int(name)] = cmd[:120]
                except OSError:
                    continue

    def close(self) -> str:
        """Stop watching; a note for the report ('' if none was seen)."""
        self._stop.set()
        self._thread.join()
        if not self.seen:
            return ""
        return (f"note: {len(self.seen)} pytest process(es) ran in this pid namespace meanwhile (their autouse fixture "
                f"SIGKILLs any new CORRAL_TURN process on the machine), e.g. {next(iter(self.seen.values()))!r}")


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def spread(values: list[float]) -> str:
    """median / p95 / max in ms."""
    if not values:
        return "n/a"
    return f"median {statistics.median(values):7.1f}  p95 {pct(values, 0.95):7.1f}  max {max(values):7.1f} ms"


class AsyncAPI:
    """The control API over the Unix socket, for many concurrent requests from one Trio loop."""

    def __init__(self, socket: Path) -> None:
        self.http = httpx.AsyncClient(
            # The limits go on the transport: a client's own limits do not apply to a transport passed in.
            transport=httpx.AsyncHTTPTransport(uds=str(socket), limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)),
            base_url="http://corral", timeout=None,
        )
        #: Connections being opened at once. The daemon's listener keeps hypercorn's default
        #: backlog of 100: past that a non-blocking AF_UNIX connect fails with EAGAIN, which
        #: Trio takes for "in progress" (the read then fails with EINVAL).
        self.connecting = trio.CapacityLimiter(64)

    async def aclose(self) -> None:
        """Close every connection."""
        await self.http.aclose()

    @staticmethod
    def _path(channel: str) -> str:
        from urllib.parse import quote

        return f"/v1/channels/{quote(channel, safe='')}"

    async def send(self, channel: str, text: str) -> dict[str, Any]:
        """POST a message; the accepted seq and generation."""
        r = await self.http.post(f"{self._path(channel)}/messages", json={"text": text})
        r.raise_for_status()
        return r.json()

    async def wait(self, channel: str, timeout: float) -> bool:
        """True once the channel is idle."""
        r = await self.http.post(f"{self._path(channel)}/wait", params={"timeout": timeout})
        return bool(r.json()["idle"])

    async def entries(self, channel: str) -> list[dict[str, Any]]:
        """Every committed entry of the channel."""
        r = await self.http.get(f"{self._path(channel)}/entries")
        r.raise_for_status()
        return r.json()["entries"]


# ---------------------------------------------------------------- the reference: bare start-up


def agent_env(home: Path, marker: str) -> dict[str, str]:
    """The environment the supervisor would give the demo agent (scrubbed, private HOME)."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": str(home), "TMPDIR": str(home / "tmp"), "DEMO_AGENT_DELAY": "0.01", DIRECT_MARKER: marker,
    }


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
    api = AsyncAPI(daemon.socket)
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
                response = await stack.enter_async_context(api.http.stream("GET", f"{api._path(channel)}/events"))
            connected += 1
            if connected == n:
                all_connected.set()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.perf_counter()
                entry = json.loads(line[6:])
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
    api = AsyncAPI(daemon.socket)
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
    foreign = ForeignTests()
    try:
        print(f"corral daemon benchmark ({'quick' if args.quick else 'full'}), {os.cpu_count()} CPU(s), Python {sys.version.split()[0]}")
        print(f"daemon: `corral run -c FILE` subprocess; demo agent (delay 0.01); client: httpx over the Unix socket")
        alone = trio.run(_bare_alone, root / "ref")
        print(f"\nreference: demo agent bare start-up (spawn -> first stdout line), alone, 10 runs: {spread(alone)}")
        ref = statistics.median(alone)

        print("\nfirst entry: send returned -> first agent entry read by a follower (SSE opened before the send);")
        print("all sends at once, but at most 64 connections opening at a time (the daemon's listen backlog is hypercorn's default 100)")
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
                print(f"       target: median <= {FIRST_ENTRY_SLACK_MS:.0f} ms + start-up alone ({ref:.1f}) = {target:.1f} ms -> {verdict};"
                      f" vs start-up of {n} at once: median {med - bare_med:+.1f} ms over it")
                print(f"       daemon RSS: before {mib(row.rss_before)}, peak {mib(row.rss_peak)}, after {mib(row.rss_after)}")
                for e in row.errors:
                    print(f"       ERROR: {e}")
                    failures.append(f"{n} channels: {e}")
        finally:
            code = daemon.stop()
            if code != 0:
                failures.append(f"daemon exited with {code}")

        print(f"\nidle: a fresh daemon with {idle_channels} channels that each completed one turn, no client connected, two windows of {idle_seconds:g} s")
        folder = root / "b"
        folder.mkdir()
        daemon = Daemon(folder)
        try:
            idles = trio.run(idle_rows, daemon, idle_channels, idle_seconds)
        finally:
            daemon.stop()
        for title, idle in zip(("right after the last turn", "the next window (steady state)"), idles):
            print(f"  {title}:")
            print(f"    CPU: {idle.cpu_s * 1000:.1f} ms = {idle.cpu_s / idle_seconds * 100:.3f} % of a core   (target: ~0)")
            print(f"    wake-ups: {idle.switches} context switches = {idle.switches / idle_seconds:.2f}/s over all threads   (target: 0)")
            print(f"    threads: {idle.threads_before} -> {idle.threads_after}; RSS {mib(idle.rss)}")
            if idle.per_thread:
                print("    by thread: " + ", ".join(f"{name} {d}" for name, d in sorted(idle.per_thread, key=lambda x: -x[1])))
            if idle.exited:
                names = sorted({name.split("/")[0].rstrip("0123456789 ") for name in idle.exited})
                print(f"    {len(idle.exited)} thread(s) exited in the window ({', '.join(names)}: Trio's idle worker threads"
                      " time out after 10 s); their own switches are not counted")
    finally:
        left = marker_processes(home_prefix) + marker_processes(home_prefix, DIRECT_MARKER)
        if left:
            failures.append(f"{len(left)} process(es) of turns left behind: {left[:5]}")
            kill_leftovers(left)
        print(f"\nleftover processes ({MARKER} / {DIRECT_MARKER} marker, HOME under {root}): {len(left)}")
        shutil.rmtree(root, ignore_errors=True)
        note = foreign.close()
        if note:
            print(note)
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
