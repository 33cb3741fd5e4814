"""Aider under the supervisor, with tests/fakes/fake_aider.py standing in for the real CLI.

The real aider needs a model API and many megabytes of dependencies; the fake follows its
documented flags (``--message``, ``--chat-history-file``, ``--restore-chat-history``, …)
and keeps its conversation in aider's markdown history file.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import trio

from conftest import make_config
from supervisor import open_supervisor

FAKE_AIDER = Path(__file__).parent / "fakes" / "fake_aider.py"


def _agent(pid_file: Path) -> dict:
    return {"adapter": "aider", "command": [str(FAKE_AIDER)], "env": {"FAKE_AIDER_PID_FILE": str(pid_file)}}


async def test_aider_resumes_its_chat_history_and_stops_its_shell(short_tmp: Path) -> None:
    pid_file = short_tmp / "shell.pid"
    config = make_config(short_tmp, {"aider": _agent(pid_file)}, stop_grace=2)
    async with open_supervisor(config) as sup:
        first = await sup.send("c", "[[say:first reply]] hello")
        with trio.fail_after(60):
            await sup.wait_idle("c")
        session, cwd = sup.store.session("c", "aider")
        assert session and (Path(cwd) / session).exists(), "the chat history file is the session"
        second = await sup.send("c", "and again")
        with trio.fail_after(60):
            await sup.wait_idle("c")
        replies = [e.text for e in await sup.entries("c", after=second.seq) if e.kind == "message"]
        assert any("earlier user messages: 1" in r for r in replies), replies
        assert sup.store.session("c", "aider")[0] == session

        await sup.send("c", "[[shell:sleep 300]] run it")
        with trio.fail_after(60):
            while not pid_file.exists() or not pid_file.read_text().strip():
                await trio.sleep(0.02)  # waiting for the fake's shell to exist, an outside event
        shell_pid = int(pid_file.read_text().split()[-1])
        assert psutil.pid_exists(shell_pid)
        result = await sup.stop("c")
        assert result.ok and shell_pid in result.swept, result
        assert not psutil.pid_exists(shell_pid) or psutil.Process(shell_pid).status() == psutil.STATUS_ZOMBIE
        entries = await sup.entries("c", after=first.seq)
        assert entries[-1].kind == "notice"
