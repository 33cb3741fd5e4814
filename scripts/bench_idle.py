"""Wake-ups of an idle `corral run`: outside systemd, with NOTIFY_SOCKET, and with a watchdog.

Counts the event-loop thread's voluntary context switches over 10 s of idleness (after
the start-up threads have gone): outside systemd and with only NOTIFY_SOCKET it should be
0 (no timer runs), with WATCHDOG_USEC=2 s one ping a second. Run from the repository root:
    python -m scripts.bench_idle
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts._config import toml

ROOT = Path(__file__).resolve().parent.parent
#: trio's idle worker threads exit after 10 s; wait past that before counting.
SETTLE = 12.0
IDLE = 10.0


def _switches(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))


def measure(label: str, *, notify: bool, watchdog_usec: int | None) -> None:
    """Start a daemon, let it go idle, print its wake-ups over ``IDLE`` seconds."""
    folder = Path(tempfile.mkdtemp(prefix="corral-idle-", dir="/tmp"))
    listener = None
    try:
        (folder / "corral.toml").write_text(toml({"agents.demo": {"adapter": "demo"}}))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if notify:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            listener.bind(str(folder / "notify"))
            env["NOTIFY_SOCKET"] = str(folder / "notify")
        if watchdog_usec is not None:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "run", "-c", "corral.toml"],
            cwd=folder, env=env, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if "ready on" in line:
                    break
            time.sleep(SETTLE)
            before = _switches(proc.pid)
            time.sleep(IDLE)
            print(f"{label:<20} event-loop wake-ups in {IDLE:g} s idle: {_switches(proc.pid) - before}")
        finally:
            proc.terminate()
            proc.wait(60)
    finally:
        if listener is not None:
            listener.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    measure("outside systemd", notify=False, watchdog_usec=None)
    measure("NOTIFY_SOCKET", notify=True, watchdog_usec=None)
    measure("WATCHDOG_USEC=2 s", notify=True, watchdog_usec=2_000_000)
