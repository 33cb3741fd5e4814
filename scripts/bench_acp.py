"""How fast an ACP stop is, and what a persistent agent process saves, per real ACP agent.

``python -m scripts.bench_acp [--runs N] [AGENT ...]`` runs each agent offline against its
fake model server through corral's ACP driver and prints, per agent:

* **cancel mid-tool**: a prompt whose tool runs ``sleep`` plus a ``setsid sleep`` grandchild;
  once both run, ``cancel()``: the time to the typed acknowledgement (the prompt answered
  ``cancelled``), what the agent's own cancel left running (**own left**: the processes corral
  killed after the acknowledgement, most of N) and the time to every process of the turn
  confirmed dead (median and max of N);
* **next prompt**: the time from ``prompt()`` to the end of a one-line answer in the running
  agent (persistent), against a fresh agent process that starts, loads the session and
  answers (what starting the CLI anew for each message costs) — and their ratio.

Then, through a real ``corral run`` daemon with the agent as ``adapter = "acp"`` (its preset,
``acp_cancel_grace`` 3 s; ``--no-daemon`` skips these rows):

* **daemon stop-one mid-tool**: N channels, each in the tool (pid files written), stopped one
  call at a time: the time from ``Client.stop`` to its return, how the prompt ``ended``
  (``cancelled``: the agent acknowledged the typed cancel) and the tool's processes still
  alive when it returned;
* **daemon next prompt**: ``send`` to the end of the turn (``wait``) of a one-line answer in
  a channel whose agent process is warm, against the same message to the agent's *native*
  adapter (``adapter = "claude" | "codex" | "gemini" | "qwen"``: the CLI started anew for the
  turn, resuming its session), each timed to the model's request carrying the message (the
  follow-up has started) and to the turn's end — the ratio is what the persistent process
  saves. opencode has no native adapter here (the driver's fresh-process row stands in).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import trio

from adapters.acp import PromptEnded
from scripts._bench import Daemon, server_tables, short_tmp
from scripts._config import toml
from scripts.fakemodel._http import FakeModelServer
from scripts.fakemodel.acp_agents import ACP_AGENTS, AcpAgentSpec, daemon_table
from scripts.fakemodel.rig import write_tool_script
from supervisor.serve.client import Client
from supervisor.testing import read_pid
from supervisor.turns.agents import AcpAgent, PromptStream, open_acp_agent

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
    figures: dict[str, list[float]] = {"ack": [], "dead": [], "own_left": [], "persistent": [], "fresh": []}
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
                        # What the agent's own cancel left running: what corral killed after it.
                        figures["own_left"].append(float(len(report.killed)))
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


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms"


def _fmt(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values) * 1000:7.0f} ms (max {max(values) * 1000:.0f})"


# ---------------------------------------------------------------- through the daemon

#: The stop's grace and the cancel's, as in the daemon tests.
DEFAULTS = {"agent": "cli", "stop_grace": 3, "stall_timeout": 120, "turn_timeout": 300}


def _daemon_config(table: dict[str, object]) -> str:
    return toml({**server_tables(), "defaults": DEFAULTS, "agents.cli": table})


def _turn_seconds(client: Client, server: FakeModelServer, channel: str, text: str) -> tuple[float, float]:
    """``send`` to the model's first request carrying ``text`` (the follow-up has started), and
    to the end of the turn."""
    start = time.perf_counter()
    seen = len(server.requests)
    client.send(channel, text)
    deadline = time.monotonic() + BOUND
    while not any(text.encode() in r.raw for r in server.requests[seen:]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{channel}: the model never saw the prompt")
        time.sleep(0.001)
    started = time.perf_counter() - start
    if not client.wait(channel, timeout=BOUND):
        raise RuntimeError(f"{channel}: the turn did not end within {BOUND:g} s")
    return started, time.perf_counter() - start


def _native_table(name: str, url: str) -> dict[str, object] | None:
    """The agent's native adapter (a CLI started per turn) pointed at the same fake server."""
    from scripts.fakemodel import anthropic, gemini_api, openai_chat, openai_responses
    from scripts.fakemodel.clis import PACKAGES, cli_path

    if name not in PACKAGES:
        return None
    env = {"claude": anthropic.agent_env, "codex": openai_responses.agent_env, "gemini": gemini_api.agent_env,
           "qwen": openai_chat.agent_env}[name](url)
    options = openai_responses.agent_options(url) if name == "codex" else {}
    from supervisor.core.netpolicy import grant_for

    return {"adapter": name, "command": [str(cli_path(name))], "env": env, **options, "network_allow": [grant_for(url)]}


def bench_daemon(spec: AcpAgentSpec, runs: int) -> dict[str, list[float]]:
    """The daemon rows of one agent."""
    figures: dict[str, list[float]] = {
        "stop": [], "cancelled": [], "left": [], "warm": [], "native": [], "warm_end": [], "native_end": [],
    }
    server = spec.server().start()
    folder = short_tmp("acp-bd-")
    try:
        tool = write_tool_script(folder)
        daemon = Daemon(folder, _daemon_config({**daemon_table(spec.name, server.url, folder), "acp_cancel_grace": 3}))
        try:
            with Client(str(daemon.socket)) as client:
                for i in range(runs):
                    channel, pid = f"stop-{i}", folder / f"stop-{i}.pid"
                    client.send(channel, f"[[shell:sh {tool} {pid}]] [[say:never]] Run the tool.")
                    deadline = time.monotonic() + BOUND
                    while not (pid.exists() and pid.read_text().strip() and Path(f"{pid}.setsid").exists()):
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{spec.name}: the tool did not start in {channel}")
                        time.sleep(0.02)
                    pids = [read_pid(pid), read_pid(Path(f"{pid}.setsid"))]
                    start = time.perf_counter()
                    result = client.stop(channel)
                    figures["stop"].append(time.perf_counter() - start)
                    figures["cancelled"].append(1.0 if result.get("ended") == "cancelled" else 0.0)
                    figures["left"].append(float(sum(1 for p in pids if psutil.pid_exists(p)
                                                     and psutil.Process(p).status() != psutil.STATUS_ZOMBIE)))
                _turn_seconds(client, server, "warm", "[[say:warm]] Warm up.")
                for i in range(runs):
                    started, ended = _turn_seconds(client, server, "warm", f"[[say:ok]] Quick one {i}.")
                    figures["warm"].append(started)
                    figures["warm_end"].append(ended)
        finally:
            daemon.stop()
        native = _native_table(spec.name, server.url)
        if native is not None:
            nfolder = short_tmp("acp-bn-")
            try:
                daemon = Daemon(nfolder, _daemon_config(native))
                try:
                    with Client(str(daemon.socket)) as client:
                        _turn_seconds(client, server, "warm", "[[say:warm]] Warm up.")  # a session to resume
                        for i in range(runs):
                            started, ended = _turn_seconds(client, server, "warm", f"[[say:ok]] Quick one {i}.")
                            figures["native"].append(started)
                            figures["native_end"].append(ended)
                finally:
                    daemon.stop()
            finally:
                shutil.rmtree(nfolder, ignore_errors=True)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return figures


def main() -> int:
    """Run the agents named on the command line (default: all) and print the tables."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("agents", nargs="*", default=sorted(ACP_AGENTS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-daemon", action="store_true", help="only the driver rows")
    args = parser.parse_args()
    print(f"ACP agents through corral's driver, median of {args.runs}:")
    print(f"{'agent':10} {'cancel ack':>24} {'own left':>8} {'tree dead':>24} {'next prompt':>24} {'fresh CLI':>24}"
          f" {'ratio':>6}")
    for name in args.agents:
        f = trio.run(bench, ACP_AGENTS[name], args.runs)
        ratio = statistics.median(f["fresh"]) / statistics.median(f["persistent"])
        left = f"{max(f['own_left']):.0f}" if f["own_left"] else "-"
        cells = [_fmt(f[key]) for key in ("ack", "dead", "persistent", "fresh")]
        rest = " ".join(f"{cell:>24}" for cell in cells[1:])
        print(f"{name:10} {cells[0]:>24} {left:>8} {rest} {ratio:5.1f}x")
        sys.stdout.flush()
    if args.no_daemon:
        return 0
    print(f"\nThrough a corral run daemon (adapter = \"acp\", acp_cancel_grace 3 s), median of {args.runs};"
          " next turn: send to the model's request (the follow-up started) / to the turn's end:")
    print(f"{'agent':8} {'stop-one mid-tool':>24} {'cancelled':>10} {'left':>5} {'warm ACP agent':>22}"
          f" {'native CLI, started anew':>26} {'ratio':>13}")
    for name in args.agents:
        f = bench_daemon(ACP_AGENTS[name], args.runs)
        warm = f"{_ms(f['warm'])} / {_ms(f['warm_end'])}"
        if f["native"]:
            native = f"{_ms(f['native'])} / {_ms(f['native_end'])}"
            ratios = (f"{statistics.median(f['native']) / statistics.median(f['warm']):4.1f}x /"
                     f" {statistics.median(f['native_end']) / statistics.median(f['warm_end']):4.1f}x")
        else:
            native, ratios = "(no native adapter)", "-"
        print(f"{name:8} {_fmt(f['stop']):>24} {int(sum(f['cancelled'])):>6}/{len(f['cancelled']):<3}"
              f" {int(sum(f['left'])):>5} {warm:>22} {native:>26} {ratios:>13}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
