"""Each turn's usage as a person reads it (issue 36): one pure formatter
(``supervisor.core.usage.usage_line``) that every surface shows — the entry that ends a turn
(``corral tail``, the dashboard, the bridges), ``corral status`` for a running turn, the
dashboard's spend of the day — with what is not known left out and no money that was not
reported or priced."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import trio
from conftest import KILL, REPO, make_config, script_agent
from hypothesis import given
from hypothesis import strategies as st

from supervisor.config.settings import parse_config
from supervisor.core.usage import (
    TurnRecord,
    TurnUsage,
    model_name,
    money,
    spend_line,
    sum_by_day,
    usage_entry,
    usage_line,
)
from supervisor.host.supervisor import STOP_NOTICE, open_supervisor


def _record(**kw: Any) -> TurnRecord:
    return TurnRecord("t", "ch", "bot", "2026-12-02", **kw)


def test_the_line_says_what_is_known_and_leaves_out_the_rest() -> None:
    full = _record(input_tokens=2_340, cache_read_tokens=9_800, cache_write_tokens=200, output_tokens=812,
                   tool_calls=3, wall_seconds=38.2, cost=Decimal("0.0412345"), currency="USD",
                   models=("claude-sonnet-4",))
    assert usage_line(full) == ("12,340 tokens in (9,800 cached, 200 to cache) · 812 out · 3 tools · $0.041 · 38 s"
                                " · claude-sonnet-4")
    # Not priced: no money at all (never a $0); no tokens reported: none said; one tool.
    assert usage_line(_record(input_tokens=5, output_tokens=1, tool_calls=1, wall_seconds=0.44)) == \
        "5 tokens in · 1 out · 1 tool · 0.4 s"
    assert usage_line(_record(wall_seconds=125)) == "2 min 5 s"
    assert usage_line(_record(cost=Decimal("2.5"), currency="CHF", wall_seconds=3_720.0)) == "2.50 CHF · 1 h 2 min"
    assert usage_line(_record()) == ""
    assert [money(Decimal(a), "USD") for a in ("0", "0.000012345", "0.5", "1234.5")] == [
        "$0", "$0.000012", "$0.50", "$1,234.50"]


@given(st.text(max_size=80))
def test_a_model_name_cannot_carry_markup_mentions_controls_or_a_second_line(name: str) -> None:
    shown = model_name(name)
    assert len(shown) <= 48
    assert not set(shown) - set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/+@-?…")


def test_a_hostile_model_name_is_shown_harmless() -> None:
    assert model_name("<@U123> @everyone **x**\n\x03\x02evil") == "?@U123?@everyone?x?evil"
    assert model_name("claude-sonnet-4@20250514") == "claude-sonnet-4@20250514"


def test_only_a_turn_whose_cli_reported_usage_ends_with_an_entry() -> None:
    record = _record(input_tokens=600, output_tokens=400, wall_seconds=1.0, models=("m",))
    assert usage_entry(record, TurnUsage()) is None
    made = usage_entry(record, TurnUsage(reports=1))
    assert made is not None
    text, meta = made
    assert text == "bot used 600 tokens in · 400 out · 1.0 s · m"
    assert meta["usage"]["line"] == usage_line(record) and meta["usage"]["cost"] is None  # type: ignore[index]


def test_a_days_sum_reads_as_one_line_with_its_unpriced_turns_said() -> None:
    priced = _record(input_tokens=100, output_tokens=20, tool_calls=2, wall_seconds=1.5, cost=Decimal("0.25"),
                     currency="USD")
    (row,) = sum_by_day([priced, _record(input_tokens=10, output_tokens=1, wall_seconds=2.0)])
    assert row["line"] == spend_line(row) == \
        "2 turns · 110 tokens in · 21 out · 2 tools · $0.25 (and 1 turn not priced) · 3.5 s"


#: Reports its tokens (a hostile model name among them), calls a tool, answers.
METERED = r"""
import json, sys
print(json.dumps({"type": "tool", "name": "Read", "input": "a.txt"}), flush=True)
print(json.dumps({"type": "usage", "input_tokens": 1200, "output_tokens": 34,
                  "model": "m<@U1>\n@everyone**\x03"}), flush=True)
if "slow" in sys.argv[-1]:
    print(json.dumps({"type": "status", "text": "thinking"}), flush=True)
    import time; time.sleep(60)
print(json.dumps({"type": "result", "text": "answered: " + sys.argv[-1]}), flush=True)
"""
#: Reports its tokens of model "m", which ``[prices]`` prices.
PRICED = METERED.replace(r'"m<@U1>\n@everyone**\x03"', '"m"')


async def test_a_turns_end_entry_carries_its_usage_and_a_stopped_turns_comes_before_its_notice(
    short_tmp: Path,
) -> None:
    config = make_config(short_tmp, {"bot": script_agent(METERED)})
    async with open_supervisor(config) as sup:
        await sup.send("ch", "hello")
        with trio.fail_after(60):
            await sup.wait_idle("ch")
        *_, answer, end = await sup.entries("ch")
        assert (answer.author, answer.text) == ("agent:bot", "answered: hello")
        assert (end.author, end.kind, end.turn) == ("system", "status", answer.turn)
        assert end.text.startswith("bot used 1,200 tokens in · 34 out · 1 tool · ") and "$" not in end.text, end
        assert end.text.endswith(" s · m?@U1?@everyone?"), end
        assert end.meta["usage"]["tokens"] == 1_234 and end.meta["usage"]["line"] in end.text
        # A stop: the turn's line is stored before the notice, which stays last.
        await sup.send("ch", "slow")
        with trio.fail_after(60):
            while not [e for e in await sup.entries("ch", after=end.seq) if e.text == "thinking"]:
                await trio.sleep(0.05)
        status = sup.status()["channels"]["ch"]["agents"]["bot"]
        assert status["turn"]["usage"]["line"].startswith("1,200 tokens in · 34 out · 1 tool · "), status
        assert (await sup.stop("ch")).ok
        *_, spent, notice = await sup.entries("ch", after=end.seq)
        assert (notice.kind, notice.text) == ("notice", STOP_NOTICE)
        assert spent.kind == "status" and spent.text.startswith("bot used 1,200 tokens in"), spent


async def test_a_priced_turn_shows_its_cost_and_the_days_sum_its_line(short_tmp: Path) -> None:
    config = parse_config({"server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]},
                           "store": {"path": "corral.db"}, "prices": {"m": {"input": 1, "output": 2}},
                           "agents": {"bot": {**script_agent(PRICED), "sandbox_write": [str(short_tmp)]}}},
                          file=str(short_tmp / "corral.toml"), base=short_tmp)
    async with open_supervisor(config) as sup:
        await sup.send("ch", "hello")
        with trio.fail_after(60):
            await sup.wait_idle("ch")
        end = (await sup.entries("ch"))[-1]
        # 1,200 in at $1 and 34 out at $2 a million: $0.001268.
        assert "· 1 tool · $0.0013 · " in end.text and end.meta["usage"]["cost"] == "0.001268", end
        (day,) = await sup.usage("ch")
        assert day["line"].startswith("1 turn · 1,200 tokens in · 34 out · 1 tool · $0.0013 · "), day


def test_the_guides_quote_the_line_corral_makes() -> None:
    record = _record(input_tokens=2_540, cache_read_tokens=9_800, output_tokens=812, tool_calls=3, wall_seconds=38.2,
                     cost=Decimal("0.0412"), currency="USD", models=("claude-sonnet-4",))
    made = usage_entry(replace(record, agent="claude"), TurnUsage(reports=4))
    assert made is not None
    for page in ("agents.md", "bridges.md", "dashboard.md"):
        text = " ".join((REPO / "docs" / page).read_text().split())  # (a quote may wrap)
        assert made[0] in text, page


def test_status_shows_a_running_turns_line_and_its_budgets() -> None:
    from supervisor.cli import _lane_state

    turn = {"id": "t1a4", "started": 0.0, "phase": "started", "pid": 4242,
            "usage": {"tokens": 1_234, "tool_calls": 1, "line": "1,200 tokens in · 34 out · 1 tool · 12 s",
                      "cost": None, "currency": "USD", "max_turn_tokens": 50_000, "max_turn_cost": None,
                      "max_turn_tool_calls": None}}
    shown = _lane_state({"state": "running", "turn": turn, "queued": 0})
    assert shown.startswith("running turn t1a4 since ") and shown.endswith(
        " (started, pid 4242): 1,200 tokens in · 34 out · 1 tool · 12 s (budget 50,000 tokens)"), shown
