"""How ``scripts/chaos_stop.py`` reads a late registration from its trace (issue 39).

A stop that lands during a turn's spawn finds nothing to kill; the registration that follows
must kill the tree (contract line 6). Sandboxed, the leader is bwrap's monitor, which exits
with its program's status as soon as bwrap's init (pid 1 of the turn's pid namespace) reports
it, while the init stays for what the program left. The trial that raised issue 39 was that:
the program (a quick burst) had ended, the monitor exited 0 a moment before the registration's
kill, and the kill reached only the init — which the trace, looking for a signal to the leader,
called "not killed". These feed the checker synthetic traces of each case, true and false.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from scripts.chaos_stop import Evidence, Runner, Trial

CHANNEL, TURN, LEADER, INIT = "c1", "t-late", 3509, 3510


def checked(folder: Path, trace: list[dict[str, Any]], ended: list[float], returncode: int | None) -> Trial:
    """Run the late-registration check on a stop at spawning (prepare 1.0, spawn 1.1, the program's
    start stamp 1.15, stop 1.2, registration 1.25, its kill sent by 1.27) plus ``trace``."""
    base: list[dict[str, Any]] = [
        {"ev": "preparing", "t": 1.0, "channel": CHANNEL, "turn": TURN},
        {"ev": "spawn", "t": 1.1, "turn": TURN},
        {"ev": "stop", "t": 1.2, "channel": CHANNEL, "turn": None, "repeat": False, "turns": []},
        *trace,
        {"ev": "registered", "t": 1.27, "turn": TURN, "pid": LEADER, "kept": False},
        {"ev": "release", "t": 1.4, "channel": CHANNEL, "turn": TURN, "pid": LEADER, "returncode": returncode},
    ]
    (folder / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
    start = {"turn": TURN, "pid": 2, "t": 1.15, "id": "t1a", "job": "burst"}
    (folder / "started.jsonl").write_text(json.dumps(start) + "\n")
    (folder / "ended.jsonl").write_text("".join(json.dumps({"turn": TURN, "t": t}) + "\n" for t in ended))
    runner = object.__new__(Runner)  # the check reads only the evidence: no daemon
    runner.evidence = Evidence(folder)
    runner.evidence.refresh()
    trial = Trial(index=1, agent="stubborn", job="burst", moment="spawning", delay=0.0, repeat=None,
                  follow_up=False, other=False)
    runner.check_trace(trial, CHANNEL, ["t1a"])
    return trial


def register(*, exited: bool = False, sandboxed: bool = True, init_alive: bool = True) -> dict[str, Any]:
    return {"ev": "register", "t": 1.25, "channel": CHANNEL, "turn": TURN, "pid": LEADER, "stale": True,
            "exited": exited, "sandboxed": sandboxed,
            **({"init": INIT, "init_alive": init_alive} if sandboxed else {})}


def sigkill(key: str, pid: int, t: float = 1.26) -> dict[str, Any]:
    return {"ev": "signal", "t": t, key: pid, "sig": int(signal.SIGKILL)}


def kinds(trial: Trial) -> list[str]:
    return [kind for kind, _ in trial.violations]


def test_chaos_trace_issue_39_the_init_killed_after_the_program_ended_is_no_violation(tmp_path: Path) -> None:
    # Trial 4187 as traced: the monitor alive at the registration's trace, gone by the kill (its
    # status 0 the program's, the program's end stamped before the kill), cgroup.kill reaching
    # the init (traced as a SIGKILL of each member).
    trial = checked(tmp_path, [register(), sigkill("pgid", INIT)], ended=[1.18], returncode=0)
    assert trial.violations == []
    assert trial.late == ["init killed, program had ended"]


def test_chaos_trace_the_init_killed_while_the_program_ran_is_a_kill(tmp_path: Path) -> None:
    # The monitor reports its init's SIGKILL as 128 + 9.
    trial = checked(tmp_path, [register(), sigkill("pid", INIT)], ended=[], returncode=137)
    assert trial.violations == []
    assert trial.late == ["init killed"]


def test_chaos_trace_a_sandbox_whose_init_nobody_killed_is_a_survivor(tmp_path: Path) -> None:
    # The monitor had exited (its program ended) but its init lived on, with whatever the
    # program left: a registration that killed nothing left that running.
    trial = checked(tmp_path, [register(exited=True)], ended=[1.18], returncode=0)
    assert kinds(trial) == ["late-registration-not-killed"]
    assert trial.late == ["not killed"]


def test_chaos_trace_a_program_that_ended_by_itself_after_the_kill_ran_on(tmp_path: Path) -> None:
    # Status 0 with the init "killed": the program's end is stamped after the registration's
    # kill, so it was not the registration that ended it.
    trial = checked(tmp_path, [register(), sigkill("pgid", INIT)], ended=[1.5], returncode=0)
    assert kinds(trial) == ["late-registration-ran-to-its-end"]


@pytest.mark.parametrize("sandboxed", [False, True])
def test_chaos_trace_a_leader_that_exited_between_the_trace_and_the_kill_had_exited(
    tmp_path: Path, sandboxed: bool
) -> None:
    # Nothing signalled, status 0, its end stamped before the kill, and (sandboxed) no init alive.
    trial = checked(tmp_path, [register(sandboxed=sandboxed, init_alive=False)], ended=[1.18], returncode=0)
    assert trial.violations == []
    assert trial.late == ["had exited"]


def test_chaos_trace_a_leader_never_signalled_that_ran_to_its_end_is_not_killed(tmp_path: Path) -> None:
    # No signal, its own status, and its end stamped only after the registration: it ran on.
    trial = checked(tmp_path, [register(sandboxed=False)], ended=[1.5], returncode=0)
    assert kinds(trial) == ["late-registration-not-killed"]
