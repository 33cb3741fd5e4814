"""The CLI as a new user types it (issue 25): -c after any command, text from stdin, names
starting with '-', who a message went to, near-miss mentions, and hints with the right file."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CORRAL, DaemonProcess

CONFIG = """
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[defaults]
agent = "demo"
[agents.demo]
adapter = "demo"
delay = 0.01
[agents.reviewer]
adapter = "demo"
delay = 0.01
"""


def run(folder: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in ``folder`` with no CORRAL_SOCKET: it finds the daemon from the config it is given."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_SOCKET", "CORRAL_CONFIG")}
    return subprocess.run([*CORRAL, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=60,
                          input=stdin)


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(short_tmp, CONFIG)
    (short_tmp / "corral.toml").rename(short_tmp / "mine.toml")  # not the default name: only -c finds it
    try:
        yield d
    finally:
        d.stop()


def test_c_file_works_after_every_client_command(daemon: DaemonProcess) -> None:
    folder = daemon.folder
    sent = run(folder, "send", "general", "hello", "-c", "mine.toml", "--json")
    assert sent.returncode == 0, sent.stderr
    for args in (["wait", "general", "--timeout", "60"], ["tail", "general"], ["status"], ["stop", "general"]):
        out = run(folder, *args, "-c", "mine.toml")
        assert out.returncode == 0, (args, out.stderr)
    assert run(folder, "shutdown", "-c", "mine.toml").returncode == 0


def test_send_dash_reads_the_text_from_stdin_even_a_long_one(daemon: DaemonProcess) -> None:
    text = "a long text " + "x" * (200 * 1024)  # over what a shell's argument may hold
    sent = run(daemon.folder, "-c", "mine.toml", "send", "general", "-", "--json", stdin=text)
    assert sent.returncode == 0, sent.stderr
    seq = json.loads(sent.stdout)["seq"]
    shown = run(daemon.folder, "-c", "mine.toml", "--json", "tail", "general").stdout
    entries = [json.loads(line) for line in shown.splitlines()]
    [entry] = [e for e in entries if e["seq"] == seq]
    assert entry["text"] == text


def test_send_says_who_it_went_to_and_flags_a_near_miss_mention(daemon: DaemonProcess) -> None:
    sent = run(daemon.folder, "-c", "mine.toml", "send", "general", "@revewer please look")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip().isdigit(), "stdout stays the seq alone, for scripts"
    assert "sent to demo" in sent.stderr, sent.stderr
    assert "@revewer" in sent.stderr and "did you mean @reviewer?" in sent.stderr, sent.stderr
    plain = run(daemon.folder, "-c", "mine.toml", "send", "general", "@reviewer hi, mail me@example.org")
    assert "sent to reviewer" in plain.stderr and "note" not in plain.stderr, plain.stderr
    as_json = json.loads(run(daemon.folder, "-c", "mine.toml", "--json", "send", "general", "@demo x").stdout)
    assert as_json["to"] == ["demo"] and as_json["hints"] == []


def test_a_channel_starting_with_a_dash_gets_a_hint_and_works_after_dashdash(daemon: DaemonProcess) -> None:
    refused = run(daemon.folder, "-c", "mine.toml", "send", "-x", "hello")
    assert refused.returncode == 2 and "goes after --" in refused.stderr, refused.stderr
    sent = run(daemon.folder, "-c", "mine.toml", "send", "--", "-x", "hello")
    assert sent.returncode == 0 and "sent to demo" in sent.stderr, sent.stderr


def test_no_daemon_hint_names_the_config_given(short_tmp: Path) -> None:
    (short_tmp / "gone.toml").write_text('[server]\nsocket = "gone.sock"\n[agents.demo]\nadapter = "demo"\n')
    out = run(short_tmp, "status", "-c", "gone.toml")
    assert out.returncode == 3 and "corral run -c gone.toml" in out.stderr, out.stderr
    missing = run(short_tmp, "status", "-c", "nope.toml")
    assert missing.returncode == 1 and "nothing was started" not in missing.stderr, missing.stderr


def test_stop_with_neither_a_channel_nor_all_says_what_to_give(short_tmp: Path) -> None:
    neither = run(short_tmp, "stop")
    assert neither.returncode == 2 and "not both" not in neither.stderr and "--all" in neither.stderr, neither.stderr
    both = run(short_tmp, "stop", "general", "--all")
    assert both.returncode == 2 and "not both" in both.stderr


def _tail(folder: Path) -> list[dict[str, object]]:
    out = run(folder, "-c", "mine.toml", "--json", "tail", "general").stdout
    return [json.loads(line) for line in out.splitlines()]


def _running(folder: Path) -> None:
    """Until the long task's tool runs (the follow ends once it is in the transcript)."""
    follow = subprocess.Popen([*CORRAL, "-c", "mine.toml", "--json", "tail", "general", "--follow"], cwd=folder,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None
        for line in follow.stdout:
            if "tool running" in json.loads(line)["text"]:
                return
        raise AssertionError("the follow ended before the tool ran")
    finally:
        follow.kill()
        follow.wait()


def test_reset_and_resend_from_the_cli(daemon: DaemonProcess) -> None:
    folder = daemon.folder
    long = json.loads(run(folder, "-c", "mine.toml", "--json", "send", "general", "please do a long task").stdout)
    _running(folder)
    busy = run(folder, "reset", "general", "-c", "mine.toml")
    assert busy.returncode == 1 and "corral stop general" in busy.stderr, busy.stderr
    assert "409" not in busy.stderr and "busy)" not in busy.stderr, "the API's code is for --json, not for people"
    coded = run(folder, "reset", "general", "-c", "mine.toml", "--json")
    assert coded.returncode == 1 and json.loads(coded.stdout)["error"]["code"] == "busy", coded.stdout
    queued = json.loads(run(folder, "-c", "mine.toml", "--json", "send", "general", "queued").stdout)
    assert run(folder, "-c", "mine.toml", "stop", "general").returncode == 0
    shown = run(folder, "-c", "mine.toml", "tail", "general").stdout
    assert f"`corral resend general {queued['seq']}` sends it again" in shown, shown
    again = run(folder, "-c", "mine.toml", "resend", "general", str(queued["seq"]))
    assert again.returncode == 0 and f"message {queued['seq']} sent again" in again.stderr, again.stderr
    twice = run(folder, "-c", "mine.toml", "resend", "general", str(queued["seq"]))
    assert twice.returncode == 1 and "sent again already" in twice.stderr, twice.stderr
    assert run(folder, "-c", "mine.toml", "wait", "general", "--timeout", "60").returncode == 0
    done = run(folder, "-c", "mine.toml", "reset", "general")
    assert done.returncode == 0 and "Conversation reset: demo starts a new conversation" in done.stdout, done
    entries = _tail(folder)
    assert entries[-1]["meta"] == {"reset": ["demo"]} and long["seq"] < entries[-1]["seq"]  # type: ignore[operator]
    unknown = run(folder, "-c", "mine.toml", "reset", "general", "--agent", "revewer")
    assert unknown.returncode == 1 and "did you mean 'reviewer'?" in unknown.stderr, unknown.stderr
