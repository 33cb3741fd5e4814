"""Symlinks an agent plants in its HOME (issue 41.8): the daemon's per-turn setup never follows one.

``$HOME/tmp`` pointing at a folder of the daemon's user used to be chmodded 0700 by the next
turn's setup (the control socket's folder: operators lost ``corral status``); a symlinked
``credentials`` parent made the daemon write the operator's login file into another agent's
hidden HOME. Each is planted here and checked from outside: the target keeps its mode and
gets no file, and the HOME gets a real folder (the link moved aside, not deleted), beside the
same setup on a clean HOME (the positive control). The last test is a hostile agent doing it
between two turns of a real daemon.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conftest import PYTHON, DaemonProcess

from supervisor.procs.files import open_agent_folder, place_credentials, write_home_files


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "state" / "home" / "a" / "c"
    home.mkdir(parents=True, mode=0o700)
    return home


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder of the daemon's user an agent must not touch (the socket's, group-readable)."""
    folder = tmp_path / "run-corral"
    folder.mkdir()
    folder.chmod(0o750)
    return folder


def moved_aside(folder: Path, name: str) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(f".{name}.corral-moved-")]


def test_a_clean_home_is_set_up_as_before(home: Path) -> None:
    write_home_files(home, {".codex/config.toml": "x = 1\n"})
    assert mode(home / "tmp") == 0o700 and mode(home / ".codex") == 0o700
    assert (home / ".codex" / "config.toml").read_text() == "x = 1\n" and mode(home / ".codex" / "config.toml") == 0o600


def test_a_planted_tmp_link_is_moved_aside_not_chmodded(home: Path, victim: Path) -> None:
    (home / "tmp").symlink_to(victim)
    write_home_files(home, {})
    assert mode(victim) == 0o750  # untouched
    assert (home / "tmp").is_dir() and not (home / "tmp").is_symlink() and mode(home / "tmp") == 0o700
    [aside] = moved_aside(home, "tmp")
    assert aside.is_symlink() and os.readlink(aside) == str(victim)  # the agent's link, kept


def test_a_planted_folder_link_is_not_written_through(home: Path, victim: Path) -> None:
    (home / ".codex").symlink_to(victim)
    (home / "deep").mkdir()
    (home / "deep" / "er").symlink_to(victim)
    write_home_files(home, {".codex/config.toml": "x", "deep/er/f.json": "y", "plain.txt": "z"})
    assert list(victim.iterdir()) == [] and mode(victim) == 0o750
    assert (home / ".codex" / "config.toml").read_text() == "x" and (home / "deep" / "er" / "f.json").read_text() == "y"
    # A file (not a folder) planted where a file goes is a link: never written through either.
    (home / "plain.txt").unlink()
    (home / "plain.txt").symlink_to(victim / "planted")
    with pytest.raises(OSError):
        write_home_files(home, {"plain.txt": "z"})
    assert not (victim / "planted").exists()


def test_a_symlinked_credentials_parent_gets_no_login_file(home: Path, victim: Path, tmp_path: Path) -> None:
    login = tmp_path / "operator-login.json"
    login.write_text('{"token": "operator"}')
    (home / ".claude").symlink_to(victim)
    [placed] = place_credentials(home, [(login, ".claude/.credentials.json")])
    assert list(victim.iterdir()) == []
    assert placed.read_text() == '{"token": "operator"}' and mode(placed) == 0o400
    assert not (home / ".claude").is_symlink()
    # A link planted at the temporary name is replaced, not followed.
    os.symlink(victim / "stolen", home / ".claude" / f"..credentials.json.corral-{os.getpid()}")
    place_credentials(home, [(login, ".claude/.credentials.json")])
    assert not (victim / "stolen").exists()


def test_the_walk_refuses_a_path_that_leaves_home(home: Path) -> None:
    with pytest.raises(ValueError):
        open_agent_folder(home, "../escape")


PLANTER = r"""
import json, os, sys
home = os.environ["HOME"]
plan = json.loads(sys.argv[-1])
done = "second turn"
if plan.get("plant"):  # its login file is a read-only mount: the folder is moved, not emptied
    for name in ("tmp", ".claude"):
        os.rename(os.path.join(home, name), os.path.join(home, name + ".old"))
        os.symlink(plan["victim"], os.path.join(home, name))
    done = "planted"
print(json.dumps({"type": "result", "text": done}), flush=True)
"""


def test_a_hostile_agent_plants_links_between_two_turns(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn one replaces its TMPDIR and its login file's folder by links to a folder of the
    daemon's user; turn two's setup must follow neither. Checked from outside."""
    user_home = short_tmp / "user"
    (user_home / ".claude").mkdir(parents=True)
    (user_home / ".claude" / ".credentials.json").write_text('{"token": "operator"}')
    monkeypatch.setenv("HOME", str(user_home))
    victim = short_tmp / "victim"
    victim.mkdir()
    victim.chmod(0o750)
    config = f"""
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[agents.planter]
adapter = "generic"
command = [{json.dumps(PYTHON)}, "-c", {json.dumps(PLANTER)}]
credentials = ["~/.claude/.credentials.json"]
"""
    daemon = DaemonProcess(short_tmp, config)
    try:
        for plan in ({"plant": True, "victim": str(victim)}, {}):
            assert daemon.cli("send", "c", json.dumps(plan)).returncode == 0
            assert daemon.cli("wait", "c", "--timeout", "60").returncode == 0
        texts = [json.loads(line)["text"] for line in daemon.cli("tail", "c", "--json").stdout.splitlines()]
        assert "planted" in texts and "second turn" in texts, texts  # the positive control: both ran
    finally:
        assert daemon.stop() == 0
    assert mode(victim) == 0o750 and list(victim.iterdir()) == []
    home = short_tmp / "corral.d" / "home" / "planter"
    [channel_home] = list(home.iterdir())
    assert (channel_home / "tmp").is_dir() and not (channel_home / "tmp").is_symlink()
    assert (channel_home / ".claude" / ".credentials.json").read_text() == '{"token": "operator"}'
