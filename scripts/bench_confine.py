#!/usr/bin/env python
"""What the kernel hardening costs a spawn (:mod:`supervisor.procs.confine`): before and after,
in one process, round by round, so the machine's load falls on both alike.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_confine`` (``--rounds N``,
default 200; ``--bwrap PATH``, default the one on PATH). Four rows, spawn of ``/bin/echo`` to its
first byte of output:

* **before, plain**: ``trio.lowlevel.open_process`` as the spawn was (no sandbox);
* **after, plain**: :func:`supervisor.procs.tree.spawn` (its child in a session keyring of its own);
* **before, sandboxed**: bwrap with the same view, its options on the command line, no filter,
  no ``--disable-userns``, no ``/proc/keys`` cover;
* **after, sandboxed**: the spawn a turn gets (options and filter in memfds, all of the above).

No target of its own: the sandbox's budget (+5 ms over a plain spawn, ``scripts.bench_sandbox``)
includes it; this says which share of it the hardening is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable
from pathlib import Path

import trio

from scripts._bench import short_tmp, spread
from supervisor.procs.sandbox import Private, Sandbox, Support, TurnGrants, probe
from supervisor.procs.tree import spawn

ECHO = ("/bin/echo", "hi")


async def first_output(started: Awaitable[trio.Process]) -> float:
    t0 = time.perf_counter()
    process = await started
    assert process.stdout is not None
    await process.stdout.receive_some(1)
    took = (time.perf_counter() - t0) * 1000
    await process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            await stream.aclose()
    return took


def bench(folder: Path, bwrap: str, rounds: int) -> dict[str, list[float]]:
    """The four rows (see the module docstring), ``rounds`` spawns each, alternating."""
    support = probe(bwrap)
    if not support.available:
        raise SystemExit(f"no sandbox with {bwrap}: {'; '.join(support.missing)}")
    grants = TurnGrants("a", cwd=str(folder), home=str(folder))
    hardened = Sandbox("required", support, Private()).prefix(grants)
    bare = Sandbox("required", Support(bwrap, version=support.version), Private()).prefix(grants)
    env = {"PATH": os.defpath}
    rows: dict[str, list[float]] = {"before, plain": [], "after, plain": [], "before, sandboxed": [],
                                    "after, sandboxed": []}

    def old(words: tuple[str, ...]) -> Awaitable[trio.Process]:
        return trio.lowlevel.open_process([*words, *ECHO], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          cwd=str(folder), env=env, start_new_session=True)

    async def run() -> None:
        for i in range(rounds + 5):  # 5 warm-up rounds, not counted
            took = [
                await first_output(old(())),
                await first_output(spawn(ECHO, env=env, cwd=str(folder), stdin_pipe=False)),
                await first_output(old(bare)),
                await first_output(spawn(ECHO, env=env, cwd=str(folder), stdin_pipe=False, sandbox=hardened)),
            ]
            if i >= 5:
                for row, ms in zip(rows.values(), took, strict=True):
                    row.append(ms)

    trio.run(run)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="spawns of each kind (default 200)")
    parser.add_argument("--bwrap", default=shutil.which("bwrap"), help="the bwrap to measure (default: on PATH)")
    args = parser.parse_args()
    if args.bwrap is None:
        raise SystemExit("no bwrap on PATH: name one with --bwrap")
    folder = short_tmp("corral-bconf-")
    try:
        rows = bench(folder, args.bwrap, args.rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    print(f"spawn to first output of /bin/echo, {args.rounds} rounds each, alternating, {args.bwrap} "
          f"({probe(args.bwrap).version}), load {load}:")
    for name, row in rows.items():
        print(f"  {name:20s} {spread(row)}")
    before = statistics.median(rows["before, sandboxed"])
    added = statistics.median(rows["after, sandboxed"]) - before
    keyring = statistics.median(rows["after, plain"]) - statistics.median(rows["before, plain"])
    print(f"  the hardening adds {added:.2f} ms ({100 * added / before:.0f} %) to the sandboxed median; "
          f"the session keyring {keyring:.2f} ms to the plain one")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
