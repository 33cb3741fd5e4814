"""Contract line 20, the rest of a stop: a spent budget drops the queue behind the turn, as a
stop does, and says so in its one notice; the next message runs (issue 36). A generic agent
that reports a tool call every few milliseconds, with a tool-call budget: fast, no model."""

from __future__ import annotations

import sys
from contextlib import aclosing
from pathlib import Path

import trio
from conftest import make_config, turn_processes

from supervisor.host.supervisor import open_supervisor

#: Loops on tool calls when the prompt says "loop"; else answers at once.
AGENT = """
import json, sys, time
if "loop" in sys.argv[-1]:
    while True:
        print(json.dumps({"type": "tool", "name": "Bash", "input": {"command": "true"}}), flush=True)
        time.sleep(0.02)
print(json.dumps({"type": "result", "text": "answered: " + sys.argv[-1]}), flush=True)
"""


async def test_contract_20_a_spent_budget_drops_the_queue_behind_the_turn_and_the_next_message_runs(
    short_tmp: Path,
) -> None:
    script = short_tmp / "agent.py"
    script.write_text(AGENT)
    config = make_config(short_tmp, {"bot": {"adapter": "generic", "command": [sys.executable, str(script)],
                                             "max_turn_tool_calls": 3}})
    async with open_supervisor(config) as sup:
        first = await sup.send("ch", "loop on tools")
        queued = await sup.send("ch", "queued behind it")
        with trio.fail_after(60):
            async with aclosing(sup.follow("ch")) as followed:
                async for entry in followed:
                    if entry.kind == "notice":
                        break
            await sup.wait_idle("ch")
        entries = await sup.entries("ch")
        notice = entries[-1]
        assert notice.text == "Stopped: this turn started 4 tool calls, over its 3. 1 queued message was not run."
        # The call that spent it is shown (it started, as the notice says), then nothing more of the turn.
        assert [e.kind for e in entries if e.author == "agent:bot"] == ["tool"] * 4, entries
        assert not [e for e in entries if e.seq > notice.seq]
        assert notice.meta.get("dropped") == 1 and queued.seq in notice.meta.get("dropped_entries", []), notice.meta
        assert not turn_processes() and sup._ledger.generation("ch") == 1
        after = await sup.send("ch", "after the stop")
        with trio.fail_after(60):
            await sup.wait_idle("ch")
        answers = [e.text for e in await sup.entries("ch", after=after.seq) if e.author == "agent:bot"]
        assert answers == ["answered: after the stop"], answers
        assert first.seq < queued.seq


async def test_status_shows_what_a_running_turn_has_spent_against_its_budget(short_tmp: Path) -> None:
    script = short_tmp / "agent.py"
    script.write_text(AGENT)
    config = make_config(short_tmp, {"bot": {"adapter": "generic", "command": [sys.executable, str(script)],
                                             "max_turn_tool_calls": 100_000}})
    async with open_supervisor(config) as sup:
        await sup.send("ch", "loop on tools")
        with trio.fail_after(60):
            async with aclosing(sup.follow("ch")) as followed:
                async for entry in followed:
                    if entry.kind == "tool":
                        break
        turn = sup.status()["channels"]["ch"]["agents"]["bot"]["turn"]
        assert turn["usage"]["tool_calls"] >= 1 and turn["usage"]["max_turn_tool_calls"] == 100_000, turn
        assert turn["usage"]["tokens"] == 0 and turn["usage"]["max_turn_tokens"] is None
        assert (await sup.stop("ch")).ok
