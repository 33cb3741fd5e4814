"""Contract line 20: a spent budget stops the turn through the same Stop (issue 36).

One daemon runs real CLIs (Claude Code in stream-json, Codex exec, claude-agent-acp over ACP)
against the fake model servers, whose every response carries usage and whose model keeps
calling the shell tool (``[[loop]]``). Each channel's agent has one budget; the turn is
stopped when it is past it — Claude Code as the tokens come, Codex and the ACP agent when
they report, at the end of the model's tool loop (``[[loop:N]]``) — and the budget's notice is
the last entry, with nothing of the turn after it and none of its processes left. All turns
run at once, so the file costs about one turn of the slowest CLI.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import DaemonProcess, turn_processes

from scripts._config import toml_value
from supervisor.core.netpolicy import grant_for
from scripts.fakemodel import anthropic, openai_responses
from scripts.fakemodel.acp_agents import daemon_table
from scripts.fakemodel.clis import cli_path

pytestmark = pytest.mark.realcli

#: The fake Anthropic model's name as the agents ask for it (and as [prices] prices it).
CLAUDE_MODEL = "claude-sonnet-4-5"
#: Each channel: its agent's table (besides the CLI's), and the prompt of its turn.
LOOP = "[[shell:echo step]] [[say:never said]]"
CHANNELS: dict[str, tuple[str, dict[str, Any], str]] = {
    "claude-tokens": ("claude", {"max_turn_tokens": 3000}, f"{LOOP} [[loop]] keep going"),
    "claude-cost": ("claude", {"model": CLAUDE_MODEL, "max_turn_cost": "0.008"}, f"{LOOP} [[loop]] keep going"),
    "codex-tokens": ("codex", {"max_turn_tokens": 300}, f"{LOOP} [[loop:3]] three steps"),
    "codex-cost": ("codex", {"model": openai_responses.MODEL, "max_turn_cost": "0.0005"}, f"{LOOP} [[loop:3]] three"),
    # Codex reports its tokens only at the end; its tool calls are seen as they start.
    "codex-tools": ("codex", {"max_turn_tool_calls": 2}, f"{LOOP} [[loop]] keep going"),
    "acp-tokens": ("acp", {"max_turn_tokens": 1000}, f"{LOOP} [[loop:2]] two steps"),
    "acp-cost": ("acp", {"max_turn_cost": "0.004"}, f"{LOOP} [[loop:2]] two steps"),
}
PRICES = {CLAUDE_MODEL: {"input": 3, "output": 15}, openai_responses.MODEL: {"input": 1.25, "output": 10}}


def _config(folder: Path, anthropic_url: str, codex_url: str) -> str:
    lines = ['[server]\nsocket = "corral.sock"', '[store]\npath = "corral.db"',
             '[defaults]\nagent = "claude-tokens"\nstall_timeout = 120\nturn_timeout = 150']
    for model, price in PRICES.items():
        lines.append(f'[prices."{model}"]\n' + "\n".join(f"{k} = {toml_value(v)}" for k, v in price.items()))
    for channel, (cli, budget, _) in CHANNELS.items():
        if cli == "acp":
            table: dict[str, Any] = daemon_table("claude", anthropic_url, folder)
        elif cli == "claude":
            table = {"adapter": "claude", "command": [str(cli_path("claude"))], "env": anthropic.agent_env(anthropic_url),
                     "network_allow": [grant_for(anthropic_url)]}
        else:
            table = {"adapter": "codex", "command": [str(cli_path("codex"))],
                     "env": openai_responses.agent_env(codex_url), **openai_responses.agent_options(codex_url),
                     "network_allow": [grant_for(codex_url)]}
        lines.append(f"[agents.{channel}]\n" + "\n".join(f"{k} = {toml_value(v)}" for k, v in {**table, **budget}.items()))
        lines.append(f'[channels.{channel}]\nagents = ["{channel}"]')
    return "\n".join(lines) + "\n"


@pytest.fixture
def budget_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    folder = tmp_path
    claude_server = anthropic.FakeAnthropicServer().start()
    codex_server = openai_responses.OpenAIResponsesServer().start()
    try:
        daemon = DaemonProcess(folder, _config(folder, claude_server.url, codex_server.url))
        try:
            yield daemon
        finally:
            assert daemon.stop() == 0, "".join(daemon.log[-30:])
        # Each stop logs how far past its budget the turn got, once it is dead (the overshoot
        # figures of docs/performance.md: pytest -s prints them).
        spent = [line for line in "".join(daemon.log).splitlines() if "budget stop " in line]
        print("\n".join(spent))
        assert {re.search(r"budget stop '([^']+)'", line)[1] for line in spent} == set(CHANNELS), spent
    finally:
        claude_server.stop()
        codex_server.stop()


def _entries(daemon: DaemonProcess, channel: str) -> list[dict[str, Any]]:
    out = daemon.cli("tail", channel, "--json")
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_contract_20_a_spent_budget_stops_the_turn_with_its_notice_last_and_nothing_left(
    budget_daemon: DaemonProcess,
) -> None:
    daemon = budget_daemon
    for channel, (_, _, prompt) in CHANNELS.items():
        sent = daemon.cli("send", channel, prompt, "--json")
        assert sent.returncode == 0, sent.stderr
    deadline = time.monotonic() + 150
    for channel in CHANNELS:
        waited = daemon.cli("wait", channel, "--timeout", str(max(1, int(deadline - time.monotonic()))))
        assert waited.returncode == 0, f"{channel}: the turn did not end:\n" + "".join(daemon.log[-40:])
    for channel, (_, budget, _) in CHANNELS.items():
        entries = _entries(daemon, channel)
        last = entries[-1]
        assert last["kind"] == "notice", (channel, entries)
        if "max_turn_tokens" in budget:
            found = re.fullmatch(r"Stopped: this turn used ([\d,]+) of its ([\d,]+) tokens\.", last["text"])
            assert found and int(found[2].replace(",", "")) == budget["max_turn_tokens"], (channel, last)
            assert int(found[1].replace(",", "")) > budget["max_turn_tokens"]
        elif "max_turn_tool_calls" in budget:
            assert last["text"] == "Stopped: this turn started 3 tool calls, over its 2.", (channel, last)
        else:
            found = re.fullmatch(r"Stopped: this turn cost \$([\d.]+) of its \$([\d.]+)\.", last["text"])
            assert found and Decimal(found[2]) == Decimal(budget["max_turn_cost"]), (channel, last)
            assert Decimal(found[1]) > Decimal(budget["max_turn_cost"])
        turns = {e["turn"] for e in entries if e.get("turn")}
        assert turns and not turn_processes(sorted(turns)), (channel, turns)
        if channel.startswith("claude-") or channel == "codex-tools":  # (stopped before its answer)
            said = [e for e in entries if e["author"].startswith("agent:")]
            assert not any("never said" in e["text"] for e in said), ("nothing of the turn after its stop", said)
    # Each turn's usage is stored with it: `corral usage` sums it per day, channel and agent.
    out = daemon.cli("usage", "--json")
    assert out.returncode == 0, out.stderr
    days = {row["channel"]: row for row in json.loads(out.stdout)["days"]}
    assert set(days) == set(CHANNELS), days
    for channel, (_, budget, _) in CHANNELS.items():
        row = days[channel]
        assert row["turns"] == 1 and row["stopped_by_budget"] == 1, row
        if "max_turn_tokens" in budget:
            assert row["tokens"] > budget["max_turn_tokens"], row
        if "max_turn_cost" in budget:
            assert Decimal(row["cost"]["USD"]) > Decimal(budget["max_turn_cost"]), row
    # Claude Code reports as it goes: stopped mid-loop, its tool calls cut short.
    for channel in ("claude-tokens", "claude-cost"):
        steps = [e for e in _entries(daemon, channel) if e["kind"] == "tool"]
        assert steps, channel
