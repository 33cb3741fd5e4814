#!/usr/bin/env python
"""How fast a message steered to a running turn reaches the agent, against a direct-pipe floor.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_steer`` (``--runs N``,
default 20; ``--quick``: 5; ``--agent demo`` or ``--agent claude`` for one of them). It runs
one :func:`~supervisor.host.supervisor.open_supervisor` in a temporary folder and steers with
``Supervisor.send(..., delivery="steer")`` (what the API, the CLI and the bridges call; no HTTP
round trip is in the figures, the steered message's own commit is). Each run is a fresh
channel, so a fresh turn and process.

* **demo**: the bundled demo agent inside its ``long 600`` tool (its "tool running" status
  committed); time from the ``send`` call to the agent's ``steered: …`` line being read
  by the turn (its stdout line, before the store), and to that status entry being committed
  (what a follower sees). The channel is then stopped. **Floor**: the same agent started
  directly (``start_new_session``, a stdin pipe), the same line written with ``os.write``
  once its tool runs, time to its ``steered: …`` line read from its stdout.
* **claude**: Claude Code against the fake Anthropic server of ``scripts/fakemodel/``, its
  shell tool blocked reading a FIFO; time from the ``send`` call to the fake server
  receiving the first model request that carries the steered text. The FIFO is written right
  after ``send`` returns, so the tool ends and the CLI asks the model again (with the
  message, "The user sent a new message while you were working"). **Floor**: the same CLI
  started directly with its adapter's launch (argv, env, cwd), the same line written on its
  stdin, the FIFO written the same way.

Figures: median and p95 (ms), and each median as a ratio to the floor's median of the same run.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.testing

from adapters import claude as claude_adapter
from adapters import demo_agent
from adapters._base import TurnRequest
from scripts._bench import DEMO_AGENT, REPO, demo_env, pct, short_tmp
from scripts.fakemodel.anthropic import FakeAnthropicServer, agent_env
from scripts.fakemodel.clis import cli_path
from supervisor.config.settings import Config, parse_config
from supervisor.core.netpolicy import grant_for
from supervisor.host.supervisor import Supervisor, open_supervisor
from supervisor.procs.lines import Line
from supervisor.procs.tree import scrubbed_environment
from supervisor.turns.process import Turn

#: How long any one step may take before the run is called failed.
STEP_TIMEOUT = 120.0
#: The shell tool of the claude runs: say it runs, then block until the FIFO is written.
CLAUDE_TOOL = '#!/bin/sh\necho $$ > "$1"\nread line < "$2"\necho released\n'


class TimedServer(FakeAnthropicServer):
    """The fake Anthropic server, noting when a request first carries each steering mark."""

    MARK = re.compile(rb"steer-mark-[0-9a-z-]+")

    def __init__(self) -> None:
        super().__init__()
        self.first_seen: dict[str, float] = {}
        self._seen_lock = threading.Lock()

    def handle(self, req: Any, out: Any) -> None:
        """Note the arrival of each mark (before the answer), then answer as the fake does."""
        now = time.perf_counter()
        with self._seen_lock:
            for mark in self.MARK.findall(req.raw):
                self.first_seen.setdefault(mark.decode(), now)
        super().handle(req, out)

    def carried(self, mark: str) -> bool:
        """A request has carried ``mark``."""
        with self._seen_lock:
            return mark in self.first_seen


def tool_started(pidfile: Path) -> bool:
    """The claude runs' tool has written its pid: it runs, blocked on its FIFO."""
    return pidfile.exists() and pidfile.read_text().strip() != ""


def config(folder: Path, agents: dict[str, dict[str, Any]]) -> Config:
    """A supervisor config in ``folder``; every agent may write there (the FIFOs, the pid files)."""
    data = {
        "server": {"socket": "corral.sock"},
        "store": {"path": "corral.db"},
        "defaults": {"stop_grace": 3, "stall_timeout": 120, "turn_timeout": 300},
        "agents": {name: {"sandbox_write": [str(folder)], **table} for name, table in agents.items()},
    }
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for something outside the turn (a file, a request at the server): polled."""
    with trio.fail_after(STEP_TIMEOUT):
        while not predicate():
            await trio.sleep(0.002)


async def committed(sup: Supervisor, channel: str, match: Callable[[str, str], bool]) -> float:
    """When the first entry of ``channel`` that matches ``(kind, text)`` is committed (perf_counter)."""
    with trio.fail_after(STEP_TIMEOUT):
        async for entry in sup.follow(channel):
            if match(entry.kind, entry.text):
                return time.perf_counter()
    raise RuntimeError("the follow ended")


def watch_lines(turn: Turn, mark: bytes, seen: list[float]) -> None:
    """Note when the turn reads a stdout line carrying ``mark`` (wrapping its per-line step)."""
    feed = turn._feed

    def timed(line: Line) -> None:
        if mark in line.data and not seen:
            seen.append(time.perf_counter())
        feed(line)

    turn._feed = timed  # type: ignore[method-assign]


def running_turn(sup: Supervisor, channel: str, agent: str) -> Turn:
    """The channel's running turn of ``agent`` (a per-turn CLI's)."""
    turn = sup._lanes.turns[channel, agent]
    assert isinstance(turn, Turn)
    return turn


# ---------------------------------------------------------------- demo


async def demo_corral(folder: Path, runs: int) -> tuple[list[float], list[float]]:
    """(steer → line read by the turn, steer → status committed), ms per run."""
    read_ms: list[float] = []
    commit_ms: list[float] = []
    async with open_supervisor(config(folder, {"demo": {"adapter": "demo", "delay": 0.01}})) as sup:
        for i in range(runs):
            channel = f"demo-{i}"
            await sup.send(channel, "long 600")
            await committed(sup, channel, lambda kind, text: kind == "status" and text.startswith("tool running"))
            turn = running_turn(sup, channel, "demo")
            mark = f"steer-mark-demo-{i}"
            seen: list[float] = []
            watch_lines(turn, mark.encode(), seen)
            async with trio.open_nursery() as nursery:
                acked: list[float] = []

                async def follow(mark: str = mark, acked: list[float] = acked, channel: str = channel) -> None:
                    acked.append(await committed(sup, channel, lambda kind, text: kind == "status" and mark in text))

                nursery.start_soon(follow)
                await trio.testing.wait_all_tasks_blocked()  # (the follower is subscribed)
                t0 = time.perf_counter()
                accepted = await sup.send(channel, mark, delivery="steer")
                if accepted.delivery != "steer":
                    raise RuntimeError(f"the demo turn refused the steer: {accepted.fallback}")
            read_ms.append((seen[0] - t0) * 1000)
            commit_ms.append((acked[0] - t0) * 1000)
            result = await sup.stop(channel)
            if not result.ok:
                raise RuntimeError(f"the stop of {channel} failed: {result.error}")
    return read_ms, commit_ms


def demo_floor(folder: Path, runs: int) -> list[float]:
    """The demo agent started directly: one steer line on its stdin → its acknowledgment read."""
    times: list[float] = []
    for i in range(runs):
        home = folder / "direct" / str(i)
        env = demo_env(home)
        proc = subprocess.Popen([sys.executable, str(DEMO_AGENT), "--", "long 600"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env=env, cwd=home, start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            for line in proc.stdout:
                if b"tool running" in line:
                    break
            mark = f"steer-mark-floor-{i}".encode()
            t0 = time.perf_counter()
            os.write(proc.stdin.fileno(), demo_agent.steer_line(mark.decode()))
            for line in proc.stdout:
                if mark in line:
                    times.append((time.perf_counter() - t0) * 1000)
                    break
            # "enough" ends its tool and the setsid helper with it; the close ends the agent.
            os.write(proc.stdin.fileno(), demo_agent.steer_line("enough"))
            proc.stdin.close()
            proc.stdout.read()
            proc.wait(timeout=STEP_TIMEOUT)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return times


# ---------------------------------------------------------------- claude


def claude_prompt(folder: Path, tag: str) -> tuple[str, Path, Path]:
    """A prompt whose tool blocks on a fresh FIFO; (prompt, the tool's pid file, the FIFO)."""
    tool = folder / "steer-tool.sh"
    if not tool.exists():
        tool.write_text(CLAUDE_TOOL)
    started, fifo = folder / f"{tag}.started", folder / f"{tag}.fifo"
    os.mkfifo(fifo)
    return f"[[shell:sh {tool} {started} {fifo}]] [[say:tool done]] run the tool", started, fifo


def release(fifo: Path) -> None:
    """Let the tool blocked on ``fifo`` end (it is reading: the open does not block)."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)


async def claude_corral(folder: Path, server: TimedServer, runs: int) -> list[float]:
    """Steer call → the first model request carrying the message, ms per run."""
    times: list[float] = []
    agent = {"adapter": "claude", "command": [str(cli_path("claude"))], "env": agent_env(server.url),
             "network_allow": [grant_for(server.url)]}
    async with open_supervisor(config(folder, {"cli": agent})) as sup:
        for i in range(runs):
            channel = f"claude-{i}"
            prompt, started, fifo = claude_prompt(folder, channel)
            await sup.send(channel, prompt)
            await until(partial(tool_started, started), "the tool")
            turn = running_turn(sup, channel, "cli")
            mark = f"steer-mark-claude-{i}"
            t0 = time.perf_counter()
            accepted = await sup.send(channel, f"Also say {mark}.", delivery="steer")
            release(fifo)
            if accepted.delivery != "steer" or accepted.steered != turn.turn_id:
                raise RuntimeError(f"the claude turn refused the steer: {accepted.fallback}")
            await until(partial(server.carried, mark), "the request carrying it")
            times.append((server.first_seen[mark] - t0) * 1000)
            if not await sup.wait_idle(channel, timeout=STEP_TIMEOUT):
                raise RuntimeError(f"{channel}: the turn did not end")
    return times


def claude_floor(folder: Path, server: TimedServer, runs: int) -> list[float]:
    """Claude Code started directly with its adapter's launch; the same line on its stdin."""
    times: list[float] = []
    for i in range(runs):
        tag = f"direct-{i}"
        base = folder / tag
        home, cwd = base / "home", base / "work"
        (home / "tmp").mkdir(parents=True)
        cwd.mkdir()
        prompt, started, fifo = claude_prompt(folder, tag)
        request = TurnRequest(prompt=prompt, channel=tag, turn_id=tag, agent="cli",
                              command=(str(cli_path("claude")),), cwd=str(cwd), home=str(home))
        launch = claude_adapter.build_launch(request)
        env = scrubbed_environment(os.environ)
        env.setdefault("PATH", os.defpath)
        env.update({"HOME": str(home), "TMPDIR": str(home / "tmp"), **launch.env, **agent_env(server.url)})
        proc = subprocess.Popen(list(launch.argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env, cwd=launch.cwd, start_new_session=True)
        assert proc.stdin is not None and launch.stdin is not None
        try:
            os.write(proc.stdin.fileno(), launch.stdin)
            deadline = time.monotonic() + STEP_TIMEOUT
            while not tool_started(started):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"claude (direct) did not run its tool (exit {proc.poll()})")
                time.sleep(0.002)
            mark = f"steer-mark-floor-{i}"
            t0 = time.perf_counter()
            os.write(proc.stdin.fileno(), claude_adapter.user_message(f"Also say {mark}."))
            release(fifo)
            while mark not in server.first_seen:
                if time.monotonic() > deadline:
                    raise RuntimeError("claude (direct): no request carried the message")
                time.sleep(0.002)
            times.append((server.first_seen[mark] - t0) * 1000)
            proc.stdin.close()
            proc.wait(timeout=STEP_TIMEOUT)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return times


# ---------------------------------------------------------------- report


def line(name: str, values: list[float], floor: list[float] | None) -> str:
    """One row: median and p95, and the median as a ratio to the floor's."""
    median = statistics.median(values)
    ratio = f"  {median / statistics.median(floor):5.2f} x floor" if floor else ""
    return f"  {name:<50} median {median:8.1f}  p95 {pct(values, 0.95):8.1f} ms{ratio}"


def main() -> int:
    """Run the rows asked for and print them."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=None, help="runs per row (default 20; 5 with --quick)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--agent", choices=("demo", "claude"), action="append", help="default: both")
    args = parser.parse_args()
    runs = args.runs or (5 if args.quick else 20)
    agents = args.agent or ["demo", "claude"]
    root = short_tmp("cst-")
    print(f"steer benchmark: {runs} run(s) per row, {os.cpu_count()} CPU(s), in-process supervisor"
          f" (open_supervisor), Turn.steer called directly; repo {REPO}")
    try:
        if "demo" in agents:
            (root / "demo").mkdir()
            read_ms, commit_ms = trio.run(demo_corral, root / "demo", runs)
            floor = demo_floor(root / "demo", runs)
            print("demo agent, inside its long tool:")
            print(line("floor: os.write → its line read (direct)", floor, None))
            print(line("corral: send(steer) → its line read by the turn", read_ms, floor))
            print(line("corral: send(steer) → its status committed", commit_ms, floor))
        if "claude" in agents:
            (root / "claude").mkdir()
            server = TimedServer().start()
            try:
                corral_ms = trio.run(claude_corral, root / "claude", server, runs)
                floor = claude_floor(root / "claude", server, runs)
            finally:
                server.stop()
            print("claude (Claude Code, fake Anthropic server), its tool ended right after the steer:")
            print(line("floor: stdin line → request carrying it (direct)", floor, None))
            print(line("corral: send(steer) → request carrying it", corral_ms, floor))
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
