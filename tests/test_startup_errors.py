"""Start-up errors are messages, not tracebacks: the path, what is wrong, the fix, exit 1.

Issue 7 finding 7 and issue 9 item 4: bad store paths, unusable socket folders, bad TCP
ports and token files readable by others, each caught by `corral check` where it can be
known without starting, and by `corral run` in one place either way.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import CORRAL, make_config

from supervisor.cli import _startup_error

AGENT = '\n[agents.demo]\nadapter = "demo"\n'


def corral(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_SOCKET", "CORRAL_CONFIG")}
    return subprocess.run([*CORRAL, *args], check=False, cwd=folder, env=env, capture_output=True, text=True, timeout=60)


def _assert_clear(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert "fix" in out.stderr, out.stderr
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr)


def _setups(folder: Path) -> dict[str, tuple[str, str]]:
    """name -> (config text, what the message must name)."""
    (folder / "damaged.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    (folder / "notes.txt").write_text("not a database at all\n")
    foreign = sqlite3.connect(folder / "foreign.db")
    foreign.execute("CREATE TABLE invoices (id INTEGER)")
    foreign.commit()
    foreign.close()
    (folder / "adir.db").mkdir()
    (folder / "afile").write_text("x")
    return {
        "damaged store": ('[store]\npath = "damaged.db"' + AGENT, "damaged.db"),
        "not a database": ('[store]\npath = "notes.txt"' + AGENT, "notes.txt"),
        "foreign store": ('[store]\npath = "foreign.db"' + AGENT, "another program"),
        "directory store": ('[store]\npath = "adir.db"' + AGENT, "is a folder"),
        "socket under /proc": ('[server]\nsocket = "/proc/corral-test/c.sock"' + AGENT, "/proc/corral-test"),
        "store folder under a file": ('[store]\npath = "afile/sub/c.db"' + AGENT, "afile is a file"),
        "socket under a file": ('[server]\nsocket = "afile/c.sock"' + AGENT, "afile is a file"),
        "socket path too long": (f'[server]\nsocket = "{"s" * 120}.sock"' + AGENT, "107"),
    }


@pytest.mark.parametrize(
    "name",
    ["damaged store", "not a database", "foreign store", "directory store", "socket under /proc",
     "store folder under a file", "socket under a file", "socket path too long"],
)
def test_check_and_run_report_an_unusable_place_with_its_path_and_fix(short_tmp: Path, name: str) -> None:
    text, needle = _setups(short_tmp)[name]
    (short_tmp / "corral.toml").write_text(text)
    _assert_clear(corral(short_tmp, "check", "-c", "corral.toml"), needle)
    _assert_clear(corral(short_tmp, "run", "-c", "corral.toml"), needle, "nothing was started")


def test_a_socket_under_proc_names_server_socket_and_offers_no_mkdir(short_tmp: Path) -> None:
    """mkdir -p cannot fix a folder on /proc: the fix names the key and its path, and asks for another."""
    (short_tmp / "corral.toml").write_text('[server]\nsocket = "/proc/corral-test/c.sock"' + AGENT)
    out = corral(short_tmp, "check", "-c", "corral.toml")
    _assert_clear(out, "server.socket (now /proc/corral-test/c.sock)")
    assert "mkdir" not in out.stderr, out.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only folder anyway")
def test_a_read_only_state_folder_is_reported(short_tmp: Path) -> None:
    (short_tmp / "corral.toml").write_text(AGENT)
    (short_tmp / "corral.d").mkdir(mode=0o500)
    try:
        _assert_clear(corral(short_tmp, "run", "-c", "corral.toml"), "corral.d", "not writable")
    finally:
        (short_tmp / "corral.d").chmod(0o700)


def test_bad_tcp_port_and_open_token_file_fail_check_and_run(short_tmp: Path) -> None:
    (short_tmp / "tok").write_text("s3cret")
    (short_tmp / "tok").chmod(0o644)
    (short_tmp / "corral.toml").write_text('[server]\ntcp = "127.0.0.1:99999"\ntoken_file = "tok"' + AGENT)
    for command in ("check", "run"):
        out = corral(short_tmp, command, "-c", "corral.toml")
        _assert_clear(out, "server.tcp", "out of range", "server.token_file", f"chmod 600 {short_tmp / 'tok'}")


def test_failures_found_only_by_trying_are_mapped_in_one_place(short_tmp: Path) -> None:
    """What preflight cannot see (a read-only file system, a store that breaks) is still one line."""
    config = make_config(short_tmp)
    read_only = OSError(30, "Read-only file system", str(short_tmp / "corral.d"))
    message = _startup_error(ExceptionGroup("nursery", [ExceptionGroup("inner", [read_only])]), config)
    assert message is not None and str(short_tmp / "corral.d") in message and "Read-only" in message and "fix" in message
    message = _startup_error(sqlite3.DatabaseError("file is not a database"), config)
    assert message is not None and str(config.store_path) in message and "fix" in message
    assert _startup_error(ExceptionGroup("bug", [ZeroDivisionError()]), config) is None, "a bug keeps its traceback"


def test_a_state_folder_this_user_cannot_write_is_a_problem(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same check as above, where the suite runs as root (which writes anywhere)."""
    from supervisor.config import preflight as _preflight

    config = make_config(short_tmp)
    config.state_dir.mkdir()
    real_access = os.access
    monkeypatch.setattr(_preflight.os, "access", lambda path, mode: Path(path) != config.state_dir and real_access(path, mode))
    [problem] = _preflight.preflight(config)
    assert problem.key == "store.path" and str(config.state_dir) in problem.message and "not writable" in problem.message
    assert problem.fix == f"chmod 700 {config.state_dir}, as the user corral runs as"
