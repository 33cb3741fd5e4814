"""``adapter = "acp"`` turns inside a supervisor, against the fake ACP agent (tests/fakes/fake_acp.py):
one persistent agent process per (channel, agent) serving turn after turn; entries as for any
turn; the stop's typed cancel and the kill that always follows (``ended``: ``cancelled`` or
``killed``); a permission decided by the policy and stored; the idle close; shutdown."""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import DaemonProcess, make_config

from adapters.acp import PermissionDecided, PromptEnded
from scripts._config import toml_value
from supervisor import open_supervisor
from supervisor.config.settings import ConfigError, parse_config
from supervisor.host.supervisor import Supervisor
from supervisor.procs.tree import descendants, read_stat
from supervisor.testing import Hooks, read_pid
from supervisor.turns.acp import turn_event
from scripts.fakemodel.rig import PID_OF_LAST, write_tool_script

FAKE = str(Path(__file__).parent / "fakes" / "fake_acp.py")
#: Real processes get real time.
BOUND = 30


def fake(folder: Path, **extra: Any) -> dict[str, Any]:
    state = folder / "fake-state"
    state.mkdir(exist_ok=True)
    return {
        "adapter": "acp", "command": [sys.executable, FAKE], "env": {"FAKE_ACP_STATE": str(state)},
        # The fake keeps its sessions there, and its tools write pid files beside it: granted,
        # as a user grants a shared folder (for the daemon configs built from this table too).
        "sandbox_write": [str(folder)],
        "acp_cancel_grace": 1.0, **extra,
    }


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"


async def turn(sup: Supervisor, channel: str, text: str, agent: str | None = None) -> list[tuple[str, str]]:
    accepted = await sup.send(channel, text, agent=agent)
    with trio.fail_after(BOUND):
        assert await sup.wait_idle(channel)
    return [(e.kind, e.text) for e in await sup.entries(channel, after=accepted.seq)]


def alive_by_file(pid_file: Path) -> bool:
    """Is the process a pid file names (``PID NAMESPACE``) alive? No process of that pid in
    that namespace (or no namespace any more) means it is dead."""
    try:
        return alive(read_pid(pid_file))
    except LookupError:
        return False


def agent_pid(sup: Supervisor, channel: str, agent: str = "acp") -> int:
    running = sup._lanes.acp._agents.get((channel, agent))
    assert running is not None
    return running.pid


async def wait_file(path: Path) -> int:
    with trio.fail_after(BOUND):
        while not path.exists() or not path.read_text().strip():
            await trio.sleep(0.02)  # a file another process writes: polled, within a bound
    return read_pid(path)


def test_prompt_ended_maps_to_the_turns_verdict() -> None:
    assert turn_event(PromptEnded("end_turn")) is not None and turn_event(PromptEnded("end_turn")).ok  # type: ignore[union-attr]
    refused = turn_event(PromptEnded("refusal"))
    assert refused is not None and not refused.ok and "refusal" in refused.text  # type: ignore[union-attr]
    assert turn_event(PromptEnded("exited", error="gone")) is None
    decided = turn_event(PermissionDecided("touch x", "selected", "no", "reject_once"))
    assert decided is not None and decided.text == "permission for 'touch x': rejected (reject_once)"  # type: ignore[union-attr]


async def test_turns_share_one_agent_process_and_store_entries_as_any_turn(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config) as sup:
        first = await turn(sup, "c", "[[say:hello world]] [[plan]] [[thought]]")
        pid = agent_pid(sup, "c")
        session = sup.session("c", "acp")
        second = await turn(sup, "c", "[[say:again]]")
        assert agent_pid(sup, "c") == pid, "the same process serves the next turn"
        assert sup.todos("c", "acp")[1] == {"content": "Do the work", "status": "in_progress"}
    # Three chunks, one message; the plan is stored; thoughts are dropped.
    assert first[:2] == [("todos", "[x] Read the task; [~] Do the work; [ ] Report back"),
                         ("message", "hello world (earlier: 0)")], first
    assert not [t for _, t in first if "hmm" in t], "thoughts are dropped"
    # The plan's unfinished todos nudge the agent, as after any turn (max_nudges = 3).
    assert [t for k, t in first if k == "message" and t.startswith("You have 2 remaining")], first
    assert second[0] == ("message", "again (earlier: 4)"), second  # after 1 prompt + 3 nudges
    assert session is not None and session.startswith("fake-")
    assert not alive(pid), "shutdown closes every agent process"


async def test_stop_mid_tool_cancels_kills_the_tool_and_the_agent_serves_on(short_tmp: Path) -> None:
    tool = write_tool_script(short_tmp)
    pid_file = short_tmp / "tool.pid"
    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", f"[[tool:sh {tool} {pid_file}]] [[say:never said]]")
        child = await wait_file(pid_file)
        grandchild = read_pid(Path(f"{pid_file}.setsid"))
        pid = agent_pid(sup, "c")
        with trio.fail_after(BOUND):
            result = await sup.stop("c")
        assert result.ok and result.ended == "cancelled", result
        assert result.to_json()["ended"] == "cancelled"
        assert not alive(child) and not alive(grandchild), "the fake leaves its tool running: corral kills it"
        assert set(result.killed) >= {child, grandchild} and pid not in result.killed
        assert alive(pid)
        entries = [(e.kind, e.text) for e in await sup.entries("c", after=accepted.seq)]
        assert entries[-1] == ("notice", "Execution stopped by user."), entries
        assert not [t for _, t in entries if "never said" in t]
        after = await turn(sup, "c", "[[say:still here]]")
        assert agent_pid(sup, "c") == pid
    assert after[-1] == ("message", "still here (earlier: 1)"), after


async def test_an_agent_that_ignores_the_cancel_is_killed_whole_and_restarted_with_load(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config) as sup:
        await turn(sup, "c", "[[say:one]]")
        session = sup.session("c", "acp")
        accepted = await sup.send("c", "[[ignore-cancel]]")
        pid = agent_pid(sup, "c")
        with trio.fail_after(BOUND):
            while sup._ledger.turn_phase("c") is None or not sup._lanes.acp._agents.get(("c", "acp")).busy:  # type: ignore[union-attr]
                await trio.sleep(0.01)  # the prompt reaches a real process
            result = await sup.stop("c")
        assert result.ok and result.ended == "killed" and pid in result.killed, result
        assert not alive(pid)
        entries = [(e.kind, e.text) for e in await sup.entries("c", after=accepted.seq)]
        assert entries[-1][0] == "notice"
        after = await turn(sup, "c", "[[say:back]]")
        assert agent_pid(sup, "c") != pid
        assert sup.session("c", "acp") == session, "the fresh process loaded the stored session"
    assert after[-1] == ("message", "back (earlier: 2)"), after


async def test_a_permission_request_is_answered_by_the_policy_and_stored(short_tmp: Path) -> None:
    agents = {"acp": fake(short_tmp), "strict": fake(short_tmp, unattended=False)}
    config = make_config(short_tmp, agents, agent="acp")
    async with open_supervisor(config) as sup:
        allowed = await turn(sup, "a", "[[permission]]")
        rejected = await turn(sup, "r", "[[permission]]", agent="strict")
    assert ("status", "permission for 'touch allowed.txt': allowed (allow_once)") in allowed, allowed
    assert ("status", "permission for 'touch allowed.txt': rejected (reject_once)") in rejected, rejected
    assert any('"optionId": "no"' in t for k, t in rejected if k == "message"), rejected


async def test_an_agent_that_dies_mid_prompt_fails_the_turn_and_restarts_on_the_next(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config) as sup:
        died = await turn(sup, "c", "[[die]]")
        after = await turn(sup, "c", "[[say:alive]]")
    # What it said before dying is kept, as for any turn; the error says why it ended.
    assert died[0] == ("message", "dying") and [k for k, _ in died].count("error") == 1, died
    assert died[-1][0] == "error" and "exited (status 3)" in died[-1][1], died
    assert after[-1] == ("message", "alive (earlier: 1)"), after


async def test_an_idle_agent_process_is_closed_and_the_next_message_loads_its_session(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(short_tmp, {"acp": fake(short_tmp, acp_idle_timeout=0.3)})
    async with open_supervisor(config) as sup:
        # Taken as the turn gets it: looked up after the turn, on a busy machine, it can be
        # closed already (0.3 s after its answer).
        pool, taken = sup._lanes.acp, []
        take = pool.agent

        async def agent(key: tuple[str, str], spec: Any) -> Any:
            running = await take(key, spec)
            taken.append((running.pid, pool._gone[key]))
            return running

        monkeypatch.setattr(pool, "agent", agent)
        await turn(sup, "c", "[[say:one]]")
        [(pid, gone)] = taken
        with trio.fail_after(BOUND):
            await gone.wait()
        assert sup._lanes.acp._agents.get(("c", "acp")) is None and not alive(pid)
        after = await turn(sup, "c", "[[say:two]]")
        assert agent_pid(sup, "c") != pid
    assert after[-1] == ("message", "two (earlier: 1)"), after


async def test_a_normal_turns_background_process_is_swept_and_the_agents_own_stay(short_tmp: Path) -> None:
    pid_file = short_tmp / "bg.pid"
    script = short_tmp / "bg.sh"
    script.write_text(f"#!/bin/sh\nsetsid sleep 3003 </dev/null >/dev/null 2>&1 &\necho {PID_OF_LAST} > {pid_file}\n")
    agent = fake(short_tmp)
    agent["env"] = {**agent["env"], "FAKE_ACP_HELPER": "1"}
    config = make_config(short_tmp, {"acp": agent})
    async with open_supervisor(config) as sup:
        await turn(sup, "c", "[[say:warm]]")
        running = sup._lanes.acp._agents.get(("c", "acp"))
        assert running is not None
        helpers = descendants(running.pid)
        entries = await turn(sup, "c", f"[[tool:sh {script}]] [[say:started]]")
        assert ("message", "started (earlier: 1)") in entries, entries
        assert not alive_by_file(pid_file), "the background process outlived its turn"
        assert all(alive(p.pid) for p in helpers), "what the agent started before the turn stays"


def test_corral_check_names_each_bad_acp_key_with_its_fix(short_tmp: Path) -> None:
    data = {
        "agents": {
            "typo": {"adapter": "acp", "preset": "gemni", "acp_cancel_grace": -1, "acp_idel_timeout": 5},
            "bare": {"adapter": "acp"},
        },
        "defaults": {"agent": "typo"},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(data, file="corral.toml", base=short_tmp)
    problems = {(p.key, p.fix) for p in caught.value.problems}
    assert ("agents.typo.preset", "did you mean 'gemini'?") in problems
    assert ("agents.typo.acp_idel_timeout", "did you mean 'acp_idle_timeout'?") in problems
    assert ("agents.typo.acp_cancel_grace", "write acp_cancel_grace = 3") in problems
    assert any(key == "agents.bare.command" and "preset" in fix for key, fix in problems), problems


def test_the_docs_acp_example_is_a_valid_config(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = (Path(__file__).parent.parent / "docs" / "agents.md").read_text()
    section = page[page.index("## Any agent that speaks ACP"):]
    block = section[section.index("```toml\n") + 8 : section.index("```\n", section.index("```toml\n"))]
    bin_dir = short_tmp / "bin"  # the agents' binaries, as an install would put them on PATH
    bin_dir.mkdir()
    for name in ("gemini", "my-agent"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    config = parse_config({**tomllib.loads(block), "defaults": {"agent": "gemini-acp"}}, base=short_tmp)
    gemini, other = config.agents["gemini-acp"], config.agents["any-acp"]
    assert gemini.command == ("gemini",) and gemini.options["preset"] == "gemini"
    assert other.command == ("my-agent", "--acp")


async def test_an_agent_a_turn_has_taken_is_not_closed_as_idle_before_its_prompt(short_tmp: Path) -> None:
    """A turn that took the agent (just started, or idle and due) and is slow to prompt it (a
    busy machine) keeps it: the idle watch closed it under the turn, whose prompt then failed."""
    arrived, go = trio.Event(), trio.Event()

    async def preparing(channel: str, turn_id: str) -> None:
        arrived.set()
        await go.wait()

    config = make_config(short_tmp, {"acp": fake(short_tmp, acp_idle_timeout=0.3)})
    async with open_supervisor(config, hooks=Hooks(preparing=preparing)) as sup:
        accepted = await sup.send("c", "[[say:still here]]")
        with trio.fail_after(BOUND):
            await arrived.wait()
        agent = sup._lanes.acp._agents[("c", "acp")]
        # Parked past the moment the idle watch would close it, and the watch given its turn.
        await trio.sleep_until(agent.last_used + 0.3 + 0.2)
        await trio.testing.wait_all_tasks_blocked()
        assert sup._lanes.acp._agents.get(("c", "acp")) is agent and not agent.dead
        go.set()
        with trio.fail_after(BOUND):
            assert await sup.wait_idle("c")
        entries = [(e.kind, e.text) for e in await sup.entries("c", after=accepted.seq)]
        assert entries[-1] == ("message", "still here (earlier: 0)"), entries
        # Released with the turn's end: idle from then on, and closed as such.
        with trio.fail_after(BOUND):
            await sup._lanes.acp._gone[("c", "acp")].wait()


async def test_a_stop_before_the_point_of_no_return_sends_no_prompt(short_tmp: Path) -> None:
    arrived, go = trio.Event(), trio.Event()

    async def preparing(channel: str, turn_id: str) -> None:
        arrived.set()
        with trio.CancelScope(shield=True):  # parked past the stop: the ledger must refuse
            await go.wait()

    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config, hooks=Hooks(preparing=preparing)) as sup:
        await sup.send("c", "[[say:must not run]] half prepared")
        with trio.fail_after(BOUND):
            await arrived.wait()
        results = []
        async with trio.open_nursery() as nursery:

            async def stop() -> None:
                results.append(await sup.stop("c"))

            nursery.start_soon(stop)
            await trio.testing.wait_all_tasks_blocked()
            go.set()
        assert results[0].ok and results[0].stopped_turns and results[0].ended is None, results
        entries = [(e.kind, e.text) for e in await sup.entries("c")]
    assert entries == [("message", "[[say:must not run]] half prepared"), ("notice", "Execution stopped by user.")]
    histories = list((short_tmp / "fake-state").glob("*.json"))
    assert histories == [], "the agent never saw the prompt"


async def test_the_stop_of_one_channel_leaves_the_other_channels_agent_alone(short_tmp: Path) -> None:
    tool = write_tool_script(short_tmp)
    pid_file = short_tmp / "tool.pid"
    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config) as sup:
        await turn(sup, "b", "[[say:here]]")
        other = agent_pid(sup, "b")
        await sup.send("a", f"[[tool:sh {tool} {pid_file}]]")
        child = await wait_file(pid_file)
        with trio.fail_after(BOUND):
            result = await sup.stop("a")
        assert result.ok and not alive(child) and other not in result.killed and alive(other)
        after = await turn(sup, "b", "[[say:still]]")
        assert agent_pid(sup, "b") == other
    assert after[-1] == ("message", "still (earlier: 1)")


def test_after_kill_9_the_restart_kills_the_orphaned_agent_and_loads_its_session(short_tmp: Path) -> None:
    table = fake(short_tmp)
    # Without this the fake ends at its stdin's EOF, racing the check that it was orphaned.
    table["env"]["FAKE_ACP_LINGER"] = "1"
    text = (
        '[server]\nsocket = "corral.sock"\n[store]\npath = "corral.db"\n[agents.acp]\n'
        + "".join(f"{key} = {toml_value(value)}\n" for key, value in table.items())
    )
    tool = write_tool_script(short_tmp)
    pid_file = short_tmp / "tool.pid"
    daemon = DaemonProcess(short_tmp, text)
    restarted = None
    try:
        assert daemon.cli("send", "c", "[[say:one]]").returncode == 0
        assert daemon.cli("wait", "c", "--timeout", str(BOUND)).returncode == 0
        assert daemon.cli("send", "c", f"[[tool:sh {tool} {pid_file}]]").returncode == 0
        deadline = time.monotonic() + BOUND
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, "the tool did not start"
            time.sleep(0.02)  # a file another process writes: polled, within a bound
        status = json.loads(daemon.cli("--json", "status").stdout)
        agent = status["channels"]["c"]["turn"]["pid"]
        child = read_pid(pid_file)
        daemon.proc.kill()
        daemon.proc.wait()
        assert alive(agent) and alive(child)  # orphaned
        restarted = DaemonProcess(short_tmp, text)
        assert not alive(agent) and not alive(child), "ready means serving: the orphans are dead by then"
        assert restarted.cli("send", "c", "[[say:back]]").returncode == 0
        assert restarted.cli("wait", "c", "--timeout", str(BOUND)).returncode == 0
        last = json.loads(restarted.cli("tail", "c", "--json").stdout.splitlines()[-1])
        assert last["text"] == "back (earlier: 2)", "the fresh agent loaded the stored session"
    finally:
        if restarted is not None:
            assert restarted.stop() == 0
        daemon.stop()


async def test_a_stop_while_the_agent_restarts_kills_the_half_started_process(short_tmp: Path) -> None:
    hold = short_tmp / "hold-load"
    agent = fake(short_tmp)
    agent["env"] = {**agent["env"], "FAKE_ACP_HOLD_LOAD": str(hold)}
    config = make_config(short_tmp, {"acp": agent})
    async with open_supervisor(config) as sup:
        await turn(sup, "c", "[[say:one]]")
        running = sup._lanes.acp._agents.get(("c", "acp"))
        assert running is not None
        first = running.pid
        await sup.send("c", "[[ignore-cancel]]")
        with trio.fail_after(BOUND):
            while not running.busy:
                await trio.sleep(0.01)  # the prompt reaches a real process
            assert (await sup.stop("c")).ended == "killed"
        hold.touch()  # the restart's session/load now hangs
        await sup.send("c", "[[say:never]]")
        with trio.fail_after(BOUND):
            while running.pid == first:
                await trio.sleep(0.01)  # a real process is being started
            half = running.pid
            result = await sup.stop("c")
        assert result.ok and result.stopped_turns, result
        assert not alive(half), "the half-started agent does not outlive the stop"
        hold.unlink()
        after = await turn(sup, "c", "[[say:back]]")
    assert after[-1] == ("message", "back (earlier: 2)"), after


async def test_a_stale_session_is_retried_as_an_acp_turn_without_it(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stale-session retry builds the turn the agent's adapter runs (a persistent agent's
    prompt), not a per-turn CLI's process turn, which has no parser for an ACP agent."""
    from supervisor.turns.acp import AcpTurn

    runs: list[str | None] = []
    real_run = AcpTurn.run

    async def run(self: AcpTurn, session_id: str | None) -> Any:
        runs.append(session_id)
        outcome = await real_run(self, session_id)
        if len(runs) == 2:  # the second message's first try: the agent says its session is gone
            outcome.stale_session = True
        return outcome

    monkeypatch.setattr(AcpTurn, "run", run)
    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config) as sup:
        await turn(sup, "c", "[[say:one]]")
        session = sup.session("c", "acp")
        assert session is not None
        again = await turn(sup, "c", "[[say:two]]")
    assert runs == [None, session, None], runs
    assert ("status", f"Session {session} is gone; starting a new conversation.") in again, again
    assert not [t for k, t in again if k == "error"], again
    assert again[-1][0] == "message" and again[-1][1].startswith("two"), again


async def test_an_acp_turn_that_says_more_than_max_output_is_ended(short_tmp: Path) -> None:
    """Issue 41.7: the output cap holds for an ACP turn too (its events' text is counted); a
    turn under it is stored whole (the positive control), in the same channel, to the same
    agent process: the capped prompt's answer had come in with the rest of its chunks unread,
    which the next prompt then read as its own (each turn showed the one before)."""
    config = make_config(short_tmp, {"acp": fake(short_tmp, max_output=300)})
    async with open_supervisor(config) as sup:
        long = await turn(sup, "c", "[[say:" + "y" * 1000 + "]]")
        short = await turn(sup, "c", "[[say:fine]]")
    ended = [t for _, t in long if "max_output" in t]
    assert ended and "300 bytes" in ended[0], long
    assert not [t for _, t in long if "y" * 1000 in t], "the rest of its output was not stored"
    assert any("fine" in t for _, t in short), short
    assert not [t for _, t in short if "y" in t or "max_output" in t], short

