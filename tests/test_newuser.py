"""What a new user hit (issue 25), in-process: errors that name their path, starting a
channel over (reset), sending again what a stop dropped (resend)."""

from __future__ import annotations

import os
from pathlib import Path

import trio
from conftest import make_config

from supervisor import open_supervisor


async def test_a_program_gone_since_the_check_is_named_with_its_path(short_tmp: Path) -> None:
    program = short_tmp / "bin" / "mybot"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\necho hi\n")
    program.chmod(0o755)
    config = make_config(short_tmp, {"mybot": {"adapter": "generic", "command": [str(program)]}})
    os.unlink(program)  # after the config was checked: the spawn fails
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "hello")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        errors = [e.text for e in await sup.entries("c", after=accepted.seq) if e.kind == "error"]
    assert errors, "the failed start is an error entry"
    assert str(program) in errors[0] and "could not start mybot" in errors[0], errors
    assert "[agents.mybot]" in errors[0], errors


async def test_the_interrupted_turn_entry_says_a_kept_plan_will_be_nudged(tmp_path: Path) -> None:
    """After kill -9 the plan is kept and nudged (a crash is not a stop): the entry says so."""
    from supervisor.procs.recovery import RESTART_NOTICE, recover
    from supervisor.store.store import open_store

    plan = [{"content": "a", "status": "completed"}, {"content": "b", "status": "in_progress"},
            {"content": "c", "status": "pending"}]
    async with open_store(str(tmp_path / "c.db")) as store:
        first = store.accept_message("c", "bot", "human:u", "go", generation=0, nudge=False)
        quiet = store.accept_message("d", "bot", "human:u", "go", generation=0, nudge=False)
        await first.committed()
        await quiet.committed()
        assert first.entry is not None and quiet.entry is not None
        await store.begin_turn("t1", "c", "bot", 0, first.entry.seq).committed()
        await store.begin_turn("t2", "d", "bot", 0, quiet.entry.seq).committed()
        await store.save_todos("c", "bot", plan).committed()
    async with open_store(str(tmp_path / "c.db")) as store:  # the restart after the crash
        report = await recover(store, 0.1, "Stopped.")
        assert sorted(report.turns) == ["t1", "t2"]
        [with_plan] = [e for e in await store.entries("c") if e.turn == "t1" and e.kind == "notice"]
        [without] = [e for e in await store.entries("d") if e.turn == "t2" and e.kind == "notice"]
    assert with_plan.text.startswith(RESTART_NOTICE)
    assert "2 unfinished task(s) are kept" in with_plan.text and "reminds" in with_plan.text, with_plan.text
    assert without.text == RESTART_NOTICE, "no plan, nothing more to say"
