"""The turn's account of what it spent: the Meter's sums and the TurnAccount that feeds it. Pure."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters._base import Result, Text, ToolUse, Usage
from supervisor.core.account import Post, TurnAccount
from supervisor.core.usage import Meter, ModelTokens, TurnUsage
from supervisor.turns.ports import TurnOutcome


def test_meter_adds_increments_per_model_and_costs_per_currency() -> None:
    meter = Meter()
    meter.add(Usage(100, 10, 1000, 50, model="a"))
    meter.add(Usage(20, 5, model="b", cost=Decimal("0.01"), currency="USD"))
    meter.add(Usage(1, 1, model="a", cost=Decimal("0.02"), currency="USD"))
    meter.add(Usage(cost=Decimal(3), currency="credits"))
    usage = meter.snapshot()
    assert usage.models == (ModelTokens("a", 101, 11, 1000, 50), ModelTokens("b", 20, 5), ModelTokens(None))
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (121, 16,
                                                                                                            1000, 50)
    assert usage.tokens == 1187
    assert usage.cost("USD") == Decimal("0.03") and usage.cost("credits") == Decimal(3) and usage.cost("EUR") is None
    assert usage.reports == 4


def test_a_cumulative_report_counts_what_it_adds_to_the_sessions_totals() -> None:
    """Codex's resumed thread reports its whole history: with the session's totals before the
    turn as the base, the turn's part is the difference; the latest report replaces the last."""
    meter = Meter(base={"gpt": (100, 10, 0, 0)})
    meter.add(Usage(150, 14, 0, 0, model="gpt", cumulative=True))
    assert meter.snapshot().models == (ModelTokens("gpt", 50, 4),)
    meter.add(Usage(180, 20, 0, 0, model="gpt", cumulative=True))
    assert meter.snapshot().models == (ModelTokens("gpt", 80, 10),)


def test_a_cumulative_report_below_the_base_counts_nothing_not_less() -> None:
    meter = Meter(base={None: (500, 50, 0, 0)})
    meter.add(Usage(100, 60, cumulative=True))
    assert meter.snapshot().models == (ModelTokens(None, 0, 10),)


def test_a_snapshot_is_frozen_and_does_not_move_with_the_meter() -> None:
    meter = Meter()
    meter.add(Usage(1, 1))
    first = meter.snapshot(wall_seconds=2.5)
    meter.add(Usage(5, 5))
    meter.tool_call()
    assert (first.tokens, first.tool_calls, first.wall_seconds) == (2, 0, 2.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.tool_calls = 3  # type: ignore[misc]


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from([None, "a", "b"])),
                max_size=20))
def test_the_meter_never_loses_a_token(reports: list[tuple[int, int, str | None]]) -> None:
    meter = Meter()
    for fresh, out, model in reports:
        meter.add(Usage(fresh, out, model=model))
    assert meter.snapshot().tokens == sum(f + o for f, o, _ in reports)


def test_the_account_counts_usage_and_tool_calls_and_posts_nothing_for_usage() -> None:
    account = TurnAccount("agent:a", "t1")
    assert account.on_event(Usage(100, 10), silenced=False) == []
    account.on_event(ToolUse("Bash", "ls"), silenced=False)
    account.on_event(ToolUse("Read", "x"), silenced=False)
    usage = account.usage(wall_seconds=4.0)
    assert (usage.tokens, usage.tool_calls, usage.wall_seconds, usage.reports) == (110, 2, 4.0, 1)


def test_usage_in_the_middle_of_a_message_does_not_split_it() -> None:
    """A CLI reports usage while a message streams (Claude's message_start/message_delta,
    ACP's usage_update): the run of text stays one message."""
    account = TurnAccount("agent:a", "t1")
    account.on_event(Text("Hel", delta=True), silenced=False)
    account.on_event(Usage(10, 1), silenced=False)
    account.on_event(Text("lo", delta=True), silenced=False)
    effects = account.on_event(Result("Hello"), silenced=False)
    assert [e for e in effects if isinstance(e, Post)] == [Post("message", "Hello", {"draft": "t1.1"})]


def test_a_silenced_turn_still_counts_what_it_spent() -> None:
    """After a stop nothing of the turn is stored, but what it spent was spent."""
    account = TurnAccount("agent:a", "t1")
    assert account.on_event(ToolUse("Bash", "sleep 9"), silenced=True) == []
    assert account.on_event(Usage(7, 3, cost=Decimal("0.5"), currency="USD"), silenced=True) == []
    usage = account.usage()
    assert (usage.tokens, usage.tool_calls, usage.cost("USD")) == (10, 1, Decimal("0.5"))


def test_a_turns_outcome_carries_its_usage() -> None:
    assert TurnOutcome().usage == TurnUsage()
    spent = TurnUsage((ModelTokens("m", 1, 2),), tool_calls=1)
    assert TurnOutcome(usage=spent).usage.tokens == 3
