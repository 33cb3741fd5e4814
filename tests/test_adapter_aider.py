"""The ``aider`` adapter: launches, the parser on real aider output, and resumption.

The captures in ``tests/data/captures/aider/`` are the real stdout of aider-chat 0.86.2
against a fake Chat Completions server (their README says how each was made). The last
tests run ``tests/fakes/fake_aider.py`` with the adapter's argv to show that a second
turn sees the first one's conversation through the chat history file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from adapters import get_adapter
from adapters._base import (
    Error,
    Event,
    Result,
    SessionId,
    Status,
    Text,
    ToolResult,
    ToolUse,
    TurnRequest,
)
from adapters.aider import (
    ADAPTER,
    BASE_ARGS,
    AiderParser,
    build_launch,
    history_file_for,
    is_valid_session,
    looks_like_error,
    message_file,
    new_parser,
)
from supervisor.testing import read_pid
from supervisor.procs.files import write_home_files as _write_files

CAPTURES = Path(__file__).parent / "data" / "captures" / "aider"
FAKE_AIDER = Path(__file__).parent / "fakes" / "fake_aider.py"


def request(**overrides: object) -> TurnRequest:
    """A turn request with sensible defaults."""
    fields: dict[str, object] = dict(
        prompt="fix the bug",
        channel="c1",
        turn_id="t1",
        agent="aider",
        command=("aider",),
        cwd="/srv/work/c1",
        home="/srv/home/aider",
    )
    fields.update(overrides)
    return TurnRequest(**fields)  # type: ignore[arg-type]


def feed_all(parser: AiderParser, text: str) -> list[Event]:
    """Every event of ``text``'s lines, without finishing."""
    events: list[Event] = []
    for line in text.splitlines():
        events += parser.feed(line)
    return events


def replay(name: str, *, interrupted: bool = False, returncode: int | None = None) -> list[Event]:
    """Feed a capture's stdout to a fresh parser, then finish it with the capture's exit status."""
    if returncode is None:
        returncode = json.loads((CAPTURES / f"{name}.json").read_text())["returncode"]
    parser = new_parser(request())
    events = feed_all(parser, (CAPTURES / f"{name}.stdout").read_text(encoding="utf-8"))
    return events + parser.finish(returncode, interrupted=interrupted)


def of(events: list[Event], kind: type) -> list[Event]:
    """The events of one kind."""
    return [e for e in events if isinstance(e, kind)]


def streamed(events: list[Event]) -> str:
    """The answer as the supervisor joins it: the Text deltas, concatenated."""
    return "".join(e.text for e in of(events, Text))  # type: ignore[attr-defined]


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    """The argument after ``flag``."""
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------- launch


def test_registered_under_its_name() -> None:
    assert get_adapter("aider") is ADAPTER
    assert ADAPTER.default_command == ("aider",)
    assert ADAPTER.interrupt_signal == signal.SIGINT


def test_fresh_turn_writes_a_new_history_file_and_does_not_restore() -> None:
    launch = build_launch(request(turn_id="turn-42"))
    assert launch.argv[0] == "aider"
    assert flag_value(launch.argv, "--chat-history-file") == ".aider.chat.history.turn-42.md"
    assert "--restore-chat-history" not in launch.argv
    message = message_file(request())
    assert launch.argv[-1] == f"--message-file={request().home}/{message}"
    assert launch.cwd == "/srv/work/c1"
    assert launch.stdin is None
    assert launch.files == {message: "fix the bug"}, "the prompt is in a private file, not in argv"
    assert launch.env == {"COLUMNS": "4096"}


def test_resumed_turn_restores_the_named_history_file() -> None:
    launch = build_launch(request(session_id=".aider.chat.history.turn-1.md"))
    argv = launch.argv
    assert flag_value(argv, "--chat-history-file") == ".aider.chat.history.turn-1.md"
    assert argv.index("--restore-chat-history") < len(argv) - 1 and argv[-1].startswith("--message-file=")


@pytest.mark.parametrize("bad", ["../elsewhere.md", "/etc/passwd", "-rf", "..", ".", "a/b.md", "x\n", ""])
def test_a_session_id_that_is_not_a_plain_file_name_starts_afresh(bad: str) -> None:
    assert not is_valid_session(bad)
    launch = build_launch(request(session_id=bad, turn_id="t9"))
    assert flag_value(launch.argv, "--chat-history-file") == ".aider.chat.history.t9.md"
    assert "--restore-chat-history" not in launch.argv


def test_history_file_names_are_safe_for_odd_turn_ids() -> None:
    assert history_file_for("a/b c") == ".aider.chat.history.a-b-c.md"
    assert history_file_for("../..") == ".aider.chat.history.session.md"
    assert is_valid_session(history_file_for("any turn / id ☃"))


def test_model_is_passed_when_set() -> None:
    assert "--model" not in build_launch(request()).argv
    argv = build_launch(request(model="openai/gpt-4o")).argv
    assert flag_value(argv, "--model") == "openai/gpt-4o"


def test_unattended_says_yes_always_and_attended_suggests_no_shell_commands() -> None:
    unattended = build_launch(request()).argv
    assert "--yes-always" in unattended
    assert "--no-suggest-shell-commands" not in unattended
    attended = build_launch(request(unattended=False)).argv
    assert "--yes-always" not in attended
    # Without a TTY aider answers its own questions with the default, "yes": see the module doc.
    assert "--no-suggest-shell-commands" in attended


def test_configured_args_come_after_the_defaults_so_they_can_override_them() -> None:
    argv = build_launch(request(args=("--git", "--openai-api-base", "http://127.0.0.1:9/v1"))).argv
    assert argv.index("--no-git") < argv.index("--git")
    assert flag_value(argv, "--openai-api-base") == "http://127.0.0.1:9/v1"
    assert argv.index("--git") < argv.index("--chat-history-file")
    for flag in ("--no-pretty", "--no-check-update", "--no-analytics", "--no-show-release-notes"):
        assert flag in BASE_ARGS


def test_a_prompt_that_looks_like_a_flag_stays_the_message() -> None:
    # The prompt never reaches aider's option parser: it is the content of a file.
    launch = build_launch(request(prompt="-v please\nand more"))
    assert list(launch.files.values()) == ["-v please\nand more"]
    assert not any("-v please" in a for a in launch.argv)


def test_each_channel_has_its_own_message_file() -> None:
    assert message_file(request(channel="a")) != message_file(request(channel="b"))
    assert message_file(request(channel="a")).startswith("tmp/")


# ---------------------------------------------------------------- real captures


def test_fresh_capture_is_the_answer_then_a_result() -> None:
    events = replay("fresh")
    assert events[0] == SessionId(".aider.chat.history.t1.md")
    assert streamed(events) == "Hello from the fake model.\n\nSecond paragraph."
    assert all(e.delta for e in of(events, Text))  # type: ignore[attr-defined]
    assert events[-1] == Result("Hello from the fake model.\n\nSecond paragraph.", ok=True)
    statuses = [e.text for e in of(events, Status)]  # type: ignore[attr-defined]
    assert "Tokens: 604 sent, 9 received." in statuses
    # The offline model-metadata download failure is noise, not an error.
    assert any("model_prices_and_context_window.json" in s for s in statuses)
    assert not of(events, Error)
    # The banner repeats every turn and is dropped.
    assert not any(s.startswith(("Aider v", "Model:", "Git repo:", "Repo-map:")) for s in statuses)


def test_resume_capture_reports_the_restored_history() -> None:
    events = replay("resume")
    assert Status("Restored previous conversation history.") in events
    assert events[-1] == Result("I remember you.", ok=True)
    argv = json.loads((CAPTURES / "resume.json").read_text())["argv"]
    fresh_argv = json.loads((CAPTURES / "fresh.json").read_text())["argv"]
    assert "--restore-chat-history" in argv
    assert flag_value(tuple(argv), "--chat-history-file") == flag_value(tuple(fresh_argv), "--chat-history-file")
    # The history file holds both exchanges in aider's markdown.
    history = (CAPTURES / "resume.history.md").read_text()
    assert "#### again [[say:I remember you.]]" in history
    assert "Hello from the fake model." in history


def test_sigint_capture_keeps_the_partial_answer_but_is_no_success() -> None:
    events = replay("sigint_stream", interrupted=True)
    assert streamed(events) == "word0 word1 word2 word3"
    assert Status("^C again to exit") in events
    assert not of(events, Result)
    assert of(events, SessionId)  # the partial exchange is in the history file: resumable


def test_sigint_capture_without_the_stop_flag_is_still_parsed() -> None:
    # aider exits 0 after a ^C; only the supervisor knows it asked for the stop.
    events = replay("sigint_stream")
    assert events[-1] == Result("word0 word1 word2 word3", ok=True)


def test_shell_suggestion_refused_under_yes_always() -> None:
    events = replay("shell_refused")
    assert streamed(events) == "I will run it:\n\n```bash\necho hi\n```"
    assert Status("suggested command: echo hi") in events
    assert not of(events, ToolUse)
    assert events[-1] == Result("I will run it:\n\n```bash\necho hi\n```", ok=True)


def test_api_down_capture_is_errors_reported_once_and_a_failed_result() -> None:
    events = replay("api_down")
    errors = [e.text for e in of(events, Error)]  # type: ignore[attr-defined]
    assert errors == [
        "litellm.InternalServerError: InternalServerError: OpenAIException - Connection error.",
        "The API provider's servers are down or overloaded.",
    ]
    assert [e.text for e in of(events, Status)][1:3] == ["Retrying in 0.2 seconds...", "Retrying in 0.5 seconds..."]  # type: ignore[attr-defined]
    assert not of(events, Text)
    # aider exits 0 after giving up: that must not read as a successful turn.
    assert events[-1] == Result("", ok=False)


# ---------------------------------------------------------------- parser details


@pytest.mark.parametrize(
    "line",
    [
        "litellm.AuthenticationError: AuthenticationError: OpenAIException - invalid key",
        "The API provider is not able to authenticate you. Check your API key.",
        "Empty response received from LLM. Check your provider account?",
        "notes.md: file not found error",
        "Unable to commit: bad object",
        "Only 3 reflections allowed, stopping.",
    ],
)
def test_error_lines_anywhere(line: str) -> None:
    assert looks_like_error(line)
    parser = AiderParser(session="s.md", sent_session=True)
    assert parser.feed(line) == [Error(line)]
    feed_all(parser, "Aider v0.86.2\n\nsome answer")
    assert parser.feed(line) == []  # the same error again is not repeated
    assert parser.feed("litellm.APIError: other") == [Error("litellm.APIError: other")]


@pytest.mark.parametrize("line", ["ValueError: something broke", "Error loading model metadata models: nope"])
def test_python_style_errors_count_only_before_the_answer(line: str) -> None:
    parser = AiderParser(session="s.md", sent_session=True)
    assert parser.feed(line) == [Error(line)]
    feed_all(parser, "Aider v0.86.2\n\nsome answer")
    assert parser.feed(line) == [Text("\n" + line, delta=True)]


@pytest.mark.parametrize(
    "line",
    ["The error was in line 3.", "Errors happen; here is the fix.", "Error handling matters.", "Unable to reproduce."],
)
def test_answer_lines_mentioning_errors_are_text(line: str) -> None:
    assert not looks_like_error(line)
    parser = AiderParser(session="s.md", sent_session=True)
    assert feed_all(parser, f"Aider v0.86.2\n\n{line}") == [Text(line, delta=True)]


def test_a_quoted_error_inside_a_code_block_is_text() -> None:
    parser = AiderParser(session="s.md", sent_session=True)
    events = feed_all(parser, "Aider v0.86.2\n\nYou saw:\n```\nlitellm.APIError: boom\n```")
    assert not of(events, Error)
    assert streamed(events) == "You saw:\n```\nlitellm.APIError: boom\n```"


def test_session_id_comes_once_on_the_first_line() -> None:
    parser = AiderParser(session="s.md")
    assert parser.feed("") == [SessionId("s.md")]
    assert parser.feed("Aider v0.86.2") == []
    assert parser.finish(0, interrupted=False) == [Result("", ok=True)]


def test_session_id_from_finish_when_nothing_was_printed() -> None:
    parser = new_parser(request(session_id=".aider.chat.history.x.md"))
    events = parser.finish(None, interrupted=True)
    assert events == [SessionId(".aider.chat.history.x.md")]


@pytest.mark.parametrize(
    ("returncode", "message"),
    [
        (1, "aider exited with status 1"),
        (2, "aider rejected its arguments (exit status 2); see the agent's args"),
        (-9, "aider was killed by signal 9"),
        (None, "aider ended without an exit status"),
    ],
)
def test_non_zero_exit_is_an_error(returncode: int | None, message: str) -> None:
    events = AiderParser(session="s.md", sent_session=True).finish(returncode, interrupted=False)
    assert events == [Error(message)]


@pytest.mark.parametrize("returncode", [0, 130, -2, None])
def test_interrupted_is_never_a_success(returncode: int | None) -> None:
    parser = AiderParser(session="s.md")
    feed_all(parser, "\nAider v0.86.2\nModel: m\n\nhalf an answ")
    events = parser.finish(returncode, interrupted=True)
    assert not [e for e in events if isinstance(e, Result) and e.ok]


def test_answer_after_an_error_is_a_success() -> None:
    # A retry that worked: the error is shown, the turn still succeeded.
    parser = AiderParser(session="s.md")
    events = feed_all(
        parser,
        "\nAider v0.86.2\n\nlitellm.APIConnectionError: boom\nRetrying in 0.2 seconds...\nFine now.\nTokens: 1 sent, 1 received.",
    )
    assert Error("litellm.APIConnectionError: boom") in events
    assert parser.finish(0, interrupted=False) == [Result("Fine now.", ok=True)]


def test_blank_lines_inside_the_answer_are_kept_and_trailing_ones_dropped() -> None:
    parser = AiderParser(session="s.md")
    events = feed_all(parser, "\nAider v0.86.2\n\none\n\n\ntwo\n\n\nTokens: 3 sent, 2 received. Cost: $0.01 message, $0.02 session.")
    assert streamed(events) == "one\n\n\ntwo"
    assert Status("Tokens: 3 sent, 2 received. Cost: $0.01 message, $0.02 session.") == events[-1]


def test_shell_command_run_by_aider_is_a_tool_use_with_its_output() -> None:
    parser = AiderParser(session="s.md")
    events = feed_all(
        parser,
        "\nAider v0.86.2\n\n```bash\nls\n```\nTokens: 1 sent, 1 received.\n\nls\n\nRunning ls\na.txt\nb.txt\n"
        "Added 2 lines of output to the chat.\n\nThere are two files.\nTokens: 2 sent, 1 received.\n"
        "Applied edit to a.txt\nCommit 1a2b3c4 fix: things",
    )
    assert ToolUse("shell", "ls") in events
    assert ToolResult("a.txt b.txt") in events
    assert ToolUse("edit", "a.txt") in events
    assert Status("Commit 1a2b3c4 fix: things") in events
    assert parser.finish(0, interrupted=False)[-1] == Result("```bash\nls\n```\n\nThere are two files.", ok=True)


def test_tool_output_cut_off_by_the_end_is_still_reported() -> None:
    parser = AiderParser(session="s.md", sent_session=True)
    feed_all(parser, "\nAider v0.86.2\n\nRunning sleep 30\npartial")
    assert parser.finish(None, interrupted=True) == [ToolResult("partial")]


# ---------------------------------------------------------------- with the fake aider


def run_fake(req: TurnRequest, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the adapter's launch with ``fake_aider.py`` in place of aider."""
    launch = build_launch(req)
    _write_files(Path(req.home), launch.files)  # as the supervisor does before the spawn
    argv = (str(FAKE_AIDER), *launch.argv[1:])
    full_env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(tmp / "home"), "TMPDIR": str(tmp), **launch.env, **env}
    return subprocess.run(
        argv, cwd=launch.cwd, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60, start_new_session=True,
    )


def parse(req: TurnRequest, proc: subprocess.CompletedProcess[str]) -> list[Event]:
    """The adapter's events for a finished fake turn."""
    parser = new_parser(req)
    return feed_all(parser, proc.stdout) + parser.finish(proc.returncode, interrupted=False)


def test_second_turn_sees_the_first_conversation(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    first = request(prompt="remember 7 [[say:noted]]", turn_id="turn-1", cwd=str(work), home=str(tmp_path / "home"))
    proc = run_fake(first, tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = parse(first, proc)
    session = of(events, SessionId)[0].id  # type: ignore[attr-defined]
    assert (work / session).is_file()
    assert events[-1] == Result("noted\n\nearlier user messages: 0", ok=True)

    second = request(prompt="what was it? [[say:it was 7]]", turn_id="turn-2", cwd=str(work),
                     home=str(tmp_path / "home"), session_id=session)
    proc = run_fake(second, tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = parse(second, proc)
    assert Status("Restored previous conversation history.") in events
    assert events[-1] == Result("it was 7\n\nearlier user messages: 1", ok=True)
    assert of(events, SessionId) == [SessionId(session)]
    history = (work / session).read_text()
    assert "#### remember 7 [[say:noted]]" in history and "#### what was it? [[say:it was 7]]" in history

    # A fresh turn in the same folder does not inherit that conversation.
    third = request(prompt="new topic", turn_id="turn-3", cwd=str(work), home=str(tmp_path / "home"))
    events = parse(third, run_fake(third, tmp_path))
    assert events[-1] == Result("ok: new topic\n\nearlier user messages: 0", ok=True)
    assert of(events, SessionId)[0] != SessionId(session)


def test_fake_rejects_unknown_flags_like_argparse(tmp_path: Path) -> None:
    req = request(cwd=str(tmp_path), args=("--no-such-flag",))
    proc = run_fake(req, tmp_path)
    assert proc.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in proc.stderr
    assert parse(req, proc)[-1] == Error("aider rejected its arguments (exit status 2); see the agent's args")


def test_fake_runs_a_shell_command_in_a_new_session(tmp_path: Path) -> None:
    req = request(prompt="[[shell:echo one; echo two]] [[say:done]]", cwd=str(tmp_path))
    proc = run_fake(req, tmp_path)
    events = parse(req, proc)
    assert ToolUse("shell", "echo one; echo two") in events
    assert ToolResult("one two") in events
    assert events[-1] == Result("done\n\nearlier user messages: 0", ok=True)


def test_fake_api_failure_exits_zero_and_reads_as_failed(tmp_path: Path) -> None:
    req = request(prompt="[[fail]]", cwd=str(tmp_path))
    events = parse(req, run_fake(req, tmp_path))
    assert of(events, Error)
    assert events[-1] == Result("", ok=False)


def test_fake_exits_130_on_sigint_and_leaves_its_command_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "tool.pid"
    req = request(prompt="[[shell:sleep 60]]", cwd=str(tmp_path), home=str(tmp_path / "home"))
    launch = build_launch(req)
    _write_files(Path(req.home), launch.files)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "FAKE_AIDER_PID_FILE": str(pid_file), **launch.env}
    proc = subprocess.Popen(
        (sys.executable, str(FAKE_AIDER), *launch.argv[1:]), cwd=launch.cwd, env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    tool_pid = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until the command has started
            if line.startswith("Running "):
                break
        tool_pid = read_pid(pid_file)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=10) == 130
        # The command was in its own session: the group's SIGINT did not reach it.
        os.kill(tool_pid, 0)
        assert os.getpgid(tool_pid) != proc.pid
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if tool_pid is not None:
            try:
                os.killpg(tool_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
