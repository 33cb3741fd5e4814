"""A turn's budget: how many tokens, how much money and how many tool calls it may spend.

Theory of operation
-------------------

Pure: no Trio, no I/O. A turn has :class:`TurnLimits` (``max_turn_tokens``, ``max_turn_cost``,
``max_turn_tool_calls``; the tightest of the agent's, the channel's and ``[server]``'s:
:meth:`TurnLimits.tightest`). After each usage report and each tool call its I/O side takes
a snapshot of the turn's :class:`~.usage.Meter` and asks :func:`spent`: ``None`` while every
budget holds, else a frozen :class:`BudgetSpent` naming the first that ran out, with the one
notice the channel gets ("Stopped: this turn used 51,200 of its 50,000 tokens."). A budget is
a maximum: a turn may use exactly that much; one token (or cent, or call) more ends it.
The decision only grows with the turn: a usage that includes another's is never under a
budget the other is over (the property tests hold it to that).

Money. A CLI that prices its own calls (Claude Code, and others sometimes) reports a cost;
where it does not, a price table (``[prices]`` per model: currency per million input,
output, cache-read and cache-write tokens: :class:`Price`) prices the tokens. A turn's
cost (:func:`turn_cost`) is the larger of the two where both are known (the CLI's own figure
can come only at the end, the priced one as the tokens come), the one known otherwise, and
unknown when neither is: a money budget then cannot act. So a money budget for an agent
whose cost cannot be known is refused before any turn runs (:func:`money_budget_refusal`:
fail closed, never silently ignored).

When each CLI reports (measured with the captures in ``tests/data/captures``; see each
adapter's docstring): a budget can act only on what has been reported, so where usage comes
only at the end, a token or cost budget stops the turn only then — its tool-call budget
(every tool call is seen as it starts) and its time limits still stop it mid-turn.

===================  ==================================  ==================================
CLI (adapter)        tokens                              its own cost
===================  ==================================  ==================================
Claude Code          as it goes: each model call's       at the end only (the result's
(``claude``)         input as it starts, its output as   ``total_cost_usd``)
                     it ends; the result tops up
Codex                **at the end only**                 none
(``codex exec``)     (``turn.completed``)
Gemini CLI           **at the end only** (the result's   none
(``gemini``)         ``stats``)
Qwen Code            as it goes (each message)           none
(``qwen``)
pi (``pi``)          as it goes (each message)           as it goes, for the models pi
                                                         has prices for (not a
                                                         ``base_url`` model)
Aider (``aider``)    as it goes (each model call's       as it goes, for the models
                     ``Tokens:`` line, rounded)          litellm has prices for
ACP agents           **at the end only** (the prompt     claude-agent-acp: at the end
(``acp``)            answer's ``usage``; ACP's           (``usage_update``'s ``cost``);
                     ``usage_update`` ``used`` is the    the others captured send none
                     context window's fill, not spend)
===================  ==================================  ==================================

Over ACP the same CLIs report *later* than their own print modes: Claude Code and Qwen Code
report each model call in stream-json, but claude-agent-acp and ``qwen --acp`` report a
turn's tokens only with the prompt's answer (qwen's not at all, in the captures); Codex
and Gemini CLI report at the end either way. :data:`REPORTING` holds this table as data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal, TypeVar

from .usage import ModelTokens, TurnUsage

#: Tokens a price is quoted for.
PER_TOKENS = Decimal(1_000_000)

#: The currency a budget and a price are in unless they say otherwise.
DEFAULT_CURRENCY = "USD"


# ---------------------------------------------------------------- when each CLI reports


@dataclass(frozen=True, slots=True)
class Reporting:
    """When a CLI reports its usage (see the module docstring's table)."""

    tokens: Literal["as_it_goes", "at_the_end"]
    cost: Literal["always", "when_priced", "never"]
    """``always``: the CLI prices every turn itself; ``when_priced``: only for models it has
    prices for, which corral cannot tell beforehand; ``never``: it reports no cost."""


#: By adapter, and ``acp:PRESET`` for an ACP agent's preset (``acp`` alone: any other).
REPORTING: Mapping[str, Reporting] = {
    "claude": Reporting("as_it_goes", "always"),
    "codex": Reporting("at_the_end", "never"),
    "gemini": Reporting("at_the_end", "never"),
    "qwen": Reporting("as_it_goes", "never"),
    "pi": Reporting("as_it_goes", "when_priced"),
    "aider": Reporting("as_it_goes", "when_priced"),
    "acp:claude": Reporting("at_the_end", "always"),
    "acp": Reporting("at_the_end", "never"),
}

#: What is assumed of an adapter the table does not name (``generic``, ``demo``): nothing.
UNKNOWN_REPORTING = Reporting("at_the_end", "never")


def reporting(adapter: str, preset: str | None = None) -> Reporting:
    """When the agent's CLI reports its usage: its row of :data:`REPORTING`."""
    if adapter == "acp":
        return REPORTING.get(f"acp:{preset}", REPORTING["acp"])
    return REPORTING.get(adapter, UNKNOWN_REPORTING)


# ---------------------------------------------------------------- prices


@dataclass(frozen=True, slots=True)
class Price:
    """A model's price per million tokens (``[prices."MODEL"]``), in ``currency``.

    ``cache_read`` and ``cache_write`` default to the input price: a table that does not
    know the cache's discount over-prices it rather than pricing it at nothing."""

    input: Decimal
    output: Decimal
    cache_read: Decimal | None = None
    cache_write: Decimal | None = None
    currency: str = DEFAULT_CURRENCY

    def cost(self, tokens: ModelTokens) -> Decimal:
        """The price of ``tokens``."""
        read = self.input if self.cache_read is None else self.cache_read
        write = self.input if self.cache_write is None else self.cache_write
        total = (tokens.input_tokens * self.input + tokens.output_tokens * self.output
                 + tokens.cache_read_tokens * read + tokens.cache_write_tokens * write)
        return total / PER_TOKENS


#: ``[prices]``: a model's name, as the CLI or the agent's ``model`` names it, to its price.
Prices = Mapping[str, Price]


def priced_cost(usage: TurnUsage, prices: Prices, currency: str = DEFAULT_CURRENCY) -> Decimal | None:
    """The turn's tokens priced by the table; None unless every model that used any has a
    price in ``currency`` (a part priced would be a cost too low to budget on)."""
    total = Decimal(0)
    for tokens in usage.models:
        if not tokens.tokens:
            continue
        price = prices.get(tokens.model) if tokens.model is not None else None
        if price is None or price.currency != currency:
            return None
        total += price.cost(tokens)
    return total


def priced_floor(usage: TurnUsage, prices: Prices, currency: str = DEFAULT_CURRENCY) -> Decimal:
    """What the table prices of the turn's tokens, models without a price left out: less than
    or equal to its cost, so a budget it already passes is spent (a model the table does not
    know, met mid-turn, must not turn a spent budget back into an unknown one)."""
    total = Decimal(0)
    for tokens in usage.models:
        price = prices.get(tokens.model) if tokens.model is not None else None
        if tokens.tokens and price is not None and price.currency == currency:
            total += price.cost(tokens)
    return total


def turn_cost(usage: TurnUsage, prices: Prices, currency: str = DEFAULT_CURRENCY) -> Decimal | None:
    """The turn's cost in ``currency``: the larger of the CLI's own and the table's, where
    both are known; the one known; None when neither is (see the module docstring)."""
    known = [c for c in (usage.cost(currency), priced_cost(usage, prices, currency)) if c is not None]
    return max(known) if known else None


# ---------------------------------------------------------------- the limits and the decision


@dataclass(frozen=True, slots=True)
class TurnLimits:
    """What one turn may spend; None: no such budget."""

    max_turn_tokens: int | None = None
    max_turn_cost: Decimal | None = None
    max_turn_tool_calls: int | None = None
    currency: str = DEFAULT_CURRENCY
    """The currency of ``max_turn_cost``."""

    @property
    def any(self) -> bool:
        """Whether any budget is set."""
        return (self.max_turn_tokens, self.max_turn_cost, self.max_turn_tool_calls) != (None, None, None)

    def tightest(self, other: TurnLimits) -> TurnLimits:
        """The smaller of each budget of the two (the agent's, the channel's, ``[server]``'s).

        ``ValueError`` for two money budgets in different currencies: neither is tighter."""
        if self.max_turn_cost is not None and other.max_turn_cost is not None and self.currency != other.currency:
            raise ValueError(f"max_turn_cost in {self.currency} and in {other.currency}: use one currency")
        currency = self.currency if self.max_turn_cost is not None else other.currency
        return TurnLimits(_least(self.max_turn_tokens, other.max_turn_tokens),
                          _least(self.max_turn_cost, other.max_turn_cost),
                          _least(self.max_turn_tool_calls, other.max_turn_tool_calls), currency)


#: No budget at all (what a table without ``max_turn_*`` keys has).
NO_LIMITS = TurnLimits()

N = TypeVar("N", int, Decimal)


def _least(a: N | None, b: N | None) -> N | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


Budget = Literal["tokens", "cost", "tool_calls"]


@dataclass(frozen=True, slots=True)
class BudgetSpent:
    """A budget ran out: stop the turn, and tell the channel ``notice``."""

    budget: Budget
    used: int | Decimal
    limit: int | Decimal
    notice: str


def spent(limits: TurnLimits, usage: TurnUsage, prices: Prices | None = None) -> BudgetSpent | None:
    """The first budget (tokens, cost, tool calls) the turn has gone past; None if none."""
    if limits.max_turn_tokens is not None and usage.tokens > limits.max_turn_tokens:
        return BudgetSpent("tokens", usage.tokens, limits.max_turn_tokens,
                           f"Stopped: this turn used {usage.tokens:,} of its {limits.max_turn_tokens:,} tokens.")
    if limits.max_turn_cost is not None:
        known = turn_cost(usage, prices or {}, limits.currency)
        floor = priced_floor(usage, prices or {}, limits.currency)
        cost = floor if known is None else max(known, floor)
        if cost > limits.max_turn_cost:
            used, limit = money_pair(cost, limits.max_turn_cost, limits.currency)
            return BudgetSpent("cost", cost, limits.max_turn_cost, f"Stopped: this turn cost {used} of its {limit}.")
    if limits.max_turn_tool_calls is not None and usage.tool_calls > limits.max_turn_tool_calls:
        return BudgetSpent("tool_calls", usage.tool_calls, limits.max_turn_tool_calls,
                           f"Stopped: this turn started {usage.tool_calls:,} tool calls, "
                           f"over its {limits.max_turn_tool_calls:,}.")
    return None


#: Most decimals a notice shows of an amount.
MAX_DECIMALS = 6


def money_pair(used: Decimal, limit: Decimal, currency: str) -> tuple[str, str]:
    """``used`` and ``limit`` as the notice shows them: to the cent (or to the limit's own last
    decimal, so a budget of $0.004 never reads as $0.00), or with as many more decimals as it
    takes for an amount over the limit not to read as equal to it."""
    exponent = limit.normalize().as_tuple().exponent
    first = min(max(2, -exponent if isinstance(exponent, int) else 2), MAX_DECIMALS)
    for places in range(first, MAX_DECIMALS + 1):
        shown = (_money(used, places, currency), _money(limit, places, currency))
        if shown[0] != shown[1]:
            return shown
    return shown


def _money(amount: Decimal, places: int, currency: str) -> str:
    text = f"{amount:,.{places}f}"
    if places > 2:
        text = text.rstrip("0")
        text = text if len(text.rpartition(".")[2]) >= 2 else f"{amount:,.2f}"
    return f"${text}" if currency == "USD" else f"{text} {currency}"


# ---------------------------------------------------------------- fail closed


def money_budget_refusal(
    agent: str, limits: TurnLimits, *, adapter: str, preset: str | None, model: str | None, prices: Prices
) -> str | None:
    """Why ``agent``'s money budget must be refused (its cost cannot be known), or None.

    A budget on what nobody can measure would never stop anything: refused unless the CLI
    prices every turn itself, or the price table prices the agent's model in the budget's
    currency. A CLI that prices only the models it knows cannot be relied on beforehand."""
    if limits.max_turn_cost is None:
        return None
    if reporting(adapter, preset).cost == "always" and limits.currency == DEFAULT_CURRENCY:
        return None
    price = prices.get(model) if model is not None else None
    if price is not None and price.currency == limits.currency:
        return None
    what = f"{adapter} (preset {preset})" if adapter == "acp" and preset else adapter
    why = f"{what} reports no cost of its own that can be relied on"
    if model is None:
        why += ", and the agent names no model to price"
        fix = 'set the agent\'s model and a [prices."MODEL"] entry for it'
    else:
        why += f", and [prices] has no {limits.currency} price for {model!r}"
        fix = f'add [prices."{model}"] with input and output per million tokens'
    return (f"agents.{agent}: max_turn_cost cannot be enforced: {why}. Fix: {fix}, "
            "or remove max_turn_cost")
