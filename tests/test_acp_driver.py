"""The Trio driver of one persistent ACP agent (supervisor/turns/agents.py), against the fake ACP agent
of tests/fakes/fake_acp.py: a turn, the typed cancel and the kill that always follows it, an
agent that ignores the cancel, one that answers it late, one that dies mid-prompt, malformed
JSON-RPC, permissions, session/load and its fallback, close and idle."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import supervisor.turns.agents
from adapters._base import Error, Launch, SessionId, Text, Todos, ToolUse, Unparsed
from adapters.acp import AcpEvent, PermissionDecided, PromptEnded
from supervisor.procs.tree import ident, read_stat
from supervisor.turns.agents import AcpAgent, AcpAgentError, PromptStream, open_acp_agent
from supervisor.turns.pool import AcpAgentPool, AcpSpec

FAKE = str(Path(__file__).parent / "fakes" / "fake_acp.py")
#: Real processes get real time: generous bounds.
BOUND = 30


@asynccontextmanager
async def fake_agent(tmp: Path, *, saved: str | None = None, **env: str) -> AsyncIterator[AcpAgent]:
    launch = Launch(argv=(sys.executable, FAKE), cwd=str(tmp), env={"FAKE_ACP_STATE": str(tmp), **env})
    async with open_acp_agent(
        launch, marker=f"acp-test-{os.getpid()}", saved_session=saved, start_timeout=BOUND
    ) as agent:
        yield agent


async def collect(stream: PromptStream) -> list[AcpEvent]:
    with trio.fail_after(BOUND):
        return [event async for event in stream]


def text_of(events: list[AcpEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Text))


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"


async def wait_file(path: Path) -> int:
    """The pid written to ``path`` by a tool, once it is there."""
    with trio.fail_after(BOUND):
        while not path.exists() or not path.read_text().strip():
            await trio.sleep(0.01)
    return int(path.read_text())


def helper_pid(agent: AcpAgent) -> int:
    """The fake's start-up helper (an MCP server stand-in): its ``sleep 3002`` child."""
    from supervisor.procs.tree import child_pids

    for pid in child_pids(agent.pid):
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"3002" in fh.read():
                return pid
    raise AssertionError("no helper")


async def test_a_turn_streams_text_and_ends_with_the_stop_reason(tmp_path: Path) -> None:
    async with fake_agent(tmp_path) as agent:
        assert agent.session_id is not None and agent.session_id.startswith("fake-")
        events = await collect(agent.prompt("[[say:hello world]] [[plan]] [[thought]]"))
        assert text_of(events) == "hello world (earlier: 0)"
        assert all(e.delta for e in events if isinstance(e, Text))
        assert [len(e.items) for e in events if isinstance(e, Todos)] == [3]
        assert events[-1] == PromptEnded("end_turn")
        assert not agent.busy
        events = await collect(agent.prompt("again"))
        assert text_of(events) == "ok: again (earlier: 1)"


async def test_cancel_mid_tool_kills_what_the_turn_started_and_keeps_the_agent(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    tool = (
        f"setsid sleep 3001 </dev/null >/dev/null 2>&1 & echo $! > {pid_file}.setsid; "
        f"sleep 3000 & echo $! > {pid_file}; wait"
    )
    async with fake_agent(tmp_path, FAKE_ACP_HELPER="1") as agent:
        helper = ident(helper_pid(agent))
        assert helper is not None
        stream = agent.prompt(f"[[tool:{tool}]]")
        async with trio.open_nursery() as nursery:
            seen: list[AcpEvent] = []

            async def consume() -> None:
                seen.extend(await collect(stream))

            nursery.start_soon(consume)
            child = await wait_file(pid_file)
            grandchild = int(Path(f"{pid_file}.setsid").read_text())
            report = await agent.cancel(grace=BOUND)
        assert report.ended == "cancelled" and report.stop_reason == "cancelled"
        assert report.acknowledged_after is not None and not report.survivors
        assert {child, grandchild} <= set(report.killed)
        assert not alive(child) and not alive(grandchild)
        assert helper.matches() and alive(agent.pid), "the agent and what it started before the turn survive"
        assert any(isinstance(e, ToolUse) for e in seen) and seen[-1] == PromptEnded("cancelled", cancelled=True)
        events = await collect(agent.prompt("[[say:still here]]"))
        assert text_of(events) == "still here (earlier: 1)"


async def test_cancel_during_a_silent_stream_is_acknowledged(tmp_path: Path) -> None:
    async with fake_agent(tmp_path) as agent:
        stream = agent.prompt("[[silent]]")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, stream)
            await trio.testing.wait_all_tasks_blocked()
            report = await agent.cancel(grace=BOUND)
        assert report.ended == "cancelled" and report.killed == []


async def test_an_agent_that_ignores_the_cancel_is_killed_whole(tmp_path: Path) -> None:
    async with fake_agent(tmp_path, FAKE_ACP_HELPER="1") as agent:
        helper = helper_pid(agent)
        agent_pid = agent.pid
        session = agent.session_id
        stream = agent.prompt("[[ignore-cancel]]")
        async with trio.open_nursery() as nursery:
            seen: list[AcpEvent] = []

            async def consume() -> None:
                seen.extend(await collect(stream))

            nursery.start_soon(consume)
            with trio.fail_after(BOUND):
                report = await agent.cancel(grace=0.3)
        assert report.ended == "killed" and report.acknowledged_after is None
        assert agent_pid in report.killed and helper in report.killed and not report.survivors
        assert not alive(agent_pid) and not alive(helper)
        assert seen[-1].stop_reason == "exited" and seen[-1].cancelled  # type: ignore[union-attr]
        assert not [e for e in seen if isinstance(e, Error)], "a killed turn is no error"
        with pytest.raises(AcpAgentError, match="ensure_running"):
            agent.prompt("more")
        # The next prompt starts a fresh process, which resumes the session.
        with trio.fail_after(BOUND):
            assert await agent.ensure_running() is True
        assert agent.pid != agent_pid and agent.session_id == session and agent.notices == []
        events = await collect(agent.prompt("[[say:back]]"))
        assert text_of(events) == "back (earlier: 1)"
        assert await agent.ensure_running() is False


async def test_an_agent_out_of_step_after_a_cancel_is_restarted_with_its_session(tmp_path: Path) -> None:
    launch = Launch(argv=(sys.executable, FAKE), cwd=str(tmp_path), env={"FAKE_ACP_STATE": str(tmp_path)})
    async with open_acp_agent(launch, marker="acp-test-restart", restart_after_cancel=True) as agent:
        first, session = agent.pid, agent.session_id
        stream = agent.prompt("[[silent]]")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, stream)
            await trio.testing.wait_all_tasks_blocked()
            report = await agent.cancel(grace=BOUND)
        assert report.ended == "cancelled" and first in report.killed and not alive(first)
        with trio.fail_after(BOUND):
            assert await agent.ensure_running() is True
        assert agent.session_id == session
        events = await collect(agent.prompt("[[say:in step]]"))
        assert text_of(events) == "in step (earlier: 1)"


async def test_a_restart_after_a_cancel_is_not_failed_by_the_exit_of_the_process_it_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The killed process's stdout reader, still reaping it when the restart begins, must not
    report that exit (status -9, corral's own kill) as the fresh process's: it failed the
    restart with "the agent exited (status -9) during start-up" now and then."""
    parked, release = trio.Event(), trio.Event()
    original_wait = trio.Process.wait

    async def wait(process: trio.Process) -> int:
        # Park the reader of the first process at EOF, in reaping it, until the restart has begun.
        if trio.lowlevel.current_task().name.endswith("._read_stdout") and not release.is_set():
            parked.set()
            with trio.CancelScope(shield=True):  # past the reader's own 1 s bound on the reap
                await release.wait()
        return await original_wait(process)

    original_spawn = supervisor.turns.agents.spawn

    async def spawn(*args: Any, **kwargs: Any) -> trio.Process:
        if parked.is_set() and not release.is_set():
            # The restart: its generation's state is in place; let the old reader finish first.
            release.set()
            await trio.testing.wait_all_tasks_blocked()
        return await original_spawn(*args, **kwargs)

    monkeypatch.setattr(trio.Process, "wait", wait)
    monkeypatch.setattr(supervisor.turns.agents, "spawn", spawn)
    launch = Launch(argv=(sys.executable, FAKE), cwd=str(tmp_path), env={"FAKE_ACP_STATE": str(tmp_path)})
    async with open_acp_agent(launch, marker="acp-test-restart-reap", restart_after_cancel=True) as agent:
        session = agent.session_id
        stream = agent.prompt("[[silent]]")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, stream)
            await trio.testing.wait_all_tasks_blocked()
            report = await agent.cancel(grace=BOUND)
        assert report.ended == "cancelled"
        with trio.fail_after(BOUND):
            await parked.wait()  # the old reader saw EOF and is reaping its process
            assert await agent.ensure_running() is True
        assert release.is_set() and agent.session_id == session
        assert await agent.ensure_running() is False, "the fresh process is taken for gone"
        events = await collect(agent.prompt("[[say:in step]]"))
        assert text_of(events) == "in step (earlier: 1)"


@pytest.mark.parametrize(("late", "grace", "ended"), [(0.2, BOUND, "cancelled"), (BOUND, 0.3, "killed")])
async def test_an_agent_that_answers_the_cancel_late(tmp_path: Path, late: float, grace: float, ended: str) -> None:
    async with fake_agent(tmp_path) as agent:
        stream = agent.prompt(f"[[silent]] [[late:{late}]]")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, stream)
            await trio.testing.wait_all_tasks_blocked()
            report = await agent.cancel(grace=grace)
        assert report.ended == ended
        if ended == "cancelled":
            assert report.acknowledged_after is not None and report.acknowledged_after >= late
            assert alive(agent.pid)
        else:
            assert not alive(agent.pid)


async def test_an_agent_that_dies_mid_prompt_ends_the_turn_with_an_error(tmp_path: Path) -> None:
    async with fake_agent(tmp_path) as agent:
        events = await collect(agent.prompt("[[die]]"))
        assert text_of(events) == "dying"
        errors = [e for e in events if isinstance(e, Error)]
        assert len(errors) == 1 and "status 3" in errors[0].text
        assert events[-1] == PromptEnded("exited", error="the agent exited (status 3)")
        report = await agent.cancel()
        assert report.ended == "idle"
        with pytest.raises(AcpAgentError):
            agent.prompt("more")


async def test_malformed_json_rpc_is_unparsed_and_the_turn_goes_on(tmp_path: Path) -> None:
    async with fake_agent(tmp_path) as agent:
        events = await collect(agent.prompt("[[garbage]] [[say:fine]]"))
        bad = [e for e in events if isinstance(e, Unparsed)]
        assert [b.line for b in bad] == ["this is not json", '{"hello": "world"}']
        assert text_of(events) == "fine (earlier: 0)" and events[-1] == PromptEnded("end_turn")


async def test_client_methods_corral_does_not_offer_are_refused(tmp_path: Path) -> None:
    async with fake_agent(tmp_path) as agent:
        events = await collect(agent.prompt("[[ask-fs]]"))
        assert '"code": -32601' in text_of(events)


@pytest.mark.parametrize(("unattended", "option"), [(True, "yes"), (False, "no")])
async def test_permission_requests_are_answered_by_the_policy(tmp_path: Path, unattended: bool, option: str) -> None:
    launch = Launch(argv=(sys.executable, FAKE), cwd=str(tmp_path), env={"FAKE_ACP_STATE": str(tmp_path)})
    async with open_acp_agent(launch, marker="acp-test-perm", unattended=unattended) as agent:
        events = await collect(agent.prompt("[[permission]]"))
        (decided,) = [e for e in events if isinstance(e, PermissionDecided)]
        assert decided.option_id == option
        assert f'"optionId": "{option}"' in text_of(events)


async def test_a_cancel_answers_a_pending_permission_cancelled(tmp_path: Path) -> None:
    async with fake_agent(tmp_path) as agent:
        agent.conn.policy = False  # nobody answers: the request stays pending
        stream = agent.prompt("[[permission]]")
        with trio.fail_after(BOUND):
            while not agent.conn.pending_permissions:
                await stream.__anext__()
        report = await agent.cancel(grace=BOUND)
        assert [d.outcome for d in report.decisions] == ["cancelled"]
        assert report.ended == "cancelled"


async def test_load_falls_back_to_a_new_session_with_a_notice(tmp_path: Path) -> None:
    async with fake_agent(tmp_path, saved="fake-gone") as agent:
        assert agent.session_id != "fake-gone"
        assert agent.notices == ["could not load session fake-gone: session fake-gone not found; a new one started"]
    async with fake_agent(tmp_path, saved="fake-gone", FAKE_ACP_NO_LOAD="1") as agent:
        assert agent.notices and "cannot load sessions" in agent.notices[0]


async def test_close_ends_the_agent_and_what_it_started(tmp_path: Path) -> None:
    async with fake_agent(tmp_path, FAKE_ACP_HELPER="1") as agent:
        helper, pid = helper_pid(agent), agent.pid
        assert await agent.close_if_idle(3600) is False
        assert await agent.close_if_idle(0) is True
        assert not alive(pid) and not alive(helper)


async def test_a_start_that_fails_says_why(tmp_path: Path) -> None:
    launch = Launch(argv=(sys.executable, "-c", "import sys; print('no ACP here', file=sys.stderr)"), cwd=str(tmp_path))
    with pytest.raises(AcpAgentError, match="no ACP here"):
        async with open_acp_agent(launch, marker="acp-test-fail", start_timeout=BOUND):
            pass


async def test_the_session_id_event_is_known_before_any_turn(tmp_path: Path) -> None:
    async with fake_agent(tmp_path) as agent:
        events = await collect(agent.prompt("x"))
        assert not [e for e in events if isinstance(e, SessionId)]
        assert agent.session_id


# ---------------------------------------------------------------- the pool


def spec(tmp: Path, name: str, **env: str) -> AcpSpec:
    launch = Launch(argv=(sys.executable, FAKE), cwd=str(tmp), env={"FAKE_ACP_STATE": str(tmp), **env})
    return AcpSpec(launch, marker=f"acp-pool-{name}-{os.getpid()}", start_timeout=BOUND)


async def test_pool_keeps_one_agent_per_key_and_a_cancel_touches_only_its_own(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        pool = AcpAgentPool(nursery)
        a = await pool.agent(("chan-a", "fake"), spec(tmp_path, "a"))
        assert await pool.agent(("chan-a", "fake"), spec(tmp_path, "a")) is a
        b = await pool.agent(("chan-b", "fake"), spec(tmp_path, "b"))
        assert a is not b and a.session_id != b.session_id
        stream_a, stream_b = a.prompt("[[silent]]"), b.prompt("[[silent]] [[late:0.3]]")
        async with trio.open_nursery() as turns:
            turns.start_soon(collect, stream_a)
            turns.start_soon(collect, stream_b)
            await trio.testing.wait_all_tasks_blocked()
            report = await a.cancel()  # (as a stopped turn's teardown does)
            assert report.ended == "cancelled"
            assert b.busy and alive(b.pid), "a stop of channel A leaves channel B's turn running"
            assert (await b.cancel()).ended == "cancelled"
        assert (await a.cancel()).ended == "idle"
        await pool.close_all()
        assert not alive(a.pid) and not alive(b.pid) and pool.pids() == set()


async def test_pool_restarts_a_killed_agent_with_its_session_and_closes_one_by_key(tmp_path: Path) -> None:
    key = ("chan", "fake")
    async with trio.open_nursery() as nursery:
        pool = AcpAgentPool(nursery)
        agent = await pool.agent(key, spec(tmp_path, "r"))
        first, session = agent.pid, agent.session_id
        stream = agent.prompt("[[ignore-cancel]]")
        async with trio.open_nursery() as turns:
            turns.start_soon(collect, stream)
            assert (await agent.cancel(grace=0.2)).ended == "killed"
        again = await pool.agent(key, spec(tmp_path, "r"))
        assert again is agent and agent.pid != first and agent.session_id == session
        assert text_of(await collect(agent.prompt("[[say:hi]]"))) == "hi (earlier: 1)"
        assert not await pool.close(("other", "fake"))
        assert await pool.close(key)
        assert not alive(agent.pid) and pool.pids() == set()
        fresh = await pool.agent(key, dataclasses.replace(spec(tmp_path, "r"), saved_session=session))
        assert fresh is not agent and fresh.session_id == session
        await pool.close_all()
