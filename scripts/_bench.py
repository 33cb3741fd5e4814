"""What the benchmark scripts share: a ``corral run`` daemon, the marker scans, the clean-up.

Imported as ``scripts._bench`` by the benchmarks, ``chaos_stop`` and ``faults``, each run
from the repository root as ``.venv/bin/python -m scripts.NAME``. Each script starts its own
daemon(s) in a temporary folder; every scan here
is scoped to processes whose HOME lies under that folder, so other corral instances on the
machine are never counted nor killed.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import IO, Any, Literal

import psutil

from scripts._config import toml

REPO = Path(__file__).resolve().parent.parent
DEMO_AGENT = REPO / "adapters" / "demo_agent.py"
#: The environment marker corral puts on every process of a turn (``CORRAL_TURN=<turn id>``).
MARKER = "CORRAL_TURN"
#: The marker of agent trees a script starts directly, without corral. Not ``CORRAL_TURN``:
#: they are no corral turns, and a marker of their own keeps each scan to its own kind.
DIRECT_MARKER = "CORRAL_BENCH_TREE"



def server_tables(**more: Any) -> dict[str, dict[str, Any]]:
    """The head of every daemon config (for :func:`scripts._config.toml`): the control socket
    and the store, inside the folder; ``more`` goes in ``[server]``."""
    return {"server": {"socket": "corral.sock", **more}, "store": {"path": "corral.db"}}


#: The head of every daemon config, as text.
SERVER_TOML = toml(server_tables())
#: The bundled demo agent's table (its delay kept short so a turn is quick).
DEMO_AGENT_TABLE: dict[str, Any] = {"adapter": "demo", "delay": 0.01}
#: A daemon with the demo agent only.
DEMO_CONFIG = toml({**server_tables(), "defaults": {"stop_grace": 2}, "agents.demo": DEMO_AGENT_TABLE})

#: One process a marker scan found: ``(pid, marker value, command line or cwd)``.
Found = tuple[int, str, str]


def corral_command() -> list[str]:
    """``corral`` from this virtualenv (or ``python -m supervisor.cli`` if not installed)."""
    exe = Path(sys.executable).with_name("corral")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "supervisor.cli"]


def short_tmp(prefix: str) -> Path:
    """A temporary folder with a short path: a Unix socket path must stay under 108 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def demo_env(home: Path) -> dict[str, str]:
    """The environment the supervisor would give the demo agent (scrubbed, private HOME)."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": str(home), "TMPDIR": str(home / "tmp"), "DEMO_AGENT_DELAY": "0.01",
    }


class Daemon:
    """A ``corral run -c FILE`` subprocess in its own session, ready once it logged so.

    Its stderr goes to ``folder/daemon.log``, appended to: a daemon restarted in the same
    folder keeps the log of the one before.
    """

    def __init__(self, folder: Path, config_text: str = DEMO_CONFIG, command: list[str] | None = None) -> None:
        """``command``: what runs ``corral`` (default :func:`corral_command`), for example a
        wrapper that instruments the daemon; ``run -c FILE`` is appended."""
        self.folder = folder
        self.socket = folder / "corral.sock"
        assert len(os.fsencode(self.socket)) < 108, self.socket
        (folder / "corral.toml").write_text(config_text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        self.proc = subprocess.Popen(
            [*(command or corral_command()), "run", "-c", str(folder / "corral.toml")],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self.log_path = folder / "daemon.log"
        log = self.log_path.open("a")
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

    def _copy_log(self, log: IO[str]) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            log.write(line)
            log.flush()  # a script may watch the log for a line as it comes
        log.close()

    @property
    def pid(self) -> int:
        """The daemon's pid."""
        return self.proc.pid

    def alive(self) -> bool:
        """Is the daemon process still running?"""
        return self.proc.poll() is None

    def stop(self) -> int:
        """SIGTERM and wait for the orderly shutdown (SIGKILL after 60 s); its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(timeout=5)
        return self.proc.returncode


def marker_processes(
    home_prefix: str | None,
    markers: Collection[str] | None = None,
    *,
    variable: str = MARKER,
    cwds: tuple[str, ...] = (),
    detail: Literal["cmdline", "cwd"] = "cmdline",
) -> list[Found]:
    """Living processes carrying ``variable`` whose HOME lies under ``home_prefix`` (None: any
    HOME or none, for a marker value no other program can carry).

    Of those, the ones whose marker value is in ``markers`` or whose cwd lies in one of
    ``cwds``; all of them if neither is given. The HOME scope keeps the scan to the script's
    own processes: other programs on the machine may run corral turns of their own.
    Returns ``(pid, marker value, detail)``, the detail being the first 100 characters of
    the command line or the cwd.
    """
    found = []
    me = os.getpid()
    key = f"{variable}=".encode()
    home = f"HOME={home_prefix}".encode() if home_prefix is not None else None
    need_cwd = bool(cwds) or detail == "cwd"
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            cwd = os.readlink(f"/proc/{name}/cwd") if need_cwd else ""
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if state == b"Z":
            continue
        marker = next((e[len(key):].decode(errors="replace") for e in env if e.startswith(key)), None)
        if marker is None or (home is not None and not any(e.startswith(home) for e in env)):
            continue
        wanted = (markers is None and not cwds) or (markers is not None and marker in markers)
        if not (wanted or any(cwd == c or cwd.startswith(c + "/") for c in cwds)):
            continue
        if detail == "cwd":
            found.append((int(name), marker, cwd))
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:100]
        except OSError:
            cmd = "?"
        found.append((int(name), marker, cmd))
    return found


def kill_by_pid(found: Iterable[Found], *, wait: float | None = 5.0) -> int:
    """SIGKILL processes the script started (found by its own marker scan); how many.

    ``wait``: seconds to wait for them to be gone, or None not to wait (from an event loop,
    which must not block).
    """
    procs = []
    for pid, _, _ in found:
        try:
            proc = psutil.Process(pid)
            proc.kill()
            procs.append(proc)
        except psutil.Error:
            pass
    if wait is not None:
        psutil.wait_procs(procs, timeout=wait)
    return len(procs)


def sweep_leftovers(
    home_prefix: str,
    variables: Iterable[str] = (MARKER, DIRECT_MARKER),
    *,
    detail: Literal["cmdline", "cwd"] = "cmdline",
) -> list[Found]:
    """The script's last check: every process still alive under ``home_prefix`` that carries
    one of the ``variables`` markers, killed by pid (and waited for). What it found, for the
    report."""
    left = [found for v in variables for found in marker_processes(home_prefix, variable=v, detail=detail)]
    if left:
        kill_by_pid(left)
    return left


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def spread(values: list[float]) -> str:
    """median / p95 / max in ms ("n/a" if there are none)."""
    if not values:
        return "n/a"
    return f"median {statistics.median(values):7.1f}  p95 {pct(values, 0.95):7.1f}  max {max(values):7.1f} ms"
