"""corral's ACP client against agents built on the two official SDKs — code no one here wrote
(tests/sdkagents: the Python SDK ``agent-client-protocol`` and the TypeScript SDK
``@agentclientprotocol/sdk``, pinned, installed on first use under ``~/.cache/corral``).

What each test proves, as the points of the ACP review:

1. a stop reaches an agent that stops only on ``$/cancel_request`` (the TypeScript SDK 2.x's
   abort signal): it answers ``cancelled`` at once instead of being killed after the grace;
2. the reason of an error (the SDKs put it in ``error.data``) is shown — for a prompt, for
   ``initialize`` (with the versions the agent speaks) and for ``authenticate``;
3. an agent answering a protocol version corral does not speak is refused, clearly;
4. an agent that wants authentication gets it (``acp_auth``: an ``env_var`` method's key in
   the agent's env), or an error that names every method it offers and what configures it;
5. a stop during the agent's start-up kills it at once and says so (``killed``, ``ended``);
   ``acp_start_timeout`` bounds the start;
6. stdout lines that are not JSON-RPC before the session opens are logged, bounded;

and, stable in 2026: ``session/resume`` before ``session/load``, ``session/close`` on close.
The TypeScript SDK's own example agent (shipped until 1.9.0) is run as it is: a turn, its
permission request decided by the policy, a cancel acknowledged; and an agent on its draft
v2 entry point, which refuses corral's version itself.

The TypeScript agent needs Node.js (``realcli``); the Python one only PyPI.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import make_config

from adapters._base import Text, ToolUse
from adapters.acp import AcpEvent, PermissionDecided, PromptEnded
from supervisor import open_supervisor
from supervisor.config.settings import ConfigError, parse_config
from supervisor.procs.tree import read_stat
from supervisor.turns.acp import turn_event
from supervisor.turns.agents import CLOSE_GRACE, AcpAgent, AcpAgentError, PromptStream, open_acp_agent
from tests import sdkagents

#: Real processes get real time: generous bounds.
BOUND = 60
#: The grace a test's cancel gets: long, so that only an acknowledgement can end it early.
GRACE = 20.0

realcli = pytest.mark.realcli


@asynccontextmanager
async def sdk_agent(kind: str, tmp: Path, *, saved: str | None = None, auth: str | None = None,
                    **env: str) -> AsyncIterator[AcpAgent]:
    launch = sdkagents.launch(kind, str(tmp), {"SDK_AGENT_LOG": str(tmp / "methods.log"), **env})
    extra = {"auth_method": auth} if auth is not None else {}
    async with open_acp_agent(launch, marker=f"acp-sdk-{kind}-{os.getpid()}", saved_session=saved,
                              start_timeout=BOUND, **extra) as agent:
        yield agent


def methods(tmp: Path) -> list[str]:
    """The methods the agent received, in order (first word of each log line)."""
    log = tmp / "methods.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


async def collect(stream: PromptStream) -> list[AcpEvent]:
    with trio.fail_after(BOUND):
        return [event async for event in stream]


def text_of(events: list[AcpEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Text))


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"


async def wait_file(path: Path) -> str:
    with trio.fail_after(BOUND):
        while not path.exists() or not path.read_text().strip():
            await trio.sleep(0.01)  # a file another process writes: polled, within a bound
    return path.read_text()


@pytest.fixture(scope="module", params=["py", pytest.param("ts", marks=realcli)])
def kind(request: pytest.FixtureRequest) -> str:
    """Each SDK's agent, installed (once) before its tests' clocks start."""
    if request.param == "py":
        sdkagents.python_sdk()
    else:
        sdkagents.ts_sdk()
    return str(request.param)


# ---------------------------------------------------------------- 1. the stop


@realcli
async def test_a_ts_sdk_agent_stops_mid_tool_on_cancel_request_and_serves_on(tmp_path: Path) -> None:
    """It stops only on ``$/cancel_request`` (its prompt follows the request's abort signal):
    without it the cancel is never answered and the agent is killed whole after the grace."""
    sdkagents.ts_sdk()
    pid_file = tmp_path / "pid"
    tool = (f"setsid sleep 3001 </dev/null >/dev/null 2>&1 & echo $! > {pid_file}.setsid; "
            f"sleep 3000 & echo $! > {pid_file}; wait")
    async with sdk_agent("ts", tmp_path) as agent:
        stream = agent.prompt(f"[[tool:{tool}]]")
        seen: list[AcpEvent] = []
        announced = trio.Event()
        async with trio.open_nursery() as nursery:

            async def consume() -> None:
                with trio.fail_after(BOUND):
                    async for event in stream:
                        seen.append(event)
                        if isinstance(event, ToolUse):
                            announced.set()

            nursery.start_soon(consume)
            with trio.fail_after(BOUND):
                await announced.wait()  # the call is on record before the stop
            child = int(await wait_file(pid_file))
            grandchild = int(await wait_file(Path(f"{pid_file}.setsid")))
            report = await agent.cancel(GRACE)
        assert report.ended == "cancelled", report
        assert report.acknowledged_after is not None and report.acknowledged_after < GRACE / 2, report
        assert grandchild in report.killed and not report.survivors, report
        assert not alive(child) and not alive(grandchild) and alive(agent.pid)
        assert any(isinstance(e, ToolUse) for e in seen) and seen[-1] == PromptEnded("cancelled", cancelled=True)
        assert "session/cancel" in methods(tmp_path), "session/cancel is sent too (the agent only records it)"
        events = await collect(agent.prompt("[[say:still here]]"))
        assert text_of(events) == "still here (earlier: 1)"


async def test_a_py_sdk_agent_stops_on_session_cancel_and_ignores_cancel_request(tmp_path: Path) -> None:
    """The other SDK knows no ``$/cancel_request``: it must not be harmed by it."""
    sdkagents.python_sdk()
    async with sdk_agent("py", tmp_path) as agent:
        stream = agent.prompt("[[silent]]")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, stream)
            with trio.fail_after(BOUND):
                while "session/prompt" not in methods(tmp_path):
                    await trio.sleep(0.01)  # the agent's own log: polled, within a bound
            report = await agent.cancel(GRACE)
        assert report.ended == "cancelled" and report.stop_reason == "cancelled", report
        events = await collect(agent.prompt("[[say:next]]"))
        assert text_of(events) == "next"


# ---------------------------------------------------------------- 2. the reason of an error


async def test_the_reason_of_a_failed_prompt_is_shown(kind: str, tmp_path: Path) -> None:
    async with sdk_agent(kind, tmp_path) as agent:
        events = await collect(agent.prompt("[[fail:model quota exceeded (429)]]"))
    ended = events[-1]
    assert isinstance(ended, PromptEnded) and ended.stop_reason == "error"
    verdict = turn_event(ended)
    assert verdict is not None and verdict.text == "The agent failed: Internal error: model quota exceeded (429)"


async def test_an_initialize_error_says_which_versions_the_agent_speaks(tmp_path: Path) -> None:
    sdkagents.python_sdk()
    with pytest.raises(AcpAgentError) as failed:
        async with sdk_agent("py", tmp_path, SDK_AGENT_REFUSE="1"):
            pass
    assert "Unsupported protocol version: the agent speaks ACP version 2; corral speaks version 1" in str(failed.value)


# ---------------------------------------------------------------- 3. the protocol version


async def test_an_agent_answering_another_protocol_version_is_refused(kind: str, tmp_path: Path) -> None:
    with pytest.raises(AcpAgentError) as failed:
        async with sdk_agent(kind, tmp_path, SDK_AGENT_VERSION="2"):
            pass
    assert "the agent speaks ACP version 2; corral speaks version 1 only" in str(failed.value)
    assert methods(tmp_path) == ["initialize"], "no session is opened with an agent corral cannot speak to"


@realcli
async def test_an_agent_on_the_sdks_v2_entry_point_is_refused_with_the_versions_it_speaks(tmp_path: Path) -> None:
    """The TypeScript SDK's draft v2 refuses corral's version-1 ``initialize`` itself: the
    reason (``data.supported``) is what says what to do."""
    sdkagents.ts_sdk()
    with pytest.raises(AcpAgentError) as failed:
        async with sdk_agent("ts-v2", tmp_path):
            pass
    assert ("initialize failed: Unsupported protocol version: the agent speaks ACP version 2; corral speaks "
            "version 1 (code -32022)") in str(failed.value)


# ---------------------------------------------------------------- the SDK's own example agent


@realcli
@pytest.mark.parametrize(("unattended", "words"), [
    (True, "Perfect! I've successfully updated the configuration."),
    (False, "I'll skip the configuration update."),
])
async def test_the_sdks_example_agent_answers_and_its_permission_is_decided_by_the_policy(
    tmp_path: Path, unattended: bool, words: str
) -> None:
    sdkagents.ts_sdk(sdkagents.TS_EXAMPLES[1])
    launch = sdkagents.launch("ts-example", str(tmp_path))
    async with open_acp_agent(launch, marker=f"acp-sdk-example-{os.getpid()}", start_timeout=BOUND,
                              unattended=unattended) as agent:
        events = await collect(agent.prompt("hello"))
    assert words in text_of(events) and events[-1] == PromptEnded("end_turn")
    decided = [e.kind for e in events if isinstance(e, PermissionDecided)]
    assert decided == ["allow_once" if unattended else "reject_once"]


@realcli
async def test_the_sdks_example_agent_acknowledges_a_cancel_and_answers_the_next_prompt(tmp_path: Path) -> None:
    sdkagents.ts_sdk(sdkagents.TS_EXAMPLES[1])
    launch = sdkagents.launch("ts-example", str(tmp_path))
    async with open_acp_agent(launch, marker=f"acp-sdk-example-{os.getpid()}", start_timeout=BOUND) as agent:
        stream = agent.prompt("hello")
        with trio.fail_after(BOUND):
            first = await stream.__anext__()  # its first chunk: the turn runs
        assert isinstance(first, Text)
        report = await agent.cancel(GRACE)
        assert report.ended == "cancelled" and report.stop_reason == "cancelled", report
        stream.discard()
        events = await collect(agent.prompt("again"))
    assert events[-1] == PromptEnded("end_turn") and "help you with that" in text_of(events)


# ---------------------------------------------------------------- 4. authentication


async def test_an_agent_that_wants_authentication_names_its_methods_and_what_to_configure(tmp_path: Path) -> None:
    sdkagents.python_sdk()
    with pytest.raises(AcpAgentError) as failed:
        async with sdk_agent("py", tmp_path, SDK_AGENT_AUTH="k1"):
            pass
    text = str(failed.value)
    assert "session/new failed: Authentication required (code -32000)" in text
    assert "'api-key' (API key): set SDK_AGENT_KEY in the agent's env and acp_auth = \"api-key\"" in text
    assert "'login' (Log in): a login in a terminal — run `" in text and "py_agent.py --login` once" in text
    assert "credentials = [...]" in text
    assert "'oauth' (Sign in with a browser): acp_auth = \"oauth\"" in text


async def test_an_env_var_method_is_authenticated_with_the_configured_key(tmp_path: Path) -> None:
    sdkagents.python_sdk()
    async with sdk_agent("py", tmp_path, auth="api-key", SDK_AGENT_AUTH="k1", SDK_AGENT_KEY="k1") as agent:
        events = await collect(agent.prompt("[[say:in]]"))
    assert text_of(events) == "in"
    assert methods(tmp_path)[:3] == ["initialize", "authenticate", "session/new"]


@pytest.mark.parametrize(("env", "words", "asked"), [
    ({"SDK_AGENT_KEY": "wrong"}, "authenticate with 'api-key' failed: Authentication required: invalid API key (401)",
     True),
    ({}, "cannot authenticate: 'api-key' needs SDK_AGENT_KEY in the agent's env", False),
])
async def test_an_authentication_that_cannot_succeed_says_why(
    tmp_path: Path, env: dict[str, str], words: str, asked: bool
) -> None:
    sdkagents.python_sdk()
    with pytest.raises(AcpAgentError) as failed:
        async with sdk_agent("py", tmp_path, auth="api-key", SDK_AGENT_AUTH="k1", **env):
            pass
    assert words in str(failed.value)
    assert ("authenticate" in methods(tmp_path)) is asked


async def test_acp_auth_names_a_method_the_agent_offers_or_the_error_lists_them(tmp_path: Path) -> None:
    sdkagents.python_sdk()
    with pytest.raises(AcpAgentError) as failed:
        async with sdk_agent("py", tmp_path, auth="api_key", SDK_AGENT_AUTH="k1", SDK_AGENT_KEY="k1"):
            pass
    assert ("acp_auth = 'api_key' is not a method the agent offers; did you mean 'api-key'? the agent offers "
            "'api-key'") in str(failed.value)


def test_corral_check_names_a_bad_acp_auth_or_start_timeout_with_its_fix(short_tmp: Path) -> None:
    with pytest.raises(ConfigError) as failed:
        parse_config({"agents": {"a": {"adapter": "acp", "command": [sys.executable], "acp_auth": 5,
                                       "acp_start_timeout": 0, "acp_auht": "x"}}}, base=short_tmp)
    problems = {(p.key, p.fix) for p in failed.value.problems}
    assert ("agents.a.acp_auth", 'write acp_auth = "..."') in problems
    assert ("agents.a.acp_start_timeout", "write acp_start_timeout = 60") in problems
    assert ("agents.a.acp_auht", "did you mean 'acp_auth'?") in problems


def sdk_table(folder: Path, **extra: Any) -> dict[str, Any]:
    """An ``adapter = "acp"`` agent on the Python SDK, granted ``folder`` (its log and holds)."""
    launch = sdkagents.launch("py", str(folder))
    env = {"SDK_AGENT_LOG": str(folder / "methods.log"), **extra.pop("env", {})}
    return {"adapter": "acp", "command": list(launch.argv), "env": env, "sandbox_write": [str(folder)],
            "acp_cancel_grace": 1.0, **extra}


async def test_a_supervised_agent_authenticates_with_acp_auth(short_tmp: Path) -> None:
    sdkagents.python_sdk()
    table = sdk_table(short_tmp, acp_auth="api-key", env={"SDK_AGENT_AUTH": "k1", "SDK_AGENT_KEY": "k1"})
    async with open_supervisor(make_config(short_tmp, {"acp": table})) as sup:
        accepted = await sup.send("c", "[[say:authenticated]]")
        with trio.fail_after(BOUND):
            assert await sup.wait_idle("c")
        entries = [(e.kind, e.text) for e in await sup.entries("c", after=accepted.seq)]
    assert entries[-1] == ("message", "authenticated"), entries


# ---------------------------------------------------------------- 5. a stop during start-up


async def test_a_stop_during_the_agents_start_kills_it_at_once_and_says_so(short_tmp: Path) -> None:
    """Before: the half-started agent had its close grace (2 s) and the stop said ``killed []``."""
    sdkagents.python_sdk()
    hold = short_tmp / "hold"
    hold.touch()
    table = sdk_table(short_tmp, env={"SDK_AGENT_HOLD": str(hold)})
    async with open_supervisor(make_config(short_tmp, {"acp": table})) as sup:
        await sup.send("c", "[[say:never]]")
        with trio.fail_after(BOUND):
            while "initialize" not in methods(short_tmp):
                await trio.sleep(0.01)  # the agent's own log: polled, within a bound
            result = await sup.stop("c")
        assert result.ok and result.stopped_turns and result.ended == "killed", result
        assert result.killed and not any(alive(pid) for pid in result.killed), result
        assert result.elapsed_ms < CLOSE_GRACE * 1000, f"the close grace was spent: {result.elapsed_ms:.0f} ms"
        entries = [(e.kind, e.text) for e in await sup.entries("c")]
        assert entries[-1] == ("notice", "Execution stopped by user."), entries
        hold.unlink()
        accepted = await sup.send("c", "[[say:back]]")
        with trio.fail_after(BOUND):
            assert await sup.wait_idle("c")
        after = [(e.kind, e.text) for e in await sup.entries("c", after=accepted.seq)]
    assert after[-1] == ("message", "back"), after


async def test_a_stop_while_the_agent_restarts_reports_the_half_started_process(short_tmp: Path) -> None:
    """The restart of a dead agent (``ensure_running``) killed a half-started process at once
    already; the stop now says so (before: ``killed []``, ``ended`` None)."""
    sdkagents.python_sdk()
    hold = short_tmp / "hold"
    table = sdk_table(short_tmp, env={"SDK_AGENT_HOLD": str(hold)})
    async with open_supervisor(make_config(short_tmp, {"acp": table})) as sup:
        for text in ("[[say:one]]", "[[exit]]"):
            await sup.send("c", text)
            with trio.fail_after(BOUND):
                assert await sup.wait_idle("c")
        hold.touch()  # the next start's initialize is held
        await sup.send("c", "[[say:never]]")
        with trio.fail_after(BOUND):
            while methods(short_tmp).count("initialize") < 2:
                await trio.sleep(0.01)  # the agent's own log: polled, within a bound
            result = await sup.stop("c")
        assert result.ok and result.ended == "killed" and result.killed, result
        assert not any(alive(pid) for pid in result.killed)
        assert result.elapsed_ms < CLOSE_GRACE * 1000, result


async def test_a_start_cancelled_before_the_session_opens_records_what_it_killed(tmp_path: Path) -> None:
    from supervisor.turns.agents import StartupKill

    sdkagents.python_sdk()
    hold = tmp_path / "hold"
    hold.touch()
    startup = StartupKill()
    launch = sdkagents.launch("py", str(tmp_path), {"SDK_AGENT_HOLD": str(hold),
                                                    "SDK_AGENT_LOG": str(tmp_path / "methods.log")})
    with trio.move_on_after(BOUND) as scope:
        async with trio.open_nursery() as nursery:

            async def start() -> None:
                async with open_acp_agent(launch, marker=f"acp-sdk-hold-{os.getpid()}", startup=startup,
                                          start_timeout=BOUND):
                    raise AssertionError("the session must not open")

            nursery.start_soon(start)
            with trio.fail_after(BOUND):
                while "initialize" not in methods(tmp_path):
                    await trio.sleep(0.01)  # the agent's own log: polled, within a bound
            started = trio.current_time()
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert trio.current_time() - started < CLOSE_GRACE
    assert len(startup.killed) >= 1 and not startup.survivors and not any(alive(p) for p in startup.killed)


async def test_acp_start_timeout_bounds_the_start(short_tmp: Path) -> None:
    sdkagents.python_sdk()
    hold = short_tmp / "hold"
    hold.touch()
    table = sdk_table(short_tmp, acp_start_timeout=0.5, env={"SDK_AGENT_HOLD": str(hold)})
    async with open_supervisor(make_config(short_tmp, {"acp": table})) as sup:
        accepted = await sup.send("c", "[[say:never]]")
        with trio.fail_after(BOUND):
            assert await sup.wait_idle("c")
        entries = [(e.kind, e.text) for e in await sup.entries("c", after=accepted.seq)]
    assert any(kind == "error" and "did not open a session within 0.5s" in text for kind, text in entries), entries


# ---------------------------------------------------------------- 6. noise before initialize


@pytest.mark.parametrize("lines", [3, 40])
async def test_lines_that_are_not_json_rpc_before_initialize_are_logged_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, lines: int
) -> None:
    sdkagents.python_sdk()
    with caplog.at_level(logging.WARNING, logger="corral.acp"):
        async with sdk_agent("py", tmp_path, SDK_AGENT_NOISE=str(lines)) as agent:
            events = await collect(agent.prompt("[[say:fine]]"))
    assert text_of(events) == "fine"
    logged = [r.getMessage() for r in caplog.records if r.name == "corral.acp" and "not JSON-RPC" in r.getMessage()]
    assert "banner line 0: corral-py-sdk-agent starting" in logged[0]
    assert len(logged) == min(lines, 5) + (lines > 5), logged
    if lines > 5:
        assert "lines of stdout during start-up were not JSON-RPC (the rest not logged)" in logged[-1]


async def test_an_agent_that_dies_during_its_start_shows_the_noise_it_printed(tmp_path: Path) -> None:
    sdkagents.python_sdk()
    with pytest.raises(AcpAgentError) as failed:
        async with sdk_agent("py", tmp_path, SDK_AGENT_NOISE="1", SDK_AGENT_DIE="1"):
            pass
    assert "the agent exited (status 4) during start-up" in str(failed.value)
    assert "stdout that was not JSON-RPC: banner line 0: corral-py-sdk-agent starting" in str(failed.value)


# ---------------------------------------------------------------- session/resume, session/close


@realcli
async def test_a_fresh_process_resumes_the_session_without_a_replay_and_close_closes_it(tmp_path: Path) -> None:
    sdkagents.ts_sdk()
    caps = {"SDK_AGENT_CAPS": "resume,close"}
    async with sdk_agent("ts", tmp_path, **caps) as agent:
        assert text_of(await collect(agent.prompt("[[say:one]]"))) == "one (earlier: 0)"
        saved = agent.session_id
    assert methods(tmp_path)[-1] == "session/close", "closing the agent closes its session first"
    async with sdk_agent("ts", tmp_path, saved=saved, **caps) as agent:
        assert agent.session_id == saved and not agent.notices
        assert text_of(await collect(agent.prompt("[[say:two]]"))) == "two (earlier: 1)"
    assert methods(tmp_path).count("session/resume") == 1 and "session/new" not in methods(tmp_path)[3:]


@realcli
async def test_after_a_stop_that_killed_the_agent_the_next_prompt_resumes_without_a_replay(tmp_path: Path) -> None:
    """A stop with no grace left kills the agent whole; the fresh process reopens the session
    with ``session/resume`` (no replay of the conversation), the agent advertising it."""
    sdkagents.ts_sdk()
    async with sdk_agent("ts", tmp_path, SDK_AGENT_CAPS="resume") as agent:
        assert text_of(await collect(agent.prompt("[[say:one]]"))) == "one (earlier: 0)"
        saved = agent.session_id
        stream = agent.prompt("[[silent]]")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, stream)
            with trio.fail_after(BOUND):
                while methods(tmp_path).count("session/prompt") < 2:
                    await trio.sleep(0.01)  # the agent's own log: polled, within a bound
            report = await agent.cancel(0)
        assert report.ended == "killed", report
        stream.discard()
        assert await agent.ensure_running()
        assert agent.session_id == saved and not agent.notices
        assert text_of(await collect(agent.prompt("[[say:two]]"))) == "two (earlier: 2)"
    assert methods(tmp_path).count("session/resume") == 1 and methods(tmp_path).count("session/new") == 1


@realcli
async def test_without_the_capabilities_neither_resume_nor_close_is_sent(tmp_path: Path) -> None:
    sdkagents.ts_sdk()
    async with sdk_agent("ts", tmp_path) as agent:
        await collect(agent.prompt("[[say:one]]"))
        saved = agent.session_id
    async with sdk_agent("ts", tmp_path, saved=saved) as agent:
        assert agent.session_id != saved and "cannot load sessions" in agent.notices[0]
    assert "session/resume" not in methods(tmp_path) and "session/close" not in methods(tmp_path)
