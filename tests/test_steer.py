"""Steering a running turn through ``Supervisor.send(..., delivery="steer")`` (contract line 19),
end to end with the bundled demo agent (it takes steered messages while its long tool runs; one
that says "enough" ends the tool), real processes and the real store; races parked at exact
points (the turn's teardown held on an event), no sleeps."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import make_config, turn_processes

from supervisor.host.supervisor import Supervisor, open_supervisor
from supervisor.procs.stdin import CLOSED
from supervisor.store.store import Entry
from supervisor.turns.process import Turn

SLOW = 30.0


async def wait_entry(sup: Supervisor, channel: str, match: Callable[[Entry], bool]) -> Entry:
    with trio.fail_after(SLOW):
        async with aclosing(sup.follow(channel)) as entries:  # type: ignore[type-var]
            async for entry in entries:
                if match(entry):
                    return entry
    raise AssertionError("the follow ended")


def tool_running(agent: str = "demo") -> Callable[[Entry], bool]:
    return lambda e: e.kind == "status" and e.text.startswith("tool running") and e.author == f"agent:{agent}"


async def idle(sup: Supervisor, channel: str) -> None:
    assert await sup.wait_idle(channel, timeout=SLOW), f"channel {channel!r} did not become idle"


async def test_contract_19_a_steer_reaches_the_running_turn_and_is_stored_as_its_human_message(
    short_tmp: Path,
) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        await sup.send("c", "long 600")
        await wait_entry(sup, "c", tool_running())
        turn = sup._lanes.turns["c", "demo"]
        accepted = await sup.send("c", "that is enough, and mention the otter", delivery="steer")
        assert accepted.delivery == "steer" and accepted.steered == turn.turn_id and accepted.fallback is None
        await idle(sup, "c")
        entries = await sup.entries("c")
        steered = next(e for e in entries if e.seq == accepted.seq)
        assert steered.author == "human:user" and steered.kind == "message" and steered.turn == turn.turn_id
        assert steered.meta["steered"] == turn.turn_id and steered.meta["delivery"] == "steer"
        reply = [e for e in entries if e.turn == turn.turn_id and e.kind == "message" and e.author == "agent:demo"]
        assert "You also said: that is enough, and mention the otter" in reply[-1].text
        assert not sup._ledger.queued("c")  # it was never queued
        # The agent's next turn does not catch up on what it was handed mid-turn.
        after = await sup.send("c", "and now?")
        await idle(sup, "c")
        answers = [e for e in await sup.entries("c", after=after.seq) if e.kind == "message"]
    assert answers and not any("caught up on" in e.text for e in answers), [e.text for e in answers]


async def test_contract_19_a_steer_that_races_the_turns_end_is_queued_and_runs_next(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        await sup.send("c", "long 600")
        await wait_entry(sup, "c", tool_running())
        turn = sup._lanes.turns["c", "demo"]
        assert isinstance(turn, Turn)
        # Park the turn in its teardown: its result read (its input closed), not yet ended.
        arrived, go = trio.Event(), trio.Event()
        end = turn._end

        async def parked_end() -> None:
            arrived.set()
            with trio.fail_after(SLOW):
                await go.wait()
            await end()

        turn._end = parked_end  # type: ignore[method-assign]
        assert await turn.steer("enough") is None  # ends the tool: the turn finishes
        with trio.fail_after(SLOW):
            await arrived.wait()
        assert turn._input is not None and turn._input.closed
        assert sup._ledger.current_turn("c", "demo") == turn.turn_id  # still the lane's turn
        accepted = await sup.send("c", "one more thing", delivery="steer")
        assert accepted.delivery == "queue" and accepted.fallback == CLOSED and accepted.steered is None
        status = await wait_entry(sup, "c", lambda e: e.kind == "status" and e.text.startswith("Not steered"))
        assert str(accepted.seq) in status.text
        go.set()
        answer = await wait_entry(sup, "c", lambda e: e.kind == "message" and "You said: one more thing" in e.text)
        await idle(sup, "c")
    assert answer.turn != turn.turn_id  # a turn of its own, after the one it raced


@pytest.mark.usefixtures("kill_mechanism")
async def test_contract_19_a_steer_in_a_channel_of_two_agents_goes_only_to_the_addressed_agents_turn(
    short_tmp: Path,
) -> None:
    demo: dict[str, Any] = {"adapter": "demo", "delay": 0.01}
    config = make_config(short_tmp, {"alice": dict(demo), "bob": dict(demo)}, agent="alice")
    async with open_supervisor(config) as sup:
        await sup.send("c", "long 600", agent="alice")
        await sup.send("c", "long 600", agent="bob")
        await wait_entry(sup, "c", tool_running("alice"))
        await wait_entry(sup, "c", tool_running("bob"))
        turns = sup._ledger.current_turns("c")
        accepted = await sup.send("c", "@bob mention the heron", delivery="steer")
        assert accepted.steered == turns["bob"] and accepted.to == ("bob",)
        await wait_entry(sup, "c", lambda e: e.author == "agent:bob" and e.text.startswith("steered:"))
        # A stop after a steer stops the turn as any stop does: both agents' turns, nothing left.
        with trio.fail_after(SLOW):
            result = await sup.stop("c")
        assert result.ok and sorted(result.stopped_turns) == sorted(turns.values())
        assert turn_processes(result.stopped_turns) == []
        entries = await sup.entries("c")
    assert not [e for e in entries if e.author == "agent:alice" and "heron" in e.text]
    assert entries[-1].kind == "notice"


async def test_contract_19_a_steer_to_several_agents_is_queued_for_each_and_says_why(short_tmp: Path) -> None:
    demo: dict[str, Any] = {"adapter": "demo", "delay": 0.01}
    config = make_config(short_tmp, {"alice": dict(demo), "bob": dict(demo)}, agent="alice")
    async with open_supervisor(config) as sup:
        await sup.send("c", "long 600", agent="alice")
        await wait_entry(sup, "c", tool_running("alice"))
        accepted = await sup.send("c", "@alice @bob both of you", delivery="steer")
        assert accepted.delivery == "queue" and accepted.fallback == "a message to several agents is queued for each"
        await sup.stop("c")
