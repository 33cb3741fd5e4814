"""Usage per turn from each CLI's own reports: every parser against the real captures.

Each test replays a capture of a real CLI (``tests/data/captures``) through its adapter's
parser and checks the :class:`~adapters._base.Usage` events: what they add up to (the CLI's own
totals, never a figure twice), when they come (as the turn goes, or only at its end), and that
a stream with no usage in it gives none. The other events of the same captures are checked by
each adapter's own tests.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from test_acp_protocol import replay as acp_replay

from adapters import get_adapter
from adapters._base import Event, Launch, ToolUse, TurnRequest, Usage
from adapters.acp import AcpConnection, acp_settings
from adapters.aider import AiderParser
from supervisor.turns.agents import AcpAgent

CAPTURES = Path(__file__).parent / "data" / "captures"


def request(agent: str, **kw: object) -> TurnRequest:
    base: dict[str, object] = dict(prompt="p", channel="c", turn_id="t", agent=agent, command=(agent,))
    base.update(kw)
    return TurnRequest(**base)  # type: ignore[arg-type]


def feed(adapter: str, lines: list[str], **kw: object) -> list[Event]:
    """Every event of ``lines`` fed to a fresh parser of ``adapter`` (stdout only, no finish)."""
    parser = get_adapter(adapter).new_parser(request(adapter, **kw))
    return [e for line in lines for e in parser.feed(line)]


def capture(cli: str, name: str) -> list[str]:
    return (CAPTURES / cli / name).read_text(encoding="utf-8", errors="replace").splitlines()


def usages(events: list[Event]) -> list[Usage]:
    return [e for e in events if isinstance(e, Usage)]


def total(events: list[Event]) -> tuple[int, int, int, int, Decimal | None]:
    """The figures the Usage events add up to, and their cost (None: none priced)."""
    found = usages(events)
    costs = [u.cost for u in found if u.cost is not None]
    return (sum(u.input_tokens for u in found), sum(u.output_tokens for u in found),
            sum(u.cache_read_tokens for u in found), sum(u.cache_write_tokens for u in found),
            sum(costs, Decimal(0)) if costs else None)


# ---------------------------------------------------------------- Claude Code


CLAUDE_WITH_RESULT = ["text", "model", "tool", "tool-error", "todos", "background", "attended-tool",
                      "interrupted", "interrupted-tree", "resume-1", "resume-2"]


@pytest.mark.parametrize("name", CLAUDE_WITH_RESULT)
def test_claude_usage_adds_up_to_its_result_line_and_no_more(name: str) -> None:
    """Per-message usage then the result's totals: the sum is the result's usage and
    ``total_cost_usd``, exactly (the result wins; nothing is counted twice)."""
    lines = capture("claude", f"{name}.jsonl")
    result = json.loads(next(line for line in lines if '"type":"result"' in line))
    usage = result["usage"]
    expected = (usage["input_tokens"], usage["output_tokens"], usage["cache_read_input_tokens"],
                usage["cache_creation_input_tokens"], Decimal(str(result["total_cost_usd"])))
    assert total(feed("claude", lines)) == expected


def test_claude_reports_a_model_calls_input_as_it_goes() -> None:
    """The tool capture: each model call's input comes with its message, before its tool call,
    and the cost only with the result (Claude Code reports no cost before it)."""
    events = feed("claude", capture("claude", "tool.jsonl"))
    first_tool = next(i for i, e in enumerate(events) if isinstance(e, ToolUse))
    before = usages(events[:first_tool])
    assert [(u.input_tokens, u.cost, u.model) for u in before] == [(1686, None, "claude-opus-4-8")]
    assert [u.cost for u in usages(events)] == [None, None, Decimal("0.018625")]


def _stream(event: dict[str, object], parent: str | None = None) -> str:
    return json.dumps({"type": "stream_event", "event": event, "parent_tool_use_id": parent, "session_id": "s"})


def _assistant(mid: str, block: dict[str, object], usage: dict[str, int]) -> str:
    return json.dumps({"type": "assistant", "message": {"id": mid, "model": "m", "content": [block], "usage": usage},
                       "parent_tool_use_id": None, "session_id": "s"})


def test_claude_counts_a_message_once_however_often_it_is_reported() -> None:
    """With partial messages a model call's usage comes at its start, on each of its content
    blocks' ``assistant`` lines and in its ``message_delta``: counted once, each figure at its
    highest, the input as the call starts and the output as it ends."""
    start = {"input_tokens": 1000, "output_tokens": 1, "cache_read_input_tokens": 5000,
             "cache_creation_input_tokens": 200}
    parser = get_adapter("claude").new_parser(request("claude"))
    at_start = parser.feed(_stream({"type": "message_start", "message": {"id": "msg_1", "model": "m", "usage": start}}))
    assert at_start == [Usage(1000, 1, 5000, 200, model="m")]
    again = parser.feed(_assistant("msg_1", {"type": "text", "text": "Let me look."}, start))
    again += parser.feed(_assistant("msg_1", {"type": "tool_use", "id": "tu", "name": "Bash", "input": {}}, start))
    assert usages(again) == []
    at_end = parser.feed(_stream({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                                  "usage": {"output_tokens": 240}}))
    assert at_end == [Usage(0, 239, 0, 0, model="m")]
    # The result's totals say the same: they add nothing but the cost.
    result = {"type": "result", "subtype": "success", "is_error": False, "result": "ok", "session_id": "s",
              "total_cost_usd": 0.01, "usage": {"input_tokens": 1000, "output_tokens": 240,
                                                "cache_read_input_tokens": 5000, "cache_creation_input_tokens": 200}}
    assert usages(parser.feed(json.dumps(result))) == [Usage(cost=Decimal("0.01"), currency="USD")]


def test_claude_counts_a_subagents_calls_apart_from_the_main_stream() -> None:
    """A subagent's stream (``parent_tool_use_id``) writes its own messages: each delta is
    its own message's, and what it spends is the turn's."""
    parser = get_adapter("claude").new_parser(request("claude"))
    usage = {"input_tokens": 10, "output_tokens": 1}
    events = parser.feed(_stream({"type": "message_start", "message": {"id": "main", "usage": usage}}))
    events += parser.feed(_stream({"type": "message_start", "message": {"id": "sub", "usage": usage}}, "task_1"))
    events += parser.feed(_stream({"type": "message_delta", "usage": {"output_tokens": 7}}, "task_1"))
    events += parser.feed(_stream({"type": "message_delta", "usage": {"output_tokens": 3}}))
    assert total(events) == (20, 10, 0, 0, None)


@pytest.mark.parametrize("name", ["stale-session", "bad-session", "api-error-400", "interrupted-silent"])
def test_claude_turn_without_a_model_call_reports_no_usage(name: str) -> None:
    assert usages(feed("claude", capture("claude", f"{name}.jsonl"))) == []


# ---------------------------------------------------------------- Qwen Code


def test_qwen_counts_each_message_as_it_goes() -> None:
    events = feed("qwen", capture("qwen", "tool.jsonl"))
    assert [(u.input_tokens, u.output_tokens, u.model) for u in usages(events)] == [(100, 10, "fake-qwen")] * 2
    first_tool = next(i for i, e in enumerate(events) if isinstance(e, ToolUse))
    assert usages(events[:first_tool])


def test_qwen_resumed_turn_does_not_count_the_sessions_earlier_turns() -> None:
    """After --resume qwen's result line has the whole session's usage (200); the turn's own
    is its one message (100): the result is not counted."""
    lines = capture("qwen", "resume.jsonl")
    assert '"input_tokens":200' in next(line for line in lines if '"type":"result"' in line)
    assert total(feed("qwen", lines)) == (100, 10, 0, 0, None)


# ---------------------------------------------------------------- Codex


def test_codex_reports_only_at_the_end_the_threads_totals() -> None:
    events = feed("codex", capture("codex", "tool.jsonl"), model="gpt-test")
    assert usages(events) == [Usage(200, 20, 0, 0, model="gpt-test", cumulative=True)]
    assert isinstance(events[-2], Usage), "with turn.completed, after every tool call"


def test_codex_resumed_thread_reports_cumulative_totals() -> None:
    """The captured resume made one model call of 100 input tokens and reports 200: the
    thread's, so it is marked cumulative (the account takes the session's earlier totals off)."""
    (usage,) = usages(feed("codex", capture("codex", "resume.jsonl")))
    assert (usage.input_tokens, usage.cumulative) == (200, True)


def test_codex_splits_the_cached_input_out_of_its_input() -> None:
    line = json.dumps({"type": "turn.completed", "usage": {"input_tokens": 1000, "cached_input_tokens": 600,
                                                           "output_tokens": 50, "reasoning_output_tokens": 30}})
    assert usages(feed("codex", [line])) == [Usage(400, 50, 600, 0, cumulative=True)]


@pytest.mark.parametrize("name", ["interrupt_tool", "interrupt_stream", "error_500"])
def test_codex_turn_without_turn_completed_reports_no_usage(name: str) -> None:
    assert usages(feed("codex", capture("codex", f"{name}.jsonl"))) == []


# ---------------------------------------------------------------- Gemini CLI


def test_gemini_reports_each_model_of_its_result_stats() -> None:
    events = feed("gemini", capture("gemini", "tool.jsonl"))
    assert usages(events) == [Usage(12, 5, model="gemini-3.5-flash-lite"), Usage(24, 10, model="gemini-3.8-flash")]
    assert total(events)[:2] == (36, 15)  # the stats' own totals
    assert not usages(events[:-3]), "only with the result line (then its Result)"


def test_gemini_counts_cached_input_apart_and_thoughts_as_output() -> None:
    stats = {"models": {"g": {"total_tokens": 1300, "input_tokens": 1000, "output_tokens": 100, "cached": 400}}}
    line = json.dumps({"type": "result", "status": "success", "stats": stats})
    assert usages(feed("gemini", [line])) == [Usage(600, 300, 400, 0, model="g")]


@pytest.mark.parametrize("name", ["interrupted-tool", "interrupted-silent"])
def test_gemini_stopped_turn_reports_no_usage(name: str) -> None:
    assert usages(feed("gemini", capture("gemini", f"{name}.jsonl"))) == []


# ---------------------------------------------------------------- pi


def test_pi_counts_each_assistant_message_once() -> None:
    """pi repeats a message's usage in message_update, turn_end and agent_end: each
    assistant message_end counts once. Its 0 cost for a model it has no price for is no cost."""
    lines = capture("pi", "tool.jsonl")
    assert sum('"input":100' in line for line in lines) > 2
    assert usages(feed("pi", lines)) == [Usage(100, 10, model="fake-qwen")] * 2


def test_pi_reports_its_own_price_when_it_has_one() -> None:
    usage = {"input": 1000, "output": 100, "cacheRead": 50, "cacheWrite": 0, "totalTokens": 1150,
             "cost": {"input": 0.003, "output": 0.0015, "cacheRead": 0.000015, "cacheWrite": 0, "total": 0.004515}}
    line = json.dumps({"type": "message_end", "message": {"role": "assistant", "content": [], "model": "m",
                                                          "usage": usage, "stopReason": "stop"}})
    assert usages(feed("pi", [line])) == [Usage(1000, 100, 50, 0, cost=Decimal("0.004515"), currency="USD", model="m")]


def test_pi_stopped_mid_stream_reports_no_usage() -> None:
    assert usages(feed("pi", capture("pi", "interrupt_stream.jsonl"))) == []


# ---------------------------------------------------------------- Aider


@pytest.mark.parametrize(("name", "expected"),
                         [("fresh", (604, 9)), ("resume", (642, 4)), ("shell_refused", (2300, 13))])
def test_aider_tokens_lines_as_printed(name: str, expected: tuple[int, int]) -> None:
    parser = AiderParser(session="s.md", model="openai/fake-model")
    events = [e for line in capture("aider", f"{name}.stdout") for e in parser.feed(line)]
    assert usages(events) == [Usage(*expected, model="openai/fake-model")]


def test_aider_cost_is_the_sessions_less_what_was_reported() -> None:
    """Each call's Tokens line counts; the cost is the session's figure less what went out
    (the cache figures on their own line push the Cost line onto the next one)."""
    parser = AiderParser(session="s.md")
    lines = ["Aider v0.86.2", "", "Hi.",
             "Tokens: 12k sent, 1.2k cache write, 2.5k cache hit, 310 received.",
             "Cost: $0.04 message, $0.04 session.",
             "Hi again.",
             "Tokens: 604 sent, 9 received. Cost: $0.0012 message, $0.0412 session."]
    events = [e for line in lines for e in parser.feed(line)]
    assert total(events) == (8300 + 604, 319, 2500, 1200, Decimal("0.0412"))


def test_aider_without_a_model_call_reports_no_usage() -> None:
    parser = AiderParser(session="s.md")
    assert usages([e for line in capture("aider", "api_down.stdout") for e in parser.feed(line)]) == []


# ---------------------------------------------------------------- ACP


def acp(agent: str, **kw: object) -> dict[str, list[Event]]:
    events = acp_replay(CAPTURES / f"acp-{agent}" / "session.jsonl", **kw)  # type: ignore[arg-type]
    return {scenario: [e for e in found if isinstance(e, Usage)] for scenario, found in events.items()}


def test_acp_claude_cost_is_what_each_turn_adds_to_the_sessions() -> None:
    """claude-agent-acp's ``usage_update`` cost is the session's so far (0.002115, then
    0.007398): each turn counts what it adds; its prompt answer has the turn's tokens."""
    found = acp("claude")
    assert total(found["text"]) == (655, 10, 0, 0, Decimal("0.0021149999999999997"))
    assert total(found["tool"]) == (1501, 52, 0, 0, Decimal("0.007398") - Decimal("0.0021149999999999997"))


def test_acp_agent_restarted_after_a_cancel_counts_from_its_new_count() -> None:
    """After a cancel claude-agent-acp is restarted (session/load): a new connection, whose
    first cost is the next turn's own (0.003264, below the 0.010707 before the cancel)."""
    found = acp("claude")
    assert total(found["after-cancel"])[4] == Decimal("0.0032640000000000004")


def _cost_update(amount: float) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "session/update",
                       "params": {"sessionId": "s", "update": {"sessionUpdate": "usage_update", "used": 9, "size": 99,
                                                               "cost": {"amount": amount, "currency": "USD"}}}})


def _in_a_turn() -> AcpConnection:
    conn = AcpConnection()
    conn.initialized, conn.session_id = True, "s"
    conn.prompt("go")
    return conn


def test_acp_cost_that_falls_is_a_count_that_started_again() -> None:
    """A cumulative cost lower than the last is the agent's count starting again: counted
    whole, never as a negative step."""
    conn = _in_a_turn()
    assert conn.receive(_cost_update(0.010707)) == [Usage(cost=Decimal("0.010707"), currency="USD")]
    assert conn.receive(_cost_update(0.003264)) == [Usage(cost=Decimal("0.003264"), currency="USD")]
    assert conn.receive(_cost_update(0.003264)) == []


def test_acp_usage_update_outside_a_turn_only_sets_the_baseline() -> None:
    conn = AcpConnection()
    assert conn.receive(_cost_update(1.5)) == []  # a session/load replaying history
    conn.initialized, conn.session_id = True, "s"
    conn.prompt("go")
    assert conn.receive(_cost_update(1.75)) == [Usage(cost=Decimal("0.25"), currency="USD")]


def test_acp_cost_after_a_cancel_still_counts() -> None:
    """The leftovers of a cancelled prompt are dropped, but the money they cost was spent."""
    conn = _in_a_turn()
    conn.cancel()
    assert conn.receive(_cost_update(0.2)) == [Usage(cost=Decimal("0.2"), currency="USD")]


def test_acp_session_totals_are_reported_as_what_each_turn_adds() -> None:
    """copilot and vibe answer each prompt with the session's totals so far (100, 300, 400,
    captured): with ``usage_totals="session"`` each turn counts its own part."""
    for agent in ("copilot", "vibe"):
        assert [total(u)[:2] for u in acp(agent).values()] == [(0, 0), (100, 10), (300, 30), (400, 40),
                                                                (500, 50), (500, 50), (600, 60)]
        found = acp(agent, usage_totals="session")
        assert [total(u)[:2] for u in found.values()] == [(0, 0), (100, 10), (200, 20), (100, 10),
                                                           (100, 10), (0, 0), (100, 10)]


@pytest.mark.parametrize("agent", ["codex", "qwen", "kimi"])
def test_acp_agent_that_reports_only_its_context_window_reports_no_usage(agent: str) -> None:
    """codex-acp's ``usage_update`` has only ``used``/``size`` (the context window's fill, not
    what was spent); qwen and kimi say nothing of usage at all."""
    assert all(found == [] for found in acp(agent).values())


# ---------------------------------------------------------------- no usage at all


def test_a_stream_with_no_usage_in_it_reports_none() -> None:
    """The generic line protocol says nothing of usage; nothing is made up."""
    lines = [json.dumps({"type": "text", "text": "hi"}), json.dumps({"type": "result", "text": "hi"})]
    assert usages(feed("generic", lines)) == []


async def test_the_presets_that_report_session_totals_say_so_to_the_agents_connection() -> None:
    """copilot's and vibe's presets reach the connection of the agent process they start."""
    assert [acp_settings({"preset": p}).usage_totals for p in ("copilot", "vibe", "claude")] == [
        "session", "session", "turn"]
    assert acp_settings({}).usage_totals == "turn"
    agent = AcpAgent(Launch(argv=("copilot",)), env={}, marker="m", unattended=True, session_cwd="/",
                     usage_totals="session")
    assert agent.conn.usage_totals == "session"
