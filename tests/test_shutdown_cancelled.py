"""Shutdown when the block of ``open_supervisor`` is cancelled from outside.

An embedding program wraps the block in a ``move_on_after`` or gets a Ctrl-C: the same
outer scope cancels the supervisor's tasks and the store's writer. The shutdown (shielded)
must still end the running turn, store its notice, and return.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio
from conftest import make_config, script_agent, turn_processes
from test_stop_contract import AGENT, SLOW, Gate, send_and_wait_ready

from supervisor import SHUTDOWN_NOTICE
from supervisor.host.supervisor import open_supervisor
from supervisor.store.store import Store


async def test_cancelling_the_block_from_outside_completes_the_shutdown(short_tmp: Path) -> None:
    gate = Gate(short_tmp / "gate")
    config = make_config(short_tmp, {"bot": script_agent(AGENT)})
    turn_id = ""
    finished = trio.Event()
    stuck = False

    async def watchdog(store: Store) -> None:
        # The bug parks the shielded shutdown on a commit nobody makes: a deadline cannot
        # cancel it, so on expiry fail what is pending (the shutdown then returns) and say so.
        nonlocal stuck
        with trio.move_on_after(SLOW):
            await finished.wait()
            return
        stuck = True
        writer = store._writer
        writer.fail(writer.pending + ([writer.last] if writer.last else []), RuntimeError("the writer is gone"))

    try:
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as outer:
                async with open_supervisor(config) as sup:
                    nursery.start_soon(watchdog, sup._store)
                    await send_and_wait_ready(sup, "ch", f"gate={gate}")
                    turn_id = sup._lanes.turns["ch", "bot"].turn_id
                    outer.cancel()  # what a move_on_after or a Ctrl-C does
                    await trio.sleep_forever()
            finished.set()
        assert outer.cancelled_caught
        assert not stuck, "the shutdown waited forever on a store whose writer was cancelled"
    finally:
        gate.close()
    db = sqlite3.connect(f"file:{short_tmp / 'corral.db'}?mode=ro", uri=True)
    try:
        last = db.execute(
            "SELECT kind, text, turn FROM entries WHERE channel = 'ch' ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        state = db.execute("SELECT state FROM turns WHERE id = ?", (turn_id,)).fetchone()
    finally:
        db.close()
    assert last == ("notice", SHUTDOWN_NOTICE, turn_id)
    assert state == ("ended",)
    assert not turn_processes([turn_id])
