#!/usr/bin/env python
"""Randomized fault trials against real ``corral run`` daemons; exit 1 on any violation.

Run it as ``.venv/bin/python -m scripts.faults`` (``--trials N``, default 1000; ``--quick``
for one trial of each fault; ``--seed S`` to replay; ``--only KIND,...`` to pick faults;
``--jobs N`` to split the trials over N worker processes, each with its own daemon and folder;
``--json`` for a machine-readable summary). Everything runs in a temporary folder: daemons on
a Unix socket there and a loopback TCP port with a token, agents (``scripts/_chaos_agent.py``)
with HOME there; the process scans only ever count and kill processes whose HOME lies there.

Faults (a trial injects one, at a random moment):

* ``kill9:accept`` — SIGKILL while a message is being accepted (the request in flight);
* ``kill9:mid-turn`` — SIGKILL while a turn runs its tool (a setsid grandchild and a
  daemonized great-grandchild alive);
* ``kill9:mid-stop`` — SIGKILL while a stop waits out the grace of an agent ignoring SIGINT;
* ``kill9:mid-shutdown`` — SIGKILL while an orderly shutdown (SIGTERM) waits out that grace;
* ``signal:NAME`` — every catchable signal whose default would end the daemon, mid-turn (the
  daemon handles each, except the crash signals SEGV, BUS, FPE, ILL, ABRT, SYS and TRAP: one of
  those may end it, and is then judged like ``kill -9``, by what the restart recovers);
* ``poison`` — lone surrogates and NULs in messages and in agent output, next to clean sends;
* ``abort:unix`` / ``abort:tcp`` — requests abandoned mid-body or mid-header (a shutdown and
  a stop announcing a body never sent, on the Unix socket and on TCP without a token);
* ``two-owners`` — a second ``corral run`` on the same store;
* ``enospc`` — the store on a tiny tmpfs filled up, messages and a stop sent, space freed,
  the daemon restarted (needs root to mount; skipped with the reason otherwise);
* ``eio`` — an embedded supervisor whose store commits fail with "disk I/O error" at a random
  write (no real device fails on demand), then reopened.

After each trial the invariants, each a line of the stop contract:

* ``daemon-alive`` — the daemon survived a fault that must not end it (the script restarts
  it after a kill or an orderly exit);
* ``ran-once`` — every accepted message ran exactly once, or was dropped by a stop that said so;
* ``nothing-after-stop`` — nothing of a stopped turn ran after its stop's record;
* ``no-survivor`` — no process of a turn survives its stop, the daemon's exit, or a restart
  (a marked process of a turn the new daemon did not start: by the turn id, then by ancestry);
* ``transcript`` — every channel in seq order; each stopped turn's notice last; each turn cut
  by a death or a shutdown ends with an entry saying so;
* ``answers`` — a well-formed request gets a well-formed answer: no 500, a stop that fails
  says so, a refused owner names the store.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts._api import APIError, Client, DaemonUnavailable
from scripts._bench import MARKER, REPO, Daemon, Found, kill_by_pid, marker_processes, short_tmp, sweep_leftovers
from scripts._config import toml

WAIT_S = 30.0
STOP_GRACE = 0.6
AGENT = REPO / "scripts" / "_chaos_agent.py"
#: Signals whose default action ends a process and that a process may catch.
SIGNALS = [
    s
    for s in (
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGUSR1",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGVTALRM",
        "SIGPROF",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
        "SIGTRAP",
        "SIGABRT",
        "SIGSEGV",
        "SIGBUS",
        "SIGFPE",
        "SIGILL",
    )
    if hasattr(signal, s)
]
#: The signals of a crash (a hardware fault, an abort, a bad system call): the daemon does not
#: handle them — after one its state is not to be trusted — so one may end it, and is then
#: judged like ``kill -9``: the restart must find and end what it left, and mark its turns.
CRASH_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGSYS", "SIGTRAP"}
KINDS = [
    "kill9:accept",
    "kill9:mid-turn",
    "kill9:mid-stop",
    "kill9:mid-shutdown",
    *[f"signal:{s}" for s in SIGNALS],
    "poison",
    "abort:unix",
    "abort:tcp",
    "two-owners",
    "enospc",
    "eio",
]


def config_text(folder: Path, store: str = "corral.db", port: int | None = None, *, disk_reserve: bool = True) -> str:
    """A daemon with the chaos agent (plain and SIGINT-ignoring), a TCP listener with a token;
    without ``disk_reserve`` (a store on a disk smaller than the reserve: the full-disk trial),
    ``[server] disk_reserve = 0``."""
    server: dict[str, Any] = {"socket": "corral.sock"}
    if port:
        server |= {"tcp": f"127.0.0.1:{port}", "token_file": "token"}
    if not disk_reserve:
        server["disk_reserve"] = 0

    def chaos_agent(command: list[str]) -> dict[str, Any]:
        return {"adapter": "generic", "sandbox_write": [str(folder)], "command": [*command, sys.executable, str(AGENT)],
                "env": {"CHAOS_DIR": str(folder)}}

    return toml({
        "server": server,
        "store": {"path": store},
        "defaults": {"agent": "plain", "stop_grace": STOP_GRACE},
        "agents.plain": chaos_agent([]),
        "agents.stubborn": chaos_agent(["env", "--ignore-signal=INT"]),
    })


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- what happened, what it means


@dataclass
class Message:
    """A message the script sent and the daemon accepted (or may have)."""

    ident: str
    channel: str
    seq: int | None
    generation: int | None
    sure: bool
    """The daemon answered 202 (else the request was cut by the fault: it may or may not be in)."""


@dataclass
class Stop:
    """A stop the daemon answered."""

    channel: str
    result: dict[str, Any]
    returned: float
    """time.monotonic() when the answer arrived."""


@dataclass
class Book:
    """Everything the current trial did, for the invariants."""

    messages: list[Message] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    channels: set[str] = field(default_factory=set)
    interrupted: set[str] = field(default_factory=set)
    """Channels whose running turn a death or an exit cut."""


def open_client(sock: Path) -> Client:
    """The project's client of the control API on ``sock`` (one per thread)."""
    return Client(str(sock), timeout=WAIT_S + 30)


def entries_of(api: Client, channel: str) -> list[dict[str, Any]]:
    """Every committed entry of the channel (none if the daemon never stored anything of it)."""
    status, body = api.answer("entries", path={"channel": channel})
    if status == 404:
        return []
    if status != 200:
        raise APIError(status, "entries", f"entries of {channel}: HTTP {status} {str(body)[:200]}", body)
    return list(body["entries"])


def idle(api: Client, channel: str) -> bool:
    """True once the channel is idle (or unknown: nothing of it was ever stored)."""
    status, body = api.answer("wait", path={"channel": channel}, params={"timeout": WAIT_S})
    return status == 404 or (status == 200 and bool(body.get("idle")))


def _stamps(folder: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    with contextlib.suppress(FileNotFoundError), (folder / "started.jsonl").open() as fh:
        for line in fh:
            if line.endswith("\n"):
                r = json.loads(line)
                out.setdefault(r["id"], []).append(r)
    return out


def _turn_messages(store: Path) -> dict[int, list[str]]:
    """Which turns took each message (by the message's seq), from the store's ``turns`` table,
    read-only: a turn killed before its agent ran its code leaves no start stamp, only its row
    and the notice that ended it."""
    out: dict[int, list[str]] = {}
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
        for turn, message in db.execute("SELECT id, message FROM turns WHERE message IS NOT NULL"):
            out.setdefault(int(message), []).append(str(turn))
    return out


def _disposition(pid: int, signum: int) -> str:
    """What ``pid`` does with ``signum`` now: ``ignored``, ``caught`` or ``default``
    (``/proc/PID/status``: SigIgn, SigCgt)."""
    masks = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigCgt"):
            masks[key] = int(value.strip(), 16)
    bit = 1 << (signum - 1)
    return "ignored" if masks["SigIgn"] & bit else "caught" if masks["SigCgt"] & bit else "default"


def _stat(pid: int) -> tuple[int, int] | None:
    """``(ppid, start time in clock ticks)`` of ``pid`` from ``/proc/PID/stat``; None once it is gone
    (or a zombie: it has exited)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    if fields[0] == b"Z":
        return None
    return int(fields[1]), int(fields[19])


#: Walks of one process's ancestry before it is judged: a walk that a process on the way cut
#: (it exited, and its children re-parented meanwhile) is walked again.
WALKS = 5


def _meets(ppid: int, ancestor: int) -> bool | None:
    """Walking up from ``ppid``: True at ``ancestor``, False at the top, None if cut on the way."""
    seen: set[int] = set()
    while ppid > 1 and ppid not in seen:
        if ppid == ancestor:
            return True
        seen.add(ppid)
        up = _stat(ppid)
        if up is None:
            return None
        ppid = up[0]
    return ppid == ancestor


def descends_from(pid: int, ancestor: int) -> bool | None:
    """Is ``pid`` a descendant of ``ancestor``? None if ``pid`` exited before that could be told.

    Walked by ``/proc`` reads, not psutil's ``parents()``: that one stops without a word where
    a process on the way has just exited (bwrap's monitor exits before the init it leaves
    behind), and raises where ``pid`` itself is gone.
    """
    for _ in range(WALKS):
        me = _stat(pid)
        if me is None:
            return None
        met = _meets(me[0], ancestor)
        if met:
            return True
        now = _stat(pid)
        if now is None or now[1] != me[1]:
            return None  # it exited during the walk (its pid may be another's now)
        if met is False and now == me:
            return False
        # Cut on the way, or re-parented meanwhile: walk again.
    return False  # alive, and never shown to descend from it


def survivors(found: list[Found], daemon: int) -> list[Found]:
    """The processes of ``found`` (a marker scan right after a restart) the new ``daemon``
    did not start: survivors of an earlier instance's turns.

    The new daemon starts the turns it restored from the queue the moment it is ready, while
    the scan reads every process of the machine, and a quick one (the "short" job: 100-200 ms)
    may be gone by the time it is judged. So a process is the new daemon's by its turn first
    — a turn id names the supervisor that made it (``t<pid hex>-``, see ``new_turn_id``) —
    and only then by its ancestry; a process of another instance's turn that the scan found
    alive is a survivor even if it is gone by now.
    """
    mine = f"t{daemon:x}-"
    return [f for f in found if not f[1].startswith(mine) and descends_from(f[0], daemon) is not True]


# ---------------------------------------------------------------- the rig


class Rig:
    """One daemon in one folder; restarted by the script when a fault ends it."""

    def __init__(self, folder: Path, store: str = "corral.db", *, disk_reserve: bool = True) -> None:
        self.folder = folder
        self.store = folder / store
        self.port = free_port()
        (folder / "token").write_text("chaos-token-" + os.urandom(8).hex())
        os.chmod(folder / "token", 0o600)
        self.text = config_text(folder, store, self.port, disk_reserve=disk_reserve)
        self.daemon: Daemon | None = None
        self.client: Client | None = None
        self.starts = 0

    @property
    def api(self) -> Client:
        """The client of the running daemon."""
        assert self.client is not None
        return self.client

    def start(self, v: Counter[str], notes: list[str]) -> None:
        """Start the daemon; then no process of an earlier instance's turns may be alive."""
        self.daemon = Daemon(self.folder, self.text)
        self.client = open_client(self.daemon.socket)
        self.starts += 1
        if self.starts > 1:
            orphans = survivors(marker_processes(str(self.folder)), self.daemon.pid)

            if orphans:
                v["no-survivor"] += 1
                notes.append(
                    f"no-survivor: {len(orphans)} process(es) of the dead daemon's turns alive after the restart: "
                    f"{orphans[:3]}"
                )
                kill_by_pid(orphans)

    def alive(self) -> bool:
        """Is the daemon running?"""
        return self.daemon is not None and self.daemon.alive()

    def kill9(self) -> None:
        """SIGKILL the daemon and wait for it."""
        assert self.daemon is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.daemon.pid, signal.SIGKILL)
        self.daemon.proc.wait()
        self.close_client()

    def close_client(self) -> None:
        """Forget the client of a dead daemon."""
        if self.client is not None:
            self.client.close()
            self.client = None

    def stop(self) -> int | None:
        """An orderly stop, at the end."""
        self.close_client()
        return self.daemon.stop() if self.daemon is not None and self.daemon.alive() else None


# ---------------------------------------------------------------- the invariants


def check(rig: Rig, book: Book, v: Counter[str], notes: list[str]) -> None:
    """Every invariant over what the trial touched; the daemon must be up and the channels idle."""
    api = rig.api
    for channel in sorted(book.channels):
        if not idle(api, channel):
            v["ran-once"] += 1
            notes.append(f"ran-once: {channel} still busy after {WAIT_S:g} s")
    stamps = _stamps(rig.folder)
    entries = {c: entries_of(api, c) for c in book.channels}
    taken = _turn_messages(rig.store)
    for m in book.messages:
        runs = stamps.get(m.ident, [])
        mine = [
            e["seq"]
            for e in entries[m.channel]
            if e["kind"] == "message" and e["author"].startswith("human:") and m.ident in e["text"]
        ]
        stored, seq = bool(mine), m.seq if m.seq is not None else (mine[0] if mine else -1)
        if len(runs) > 1:
            v["ran-once"] += 1
            notes.append(f"ran-once: message {m.ident} in {m.channel} ran {len(runs)} times")
        elif not runs and (m.sure or stored):
            # Dropped by a stop that said so: its notice (the stop's record) is in the channel,
            # under a newer generation; even if the fault cut the stop's answer.
            dropped = any(
                e["kind"] == "notice" and m.generation is not None and e["generation"] > m.generation
                for e in entries[m.channel]
            )
            # Or its turn began and was ended (by a stop, a shutdown, a death) before the agent
            # ran its code: the turn's last entry is the notice that says so.
            ended = any(
                [e["kind"] for e in entries[m.channel] if e["turn"] == turn][-1:] == ["notice"]
                for turn in taken.get(seq, [])
            )
            if not (dropped or ended):
                v["ran-once"] += 1
                notes.append(
                    f"ran-once: message {m.ident} in {m.channel} was accepted and never ran, and no stop dropped it"
                )
        if m.sure and not stored:
            v["ran-once"] += 1
            notes.append(f"ran-once: message {m.ident} was accepted (202) and is not in the transcript")
    for s in book.stops:
        if not s.result.get("ok"):
            continue
        gen = s.result.get("generation", 0)
        late = [
            m.ident
            for m in book.messages
            if m.channel == s.channel and m.generation is not None and m.generation < gen
            for r in stamps.get(m.ident, [])
            if r["t"] > s.returned
        ]
        if late:
            v["nothing-after-stop"] += 1
            notes.append(f"nothing-after-stop: {late} started after the stop of {s.channel} returned")
    for channel, es in entries.items():
        seqs = [e["seq"] for e in es]
        if seqs != sorted(set(seqs)):
            v["transcript"] += 1
            notes.append(f"transcript: {channel} is not in seq order")
        by_turn: dict[str, list[dict[str, Any]]] = {}
        for e in es:
            if e["turn"]:
                by_turn.setdefault(e["turn"], []).append(e)
        for turn, tes in by_turn.items():
            notice = next((e for e in tes if e["kind"] == "notice"), None)
            if notice is not None and tes[-1] is not notice:
                v["transcript"] += 1
                notes.append(
                    f"transcript: turn {turn} in {channel} has entries after its notice: {[e['kind'] for e in tes]}"
                )
        for s in (s for s in book.stops if s.channel == channel and s.result.get("ok")):
            notice = next((e for e in es if e["seq"] == s.result.get("notice_seq")), None)
            if notice is None or notice["kind"] != "notice":
                v["transcript"] += 1
                notes.append(
                    f"transcript: the stop of {channel} (ok) names notice {s.result.get('notice_seq')}, not in the "
                    f"transcript"
                )
            else:
                old = [
                    e
                    for e in es
                    if e["author"].startswith("agent:")
                    and e["generation"] < s.result["generation"]
                    and e["seq"] > notice["seq"]
                ]
                if old:
                    v["nothing-after-stop"] += 1
                    notes.append(
                        f"nothing-after-stop: {len(old)} entries of a stopped turn after the notice in {channel}"
                    )
    for channel in book.interrupted:
        es = entries[channel]
        turns = [e["turn"] for e in es if e["turn"] and e["author"].startswith("agent:")]
        if not turns:
            continue
        cut = turns[0]
        last = [e for e in es if e["turn"] == cut][-1]
        # A notice: the interruption's, or the stop's when a stop was on record before the end.
        if last["kind"] != "notice":
            v["transcript"] += 1
            notes.append(
                f"transcript: turn {cut} in {channel} was cut by the daemon's end; its last entry is "
                f"{last['kind']} {last['text'][:50]!r}, not an interruption notice"
            )


def survivors_of_stop(rig: Rig, result: dict[str, Any], v: Counter[str], notes: list[str]) -> None:
    """Nothing of the stopped turns alive when the stop returned."""
    turns = set(result.get("stopped_turns") or [])
    if turns:
        alive = marker_processes(str(rig.folder), turns)
        if alive:
            v["no-survivor"] += 1
            notes.append(f"no-survivor: {alive[:3]} of a stopped turn alive when the stop returned")
            kill_by_pid(alive)


def survivors_of_exit(rig: Rig, v: Counter[str], notes: list[str]) -> None:
    """With the daemon gone, no process of its turns is alive."""
    alive = marker_processes(str(rig.folder))
    if alive:
        v["no-survivor"] += 1
        notes.append(f"no-survivor: {len(alive)} process(es) of the turns alive after the daemon exited: {alive[:3]}")
        kill_by_pid(alive)


# ---------------------------------------------------------------- the faults


class Trials:
    """Runs fault trials on one rig (and the extra rigs some faults need)."""

    def __init__(self, root: Path, rng: random.Random) -> None:
        self.root = root
        self.rng = rng
        self.rig = Rig(root / "main")
        self.count = 0
        self.kinds: Counter[str] = Counter()
        self.skipped: dict[str, str] = {}
        self.violations: Counter[str] = Counter()
        self.by_fault: Counter[str] = Counter()
        self.notes: list[str] = []
        self.disk_full = False
        """The store's disk is full now: a send may be refused if it says so."""

    def channel(self, book: Book, tag: str) -> str:
        """A fresh channel for this trial."""
        name = f"f{self.count}-{tag}"
        book.channels.add(name)
        return name

    def send(
        self, book: Book, channel: str, job: str, agent: str = "plain", client: Client | None = None
    ) -> Message | None:
        """Send ``job IDENT``; record it as accepted if the daemon said so."""
        ident = f"{channel}.{len(book.messages)}"
        api = client or self.rig.api
        try:
            status, body = api.answer(
                "send", path={"channel": channel}, json_body={"text": f"{job} {ident}", "agent": agent}
            )
        except DaemonUnavailable:
            m = Message(ident, channel, None, None, sure=False)
            book.messages.append(m)
            return None
        if status != 202 and self.disk_full and any(w in str(body).lower() for w in ("disk", "space")):
            return None  # refused, and it says why: right on a full disk
        if status != 202:
            self.violations["answers"] += 1
            self.notes.append(f"answers: a clean send to {channel} got HTTP {status}: {str(body)[:150]}")
            return None
        m = Message(ident, channel, body["seq"], body["generation"], sure=True)
        book.messages.append(m)
        return m

    def stop(self, book: Book, channel: str, client: Client | None = None) -> dict[str, Any] | None:
        """Stop the channel; check its answer and that nothing of its turn survived it."""
        api = client or self.rig.api
        try:
            status, body = api.answer("stop", path={"channel": channel})
        except DaemonUnavailable:
            return None
        if not isinstance(body, dict) or (status >= 500 and "ok" not in body):
            self.violations["answers"] += 1
            self.notes.append(f"answers: a stop of {channel} got HTTP {status}: {str(body)[:150]}")
            return None
        book.stops.append(Stop(channel, body, time.monotonic()))
        if body.get("ok") and body.get("notice_seq") is None and not body.get("repeat"):
            self.violations["answers"] += 1
            self.notes.append(f"answers: a stop of {channel} says ok with no notice: {body}")
        survivors_of_stop(self.rig, body, self.violations, self.notes)
        return body

    def wait_entry(self, channel: str, kind: str, timeout: float = WAIT_S) -> bool:
        """Poll the transcript until an agent entry of ``kind`` appears (the agent's pace, an outside event)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e["kind"] == kind and e["author"].startswith("agent:") for e in entries_of(self.rig.api, channel)):
                return True
            time.sleep(0.02)
        return False

    def ensure(self) -> None:
        """The daemon up (started again after a fault ended it)."""
        if not self.rig.alive():
            self.rig.close_client()
            self.rig.start(self.violations, self.notes)

    def run(self, kind: str) -> None:
        """One trial of ``kind``, then the invariants."""
        self.count += 1
        self.kinds[kind] += 1
        before = sum(self.violations.values())
        book = Book()
        family, _, detail = kind.partition(":")
        self.ensure()
        try:
            if family == "kill9":
                self.kill9(book, detail)
            elif family == "signal":
                self.signal(book, detail)
            elif family == "abort":
                self.abort(book, detail)
            elif kind in ("poison", "two-owners"):
                getattr(self, kind.replace("-", "_"))(book)
            elif kind == "enospc":
                self.enospc()
                return
            elif kind == "eio":
                self.eio()
                return
            self.ensure()
            check(self.rig, book, self.violations, self.notes)
        finally:
            self.by_fault[kind] += sum(self.violations.values()) - before

    # -- kill -9

    def kill9(self, book: Book, point: str) -> None:
        rig, rng = self.rig, self.rng
        ch = self.channel(book, "k")
        if point == "accept":
            other = self.channel(book, "q")
            self.send(book, other, "short")
            t = threading.Thread(target=self.send, args=(book, ch, "short", "plain", open_client(rig.daemon.socket)))  # type: ignore[union-attr]
            t.start()
            time.sleep(rng.uniform(0.0, 0.01))  # the fault's moment: somewhere in the accept
            rig.kill9()
            t.join()
        elif point == "mid-turn":
            agent = rng.choice(["plain", "stubborn"])
            self.send(book, ch, "long", agent)
            # Queued behind it (the same agent: each agent of a channel has its own queue):
            # it runs once, after the restart.
            self.send(book, ch, "short", agent)
            self.wait_entry(ch, "tool")
            time.sleep(rng.uniform(0.0, 0.2))
            rig.kill9()
            book.interrupted.add(ch)
        elif point == "mid-stop":
            self.send(book, ch, "long", "stubborn")
            self.send(book, ch, "short", "stubborn")  # queued (its agent is busy): the stop drops it
            self.wait_entry(ch, "tool")
            client = open_client(rig.daemon.socket)  # type: ignore[union-attr]
            t = threading.Thread(target=self.stop, args=(book, ch, client))
            t.start()
            time.sleep(rng.uniform(0.05, STOP_GRACE - 0.2))
            rig.kill9()
            t.join()
            client.close()
            book.interrupted.add(ch)
        elif point == "mid-shutdown":
            self.send(book, ch, "long", "stubborn")
            self.send(book, ch, "short", "stubborn")  # queued (its agent is busy): kept for after the restart
            self.wait_entry(ch, "tool")
            assert rig.daemon is not None
            rig.daemon.proc.send_signal(signal.SIGTERM)
            time.sleep(rng.uniform(0.05, STOP_GRACE - 0.2))
            rig.kill9()
            book.interrupted.add(ch)
        self.ensure()

    # -- every catchable signal

    def signal(self, book: Book, name: str) -> None:
        rig = self.rig
        ch = self.channel(book, "s")
        self.send(book, ch, "long", self.rng.choice(["plain", "stubborn"]))
        self.wait_entry(ch, "tool")
        assert rig.daemon is not None
        signum = getattr(signal, name)
        how = _disposition(rig.daemon.pid, signum)
        logged = rig.daemon.log_path.stat().st_size
        rig.daemon.proc.send_signal(signum)
        if how == "caught":
            # The daemon logs every signal it handles: wait for that line (or its end), then
            # for the orderly exit if it said so.
            deadline = time.monotonic() + WAIT_S
            line = ""
            while rig.alive() and time.monotonic() < deadline and not line:
                with rig.daemon.log_path.open("rb") as fh:
                    fh.seek(logged)
                    text = fh.read().decode(errors="replace")
                line = next((t for t in text.splitlines() if f"received {name}" in t), "")
                time.sleep(0.01)  # the daemon's pace, an outside event
            if not line and rig.alive():
                self.violations["answers"] += 1
                self.notes.append(f"answers: the daemon catches {name} but never said it received it")
            if "shutting down in order" in line:
                rig.daemon.proc.wait(timeout=WAIT_S)
        elif how == "default":
            with contextlib.suppress(subprocess.TimeoutExpired):
                rig.daemon.proc.wait(timeout=WAIT_S)
        if rig.alive():
            self.stop(book, ch)
            return
        book.interrupted.add(ch)
        rig.close_client()
        code = rig.daemon.proc.returncode
        if code is not None and code < 0 and name in CRASH_SIGNALS:
            pass  # a crash, like kill -9: the restart must find what it left (checked there)
        elif code is not None and code < 0:
            # Killed outright, like kill -9: the restart must find what it left (checked there).
            self.violations["daemon-alive"] += 1
            self.notes.append(f"daemon-alive: {name} killed the daemon outright (status {code}), no orderly shutdown")
        else:
            survivors_of_exit(rig, self.violations, self.notes)  # an orderly exit leaves nothing
        self.ensure()

    # -- aborted and half-sent requests

    def abort(self, book: Book, listener: str) -> None:
        rig, rng = self.rig, self.rng
        ch = self.channel(book, "a")
        self.send(book, ch, "long")
        self.wait_entry(ch, "tool")
        target = f"/v1/channels/{ch}/stop"
        requests = [
            b"POST /v1/shutdown HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n",
            f"POST {target} HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n{{".encode(),
            b"POST /v1/channels/x/messages HTTP/1.1\r\nhost: x\r\ncontent-le",
            f'POST /v1/channels/{ch}-z/messages HTTP/1.1\r\nhost: x\r\ncontent-length: '
            f'40\r\n\r\n{{"text": "sh'.encode(),
        ]
        for _ in range(rng.randint(5, 20)):
            data = rng.choice(requests)
            if listener == "unix":
                s = socket.socket(socket.AF_UNIX)
                addr: Any = str(rig.folder / "corral.sock")
            else:
                s = socket.socket()
                addr = ("127.0.0.1", rig.port)
            try:
                s.connect(addr)
                s.sendall(data if rng.random() < 0.5 else data[: rng.randint(len(data) // 2, len(data))])
                if rng.random() < 0.5:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.3)  # let the daemon notice the last abandoned connection before the check
        if not rig.alive():
            self.violations["daemon-alive"] += 1
            status = rig.daemon.proc.returncode if rig.daemon else None
            self.notes.append(f"daemon-alive: aborted requests on {listener} ended the daemon (status {status})")
            book.interrupted.add(ch)
            rig.close_client()
            survivors_of_exit(rig, self.violations, self.notes)
            self.ensure()
            return
        entries = entries_of(rig.api, ch)
        if any(e["kind"] == "notice" for e in entries):
            self.violations["answers"] += 1
            self.notes.append(f"answers: a stop abandoned before its body was sent still stopped {ch}")
        self.stop(book, ch)

    # -- poisoned text

    def poison(self, book: Book) -> None:
        rig = self.rig
        bad, good = self.channel(book, "p"), [self.channel(book, f"g{i}") for i in range(3)]
        self.send(book, bad, "poison")
        results: list[tuple[str, int, Any]] = []

        def clean(channel: str) -> None:
            client = open_client(rig.daemon.socket)  # type: ignore[union-attr]
            try:
                for _ in range(3):
                    self.send(book, channel, "short", client=client)
            finally:
                client.close()

        def poisoned(text_json: str) -> None:
            client = open_client(rig.daemon.socket)  # type: ignore[union-attr]
            try:
                # The client's JSON escapes what is not ASCII, so the daemon gets the escapes as written.
                poison = {"text": json.loads(text_json)}
                status, body = client.answer("send", path={"channel": bad}, json_body=poison)
                results.append((text_json, status, body))
            except DaemonUnavailable as exc:  # no answer: the daemon died (daemon-alive says so below)
                results.append((text_json, 0, str(exc)))
            finally:
                client.close()

        threads = [threading.Thread(target=clean, args=(c,)) for c in good]
        threads += [
            threading.Thread(target=poisoned, args=(t,))
            for t in ('"lone \\ud800 surrogate"', '"nul \\u0000 inside"', '"\\udfff"')
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for text, status, body in results:
            if status >= 500:
                self.violations["answers"] += 1
                self.notes.append(f"answers: the poisoned message {text} got HTTP {status}: {str(body)[:120]}")
            elif status == 202 and isinstance(body, dict):
                book.messages.append(Message(f"?{text}", bad, body.get("seq"), body.get("generation"), sure=False))
        if not rig.alive():
            self.violations["daemon-alive"] += 1
            self.notes.append("daemon-alive: poisoned text ended the daemon")

    # -- two owners of one store

    def two_owners(self, book: Book) -> None:
        rig = self.rig
        ch = self.channel(book, "o")
        self.send(book, ch, "short")
        second = self.root / f"second{self.count}"
        second.mkdir()
        text = config_text(rig.folder, str(rig.folder / "corral.db")).replace(
            '"corral.sock"', json.dumps(str(second / "corral.sock"))
        )
        try:
            other = Daemon(second, text)
        except RuntimeError:
            log = (second / "daemon.log").read_text(errors="replace")
            if "in use" not in log:
                self.violations["answers"] += 1
                self.notes.append(
                    f"answers: the second owner was refused without naming the store in use: "
                    f"{log.strip().splitlines()[-1:]}"
                )
            return
        self.violations["answers"] += 1
        self.notes.append("answers: a second daemon started on a store another daemon owns")
        client = open_client(other.socket)
        try:
            self.send(book, ch, "short", client=client)
        finally:
            client.close()
            other.stop()
            if rig.daemon is not None:
                kill_by_pid(survivors(marker_processes(str(rig.folder)), rig.daemon.pid))

    # -- a full disk

    def enospc(self) -> None:
        if os.geteuid() != 0:
            self.skipped["enospc"] = "needs root to mount a tmpfs"
            return
        folder = self.root / f"disk{self.count}"
        disk = folder / "disk"
        disk.mkdir(parents=True)
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True, text=True
        )
        if mounted.returncode != 0:
            self.skipped["enospc"] = f"mount -t tmpfs failed: {mounted.stderr.strip()[:100]}"
            return
        # The disk is smaller than the reserve (which would refuse every turn): what is tried
        # is the store's own full disk, as with the reserve used up.
        rig = Rig(folder, store=str(disk / "corral.db"), disk_reserve=False)
        book = Book()
        try:
            rig.start(self.violations, self.notes)
            ch = "full"
            book.channels.add(ch)
            self.send_on(rig, book, ch, "long", "stubborn")
            queued = [self.send_on(rig, book, ch, "short", "stubborn") for _ in range(2)]
            filler = disk / "filler"
            with contextlib.suppress(OSError), filler.open("wb") as fh:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            self.disk_full = True
            self.send_on(rig, book, ch, "short", "stubborn")  # may be refused: it must say the disk is full
            status, body = rig.api.answer("stop", path={"channel": ch})
            stop = Stop(ch, body if isinstance(body, dict) else {}, time.monotonic())
            if status >= 500 and not isinstance(body, dict):
                self.violations["answers"] += 1
                self.notes.append(f"answers: a stop on a full disk got HTTP {status}: {str(body)[:120]}")
            if isinstance(body, dict) and body.get("ok") and body.get("notice_seq") is None:
                self.violations["answers"] += 1
                self.notes.append(f"answers: a stop on a full disk says ok without a stored notice: {body}")
            err = str(body.get("error") if isinstance(body, dict) else body)
            if (
                isinstance(body, dict)
                and not body.get("ok")
                and "disk" not in err.lower()
                and "space" not in err.lower()
            ):
                self.violations["answers"] += 1
                self.notes.append(f"answers: a stop on a full disk failed without saying the disk is full: {err[:120]}")
            if isinstance(body, dict) and not body.get("ok") and (body.get("killed") or body.get("swept")):
                self.violations["nothing-after-stop"] += 1
                self.notes.append(
                    f"nothing-after-stop: a stop that could not store its record killed {body.get('killed')} anyway"
                )
            book.stops.append(stop)
            filler.unlink()
            self.disk_full = False
            if rig.daemon:
                rig.daemon.stop()
            survivors_of_exit(rig, self.violations, self.notes)
            rig.start(self.violations, self.notes)
            # The stop said it failed: then it must not have dropped anything silently, and
            # whatever ran must have run once. It said ok: nothing it dropped may run.
            if stop.result.get("ok"):
                ran = _stamps(folder)
                for q in queued:
                    if q is not None and ran.get(q.ident):
                        idle(rig.api, ch)
                        self.violations["nothing-after-stop"] += 1
                        self.notes.append(
                            f"nothing-after-stop: {q.ident}, dropped by a stop on a full disk, ran after the restart"
                        )
            check(rig, book, self.violations, self.notes)
        finally:
            self.disk_full = False
            rig.stop()
            survivors_of_exit(rig, self.violations, self.notes)
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)

    def send_on(self, rig: Rig, book: Book, channel: str, job: str, agent: str = "plain") -> Message | None:
        """send() to another rig's daemon."""
        saved, self.rig = self.rig, rig
        try:
            return self.send(book, channel, job, agent)
        finally:
            self.rig = saved

    # -- EIO, through a store wrapper in an embedded supervisor

    def eio(self) -> None:
        folder = self.root / f"eio{self.count}"
        folder.mkdir()
        found = run_eio(folder, self.rng.randint(1, 12))
        for key, note in found:
            self.violations[key] += 1
            self.notes.append(f"{key}: {note}")


def run_eio(folder: Path, fail_at: int) -> list[tuple[str, str]]:
    """An embedded supervisor whose ``fail_at``-th store commit fails with EIO; then reopened."""
    import trio

    from supervisor import open_supervisor
    from supervisor.config.settings import load_config
    from supervisor.store.store import Store, StoreError

    (folder / "corral.toml").write_text(config_text(folder))
    config = load_config(folder / "corral.toml")
    found: list[tuple[str, str]] = []
    commit = Store._commit
    count = {"n": 0}

    def faulty(self: Store, batch: list[Any]) -> None:
        count["n"] += 1
        if count["n"] == fail_at:
            raise sqlite3.OperationalError("disk I/O error")
        commit(self, batch)

    accepted: list[tuple[str, int]] = []
    stopped: list[Any] = []

    async def session() -> None:
        async with open_supervisor(config) as sup:
            for i in range(3):
                try:
                    a = await sup.send("eio", f"short eio.{i}")
                    accepted.append((f"eio.{i}", a.seq))
                except StoreError:
                    pass
            try:
                a = await sup.send("eio", "long eio.L")
                accepted.append(("eio.L", a.seq))
            except StoreError:
                pass  # refused, and said so: nothing to wait for
            else:
                # Until the long job runs, or the channel is idle without it: the fault hit
                # its turn's record, and the message waits in the store for the next start.
                await started_or_idle(sup)
            stopped.append(await sup.stop("eio"))

    def long_runs() -> int:
        return len(_stamps(folder).get("eio.L", []))

    async def started_or_idle(sup: Any, before: int = 0) -> None:
        with trio.fail_after(WAIT_S):
            while long_runs() == before and not await sup.wait_idle("eio", timeout=0):
                await trio.sleep(0.02)  # the agent's start, an outside event

    async def reopen() -> list[Any]:
        if not accepted:
            return []  # nothing was ever stored: no channel to look at
        async with open_supervisor(config) as sup:
            before = long_runs()
            await started_or_idle(sup, before)
            if long_runs() > before:
                await sup.stop("eio")  # the long job, left queued by the fault, runs now: 30 s otherwise
            with trio.fail_after(WAIT_S):
                await sup.wait_idle("eio")
            return await sup.entries("eio")

    logging.disable(logging.CRITICAL)  # the failed commit is logged: expected here, noise in the report
    Store._commit = faulty  # type: ignore[method-assign]
    try:
        trio.run(session)
    except Exception as exc:  # noqa: BLE001 - the supervisor must contain a failed write
        found.append(
            ("answers", f"an EIO at commit {fail_at} escaped the embedded supervisor: {type(exc).__name__}: {exc}")
        )
    finally:
        Store._commit = commit  # type: ignore[method-assign]
    try:
        entries = trio.run(reopen)
    finally:
        logging.disable(logging.NOTSET)
    texts = [e.text for e in entries]
    for ident, seq in accepted:
        if not any(ident in t for t in texts):
            found.append(("ran-once", f"message {ident} was accepted (seq {seq}) but is not in the store after an EIO"))
    if stopped and stopped[0].ok and not any(e.kind == "notice" and e.seq == stopped[0].notice_seq for e in entries):
        found.append(("transcript", "a stop answered ok but its notice is not in the store after an EIO"))
    stamps = _stamps(folder)
    for ident, runs in stamps.items():
        if len(runs) > 1:
            found.append(("ran-once", f"message {ident} ran {len(runs)} times across an EIO and a reopen"))
    left = marker_processes(str(folder))
    if left:
        found.append(("no-survivor", f"{left[:3]} alive after the embedded supervisor closed"))
        kill_by_pid(left)
    return found


# ---------------------------------------------------------------- main


def plan(trials: int, quick: bool, only: list[str] | None, rng: random.Random) -> list[str]:
    """The trials' fault kinds: one of each (quick), else a shuffled, nearly even mix."""
    kinds = [k for k in KINDS if not only or any(k == o or k.startswith(o + ":") for o in only)]
    if quick:
        return kinds
    out = [kinds[i % len(kinds)] for i in range(trials)]
    rng.shuffle(out)
    return out


def run_plan(kinds: list[str], seed: int, say: Any) -> dict[str, Any]:
    """Run ``kinds`` in order against one rig (in a fresh folder); the summary."""
    rng = random.Random(seed)
    root = short_tmp("cf-")
    (root / "main").mkdir()
    say(f"faults: {len(kinds)} trials, seed {seed}, in {root}")
    trials = Trials(root, rng)
    started = time.monotonic()
    done = 0
    try:
        for i, kind in enumerate(kinds, 1):
            try:
                trials.run(kind)
                done = i
            except KeyboardInterrupt:
                say(f"interrupted: the figures cover the {done} trials done")
                break
            except Exception as exc:  # noqa: BLE001 - a harness failure is counted, the run goes on
                trials.violations["harness"] += 1
                trials.by_fault[kind] += 1
                trials.notes.append(f"harness: {kind}: {type(exc).__name__}: {exc}")
            done = i
            if i % max(1, len(kinds) // 20) == 0:
                say(
                    f"  {i:>5}/{len(kinds)} trials, {time.monotonic() - started:6.1f} s, "
                    f"{sum(trials.violations.values())} violations",
                    flush=True,
                )
    finally:
        trials.rig.stop()
        left: list[Found] = sweep_leftovers(str(root), (MARKER,))
    if left:
        trials.violations["no-survivor"] += 1
        trials.notes.append(f"no-survivor: {len(left)} process(es) alive after the last daemon stopped")
    total = sum(trials.violations.values())
    if not total:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "trials": done,
        "seed": seed,
        "elapsed_s": round(time.monotonic() - started, 1),
        "violations": total,
        "by_invariant": dict(trials.violations),
        "by_fault": {k: n for k, n in trials.by_fault.items() if n},
        "kinds": dict(trials.kinds),
        "skipped": trials.skipped,
        "notes": trials.notes[:50],
        "starts": trials.rig.starts,
        "kept": str(root) if total else None,
    }


def run_jobs(kinds: list[str], seed: int, jobs: int, say: Any) -> dict[str, Any]:
    """Split the plan over ``jobs`` worker processes (each its own rig and folder); merge their summaries."""
    parts = [kinds[j::jobs] for j in range(jobs)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "scripts.faults", "--worker", ",".join(part), "--seed", str(seed * 1000 + j)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,  # the workers import scripts._bench as this process does
        )
        for j, part in enumerate(parts)
        if part
    ]
    merged: dict[str, Any] = {
        "trials": 0,
        "seed": seed,
        "jobs": jobs,
        "violations": 0,
        "by_invariant": Counter(),
        "by_fault": Counter(),
        "kinds": Counter(),
        "skipped": {},
        "notes": [],
        "starts": 0,
        "kept": [],
    }
    for proc in procs:
        out, _ = proc.communicate()
        lines = out.strip().splitlines()
        if proc.returncode not in (0, 1) or not lines:
            merged["violations"] += 1
            merged["by_invariant"]["harness"] += 1
            merged["notes"].append(f"harness: a worker exited with status {proc.returncode}")
            continue
        part = json.loads(lines[-1])
        for key in ("trials", "violations", "starts"):
            merged[key] += part[key]
        for key in ("by_invariant", "by_fault", "kinds"):
            merged[key].update(part[key])
        merged["skipped"].update(part["skipped"])
        merged["notes"] += part["notes"]
        if part["kept"]:
            merged["kept"].append(part["kept"])
    for key in ("by_invariant", "by_fault", "kinds"):
        merged[key] = dict(merged[key])
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000, help="how many trials (default 1000)")
    parser.add_argument("--quick", action="store_true", help="one trial of each fault")
    parser.add_argument("--seed", type=int, default=None, help="replay a run with this seed")
    parser.add_argument("--only", default=None, help="comma-separated fault kinds or families (kill9, signal, ...)")
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes, each with its own daemon and folder (default 1)"
    )
    parser.add_argument(
        "--fleet", action="store_true",
        help="fault trials on a fleet: three daemons on one throwaway PostgreSQL (see scripts/_chaos_fleet.py)",
    )
    parser.add_argument(
        "--partition", action="store_true",
        help="with --fleet: network faults between each host and PostgreSQL, through a loopback fault proxy"
        " (see scripts/_partition.py); --only names the faults (default: all of them)",
    )
    parser.add_argument("--lease", type=float, default=None,
                        help="with --fleet: [cluster] lease, seconds (default 1; with --partition 2)")
    parser.add_argument("--json", action="store_true", help="print only a JSON summary")
    # Internal: a worker of --jobs runs exactly these kinds and prints its JSON summary.
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    if args.fleet and args.partition:
        from scripts._partition import FAULTS
        from scripts._partition import run as run_partition

        only = tuple(args.only.split(",")) if args.only else FAULTS
        unknown = set(only) - set(FAULTS)
        if unknown:
            parser.error(f"unknown partition faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
        trials = len(only) if args.quick else args.trials
        summary_p = run_partition(trials, seed, args.lease or 2.0, only=only)
        print(json.dumps(summary_p) if args.json else json.dumps(summary_p, indent=2))
        return 1 if summary_p["violations"] else 0
    if args.fleet:
        from scripts._chaos_fleet import run as run_fleet

        fleet_summary = run_fleet((4 if args.quick else args.trials), seed, args.lease or 1.0, faults=True)
        print(json.dumps(fleet_summary) if args.json else json.dumps(fleet_summary, indent=2))
        return 1 if fleet_summary["violations"] else 0
    if args.worker is not None:
        print(json.dumps(run_plan(args.worker.split(","), seed, lambda *a, **k: None)))
        return 0
    kinds = plan(args.trials, args.quick, args.only.split(",") if args.only else None, random.Random(seed))
    say = (lambda *a, **k: None) if args.json else print
    started = time.monotonic()
    if args.jobs > 1:
        say(f"faults: {len(kinds)} trials, seed {seed}, {args.jobs} workers")
        summary = run_jobs(kinds, seed, args.jobs, say)
    else:
        summary = run_plan(kinds, seed, say)
    summary["elapsed_s"] = round(time.monotonic() - started, 1)
    total = summary["violations"]
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"\ntrials: {summary['trials']} in {summary['elapsed_s']:.1f} s; daemon starts: {summary['starts']}")
        print("trials per fault kind:")
        for k in KINDS:
            if summary["kinds"].get(k):
                print(
                    f"  {summary['kinds'][k]:>5} x {k:<22} violations {summary['by_fault'].get(k, 0)}"
                    + (f"  (skipped: {summary['skipped'][k]})" if k in summary["skipped"] else "")
                )
        print(f"violations: {total}")
        for key, n in Counter(summary["by_invariant"]).most_common():
            print(f"  {n:>5} x {key}")
        seen: set[str] = set()
        for note in summary["notes"]:
            head = note[:60]
            if head not in seen:
                seen.add(head)
                print(f"    - {note[:300]}")
            if len(seen) >= 15:
                break
    if total:
        jobs = f" --jobs {args.jobs}" if args.jobs > 1 else ""
        say(f"(replay with --seed {seed}{jobs}; logs kept in {summary['kept']})")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
