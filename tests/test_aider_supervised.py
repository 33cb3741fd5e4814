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
from supervisor.testing import read_pid

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
        session, cwd = sup._store.session("c", "aider")
        assert session and (Path(cwd) / session).exists(), "the chat history file is the session"
        second = await sup.send("c", "and again")
        with trio.fail_after(60):
            await sup.wait_idle("c")
        replies = [e.text for e in await sup.entries("c", after=second.seq) if e.kind == "message"]
        assert any("earlier user messages: 1" in r for r in replies), replies
        assert sup._store.session("c", "aider")[0] == session

        await sup.send("c", "[[shell:sleep 300]] run it")
        with trio.fail_after(60):
            while not pid_file.exists() or not pid_file.read_text().strip():
                await trio.sleep(0.02)  # waiting for the fake's shell to exist, an outside event
        shell_pid = read_pid(pid_file)
        with trio.fail_after(60):
            while not (tree := _shell_tree(shell_pid)):
                await trio.sleep(0.02)  # waiting for sh to run its command, an outside event
        result = await sup.stop("c")
        # The contract: nothing of the turn is alive when the stop returns. The shell runs in a
        # new session, which only the sweep reaches; which of its processes the sweep hits
        # first is a race (sh exits on its own once its child dies), so the proof is that the
        # sweep hit that session and that every process of it is gone, killed or exited.
        assert result.ok, result
        assert set(result.swept) & tree, (result, tree)
        alive = [pid for pid in tree if _alive(pid)]
        assert not alive, (alive, result)
        entries = await sup.entries("c", after=first.seq)
        assert entries[-1].kind == "notice"


def _shell_tree(shell_pid: int) -> set[int]:
    """The shell and its descendants, once it runs its command (empty before that)."""
    try:
        shell = psutil.Process(shell_pid)
        tree = {shell_pid} | {c.pid for c in shell.children(recursive=True)}
        runs_it = len(tree) > 1 or "sleep" in " ".join(shell.cmdline()[:1])
    except psutil.Error:
        return set()
    return tree if runs_it else set()


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
