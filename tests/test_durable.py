"""Durability against a real daemon: one owner per store, abrupt death, signals, shutdown
during a stop (stop contract lines 15 and 17; the in-process tests are in
test_stop_contract.py).

Each test runs `corral run` as a subprocess with the contract tests' script agent. Waiting
is on conditions read from the store (a read-only connection of its own), under deadlines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from conftest import CORRAL, PYTHON, DaemonProcess, make_config, turn_processes
from test_stop_contract import AGENT, Gate

from supervisor import SHUTDOWN_NOTICE, StoreError
from supervisor.core.results import RESTART_NOTICE
from supervisor.host.supervisor import open_supervisor
from supervisor.store.engines import is_postgres
from supervisor.store.store import StoreInUse
from supervisor.testing import host_pid

T = TypeVar("T")
DEADLINE = 30.0


def config_text(folder: Path, grace: float) -> str:
    (folder / "agent.py").write_text(AGENT)
    return f"""
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[agents.bot]
adapter = "generic"
command = [{json.dumps(PYTHON)}, {json.dumps(str(folder / "agent.py"))}]
stop_grace = {grace}
"""


def start(folder: Path, grace: float = 2.0) -> DaemonProcess:
    return DaemonProcess(folder, config_text(folder, grace))


def rows(folder: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Committed rows of the daemon's store, read through a read-only connection."""
    db = sqlite3.connect(f"file:{folder / 'corral.db'}?mode=ro", uri=True)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def entries(folder: Path, channel: str = "ch") -> list[dict[str, Any]]:
    out = rows(folder, "SELECT seq, author, kind, text, turn, meta FROM entries WHERE channel = ? ORDER BY seq", (channel,))
    return [dict(seq=s, author=a, kind=k, text=t, turn=u, meta=json.loads(m)) for s, a, k, t, u, m in out]


def until(what: str, probe: Callable[[], T | None], timeout: float = DEADLINE) -> T:
    """Poll ``probe`` until it returns something truthy (a condition, not a settling sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def entry(folder: Path, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    return until("an entry", lambda: next((e for e in entries(folder) if match(e)), None))


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def gate(short_tmp: Path) -> Iterator[Gate]:
    made = Gate(short_tmp / "gate")
    try:
        yield made
    finally:
        made.close()


def running_turn(folder: Path, daemon: DaemonProcess, prompt: str) -> tuple[str, int, int]:
    """Send ``prompt`` (which must include ``setsid``) and wait until it is ready:
    returns (turn id, leader pid, setsid grandchild pid).

    The agent reports the grandchild as ``setsid PID NAMESPACE``, its sandbox's pid; it is
    turned into this process's pid here, while the grandchild lives (it sleeps)."""
    daemon.cli("send", "ch", prompt, check=True)
    tool = entry(folder, lambda e: e["kind"] == "status" and e["text"].startswith("setsid "))
    entry(folder, lambda e: e["kind"] == "message" and e["text"] == "ready")
    (leader,) = until("the turn's leader pid", lambda: rows(folder, "SELECT pid FROM turns WHERE pid IS NOT NULL"))
    _, pid, namespace = tool["text"].split()
    return tool["turn"], leader[0], host_pid(int(pid), int(namespace))


# ---------------------------------------------------------------- one owner per store


async def test_a_second_embedded_supervisor_on_one_store_is_refused(short_tmp: Path, store_at: str) -> None:
    config = make_config(short_tmp)
    lock = Path(str(config.store_path) + ".lock")
    if is_postgres(store_at):  # the lock is the database's: an advisory lock naming the holder
        config = dataclasses.replace(config, store_url=store_at)
        holder = rf"store {re.escape(store_at)} is in use by corral pid {os.getpid()} on "
    else:
        holder = rf"store .*corral.db is in use by pid {os.getpid()}"
    async with open_supervisor(config) as sup:
        if is_postgres(store_at):
            assert not lock.exists()
        else:
            assert stat.S_IMODE(lock.stat().st_mode) == 0o600
            assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(StoreInUse, match=holder):
            async with open_supervisor(config):
                pass
        store_id = sup._store.store_id
    async with open_supervisor(config) as again:  # released with its owner; the id is stable
        # (16 hex digits; a fleet host's processes carry its seq slot too, 2 more)
        assert again._store.store_id == store_id and len(store_id) == (18 if is_postgres(store_at) else 16)
    assert issubclass(StoreInUse, StoreError)


def test_a_second_corral_run_on_the_same_store_exits_1_and_changes_nothing(short_tmp: Path) -> None:
    first = start(short_tmp)
    try:
        first.cli("send", "ch", "hello", check=True)
        entry(short_tmp, lambda e: e["text"] == "done: hello")
        before = rows(short_tmp, "SELECT * FROM entries ORDER BY seq")
        other = short_tmp / "other"
        other.mkdir()
        (other / "corral.toml").write_text(
            config_text(short_tmp, 2.0).replace('"corral.sock"', '"other.sock"').replace('"corral.db"', json.dumps(str(short_tmp / "corral.db")))
        )
        second = subprocess.run([*CORRAL, "run", "-c", "corral.toml"], cwd=other, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert f"is in use by pid {first.proc.pid}" in second.stderr and "Traceback" not in second.stderr
        assert not (other / "other.sock").exists()
        assert rows(short_tmp, "SELECT * FROM entries ORDER BY seq") == before
        assert first.cli("status").returncode == 0  # the owner serves on
    finally:
        assert first.stop() == 0


# ---------------------------------------------------------------- signals


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT])
def test_hup_and_quit_shut_down_in_order_and_leave_no_orphan(short_tmp: Path, gate: Gate, sig: int) -> None:
    daemon = start(short_tmp)
    try:
        turn, leader, grandchild = running_turn(short_tmp, daemon, f"setsid gate={gate}")
        daemon.proc.send_signal(sig)
        assert daemon.proc.wait(timeout=60) == 0  # it ends on its own, in order
        daemon.stop()
        assert not alive(leader) and not alive(grandchild)
        assert not turn_processes([turn])
        last = entries(short_tmp)[-1]
        assert (last["kind"], last["text"], last["turn"]) == ("notice", SHUTDOWN_NOTICE, turn)
    finally:
        daemon.stop()


def test_usr1_logs_a_status_line_and_other_signals_are_ignored(short_tmp: Path, gate: Gate) -> None:
    daemon = start(short_tmp)
    try:
        turn, leader, grandchild = running_turn(short_tmp, daemon, f"setsid gate={gate}")
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO,
                    signal.SIGRTMIN, signal.SIGRTMIN + 1):
            daemon.proc.send_signal(sig)
        # Still serving, the turn untouched (a send is answered only by a live daemon).
        assert daemon.cli("status").returncode == 0
        assert alive(leader) and alive(grandchild)
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0
    log = "".join(daemon.log)
    assert "received SIGUSR1: status: pid" in log and "received SIGALRM: ignored" in log
    assert "received SIGRTMIN: ignored" in log and "received SIGRTMIN+1: ignored" in log
    assert not alive(leader) and not alive(grandchild) and not turn_processes([turn])


# ---------------------------------------------------------------- 15. death is not silence


def test_contract_15_after_kill_9_the_orphans_die_before_the_restart_serves(short_tmp: Path, gate: Gate) -> None:
    daemon = start(short_tmp)
    restarted = None
    try:
        turn, leader, grandchild = running_turn(short_tmp, daemon, f"setsid gate={gate}")
        daemon.cli("send", "ch", "queued before the crash", check=True)
        daemon.proc.kill()
        daemon.proc.wait()
        assert alive(leader) and alive(grandchild)  # orphaned, still working

        restarted = start(short_tmp)
        # Ready means serving: by then every orphan is dead.
        assert not alive(leader) and not alive(grandchild)
        done = entry(short_tmp, lambda e: e["text"] == "done: queued before the crash")
        of_turn = [e for e in entries(short_tmp) if e["turn"] == turn]
        assert (of_turn[-1]["kind"], of_turn[-1]["text"]) == ("notice", RESTART_NOTICE)
        assert of_turn[-1]["seq"] < done["seq"]  # the queued message ran after the orphan died
        assert restarted.cli("wait", "ch", "--timeout", "30").returncode == 0
        assert [e["text"] for e in entries(short_tmp)].count("done: queued before the crash") == 1
        status = json.loads(restarted.cli("--json", "status", check=True).stdout)
        assert {leader, grandchild} <= set(status["recovered"]["killed"])
        assert status["recovered"]["turns"] == [turn]
        plain = restarted.cli("status", check=True).stdout
        assert f"interrupted turns ['{turn}']" in plain
    finally:
        if restarted is not None:
            assert restarted.stop() == 0
        daemon.stop()


# ---------------------------------------------------------------- 17. a stop outlives the supervisor


def stop_in_background(daemon: DaemonProcess) -> subprocess.Popen[str]:
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.socket)}
    return subprocess.Popen([*CORRAL, "--json", "stop", "ch"], cwd=daemon.folder, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def nothing_resumed(folder: Path, turn: str) -> None:
    """After a restart: what the stop dropped did not run, its plan stays cancelled, no nudge."""
    texts = [e["text"] for e in entries(folder)]
    assert not [t for t in texts if t.startswith("done: ")]
    assert not [t for t in texts if "remaining task" in t]
    dropped = [e for e in entries(folder) if e["text"] == "dropped by the stop"]
    assert dropped and dropped[0]["meta"].get("dropped_by_stop")
    ((items,),) = rows(folder, "SELECT items FROM todos")
    assert {i["status"] for i in json.loads(items)} <= {"completed", "cancelled"}
    assert rows(folder, "SELECT * FROM queue") == []
    notices = [e for e in entries(folder) if e["kind"] == "notice"]
    assert [n["text"] for n in notices] == ["Execution stopped by user. 1 queued message was not run."]
    of_turn = [e for e in entries(folder) if e["turn"] == turn]
    assert of_turn[-1]["kind"] == "notice"


def test_contract_17_kill_9_after_the_stop_is_recorded_never_undoes_it(short_tmp: Path, gate: Gate) -> None:
    daemon = start(short_tmp, grace=3)
    restarted = None
    try:
        turn, leader, grandchild = running_turn(short_tmp, daemon, f"ignore todos setsid gate={gate}")
        daemon.cli("send", "ch", "dropped by the stop", check=True)
        stopper = stop_in_background(daemon)
        until("the stop's record", lambda: rows(short_tmp, "SELECT seq FROM stops"))
        daemon.proc.kill()  # mid-stop: the agent ignores SIGINT, the stop waits out its grace
        daemon.proc.wait()
        assert stopper.wait(timeout=60) != 0

        restarted = start(short_tmp, grace=0.5)
        assert not alive(leader) and not alive(grandchild)
        assert restarted.cli("wait", "ch", "--timeout", "30").returncode == 0
        nothing_resumed(short_tmp, turn)
        status = json.loads(restarted.cli("--json", "status", check=True).stdout)
        assert status["recovered"]["turns"] == [] and len(status["recovered"]["stops"]) == 1
    finally:
        if restarted is not None:
            assert restarted.stop() == 0
        daemon.stop()


def test_contract_17_shutdown_during_a_stop_answers_its_caller(short_tmp: Path, gate: Gate) -> None:
    daemon = start(short_tmp, grace=3)
    restarted = None
    try:
        turn, leader, grandchild = running_turn(short_tmp, daemon, f"ignore todos setsid gate={gate}")
        daemon.cli("send", "ch", "dropped by the stop", check=True)
        stopper = stop_in_background(daemon)
        until("the stop's record", lambda: rows(short_tmp, "SELECT seq FROM stops"))
        daemon.proc.send_signal(signal.SIGTERM)  # while the stop waits out the grace
        out, err = stopper.communicate(timeout=60)
        assert stopper.returncode == 0, err
        result = json.loads(out)
        assert result["ok"] and result["notice_seq"] is not None and result["stopped_turns"] == [turn]
        assert leader in result["killed"] and grandchild in result["swept"] + result["killed"]
        assert daemon.proc.wait(timeout=60) == 0  # it ends on its own, in order
        daemon.stop()
        assert not alive(leader) and not alive(grandchild)

        restarted = start(short_tmp)
        assert restarted.cli("wait", "ch", "--timeout", "30").returncode == 0
        nothing_resumed(short_tmp, turn)
    finally:
        if restarted is not None:
            assert restarted.stop() == 0
        daemon.stop()


def test_tail_marks_a_message_a_stop_dropped() -> None:
    from supervisor.cli import format_entry

    entry = {"seq": 3, "ts": 0.0, "author": "human:user", "kind": "message", "text": "later", "meta": {"dropped_by_stop": 5}}
    assert format_entry(entry).endswith("later (not run: dropped by a stop)")
    assert format_entry({**entry, "meta": {}}).endswith(" later")


def test_stop_prints_what_each_turn_came_to() -> None:
    from supervisor.cli import format_stop

    result = {"channel": "ch", "repeat": False, "generation": 2, "stopped_turns": ["t1"], "killed": [41],
              "swept": [], "dropped": 1, "elapsed_ms": 6.25, "ok": True, "error": None, "ended": None}
    assert format_stop(result) == (
        "ch: stopped — generation 2; turns 1, killed [41], swept [], dropped 1 message(s), 6.2 ms")
    assert "turns 1, ACP prompt cancelled, killed" in format_stop({**result, "ended": "cancelled"})
    failed = format_stop({**result, "ok": False, "error": "host h2 has not answered since 14:02:11"})
    assert failed.endswith("ms — FAILED: host h2 has not answered since 14:02:11")
    assert "repeat (already stopped)" in format_stop({**result, "repeat": True})


# ---------------------------------------------------------------- a real full disk


@pytest.fixture
def tiny_disk(short_tmp: Path) -> Iterator[Path]:
    """A 4 MB tmpfs (root only): a full disk gives the store a real ENOSPC."""
    folder = short_tmp / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; returns the filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


async def test_contract_17_a_stop_on_a_full_disk_kills_nothing_and_says_so(tiny_disk: Path, short_tmp: Path) -> None:
    import trio
    from conftest import script_agent

    gate = Gate(short_tmp / "gate")
    # The gate is outside the store's folder: the agent is granted both (its /tmp is its own).
    config = make_config(tiny_disk, {"bot": script_agent(AGENT, sandbox_write=[str(tiny_disk), str(short_tmp)])})
    # The disk is smaller than the disk reserve (which would refuse every turn): this line is
    # what holds once no reserve is left (a disk filled past it, or the reserve off).
    config = dataclasses.replace(config, server=dataclasses.replace(config.server, disk_reserve=0))
    try:
        async with open_supervisor(config) as sup:
            await sup.send("ch", f"gate={gate}")
            with trio.fail_after(DEADLINE):
                while not [e for e in await sup.entries("ch") if e.text == "ready"]:
                    await trio.sleep(0.02)  # a condition polled under a deadline
            await sup.send("ch", "queued behind")
            turn = sup._lanes.turns["ch", "bot"]
            assert turn.tree is not None
            filler = fill(tiny_disk)
            with trio.fail_after(DEADLINE):
                failed = await sup.stop("ch")
            assert not failed.ok and failed.error is not None
            assert "could not be stored" in failed.error and "full" in failed.error
            assert failed.error.endswith("nothing was stopped")
            assert alive(turn.tree.pid) and not sup._ledger.is_stale("ch", turn.turn_id)
            assert len(sup._ledger.queued("ch")) == 1
            filler.unlink()
            with trio.fail_after(DEADLINE):
                retry = await sup.stop("ch")
            assert retry.ok and not retry.repeat and retry.dropped == 1 and turn.tree.pid in retry.killed
            assert await sup.wait_idle("ch", timeout=DEADLINE)
    finally:
        gate.close()
