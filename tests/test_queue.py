"""The queue in people's hands, end to end (contract line 21): seeing it, taking a message back,
moving one first, the depth policy — real processes, the real store, races parked at exact
points (a gate the agent blocks on, the ``took`` hook after a turn's take), no sleeps.

The agent is ``tests/test_stop_contract.py``'s script agent (``gate=FIFO`` holds its turn).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import make_config, script_agent
from test_stop_contract import (
    AGENT,
    FailCommits,
    gates,  # noqa: F401 - a fixture
    idle,
    is_ready,
    running,
    wait_entry,
)

from supervisor.core.queue import QueueEditRefused, QueueFull
from supervisor.host.supervisor import open_supervisor
from supervisor.store.store import StoreError


def answered(text: str) -> Any:
    return lambda e: e.kind == "message" and e.text == f"done: {text}"


async def test_contract_21_a_message_taken_back_never_runs_and_a_stop_after_it_drops_only_the_rest(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"first gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        one = await sup.send("ch", "one", author="human:alice")
        two = await sup.send("ch", "two")
        view = await sup.queue("ch")
        turn = spawned.calls[0].turn_id
        assert view["running"] == {"bot": turn} and view["depth"] == 2
        assert [(r["entry"], r["place"], r["author"], r["agent"]) for r in view["queued"]] == [
            (one.seq, 1, "human:alice", "bot"), (two.seq, 2, "human:user", "bot")]
        assert view["queued"][0]["why"] == f"behind the running turn {turn}"
        assert view["queued"][1]["why"] == f"behind seq {one.seq}"
        assert all(r["age"] is not None and r["age"] >= 0 for r in view["queued"])

        result = await sup.cancel("ch", one.seq, author="human:alice")
        assert (result.rows, result.agents, result.by) == ((one.seq,), ("bot",), "human:alice")
        assert [r["entry"] for r in (await sup.queue("ch"))["queued"]] == [two.seq]
        with pytest.raises(QueueEditRefused) as again:  # a second take-back finds nothing
            await sup.cancel("ch", one.seq)
        assert again.value.code == "not_queued"

        stopped = await sup.stop("ch")
        assert stopped.dropped == 1  # only "two": "one" was taken back, not dropped by the stop
        gate.open()
        await idle(sup, "ch")
        entries = await sup.entries("ch")
        assert await sup._store.load_queue("ch") == []  # nothing of either comes back after a restart
    record = next(e for e in entries if e.seq == result.record)
    assert record.text == f"seq {one.seq} taken back by alice" and record.meta["take_back"] == one.seq
    taken = next(e for e in entries if e.seq == one.seq)
    assert taken.meta["taken_back"] == result.record  # marked in the record's own transaction
    assert len(spawned.calls) == 1  # neither ever started a turn
    assert not any(answered("one")(e) for e in entries)


async def test_contract_21_a_take_back_that_races_the_turns_take_is_not_taken_back_and_names_the_stop(
    short_tmp: Path,
) -> None:
    parked, release = trio.Event(), trio.Event()

    async def took(channel: str, turn_id: str) -> None:
        parked.set()
        await release.wait()

    async with running(short_tmp, took=took) as (sup, spawned):
        accepted = await sup.send("ch", "run me")
        with trio.fail_after(20):
            await parked.wait()  # the worker took it off the queue; the turn has not spawned
        with pytest.raises(QueueEditRefused) as refused:
            await sup.cancel("ch", accepted.seq)
        assert refused.value.code == "running" and "corral stop ch" in str(refused.value)
        (turn,) = sup._ledger.current_turns("ch").values()
        assert refused.value.running == (("bot", turn),)
        with pytest.raises(QueueEditRefused):
            await sup.move_first("ch", accepted.seq)
        release.set()
        await wait_entry(sup, "ch", answered("run me"))  # it runs: it was not taken back
        await idle(sup, "ch")


async def test_contract_21_a_message_moved_first_runs_next_its_order_is_stored_and_a_failed_record_undoes_it(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    faults = FailCommits()
    async with running(short_tmp) as (sup, spawned):
        faults.install(sup)
        await sup.send("ch", f"first gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        a, b, c = [await sup.send("ch", word) for word in ("a", "b", "c")]
        faults.arm()
        with pytest.raises(StoreError):  # the record could not be stored: nothing is edited
            await sup.cancel("ch", b.seq)
        assert [r["entry"] for r in (await sup.queue("ch"))["queued"]] == [a.seq, b.seq, c.seq]
        moved = await sup.move_first("ch", c.seq, author="human:bob")
        assert moved.action == "move_first"
        assert [r["entry"] for r in (await sup.queue("ch"))["queued"]] == [c.seq, a.seq, b.seq]
        await sup.flush()
        # What a restart queues again, in this order.
        assert [row.seq for row in await sup._store.load_queue("ch")] == [c.seq, a.seq, b.seq]
        gate.open()
        await idle(sup, "ch")
        entries = await sup.entries("ch")
    done = [e.text for e in entries if e.kind == "message" and e.text.startswith("done: ")]
    assert done[1:] == ["done: c", "done: a", "done: b"]
    assert any(e.text == f"seq {c.seq} moved first by bob" for e in entries)


async def test_a_full_channel_refuses_with_its_depth_or_drops_its_oldest_and_says_so(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    config = make_config(short_tmp, {"bot": script_agent(AGENT)}, max_queued=1)
    async with open_supervisor(config) as sup:
        await sup.send("ch", f"first gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        one = await sup.send("ch", "one")
        with pytest.raises(QueueFull) as full:
            await sup.send("ch", "two")
        assert (full.value.depth, full.value.limit) == (1, 1) and "max_queued = 1" in str(full.value)
        assert [r["entry"] for r in (await sup.queue("ch"))["queued"]] == [one.seq]
        # The same limit, dropping the oldest instead: one waits, "one" made way for "three".
        sup.config = make_config(short_tmp, {"bot": script_agent(AGENT)}, max_queued=1, when_full="drop_oldest")
        three = await sup.send("ch", "three")
        assert three.dropped == (one.seq,)
        assert [r["entry"] for r in (await sup.queue("ch"))["queued"]] == [three.seq]
        await sup.stop("ch")
        gate.open()
        await idle(sup, "ch")
        entries = await sup.entries("ch")
    said = next(e for e in entries if e.meta.get("take_back") == one.seq)
    assert said.text.startswith(f"seq {one.seq} dropped: channel 'ch' was full (max_queued = 1")
    assert next(e for e in entries if e.seq == one.seq).meta["taken_back"] == said.seq


async def test_a_queue_edits_record_commits_with_the_edit_and_a_key_expires_on_both_engines(store_at: str) -> None:
    from supervisor.core.queue import idempotency_origin
    from supervisor.store.store import Store, open_store

    async with open_store(store_at) as store:
        rows = [await store.accept_message("c", "x", "human:a", t, generation=0, nudge=False).committed()
                for t in ("one", "two", "three")]
        one, two, three = (r.seq for r in rows if r is not None)
        moved = store.submit_queue_edit("c", "move_first", three, [three], "moved", by="human:a", generation=0)
        await moved.committed()
        assert [r.seq for r in await store.load_queue("c")] == [three, one, two]
        record = await store.submit_queue_edit("c", "take_back", one, [one], "taken", by="human:a",
                                               generation=0).committed()
        assert record is not None and [r.seq for r in await store.load_queue("c")] == [three, two]
        assert (await store.entry(one)).meta["taken_back"] == record.seq  # type: ignore[union-attr]
        # A catch-up leaves out what was taken back and what still waits for the agent.
        assert await store.missed("c", "x", after=None, before=three + 100, skip=None, limit=10) == ([], 0)
        # An idempotency key's origin: found with its time; an expired one makes way in the new message's write.
        origin = idempotency_origin("human:a", "k")
        first = await store.accept_message("c", None, "human:a", "keyed", generation=0, nudge=False,
                                           origin=origin).committed()
        found = await store.origin_at(origin)
        assert first is not None and found is not None and found[0] == first.seq
        renewed = await store.accept_message("c", None, "human:a", "keyed", generation=0, nudge=False, origin=origin,
                                             also=lambda db, _: Store.forget_origin(db, origin)).committed()
        assert renewed is not None and (await store.origin_at(origin))[0] == renewed.seq  # type: ignore[index]
