"""A fleet under network faults: the harness of ``faults.py --fleet --partition``, of
``bench_fleet``'s partition figures and of ``tests/test_fleet_partition.py``.

Two or three ``corral run`` daemons on one throwaway PostgreSQL server (started as the
tests start theirs, ``scripts/_postgres.py``), each host connecting over TCP to a fault proxy
of its own on 127.0.0.1 (:mod:`scripts._faultproxy`), the proxy to the server's Unix socket.
The harness reads the database directly, never through a proxy.

The agent writes ``PID HOST START`` (``START``: ``time.monotonic()``, one clock for every
process of the machine) to a file named for the message's last word, says "ready" and waits
(``quick``: answers and exits; ``stubborn``: ignores SIGINT, so only SIGKILL ends it before
its stop grace is up — the owner's first agent in the cut trials, where a polite kill would
overlap the next owner's turn). A watcher per agent process waits on its pidfd and notes the
moment it dies, so each turn's processes have an interval of life, and the overlap of two
hosts' intervals on one channel is measured, not sampled (:func:`largest_overlap`).

Trials (``run``), each on a fresh channel owned by a host drawn at random, the agent
running; one fault each:

* ``owner-cut``: the owner's database blackholed (a cut cable) mid-turn; a message sent
  through another host must begin there once the lease runs out, and the owner's agent must
  be dead before it begins; healed, the owner must serve again without a restart;
* ``stop-while-cut``: the same cut, and a stop through another host: answered within the
  lease plus :data:`STOP_BOUND`, ``ok`` or ``ok: false`` naming the owner, the owner's agent
  dead by then; healed, nothing of the owner's turn stored after the stop's notice, and a
  follow-up through the owner runs;
* ``stop-via-cut-owner``: the same cut, and the stop through the cut-off owner itself:
  answered within the lease plus the bound (``ok: false``: its record cannot be stored),
  its agent dead by then (its lease could not be renewed); healed, a follow-up runs;
* ``heal-early``: the cut heals after a quarter of the lease: nothing moves (same owner and
  token, the agent alive), then a stop through the owner ends it;
* ``notices-cut``: only the hosts' notices cut (their LISTEN connections blackholed), the
  database reachable: a stop through another host is answered within the lease plus the
  bound (the owner never hears it: the asker takes the lease by force), a follow-up sent at
  once runs, never beside the owner's agent, which is dead within a lease of the answer;
* ``db-cut``: the database cut from every host: every host kills its turns by its local
  deadline; healed, a message runs;
* ``reset``: the owner's connections reset mid-turn: no overlap, and a follow-up runs;
* ``slow``: every answer to the owner delayed 50-300 ms (jittered): its lease holds (nothing
  moves, the agent alive) while renewals get through within the lease.

Checked in every trial: no two hosts' agents of the channel alive at once (the largest
overlap, target 0); nothing stored by a turn after the stop's notice, no ``FLUSHED``
leftover; every message sent ran at most once (at most one turn row begun for it: a turn
cut short by its host's loss is closed with a notice, never run again) and ran unless a stop
dropped it or its host was lost mid-turn.
"""

from __future__ import annotations

import json
import os
import random
import select
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scripts._bench import Daemon
from scripts._chaos_fleet import config as fleet_config
from scripts._chaos_fleet import until
from scripts._faultproxy import FaultProxy
from scripts._trials import run as trials_run
from supervisor.serve.client import Client
from supervisor.testing import host_pid

#: What a stop through a survivor may take beyond the lease (the forced takeover, the take-over
#: read, the stop itself) while the owner is cut off.
STOP_BOUND = 3.0
FAULTS = ("owner-cut", "stop-while-cut", "stop-via-cut-owner", "heal-early", "notices-cut", "db-cut", "reset", "slow")

AGENT = r"""
import os, signal, sys, time
text = sys.argv[-1]
start = time.monotonic()
def flush(*_):
    print("FLUSHED " + text, flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, signal.SIG_IGN if text.startswith("stubborn") else flush)
with open(os.path.join(os.environ["CHAOS_PIDS"], text.split()[-1]), "w") as fh:
    # Its pid in its sandbox's pid namespace, and the namespace: the harness reads the host's pid.
    fh.write(f"{os.getpid()} {os.stat('/proc/self/ns/pid').st_ino} {os.environ['CHAOS_HOST']} {start}")
if text.startswith("quick"):
    print("done " + text, flush=True)
    sys.exit(0)
print("ready", flush=True)
time.sleep(3600)
"""


def largest_overlap(lives: Iterable[tuple[str, float, float]]) -> float:
    """(Pure) the longest time two processes of different hosts were alive at once, from
    ``(host, start, end)`` intervals (0.0: never)."""
    spans = list(lives)
    worst = 0.0
    for i, (host, start, end) in enumerate(spans):
        for other, start2, end2 in spans[i + 1:]:
            if other != host:
                worst = max(worst, min(end, end2) - max(start, start2))
    return worst


class Life:
    """One agent process: its host, start, and (once it died) its end, from its pidfd."""

    def __init__(self, pid: int, host: str, start: float) -> None:
        self.pid, self.host, self.start = pid, host, start
        self.end: float | None = None
        self._dead = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        try:
            if self.pid <= 0:  # (gone before its pid could be read: see Partition.life)
                raise ProcessLookupError
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self.end = time.monotonic()  # (already gone: an upper bound)
            self._dead.set()
            return
        try:
            select.select([fd], [], [])
            self.end = time.monotonic()
        finally:
            os.close(fd)
            self._dead.set()

    def alive(self) -> bool:
        """Not dead yet."""
        return not self._dead.is_set()

    def wait_dead(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for its death."""
        return self._dead.wait(timeout)

    def span(self) -> tuple[str, float, float]:
        """``(host, start, end)``, the end being now while it lives."""
        return self.host, self.start, self.end if self.end is not None else time.monotonic()


class PartitionFleet:
    """Daemons on one database, each through a fault proxy of its own."""

    def __init__(self, server: Any, root: Path, lease: float, hosts: tuple[str, ...] = ("ha", "hb")) -> None:
        from psycopg.conninfo import conninfo_to_dict

        self.root, self.lease, self.hosts = root, lease, hosts
        self.url = server.new_database()
        database = str(conninfo_to_dict(self.url)["dbname"])
        (root / "agent.py").write_text(AGENT)
        (root / "pids").mkdir()
        self.proxies = {h: FaultProxy(str(server.folder / ".s.PGSQL.5432"), h) for h in hosts}
        self._database = database
        self.daemons: dict[str, Daemon] = {}
        self.lives: dict[str, Life] = {}
        self._conn: Any = None
        for host in hosts:
            self.start(host)

    def start(self, host: str) -> None:
        """(Re)start a host's daemon, connecting through its proxy."""
        folder = self.root / host
        folder.mkdir(exist_ok=True)
        env = {"CHAOS_PIDS": str(self.root / "pids"), "CHAOS_HOST": host}
        text = fleet_config(folder, self.proxies[host].url(self._database), host, self.lease, {}, env=env)
        self.daemons[host] = Daemon(folder, text)

    def client(self, host: str) -> Client:
        """A client of the host's daemon."""
        return Client(str(self.daemons[host].socket))

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows from the database (directly, not through a proxy), on one connection of the
        harness's own, opened again (up to 10 times, 0.5 s apart) if it fails: the harness's
        reads must not fail a trial for the machine's sake."""
        import psycopg

        for attempt in range(10):
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = psycopg.connect(self.url, autocommit=True)
                found: list[tuple[Any, ...]] = self._conn.execute(sql, params).fetchall()
                return found
            except psycopg.OperationalError:
                if attempt == 9:
                    raise
                time.sleep(0.5)  # (a connection refused for a moment: try again)
        raise AssertionError("unreachable")

    def life(self, name: str, timeout: float = 30.0) -> Life:
        """The agent process of message ``name`` (waits for it to start)."""
        if name not in self.lives:
            path = self.root / "pids" / name

            def read() -> tuple[int, str, float] | None:
                try:
                    pid, ns, host, start = path.read_text().split()
                    # Read while the agent runs: it has written the file and not yet exited.
                    return host_pid(int(pid), int(ns)), host, float(start)
                except (OSError, ValueError):
                    return None
                except LookupError:  # (already gone: a quick message's agent)
                    return -1, host, float(start)

            pid, host, start = until(f"the agent of {name}", read, timeout)
            self.lives[name] = Life(pid, host, start)
        return self.lives[name]

    def started(self, name: str) -> bool:
        """The agent of message ``name`` has started."""
        return (self.root / "pids" / name).exists()

    def ready(self, channel: str, count: int = 1) -> bool:
        """The channel's agents said "ready" ``count`` times."""
        found = self.rows("SELECT count(*) FROM entries WHERE channel = %s AND text = 'ready'", (channel,))
        return int(found[0][0]) >= count

    def lease_of(self, channel: str) -> tuple[str, int] | None:
        """The channel's lease: owner and token."""
        found = self.rows("SELECT owner, token FROM leases WHERE channel = %s", (channel,))
        return (str(found[0][0]), int(found[0][1])) if found else None

    def heartbeat(self, host: str) -> float:
        """The host's last heartbeat (database clock)."""
        found = self.rows("SELECT heartbeat FROM hosts WHERE host = %s", (host,))
        return float(found[0][0]) if found else 0.0

    def rejoined(self, host: str, timeout: float = 30.0) -> None:
        """Wait until the host's heartbeats reach the database again (two in a row)."""
        first = self.heartbeat(host)
        second = until(f"{host}'s heartbeat", lambda: (b := self.heartbeat(host)) > first and b, timeout)
        until(f"{host}'s next heartbeat", lambda: self.heartbeat(host) > second, timeout)

    def overlap(self, names: Iterable[str]) -> float:
        """The largest overlap of different hosts' agents among messages ``names`` that started."""
        return largest_overlap(self.lives[n].span() for n in names if n in self.lives)

    def heal(self) -> None:
        """Every proxy forwards again."""
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        """Heal, stop every daemon, close the proxies, kill any agent still alive (by pid)."""
        self.heal()
        for daemon in self.daemons.values():
            if daemon.alive():
                daemon.stop()
        for proxy in self.proxies.values():
            proxy.close()
        if self._conn is not None:
            self._conn.close()
        for life in self.lives.values():
            if life.alive():
                try:
                    os.kill(life.pid, 9)  # (this harness's own agent, by its pid)
                except ProcessLookupError:
                    pass


def check_messages(fleet: PartitionFleet, channel: str) -> list[str]:
    """At most once, and unless dropped or cut short by its host's loss, once: the
    violated kinds."""
    bad = []
    for seq, meta in fleet.rows("SELECT seq, meta FROM entries WHERE channel = %s AND author LIKE 'human:%%'",
                                (channel,)):
        begun = int(fleet.rows("SELECT count(*) FROM turns WHERE message = %s", (seq,))[0][0])
        if begun > 1:
            bad.append("message-ran-twice")
        elif begun == 0 and "dropped_by_stop" not in json.loads(meta):
            queued = fleet.rows("SELECT count(*) FROM queue WHERE seq = %s", (seq,))[0][0]
            bad.append("message-still-queued" if queued else "message-lost")
    return bad


def check_after_notice(fleet: PartitionFleet, channel: str, result: dict[str, Any]) -> list[str]:
    """Nothing of a stopped turn stored after the stop's notice, and no leftover output."""
    bad = []
    notice, stopped = result.get("notice_seq"), list(result.get("stopped_turns") or [])
    if notice is not None and stopped and fleet.rows(
        "SELECT count(*) FROM entries WHERE channel = %s AND pos > (SELECT pos FROM entries WHERE seq = %s)"
        " AND turn = ANY(%s)", (channel, notice, stopped))[0][0]:
        bad.append("stored-after-notice")
    if fleet.rows("SELECT count(*) FROM entries WHERE channel = %s AND text LIKE 'FLUSHED%%'", (channel,))[0][0]:
        bad.append("leftover-output-stored")
    return bad


def _follow_up(fleet: PartitionFleet, channel: str, via: str, name: str, timeout: float) -> list[str]:
    with fleet.client(via) as c:
        c.send(channel, f"quick {name}")
    try:
        until("the follow-up", lambda: fleet.rows(
            "SELECT 1 FROM entries WHERE channel = %s AND text = %s", (channel, f"done quick {name}")), timeout)
    except TimeoutError:
        return ["follow-up-never-ran"]
    return []


def _timed_stop(
    fleet: PartitionFleet, via: str, channel: str, since: float, lease: float, drawn: dict[str, Any], bad: list[str]
) -> dict[str, Any]:
    """A stop of ``channel`` through host ``via``: its answer, its time from ``since`` into
    ``drawn["stop_s"]``, and ``stop-answered-late`` into ``bad`` past the lease plus the bound."""
    with fleet.client(via) as c:
        result: dict[str, Any] = c.stop(channel)
    took = time.monotonic() - since
    drawn["stop_s"] = round(took, 3)
    if took > lease + STOP_BOUND:
        bad.append("stop-answered-late")
    return result


def trial(fleet: PartitionFleet, rng: random.Random, i: int, fault: str) -> tuple[list[str], dict[str, Any]]:
    """One trial of ``fault`` on channel ``p{i}``; the violated kinds and what was measured."""
    lease = fleet.lease
    channel = f"p{i}"
    owner = rng.choice(fleet.hosts)
    other = rng.choice([h for h in fleet.hosts if h != owner])
    drawn: dict[str, Any] = {"channel": channel, "fault": fault, "owner": owner, "via": other}
    first = f"{channel}a"
    with fleet.client(owner) as c:
        stubborn = fault in ("owner-cut", "stop-while-cut", "stop-via-cut-owner", "db-cut")
        c.send(channel, f"{'stubborn' if stubborn else 'wait'} {first}")
    until("ready", lambda: fleet.ready(channel), 30)
    life = fleet.life(first)
    names = [first]
    bad: list[str] = []
    proxy = fleet.proxies[owner]
    taken = fleet.lease_of(channel)
    wait = lease * 3 + 15  # (generous: a loaded machine; the figures say how long it really took)
    if fault in ("owner-cut", "stop-while-cut"):
        proxy.blackhole()
        cut = time.monotonic()
        if fault == "owner-cut":
            nxt = f"{channel}b"
            with fleet.client(other) as c:
                c.send(channel, f"wait {nxt}")
            names.append(nxt)
            try:
                began = fleet.life(nxt, timeout=wait)
                drawn["moved_s"] = round(began.start - cut, 3)
                if began.host == owner:
                    bad.append("ran-on-the-cut-host")
            except TimeoutError:
                bad.append("channel-never-moved")
            drawn["owner_killed_s"] = round((life.end or time.monotonic()) - cut, 3) if not life.alive() else None
            proxy.heal()
            with fleet.client(other) as c:
                result = c.stop(channel)
            bad += check_after_notice(fleet, channel, result)
        else:
            result = _timed_stop(fleet, other, channel, cut, lease, drawn, bad)
            if not result.get("ok") and owner not in str(result.get("error")):
                bad.append("stop-not-honest")
            if life.alive():
                bad.append("alive-when-stop-returned")
            proxy.heal()
            bad += check_after_notice(fleet, channel, result)
        try:
            fleet.rejoined(owner, wait)
        except TimeoutError:
            bad.append("host-never-rejoined")
        bad += _follow_up(fleet, channel, owner, f"{channel}z", wait)
    elif fault == "stop-via-cut-owner":
        proxy.blackhole()
        cut = time.monotonic()
        result = _timed_stop(fleet, owner, channel, cut, lease, drawn, bad)
        if result.get("ok"):
            bad.append("stop-ok-though-unrecorded")
        if not life.wait_dead(1.0):
            bad.append("alive-when-stop-returned")
        proxy.heal()
        try:
            fleet.rejoined(owner, wait)
        except TimeoutError:
            bad.append("host-never-rejoined")
        bad += check_after_notice(fleet, channel, result)
        bad += _follow_up(fleet, channel, other, f"{channel}z", wait)
    elif fault == "heal-early":
        proxy.blackhole()
        time.sleep(lease / 4)  # (the fault's length)
        proxy.heal()
        fleet.rejoined(owner, wait)
        if not life.alive():
            bad.append("killed-though-healed-in-time")
        if fleet.lease_of(channel) != taken:
            bad.append("lease-moved-though-healed-in-time")
        with fleet.client(owner) as c:
            result = c.stop(channel)
        if not result.get("ok"):
            bad.append("stop-not-ok")
        bad += check_after_notice(fleet, channel, result)
        bad += _follow_up(fleet, channel, other, f"{channel}z", wait)
    elif fault == "notices-cut":
        for p in fleet.proxies.values():
            p.blackhole(notices_only=True)
        result = _timed_stop(fleet, other, channel, time.monotonic(), lease, drawn, bad)
        if not result.get("ok") and owner not in str(result.get("error")):
            bad.append("stop-not-honest")
        # At once: the next owner's turn may not begin while the owner's may still live.
        bad += _follow_up(fleet, channel, other, f"{channel}z", wait)
        if not life.wait_dead(lease + 2):
            bad.append("stopped-turn-alive-a-lease-later")
        fleet.heal()
        bad += check_after_notice(fleet, channel, result)
    elif fault == "db-cut":
        for p in fleet.proxies.values():
            p.blackhole()
        cut = time.monotonic()
        if not life.wait_dead(lease + 2):
            bad.append("turn-alive-after-its-lease")
        drawn["owner_killed_s"] = round((life.end or time.monotonic()) - cut, 3)
        fleet.heal()
        for host in fleet.hosts:
            try:
                fleet.rejoined(host, wait)
            except TimeoutError:
                bad.append("host-never-rejoined")
        bad += _follow_up(fleet, channel, other, f"{channel}z", wait)
    elif fault == "reset":
        proxy.reset()
        with fleet.client(other) as c:
            result = c.stop(channel)
        bad += check_after_notice(fleet, channel, result)
        bad += _follow_up(fleet, channel, other, f"{channel}z", wait)
    elif fault == "slow":
        proxy.delay(0.05, 0.3, seed=i)
        try:
            fleet.rejoined(owner, wait)
            fleet.rejoined(owner, wait)
        finally:
            proxy.heal()
        if not life.alive():
            bad.append("killed-on-a-slow-database")
        if fleet.lease_of(channel) != taken:
            bad.append("lease-moved-on-a-slow-database")
        with fleet.client(owner) as c:
            result = c.stop(channel)
        if not result.get("ok"):
            bad.append("stop-not-ok")
        bad += _follow_up(fleet, channel, other, f"{channel}z", wait)
    else:
        raise ValueError(f"unknown fault {fault!r}")
    for name in [f"{channel}y", f"{channel}z"]:
        if fleet.started(name):
            fleet.life(name)
            names.append(name)
    if not life.wait_dead(10):
        bad.append("agent-outlived-the-trial")
    overlap = fleet.overlap(names)
    drawn["overlap_s"] = round(overlap, 4)
    if overlap > 0:
        bad.append("two-hosts-ran-the-channel-at-once")
    bad += check_messages(fleet, channel)
    return sorted(set(bad)), drawn


def run(trials: int, seed: int, lease: float, *, only: tuple[str, ...] = FAULTS) -> dict[str, Any]:
    """Run the partition trials on a throwaway server; the summary."""
    per_fault: Counter[str] = Counter()
    figures: dict[str, list[float]] = {"moved_s": [], "stop_s": [], "overlap_s": [], "owner_killed_s": []}

    def one(fleet: PartitionFleet, rng: random.Random, i: int) -> tuple[list[str], dict[str, Any]]:
        fault = only[i % len(only)] if trials >= len(only) else rng.choice(only)
        bad, drawn = trial(fleet, rng, i, fault)
        per_fault[fault] += 1
        for key in list(figures):
            if drawn.get(key) is not None and "/" not in key:
                figures[key].append(float(drawn[key]))
                figures.setdefault(f"{key}/{fault}", []).append(float(drawn[key]))
        return bad, drawn

    def extra() -> dict[str, Any]:
        return {
            "faults": dict(per_fault),
            "figures": {k: {"n": len(v), "max": max(v), "median": sorted(v)[len(v) // 2]} for k, v in figures.items()
                        if v},
        }

    return trials_run(
        "fleet-partition", trials=trials, seed=seed, lease=lease, hosts=3,
        fleet=lambda server, root, rng: PartitionFleet(server, root, lease, ("ha", "hb", "hc")),
        trial=one, extra=extra, prefix="corral-pt-", called="fleet partition",
    )
