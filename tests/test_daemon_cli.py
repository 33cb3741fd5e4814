"""The CLI end to end against a real daemon (`corral run`) with the demo agent."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
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
    # A channel exists once it has a message (a mistyped one is refused); the reply streams in.
    corral(daemon.folder, "send", "general", "follow me", check=True)
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.folder / "corral.sock")}
    follower = subprocess.Popen(
        [*CORRAL, "tail", "general", "--follow", "--json"], cwd=daemon.folder, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
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
        # Worded for a shutdown that is not followed by a restart as well as one that is.
        assert "Task interrupted — corral was shut down. Send another message to continue." in texts
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


def test_stop_needs_only_the_server_table_of_the_config(daemon: Daemon) -> None:
    """Issue 9 item 1: an agent missing from this PATH never blocks an emergency stop."""
    daemon.cli("send", "general", "hello", check=True)
    daemon.cli("wait", "general", "--timeout", "60", check=True)
    (daemon.folder / "client.toml").write_text(
        '[server]\nsocket = "corral.sock"\n[agents.claude]\nadapter = "claude"\ncommand = ["no-such-claude-binary"]\n'
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_SOCKET", "CORRAL_CONFIG")}
    out = subprocess.run([*CORRAL, "-c", "client.toml", "stop", "general"], cwd=daemon.folder, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("general: stopped")


def test_a_mistyped_channel_exits_1_with_a_suggestion(daemon: Daemon) -> None:
    """Issue 9 item 7: stop, tail and wait on a channel that never existed."""
    daemon.cli("send", "general", "hello", check=True)
    daemon.cli("wait", "general", "--timeout", "60", check=True)
    for args in (["stop", "generl"], ["tail", "generl"], ["tail", "-f", "generl"], ["wait", "generl"]):
        out = daemon.cli(*args, timeout=60)
        assert out.returncode == 1, (args, out.stderr)
        assert "unknown channel 'generl'" in out.stderr and "did you mean 'general'?" in out.stderr, (args, out.stderr)
    status = json.loads(daemon.cli("status", "--json", check=True).stdout)
    assert sorted(status["channels"]) == ["general"]


def test_tail_follow_exits_3_when_the_daemon_goes_away(daemon: Daemon) -> None:
    daemon.cli("send", "general", "hello", check=True)
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.socket)}
    follower = subprocess.Popen([*CORRAL, "tail", "-f", "general"], cwd=daemon.folder, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        assert "hello" in follower.stdout.readline()  # it follows
        daemon.cli("shutdown", check=True)
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 3, err
    assert "went away" in err


def test_version_and_help_say_everything(short_tmp: Path) -> None:
    import supervisor

    out = corral(short_tmp, "--version", check=True)
    assert out.stdout.strip() == f"corral {supervisor.__version__}"
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert f'version = "{supervisor.__version__}"' in pyproject, "one source: pyproject's version"
    listing = corral(short_tmp, "--help", check=True).stdout
    assert "..." not in listing.split("Commands:")[1], listing
    for command in ("run", "check", "send", "stop", "wait", "tail", "status", "shutdown", "demo"):
        assert f"  {command} " in listing
    run_help = corral(short_tmp, "run", "--help", check=True).stdout
    assert "Least severe log record" in run_help and "--json" in run_help


def test_json_is_honoured_by_demo_and_run(short_tmp: Path) -> None:
    """Issue 9 item 11: `--json` is documented for every command, so every command honours it."""
    out = corral(short_tmp, "--json", "demo", timeout=120)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert lines and all("say" in line for line in lines[:-1]), out.stdout
    assert lines[-1] == {"ok": out.returncode == 0, "status": out.returncode}
    (short_tmp / "corral.toml").write_text(CONFIG)
    proc = subprocess.Popen([*CORRAL, "--json", "run", "-c", "corral.toml"], cwd=short_tmp,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = json.loads(proc.stderr.readline())
        assert {"ts", "level", "logger", "message"} <= set(first)
        corral(short_tmp, "shutdown", check=True)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert all(json.loads(line) for line in rest.splitlines())


def test_the_cli_starts_without_trio_psutil_hypercorn_or_httpx() -> None:
    """Issue 8: client commands import only what they use."""
    code = (
        "import sys, supervisor, supervisor.cli; supervisor.__version__;"
        "print(sorted(m for m in ('trio', 'psutil', 'hypercorn', 'httpx', 'adapters') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_cli_and_the_config_agree_on_the_default_config_name() -> None:
    from supervisor import cli
    from supervisor.config import settings as _config

    assert cli.DEFAULT_CONFIG_NAME == _config.DEFAULT_CONFIG_NAME


def test_the_console_script_answers_version_without_importing_click() -> None:
    """Issue 25: `corral --version` need not pay for click (its target is 5 x a bare `python -c pass`)."""
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert 'corral = "supervisor._entry:main"' in pyproject, "the console script is the fast entry"
    code = (
        "import sys; sys.argv = ['corral', '--version']; from supervisor._entry import main; main();"
        "print(sorted(m for m in ('click', 'trio', 'json') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    import supervisor

    assert out.stdout.splitlines() == [f"corral {supervisor.__version__}", "[]"], out.stdout
    code = "import sys; sys.argv = ['corral', '--version', '--json']; from supervisor._entry import main; main()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"corral {supervisor.__version__}", "click's path still works"


def test_send_interrupt_replaces_the_running_turn_and_a_steer_falls_back_with_its_reason(daemon: Daemon) -> None:
    corral(daemon.folder, "send", "work", "please do a long task", check=True)
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.folder / "corral.sock")}
    follower = subprocess.Popen([*CORRAL, "tail", "work", "--follow", "--json"], cwd=daemon.folder, env=env,
                                stdout=subprocess.PIPE, text=True)
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
    queued = corral(daemon.folder, "send", "work", "queued behind it", check=True)
    sent = corral(daemon.folder, "send", "--interrupt", "work", "do this instead", check=True)
    assert sent.stdout.strip().isdigit()
    assert "interrupted 1 turn(s), dropped 1 queued message(s)" in sent.stderr and "it runs next" in sent.stderr
    assert corral(daemon.folder, "wait", "work", "--timeout", "30").returncode == 0
    entries = [json.loads(l) for l in corral(daemon.folder, "tail", "work", "--json", check=True).stdout.splitlines()]
    notice = next(e for e in entries if e["kind"] == "notice")
    assert notice["text"] == "Interrupted by a new message. 1 queued message was not run."
    assert notice["meta"]["killed"] and notice["meta"]["dropped_entries"] == [int(queued.stdout)]
    assert not turn_processes()
    answers = [e["text"] for e in entries if e["author"] == "agent:demo" and e["kind"] == "message"]
    assert any("You said: do this instead" in a for a in answers)
    assert not any("queued behind it" in a for a in answers)
    # The demo daemon's channel is idle now: a steer has nothing to go into, and runs as a message.
    steered = json.loads(corral(daemon.folder, "send", "--steer", "work", "and this", "--json", check=True).stdout)
    assert steered["delivery"] == "queue" and steered["fallback"] == "demo is not running a turn"


def test_an_interrupted_turn_is_ended_on_the_record_so_a_restart_recovers_nothing(daemon: Daemon) -> None:
    """Issue 32's sequence: a long task, ``send --interrupt``, ``wait``, ``shutdown``, ``run``
    again. The interrupted turn's row was ended with its notice, so the next start finds no
    interrupted turn: no recovery warning, no false "corral restarted" notice."""
    import sqlite3

    corral(daemon.folder, "send", "general", "Please do a long task", check=True)
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.folder / "corral.sock")}
    follower = subprocess.Popen([*CORRAL, "tail", "general", "--follow", "--json"], cwd=daemon.folder, env=env,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        while "tool running" not in json.loads(follower.stdout.readline() or '{"text": "ended"}')["text"]:
            assert follower.poll() is None, "the follow stream ended early"
    finally:
        follower.terminate()
        follower.wait(timeout=10)
    corral(daemon.folder, "send", "--interrupt", "general", "hello there", check=True)
    assert corral(daemon.folder, "wait", "general", "--timeout", "30").returncode == 0
    assert corral(daemon.folder, "shutdown").returncode == 0
    assert daemon.proc.wait(timeout=60) == 0
    with sqlite3.connect(daemon.folder / "corral.db") as db:
        states = [s for (s,) in db.execute("SELECT state FROM turns ORDER BY began")]
    assert len(states) == 2 and set(states) == {"ended"}, states
    second = Daemon(daemon.folder)
    try:
        log = "".join(second.log)
        assert "recovered after an abrupt end" not in log, log
        entries = [json.loads(line) for line in
                   corral(daemon.folder, "tail", "general", "--json", check=True).stdout.splitlines()]
        notices = [e["text"] for e in entries if e["kind"] == "notice"]
        assert notices == ["Interrupted by a new message."], notices
    finally:
        second.stop()


def test_tail_shows_the_newest_entries_a_screenful_by_default_and_all_with_all(daemon: Daemon) -> None:
    """Issue 32: ``tail --limit N`` is the newest N, as ``tail -n``; without it a person gets a
    screenful of the newest (and is told earlier ones were left out), ``--all`` everything."""
    for n in range(4):
        corral(daemon.folder, "send", "many", f"message {n}", check=True)
    assert corral(daemon.folder, "wait", "many", "--timeout", "60").returncode == 0
    every = [json.loads(line) for line in corral(daemon.folder, "tail", "many", "--json", check=True).stdout.splitlines()]
    assert len(every) >= 8 and [e["seq"] for e in every] == sorted(e["seq"] for e in every)
    two = [json.loads(line) for line in
           corral(daemon.folder, "tail", "many", "--limit", "2", "--json", check=True).stdout.splitlines()]
    assert two == every[-2:]
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.folder / "corral.sock"), "LINES": "7", "COLUMNS": "200"}
    screen = subprocess.run([*CORRAL, "tail", "many"], cwd=daemon.folder, env=env, capture_output=True, text=True,
                            timeout=60, check=True)
    shown = [line for line in screen.stdout.splitlines() if line.startswith("[")]  # (an entry may take more lines)
    assert [int(line[1:6]) for line in shown] == [e["seq"] for e in every[-5:]], screen.stdout
    assert "the newest 5 entries; earlier ones: --limit N, or --all" in screen.stderr
    everything = subprocess.run([*CORRAL, "tail", "many", "--all"], cwd=daemon.folder, env=env,
                                capture_output=True, text=True, timeout=60, check=True)
    assert "message 0" in everything.stdout.splitlines()[0] and not everything.stderr
    both = corral(daemon.folder, "tail", "many", "--all", "--limit", "3")
    assert both.returncode == 2 and "--all and --limit" in both.stderr


def test_status_says_hand_offs_wait_after_a_stop_only_where_there_are_hand_offs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 32: after a plain stop in a one-agent channel, "routing rests until a human
    speaks" read as something wrong: there is no routing to rest there."""
    from click.testing import CliRunner

    from supervisor import cli

    lane = {"state": "idle", "queued": 0, "waiting": None, "turn": None}
    answer = {"pid": 1, "uptime": 5.0, "running": 0, "agents": {}, "channels": {
        "solo": {"generation": 1, "rests": True, "members": ["demo"], "agents": {"demo": lane}},
        "pair": {"generation": 1, "rests": True, "members": ["demo", "reviewer"], "agents": {"demo": lane}},
    }}
    monkeypatch.setattr(cli, "_call", lambda ctx, fn, client=None: answer)
    out = CliRunner().invoke(cli.main, ["status"]).output
    solo, pair = (next(line for line in out.splitlines() if f"channel {name}:" in line) for name in ("solo", "pair"))
    assert solo == "  channel solo: generation 1"
    assert pair == "  channel pair: generation 1, after its stop agent-to-agent hand-offs wait for a human's message"
