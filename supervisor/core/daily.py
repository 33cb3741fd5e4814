"""Daily budgets: what a channel, or an agent, may spend in one UTC day, and today's spend.

Pure: no Trio, no I/O. ``max_daily_tokens`` and ``max_daily_cost`` in ``[agents.X]`` and
``[channels.X]`` (:class:`DailyLimits`) bound the sum of the day's ended turns, every channel
of an agent or every agent of a channel. The host fills a :class:`DailyTally` from the store's
``turn_usage`` rows of today at start and adds each turn's :class:`~.usage.TurnRecord` as the
turn ends; before a lane takes its next message it asks :meth:`DailyTally.spent`. A spent
budget does not stop a running turn (the per-turn budgets do that): it refuses the *next*
turns of that channel or agent, whose messages stay queued until the next UTC day
(:func:`seconds_to_midnight`) or a ``corral budget reset`` (:meth:`DailyTally.reset`).

A turn is counted on the day it ended (its record's ``day``). The tally holds one day: a
record or a question of a later day starts the new day from nothing, and a record of an
earlier day is not counted (it ended before midnight, so it belongs to a day that is over).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from .budget import DEFAULT_CURRENCY
from .usage import TurnRecord

Scope = Literal["agent", "channel"]


@dataclass(frozen=True, slots=True)
class DailyLimits:
    """What an agent, or a channel, may spend in one UTC day; None: no such budget."""

    max_daily_tokens: int | None = None
    max_daily_cost: Decimal | None = None
    currency: str = DEFAULT_CURRENCY
    """The currency of ``max_daily_cost``."""

    @property
    def any(self) -> bool:
        """Whether any daily budget is set."""
        return self.max_daily_tokens is not None or self.max_daily_cost is not None


#: No daily budget (a table without ``max_daily_*`` keys).
NO_DAILY = DailyLimits()


@dataclass(frozen=True, slots=True)
class DailySpent:
    """A daily budget that is spent: whose, which, and by how much."""

    scope: Scope
    name: str
    budget: Literal["tokens", "cost"]
    used: int | Decimal
    limit: int | Decimal
    currency: str = DEFAULT_CURRENCY

    @property
    def amounts(self) -> str:
        """``51,200 of 50,000 tokens``, or ``$5.10 of $5``."""
        if self.budget == "tokens":
            return f"{self.used:,} of {self.limit:,} tokens"
        return f"{_money(Decimal(self.used), self.currency)} of {_money(Decimal(self.limit), self.currency)}"

    def waiting_text(self, waiting: Sequence[int]) -> str:
        """The status entry of a lane that does not take its messages (``waiting``: their entries)."""
        which = ", ".join(str(seq) for seq in waiting)
        what = f"message {which} waits" if len(waiting) == 1 else f"messages {which} wait"
        return (f"Waiting: {self.scope} {self.name}'s daily budget is spent ({self.amounts} today), so {what}; "
                f"it runs after 00:00 UTC or `corral budget reset {self.name}`.")

    def as_json(self) -> dict[str, object]:
        """The same, as the API and an entry's ``meta`` carry it."""
        return {"scope": self.scope, "name": self.name, "budget": self.budget, "used": str(self.used),
                "limit": str(self.limit), "currency": self.currency if self.budget == "cost" else None}


def _money(amount: Decimal, currency: str) -> str:
    text = f"{amount:,.2f}" if amount == amount.quantize(Decimal("0.01")) else f"{amount:,f}"
    return f"${text}" if currency == DEFAULT_CURRENCY else f"{text} {currency}"


def utc_day(now: float | None = None) -> str:
    """The UTC day of ``now`` (seconds since the epoch; None: now), ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))


def seconds_to_midnight(now: float) -> float:
    """Seconds from ``now`` (since the epoch) to the next 00:00 UTC (never 0: at midnight, a day)."""
    return 86_400 - now % 86_400


@dataclass(slots=True)
class DailyTally:
    """Today's spend per agent and per channel (see the module's docstring)."""

    day: str = ""
    tokens: dict[tuple[Scope, str], int] = field(default_factory=dict)
    costs: dict[tuple[Scope, str, str], Decimal] = field(default_factory=dict)

    def _roll(self, day: str) -> bool:
        """Move to ``day`` if it is later; False: ``day`` is over (before the tally's)."""
        if day > self.day:
            self.day = day
            self.tokens.clear()
            self.costs.clear()
        return day == self.day

    def add(self, record: TurnRecord) -> None:
        """Count an ended turn (on its record's day)."""
        if not self._roll(record.day):
            return
        keys: tuple[tuple[Scope, str], ...] = (("agent", record.agent), ("channel", record.channel))
        for scope, name in keys:
            self.tokens[(scope, name)] = self.tokens.get((scope, name), 0) + record.tokens
            if record.cost is not None and record.currency is not None:
                ckey = (scope, name, record.currency)
                self.costs[ckey] = self.costs.get(ckey, Decimal(0)) + record.cost

    def add_all(self, records: Iterable[TurnRecord]) -> None:
        """Count each record (the store's rows of today, at start)."""
        for record in records:
            self.add(record)

    def reset(self, name: str | None = None) -> list[str]:
        """Forget today's spend of the channel or agent ``name`` (None: of every one); the
        names it forgot (``agent X`` / ``channel X``), so that a reset of nothing is said."""
        gone = sorted({f"{s} {n}" for s, n in self.tokens if name is None or n == name}
                      | {f"{s} {n}" for s, n, _ in self.costs if name is None or n == name})
        self.tokens = {k: v for k, v in self.tokens.items() if name is not None and k[1] != name}
        self.costs = {k: v for k, v in self.costs.items() if name is not None and k[1] != name}
        return gone

    def used(self, scope: Scope, name: str, currency: str, day: str) -> tuple[int, Decimal]:
        """Tokens and cost (in ``currency``) spent by ``name`` on ``day``."""
        if not self._roll(day):
            return 0, Decimal(0)
        return self.tokens.get((scope, name), 0), self.costs.get((scope, name, currency), Decimal(0))

    def spent(self, channel: str, agent: str, *, agent_limits: DailyLimits, channel_limits: DailyLimits,
              day: str) -> DailySpent | None:
        """The first daily budget of the lane that is spent (the agent's, then the channel's),
        or None: its next turn may start. Spent means reached: a budget of 50,000 tokens
        with 50,000 used lets no more turns start."""
        lanes: tuple[tuple[Scope, str, DailyLimits], ...] = (
            ("agent", agent, agent_limits), ("channel", channel, channel_limits))
        for scope, name, limits in lanes:
            if not limits.any:
                continue
            tokens, cost = self.used(scope, name, limits.currency, day)
            if limits.max_daily_tokens is not None and tokens >= limits.max_daily_tokens:
                return DailySpent(scope, name, "tokens", tokens, limits.max_daily_tokens)
            if limits.max_daily_cost is not None and cost >= limits.max_daily_cost:
                return DailySpent(scope, name, "cost", cost, limits.max_daily_cost, limits.currency)
        return None
