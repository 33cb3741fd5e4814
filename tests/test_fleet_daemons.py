"""A fleet of real `corral run` daemons on one machine and one PostgreSQL database, each its
own host (its own socket and state folder): placement across hosts (and a pinned channel
waiting for its dead host), a stop through another host, `kill -9` of a host, a host paused
with SIGSTOP past its lease, a stop of a paused host's channel, the database restarted
under the fleet.

Leases are 1 s; every wait is a condition polled under a generous deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from scripts._postgres import PostgresServer
from conftest import PYTHON, DaemonProcess
from test_stop_contract import AGENT, Gate

T = TypeVar("T")
DEADLINE = 30.0
LEASE = 1.0


def fleet_config(folder: Path, url: str, host: str, pinned: dict[str, str] | None = None) -> str:
    """A fleet host's config; its agent is granted the test's folder (its gates, beside every
    host's folder): a turn's /tmp is its own."""
    (folder / "agent.py").write_text(AGENT)
    channels = "".join(f'[channels.{c}]\nhost = "{h}"\n' for c, h in (pinned or {}).items())
    return f"""
[server]
socket = "corral.sock"
cgroup = "off"
[store]
url = {json.dumps(url)}
[cluster]
host = "{host}"
lease = {LEASE}
[agents.bot]
adapter = "generic"
command = [{json.dumps(PYTHON)}, {json.dumps(str(folder / "agent.py"))}]
stop_grace = 2.0
sandbox_write = [{json.dumps(str(folder.parent))}]
{channels}"""


def rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    try:
        with psycopg.connect(url) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()
    except psycopg.OperationalError:
        return []


def texts(url: str, channel: str = "ch") -> list[str]:
    return [t for (t,) in rows(url, "SELECT text FROM entries WHERE channel = ? ORDER BY seq", (channel,))]


def until(what: str, probe: Callable[[], T | None], timeout: float = DEADLINE) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.02)  # (polling a condition; not settling)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Fleet:
    """Daemons as hosts, each in a folder of its own; all stopped at the end."""

    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url
        self.daemons: dict[str, DaemonProcess] = {}

    def start(self, host: str, pinned: dict[str, str] | None = None) -> DaemonProcess:
        folder = self.root / host
        folder.mkdir(exist_ok=True)
        self.daemons[host] = DaemonProcess(folder, fleet_config(folder, self.url, host, pinned))
        return self.daemons[host]

    def close(self) -> None:
        for daemon in self.daemons.values():
            if daemon.proc.poll() is None:
                os.kill(daemon.proc.pid, signal.SIGCONT)
                daemon.stop()


@pytest.fixture
def fleet(short_tmp: Path, postgres_url: str) -> Iterator[Fleet]:
    made = Fleet(short_tmp, postgres_url)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def gate(short_tmp: Path) -> Iterator[Gate]:
    made = Gate(short_tmp / "gate")
    try:
        yield made
    finally:
        made.open(4)  # (let any agent still blocked go)
        made.close()


def turn_on(url: str, channel: str, host: str) -> tuple[str, int] | None:
    found = rows(url, "SELECT id, pid FROM turns WHERE channel = ? AND host = ? AND pid IS NOT NULL", (channel, host))
    return (found[0][0], int(found[0][1])) if found else None


def test_a_message_sent_through_a_to_a_channel_pinned_to_b_runs_on_b_and_shows_through_a(fleet: Fleet) -> None:
    pinned = {"p": "hb"}
    a, _b, _c = fleet.start("ha", pinned), fleet.start("hb", pinned), fleet.start("hc", pinned)
    a.cli("send", "p", "hello", check=True)
    until("the reply", lambda: "done: hello" in texts(fleet.url, "p"))
    assert rows(fleet.url, "SELECT DISTINCT host FROM turns WHERE channel = 'p'") == [("hb",)]
    assert "done: hello" in a.cli("tail", "p", check=True).stdout  # read through A
    status = json.loads(a.cli("--json", "status", check=True).stdout)
    assert {h["host"] for h in status["fleet"]["hosts"]} >= {"ha", "hb"}
    assert status["fleet"]["pinned"] == {"p": {"host": "hb", "waiting": False}}
    _b.proc.kill()  # a dead host: its pinned channel waits for it, and status says so
    _b.proc.wait()
    until("ha to see hb gone", lambda: json.loads(a.cli("--json", "status", check=True).stdout)
          ["fleet"]["pinned"]["p"]["waiting"])
    a.cli("send", "p", "waits for hb", check=True)
    assert rows(fleet.url, "SELECT count(*) FROM queue WHERE channel = 'p'") == [(1,)]


def test_kill_9_of_a_host_moves_its_unpinned_channels_to_a_live_host_after_the_lease(
    fleet: Fleet, gate: Gate
) -> None:
    url = fleet.url
    a, b = fleet.start("ha"), fleet.start("hb")
    b.cli("send", "ch", f"gate={gate}", check=True)
    until("hb's turn", lambda: "ready" in texts(url))
    b.cli("send", "ch", "queued on hb", check=True)
    b.proc.kill()  # kill -9: no lease given back, no notice, nothing
    killed = time.monotonic()
    b.proc.wait()
    gate.open(2)  # (hb's orphan finishes into a closed pipe; ha's catch-up prompt names the gate too)
    until("ha to run what hb had queued",
          lambda: any(t.startswith("done:") and "queued on hb" in t for t in texts(url)))
    moved = time.monotonic() - killed
    assert moved <= LEASE + 2 + 3, moved  # (target: lease + 2 s; slack for a loaded machine)
    assert ("ha",) in rows(url, "SELECT host FROM turns WHERE channel = 'ch'")
    assert any("another host took the channel over" in t for t in texts(url))  # hb's turn, closed by ha
    ((owner, token),) = rows(url, "SELECT owner, token FROM leases WHERE channel = 'ch'")
    assert (owner, token) == ("ha", 2)
    assert a.cli("wait", "ch", "--timeout", "30").returncode == 0


def test_a_host_paused_past_its_lease_kills_its_stale_turn_on_resume_and_stores_nothing(
    fleet: Fleet, gate: Gate
) -> None:
    url = fleet.url
    a, b = fleet.start("ha"), fleet.start("hb")
    b.cli("send", "ch", f"flush gate={gate}", check=True)  # on SIGINT it prints, plans, answers
    until("hb's turn", lambda: "ready" in texts(url))
    turn_id, pid = until("hb's turn row", lambda: turn_on(url, "ch", "hb"))
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        a.cli("send", "ch", "through ha", check=True)
        until("ha to take the channel", lambda: turn_on(url, "ch", "ha"), timeout=LEASE + 10)
        stopped = a.cli("--json", "stop", "ch")  # ha owns it now; hb's process is out of its reach
        result = json.loads(stopped.stdout)
        assert result["ok"] is False and "host hb has not answered since" in result["error"], result
        assert "its processes could not be confirmed dead" in result["error"]
        assert alive(pid)  # (paused with its host: nothing could kill it yet)
        before = texts(url)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    resumed = time.monotonic()
    until("hb to kill its stale turn", lambda: not alive(pid), timeout=10)
    assert time.monotonic() - resumed <= 1.0 + 2.0  # (the brief: within a second; slack for a loaded machine)
    until("hb to answer again", lambda: json.loads(b.cli("--json", "status").stdout or "{}").get("fleet"))
    after = texts(url)
    assert not any("flushed" in t for t in after)  # the stale turn stored nothing
    assert after[: len(before)] == before
    assert rows(url, "SELECT count(*) FROM todos") == [(0,)]
    assert "lease lost" in "".join(b.log) or b.proc.poll() is None
    ((owner,),) = rows(url, "SELECT owner FROM leases WHERE channel = 'ch'")
    assert owner == "ha"
    assert turn_id not in {t for (t,) in rows(url, "SELECT id FROM turns WHERE state = 'running'")}


def test_a_stop_through_a_of_bs_running_turn(fleet: Fleet, gate: Gate) -> None:
    url = fleet.url
    a, b = fleet.start("ha"), fleet.start("hb")
    b.cli("send", "ch", f"gate={gate}", check=True)
    until("hb's turn", lambda: "ready" in texts(url))
    _, pid = until("hb's turn row", lambda: turn_on(url, "ch", "hb"))
    result = json.loads(a.cli("--json", "stop", "ch", check=True).stdout)
    assert result["ok"] and result["stopped_turns"] and result["killed"], result
    assert not alive(pid) and "Execution stopped by user." in texts(url)
    assert rows(url, "SELECT host FROM stops") == [("hb",)]


def test_a_stop_of_a_channel_whose_host_is_paused_answers_within_the_lease_and_is_honoured_on_resume(
    fleet: Fleet, gate: Gate
) -> None:
    url = fleet.url
    a, b = fleet.start("ha", {"p": "hb"}), fleet.start("hb", {"p": "hb"})
    b.cli("send", "p", f"flush gate={gate}", check=True)  # on SIGINT it prints, plans, answers
    until("hb's turn", lambda: "ready" in texts(url, "p"))
    _, pid = until("hb's turn row", lambda: turn_on(url, "p", "hb"))
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        asked = time.monotonic()
        result = json.loads(a.cli("--json", "stop", "p").stdout)
        assert time.monotonic() - asked <= LEASE + 5  # (the lease, and slack for a loaded machine)
        assert result["ok"] is False, result
        assert "host hb has not answered since" in result["error"], result
        assert "its processes could not be confirmed dead" in result["error"]
        assert alive(pid)
        ((generation,),) = rows(url, "SELECT generation FROM generations WHERE channel = 'p'")
        assert generation == result["generation"] == 1  # the record is stored
        before = texts(url, "p")
        assert before[-1].startswith("Stopping failed — host hb has not answered since")
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    resumed = time.monotonic()
    until("hb to kill its stale turn", lambda: not alive(pid), timeout=10)
    assert time.monotonic() - resumed <= 1.0 + 2.0  # (within a second; slack for a loaded machine)
    gate.open()
    b.cli("send", "p", "after the stop", check=True)
    until("hb to run p again", lambda: any(t.startswith("done:") and "after the stop" in t for t in texts(url, "p")))
    after = texts(url, "p")
    assert after[: len(before)] == before and not any("flushed" in t for t in after)  # the stale turn stored nothing
    assert rows(url, "SELECT count(*) FROM todos") == [(0,)]


def test_the_database_restarted_under_a_running_fleet(
    fleet: Fleet, postgres_server: PostgresServer, gate: Gate
) -> None:
    url = fleet.url
    a, b = fleet.start("ha"), fleet.start("hb")
    a.cli("send", "ch", "one", check=True)
    until("the reply", lambda: "done: one" in texts(url))
    a.cli("send", "ch", f"gate={gate}", check=True)
    until("ha's turn", lambda: texts(url).count("ready") == 2)
    a.cli("send", "ch", "dropped by the stop", check=True)
    stop = json.loads(b.cli("--json", "stop", "ch", check=True).stdout)  # through hb: ha carries it out
    assert stop["ok"] and stop["dropped"] == 1, stop

    postgres_server.stop()
    try:
        refused = b.cli("send", "ch", "sent while the database is down")
        # (the CLI's send carries an idempotency key: the daemon reads the key's record first)
        assert refused.returncode != 0 and re.search(r"could not (store|read the store)", refused.stderr), \
            refused.stderr  # (the code, store_failed, is --json's)
        assert a.cli("status").returncode == 0 and b.cli("status").returncode == 0  # both serve on
    finally:
        postgres_server.start()  # (the server is the session's: never left down for the next tests)

    b.cli("send", "ch", "three", check=True)
    until("the reply after the restart", lambda: any(t.startswith("done:") and "three" in t for t in texts(url)))
    got = texts(url)
    assert {"one", "done: one", f"gate={gate}", "dropped by the stop"} <= set(got)  # nothing accepted is lost
    assert "sent while the database is down" not in got
    assert not any(t.startswith("done:") and "dropped by the stop" in t.split("\n")[-1] for t in got)
    ((generation,),) = rows(url, "SELECT generation FROM generations WHERE channel = 'ch'")
    assert generation >= stop["generation"]  # the stop is not undone
    until("the queue to drain", lambda: rows(url, "SELECT count(*) FROM queue") == [(0,)])
    for daemon in (a, b):
        status = json.loads(daemon.cli("--json", "status", check=True).stdout)
        assert status["fleet"]["hosts"], status["fleet"]
