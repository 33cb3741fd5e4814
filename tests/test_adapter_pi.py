"""The pi adapter: its launch, and its parser replaying real captures of ``pi --mode json``.

The captures in ``tests/data/captures/pi`` come from the real CLI run against the fake OpenAI
chat server (``scripts/capture_pi.py``; see the README there). Session ids change when they
are regenerated, so the tests read them from the files.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from adapters import get_adapter
from adapters._base import (
    Error,
    Event,
    Result,
    SessionId,
    StaleSession,
    Status,
    Text,
    ToolResult,
    ToolUse,
    TurnRequest,
    Unparsed,
    Usage,
)
from adapters.pi import ADAPTER, READ_ONLY_TOOLS, PiParser, build_launch, models_json, new_parser

CAPTURES = Path(__file__).parent / "data" / "captures" / "pi"
STALE_ID = "00000000-0000-4000-8000-000000000000"


def request(**kw: object) -> TurnRequest:
    """A turn request with sensible defaults."""
    base: dict[str, object] = dict(
        prompt="hello", channel="general", turn_id="t1", agent="pi", command=("pi",), cwd="/srv/work", home="/srv/home",
    )
    base.update(kw)
    return TurnRequest(**base)  # type: ignore[arg-type]


def lines(name: str) -> list[str]:
    return (CAPTURES / f"{name}.jsonl").read_text().splitlines()


def stderr_lines(name: str) -> list[str]:
    return (CAPTURES / f"{name}.stderr.txt").read_text().splitlines()


def session_of(name: str) -> str:
    return str(json.loads(lines(name)[0])["id"])


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


def joined_text(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, Text))


# ---------------------------------------------------------------- launch


def test_the_adapter_is_known_and_interrupts_with_sigint() -> None:
    assert get_adapter("pi") is ADAPTER
    assert ADAPTER.default_command == ("pi",) and ADAPTER.interrupt_signal == signal.SIGINT
    assert ADAPTER.option_keys == {"base_url", "api", "env_key"}


def test_launch_puts_the_prompt_on_stdin_and_keeps_pi_offline() -> None:
    launch = build_launch(request(prompt="--model x -p secret"))
    assert launch.argv == ("pi", "--mode", "json")
    assert launch.stdin == b"--model x -p secret"
    assert launch.env["PI_OFFLINE"] == "1" and launch.cwd == "/srv/work"
    settings = json.loads(launch.files[".pi/agent/settings.json"])
    assert settings["enableInstallTelemetry"] is False
    assert ".pi/agent/models.json" not in launch.files


def test_a_model_of_ones_own_is_a_provider_whose_key_stays_in_the_environment() -> None:
    req = request(model="m1", options={"base_url": "http://127.0.0.1:9/v1", "env_key": "MY_KEY"})
    launch = build_launch(req)
    assert launch.argv[-2:] == ("--model", "corral/m1")
    models = json.loads(launch.files[".pi/agent/models.json"])
    assert models == models_json(req)
    assert models["providers"]["corral"] == {
        "baseUrl": "http://127.0.0.1:9/v1", "api": "openai-completions", "apiKey": "MY_KEY", "models": [{"id": "m1"}],
    }


def test_a_builtin_model_is_passed_as_is() -> None:
    model = "anthropic/claude-sonnet-4-5"
    assert build_launch(request(model=model)).argv[-2:] == ("--model", model)


def test_resume_and_attended_and_args() -> None:
    launch = build_launch(request(session_id="abc", unattended=False, args=("--thinking", "off")))
    assert launch.argv == ("pi", "--mode", "json", "--session", "abc", "--tools", READ_ONLY_TOOLS, "--thinking", "off")


# ---------------------------------------------------------------- captures


@pytest.mark.parametrize("path", sorted(CAPTURES.glob("*.jsonl")), ids=lambda p: p.stem)
def test_every_capture_parses_without_unparsed_lines(path: Path) -> None:
    parser = PiParser()
    for line in path.read_text().splitlines():
        assert not [e for e in parser.feed(line) if isinstance(e, Unparsed)], line


def test_captures_cover_the_required_scenarios() -> None:
    names = {p.stem for p in CAPTURES.glob("*.jsonl")}
    assert {"text", "resume", "tool", "interrupt_tool", "stale_session", "error_500", "attended_tool"} <= names


def test_text_turn_streams_deltas_and_ends_with_the_answer() -> None:
    events = replay("text")
    assert events[0] == SessionId(session_of("text"))
    assert all(e.delta for e in events if isinstance(e, Text)) and len([e for e in events if isinstance(e, Text)]) > 1
    assert joined_text(events) == "Hello from the fake model."
    assert events[-1] == Result("Hello from the fake model.", ok=True)


def test_resumed_turn_keeps_its_session_id() -> None:
    sid = session_of("resume")
    events = replay("resume", session_id=sid)
    assert events[0] == SessionId(sid) and not [e for e in events if isinstance(e, Status)]
    assert events[-1] == Result("Second answer, same session.", ok=True)


def test_tool_turn() -> None:
    events = [e for e in replay("tool") if not (isinstance(e, Text) and e.delta)]
    assert events == [
        SessionId(session_of("tool")),
        ToolUse("bash", "echo hello from the tool"),
        ToolResult("hello from the tool", is_error=False),
        Result("It printed hello.", ok=True),
    ]


def test_failing_tool_is_an_error_result() -> None:
    results = [e for e in replay("tool_error") if isinstance(e, ToolResult)]
    assert len(results) == 1 and results[0].is_error and "No such file" in results[0].preview


def test_attended_agent_has_no_bash() -> None:
    results = [e for e in replay("attended_tool") if isinstance(e, ToolResult)]
    assert results and results[0].is_error and "not found" in results[0].preview


def test_interrupted_turn_is_no_success_and_no_error() -> None:
    events = replay("interrupt_tool", returncode=-2, interrupted=True)
    assert not [e for e in events if isinstance(e, Result | Error)]
    assert [e for e in events if isinstance(e, ToolUse)]


def test_a_killed_turn_that_was_not_stopped_is_an_error() -> None:
    events = replay("interrupt_stream", returncode=-2)
    assert isinstance(events[-1], Error) and "status -2" in events[-1].text


def test_stale_session_is_reported() -> None:
    events = replay("stale_session", session_id=STALE_ID, returncode=1)
    assert events == [StaleSession(f"No session found matching '{STALE_ID}'")]


def test_a_failed_model_request_is_one_error_after_pis_retries() -> None:
    events = replay("error_500")
    errors = [e for e in events if isinstance(e, Error)]
    assert len(errors) == 1 and "500" in errors[0].text
    assert [e for e in events if isinstance(e, Status) and e.text.startswith("retrying")]
    assert not [e for e in events if isinstance(e, Result)]


def test_an_error_without_a_retry_is_reported_at_exit() -> None:
    parser = PiParser()
    failed = {"role": "assistant", "content": [], "stopReason": "error", "errorMessage": "400 bad request"}
    parser.feed(json.dumps({"type": "message_end", "message": failed}))
    assert parser.feed(json.dumps({"type": "agent_end", "messages": []})) == []
    assert parser.finish(0, interrupted=False) == [Error("400 bad request")]


def test_a_text_not_streamed_as_deltas_is_sent_whole() -> None:
    parser = PiParser()
    message = {"role": "assistant", "content": [{"type": "text", "text": "Whole."}], "stopReason": "stop"}
    assert parser.feed(json.dumps({"type": "message_end", "message": message})) == [Text("Whole.")]
    assert parser.feed(json.dumps({"type": "agent_end"})) == [Result("Whole.", ok=True)]


def test_the_docs_pi_example_is_a_valid_config(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib

    from supervisor import parse_config

    page = (Path(__file__).parent.parent / "docs" / "agents.md").read_text()
    section = page[page.index("\n## pi\n"):]
    block = section[section.index("```toml\n") + 8 : section.index("```\n", section.index("```toml\n"))]
    bin_dir = short_tmp / "bin"  # pi's binary, as an install would put it on PATH
    bin_dir.mkdir()
    (bin_dir / "pi").write_text("#!/bin/sh\n")
    (bin_dir / "pi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    config = parse_config({**tomllib.loads(block), "defaults": {"agent": "pi"}}, base=short_tmp)
    agent = config.agents["pi"]
    assert agent.command == ("pi",) and agent.options["base_url"] == "http://127.0.0.1:8000/v1"
    launch = build_launch(request(model=agent.model, options=agent.options))
    assert launch.argv[-2:] == ("--model", "corral/qwen3-coder")
    assert json.loads(launch.files[".pi/agent/models.json"])["providers"]["corral"]["apiKey"] == "LOCAL_API_KEY"
