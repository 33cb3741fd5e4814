"""The CLI end to end against a real daemon (`corral run`) with the demo agent."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import CORRAL, DaemonProcess, turn_processes

CONFIG = """
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[defaults]
stop_grace = 2
[agents.demo]
adapter = "demo"
delay = 0.01
"""


def corral(folder: Path, *args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the CLI against the daemon of ``folder``."""
    env = {**os.environ, "CORRAL_SOCKET": str(folder / "corral.sock")}
    return subprocess.run([*CORRAL, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout, check=check)


class Daemon(DaemonProcess):
    """The demo-agent daemon these tests share."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, CONFIG)


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[Daemon]:
    d = Daemon(short_tmp)
    try:
        yield d
    finally:
        d.stop()


def test_socket_is_created_with_mode_0600(daemon: Daemon) -> None:
    mode = stat.S_IMODE((daemon.folder / "corral.sock").stat().st_mode)
    assert mode == 0o600
    assert stat.S_IMODE((daemon.folder / "corral.db").stat().st_mode) == 0o600


def test_send_wait_tail_status(daemon: Daemon) -> None:
    sent = corral(daemon.folder, "send", "general", "hello there", "--json", check=True)
    seq = json.loads(sent.stdout)["seq"]
    assert seq >= 1
    assert corral(daemon.folder, "wait", "general", "--timeout", "30").returncode == 0
    tail = corral(daemon.folder, "tail", "general", "--json", check=True)
    entries = [json.loads(line) for line in tail.stdout.splitlines()]
    assert entries[0]["seq"] == seq and entries[0]["author"] == "human:user"
    replies = [e for e in entries if e["author"] == "agent:demo" and e["kind"] == "message"]
    assert replies and "You said: hello there" in replies[0]["text"]
    assert len({e["turn"] for e in entries[1:]}) == 1, "every entry of the turn carries its turn id"
    human = corral(daemon.folder, "tail", "general", "--after", str(seq), check=True).stdout
    assert "You said: hello there" in human and "hello there" in human
    status = json.loads(corral(daemon.folder, "status", "--json", check=True).stdout)
    assert status["channels"]["general"]["turn"] is None and "demo" in status["agents"]


def test_follow_streams_entries_as_they_are_stored(daemon: Daemon) -> None:
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.folder / "corral.sock")}
    follower = subprocess.Popen(
        [*CORRAL, "tail", "general", "--follow", "--json"], cwd=daemon.folder, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        corral(daemon.folder, "send", "general", "follow me", check=True)
        assert follower.stdout is not None
        seen = []
        while not any(e["kind"] == "message" and e["author"] == "agent:demo" for e in seen):
            line = follower.stdout.readline()
            assert line, "the follow stream ended early"
            seen.append(json.loads(line))
        assert seen[0]["text"] == "follow me"
    finally:
        follower.terminate()
        follower.wait(timeout=10)


def test_stop_mid_tool_kills_the_tree_and_a_follow_up_resumes(daemon: Daemon) -> None:
    corral(daemon.folder, "send", "work", "please do a long task", check=True)
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.folder / "corral.sock")}
    follower = subprocess.Popen([*CORRAL, "tail", "work", "--follow", "--json"], cwd=daemon.folder, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        while True:
            line = follower.stdout.readline()
            assert line, "the follow stream ended early"
            if "tool running" in json.loads(line)["text"]:
                break
    finally:
        follower.terminate()
        follower.wait(timeout=10)
    result = json.loads(corral(daemon.folder, "stop", "work", "--json", check=True).stdout)
    assert result["ok"] and not result["repeat"] and result["stopped_turns"]
    assert result["killed"] and result["swept"], "the setsid helper escapes the group and must be swept"
    assert not [p for p in result["killed"] + result["swept"] if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not turn_processes()
    entries = [json.loads(l) for l in corral(daemon.folder, "tail", "work", "--json", check=True).stdout.splitlines()]
    assert entries[-1]["kind"] == "notice" and entries[-1]["seq"] == result["notice_seq"]
    again = json.loads(corral(daemon.folder, "stop", "work", "--json", check=True).stdout)
    assert again["repeat"] and again["notice_seq"] == result["notice_seq"]
    corral(daemon.folder, "send", "work", "and now?", check=True)
    assert corral(daemon.folder, "wait", "work", "--timeout", "30").returncode == 0
    text = corral(daemon.folder, "tail", "work", "--after", str(result["notice_seq"]), check=True).stdout
    assert "had 1 earlier message(s); the last was: 'please do a long task'" in text, text


def test_stop_all_reports_each_channel(daemon: Daemon) -> None:
    for channel in ("a", "b"):
        corral(daemon.folder, "send", channel, "long 30", check=True)
    for channel in ("a", "b"):
        deadline = time.monotonic() + 30
        while not any("tool running" in e["text"] for e in map(json.loads, corral(daemon.folder, "tail", channel, "--json").stdout.splitlines())):
            assert time.monotonic() < deadline
            corral(daemon.folder, "wait", channel, "--timeout", "0.2")  # a bounded wait, not a sleep
    result = json.loads(corral(daemon.folder, "stop", "--all", "--json", check=True).stdout)
    assert result["channel"] is None
    assert sorted(c["channel"] for c in result["channels"]) == ["a", "b"]
    assert all(c["ok"] and c["notice_seq"] for c in result["channels"])
    assert not turn_processes()


def test_wait_times_out_with_exit_4(daemon: Daemon) -> None:
    corral(daemon.folder, "send", "slow", "long 30", check=True)
    assert corral(daemon.folder, "wait", "slow", "--timeout", "0.3").returncode == 4
    assert json.loads(corral(daemon.folder, "stop", "slow", "--json").stdout)["ok"]


def test_shutdown_command_ends_the_daemon(daemon: Daemon) -> None:
    out = corral(daemon.folder, "shutdown", check=True)
    assert "shutting down" in out.stdout
    assert daemon.proc.wait(timeout=30) == 0
    assert not (daemon.folder / "corral.sock").exists()


def test_sigterm_leaves_no_process_behind_and_keeps_the_queue(daemon: Daemon) -> None:
    corral(daemon.folder, "send", "busy", "long 60", check=True)
    corral(daemon.folder, "send", "busy", "after the restart", check=True)
    deadline = time.monotonic() + 30
    while not any("tool running" in e["text"] for e in map(json.loads, corral(daemon.folder, "tail", "busy", "--json").stdout.splitlines())):
        assert time.monotonic() < deadline
        corral(daemon.folder, "wait", "busy", "--timeout", "0.2")
    children = psutil.Process(daemon.proc.pid).children(recursive=True)
    assert children
    assert daemon.stop() == 0
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"left behind: {alive}"
    assert not turn_processes()
    # Restarted, the queued message runs; the interrupted turn says so.
    second = Daemon(daemon.folder)
    try:
        assert corral(daemon.folder, "wait", "busy", "--timeout", "30").returncode == 0
        entries = [json.loads(l) for l in corral(daemon.folder, "tail", "busy", "--json", check=True).stdout.splitlines()]
        texts = [e["text"] for e in entries]
        assert any(t.startswith("Task interrupted") for t in texts)
        assert any("You said: after the restart" in t for t in texts)
    finally:
        second.stop()


def test_client_commands_without_a_daemon_exit_3(short_tmp: Path) -> None:
    out = corral(short_tmp, "status")
    assert out.returncode == 3
    assert "no daemon is running" in out.stderr and "corral run" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_check_reports_problems_with_exit_1(short_tmp: Path) -> None:
    (short_tmp / "bad.toml").write_text('[agents.x]\nadapter = "claud"\nstop_grace = "2s"\n[server]\nsockt = "x"\n')
    out = corral(short_tmp, "check", "-c", "bad.toml")
    assert out.returncode == 1
    assert "did you mean 'claude'" in out.stderr and "did you mean 'socket'" in out.stderr
    good = corral(short_tmp, "check", "-c", str(Path(__file__).parent.parent / "config.example.toml"))
    assert good.returncode == 0, good.stderr
