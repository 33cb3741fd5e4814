"""The pieces every parser shares (adapters/_common.py): the end-of-turn tracker, the
dispatch table, and the parser protocol's ``feed_stderr``."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from adapters import KNOWN_ADAPTERS, Error, Event, StaleSession, TurnRequest, get_adapter
from adapters._common import TurnEnd, by_type


def _request(adapter: str, session_id: str | None = None) -> TurnRequest:
    return TurnRequest(prompt="hi", channel="c", turn_id="t", agent=adapter, command=(adapter,), session_id=session_id)


def test_turn_end_is_closed_by_a_result_or_a_stale_session_not_by_an_error() -> None:
    end = TurnEnd()
    assert not end.closed
    assert end.error("boom") == Error("boom") and end.saw_error and not end.closed
    end.result()
    assert end.closed
    stale = TurnEnd()
    assert stale.stale("unknown session") == [StaleSession("unknown session")]
    assert stale.closed


def test_turn_end_reports_a_stale_session_once() -> None:
    end = TurnEnd()
    assert end.stale("first") == [StaleSession("first")]
    assert end.stale("second") == []


def test_turn_end_keeps_the_last_non_blank_stderr_lines() -> None:
    end = TurnEnd()
    assert end.last_stderr() == ""
    for i in range(10):
        end.keep_stderr(f"line {i}")
    end.keep_stderr("")
    assert end.stderr_tail == [f"line {i}" for i in range(5, 10)]
    assert end.last_stderr() == "line 9"


def test_by_type_calls_the_handler_of_the_line_type_and_none_for_an_unknown_one() -> None:
    seen: list[tuple[object, str]] = []

    def handler(parser: object, obj: dict[str, Any], line: str) -> list[Event]:
        seen.append((parser, line))
        return [Error(str(obj["x"]))]

    table = {"known": handler}
    parser = object()
    assert by_type(table, parser, {"type": "known", "x": 1}, "L") == [Error("1")]
    assert seen == [(parser, "L")]
    assert by_type(table, parser, {"type": "other"}, "L") is None
    assert by_type(table, parser, {"type": 3}, "L") is None


#: Adapters whose agents are not read line by line (they declare ``runs = "persistent"``: the
#: ACP one, a JSON-RPC connection driven by supervisor.turns.acp), so they have no parser.
NO_LINE_PARSER = {name for name in KNOWN_ADAPTERS if get_adapter(name).runs == "persistent"}


def test_a_persistent_agent_is_declared_by_its_adapter() -> None:
    assert NO_LINE_PARSER == {"acp"}
    assert {get_adapter(name).runs for name in KNOWN_ADAPTERS} == {"per_turn", "persistent"}


@pytest.mark.parametrize("name", sorted(set(KNOWN_ADAPTERS) - NO_LINE_PARSER))
def test_every_parser_has_feed_stderr_and_a_blank_line_gives_nothing(name: str) -> None:
    parser = get_adapter(name).new_parser(_request(name))
    assert inspect.ismethod(parser.feed_stderr)
    assert parser.feed_stderr("") == []


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("codex", "Error: thread/resume: thread/resume failed: no rollout found for thread id X (code -32600)"),
        ("qwen", "No saved session found with ID X"),
        ("claude", "No conversation found with session ID: X"),
        ("gemini", "Error resuming session: No previous sessions found for this project."),
    ],
)
def test_a_repeated_stale_session_message_on_stderr_is_one_stale_session(name: str, line: str) -> None:
    parser = get_adapter(name).new_parser(_request(name, session_id="X"))
    first = parser.feed_stderr(line)
    assert [type(e) for e in first] == [StaleSession]
    assert parser.feed_stderr(line) == []
    assert parser.finish(1, interrupted=False) == []


def test_an_adapter_without_a_line_parser_says_what_drives_it() -> None:
    for name in NO_LINE_PARSER:
        with pytest.raises(TypeError, match="supervisor.turns.acp"):
            get_adapter(name).new_parser(_request(name))
