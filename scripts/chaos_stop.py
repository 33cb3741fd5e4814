#!/usr/bin/env python
"""Randomized stop trials against one real ``corral run`` daemon; exit 1 on any violation.

Run it as ``.venv/bin/python -m scripts.chaos_stop`` (``--trials N``, default 1000;
``--quick`` for 50; ``--seed S`` to replay a run; ``--seed-bug NAME`` to reintroduce one bug
and watch the trials catch it; ``--cgroup off`` to stop through the sweep instead of a cgroup
per turn; ``--kinds single|multi`` for one kind of trial, both by default, see below;
``--json`` for a machine-readable summary). Several trials run
at once, each on fresh channels of the same daemon (restarted only if it dies, which is itself
a violation). The daemon runs through ``scripts/_chaos_daemon.py``, which traces the ledger's
stops, each turn's point of no return, spawn, registration and signal (a ``cgroup.kill``
counting as a SIGKILL of each member), and widens those windows.

The agent is ``scripts/_chaos_agent.py`` (the generic line protocol) in three setups: the prompt
as an argument, the prompt on stdin (``prompt = "stdin"``), and one that ignores SIGINT from
exec on. It stamps its start, reports a plan (todos), double-forks mid-tool (a setsid grandchild
and a daemonized great-grandchild), and flushes text, a session id and a plan on SIGINT.

Each trial sends a job (``long``: the tool and 30 s of output; ``short``: a quick reply;
``burst``: 400 lines at once), then stops the channel at a random moment: right after the
send, once the trace shows the turn preparing or spawning, after 0-300 ms, with a second message queued
behind the first, after a chosen entry appears (the plan, mid-tool, mid-flush) or after the
reply. Sometimes the stop is repeated (after it returned, or as a second concurrent call),
sometimes a follow-up message goes right after it, sometimes a second channel runs a turn at
the same time. Every trial checks every line of the stop contract it can observe:

* no entry of the stopped turn after its notice; exactly one notice per non-repeat stop;
* leftover output discarded: the agent's SIGINT flush is never stored;
* no nudge after the stop, and the plan at the notice has nothing pending or in progress;
* no spawn of a turn stopped before it started (trace: its spawn after the stop decision),
  and no message accepted before the stop ever starts a turn after it (started stamps);
* late registrations die: a process registered for a turn already stale is SIGKILLed at once
  (unless it had exited already: the widened spawn window lets a quick agent finish before its
  registration), or frozen then SIGKILLed while its stop is being stored (or, frozen as it was
  exiting, ended by itself: its returncode at release), the trace counting kills by pid as well
  as by group, and never runs its code after the registration (its start stamp). Sandboxed, a
  SIGKILL of bwrap's init (pid 1 of the turn's pid namespace: the kernel ends the namespace with
  it) counts for the leader, bwrap's monitor; the monitor exits with its program's status as
  soon as the init reports it, the init staying for what the program left, so a leader found
  gone at the kill is fine only if no init of its lives, and a status of the program's own
  (0-127) only if the agent stamped its end before the registration's kill was sent;
* nothing of the stopped turn alive when the stop returns; nothing of the trial at its end
  (``CORRAL_TURN`` marker, or a cwd in the channel's working folder);
* the follow-up ran under the stop's generation; the other channel was untouched.

**Interrupt trials** (``--kinds interrupt``; not drawn unless asked, so earlier seeds replay
as they did): a job on one agent, then a message with ``"delivery": "interrupt"`` at a random
moment (right after the send, once the turn prepares or spawns, after 0-300 ms, with a second
message queued behind the first, or after the reply), sometimes with a second interrupt right
after it, a stop right after it, or a stop right before it. Checked (contract line 19): no
process of an interrupted turn alive when a follower sees its notice; exactly one notice per
interrupted turn — its own, or the stop's that came after — and no entry of it after that; no
interrupt notice for a turn no interrupt named, and none after a stop came first; a message
the interrupt (or a second interrupt, or a stop after it) dropped never starts once that was
decided (the start stamps); the last interrupting message runs unless a stop came after it;
the SIGINT flush is never stored; nothing of the trial alive at its end. They run in rounds of
``RESTART_EVERY``, the daemon restarted (SIGTERM, an orderly shutdown, then a fresh start on the
same store) after each: then no turn of the round's channels may be ``running`` in the store —
every turn's row is ended once its notice is stored, whoever ended it — and the fresh start
stores no "Task interrupted — corral restarted" notice in any of them.

**Cancel trials** (``--kinds cancel``; not drawn unless asked): a job on one agent and a short
message queued behind it, taken back (``DELETE …/queue/SEQ``) at a random moment of the first
turn (right after the sends, once it prepares or spawns, after 0-300 ms, or about when it
ends), sometimes moved first before, or with a stop right after or right before. Checked
(contract line 21): a message taken back (200) never starts a turn and its record is stored; one
answered ``running`` (409) names its turn and did start (unless a stop ended that turn before
its spawn); one answered ``not_queued`` (404) ran, or a stop before dropped it or ended the turn that had
taken it (before its spawn); nothing of the
trial alive at its end.

**Multi-agent trials** (``--kinds``: ``single``, ``multi``, or both, the default) run in a
channel of three ring agents ``ma``, ``mb``, ``mc`` (the chaos agent plain, on stdin and
stubborn; ``[defaults] max_hops = 4``) that hand work on by ``@mentions``: a chain (one agent
after the other until the hop limit), a long chain (each hands on, then runs its tool: every
agent it reaches is mid-tool at once), or a fan (two chains at once). The stop lands right
after the send, after 0-300 ms, after the 1st-3rd hand-off message, or once the chain has
ended; sometimes repeated (after, or concurrently). Then, sometimes, another bot posts an
``agent:mb`` message mentioning ``@mc`` (stored, never handed on: the channel rests), and a
human message lifts the rest (its chain must run to the hop limit), sometimes stopped again
mid-chain; sometimes a second channel runs a chain of the same agents meanwhile. Checked:

* every fresh stop has exactly one notice, and no entry of any turn it stopped comes after
  it; a repeat names the same notice; no older-generation agent entry after a notice;
* no leftover output stored (the SIGINT flush, which mentions the next agent), and nothing
  handed on from it; the plan of every agent settled at the notice;
* no routed message accepted while the channel rests (the trace of the ledger's accepts, the
  bot post's ``to``, and no turn ever started by the bot post); hops never above max_hops;
* a human lifts the rest: its chain ends with the hop-limit status entry;
* no process of a stopped turn alive when its stop returns, none of the trial at its end;
* the second channel: no stop, no notice, its chain ran to the hop limit.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sqlite3
import sys
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from scripts._api import AsyncAPI
from scripts._bench import MARKER, REPO, Daemon, Found, kill_by_pid, marker_processes, short_tmp, sweep_leftovers
from scripts._chaos_agent import FLUSH_TEXT
from scripts._chaos_daemon import SEEDED_BUGS
from scripts._config import toml
from supervisor.core.results import RESTART_NOTICE
from supervisor.turns.ports import channel_slug

#: Trials running at once (on different channels).
CONCURRENCY = 8
#: Longest a trial may wait for anything (a follow-up turn, an entry, idleness).
WAIT_S = 60.0
#: The stubborn agent's SIGINT is ignored: the stop waits this long before SIGKILL.
STOP_GRACE = 1.0
#: Interrupt trials run in rounds of this many, the daemon restarted (orderly) after each.
RESTART_EVERY = 40
#: The words the start after a crash stores for each turn the store still calls running.
RESTART_NOTICE_START = RESTART_NOTICE.split(".")[0]

AGENTS = ("plain", "stdin", "stubborn")
#: The agents of a multi-agent trial, in ring order (each hands on to the next).
RING = ("ma", "mb", "mc")
#: ``[defaults] max_hops`` of the chaos daemon.
MAX_HOPS = 4
KINDS = ("single", "multi", "interrupt", "cancel")
#: The kinds ``--kinds`` draws from unless told (the seeds of earlier runs replay as they did).
DEFAULT_KINDS = ("single", "multi")
#: When an interrupt trial interrupts its first turn, and what comes with it.
INTERRUPT_MOMENTS = ("now", "preparing", "spawning", "delay", "queued", "done")
INTERRUPT_EXTRAS = (None, None, "double", "stop", "stop-first")
#: When a cancel trial takes its second message back (its first turn's moment), and what comes with it.
CANCEL_MOMENTS = ("now", "preparing", "spawning", "delay", "done")
CANCEL_EXTRAS = (None, None, "stop", "stop-first", "first")
MULTI_JOBS = ("chain", "chainlong", "chainlong", "fan")
#: Agent turns a job's chain may take at most (the human's message's turn, then one per hop).
MULTI_TURNS = {"chain": MAX_HOPS + 1, "chainlong": MAX_HOPS + 1, "fan": 1 + 2 * MAX_HOPS}
#: The hop-limit status entry's words (supervisor/core/router.py).
CHAIN_STOPPED = f"chain stopped at {MAX_HOPS} hops"
ENTRY_KINDS = {
    # Not "message": a long job's text is one message stored when it ends, 30 s on ("done",
    # which a long job never draws either: a trial would wait the whole turn for nothing new).
    "long": ["status:thinking", "todos", "tool", "status:tool running"],
    "short": ["status:thinking", "message"],
    "burst": ["status:thinking", "message"],
}


def chaos_config(folder: Path, cgroup: str = "auto", sandbox: str = "auto") -> str:
    """The daemon's config: the three setups of the chaos agent; ``cgroup`` picks the kill
    mechanism (``"auto"``: a cgroup per turn where cgroup v2 is writable, ``"off"``: the sweep),
    ``sandbox`` the sandbox (a sandboxed turn's escapees die with its pid namespace)."""
    python, agent = sys.executable, str(REPO / "scripts" / "_chaos_agent.py")
    # The chaos agent logs its starts into the folder: every agent is granted it (the sandbox
    # keeps the daemon's own state inside it hidden all the same).
    env = {"CHAOS_DIR": str(folder)}

    def chaos_agent(command: list[str], more_env: dict[str, str], **more: Any) -> dict[str, Any]:
        return {"adapter": "generic", "sandbox_write": [str(folder)], "command": [*command, python, agent], **more,
                "env": {**env, **more_env}}

    ring = {"CHAOS_RING": ",".join(RING)}
    stdin = {"prompt": "stdin"}
    ignoring = ["env", "--ignore-signal=INT"]
    return toml({
        "server": {"socket": "corral.sock", "cgroup": cgroup, "sandbox": sandbox},
        "store": {"path": "corral.db"},
        "defaults": {"max_hops": MAX_HOPS, "agent": "plain", "stop_grace": STOP_GRACE},
        "agents.plain": chaos_agent([], {}),
        "agents.stdin": chaos_agent([], {"CHAOS_STDIN": "1"}, **stdin),
        "agents.stubborn": chaos_agent(ignoring, {}),
        "agents.ma": chaos_agent([], {**ring, "CHAOS_AGENT": "ma"}),
        "agents.mb": chaos_agent([], {**ring, "CHAOS_AGENT": "mb", "CHAOS_STDIN": "1"}, **stdin),
        "agents.mc": chaos_agent(ignoring, {**ring, "CHAOS_AGENT": "mc"}),
    })


# ---------------------------------------------------------------- the trace and the stamps


class JsonLog:
    """A JSON-lines file another process appends to, read incrementally (whole lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.records: list[dict[str, Any]] = []

    def refresh(self) -> None:
        """Read the lines appended since the last call."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        self.records += [json.loads(line) for line in data[:end].splitlines() if line.strip()]


class Evidence:
    """What the daemon traced and the agents stamped, indexed for the checks."""

    def __init__(self, folder: Path) -> None:
        self.trace = JsonLog(folder / "trace.jsonl")
        self.stamps = JsonLog(folder / "started.jsonl")
        self.ends = JsonLog(folder / "ended.jsonl")
        self._seen = (0, 0, 0)
        self.stops: dict[str, list[dict[str, Any]]] = {}
        self.prepared: dict[str, list[dict[str, Any]]] = {}
        self.spawned: dict[str, float] = {}
        self.registered: dict[str, dict[str, Any]] = {}
        self.started: dict[str, list[dict[str, Any]]] = {}
        """Start stamps by message id."""
        self.started_turn: dict[str, list[dict[str, Any]]] = {}
        self.signals: dict[int, list[dict[str, Any]]] = {}
        """Signals sent to each process group or process (a leader's pid is its group's id), in order."""
        self.released: dict[str, dict[str, Any]] = {}
        """Each turn's tree as it was released, by turn: the leader's returncode."""
        self.late_done: dict[str, float] = {}
        """When a stale turn's registration was over (its kill or freeze sent), by turn."""
        self.ended_turn: dict[str, list[float]] = {}
        """When each turn's agent exited by itself (its end stamps), by turn."""
        self.accepts: dict[str, list[dict[str, Any]]] = {}
        """The ledger's accepted messages, by channel."""

    def refresh(self) -> None:
        """Index whatever was appended since the last call."""
        self.trace.refresh()
        self.stamps.refresh()
        self.ends.refresh()
        t0, s0, e0 = self._seen
        for r in self.trace.records[t0:]:
            if r["ev"] == "stop":
                self.stops.setdefault(r["channel"], []).append(r)
            elif r["ev"] == "preparing":
                self.prepared.setdefault(r["channel"], []).append(r)
            elif r["ev"] == "spawn":
                self.spawned.setdefault(r["turn"], r["t"])
            elif r["ev"] == "register":
                self.registered[r["turn"]] = r
            elif r["ev"] == "registered":
                self.late_done[r["turn"]] = r["t"]
            elif r["ev"] == "signal":
                self.signals.setdefault(r["pgid"] if "pgid" in r else r["pid"], []).append(r)
            elif r["ev"] == "release":
                self.released[r["turn"]] = r
            elif r["ev"] == "accept":
                self.accepts.setdefault(r["channel"], []).append(r)
        for r in self.stamps.records[s0:]:
            self.started.setdefault(r["id"], []).append(r)
            self.started_turn.setdefault(r["turn"], []).append(r)
        for r in self.ends.records[e0:]:
            self.ended_turn.setdefault(r["turn"], []).append(r["t"])
        self._seen = (len(self.trace.records), len(self.stamps.records), len(self.ends.records))


# ---------------------------------------------------------------- one trial


@dataclass
class Trial:
    """What a trial did and what it found."""

    index: int
    agent: str
    job: str
    moment: str
    """now | preparing | spawning | delay | queued | entry:KIND | done"""
    delay: float
    repeat: str | None
    """None | after | concurrent"""
    follow_up: bool
    other: bool
    violations: list[tuple[str, str]] = field(default_factory=list)
    """(kind, detail)"""
    phase: str = "?"
    """Where the first turn was when the stop was decided: queued | preparing | spawning | running | ended."""
    stop_ms: float = 0.0
    ended_turn: bool = False
    killed: int = 0
    swept: int = 0
    kind: str = "single"
    """single | multi (a channel of the ring agents, handing work on) | interrupt (a message that
    interrupts the turn instead of a stop; ``repeat`` then says what comes with it: None, double — a
    second interrupt right after —, stop — a stop right after —, stop-first — a stop right before)"""
    hand_offs: int = 1
    """Multi, moment ``handoff``: stop once this many hand-off messages are stored."""
    bot: bool = False
    """Multi: after the stop, another bot posts an agent message that mentions an agent."""
    again: bool = False
    """Multi: the chain a human's message starts (``follow_up``) is stopped again, mid-chain."""
    late: list[str] = field(default_factory=list)
    """How each process registered for a stopped turn ended: killed | frozen, killed | had exited |
    exited as frozen (it was exiting when frozen: a signal cannot stop a process that exits)."""

    def violate(self, kind: str, detail: str) -> None:
        """Record one violation of the contract (or of the harness's expectations)."""
        self.violations.append((kind, detail))

    def describe(self) -> str:
        """The trial's choices, for a violation report."""
        moment = f"delay {self.delay * 1000:.0f} ms" if self.moment == "delay" else self.moment
        if self.kind == "interrupt":
            return (f"trial {self.index} (interrupt): {self.job} on {self.agent}, interrupted at {moment}, "
                    f"with {self.repeat}")
        if self.kind == "multi":
            moment = f"hand-off {self.hand_offs}" if self.moment == "handoff" else moment
            return (
                f"trial {self.index} (multi): {self.job} from ma, stop at {moment} ({self.phase}), "
                f"repeat={self.repeat}, bot post={self.bot}, human lifts={self.follow_up}, stopped again={self.again}, "
                f"other channel={self.other}"
            )
        return (
            f"trial {self.index}: {self.job} on {self.agent}, stop at {moment} ({self.phase}), repeat={self.repeat}, "
            f"follow-up={self.follow_up}, other channel={self.other}"
        )


MOMENTS = ("now", "preparing", "spawning", "delay", "queued", "entry", "done")


def choose(index: int, rng: random.Random, moments: tuple[str, ...] = MOMENTS) -> Trial:
    """The trial's random choices (the stop's moment among ``moments``)."""
    job = rng.choice(["long", "long", "long", "short", "burst"])
    if moments == ("done",):
        job = rng.choice(["short", "burst"])
    weighted = ["now", "preparing", "spawning", "spawning", "delay", "delay", "queued", "entry", "entry", "entry"]
    moment = rng.choice([m for m in weighted + ([] if job == "long" else ["done"]) if m in moments] or list(moments))
    if moment == "entry":
        moment = "entry:" + rng.choice(ENTRY_KINDS[job])
    return Trial(
        index=index,
        agent=rng.choice(AGENTS),
        job=job,
        moment=moment,
        delay=rng.uniform(0.0, 0.3),
        repeat=rng.choice([None, None, None, "after", "concurrent"]),
        follow_up=rng.random() < 0.5,
        other=rng.random() < 0.3,
    )


def choose_multi(index: int, rng: random.Random) -> Trial:
    """A multi-agent trial's random choices."""
    job = rng.choice(MULTI_JOBS)
    # A long chain never ends by itself (its agents run their tools): no "done" moment.
    moments = ["now", "delay", "delay", "handoff", "handoff", "handoff"] + ([] if job == "chainlong" else ["done"])
    lift = rng.random() < 0.7
    return Trial(
        index=index,
        agent="ma",
        job=job,
        moment=rng.choice(moments),
        delay=rng.uniform(0.0, 0.3),
        repeat=rng.choice([None, None, "after", "concurrent"]),
        follow_up=lift,
        other=rng.random() < 0.3,
        kind="multi",
        hand_offs=rng.randint(1, 3),
        bot=rng.random() < 0.5,
        again=lift and rng.random() < 0.3,
    )


def choose_interrupt(index: int, rng: random.Random) -> Trial:
    """An interrupt trial's random choices."""
    job = rng.choice(["long", "long", "short", "burst"])
    moments = [m for m in INTERRUPT_MOMENTS if m != "done" or job != "long"]
    return Trial(index=index, agent=rng.choice(AGENTS), job=job, moment=rng.choice(moments),
                 delay=rng.uniform(0.0, 0.3), repeat=rng.choice(INTERRUPT_EXTRAS), follow_up=False, other=False,
                 kind="interrupt")


def choose_cancel(index: int, rng: random.Random) -> Trial:
    """A cancel trial's random choices: when the queued message is taken back, and what comes with it."""
    job = rng.choice(["long", "short", "short", "burst"])
    moments = [m for m in CANCEL_MOMENTS if m != "done" or job != "long"]
    return Trial(index=index, agent=rng.choice(AGENTS), job=job, moment=rng.choice(moments),
                 delay=rng.uniform(0.0, 0.3), repeat=rng.choice(CANCEL_EXTRAS), follow_up=False, other=False,
                 kind="cancel")


def _turn_rows(db: Path) -> list[tuple[str, str, str]]:
    """Every turn row of the store: (id, channel, state). Read while no daemon runs."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return [(str(a), str(b), str(c)) for a, b, c in conn.execute("SELECT id, channel, state FROM turns")]


def _hand_off_of(ident: str) -> Any:
    """True for an agent's message that hands work of trial job ``ident`` on (it mentions a ring agent)."""
    return lambda e: (
        e["author"].startswith("agent:") and e["kind"] == "message" and e["text"].startswith("@")
        and e["text"].endswith(f" {ident}")
    )


class Runner:
    """Runs the trials against one daemon, restarting it only if it dies."""

    def __init__(self, folder: Path, seed_bug: str | None = None, cgroup: str = "auto", sandbox: str = "auto") -> None:
        self.folder = folder
        self.config = chaos_config(folder, cgroup, sandbox)
        self.command = [
            sys.executable,
            str(REPO / "scripts" / "_chaos_daemon.py"),
            "--trace",
            str(folder / "trace.jsonl"),
        ]
        if seed_bug:
            self.command += ["--seed-bug", seed_bug]
        self.daemon = Daemon(folder, self.config, self.command)
        self.api = AsyncAPI(self.daemon.socket, timeout=WAIT_S + 30)
        self.evidence = Evidence(folder)
        self.home = str(folder)
        self.work = folder / "corral.d" / "work"
        self.restarts = 0
        self.planned_restarts = 0
        """Orderly restarts after each round of interrupt trials (see :meth:`restart_and_check`)."""
        self._restarting = trio.Lock()

    def cwd_of(self, agent: str, channel: str) -> str:
        """The channel's working folder for that agent (every process of its turns runs there)."""
        return str(self.work / agent / channel_slug(channel))

    async def ensure_daemon(self, trial: Trial) -> None:
        """If the daemon died, say so in the trial and start it again."""
        async with self._restarting:
            if self.daemon.alive():
                return
            trial.violate("daemon-died", f"status {self.daemon.proc.returncode}; see {self.daemon.log_path}")
            await self.api.aclose()
            self.daemon.stop()
            self.daemon = await trio.to_thread.run_sync(Daemon, self.folder, self.config, self.command)
            self.api = AsyncAPI(self.daemon.socket, timeout=WAIT_S + 30)
            self.restarts += 1

    async def restart_and_check(self, trials: list[Trial]) -> None:
        """An orderly restart of the daemon after a round of interrupt trials (``trials``), and
        what it must find: every turn of their channels ended in the store (whoever ended it:
        the turn, a stop, an interrupt — a turn left ``running`` makes the next start post a
        false "Task interrupted — corral restarted" notice), and after the start, no such notice."""
        async with self._restarting:
            await self.api.aclose()
            code = await trio.to_thread.run_sync(self.daemon.stop)
            channels = {f"c{t.index}": t for t in trials}
            if code != 0:
                trials[0].violate("daemon-exit", f"the planned restart's shutdown: {code}; see {self.daemon.log_path}")
            for turn, channel, state in await trio.to_thread.run_sync(_turn_rows, self.folder / "corral.db"):
                if channel in channels and state == "running":
                    channels[channel].violate(
                        "turn-left-running", f"turn {turn} of {channel} is 'running' in the store after the shutdown"
                    )
            self.daemon = await trio.to_thread.run_sync(Daemon, self.folder, self.config, self.command)
            self.api = AsyncAPI(self.daemon.socket, timeout=WAIT_S + 30)
            self.planned_restarts += 1
        for channel, trial in channels.items():
            false = [e for e in await self.api.entries(channel) if e["text"].startswith(RESTART_NOTICE_START)]
            if false:
                trial.violate("false-restart-notice", f"{channel} after the restart: {_brief(false)}")

    async def wait_trace(self, channel: str, phase: str) -> None:
        """Until the trace shows the channel's first turn preparing (or spawning), or WAIT_S."""
        ev = self.evidence
        with trio.move_on_after(WAIT_S):
            while True:
                ev.refresh()
                prepared = ev.prepared.get(channel)
                if prepared and (phase == "preparing" or prepared[0]["turn"] in ev.spawned):
                    return
                await trio.sleep(0.001)  # the daemon appends to the trace: an outside event, polled

    async def run(self, trial: Trial) -> None:
        """Run one trial; its violations end up in ``trial.violations``."""
        try:
            run = {"multi": self._run_multi, "interrupt": self._run_interrupt,
                   "cancel": self._run_cancel}.get(trial.kind, self._run)
            await run(trial)
        except Exception as exc:  # noqa: BLE001 - a harness failure is reported like a violation
            leaves = list(_leaves(exc))
            trial.violate("trial-failed", "; ".join(f"{type(e).__name__}: {e}" for e in leaves))
            await self.ensure_daemon(trial)

    async def _run(self, trial: Trial) -> None:
        api = self.api
        channel, other = f"c{trial.index}", f"c{trial.index}-other"
        ident = f"t{trial.index}"
        got = trio.Event()
        watch, watch_idle = trio.CancelScope(), trio.CancelScope()
        waited_for: str | None = None
        before = [f"{ident}a"]  # ids of the messages accepted before the stop

        async def watch_entries() -> None:
            with watch:
                await api.wait_for(channel, trial.moment[6:], got)

        async with trio.open_nursery() as nursery:
            if trial.moment.startswith("entry:"):
                nursery.start_soon(watch_entries)
            if trial.other:
                nursery.start_soon(api.send, other, f"short {ident}o", trial.agent)
            accepted = await api.send(channel, f"{trial.job} {ident}a", trial.agent)
            if trial.moment == "queued":
                before.append(f"{ident}b")
                await api.send(channel, f"short {ident}b", trial.agent)
            if trial.moment.startswith("entry:"):
                # Only once the message is in: a wait sent before it would find the channel idle.
                async def idle_then_give_up() -> None:
                    with watch_idle:
                        await api.wait(channel, WAIT_S)
                        got.set()  # the turn ended without that entry: stop now, and say so below

                nursery.start_soon(idle_then_give_up)
            # The stop moment.
            if trial.moment in ("delay", "queued"):
                await trio.sleep(trial.delay)
            elif trial.moment == "done":
                await api.wait(channel, WAIT_S)
            elif trial.moment in ("preparing", "spawning"):
                await self.wait_trace(channel, trial.moment)
            elif trial.moment.startswith("entry:"):
                with trio.move_on_after(WAIT_S):
                    await got.wait()
                watch.cancel()
                watch_idle.cancel()
                if not got.is_set():
                    trial.violate("harness", f"no {trial.moment[6:]!r} entry within {WAIT_S:g} s")
                else:
                    waited_for = trial.moment[6:]
            t0 = time.perf_counter()
            results: list[dict[str, Any]] = []
            if trial.repeat == "concurrent":
                async with trio.open_nursery() as both:
                    for _ in range(2):
                        both.start_soon(_append, results, api, channel)
            else:
                results.append(await api.stop(channel))
            trial.stop_ms = (time.perf_counter() - t0) * 1000
        # No process of the stopped turn may outlive the stop's return.
        stopped = {t for r in results for t in r.get("stopped_turns", [])}
        trial.ended_turn = bool(stopped)
        trial.killed = sum(len(r.get("killed", [])) for r in results)
        trial.swept = sum(len(r.get("swept", [])) for r in results)
        if stopped:
            alive = await trio.to_thread.run_sync(_turn_processes, self.home, stopped)
            if alive:
                trial.violate("alive-when-stop-returned", f"{alive}")
                kill_by_pid(alive, wait=None)
        if trial.repeat == "after":
            results.append(await api.stop(channel))
        follow = await api.send(channel, f"short {ident}f", trial.agent) if trial.follow_up else None
        for name in (channel, other) if trial.other else (channel,):
            if not await api.wait(name, WAIT_S):
                trial.violate("busy", f"{name} still busy after {WAIT_S:g} s")
        entries = await api.entries(channel)
        if waited_for:
            kind, _, prefix = waited_for.partition(":")
            if not any(
                e["kind"] == kind and e["text"].startswith(prefix) for e in entries if e["author"].startswith("agent:")
            ):
                trial.violate(
                    "harness",
                    f"the turn ended without a {waited_for!r} entry: "
                    f"{_brief([e for e in entries if e['kind'] in ('error', 'notice')])}",
                )
        self.check_stop(trial, accepted, results, follow, entries)
        self.evidence.refresh()
        self.check_trace(trial, channel, before)
        turns = {e["turn"] for e in entries if e["turn"]} | stopped
        turns |= {r["turn"] for r in self.evidence.prepared.get(channel, [])}
        cwds: tuple[str, ...] = (self.cwd_of(trial.agent, channel),)
        if trial.other:
            other_entries = await api.entries(other)
            turns |= {e["turn"] for e in other_entries if e["turn"]}
            cwds += (self.cwd_of(trial.agent, other),)
            agent = [e for e in other_entries if e["author"].startswith("agent:")]
            if not any(e["kind"] == "message" for e in agent):
                trial.violate("other-channel", f"never got its reply: {_brief(other_entries)}")
            bad = [e for e in other_entries if e["kind"] in ("notice", "error")]
            if bad:
                trial.violate("other-channel", f"disturbed: {_brief(bad)}")
        alive = await trio.to_thread.run_sync(_turn_processes, self.home, turns, cwds)
        if alive:
            trial.violate("alive-at-trial-end", f"{alive}")
            kill_by_pid(alive, wait=None)

    async def _run_interrupt(self, trial: Trial) -> None:
        """A message interrupts the turn (contract line 19), at a random moment, sometimes with a
        second interrupt, or a stop right after or right before it."""
        api, v = self.api, trial.violate
        channel, ident = f"c{trial.index}", f"t{trial.index}"
        sent: dict[int, str] = {}  # seq -> ident of the messages sent before the interrupt
        sent[(await api.send(channel, f"{trial.job} {ident}a", trial.agent))["seq"]] = f"{ident}a"
        if trial.moment == "queued":
            sent[(await api.send(channel, f"short {ident}b", trial.agent))["seq"]] = f"{ident}b"
        if trial.moment in ("delay", "queued"):
            await trio.sleep(trial.delay)
        elif trial.moment == "done":
            await api.wait(channel, WAIT_S)
        elif trial.moment in ("preparing", "spawning"):
            await self.wait_trace(channel, trial.moment)
        stops: list[dict[str, Any]] = []
        if trial.repeat == "stop-first":
            stops.append(await api.stop(channel))
        at_notice: list[Found] = []

        async def processes_at_the_notice(turn: str, after: int) -> None:
            # The lane stores the notice once the interrupted turn's teardown is over: its
            # processes are gone by the time a follower sees it.
            def noticed(e: dict[str, Any]) -> bool:
                return bool(e["kind"] == "notice" and e["turn"] == turn)

            with trio.move_on_after(WAIT_S):
                await api.follow_until(channel, noticed, after)
                at_notice.extend(await trio.to_thread.run_sync(_turn_processes, self.home, {turn}))

        t_interrupt = time.monotonic()
        first = await api.send(channel, f"short {ident}i", trial.agent, delivery="interrupt")
        trial.stop_ms = (time.monotonic() - t_interrupt) * 1000
        second: dict[str, Any] | None = None
        async with trio.open_nursery() as nursery:
            for turn in first.get("interrupted", []):
                nursery.start_soon(processes_at_the_notice, turn, first["seq"])
            if trial.repeat == "double":
                second = await api.send(channel, f"short {ident}j", trial.agent, delivery="interrupt")
            elif trial.repeat == "stop":
                stops.append(await api.stop(channel))
            if not await api.wait(channel, WAIT_S):
                v("busy", f"{channel} still busy after {WAIT_S:g} s")
                nursery.cancel_scope.cancel()
        if at_notice:
            v("alive-at-the-interrupt-notice", f"{at_notice}")
            kill_by_pid(at_notice, wait=None)
        entries = await api.entries(channel)
        self.evidence.refresh()
        ev = self.evidence
        trial.ended_turn = bool(first.get("interrupted"))
        if first.get("delivery") != "interrupt":
            v("interrupt", f"answered delivery {first.get('delivery')!r}")
        for r in stops:
            if r.get("http_status") != 200 or not r.get("ok"):
                v("stop-failed", f"HTTP {r.get('http_status')}: {r.get('error')}")
        leftovers = [e for e in entries if FLUSH_TEXT in e["text"]]
        if leftovers:
            v("leftover-output-stored", _brief(leftovers))
        if trial.repeat == "stop-first" and first.get("interrupted"):
            v("interrupt-after-stop", f"interrupted {first['interrupted']}, the stop's to end already")
        stopped_after = {t for r in stops if trial.repeat == "stop" for t in r.get("stopped_turns", [])}
        interrupted = [*first.get("interrupted", []), *((second or {}).get("interrupted", []))]
        notices = [e for e in entries if e["kind"] == "notice"]
        for n in notices:
            turn = n["meta"].get("interrupted")
            if turn is not None and turn not in interrupted:
                v("stray-interrupt-notice", _brief([n]))
        for turn in interrupted:
            own = [n for n in notices if n["meta"].get("interrupted") == turn]
            covered = [n for n in notices if "stop_seq" in n["meta"] and turn in stopped_after]
            if covered:
                if own:
                    v("interrupt-notice-after-a-stop", f"turn {turn}: {_brief(own)}")
                mine = covered
            elif len(own) != 1:
                v("interrupt-notice-count", f"turn {turn}: {len(own)} notice(s): {_brief(own)}")
                mine = own
            else:
                mine = own
            if mine:
                late = [e for e in entries if e["turn"] == turn and e["seq"] > mine[0]["seq"]]
                if late:
                    v("entry-after-notice", _brief(late))
        # What an interrupt dropped (still queued when it was decided: it had not started) never
        # starts; nor what a stop after it dropped.
        sent[first["seq"]] = f"{ident}i"
        replaced = [sent[seq] for answer in (first, second or {}) for seq in answer.get("dropped", []) if seq in sent]
        t_stop = min((s["t"] for s in ev.stops.get(channel, []) if not s["repeat"]), default=None)
        if trial.repeat == "stop" and t_stop is not None:
            for stamp in ev.started.get(f"{ident}i", []):
                if ev.spawned.get(stamp["turn"], float("inf")) > t_stop:
                    v("dropped-message-ran", f"the interrupting message started turn {stamp['turn']} after the stop")
        for name in replaced:
            for stamp in ev.started.get(name, []):
                v("replaced-message-ran", f"message {name}, dropped by an interrupt, started turn {stamp['turn']}")
        # And whatever the daemon answered: a message sent before the interrupt starts a turn after
        # the interrupting message was accepted only as the turn it interrupted.
        accepted_at = next((r["t"] for r in ev.accepts.get(channel, []) if r["seq"] == first["seq"]), None)
        for seq, name in sent.items():
            if seq == first["seq"] or accepted_at is None:
                continue
            for stamp in ev.started.get(name, []):
                if ev.spawned.get(stamp["turn"], -1.0) > accepted_at and stamp["turn"] not in interrupted:
                    v("replaced-message-ran", f"message {name} started turn {stamp['turn']} after the interrupt")
        last = f"{ident}j" if second is not None else f"{ident}i"
        if trial.repeat != "stop" and not ev.started.get(last):
            v("interrupting-message-never-ran", f"{last}: {_brief(entries[-4:])}")
        turns = {e["turn"] for e in entries if e["turn"]} | {r["turn"] for r in ev.prepared.get(channel, [])}
        alive = await trio.to_thread.run_sync(_turn_processes, self.home, turns, (self.cwd_of(trial.agent, channel),))
        if alive:
            v("alive-at-trial-end", f"{alive}")
            kill_by_pid(alive, wait=None)

    async def _run_cancel(self, trial: Trial) -> None:
        """A queued message is taken back (contract line 21) at a random moment of the turn ahead
        of it — sometimes with a stop right after or right before, or moved first beforehand.
        Taken back (200): it never starts a turn. Running (409): a turn took it, and it started
        (or a stop ended it before its spawn). Not queued (404): a stop dropped it, or it ran."""
        api, v = self.api, trial.violate
        channel, ident = f"c{trial.index}", f"t{trial.index}"
        await api.send(channel, f"{trial.job} {ident}a", trial.agent)
        queued = await api.send(channel, f"short {ident}b", trial.agent)
        if trial.moment == "delay":
            await trio.sleep(trial.delay)
        elif trial.moment == "done":
            await trio.sleep(0.05 + trial.delay)  # (the first short turn over, the second maybe begun)
        elif trial.moment in ("preparing", "spawning"):
            await self.wait_trace(channel, trial.moment)
        stops: list[dict[str, Any]] = []
        if trial.repeat == "stop-first":
            stops.append(await api.stop(channel))
        if trial.repeat == "first":
            moved = await api.cancel(channel, queued["seq"], first=True)
            if moved["http_status"] not in (200, 404, 409):
                v("cancel-failed", f"move first: HTTP {moved['http_status']}: {moved.get('error')}")
        t_cancel = time.monotonic()
        answer = await api.cancel(channel, queued["seq"])
        trial.stop_ms = (time.monotonic() - t_cancel) * 1000
        if trial.repeat == "stop":
            stops.append(await api.stop(channel))
        if not await api.wait(channel, WAIT_S):
            v("busy", f"{channel} still busy after {WAIT_S:g} s")
        entries = await api.entries(channel)
        self.evidence.refresh()
        ev = self.evidence
        for r in stops:
            if r.get("http_status") != 200 or not r.get("ok"):
                v("stop-failed", f"HTTP {r.get('http_status')}: {r.get('error')}")
        status, code = answer["http_status"], (answer.get("error") or {}).get("code")
        ran = ev.started.get(f"{ident}b", [])
        if status == 200:
            if ran:
                v("taken-back-message-ran", f"{ident}b started turn(s) {[s['turn'] for s in ran]}")
            if not any(e["meta"].get("take_back") == queued["seq"] for e in entries):
                v("take-back-not-recorded", _brief(entries[-4:]))
        elif status == 409 and code == "running":
            holders = [t["turn"] for t in (answer.get("error") or {}).get("running", [])]
            if not holders:
                v("running-without-its-turn", f"{answer}")
            stopped = {t for r in stops for t in r.get("stopped_turns", [])}
            if not ran and not set(holders) <= stopped:
                v("running-message-never-ran", f"{ident}b: answered running in {holders}, never started")
        elif status == 404 and code == "not_queued":
            # A stop before the take-back dropped it, or ended the turn that had taken it before its spawn.
            ended = any(r.get("dropped") or r.get("stopped_turns") for r in stops if trial.repeat == "stop-first")
            if not ran and not ended:
                v("not-queued-but-never-ran", f"{ident}b: {_brief(entries[-4:])}")
        else:
            v("cancel-failed", f"HTTP {status}: {answer.get('error')}")
        turns = {e["turn"] for e in entries if e["turn"]} | {r["turn"] for r in ev.prepared.get(channel, [])}
        alive = await trio.to_thread.run_sync(_turn_processes, self.home, turns, (self.cwd_of(trial.agent, channel),))
        if alive:
            v("alive-at-trial-end", f"{alive}")
            kill_by_pid(alive, wait=None)

    def check_stop(
        self,
        trial: Trial,
        accepted: dict[str, Any],
        results: list[dict[str, Any]],
        follow: dict[str, Any] | None,
        entries: list[dict[str, Any]],
    ) -> None:
        """The stop contract, from the stop results and the channel's transcript."""
        v = trial.violate
        for r in results:
            if r.get("http_status") != 200 or not r.get("ok"):
                v("stop-failed", f"HTTP {r.get('http_status')}: {r.get('error')}")
        leftovers = [e for e in entries if FLUSH_TEXT in e["text"]]
        if leftovers:
            v("leftover-output-stored", _brief(leftovers))
        first = [r for r in results if not r.get("repeat")]
        repeats = [r for r in results if r.get("repeat")]
        if len(first) != 1:
            v("notice-count", f"{len(first)} non-repeat stop(s) among {len(results)} (expected exactly 1)")
            return
        stop = first[0]
        notices = [e for e in entries if e["kind"] == "notice"]
        if len(notices) != 1:
            v("notice-count", f"{len(notices)} notice(s) for one stop: {_brief(notices)}")
        notice = next((e for e in notices if e["seq"] == stop.get("notice_seq")), None)
        if notice is None:
            v("notice-missing", f"the stop's notice_seq {stop.get('notice_seq')} is not a notice in the channel")
            return
        for r in repeats:
            if r.get("notice_seq") != notice["seq"]:
                v("repeat", f"a repeat stop names notice {r.get('notice_seq')}, not {notice['seq']}")
        generation = stop["generation"]
        if notice["generation"] != generation or generation <= accepted["generation"]:
            v("generation", f"message {accepted['generation']}, stop {generation}, notice {notice['generation']}")
        if notice["turn"] is not None:
            late = [e for e in entries if e["turn"] == notice["turn"] and e["seq"] > notice["seq"]]
            if late:
                v("entry-after-notice", _brief(late))
        if stop.get("stopped_turns") and notice["turn"] not in stop["stopped_turns"]:
            v("notice-turn", f"the notice names turn {notice['turn']}, the stop stopped {stop['stopped_turns']}")
        old = [
            e
            for e in entries
            if e["author"].startswith("agent:") and e["generation"] < generation and e["seq"] > notice["seq"]
        ]
        if old:
            v("old-message-ran", _brief(old))
        nudges = [e for e in entries if e["meta"].get("nudge") and e["seq"] > notice["seq"]]
        if nudges:
            v("nudge-after-stop", _brief(nudges))
        plans = [e for e in entries if isinstance(e["meta"].get("todos"), list) and e["seq"] < notice["seq"]]
        if plans:
            open_items = [i for i in plans[-1]["meta"]["todos"] if i.get("status") in ("pending", "in_progress")]
            if open_items:
                v("todos-unfinished-after-stop", f"the plan at the notice: {open_items}")
        if follow is not None:
            if follow["generation"] != generation:
                v("follow-up", f"got generation {follow['generation']}, the stop made {generation}")
            replies = [
                e
                for e in entries
                if e["author"].startswith("agent:")
                and e["kind"] == "message"
                and e["seq"] > follow["seq"]
                and e["generation"] == follow["generation"]
            ]
            if not replies:
                after = [e for e in entries if e["seq"] > follow["seq"]]
                v("follow-up", f"never got a reply; after it: {_brief(after)}")

    def check_trace(self, trial: Trial, channel: str, before: list[str]) -> None:
        """The point of no return and the late registrations, from the trace and the start stamps."""
        ev = self.evidence
        stops = [s for s in ev.stops.get(channel, []) if not s["repeat"]]
        if not stops:
            trial.violate("harness", f"no stop of {channel} in the trace")
            return
        t_stop = stops[0]["t"]
        prepared = ev.prepared.get(channel, [])
        first = prepared[0]["turn"] if prepared else None
        # Where the first turn was when the stop was decided.
        if first is None or prepared[0]["t"] > t_stop:
            trial.phase = "queued"
        elif ev.spawned.get(first, float("inf")) > t_stop:
            trial.phase = "preparing"
        elif first not in ev.registered or ev.registered[first]["t"] > t_stop:
            trial.phase = "spawning"
        elif stops[0]["turn"] == first:
            trial.phase = "running"
        else:
            trial.phase = "ended"
        for p in prepared:
            if p["t"] < t_stop and ev.spawned.get(p["turn"], -1.0) > t_stop:
                trial.violate("spawn-after-stop", f"turn {p['turn']} was stopped while preparing and spawned anyway")
        for ident in before:
            for stamp in ev.started.get(ident, []):
                if ev.spawned.get(stamp["turn"], float("inf")) > t_stop:
                    trial.violate(
                        "dropped-message-ran",
                        f"message {ident} was accepted before the stop and started turn {stamp['turn']} after it",
                    )
        for p in prepared:
            reg = ev.registered.get(p["turn"])
            if reg is None or not reg["stale"]:
                continue
            after = [s for s in ev.signals.get(reg["pid"], []) if s["t"] >= reg["t"]]
            first = after[0] if after else None
            # SIGKILL at once; or, while the stop's record is being stored, SIGSTOP (frozen) and
            # SIGKILL once it is.
            frozen = first is not None and first["sig"] == signal.SIGSTOP
            killed = first is not None and (
                first["sig"] == signal.SIGKILL or (frozen and any(s["sig"] == signal.SIGKILL for s in after))
            )
            # Sandboxed, the leader is bwrap's monitor and the program runs under bwrap's init
            # (pid 1 of the turn's pid namespace): a SIGKILL of the init ends every process of
            # the namespace (the kernel's doing), so it counts as the kill. The monitor exits
            # with the status the init reports for the program, the moment the program ends,
            # and the init stays for what the program left: so the registration can find the
            # monitor gone and the init alive — then the init must be killed.
            init = reg.get("init")
            init_alive = bool(reg.get("sandboxed") and reg.get("init_alive"))
            via_init = init is not None and any(
                s["sig"] == signal.SIGKILL for s in ev.signals.get(init, []) if s["t"] >= reg["t"]
            )
            resumed = any(s["sig"] == signal.SIGCONT for s in after)
            # The leader's own status (not a signal's: negative, or 128+N as bwrap reports one):
            # the agent ended by itself, which it stamps as it exits. Before the registration's
            # kill was sent, that was allowed (nothing was left to kill); after, it ran on.
            released = ev.released.get(p["turn"], {}).get("returncode")
            own_status = isinstance(released, int) and 0 <= released < 128 and not resumed
            done = ev.late_done.get(p["turn"], reg["t"])  # (none: a seeded bug's registration)
            ended_before = any(t <= done for t in ev.ended_turn.get(p["turn"], []))
            # Frozen at once, never resumed, and yet it exited by itself (its returncode, read
            # as its tree was released, is no signal's): it was already exiting when the SIGSTOP
            # came, which a process in exit does not obey, and by the kill nothing was left.
            exiting = frozen and not killed and own_status
            # Nothing left to kill: the leader had exited (seen by the trace, or by its own
            # status and end stamp, though it raced the trace), and no init of its sandbox lives.
            gone = (bool(reg.get("exited")) or (own_status and ended_before)) and not init_alive
            trial.late.append(
                "had exited" if gone and not killed and not via_init else "exited as frozen" if exiting
                else "frozen, killed" if killed and frozen else "killed" if killed
                else ("init killed, program had ended" if own_status else "init killed") if via_init
                else "not killed"
            )
            if not (killed or via_init or gone or exiting):
                trial.violate(
                    "late-registration-not-killed",
                    f"pid {reg['pid']} registered for stopped turn {p['turn']}; signals after: "
                    f"{[signal.Signals(s['sig']).name for s in after]}"
                    + (f", to its init {init}: {[signal.Signals(s['sig']).name for s in ev.signals.get(init, [])]}"
                       if init is not None else "")
                    + f"; returncode at release: {released}",
                )
            elif own_status and not ended_before and not reg.get("exited"):
                trial.violate(
                    "late-registration-ran-to-its-end",
                    f"pid {reg['pid']} registered for stopped turn {p['turn']} exited {released} by itself, "
                    f"and its agent's end was not stamped before the registration's kill",
                )
            # Its code may run between the registration and the signal's sending (on another
            # core): not after it.
            since = first["t"] if killed and first else reg["t"]
            late = [s for s in ev.started_turn.get(p["turn"], []) if s["t"] > since]
            if late:
                trial.violate(
                    "late-registration-lived",
                    f"pid {reg['pid']} of stopped turn {p['turn']} ran its code "
                    f"{(late[0]['t'] - reg['t']) * 1000:.0f} ms after registering",
                )


    # ------------------------------------------------------------ multi-agent trials

    async def _stop_now(self, trial: Trial, channel: str, results: list[dict[str, Any]], concurrent: bool) -> None:
        """Stop the channel (twice at once if ``concurrent``); check nothing of it outlives the return."""
        t0 = time.perf_counter()
        fresh: list[dict[str, Any]] = []
        if concurrent:
            async with trio.open_nursery() as both:
                for _ in range(2):
                    both.start_soon(_append, fresh, self.api, channel)
        else:
            fresh.append(await self.api.stop(channel))
        trial.stop_ms = trial.stop_ms or (time.perf_counter() - t0) * 1000
        results += fresh
        stopped = {t for r in fresh for t in r.get("stopped_turns", [])}
        trial.ended_turn = trial.ended_turn or bool(stopped)
        trial.killed += sum(len(r.get("killed", [])) for r in fresh)
        trial.swept += sum(len(r.get("swept", [])) for r in fresh)
        if stopped:
            alive = await trio.to_thread.run_sync(_turn_processes, self.home, stopped)
            if alive:
                trial.violate("alive-when-stop-returned", f"{alive}")
                kill_by_pid(alive, wait=None)

    async def _until(self, trial: Trial, channel: str, until: Any, what: str, after: int = 0) -> None:
        """Follow the channel until ``until(entry)``; a harness violation if it goes idle first."""
        got = trio.Event()
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                await self.api.follow_until(channel, until, after)
                got.set()
                nursery.cancel_scope.cancel()

            async def idle() -> None:
                await self.api.wait(channel, WAIT_S)
                # Idle: one more look (the entry may have come with the last turn), then give up.
                entries = await self.api.entries(channel)
                if not any(until(e) for e in entries if e["seq"] > after):
                    trial.violate("harness", f"the channel went idle before {what}: {_brief(entries[-4:])}")
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            nursery.start_soon(idle)
            with trio.move_on_after(WAIT_S):
                await trio.sleep_forever()
            trial.violate("harness", f"no {what} within {WAIT_S:g} s")
            nursery.cancel_scope.cancel()

    async def _run_multi(self, trial: Trial) -> None:
        api = self.api
        channel, other = f"m{trial.index}", f"m{trial.index}-other"
        ident = f"t{trial.index}"
        results: list[dict[str, Any]] = []
        if trial.other:
            await api.send(other, f"@ma chain {ident}o")
        accepted = await api.send(channel, f"@ma {trial.job} {ident}a")
        if trial.moment == "delay":
            await trio.sleep(trial.delay)
        elif trial.moment == "done":
            await api.wait(channel, WAIT_S)
        elif trial.moment == "handoff":
            seen = [0]
            handed = _hand_off_of(f"{ident}a")

            def enough(entry: dict[str, Any]) -> bool:
                seen[0] += handed(entry)
                return seen[0] >= trial.hand_offs

            await self._until(trial, channel, enough, f"{trial.hand_offs} hand-off(s)", accepted["seq"])
        await self._stop_now(trial, channel, results, concurrent=trial.repeat == "concurrent")
        if trial.repeat == "after":
            results.append(await api.stop(channel))
        bot = await api.send(channel, f"@mc chain {ident}b", author="agent:mb") if trial.bot else None
        human = await api.send(channel, f"@ma chain {ident}h") if trial.follow_up else None
        if human is not None and trial.again:
            await self._until(trial, channel, _hand_off_of(f"{ident}h"), "the lifted chain's hand-off", human["seq"])
            await self._stop_now(trial, channel, results, concurrent=False)
        for name in (channel, other) if trial.other else (channel,):
            if not await api.wait(name, WAIT_S):
                trial.violate("busy", f"{name} still busy after {WAIT_S:g} s")
        entries = await api.entries(channel)
        self.evidence.refresh()
        self.check_multi(trial, ident, entries, results, bot, human)
        self.check_multi_trace(trial, channel, results)
        turns = {e["turn"] for e in entries if e["turn"]} | {t for r in results for t in r.get("stopped_turns", [])}
        turns |= {r["turn"] for r in self.evidence.prepared.get(channel, [])}
        cwds = tuple(self.cwd_of(agent, channel) for agent in RING)
        if trial.other:
            other_entries = await api.entries(other)
            turns |= {e["turn"] for e in other_entries if e["turn"]}
            turns |= {r["turn"] for r in self.evidence.prepared.get(other, [])}
            cwds += tuple(self.cwd_of(agent, other) for agent in RING)
            if self.evidence.stops.get(other):
                trial.violate("other-channel", f"stopped: {self.evidence.stops[other]}")
            bad = [e for e in other_entries if e["kind"] in ("notice", "error")]
            if bad:
                trial.violate("other-channel", f"disturbed: {_brief(bad)}")
            if not any(e["kind"] == "status" and CHAIN_STOPPED in e["text"] for e in other_entries):
                trial.violate("other-channel", f"its chain never reached the hop limit: {_brief(other_entries[-4:])}")
        alive = await trio.to_thread.run_sync(_turn_processes, self.home, turns, cwds)
        if alive:
            trial.violate("alive-at-trial-end", f"{alive}")
            kill_by_pid(alive, wait=None)

    def check_multi(
        self, trial: Trial, ident: str, entries: list[dict[str, Any]], results: list[dict[str, Any]],
        bot: dict[str, Any] | None, human: dict[str, Any] | None,
    ) -> None:
        """The stop contract with several agents, from the stop results, the transcript and the stamps."""
        v = trial.violate
        for r in results:
            if r.get("http_status") != 200 or not r.get("ok"):
                v("stop-failed", f"HTTP {r.get('http_status')}: {r.get('error')}")
            if len(r.get("turns", [])) != len(r.get("stopped_turns", [])):
                v("stop-result", f"turns {r.get('turns')} do not match stopped_turns {r.get('stopped_turns')}")
        fresh = [r for r in results if not r.get("repeat")]
        if len(fresh) != 1 + trial.again:
            v("notice-count", f"{len(fresh)} fresh stop(s) among {len(results)} (expected {1 + trial.again})")
            return
        trial.phase = f"{len(fresh[0].get('turns', []))} turn(s) running"
        by_seq = {e["seq"]: e for e in entries}
        notices = [e for e in entries if e["kind"] == "notice"]
        if len(notices) != len(fresh):
            v("notice-count", f"{len(notices)} notice(s) for {len(fresh)} fresh stop(s): {_brief(notices)}")
        for r in results:
            if r.get("repeat") and r.get("notice_seq") != fresh[0].get("notice_seq"):
                v("repeat", f"a repeat stop names notice {r.get('notice_seq')}, not {fresh[0].get('notice_seq')}")
        for stop in fresh:
            notice = by_seq.get(stop.get("notice_seq", -1))
            if notice is None or notice["kind"] != "notice":
                v("notice-missing", f"the stop's notice_seq {stop.get('notice_seq')} is not a notice in the channel")
                continue
            late = [e for e in entries if e["turn"] in stop["stopped_turns"] and e["seq"] > notice["seq"]]
            if late:
                v("entry-after-notice", _brief(late))
            old = [
                e for e in entries
                if e["author"].startswith("agent:") and e["generation"] < stop["generation"]
                and e["seq"] > notice["seq"]
            ]
            if old:
                v("old-message-ran", _brief(old))
            last_plan: dict[str, dict[str, Any]] = {}
            for e in entries:
                if e["seq"] < notice["seq"] and isinstance(e["meta"].get("todos"), list):
                    # The agent's own plan entries and the stop's "Plan cancelled (NAME)" name it differently.
                    last_plan[str(e["meta"].get("agent") or e["author"]).removeprefix("agent:")] = e
            nudges = [e for e in entries if e["meta"].get("nudge") and e["seq"] > notice["seq"]]
            if nudges:
                v("nudge-after-stop", _brief(nudges))
            for agent, plan in last_plan.items():
                open_items = [i for i in plan["meta"]["todos"] if i.get("status") in ("pending", "in_progress")]
                if open_items:
                    v("todos-unfinished-after-stop", f"{agent}'s plan at notice #{notice['seq']}: {open_items}")
        leftovers = [e for e in entries if FLUSH_TEXT in e["text"]]
        if leftovers:
            v("leftover-output-stored", _brief(leftovers))
        # A routed flush would start its receiver with the job word FLUSHED-ON-SIGINT.
        stamps = [s for job in ("a", "b", "h") for s in self.evidence.started.get(f"{ident}{job}", [])]
        flushed = [s for s in stamps if s["job"] == FLUSH_TEXT]
        if flushed:
            v("stale-output-routed", f"turns started by a stopped turn's flush: {flushed[:3]}")
        if bot is not None and bot.get("to"):
            v("routed-while-resting", f"the bot's post (agent:mb) after the stop went to {bot['to']}")
        ran = self.evidence.started.get(f"{ident}b", [])
        if ran:
            v("routed-while-resting", f"the bot's post started turn(s) {[s['turn'] for s in ran]}")
        for chain in (f"{ident}a", f"{ident}h"):
            turns = {s["turn"] for s in self.evidence.started.get(chain, [])}
            if len(turns) > MULTI_TURNS[trial.job if chain.endswith("a") else "chain"]:
                v("hops-over-max", f"chain {chain} took {len(turns)} turns")
        if human is not None and not trial.again:
            ended = [
                e for e in entries if e["seq"] > human["seq"] and e["kind"] == "status" and CHAIN_STOPPED in e["text"]
            ]
            if not ended:
                after = [e for e in entries if e["seq"] > human["seq"]]
                v("rest-not-lifted", f"the human's chain never reached the hop limit: {_brief(after[-5:])}")

    def check_multi_trace(self, trial: Trial, channel: str, results: list[dict[str, Any]]) -> None:
        """From the trace: routed accepts while resting, hops, spawns after a stop of their turn."""
        ev = self.evidence
        for a in ev.accepts.get(channel, []):
            if a["routed"] and a["rests"]:
                trial.violate("routed-while-resting", f"the ledger accepted routed message {a['seq']} for {a['agent']}")
            if a["hops"] > MAX_HOPS:
                trial.violate("hops-over-max", f"message {a['seq']} for {a['agent']} at {a['hops']} hops")
        stops = [s for s in ev.stops.get(channel, []) if not s["repeat"]]
        if len(stops) != sum(1 for r in results if not r.get("repeat")):
            trial.violate("harness", f"{len(stops)} fresh stop(s) of {channel} in the trace")
        for stop in stops:
            for p in ev.prepared.get(channel, []):
                stopped = p["turn"] in stop["turns"]
                if stopped and p["t"] < stop["t"] and ev.spawned.get(p["turn"], -1.0) > stop["t"]:
                    trial.violate("spawn-after-stop", f"turn {p['turn']} was stopped while preparing, spawned anyway")


def _turn_processes(home: str, turns: set[str], cwds: tuple[str, ...] = ()) -> list[Found]:
    """Living processes of ``turns`` or with a cwd in ``cwds`` (HOME under ``home``): ``(pid, turn, cwd)``."""
    return marker_processes(home, turns, cwds=cwds, detail="cwd")


def _leaves(exc: BaseException) -> Any:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


async def _append(results: list[dict[str, Any]], api: AsyncAPI, channel: str) -> None:
    results.append(await api.stop(channel))


def _brief(entries: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"#{e['seq']} {e['author']} {e['kind']} g{e['generation']} {e['turn']} {e['text'][:60]!r}" for e in entries[:6]
    )


# ---------------------------------------------------------------- main


async def run_all(runner: Runner, trials: list[Trial], concurrency: int, quiet: bool) -> None:
    """Run every trial, ``concurrency`` at a time; print progress every 10 %."""
    pending = iter(trials)
    done = 0
    started = time.monotonic()

    async def worker() -> None:
        nonlocal done
        for trial in pending:
            await runner.run(trial)
            done += 1
            if not quiet and done % max(1, len(trials) // 10) == 0:
                bad = sum(1 for t in trials if t.violations)
                print(
                    f"  {done:>5}/{len(trials)} trials, {time.monotonic() - started:6.1f} s, {bad} with violations",
                    flush=True,
                )

    # Interrupt trials come in rounds, the daemon restarted after each (the restart must find
    # nothing of them running); the other kinds run on one daemon as before.
    rounds = (
        [trials[i:i + RESTART_EVERY] for i in range(0, len(trials), RESTART_EVERY)]
        if any(t.kind == "interrupt" for t in trials) else [trials]
    )
    for batch in rounds:
        pending = iter(batch)
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        interrupts = [t for t in batch if t.kind == "interrupt"]
        if interrupts:
            await runner.restart_and_check(interrupts)
    await runner.api.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000, help="how many trials (default 1000)")
    parser.add_argument("--quick", action="store_true", help="50 trials")
    parser.add_argument("--seed", type=int, default=None, help="replay a run with this seed")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help=f"trials at once (default {CONCURRENCY})")
    parser.add_argument(
        "--seed-bug",
        choices=sorted(SEEDED_BUGS),
        default=None,
        help="reintroduce one bug in the daemon: " + "; ".join(f"{k}: {v[1]}" for k, v in SEEDED_BUGS.items()),
    )
    parser.add_argument(
        "--cgroup",
        choices=("auto", "off"),
        default="auto",
        help="the kill mechanism: a cgroup per turn where writable (auto, the default) or the sweep "
        "(off); the seeded bug no-marker-scan implies off, and sandbox off (the marker scan is the sweep's, for "
        "turns outside a sandbox)",
    )
    parser.add_argument(
        "--kinds",
        default=",".join(DEFAULT_KINDS),
        help="comma-separated trial kinds to draw from: single (one agent per channel), multi (the ring agents "
        "handing work on), interrupt (a message interrupts the turn: contract line 19); default single,multi. "
        "--moments applies to single trials",
    )
    parser.add_argument(
        "--fleet", action="store_true",
        help="stop trials on a fleet: three daemons on one throwaway PostgreSQL (see scripts/_chaos_fleet.py)",
    )
    parser.add_argument("--lease", type=float, default=1.0, help="with --fleet: [cluster] lease, seconds (default 1)")
    parser.add_argument("--fleet-moments", default="at-once,delay,ready",
                        help="with --fleet: stop moments to draw from (default at-once,delay,ready)")
    parser.add_argument("--json", action="store_true", help="print only a JSON summary")
    parser.add_argument(
        "--moments",
        default=",".join(MOMENTS),
        help=f"comma-separated stop moments to draw from (default all: {','.join(MOMENTS)})",
    )
    args = parser.parse_args()
    moments = tuple(m for m in args.moments.split(",") if m)
    if not moments or set(moments) - set(MOMENTS):
        parser.error(f"--moments: choose among {', '.join(MOMENTS)}")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds: choose among {', '.join(KINDS)}")
    count = 50 if args.quick else args.trials
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    if args.fleet:
        from scripts._chaos_fleet import run as run_fleet

        fleet_moments = tuple(m for m in args.fleet_moments.split(",") if m)
        fleet_summary = run_fleet((50 if args.quick else args.trials), seed, args.lease, faults=False,
                                  moments=fleet_moments)
        print(json.dumps(fleet_summary) if args.json else json.dumps(fleet_summary, indent=2))
        return 1 if fleet_summary["violations"] else 0
    rng = random.Random(seed)
    choosers = {"multi": choose_multi, "interrupt": choose_interrupt, "cancel": choose_cancel}
    trials = [
        (choosers[kind](i, rng) if (kind := rng.choice(kinds)) in choosers else choose(i, rng, moments))
        for i in range(count)
    ]
    root = short_tmp("cc-")
    say = (lambda *a, **k: None) if args.json else print
    say(
        f"chaos stop: {count} trials, {args.concurrency} at a time, seed {seed}, one `corral run` daemon in {root}"
        + (f", seeded bug {args.seed_bug}" if args.seed_bug else "")
    )
    started = time.monotonic()
    failures: list[str] = []
    runner: Runner | None = None
    left: list[Found] = []
    try:
        # The marker scan is the sweep's, and what it finds only an unsandboxed turn leaves:
        # a sandboxed turn's escapees die with its pid namespace, whatever the sweep misses.
        marker_bug = args.seed_bug == "no-marker-scan"
        runner = Runner(root, args.seed_bug, "off" if marker_bug else args.cgroup, "off" if marker_bug else "auto")
        trio.run(run_all, runner, trials, args.concurrency, args.json)
    finally:
        if runner is not None:
            code = runner.daemon.stop()
            if code != 0:
                failures.append(f"the daemon exited with status {code} at the end")
        left = sweep_leftovers(str(root), (MARKER,), detail="cwd")
        if left:
            failures.append(f"{len(left)} turn process(es) alive after the daemon stopped: {left[:5]}")
    elapsed = time.monotonic() - started
    bad = [t for t in trials if t.violations]
    violations = sum(len(t.violations) for t in trials) + len(failures)
    by_kind = Counter(kind for t in trials for kind, _ in t.violations)
    by_kind.update({"after-the-run": len(failures)} if failures else {})
    phases = Counter(t.phase for t in trials)
    if args.json:
        print(
            json.dumps(
                {
                    "trials": count,
                    "seed": seed,
                    "seed_bug": args.seed_bug,
                    "elapsed_s": round(elapsed, 1),
                    "violations": violations,
                    "by_kind": dict(by_kind),
                    "phases": dict(phases),
                    "late_registrations": dict(Counter(how for t in trials for how in t.late)),
                    "planned_restarts": runner.planned_restarts if runner else None,
                    "examples": [[t.describe(), *[f"{k}: {d}" for k, d in t.violations[:3]]] for t in bad[:3]]
                    + failures,
                }
            )
        )
    else:
        stops = sorted(t.stop_ms for t in trials if t.stop_ms)
        mix = Counter(f"{t.job}/{t.moment.split(':')[0]}" for t in trials)
        multi = [t for t in trials if t.kind == "multi"]
        print(
            f"\ntrials: {count} in {elapsed:.1f} s ({count / elapsed:.1f}/s); daemon restarts: "
            f"{runner.restarts if runner else '?'} after a death, "
            f"{runner.planned_restarts if runner else '?'} planned (after each {RESTART_EVERY} interrupt trials)"
        )
        print(
            f"mix: {', '.join(f'{k} {n}' for k, n in sorted(mix.items()))}; agents "
            f"{dict(Counter(t.agent for t in trials))}; repeats {sum(1 for t in trials if t.repeat)}, "
            f"follow-ups {sum(1 for t in trials if t.follow_up)}, second channel {sum(1 for t in trials if t.other)}"
        )
        if multi:
            print(
                f"multi-agent trials: {len(multi)}; bot posts {sum(1 for t in multi if t.bot)}, human lifts "
                f"{sum(1 for t in multi if t.follow_up)}, stopped again mid-chain {sum(1 for t in multi if t.again)}, "
                f"second channel {sum(1 for t in multi if t.other)}"
            )
        print(
            f"phase of the turn when the stop was decided: {', '.join(f'{k} {n}' for k, n in sorted(phases.items()))}"
        )
        print(
            f"stops that ended a turn: {sum(1 for t in trials if t.ended_turn)} (killed a process: "
            f"{sum(1 for t in trials if t.killed)}, swept a setsid grandchild: {sum(1 for t in trials if t.swept)}); "
            f"the rest stopped an idle channel or a turn before its spawn"
        )
        if stops:
            print(
                f"stop call (client side): median {stops[len(stops) // 2]:.1f} ms, p95 "
                f"{stops[int(len(stops) * 0.95)]:.1f} ms, max {stops[-1]:.1f} ms"
            )
        late = Counter(how for t in trials for how in t.late)
        print(
            f"processes registered for a stopped turn: {sum(late.values())}"
            + (f" ({', '.join(f'{k} {n}' for k, n in sorted(late.items()))})" if late else "")
        )
        print(f"processes left after the daemon stopped: {len(left)}")
        print(f"violations: {violations} (in {len(bad)} trial(s))")
        for key, n in by_kind.most_common():
            print(f"  {n:>4} x {key}")
        for t in bad[:5]:
            print(f"  {t.describe()}")
            for kind, detail in t.violations[:4]:
                print(f"    - {kind}: {detail[:300]}")
        for line in failures:
            print(f"  - {line}")
    if violations:
        say(
            f"(replay with --seed {seed}{' --quick' if args.quick else f' --trials {count}'}"
            f"{f' --seed-bug {args.seed_bug}' if args.seed_bug else ''}"
            f"{f' --kinds {args.kinds}' if kinds != DEFAULT_KINDS else ''}; daemon log kept in {root}/daemon.log)"
        )
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
