"""``python -m tests.sdkagents``: install the pinned SDKs (if missing) and say where.

``python -m tests.sdkagents stop [N]``: also time N stops (default 5) of the SDK agents, and
print the median and how they ended:

* through corral's ACP driver, mid-tool (the TypeScript agent) or on a silent stream (the
  Python one), with the production ``acp_cancel_grace`` (3 s): the cancel, its
  acknowledgement, the kill of what the turn started;
* through a supervisor (sandboxed, as by default), ``sup.stop`` mid-tool of the TypeScript
  agent, and during the start-up of the Python agent (its ``initialize`` held).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from . import PY_SDK, TS_EXAMPLES, TS_SDK, launch, python_sdk, ts_sdk

#: A tool with a ``setsid`` grandchild; ``{pid}`` is the file its child's pid goes to.
TOOL = "setsid sleep 3001 </dev/null >/dev/null 2>&1 & sleep 3000 & echo $! > {pid}; wait"


async def _until_file(path: Path) -> None:
    with trio.fail_after(60):
        while not (path.exists() and path.read_text().strip()):
            await trio.sleep(0.01)


async def _drain(stream: AsyncIterator[Any]) -> None:
    async for _ in stream:
        pass


async def _driver_stop(kind: str, tmp: str, n: int) -> tuple[float, str]:
    from supervisor.turns.agents import open_acp_agent

    pid_file = Path(tmp) / f"pid{n}"
    log = Path(tmp) / f"log{n}"
    prompt = f"[[tool:{TOOL.format(pid=pid_file)}]]" if kind == "ts" else "[[silent]]"
    async with open_acp_agent(launch(kind, tmp, {"SDK_AGENT_LOG": str(log)}),
                              marker=f"acp-sdk-bench-{os.getpid()}-{n}") as agent:
        stream = agent.prompt(prompt)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, stream)
            await _until_file(pid_file if kind == "ts" else log)
            if kind == "py":
                with trio.fail_after(60):
                    while "session/prompt" not in log.read_text():
                        await trio.sleep(0.01)
            report = await agent.cancel(3.0)
    return report.dead_after, report.ended


async def _supervised_stop(what: str, tmp: str, n: int) -> tuple[float, str]:
    from supervisor import open_supervisor
    from supervisor.config.settings import parse_config

    folder = Path(tmp) / f"s{n}"
    folder.mkdir()
    pid_file, log, hold = folder / "pid", folder / "methods.log", folder / "hold"
    kind = "ts" if what == "mid-tool" else "py"
    agent = launch(kind, str(folder), {"SDK_AGENT_LOG": str(log), "SDK_AGENT_HOLD": str(hold)})
    table = {"adapter": "acp", "command": list(agent.argv), "env": dict(agent.env), "sandbox_write": [str(folder)]}
    config = parse_config({"server": {"socket": "corral.sock"}, "store": {"path": "corral.db"},
                           "agents": {"acp": table}}, file=str(folder / "corral.toml"), base=folder)
    if what == "start-up":
        hold.touch()
    async with open_supervisor(config) as sup:
        await sup.send("c", f"[[tool:{TOOL.format(pid=pid_file)}]]")
        await _until_file(pid_file if what == "mid-tool" else log)
        result = await sup.stop("c")
    return result.elapsed_ms / 1000, f"{result.ended} ({len(result.killed)} killed)"


async def _row(label: str, runs: list[tuple[float, str]]) -> None:
    times = [t for t, _ in runs]
    print(f"{label}: median {statistics.median(times):.3f} s (max {max(times):.3f} s) over {len(runs)}, "
          f"ended {sorted({e for _, e in runs})}")


async def _stops(trials: int) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        for kind in ("ts", "py"):
            runs = [await _driver_stop(kind, tmp, n + (100 if kind == "py" else 0)) for n in range(trials)]
            await _row(f"driver, {kind} SDK agent, {'mid-tool' if kind == 'ts' else 'silent stream'}", runs)
        for what in ("mid-tool", "start-up"):
            runs = [await _supervised_stop(what, tmp, n + (100 if what == "start-up" else 0)) for n in range(trials)]
            await _row(f"supervisor, {'ts' if what == 'mid-tool' else 'py'} SDK agent, {what}", runs)


print(f"{PY_SDK[0]} {PY_SDK[1]}: {python_sdk()}")
print(f"{TS_SDK[0]} {TS_SDK[1]}: {ts_sdk()}")
print(f"{TS_EXAMPLES[0]} {TS_EXAMPLES[1]} (its example agents): {ts_sdk(TS_EXAMPLES[1])}")
if sys.argv[1:2] == ["stop"]:
    trio.run(_stops, int(sys.argv[2]) if len(sys.argv) > 2 else 5)
