"""How ``scripts/faults.py`` tells a survivor of a dead daemon from a process of the new one.

After a restart the script scans for marked processes and counts as a survivor each one the
new daemon did not start. The new daemon starts the turns it restored from the queue the
moment it is ready — during that scan — and a quick one (the "short" job, 100-200 ms) can be
found alive and be gone by the time it is judged. The old check asked psutil for its parents,
which raised, and took "gone" for "not a descendant": a rare ``no-survivor`` naming the new
daemon's own short turn (its program, and bwrap's init with it) that no replay reproduced.
These tests take the scan's result, let the process exit, and only then ask for the verdict.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from scripts.faults import descends_from, survivors

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
#: The turn ids a supervisor with this pid makes (``new_turn_id``), and another's.
NEW_TURN = f"t{os.getpid():x}-19a0000000-abcdef"
OLD_TURN = f"t{os.getpid() + 1:x}-19a0000000-abcdef"

Procs = list[subprocess.Popen[bytes]]


@pytest.fixture
def procs() -> Iterator[Procs]:
    started: Procs = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def _start(procs: Procs) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(SLEEPER)
    procs.append(proc)
    return proc


def test_the_new_daemons_turn_gone_before_it_is_judged_is_no_survivor(procs: Procs) -> None:
    # This process plays the new daemon; its child, the restored short turn.
    turn = _start(procs)
    found = [(turn.pid, NEW_TURN, "python _chaos_agent.py -- short")]  # what the scan read while it ran
    # Between the scan and the verdict the short turn ends, and its parent reaps it.
    turn.kill()
    turn.wait()
    assert descends_from(turn.pid, os.getpid()) is None
    assert survivors(found, os.getpid()) == []


def test_an_old_turns_process_the_scan_found_alive_is_a_survivor_even_if_gone_since(procs: Procs) -> None:
    leftover = _start(procs)
    found = [(leftover.pid, OLD_TURN, "python _chaos_agent.py -- long")]
    leftover.kill()
    leftover.wait()
    assert survivors(found, os.getpid()) == found


def test_a_live_descendant_of_the_daemon_is_its_own(procs: Procs) -> None:
    turn = _start(procs)
    assert descends_from(turn.pid, os.getpid()) is True
    assert survivors([(turn.pid, OLD_TURN, "python")], os.getpid()) == []


def test_a_live_process_outside_the_daemon_is_a_survivor(procs: Procs) -> None:
    orphan, daemon = _start(procs), _start(procs)  # siblings: neither descends from the other
    found = [(orphan.pid, OLD_TURN, "python _chaos_agent.py -- long")]
    assert descends_from(orphan.pid, daemon.pid) is False
    assert survivors(found, daemon.pid) == found


def test_a_process_whose_parent_exited_is_walked_to_its_new_parent(procs: Procs) -> None:
    # A middle process forks a sleeper and exits: the sleeper re-parents (to init, or to a
    # subreaper above); the walk follows its new parent and still tells it is not the daemon's.
    middle = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess; print(subprocess.Popen({SLEEPER!r}).pid, flush=True)"],
        stdout=subprocess.PIPE,
    )
    assert middle.stdout is not None
    pid = int(middle.stdout.readline())
    middle.stdout.close()
    middle.wait()
    daemon = _start(procs)
    try:
        assert descends_from(pid, daemon.pid) is False
        assert survivors([(pid, OLD_TURN, "python")], daemon.pid) == [(pid, OLD_TURN, "python")]
    finally:
        os.kill(pid, signal.SIGKILL)
