"""The budget decision (supervisor/core/budget.py): pure, exact at its threshold, and monotone."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from adapters import KNOWN_ADAPTERS
from adapters._base import Usage
from adapters.acp import PRESETS
from supervisor.core.budget import (
    REPORTING,
    BudgetSpent,
    Price,
    TurnLimits,
    money_budget_refusal,
    priced_cost,
    reporting,
    spent,
    turn_cost,
)
from supervisor.core.usage import Meter, ModelTokens, TurnUsage


def used(tokens: int = 0, *, tool_calls: int = 0, model: str | None = "m", cost: str | None = None) -> TurnUsage:
    """A turn that used ``tokens`` input tokens of ``model`` (and ``cost``, the CLI's own)."""
    costs = (("USD", Decimal(cost)),) if cost is not None else ()
    return TurnUsage((ModelTokens(model, tokens),), costs, tool_calls)


# ---------------------------------------------------------------- tokens and tool calls


def test_the_token_notice_names_what_ran_out() -> None:
    decision = spent(TurnLimits(max_turn_tokens=50_000), used(51_200))
    assert decision == BudgetSpent("tokens", 51_200, 50_000, "Stopped: this turn used 51,200 of its 50,000 tokens.")


@given(st.integers(0, 10**9), st.integers(0, 10**9))
def test_a_token_budget_is_a_maximum_exactly(limit: int, tokens: int) -> None:
    """A turn may use exactly its budget; one token more ends it."""
    decision = spent(TurnLimits(max_turn_tokens=limit), used(tokens))
    assert (decision is not None) == (tokens > limit)
    assert spent(TurnLimits(max_turn_tokens=limit), used(limit)) is None
    assert spent(TurnLimits(max_turn_tokens=limit), used(limit + 1)) is not None


def test_every_kind_of_token_counts() -> None:
    usage = TurnUsage((ModelTokens("m", 10, 20, 30, 40),))
    assert spent(TurnLimits(max_turn_tokens=99), usage) is not None
    assert spent(TurnLimits(max_turn_tokens=100), usage) is None


@given(st.integers(0, 1000), st.integers(0, 1000))
def test_a_tool_call_budget_is_a_maximum_exactly(limit: int, calls: int) -> None:
    decision = spent(TurnLimits(max_turn_tool_calls=limit), used(tool_calls=calls))
    assert (decision is not None) == (calls > limit)
    if decision is not None:
        assert decision.notice == f"Stopped: this turn started {calls:,} tool calls, over its {limit:,}."


def test_no_budget_never_stops_anything() -> None:
    assert spent(TurnLimits(), used(10**12, tool_calls=10**6, cost="1000000")) is None
    assert not TurnLimits().any and TurnLimits(max_turn_tool_calls=0).any


# ---------------------------------------------------------------- money


PRICES = {"m": Price(Decimal(3), Decimal(15))}


def test_a_price_per_million_tokens() -> None:
    usage = TurnUsage((ModelTokens("m", 1_000_000, 100_000, 2_000_000),))
    # Cache reads priced at the input price when the table has no cache price: never at nothing.
    assert priced_cost(usage, PRICES) == Decimal(3) + Decimal("1.5") + Decimal(6)
    cheap = {"m": Price(Decimal(3), Decimal(15), cache_read=Decimal("0.3"), cache_write=Decimal("3.75"))}
    assert priced_cost(TurnUsage((ModelTokens("m", 0, 0, 1_000_000, 1_000_000),)), cheap) == Decimal("4.05")


def test_a_model_without_a_price_makes_the_priced_cost_unknown() -> None:
    usage = TurnUsage((ModelTokens("m", 10), ModelTokens("other", 10)))
    assert priced_cost(usage, PRICES) is None
    assert priced_cost(TurnUsage((ModelTokens(None, 10),)), PRICES) is None
    assert priced_cost(TurnUsage((ModelTokens("m", 10),)), {"m": Price(Decimal(1), Decimal(1), currency="EUR")}) is None
    # A model that used nothing needs no price.
    assert priced_cost(TurnUsage((ModelTokens("m", 10), ModelTokens("other"))), PRICES) == Decimal("0.00003")


def test_the_turns_cost_is_the_larger_of_the_clis_and_the_tables() -> None:
    assert turn_cost(used(1_000_000, cost="2"), PRICES) == Decimal(3)
    assert turn_cost(used(1_000_000, cost="5"), PRICES) == Decimal(5)
    assert turn_cost(used(1_000_000, model="other", cost="2"), PRICES) == Decimal(2)
    assert turn_cost(used(1_000_000, model="other"), PRICES) is None


def test_the_cost_notice_shows_enough_decimals_to_be_over() -> None:
    limits = TurnLimits(max_turn_cost=Decimal("0.50"))
    assert spent(limits, used(cost="0.52")) == BudgetSpent("cost", Decimal("0.52"), Decimal("0.50"),
                                                           "Stopped: this turn cost $0.52 of its $0.50.")
    decision = spent(limits, used(cost="0.5004"))
    assert decision is not None and decision.notice == "Stopped: this turn cost $0.5004 of its $0.50."
    euros = spent(TurnLimits(max_turn_cost=Decimal(1), currency="EUR"), TurnUsage(costs=(("EUR", Decimal(2)),)))
    assert euros is not None and euros.notice == "Stopped: this turn cost 2.00 EUR of its 1.00 EUR."
    # A budget below a cent is shown to its own last decimal, never as "$0.00".
    tiny = spent(TurnLimits(max_turn_cost=Decimal("0.004")), used(cost="0.007827"))
    assert tiny is not None and tiny.notice == "Stopped: this turn cost $0.008 of its $0.004."


@given(st.decimals(0, 1000, places=6), st.decimals(0, 1000, places=6))
def test_a_money_budget_is_a_maximum_exactly(limit: Decimal, cost: Decimal) -> None:
    decision = spent(TurnLimits(max_turn_cost=limit), used(cost=str(cost)))
    assert (decision is not None) == (cost > limit)


def test_a_cost_in_another_currency_is_not_this_budgets() -> None:
    assert spent(TurnLimits(max_turn_cost=Decimal(1)), TurnUsage(costs=(("credits", Decimal(50)),))) is None


def test_tokens_priced_by_the_table_stop_a_turn_whose_cli_reports_no_cost() -> None:
    decision = spent(TurnLimits(max_turn_cost=Decimal(1)), used(400_000), PRICES)
    assert decision is not None and decision.budget == "cost" and decision.used == Decimal("1.2")


# ---------------------------------------------------------------- monotone


STEP = st.one_of(
    st.tuples(st.just("usage"), st.integers(0, 50_000), st.integers(0, 5_000), st.sampled_from(["m", "x", None]),
              st.one_of(st.none(), st.decimals(0, 1, places=4))),
    st.tuples(st.just("tool")),
)
LIMITS = st.builds(
    TurnLimits,
    max_turn_tokens=st.one_of(st.none(), st.integers(0, 200_000)),
    max_turn_cost=st.one_of(st.none(), st.decimals(0, 3, places=3)),
    max_turn_tool_calls=st.one_of(st.none(), st.integers(0, 10)),
)


@given(LIMITS, st.lists(STEP, max_size=30))
# (found: a model the table does not price, met after the budget was spent, made the cost unknown)
@example(TurnLimits(max_turn_cost=Decimal("0.000")), [("usage", 0, 1, "m", None), ("usage", 0, 1, "x", None)])
def test_once_a_budget_ran_out_it_stays_out(limits: TurnLimits, steps: list[tuple[object, ...]]) -> None:
    """Decided after each report and each tool call: a turn found over its budget is over it
    at every later step (its usage only grows), and the used figure never goes down."""
    meter = Meter()
    first: BudgetSpent | None = None
    for step in steps:
        if step[0] == "tool":
            meter.tool_call()
        else:
            _, fresh, out, model, cost = step
            currency = "USD" if cost is not None else None
            meter.add(Usage(fresh, out, model=model, cost=cost, currency=currency))  # type: ignore[arg-type]
        decision = spent(limits, meter.snapshot(), PRICES)
        if first is not None:
            assert decision is not None
            if decision.budget == first.budget:
                assert decision.used >= first.used
        elif decision is not None:
            first = decision


# ---------------------------------------------------------------- the tightest of three


def test_the_tightest_limits_apply() -> None:
    agent = TurnLimits(max_turn_tokens=100, max_turn_cost=Decimal(2))
    channel = TurnLimits(max_turn_tokens=50, max_turn_tool_calls=3)
    server = TurnLimits(max_turn_cost=Decimal(1))
    assert agent.tightest(channel).tightest(server) == TurnLimits(50, Decimal(1), 3)


def test_money_budgets_in_two_currencies_are_not_compared() -> None:
    with pytest.raises(ValueError, match="one currency"):
        TurnLimits(max_turn_cost=Decimal(1)).tightest(TurnLimits(max_turn_cost=Decimal(1), currency="EUR"))
    euros = TurnLimits(max_turn_cost=Decimal(1), currency="EUR")
    assert euros.tightest(TurnLimits(max_turn_tokens=5)).currency == "EUR"


# ---------------------------------------------------------------- fail closed


COST = TurnLimits(max_turn_cost=Decimal("0.50"))


def test_a_money_budget_without_a_price_is_refused() -> None:
    why = money_budget_refusal("coder", COST, adapter="codex", preset=None, model="gpt-5", prices={})
    assert why == (
        "agents.coder: max_turn_cost cannot be enforced: codex reports no cost of its own that can be relied on, "
        "and [prices] has no USD price for 'gpt-5'. Fix: add [prices.\"gpt-5\"] with input and output per million "
        "tokens, or remove max_turn_cost"
    )


def test_a_money_budget_with_a_price_for_the_model_is_accepted() -> None:
    prices = {"gpt-5": Price(Decimal("1.25"), Decimal(10))}
    assert money_budget_refusal("coder", COST, adapter="codex", preset=None, model="gpt-5", prices=prices) is None


def test_a_money_budget_for_a_cli_that_prices_every_turn_is_accepted() -> None:
    assert money_budget_refusal("c", COST, adapter="claude", preset=None, model=None, prices={}) is None
    assert money_budget_refusal("c", COST, adapter="acp", preset="claude", model=None, prices={}) is None


@pytest.mark.parametrize(("adapter", "preset"), [("acp", "codex"), ("acp", None), ("pi", None), ("aider", None),
                                                 ("gemini", None), ("qwen", None), ("generic", None)])
def test_a_cli_that_prices_only_sometimes_or_never_needs_a_price(adapter: str, preset: str | None) -> None:
    why = money_budget_refusal("a", COST, adapter=adapter, preset=preset, model=None, prices={})
    assert why is not None and "names no model to price" in why and why.startswith("agents.a: max_turn_cost")


def test_a_price_in_another_currency_does_not_do() -> None:
    prices = {"m": Price(Decimal(1), Decimal(1), currency="EUR")}
    assert money_budget_refusal("a", COST, adapter="codex", preset=None, model="m", prices=prices) is not None
    euros = TurnLimits(max_turn_cost=Decimal(1), currency="EUR")
    assert money_budget_refusal("a", euros, adapter="codex", preset=None, model="m", prices=prices) is None
    # Claude Code prices in dollars: a budget in euros needs a table.
    assert money_budget_refusal("a", euros, adapter="claude", preset=None, model=None, prices={}) is not None


def test_no_money_budget_needs_no_price() -> None:
    assert money_budget_refusal("a", TurnLimits(max_turn_tokens=5), adapter="codex", preset=None, model=None,
                                prices={}) is None


# ---------------------------------------------------------------- when each CLI reports


def test_the_reporting_table_names_every_cli_adapter_and_the_end_only_ones() -> None:
    assert set(KNOWN_ADAPTERS) - {"generic", "demo"} <= {name.partition(":")[0] for name in REPORTING}
    assert {name for name, row in REPORTING.items() if row.tokens == "at_the_end"} == {"codex", "gemini", "acp",
                                                                                         "acp:claude"}
    assert all(name.partition(":")[2] in PRESETS for name in REPORTING if ":" in name)
    assert reporting("acp", "kimi") == REPORTING["acp"] and reporting("generic").cost == "never"
