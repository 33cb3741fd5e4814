"""A fast slice of ``scripts/faults.py``: one trial of each fault below, against real daemons.

Every fault must report 0 violations of the invariants (issue 7's findings are all fixed):
a violation, or a harness failure, fails the test with the script's notes.
"""

from __future__ import annotations

from typing import Any

import pytest
from _scripts import run_json

pytestmark = pytest.mark.chaos


def _faults(kinds: str) -> dict[str, Any]:
    summary = run_json("faults.py", "--quick", "--seed", "7", "--only", kinds)
    assert summary["trials"] == len(kinds.split(","))
    assert summary["violations"] == 0, summary
    return summary


def test_faults_slice_orderly_shutdown_and_eio_hold() -> None:
    _faults("signal:SIGTERM,signal:SIGINT,eio")


def test_faults_slice_death_and_signals_leave_nothing_behind() -> None:
    # kill -9 mid-turn, the orderly signals, a status signal, an ignored one, a crash signal.
    _faults("kill9:mid-turn,signal:SIGHUP,signal:SIGQUIT,signal:SIGUSR1,signal:SIGALRM,signal:SIGSEGV")


def test_faults_slice_a_stop_cut_by_kill9_is_honoured() -> None:
    _faults("kill9:mid-stop")


def test_faults_slice_a_second_owner_is_refused() -> None:
    _faults("two-owners")


def test_faults_slice_aborted_requests_leave_the_daemon_serving() -> None:
    _faults("abort:unix,abort:tcp")


def test_faults_slice_poisoned_text_harms_no_one_else() -> None:
    _faults("poison")


def test_faults_slice_a_full_disk_keeps_every_stop() -> None:
    summary = _faults("enospc")
    assert "enospc" not in summary["skipped"] or summary["skipped"]["enospc"].startswith("needs root"), summary


def test_faults_slice_fleet_owner_paused_or_killed_mid_turn_with_the_stop_through_another_host() -> None:
    from scripts._postgres import missing

    if missing():
        pytest.skip(f"no PostgreSQL server: {missing()}")
    summary = run_json("faults.py", "--fleet", "--trials", "4", "--seed", "2")
    assert summary["mode"] == "fleet-faults" and summary["trials"] == 4
    assert summary["violations"] == 0, summary
    assert summary["drawn"].get("sigstop", 0) > 0 and summary["drawn"].get("sigkill", 0) > 0, summary


def test_faults_slice_fleet_partitions_the_whole_database_a_reset_and_a_slow_database() -> None:
    # (The owner cut mid-turn, a stop while it is cut, a cut healed in time and the notices
    # cut are tests of their own: tests/test_fleet_partition.py.)
    from scripts._postgres import missing

    if missing():
        pytest.skip(f"no PostgreSQL server: {missing()}")
    summary = run_json("faults.py", "--fleet", "--partition", "--quick", "--only", "db-cut,reset,slow", "--seed", "3")
    assert summary["mode"] == "fleet-partition" and summary["faults"] == {"db-cut": 1, "reset": 1, "slow": 1}
    assert summary["violations"] == 0, summary
    assert summary["figures"]["overlap_s"]["max"] == 0.0, summary
