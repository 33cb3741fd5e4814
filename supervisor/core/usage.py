"""What a turn spent: its tokens by model, its cost by currency, its tool calls, its wall time.

Pure: no Trio, no I/O. A turn's parser reports :class:`~adapters._base.Usage` increments (each
adapter turns its CLI's own running totals into increments: see its module docstring), and
the turn's :class:`Meter` adds them up, with every tool call as it starts; the meter's
:meth:`~Meter.snapshot` is a frozen :class:`TurnUsage`, what the budget decides on
(:mod:`.budget`) and what the turn's outcome carries to be stored.

A report marked ``cumulative`` is the *conversation's* totals (Codex's ``turn.completed`` of a
resumed thread counts its earlier turns): the turn's part of it is what it adds to the
session's totals before the turn (:attr:`Meter.base`, zero for a new session), field by
field, never less than nothing; the latest such report replaces the one before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (only a type: a client reading the config's budgets never loads the adapters)
    from adapters import Usage

#: Fresh input, output, cache read, cache write: :class:`~adapters._base.Usage`'s order.
Figures = tuple[int, int, int, int]
_ZERO: Figures = (0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class ModelTokens:
    """A turn's tokens of one model (``None``: the CLI named none)."""

    model: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def tokens(self) -> int:
        """Every token: input (fresh, cached and cache-written) and output."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """What a turn spent, as its CLI reported it (frozen: a snapshot of its :class:`Meter`)."""

    models: tuple[ModelTokens, ...] = ()
    """The tokens, per model, in the order the models were first reported."""
    costs: tuple[tuple[str, Decimal], ...] = ()
    """The CLI's own cost of the turn, per currency (none: it priced nothing)."""
    tool_calls: int = 0
    """Tool calls started (each is counted as it starts, whether or not it finished)."""
    wall_seconds: float | None = None
    """From the turn's start to its end (None: not ended, or not measured)."""
    reports: int = 0
    """Usage reports received: 0 means the CLI said nothing of its usage, not that it was free."""

    @property
    def input_tokens(self) -> int:
        """Fresh input tokens, every model."""
        return sum(m.input_tokens for m in self.models)

    @property
    def output_tokens(self) -> int:
        """Output tokens, every model."""
        return sum(m.output_tokens for m in self.models)

    @property
    def cache_read_tokens(self) -> int:
        """Input tokens read from the prompt cache, every model."""
        return sum(m.cache_read_tokens for m in self.models)

    @property
    def cache_write_tokens(self) -> int:
        """Input tokens written to the prompt cache, every model."""
        return sum(m.cache_write_tokens for m in self.models)

    @property
    def tokens(self) -> int:
        """Every token of the turn, what a token budget counts."""
        return sum(m.tokens for m in self.models)

    def cost(self, currency: str) -> Decimal | None:
        """The CLI's own cost in ``currency``; None when it reported none in it."""
        return dict(self.costs).get(currency)


@dataclass(slots=True)
class Meter:
    """A turn's running sum of usage reports and tool calls. Pure; see the module docstring."""

    base: Mapping[str | None, Figures] = field(default_factory=dict)
    """The session's totals before the turn, per model, for ``cumulative`` reports."""
    tool_calls: int = 0
    reports: int = 0
    _added: dict[str | None, list[int]] = field(default_factory=dict)
    _cumulative: dict[str | None, Figures] = field(default_factory=dict)
    _costs: dict[str, Decimal] = field(default_factory=dict)

    def add(self, usage: Usage) -> None:
        """Count one usage report."""
        self.reports += 1
        figures: Figures = (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens,
                            usage.cache_write_tokens)
        if usage.cumulative:
            self._cumulative[usage.model] = figures
            self._added.setdefault(usage.model, [0, 0, 0, 0])  # keeps the model's first place
        else:
            added = self._added.setdefault(usage.model, [0, 0, 0, 0])
            for i, n in enumerate(figures):
                added[i] += n
        if usage.cost is not None and usage.currency:
            self._costs[usage.currency] = self._costs.get(usage.currency, Decimal(0)) + usage.cost

    def tool_call(self) -> None:
        """Count a tool call as it starts."""
        self.tool_calls += 1

    def snapshot(self, wall_seconds: float | None = None) -> TurnUsage:
        """What the turn has spent so far."""
        models = []
        for model, added in self._added.items():
            latest = self._cumulative.get(model, _ZERO)
            before = self.base.get(model, _ZERO)
            own = [a + max(0, c - b) for a, c, b in zip(added, latest, before, strict=True)]
            models.append(ModelTokens(model, *own))
        return TurnUsage(tuple(models), tuple(self._costs.items()), self.tool_calls, wall_seconds, self.reports)


# ---------------------------------------------------------------- what turns spent, stored and summed


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """What one ended turn spent, as the store keeps it (``turn_usage``, one row a turn)."""

    turn: str
    channel: str
    agent: str
    day: str
    """The UTC day it ended on (``YYYY-MM-DD``): what the daily sums and budgets go by."""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    tool_calls: int = 0
    wall_seconds: float | None = None
    cost: Decimal | None = None
    """The turn's cost in ``currency`` (the CLI's own, or priced by ``[prices]``); None: unknown."""
    currency: str | None = None
    models: tuple[str, ...] = ()
    budget: str | None = None
    """The budget that stopped it (``tokens``, ``cost``, ``tool_calls``), if one did."""

    @property
    def tokens(self) -> int:
        """Every token of the turn."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


def turn_record(turn: str, channel: str, agent: str, day: str, usage: TurnUsage, *, cost: Decimal | None,
                currency: str | None, budget: str | None = None) -> TurnRecord:
    """The stored form of a turn's :class:`TurnUsage`."""
    return TurnRecord(turn, channel, agent, day, usage.input_tokens, usage.output_tokens, usage.cache_read_tokens,
                      usage.cache_write_tokens, usage.tool_calls, usage.wall_seconds, cost,
                      currency if cost is not None else None,
                      tuple(m.model for m in usage.models if m.model is not None), budget)


def sum_by_day(records: Iterable[TurnRecord]) -> list[dict[str, object]]:
    """The records summed per day, channel and agent (oldest day first), as the API answers:
    turns, each kind of tokens, tool calls, wall time, the cost per currency (a decimal's text)
    and ``unpriced``, the turns whose cost is not known (their sum is then a floor)."""
    sums: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        row = sums.setdefault((r.day, r.channel, r.agent), {
            "day": r.day, "channel": r.channel, "agent": r.agent, "turns": 0, "tokens": 0, "input_tokens": 0,
            "output_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0, "tool_calls": 0,
            "wall_seconds": 0.0, "cost": {}, "unpriced": 0, "stopped_by_budget": 0,
        })
        row["turns"] += 1
        row["tokens"] += r.tokens
        for key in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "tool_calls"):
            row[key] += getattr(r, key)
        row["wall_seconds"] += r.wall_seconds or 0.0
        if r.cost is not None and r.currency is not None:
            row["cost"][r.currency] = row["cost"].get(r.currency, Decimal(0)) + r.cost
        elif r.tokens:
            row["unpriced"] += 1
        row["stopped_by_budget"] += r.budget is not None
    out = []
    for day_channel_agent in sorted(sums):
        row = sums[day_channel_agent]
        row["cost"] = {currency: str(amount) for currency, amount in sorted(row["cost"].items())}
        row["wall_seconds"] = round(row["wall_seconds"], 3)
        out.append(row)
    return out
