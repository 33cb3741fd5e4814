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

What a person reads of it is one line, made here for every surface (``corral tail``, ``status``,
the dashboard, the bridges), so they agree: :func:`usage_line` ("12,340 tokens in · 812 out ·
3 tools · $0.041 · 38 s · claude-sonnet-4"), what is not known left out, and no money where
the cost is not known; :func:`usage_entry` is the entry that ends a turn whose CLI reported its
usage; :func:`spend_line` is a day's sum. A model's name comes from the CLI, which is not
trusted: :func:`model_name` keeps it to a short run of the characters model names use, so it
cannot carry markup, a mention's brackets, a control code or a second line into any of them.
"""

from __future__ import annotations

import re
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
    ``unpriced``, the turns whose cost is not known (their sum is then a floor), and ``line``,
    the sum as a person reads it (:func:`spend_line`)."""
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
        row["line"] = spend_line(row)
        out.append(row)
    return out


# ---------------------------------------------------------------- what a person reads

#: The characters a model's name keeps (each run of any other becomes one ``?``), and its length.
_NOT_MODEL = re.compile(r"[^A-Za-z0-9._:/+@-]+")
MODEL_CHARS = 48
#: The currencies written with their sign before the amount; any other follows it, by code.
_SIGNS = {"USD": "$", "EUR": "€", "GBP": "£"}


def model_name(name: str) -> str:
    """A CLI's model name as a line may show it: letters, digits and ``._:/+@-`` (a run of
    anything else, markup, brackets, controls or a newline among them, becomes one ``?``), at
    most :data:`MODEL_CHARS` characters."""
    kept = _NOT_MODEL.sub("?", name)
    return kept if len(kept) <= MODEL_CHARS else kept[:MODEL_CHARS - 1] + "…"


def money(amount: Decimal, currency: str) -> str:
    """``$0.041``, ``$1.20``, ``0.50 CHF``: cents from a unit up, two significant digits below it."""
    if amount == 0:
        text = "0"
    elif abs(amount) >= 1:
        text = f"{amount:,.2f}"
    else:
        text = f"{amount.quantize(Decimal(1).scaleb(amount.adjusted() - 1)):f}"
    sign = _SIGNS.get(currency)
    return f"{sign}{text}" if sign else f"{text} {currency}"


def duration(seconds: float) -> str:
    """``0.4 s``, ``38 s``, ``2 min 5 s``, ``1 h 2 min``."""
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def _counted(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _tokens(input_tokens: int, cache_read: int, cache_write: int, output_tokens: int) -> list[str]:
    """What the model read (fresh, from the cache, into it) and wrote; nothing if it used none."""
    read = input_tokens + cache_read + cache_write
    if not read and not output_tokens:
        return []
    cached = ", ".join(part for part in (f"{cache_read:,} cached" if cache_read else "",
                                         f"{cache_write:,} to cache" if cache_write else "") if part)
    return [f"{read:,} tokens in" + (f" ({cached})" if cached else ""), f"{output_tokens:,} out"]


def usage_line(record: TurnRecord) -> str:
    """One turn's usage as a person reads it: tokens in (of them cached, and written to the
    cache) and out, tool calls, cost, wall time, models; each left out where not known (no
    tokens reported, no tool called, no cost known, not timed, no model named)."""
    parts = _tokens(record.input_tokens, record.cache_read_tokens, record.cache_write_tokens, record.output_tokens)
    if record.tool_calls:
        parts.append(_counted(record.tool_calls, "tool", "tools"))
    if record.cost is not None and record.currency is not None:
        parts.append(money(record.cost, record.currency))
    if record.wall_seconds is not None:
        parts.append(duration(record.wall_seconds))
    if record.models:
        parts.append(", ".join(model_name(m) for m in record.models))
    return " · ".join(parts)


def usage_json(record: TurnRecord) -> dict[str, object]:
    """A turn's record as an entry's ``meta`` (and the API) carry it: the figures, the cost as a
    decimal's text (None: not known) and the line :func:`usage_line` makes of them."""
    return {"agent": record.agent, "input_tokens": record.input_tokens, "output_tokens": record.output_tokens,
            "cache_read_tokens": record.cache_read_tokens, "cache_write_tokens": record.cache_write_tokens,
            "tokens": record.tokens, "tool_calls": record.tool_calls,
            "wall_seconds": None if record.wall_seconds is None else round(record.wall_seconds, 3),
            "cost": None if record.cost is None else str(record.cost), "currency": record.currency,
            "models": list(record.models), "budget": record.budget, "line": usage_line(record)}


def usage_entry(record: TurnRecord, usage: TurnUsage) -> tuple[str, dict[str, object]] | None:
    """The ``status`` entry that ends a turn whose CLI reported its usage: its text ("AGENT used
    LINE") and its ``meta`` (``{"usage": ...}``, :func:`usage_json`); None when the CLI reported
    none (a line of tool calls and time alone would follow every turn of an agent that says
    nothing of its tokens: those are still stored, for ``corral usage``)."""
    if not usage.reports:
        return None
    return f"{record.agent} used {usage_line(record)}", {"usage": usage_json(record)}


def spend_line(row: Mapping[str, Any]) -> str:
    """A day's sum (a row of :func:`sum_by_day`) as a person reads it: turns, tokens, tool
    calls, the cost per currency (a floor, said so, when some turns were not priced), wall time."""
    parts = [_counted(int(row["turns"]), "turn", "turns")]
    parts += _tokens(int(row["input_tokens"]), int(row["cache_read_tokens"]), int(row["cache_write_tokens"]),
                     int(row["output_tokens"]))
    if row["tool_calls"]:
        parts.append(_counted(int(row["tool_calls"]), "tool", "tools"))
    costs = [money(Decimal(amount), currency) for currency, amount in row["cost"].items()]
    if costs and row["unpriced"]:
        costs[-1] += f" (and {_counted(int(row['unpriced']), 'turn', 'turns')} not priced)"
    elif row["unpriced"]:
        costs.append("cost not known")
    parts += costs
    parts.append(duration(float(row["wall_seconds"])))
    return " · ".join(parts)
