"""The gemini adapter: its launch, and its parser replaying real captures of the CLI.

The captures in ``tests/data/captures/gemini`` were made by ``scripts/capture_gemini.py``
from the real ``gemini`` CLI talking to the fake Gemini API; ``manifest.json`` there has
each run's exit code and whether it was stopped.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters import gemini
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
    preview,
)

CAPTURES = Path(__file__).parent / "data" / "captures" / "gemini"
MANIFEST: dict[str, Any] = json.loads((CAPTURES / "manifest.json").read_text())
SHELL = "run_shell_command"


def request(**overrides: Any) -> TurnRequest:
    """A turn request with test defaults."""
    values: dict[str, Any] = dict(
        prompt="hello",
        channel="c1",
        turn_id="t1",
        agent="gem",
        command=("gemini",),
        cwd="/work/c1",
        home="/homes/gem",
    )
    values.update(overrides)
    return TurnRequest(**values)


def lines(name: str, suffix: str = ".jsonl") -> list[str]:
    """A capture's lines, without their newlines."""
    return (CAPTURES / f"{name}{suffix}").read_text().splitlines()


def replay(name: str, *, stderr: bool = True, resuming: str | None = None) -> list[Event]:
    """Feed a capture to a fresh parser as the supervisor would, finish included."""
    meta = MANIFEST[name]
    parser = gemini.new_parser(request(session_id=resuming if resuming is not None else meta["resumed"]))
    events: list[Event] = []
    for line in lines(name):
        events += parser.feed(line)
    if stderr:
        for line in lines(name, ".stderr.txt"):
            events += parser.feed_stderr(line)
    events += parser.finish(meta["returncode"], interrupted=meta["interrupted"])
    # Usage is checked apart (tests/test_usage_parsers.py): these are the transcript's events.
    return [e for e in events if not isinstance(e, Usage)]


def session_of(name: str) -> str:
    """The session id of a capture's init line."""
    return json.loads(lines(name)[0])["session_id"]


def shell_use(command: str) -> ToolUse:
    """The ToolUse the fake model's shell call becomes."""
    return ToolUse(SHELL, preview({"command": command, "description": "run a command"}))


# ---------------------------------------------------------------- captures


def expected(name: str) -> list[Event]:
    """What each capture must parse into, in order."""
    sid = SessionId(session_of(name)) if lines(name) else None
    if name == "text":
        return [sid, Text("Hello from the fake Gemini.", delta=True), Result("Hello from the fake Gemini.")]
    if name == "resume-first":
        return [sid, Text("I will remember 42.", delta=True), Result("I will remember 42.")]
    if name == "resume-second":
        return [SessionId(session_of("resume-first")), Text("You said 42.", delta=True), Result("You said 42.")]
    if name == "tool":
        answer = "The command printed hi-from-tool."
        return [sid, shell_use("echo hi-from-tool"), ToolResult("hi-from-tool"), Text(answer, delta=True), Result(answer)]
    if name == "todos":
        plan = Todos(
            (
                TodoItem("Read the request", "completed"),
                TodoItem("Run the command", "in_progress"),
                TodoItem("Report back", "pending"),
            )
        )
        answer = "All three steps done."
        return [sid, plan, shell_use("echo planned"), ToolResult("planned"), Text(answer, delta=True), Result(answer)]
    if name == "slow":
        answer = "This answer arrives in several small pieces over a second."
        pieces = [Text(json.loads(line)["content"], delta=True) for line in lines(name) if '"role":"assistant"' in line]
        return [sid, *pieces, Result(answer)]
    if name == "interrupted-tool":
        # A stopped gemini prints nothing more and exits 0: no Result, no Error.
        return [sid, shell_use("sleep 30")]
    if name == "interrupted-resume":
        return [SessionId(session_of("interrupted-tool")), Text("Back after the stop.", delta=True), Result("Back after the stop.")]
    if name == "interrupted-text":
        # Stopped after the second piece; whatever arrived is text, and nothing ends the turn.
        pieces = [json.loads(line)["content"] for line in lines(name) if '"role":"assistant"' in line]
        assert len(pieces) >= 2 and "one two three four five six seven eight nine ten".startswith("".join(pieces))
        return [sid, *(Text(piece, delta=True) for piece in pieces)]
    if name == "interrupted-silent":
        return [sid]
    if name == "stale-session":
        return [StaleSession(lines(name, ".stderr.txt")[0])]
    if name == "stale-no-sessions":
        return [StaleSession("Error resuming session: No previous sessions found for this project.")]
    if name in ("error-400", "error-500"):
        status = name.split("-")[1]
        message = json.loads(lines(name)[-1])["error"]["message"]
        assert f"fake server error {status}" in message
        return [sid, Error(message), Result("", ok=False)]
    if name == "empty-response":
        message = "The model returned an empty response with no text or thoughts. This may be a transient API issue; please try again."
        return [sid, Error(message), Result("", ok=False)]
    if name == "background":
        answer = "Started it in the background."
        return [sid, shell_use("nohup sleep 300 >/dev/null 2>&1 &"), ToolResult(""), Text(answer, delta=True), Result(answer)]
    raise AssertionError(f"no expectation for capture {name!r}: add one")


ALL_CAPTURES = sorted(path.name.removesuffix(".jsonl") for path in CAPTURES.glob("*.jsonl"))


def test_every_scenario_was_captured() -> None:
    """The capture script's scenarios and the files agree."""
    assert sorted(MANIFEST) == ALL_CAPTURES
    assert len(ALL_CAPTURES) >= 10


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_capture_replays_to_expected_events(name: str) -> None:
    """Every real capture parses, with nothing unparsed, into the expected events."""
    events = replay(name)
    assert not [e for e in events if isinstance(e, Unparsed)]
    assert events == expected(name)


@pytest.mark.parametrize("name", ALL_CAPTURES)
def test_stopped_turn_never_succeeds(name: str) -> None:
    """Whatever was printed, a turn finished as interrupted adds no successful Result."""
    parser = gemini.new_parser(request())
    for line in lines(name):
        parser.feed(line)
    tail = parser.finish(0, interrupted=True)
    assert not [e for e in tail if isinstance(e, Result) and e.ok]


def test_killed_gemini_exit_zero_is_not_success() -> None:
    """A gemini killed mid-tool exits 0 with no result line; unless it was our stop, that is an Error."""
    assert MANIFEST["interrupted-tool"]["returncode"] == 0
    parser = gemini.new_parser(request())
    for line in lines("interrupted-tool"):
        parser.feed(line)
    tail = parser.finish(0, interrupted=False)
    assert len(tail) == 1 and isinstance(tail[0], Error)


def test_stale_session_without_stderr_is_still_stale() -> None:
    """If stderr never reaches the parser, a resume that exits 42 before any output is stale."""
    events = replay("stale-session", stderr=False)
    assert len(events) == 1 and isinstance(events[0], StaleSession)


def test_coloured_stale_line_is_recognised() -> None:
    """gemini colours fatal errors red unless NO_COLOR; the stale message still counts."""
    parser = gemini.new_parser(request(session_id="abc"))
    line = "\x1b[31mError resuming session: No previous sessions found for this project.\x1b[0m"
    assert parser.feed_stderr(line) == [StaleSession("Error resuming session: No previous sessions found for this project.")]


def test_exit_42_without_resume_is_an_error() -> None:
    """Exit 42 of a fresh turn is a plain failure, never a stale session."""
    parser = gemini.new_parser(request())
    assert parser.feed_stderr("Some fatal input error") == []
    assert parser.finish(42, interrupted=False) == [Error("gemini exited with status 42: Some fatal input error")]


def test_stale_session_reported_once() -> None:
    """The stale line, seen on stderr, is not repeated by finish."""
    parser = gemini.new_parser(request(session_id="abc"))
    first = parser.feed_stderr("Error resuming session: No previous sessions found for this project.")
    assert first == [StaleSession("Error resuming session: No previous sessions found for this project.")]
    assert parser.feed_stderr("Error resuming session: again") == []
    assert parser.finish(42, interrupted=False) == []


def test_background_job_capture_shows_survivor() -> None:
    """Recorded fact: a `nohup … &` started by the tool outlived a successful turn."""
    assert any("sleep 300" in s for s in MANIFEST["background"]["survivors"])
    assert any("sleep 30" in s for s in MANIFEST["interrupted-tool"]["survivors"])


# ---------------------------------------------------------------- launch


def test_fresh_launch() -> None:
    """Stream-json, yolo, the prompt on stdin (headless gemini reads it there), not in argv."""
    launch = gemini.build_launch(request(prompt="fix the bug"))
    assert launch.argv == ("gemini", "--output-format=stream-json", "--approval-mode=yolo")
    assert launch.cwd == "/work/c1"
    assert launch.stdin == b"fix the bug"
    assert launch.env == {
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_TELEMETRY_ENABLED": "false",
        "NO_COLOR": "1",
    }
    assert "HOME" not in launch.env


def test_settings_file() -> None:
    """settings.json: API-key auth, no usage statistics, no telemetry."""
    files = gemini.build_launch(request()).files
    assert list(files) == [".gemini/settings.json"]
    settings = json.loads(files[".gemini/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False


def test_auth_type_option() -> None:
    """The auth_type option picks another auth method."""
    launch = gemini.build_launch(request(options={"auth_type": "vertex-ai"}))
    assert json.loads(launch.files[".gemini/settings.json"])["security"]["auth"]["selectedType"] == "vertex-ai"
    assert "auth_type" in gemini.ADAPTER.option_keys


def test_resume_launch() -> None:
    """A known session is resumed with --resume=ID."""
    argv = gemini.build_launch(request(session_id="3f2a-1")).argv
    assert argv[-1] == "--resume=3f2a-1"


def test_model_launch() -> None:
    """A configured model is passed with --model=."""
    argv = gemini.build_launch(request(model="gemini-2.5-pro")).argv
    assert "--model=gemini-2.5-pro" in argv
    assert not any(a.startswith("--model") for a in gemini.build_launch(request()).argv)


def test_attended_launch_keeps_cli_permission_defaults() -> None:
    """unattended=False leaves out yolo: gemini's own approval mode applies."""
    argv = gemini.build_launch(request(unattended=False)).argv
    assert not any("approval-mode" in a or a in ("-y", "--yolo") for a in argv)
    assert argv == ("gemini", "--output-format=stream-json")


def test_args_go_after_corral_flags_and_before_resume_and_prompt() -> None:
    """Configured args sit between corral's flags and the resume/prompt."""
    argv = gemini.build_launch(request(args=("--sandbox", "-e", "none"), session_id="s1", model="m")).argv
    assert argv == (
        "gemini",
        "--output-format=stream-json",
        "--approval-mode=yolo",
        "--model=m",
        "--sandbox",
        "-e",
        "none",
        "--resume=s1",
    )


def test_configured_command_is_used() -> None:
    """A configured command (e.g. npx) replaces the default binary."""
    argv = gemini.build_launch(request(command=("npx", "@google/gemini-cli"))).argv
    assert argv[:2] == ("npx", "@google/gemini-cli")


@pytest.mark.parametrize("prompt", ["-h", "--version", "--resume=x", "", "two\nlines", "a=b"])
def test_prompt_is_never_an_argument(prompt: str) -> None:
    """A prompt that looks like a flag stays the prompt: it goes on stdin, verbatim."""
    launch = gemini.build_launch(request(prompt=prompt))
    assert launch.stdin == prompt.encode()
    assert not any(prompt and prompt in a for a in launch.argv)


def test_adapter_metadata() -> None:
    """Name, default binary, SIGINT first on a stop, the prompt on stdin (its write is the point of no return)."""
    assert gemini.ADAPTER.name == "gemini"
    assert gemini.ADAPTER.default_command == ("gemini",)
    assert gemini.ADAPTER.interrupt_signal == signal.SIGINT
    assert gemini.build_launch(request()).stdin is not None
    assert isinstance(gemini.ADAPTER.new_parser(request()), gemini.GeminiParser)


# ---------------------------------------------------------------- parser details


def feed_all(*objs: object) -> tuple[gemini.GeminiParser, list[Event]]:
    """Feed JSON-encoded objects (strings as they are) to a fresh parser."""
    parser = gemini.new_parser(request())
    events: list[Event] = []
    for obj in objs:
        events += parser.feed(obj if isinstance(obj, str) else json.dumps(obj))
    return parser, events


def test_final_answer_is_text_after_last_tool() -> None:
    """Commentary before a tool call is not the final answer."""
    _, events = feed_all(
        {"type": "message", "role": "assistant", "content": "Let me look.", "delta": True},
        {"type": "tool_use", "tool_name": "read_file", "tool_id": "t1", "parameters": {"path": "a"}},
        {"type": "tool_result", "tool_id": "t1", "status": "success", "output": "x"},
        {"type": "message", "role": "assistant", "content": "It is ", "delta": True},
        {"type": "message", "role": "assistant", "content": "fine.", "delta": True},
        {"type": "result", "status": "success", "stats": {}},
    )
    assert events[-1] == Result("It is fine.")


def test_tool_error_result() -> None:
    """A failed tool becomes an error ToolResult carrying the error message."""
    _, events = feed_all(
        {
            "type": "tool_result",
            "tool_id": "t",
            "status": "error",
            "output": "",
            "error": {"type": "FILE_NOT_FOUND", "message": "File not found: a"},
        }
    )
    assert events == [ToolResult("File not found: a", is_error=True)]


def test_long_tool_input_is_bounded() -> None:
    """Tool previews stay short."""
    _, events = feed_all({"type": "tool_use", "tool_name": SHELL, "tool_id": "t", "parameters": {"command": "x" * 5000}})
    assert isinstance(events[0], ToolUse) and len(events[0].preview) <= 200


def test_warning_is_status_error_is_error() -> None:
    """`error` lines: a warning is progress, an error is shown as one."""
    _, events = feed_all(
        {"type": "error", "severity": "warning", "message": "Loop detected"},
        {"type": "error", "severity": "error", "message": "Maximum session turns exceeded"},
    )
    assert events == [Status("Loop detected"), Error("Maximum session turns exceeded")]


def test_error_result_without_message_after_none() -> None:
    """A bare error result still tells the user something went wrong."""
    _, events = feed_all({"type": "result", "status": "error", "stats": {}})
    assert events == [Error("gemini ended the turn with status 'error'"), Result("", ok=False)]


def test_malformed_todos_fall_back_to_tool_use() -> None:
    """A write_todos call the parser cannot read is still shown as a tool call."""
    params = {"todos": [{"description": "x", "status": "weird"}]}
    _, events = feed_all({"type": "tool_use", "tool_name": "write_todos", "tool_id": "t", "parameters": params})
    assert events == [ToolUse("write_todos", preview(params))]


def test_blocked_todo_is_pending() -> None:
    """gemini's extra `blocked` status maps to pending."""
    params = {"todos": [{"description": "x", "status": "blocked"}]}
    _, events = feed_all({"type": "tool_use", "tool_name": "write_todos", "tool_id": "t", "parameters": params})
    assert events == [Todos((TodoItem("x", "pending"),))]


def test_nonzero_exit_without_result_is_error_with_stderr() -> None:
    """A crash before the result line is an Error naming the status and the last stderr line."""
    parser, _ = feed_all({"type": "init", "session_id": "s"})
    parser.feed_stderr("Boom: something broke")
    assert parser.finish(1, interrupted=False) == [Error("gemini exited with status 1: Boom: something broke")]


def test_nothing_added_after_result() -> None:
    """After the result line, finish adds nothing, whatever the exit status."""
    parser, _ = feed_all({"type": "result", "status": "success"})
    assert parser.finish(0, interrupted=False) == []
    assert parser.finish(1, interrupted=False) == []


# ---------------------------------------------------------------- robustness


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("garbage here", "not JSON"),
        ('{"type":"message","role":"assis', "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ("42", "not a JSON object"),
        ('"a string"', "not a JSON object"),
        ("null", "not a JSON object"),
        ('{"type":"telemetry","x":1}', "unknown type 'telemetry'"),
        ('{"no_type":true}', "unknown type None"),
        ('{"type":7}', "unknown type 7"),
        ('{"type":"init"}', "'init' without a session_id"),
        ('{"type":"message","role":"assistant","content":null}', "'message' without a string content"),
        ('{"type":"message","role":"robot","content":"x"}', "'message' from unknown role 'robot'"),
        ('{"type":"tool_use","parameters":{}}', "'tool_use' without a tool_name"),
        ('{"type":"tool_result","status":"maybe"}', "'tool_result' with unknown status 'maybe'"),
        ('{"type":"error","severity":"error"}', "'error' without a message"),
    ],
)
def test_bad_lines_are_unparsed(line: str, reason: str) -> None:
    """Bad lines become Unparsed with a reason, never an exception."""
    assert gemini.new_parser(request()).feed(line) == [Unparsed(line, reason)]


def test_blank_lines_are_ignored() -> None:
    """Empty lines produce nothing."""
    parser = gemini.new_parser(request())
    assert parser.feed("") == [] and parser.feed("   ") == []
    assert parser.feed_stderr("") == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {"type": st.sampled_from(["init", "message", "tool_use", "tool_result", "error", "result", "other"])},
    optional={
        k: JSON
        for k in ("session_id", "role", "content", "delta", "tool_name", "tool_id", "parameters", "status", "output", "error", "severity", "message")
    },
)


@given(st.lists(st.text() | FIELDS.map(json.dumps), max_size=8), st.one_of(st.none(), st.integers(-9, 255)), st.booleans())
def test_parser_never_raises(feed: list[str], returncode: int | None, interrupted: bool) -> None:
    """Any sequence of lines, then any ending: events, never an exception; no success after a stop."""
    parser = gemini.new_parser(request(session_id="s"))
    for line in feed:
        parser.feed(line)
        parser.feed_stderr(line)
    tail = parser.finish(returncode, interrupted=interrupted)
    if interrupted:
        assert tail == []
