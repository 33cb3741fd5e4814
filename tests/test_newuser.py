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
