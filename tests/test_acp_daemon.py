"""Real ACP agents as ``adapter = "acp"`` agents of a real `corral run` daemon, offline against
the fake model servers (gemini --acp, qwen --acp, claude-agent-acp, codex-acp, opencode acp, copilot, vibe,
kilo, kimi, fast-agent):

* a text turn stores its answer and the session id; a stop mid-tool kills the tool and its
  setsid grandchild before it returns (``ended``: the agent acknowledged the typed cancel), the
  notice is last, the agent process serves the next message, which resumes the conversation;
* then, in the same warm agent, a stop while the model stream is silent lands within the stop budget;
* a permission request of an attended agent is answered by the policy (rejected) and stored.

The agents are installed by scripts/install-clis.sh. A missing agent fails, never skips.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import DaemonProcess, turn_processes

from scripts._config import toml_value
from supervisor.testing import read_pid
from scripts.fakemodel._http import FakeModelServer
from scripts.fakemodel.acp_agents import ACP_AGENTS, daemon_table
from scripts.fakemodel.rig import write_tool_script

pytestmark = pytest.mark.realcli

STOP_GRACE = 3.0
#: Generous: the tests check that the agent acknowledges the cancel, not how fast a loaded
#: machine lets it (see tests/test_acp_realcli.py).
CANCEL_GRACE = 10.0
#: A stop returns within the cancel grace plus this (the kill, the notice).
STOP_MARGIN = 3.0


def config_text(table: dict[str, Any]) -> str:
    """Two agents on the same ACP command: ``cli`` (unattended) and ``strict`` (attended)."""
    lines = [
        '[server]\nsocket = "corral.sock"',
        '[store]\npath = "corral.db"',
        f'[defaults]\nagent = "cli"\nstop_grace = {STOP_GRACE}\nstall_timeout = 120\nturn_timeout = 300',
    ]
    for name, extra in (("cli", {}), ("strict", {"unattended": False})):
        lines.append(f"[agents.{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in {**table, **extra}.items()]
        lines.append(f"acp_cancel_grace = {CANCEL_GRACE}")
    return "\n".join(lines) + "\n"


class Rig:
    """A fake model server and a daemon running one real ACP agent against it."""

    def __init__(self, folder: Path, name: str) -> None:
        self.name = name
        self.folder = folder
        self.server: FakeModelServer = ACP_AGENTS[name].server().start()
        try:
            self.daemon = DaemonProcess(folder, config_text(daemon_table(name, self.server.url, folder)))
        except BaseException:
            self.server.stop()
            raise

    def close(self) -> None:
        try:
            assert self.daemon.stop() == 0, "".join(self.daemon.log[-30:])
        finally:
            self.server.stop()

    def json(self, *args: str) -> Any:
        out = self.daemon.cli(*args, "--json")
        assert out.returncode == 0, f"corral {' '.join(args)} failed: {out.stderr}"
        return json.loads(out.stdout)

    def entries(self, channel: str, after: int = 0) -> list[dict[str, Any]]:
        out = self.daemon.cli("tail", channel, "--after", str(after), "--json")
        return [json.loads(line) for line in out.stdout.splitlines()]

    def send_and_wait(self, channel: str, text: str, *args: str) -> list[dict[str, Any]]:
        seq = self.json("send", channel, text, *args)["seq"]
        wait = self.daemon.cli("wait", channel, "--timeout", "180")
        assert wait.returncode == 0, f"the turn did not end: {wait.stderr}"
        return self.entries(channel, after=seq - 1)

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 120) -> None:
        """Wait for something outside corral (a file, a model request) to happen."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def saw(self, words: str) -> bool:
        return any(words.encode() in r.raw for r in self.server.requests)


@pytest.fixture(params=sorted(ACP_AGENTS))
def rig(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[Rig]:
    rig = Rig(short_tmp, request.param)
    try:
        yield rig
    finally:
        rig.close()
    assert not turn_processes(), "shutdown closes every agent process"


def _messages(entries: list[dict[str, Any]], agent: str = "cli") -> list[str]:
    return [e["text"] for e in entries if e["author"] == f"agent:{agent}" and e["kind"] == "message"]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_text_then_stop_mid_tool_then_the_agent_resumes_then_a_stop_on_a_silent_stream(rig: Rig) -> None:
    first = rig.send_and_wait("work", "[[say:I will remember.]] Remember the word pelican.")
    assert "I will remember." in _messages(first), first
    assert not [e for e in first if e["kind"] == "error"], first
    session = rig.json("status")["channels"]["work"]["sessions"]["cli"]
    assert session
    script = write_tool_script(rig.folder)
    started = rig.folder / "tool.pid"
    seq = rig.json("send", "work", f"[[shell:sh {script} {started}]] [[say:never said]] Run the tool.")["seq"]
    rig.wait_for(lambda: started.exists() and started.read_text().strip() != "", "the tool to start")
    tool, setsid = read_pid(started), read_pid(Path(f"{started}.setsid"))
    agent = rig.json("status")["channels"]["work"]["turn"]["pid"]
    assert _alive(tool) and _alive(setsid) and _alive(agent)
    begun = time.monotonic()
    result = rig.json("stop", "work")
    elapsed = time.monotonic() - begun
    assert result["ok"] and result["stopped_turns"] and result["ended"] == "cancelled", result
    assert elapsed < CANCEL_GRACE + STOP_MARGIN, f"stop took {elapsed:.2f} s"
    assert not _alive(tool) and not _alive(setsid), result
    restarts = ACP_AGENTS[rig.name].restart_after_cancel
    assert _alive(agent) != restarts, "the agent process stays, unless its preset restarts it after a cancel"
    entries = rig.entries("work", after=seq - 1)
    assert entries[-1]["kind"] == "notice" and entries[-1]["seq"] == result["notice_seq"], entries
    assert not [e for e in entries if e["author"] != "human:user" and "never said" in e["text"]], entries
    before = len(rig.server.requests)
    after = rig.send_and_wait("work", "[[say:You said pelican.]] Which word?")
    assert "You said pelican." in _messages(after), after
    later = [r.raw.decode("utf-8", "replace") for r in rig.server.requests[before:]]
    assert any("pelican" in body.split("Which word")[0] for body in later), "the conversation went on"
    assert rig.json("status")["channels"]["work"]["sessions"]["cli"] == session
    # Then a stop on a silent stream, in the same (warm) agent: one cold start fewer a test.
    seq = rig.json("send", "work", "[[silent]] Think very hard.")["seq"]
    rig.wait_for(lambda: rig.saw("Think very hard."), "the model request")
    begun = time.monotonic()
    result = rig.json("stop", "work")
    elapsed = time.monotonic() - begun
    assert result["ok"] and result["stopped_turns"] and result["ended"] in ("cancelled", "killed"), result
    assert elapsed < CANCEL_GRACE + STOP_MARGIN, f"stop took {elapsed:.2f} s"
    assert rig.entries("work", after=seq - 1)[-1]["kind"] == "notice"


def test_a_permission_request_is_answered_by_the_policy(rig: Rig) -> None:
    prompt = "[[shell:touch rejected.txt]] [[say:Done or not.]] Touch a file."
    entries = rig.send_and_wait("ask", prompt, "--agent", "strict")
    decisions = [e["text"] for e in entries if e["kind"] == "status" and e["text"].startswith("permission for")]
    if rig.name == "fast-agent":  # asks nothing over ACP: an attended fast-agent has no shell tool
        assert decisions == [], entries
    else:
        assert decisions and all(": rejected (reject" in d for d in decisions), entries
    work = rig.folder / "corral.d" / "work" / "strict"
    assert not list(work.glob("*/rejected.txt")), "the rejected tool did not run"
