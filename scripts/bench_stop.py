#!/usr/bin/env python
"""How fast a Stop is, and what it leaves behind, against the bare ``killpg`` floor.

Run it as ``.venv/bin/python scripts/bench_stop.py`` (``--quick`` for a small fast run). It
starts its own ``corral run`` daemon in a temporary folder and stops it at the end; every
figure is taken through the daemon's control API with :class:`supervisor._client.Client`
(so each includes the HTTP round trip over the Unix socket).

For 1, 50 and 200 channels, each running the demo agent inside its tool (every channel's
"tool running" status entry seen first):

* **stop-one**: the channels stopped in turn, one call at a time; time from the call to its
  return (median/p95), plus the processes of that turn still alive right when it returned;
* **stop-all**: one call that stops them all;
* **left after 1 s**: processes of the stopped turns (setsid grandchildren included) found by
  the ``CORRAL_TURN`` marker one second after the last stop returned;
* **floor**: the same trees started directly (``start_new_session=True``, same prompt, until
  the "tool running" line), then a bare ``os.killpg(pgid, SIGKILL)`` + wait of the leader,
  timed per tree. The setsid grandchild survives that; it is counted, then killed by pid.

Then, for each real CLI (claude, codex, gemini, qwen; ``--cli``), against its fake model
server of tests/fakemodel/, each turn running a tool that starts a long process plus a setsid
grandchild and writes their pids (ready = both pid files written):

* **corral stop-one**: a ``corral run`` daemon with that CLI (stop_grace 3), N channels
  (``--cli-channels``, default 3; 1 with ``--quick``) stopped one call at a time: time from the
  call to its return, killed/swept counts, and the turn's processes still alive 1 s later
  (the tool's pids from the pid files, and the ``CORRAL_TURN`` marker);
* **SIGTERM group**: what most connectors do. The same CLI started directly with the launch
  its adapter builds (same argv, env, cwd, HOME files), in its own session; once its tool
  runs, ``os.killpg(pgid, SIGTERM)``, wait up to 5 s for the leader, then count what is alive
  1 s later (by the pid files and by a ``CORRAL_BENCH_TREE`` marker). All of it is then
  killed by pid.

The demo rows are skipped with ``--no-demo``. Adding a demo-like agent: write a ``*_setup``
context manager like :func:`demo_setup` and add it to ``SETUPS``; a real CLI goes in ``CLIS``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
# The fake model servers and the CLIs' install paths live with the tests.
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from adapters import claude as claude_adapter  # noqa: E402
from adapters import codex as codex_adapter  # noqa: E402
from adapters import gemini as gemini_adapter  # noqa: E402
from adapters import qwen as qwen_adapter  # noqa: E402
from adapters._base import Adapter, TurnRequest  # noqa: E402
from fakemodel import anthropic, gemini_api, openai_chat, openai_responses  # noqa: E402
from fakemodel._http import FakeModelServer  # noqa: E402
from fakemodel.clis import cli_path  # noqa: E402
from supervisor._client import Client  # noqa: E402
from supervisor._tree import scrubbed_environment  # noqa: E402
DEMO_AGENT = REPO / "adapters" / "demo_agent.py"
MARKER = "CORRAL_TURN"
#: The marker of trees this script starts directly. Not CORRAL_TURN on purpose: the test
#: suite's autouse fixture kills (and fails on) any new CORRAL_TURN process on the machine.
DIRECT_MARKER = "CORRAL_BENCH_TREE"
#: Targets, printed next to the figures.
STOP_ONE_FACTOR, STOP_ONE_SLACK_MS = 2.0, 10.0
STOP_ALL_200_MS = 150.0
READY_TIMEOUT = 180.0


# ---------------------------------------------------------------- the daemon and the scans


def corral_command() -> list[str]:
    """``corral`` from this virtualenv (or ``python -m supervisor.cli`` if not installed)."""
    exe = Path(sys.executable).with_name("corral")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "supervisor.cli"]


class Daemon:
    """A ``corral run -c FILE`` subprocess in its own session, ready once it logged so."""

    def __init__(self, folder: Path, config_text: str) -> None:
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
        self._drain = threading.Thread(target=self._copy_log, args=(log,), daemon=True)
        self._drain.start()

    def _copy_log(self, log: Any) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            log.write(line)
        log.close()

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


def marker_processes(
    home_prefix: str, markers: set[str] | None = None, variable: str = MARKER
) -> list[tuple[int, str, str]]:
    """Living processes with the turn marker (of ``markers``, or any) and HOME under ``home_prefix``.

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
        marker = next((e[len(key):].decode(errors="replace") for e in env if e.startswith(key)), None)
        if marker is None or (markers is not None and marker not in markers) or not any(e.startswith(home) for e in env):
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:100]
        except OSError:
            cmd = "?"
        found.append((int(name), marker, cmd))
    return found


def kill_by_pid(found: Iterable[tuple[int, str, str]]) -> int:
    """SIGKILL processes this script started (found by its own marker scan); wait; how many."""
    procs = []
    for pid, _, _ in found:
        try:
            proc = psutil.Process(pid)
            proc.kill()
            procs.append(proc)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)
    return len(procs)


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


# ---------------------------------------------------------------- what an agent row needs


@dataclass(frozen=True)
class AgentSetup:
    """Everything a row needs to know about one agent CLI."""

    label: str
    agent: str
    """The agent's name in the config."""
    agent_toml: str
    """Its ``[agents.NAME]`` table (and anything else the config needs)."""
    prompt: str
    """A prompt that makes it run a long tool."""
    ready_entry: Callable[[dict[str, Any]], bool]
    """True for the transcript entry that shows the tool tree exists."""
    direct_argv: Callable[[str], list[str]]
    """The command line to start it directly with a prompt (for the floor)."""
    direct_env: Callable[[Path], dict[str, str]]
    """Its environment when started directly, given a private HOME."""
    ready_line: Callable[[str], bool]
    """True for the stdout line that shows the tool tree exists, when run directly."""


@contextlib.contextmanager
def demo_setup(folder: Path) -> Iterator[AgentSetup]:
    """The bundled demo agent: its tool is a same-group child plus a setsid grandchild."""

    def env(home: Path) -> dict[str, str]:
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        return {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8"),
                "HOME": str(home), "TMPDIR": str(home / "tmp"), "DEMO_AGENT_DELAY": "0.01"}

    yield AgentSetup(
        label="demo",
        agent="demo",
        agent_toml='[agents.demo]\nadapter = "demo"\ndelay = 0.01\n',
        prompt="long 120",
        ready_entry=lambda e: e["kind"] == "status" and "tool running" in e["text"],
        direct_argv=lambda prompt: [sys.executable, str(DEMO_AGENT), prompt],
        direct_env=env,
        ready_line=lambda line: "tool running" in line,
    )


#: Rows to run, by name. A real CLI (claude, codex, gemini, qwen against the fake model
#: servers of tests/fakemodel/) goes here as one more setup.
SETUPS: dict[str, Callable[[Path], contextlib.AbstractContextManager[AgentSetup]]] = {"demo": demo_setup}


def config_text(setup: AgentSetup) -> str:
    """The daemon's config for one agent setup."""
    return (
        '[server]\nsocket = "corral.sock"\n[store]\npath = "corral.db"\n'
        f'[defaults]\nstop_grace = 2\nagent = "{setup.agent}"\n' + setup.agent_toml
    )


# ---------------------------------------------------------------- rows


@dataclass
class StopRow:
    """The figures of one row."""

    what: str
    channels: int
    times_ms: list[float] = field(default_factory=list)
    """Client side: the stop call until it returned (HTTP round trip included)."""
    server_ms: list[float] = field(default_factory=list)
    """The daemon's own ``elapsed_ms`` of each stop."""
    alive_at_return: int = 0
    left_after_1s: int = 0
    left_detail: list[tuple[int, str, str]] = field(default_factory=list)
    killed: int = 0
    swept: int = 0
    errors: list[str] = field(default_factory=list)
    ready_ms: float = 0.0


def start_and_wait_ready(socket: Path, setup: AgentSetup, channels: list[str]) -> float:
    """Send the setup's prompt to every channel, then follow each until its tool runs; ms."""
    started = time.perf_counter()
    with Client(str(socket)) as client:
        for channel in channels:
            client.send(channel, setup.prompt, agent=setup.agent)

    def follow(channel: str) -> None:
        with Client(str(socket)) as client:
            for entry in client.follow(channel):
                if setup.ready_entry(entry):
                    return
                if entry["kind"] in ("error", "notice"):
                    raise RuntimeError(f"{channel}: {entry['kind']}: {entry['text']}")
        raise RuntimeError(f"{channel}: the stream ended before the tool ran")

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(channels)) as pool:
        futures = [pool.submit(follow, c) for c in channels]
        for future in concurrent.futures.as_completed(futures, timeout=READY_TIMEOUT):
            future.result()
    return (time.perf_counter() - started) * 1000


def _account(row: StopRow, result: dict[str, Any]) -> None:
    for r in result["channels"] if result.get("channels") is not None else [result]:
        row.killed += len(r["killed"])
        row.swept += len(r["swept"])
        if not r["ok"]:
            row.errors.append(f"{r['channel']}: {r['error']}")
        if not r["stopped_turns"]:
            row.errors.append(f"{r['channel']}: the stop found no turn to stop")


def row_stop_one(daemon: Daemon, setup: AgentSetup, n: int, tag: str) -> StopRow:
    """``n`` channels in their tool; stop each in turn, one call at a time."""
    row = StopRow("stop-one", n)
    channels = [f"{tag}-{i}" for i in range(n)]
    row.ready_ms = start_and_wait_ready(daemon.socket, setup, channels)
    home = str(daemon.folder)
    stopped: set[str] = set()
    with Client(str(daemon.socket)) as client:
        client.status()  # open the connection first: the timed calls reuse it
        for channel in channels:
            t0 = time.perf_counter()
            result = client.stop(channel)
            row.times_ms.append((time.perf_counter() - t0) * 1000)
            row.server_ms.append(result["elapsed_ms"])
            _account(row, result)
            stopped.update(result["stopped_turns"])
            row.alive_at_return += len(marker_processes(home, set(result["stopped_turns"])))
    time.sleep(1.0)  # the figure asked for is "left after 1 s"
    row.left_detail = marker_processes(home, stopped)
    row.left_after_1s = len(row.left_detail)
    return row


def row_stop_all(daemon: Daemon, setup: AgentSetup, n: int, tag: str) -> StopRow:
    """``n`` channels in their tool; one stop-all call."""
    row = StopRow("stop-all", n)
    channels = [f"{tag}-{i}" for i in range(n)]
    row.ready_ms = start_and_wait_ready(daemon.socket, setup, channels)
    home = str(daemon.folder)
    with Client(str(daemon.socket)) as client:
        client.status()
        t0 = time.perf_counter()
        result = client.stop(None)
        row.times_ms.append((time.perf_counter() - t0) * 1000)
    row.server_ms.append(result["elapsed_ms"])
    _account(row, result)
    stopped = set(result["stopped_turns"])
    if sorted(r["channel"] for r in result["channels"]) != sorted(channels):
        row.errors.append(f"stop-all reported {len(result['channels'])} channel(s), expected {n}")
    row.alive_at_return = len(marker_processes(home, stopped))
    time.sleep(1.0)
    row.left_detail = marker_processes(home, stopped)
    row.left_after_1s = len(row.left_detail)
    return row


def row_floor_killpg(folder: Path, setup: AgentSetup, n: int, tag: str) -> StopRow:
    """The same trees started directly; ``os.killpg(pgid, SIGKILL)`` + wait of the leader, per tree."""
    row = StopRow("killpg floor", n)
    home = folder / f"direct-{tag}"
    env = setup.direct_env(home)
    procs: list[subprocess.Popen[str]] = []
    started = time.perf_counter()
    errlog = (folder / f"direct-{tag}.stderr").open("w")
    try:
        for i in range(n):
            procs.append(subprocess.Popen(
                setup.direct_argv(setup.prompt), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=errlog, env={**env, DIRECT_MARKER: f"floor-{tag}-{i}"}, cwd=str(home),
                text=True, start_new_session=True,
            ))

        def ready(proc: subprocess.Popen[str]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if setup.ready_line(line):
                    return
            raise RuntimeError(f"pid {proc.pid} ended before its tool ran (exit {proc.wait()}); see {errlog.name}")

        with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
            for future in concurrent.futures.as_completed([pool.submit(ready, p) for p in procs], timeout=READY_TIMEOUT):
                future.result()
        row.ready_ms = (time.perf_counter() - started) * 1000
        for proc in procs:
            t0 = time.perf_counter()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            row.times_ms.append((time.perf_counter() - t0) * 1000)
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        time.sleep(1.0)  # same "after 1 s" as the daemon rows
        row.left_detail = marker_processes(str(home), variable=DIRECT_MARKER)
        row.left_after_1s = len(row.left_detail)
        kill_by_pid(row.left_detail)  # the setsid grandchildren killpg missed: ours, by pid
        errlog.close()
    return row


# ---------------------------------------------------------------- main


def print_row(row: StopRow) -> None:
    """One row, human-readable."""
    print(f"  {row.what:<13} {row.channels:>3} ch: {spread(row.times_ms)}"
          + (f"   (daemon's own: {spread(row.server_ms)})" if row.server_ms else ""))
    extra = f"killed {row.killed}, swept {row.swept}, " if row.what != "killpg floor" else ""
    at_return = f"alive at return {row.alive_at_return}, " if row.what != "killpg floor" else ""
    kinds: dict[str, int] = {}
    for _, _, cmd in row.left_detail:
        kind = "setsid helper" if "time.sleep" in cmd and "import time" in cmd else cmd.split(" ")[-1][:30]
        kinds[kind] = kinds.get(kind, 0) + 1
    left = f"left after 1 s {row.left_after_1s}" + (f" ({', '.join(f'{v} {k}' for k, v in kinds.items())})" if kinds else "")
    print(f"  {'':<13} {'':>3}     {extra}{at_return}{left}; all trees ready in {row.ready_ms:.0f} ms")
    for e in row.errors[:5]:
        print(f"  {'':<13}     ERROR: {e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 and 10 channels only")
    parser.add_argument("--setup", choices=sorted(SETUPS), action="append", help="which agent rows (default: all)")
    args = parser.parse_args()
    sizes = (1, 10) if args.quick else (1, 50, 200)
    root = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    failures: list[str] = []
    foreign = ForeignTests()
    print(f"stop benchmark ({'quick' if args.quick else 'full'}), {os.cpu_count()} CPU(s); daemon: `corral run` subprocess;")
    print("every daemon figure is the client-side time of supervisor._client.Client.stop(), HTTP round trip over the Unix socket included")
    try:
        for name in args.setup or list(SETUPS):
            folder = root / name
            folder.mkdir()
            with SETUPS[name](folder) as setup:
                print(f"\n[{setup.label}] prompt {setup.prompt!r}; ready = its 'tool running' entry (tree: agent, tool child, setsid grandchild)")
                daemon = Daemon(folder, config_text(setup))
                rows: list[StopRow] = []
                try:
                    for n in sizes:
                        floor = row_floor_killpg(folder, setup, n, f"f{n}")
                        one = row_stop_one(daemon, setup, n, f"o{n}")
                        every = row_stop_all(daemon, setup, n, f"a{n}")
                        for row in (floor, one, every):
                            print_row(row)
                            rows.append(row)
                        floor_med = statistics.median(floor.times_ms)
                        target = STOP_ONE_FACTOR * floor_med + STOP_ONE_SLACK_MS
                        one_med, one_p95 = statistics.median(one.times_ms), pct(one.times_ms, 0.95)
                        print(f"  target stop-one <= {STOP_ONE_FACTOR:g} x floor ({floor_med:.1f}) + {STOP_ONE_SLACK_MS:g} = {target:.1f} ms:"
                              f" median {one_med:.1f} -> {'meets' if one_med <= target else 'MISSES'},"
                              f" p95 {one_p95:.1f} -> {'meets' if one_p95 <= target else 'misses'}")
                        if n == 200:
                            t = every.times_ms[0]
                            print(f"  target stop-all of 200 <= {STOP_ALL_200_MS:g} ms: {t:.1f} -> {'meets' if t <= STOP_ALL_200_MS else 'MISSES'}")
                        left = one.left_after_1s + every.left_after_1s + one.alive_at_return + every.alive_at_return
                        print(f"  target zero leftovers (daemon rows): {left} -> {'meets' if left == 0 else 'MISSES'};"
                              f" the bare killpg floor left {floor.left_after_1s} (killed by pid afterwards)")
                        if left:
                            failures.append(f"{setup.label} {n}: {left} leftover process(es)")
                        for row in (one, every):
                            failures += [f"{setup.label} {row.what} {n}: {e}" for e in row.errors]
                finally:
                    code = daemon.stop()
                    if code != 0:
                        failures.append(f"the daemon exited with status {code}")
    finally:
        left = marker_processes(str(root)) + marker_processes(str(root), variable=DIRECT_MARKER)
        if left:
            failures.append(f"{len(left)} process(es) left at the end: {left[:5]}")
            kill_by_pid(left)
        print(f"\nprocesses left at the end ({MARKER} / {DIRECT_MARKER} marker, HOME under {root}): {len(left)}")
        shutil.rmtree(root, ignore_errors=True)
        note = foreign.close()
        if note:
            print(note)
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures[:20]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
