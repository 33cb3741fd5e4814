"""The ``claude`` adapter: launches, and the parser replaying real captures of the CLI.

The captures in ``tests/data/captures/claude/`` are the real stdout (and stderr) of
Claude Code against the fake Anthropic server; ``scripts/capture_claude.py`` regenerates
them and their README says how each was made.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from adapters.claude import ADAPTER, ClaudeParser, build_launch

CAPTURES = Path(__file__).parent / "data" / "captures" / "claude"


def request(**overrides: object) -> TurnRequest:
    """A turn request with sensible defaults."""
    fields: dict[str, object] = dict(
        prompt="fix the bug",
        channel="c1",
        turn_id="t1",
        agent="claude",
        command=("claude",),
        cwd="/srv/work/c1",
        home="/srv/home/claude",
    )
    fields.update(overrides)
    return TurnRequest(**fields)  # type: ignore[arg-type]


def replay(name: str, *, interrupted: bool = False, returncode: int | None = 0) -> list[Event]:
    """Feed a capture's stdout (then its stderr, if any) to a fresh parser, then finish it."""
    parser = ADAPTER.new_parser(request())
    events: list[Event] = []
    for line in (CAPTURES / f"{name}.jsonl").read_text().splitlines():
        events += parser.feed(line)
    stderr = CAPTURES / f"{name}.stderr"
    if stderr.exists():
        for line in stderr.read_text().splitlines():
            events += parser.feed_stderr(line)
    events += parser.finish(returncode, interrupted=interrupted)
    # Usage is checked apart (tests/test_usage_parsers.py): these are the transcript's events.
    return [e for e in events if not isinstance(e, Usage)]


def kinds(events: list[Event]) -> list[str]:
    """The event class names, in order."""
    return [type(e).__name__ for e in events]


def session_in(name: str) -> str:
    """The session id on the capture's first line."""
    return json.loads((CAPTURES / f"{name}.jsonl").read_text().splitlines()[0])["session_id"]


# ---------------------------------------------------------------- captures

#: Capture -> (how its turn ended, the expected event kinds in order).
EXPECTED: dict[str, tuple[dict[str, object], list[str]]] = {
    "text": ({}, ["SessionId", "Text", "Result"]),
    "model": ({}, ["SessionId", "Text", "Result"]),
    "args-dash": ({}, ["SessionId", "Text", "Result"]),
    "resume-1": ({}, ["SessionId", "Text", "Result"]),
    "resume-2": ({}, ["SessionId", "Text", "Result"]),
    "stale-cwd-1": ({}, ["SessionId", "Text", "Result"]),
    "interrupted-resume": ({}, ["SessionId", "Text", "Result"]),
    "tool": ({}, ["SessionId", "ToolUse", "ToolResult", "Text", "Result"]),
    "tool-error": ({}, ["SessionId", "ToolUse", "ToolResult", "Text", "Result"]),
    "background": ({}, ["SessionId", "ToolUse", "ToolResult", "Text", "Result"]),
    "attended-tool": ({}, ["SessionId", "ToolUse", "ToolResult", "Text", "Status", "Result"]),
    "todos": ({}, ["SessionId", "Todos", "Text", "Result"]),
    "interrupted": ({"interrupted": True, "returncode": 1},
                    ["SessionId", "ToolUse", "ToolResult", "Status", "Error", "Result"]),
    "interrupted-tree": ({"interrupted": True, "returncode": 1},
                         ["SessionId", "ToolUse", "ToolResult", "Status", "Error", "Result"]),
    "interrupted-silent": ({"interrupted": True, "returncode": 0}, ["SessionId", "Status", "Error", "Result"]),
    "stale-session": ({"returncode": 1}, ["StaleSession"]),
    "stale-cwd": ({"returncode": 1}, ["StaleSession"]),
    "bad-session": ({"returncode": 1}, ["StaleSession"]),
    "api-error-400": ({"returncode": 1}, ["SessionId", "Error", "Result"]),
    "api-error-500": ({"returncode": 1}, ["SessionId", "Status", "Status", "Error", "Result"]),
    "api-unreachable": ({"returncode": 1}, ["SessionId", "Status", "Status", "Error", "Result"]),
}


def test_every_capture_has_an_expectation() -> None:
    """A new capture must be added to the table (interrupted-text is checked on its own)."""
    names = {p.stem for p in CAPTURES.glob("*.jsonl")}
    assert names == set(EXPECTED) | {"interrupted-text"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_capture_replays_to_the_expected_events(name: str) -> None:
    """Each real capture parses without Unparsed lines into the events of its scenario."""
    how, expected = EXPECTED[name]
    events = replay(name, **how)  # type: ignore[arg-type]
    assert kinds(events) == expected


@pytest.mark.parametrize("name", sorted(set(EXPECTED) | {"interrupted-text"}))
def test_capture_replays_with_the_session_of_its_init_line(name: str) -> None:
    """The one SessionId of a turn is the id of its first line; stale turns report none."""
    ids = [e.id for e in replay(name, **EXPECTED.get(name, ({"interrupted": True}, []))[0]) if isinstance(e, SessionId)]  # type: ignore[arg-type]
    if name in ("stale-session", "stale-cwd", "bad-session"):
        assert ids == []
    else:
        assert ids == [session_in(name)]


def test_text_turn() -> None:
    """The answer is a whole Text, and the Result repeats it as the final answer."""
    events = replay("text")
    assert events[1:] == [Text("Hello from the fake model."), Result("Hello from the fake model.", ok=True)]


def test_resumed_turn_keeps_the_session_id() -> None:
    """Claude Code keeps the id on resume: the second turn reports the first's."""
    first = [e for e in replay("resume-1") if isinstance(e, SessionId)]
    second = replay("resume-2")
    assert [e for e in second if isinstance(e, SessionId)] == first
    assert second[-1] == Result("The word was pineapple.", ok=True)


def test_tool_turn() -> None:
    """The Bash call previews its command; its output is the ToolResult."""
    events = replay("tool")
    assert events[1:3] == [ToolUse("Bash", "echo hello-from-tool"), ToolResult("hello-from-tool", is_error=False)]
    assert events[-1] == Result("The command printed hello-from-tool.", ok=True)


def test_failing_tool_is_an_error_result() -> None:
    """A non-zero exit of the command marks the ToolResult as an error, not the turn."""
    events = replay("tool-error")
    result = next(e for e in events if isinstance(e, ToolResult))
    assert result.is_error and result.preview.startswith("Exit code 2")
    assert events[-1] == Result("The command failed.", ok=True)


def test_todowrite_becomes_the_plan_without_a_tool_entry() -> None:
    """TodoWrite's input is the whole plan (activeForm dropped); its bookkeeping result is not shown."""
    events = replay("todos")
    assert events[1] == Todos((
        TodoItem("Read the code", "completed"),
        TodoItem("Write the fix", "in_progress"),
        TodoItem("Run the tests", "pending"),
    ))
    assert not any(isinstance(e, (ToolUse, ToolResult)) for e in events)


def test_permission_denial_is_reported() -> None:
    """Without the bypass, a denied tool call shows up as a status before the result."""
    events = replay("attended-tool")
    assert Status("permission denied: Bash touch made-by-tool.txt") in events
    assert next(e for e in events if isinstance(e, ToolResult)).is_error


@pytest.mark.parametrize("name", ["interrupted", "interrupted-tree", "interrupted-silent", "interrupted-text"])
def test_interrupted_turn_never_succeeds(name: str) -> None:
    """SIGINT mid-tool or mid-answer: the CLI's own result line is a failure, and so is finish."""
    events = replay(name, interrupted=True, returncode=0)
    assert not any(isinstance(e, Result) and e.ok for e in events)
    assert Error("claude: turn interrupted") in events
    assert any(isinstance(e, Status) and e.text.startswith("Request interrupted by user") for e in events)


def test_interrupted_while_streaming_keeps_what_was_said() -> None:
    """The CLI flushes the part of the answer it had; the turn still fails."""
    events = replay("interrupted-text", interrupted=True)
    texts = [e for e in events if isinstance(e, Text)]
    assert texts and "one two three four five six seven eight nine ten".startswith(texts[0].text)
    assert events[-1] == Result("", ok=False)


@pytest.mark.parametrize("name", ["stale-session", "stale-cwd", "bad-session"])
def test_stale_session_is_reported_once(name: str) -> None:
    """stdout's result line and stderr both say it; the parser reports it once."""
    events = replay(name, returncode=1)
    assert len(events) == 1 and isinstance(events[0], StaleSession)


@pytest.mark.parametrize("name", ["stale-session", "stale-cwd"])
def test_stale_session_from_stderr_alone(name: str) -> None:
    """If stderr is read first, its line is enough; the stdout line then adds nothing."""
    parser = ClaudeParser()
    stderr = (CAPTURES / f"{name}.stderr").read_text().splitlines()
    assert [type(e) for e in parser.feed_stderr(stderr[0])] == [StaleSession]
    for line in (CAPTURES / f"{name}.jsonl").read_text().splitlines():
        assert parser.feed(line) == []
    assert parser.finish(1, interrupted=False) == []


def test_api_errors_are_reported_once() -> None:
    """The synthetic "API Error" message and the result line say the same: one Error."""
    events = replay("api-error-400", returncode=1)
    assert events[1:] == [Error("API Error: 400 fake says no (model API at https://api.anthropic.com)"),
                          Result("", ok=False)]


def test_api_retries_are_statuses() -> None:
    """Each retry of a failed model call is a status line, naming the API it called."""
    statuses = [e for e in replay("api-error-500", returncode=1) if isinstance(e, Status)]
    assert statuses[0] == Status(
        "model API at https://api.anthropic.com answered 500 (server_error); retrying, attempt 1 of 2"
    )


def test_an_unreachable_api_is_said_with_its_url_while_retrying_and_its_reason_at_the_end() -> None:
    """Issue 32: an unreachable base URL showed "model API (unknown); retrying" for minutes.
    The retries name the URL and what "no answer" can be; the end names the CLI's reason."""
    parser = ADAPTER.new_parser(request(env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}))
    events: list[Event] = []
    for line in (CAPTURES / "api-unreachable.jsonl").read_text().splitlines():
        events += parser.feed(line)
    statuses = [e.text for e in events if isinstance(e, Status)]
    assert statuses[0] == ("model API at http://127.0.0.1:9 unreachable (no answer: the connection was refused, "
                           "its name did not resolve, or it timed out); retrying, attempt 1 of 2")
    assert "unknown" not in " ".join(statuses)
    (error,) = [e for e in events if isinstance(e, Error)]
    assert error.text == ("Claude Code could not reach the model API at http://127.0.0.1:9: the connection was "
                          "refused (nothing listens there) (API Error: Unable to connect to API (ConnectionRefused))")


# ---------------------------------------------------------------- finish


def test_finish_without_result_line_is_an_error() -> None:
    """A CLI that dies without its result line did not succeed, whatever its exit code."""
    parser = ClaudeParser()
    parser.feed((CAPTURES / "text.jsonl").read_text().splitlines()[0])
    assert parser.finish(0, interrupted=False) == [Error("claude exited with status 0 before the end of its turn")]


def test_finish_of_a_killed_turn_is_never_success() -> None:
    """SIGKILLed before any result line: an Error, no Result."""
    parser = ClaudeParser()
    events = parser.finish(-9, interrupted=True)
    assert [type(e) for e in events] == [Error]


def test_finish_after_the_result_line_adds_nothing() -> None:
    """The result line has said it all."""
    parser = ClaudeParser()
    for line in (CAPTURES / "tool.jsonl").read_text().splitlines():
        parser.feed(line)
    assert parser.finish(0, interrupted=False) == []


# ---------------------------------------------------------------- robustness


@pytest.mark.parametrize(
    "line, reason",
    [
        ("garbage, not json", "not JSON"),
        ('{"type":"assistant","message":{"content":[{"type":"te', "not JSON"),
        ("[1, 2, 3]", "not a JSON object"),
        ('"a string"', "not a JSON object"),
        ("42", "not a JSON object"),
        ("null", "not a JSON object"),
        ('{"type":"brand_new_thing","x":1}', "unknown type 'brand_new_thing'"),
        ('{"no_type":true}', "unknown type None"),
        ('{"type":"system","subtype":"mystery"}', "unhandled system subtype 'mystery'"),
        ('{"type":"assistant","message":"hello"}', "'assistant' without a message"),
        ('{"type":"assistant","message":{"content":7}}', "'assistant' message without content blocks"),
        ('{"type":"user","message":{"content":{"a":1}}}', "'user' message without content"),
    ],
)
def test_odd_lines_are_unparsed(line: str, reason: str) -> None:
    """Lines the parser cannot use are Unparsed with a reason, never an exception."""
    assert ClaudeParser().feed(line) == [Unparsed(line, reason)]


def test_blank_lines_and_quiet_types_yield_nothing() -> None:
    """Blank lines and stream events (only with --include-partial-messages) are skipped."""
    parser = ClaudeParser()
    assert parser.feed("") == [] and parser.feed("   ") == []
    assert parser.feed('{"type":"stream_event","event":{"type":"message_start"}}') == []


def test_malformed_result_fields_do_not_raise() -> None:
    """A result line whose fields have the wrong types still ends the turn."""
    events = ClaudeParser().feed('{"type":"result","subtype":"success","result":5,"session_id":7,"permission_denials":"x"}')
    assert events[-1] == Result("", ok=True)


def test_tool_preview_is_bounded() -> None:
    """A huge command is cut to the preview limit."""
    line = json.dumps({"type": "assistant", "message": {"content": [
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "echo " + "x" * 5000}}]}})
    (event,) = ClaudeParser().feed(line)
    assert isinstance(event, ToolUse) and len(event.preview) == TOOL_PREVIEW_CHARS


def test_invalid_todowrite_is_a_plain_tool_use() -> None:
    """A TodoWrite with an unknown status is shown as a tool call, not a plan."""
    line = json.dumps({"type": "assistant", "message": {"content": [
        {"type": "tool_use", "id": "t1", "name": "TodoWrite", "input": {"todos": [{"content": "a", "status": "weird"}]}}]}})
    (event,) = ClaudeParser().feed(line)
    assert isinstance(event, ToolUse) and event.name == "TodoWrite"


def test_subagent_text_is_progress_not_the_answer() -> None:
    """Words of a Task subagent (parent_tool_use_id set) are statuses."""
    line = json.dumps({"type": "assistant", "parent_tool_use_id": "toolu_1",
                       "message": {"content": [{"type": "text", "text": "looking around"}]}})
    assert ClaudeParser().feed(line) == [Status("looking around")]


def test_tool_result_with_block_content() -> None:
    """A tool result may be a list of blocks; images become a placeholder."""
    line = json.dumps({"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t",
                       "content": [{"type": "text", "text": "line one"}, {"type": "image", "source": {}}]}]}})
    assert ClaudeParser().feed(line) == [ToolResult("line one [image]", is_error=False)]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(["system", "assistant", "user", "result", "stream_event", "x"])


@settings(max_examples=300, deadline=None)
@given(kind=KEYS, fields=st.dictionaries(
    st.sampled_from(["subtype", "message", "session_id", "result", "errors", "is_error", "error",
                     "permission_denials", "parent_tool_use_id", "terminal_reason"]), JSON, max_size=6))
def test_any_json_object_never_raises(kind: str, fields: dict[str, object]) -> None:
    """Whatever the shape of a line of a known type, feeding it returns events."""
    parser = ClaudeParser()
    assert isinstance(parser.feed(json.dumps({"type": kind, **fields})), list)
    assert not any(isinstance(e, Result) and e.ok for e in parser.finish(None, interrupted=True))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_never_raises(line: str) -> None:
    """Arbitrary text is Unparsed or nothing."""
    assert all(isinstance(e, Unparsed) for e in ClaudeParser().feed(line))


# ---------------------------------------------------------------- launch


def _typed(line: bytes) -> str:
    """The text of one stream-json user message line (what the CLI reads on stdin)."""
    assert line.endswith(b"\n") and line.count(b"\n") == 1, line
    message = json.loads(line)
    assert message["type"] == "user" and message["message"]["role"] == "user", message
    [block] = message["message"]["content"]
    assert block["type"] == "text", block
    return str(block["text"])


def test_fresh_launch() -> None:
    """Print mode, stream-json in and out, bypassed permissions, the prompt on stdin (not in
    argv) as one user message line, and stdin kept open for steered messages."""
    launch = build_launch(request())
    assert launch.argv == ("claude", "-p", "--input-format", "stream-json", "--output-format", "stream-json",
                           "--verbose", "--include-partial-messages", "--dangerously-skip-permissions")
    assert launch.cwd == "/srv/work/c1" and dict(launch.files) == {}
    assert launch.stdin is not None and _typed(launch.stdin) == "fix the bug" and launch.keep_stdin
    assert launch.env["IS_SANDBOX"] == "1"
    assert launch.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert launch.env["CLAUDE_CODE_ENABLE_TASKS"] == "0"
    assert "HOME" not in launch.env and "TMPDIR" not in launch.env


def test_resume_launch() -> None:
    """A known session id is resumed with --resume."""
    argv = build_launch(request(session_id="0b7c4a1e-5d2f-4c3b-9a8e-000000000000")).argv
    assert argv[-2:] == ("--resume", "0b7c4a1e-5d2f-4c3b-9a8e-000000000000")


def test_model_launch() -> None:
    """A configured model is passed with --model."""
    argv = build_launch(request(model="claude-haiku-4-5")).argv
    assert argv[argv.index("--model") + 1] == "claude-haiku-4-5"
    assert "--model" not in build_launch(request()).argv


def test_attended_launch_keeps_the_cli_permission_defaults() -> None:
    """unattended=False: no bypass flag, no sandbox claim."""
    launch = build_launch(request(unattended=False))
    assert "--dangerously-skip-permissions" not in launch.argv
    assert "IS_SANDBOX" not in launch.env


def test_the_prompt_is_never_in_argv_so_options_cannot_eat_or_parse_it() -> None:
    """Variadic options in args cannot eat the prompt, and a prompt starting with '-' stays a prompt."""
    launch = build_launch(request(args=("--allowedTools", "Bash", "Read"), prompt="-v is broken",
                                  command=("/opt/claude", "--debug")))
    assert launch.argv[:2] == ("/opt/claude", "--debug")
    assert launch.argv[-3:] == ("--allowedTools", "Bash", "Read")
    assert launch.stdin is not None and _typed(launch.stdin) == "-v is broken"
    assert not any("-v is broken" in arg for arg in launch.argv)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_a_steered_message_is_one_user_message_line_whatever_its_text(text: str) -> None:
    """The adapter steers: any text (newlines, quotes, a lone surrogate) is exactly one
    stream-json line the CLI reads as a user message with that text, as the prompt is."""
    assert ADAPTER.steer is not None
    line = ADAPTER.steer(text)
    assert _typed(line) == text
    assert line == build_launch(request(prompt=text)).stdin


def test_adapter_declares_sigint() -> None:
    """SIGINT is what makes the CLI kill its tool tree."""
    assert ADAPTER.interrupt_signal == signal.SIGINT
    assert ADAPTER.name == "claude" and ADAPTER.default_command == ("claude",)


def _stream(event: dict[str, object], parent: str | None = None) -> str:
    return json.dumps({"type": "stream_event", "event": event, "parent_tool_use_id": parent, "session_id": "s"})


def test_partial_messages_are_text_deltas_and_the_whole_message_is_not_posted_again() -> None:
    parser = ADAPTER.new_parser(request())
    events = parser.feed(_stream({"type": "message_start", "message": {"id": "msg_1"}}))
    events += parser.feed(_stream({"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": "Hel"}}))
    events += parser.feed(_stream({"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": "lo"}}))
    events += parser.feed(_stream({"type": "content_block_delta", "index": 1,
                                   "delta": {"type": "input_json_delta", "partial_json": "{"}}))
    assert events == [Text("Hel", delta=True), Text("lo", delta=True)]
    whole = {"type": "assistant", "message": {"id": "msg_1", "content": [
        {"type": "text", "text": "Hello"}, {"type": "tool_use", "id": "tu", "name": "Bash", "input": {"command": "ls"}}]}}
    assert [type(e) for e in parser.feed(json.dumps(whole))] == [ToolUse]
    # A message that was not streamed still posts its text.
    other = {"type": "assistant", "message": {"id": "msg_2", "content": [{"type": "text", "text": "Bye"}]}}
    assert parser.feed(json.dumps(other)) == [Text("Bye")]


def test_a_subagents_partial_messages_are_not_the_answer() -> None:
    parser = ADAPTER.new_parser(request())
    line = _stream({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}}, parent="toolu_1")
    assert parser.feed(line) == []


def test_a_second_answer_in_the_same_process_is_parsed_as_part_of_the_turn() -> None:
    """A message steered while the model wrote is answered after the first ``result``, in the
    same process: another ``system/init`` (the same session: not reported again), its text,
    another ``result``; nothing of it is lost or unparsed, and ``finish`` adds nothing."""
    sid = "0b7c4a1e-5d2f-4c3b-9a8e-000000000000"
    parser = ADAPTER.new_parser(request())
    events: list[Event] = []
    for answer in ("First answer.", "Second answer."):
        events += parser.feed(json.dumps({"type": "system", "subtype": "init", "session_id": sid}))
        events += parser.feed(json.dumps({"type": "assistant", "session_id": sid, "message": {
            "id": f"msg_{answer[:5]}", "role": "assistant", "content": [{"type": "text", "text": answer}]}}))
        events += parser.feed(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                                          "result": answer, "session_id": sid}))
    assert events == [SessionId(sid), Text("First answer."), Result("First answer.", ok=True),
                      Text("Second answer."), Result("Second answer.", ok=True)]
    assert parser.finish(0, interrupted=False) == []
