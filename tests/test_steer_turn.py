"""Steering a per-turn CLI's running turn: ``Turn.steer`` (supervisor/turns/process.py), the
open stdin it writes through (supervisor/procs/stdin.py) and the adapters that encode it.

The pure encodings first; then :class:`AgentInput` on a bare pipe (a full pipe, a stop while
it waits for room, the agent gone, a close while a message is written); then ``Turn.steer``
with the bundled demo agent through a real :class:`Supervisor`. Races are parked at exact
points (a ``preparing`` hook, the ledger's stale mark, a writer blocked on a full pipe), never
by sleeping; real processes get generous ``fail_after`` limits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import make_config, turn_processes
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import demo, demo_agent, generic
from adapters._base import Event, Result, TurnRequest
from supervisor.host.supervisor import Supervisor, open_supervisor
from supervisor.procs.stdin import CLOSED, GONE, AgentInput
from supervisor.store.store import Entry
from supervisor.testing import Hooks
from supervisor.turns.process import NOT_STARTED, Turn

#: Generous limit for anything that involves a real process.
SLOW = 30.0


# ---------------------------------------------------------------- the adapters' encodings


def _request(**kw: Any) -> TurnRequest:
    base: dict[str, Any] = {"prompt": "long 5", "channel": "c", "turn_id": "t1", "agent": "demo",
                            "command": demo.DEFAULT_COMMAND, "cwd": "/w", "home": "/h"}
    return TurnRequest(**{**base, **kw})


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_the_demo_agent_reads_back_every_message_the_demo_adapter_writes(text: str) -> None:
    """One line per message whatever the text (newlines, quotes, a lone surrogate)."""
    assert demo.ADAPTER.steer is not None
    line = demo.ADAPTER.steer(text)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert demo_agent.read_steer_line(line) == text


def test_the_demo_agent_ignores_lines_that_are_not_messages() -> None:
    for line in (b"hello\n", b"[1, 2]\n", b'{"type": "control", "text": "x"}\n', b'{"type": "user", "text": 3}\n'):
        assert demo_agent.read_steer_line(line) is None


def test_the_demo_launch_keeps_its_prompt_in_argv_and_stdin_open() -> None:
    """The spawn stays the point of no return (nothing to write first); stdin is for steering."""
    launch = demo.build_launch(_request(prompt="-x long 5"))
    assert launch.argv[-2:] == ("--", "-x long 5")
    assert launch.stdin == b"" and launch.keep_stdin


def test_an_adapter_that_cannot_steer_says_so_as_data() -> None:
    assert generic.ADAPTER.steer is None
    assert not generic.build_launch(_request(options={"prompt": "stdin"})).keep_stdin


def test_the_demo_agent_takes_a_message_while_it_streams_and_answers_it(tmp_path: Path) -> None:
    """The agent alone, on a pipe (no corral): a message written while ``stream N`` streams is
    acknowledged at once, ``enough`` ends the stream, and the reply names the message."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path), "DEMO_AGENT_DELAY": "0.01"}
    agent = subprocess.Popen([sys.executable, demo_agent.__file__, "--", "stream 120"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env)
    assert agent.stdin is not None and agent.stdout is not None
    try:
        kinds: list[tuple[str, str]] = []
        for raw in agent.stdout:
            line = json.loads(raw)
            kinds.append((line["type"], line.get("text", "")))
            if line["type"] == "text" and line["text"].startswith("Streaming line 0"):
                agent.stdin.write(demo_agent.steer_line("that is enough, thanks"))
                agent.stdin.flush()
            if line["type"] == "result":
                agent.stdin.close()  # as corral does on reading the result: the agent exits
        assert agent.wait(timeout=SLOW) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    steered = kinds.index(("status", "steered: that is enough, thanks"))
    assert any(text.startswith("Streaming line") for _, text in kinds[:steered]), "taken mid-stream"
    assert ("text", "You also said: that is enough, thanks") in kinds[steered:]
    assert kinds[-1] == ("result", "")
    assert sum(1 for kind, text in kinds if text.startswith("Streaming line")) < 50, "the stream ended early"


# ---------------------------------------------------------------- AgentInput on a bare pipe


@asynccontextmanager
async def pipe() -> AsyncIterator[tuple[AgentInput, int]]:
    """An AgentInput on a pipe's write end, and the read end (non-blocking)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    agent_input = AgentInput(trio.lowlevel.FdStream(write_fd))
    try:
        yield agent_input, read_fd
    finally:
        agent_input.abort()
        os.close(read_fd)


def drain(fd: int) -> bytes:
    """Everything the pipe holds now (b"" at EOF or when empty)."""
    out = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


class Ledger:
    """A refusal the test flips, counting how often it is asked."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.asked = 0

    def __call__(self) -> str | None:
        self.asked += 1
        return self.reason


async def test_a_refused_message_writes_nothing() -> None:
    async with pipe() as (agent_input, read_fd):
        ledger = Ledger()
        ledger.reason = "the turn was stopped"
        assert await agent_input.write(b"hello\n", ledger) == "the turn was stopped"
        assert drain(read_fd) == b"" and agent_input.written == 0 and not agent_input.closed
        ledger.reason = None
        assert await agent_input.write(b"hello\n", ledger) is None
        assert drain(read_fd) == b"hello\n"


async def test_a_full_pipe_asks_again_before_each_further_write_and_a_stop_cuts_the_message_there() -> None:
    async with pipe() as (agent_input, read_fd):
        ledger = Ledger()
        big = b"x" * (4 << 20) + b"\n"  # bigger than any pipe buffer
        result: list[str | None] = []

        async def writer() -> None:
            result.append(await agent_input.write(big, ledger))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()  # the writer waits for room
            asked = ledger.asked  # (once per write tried: the one that filled the pipe, the one it refused)
            first = drain(read_fd)
            assert 0 < len(first) < len(big)
            ledger.reason = "the turn was stopped"  # a stop lands while it waits
        assert result == ["the turn was stopped"] and ledger.asked == asked + 1
        assert agent_input.written == len(first) and agent_input.closed  # cut: nothing may follow
        assert drain(read_fd) == b""  # EOF: the half message was the last
        assert await agent_input.write(b"more\n", ledger) == CLOSED


async def test_a_close_while_a_message_is_written_waits_until_it_is_whole() -> None:
    async with pipe() as (agent_input, read_fd):
        big = b"y" * (4 << 20) + b"\n"
        result: list[str | None] = []

        async def writer() -> None:
            result.append(await agent_input.write(big, Ledger()))

        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                await trio.testing.wait_all_tasks_blocked()
                agent_input.close()  # the CLI's result came: close, but not mid-message
                got = b""
                while len(got) < len(big):
                    got += drain(read_fd)
                    await trio.testing.wait_all_tasks_blocked()
        assert result == [None] and got == big and agent_input.closed
        assert await agent_input.write(b"later\n", Ledger()) == CLOSED


async def test_an_abort_wakes_a_writer_waiting_for_room() -> None:
    async with pipe() as (agent_input, _read_fd):
        result: list[str | None] = []

        async def writer() -> None:
            result.append(await agent_input.write(b"z" * (4 << 20), Ledger()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            agent_input.abort()
        assert result == [CLOSED]


async def test_an_agent_that_is_gone_is_said_so_and_nothing_more_is_tried() -> None:
    read_fd, write_fd = os.pipe()
    agent_input = AgentInput(trio.lowlevel.FdStream(write_fd))
    os.close(read_fd)
    assert await agent_input.write(b"hello\n", Ledger()) == GONE
    assert agent_input.closed
    assert await agent_input.write(b"hello\n", Ledger()) == CLOSED


async def test_messages_never_interleave() -> None:
    async with pipe() as (agent_input, read_fd):
        a, b = b"a" * (1 << 20) + b"\n", b"b" * (1 << 20) + b"\n"
        got = b""
        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agent_input.write, a, Ledger())
                nursery.start_soon(agent_input.write, b, Ledger())
                while len(got) < len(a) + len(b):
                    await trio.testing.wait_all_tasks_blocked()
                    got += drain(read_fd)
        assert sorted(got.splitlines(keepends=True)) == [a, b]


# ---------------------------------------------------------------- Turn.steer with the demo agent


async def wait_entry(sup: Supervisor, channel: str, match: Callable[[Entry], bool]) -> Entry:
    """The first committed entry of ``channel`` that matches (past or future)."""
    with trio.fail_after(SLOW):
        async with aclosing(sup.follow(channel)) as entries:
            async for entry in entries:
                if match(entry):
                    return entry
    raise AssertionError("the follow ended")


def tool_running(entry: Entry) -> bool:
    return entry.kind == "status" and entry.text.startswith("tool running")


async def running_turn(sup: Supervisor, channel: str, prompt: str) -> Turn:
    """Send ``prompt`` to the demo agent; its turn once the long tool runs."""
    await sup.send(channel, prompt)
    await wait_entry(sup, channel, tool_running)
    turn = sup._lanes.turns[channel, "demo"]
    assert isinstance(turn, Turn)
    return turn


async def idle(sup: Supervisor, channel: str) -> None:
    assert await sup.wait_idle(channel, timeout=SLOW), f"channel {channel!r} did not become idle"


async def test_a_steered_message_reaches_the_demo_agent_mid_tool_and_is_answered_in_the_same_turn(
    short_tmp: Path,
) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        turn = await running_turn(sup, "c", "long 600")
        with trio.fail_after(SLOW):
            assert await turn.steer("that is enough; also mention the @giraffe") is None
        await idle(sup, "c")
        # (The plan the long task reports is nudged on afterwards, in a turn of its own.)
        entries = [e for e in await sup.entries("c") if e.turn == turn.turn_id]
        texts = [(e.kind, e.text) for e in entries]
        steered = texts.index(("status", "steered: that is enough; also mention the giraffe"))
        running = next(i for i, e in enumerate(entries) if tool_running(e))
        cut = next(i for i, (k, t) in enumerate(texts) if t.startswith("The long task was cut short"))
        assert running < steered < cut, texts  # taken while the tool ran, and it ended the tool
        reply = [e for e in entries if e.kind == "message"][-1]
        assert "You also said: that is enough; also mention the giraffe" in reply.text
        assert turn.outcome.ok and not turn.outcome.stopped


async def test_a_steer_to_a_stopped_turn_writes_nothing(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        turn = await running_turn(sup, "c", "long 600")
        assert turn._input is not None
        before = turn._input.written
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.stop, "c")
            with trio.fail_after(SLOW):
                while not sup._ledger.is_stale("c", turn.turn_id):  # parked at the stop's first act
                    await trio.sleep(0)
            # The stop has only moved the generation: the agent lives, its input is open.
            assert not turn._input.closed and turn.tree is not None and turn.tree.process.returncode is None
            assert await turn.steer("this must not arrive") == "the turn was stopped"
            assert turn._input.written == before
        assert not [e for e in await sup.entries("c") if "must not arrive" in e.text]


async def test_a_steer_after_the_turns_input_closed_returns_a_reason(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        turn = await running_turn(sup, "c", "long 0.2")
        await idle(sup, "c")
        assert turn._input is not None and turn._input.closed
        written = turn._input.written
        assert await turn.steer("too late") == CLOSED
        assert turn._input.written == written


async def test_the_input_closes_at_the_turns_result(short_tmp: Path) -> None:
    """Once the result is read the input is closed in that step (a later message is queued),
    while stdout is still read to its end."""
    async with open_supervisor(make_config(short_tmp)) as sup:
        turn = await running_turn(sup, "c", "long 600")
        agent_input = turn._input
        assert agent_input is not None and not agent_input.closed
        closed_at_result: list[bool] = []
        handle = turn._handle

        def spy(event: Event) -> None:  # (the turn's own step for each event, watched)
            if isinstance(event, Result):
                closed_at_result.append(agent_input.closed)
            handle(event)

        turn._handle = spy  # type: ignore[method-assign]
        assert await turn.steer("enough") is None
        await idle(sup, "c")
        assert closed_at_result == [True]
        assert await turn.steer("after the result") == CLOSED


async def test_a_steer_while_the_turn_prepares_returns_a_reason(short_tmp: Path) -> None:
    arrived, go = trio.Event(), trio.Event()

    async def preparing(channel: str, turn_id: str) -> None:
        arrived.set()
        with trio.fail_after(SLOW):
            await go.wait()

    async with open_supervisor(make_config(short_tmp), hooks=Hooks(preparing=preparing)) as sup:
        await sup.send("c", "hello")
        with trio.fail_after(SLOW):
            await arrived.wait()
        turn = sup._lanes.turns["c", "demo"]
        assert await turn.steer("not yet") == NOT_STARTED
        go.set()
        await idle(sup, "c")
        assert not [e for e in await sup.entries("c") if "not yet" in e.text]


@pytest.mark.usefixtures("kill_mechanism")
async def test_a_stop_right_after_a_steer_leaves_no_process(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        turn = await running_turn(sup, "c", "long 600")
        assert await turn.steer("keep going, and mention the otter") is None
        with trio.fail_after(SLOW):
            result = await sup.stop("c")
        assert result.ok and list(result.stopped_turns) == [turn.turn_id], result
        assert turn_processes(result.stopped_turns) == []
        assert turn.done.is_set() and turn.outcome.stopped
        entries = await sup.entries("c")
        assert entries[-1].kind == "notice"
        assert await turn.steer("after the stop") == CLOSED


def test_the_demo_agents_messages_are_json_never_argv() -> None:
    """A message reaches the agent only as JSON on stdin: the encoding is the whole of it."""
    text = "--session x; rm -rf / $(reboot)"
    assert demo.ADAPTER.steer is not None
    assert json.loads(demo.ADAPTER.steer(text)) == {"type": "user", "text": text}
