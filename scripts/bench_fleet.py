#!/usr/bin/env python
"""A fleet of three `corral run` daemons (hosts ha, hb, hc) on one machine and one database.

Run it as ``.venv/bin/python -m scripts.bench_fleet`` from the repository. It measures

* **messages accepted and started per second**: ``--messages`` sends through ha to 30
  channels pinned round-robin to the three hosts (two thirds of them run elsewhere: the
  owner is notified when each is queued), each awaited; then the time until every one of
  them has begun a turn on its host;
* **stop latency**: a stop of a channel with a running turn on ha, sent through ha (local)
  and through hb (cross-host: hb asks ha through LISTEN/NOTIFY, ha stops it and answers),
  ``--stops`` times each, alternating; median and p90 as the client sees them (target:
  cross-host ≤ local + 10 ms, median);
* **a dead host's channels moving**: hc runs a turn and has a message queued; it is killed
  with SIGKILL; the time until a live host begins that channel's queued message (target:
  the lease + 2 s);
* **a partition** (``--partitions`` trials of each, on a second fleet whose hosts reach the
  database through a loopback fault proxy each, ``scripts/_partition.py``): the owner's
  database blackholed mid-turn (a cut cable), then the time from the cut to the channel's
  next turn on another host, and when the owner's agent died (its local deadline minus the
  margin: before the next turn); the largest overlap of two hosts' agents of one channel
  over every trial, measured from each agent's start and its pidfd's exit (target 0); and
  the latency of a stop through a survivor while the owner is cut off (target: the lease
  plus 3 s; ``ok: false`` naming the owner).

PostgreSQL runs on ``--url`` if given, else on a throwaway server started the way the tests
start theirs (``scripts/_postgres.py``). The lease is ``--lease`` seconds (2 by default).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from scripts._bench import Daemon, short_tmp
from scripts._chaos_fleet import config as fleet_config
from supervisor.serve.client import Client

T = TypeVar("T")

#: An agent that says "ready" and waits to be stopped (SIGINT ends it), or answers at once ("quick").
AGENT = r"""
import signal, sys, time
signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
print("ready", flush=True)
if "quick" not in sys.argv[-1]:
    time.sleep(3600)
print("done", flush=True)
"""
HOSTS = ("ha", "hb", "hc")
CHANNELS = 30


def config(folder: Path, url: str, host: str, lease: float) -> str:
    """A host's config: the fleet, the agent, and the pinned channels."""
    return fleet_config(folder, url, host, lease, {f"b{i}": HOSTS[i % 3] for i in range(CHANNELS)})


def until(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll a condition under a deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.005)
    raise RuntimeError(f"timed out waiting for {what}")


def count(url: str, sql: str, params: tuple[Any, ...] = ()) -> int:
    """One number from the database."""
    import psycopg

    with psycopg.connect(url) as conn:
        ((n,),) = conn.execute(sql, params).fetchall()
        return int(n or 0)


def running(url: str, channel: str) -> Callable[[], int]:
    """A probe: the channel's agent has said "ready" (its SIGINT handler is in place)."""
    return lambda: count(url, "SELECT count(*) FROM entries WHERE channel = %s AND text = 'ready'", (channel,))


def measure(url: str, root: Path, lease: float, messages: int, stops: int) -> dict[str, Any]:
    """Start the fleet, take every figure, stop the fleet."""
    (root / "agent.py").write_text(AGENT)
    daemons: dict[str, Daemon] = {}
    for host in HOSTS:
        (root / host).mkdir()
        daemons[host] = Daemon(root / host, config(root / host, url, host, lease))
    out: dict[str, Any] = {"lease_s": lease, "hosts": len(HOSTS)}
    try:
        with Client(str(daemons["ha"].socket)) as a, Client(str(daemons["hb"].socket)) as b:
            began = time.perf_counter()
            for i in range(messages):
                a.send(f"b{i % CHANNELS}", f"quick {i}")
            accepted = time.perf_counter() - began
            until("every message to begin", lambda: count(url, "SELECT count(*) FROM turns") >= messages)
            started = time.perf_counter() - began
            out["accepted_per_s"] = round(messages / accepted, 1)
            out["started_per_s"] = round(messages / started, 1)

            timings: dict[str, list[float]] = {"local": [], "cross": []}
            for i in range(stops * 2):
                channel, through = f"s{i}", ("local", a) if i % 2 == 0 else ("cross", b)
                a.send(channel, "wait")  # (through ha: ha owns the channel)
                until("the turn", running(url, channel))
                t0 = time.perf_counter()
                result = through[1].stop(channel)
                timings[through[0]].append(time.perf_counter() - t0)
                assert result["ok"] and result["stopped_turns"], result
            for kind, values in timings.items():
                out[f"{kind}_stop_median_ms"] = round(statistics.median(values) * 1000, 1)
                out[f"{kind}_stop_p90_ms"] = round(sorted(values)[int(len(values) * 0.9)] * 1000, 1)
            out["cross_minus_local_median_ms"] = round(out["cross_stop_median_ms"] - out["local_stop_median_ms"], 1)

        with Client(str(daemons["hc"].socket)) as c:
            c.send("m", "wait")
            until("hc's turn", lambda: count(url, "SELECT count(*) FROM turns WHERE channel = 'm' AND host = 'hc'"))
            c.send("m", "quick after the move")
        os.kill(daemons["hc"].pid, signal.SIGKILL)
        killed = time.perf_counter()
        daemons["hc"].proc.wait()
        until("a live host to take m", lambda: count(
            url, "SELECT count(*) FROM turns WHERE channel = 'm' AND host != 'hc'"), timeout=lease * 5 + 30)
        out["dead_host_move_s"] = round(time.perf_counter() - killed, 2)
        out["dead_host_target_s"] = lease + 2
    finally:
        for daemon in daemons.values():
            if daemon.alive():
                daemon.stop()
    return out


def measure_partitions(server: Any, lease: float, trials: int) -> dict[str, Any]:
    """The partition figures: ``trials`` owner cuts and ``trials`` stops through a survivor
    while the owner is cut off, on a fleet of three hosts behind fault proxies."""
    import random

    from scripts._partition import PartitionFleet, trial

    moved: list[float] = []
    killed: list[float] = []
    stops: list[float] = []
    overlaps: list[float] = []
    violations: list[str] = []
    fleet = PartitionFleet(server, short_tmp("corral-fleet-p-"), lease, HOSTS)
    try:
        rng = random.Random(1)
        for i in range(trials * 2):
            bad, drawn = trial(fleet, rng, i, "owner-cut" if i % 2 == 0 else "stop-while-cut")
            violations += bad
            overlaps.append(drawn["overlap_s"])
            if drawn.get("moved_s") is not None:
                moved.append(drawn["moved_s"])
            if drawn.get("owner_killed_s") is not None:
                killed.append(drawn["owner_killed_s"])
            if drawn.get("stop_s") is not None:
                stops.append(drawn["stop_s"])
    finally:
        fleet.close()

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 3) if values else None

    return {
        "partition_trials": trials * 2,
        "partition_to_next_turn_median_s": median(moved), "partition_to_next_turn_max_s": max(moved, default=None),
        "cut_owner_killed_median_s": median(killed), "cut_owner_killed_max_s": max(killed, default=None),
        "largest_overlap_s": max(overlaps, default=0.0),
        "stop_via_survivor_median_s": median(stops), "stop_via_survivor_max_s": max(stops, default=None),
        "stop_via_survivor_target_s": lease + 3.0,
        "partition_violations": sorted(set(violations)),
    }


def main() -> int:
    """Measure; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an empty PostgreSQL database to use (else a throwaway server is started)")
    parser.add_argument("--lease", type=float, default=2.0, help="[cluster] lease, seconds (default 2)")
    parser.add_argument("--messages", type=int, default=300, help="messages to send (default 300)")
    parser.add_argument("--stops", type=int, default=20, help="stops to time (default 20)")
    parser.add_argument("--partitions", type=int, default=5,
                        help="partition trials of each kind (default 5; 0: none; needs the throwaway server)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    server = None
    url: str | None = args.url
    if url is None:
        from scripts._postgres import PostgresServer, missing

        reason = missing()
        if reason is not None:
            print(f"cannot run: {reason}", file=sys.stderr)
            return 1
        server = PostgresServer()
        url = server.new_database()
    root = short_tmp("corral-fleet-")
    try:
        out = measure(url, root, args.lease, args.messages, args.stops)
        if server is not None and args.partitions > 0:
            out.update(measure_partitions(server, args.lease, args.partitions))
    finally:
        if server is not None:
            server.close()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, value in out.items():
            print(f"{key:<30}{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
