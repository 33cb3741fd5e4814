"""The qwen adapter: launches it builds, and its parser replayed on real captures.

The captures in ``tests/data/captures/qwen`` are real output of qwen 0.15.10 against the
fake OpenAI server (``scripts/capture_qwen.py`` makes them; their README says how). Each
replay feeds stdout, then stderr, then ``finish`` with the exit status the README records.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters._base import (
    Error,
    Event,
    Result,
    SessionId,
    StaleSession,
    Status,
    Text,
    TodoItem,
    Todos,
    ToolResult,
    ToolUse,
    TurnRequest,
    Unparsed,
    Usage,
)
from adapters.qwen import ADAPTER, DEFAULT_SETTINGS, SETTINGS_PATH, QwenParser, build_launch

CAPTURES = Path(__file__).parent / "data" / "captures" / "qwen"


# ------------------------------------------------------------------ helpers


def exit_statuses() -> dict[str, int]:
    """Capture name -> the exit status its README records."""
    statuses: dict[str, int] = {}
    name = None
    for line in (CAPTURES / "README.md").read_text().splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
        m = re.match(r"- exit status: (-?\d+)", line)
        if m and name:
            statuses[name] = int(m.group(1))
    return statuses


def capture_names() -> list[str]:
    return sorted(p.stem for p in CAPTURES.glob("*.jsonl"))


def replay(name: str, *, interrupted: bool | None = None) -> list[Event]:
    """All the events of one capture: stdout lines, stderr lines, then finish."""
    parser = QwenParser()
    events: list[Event] = []
    for line in (CAPTURES / f"{name}.jsonl").read_text(encoding="utf-8", errors="replace").splitlines():
        events += parser.feed(line)
    err = CAPTURES / f"{name}.stderr.txt"
    if err.exists():
        for line in err.read_text().splitlines():
            events += parser.feed_stderr(line)
    rc = exit_statuses()[name]
    if interrupted is None:
        interrupted = name.startswith("interrupt")
    events += parser.finish(rc, interrupted=interrupted)
    # Usage is checked apart (tests/test_usage_parsers.py): these are the transcript's events.
    return [e for e in events if not isinstance(e, Usage)]


def kinds(events: list[Event]) -> list[type]:
    """Event types in order, with runs of the same type collapsed."""
    out: list[type] = []
    for e in events:
        if not out or out[-1] is not type(e):
            out.append(type(e))
    return out


def streamed_text(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, Text))


def first_session(name: str) -> str:
    return json.loads((CAPTURES / f"{name}.jsonl").read_text().splitlines()[0])["session_id"]


def request(**kw: object) -> TurnRequest:
    base: dict[str, object] = dict(
        prompt="hi", channel="c", turn_id="t1", agent="qwen", command=("qwen",), cwd="/work/chan", home="/home/q"
    )
    base.update(kw)
    return TurnRequest(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------------ captures


def test_every_capture_is_recorded_in_the_readme() -> None:
    names = capture_names()
    assert len(names) >= 10
    assert set(names) <= set(exit_statuses())


@pytest.mark.parametrize("name", capture_names())
def test_every_capture_parses_without_unparsed_lines(name: str) -> None:
    events = replay(name)
    assert not [e for e in events if isinstance(e, Unparsed)]


@pytest.mark.parametrize("name", capture_names())
def test_no_stopped_turn_ends_in_success(name: str) -> None:
    parser = QwenParser()
    events: list[Event] = []
    for line in (CAPTURES / f"{name}.jsonl").read_text().splitlines():
        events += parser.feed(line)
    if not any(isinstance(e, Result) for e in events):
        assert not [e for e in parser.finish(-2, interrupted=True) if isinstance(e, Result) and e.ok]


def test_text_turn() -> None:
    events = replay("text")
    assert kinds(events) == [SessionId, Text, Result]
    assert events[0] == SessionId(first_session("text"))
    assert all(e.delta for e in events if isinstance(e, Text))
    assert streamed_text(events) == "Hello from the fake model."
    assert events[-1] == Result("Hello from the fake model.", ok=True)


def test_text_turn_without_partial_messages() -> None:
    events = replay("text_no_partial")
    assert events == [
        SessionId(first_session("text_no_partial")),
        Text("Hello without partial messages."),
        Result("Hello without partial messages.", ok=True),
    ]


def test_resumed_turn_keeps_the_session_id() -> None:
    events = replay("resume")
    assert events[0] == SessionId(first_session("text"))
    assert streamed_text(events) == "Still here on the second turn."
    assert events[-1] == Result("Still here on the second turn.", ok=True)


def test_tool_turn() -> None:
    events = replay("tool")
    assert kinds(events) == [SessionId, ToolUse, ToolResult, Text, Result]
    use = next(e for e in events if isinstance(e, ToolUse))
    assert use.name == "run_shell_command"
    assert "echo hello-from-tool" in use.preview
    assert next(e for e in events if isinstance(e, ToolResult)) == ToolResult("hello-from-tool", is_error=False)
    assert events[-1] == Result("The command printed hello-from-tool.", ok=True)
    assert streamed_text(events) == "The command printed hello-from-tool."


def test_todo_tool_becomes_the_plan() -> None:
    events = replay("todos")
    assert kinds(events) == [SessionId, Todos, Text, Result]
    plan = next(e for e in events if isinstance(e, Todos))
    assert plan.items == (
        TodoItem("Read the task", "completed"),
        TodoItem("Do the work", "in_progress"),
        TodoItem("Report back", "pending"),
    )


def test_interrupted_tool_turn() -> None:
    events = replay("interrupt_tool")
    assert kinds(events) == [SessionId, ToolUse, ToolResult]
    result = next(e for e in events if isinstance(e, ToolResult))
    assert result.is_error and "Operation Cancelled" in result.preview
    assert exit_statuses()["interrupt_tool"] == -signal.SIGINT


def test_killed_turn_without_a_stop_is_an_error() -> None:
    # The same output, but the process died on its own: the turn must not look done.
    events = replay("interrupt_tool", interrupted=False)
    assert isinstance(events[-1], Error)
    assert not any(isinstance(e, Result) for e in events)


def test_interrupted_text_turn_keeps_the_partial_text() -> None:
    events = replay("interrupt_text")
    assert kinds(events) == [SessionId, Text]
    assert streamed_text(events)
    assert "This long answer is streamed slowly".startswith(streamed_text(events)[:10])


def test_resume_after_an_interrupt() -> None:
    events = replay("resume_after_interrupt")
    assert events[0] == SessionId(first_session("interrupt_tool"))
    assert events[-1] == Result("Back after the stop.", ok=True)


def test_api_error_is_an_error_not_an_answer() -> None:
    events = replay("error_400")
    assert kinds(events) == [SessionId, Error, Result]
    assert "API Error: 400" in next(e for e in events if isinstance(e, Error)).text
    assert events[-1] == Result("", ok=False)
    assert not any(isinstance(e, Text) for e in events)


@pytest.mark.parametrize("name", ["stale_session", "stale_title", "stale_cwd"])
def test_unknown_session_is_stale(name: str) -> None:
    assert (CAPTURES / f"{name}.jsonl").read_text() == ""
    events = replay(name)
    assert len(events) == 1 and isinstance(events[0], StaleSession)
    assert "No saved session found" in events[0].text


def test_declined_tool_without_yolo() -> None:
    events = replay("denied")
    assert kinds(events) == [SessionId, ToolUse, ToolResult, Text, Status, Result]
    assert next(e for e in events if isinstance(e, ToolResult)).is_error
    status = next(e for e in events if isinstance(e, Status))
    assert status.text.startswith("permission denied: run_shell_command")
    assert events[-1] == Result("Could not run it.", ok=True)


@pytest.mark.parametrize(
    ("name", "answer"),
    [("model", "A fake one."), ("dash_prompt", "Dashes reach the model."), ("bg_nohup", "Started it."), ("bg_setsid", "Started it.")],
)
def test_other_successful_turns(name: str, answer: str) -> None:
    events = replay(name)
    assert isinstance(events[0], SessionId)
    assert events[-1] == Result(answer, ok=True)
    assert sum(isinstance(e, SessionId) for e in events) == 1


# ------------------------------------------------------------------ finish


def test_finish_after_a_result_adds_nothing() -> None:
    parser = QwenParser()
    parser.feed('{"type":"result","subtype":"success","session_id":"s","is_error":false,"result":"done"}')
    assert parser.finish(0, interrupted=False) == []


def test_finish_without_a_result_is_an_error_even_on_status_0() -> None:
    parser = QwenParser()
    parser.feed('{"type":"system","subtype":"init","session_id":"s"}')
    events = parser.finish(0, interrupted=False)
    assert len(events) == 1 and isinstance(events[0], Error)


def test_finish_on_a_crash_quotes_the_message_not_the_stack() -> None:
    parser = QwenParser()
    for line in [
        "An unexpected critical error occurred:",
        "TypeError: Cannot read properties of undefined (reading 'model')",
        "    at resolveModelConfig (file:///x/cli.js:293390:35)",
    ]:
        assert parser.feed_stderr(line) == []
    (event,) = parser.finish(1, interrupted=False)
    assert isinstance(event, Error)
    assert "status 1" in event.text and "TypeError" in event.text and "resolveModelConfig" not in event.text


def test_finish_when_stopped_adds_nothing() -> None:
    assert QwenParser().finish(-2, interrupted=True) == []
    assert QwenParser().finish(None, interrupted=True) == []


def test_error_result_line() -> None:
    parser = QwenParser()
    events = parser.feed(
        '{"type":"result","subtype":"error_during_execution","session_id":"s","is_error":true,'
        '"error":{"message":"Model stream ended"}}'
    )
    assert events == [SessionId("s"), Error("Model stream ended"), Result("", ok=False)]
    assert parser.finish(1, interrupted=False) == []


def test_subagent_lines_are_not_the_answer() -> None:
    parser = QwenParser()
    line = {
        "type": "assistant",
        "session_id": "s",
        "parent_tool_use_id": "call_1",
        "message": {"id": "m", "content": [{"type": "text", "text": "sub work"}, {"type": "tool_use", "name": "glob", "input": {"pattern": "*"}}]},
    }
    assert parser.feed(json.dumps(line)) == [SessionId("s"), Status("sub work"), ToolUse("glob", '{"pattern":"*"}')]
    delta = {"type": "stream_event", "session_id": "s", "parent_tool_use_id": "call_1",
             "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}}}
    assert parser.feed(json.dumps(delta)) == []


def test_long_tool_input_is_bounded() -> None:
    parser = QwenParser()
    line = {"type": "assistant", "session_id": "s", "message": {"content": [
        {"type": "tool_use", "id": "c", "name": "run_shell_command", "input": {"command": "x" * 5000}}]}}
    use = parser.feed(json.dumps(line))[-1]
    assert isinstance(use, ToolUse) and len(use.preview) <= 200


# ------------------------------------------------------------------ robustness


@pytest.mark.parametrize(
    "line",
    [
        "garbage that is not json",
        '{"type":"assistant","message":{"content":[{"type":"te',
        "[1, 2, 3]",
        '"a string"',
        "42",
        "null",
        '{"type":"something_new","session_id":"s"}',
        '{"no_type":true}',
        '{"type":"assistant","message":"not an object"}',
    ],
)
def test_bad_lines_are_unparsed(line: str) -> None:
    events = QwenParser().feed(line)
    assert events and isinstance(events[-1], Unparsed)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        '{"type":"assistant","message":{"content":[1,null,{"type":"tool_use"},{"type":"text","text":7}]}}',
        '{"type":"user","message":{"content":"plain"}}',
        '{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":null}}}',
        '{"type":"system","subtype":"init","session_id":5}',
    ],
)
def test_odd_but_harmless_lines_give_nothing(line: str) -> None:
    assert QwenParser().feed(line) == []


def test_result_with_a_non_string_result_is_still_the_end() -> None:
    assert QwenParser().feed('{"type":"result","subtype":"success","result":5}') == [Result("", ok=True)]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_never_raises(line: str) -> None:
    parser = QwenParser()
    parser.feed(line)
    parser.feed_stderr(line)
    parser.finish(0, interrupted=False)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["system", "assistant", "user", "stream_event", "result"]),
    st.dictionaries(st.sampled_from(["message", "event", "session_id", "result", "is_error", "subtype",
                                     "permission_denials", "parent_tool_use_id", "error"]), _json),
)
def test_known_types_with_any_shape_never_raise(kind: str, fields: dict) -> None:
    QwenParser().feed(json.dumps({"type": kind, **fields}))


# ------------------------------------------------------------------ launch


def test_fresh_launch() -> None:
    launch = build_launch(request(prompt="hello there"))
    assert launch.argv == (
        "qwen", "--auth-type", "openai", "--output-format", "stream-json",
        "--include-partial-messages", "--yolo",
    )
    assert launch.cwd == "/work/chan"
    assert launch.stdin == b"hello there", "the prompt goes on stdin, not in argv"
    assert "HOME" not in launch.env
    assert launch.env["QWEN_TELEMETRY_ENABLED"] == "false"
    settings_json = json.loads(launch.files[SETTINGS_PATH])
    assert settings_json["privacy"]["usageStatisticsEnabled"] is False
    assert settings_json["memory"]["enableManagedAutoMemory"] is False
    assert settings_json["telemetry"]["enabled"] is False


def test_resume_launch() -> None:
    argv = build_launch(request(session_id="abc-123")).argv
    assert argv[1:3] == ("--resume", "abc-123")
    assert not any("hi" in a for a in argv[3:])


def test_model_launch() -> None:
    argv = build_launch(request(model="qwen3-coder-plus")).argv
    i = argv.index("--model")
    assert argv[i + 1] == "qwen3-coder-plus"


def test_attended_launch_keeps_qwen_permission_defaults() -> None:
    argv = build_launch(request(unattended=False)).argv
    assert "--yolo" not in argv and not any(a.startswith("--approval-mode") for a in argv)


def test_args_come_first_and_are_never_doubled() -> None:
    # qwen turns a repeated option into an array and crashes: never add what args carry.
    argv = build_launch(
        request(
            args=("-m", "mine", "--approval-mode", "auto-edit", "--auth-type=anthropic", "-o", "stream-json", "--include-partial-messages"),
            model="theirs",
            session_id="s1",
        )
    ).argv
    assert argv[:9] == ("qwen", "-m", "mine", "--approval-mode", "auto-edit", "--auth-type=anthropic", "-o", "stream-json", "--include-partial-messages")
    assert argv[9:] == ("--resume", "s1")


def test_prompt_is_never_an_argument_and_goes_on_stdin_verbatim() -> None:
    for prompt in ["--help me", "-x", "0x10", "two\nlines  spaced", "[[say:x]] -- y"]:
        launch = build_launch(request(prompt=prompt))
        assert launch.stdin == prompt.encode()
        assert not any(prompt in a for a in launch.argv)


def test_options() -> None:
    launch = build_launch(
        request(options={"auth_type": "", "partial_messages": "false", "settings": {"privacy": {"extra": 1}, "model": {"name": "m"}}})
    )
    assert "--auth-type" not in launch.argv
    assert "--include-partial-messages" not in launch.argv
    written = json.loads(launch.files[SETTINGS_PATH])
    assert written["privacy"] == {"usageStatisticsEnabled": False, "extra": 1}
    assert written["model"] == {"name": "m"}
    assert DEFAULT_SETTINGS["privacy"] == {"usageStatisticsEnabled": False}  # not mutated


def test_adapter_record() -> None:
    assert ADAPTER.name == "qwen"
    assert ADAPTER.default_command == ("qwen",)
    assert ADAPTER.interrupt_signal == signal.SIGINT
    assert {"auth_type", "settings", "partial_messages"} <= ADAPTER.option_keys
    assert isinstance(ADAPTER.new_parser(request()), QwenParser)
