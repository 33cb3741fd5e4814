"""The fleet mode of ``scripts/chaos_stop.py`` and ``scripts/faults.py`` (``--fleet``).

Three ``corral run`` daemons (hosts ha, hb, hc) on one throwaway PostgreSQL server (started
as the tests start theirs, ``scripts/_postgres.py``), lease ``--lease`` seconds. Each trial
uses a fresh channel, pinned to a host drawn at random or unpinned (then it runs where it
was sent), sends a job through one host and stops it through another drawn at random (most
often a host that does not own the channel).

The agent writes its pid to a file named for the message, says "ready", and waits; on
SIGINT it prints ``FLUSHED`` (leftover output, never to be stored) and exits.

Stop trials (``chaos_stop.py --fleet``): the stop lands right after the send, after 0-300 ms,
or once the agent said "ready", sometimes with a second message queued behind. Checked: the
stop answers ``ok``; exactly one notice; no entry of a stopped turn after its notice and no
``FLUSHED`` ever; the queued message never runs; the agent's process is dead when the stop
returns; a follow-up sent through a third host runs (the channel is not wedged).

Fault trials (``faults.py --fleet``): the owner is paused (SIGSTOP) or killed (SIGKILL)
mid-turn, and the stop goes through another host. Checked: the stop answers ``ok: false``
within the lease plus a margin, naming the silent host; a paused owner, resumed, kills its
stale turn within 2 s and stores nothing for the channel after the notice; a killed owner,
restarted, kills the orphan (its turn's process is dead once it is ready again); a
follow-up runs.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from scripts._bench import Daemon
from scripts._config import toml
from scripts._trials import run as trials_run
from supervisor.serve.client import Client
from supervisor.testing import read_pid

T = TypeVar("T")
HOSTS = ("ha", "hb", "hc")

AGENT = r"""
import os, signal, sys, time
text = sys.argv[-1]
def flush(*_):
    print("FLUSHED " + text, flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, flush)
folder = os.environ["CHAOS_PIDS"]
with open(os.path.join(folder, text.split()[-1]), "w") as fh:
    fh.write(f"{os.getpid()} {os.stat('/proc/self/ns/pid').st_ino}")  # the sandbox's pid and namespace
if text.startswith("quick"):
    print("done " + text, flush=True)
    sys.exit(0)
print("ready", flush=True)
time.sleep(3600)
"""


def config(
    folder: Path, url: str, host: str, lease: float, pinned: dict[str, str], *, env: dict[str, str] | None = None
) -> str:
    """A fleet host's config: the store, the cluster, the agent (``agent.py`` beside the hosts'
    folders, with ``env``), the pinned channels. Shared with ``bench_fleet``."""
    return toml({
        "server": {"socket": "corral.sock", "cgroup": "off"},
        "store": {"url": url},
        "cluster": {"host": host, "lease": lease},
        "agents.bot": {
            "adapter": "generic", "command": [sys.executable, str(folder.parent / "agent.py")], "stop_grace": 2,
            "env": env or {}, "sandbox_write": [v for k, v in (env or {}).items() if k == "CHAOS_PIDS"],
        },
        **{f"channels.{c}": {"host": h} for c, h in pinned.items()},
    })


def until(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """Poll a condition under a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class Fleet:
    """Three daemons on one database, and the checks' reads."""

    def __init__(self, url: str, root: Path, lease: float, pinned: dict[str, str]) -> None:
        self.url, self.root, self.lease, self.pinned = url, root, lease, pinned
        (root / "agent.py").write_text(AGENT)
        (root / "pids").mkdir()
        self.daemons: dict[str, Daemon] = {}
        for host in HOSTS:
            self.start(host)

    def start(self, host: str) -> None:
        """(Re)start a host's daemon in its folder."""
        folder = self.root / host
        folder.mkdir(exist_ok=True)
        pids = {"CHAOS_PIDS": str(folder.parent / "pids")}
        self.daemons[host] = Daemon(folder, config(folder, self.url, host, self.lease, self.pinned, env=pids))

    def client(self, host: str) -> Client:
        """A client of the host's daemon."""
        return Client(str(self.daemons[host].socket))

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows from the database."""
        import psycopg

        with psycopg.connect(self.url) as conn:
            return conn.execute(sql, params).fetchall()

    def pid(self, name: str) -> int | None:
        """The pid the agent of message ``name`` wrote (as this process sees it), if it
        started and is alive: a pid its sandbox no longer has is a process that is gone."""
        try:
            return read_pid(self.root / "pids" / name)
        except (OSError, ValueError, LookupError):
            return None

    def owner(self, channel: str) -> str | None:
        """The host whose turn row for the channel is the latest."""
        found = self.rows("SELECT host FROM turns WHERE channel = %s ORDER BY began DESC LIMIT 1", (channel,))
        return str(found[0][0]) if found else None

    def close(self) -> None:
        """Stop every daemon (resuming a paused one first)."""
        for daemon in self.daemons.values():
            if daemon.alive():
                os.kill(daemon.pid, signal.SIGCONT)
                daemon.stop()


def check_stop(fleet: Fleet, channel: str, result: dict[str, Any], names: list[str]) -> list[str]:
    """The contract lines a finished stop must show; the violated ones' kinds."""
    bad = []
    notices = fleet.rows("SELECT seq FROM entries WHERE channel = %s AND kind = 'notice' AND author = 'system'"
                         " AND text ILIKE %s", (channel, "%stop%"))
    if len(notices) != 1:
        bad.append("notices-not-one")
    if result.get("notice_seq") is not None:
        stopped = list(result.get("stopped_turns") or [])
        late = fleet.rows("SELECT count(*) FROM entries WHERE channel = %s AND seq > %s AND turn = ANY(%s)",
                          (channel, result["notice_seq"], stopped))
        if late[0][0]:
            bad.append("entry-after-notice")
    if fleet.rows("SELECT count(*) FROM entries WHERE channel = %s AND text LIKE 'FLUSHED%%'", (channel,))[0][0]:
        bad.append("leftover-output-stored")
    return bad


MOMENTS = ("at-once", "delay", "ready")


def stop_trial(
    fleet: Fleet, rng: random.Random, i: int, moments: tuple[str, ...] = MOMENTS
) -> tuple[list[str], dict[str, Any]]:
    """One stop trial; the violations' kinds and what was drawn."""
    channel = f"t{i}"
    via_send, via_stop, via_after = (rng.choice(HOSTS) for _ in range(3))
    moment = rng.choice(moments)
    queued = rng.random() < 0.4
    drawn: dict[str, Any] = {"channel": channel, "pinned": fleet.pinned.get(channel), "send": via_send,
                             "stop": via_stop, "moment": moment, "queued": queued}
    names = [f"{channel}a"]
    with fleet.client(via_send) as c:
        c.send(channel, f"wait {names[0]}")
        if queued:
            names.append(f"{channel}b")
            c.send(channel, f"wait {names[1]}")
    if moment == "delay":
        time.sleep(rng.uniform(0, 0.3))
    elif moment == "ready":
        until("ready", lambda: fleet.rows("SELECT 1 FROM entries WHERE channel = %s AND text = 'ready'", (channel,)))
    with fleet.client(via_stop) as c:
        result = c.stop(channel)
    drawn["owner"] = fleet.owner(channel)
    drawn["cross_host"] = drawn["owner"] is not None and drawn["owner"] != via_stop
    drawn["stopped_turn"] = bool(result.get("stopped_turns"))
    pids = [p for p in (fleet.pid(n) for n in names) if p is not None]
    bad = [] if result.get("ok") else ["stop-not-ok"]
    bad += ["alive-when-stop-returned" for p in pids if alive(p)]
    bad += check_stop(fleet, channel, result, names)
    with fleet.client(via_after) as c:
        c.send(channel, f"quick {channel}c")
    try:
        until("the follow-up", lambda: fleet.rows("SELECT 1 FROM entries WHERE channel = %s AND text LIKE 'done%%'",
                                                  (channel,)))
    except TimeoutError:
        bad.append("follow-up-never-ran")
    if queued and fleet.pid(names[1]) is not None:
        bad.append("dropped-message-ran")
    bad += check_stop(fleet, channel, result, names)
    return sorted(set(bad)), drawn


def fault_trial(fleet: Fleet, rng: random.Random, i: int) -> tuple[list[str], dict[str, Any]]:
    """One fault trial: the owner paused or killed mid-turn, the stop through another host."""
    channel = f"t{i}"
    fault = rng.choice(("sigstop", "sigkill"))
    owner = fleet.pinned.get(channel) or rng.choice(HOSTS)
    via_stop = rng.choice([h for h in HOSTS if h != owner])
    drawn: dict[str, Any] = {"channel": channel, "fault": fault, "owner": owner, "stop": via_stop}
    name = f"{channel}a"
    with fleet.client(owner) as c:
        c.send(channel, f"wait {name}")
    until("ready", lambda: fleet.rows("SELECT 1 FROM entries WHERE channel = %s AND text = 'ready'", (channel,)))
    pid = fleet.pid(name)
    daemon = fleet.daemons[owner]
    os.kill(daemon.pid, signal.SIGSTOP if fault == "sigstop" else signal.SIGKILL)
    bad = []
    began = time.monotonic()
    answer: dict[str, Any] = {}

    def stop() -> None:
        with fleet.client(via_stop) as c:
            answer.update(c.stop(channel))

    caller = threading.Thread(target=stop, daemon=True)
    caller.start()
    caller.join(fleet.lease + 10)
    if caller.is_alive():  # (a stop that waits on the silent host: resume it, so the run goes on)
        bad.append("stop-hung")
        if fault == "sigstop":
            os.kill(daemon.pid, signal.SIGCONT)
        caller.join(120)
    result = answer
    took = time.monotonic() - began
    drawn["stop_s"] = round(took, 2)
    if result.get("ok") or owner not in str(result.get("error")):
        bad.append("stop-not-honest")
    if took > fleet.lease + 3:
        bad.append("stop-answered-late")
    notice_seq = result.get("notice_seq")
    if fault == "sigstop":
        os.kill(daemon.pid, signal.SIGCONT)
    else:
        daemon.proc.wait()
        fleet.start(owner)  # its recovery kills the orphan before it is ready
    try:
        until("the stale turn to die", lambda: pid is None or not alive(pid), timeout=2.0 if fault == "sigstop" else 5)
    except TimeoutError:
        bad.append("stale-turn-alive")
        if pid is not None:
            os.kill(pid, signal.SIGKILL)  # (the script's own agent, by pid)
    with fleet.client(via_stop) as c:
        c.send(channel, f"quick {channel}c")
    try:
        until("the follow-up", lambda: fleet.rows("SELECT 1 FROM entries WHERE channel = %s AND text LIKE 'done%%'",
                                                  (channel,)), timeout=fleet.lease * 3 + 10)
    except TimeoutError:
        bad.append("follow-up-never-ran")
    if notice_seq is not None and fleet.rows(
        "SELECT count(*) FROM entries e JOIN turns t ON t.id = e.turn WHERE e.channel = %s AND e.seq > %s"
        " AND t.host = %s AND t.message < %s", (channel, notice_seq, owner, notice_seq))[0][0]:
        bad.append("stale-host-stored-after-notice")
    if fleet.rows("SELECT count(*) FROM entries WHERE channel = %s AND text LIKE 'FLUSHED%%'", (channel,))[0][0]:
        bad.append("leftover-output-stored")
    return sorted(set(bad)), drawn


def run(trials: int, seed: int, lease: float, *, faults: bool, moments: tuple[str, ...] = MOMENTS) -> dict[str, Any]:
    """Run the trials on a throwaway server; the summary."""
    shape: Counter[str] = Counter()

    def fleet(server: Any, root: Path, rng: random.Random) -> Fleet:
        pinned = {f"t{i}": rng.choice(HOSTS) for i in range(trials) if rng.random() < (1.0 if faults else 0.5)}
        return Fleet(server.new_database(), root, lease, pinned)

    def one(fleet: Fleet, rng: random.Random, i: int) -> tuple[list[str], dict[str, Any]]:
        bad, drawn = fault_trial(fleet, rng, i) if faults else stop_trial(fleet, rng, i, moments)
        shape.update(k for k in ("cross_host", "stopped_turn", "queued") if drawn.get(k))
        shape.update(str(drawn[k]) for k in ("fault", "moment") if k in drawn)
        return bad, drawn

    return trials_run(
        "fleet-faults" if faults else "fleet-stops", trials=trials, seed=seed, lease=lease, hosts=len(HOSTS),
        fleet=fleet, trial=one, extra=lambda: {"drawn": dict(shape)}, prefix="corral-cf-", called="fleet",
    )
