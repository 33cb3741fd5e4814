"""Interrupting and steering a busy agent, end to end (contract line 19): real processes, the
real store, races parked at exact points (gates the agent blocks on), no sleeps.

The agent is ``tests/test_stop_contract.py``'s script agent (words of its prompt steer it:
``child``, ``setsid``, ``gate=FIFO``, ``windup=FIFO``, ``todos`` …), in a channel of one agent
(``bot``) or of two (``alice``, ``bob``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import make_config, script_agent, turn_processes
from test_stop_contract import (
    AGENT,
    SLOW,
    FailCommits,
    SpawnRecorder,
    alive,
    gates,  # noqa: F401 - a fixture
    idle,
    is_ready,
    running,
    wait_entry,
    wait_reported,
)

from supervisor.core.errors import UsageError
from supervisor.core.results import INTERRUPT_NOTICE, STOP_NOTICE
from supervisor.host.supervisor import Supervisor, open_supervisor
from supervisor.store.store import Entry, StoreError
from supervisor.testing import Hooks

pytestmark = pytest.mark.usefixtures("kill_mechanism")


@asynccontextmanager
async def two_agents(folder: Path) -> AsyncIterator[tuple[Supervisor, SpawnRecorder]]:
    """A channel ``ch`` of two script agents, alice (its default) and bob."""
    recorder = SpawnRecorder()
    config = make_config(folder, {"alice": script_agent(AGENT), "bob": script_agent(AGENT)}, agent="alice")
    async with open_supervisor(config, hooks=Hooks(spawn=recorder)) as sup:
        yield sup, recorder


def of_turn(entries: list[Entry], turn_id: str) -> list[Entry]:
    return [e for e in entries if e.turn == turn_id]


def answered(text: str) -> Any:
    return lambda e: e.kind == "message" and e.text == f"done: {text}"


async def running_rows(sup: Supervisor) -> list[str]:
    """The turns the store still holds as ``running``: what the next start would recover as
    interrupted by a crash (every turn whose notice is stored must be ended, whoever ended it)."""
    await sup._store.flush()  # (the writes submitted so far, committed: a turn's end is not awaited)
    return [turn_id for turn_id, *_ in (await sup._store.unfinished())[0]]


async def test_contract_19_an_interrupt_ends_the_turn_and_its_tree_and_runs_the_message_next(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"whoami child setsid todos gate={gate}")
        agent_pid = await wait_reported(sup, "ch", "pid")
        child = await wait_reported(sup, "ch", "child")
        escaped = await wait_reported(sup, "ch", "setsid")
        await wait_entry(sup, "ch", is_ready)
        queued = await sup.send("ch", "queued before the interrupt")
        first = spawned.calls[0].turn_id

        accepted = await sup.send("ch", "instead", delivery="interrupt")
        assert accepted.delivery == "interrupt" and accepted.interrupted == (first,)
        assert accepted.dropped == (queued.seq,)

        notice = await wait_entry(sup, "ch", lambda e: e.kind == "notice")
        # When the notice is stored, nothing of the interrupted turn is alive, and its row is
        # ended (in the notice's own transaction: a restart must not take it for a crash's).
        assert not any(alive(pid) for pid in (agent_pid, child, escaped))
        assert not turn_processes([first])
        assert first not in await running_rows(sup)
        answer = await wait_entry(sup, "ch", answered("instead"))
        await idle(sup, "ch")
        entries = await sup.entries("ch")
        assert await running_rows(sup) == []
    assert notice.text == f"{INTERRUPT_NOTICE} 1 queued message was not run."
    assert notice.turn == first and notice.meta["interrupted_by"] == accepted.seq
    assert agent_pid in notice.meta["killed"]
    assert notice.meta["dropped_entries"] == [queued.seq]
    # Nothing of the interrupted turn after its notice; the new turn's all after it.
    assert all(e.seq < notice.seq for e in of_turn(entries, first) if e is not notice and e.seq != notice.seq)
    second = answer.turn
    assert second is not None and second != first
    assert all(e.seq > notice.seq for e in of_turn(entries, second))
    # The queued message never ran, and is marked dropped; the plan is cancelled.
    assert not any(e.text == "done: queued before the interrupt" for e in entries)
    dropped = next(e for e in entries if e.seq == queued.seq)
    assert dropped.meta.get("dropped_by_stop") == accepted.seq
    # ... by an interrupt, and said so (not "dropped by a stop").
    assert dropped.meta.get("dropped_by_interrupt") == accepted.seq
    from supervisor.cli import format_entry
    assert f"(not run: dropped by an interrupt (message {accepted.seq});" in format_entry(dropped.to_json())
    assert [i["status"] for i in sup.todos("ch", "bot")] == ["completed", "cancelled", "cancelled"]
    # The cancelled plan is said in the transcript, as a stop says it, just before the notice:
    # no room or page keeps the plan shown as live.
    (plan,) = [e for e in entries if e.kind == "todos" and e.text.startswith("Plan cancelled")]
    assert plan.text == "Plan cancelled (bot)." and entries[entries.index(notice) - 1] == plan
    assert [i["status"] for i in plan.meta["todos"]] == ["completed", "cancelled", "cancelled"]
    assert [c.turn_id for c in spawned.calls][:2] == [first, second]
    # Only one notice: the interrupt's (no stop happened).
    assert [e.text for e in entries if e.kind == "notice"] == [notice.text]


async def test_contract_19_two_interrupts_in_a_row_the_second_interrupts_the_firsts_turn(
    short_tmp: Path, gates: Any
) -> None:
    gate, second_gate = gates(), gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        one = await sup.send("ch", f"one gate={second_gate}", delivery="interrupt")
        first = spawned.calls[0].turn_id
        await wait_entry(sup, "ch", lambda e: is_ready(e) and e.turn != first)
        two = await sup.send("ch", "two", delivery="interrupt")
        assert len(two.interrupted) == 1 and two.interrupted != one.interrupted
        await wait_entry(sup, "ch", answered("two"))
        await idle(sup, "ch")
        entries = await sup.entries("ch")
        assert await running_rows(sup) == []
    notices = [e for e in entries if e.kind == "notice"]
    assert [n.turn for n in notices] == [one.interrupted[0], two.interrupted[0]]
    for notice in notices:
        assert all(e.seq <= notice.seq for e in of_turn(entries, notice.turn or ""))
    assert not any(e.text.startswith("done: one") for e in entries)


async def test_contract_19_a_second_interrupt_before_the_first_runs_drops_the_firsts_message(
    short_tmp: Path, gates: Any
) -> None:
    gate, windup = gates(), gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"windup={windup} gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        one = await sup.send("ch", "one", delivery="interrupt")  # the turn winds down, parked on its gate
        two = await sup.send("ch", "two", delivery="interrupt")
        assert two.interrupted == () and two.dropped == (one.seq,)
        windup.open()
        await wait_entry(sup, "ch", answered("two"))
        await idle(sup, "ch")
        entries = await sup.entries("ch")
        assert await running_rows(sup) == []
    assert len(spawned.calls) == 2
    assert not any(e.text == "done: one" for e in entries)
    assert [e.turn for e in entries if e.kind == "notice"] == [spawned.calls[0].turn_id]


async def test_contract_19_an_interrupt_while_a_stop_winds_the_turn_down_interrupts_nothing(
    short_tmp: Path, gates: Any
) -> None:
    gate, windup = gates(), gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"windup={windup} gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        async with trio.open_nursery() as nursery:
            stopped: list[Any] = []

            async def stop() -> None:
                stopped.append(await sup.stop("ch"))

            nursery.start_soon(stop)
            await trio.testing.wait_all_tasks_blocked()  # the stop has signalled; the turn winds down
            accepted = await sup.send("ch", "after the stop", delivery="interrupt")
            assert accepted.interrupted == () and accepted.dropped == ()
            windup.open()
        await wait_entry(sup, "ch", answered("after the stop"))
        await idle(sup, "ch")
        entries = await sup.entries("ch")
    assert stopped[0].ok and stopped[0].stopped_turns == [spawned.calls[0].turn_id]
    assert [e.text for e in entries if e.kind == "notice"] == [STOP_NOTICE]
    # The stop's notice is the stopped turn's last entry.
    notice = next(e for e in entries if e.kind == "notice")
    assert all(e.seq <= notice.seq for e in of_turn(entries, spawned.calls[0].turn_id))


async def test_contract_19_a_stop_while_an_interrupt_winds_the_turn_down_drops_its_message_too(
    short_tmp: Path, gates: Any
) -> None:
    gate, windup = gates(), gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"windup={windup} gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        interrupting = await sup.send("ch", "instead", delivery="interrupt")
        async with trio.open_nursery() as nursery:
            stopped: list[Any] = []

            async def stop() -> None:
                stopped.append(await sup.stop("ch"))

            nursery.start_soon(stop)
            await trio.testing.wait_all_tasks_blocked()
            windup.open()
        await idle(sup, "ch")
        entries = await sup.entries("ch")
        assert await running_rows(sup) == []
    result = stopped[0]
    assert result.ok and tuple(result.stopped_turns) == interrupting.interrupted and result.dropped == 1
    # One notice, the stop's, last; the interrupting message never ran.
    assert [e.text for e in entries if e.kind == "notice"] == [f"{STOP_NOTICE} 1 queued message was not run."]
    assert entries[-1].kind == "notice"
    assert len(spawned.calls) == 1


async def test_contract_19_an_interrupt_in_a_channel_of_two_agents_ends_only_the_addressed_agents_turn(
    short_tmp: Path, gates: Any
) -> None:
    gate_a, gate_b = gates(), gates()
    async with two_agents(short_tmp) as (sup, spawned):
        await sup.send("ch", f"whoami gate={gate_a}", agent="alice")
        await sup.send("ch", f"whoami gate={gate_b}", agent="bob")
        await wait_entry(sup, "ch", lambda e: is_ready(e) and e.author == "agent:alice")
        await wait_entry(sup, "ch", lambda e: is_ready(e) and e.author == "agent:bob")
        turns = sup._ledger.current_turns("ch")
        bob_leader = next(c.process for c in spawned.calls if c.turn_id == turns["bob"])
        accepted = await sup.send("ch", "@alice instead", delivery="interrupt")
        assert accepted.interrupted == (turns["alice"],) and accepted.to == ("alice",)
        notice = await wait_entry(sup, "ch", lambda e: e.kind == "notice")
        assert notice.turn == turns["alice"]
        assert not turn_processes([turns["alice"]])
        # Bob's turn runs on, untouched.
        assert bob_leader.returncode is None and turn_processes([turns["bob"]])
        assert sup._ledger.current_turns("ch")["bob"] == turns["bob"]
        assert not sup._ledger.is_stale("ch", turns["bob"])
        gate_b.open()
        await wait_entry(sup, "ch", lambda e: e.author == "agent:bob" and e.text.startswith("done:"))
        gate_a.open()  # (alice's new prompt catches up on the channel, gates and all: either may be hers)
        gate_b.open()
        await wait_entry(
            sup, "ch", lambda e: e.author == "agent:alice" and e.kind == "message" and e.text.endswith("@alice instead")
        )
        await idle(sup, "ch")


async def test_contract_19_an_interrupt_of_an_idle_channel_runs_as_a_message(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, _):
        accepted = await sup.send("ch", "hello", delivery="interrupt")
        assert accepted.delivery == "interrupt" and accepted.interrupted == () and accepted.dropped == ()
        await wait_entry(sup, "ch", answered("hello"))
        await idle(sup, "ch")
        assert not [e for e in await sup.entries("ch") if e.kind == "notice"]


async def test_contract_19_an_interrupt_whose_record_cannot_be_stored_kills_nothing(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    faults = FailCommits()
    async with running(short_tmp) as (sup, spawned):
        faults.install(sup)
        await sup.send("ch", f"whoami gate={gate}")
        agent_pid = await wait_reported(sup, "ch", "pid")
        await wait_entry(sup, "ch", is_ready)
        queued = await sup.send("ch", "queued")
        faults.arm(1)
        with pytest.raises(StoreError):
            await sup.send("ch", "instead", delivery="interrupt")
        turn_id = spawned.calls[0].turn_id
        assert alive(agent_pid) and not sup._ledger.is_stale("ch", turn_id)
        assert [m.id for m in sup._ledger.queued("ch")][:1] == [queued.seq]
        gate.open()
        await wait_entry(sup, "ch", answered("queued"))
        await idle(sup, "ch")
        entries = await sup.entries("ch")
    assert not any(e.kind == "notice" for e in entries)
    assert not any(e.text == "done: instead" for e in entries)


async def test_only_a_human_may_interrupt_and_a_bad_delivery_is_refused(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, _):
        with pytest.raises(UsageError, match="did you mean 'interrupt'"):
            await sup.send("ch", "x", delivery="interupt")
        with pytest.raises(UsageError, match="only a human's message"):
            await sup.send("ch", "x", delivery="interrupt", author="system")


async def test_contract_19_a_steer_to_an_agent_that_cannot_take_one_is_queued_and_says_so(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, _):
        await sup.send("ch", f"gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        accepted = await sup.send("ch", "also this", delivery="steer")
        assert accepted.delivery == "queue" and accepted.steered is None
        assert accepted.fallback == "bot cannot take a message mid-turn"
        status = await wait_entry(sup, "ch", lambda e: e.kind == "status" and e.text.startswith("Not steered"))
        assert str(accepted.seq) in status.text
        gate.open()
        await wait_entry(sup, "ch", answered("also this"))
        await idle(sup, "ch")


async def test_contract_19_a_steer_to_an_idle_channel_runs_as_a_message(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, _):
        accepted = await sup.send("ch", "hello", delivery="steer")
        assert accepted.delivery == "queue" and accepted.fallback == "bot is not running a turn"
        await wait_entry(sup, "ch", answered("hello"))
        await idle(sup, "ch")
        assert not [e for e in await sup.entries("ch") if e.kind == "status" and e.text.startswith("Not steered")]


async def test_contract_19_an_interrupt_of_an_acp_turn_cancels_its_prompt_kills_its_tool_and_the_agent_serves_it(
    short_tmp: Path,
) -> None:
    from test_acp_turns import agent_pid, fake, wait_file

    from supervisor.testing import read_pid
    from scripts.fakemodel.rig import write_tool_script

    tool = write_tool_script(short_tmp)
    pid_file = short_tmp / "tool.pid"
    config = make_config(short_tmp, {"acp": fake(short_tmp)})
    async with open_supervisor(config) as sup:
        await sup.send("c", f"[[tool:sh {tool} {pid_file}]] [[say:never said]]")
        child = await wait_file(pid_file)
        grandchild = read_pid(Path(f"{pid_file}.setsid"))
        pid = agent_pid(sup, "c")
        accepted = await sup.send("c", "[[say:instead]]", delivery="interrupt")
        assert len(accepted.interrupted) == 1
        notice = await wait_entry(sup, "c", lambda e: e.kind == "notice")
        assert not alive(child) and not alive(grandchild), "the fake leaves its tool running: corral kills it"
        assert accepted.interrupted[0] not in await running_rows(sup)
        answer = await wait_entry(sup, "c", lambda e: e.kind == "message" and e.text.startswith("instead"))
        await idle(sup, "c")
        assert agent_pid(sup, "c") == pid  # the agent acknowledged its cancel: the same process serves on
        entries = await sup.entries("c")
    assert notice.text == INTERRUPT_NOTICE and notice.turn == accepted.interrupted[0]
    assert notice.seq < answer.seq
    assert not any("never said" in e.text for e in entries if e.author.startswith("agent:"))


async def test_contract_19_a_steer_into_an_acp_agent_that_queues_prompts_is_taken_into_the_running_turn(
    short_tmp: Path,
) -> None:
    from test_acp_turns import fake, wait_file

    from scripts.fakemodel.rig import write_tool_script

    tool = write_tool_script(short_tmp)
    pid_file = short_tmp / "tool.pid"
    table = fake(short_tmp)
    table["env"] = {**table["env"], "FAKE_ACP_QUEUEING": "1"}
    async with open_supervisor(make_config(short_tmp, {"acp": table})) as sup:
        await sup.send("c", f"[[tool:sh {tool} {pid_file}]] [[say:done]]")
        await wait_file(pid_file)
        turn = sup._ledger.current_turn("c")
        accepted = await sup.send("c", "that is enough", delivery="steer")
        assert accepted.delivery == "steer" and accepted.steered == turn
        await idle(sup, "c")
        entries = await sup.entries("c")
    said = [e.text for e in entries if e.kind == "message" and e.author == "agent:acp" and e.turn == turn]
    assert said[0].startswith("steered: that is enough") and "You also said: that is enough" in said[-1], said
    assert [e.kind for e in entries if e.turn == turn and e.kind in ("notice", "error")] == []


async def test_contract_19_a_stop_after_a_steer_into_an_acp_turn_cancels_both_prompts(short_tmp: Path) -> None:
    from test_acp_turns import agent_pid, fake, wait_file

    from scripts.fakemodel.rig import write_tool_script

    tool = write_tool_script(short_tmp)
    pid_file = short_tmp / "tool.pid"
    table = fake(short_tmp)
    table["env"] = {**table["env"], "FAKE_ACP_QUEUEING": "1"}
    async with open_supervisor(make_config(short_tmp, {"acp": table})) as sup:
        await sup.send("c", f"[[tool:sh {tool} {pid_file}]] [[say:never said]]")
        await wait_file(pid_file)
        pid = agent_pid(sup, "c")
        steered = await sup.send("c", "keep going", delivery="steer")
        assert steered.delivery == "steer"
        with trio.fail_after(SLOW):
            result = await sup.stop("c")
        assert result.ok and result.ended == "cancelled", result
        after = await sup.send("c", "[[say:next]]")
        answer = await wait_entry(sup, "c", lambda e: e.kind == "message" and e.text.startswith("next"))
        await idle(sup, "c")
        assert agent_pid(sup, "c") == pid
    assert answer.seq > after.seq  # the cancelled prompts' late answers ended nothing of the next turn


async def test_an_interrupted_turn_that_fails_before_its_notice_is_still_ended_on_the_record(
    short_tmp: Path, gates: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in corral between the interrupted turn's end and its notice (contained, said as an
    internal error) must not leave its row ``running`` for the next start to call a crash's."""
    from supervisor.host.lanes import Lanes

    def broken(*_: Any) -> None:
        raise RuntimeError("a bug before the notice")

    monkeypatch.setattr(Lanes, "_interrupted", broken)
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        accepted = await sup.send("ch", "instead", delivery="interrupt")
        await wait_entry(sup, "ch", lambda e: e.kind == "error" and "a bug before the notice" in e.text)
        await wait_entry(sup, "ch", answered("instead"))
        await idle(sup, "ch")
        assert accepted.interrupted == (spawned.calls[0].turn_id,)
        assert await running_rows(sup) == []
