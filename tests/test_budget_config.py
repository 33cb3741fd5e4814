"""Budgets in ``corral.toml`` (issue 36): ``max_turn_*`` in ``[agents.X]``, ``[channels.X]`` and
``[server]`` (the tightest applies), ``[prices."MODEL"]``, and a money budget nobody can enforce
refused (fail closed) with its file, key and fix; ``corral check``'s word on CLIs that report
only at the end."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from supervisor.config.preflight import budget_notes
from supervisor.config.settings import ConfigError, Problem, parse_config
from supervisor.core.budget import Price, TurnLimits


def _agent(adapter: str, **keys: Any) -> dict[str, Any]:
    return {"adapter": adapter, "command": ["/bin/true"], **keys}


def _problems(data: dict[str, Any]) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, file="corral.toml")
    return info.value.problems


def test_the_tightest_of_the_agents_the_channels_and_the_servers_budgets_applies() -> None:
    config = parse_config({
        "server": {"max_turn_tokens": 90_000, "max_turn_tool_calls": 40},
        "channels": {"ops": {"agents": ["a"], "max_turn_tokens": 50_000, "max_turn_cost": "2.50"}},
        "agents": {"a": _agent("claude", max_turn_cost=0.5, max_turn_tool_calls=60)},
    })
    assert config.turn_limits("ops", "a") == TurnLimits(50_000, Decimal("0.5"), 40)
    assert config.turn_limits("elsewhere", "a") == TurnLimits(90_000, Decimal("0.5"), 40)


def test_a_price_table_is_read_exactly_and_lets_a_cli_without_costs_have_a_money_budget() -> None:
    config = parse_config({
        "prices": {"gpt-5.4": {"input": 1.25, "output": "10", "cache_read": 0.125}},
        "agents": {"c": _agent("codex", model="gpt-5.4", max_turn_cost="0.10")},
    })
    assert config.prices == {"gpt-5.4": Price(Decimal("1.25"), Decimal("10"), Decimal("0.125"))}
    assert config.turn_limits("x", "c").max_turn_cost == Decimal("0.10")


@pytest.mark.parametrize("where", ["agent", "channel", "server"])
def test_a_money_budget_whose_cost_cannot_be_known_is_refused_naming_the_key_and_the_fix(where: str) -> None:
    data: dict[str, Any] = {"agents": {"c": _agent("codex")}, "channels": {"ops": {"agents": ["c"]}}}
    {"agent": data["agents"]["c"], "channel": data["channels"]["ops"],
     "server": data.setdefault("server", {})}[where]["max_turn_cost"] = 0.5
    [problem] = _problems(data)
    assert problem.key == {"agent": "agents.c", "channel": "channels.ops", "server": "server"}[where] + ".max_turn_cost"
    assert "cannot be enforced for agent c's turns" in problem.message and "codex" in problem.message
    assert "[prices" in problem.fix and "remove max_turn_cost" in problem.fix


def test_a_price_for_another_model_or_currency_does_not_make_a_money_budget_enforceable() -> None:
    [problem] = _problems({"prices": {"other": {"input": 1, "output": 2}},
                           "agents": {"g": _agent("gemini", model="gemini-3", max_turn_cost=1)}})
    assert problem.key == "agents.g.max_turn_cost" and "'gemini-3'" in problem.message
    [problem] = _problems({"prices": {"m": {"input": 1, "output": 2, "currency": "EUR"}},
                           "agents": {"g": _agent("gemini", model="m", max_turn_cost=1)}})
    assert "USD price" in problem.message


def test_bad_budget_and_price_values_each_say_their_key_and_fix() -> None:
    problems = _problems({
        "server": {"max_turn_tokens": 0},
        "prices": {"m": {"input": -1}},
        "agents": {"a": _agent("claude", model="m", max_turn_cost="ten", max_turn_tool_calls=-2, max_turn_tokes=5)},
    })
    keys = {p.key: p for p in problems}
    assert set(keys) == {"server.max_turn_tokens", "agents.a.max_turn_cost", "agents.a.max_turn_tool_calls",
                         "agents.a.max_turn_tokes", 'prices."m".input', 'prices."m".output'}
    assert keys["agents.a.max_turn_tokes"].fix == "did you mean 'max_turn_tokens'?"
    assert "0.50" in keys["agents.a.max_turn_cost"].fix


def test_money_budgets_in_two_currencies_for_one_agents_turns_are_refused() -> None:
    [problem] = _problems({"server": {"max_turn_cost": "1 EUR"},
                           "agents": {"a": _agent("claude", max_turn_cost=0.5)}})
    assert problem.key == "server.max_turn_cost" and "one currency" in problem.fix


def test_check_says_a_token_budget_acts_only_at_the_end_for_a_cli_that_reports_only_then() -> None:
    config = parse_config({
        "server": {"max_turn_tokens": 10_000},
        "agents": {"codex": _agent("codex"), "claude": _agent("claude"), "acp": _agent("acp", preset="claude")},
        "defaults": {"agent": "claude"},
    })
    told = budget_notes(config)
    assert [n.split(":")[0] for n in told] == ["agents.codex", "agents.acp"]
    assert "only when the turn ends" in told[0] and "max_turn_tool_calls" in told[0]
    assert "preset claude" in told[1]
    assert budget_notes(parse_config({"agents": {"codex": _agent("codex")}})) == []
