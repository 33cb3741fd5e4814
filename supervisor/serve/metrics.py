"""``GET /metrics``: what runs and waits, the limits, stops and turns, in Prometheus' text format.

The counters live in :class:`~supervisor.core.counters.Metrics` (the supervisor counts turns
and stops into it, in the step that decides them); the gauges are read from
``Supervisor.summary()`` (counts, never every channel's state) when the page is asked for.
The text format (``# HELP``, ``# TYPE``, one sample a line, a histogram's cumulative
``_bucket{le=…}`` lines with ``_sum`` and ``_count``) is written here directly: it is a few
lines of code, and the client library would add a dependency and a registry of its own for
them. No label has a channel's name: a fleet's thousands of channels would be as many
series; channels are counted instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.counters import Metrics

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    return repr(float(value)) if isinstance(value, float) and not value.is_integer() else str(int(value))


class _Page:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_: str, samples: Iterable[tuple[Mapping[str, str], float]]) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            self.sample(name, labels, value)

    def sample(self, name: str, labels: Mapping[str, str], value: float) -> None:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}")


def render(summary: Mapping[str, Any], metrics: Metrics) -> str:
    """The page, from ``Supervisor.summary()`` (counts, not every channel's state) and the counters."""
    page = _Page()
    capacity = summary.get("capacity") or {}
    agents = sorted(summary.get("agents") or ())
    running: Mapping[str, int] = summary.get("running_by_agent") or {}
    waiting: Mapping[str, int] = summary.get("waiting_by_agent") or {}
    channels_running = summary.get("channels_running", 0)
    channels_waiting = summary.get("channels_waiting", 0)
    page.metric("corral_turns_running", "gauge", "Turns running now, by agent.",
                (({"agent": a}, running.get(a, 0)) for a in agents))
    page.metric("corral_turns_waiting", "gauge", "Turns waiting for a slot now, by agent.",
                (({"agent": a}, waiting.get(a, 0)) for a in agents))
    page.metric("corral_channels_running", "gauge", "Channels with a turn running.", [({}, channels_running)])
    page.metric("corral_channels_waiting", "gauge", "Channels with a turn waiting for a slot.",
                [({}, channels_waiting)])
    if capacity:
        page.metric("corral_max_turns", "gauge", "The host's turn limit ([server] max_turns).",
                    [({}, capacity["max_turns"])])
        page.metric("corral_slots_used", "gauge", "Slots taken: running turns and idle ACP agents.",
                    [({}, capacity["used"])])
        page.metric("corral_acp_agents_idle", "gauge", "Idle ACP agents holding a slot.",
                    [({}, capacity["residents"])])
        limited = [(name, a["max_concurrent"]) for name, a in sorted(capacity.get("agents", {}).items())
                   if a.get("max_concurrent") is not None]
        page.metric("corral_agent_max_concurrent", "gauge", "An agent's limit (max_concurrent), where set.",
                    (({"agent": name}, cap) for name, cap in limited))
        page.metric("corral_memory_reserve_bytes", "gauge", "[server] memory_reserve.",
                    [({}, capacity["memory_reserve"])])
        memory = capacity.get("memory")
        if memory:
            page.metric("corral_memory_available_bytes", "gauge", "Memory a new turn could use, at the last reading.",
                        [({"source": memory["source"]}, memory["available"])])
    page.metric("corral_turns_begun_total", "counter", "Turns begun (their message taken off the queue), by agent.",
                (({"agent": a}, metrics.turns_begun[a]) for a in sorted(set(agents) | set(metrics.turns_begun))))
    page.metric("corral_turns_ended_total", "counter", "Turns ended, by agent.",
                (({"agent": a}, metrics.turns_ended[a]) for a in sorted(set(agents) | set(metrics.turns_ended))))
    page.metric("corral_tokens_total", "counter", "Tokens turns used, as their CLIs reported, by agent and kind.",
                (({"agent": a, "kind": k}, n) for (a, k), n in sorted(metrics.tokens.items())))
    page.metric("corral_tool_calls_total", "counter", "Tool calls turns started, by agent.",
                (({"agent": a}, n) for a, n in sorted(metrics.tool_calls.items())))
    page.metric("corral_cost_total", "counter", "What turns cost, where known, by agent and currency.",
                (({"agent": a, "currency": c}, float(v)) for (a, c), v in sorted(metrics.cost.items())))
    page.metric("corral_budget_stops_total", "counter", "Turns a spent budget stopped, by agent and budget.",
                (({"agent": a, "budget": b}, n) for (a, b), n in sorted(metrics.budget_stops.items())))
    page.metric("corral_stops_total", "counter", "Stops answered, by result.",
                (({"result": r}, metrics.stops[r]) for r in ("ok", "failed")))
    histogram = metrics.stop_seconds
    page.lines += ["# HELP corral_stop_seconds How long a stop took, from the call to its answer.",
                   "# TYPE corral_stop_seconds histogram"]
    for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
        page.sample("corral_stop_seconds_bucket", {"le": _number(bound)}, count)
    page.sample("corral_stop_seconds_sum", {}, histogram.total)
    page.sample("corral_stop_seconds_count", {}, histogram.n)
    return "\n".join(page.lines) + "\n"
