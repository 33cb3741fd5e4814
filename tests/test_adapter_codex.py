"""The codex adapter: its launch, and its parser replaying real captures of ``codex exec --json``.

The captures in ``tests/data/captures/codex`` come from the real CLI run against the fake
Responses API (``scripts/capture_codex.py``; see the README there). Thread ids change when they
are regenerated, so the tests read them from the files.
"""

from __future__ import annotations

import json
import signal
import tomllib
from pathlib import Path

import pytest

from adapters._base import (
    TOOL_PREVIEW_CHARS,
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
from adapters.codex import ADAPTER, CodexParser, build_launch, new_parser

CAPTURES = Path(__file__).parent / "data" / "captures" / "codex"
STALE_ID = "00000000-0000-4000-8000-000000000000"
COMMON = ("--json", "--skip-git-repo-check", "--disable", "plugins")


def request(**kw: object) -> TurnRequest:
    """A turn request with sensible defaults."""
    base: dict[str, object] = dict(
        prompt="hello", channel="general", turn_id="t1", agent="codex", command=("codex",),
        cwd="/srv/work", home="/srv/home",
    )
    base.update(kw)
    return TurnRequest(**base)  # type: ignore[arg-type]


def lines(name: str) -> list[str]:
    """The stdout lines of one capture."""
    return (CAPTURES / f"{name}.jsonl").read_text().splitlines()


def stderr_lines(name: str) -> list[str]:
    """The stderr lines of one capture."""
    return (CAPTURES / f"{name}.stderr.txt").read_text().splitlines()


def thread_of(name: str) -> str:
    """The thread id a capture announced."""
    return json.loads(lines(name)[0])["thread_id"]


def replay(
    name: str, *, session_id: str | None = None, returncode: int | None = 0, interrupted: bool = False
) -> list[Event]:
    """Feed a capture's stdout and stderr to a fresh parser, then finish it."""
    parser = new_parser(request(session_id=session_id))
    events: list[Event] = []
    for line in lines(name):
        events += parser.feed(line)
    for line in stderr_lines(name):
        events += parser.feed_stderr(line)
    events += parser.finish(returncode, interrupted=interrupted)
    # Usage is checked apart (tests/test_usage_parsers.py): these are the transcript's events.
    return [e for e in events if not isinstance(e, Usage)]


# ---------------------------------------------------------------- captures


@pytest.mark.parametrize("path", sorted(CAPTURES.glob("*.jsonl")), ids=lambda p: p.stem)
def test_every_capture_parses_without_unparsed_lines(path: Path) -> None:
    parser = CodexParser()
    for line in path.read_text().splitlines():
        events = parser.feed(line)
        assert not [e for e in events if isinstance(e, Unparsed)], line


def test_captures_cover_the_required_scenarios() -> None:
    names = {p.stem for p in CAPTURES.glob("*.jsonl")}
    assert {"text", "resume", "tool", "interrupt_tool", "stale_session", "error_400", "error_500"} <= names
    assert (CAPTURES / "README.md").exists()


def test_text_turn() -> None:
    tid = thread_of("text")
    assert replay("text") == [
        SessionId(tid),
        Text("Hello from the fake model."),
        Result("Hello from the fake model.", ok=True),
    ]


def test_resumed_turn_keeps_its_thread_id() -> None:
    tid = thread_of("resume")
    assert replay("resume", session_id=tid) == [
        SessionId(tid),
        Text("Second answer, same thread."),
        Result("Second answer, same thread.", ok=True),
    ]


def test_model_warning_is_a_status_not_an_error() -> None:
    events = replay("model")
    assert [type(e) for e in events] == [SessionId, Status, Text, Result]
    assert "gpt-5.4" in events[1].text  # type: ignore[union-attr]
    assert events[-1] == Result("Answer from another model.", ok=True)


def test_tool_turn() -> None:
    tid = thread_of("tool")
    assert replay("tool") == [
        SessionId(tid),
        ToolUse("exec_command", "echo hello from the tool"),
        ToolResult("hello from the tool", is_error=False),
        Text("The command printed hello."),
        Result("The command printed hello.", ok=True),
    ]


def test_failing_tool_is_an_error_result() -> None:
    events = replay("tool_error")
    results = [e for e in events if isinstance(e, ToolResult)]
    assert len(results) == 1 and results[0].is_error
    assert "No such file or directory" in results[0].preview
    assert events[-1] == Result("The listing failed.", ok=True)


def test_slow_answer_still_arrives_whole() -> None:
    events = replay("slow_text")
    assert [e for e in events if isinstance(e, Text)] == [Text("A slowly streamed answer in several pieces.")]


@pytest.mark.parametrize("name", ["background", "background_setsid", "attended_tool"])
def test_other_tool_turns_end_with_a_result(name: str) -> None:
    events = replay(name)
    assert [type(e) for e in events] == [SessionId, ToolUse, ToolResult, Text, Result]
    assert events[-1].ok  # type: ignore[union-attr]


def test_interrupted_tool_turn_never_succeeds() -> None:
    tid = thread_of("interrupt_tool")
    events = replay("interrupt_tool", returncode=1, interrupted=True)
    assert events == [SessionId(tid), ToolUse("exec_command", "sleep 30.123 & sleep 30.456")]


def test_interrupted_turn_resumed_is_not_stale() -> None:
    # Its stderr has "thread … not found" (a rollout write racing the exit): not a stale id.
    events = replay("interrupt_tool", session_id=thread_of("interrupt_tool"), returncode=1, interrupted=True)
    assert not [e for e in events if isinstance(e, StaleSession | Result)]


def test_turn_that_dies_without_its_end_line_is_an_error() -> None:
    events = replay("interrupt_tool", returncode=1, interrupted=False)
    assert isinstance(events[-1], Error)
    assert not [e for e in events if isinstance(e, Result)]


def test_interrupted_while_the_model_is_silent() -> None:
    assert replay("interrupt_stream", returncode=1, interrupted=True) == [SessionId(thread_of("interrupt_stream"))]


def test_resume_after_interrupt() -> None:
    tid = thread_of("resume_after_interrupt")
    assert tid == thread_of("interrupt_tool")
    assert replay("resume_after_interrupt", session_id=tid) == [
        SessionId(tid),
        Text("Resumed after the stop."),
        Result("Resumed after the stop.", ok=True),
    ]


def test_stale_session_comes_on_stderr() -> None:
    assert lines("stale_session") == []
    events = replay("stale_session", session_id=STALE_ID, returncode=1)
    assert len(events) == 1 and isinstance(events[0], StaleSession)
    assert STALE_ID in events[0].text


def test_unknown_thread_name_starts_a_new_thread() -> None:
    events = replay("stale_name", session_id="no-such-thread-name")
    assert isinstance(events[0], Status) and "no-such-thread-name" in events[0].text
    assert events[1] == SessionId(thread_of("stale_name"))
    assert events[-1] == Result("A new thread instead.", ok=True)


def test_error_400_is_one_error() -> None:
    events = replay("error_400", returncode=1)
    assert [type(e) for e in events] == [SessionId, Error]
    assert "Invalid request: the fake server rejects this." in events[1].text  # type: ignore[union-attr]


def test_error_500_retries_are_statuses_then_one_error() -> None:
    events = replay("error_500", returncode=1)
    assert [type(e) for e in events] == [SessionId, *[Status] * 5, Error]
    assert all(e.text.startswith("Reconnecting... ") for e in events[1:6])  # type: ignore[union-attr]


# ---------------------------------------------------------------- launch


def test_fresh_launch() -> None:
    launch = build_launch(request(prompt="do it"))
    assert launch.argv == ("codex", "exec", *COMMON, "--", "-")
    assert launch.env == {"CODEX_HOME": "/srv/home/.codex"}
    assert launch.cwd == "/srv/work"
    assert launch.stdin == b"do it", "the prompt goes on stdin, not in argv"
    assert set(launch.files) == {".codex/config.toml"}


def test_resume_launch() -> None:
    launch = build_launch(request(prompt="again", session_id="abc-123"))
    assert launch.argv == ("codex", "exec", "resume", *COMMON, "--", "abc-123", "-")
    assert launch.stdin == b"again"


def test_model_and_args_go_before_the_separator() -> None:
    launch = build_launch(request(model="gpt-5.5", args=("-c", "model_reasoning_effort=\"low\"")))
    assert launch.argv == ("codex", "exec", *COMMON, "--model", "gpt-5.5", "-c", 'model_reasoning_effort="low"', "--", "-")
    resumed = build_launch(request(model="gpt-5.5", session_id="s1"))
    assert resumed.argv == ("codex", "exec", "resume", *COMMON, "--model", "gpt-5.5", "--", "s1", "-")


def test_prompt_that_looks_like_a_flag_stays_the_prompt() -> None:
    launch = build_launch(request(prompt="--help me"))
    assert launch.argv[-2:] == ("--", "-") and launch.stdin == b"--help me"


def test_bare_dash_prompt_goes_on_stdin() -> None:
    launch = build_launch(request(prompt="-"))
    assert launch.argv[-1] == "-" and launch.stdin == b"-"


def test_configured_command_is_used() -> None:
    launch = build_launch(request(command=("/opt/codex/bin/codex",)))
    assert launch.argv[0] == "/opt/codex/bin/codex"
    assert ADAPTER.default_command == ("codex",)


def config(req: TurnRequest) -> dict[str, object]:
    return tomllib.loads(build_launch(req).files[".codex/config.toml"])


def test_unattended_config() -> None:
    cfg = config(request())
    assert cfg["approval_policy"] == "never"
    assert cfg["sandbox_mode"] == "danger-full-access"
    assert cfg["analytics"] == {"enabled": False}
    assert "model_provider" not in cfg


def test_attended_config_leaves_codex_its_defaults() -> None:
    cfg = config(request(unattended=False))
    assert "approval_policy" not in cfg and "sandbox_mode" not in cfg
    assert cfg["analytics"] == {"enabled": False}


def test_base_url_defines_a_provider() -> None:
    cfg = config(request(options={"base_url": 'http://127.0.0.1:9/v1"quoted"', "env_key": "MY_KEY"}))
    assert cfg["model_provider"] == "corral"
    assert cfg["model_providers"] == {
        "corral": {"name": "corral", "base_url": 'http://127.0.0.1:9/v1"quoted"', "env_key": "MY_KEY", "wire_api": "responses"}
    }
    default_key = config(request(options={"base_url": "http://x/v1"}))
    assert default_key["model_providers"]["corral"]["env_key"] == "OPENAI_API_KEY"  # type: ignore[index]


def test_bad_option_types_are_ignored() -> None:
    cfg = config(request(options={"base_url": 42}))
    assert "model_provider" not in cfg


def test_adapter_record() -> None:
    assert ADAPTER.name == "codex"
    assert ADAPTER.interrupt_signal == signal.SIGINT
    assert ADAPTER.option_keys == frozenset({"base_url", "env_key"})
    assert isinstance(ADAPTER.new_parser(request()), CodexParser)


# ---------------------------------------------------------------- robustness


@pytest.mark.parametrize(
    "line",
    [
        "garbage",
        '{"type":"turn.completed"',
        "[1, 2]",
        '"a string"',
        "null",
        "42",
        '{"no_type": 1}',
        '{"type": 7}',
        '{"type":"something.new"}',
        '{"type":"item.completed"}',
        '{"type":"item.completed","item":"text"}',
        '{"type":"item.completed","item":{"type":"collab_tool_call","id":"x"}}',
        '{"type":"thread.started"}',
        '{"type":"todo_list"}',
        '{"type":"item.completed","item":{"type":"todo_list","items":"no"}}',
        '{"type":"item.completed","item":{"type":"todo_list","items":[{"completed":true}]}}',
    ],
)
def test_bad_lines_are_unparsed(line: str) -> None:
    events = CodexParser().feed(line)
    assert len(events) == 1 and isinstance(events[0], Unparsed)
    assert events[0].line == line


@pytest.mark.parametrize(
    "line",
    [
        '{"type":"item.completed","item":{"type":"agent_message","text":5}}',
        '{"type":"item.started","item":{"type":"command_execution","id":1,"command":null}}',
        '{"type":"item.completed","item":{"type":"file_change","changes":[1,{"path":"a"}]}}',
        '{"type":"item.completed","item":{"type":"mcp_tool_call","result":[1],"error":"x"}}',
        '{"type":"turn.failed","error":"flat"}',
        '{"type":"error"}',
    ],
)
def test_odd_shapes_never_raise(line: str) -> None:
    CodexParser().feed(line)


def test_deeply_nested_line_is_unparsed() -> None:
    line = "[" * 100_000 + "]" * 100_000
    assert isinstance(CodexParser().feed(line)[0], Unparsed)


def test_blank_lines_are_ignored() -> None:
    assert CodexParser().feed("") == [] and CodexParser().feed("   ") == []


def test_finish_without_end_line_is_an_error_and_never_a_result() -> None:
    parser = CodexParser()
    parser.feed('{"type":"thread.started","thread_id":"t"}')
    events = parser.finish(0, interrupted=False)
    assert len(events) == 1 and isinstance(events[0], Error)


def test_finish_after_a_stop_adds_nothing() -> None:
    parser = CodexParser()
    parser.feed('{"type":"turn.started"}')
    assert parser.finish(-2, interrupted=True) == []


def test_finish_after_turn_completed_adds_nothing() -> None:
    parser = CodexParser()
    assert parser.feed('{"type":"turn.completed","usage":{}}') == [Result("", ok=True)]
    assert parser.finish(0, interrupted=False) == []


def test_stale_message_only_counts_on_a_resume() -> None:
    line = "Error: thread/resume: thread/resume failed: no rollout found for thread id X (code -32600)"
    assert CodexParser().feed_stderr(line) == []
    assert CodexParser(session_id="X").feed_stderr(line) == [StaleSession(line)]
    assert CodexParser(session_id="X").feed_stderr("Reading additional input from stdin...") == []


def test_result_text_is_the_last_agent_message() -> None:
    parser = CodexParser()
    parser.feed('{"type":"item.completed","item":{"id":"a","type":"agent_message","text":"first"}}')
    parser.feed('{"type":"item.completed","item":{"id":"b","type":"agent_message","text":"last"}}')
    assert parser.feed('{"type":"turn.completed"}') == [Result("last", ok=True)]


def test_todo_list() -> None:
    line = json.dumps({
        "type": "item.updated",
        "item": {"id": "p", "type": "todo_list", "items": [{"text": "read", "completed": True}, {"text": "write", "completed": False}]},
    })
    assert CodexParser().feed(line) == [Todos((TodoItem("read", "completed"), TodoItem("write", "pending")))]


def test_tool_use_once_and_result_once() -> None:
    parser = CodexParser()
    started = {"id": "i", "type": "command_execution", "command": "/bin/bash -lc 'make'", "aggregated_output": "", "exit_code": None, "status": "in_progress"}
    assert parser.feed(json.dumps({"type": "item.started", "item": started})) == [ToolUse("exec_command", "make")]
    assert parser.feed(json.dumps({"type": "item.updated", "item": started})) == []
    done = {**started, "aggregated_output": "x" * 1000, "exit_code": 0, "status": "completed"}
    events = parser.feed(json.dumps({"type": "item.completed", "item": done}))
    assert len(events) == 1 and isinstance(events[0], ToolResult)
    assert len(events[0].preview) == TOOL_PREVIEW_CHARS
    assert parser.feed(json.dumps({"type": "item.completed", "item": done})) == []


def test_declined_command_seen_only_when_completed() -> None:
    item = {"id": "d", "type": "command_execution", "command": "rm -rf /", "aggregated_output": "", "exit_code": None, "status": "declined"}
    assert CodexParser().feed(json.dumps({"type": "item.completed", "item": item})) == [
        ToolUse("exec_command", "rm -rf /"),
        ToolResult("", is_error=True),
    ]


def test_file_change_mcp_and_web_search() -> None:
    parser = CodexParser()
    fc = {"id": "f", "type": "file_change", "changes": [{"path": "a.py", "kind": "update"}], "status": "completed"}
    assert parser.feed(json.dumps({"type": "item.completed", "item": fc})) == [
        ToolUse("apply_patch", "update a.py"),
        ToolResult("completed", is_error=False),
    ]
    mcp = {"id": "m", "type": "mcp_tool_call", "server": "docs", "tool": "search", "arguments": {"q": "x"}, "status": "failed", "error": {"message": "boom"}}
    assert parser.feed(json.dumps({"type": "item.completed", "item": mcp})) == [
        ToolUse("docs.search", '{"q":"x"}'),
        ToolResult("boom", is_error=True),
    ]
    ws = {"id": "w", "type": "web_search", "query": "trio nursery"}
    assert parser.feed(json.dumps({"type": "item.completed", "item": ws})) == [ToolUse("web_search", "trio nursery")]


def test_reasoning_is_status() -> None:
    line = '{"type":"item.completed","item":{"id":"r","type":"reasoning","text":"**Thinking** about it"}}'
    assert CodexParser().feed(line) == [Status("**Thinking** about it")]
