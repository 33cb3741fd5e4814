#!/usr/bin/env python
"""The store's write costs on SQLite and on PostgreSQL, side by side.

Run it as ``.venv/bin/python -m scripts.bench_store`` from the repository. For each engine it
measures

* **commit latency**: 500 entries appended one after another, each awaited (one commit
  each: what a lone message costs before it is acknowledged), median and p99;
* **group commit**: 20,000 entries submitted at once, then awaited (how fast a burst of
  agent output is stored, and in how many commits).

SQLite runs in a temporary folder (``synchronous=FULL``, as the daemon runs it).
PostgreSQL runs on ``--url`` if given, else on a throwaway server started here the way the
tests start theirs (``scripts/_postgres.py``; Debian's binaries, ``fsync=off``: a test server,
so its commit figure is a lower bound). Prints a table, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from supervisor.store.store import open_store

LATENCY_WRITES = 500
BURST_WRITES = 20_000


async def measure(where: str) -> dict[str, Any]:
    """The figures of one store."""
    async with open_store(where) as store:
        latencies = []
        for i in range(LATENCY_WRITES):
            began = time.perf_counter()
            await store.append("bench", "agent:x", "message", f"line {i}")
            latencies.append(time.perf_counter() - began)
        before = store.commits
        began = time.perf_counter()
        pendings = [store.submit_entry("burst", "agent:x", "status", f"line {i}") for i in range(BURST_WRITES)]
        for pending in pendings:
            await pending.committed()
        burst = time.perf_counter() - began
        latencies.sort()
        return {
            "commit_median_ms": round(statistics.median(latencies) * 1000, 3),
            "commit_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
            "burst_entries_per_s": round(BURST_WRITES / burst),
            "burst_commits": store.commits - before,
        }


def main() -> int:
    """Measure both engines; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a PostgreSQL database to use (else a throwaway server is started)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as folder:
        results["sqlite"] = trio.run(measure, str(Path(folder) / "corral.db"))
    server = None
    url: str | None = args.url
    if url is None:
        from scripts._postgres import PostgresServer, missing

        reason = missing()
        if reason is not None:
            print(f"PostgreSQL skipped: {reason}", file=sys.stderr)
        else:
            server = PostgresServer()
            url = server.new_database()
    try:
        if url is not None:
            results["postgresql"] = trio.run(measure, url)
    finally:
        if server is not None:
            server.close()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{'engine':<12}{'commit median ms':>18}{'commit p99 ms':>15}{'burst entries/s':>17}{'burst commits':>15}")
    for engine, r in results.items():
        print(f"{engine:<12}{r['commit_median_ms']:>18}{r['commit_p99_ms']:>15}{r['burst_entries_per_s']:>17}"
              f"{r['burst_commits']:>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
