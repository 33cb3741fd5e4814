"""How fast an ACP stop is, and what a persistent agent process saves, per real ACP agent.

``python -m scripts.bench_acp [--runs N] [AGENT ...]`` runs each agent offline against its
fake model server through corral's ACP driver and prints, per agent:

* **cancel mid-tool**: a prompt whose tool runs ``sleep`` plus a ``setsid sleep`` grandchild;
  once both run, ``cancel()``: the time to the typed acknowledgement (the prompt answered
  ``cancelled``) and to every process of the turn confirmed dead (median and max of N);
* **next prompt**: the time from ``prompt()`` to the end of a one-line answer in the running
  agent (persistent), against a fresh agent process that starts, loads the session and
  answers (what starting the CLI anew for each message costs) — and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from adapters.acp import PromptEnded
from supervisor._acp import AcpAgent, PromptStream, open_acp_agent
from tests.fakemodel.acp_agents import ACP_AGENTS, AcpAgentSpec
from tests.fakemodel.rig import write_tool_script

BOUND = 120.0


async def _answer(agent: AcpAgent, text: str) -> float:
    """Seconds from ``prompt`` to its PromptEnded."""
    start = time.perf_counter()
    with trio.fail_after(BOUND):
        async for event in agent.prompt(text):
            if isinstance(event, PromptEnded):
                break
    return time.perf_counter() - start


async def bench(spec: AcpAgentSpec, runs: int) -> dict[str, list[float]]:
    """Every figure of one agent, ``runs`` times each."""
    figures: dict[str, list[float]] = {"ack": [], "dead": [], "persistent": [], "fresh": []}
    server = spec.server().start()
    try:
        with tempfile.TemporaryDirectory(prefix="acp-bench-") as root:
            work, home = Path(root, "work"), str(Path(root, "home"))
            work.mkdir()
            tool = write_tool_script(Path(root))
            launch = spec.launch(server.url, str(work), home)
            marker = f"acp-bench-{spec.name}"
            async with open_acp_agent(
                launch, marker=marker, home=home, restart_after_cancel=spec.restart_after_cancel, start_timeout=BOUND
            ) as agent:
                await _answer(agent, "[[say:warm]] Warm up.")
                for i in range(runs):
                    pid = Path(root, f"pid{i}")
                    stream = agent.prompt(f"[[shell:sh {tool} {pid}]] [[say:never]] Run the tool.")
                    async with trio.open_nursery() as nursery:

                        async def drain(events: PromptStream) -> None:
                            async for _ in events:
                                pass

                        nursery.start_soon(drain, stream)
                        with trio.fail_after(BOUND):
                            while not pid.exists() or not pid.read_text().strip():
                                await trio.sleep(0.02)
                        report = await agent.cancel()
                    if report.acknowledged_after is not None:
                        figures["ack"].append(report.acknowledged_after)
                    figures["dead"].append(report.dead_after)
                    await agent.ensure_running()
                for _ in range(runs):
                    figures["persistent"].append(await _answer(agent, "[[say:ok]] Quick one."))
                session = agent.session_id
            for _ in range(runs):
                start = time.perf_counter()
                async with open_acp_agent(
                    launch, marker=marker, home=home, saved_session=session, start_timeout=BOUND
                ) as fresh:
                    await _answer(fresh, "[[say:ok]] Quick one.")
                    figures["fresh"].append(time.perf_counter() - start)
    finally:
        server.stop()
    return figures


def _fmt(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values) * 1000:7.0f} ms (max {max(values) * 1000:.0f})"


def main() -> int:
    """Run the agents named on the command line (default: all) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("agents", nargs="*", default=sorted(ACP_AGENTS))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"{'agent':8} {'cancel ack':>24} {'tree dead':>24} {'next prompt':>24} {'fresh CLI':>24} {'ratio':>6}")
    for name in args.agents:
        f = trio.run(bench, ACP_AGENTS[name], args.runs)
        ratio = statistics.median(f["fresh"]) / statistics.median(f["persistent"])
        cells = [_fmt(f[key]) for key in ("ack", "dead", "persistent", "fresh")]
        print(f"{name:8} " + " ".join(f"{cell:>24}" for cell in cells) + f" {ratio:5.1f}x")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
