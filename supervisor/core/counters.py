"""corral's counters since start: turns begun and ended by agent, stops by result and duration.

The supervisor counts into :class:`Metrics` in the step that decides each turn and stop; the
serving face renders them (``GET /metrics``, :mod:`supervisor.serve.metrics`). Plain values, no I/O.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

#: Seconds: the stop histogram's upper bounds (a stop is tens of milliseconds; a stuck one, seconds).
STOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, math.inf)

@dataclass(slots=True)
class Histogram:
    """Cumulative counts of observations by upper bound, their sum and count."""

    bounds: tuple[float, ...] = STOP_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * len(STOP_BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        """Count one observation."""
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1


@dataclass(slots=True)
class Metrics:
    """corral's counters since start."""

    turns_begun: Counter[str] = field(default_factory=Counter)
    """By agent: turns that took their message off the queue."""
    turns_ended: Counter[str] = field(default_factory=Counter)
    stops: Counter[str] = field(default_factory=Counter)
    """By result: ``ok`` or ``failed``."""
    stop_seconds: Histogram = field(default_factory=Histogram)
    tokens: Counter[tuple[str, str]] = field(default_factory=Counter)
    """By (agent, kind: ``input``, ``output``, ``cache_read``, ``cache_write``): tokens turns used."""
    tool_calls: Counter[str] = field(default_factory=Counter)
    """By agent: tool calls its turns started."""
    cost: dict[tuple[str, str], Decimal] = field(default_factory=dict)
    """By (agent, currency): what its turns cost, where known."""
    budget_stops: Counter[tuple[str, str]] = field(default_factory=Counter)
    """By (agent, budget): turns a spent budget stopped."""

    def spent(self, agent: str, tokens: tuple[int, int, int, int], tool_calls: int, cost: Decimal | None,
              currency: str | None, budget: str | None) -> None:
        """Count what one ended turn spent (fresh input, output, cache read, cache write tokens)."""
        for kind, n in zip(("input", "output", "cache_read", "cache_write"), tokens, strict=True):
            self.tokens[(agent, kind)] += n
        self.tool_calls[agent] += tool_calls
        if cost is not None and currency is not None:
            self.cost[(agent, currency)] = self.cost.get((agent, currency), Decimal(0)) + cost
        if budget is not None:
            self.budget_stops[(agent, budget)] += 1

    def stopped(self, ok: bool, elapsed_ms: float) -> None:
        """Count one stop's answer."""
        self.stops["ok" if ok else "failed"] += 1
        self.stop_seconds.observe(elapsed_ms / 1000)
