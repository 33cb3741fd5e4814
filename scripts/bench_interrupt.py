#!/usr/bin/env python
"""How fast a message that interrupts a running turn replaces it, against a plain stop in the same run.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_interrupt`` (``--rounds N``,
``--cli ''`` for the demo agent only). It embeds a supervisor (``open_supervisor``) in a temporary
folder; each round is a fresh channel whose turn is inside its tool (the demo agent's "tool
running" status; for claude, against the fake Anthropic server, the tool's pid files written).

* **floor, stop**: the same state stopped with ``Supervisor.stop``: the call to its return
  (the turn's processes are gone, and its notice stored, when it returns);
* **interrupt → processes gone**: the call to ``send(..., delivery="interrupt")`` to the
  interrupted turn's notice reaching a follower (the lane stores it once the turn's teardown is
  over: its processes are gone then; the bench checks that none is left at that moment);
* **interrupt → new turn started**: the same call to the spawn of the interrupting message's turn.

Figures are median / p95 in ms and the medians' ratio to the floor's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import trio

from scripts._bench import pct, server_tables, short_tmp
from scripts._config import toml
from scripts.bench_stop import CLI_STOP_GRACE, CLIS, cli_setup
from supervisor.config.settings import load_config, parse_config
from supervisor.core.results import INTERRUPT_NOTICE
from supervisor.host.supervisor import Supervisor, open_supervisor
from supervisor.procs.tree import TURN_MARKER
from supervisor.procs.tree import spawn as real_spawn
from supervisor.testing import Hooks, read_pid

#: How long a turn may take to reach its tool.
READY = 120.0


@dataclass
class Spawns:
    """``Hooks.spawn``: the real spawner, noting when each turn's process was spawned."""

    at: dict[str, float] = field(default_factory=dict)

    async def __call__(self, argv: tuple[str, ...], *, env: Any, **kw: Any) -> trio.Process:
        process = await real_spawn(argv, env=env, **kw)
        self.at[env[TURN_MARKER]] = time.perf_counter()
        return process


@dataclass
class Setup:
    """One agent: how to start a turn that reaches its tool, and how to know it did."""

    name: str
    config: Callable[[Path], Any]
    start: Callable[[Supervisor, str, Path], Any]
    """Send the long turn (its prompt may name a pid file in the folder)."""
    ready: Callable[[Supervisor, str, Path], Any]
    """Wait until the turn is inside its tool."""
    tool: Callable[[str, Path], list[int]]
    """The tool's pids (for the leftovers' check), if the agent writes them."""


async def _until(probe: Callable[[], Any], what: str) -> Any:
    with trio.fail_after(READY):
        while not (found := probe()):
            await trio.sleep(0.01)  # (polling a file the agent writes; not settling)
        return found


async def _follow_until(sup: Supervisor, channel: str, match: Callable[[Any], bool]) -> Any:
    with trio.fail_after(READY):
        async with aclosing(sup.follow(channel)) as entries:  # type: ignore[type-var]
            async for entry in entries:
                if match(entry):
                    return entry
    raise RuntimeError("the follow ended")


def demo() -> Setup:
    def config(folder: Path) -> Any:
        data = {"server": {"socket": "corral.sock"}, "store": {"path": "corral.db"},
                "defaults": {"stop_grace": 2}, "agents": {"demo": {"adapter": "demo", "delay": 0.01}}}
        return parse_config(data, file=str(folder / "corral.toml"), base=folder)

    async def start(sup: Supervisor, channel: str, folder: Path) -> None:
        await sup.send(channel, "please do a long task")

    async def ready(sup: Supervisor, channel: str, folder: Path) -> None:
        await _follow_until(sup, channel, lambda e: e.kind == "status" and "tool running" in e.text)

    return Setup("demo", config, start, ready, lambda channel, folder: [])


def tool_pids(pidfile: Path) -> list[int]:
    """The tool's long process and setsid grandchild (host pids), once it wrote both pid files."""
    try:
        return [read_pid(pidfile), read_pid(f"{pidfile}.setsid")]
    except (FileNotFoundError, IndexError, ValueError):
        return []  # (not written yet, or half-written)


@contextlib.contextmanager
def claude(folder: Path) -> Any:
    with cli_setup(CLIS["claude"], folder) as setup:
        def config(where: Path) -> Any:
            table = {"adapter": "claude", "command": list(setup.command), "env": setup.env, **setup.options,
                     "sandbox_write": [str(folder)]}
            text = toml({**server_tables(), "defaults": {"agent": "claude", "stop_grace": CLI_STOP_GRACE},
                         "agents.claude": table})
            (where / "corral.toml").write_text(text)
            return load_config(where / "corral.toml")

        async def start(sup: Supervisor, channel: str, where: Path) -> None:
            await sup.send(channel, setup.prompt(folder / f"{channel}.pid"))

        async def ready(sup: Supervisor, channel: str, where: Path) -> None:
            await _until(lambda: tool_pids(folder / f"{channel}.pid"), f"{channel}'s tool")

        yield Setup("claude", config, start, ready, lambda channel, where: tool_pids(folder / f"{channel}.pid"))


def _alive(pids: list[int]) -> list[int]:
    left = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
    return left


@asynccontextmanager
async def _supervisor(setup: Setup, folder: Path, spawns: Spawns) -> AsyncIterator[Supervisor]:
    async with open_supervisor(setup.config(folder), hooks=Hooks(spawn=spawns)) as sup:
        yield sup


async def measure(setup: Setup, folder: Path, rounds: int) -> dict[str, Any]:
    spawns = Spawns()
    floor: list[float] = []
    gone: list[float] = []
    started: list[float] = []
    left = 0
    async with _supervisor(setup, folder, spawns) as sup:
        for i in range(rounds):
            channel = f"stop-{i}"
            await setup.start(sup, channel, folder)
            await setup.ready(sup, channel, folder)
            t0 = time.perf_counter()
            result = await sup.stop(channel)
            floor.append((time.perf_counter() - t0) * 1000)
            assert result.ok, result.error

            channel = f"interrupt-{i}"
            await setup.start(sup, channel, folder)
            await setup.ready(sup, channel, folder)
            tool = setup.tool(channel, folder)
            first = sup._ledger.current_turn(channel)
            t0 = time.perf_counter()
            accepted = await sup.send(channel, "never mind, just say hello", delivery="interrupt")
            assert accepted.interrupted == (first,), accepted
            await _follow_until(sup, channel, lambda e: e.kind == "notice" and e.text.startswith(INTERRUPT_NOTICE))
            gone.append((time.perf_counter() - t0) * 1000)
            left += len(_alive(tool))
            second = await _until(_spawned_after(spawns, first, t0), "the new turn's spawn")
            started.append((spawns.at[second] - t0) * 1000)
            assert await sup.wait_idle(channel, timeout=READY)
    return {"floor": floor, "gone": gone, "started": started, "left": left}


def _spawned_after(spawns: Spawns, first: str | None, since: float) -> Callable[[], str | None]:
    """A probe: the first turn other than ``first`` spawned after ``since``."""
    return lambda: next((t for t, at in spawns.at.items() if t != first and at > since), None)


def _row(name: str, figures: dict[str, Any]) -> str:
    med = statistics.median
    floor = med(figures["floor"])
    return (f"{name:<7} stop (floor) {med(figures['floor']):7.1f} / {pct(figures['floor'], 0.95):7.1f} ms | "
            f"interrupt → gone {med(figures['gone']):7.1f} / {pct(figures['gone'], 0.95):7.1f} ms "
            f"({med(figures['gone']) / floor:.2f} x) | → new turn spawned {med(figures['started']):7.1f} / "
            f"{pct(figures['started'], 0.95):7.1f} ms ({med(figures['started']) / floor:.2f} x) | "
            f"left {figures['left']}")


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cli", default="claude", help="real CLIs to measure too ('' for none)")
    args = parser.parse_args(argv)
    print(f"interrupt vs stop, {args.rounds} rounds each, median / p95 (load {os.getloadavg()[0]:.1f})")
    folder = short_tmp("corral-bi-")
    try:
        (folder / "demo").mkdir()
        print(_row("demo", await measure(demo(), folder / "demo", args.rounds)), flush=True)
        if "claude" in args.cli.split(","):
            (folder / "claude").mkdir()
            with claude(folder / "claude") as setup:
                print(_row("claude", await measure(setup, folder / "claude", args.rounds)), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1:]))
