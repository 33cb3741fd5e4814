#!/usr/bin/env python
"""How fast the ``corral`` CLI starts, as a ratio to a bare ``python -c pass``.

Run it as ``.venv/bin/python scripts/bench_cli_startup.py`` from the repository. It takes the
median wall time of 10 runs each of

* ``python -c pass`` (the reference: the interpreter's own start-up, site included),
* ``corral --version``,
* ``corral status`` against a running daemon (it starts one with the demo agent in a
  temporary folder, and shuts it down at the end),

and prints each with its ratio to the reference. Targets: ``--version`` at most 5 x,
``status`` at most 8 x. The exit status is 1 if a target is missed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"corral --version": 5.0, "corral status": 8.0}
DEMO_CONFIG = '[server]\nsocket = "corral.sock"\n[store]\npath = "corral.db"\n[agents.demo]\nadapter = "demo"\n'


def corral_command() -> list[str]:
    """The installed console script beside this Python (what a user runs), else ``-m``."""
    script = Path(sys.executable).parent / "corral"
    return [str(script)] if script.exists() else [sys.executable, "-m", "supervisor.cli"]


def median_wall(argv: list[str], env: dict[str, str], cwd: Path, runs: int) -> float:
    """Median wall time of ``runs`` runs of ``argv``, in seconds (each must exit 0)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per command (default 10)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="corral-bench-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "CORRAL_SOCKET": str(folder / "corral.sock")}
    corral = corral_command()
    (folder / "corral.toml").write_text(DEMO_CONFIG)
    daemon = subprocess.Popen(
        [*corral, "run", "-c", "corral.toml"], cwd=folder, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert daemon.stderr is not None
        for line in daemon.stderr:
            if "ready on" in line:
                break
        else:
            print("the daemon did not start", file=sys.stderr)
            return 1
        rows = {
            "python -c pass": median_wall([sys.executable, "-c", "pass"], env, folder, args.runs),
            "corral --version": median_wall([*corral, "--version"], env, folder, args.runs),
            "corral status": median_wall([*corral, "status"], env, folder, args.runs),
        }
    finally:
        subprocess.run([*corral, "shutdown"], check=False, env=env, cwd=folder,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(folder, ignore_errors=True)
    bare = rows["python -c pass"]
    missed = False
    print(f"median of {args.runs} wall times ({' '.join(corral)})")
    for name, seconds in rows.items():
        ratio = seconds / bare
        target = TARGETS.get(name)
        verdict = "" if target is None else f"  (target <= {target:g} x: {'ok' if ratio <= target else 'MISSED'})"
        missed |= target is not None and ratio > target
        print(f"  {name:<18} {seconds * 1000:7.1f} ms  {ratio:5.1f} x{verdict}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
