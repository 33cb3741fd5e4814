"""Tests for ``adapters.generic``: the corral line protocol and the launch it builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters import get_adapter
from adapters._base import (
    Error,
    Result,
    SessionId,
    Status,
    Text,
    TodoItem,
    Todos,
    ToolUse,
    TurnRequest,
    Unparsed,
)
from adapters.generic import ADAPTER, GenericParser, build_launch, new_parser


def request(**kw: object) -> TurnRequest:
    """A turn request with test defaults."""
    base: dict[str, object] = {
        "prompt": "do the thing",
        "channel": "c",
        "turn_id": "t1",
        "agent": "g",
        "command": ("/bin/agent", "--json"),
        "cwd": "/work/c",
    }
    base.update(kw)
    return TurnRequest(**base)  # type: ignore[arg-type]


def feed(line: str, parser: GenericParser | None = None) -> list[object]:
    """Events of one line fed to a (fresh) parser."""
    return list((parser or GenericParser()).feed(line))


def js(**obj: object) -> str:
    """A protocol line."""
    return json.dumps(obj)


# ---------------------------------------------------------------- the line protocol


def test_each_type() -> None:
    assert feed(js(type="text", text="hello")) == [Text("hello", delta=True)]
    assert feed(js(type="status", text="thinking")) == [Status("thinking")]
    assert feed(js(type="tool", name="shell", input={"cmd": "ls  -la\n/"})) == [ToolUse("shell", r'{"cmd":"ls -la\n/"}')]
    assert feed(js(type="tool", name="read")) == [ToolUse("read", "")]
    assert feed(js(type="session", id="abc-1")) == [SessionId("abc-1")]
    assert feed(js(type="result", text="done")) == [Result("done", ok=True)]
    assert feed(js(type="result")) == [Result("", ok=True)]
    assert feed(js(type="error", text="boom")) == [Error("boom")]
    assert feed(
        js(type="todos", todos=[{"content": "a", "status": "pending"}, {"content": "b", "status": "completed"}])
    ) == [Todos((TodoItem("a", "pending"), TodoItem("b", "completed")))]
    assert feed(js(type="todos", todos=[])) == [Todos(())]


def test_tool_input_preview_is_bounded() -> None:
    [event] = feed(js(type="tool", name="write", input="x" * 1000))
    assert isinstance(event, ToolUse) and len(event.preview) == 200 and event.preview.endswith("…")


def test_plain_lines_are_text_verbatim_and_blank_lines_are_dropped() -> None:
    assert feed("just some words") == [Text("just some words", delta=True)]
    assert feed("  indented  ") == [Text("  indented  ", delta=True)]
    assert feed("") == []
    assert feed("   \t") == []


@pytest.mark.parametrize(
    "line",
    [
        '{"text": "no type"}',
        '{"type": 3, "text": "type not a string"}',
        "[1, 2]",
        '"a string"',
        "{not json at all",
        '{"type": "text", "text": "unterminated',
        "{}",
    ],
)
def test_json_without_a_string_type_and_malformed_json_are_text(line: str) -> None:
    assert feed(line) == [Text(line, delta=True)]


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "text"},
        {"type": "text", "text": 5},
        {"type": "status", "text": None},
        {"type": "error", "text": ["x"]},
        {"type": "result", "text": 1},
        {"type": "tool", "input": "x"},
        {"type": "tool", "name": 1},
        {"type": "todos", "todos": "x"},
        {"type": "todos", "todos": [{"content": "a", "status": "someday"}]},
        {"type": "todos", "todos": [{"status": "pending"}]},
        {"type": "session"},
        {"type": "session", "id": ""},
        {"type": "session", "id": 7},
        {"type": "nonsense", "text": "x"},
    ],
)
def test_bad_fields_are_unparsed(obj: dict[str, object]) -> None:
    parser = GenericParser()
    [event] = parser.feed(json.dumps(obj))
    assert isinstance(event, Unparsed)
    assert json.loads(event.line) == obj
    assert event.reason
    # A bad result or error line does not count as the turn's outcome.
    assert parser.finish(1, interrupted=False) == [Error("agent exited with status 1")]


def joined(lines: list[str]) -> list[tuple[str, str]]:
    """What the turn makes of a parser's events: text deltas join until any other event."""
    parser, out, text = GenericParser(), [], []
    for line in lines:
        for event in parser.feed(line):
            if isinstance(event, Text):
                assert event.delta, "generic text is always a piece of a run"
                text.append(event.text)
                continue
            if isinstance(event, SessionId):  # the turn does not flush text for a session id
                continue
            if text:
                out.append(("message", "".join(text)))
                text.clear()
            out.append((type(event).__name__, getattr(event, "text", "")))
    if text:
        out.append(("message", "".join(text)))
    return out


def test_a_contiguous_run_of_text_pieces_and_plain_lines_is_one_message() -> None:
    lines = [
        js(type="session", id="s"),
        js(type="text", text="first piece"),
        "a plain line",
        js(type="text", text="last piece"),
        js(type="status", text="working"),
        "after the status",
        js(type="session", id="s"),  # invisible: does not split the run
        js(type="text", text="same message"),
        js(type="tool", name="shell", input="ls"),
        js(type="text", text="alone"),
        js(type="result", text="done"),
    ]
    assert joined(lines) == [
        ("message", "first piece\na plain line\nlast piece"),
        ("Status", "working"),
        ("message", "after the status\nsame message"),
        ("ToolUse", ""),
        ("message", "alone"),
        ("Result", "done"),
    ]


def test_blank_lines_inside_a_run_do_not_break_or_pad_it() -> None:
    assert joined(["one", "", "   ", "two"]) == [("message", "one\ntwo")]


def test_an_unparsed_line_or_an_error_ends_the_run() -> None:
    assert joined(["a", js(type="mystery"), "b", js(type="error", text="boom"), "c"]) == [
        ("message", "a"), ("Unparsed", ""), ("message", "b"), ("Error", "boom"), ("message", "c"),
    ]


# ---------------------------------------------------------------- finish


def test_finish_without_a_result_maps_the_exit_code() -> None:
    assert GenericParser().finish(0, interrupted=False) == [Result("", ok=True)]
    assert GenericParser().finish(2, interrupted=False) == [Error("agent exited with status 2")]
    assert GenericParser().finish(-9, interrupted=False) == [Error("agent exited with status -9")]
    assert GenericParser().finish(None, interrupted=False) == [Error("agent exited with status None")]


@pytest.mark.parametrize("returncode", [0, 1, -2, -9, None])
def test_finish_after_an_interrupt_adds_nothing(returncode: int | None) -> None:
    parser = GenericParser()
    parser.feed("partial answer")
    assert parser.finish(returncode, interrupted=True) == []


@pytest.mark.parametrize("returncode", [0, 1, None])
def test_finish_after_a_reported_result_or_error_adds_nothing(returncode: int | None) -> None:
    with_result = GenericParser()
    with_result.feed(js(type="result", text="ok"))
    assert with_result.finish(returncode, interrupted=False) == []
    with_error = GenericParser()
    with_error.feed(js(type="error", text="bad"))
    assert with_error.finish(returncode, interrupted=False) == []


def test_text_alone_does_not_end_the_turn() -> None:
    parser = GenericParser()
    parser.feed(js(type="text", text="hi"))
    parser.feed(js(type="status", text="s"))
    assert parser.finish(3, interrupted=False) == [Error("agent exited with status 3")]


def test_new_parser_is_fresh_each_turn() -> None:
    first = new_parser(request())
    first.feed(js(type="result", text="x"))
    second = new_parser(request())
    assert second is not first
    assert second.finish(1, interrupted=False) == [Error("agent exited with status 1")]


# ---------------------------------------------------------------- build_launch


def test_prompt_is_the_last_argument_after_configured_args() -> None:
    launch = build_launch(request(args=("-v", "--model-x")))
    assert launch.argv == ("/bin/agent", "--json", "-v", "--model-x", "--", "do the thing")
    assert launch.stdin is None
    assert launch.cwd == "/work/c"
    assert dict(launch.env) == {} and dict(launch.files) == {}


def test_a_prompt_that_looks_like_an_option_stays_one_last_argument_after_dashdash() -> None:
    launch = build_launch(request(prompt="--help me\nplease"))
    assert launch.argv[-2:] == ("--", "--help me\nplease")


def test_prompt_on_stdin() -> None:
    launch = build_launch(request(prompt="héllo", args=("-q",), options={"prompt": "stdin"}))
    assert launch.argv == ("/bin/agent", "--json", "-q")
    assert launch.stdin == "héllo".encode()


def test_resume_args_go_before_the_prompt_only_with_a_session() -> None:
    options = {"resume_args": ["--session", "{session}", "--id={session}"]}
    without = build_launch(request(args=("-v",), options=options))
    assert without.argv == ("/bin/agent", "--json", "-v", "--", "do the thing")
    with_session = build_launch(request(args=("-v",), options=options, session_id="s-42"))
    assert with_session.argv == ("/bin/agent", "--json", "-v", "--session", "s-42", "--id=s-42", "--", "do the thing")
    on_stdin = build_launch(request(options={**options, "prompt": "stdin"}, session_id="s-42"))
    assert on_stdin.argv == ("/bin/agent", "--json", "--session", "s-42", "--id=s-42")
    assert on_stdin.stdin == b"do the thing"


def test_a_session_without_resume_args_adds_nothing() -> None:
    assert build_launch(request(session_id="s-1")).argv == ("/bin/agent", "--json", "--", "do the thing")


def test_the_adapter_is_registered_as_generic() -> None:
    assert get_adapter("generic") is ADAPTER
    assert ADAPTER.default_command == ()
    assert ADAPTER.option_keys == {"resume_args", "prompt"}
    assert ADAPTER.build_launch is build_launch


# ---------------------------------------------------------------- supervised


QUIET_AGENT = r"""
import json, os, sys
print("first line", flush=True)
print(json.dumps({"type": "text", "text": "second line"}), flush=True)
os.read(os.open(sys.argv[-1], os.O_RDONLY), 1)  # quiet until the test opens the gate
print("after the wait", flush=True)
print("and its second line", flush=True)
"""


async def test_a_run_is_one_entry_and_shown_when_the_agent_goes_quiet(short_tmp: Path) -> None:
    import os

    import trio
    from conftest import make_config, script_agent

    from supervisor import open_supervisor

    gate = short_tmp / "gate"
    os.mkfifo(gate)
    config = make_config(short_tmp, {"g": script_agent(QUIET_AGENT)})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", str(gate))
        with trio.fail_after(30):
            async for entry in sup.follow("c", after=accepted.seq):
                if entry.kind == "message":
                    first = entry
                    break
        # Shown while the agent still runs, as one entry.
        assert first.text == "first line\nsecond line"
        assert sup._lanes.turns["c", "g"].turn_id == first.turn
        fd = os.open(gate, os.O_WRONLY)
        os.write(fd, b"x")
        os.close(fd)
        with trio.fail_after(30):
            assert await sup.wait_idle("c")
        messages = [e.text for e in await sup.entries("c", after=accepted.seq) if e.kind == "message"]
    assert messages == ["first line\nsecond line", "after the wait\nand its second line"]


@pytest.mark.parametrize("depth", [100_000, 5_000])
def test_a_line_nested_deeper_than_python_recurses_is_text_not_an_internal_error(depth: int) -> None:
    """Issue 41.11: such a line raised RecursionError past the parser and ended the turn with
    "Internal error in corral"; it is the agent's text."""
    line = '{"type": "tool", "name": "x", "input": ' + "[" * depth + "]" * depth + "}"
    assert feed(line) == [Text(line, delta=True)]


def test_a_deep_line_python_can_still_read_is_parsed_as_before() -> None:
    line = '{"type": "tool", "name": "x", "input": ' + "[" * 50 + "]" * 50 + "}"
    [event] = feed(line)
    assert isinstance(event, ToolUse) and event.name == "x"
