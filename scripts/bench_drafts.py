"""Live output: how long from an agent printing text to an SSE follower seeing it as a draft.

Run from the repository root: ``.venv/bin/python -m scripts.bench_drafts [--seconds S]
[--channels N] [--followers F]``.

A real ``corral run`` daemon with the demo agent, whose ``stream N`` prompt prints a line
every 0.1 s for N seconds, each line carrying the wall-clock time it was printed. One SSE
follower per channel (``events?drafts=1``; ``--followers F``: F of them) takes the time each draft
arrives and subtracts the newest line's print time: *print → draft*. Rows: 1 channel streaming,
and 200 at once (``--channels``), with the daemon's CPU over the streaming (its user + system
time over the wall time: 100 % is one core) and the load average beside it. The crowd's figure is
given twice: every draft, and the drafts once every follower saw its first (from then on
every agent is printing: before it, 200 agents starting at once take the two cores, and the
lag is theirs, not the fan-out's). The target is the second's p95.

The floor, measured in the same run: the same kind of child printing the same lines, read
straight from its pipe by this process (no corral): *print → read*. Each figure is also
given as a ratio to that floor.

The store's writes: entries committed per second of the 200-channel run, once with drafts
followers and once with plain followers (``events`` without ``drafts``): drafts must add no
writes, so the two counts of rows are equal (both are every line saved, in pieces).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

import psutil
import trio

from scripts._api import AsyncAPI, api_path
from scripts._bench import DEMO_CONFIG, Daemon, pct, short_tmp

#: The demo agent's streaming line (adapters/demo_agent.py).
PRINTED_AT = "printed at "
CHILD = r"""
import sys, time
end = time.monotonic() + float(sys.argv[1])
i = 0
while time.monotonic() < end:
    print(f"Streaming line {i}, printed at {time.time():.3f}.", flush=True)
    i += 1
    time.sleep(0.1)
"""


def printed_at(text: str) -> float:
    """The print time of the newest line of a draft's text."""
    return float(text.rstrip().rsplit(PRINTED_AT, 1)[1].rstrip("."))


async def floor(seconds: float) -> list[float]:
    """print → read of the same lines from a child's pipe, without corral (ms)."""
    lags: list[float] = []
    proc = await trio.lowlevel.open_process([sys.executable, "-c", CHILD, str(seconds)], stdout=-1)
    assert proc.stdout is not None
    buffer = b""
    try:
        while chunk := await proc.stdout.receive_some(65536):
            now = time.time()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if lines:
                lags.append((now - printed_at(lines[-1].decode())) * 1000)
    finally:
        await proc.wait()
    return lags


async def count_entries(api: AsyncAPI, names: list[str]) -> int:
    """Entries stored in these channels so far."""
    return sum([len(await api.entries(name)) for name in names])


#: The newest line's print time in a draft event's JSON (each draft holds the whole run: the last is the newest).
_PRINTED = re.compile(rb"printed at (\d+\.\d+)")


async def follow_drafts(api: AsyncAPI, socket: Path, channel: str, after: int, drafts: bool,
                        lags: list[tuple[float, float]], firsts: list[float], done: trio.Event,
                        ready: trio.Event) -> None:
    """Take each draft's print → arrival (and the arrival) until the turn's last entry; the
    first draft's arrival also goes to ``firsts``.

    A lean reader (an HTTP/1.0 request on the socket, so no chunked framing; the events found
    by their blank line, the print time by a regular expression, the arrival timed as the bytes
    come): with 200 channels' followers in this one process, httpx's parsing of each line
    would be what is measured, not the daemon."""
    query = f"after={after}" + ("&drafts=1" if drafts else "")
    async with api.connecting:
        sock = await trio.open_unix_socket(str(socket))
    buffer, headers, first = b"", False, False
    try:
        await sock.send_all(f"GET {api_path('follow', channel)}?{query} HTTP/1.0\r\nHost: corral\r\n\r\n".encode())
        while chunk := await sock.receive_some(262144):
            now = time.time()
            buffer += chunk
            if not headers:
                if b"\r\n\r\n" not in buffer:
                    continue
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
                    raise RuntimeError(f"follow {channel}: {head[:80]!r}")
                headers = True
                ready.set()
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                if event.startswith(b"event: draft"):
                    if stamps := _PRINTED.findall(event):
                        if not first:
                            first = True
                            firsts.append(now)
                        lags.append((now, (now - float(stamps[-1])) * 1000))
                elif b"You said:" in event and b'"kind": "message"' in event:
                    return
    finally:
        await sock.aclose()
        ready.set()
        done.set()


async def run_row(
    daemon: Daemon, channels: int, seconds: float, drafts: bool, followers: int = 1
) -> tuple[list[tuple[float, float]], int, float, float, float]:
    """``channels`` channels streaming at once, each followed ``followers`` times: (arrival,
    print → draft lag in ms) of each draft, entries written, seconds, and the daemon's CPU
    meanwhile (1.0: one core), and when the last follower saw its first draft."""
    api = AsyncAPI(daemon.socket, timeout=None, keepalive=None)
    tag = f"{'d' if drafts else 'p'}{channels}-{time.monotonic_ns()}"
    names = [f"{tag}-{i}" for i in range(channels)]
    lags: list[tuple[float, float]] = []
    firsts: list[float] = []
    try:
        # Each channel made first (a channel exists once it has a message), then followed.
        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(api.send, name, "hello")
        for name in names:
            assert await api.wait(name, 120)
        afters = {name: (await api.entries(name))[-1]["seq"] for name in names}
        before = await count_entries(api, names)
        started = time.monotonic()
        proc = psutil.Process(daemon.pid)
        async with trio.open_nursery() as nursery:
            for name in names:
                for _ in range(followers):
                    ready, done = trio.Event(), trio.Event()
                    nursery.start_soon(follow_drafts, api, daemon.socket, name, afters[name], drafts, lags, firsts,
                                       done, ready)
                    await ready.wait()
            cpu_before, streaming = sum(proc.cpu_times()[:2]), time.monotonic()
            for name in names:
                nursery.start_soon(api.send, name, f"stream {seconds:g} please")
        cpu = (sum(proc.cpu_times()[:2]) - cpu_before) / (time.monotonic() - streaming)
        elapsed = time.monotonic() - started
        for name in names:
            assert await api.wait(name, 120)
        written = await count_entries(api, names) - before
    finally:
        await api.aclose()
    return lags, written, elapsed, cpu, max(firsts, default=0.0)


def line(label: str, lags: list[float], base: float) -> str:
    if not lags:
        return f"{label:<34} no drafts seen"
    med, p95 = statistics.median(lags), pct(lags, 0.95)
    return (f"{label:<34} median {med:7.2f} ms   p95 {p95:7.2f} ms   ({len(lags)} drafts; "
            f"median {med / base:5.1f}x the floor)")


def load() -> str:
    """The load average, for the figure beside it."""
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


async def main_async(seconds: float, many: int, followers: int) -> int:
    base_lags = await floor(seconds)
    base = statistics.median(base_lags)
    folder = short_tmp("corral-bd-")
    daemon = Daemon(folder, DEMO_CONFIG)
    try:
        one = [lag for _, lag in (await run_row(daemon, 1, seconds, drafts=True, followers=followers))[0]]
        load_one = load()
        arrivals, written_d, elapsed_d, cpu, steady_from = await run_row(
            daemon, many, seconds, drafts=True, followers=followers)
        crowd = [lag for _, lag in arrivals]
        # The steady state: once the last agent printed (its start-up, and the other agents' start-ups
        # taking the two cores meanwhile, are not the daemon's fan-out).
        steady = [lag for at, lag in arrivals if at >= steady_from]
        load_crowd = load()
        _, written_p, elapsed_p, _, _ = await run_row(daemon, many, seconds, drafts=False)
    finally:
        daemon.stop()
    each = f", {followers} followers each" if followers != 1 else ""
    print(f"floor: print -> read from a pipe, no corral: median {base:.2f} ms, p95 {pct(base_lags, 0.95):.2f} ms")
    print(line(f"print -> draft at SSE, 1 channel{each}", one, base) + f"  [{load_one}]")
    print(line(f"print -> draft at SSE, {many} channels{each}", crowd, base)
          + f"  daemon CPU {cpu * 100:.0f} % of a core  [{load_crowd}]")
    print(line("  of them once every agent printed", steady, base))
    print(f"store writes, {many} channels streaming {seconds:g} s: {written_d} entries with drafts followers "
          f"({written_d / elapsed_d:.0f}/s), {written_p} with plain followers ({written_p / elapsed_p:.0f}/s): "
          f"drafts add {written_d - written_p} writes")
    target = statistics.median(one) <= 100 if one else False
    print(f"target (1 channel, median print -> draft <= 100 ms): {'met' if target else 'MISSED'}")
    crowd_met = bool(steady) and pct(steady, 0.95) <= 100
    print(f"target ({many} channels once streaming, p95 print -> draft <= 100 ms): {'met' if crowd_met else 'MISSED'}")
    return 0 if one and crowd and written_d == written_p else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each agent streams (default 3)")
    parser.add_argument("--channels", type=int, default=200, help="channels streaming at once (default 200)")
    parser.add_argument("--followers", type=int, default=1, help="SSE followers of each channel (default 1)")
    args = parser.parse_args()
    return trio.run(main_async, args.seconds, args.channels, args.followers)


if __name__ == "__main__":
    sys.exit(main())

