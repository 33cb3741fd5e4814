"""``python -m tests.sdkagents``: install both pinned SDKs (if missing) and say where.

``python -m tests.sdkagents stop [N]``: also time N stops mid-tool (default 5) of each SDK
agent through corral's ACP driver — the cancel, its acknowledgement, the kill of what the
turn started — with the production ``acp_cancel_grace`` (3 s), and print how each ended.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import trio

from . import PY_SDK, TS_EXAMPLES, TS_SDK, launch, python_sdk, ts_sdk


async def _stops(kind: str, trials: int) -> None:
    from supervisor.turns.agents import open_acp_agent

    times, ends = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(trials):
            pid_file = Path(tmp) / f"pid{n}"
            tool = f"setsid sleep 3001 </dev/null >/dev/null 2>&1 & sleep 3000 & echo $! > {pid_file}; wait"
            prompt = f"[[tool:{tool}]]" if kind == "ts" else "[[silent]]"
            async with open_acp_agent(launch(kind, tmp), marker=f"acp-sdk-bench-{os.getpid()}-{n}") as agent:
                stream = agent.prompt(prompt)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_drain, stream)
                    with trio.fail_after(60):
                        while kind == "ts" and not (pid_file.exists() and pid_file.read_text().strip()):
                            await trio.sleep(0.01)
                        await trio.sleep(0.2 if kind == "py" else 0)
                    report = await agent.cancel(3.0)
                times.append(report.dead_after)
                ends.append(report.ended)
    print(f"{kind} SDK agent: stop median {statistics.median(times):.2f} s (max {max(times):.2f} s) over {trials}, "
          f"ended {sorted(set(ends))}")


async def _drain(stream: object) -> None:
    async for _ in stream:  # type: ignore[attr-defined]
        pass


print(f"{PY_SDK[0]} {PY_SDK[1]}: {python_sdk()}")
print(f"{TS_SDK[0]} {TS_SDK[1]}: {ts_sdk()}")
print(f"{TS_EXAMPLES[0]} {TS_EXAMPLES[1]} (its example agents): {ts_sdk(TS_EXAMPLES[1])}")
if sys.argv[1:2] == ["stop"]:
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    for kind in ("ts", "py"):
        trio.run(_stops, kind, trials)
