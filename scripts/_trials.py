"""The fleet chaos modes' trial loop and its summary, once (``_chaos_fleet``, ``_partition``).

A mode gives how to build its fleet on a throwaway PostgreSQL server and how to run one trial
(``trial(fleet, rng, i)`` returns the violations it found and what it drew); :func:`run` runs
the trials in order with one seeded random source, tallies the violations by kind, keeps the
first failures, closes the fleet and the server whatever happens, removes the folder unless a
trial failed (the daemons' logs are there), and answers the summary every mode prints.
"""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from scripts._bench import short_tmp


class Closable(Protocol):
    """A fleet: whatever it started ends on :meth:`close`."""

    def close(self) -> None:
        """End the fleet's daemons (by pid) and its connections."""


F = TypeVar("F", bound=Closable)


def run(
    mode: str,
    *,
    trials: int,
    seed: int,
    lease: float,
    hosts: int,
    fleet: Callable[[Any, Path, random.Random], F],
    trial: Callable[[F, random.Random, int], tuple[list[str], dict[str, Any]]],
    extra: Callable[[], dict[str, Any]] = dict,
    prefix: str,
    called: str,
) -> dict[str, Any]:
    """Run ``trials`` trials of ``mode`` on a fleet ``fleet(server, root, rng)`` builds, in a
    folder named ``prefix…``; the summary. ``called``: the mode's name where it cannot run.

    ``extra()`` adds the mode's own figures (taken once the trials are done) to the summary,
    between the violations and the failures."""
    from scripts._postgres import PostgresServer, missing

    reason = missing()
    if reason is not None:
        raise SystemExit(f"cannot run the {called} mode: {reason}")
    rng = random.Random(seed)
    server = PostgresServer()
    root = short_tmp(prefix)
    built: F | None = None
    by_kind: Counter[str] = Counter()
    failures: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        built = fleet(server, root, rng)
        for i in range(trials):
            bad, drawn = trial(built, rng, i)
            by_kind.update(bad)
            if bad:
                failures.append({**drawn, "violations": bad})
    finally:
        if built is not None:
            built.close()
        server.close()
    if not failures:
        shutil.rmtree(root, ignore_errors=True)  # (kept when a trial failed: the daemons' logs are there)
    return {
        "mode": mode, "trials": trials, "seed": seed, "lease_s": lease, "hosts": hosts,
        "violations": sum(by_kind.values()), "by_kind": dict(by_kind), **extra(),
        "failures": failures[:10], "seconds": round(time.monotonic() - started, 1),
    }
