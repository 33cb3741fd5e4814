"""A fast slice of ``scripts/chaos_stop.py``: a clean daemon breaks no contract line in any
trial, single-agent, multi-agent (hand-off chains) or interrupt (then restarted), and each seeded bug (a mistake the
contract forbids, put back in the daemon) is caught.

Each run starts a real ``corral run`` (traced, see ``scripts/_chaos_daemon.py``) and the chaos
agent in its three setups. A seeded run draws its stop moments where that bug shows: the
script's full mix catches every one as well, only over more trials (see docs/robustness.md).
"""

from __future__ import annotations

import pytest
from _scripts import run_json

pytestmark = pytest.mark.chaos


def test_chaos_slice_finds_no_violation_on_a_clean_daemon() -> None:
    summary = run_json("chaos_stop.py", "--trials", "16", "--seed", "7", "--kinds", "single")
    assert summary["trials"] == 16
    assert summary["violations"] == 0, summary


def test_chaos_slice_finds_no_violation_in_multi_agent_channels() -> None:
    # Hand-off chains stopped mid-chain, repeated stops, bot posts while the channel rests,
    # human messages lifting the rest, a second channel with the same agents.
    summary = run_json("chaos_stop.py", "--trials", "16", "--seed", "7", "--kinds", "multi")
    assert summary["trials"] == 16
    assert summary["violations"] == 0, summary


def test_chaos_slice_interrupt_trials_leave_no_turn_running_for_the_restart() -> None:
    # Interrupts at random moments (some doubled, some with a stop after or before), then an
    # orderly restart: every turn's row ended in the store, no "corral restarted" notice after.
    summary = run_json("chaos_stop.py", "--trials", "16", "--seed", "7", "--kinds", "interrupt")
    assert summary["trials"] == 16 and summary["planned_restarts"] == 1
    assert summary["violations"] == 0, summary


@pytest.mark.parametrize(
    ("bug", "moments", "kind"),
    [
        ("no-point-of-no-return", "preparing", "spawn-after-stop"),
        ("no-late-kill", "spawning", "late-registration-not-killed"),
        ("todos-kept", "entry", "todos-unfinished-after-stop"),
        ("output-before-notice", "entry", "leftover-output-stored"),
        ("output-after-notice", "entry", "entry-after-notice"),
        ("no-marker-scan", "entry", "alive-when-stop-returned"),
    ],
)
def test_chaos_slice_catches_each_seeded_bug(bug: str, moments: str, kind: str) -> None:
    # Two trials at a time: with eight, the stop requests queue behind each other on a loaded
    # machine and land after the window the bug opens (the full mix is what docs/robustness.md counts).
    summary = run_json("chaos_stop.py", "--trials", "12", "--seed", "7", "--seed-bug", bug, "--moments", moments,
                       "--concurrency", "2", "--kinds", "single")
    assert summary["seed_bug"] == bug
    assert summary["by_kind"].get(kind, 0) > 0, summary


def test_chaos_slice_catches_a_stop_that_forgets_the_routing_rest() -> None:
    # Seeded: a stop leaves agent-to-agent routing on; another bot's post after it is handed on.
    summary = run_json("chaos_stop.py", "--trials", "12", "--seed", "7", "--seed-bug", "rest-forgotten",
                       "--kinds", "multi")
    assert summary["seed_bug"] == "rest-forgotten"
    assert summary["by_kind"].get("routed-while-resting", 0) > 0, summary


def test_chaos_slice_fleet_stops_through_any_host_break_no_contract_line() -> None:
    # Three daemons on one throwaway PostgreSQL; most stops go through a host that does not own the channel.
    from scripts._postgres import missing

    if missing():
        pytest.skip(f"no PostgreSQL server: {missing()}")
    summary = run_json("chaos_stop.py", "--fleet", "--trials", "16", "--seed", "2")
    assert summary["mode"] == "fleet-stops" and summary["trials"] == 16
    assert summary["violations"] == 0, summary
    drawn = summary["drawn"]
    assert drawn.get("cross_host", 0) > 0 and drawn.get("stopped_turn", 0) > 0 and drawn.get("queued", 0) > 0, summary
    assert all(drawn.get(moment, 0) > 0 for moment in ("at-once", "delay", "ready")), summary
