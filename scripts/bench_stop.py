#!/usr/bin/env python
"""How fast a Stop is, and what it leaves behind, against the bare ``killpg`` floor.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_stop`` (``--quick`` for a
small fast run). It starts its own ``corral run`` daemon in a temporary folder and stops it at the end; every
figure is taken through the daemon's control API with :class:`supervisor.serve.client.Client`
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
  timed per tree. The setsid grandchild survives that; it is counted, then killed by pid;
* **SIGINT-all floor** / **killpg-all floor**: the floors of a stop-all — every group sent
  SIGINT (what corral's stop sends first) or SIGKILL in one pass, then every leader waited.

Then **4 agents**: one channel whose 4 agents (the same agent configured four times) are
all inside their tool, stopped with one call, in ``--multi-rounds`` rounds (a fresh channel
each), against the **4-tree floor**: the same 4 trees started directly, every group
SIGKILLed in one pass and every leader waited (the killpg-all floor of 4, taken as many
times; the SIGINT-all floor of 4 is shown too). Target: the median stop within 2 x the
median floor + 10 ms, and 0 processes left.

The stop-one, stop-all and 4-agent rows run once per kill mechanism (``--mech``), each with its own
daemon: ``cgroup`` (a cgroup v2 per turn; skipped, saying why, where none is writable) and
``sweep`` (``[server] cgroup = "off"``). Each daemon row also shows corral's own CPU per
stopped turn (the stop result's ``cpu_ms``: ``time.process_time()`` of the daemon, all its
threads, from the call to the return) and the load average when the row ended. Two agents:
``demo`` (the bundled demo agent) and ``light`` (``sh`` with a ``sleep`` in its group and a
``setsid sleep``: the lightest tree, so what is measured is corral, not the agent).
``--spawn`` measures what spawning into a cgroup costs (the shell pre-exec step).

Then, for each real CLI (claude, codex, gemini, qwen, pi; ``--cli``), against its fake model
server of scripts/fakemodel/, each turn running a tool that starts a long process plus a setsid
grandchild and writes their pids (ready = both pid files written):

* **corral stop-one**: a ``corral run`` daemon with that CLI (stop_grace 3), N channels
  (``--cli-channels``, default 3; 1 with ``--quick``) stopped one call at a time: time from the
  call to its return, killed/swept counts, and the turn's processes still alive 1 s later
  (the tool's pids from the pid files, and the ``CORRAL_TURN`` marker);
* **SIGTERM group**: what most connectors do. The same CLI started directly with the launch
  its adapter builds (same argv, env, cwd, HOME files), in its own session; once its tool
  runs, ``os.killpg(pgid, SIGTERM)``, wait up to 5 s for the leader, then count what is alive
  1 s later (by the pid files and by a ``CORRAL_BENCH_TREE`` marker). All of it is then
  killed by pid;
* **SIGINT group** (the adapter's interrupt signal): the CLI's own stop, what corral sends
  first, with nothing after it: the same count of what it leaves.

The demo rows are skipped with ``--no-demo``. Adding a demo-like agent: write a ``*_setup``
context manager like :func:`demo_setup` and add it to ``SETUPS``; a real CLI goes in ``CLIS``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from adapters import claude as claude_adapter
from adapters import codex as codex_adapter
from adapters import gemini as gemini_adapter
from adapters import pi as pi_adapter
from adapters import qwen as qwen_adapter
from adapters._base import Adapter, TurnRequest
from scripts._bench import (
    DEMO_AGENT,
    DEMO_AGENT_TABLE,
    DIRECT_MARKER,
    MARKER,
    Daemon,
    Found,
    demo_env,
    kill_by_pid,
    marker_processes,
    pct,
    server_tables,
    short_tmp,
    spread,
    sweep_leftovers,
)
from scripts._config import toml
from scripts.fakemodel import anthropic, gemini_api, openai_chat, openai_responses
from scripts.fakemodel._http import FakeModelServer
from scripts.fakemodel.clis import cache_dir as cli_cache_dir
from scripts.fakemodel.clis import cli_path
from scripts.fakemodel.rig import SETSID_SLEEP, TOOL_SLEEP, write_tool_script
from supervisor.procs.cgroup import open_root
from supervisor.procs.sandbox import BASE_ARGS
from supervisor.procs.tree import scrubbed_environment
from supervisor.serve.client import Client
from supervisor.testing import read_pid

#: Targets, printed next to the figures.
STOP_ONE_FACTOR, STOP_ONE_SLACK_MS = 2.0, 10.0
STOP_ALL_200_MS = 100.0
#: Issue 11: cgroup stop-all of busy channels (the demo agent) within this many SIGINT-all
#: floors, of light trees within this many killpg-all floors (a bare SIGKILL-and-wait of the
#: same trees); corral's CPU per stopped turn under this.
STOP_ALL_FLOOR_FACTOR = 1.5
STOP_ALL_LIGHT_FACTOR = 2.0
CPU_PER_TURN_MS = 0.25
#: Issue 40's: the stop-all of 200 light trees' CPU per stopped turn.
CPU_PER_TURN_40_MS = 0.4
#: Issue 40: a sandboxed light tree's stop-one within this much of the bwrap killpg floor.
SANDBOX_STOP_SLACK_MS = 3.0
MECHS = ("cgroup", "sweep")
#: The multi-agent row (issue 10): agents of one channel, all mid-tool, stopped at once.
MULTI_AGENTS = 4
MULTI_ROUNDS, MULTI_ROUNDS_QUICK = 10, 5
READY_TIMEOUT = 180.0


# ---------------------------------------------------------------- what an agent row needs


@dataclass(frozen=True)
class AgentSetup:
    """Everything a row needs to know about one agent CLI."""

    label: str
    agent: str
    """The agent's name in the config."""
    agent_table: dict[str, Any]
    """Its ``[agents.NAME]`` table."""
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
    light: bool = False
    """The lightest tree: its stop-all target is against the killpg-all floor, not the SIGINT-all one."""


@contextlib.contextmanager
def demo_setup(folder: Path) -> Iterator[AgentSetup]:
    """The bundled demo agent: its tool is a same-group child plus a setsid grandchild."""
    yield AgentSetup(
        label="demo",
        agent="demo",
        agent_table=DEMO_AGENT_TABLE,
        prompt="long 120",
        ready_entry=lambda e: e["kind"] == "status" and "tool running" in e["text"],
        direct_argv=lambda prompt: [sys.executable, str(DEMO_AGENT), prompt],
        direct_env=demo_env,
        ready_line=lambda line: "tool running" in line,
    )


#: The light tree: a shell, a ``sleep`` in its group and a ``setsid sleep`` (its own session).
LIGHT_SCRIPT = 'sleep 600 & setsid sleep 600 & echo "tool running"; wait'


@contextlib.contextmanager
def light_setup(folder: Path) -> Iterator[AgentSetup]:
    """The lightest tree a turn can have: what a stop costs corral itself, not the agent."""
    argv = ["/bin/sh", "-c", LIGHT_SCRIPT, "sh"]
    yield AgentSetup(
        label="light",
        agent="light",
        agent_table={"adapter": "generic", "command": argv},
        prompt="go",
        ready_entry=lambda e: e["kind"] == "message" and "tool running" in e["text"],
        direct_argv=lambda prompt: [*argv, prompt],
        direct_env=demo_env,
        ready_line=lambda line: "tool running" in line,
        light=True,
    )


#: Rows to run, by name. A real CLI (claude, codex, gemini, qwen against the fake model
#: servers of scripts/fakemodel/) goes here as one more setup.
SETUPS: dict[str, Callable[[Path], contextlib.AbstractContextManager[AgentSetup]]] = {
    "demo": demo_setup, "light": light_setup,
}


def multi_agents(setup: AgentSetup) -> list[str]:
    """The agents of the multi-agent row: the setup's agent, then copies named ``AGENT-2`` ..."""
    return [setup.agent, *(f"{setup.agent}-{k}" for k in range(2, MULTI_AGENTS + 1))]


def config_text(setup: AgentSetup, mech: str = "sweep") -> str:
    """The daemon's config for one agent setup and kill mechanism (the agent, and its copies
    for the multi-agent row: a channel without a table admits every agent)."""
    # (max_turns: this benchmark measures up to 200 turns at once, whatever memory would
    # admit; the real CLIs' memory_estimate would derive a lower default on a small machine.)
    return toml({
        **server_tables(cgroup="auto" if mech == "cgroup" else "off", max_turns=1000),
        "defaults": {"stop_grace": 2, "agent": setup.agent},
        **{f"agents.{name}": setup.agent_table for name in multi_agents(setup)},
    })


def cgroup_missing() -> str | None:
    """Why the cgroup rows cannot run here; None if they can."""
    root = open_root("auto", f"bench-{os.getpid()}")
    if root is None:
        return "no writable cgroup v2 (see the daemon's log line 'kill mechanism')"
    root.close()
    return None


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
    left_detail: list[Found] = field(default_factory=list)
    killed: int = 0
    swept: int = 0
    errors: list[str] = field(default_factory=list)
    ready_ms: float = 0.0
    cpu_ms: list[float] = field(default_factory=list)
    """corral's own CPU per stopped turn, one figure per call (a stop-all's divided by its turns)."""
    kill: set[str] = field(default_factory=set)
    """The mechanisms the stop results named."""
    load: str = ""


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
    turns = len(result["stopped_turns"]) or 1
    row.cpu_ms.append(result.get("cpu_ms", 0.0) / turns)
    for r in result["channels"] if result.get("channels") is not None else [result]:
        if r.get("kill"):
            row.kill.add(r["kill"])
        row.killed += len(r["killed"])
        row.swept += len(r["swept"])
        if not r["ok"]:
            row.errors.append(f"{r['channel']}: {r['error']}")
        if not r["stopped_turns"]:
            row.errors.append(f"{r['channel']}: the stop found no turn to stop")


def row_stop_one(daemon: Daemon, setup: AgentSetup, n: int, tag: str, mech: str = "") -> StopRow:
    """``n`` channels in their tool; stop each in turn, one call at a time."""
    row = StopRow(f"stop-one {mech}".strip(), n)
    channels = [f"{tag}-{i}" for i in range(n)]
    row.ready_ms = start_and_wait_ready(daemon.socket, setup, channels)
    stop_one_by_one(daemon, row, channels)
    return row


def stop_one_by_one(
    daemon: Daemon, row: StopRow, channels: list[str], tool_pids_of: Callable[[str], Iterable[int]] = lambda c: ()
) -> None:
    """Stop ``channels`` in turn, one call at a time, and fill in ``row``.

    Per call: the client-side time, the daemon's own figures, and the processes of the
    stopped turn alive right when it returned (by the marker, plus any of the channel's
    ``tool_pids_of`` the scan missed); then the same for every stopped turn 1 s later.
    """
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
            marked = marker_processes(home, set(result["stopped_turns"]))
            row.alive_at_return += len(left_of(tool_pids_of(channel), marked))
    time.sleep(1.0)  # the figure asked for is "left after 1 s"
    row.left_detail = left_of([pid for c in channels for pid in tool_pids_of(c)], marker_processes(home, stopped))
    row.left_after_1s = len(row.left_detail)


def row_stop_all(daemon: Daemon, setup: AgentSetup, n: int, tag: str, mech: str = "") -> StopRow:
    """``n`` channels in their tool; one stop-all call."""
    row = StopRow(f"stop-all {mech}".strip(), n)
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


def row_multi_agent(daemon: Daemon, setup: AgentSetup, rounds: int, tag: str, mech: str = "") -> StopRow:
    """One channel, ``MULTI_AGENTS`` agents all in their tool; one stop call; ``rounds`` times."""
    row = StopRow(f"{MULTI_AGENTS}-agent {mech}".strip(), 1)
    agents = multi_agents(setup)
    home = str(daemon.folder)
    stopped: set[str] = set()
    with Client(str(daemon.socket)) as client:
        client.status()
        for r in range(rounds):
            channel = f"{tag}-{r}"
            started = time.perf_counter()
            client.send(channel, setup.prompt, to=agents)
            running: set[str] = set()
            with Client(str(daemon.socket)) as follower:
                for entry in follower.follow(channel):
                    if setup.ready_entry(entry):
                        running.add(entry["author"])
                        if len(running) == len(agents):
                            break
                    elif entry["kind"] in ("error", "notice"):
                        raise RuntimeError(f"{channel}: {entry['kind']}: {entry['text']}")
                else:
                    raise RuntimeError(f"{channel}: the stream ended before every agent's tool ran")
            row.ready_ms = max(row.ready_ms, (time.perf_counter() - started) * 1000)
            t0 = time.perf_counter()
            result = client.stop(channel)
            row.times_ms.append((time.perf_counter() - t0) * 1000)
            row.server_ms.append(result["elapsed_ms"])
            _account(row, result)
            turns = sorted(t["agent"] for t in result.get("turns", []))
            if turns != sorted(agents):
                row.errors.append(f"{channel}: the stop stopped the turns of {turns}, not of {sorted(agents)}")
            stopped.update(result["stopped_turns"])
            row.alive_at_return += len(marker_processes(home, set(result["stopped_turns"])))
    time.sleep(1.0)  # the figure asked for is "left after 1 s"
    row.left_detail = marker_processes(home, stopped)
    row.left_after_1s = len(row.left_detail)
    return row


def row_floor_rounds(folder: Path, setup: AgentSetup, n: int, tag: str, rounds: int, sig: int) -> StopRow:
    """:func:`row_floor_killpg` of ``n`` trees all at once, ``rounds`` times: one figure each."""
    total: StopRow | None = None
    for r in range(rounds):
        row = row_floor_killpg(folder, setup, n, f"{tag}{r}", all_at_once=True, sig=sig)
        if total is None:
            total = row
            continue
        total.times_ms += row.times_ms
        total.left_after_1s += row.left_after_1s
        total.left_detail += row.left_detail
        total.ready_ms = max(total.ready_ms, row.ready_ms)
    assert total is not None, "at least one round"
    total.what = f"{'SIGINT' if sig == signal.SIGINT else 'killpg'}-{n} floor"
    return total


def bench_multi(folder: Path, setup: AgentSetup, rounds: int, daemons: dict[str, Daemon], failures: list[str]) -> None:
    """The multi-agent row per mechanism, against the floor of the same trees (same run)."""
    n = MULTI_AGENTS
    print(f"  {n} agents in one channel, all in their tool, stopped with one call; {rounds} rounds"
          f" (a fresh channel each), against {n} trees started directly, all signalled in one pass:")
    floor = _loaded(row_floor_rounds(folder, setup, n, "mk", rounds, signal.SIGKILL))
    sigint = _loaded(row_floor_rounds(folder, setup, n, "mi", rounds, signal.SIGINT))
    for row in (floor, sigint):
        print_row(row)
    floor_med = statistics.median(floor.times_ms)
    target = STOP_ONE_FACTOR * floor_med + STOP_ONE_SLACK_MS
    for mech, daemon in daemons.items():
        row = _loaded(row_multi_agent(daemon, setup, rounds, f"m{n}", mech))
        print_row(row)
        med, p95 = statistics.median(row.times_ms), pct(row.times_ms, 0.95)
        left = row.alive_at_return + row.left_after_1s
        print(f"  {mech}: target {n}-agent stop <= {STOP_ONE_FACTOR:g} x the {n}-tree floor ({floor_med:.1f})"
              f" + {STOP_ONE_SLACK_MS:g} = {target:.1f} ms:"
              f" median {med:.1f} -> {'meets' if med <= target else 'MISSES'},"
              f" p95 {p95:.1f} -> {'meets' if p95 <= target else 'misses'};"
              f" SIGINT floor of {n} {statistics.median(sigint.times_ms):.1f} ms;"
              f" leftovers {left} -> {'meets' if left == 0 else 'MISSES'} (target 0)")
        if left:
            failures.append(f"{setup.label} {mech} {n}-agent: {left} leftover process(es)")
        failures += [f"{setup.label} {row.what}: {e}" for e in row.errors]


def kill_groups(procs: Iterable[subprocess.Popen[Any]]) -> None:
    """SIGKILL the group of every leader (started with ``start_new_session``) still running; reap it."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


#: The sandboxed floor's bwrap: corral's base sandbox (its namespaces, ``/dev``, ``/proc``, a
#: private ``/tmp``), without corral (no plan, no hidden folders, no cgroup, no daemon).
BWRAP_FLOOR = ("bwrap", *BASE_ARGS, "--tmpfs", "/tmp", "--die-with-parent", "--")


def pidfds(procs: Iterable[psutil.Process]) -> dict[int, int]:
    """A pidfd of each process still there, by fd (its pid the value)."""
    fds: dict[int, int] = {}
    for proc in procs:
        with contextlib.suppress(OSError):
            fds[os.pidfd_open(proc.pid)] = proc.pid
    return fds


def wait_pidfds(fds: dict[int, int], timeout: float) -> list[int]:
    """Wait until every pidfd's process has exited (a pidfd turns readable then: no polling
    loop, unlike ``psutil.wait_procs``, whose sleeps between checks were most of this floor);
    close them; the pids still alive at ``timeout``."""
    poll = select.poll()
    for fd in fds:
        poll.register(fd, select.POLLIN)
    left, deadline = set(fds), time.monotonic() + timeout
    try:
        while left and (wait := deadline - time.monotonic()) > 0:
            for fd, _ in poll.poll(wait * 1000):
                poll.unregister(fd)
                left.discard(fd)
        return sorted(fds[fd] for fd in left)
    finally:
        for fd in fds:
            os.close(fd)


def row_floor_killpg(
    folder: Path, setup: AgentSetup, n: int, tag: str, *, all_at_once: bool = False, sig: int = signal.SIGKILL,
    sandboxed: bool = False,
) -> StopRow:
    """The same trees started directly; ``os.killpg(pgid, SIGKILL)`` + wait of the leader, per tree.

    ``all_at_once``: the floor of a stop-all — every group signalled, then every leader waited.
    ``sig``: SIGINT for the ``SIGINT-all floor`` (what a stop sends first; the leaders must
    exit of it, as the demo agent and ``sh`` do). ``sandboxed``: each tree inside bwrap
    (:data:`BWRAP_FLOOR`), and the wait is for every process of it (bwrap, its init, the
    tree), as corral's stop waits for the whole tree: the floor of a sandboxed stop-one.
    """
    name = "SIGINT-all floor" if sig == signal.SIGINT else "killpg-all floor"
    row = StopRow(name if all_at_once else "bwrap killpg floor" if sandboxed else "killpg floor", n)
    home = folder / f"direct-{tag}"
    env = setup.direct_env(home)
    procs: list[subprocess.Popen[str]] = []
    started = time.perf_counter()
    errlog = (folder / f"direct-{tag}.stderr").open("w")
    try:
        for i in range(n):
            procs.append(subprocess.Popen(
                [*(BWRAP_FLOOR if sandboxed else ()), *setup.direct_argv(setup.prompt)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
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
            futures = [pool.submit(ready, p) for p in procs]
            for future in concurrent.futures.as_completed(futures, timeout=READY_TIMEOUT):
                future.result()
        row.ready_ms = (time.perf_counter() - started) * 1000
        if all_at_once:
            t0 = time.perf_counter()
            for proc in procs:
                os.killpg(proc.pid, sig)
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:  # (seen once under a load of 26: a shell that missed it)
                    row.errors.append(f"leader {proc.pid} was still running 30 s after the {signal.Signals(sig).name}")
            row.times_ms.append((time.perf_counter() - t0) * 1000)
        for proc in procs if not all_at_once else ():
            tree = pidfds(psutil.Process(proc.pid).children(recursive=True)) if sandboxed else {}
            t0 = time.perf_counter()
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if tree:  # (the setsid process outside the group dies with the namespace's init)
                alive = wait_pidfds(tree, timeout=10.0)
                row.errors += [f"{pid} of the sandboxed tree alive 10 s after the kill" for pid in alive]
            row.times_ms.append((time.perf_counter() - t0) * 1000)
    finally:
        kill_groups(procs)
        for proc in procs:
            if proc.stdout is not None:
                proc.stdout.close()
        time.sleep(1.0)  # same "after 1 s" as the daemon rows
        row.left_detail = marker_processes(str(home), variable=DIRECT_MARKER)
        row.left_after_1s = len(row.left_detail)
        kill_by_pid(row.left_detail)  # the setsid grandchildren killpg missed: ours, by pid
        errlog.close()
    return row


# ---------------------------------------------------------------- real CLIs

#: The corral stop grace of the CLI rows (as in tests/test_realcli.py).
CLI_STOP_GRACE = 3.0
#: How long the comparison row waits for the CLI to exit after its SIGTERM.
SIGTERM_WAIT = 5.0


@dataclass(frozen=True)
class CliSpec:
    """How to point one real CLI at its fake model server (as tests/test_realcli.py does)."""

    name: str
    adapter: Adapter
    server: Callable[[], FakeModelServer]
    env: Callable[[str], dict[str, str]]
    """The agent's ``env`` for the server's URL."""
    options: Callable[[str], dict[str, str]] = lambda url: {}
    """The agent's adapter options (``TurnRequest.options``) for the server's URL."""


CLIS: dict[str, CliSpec] = {
    "claude": CliSpec("claude", claude_adapter.ADAPTER, anthropic.FakeAnthropicServer, anthropic.agent_env),
    "codex": CliSpec("codex", codex_adapter.ADAPTER, openai_responses.OpenAIResponsesServer, openai_responses.agent_env,
                     openai_responses.agent_options),
    "gemini": CliSpec("gemini", gemini_adapter.ADAPTER, gemini_api.FakeGeminiServer, gemini_api.agent_env),
    "qwen": CliSpec("qwen", qwen_adapter.ADAPTER, openai_chat.OpenAIChatServer, openai_chat.agent_env),
    "pi": CliSpec("pi", pi_adapter.ADAPTER, openai_chat.PiChatServer, lambda url: dict(openai_chat.PI_ENV),
                  openai_chat.pi_options),
}


@dataclass(frozen=True)
class CliSetup:
    """One real CLI, its fake model server running, and the tool its turns run."""

    name: str
    adapter: Adapter
    command: tuple[str, ...]
    env: dict[str, str]
    options: dict[str, str]
    tool: Path
    folder: Path

    def prompt(self, pidfile: Path) -> str:
        """A prompt whose turn runs the tool, which writes its pids to ``pidfile``(``.setsid``)."""
        return f"[[shell:sh {self.tool} {pidfile}]] [[say:tool done]] run the tool"

    def config_text(self) -> str:
        """The daemon's config: this CLI as the only agent."""
        # The tool and its pid files live in the folder: granted, as a user grants a folder it
        # points an agent at (the sandbox shows a turn nothing else of /tmp).
        # And the fake model server's loopback address, which the default network refuses.
        from supervisor.core.netpolicy import configured_urls, grant_for, local_urls

        grants = [grant_for(url) for url in local_urls(configured_urls(self.env, self.options))]
        table = {"adapter": self.name, "command": list(self.command), "env": self.env, **self.options,
                 "sandbox_write": [str(self.folder)], "network_allow": grants}
        return toml({
            **server_tables(),
            "defaults": {"agent": self.name, "stop_grace": CLI_STOP_GRACE, "stall_timeout": 120, "turn_timeout": 300},
            f"agents.{self.name}": table,
        })


@contextlib.contextmanager
def cli_setup(spec: CliSpec, folder: Path) -> Iterator[CliSetup]:
    """Start the CLI's fake model server and write the tool script; stop the server after."""
    tool = write_tool_script(folder)  # the tool tests/test_realcli.py runs
    server = spec.server().start()
    try:
        yield CliSetup(spec.name, spec.adapter, (str(cli_path(spec.name)),), spec.env(server.url),
                       spec.options(server.url), tool, folder)
    finally:
        server.stop()


def tool_pids(pidfile: Path) -> tuple[int, int] | None:
    """(long process, setsid grandchild) once the tool wrote both pid files, else None.

    The pids are host pids: a sandboxed tool writes ``PID NAMESPACE`` (``read_pid`` maps it).
    """
    setsid = Path(f"{pidfile}.setsid")
    try:
        if not pidfile.read_text().strip() or not setsid.read_text().strip():
            return None
        return read_pid(pidfile), read_pid(setsid)
    except (FileNotFoundError, ValueError, LookupError):
        return None


def alive_tool(pid: int) -> str | None:
    """The command line of ``pid`` if it is still one of the tool's sleeps (not a zombie)."""
    try:
        proc = psutil.Process(pid)
        cmd = " ".join(proc.cmdline())
        sleeps = ("sleep 300", "/usr/bin/sleep 300", "/bin/sleep 300")
        if proc.status() == psutil.STATUS_ZOMBIE or not cmd.startswith(sleeps):
            return None
        return cmd
    except psutil.Error:
        return None


def left_of(pids: Iterable[int], found: list[Found]) -> list[Found]:
    """The marker scan plus any of the tool's ``pids`` still alive that it missed."""
    seen = {pid for pid, _, _ in found}
    extra = [(pid, "pidfile", cmd) for pid in pids if pid not in seen and (cmd := alive_tool(pid))]
    return found + extra


def row_cli_corral(daemon: Daemon, setup: CliSetup, n: int, tag: str) -> StopRow:
    """``n`` channels of the CLI in their tool (pid files written); stop each in turn."""
    row = StopRow("corral stop-one", n)
    channels = [f"{tag}-{i}" for i in range(n)]
    pidfiles = {c: setup.folder / f"{c}.pid" for c in channels}
    started = time.perf_counter()
    with Client(str(daemon.socket)) as client:
        for channel in channels:
            client.send(channel, setup.prompt(pidfiles[channel]), agent=setup.name)
        pending, deadline, next_check = set(channels), time.monotonic() + READY_TIMEOUT, 0.0
        while pending:
            pending = {c for c in pending if tool_pids(pidfiles[c]) is None}
            if not pending:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{setup.name}: the tool did not start in {sorted(pending)} within {READY_TIMEOUT:g} s")
            if time.monotonic() > next_check:  # a turn that ended without running the tool
                next_check = time.monotonic() + 1.0
                for c in pending:
                    if client.wait(c, timeout=0):
                        tail = [(e["kind"], e["text"][:120]) for e in client.entries(c)[-4:]]
                        raise RuntimeError(f"{setup.name} {c}: the turn ended before its tool ran: {tail}")
            time.sleep(0.05)
    row.ready_ms = (time.perf_counter() - started) * 1000
    # The pid files stay in place after the stop, so each channel's tool pids can be read then.
    stop_one_by_one(daemon, row, channels, lambda c: tool_pids(pidfiles[c]) or ())
    return row


@dataclass
class TermRow:
    """The figures of the "a signal to the CLI's group alone" comparisons (SIGTERM, or the
    adapter's interrupt signal: the CLI's own exit on a stop, without corral's kill)."""

    trees: int
    sig: signal.Signals = signal.SIGTERM
    exit_ms: list[float] = field(default_factory=list)
    """SIGTERM until the leader was reaped, for the leaders that exited within the wait."""
    returncodes: list[int] = field(default_factory=list)
    still_running: int = 0
    """Leaders still running ``SIGTERM_WAIT`` after the signal."""
    tool_pids_alive: int = 0
    tool_pids_total: int = 0
    left_detail: list[Found] = field(default_factory=list)
    ready_ms: float = 0.0
    cleaned: int = 0


def row_cli_sigterm(setup: CliSetup, n: int, tag: str, sig: signal.Signals = signal.SIGTERM) -> TermRow:
    """The CLI started directly with its adapter's launch; ``sig`` to its group, then count."""
    row = TermRow(n, sig)
    base = setup.folder / f"direct-{tag}"
    home = base / "home"
    procs: list[subprocess.Popen[bytes]] = []
    pidfiles: list[Path] = []
    logs = []
    started = time.perf_counter()
    try:
        for i in range(n):
            cwd = base / "work" / str(i)
            cwd.mkdir(parents=True)
            pidfile = base / f"{i}.pid"
            pidfiles.append(pidfile)
            request = TurnRequest(
                prompt=setup.prompt(pidfile), channel=f"{tag}-{i}", turn_id=f"{tag}-{i}", agent=setup.name,
                command=setup.command, cwd=str(cwd), home=str(home), options=setup.options,
            )
            launch = setup.adapter.build_launch(request)
            (home / "tmp").mkdir(parents=True, exist_ok=True)
            for rel, content in launch.files.items():  # as the supervisor writes them
                path = Path(rel) if os.path.isabs(rel) else home / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content, encoding="utf-8")
            # The supervisor's environment, with this script's marker instead of CORRAL_TURN.
            env = scrubbed_environment(os.environ)
            env.setdefault("PATH", os.defpath)
            env.update({"HOME": str(home), "TMPDIR": str(home / "tmp")})
            env.update(launch.env)
            env.update(setup.env)
            env[DIRECT_MARKER] = f"term-{tag}-{i}"
            log = (base / f"{i}.out").open("wb")
            logs.append(log)
            proc = subprocess.Popen(
                list(launch.argv), stdin=subprocess.DEVNULL if launch.stdin is None else subprocess.PIPE,
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=launch.cwd, start_new_session=True)
            if launch.stdin is not None:  # the adapter passes the prompt on stdin
                assert proc.stdin is not None
                proc.stdin.write(launch.stdin)
                proc.stdin.close()
            procs.append(proc)
        deadline = time.monotonic() + READY_TIMEOUT
        while not all(tool_pids(p) for p in pidfiles):
            for proc, pidfile in zip(procs, pidfiles, strict=True):
                if proc.poll() is not None and tool_pids(pidfile) is None:
                    out = (base / f"{procs.index(proc)}.out").read_text(errors="replace")[-400:]
                    raise RuntimeError(
                        f"{setup.name} pid {proc.pid} exited {proc.returncode} before its tool ran: {out!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{setup.name}: the directly started tools did not start within {READY_TIMEOUT:g} s")
            time.sleep(0.05)
        row.ready_ms = (time.perf_counter() - started) * 1000
        pids = [pid for p in pidfiles for pid in tool_pids(p) or ()]
        row.tool_pids_total = len(pids)
        for proc in procs:
            t0 = time.perf_counter()
            os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=SIGTERM_WAIT)
                row.exit_ms.append((time.perf_counter() - t0) * 1000)
                row.returncodes.append(proc.returncode)
            except subprocess.TimeoutExpired:
                row.still_running += 1
        time.sleep(1.0)  # "alive after 1 s", after the last leader's wait
        row.tool_pids_alive = sum(1 for pid in pids if alive_tool(pid))
        row.left_detail = left_of(pids, marker_processes(str(base), variable=DIRECT_MARKER))
    finally:
        # Clean up what SIGTERM left: the groups, then every marked process and tool pid, by pid.
        kill_groups(procs)
        leftover = marker_processes(str(base), variable=DIRECT_MARKER)
        row.cleaned = kill_by_pid(left_of([pid for p in pidfiles for pid in tool_pids(p) or ()], leftover))
        for log in logs:
            log.close()
    return row


def kind_of(cmd: str) -> str:
    """A short name for a leftover process's command line."""
    if "time.sleep" in cmd and "import time" in cmd:
        return "setsid helper"
    if SETSID_SLEEP in cmd:
        return "setsid grandchild"
    if TOOL_SLEEP in cmd:
        return "tool's long process"
    words = cmd.split()
    return (os.path.basename(words[0]) if words else "?")[:30]


def kinds_text(found: list[Found]) -> str:
    """`` (2 setsid grandchild, 1 node)`` or ''."""
    kinds: dict[str, int] = {}
    for _, _, cmd in found:
        kinds[kind_of(cmd)] = kinds.get(kind_of(cmd), 0) + 1
    return f" ({', '.join(f'{v} {k}' for k, v in kinds.items())})" if kinds else ""


def print_term_row(row: TermRow) -> None:
    """The comparison row, human-readable."""
    exits = (f"leader exited in median {statistics.median(row.exit_ms):.0f} / max {max(row.exit_ms):.0f} ms"
             if row.exit_ms else "no leader exited")
    print(f"  {row.sig.name + ' group':<15} {row.trees:>3} ch: {exits}, rc {sorted(set(row.returncodes))};"
          f" still running after {SIGTERM_WAIT:g} s: {row.still_running}")
    print(f"  {'':<15} {'':>3}     alive after 1 s: tool pids {row.tool_pids_alive}/{row.tool_pids_total},"
          f" marked processes {len(row.left_detail)}{kinds_text(row.left_detail)};"
          f" killed by pid afterwards: {row.cleaned};"
          f" ready in {row.ready_ms:.0f} ms")


def missing_cli(name: str) -> str | None:
    """Why the real-CLI rows of ``name`` cannot run here, or None when they can."""
    try:
        path = cli_path(name)
    except FileNotFoundError:
        return (f"not installed under {cli_cache_dir()}"
                " (scripts/install-clis.sh installs it; needs Node.js >= 20 and npm)")
    if shutil.which("node") is None:
        return f"installed at {path}, but Node.js (node) is not on PATH"
    return None


def run_cli(name: str, root: Path, n: int, failures: list[str]) -> None:
    """Both rows of one real CLI, one fake model server."""
    folder = root / name
    folder.mkdir()
    with cli_setup(CLIS[name], folder) as setup:
        request = TurnRequest("PROMPT", "c", "t", name, (name,), home="HOME", options=setup.options)
        sample = setup.adapter.build_launch(request)
        print(f"\n[{name}] {' '.join(sample.argv)}"
              f"  (interrupt {setup.adapter.interrupt_signal.name}, grace {CLI_STOP_GRACE:g} s)")
        daemon = Daemon(folder, setup.config_text())
        try:
            one = row_cli_corral(daemon, setup, n, "c")
            print_row(one)
        finally:
            code = daemon.stop()
            if code != 0:
                failures.append(f"{name}: the daemon exited with status {code}")
        failures += [f"{name} corral: {e}" for e in one.errors]
        if one.left_after_1s:
            failures.append(f"{name} corral: {one.left_after_1s} leftover process(es) after 1 s: {one.left_detail[:4]}")
        term = row_cli_sigterm(setup, n, "t")
        print_term_row(term)
        # The CLI's own stop: its interrupt signal (what corral sends first), and nothing after.
        own = row_cli_sigterm(setup, n, "i", setup.adapter.interrupt_signal)
        print_term_row(own)
        print(f"  corral leftovers after 1 s: {one.left_after_1s}"
              f" -> {'meets' if one.left_after_1s == 0 else 'MISSES'} (target 0;"
              f" alive at return {one.alive_at_return}); SIGTERM to the group alone left {len(term.left_detail)},"
              f" the CLI's own {own.sig.name} exit left {len(own.left_detail)}")


# ---------------------------------------------------------------- main


def print_row(row: StopRow) -> None:
    """One row, human-readable."""
    print(f"  {row.what:<15} {row.channels:>3} ch: {spread(row.times_ms)}"
          + (f"   (daemon's own: {spread(row.server_ms)})" if row.server_ms else ""))
    daemon = not row.what.endswith("floor")
    extra = f"killed {row.killed}, swept {row.swept}, " if daemon else ""
    at_return = f"alive at return {row.alive_at_return}, " if daemon else ""
    left = f"left after 1 s {row.left_after_1s}" + kinds_text(row.left_detail)
    print(f"  {'':<15} {'':>3}     {extra}{at_return}{left}; all trees ready in {row.ready_ms:.0f} ms; load {row.load}")
    if row.cpu_ms:
        print(f"  {'':<15} {'':>3}     corral CPU per stopped turn: median {statistics.median(row.cpu_ms):.3f} ms,"
              f" max {max(row.cpu_ms):.3f} ms; kill {', '.join(sorted(row.kill)) or 'none'}")
    for e in row.errors[:5]:
        print(f"  {'':<15}     ERROR: {e}")


def _loaded(row: StopRow) -> StopRow:
    row.load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    return row


def bench_size(folder: Path, setup: AgentSetup, n: int, daemons: dict[str, Daemon], failures: list[str]) -> None:
    """The rows of one channel count: the floors, then stop-one and stop-all per mechanism."""
    floor = _loaded(row_floor_killpg(folder, setup, n, f"f{n}"))
    sigint_all = _loaded(row_floor_killpg(folder, setup, n, f"i{n}", all_at_once=True, sig=signal.SIGINT))
    kill_all = _loaded(row_floor_killpg(folder, setup, n, f"g{n}", all_at_once=True))
    # The sandboxed stop-one's floor: the same tree in bwrap, killed and waited for (light trees,
    # up to 50 of them: it is a per-tree figure).
    sandbox_floor = _loaded(row_floor_killpg(folder, setup, min(n, 50), f"b{n}", sandboxed=True)) \
        if setup.light and shutil.which("bwrap") else None
    for row in (floor, sigint_all, kill_all, *([sandbox_floor] if sandbox_floor else [])):
        print_row(row)
    print(f"  (the floors are floors, not competitors: they end the groups only and wait for the leaders;"
          f" left alive after 1 s: SIGINT-all {sigint_all.left_after_1s}, killpg-all {kill_all.left_after_1s}"
          " — setsid processes, and background jobs that ignore SIGINT — where corral's stops must leave 0)")
    for mech, daemon in daemons.items():
        one = _loaded(row_stop_one(daemon, setup, n, f"o{n}", mech))
        every = _loaded(row_stop_all(daemon, setup, n, f"a{n}", mech))
        for row in (one, every):
            print_row(row)
        floor_med = statistics.median(floor.times_ms)
        target = STOP_ONE_FACTOR * floor_med + STOP_ONE_SLACK_MS
        one_med, one_p95 = statistics.median(one.times_ms), pct(one.times_ms, 0.95)
        print(f"  {mech}: target stop-one <= {STOP_ONE_FACTOR:g} x floor ({floor_med:.1f})"
              f" + {STOP_ONE_SLACK_MS:g} = {target:.1f} ms:"
              f" median {one_med:.1f} -> {'meets' if one_med <= target else 'MISSES'},"
              f" p95 {one_p95:.1f} -> {'meets' if one_p95 <= target else 'misses'}")
        if sandbox_floor is not None and sandbox_floor.times_ms:
            bwrap_med = statistics.median(sandbox_floor.times_ms)
            print(f"  {mech}: target stop-one (sandboxed) <= the bwrap killpg floor ({bwrap_med:.1f}) +"
                  f" {SANDBOX_STOP_SLACK_MS:g} ms: median {one_med:.1f} ({one_med - bwrap_med:+.1f}) ->"
                  f" {'meets' if one_med <= bwrap_med + SANDBOX_STOP_SLACK_MS else 'MISSES'}")
        t, sigint_floor, kill_floor = every.times_ms[0], sigint_all.times_ms[0], kill_all.times_ms[0]
        factor, floor_name, target_floor = (
            (STOP_ALL_LIGHT_FACTOR, "killpg-all", kill_floor) if setup.light
            else (STOP_ALL_FLOOR_FACTOR, "SIGINT-all", sigint_floor)
        )
        within = t <= factor * target_floor
        print(f"  {mech}: stop-all of {n} = {t:.1f} ms = {t / sigint_floor:.2f} x the SIGINT-all floor"
              f" ({sigint_floor:.1f} ms), {t / kill_floor:.2f} x the killpg-all floor ({kill_floor:.1f} ms)"
              + (f"; target <= {factor:g} x the {floor_name} floor -> {'meets' if within else 'MISSES'}"
                 if mech == "cgroup" and n >= 50 else ""))
        cpu = statistics.median(every.cpu_ms)
        print(f"  {mech}: corral CPU per stopped turn (stop-all): {cpu:.3f} ms; target < {CPU_PER_TURN_MS:g} ->"
              f" {'meets' if cpu < CPU_PER_TURN_MS else 'MISSES'}; issue 40's <= {CPU_PER_TURN_40_MS:g} ->"
              f" {'meets' if cpu <= CPU_PER_TURN_40_MS else 'MISSES'}")
        if n == 200:
            print(f"  {mech}: target stop-all of 200 <= {STOP_ALL_200_MS:g} ms:"
                  f" {t:.1f} -> {'meets' if t <= STOP_ALL_200_MS else 'MISSES'}")
        left = one.left_after_1s + every.left_after_1s + one.alive_at_return + every.alive_at_return
        print(f"  {mech}: target zero leftovers (daemon rows): {left} -> {'meets' if left == 0 else 'MISSES'};"
              f" the bare killpg floor left {floor.left_after_1s} (killed by pid afterwards)")
        if left:
            failures.append(f"{setup.label} {mech} {n}: {left} leftover process(es)")
        for row in (one, every):
            failures += [f"{setup.label} {row.what} {n}: {e}" for e in row.errors]


def bench_spawn(rounds: int = 200) -> int:
    """Spawn latency of ``/bin/true`` (spawn until exit) with and without the cgroup step."""
    import trio

    from supervisor.procs.tree import spawn

    root = open_root("auto", f"bench-{os.getpid()}")
    if root is None:
        print("no writable cgroup v2: nothing to compare")
        return 1

    async def one(cgroup: Any) -> float:
        t0 = time.perf_counter()
        proc = await spawn(("true",), env={"PATH": os.defpath}, cwd="/", stdin_pipe=False, **cgroup)
        await proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()
        return (time.perf_counter() - t0) * 1000

    async def run() -> None:
        plain: list[float] = []
        inside: list[float] = []
        for i in range(rounds):
            plain.append(await one({}))
            cg = root.create(f"s{i}")
            inside.append(await one({"cgroup": cg}))
            cg.remove()
        load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
        print(f"spawn of /bin/true until exit, {rounds} rounds, load {load}:")
        print(f"  plain          {spread(plain)}")
        print(f"  into a cgroup  {spread(inside)}")
        print(f"  the pre-exec step costs {statistics.median(inside) - statistics.median(plain):.2f} ms (median)")

    try:
        trio.run(run)
    finally:
        root.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="demo rows at 1 and 10 channels, one channel per CLI")
    parser.add_argument("--setup", choices=sorted(SETUPS), action="append",
                        help="which demo-like agent rows (default: all)")
    parser.add_argument("--no-demo", action="store_true", help="skip the demo agent rows")
    parser.add_argument("--cli", default=",".join(CLIS),
                        help="comma list of real CLIs to run ('' for none; default: %(default)s)")
    parser.add_argument("--cli-channels", type=int, default=None, help="channels per CLI (default 3; 1 with --quick)")
    parser.add_argument("--mech", choices=MECHS, action="append",
                        help="kill mechanisms of the daemon rows (default: both)")
    parser.add_argument("--sizes", help="comma list of channel counts (default 1,50,200; 1,10 with --quick)")
    parser.add_argument("--multi-rounds", type=int, default=None,
                        help=f"rounds of the {MULTI_AGENTS}-agent row (default {MULTI_ROUNDS};"
                        f" {MULTI_ROUNDS_QUICK} with --quick; 0 skips it)")
    parser.add_argument("--spawn", action="store_true", help="only measure the spawn latency with and without a cgroup")
    args = parser.parse_args()
    if args.spawn:
        return bench_spawn()
    sizes = tuple(int(x) for x in args.sizes.split(",")) if args.sizes else (1, 10) if args.quick else (1, 50, 200)
    mechs = list(args.mech or MECHS)
    multi_rounds = args.multi_rounds if args.multi_rounds is not None else (
        MULTI_ROUNDS_QUICK if args.quick else MULTI_ROUNDS)
    if "cgroup" in mechs and (why := cgroup_missing()) is not None:
        print(f"skipping the cgroup rows: {why}")
        mechs.remove("cgroup")
    clis = [c.strip() for c in args.cli.split(",") if c.strip()]
    unknown = [c for c in clis if c not in CLIS]
    if unknown:
        parser.error(f"unknown CLI(s) {unknown}; known: {', '.join(CLIS)}")
    cli_channels = args.cli_channels or (1 if args.quick else 3)
    # Without the agent CLIs (or Node.js) the demo rows still run; the CLI rows say why not.
    skipped = {name: why for name in clis if (why := missing_cli(name)) is not None}
    clis = [name for name in clis if name not in skipped]
    for name, why in skipped.items():
        print(f"skipping the {name} rows: {why}")
    root = short_tmp("cs-")
    failures: list[str] = []
    print(f"stop benchmark ({'quick' if args.quick else 'full'}), {os.cpu_count()} CPU(s);"
          " daemon: `corral run` subprocess;")
    print("every daemon figure is the client-side time of supervisor.serve.client.Client.stop(),"
          " HTTP round trip over the Unix socket included")
    if clis:
        print(f"real-CLI rows ({', '.join(clis)}; {cli_channels} channel(s) each;"
              " fake model servers on 127.0.0.1), each turn's tool"
              f" = `{TOOL_SLEEP}` + a setsid `{SETSID_SLEEP}`, ready once both pid files exist:\n"
              "  corral stop-one = Client.stop(channel) one at a time on a `corral run` daemon"
              f" (stop_grace {CLI_STOP_GRACE:g});"
              " left after 1 s = tool pids alive + CORRAL_TURN-marked processes\n"
              "  SIGTERM group   = the CLI started directly (its adapter's argv/env/cwd/HOME files),"
              " os.killpg(pgid, SIGTERM),"
              f" leader waited up to {SIGTERM_WAIT:g} s, then what is alive 1 s later (what most connectors do)")
    try:
        for name in [] if args.no_demo else args.setup or list(SETUPS):
            folder = root / name
            folder.mkdir()
            with SETUPS[name](folder) as setup:
                print(f"\n[{setup.label}] prompt {setup.prompt!r};"
                      " ready = its 'tool running' entry (tree: agent, tool child, setsid grandchild)")
                daemons: dict[str, Daemon] = {}
                try:
                    for mech in mechs:
                        (folder / mech).mkdir()
                        daemons[mech] = Daemon(folder / mech, config_text(setup, mech))
                    for n in sizes:
                        bench_size(folder, setup, n, daemons, failures)
                    if multi_rounds:
                        bench_multi(folder, setup, multi_rounds, daemons, failures)
                finally:
                    for daemon in daemons.values():
                        code = daemon.stop()
                        if code != 0:
                            failures.append(f"the daemon exited with status {code}")
        for name in clis:
            try:
                run_cli(name, root, cli_channels, failures)
            except RuntimeError as exc:  # one CLI failing to start its tool must not hide the others
                print(f"  ERROR: {exc}")
                failures.append(f"{name}: {exc}")
    finally:
        leftover = sweep_leftovers(str(root))
        if leftover:
            failures.append(f"{len(leftover)} process(es) left at the end: {leftover[:5]}")
        print(f"\nprocesses left at the end ({MARKER} / {DIRECT_MARKER} marker, HOME under {root}): {len(leftover)}")
        shutil.rmtree(root, ignore_errors=True)
    if skipped:
        print(f"skipped: the rows of {', '.join(skipped)} (not installed here; see above)")
    print("ACP agents (adapter = \"acp\": the typed cancel's acknowledgement, the tree dead, the stop through the"
          " daemon, the next prompt of a warm agent against a CLI started anew): python -m scripts.bench_acp")
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures[:20]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
