"""The real agent CLIs, run by a real `corral run` daemon against fake model servers.

For each CLI: a text turn streams and stores its session id; a stop mid-tool kills
everything the CLI started (its tools run in their own sessions) and the notice is the last
entry; the next message resumes the session (the model sees the earlier conversation); a
stop while the model stream is silent lands within the stop budget; a normal turn's
background process is swept when the turn ends.

The CLIs are installed by scripts/install-clis.sh (`make test` runs it). A CLI that is not
installed makes its tests fail, never skip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import CORRAL, DaemonProcess, turn_processes

from scripts._config import toml_value
from supervisor.core.netpolicy import grant_for
from supervisor.testing import pid_file_alive, read_pid
from scripts.fakemodel import anthropic, gemini_api, openai_chat, openai_responses
from scripts.fakemodel._http import FakeModelServer
from scripts.fakemodel.clis import cli_path
from scripts.fakemodel.rig import PID_OF_LAST, write_tool_script

pytestmark = pytest.mark.realcli

STOP_GRACE = 3.0
#: A stop must return within the grace period plus this (the CLI's exit, sweep, drain).
STOP_MARGIN = 3.0


@dataclass(frozen=True)
class CLI:
    """How to point one real CLI at its fake model server."""

    name: str
    server: Callable[[], FakeModelServer]
    agent: Callable[[str, Path], dict[str, Any]]
    shell: bool = True
    """Does the CLI run a shell tool when unattended? (aider's ``--yes-always`` refuses its
    shell commands: its stop is tested mid-stream instead.)"""


CLIS = [
    CLI("claude", anthropic.FakeAnthropicServer, lambda url, cli: {"adapter": "claude", "command": [str(cli)], "env": anthropic.agent_env(url)}),
    CLI(
        "codex",
        openai_responses.OpenAIResponsesServer,
        lambda url, cli: {"adapter": "codex", "command": [str(cli)], "env": openai_responses.agent_env(url), **openai_responses.agent_options(url)},
    ),
    CLI("gemini", gemini_api.FakeGeminiServer, lambda url, cli: {"adapter": "gemini", "command": [str(cli)], "env": gemini_api.agent_env(url)}),
    CLI("qwen", openai_chat.OpenAIChatServer, lambda url, cli: {"adapter": "qwen", "command": [str(cli)], "env": openai_chat.agent_env(url)}),
    CLI(
        "aider",
        openai_chat.AiderChatServer,
        lambda url, cli: {"adapter": "aider", "command": [str(cli)], "model": f"openai/{openai_chat.MODEL}", "env": openai_chat.aider_env(url)},
        shell=False,
    ),
    CLI(
        "pi",
        openai_chat.PiChatServer,
        lambda url, cli: {"adapter": "pi", "command": [str(cli)], "model": openai_chat.MODEL, "env": openai_chat.PI_ENV,
                          **openai_chat.pi_options(url)},
    ),
]


def config_text(agent: dict[str, Any]) -> str:
    """A corral.toml with one agent, ``cli``."""
    lines = [
        '[server]\nsocket = "corral.sock"',
        '[store]\npath = "corral.db"',
        f'[defaults]\nagent = "cli"\nstop_grace = {STOP_GRACE}\nstall_timeout = 120\nturn_timeout = 300',
        "[agents.cli]",
    ]
    lines += [f"{key} = {toml_value(value)}" for key, value in agent.items()]
    return "\n".join(lines) + "\n"


class Rig:
    """A fake model server, a daemon running one real CLI against it, and helpers."""

    def __init__(self, folder: Path, cli: CLI) -> None:
        self.folder = folder
        self.cli = cli
        self.server = cli.server().start()
        try:
            # The tools the fake model asks for write pid files in the folder: granted, as a user
            # would; the network is the default ("internet"), with the fake model's loopback
            # address granted (that network refuses loopback otherwise).
            agent = {**cli.agent(self.server.url, cli_path(cli.name)), "sandbox_write": [str(folder)],
                     "network_allow": [grant_for(self.server.url)]}
            self.daemon = DaemonProcess(folder, config_text(agent))
        except BaseException:
            self.server.stop()
            raise

    def close(self) -> None:
        try:
            assert self.daemon.stop() == 0, "".join(self.daemon.log[-30:])
        finally:
            self.server.stop()

    def json(self, *args: str) -> Any:
        out = self.daemon.cli(*args, "--json")
        assert out.returncode == 0, f"corral {' '.join(args)} failed: {out.stderr}\n" + "".join(self.daemon.log[-40:])
        return json.loads(out.stdout)

    def entries(self, channel: str, after: int = 0) -> list[dict[str, Any]]:
        out = self.daemon.cli("tail", channel, "--after", str(after), "--json")
        return [json.loads(line) for line in out.stdout.splitlines()]

    def send_and_wait(self, channel: str, text: str) -> list[dict[str, Any]]:
        seq = self.json("send", channel, text)["seq"]
        wait = self.daemon.cli("wait", channel, "--timeout", "180")
        assert wait.returncode == 0, "the turn did not end:\n" + "".join(self.daemon.log[-40:])
        return self.entries(channel, after=seq - 1)

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 90) -> None:
        """Wait for something outside corral (a file, a request) to happen."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n" + "".join(self.daemon.log[-40:]))
            time.sleep(0.05)


#: The tests whose scenario is a shell tool the CLI runs.
NEEDS_SHELL = {"test_stop_mid_tool_kills_everything_and_the_notice_is_last", "test_background_process_of_a_normal_turn_is_swept"}


@pytest.fixture(params=CLIS, ids=[c.name for c in CLIS])
def rig(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[Rig]:
    if not request.param.shell and request.function.__name__ in NEEDS_SHELL:
        pytest.skip(f"{request.param.name} runs no shell tool unattended: no tool to stop or leave behind")
    rig = Rig(short_tmp, request.param)
    try:
        yield rig
    finally:
        rig.close()


def _agent_messages(entries: list[dict[str, Any]]) -> list[str]:
    return [e["text"] for e in entries if e["author"] == "agent:cli" and e["kind"] == "message"]


def _tool_script(folder: Path) -> tuple[Path, Path]:
    """A tool that starts a long process and a setsid grandchild, and its pid file."""
    return write_tool_script(folder), folder / "tool.started"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_text_turn_streams_and_stores_the_session_id(rig: Rig) -> None:
    entries = rig.send_and_wait("chat", "[[say:Hello from the fake model.]] greet me")
    assert any("Hello from the fake model." in text for text in _agent_messages(entries)), entries
    assert not [e for e in entries if e["kind"] == "error"], entries
    status = rig.json("status")
    assert status["channels"]["chat"]["sessions"].get("cli"), status["channels"]["chat"]


def test_stop_mid_tool_kills_everything_and_the_notice_is_last(rig: Rig) -> None:
    script, started = _tool_script(rig.folder)
    seq = rig.json("send", "work", f"[[shell:sh {script} {started}]] [[say:tool done]] run the tool")["seq"]
    rig.wait_for(lambda: started.exists() and started.read_text().strip() != "" and Path(f"{started}.setsid").exists(), "the tool to start")
    tool_pid = read_pid(started)
    setsid_pid = read_pid(Path(f"{started}.setsid"))
    assert _alive(tool_pid) and _alive(setsid_pid)
    result = rig.json("stop", "work")
    assert result["ok"] and result["stopped_turns"], result
    assert not _alive(tool_pid) and not _alive(setsid_pid), result
    assert not turn_processes(result["stopped_turns"])
    entries = rig.entries("work", after=seq - 1)
    assert entries[-1]["kind"] == "notice" and entries[-1]["seq"] == result["notice_seq"], entries
    assert rig.daemon.cli("wait", "work", "--timeout", "5").returncode == 0
    assert rig.entries("work", after=result["notice_seq"]) == [], "nothing may follow the notice"


def test_next_message_resumes_the_session_after_a_stop(rig: Rig) -> None:
    first = rig.send_and_wait("resume", "[[say:first answer]] remember the word pelican")
    assert any("first answer" in t for t in _agent_messages(first)), first
    session = rig.json("status")["channels"]["resume"]["sessions"]["cli"]
    if rig.cli.shell:
        script, started = _tool_script(rig.folder)
        rig.json("send", "resume", f"[[shell:sh {script} {started}]] run the tool")
        rig.wait_for(lambda: started.exists() and started.read_text().strip() != "", "the tool to start")
    else:
        rig.json("send", "resume", "[[silent]] think about it")
        rig.wait_for(lambda: any(b"think about it" in r.raw for r in rig.server.requests), "the model request")
    assert rig.json("stop", "resume")["ok"]
    before = len(rig.server.requests)
    second = rig.send_and_wait("resume", "[[say:second answer]] what was the word?")
    assert any("second answer" in t for t in _agent_messages(second)), second
    later = [r.raw.decode("utf-8", "replace") for r in rig.server.requests[before:]]
    assert any("pelican" in body for body in later), "the resumed turn did not carry the earlier conversation"
    assert rig.json("status")["channels"]["resume"]["sessions"]["cli"] == session


def test_stop_while_the_model_stream_is_silent_lands_within_the_budget(rig: Rig) -> None:
    seq = rig.json("send", "quiet", "[[silent]] think very hard")["seq"]
    rig.wait_for(lambda: any(b"think very hard" in r.raw for r in rig.server.requests), "the model request")
    started = time.monotonic()
    result = rig.json("stop", "quiet")
    elapsed = time.monotonic() - started
    assert result["ok"] and result["stopped_turns"], result
    assert elapsed < STOP_GRACE + STOP_MARGIN, f"stop took {elapsed:.2f} s"
    entries = rig.entries("quiet", after=seq - 1)
    assert entries[-1]["kind"] == "notice"
    assert not turn_processes(result["stopped_turns"])


def test_background_process_of_a_normal_turn_is_swept(rig: Rig) -> None:
    pidfile = rig.folder / "bg.pid"
    script = rig.folder / "bg.sh"
    script.write_text(f"#!/bin/sh\nsetsid nohup sleep 3002 </dev/null >/dev/null 2>&1 &\necho {PID_OF_LAST} > {pidfile}\necho started\n")
    entries = rig.send_and_wait("bg", f"[[shell:sh {script}]] [[say:background started]] start it")
    assert any("background started" in t for t in _agent_messages(entries)), entries
    assert not pid_file_alive(pidfile), "the background process outlived its turn"
    assert not turn_processes()


#: The CLIs that stream their answer as it is written (partial messages, or delta events);
#: codex exec prints each agent message whole (no delta events in its --json stream); aider
#: prints its answer as it streams (plain text lines); pi prints text deltas.
STREAMING = {"claude", "gemini", "qwen", "aider", "pi"}
#: Of those, the CLIs that print whole lines as they come (aider): a one-line answer's draft, if
#: the line shows before the turn ends, is the whole line; whether it does is a race.
LINE_STREAMING = {"aider"}


def test_drafts_show_the_answer_while_the_model_streams_it(rig: Rig, request: pytest.FixtureRequest) -> None:
    import os
    import subprocess
    import threading

    name = request.node.callspec.params["rig"].name
    streams = name in STREAMING
    answer = "One two three four five six seven eight nine ten eleven twelve."
    env = {**os.environ, "CORRAL_SOCKET": str(rig.daemon.socket)}
    # The channel must exist to be followed: a first turn makes it.
    rig.send_and_wait("chat", "[[say:ready]] hi")
    after = rig.entries("chat")[-1]["seq"]
    tail = subprocess.Popen([*CORRAL, "tail", "chat", "-f", "--after", str(after), "--json"],
                            cwd=rig.folder, env=env, stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(120, tail.kill)  # (a stream that never brings the answer fails the test)
    watchdog.start()
    try:
        rig.json("send", "chat", f"[[say:{answer}]] [[slow:2]] stream it")
        drafts: list[dict[str, Any]] = []
        assert tail.stdout is not None
        for line in tail.stdout:
            item = json.loads(line)
            if item["kind"] == "draft":
                drafts.append(item)
            elif item["kind"] == "message" and item["author"] == "agent:cli" and answer in item["text"]:
                saved = item
                break
        else:
            raise AssertionError(f"the answer never came: {drafts}\n" + "".join(rig.daemon.log[-40:]))
    finally:
        watchdog.cancel()
        tail.kill()
        tail.wait()
    if not streams:  # each message whole: it is saved as it comes, no draft before it
        assert drafts == [] and saved["meta"].get("draft") is None
        return
    assert drafts or name in LINE_STREAMING, "no draft before the saved answer"
    partial = [d for d in drafts if d["text"] and d["text"] != saved["text"]]
    assert partial or name in LINE_STREAMING, (drafts, saved)
    assert all(saved["text"].startswith(d["text"]) for d in drafts if d["text"]), (drafts, saved)
    assert not drafts or saved["meta"].get("draft") == drafts[-1]["draft"]


# ---------------------------------------------------------------- steering (claude)
#
# In process (``open_supervisor``), since the turn's ``steer`` is called directly: a message
# handed to the running turn is written on the CLI's open stdin (stream-json input).


def _unread(turn: Any) -> int:
    """Bytes written to the turn's stdin pipe that the CLI has not read yet (FIONREAD)."""
    import fcntl
    import struct
    import termios

    stdin = turn.tree.process.stdin
    got = fcntl.ioctl(stdin.fileno(), termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", got)[0])


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 90) -> None:
    """Wait for something outside corral (a file the tool writes, the CLI reading its input)."""
    import trio

    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


@pytest.fixture
def claude_server() -> Iterator[anthropic.FakeAnthropicServer]:
    server = anthropic.FakeAnthropicServer().start()
    try:
        yield server
    finally:
        server.stop()


def _claude_config(folder: Path, server: FakeModelServer) -> Any:
    from conftest import make_config

    agent = {"adapter": "claude", "command": [str(cli_path("claude"))], "env": anthropic.agent_env(server.url),
             "network_allow": [grant_for(server.url)]}
    return make_config(folder, {"cli": agent}, stop_grace=STOP_GRACE, stall_timeout=120, turn_timeout=300)


async def test_claude_takes_a_steered_message_mid_tool_into_its_next_model_request(
    short_tmp: Path, claude_server: anthropic.FakeAnthropicServer
) -> None:
    import trio

    from supervisor.host.supervisor import open_supervisor

    started, go = short_tmp / "tool.started", short_tmp / "tool.go"
    script = short_tmp / "wait.sh"
    script.write_text('#!/bin/sh\necho $$ > "$1"\nwhile [ ! -e "$2" ]; do sleep 0.05; done\necho released\n')
    async with open_supervisor(_claude_config(short_tmp, claude_server)) as sup:
        await sup.send("steer", f"[[shell:sh {script} {started} {go}]] [[say:tool done]] run the tool")
        await _until(started.exists, "the tool to start")
        turn = sup._lanes.turns["steer", "cli"]
        with trio.fail_after(30):
            assert await turn.steer("Also mention the giraffe, please.") is None
        await _until(lambda: _unread(turn) == 0, "the CLI to read its input")
        go.touch()  # the tool ends: the CLI asks the model again
        assert await sup.wait_idle("steer", timeout=180)
        entries = [e for e in await sup.entries("steer") if e.turn == turn.turn_id]
    carrying = [r for r in claude_server.requests if b"giraffe" in r.raw]
    assert carrying, "no model request carried the steered message"
    # The first one is the request that answers the tool: the message came mid-turn.
    messages = carrying[0].body["messages"]
    assert any(b.get("type") == "tool_result" for m in messages if isinstance(m.get("content"), list)
               for b in m["content"]), messages[-2:]
    assert "giraffe" in json.dumps(messages[-2:]), messages[-2:]
    assert turn.outcome.ok, entries
    assert any(e.kind == "message" and "tool done" in e.text for e in entries), entries
    assert not [e for e in entries if e.kind == "error"], entries


async def test_claude_stopped_right_after_a_steer_leaves_no_process(
    short_tmp: Path, claude_server: anthropic.FakeAnthropicServer
) -> None:
    import trio

    from supervisor.host.supervisor import open_supervisor

    script, started = _tool_script(short_tmp)
    async with open_supervisor(_claude_config(short_tmp, claude_server)) as sup:
        await sup.send("work", f"[[shell:sh {script} {started}]] [[say:tool done]] run the tool")
        await _until(lambda: started.exists() and started.read_text().strip() != "", "the tool to start")
        tool_pid = read_pid(started)
        turn = sup._lanes.turns["work", "cli"]
        with trio.fail_after(30):
            assert await turn.steer("Then tell me about otters.") is None
            result = await sup.stop("work")
        assert result.ok and list(result.stopped_turns) == [turn.turn_id], result
        assert not _alive(tool_pid)
        assert not turn_processes(list(result.stopped_turns))
        entries = await sup.entries("work")
        assert entries[-1].kind == "notice", entries
        assert await turn.steer("after the stop") is not None


async def test_claude_answers_a_message_steered_while_it_writes_after_its_answer_in_the_same_turn(
    short_tmp: Path, claude_server: anthropic.FakeAnthropicServer
) -> None:
    """With no tool boundary left the CLI answers the message after its first result, in the
    same process (stdin is closed at that result): stdout is read to its end, so the second
    answer is this turn's."""
    import trio

    from supervisor.host.supervisor import open_supervisor

    async with open_supervisor(_claude_config(short_tmp, claude_server)) as sup:
        await sup.send("late", "[[say:One two three four five six seven eight.]] [[slow:3]] write slowly")
        await _until(lambda: claude_server.text_pieces_sent >= 1, "the model to start writing")
        turn = sup._lanes.turns["late", "cli"]
        with trio.fail_after(30):
            assert await turn.steer("[[say:Second answer, about otters.]] and otters?") is None
        assert await sup.wait_idle("late", timeout=180)
        entries = [e for e in await sup.entries("late") if e.turn == turn.turn_id]
        assert await turn.steer("after the turn") is not None
    messages = [e.text for e in entries if e.kind == "message"]
    assert sum("One two three" in m for m in messages) == 1, entries
    assert sum("Second answer, about otters." in m for m in messages) == 1, entries
    assert turn.outcome.ok and not [e for e in entries if e.kind == "error"], entries
    assert len(sup._lanes.turns) == 0
