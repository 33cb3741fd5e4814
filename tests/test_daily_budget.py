"""Daily budgets (issue 36): ``max_daily_tokens`` / ``max_daily_cost`` in ``[agents.X]`` and
``[channels.X]``, read with file, key and fix; today's spend per agent and channel (pure); and a
spent one refusing the lane's next turn, whose message waits, named, until ``budget reset``."""

from __future__ import annotations

from contextlib import aclosing
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import make_config, script_agent
from hypothesis import given
from hypothesis import strategies as st

from supervisor.config.settings import ConfigError, Problem, parse_config
from supervisor.core.daily import DailyLimits, DailySpent, DailyTally, seconds_to_midnight, utc_day
from supervisor.core.usage import TurnRecord
from supervisor.host.supervisor import open_supervisor


def _agent(adapter: str, **keys: Any) -> dict[str, Any]:
    return {"adapter": adapter, "command": ["/bin/true"], **keys}


def _problems(data: dict[str, Any]) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, file="corral.toml")
    return info.value.problems


def test_daily_budgets_are_read_per_agent_and_per_channel() -> None:
    config = parse_config({
        "prices": {"m": {"input": 1, "output": 2, "currency": "EUR"}},
        "channels": {"ops": {"agents": ["a"], "max_daily_tokens": 2_000_000, "max_daily_cost": "12.50 EUR"}},
        "agents": {"a": _agent("claude", model="m", max_daily_tokens=50_000, max_daily_cost="3 EUR")},
    })
    assert config.daily_limits("ops", "a") == (DailyLimits(50_000, Decimal(3), "EUR"),
                                               DailyLimits(2_000_000, Decimal("12.50"), "EUR"))
    assert config.usage_currency("ops", "a") == "EUR"


def test_a_daily_money_budget_nobody_can_price_is_refused_with_its_key_and_fix() -> None:
    problems = _problems({"channels": {"ops": {"agents": ["g"], "max_daily_cost": 5}},
                          "agents": {"g": _agent("gemini", model="gemini-3", max_daily_cost=1)}})
    keys = {p.key: p for p in problems}
    assert set(keys) == {"agents.g.max_daily_cost", "channels.ops.max_daily_cost"}, problems
    for problem in keys.values():
        assert "cannot be enforced for agent g's turns" in problem.message and "'gemini-3'" in problem.message
        assert '[prices."gemini-3"]' in problem.fix and "remove max_daily_cost" in problem.fix
        assert problem.file == "corral.toml"


def test_bad_daily_budgets_say_what_to_write() -> None:
    problems = _problems({"prices": {"m": {"input": 1, "output": 2, "currency": "EUR"}},
                          "agents": {"a": _agent("claude", max_daily_tokens=0, max_daily_cost="lots"),
                                     "b": _agent("claude", model="m", max_daily_cost="2 EUR", max_turn_cost=1)}})
    keys = {p.key: p for p in problems}
    assert {"agents.a.max_daily_tokens", "agents.a.max_daily_cost", "agents.b.max_daily_cost"} <= set(keys), problems
    assert "max_daily_cost = 5" in keys["agents.a.max_daily_cost"].fix
    assert "in USD" in keys["agents.b.max_daily_cost"].message and "one currency" in keys["agents.b.max_daily_cost"].fix


def _record(agent: str, channel: str, tokens: int, day: str = "2026-12-02", cost: str | None = None) -> TurnRecord:
    return TurnRecord("t", channel, agent, day, input_tokens=tokens, cost=None if cost is None else Decimal(cost),
                      currency=None if cost is None else "USD")


def test_a_spent_daily_budget_is_named_and_a_reset_or_the_next_day_lifts_it() -> None:
    tally = DailyTally()
    tally.add_all([_record("x", "ops", 30_000), _record("x", "dev", 21_200), _record("y", "ops", 5, cost="0.20")])
    agent, channel = DailyLimits(max_daily_tokens=50_000), DailyLimits(max_daily_cost=Decimal("0.20"))
    spent = tally.spent("dev", "x", agent_limits=agent, channel_limits=channel, day="2026-12-02")
    assert spent == DailySpent("agent", "x", "tokens", 51_200, 50_000)
    assert spent.waiting_text([7]) == ("Waiting: agent x's daily budget is spent (51,200 of 50,000 tokens today), "
                                       "so message 7 waits; it runs after 00:00 UTC or `corral budget reset x`.")
    assert tally.spent("ops", "y", agent_limits=DailyLimits(), channel_limits=channel, day="2026-12-02") == \
        DailySpent("channel", "ops", "cost", Decimal("0.20"), Decimal("0.20"))
    assert tally.spent("dev", "x", agent_limits=agent, channel_limits=channel, day="2026-12-03") is None
    tally = DailyTally()
    tally.add_all([_record("x", "dev", 51_200)])
    assert tally.reset("x") == ["agent x"]
    assert tally.spent("dev", "x", agent_limits=agent, channel_limits=channel, day="2026-12-02") is None
    assert tally.reset("x") == []  # (nothing left to reset: said, not silent)


@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("pq"), st.integers(0, 10_000),
                          st.sampled_from(["2026-12-01", "2026-12-02"])), max_size=30),
       st.integers(1, 40_000))
def test_a_lane_is_refused_exactly_when_todays_sum_reaches_a_budget(
    turns: list[tuple[str, str, int, str]], limit: int
) -> None:
    tally = DailyTally()
    tally.add_all(_record(agent, channel, n, day) for agent, channel, n, day in sorted(turns, key=lambda t: t[3]))
    today = "2026-12-02"
    for agent in "ab":
        for channel in "pq":
            by_agent = sum(n for a, _, n, d in turns if a == agent and d == today)
            by_channel = sum(n for _, c, n, d in turns if c == channel and d == today)
            spent = tally.spent(channel, agent, agent_limits=DailyLimits(max_daily_tokens=limit),
                                channel_limits=DailyLimits(max_daily_tokens=limit), day=today)
            if by_agent >= limit:
                assert spent is not None and (spent.scope, spent.used) == ("agent", by_agent)
            elif by_channel >= limit:
                assert spent is not None and (spent.scope, spent.used) == ("channel", by_channel)
            else:
                assert spent is None


def test_the_wait_ends_at_the_next_utc_midnight() -> None:
    assert seconds_to_midnight(1_796_169_600) == 86_400  # 2026-12-02 00:00:00 UTC: a whole day
    assert seconds_to_midnight(1_796_169_600 + 86_399.5) == 0.5


#: Reports 1,000 tokens, then answers.
USING = """
import json, sys
print(json.dumps({"type": "usage", "input_tokens": 600, "output_tokens": 400}), flush=True)
print(json.dumps({"type": "result", "text": "answered: " + sys.argv[-1]}), flush=True)
"""


async def _waiting_entry(sup: Any, after: int) -> Any:
    with trio.fail_after(60):
        async with aclosing(sup.follow("ch", after)) as followed:
            async for entry in followed:
                if entry.kind == "status" and "daily_budget" in entry.meta:
                    return entry
    raise AssertionError("no waiting entry")


async def test_contract_20_a_spent_daily_budget_keeps_the_next_message_queued_until_budget_reset(
    short_tmp: Path,
) -> None:
    config = make_config(short_tmp, {"bot": script_agent(USING, max_daily_tokens=1_000)})
    async with open_supervisor(config) as sup:
        await sup.send("ch", "first")
        with trio.fail_after(60):
            await sup.wait_idle("ch")
        kept = await sup.send("ch", "second")
        waiting = await _waiting_entry(sup, kept.seq)
        assert waiting.text == ("Waiting: agent bot's daily budget is spent (1,000 of 1,000 tokens today), so message "
                                f"{kept.seq} waits; it runs after 00:00 UTC or `corral budget reset bot`."), waiting
        view = await sup.queue("ch")
        assert [(m["seq"], m["why"]) for m in view["queued"]] == [
            (kept.seq, "agent bot's daily budget is spent (1,000 of 1,000 tokens today)")], view
        assert sup.budget_reset("bot") == {"reset": ["agent bot"], "day": utc_day()}
        with trio.fail_after(60):
            await sup.wait_idle("ch")
        answers = [e.text for e in await sup.entries("ch") if e.author == "agent:bot"]
        assert answers == ["answered: first", "answered: second"], answers
        # Spent again: a Stop drops the message that waits, as it drops any queued one.
        dropped = await sup.send("ch", "third")
        await _waiting_entry(sup, dropped.seq)
        assert (await sup.stop("ch")).ok
        with trio.fail_after(60):
            await sup.wait_idle("ch")
        entries = await sup.entries("ch", after=dropped.seq)
        assert entries[-1].kind == "notice" and "1 queued message was not run" in entries[-1].text, entries
        assert not [e for e in entries if e.author == "agent:bot"] and (await sup.queue("ch"))["queued"] == []


def test_the_guides_daily_budget_example_is_read_as_it_says() -> None:
    import re
    import tomllib

    guide = (Path(__file__).parent.parent / "docs" / "agents.md").read_text()
    section = guide.split("### Daily budgets: what a day may spend", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```toml\n(.*?)```\n", section, re.S)
    data = tomllib.loads(block)
    data["agents"]["coder"]["command"] = ["/bin/true"]  # (claude need not be installed to read the budgets)
    config = parse_config(data, file="docs/agents.md")
    assert config.daily_limits("ops", "coder") == (DailyLimits(2_000_000, Decimal(5)), DailyLimits(500_000))


def test_the_generic_protocols_usage_line_is_read_and_a_bad_one_is_said() -> None:
    from adapters import Usage
    from adapters.generic import GenericParser

    import json

    parser = GenericParser()
    line = {"type": "usage", "input_tokens": 600, "output_tokens": 400, "model": "m"}
    assert parser.feed(json.dumps(line)) == [Usage(input_tokens=600, output_tokens=400, model="m")]
    for bad in ({"input_tokens": -1}, {"output_tokens": "many"}, {"input_tokens": True}, {"model": 3}):
        (event,) = parser.feed(json.dumps({"type": "usage", **bad}))
        assert type(event).__name__ == "Unparsed", bad


async def test_todays_spend_is_read_from_the_store_at_start_so_a_restart_does_not_lift_the_budget(
    short_tmp: Path,
) -> None:
    config = make_config(short_tmp, {"bot": script_agent(USING, max_daily_tokens=1_000)})
    async with open_supervisor(config) as sup:
        await sup.send("ch", "first")
        with trio.fail_after(60):
            await sup.wait_idle("ch")
    async with open_supervisor(config) as sup:
        kept = await sup.send("ch", "after the restart")
        waiting = await _waiting_entry(sup, kept.seq)
        assert waiting.meta["waiting"] == [kept.seq] and waiting.meta["daily_budget"]["used"] == "1000", waiting.meta
        assert (await sup.stop("ch")).ok
