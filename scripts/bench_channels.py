#!/usr/bin/env python
"""Many channels on one host: N channels with a message each, then a restart with all of them stored.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_channels --channels N``
(default 10,000; nice it on a shared machine). It starts its own ``corral run`` daemon in a
temporary folder with a light generic agent (``--agent light``, the default: ``sh -c 'echo ok'``,
one line and exit, sandboxed under bubblewrap as by default) or the bundled demo agent
(``--agent demo``: a Python process per turn, about five times the CPU), and ``[server]
max_turns`` (``--max-turns``, default 8), so the turns go through the capacity limit.

Figures, in order:

* **accepts/s**: N sends (one per channel, ``--clients`` at once) over the Unix socket, each
  answered once its message is stored;
* **turns/s**: N turns ended (``corral_turns_ended_total``) over the time from the first send;
* **RSS idle** of the daemon once every turn ended;
* **a status page**: ``GET /v1/status`` (the default page: busy channels, the idle counted)
  and ``?idle=1`` (200 channels), time and bytes, median of 5; the whole host paged through;
* **/metrics**: time and bytes, median of 5;
* **restart to ready**: SIGTERM, then a new daemon on the same store, from its start to its
  "ready on" line (``--queue Q``: Q messages are sent just before the stop, so the restart
  restores a queue of Q); the same status and metrics figures again, and the RSS once the
  restored queue has run.

It checks that no turn's process is left behind (the ``CORRAL_TURN`` marker).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx
import psutil
import trio

from scripts._api import AsyncAPI
from scripts._bench import DEMO_AGENT_TABLE, MARKER, Daemon, server_tables, short_tmp, sweep_leftovers
from scripts._config import toml

#: A light generic agent: one line of text and exit 0 (the prompt is its last argument, unread).
LIGHT_AGENT_TABLE: dict[str, Any] = {"adapter": "generic", "command": ["sh", "-c", "echo ok", "light"]}
AGENTS = {"light": LIGHT_AGENT_TABLE, "demo": DEMO_AGENT_TABLE}


def mib(n: int) -> str:
    """Bytes as MiB."""
    return f"{n / 2**20:.1f} MiB"


def load() -> str:
    """The machine's load averages now."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


async def timed(call: Callable[[], Awaitable[Any]], runs: int = 5) -> tuple[float, Any]:
    """The median wall time of ``call`` in ms, and its last result."""
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result


async def ended(api: AsyncAPI) -> int:
    """``corral_turns_ended_total`` summed over agents."""
    page = (await api.http.get("/metrics")).text
    return int(sum(float(line.split()[-1]) for line in page.splitlines()
                   if line.startswith("corral_turns_ended_total")))


async def send_all(api: AsyncAPI, channels: list[str], clients: int, resent: list[str]) -> None:
    """One message to each channel, ``clients`` sends at once (``resent``: the channels whose
    send was sent again after its connection broke)."""
    limiter = trio.CapacityLimiter(clients)

    async def one(channel: str) -> None:
        async with limiter:
            try:
                await api.send(channel, "hello")
            except httpx.TransportError:  # a connection reset under load (counted): sent once more
                resent.append(channel)
                await api.send(channel, "hello")

    async with trio.open_nursery() as nursery:
        for channel in channels:
            nursery.start_soon(one, channel)


async def wait_ended(api: AsyncAPI, total: int, timeout: float) -> None:
    """Until ``total`` turns ended (polling /metrics each half second)."""
    with trio.fail_after(timeout):
        while await ended(api) < total:
            await trio.sleep(0.5)


async def reads(api: AsyncAPI, rows: dict[str, Any], tag: str) -> None:
    """The status pages' and /metrics' time and size."""
    pages: dict[str, dict[str, int]] = {"status": {}, "status?idle=1": {"idle": 1}}
    for name, params in pages.items():
        ms, r = await timed(partial(api.http.get, "/v1/status", params=params))
        r.raise_for_status()
        body = r.json()
        rows[f"{tag} {name}"] = {"ms": round(ms, 1), "bytes": len(r.content), "listed": len(body["channels"]),
                                 "counts": body["channel_counts"]}
    start, after, count, seen = time.perf_counter(), None, 0, 0
    while True:
        r = await api.http.get("/v1/status", params={"idle": 1, **({"after": after} if after else {})})
        body = r.json()
        count, seen, after = count + 1, seen + len(body["channels"]), body["next"]
        if after is None:
            break
    rows[f"{tag} every page"] = {"ms": round((time.perf_counter() - start) * 1000, 1), "pages": count,
                                 "channels": seen}
    ms, r = await timed(lambda: api.http.get("/metrics"))
    rows[f"{tag} /metrics"] = {"ms": round(ms, 1), "bytes": len(r.content)}


async def first_run(daemon: Daemon, n: int, clients: int, queue: int, rows: dict[str, Any]) -> None:
    api = AsyncAPI(daemon.socket, timeout=600)
    try:
        channels = [f"ch-{i:06}" for i in range(n)]
        start = time.perf_counter()
        resent: list[str] = []
        await send_all(api, channels, clients, resent)
        sent = time.perf_counter() - start
        rows["accepts"] = {"per_s": round(n / sent, 1), "seconds": round(sent, 2), "load": load(),
                           "resent after a broken connection": len(resent)}
        await wait_ended(api, n, timeout=max(600.0, n * 0.5))
        ran = time.perf_counter() - start
        rows["turns"] = {"per_s": round(n / ran, 1), "seconds": round(ran, 2), "load": load()}
        rows["rss idle"] = mib(psutil.Process(daemon.pid).memory_info().rss)
        await reads(api, rows, "first")
        if queue:
            # Queued just before the stop: the restart restores them (max_turns keeps most waiting).
            await send_all(api, channels[:queue], clients, resent)
    finally:
        await api.aclose()


async def second_run(daemon: Daemon, n: int, queue: int, rows: dict[str, Any]) -> None:
    api = AsyncAPI(daemon.socket, timeout=600)
    try:
        rows["restart rss"] = mib(psutil.Process(daemon.pid).memory_info().rss)
        await reads(api, rows, "restarted")
        if queue:
            await wait_ended(api, queue, timeout=max(600.0, queue * 0.5))
            rows["rss idle after the restored queue"] = mib(psutil.Process(daemon.pid).memory_info().rss)
    finally:
        await api.aclose()


async def in_process(n: int) -> dict[str, Any]:
    """``--ledger N``: a page's, /metrics' and the old whole status's cost in one process, with N
    idle channels made through the ledger (as a restart restores them) and 20 queued ones."""
    from supervisor.config.settings import parse_config
    from supervisor.host.supervisor import open_supervisor
    from supervisor.serve.metrics import render

    folder = short_tmp("cl-")
    data = {**server_tables(), "agents": {"demo": DEMO_AGENT_TABLE}}
    out: dict[str, Any] = {"channels": n, "load before": load()}
    try:
        async with open_supervisor(parse_config(data, file=str(folder / "corral.toml"), base=folder)) as sup:
            for i in range(n):
                sup._ledger.restore(f"ch-{i:06}", 0)
            for i in range(20):
                sup._ledger.accept(f"q-{i}", "demo", 10**9 + i, human=True)

            async def page(**kw: Any) -> dict[str, Any]:
                return sup.status(limit=200, **kw)

            async def metrics() -> str:
                return render(sup.summary(), sup.metrics)

            async def whole() -> dict[str, Any]:
                return sup.status()

            ms, first = await timed(page)
            out["status page"] = {"ms": round(ms, 1), "bytes": len(json.dumps(first))}
            ms, idle = await timed(partial(page, idle=True))
            out["status?idle=1 page"] = {"ms": round(ms, 1), "bytes": len(json.dumps(idle))}
            ms, text = await timed(metrics)
            out["/metrics"] = {"ms": round(ms, 1), "bytes": len(text)}
            ms, every = await timed(whole, runs=1)
            out["every channel (status before paging)"] = {"ms": round(ms, 1), "bytes": len(json.dumps(every))}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out["load after"] = load()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--channels", type=int, default=10_000, help="how many channels (one message each)")
    parser.add_argument("--max-turns", type=int, default=8, help="[server] max_turns")
    parser.add_argument("--agent", choices=sorted(AGENTS), default="light",
                        help="light: sh -c 'echo ok' (default); demo: the bundled demo agent (Python)")
    parser.add_argument("--clients", type=int, default=32, help="sends at once")
    parser.add_argument("--queue", type=int, default=0, help="messages queued just before the restart")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object at the end")
    parser.add_argument("--ledger", type=int, metavar="N", default=0,
                        help="instead: N idle channels in one process (no daemon, no turns), a page's cost")
    args = parser.parse_args()
    if args.ledger:
        print(json.dumps(trio.run(in_process, args.ledger)))
        return 0
    root = short_tmp("cc-")
    rows: dict[str, Any] = {"channels": args.channels, "agent": args.agent, "max_turns": args.max_turns,
                            "queue": args.queue,
                            "cpus": os.cpu_count(), "load before": load()}
    failures: list[str] = []
    config = toml({**server_tables(max_turns=args.max_turns), f"agents.{args.agent}": AGENTS[args.agent]})
    try:
        daemon = Daemon(root, config)
        try:
            trio.run(first_run, daemon, args.channels, args.clients, args.queue, rows)
        finally:
            if daemon.stop() != 0:
                failures.append("the first daemon did not exit 0")
        start = time.perf_counter()
        daemon = Daemon(root, config)
        rows["restart to ready"] = {"ms": round((time.perf_counter() - start) * 1000, 1), "load": load()}
        try:
            trio.run(second_run, daemon, args.channels, args.queue, rows)
        finally:
            if daemon.stop() != 0:
                failures.append("the restarted daemon did not exit 0")
    finally:
        left = sweep_leftovers(str(root))
        if left:
            failures.append(f"{len(left)} process(es) of turns left behind ({MARKER}): {left[:5]}")
        shutil.rmtree(root, ignore_errors=True)
    rows["load after"] = load()
    rows["failures"] = failures
    if args.json:
        print(json.dumps(rows))
    else:
        for key, value in rows.items():
            print(f"{key}: {value}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
