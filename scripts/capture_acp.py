"""Record real ACP exchanges: every line corral and a real ACP agent send each other.

``python -m scripts.capture_acp [AGENT ...]`` (default: every agent of
``scripts.fakemodel.acp_agents``) runs each agent offline against its fake model server through
corral's own driver (``supervisor.turns.agents``) and writes ``tests/data/captures/acp-AGENT/``:

* ``session.jsonl``: one agent process — start-up, ``text``, ``tool`` (a permission request the
  unattended policy allows), ``cancel-tool`` (a cancel while the tool sleeps, with a setsid
  grandchild), ``after-cancel`` (the next prompt in the same process), ``cancel-silent`` (a
  cancel while the model stream is silent), ``after-silent``;
* ``load.jsonl``: a fresh process resuming that session with ``session/load``;
* ``stale.jsonl``: a fresh process asked to load a session that does not exist;
* ``attended.jsonl``: an attended agent (the policy rejects) asked to run a tool.

Each line is ``{"scenario", "dir": "send"|"recv", "line"}`` with the raw JSON-RPC line. The
temporary folders in them are replaced by ``/tmp/CAPTURE``. ``manifest.json`` says what
each cancel did (acknowledged or killed, how fast, what was killed).

The shared capture helper (``scripts/_capture.py``) runs one-shot turns and interrupts them
with a signal; an ACP agent is a persistent process spoken to over stdin, so this script uses
the driver itself, which is also what the captures are meant to show.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from scripts.fakemodel.acp_agents import ACP_AGENTS, AcpAgentSpec
from scripts.fakemodel.rig import write_tool_script
from supervisor.turns.agents import AcpAgent, open_acp_agent

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "captures"


class Recorder:
    """Collects the lines of one agent process, tagged with the scenario running."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.scenario = "start"
        self.records: list[dict[str, str]] = []

    def tap(self, direction: str, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace").replace(self.root, "/tmp/CAPTURE")
        self.records.append({"scenario": self.scenario, "dir": direction, "line": text})

    def write(self, path: Path) -> None:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records))


async def _turn(agent: AcpAgent, rec: Recorder, scenario: str, prompt: str) -> list[str]:
    rec.scenario = scenario
    return [repr(ev) async for ev in agent.prompt(prompt)]


async def _cancelled_turn(
    agent: AcpAgent, rec: Recorder, scenario: str, prompt: str, ready: Path | None
) -> dict[str, Any]:
    rec.scenario = scenario
    stream = agent.prompt(prompt)
    events: list[str] = []
    report: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:

        async def consume() -> None:
            async for ev in stream:
                events.append(repr(ev))

        nursery.start_soon(consume)
        with trio.fail_after(120):
            if ready is not None:
                while not ready.exists():
                    await trio.sleep(0.05)
            await trio.sleep(2.0)  # the silent stream, or the tool running for a moment
        result = await agent.cancel()
        report = {
            "ended": result.ended,
            "stop_reason": result.stop_reason,
            "acknowledged_after": result.acknowledged_after,
            "dead_after": result.dead_after,
            "killed": len(result.killed),
            "survivors": result.survivors,
        }
    report["events"] = events
    return report


async def capture(spec: AcpAgentSpec, out: Path) -> dict[str, Any]:
    """Run every scenario for one agent; write its files; return its manifest entry."""
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {}
    server = spec.server().start()
    try:
        with tempfile.TemporaryDirectory(prefix="acp-capture-") as root:
            work, home = Path(root, "work"), str(Path(root, "home"))
            work.mkdir()
            tool = write_tool_script(Path(root))
            launch = spec.launch(server.url, str(work), home)
            rec = Recorder(root)
            async with open_acp_agent(
                launch,
                marker=f"acp-capture-{spec.name}",
                home=home,
                tap=rec.tap,
                restart_after_cancel=spec.restart_after_cancel,
            ) as agent:
                session = agent.session_id
                manifest["argv"] = [Path(launch.argv[0]).name, *launch.argv[1:]]
                manifest["text"] = await _turn(agent, rec, "text", "[[say:Hello from ACP.]] Say hello.")
                manifest["tool"] = await _turn(
                    agent,
                    rec,
                    "tool",
                    "[[shell:echo hi-from-tool]] [[say:The command printed hi-from-tool.]] Run echo.",
                )
                pid = Path(root, "pid")
                manifest["cancel-tool"] = await _cancelled_turn(
                    agent, rec, "cancel-tool", f"[[shell:sh {tool} {pid}]] [[say:never said]] Run the tool.", pid
                )
                rec.scenario = "after-cancel"
                manifest["restarted-after-cancel"] = await agent.ensure_running()
                manifest["after-cancel"] = await _turn(agent, rec, "after-cancel", "[[say:Still here.]] Are you there?")
                manifest["cancel-silent"] = await _cancelled_turn(
                    agent, rec, "cancel-silent", "[[silent]] Think forever.", None
                )
                rec.scenario = "after-silent"
                manifest["restarted-after-silent"] = await agent.ensure_running()
                manifest["after-silent"] = await _turn(agent, rec, "after-silent", "[[say:Back again.]] And now?")
            rec.write(out / "session.jsonl")

            rec = Recorder(root)
            async with open_acp_agent(
                launch, marker=f"acp-capture-{spec.name}", home=home, saved_session=session, tap=rec.tap
            ) as agent:
                manifest["load"] = {
                    "notices": agent.notices,
                    "events": await _turn(agent, rec, "load", "[[say:Resumed.]] What did I say first?"),
                }
            rec.write(out / "load.jsonl")

            rec = Recorder(root)
            async with open_acp_agent(
                launch, marker=f"acp-capture-{spec.name}", home=home, saved_session="no-such-session", tap=rec.tap
            ) as agent:
                manifest["stale"] = {"notices": agent.notices}
            rec.write(out / "stale.jsonl")

            rec = Recorder(root)
            # An agent whose attended launch differs (no tool that never asks) starts with that.
            attended = spec.attended(server.url, str(work), home) if spec.attended is not None else launch
            async with open_acp_agent(
                attended, marker=f"acp-capture-{spec.name}", home=home, unattended=False, tap=rec.tap
            ) as agent:
                manifest["attended"] = await _turn(
                    agent, rec, "attended", "[[shell:touch rejected.txt]] [[say:Done or not.]] Touch a file."
                )
                manifest["attended-file-created"] = (work / "rejected.txt").exists()
            rec.write(out / "attended.jsonl")
    finally:
        server.stop()
    text = json.dumps(manifest, indent=2, ensure_ascii=False)
    (out / "manifest.json").write_text(text.replace(root, "/tmp/CAPTURE") + "\n")
    return manifest


def main() -> int:
    """Capture the agents named on the command line (default: all)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("agents", nargs="*", default=sorted(ACP_AGENTS))
    args = parser.parse_args()
    status = 0
    for name in args.agents:
        try:
            manifest = trio.run(capture, ACP_AGENTS[name], OUT / f"acp-{name}")
        except Exception as exc:  # noqa: BLE001 - report each agent and go on with the next
            print(f"{name}: FAILED: {exc!r}", file=sys.stderr)
            status = 1
            continue
        ended = {key: manifest[key]["ended"] for key in ("cancel-tool", "cancel-silent")}
        print(f"{name}: " + ", ".join(f"{key} {value}" for key, value in ended.items()))
    return status


if __name__ == "__main__":
    sys.exit(main())
