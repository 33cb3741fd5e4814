"""The stop contract (docs/stop-contract.md), one test (or more) per line, in process.

Every test runs a real supervisor (``open_supervisor``) with a generic script agent. Races
are driven deterministically: a turn is parked at a hook (``took``, ``preparing``, or a
``spawn`` that wraps the real spawner) or at a *gate* — a FIFO the agent blocks on until
the test writes to it — and the stop lands while it is parked. Nothing sleeps to let
things settle; real processes get real time under generous ``fail_after`` limits.

Each hole of the post-mortems cited in ``docs/stop-contract.md`` has its own test: a message
already taken off the queue, a stop during preparation and during the spawn, the todo
nudge queued by the stopped turn, output flushed after the kill, a message typed after the
stop plus the client's automatic re-send, a stop in an idle channel, stop-all, and a stop
during a silent stream.
"""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
import trio.testing
from conftest import make_config, script_agent, turn_processes

from supervisor.core.ledger import StopLedger
from supervisor.host.supervisor import NUDGE_TEXT, STOP_NOTICE, Supervisor, open_supervisor
from supervisor.procs.registry import ProcessRegistry
from supervisor.procs.tree import TURN_MARKER, ProcessTree, descendants
from supervisor.procs.tree import spawn as real_spawn
from supervisor.store.store import Entry, Store, StoreError
from supervisor.testing import Hooks, host_pid

#: Generous limit for anything that involves a real process.
SLOW = 20.0

#: Every test here runs with each kill mechanism: a cgroup per turn, and the sweep fallback.
pytestmark = pytest.mark.usefixtures("kill_mechanism")

# The test agent speaks the generic line protocol; words of its prompt steer it:
#   ignore            ignore SIGINT and SIGTERM (only SIGKILL ends it)
#   flush             on SIGINT print text, a status, todos, a session id and a result, then exit
#   windup=FIFO       on SIGINT wait for the FIFO gate before exiting (a slow wind-down)
#   session=ID        print a session id first
#   whoami            report its own pid ("pid PID NAMESPACE")
#   child             start a child in the same process group (it sleeps; "child PID NAMESPACE")
#   setsid            start a child in a session of its own (it sleeps; "setsid PID NAMESPACE")
#   todos             report a plan with one item done, one in progress, one pending
#   silent            print nothing more and sleep (a stalled stream)
#   tick              print a line every 50 ms forever
#   gate=FIFO         after "ready", wait for the FIFO gate
#   hang              after the result, sleep instead of exiting
# A plain "ready" line (a message entry) tells the test the agent is where it should be.
# Resume arguments (``--resume ID``) come before the prompt; the agent reports them.
# A pid it reports is its pid namespace's (a sandboxed turn has its own), so it names the
# namespace too: :func:`reported_pid` turns both into this process's pid.
AGENT = r"""
import json, os, signal, subprocess, sys, time
prompt = sys.argv[-1]
words = prompt.split()
opts = dict(w.split("=", 1) for w in words if "=" in w)

def emit(kind, **fields):
    print(json.dumps({"type": kind, **fields}), flush=True)

def wait_gate(path):
    os.read(os.open(path, os.O_RDONLY), 1)

NS = os.stat("/proc/self/ns/pid").st_ino

if "ignore" in words:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif "flush" in words:
    def flush(*_):
        print("flushed text after the kill", flush=True)
        emit("status", text="flushed status")
        emit("todos", todos=[{"content": "flushed plan", "status": "pending"}])
        emit("session", id="sess-flushed")
        emit("result", text="flushed final answer")
        os._exit(0)
    signal.signal(signal.SIGINT, flush)
elif "windup" in opts:
    def windup(*_):
        wait_gate(opts["windup"])
        os._exit(130)
    signal.signal(signal.SIGINT, windup)
else:
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))

if len(sys.argv) > 3:  # ["-c", *args, "--", prompt]
    emit("status", text="args " + " ".join(sys.argv[1:-2]))
if "session" in opts:
    emit("session", id=opts["session"])
if "whoami" in words:
    emit("status", text=f"pid {os.getpid()} {NS}")
if "child" in words:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    emit("status", text=f"child {child.pid} {NS}")
if "setsid" in words:
    tool = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True,
                            stdout=subprocess.DEVNULL)
    emit("status", text=f"setsid {tool.pid} {NS}")
if "todos" in words:
    emit("todos", todos=[{"content": "one", "status": "completed"},
                         {"content": "two", "status": "in_progress"},
                         {"content": "three", "status": "pending"}])
if "silent" in words:
    time.sleep(3600)
if "tick" in words:
    while True:
        print("tick", flush=True)
        time.sleep(0.05)
print("ready", flush=True)
if "gate" in opts:
    wait_gate(opts["gate"])
emit("result", text="done: " + prompt)
if "hang" in words:
    time.sleep(3600)
"""


# ---------------------------------------------------------------- helpers


class Gate:
    """A FIFO the agent blocks on (``gate=PATH``) until the test opens it.

    The test holds the FIFO open read-write, so the agent's open never blocks and its read
    blocks until a byte arrives.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)

    def open(self, readers: int = 1) -> None:
        """Let ``readers`` blocked agents through."""
        os.write(self._fd, b"x" * readers)

    def close(self) -> None:
        os.close(self._fd)

    def __str__(self) -> str:
        return str(self.path)


@pytest.fixture
def gates(short_tmp: Path) -> Iterator[Callable[[], Gate]]:
    """Make gates in the test's folder; all are closed at the end."""
    made: list[Gate] = []

    def make() -> Gate:
        gate = Gate(short_tmp / f"gate{len(made)}")
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


@dataclass
class Spawned:
    turn_id: str
    process: trio.Process


@dataclass
class SpawnRecorder:
    """``Hooks.spawn``: the real spawner, recording every call; can park after the spawn.

    Shielded like the real one, which cannot be cancelled half-way.
    """

    park: bool = False
    """Park after the spawn (once), until ``go``; by then the process has printed."""
    calls: list[Spawned] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)
    go: trio.Event = field(default_factory=trio.Event)

    async def __call__(self, argv: tuple[str, ...], *, env: Any, cwd: str, stdin_pipe: bool, **kw: Any) -> trio.Process:
        with trio.CancelScope(shield=True):
            process = await real_spawn(argv, env=env, cwd=cwd, stdin_pipe=stdin_pipe, **kw)
            self.calls.append(Spawned(env[TURN_MARKER], process))
            if self.park and not self.go.is_set():
                with trio.fail_after(SLOW):
                    assert process.stdout is not None
                    await trio.lowlevel.wait_readable(process.stdout.fileno())  # peeks, reads nothing
                    self.arrived.set()
                    await self.go.wait()
        return process


@dataclass
class Park:
    """A ``took`` or ``preparing`` hook that parks the first turn until ``go`` is set."""

    shield: bool = False
    calls: list[tuple[str, str]] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)
    go: trio.Event = field(default_factory=trio.Event)
    cancelled: bool = False

    async def __call__(self, channel: str, turn_id: str) -> None:
        self.calls.append((channel, turn_id))
        if len(self.calls) > 1:
            return
        self.arrived.set()
        try:
            with trio.CancelScope(shield=self.shield), trio.fail_after(SLOW):
                await self.go.wait()
        except trio.Cancelled:
            self.cancelled = True
            raise


@asynccontextmanager
async def running(
    folder: Path, *, took: Any = None, preparing: Any = None, spawn: SpawnRecorder | None = None,
    **agent: Any,
) -> AsyncIterator[tuple[Supervisor, SpawnRecorder]]:
    """A supervisor with one script agent, ``bot``; limits and options go in ``agent``."""
    recorder = spawn or SpawnRecorder()
    config = make_config(folder, {"bot": script_agent(AGENT, **agent)})
    async with open_supervisor(config, hooks=Hooks(took=took, preparing=preparing, spawn=recorder)) as sup:
        yield sup, recorder


async def wait_entry(sup: Supervisor, channel: str, match: Callable[[Entry], bool], timeout: float = SLOW) -> Entry:
    """The first committed entry of ``channel`` that matches (past or future)."""
    with trio.fail_after(timeout):
        async with aclosing(sup.follow(channel)) as entries:
            async for entry in entries:
                if match(entry):
                    return entry
    raise AssertionError("the follow ended")


def is_ready(entry: Entry) -> bool:
    return entry.kind == "message" and entry.text == "ready"


async def send_and_wait_ready(sup: Supervisor, channel: str, prompt: str) -> Entry:
    await sup.send(channel, prompt)
    return await wait_entry(sup, channel, is_ready)


def notices(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.kind == "notice"]


def reported_pid(entry: Entry) -> int:
    """This process's pid for the one a status line of the agent names (``WORD PID NAMESPACE``):
    read while that process lives (a dead one's pid no longer exists in its namespace)."""
    _, pid, namespace = entry.text.split()
    return host_pid(int(pid), int(namespace))


async def wait_reported(sup: Supervisor, channel: str, word: str) -> int:
    """The (translated) pid of the agent's first ``WORD PID NAMESPACE`` status line."""
    entry = await wait_entry(sup, channel, lambda e: e.kind == "status" and e.text.startswith(word + " "))
    return reported_pid(entry)


def tree_pids(leaders: Iterable[int]) -> set[int]:
    """The pids of these turns' whole trees now (bubblewrap's monitor, its init, the program
    and what it started): what a stop of them kills, read right before it."""
    return {p.pid for leader in leaders for p in descendants(leader)}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def idle(sup: Supervisor, channel: str) -> None:
    assert await sup.wait_idle(channel, timeout=SLOW), f"channel {channel!r} did not become idle"


async def existing_idle(sup: Supervisor, channel: str) -> int:
    """Make ``channel`` exist (one finished turn: a stop on a never-used name is a typo); its last seq."""
    await sup.send(channel, "hello")
    await idle(sup, channel)
    return (await sup.entries(channel))[-1].seq


# ---------------------------------------------------------------- 1. scoped


async def test_contract_01_stop_leaves_the_same_agent_in_another_channel_alone(short_tmp: Path, gates: Any) -> None:
    a_gate, b_gate = gates(), gates()
    async with running(short_tmp) as (sup, spawned):
        await send_and_wait_ready(sup, "A", f"gate={a_gate}")
        await send_and_wait_ready(sup, "B", f"gate={b_gate}")
        b_proc = next(s.process for s in spawned.calls if sup._lanes.turns["B", "bot"].turn_id == s.turn_id)

        with trio.fail_after(SLOW):
            result = await sup.stop("A")

        assert result.ok and len(result.stopped_turns) == 1
        assert sup._ledger.generation("A") == 1 and sup._ledger.generation("B") == 0
        assert b_proc.returncode is None and alive(b_proc.pid)
        b_gate.open()
        await idle(sup, "B")
        b = await sup.entries("B")
        assert not notices(b)
        assert b[-1].kind == "message" and b[-1].text.startswith("done: ") and b[-1].author == "agent:bot"
        assert b_proc.returncode == 0
        assert [e.text for e in notices(await sup.entries("A"))] == [STOP_NOTICE]


async def test_contract_01_stop_in_an_idle_channel_touches_only_that_channel(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await send_and_wait_ready(sup, "busy", f"gate={gate}")
        busy_turn = sup._lanes.turns["busy", "bot"].turn_id
        last = await existing_idle(sup, "idle")

        with trio.fail_after(SLOW):
            result = await sup.stop("idle")

        # The idle channel still gets its notice (the UI settles), and nothing else moves.
        assert result.ok and result.stopped_turns == [] and result.killed == []
        assert [e.text for e in await sup.entries("idle", after=last)] == [STOP_NOTICE]
        assert sup._lanes.turns["busy", "bot"].turn_id == busy_turn
        assert not sup._ledger.is_stale("busy", busy_turn)
        assert spawned.calls[0].process.returncode is None
        gate.open()
        await idle(sup, "busy")
        busy = await sup.entries("busy")
        assert not notices(busy) and busy[-1].text.startswith("done: ")


def count_commits(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The store's commits from now on, each as its entries' kinds (a list the test reads)."""
    commits: list[list[str]] = []
    commit = Store._commit

    def counted(store: Store, batch: list[Any]) -> None:
        commits.append([p.entry.kind for p in batch if p.entry is not None])
        commit(store, batch)

    monkeypatch.setattr(Store, "_commit", counted)
    return commits


async def test_contract_01_stop_all_stops_every_busy_channel(
    short_tmp: Path, gates: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = gates()
    commits = count_commits(monkeypatch)
    async with running(short_tmp) as (sup, spawned):
        for channel in ("c1", "c2", "c3"):
            await send_and_wait_ready(sup, channel, f"gate={gate}")
        await existing_idle(sup, "quiet")
        await sup.stop("quiet")  # a channel the ledger knows, with nothing to stop
        busy_calls = spawned.calls[:3]  # the fourth made "quiet" and has ended
        busy_trees = tree_pids(s.process.pid for s in busy_calls)

        await sup.flush()
        commits.clear()
        with trio.fail_after(SLOW):
            result = await sup.stop(None)

        assert result.ok and result.channels is not None
        assert sorted(r.channel for r in result.channels) == ["c1", "c2", "c3"]
        # The three records in one commit, then the three notices in one (with the stopped
        # turns' usage rows): two in all, however many channels (contract 17's own tests
        # prove the record's comes before the kill).
        assert [kinds.count("notice") for kinds in commits] == [0, 3]
        assert set(result.stopped_turns) <= {r.turn for r in await sup._store.usage()}
        assert len(result.stopped_turns) == 3
        assert sorted(result.killed) == sorted(busy_trees)
        assert all(s.process.returncode is not None for s in spawned.calls)
        for channel in ("c1", "c2", "c3"):
            assert [e.text for e in notices(await sup.entries(channel))] == [STOP_NOTICE]
        assert len(notices(await sup.entries("quiet"))) == 1  # only its own earlier stop
        assert not turn_processes([s.turn_id for s in spawned.calls])


async def test_contract_01_a_stop_of_one_channel_is_two_commits_its_record_then_its_notice_with_the_usage(
    short_tmp: Path, gates: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop's record is committed before the kill (contract 17), its notice after the
    teardown (10): two commits, and no third for the stopped turn's usage row, which waits
    for the notice and goes in its commit (ending on its own, a turn's row goes at once)."""
    gate = gates()
    commits = count_commits(monkeypatch)
    async with running(short_tmp) as (sup, _):
        await send_and_wait_ready(sup, "c1", f"gate={gate}")
        await sup.flush()
        commits.clear()
        with trio.fail_after(SLOW):
            result = await sup.stop("c1")
        await sup.flush()
        assert result.ok and len(result.stopped_turns) == 1
        assert [kinds.count("notice") for kinds in commits] == [0, 1], commits
        assert result.stopped_turns[0] in {r.turn for r in await sup._store.usage("c1")}


# ---------------------------------------------------------------- 2. on record before any await


class FirstStep(trio.abc.Instrument):
    """Takes a snapshot when the named task first yields to the scheduler, and another at the
    start and the end of the step in which ``signalled`` first turns true."""

    def __init__(self, name: str, probe: Callable[[], dict[str, Any]]) -> None:
        self.name = name
        self.probe = probe
        self.seen: dict[str, Any] | None = None
        self.before_signal: dict[str, Any] | None = None
        self.at_signal: dict[str, Any] | None = None
        self._step_began: dict[str, Any] | None = None

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name == self.name and self.at_signal is None:
            self._step_began = self.probe()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name != self.name:
            return
        now = self.probe()
        if self.seen is None:
            self.seen = now
        if self.at_signal is None and now["signalled"]:
            self.before_signal, self.at_signal = self._step_began, now


def stop_rows(sup: Supervisor) -> list[tuple[Any, ...]]:
    """The stops table, read through a connection of its own (what is on disk, committed)."""
    db = sqlite3.connect(str(sup.config.store_path))
    try:
        return db.execute("SELECT seq, channel, generation, result FROM stops").fetchall()
    finally:
        db.close()


async def test_contract_02_generation_moves_and_kill_is_sent_before_the_first_await(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, _):
        await send_and_wait_ready(sup, "ch", f"gate={gate}")
        await sup.send("ch", "queued behind the running turn")
        turn = sup._lanes.turns["ch", "bot"]
        assert turn.tree is not None

        def probe() -> dict[str, Any]:
            return {
                "generation": sup._ledger.generation("ch"),
                "stale": sup._ledger.is_stale("ch", turn.turn_id),
                "cancelled": turn.scope.cancel_called,
                "signalled": turn.tree is not None and turn.tree.interrupted,
                "queued": len(sup._ledger.queued("ch")),
                "recorded": len(stop_rows(sup)),
            }

        first = FirstStep("stop-under-test", probe)
        trio.lowlevel.add_instrument(first)
        results = []
        try:
            async def stop() -> None:
                results.append(await sup.stop("ch"))

            with trio.fail_after(SLOW):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stop, name="stop-under-test")
        finally:
            trio.lowlevel.remove_instrument(first)

        # On record before any await: the generation has moved, the turn is stale and the
        # queue dropped; the kill waits for the stop's record (contract 17).
        assert first.seen == {
            "generation": 1, "stale": True, "cancelled": False, "signalled": False, "queued": 0, "recorded": 0,
        }
        # The kill: in one step, which began with the record already on disk, the scope is
        # cancelled and the group signalled. No checkpoint between the decision and the signal.
        assert first.before_signal is not None and first.before_signal["recorded"] == 1
        assert not first.before_signal["cancelled"] and not first.before_signal["signalled"]
        assert first.at_signal is not None and first.at_signal["cancelled"] and first.at_signal["signalled"]
        assert results[0].ok and results[0].dropped == 1


# ---------------------------------------------------------------- 3. queued work is dropped


async def test_contract_03_queued_messages_are_dropped(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await send_and_wait_ready(sup, "ch", f"gate={gate}")
        second = await sup.send("ch", "second")
        third = await sup.send("ch", "third")
        assert third.queued == 2

        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        await idle(sup, "ch")

        assert result.dropped == 2
        assert len(spawned.calls) == 1
        assert await sup._store.query("SELECT seq FROM queue") == []
        entries = await sup.entries("ch")
        assert not [e for e in entries if e.author == "agent:bot" and e.seq > second.seq]
        assert entries[-1].kind == "notice"


async def test_contract_03_message_taken_off_the_queue_never_starts(short_tmp: Path) -> None:
    # Hole 1 of openagents#676: the drain loop had already shifted the message.
    took = Park()
    async with running(short_tmp, took=took) as (sup, spawned):
        accepted = await sup.send("ch", "taken off the queue")
        with trio.fail_after(SLOW):
            await took.arrived.wait()
        assert sup._ledger.queued("ch") == ()  # no longer queued: only the ledger's turn knows it

        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        took.go.set()
        await idle(sup, "ch")

        assert result.ok and result.stopped_turns == [took.calls[0][1]]
        assert spawned.calls == []
        entries = await sup.entries("ch")
        assert [(e.seq, e.kind) for e in entries] == [(accepted.seq, "message"), (result.notice_seq, "notice")]

        # The channel is not wedged: the next message runs.
        await sup.send("ch", "next")
        await idle(sup, "ch")
        assert len(spawned.calls) == 1
        assert (await sup.entries("ch"))[-1].text == "done: next"


async def test_contract_03_half_prepared_turn_never_spawns(short_tmp: Path) -> None:
    # Hole 2 of openagents#676: a stop during the preparation round trips found no process.
    preparing = Park()
    async with running(short_tmp, preparing=preparing) as (sup, spawned):
        await sup.send("ch", "half prepared")
        with trio.fail_after(SLOW):
            await preparing.arrived.wait()

        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        await idle(sup, "ch")

        assert preparing.cancelled  # the stop cancelled the preparation itself
        assert spawned.calls == []
        assert result.ok and result.stopped_turns == [preparing.calls[0][1]] and result.killed == []
        entries = await sup.entries("ch")
        assert [e.kind for e in entries] == ["message", "notice"]


# ---------------------------------------------------------------- 4. new work runs


async def test_contract_04_message_after_the_stop_runs_while_the_stopped_turn_winds_down(
    short_tmp: Path, gates: Any
) -> None:
    gate, windup = gates(), gates()
    async with running(short_tmp) as (sup, spawned):
        await send_and_wait_ready(sup, "ch", f"gate={gate} windup={windup}")
        results = []

        async def stop() -> None:
            results.append(await sup.stop("ch"))

        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop)
                await trio.testing.wait_all_tasks_blocked()
                assert sup._ledger.generation("ch") == 1
                first = spawned.calls[0].process
                assert first.returncode is None  # still winding down: its SIGINT handler waits

                after = await sup.send("ch", "typed after the stop")
                assert after.generation == 1
                windup.open()
        await idle(sup, "ch")

        result = results[0]
        assert result.ok and first.returncode == 130
        assert len(spawned.calls) == 2
        entries = await sup.entries("ch")
        notice = next(e for e in entries if e.kind == "notice")
        # The stop's own seq is on the server clock at the moment of the stop.
        assert notice.meta["stop_seq"] < after.seq
        assert entries[-1].text == "done: typed after the stop" and entries[-1].generation == 1


# ---------------------------------------------------------------- 5. checked at the point of no return


async def test_contract_05_stale_turn_gives_up_at_the_point_of_no_return(short_tmp: Path) -> None:
    # A preparation step that does not notice cancellation (shielded, like an HTTP round
    # trip that must complete): only the check right before the spawn can save the day.
    preparing = Park(shield=True)
    async with running(short_tmp, preparing=preparing) as (sup, spawned):
        await sup.send("ch", "prepared past the stop")
        with trio.fail_after(SLOW):
            await preparing.arrived.wait()
        results = []

        async def stop() -> None:
            results.append(await sup.stop("ch"))

        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop)
                await trio.testing.wait_all_tasks_blocked()
                assert results == []  # the stop waits for the turn to finish
                preparing.go.set()
        await idle(sup, "ch")

        assert not preparing.cancelled
        assert spawned.calls == []
        assert results[0].ok
        assert [e.kind for e in await sup.entries("ch")] == ["message", "notice"]


# ---------------------------------------------------------------- 6. late registrations die


async def test_contract_06_process_registered_for_a_stopped_turn_is_killed_at_once(short_tmp: Path) -> None:
    # The process ignores SIGINT and the grace is long: only the registry's SIGKILL on
    # registration ends it in time. It has printed its session id (kept, line 8) and
    # more (dropped) before the spawn returns.
    spawner = SpawnRecorder(park=True)
    async with running(short_tmp, spawn=spawner, stop_grace=60) as (sup, _):
        await sup.send("ch", "ignore session=sess-late hang")
        with trio.fail_after(SLOW):
            await spawner.arrived.wait()
        spawned = spawner.calls[0]
        results = []

        async def stop() -> None:
            results.append(await sup.stop("ch"))

        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop)
                await trio.testing.wait_all_tasks_blocked()
                assert sup._registry.get("ch", spawned.turn_id) is None  # nothing to kill yet
                assert spawned.process.returncode is None
                spawner.go.set()
        await idle(sup, "ch")

        result = results[0]
        assert result.ok and result.elapsed_ms < 10_000
        assert spawned.process.returncode == -signal.SIGKILL
        assert sup._registry.get("ch", spawned.turn_id) is None
        entries = await sup.entries("ch")
        assert [e.kind for e in entries] == ["message", "notice"]
        assert sup._store.session("ch", "bot")[0] == "sess-late"
        assert not turn_processes([spawned.turn_id])


@pytest.mark.parametrize("recorded", [True, False])
async def test_contract_06_a_registration_while_the_stop_is_stored_is_frozen_until_it_is(
    short_tmp: Path, recorded: bool
) -> None:
    # Line 17 forbids killing before the stop's record is stored; line 6 forbids the process
    # of a stopped turn to run meanwhile. Frozen, then killed once stored, or resumed if the
    # stop was undone (its record failed).
    ledger = StopLedger()
    ledger.accept("ch", "bot", 1, human=True)
    ledger.take("ch", "bot", "t1")
    decision = ledger.stop("ch")
    registry = ProcessRegistry(ledger, recording=lambda channel: True)
    env = {"PATH": os.environ["PATH"], TURN_MARKER: "t1"}
    tree = ProcessTree(await real_spawn(("sleep", "60"), env=env, cwd=str(short_tmp), stdin_pipe=False), "t1")

    def state() -> str:
        with open(f"/proc/{tree.pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]

    try:
        assert registry.register("ch", "t1", tree)  # deferred: not killed yet
        with trio.fail_after(SLOW):
            while state() != "T":  # the kernel delivers SIGSTOP asynchronously: an outside event
                await trio.sleep(0.01)
        if not recorded:
            assert ledger.abort_stop(decision)
        registry.settle("ch")
        if recorded:
            with trio.fail_after(SLOW):
                await tree.process.wait()
            assert tree.process.returncode == -signal.SIGKILL
        else:
            with trio.fail_after(SLOW):
                while state() == "T":
                    await trio.sleep(0.01)
            assert tree.process.returncode is None
    finally:
        if tree.process.returncode is None:
            tree.process.kill()
        await tree.process.wait()
        for stream in (tree.process.stdout, tree.process.stderr):
            assert stream is not None
            await stream.aclose()


async def test_contract_06_release_is_by_identity(short_tmp: Path) -> None:
    ledger = StopLedger()
    ledger.accept("ch", "bot", 1, human=True)
    ledger.take("ch", "bot", "t1")
    registry = ProcessRegistry(ledger)
    env = {"PATH": os.environ["PATH"], TURN_MARKER: "t1"}
    old = ProcessTree(await real_spawn(("true",), env=env, cwd=str(short_tmp), stdin_pipe=False), "t1")
    new = ProcessTree(await real_spawn(("true",), env=env, cwd=str(short_tmp), stdin_pipe=False), "t1")
    try:
        assert registry.register("ch", "t1", old)
        assert registry.register("ch", "t1", new)  # the successor (a retry of the same turn)
        assert not registry.release("ch", "t1", old)  # the late exit of the old one
        assert registry.get("ch", "t1") is new
        assert registry.release("ch", "t1", new)
        assert registry.get("ch", "t1") is None
    finally:
        for tree in (old, new):
            await tree.process.wait()
            for stream in (tree.process.stdout, tree.process.stderr):
                assert stream is not None
                await stream.aclose()


# ---------------------------------------------------------------- 7. the whole tree dies


async def test_contract_07_stop_kills_the_group_and_reports_it(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"whoami child gate={gate}")
        agent_pid = await wait_reported(sup, "ch", "pid")
        child_pid = await wait_reported(sup, "ch", "child")
        await wait_entry(sup, "ch", is_ready)
        leader = spawned.calls[0]

        with trio.fail_after(SLOW):
            result = await sup.stop("ch")

        assert result.ok
        assert {agent_pid, child_pid} <= set(result.killed)
        assert not alive(agent_pid) and not alive(child_pid) and leader.process.returncode is not None
        assert not turn_processes([leader.turn_id])


async def test_contract_07_sigkill_after_the_grace_when_sigint_is_ignored(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    grace = 0.5
    async with running(short_tmp, stop_grace=grace) as (sup, spawned):
        await send_and_wait_ready(sup, "ch", f"ignore child gate={gate}")
        leader = spawned.calls[0]
        tree = tree_pids([leader.process.pid])

        with trio.fail_after(SLOW):
            result = await sup.stop("ch")

        assert result.ok and result.error is None
        assert result.elapsed_ms >= grace * 1000
        assert leader.process.returncode == -signal.SIGKILL
        assert sorted(result.killed) == sorted(tree)
        assert not turn_processes([leader.turn_id])
        assert (await sup.entries("ch"))[-1].text == STOP_NOTICE


# ---------------------------------------------------------------- 8. leftover output is discarded, except the session id


async def test_contract_08_output_flushed_after_the_kill_keeps_only_the_session_id(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp, resume_args=["--resume", "{session}"]) as (sup, spawned):
        await send_and_wait_ready(sup, "ch", f"flush session=sess-first gate={gate}")
        assert sup._store.session("ch", "bot")[0] == "sess-first"
        turn_id = spawned.calls[0].turn_id

        with trio.fail_after(SLOW):
            result = await sup.stop("ch")

        assert result.ok
        assert spawned.calls[0].process.returncode == 0  # it did flush and exit on its own
        entries = await sup.entries("ch")
        assert not [e for e in entries if "flushed" in e.text]
        assert [e.kind for e in entries if e.turn == turn_id] == ["message", "notice"]  # "ready", then the notice
        assert entries[-1].seq == result.notice_seq
        assert sup._store.session("ch", "bot")[0] == "sess-flushed"
        assert sup._store.todos("ch", "bot") == []

        # The next message resumes the conversation the killed CLI named last.
        await sup.send("ch", "resume me")
        await idle(sup, "ch")
        later = [e for e in await sup.entries("ch") if e.seq > result.notice_seq]
        assert any(e.kind == "status" and e.text == "args --resume sess-flushed" for e in later)
        assert later[-1].text == "done: resume me"


# ---------------------------------------------------------------- 9. no self-resumption


async def test_contract_09_no_nudge_after_a_stop_and_the_plan_is_cancelled(short_tmp: Path) -> None:
    async with running(short_tmp, max_nudges=1) as (sup, spawned):
        # Control: a turn that ends normally with unfinished todos does get nudged.
        await sup.send("control", "todos")
        await idle(sup, "control")
        control = await sup.entries("control")
        assert [e.text for e in control if e.meta.get("nudge")] == [NUDGE_TEXT.format(n=2)]

        # The stop lands as the turn is finishing: plan reported, answer given.
        await sup.send("ch", "todos hang")
        await wait_entry(sup, "ch", is_ready)
        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        await idle(sup, "ch")

        assert result.ok
        entries = await sup.entries("ch")
        assert not [e for e in entries if e.meta.get("nudge") or "remaining task" in e.text]
        assert not [e for e in entries if e.text.startswith("done: ")]  # its answer is not posted either
        assert sum(1 for s in spawned.calls if s.turn_id == result.stopped_turns[0]) == 1
        assert len(spawned.calls) == 3  # control, its nudge, the stopped turn: nothing after
        cancelled = [e for e in entries if e.kind == "todos" and e.author == "system"]
        assert len(cancelled) == 1
        expected = [
            {"content": "one", "status": "completed"},
            {"content": "two", "status": "cancelled"},
            {"content": "three", "status": "cancelled"},
        ]
        assert cancelled[0].meta["todos"] == expected
        assert sup._store.todos("ch", "bot") == expected
        assert cancelled[0].seq < result.notice_seq == entries[-1].seq


# ---------------------------------------------------------------- 10. the notice is last, once, always


async def test_contract_10_notice_is_the_last_entry_of_the_stopped_turn(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await send_and_wait_ready(sup, "ch", f"todos session=s1 gate={gate}")
        turn_id = spawned.calls[0].turn_id

        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        await idle(sup, "ch")

        entries = await sup.entries("ch")
        notice = entries[-1]
        assert notice.kind == "notice" and notice.text == STOP_NOTICE and notice.seq == result.notice_seq
        assert notice.turn == turn_id and notice.generation == 1
        of_turn = [e for e in entries if e.turn == turn_id]
        assert max(e.seq for e in of_turn) == notice.seq
        assert [e.kind for e in entries] == ["message", "todos", "message", "todos", "notice"]


async def test_contract_10_a_stop_with_nothing_running_still_posts_the_notice(short_tmp: Path) -> None:
    async with running(short_tmp) as (sup, spawned):
        last = await existing_idle(sup, "quiet")
        with trio.fail_after(SLOW):
            result = await sup.stop("quiet")
        assert result.ok and not result.repeat and result.stopped_turns == []
        entries = await sup.entries("quiet", after=last)
        assert [(e.kind, e.text, e.seq) for e in entries] == [("notice", STOP_NOTICE, result.notice_seq)]
        assert len(spawned.calls) == 1, "only the turn that made the channel ran"


async def test_contract_10_a_burst_of_stops_posts_one_notice(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, _):
        await send_and_wait_ready(sup, "ch", f"gate={gate}")
        results = []

        async def stop() -> None:
            results.append(await sup.stop("ch"))

        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(stop)

        assert sorted(r.repeat for r in results) == [False, True, True, True, True]
        assert len({r.notice_seq for r in results}) == 1 and results[0].notice_seq is not None
        assert len({r.generation for r in results}) == 1
        assert len(notices(await sup.entries("ch"))) == 1
        assert await sup._store.query("SELECT count(*) FROM stops") == [(1,)]


# ---------------------------------------------------------------- 11. repeats are idempotent


async def test_contract_11_repeat_stop_keeps_the_message_typed_after_the_first(short_tmp: Path, gates: Any) -> None:
    # The client re-sends Stop after a few seconds; the message typed in between must run.
    gate, windup = gates(), gates()
    async with running(short_tmp) as (sup, spawned):
        await send_and_wait_ready(sup, "ch", f"gate={gate} windup={windup}")
        results: dict[str, Any] = {}

        async def stop(name: str) -> None:
            results[name] = await sup.stop("ch")

        with trio.fail_after(SLOW):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop, "first")
                await trio.testing.wait_all_tasks_blocked()
                typed = await sup.send("ch", "typed between the presses")
                nursery.start_soon(stop, "repeat")
                await trio.testing.wait_all_tasks_blocked()
                assert sup._ledger.generation("ch") == 1
                assert [m.id for m in sup._ledger.queued("ch")] == [typed.seq]
                windup.open()
        await idle(sup, "ch")

        first, repeat = results["first"], results["repeat"]
        assert not first.repeat and repeat.repeat
        assert repeat.generation == first.generation == 1
        assert repeat.notice_seq == first.notice_seq is not None
        assert repeat.dropped == 0 and repeat.stopped_turns == [] and repeat.killed == []
        entries = await sup.entries("ch")
        assert len(notices(entries)) == 1
        assert await sup._store.query("SELECT count(*) FROM stops") == [(1,)]
        assert entries[-1].text == "done: typed between the presses"
        assert len(spawned.calls) == 2


async def test_contract_11_stop_after_a_new_turn_began_is_not_a_repeat(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, _):
        await existing_idle(sup, "ch")
        first = await sup.stop("ch")
        await send_and_wait_ready(sup, "ch", f"gate={gate}")
        with trio.fail_after(SLOW):
            second = await sup.stop("ch")
        assert not second.repeat and second.generation == first.generation + 1 == 2
        assert second.notice_seq != first.notice_seq and len(second.stopped_turns) == 1


# ---------------------------------------------------------------- 13. fast and acknowledged


async def test_contract_13_the_result_says_what_the_stop_did_and_it_is_logged(
    short_tmp: Path, gates: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"whoami child gate={gate}")
        agent_pid = await wait_reported(sup, "ch", "pid")
        child_pid = await wait_reported(sup, "ch", "child")
        await wait_entry(sup, "ch", is_ready)
        await sup.send("ch", "queued one")
        await sup.send("ch", "queued two")
        tree = tree_pids([spawned.calls[0].process.pid])
        assert {agent_pid, child_pid} <= tree

        with trio.fail_after(SLOW):
            result = await sup.stop("ch")

        assert result.ok and result.error is None and not result.repeat
        assert result.generation == 1 and result.dropped == 2
        assert result.stopped_turns == [spawned.calls[0].turn_id]
        assert set(result.killed) == tree
        assert result.swept == []
        assert 0 < result.elapsed_ms < 10_000
        as_json = result.to_json()
        assert as_json["killed"] == result.killed and as_json["notice_seq"] == result.notice_seq
        logged = [r for r in caplog.records if r.name == "corral" and r.levelno == logging.INFO]
        assert any(r.getMessage().startswith("stop 'ch': generation 1") for r in logged)


async def test_contract_13_a_stop_that_cannot_be_carried_out_answers_with_an_error(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral")
    async with running(short_tmp) as (sup, _):
        last = await existing_idle(sup, "ch")

        def broken(batch: Any) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(sup._store, "_commit", broken)
        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        monkeypatch.undo()
        assert not result.ok and result.error is not None and "could not be stored" in result.error
        assert result.notice_seq is None
        assert any("FAILED" in r.getMessage() for r in caplog.records if r.name == "corral")
        assert await sup.entries("ch", after=last) == []


async def test_contract_13_a_process_that_survives_the_sweep_fails_the_stop_loudly(
    short_tmp: Path, gates: Any, monkeypatch: pytest.MonkeyPatch, kill_mechanism: str
) -> None:
    # Simulate a process the sweep (or cgroup.kill) cannot kill (stuck in the kernel).
    import supervisor.procs.cgroup as cgroup_module
    import supervisor.procs.tree as tree_module

    gate = gates()
    immortal: set[int] = set()
    real_kill_exact = tree_module.kill_exact
    monkeypatch.setattr(tree_module, "kill_exact", lambda ident: ident.pid not in immortal and real_kill_exact(ident))

    def kill_all_but_immortal(path: Any) -> None:
        for pid in set(cgroup_module.read_procs(path)) - immortal:
            os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(cgroup_module, "kill_all", kill_all_but_immortal)
    real_sweep = ProcessTree.sweep
    monkeypatch.setattr(ProcessTree, "sweep", lambda self, scanner, budget=1.0: real_sweep(self, scanner, budget=budget))
    async with running(short_tmp) as (sup, _):
        await send_and_wait_ready(sup, "ch", f"gate={gate}")
        turn_id = sup._lanes.turns["ch", "bot"].turn_id
        tree = sup._registry.get("ch", turn_id)
        assert tree is not None
        # The stuck process is one of the turn's that is not inside its sandbox: every process
        # inside dies with the pid namespace's init, whoever kills it, so no simulation there
        # could outlive the stop (a process really stuck in the kernel would). It is the turn's
        # as corral knows a turn's processes: it carries the turn's marker (what the sweep
        # scans for) and sits in the turn's cgroup (what cgroup.kill ends). It ignores SIGINT
        # (the cgroup path interrupts it) before it says so.
        stuck = subprocess.Popen(
            ["sh", "-c", "trap '' INT TERM; echo ready; exec sleep 3600"],
            env={**os.environ, TURN_MARKER: turn_id, "CORRAL_STORE": sup._store.store_id},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True,
        )
        pid = stuck.pid
        try:
            assert stuck.stdout is not None and stuck.stdout.readline() == b"ready\n"
            immortal.add(pid)
            if tree.cgroup is not None:
                Path(tree.cgroup.path, "cgroup.procs").write_text(str(pid))
            with trio.fail_after(SLOW):
                result = await sup.stop("ch")
            assert not result.ok and result.error == f"processes [{pid}] could not be confirmed dead"
            notice = (await sup.entries("ch"))[-1]
            assert notice.kind == "notice" and notice.text.startswith("Stopping failed") and str(pid) in notice.text
            assert notice.meta["ok"] is False
        finally:
            stuck.kill()
            stuck.wait(timeout=SLOW)
            assert stuck.stdout is not None
            stuck.stdout.close()


# ---------------------------------------------------------------- 14. a stalled stream still stops


async def test_contract_14_stop_during_a_silent_stream_returns_within_the_budget(short_tmp: Path) -> None:
    # The sorcar post-mortem: a stream silent for minutes, and a process that does not
    # react to the polite signal. The stop must not wait for the stream to wake.
    grace = 1.0
    async with running(short_tmp, stop_grace=grace) as (sup, spawned):
        await sup.send("ch", "ignore session=sess-silent child silent")
        await wait_entry(sup, "ch", lambda e: e.kind == "status" and e.text.startswith("child "))
        assert sup._store.session("ch", "bot")[0] == "sess-silent"

        start = trio.current_time()
        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        elapsed = trio.current_time() - start

        assert result.ok
        assert elapsed < grace + 3.0
        assert spawned.calls[0].process.returncode == -signal.SIGKILL
        assert not turn_processes([spawned.calls[0].turn_id])
        assert sup._store.session("ch", "bot")[0] == "sess-silent"


async def test_contract_14_stall_timeout_ends_a_silent_turn(short_tmp: Path) -> None:
    async with running(short_tmp, stall_timeout=0.5, stop_grace=0.5) as (sup, spawned):
        await sup.send("ch", "silent")
        with trio.fail_after(SLOW):
            error = await wait_entry(sup, "ch", lambda e: e.kind == "error")
        await idle(sup, "ch")
        assert "stall_timeout" in error.text and "0.5 s" in error.text
        assert spawned.calls[0].process.returncode is not None
        assert not turn_processes([spawned.calls[0].turn_id])
        assert not notices(await sup.entries("ch"))


async def test_contract_14_turn_timeout_ends_a_turn_that_runs_too_long(short_tmp: Path) -> None:
    async with running(short_tmp, turn_timeout=1.0, stall_timeout=30) as (sup, spawned):
        await sup.send("ch", "tick")
        with trio.fail_after(SLOW):
            error = await wait_entry(sup, "ch", lambda e: e.kind == "error")
        await idle(sup, "ch")
        assert "turn_timeout" in error.text and "1 s" in error.text
        entries = await sup.entries("ch")
        assert any(e.text == "tick" for e in entries)
        assert entries[-1].seq == error.seq
        assert not turn_processes([spawned.calls[0].turn_id])


# ---------------------------------------------------------------- 16. saved before shown


async def test_contract_16_a_failed_store_write_is_an_error_the_caller_sees(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(short_tmp) as (sup, spawned):
        seen: list[Entry] = []

        async def follow(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with aclosing(sup.follow("ch")) as entries:
                task_status.started()
                async for entry in entries:
                    seen.append(entry)

        async with trio.open_nursery() as nursery:
            await nursery.start(follow)

            def broken(batch: Any) -> None:
                raise sqlite3.OperationalError("disk I/O error")

            monkeypatch.setattr(sup._store, "_commit", broken)
            with pytest.raises(StoreError), trio.fail_after(SLOW):
                await sup.send("ch", "lost to the disk")
            with trio.fail_after(SLOW):
                stop = await sup.stop("ch")
            assert not stop.ok and "could not be stored" in (stop.error or "")
            await idle(sup, "ch")
            monkeypatch.undo()

            # The unstored message never ran, and nobody was shown it.
            assert spawned.calls == []
            await sup.send("ch", "after the disk came back")
            await idle(sup, "ch")
            await wait_entry(sup, "ch", lambda e: e.text == "done: after the disk came back")
            nursery.cancel_scope.cancel()

        texts = [e.text for e in seen]
        assert "lost to the disk" not in texts and STOP_NOTICE not in texts
        assert texts[0] == "after the disk came back" and texts[-1] == "done: after the disk came back"
        stored = await sup._store.query("SELECT text FROM entries")
        assert ("lost to the disk",) not in stored
        assert len(spawned.calls) == 1


async def test_contract_16_a_turn_that_cannot_be_recorded_does_not_start(short_tmp: Path, gates: Any) -> None:
    # The disk fills between the message's acceptance and its turn: the dequeue and the
    # turn's row cannot be stored, so the turn must not start (after a crash, nobody could
    # find it, and the message would run again); the message stays queued and it says so.
    gate = gates()
    faults = FailCommits()
    took_turns: list[str] = []

    async def took(channel: str, turn_id: str) -> None:
        took_turns.append(turn_id)
        if len(took_turns) == 2:
            faults.arm(1)  # the next commit holds this turn's dequeue and row

    async with running(short_tmp, took=took) as (sup, spawned):
        faults.install(sup)
        await send_and_wait_ready(sup, "ch", f"gate={gate}")
        await sup.send("ch", "taken while the disk was full")
        gate.open()
        error = await wait_entry(sup, "ch", lambda e: e.kind == "error")
        await idle(sup, "ch")
        assert faults.failed == 1 and len(spawned.calls) == 1
        assert error.turn == took_turns[1]
        assert "did not run" in error.text and "disk full" in error.text
        assert await sup._store.query("SELECT text FROM queue") == [("taken while the disk was full",)]
        assert await sup._store.query("SELECT id FROM turns") == [(took_turns[0],)]


# ---------------------------------------------------------------- 15. death is not silence


def disk_full() -> sqlite3.OperationalError:
    """The error SQLite raises when the disk is full (SQLITE_FULL), as the store sees it."""
    error = sqlite3.OperationalError("database or disk is full")
    error.sqlite_errorcode = 13  # type: ignore[attr-defined]
    return error


class FailCommits:
    """A fault on the store's commit: the next ``n`` commits fail as a full disk does."""

    def __init__(self) -> None:
        self.left = 0
        self.failed = 0

    def arm(self, n: int = 1) -> None:
        self.left = n

    def install(self, sup: Supervisor) -> None:
        real = sup._store._commit

        def commit(batch: Any) -> None:
            if self.left > 0:
                self.left -= 1
                self.failed += 1
                raise disk_full()
            real(batch)

        sup._store._commit = commit  # type: ignore[method-assign]


def fake_orphan(store_id: str, *extra_env: str) -> psutil.Popen:
    """A process that looks like a turn's leftover of the store ``store_id``: it carries the
    store marker and ignores SIGINT (so only the SIGKILL after the grace ends it)."""
    import subprocess
    import sys

    env = {"PATH": os.environ["PATH"], "CORRAL_STORE": store_id, TURN_MARKER: "t0-orphan"}
    for item in extra_env:
        key, _, value = item.partition("=")
        env[key] = value
    code = "import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('up', flush=True); time.sleep(3600)"
    proc = psutil.Popen([sys.executable, "-c", code], env=env, start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # its handler is set
    return proc


async def test_contract_15_a_start_ends_its_stores_orphans_and_never_another_stores(short_tmp: Path) -> None:
    first, second = short_tmp / "one", short_tmp / "two"
    first.mkdir()
    second.mkdir()
    ids = {}
    for folder in (first, second):
        async with running(folder) as (sup, _):
            ids[folder] = sup._store.store_id
            # A turn the previous owner began and never ended, as an abrupt death leaves it.
            await sup._store.begin_turn("t0-gone", "ch", "bot", 0, 0).committed()
    assert ids[first] != ids[second]
    ours, theirs = fake_orphan(ids[first]), fake_orphan(ids[second])
    try:
        async with running(first, stop_grace=0.2) as (sup, _):
            # Before open_supervisor yields (before serving), its own orphan is dead...
            assert not alive(ours.pid)
            # ...and the other store's process is untouched.
            assert alive(theirs.pid)
            assert sup.recovered is not None and sup.recovered.killed == [ours.pid]
            assert sup.recovered.turns == ["t0-gone"]
            assert sup.status()["recovered"]["killed"] == [ours.pid]
            entries = await sup.entries("ch")
            assert [(e.kind, e.text, e.turn) for e in entries] == [
                ("notice", "Task interrupted — corral restarted. Send another message to continue.", "t0-gone")
            ]
            assert await sup._store.query("SELECT state FROM turns WHERE id = 't0-gone'") == [("ended",)]
        async with running(first) as (sup, _):
            assert sup.recovered is not None and sup.recovered.turns == [] and sup.recovered.killed == []
    finally:
        for proc in (ours, theirs):
            try:
                proc.kill()
                proc.wait()
            except psutil.NoSuchProcess:
                pass  # reaped already: the recovery waits for (and reaps) its own children


async def test_contract_15_every_turn_process_carries_its_store(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"setsid gate={gate}")
        environ = psutil.Process(await wait_reported(sup, "ch", "setsid")).environ()
        assert environ["CORRAL_STORE"] == sup._store.store_id
        assert environ[TURN_MARKER] == spawned.calls[0].turn_id
        (pid, started, state), = await sup._store.query(
            "SELECT pid, pid_started, state FROM turns WHERE id = ?", (spawned.calls[0].turn_id,)
        )
        assert pid == spawned.calls[0].process.pid and started and state == "running"
        gate.open()
        await idle(sup, "ch")
        await sup._store.flush()
        assert await sup._store.query("SELECT state FROM turns") == [("ended",)]


# ---------------------------------------------------------------- 17. a stop outlives the supervisor


async def test_contract_17_a_stop_whose_record_cannot_be_stored_kills_nothing(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    faults = FailCommits()
    async with running(short_tmp) as (sup, spawned):
        faults.install(sup)
        await sup.send("ch", f"whoami todos gate={gate}")
        agent_pid = await wait_reported(sup, "ch", "pid")
        await wait_entry(sup, "ch", is_ready)
        await sup.send("ch", "queued behind")
        turn_id = spawned.calls[0].turn_id
        tree = tree_pids([spawned.calls[0].process.pid])
        faults.arm(1)
        with trio.fail_after(SLOW):
            failed = await sup.stop("ch")
        assert faults.failed == 1
        assert not failed.ok and failed.error is not None
        assert failed.error.startswith("the stop could not be stored: disk full")
        assert failed.error.endswith("nothing was stopped")
        assert failed.notice_seq is None and failed.killed == [] and failed.stopped_turns == []
        # Nothing was killed or dropped; the ledger is as it was.
        assert agent_pid in tree and all(alive(pid) for pid in tree)
        assert sup._ledger.generation("ch") == 0 and not sup._ledger.is_stale("ch", turn_id)
        stored = [r[0] for r in await sup._store.query("SELECT seq FROM queue")]
        assert [m.id for m in sup._ledger.queued("ch")] == stored
        assert len(sup._ledger.queued("ch")) == 1
        assert sup._store.todos("ch", "bot")[2]["status"] == "pending"

        # A retried stop is a real stop, not a repeat with no notice.
        with trio.fail_after(SLOW):
            retry = await sup.stop("ch")
        await idle(sup, "ch")
        assert retry.ok and not retry.repeat and retry.notice_seq is not None and retry.dropped == 1
        assert retry.stopped_turns == [turn_id] and agent_pid in retry.killed
        assert len(spawned.calls) == 1


async def test_contract_17_a_process_registered_while_the_record_is_stored_dies_only_once_it_is(
    short_tmp: Path, gates: Any
) -> None:
    import threading

    # The record's commit is held in its thread; meanwhile the stopped turn's spawn returns.
    entered, release = threading.Event(), threading.Event()
    fail = [True]
    gate = gates()
    spawner = SpawnRecorder(park=True)
    async with running(short_tmp, spawn=spawner) as (sup, _):
        real = sup._store._commit

        def held(batch: Any) -> None:
            if any(p is record[0] for p in batch):
                entered.set()
                release.wait(SLOW)
                if fail[0]:
                    raise disk_full()
            real(batch)

        sup._store._commit = held  # type: ignore[method-assign]
        real_submit = sup._store.submit_stop_records
        record: list[Any] = [None]

        def submit(records: Any) -> Any:
            record[0] = real_submit(records)
            return record[0]

        sup._store.submit_stop_records = submit  # type: ignore[method-assign]
        for attempt in ("fails", "stored"):
            entered.clear()
            release.clear()
            fail[0] = attempt == "fails"
            spawner.go = trio.Event()
            spawner.arrived = trio.Event()
            await sup.send("ch", f"ignore gate={gate}")
            with trio.fail_after(SLOW):
                await spawner.arrived.wait()
            spawned = spawner.calls[-1]
            results: list[Any] = []

            async def stop() -> None:
                results.append(await sup.stop("ch"))

            with trio.fail_after(SLOW):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stop)
                    assert await trio.to_thread.run_sync(entered.wait, SLOW)
                    spawner.go.set()  # registers for a stale turn while its stop is not stored
                    await trio.testing.wait_all_tasks_blocked()
                    assert sup._registry.get("ch", spawned.turn_id) is not None
                    assert spawned.process.returncode is None  # not killed: the record may fail
                    release.set()
            if attempt == "fails":
                assert not results[0].ok and spawned.process.returncode is None
                gate.open()  # the turn was never stopped: it runs to its end
                await idle(sup, "ch")
                assert (await sup.entries("ch"))[-1].text == f"done: ignore gate={gate}"
            else:
                await idle(sup, "ch")
                # Stored: killed at once (SIGKILL, as on registration), not after the grace.
                assert results[0].ok and spawned.process.returncode == -signal.SIGKILL
                assert results[0].elapsed_ms < 10_000


async def test_contract_17_stop_all_stores_every_record_in_one_transaction(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    faults = FailCommits()
    async with running(short_tmp) as (sup, spawned):
        faults.install(sup)
        for channel in ("a", "b"):
            await send_and_wait_ready(sup, channel, f"gate={gate}")
        faults.arm(1)
        with trio.fail_after(SLOW):
            failed = await sup.stop()
        # One failed commit fails every channel's stop: the records are one transaction.
        assert faults.failed == 1 and not failed.ok
        assert [c.ok for c in failed.channels or []] == [False, False]
        assert all(alive(s.process.pid) for s in spawned.calls)
        assert [sup._ledger.generation(c) for c in ("a", "b")] == [0, 0]
        assert await sup._store.query("SELECT * FROM stops") == []
        with trio.fail_after(SLOW):
            done = await sup.stop()
        assert done.ok and sorted(done.stopped_turns) == sorted(s.turn_id for s in spawned.calls)
        assert sorted(r[0] for r in await sup._store.query("SELECT channel FROM stops")) == ["a", "b"]


async def test_contract_17_the_record_is_on_disk_before_the_kill(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, spawned):
        await sup.send("ch", f"todos gate={gate}")
        await wait_entry(sup, "ch", is_ready)
        queued = await sup.send("ch", "never runs")
        seen: list[Any] = []
        real_interrupt = sup._registry.interrupt

        def interrupt(channel: str, turn_id: str, sig: int = signal.SIGINT) -> Any:
            # What a crash at the moment of the kill would leave on disk.
            db = sqlite3.connect(str(sup.config.store_path))
            try:
                seen.append({
                    "stops": db.execute("SELECT channel, generation FROM stops").fetchall(),
                    "generation": db.execute("SELECT generation FROM generations WHERE channel = 'ch'").fetchall(),
                    "queue": db.execute("SELECT seq FROM queue").fetchall(),
                    "todos": db.execute("SELECT items FROM todos").fetchall(),
                    "turn": db.execute("SELECT state FROM turns").fetchall(),
                })
            finally:
                db.close()
            return real_interrupt(channel, turn_id, sig)

        sup._registry.interrupt = interrupt  # type: ignore[method-assign]
        with trio.fail_after(SLOW):
            result = await sup.stop("ch")
        await idle(sup, "ch")
        assert result.ok and len(seen) == 1
        disk = seen[0]
        assert disk["stops"] == [("ch", 1)] and disk["generation"] == [(1,)] and disk["queue"] == []
        assert "pending" not in disk["todos"][0][0] and "in_progress" not in disk["todos"][0][0]
        assert disk["turn"] == [("stopped",)]
        entries = await sup.entries("ch")
        dropped = [e for e in entries if e.seq == queued.seq][0]
        assert dropped.meta["dropped_by_stop"] == (await sup._store.query("SELECT seq FROM stops"))[0][0]
        await sup._store.flush()
        assert await sup._store.query("SELECT state FROM turns") == [("ended",)]
        assert len(spawned.calls) == 1


async def test_contract_17_the_notice_says_what_the_stop_dropped(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    async with running(short_tmp) as (sup, _):
        await send_and_wait_ready(sup, "ch", f"gate={gate}")
        await sup.send("ch", "one")
        await sup.send("ch", "two")
        with trio.fail_after(SLOW):
            two = await sup.stop("ch")
        await send_and_wait_ready(sup, "ch", f"gate={gate}")
        await sup.send("ch", "three")
        with trio.fail_after(SLOW):
            one = await sup.stop("ch")
        await idle(sup, "ch")
        entries = {e.seq: e for e in await sup.entries("ch")}
        assert entries[two.notice_seq].text == "Execution stopped by user. 2 queued messages were not run."
        assert entries[one.notice_seq].text == "Execution stopped by user. 1 queued message was not run."
        marked = {e.text: e.meta.get("dropped_by_stop") for e in entries.values() if e.kind == "message"}
        assert marked["one"] == marked["two"] is not None and marked["three"] not in (None, marked["one"])
        assert entries[two.notice_seq].meta["dropped"] == 2


# ---------------------------------------------------------------- the agent itself


def test_helpers_agent_compiles() -> None:
    compile(AGENT, "<agent>", "exec")

