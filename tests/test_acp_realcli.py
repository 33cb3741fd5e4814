"""Real ACP agents (gemini --acp, qwen --acp, claude-agent-acp, codex-acp, opencode acp, copilot, vibe, kilo, kimi,
fast-agent) driven by corral's ACP driver,
offline against the fake model servers: a text turn and its session id; a cancel mid-tool
(the tool and its setsid grandchild dead, the agent serving the next prompt); a resume with
session/load in a fresh process; a cancel while the model stream is silent; a permission
request answered by the policy.

The agents are installed by scripts/install-clis.sh. A missing agent fails, never skips.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from adapters._base import Text, ToolUse
from adapters.acp import AcpEvent, PermissionDecided, PromptEnded
from supervisor.procs.tree import read_stat
from supervisor.testing import read_pid
from supervisor.turns.agents import AcpAgent, PromptStream, open_acp_agent
from scripts.fakemodel._http import FakeModelServer
from scripts.fakemodel.acp_agents import ACP_AGENTS, AcpAgentSpec
from scripts.fakemodel.rig import write_tool_script

pytestmark = pytest.mark.realcli

#: Real processes get real time.
BOUND = 120
#: The grace the tests give a cancel's acknowledgement: generous, because what is tested is
#: that the agent acknowledges, not how fast a loaded machine lets it. claude-agent-acp 0.23
#: answers ``cancelled`` only once the Claude Code process it drives has handled the
#: interrupt and emitted its result (a round trip through a second node process): on two
#: cores shared with other work that took over the production default of 3 s now and then.
CANCEL_GRACE = 15.0

#: Agents whose ``session/load`` cannot resume here, and why (corral falls back to a new
#: session with a notice). gemini 0.61's ACP loadSession starts recording the session under
#: the same id *before* reading it, so the saved conversation is emptied and the load fails
#: with "No previous sessions found for this project." (headless ``--resume`` works).
LOAD_BROKEN = {"gemini"}
#: Agents that run their shell tool without asking over ACP, and why: an attended agent of
#: theirs gets no shell tool at all (the preset's ``unattended_args``).
ASKS_NOTHING = {"fast-agent": "its local shell asks no permission; only a client's ACP terminal is asked for"}


class Rig:
    """One agent, its fake model server and a private folder."""

    def __init__(self, spec: AcpAgentSpec, folder: Path) -> None:
        self.spec = spec
        self.folder = folder
        self.work = folder / "work"
        self.work.mkdir()
        self.home = str(folder / "home")
        self.server: FakeModelServer = spec.server().start()

    @asynccontextmanager
    async def agent(self, *, saved: str | None = None, unattended: bool = True) -> AsyncIterator[AcpAgent]:
        make = self.spec.attended if not unattended and self.spec.attended is not None else self.spec.launch
        launch = make(self.server.url, str(self.work), self.home)
        async with open_acp_agent(
            launch,
            marker=f"acp-real-{self.spec.name}-{id(self)}",
            home=self.home,
            saved_session=saved,
            unattended=unattended,
            restart_after_cancel=self.spec.restart_after_cancel,
            start_timeout=BOUND,
        ) as agent:
            yield agent

    def saw(self, words: str) -> bool:
        """Did any model request carry ``words``?"""
        return any(words in json.dumps(r.body) for r in self.server.requests)


@pytest.fixture(params=sorted(ACP_AGENTS))
def rig(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[Rig]:
    rig = Rig(ACP_AGENTS[request.param], short_tmp)
    try:
        yield rig
    finally:
        rig.server.stop()


async def collect(stream: PromptStream) -> list[AcpEvent]:
    with trio.fail_after(BOUND):
        return [event async for event in stream]


def text_of(events: list[AcpEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Text))


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Wait for something outside corral (a file, a model request) to happen."""
    with trio.fail_after(BOUND):
        while not predicate():
            await trio.sleep(0.05)


async def test_text_then_a_cancel_mid_tool_then_one_on_a_silent_stream_in_one_agent(rig: Rig) -> None:
    """Three scenarios in one agent process, in turn (one cold start, not three: a start is
    most of these tests' time): a text turn and its session id; a cancel mid-tool (the tool
    and its setsid grandchild dead, the agent serving the next prompt); a cancel while the
    model stream is silent, acknowledged within the grace, and the next prompt answered."""
    async with rig.agent() as agent:
        await _text_turn(agent)
        await _cancel_mid_tool(rig, agent)
        await _cancel_on_a_silent_stream(rig, agent)


async def _text_turn(agent: AcpAgent) -> None:
    assert agent.session_id
    events = await collect(agent.prompt("[[say:Hello from ACP.]] Say hello."))
    assert text_of(events) == "Hello from ACP."
    assert events[-1] == PromptEnded("end_turn")


async def _cancel_mid_tool(rig: Rig, agent: AcpAgent) -> None:
    tool = write_tool_script(rig.folder)
    pid_file = rig.folder / "pid"
    stream = agent.prompt(f"[[shell:sh {tool} {pid_file}]] [[say:never said]] Run the tool.")
    seen: list[AcpEvent] = []
    async with trio.open_nursery() as nursery:

        async def consume() -> None:
            seen.extend(await collect(stream))

        nursery.start_soon(consume)
        await wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        child = read_pid(pid_file)
        grandchild = read_pid(Path(f"{pid_file}.setsid"))
        assert alive(child) and alive(grandchild)
        with trio.fail_after(CANCEL_GRACE + 10):
            report = await agent.cancel(grace=CANCEL_GRACE)
    assert report.ended == "cancelled", report
    assert not alive(child) and not alive(grandchild) and not report.survivors
    asked = [] if rig.spec.name in ASKS_NOTHING else ["allow_once"]
    assert [e.kind for e in seen if isinstance(e, PermissionDecided)] == asked
    assert seen[-1].stop_reason == "cancelled"  # type: ignore[union-attr]
    assert "never said" not in text_of(seen)
    before = agent.pid
    restarted = await agent.ensure_running()
    assert restarted == rig.spec.restart_after_cancel
    assert (agent.pid == before) != restarted, "the same process serves on unless the preset restarts it"
    events = await collect(agent.prompt("[[say:Still here.]] Are you there?"))
    assert text_of(events) == "Still here."


async def _cancel_on_a_silent_stream(rig: Rig, agent: AcpAgent) -> None:
    stream = agent.prompt("[[silent]] Think forever.")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect, stream)
        await wait_until(lambda: rig.saw("Think forever."))
        with trio.fail_after(CANCEL_GRACE + 10):
            report = await agent.cancel(grace=CANCEL_GRACE)
    assert report.ended == "cancelled", report
    assert report.acknowledged_after is not None and report.acknowledged_after < CANCEL_GRACE
    await agent.ensure_running()
    events = await collect(agent.prompt("[[say:Back again.]] And now?"))
    assert text_of(events) == "Back again."


async def test_resume_with_session_load_in_a_fresh_process(rig: Rig) -> None:
    async with rig.agent() as agent:
        session = agent.session_id
        await collect(agent.prompt("[[say:I will remember.]] Remember the word pelican."))
    async with rig.agent(saved=session) as agent:
        events = await collect(agent.prompt("[[say:You said pelican.]] Which word?"))
        assert text_of(events) == "You said pelican."
        last = json.dumps(rig.server.requests[-1].body)
        if rig.spec.name in LOAD_BROKEN:
            assert agent.notices and "could not load session" in agent.notices[0]
            assert agent.session_id != session
        else:
            assert agent.notices == [] and agent.session_id == session
            assert "pelican" in last.split("Which word")[0], "the model saw the earlier conversation"


async def test_attended_agent_has_its_tool_rejected_by_the_policy(rig: Rig) -> None:
    async with rig.agent(unattended=False) as agent:
        events = await collect(agent.prompt("[[shell:touch rejected.txt]] [[say:Done or not.]] Touch a file."))
        decided = [e for e in events if isinstance(e, PermissionDecided)]
        if rig.spec.name in ASKS_NOTHING:  # no shell tool to ask for: the model's call fails
            assert decided == []
        else:
            assert decided and all((d.kind or "").startswith("reject") for d in decided)
            assert any(isinstance(e, ToolUse) for e in events) or decided
        assert isinstance(events[-1], PromptEnded)
        assert not (rig.work / "rejected.txt").exists()


async def test_claude_agent_acp_takes_a_steered_prompt_into_its_running_turn(short_tmp: Path) -> None:
    # claude-agent-acp queues a session/prompt sent while one runs (_meta.claudeCode.promptQueueing):
    # corral steers a turn with it, and the message reaches Claude Code's next model request.
    rig = Rig(ACP_AGENTS["claude"], short_tmp)
    started, fifo = short_tmp / "started", short_tmp / "fifo"
    os.mkfifo(fifo)
    try:
        async with rig.agent() as agent:
            assert agent.conn.prompt_queueing
            stream = agent.prompt(f"[[shell:sh -c 'echo go > {started}; read x < {fifo}']] [[say:tool done]] run it")
            seen: list[AcpEvent] = []
            async with trio.open_nursery() as nursery:

                async def consume() -> None:
                    seen.extend(await collect(stream))

                nursery.start_soon(consume)
                await wait_until(lambda: started.exists())
                assert agent.steer("STEERED-TEXT also mind the tests") is None
                await agent.send_queued()
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the tool reads it: the open does not block
                os.write(fd, b"go\n")
                os.close(fd)
            assert seen[-1] == PromptEnded("end_turn")
            assert [e for e in seen if isinstance(e, PromptEnded)] == [seen[-1]]  # one turn, one end
            assert rig.saw("STEERED-TEXT also mind the tests")
            events = await collect(agent.prompt("[[say:Still here.]] Are you there?"))
            assert text_of(events) == "Still here."
    finally:
        rig.server.stop()
