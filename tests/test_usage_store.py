"""What each turn spent, stored with it (issue 36): ``turn_usage`` (migration 7), on both
engines; summed per UTC day, channel and agent (``corral usage``, ``GET /v1/usage``); counted
in ``/metrics``."""

from __future__ import annotations

from decimal import Decimal

from supervisor.core.counters import Metrics
from supervisor.core.usage import TurnRecord, sum_by_day
from supervisor.serve.metrics import render
from supervisor.store.store import open_store


def _record(turn: str, channel: str = "ops", agent: str = "claude", day: str = "2026-12-01", **kw: object) -> TurnRecord:
    base: dict[str, object] = {"input_tokens": 100, "output_tokens": 20, "cache_read_tokens": 300, "tool_calls": 2,
                               "wall_seconds": 1.5, "cost": Decimal("0.0105"), "currency": "USD"}
    return TurnRecord(turn, channel, agent, day, **{**base, **kw})  # type: ignore[arg-type]


async def test_each_turns_usage_is_stored_and_read_back_exactly_from_a_day_on(store_at: str) -> None:
    async with open_store(store_at) as store:
        kept = [_record("t1", models=("m",), budget="tokens"), _record("t2", channel="dev", day="2026-12-02",
                                                                       cost=None, currency=None)]
        for record in [_record("t0", day="2026-11-30"), *kept]:
            await store.record_usage(record).committed()
        assert await store.usage(None, "2026-12-01") == kept
        assert await store.usage("dev", "2026-12-01") == kept[1:]


def test_the_sums_go_per_day_channel_and_agent_with_costs_per_currency_and_the_unpriced_counted() -> None:
    days = sum_by_day([_record("t1"), _record("t2", cost=Decimal("0.0005"), budget="cost"),
                       _record("t3", cost=None, currency=None), _record("t4", agent="codex", currency="EUR"),
                       _record("t5", day="2026-12-02")])
    assert [(d["day"], d["agent"], d["turns"]) for d in days] == [
        ("2026-12-01", "claude", 3), ("2026-12-01", "codex", 1), ("2026-12-02", "claude", 1)]
    first = days[0]
    assert first["tokens"] == 3 * 420 and first["tool_calls"] == 6 and first["wall_seconds"] == 4.5
    assert first["cost"] == {"USD": "0.0110"} and first["unpriced"] == 1 and first["stopped_by_budget"] == 1
    assert days[1]["cost"] == {"EUR": "0.0105"}


def test_metrics_count_tokens_tool_calls_cost_and_budget_stops_by_agent() -> None:
    metrics = Metrics()
    metrics.spent("claude", (100, 20, 300, 0), 2, Decimal("0.25"), "USD", None)
    metrics.spent("claude", (1, 1, 0, 0), 1, Decimal("0.5"), "USD", "tokens")
    page = render({"agents": []}, metrics)
    assert 'corral_tokens_total{agent="claude",kind="input"} 101' in page
    assert 'corral_tool_calls_total{agent="claude"} 3' in page
    assert 'corral_cost_total{agent="claude",currency="USD"} 0.75' in page
    assert 'corral_budget_stops_total{agent="claude",budget="tokens"} 1' in page
