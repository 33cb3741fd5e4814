"""A host never takes on more than it can hold: ``[server] max_turns``, an agent's
``max_concurrent``, memory admission, fair waiting, and waiting turns under the stop contract.

Real supervisors, real processes. Races are driven at exact points (the ``admitted`` and
``took`` hooks, FIFO gates, ``wait_all_tasks_blocked``); the one loop that samples runs beside
the turns to count their live trees, and never decides anything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from conftest import KILL, script_agent, turn_processes
from test_acp_turns import fake
from test_stop_contract import SLOW, Gate, wait_entry

from supervisor.config.settings import Config, parse_config
from supervisor.core.admission import MemoryReading
from supervisor.host.supervisor import STOP_NOTICE, Supervisor, open_supervisor
from supervisor.procs.tree import TURN_MARKER
from supervisor.testing import Hooks

GIB = 1024**3

# Prints "ready" and waits on gate=FIFO when its prompt names one; else answers at once.
AGENT = r"""
import json, os, sys
words = sys.argv[-1].splitlines()[-1].split()
opts = dict(w.split("=", 1) for w in words if "=" in w)
if "gate" in opts:
    print("ready", flush=True)
    os.read(os.open(opts["gate"], os.O_RDONLY), 1)
print(json.dumps({"type": "result", "text": "done " + " ".join(words)}), flush=True)
"""


def config(folder: Path, *, server: dict[str, Any] | None = None, agents: dict[str, dict[str, Any]] | None = None,
           **defaults: Any) -> Config:
    agents = agents or {"a": script_agent(AGENT)}
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"], **(server or {})},
        "store": {"path": "corral.db"},
        "agents": {name: {"sandbox_write": [str(folder)], **table} for name, table in agents.items()},
    }
    if defaults or len(agents) > 1:
        data["defaults"] = {"agent": next(iter(agents)), **defaults}
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


@pytest.fixture
def gates(short_tmp: Path) -> AsyncIterator[Callable[[], Gate]]:
    made: list[Gate] = []

    def make() -> Gate:
        made.append(Gate(short_tmp / f"gate{len(made)}"))
        return made[-1]

    yield make  # type: ignore[misc]
    for gate in made:
        gate.close()


@asynccontextmanager
async def running(cfg: Config, hooks: Hooks | None = None) -> AsyncIterator[Supervisor]:
    async with open_supervisor(cfg, hooks=hooks) as sup:
        yield sup


async def ready(sup: Supervisor, channel: str) -> None:
    await wait_entry(sup, channel, lambda e: e.kind == "message" and e.text == "ready")


async def done(sup: Supervisor, channel: str, timeout: float = SLOW) -> None:
    with trio.fail_after(timeout):
        assert await sup.wait_idle(channel)


def waiting(sup: Supervisor) -> list[tuple[str, str, int, str]]:
    return [(w["channel"], w["agent"], w["position"], w["why"]) for w in sup.status()["capacity"]["waiting"]]


async def settled() -> None:
    await trio.testing.wait_all_tasks_blocked(0.05)


def live_turns() -> set[str]:
    """Turns with a process alive now (their trees: every process carries the marker)."""
    return {p.info["environ"][TURN_MARKER] for p in turn_processes()}


# ---------------------------------------------------------------- the limit and its order


async def test_100_messages_to_100_channels_with_max_turns_4_run_4_at_a_time_in_fair_order(short_tmp: Path) -> None:
    order: list[str] = []

    async def took(channel: str, turn_id: str) -> None:
        order.append(channel)

    peak = 0
    async with running(config(short_tmp, server={"max_turns": 4}), Hooks(took=took)) as sup:
        assert sup.status()["capacity"]["max_turns"] == 4
        granted: list[str] = []
        decide = sup._capacity.admission.decide

        def recording(*args: Any) -> Any:
            decision = decide(*args)
            granted.extend(g.channel for g in decision.grants)
            return decision

        sup._capacity.admission.decide = recording  # type: ignore[method-assign]
        channels = [f"c{i:03}" for i in range(100)]

        async def sample(cancel: trio.CancelScope) -> None:
            nonlocal peak
            with cancel:
                while True:
                    peak = max(peak, len(live_turns()), sup.status()["capacity"]["running"])
                    await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            nursery.start_soon(sample, scope)
            for channel in channels:
                await sup.send(channel, f"hello {channel}")
            for channel in channels:
                await done(sup, channel, timeout=120)
            scope.cancel()
        assert 1 <= peak <= 4
        # Fair: one message per channel, so the order of the sends is the order of the grants;
        # the workers then run in the scheduler's order, so no turn begins more than the
        # limit's worth of places from its channel's.
        assert granted == channels
        assert sorted(order) == channels
        assert max(abs(order.index(c) - i) for i, c in enumerate(channels)) <= 4
        for channel in channels:
            texts = [e.text for e in await sup.entries(channel) if e.author.startswith("agent:")]
            assert texts == [f"done hello {channel}"]
        assert sup.status()["capacity"]["waiting"] == [] and sup.status()["capacity"]["used"] == 0


async def test_the_default_limit_is_derived_from_memory_and_lets_200_light_turns_run(short_tmp: Path) -> None:
    cfg = config(short_tmp, agents={"demo": {"adapter": "demo", "delay": 0.01}})
    async with running(cfg) as sup:
        capacity = sup.status()["capacity"]
        assert capacity["max_turns_from"] == "memory"
        assert capacity["max_turns"] >= 200 or capacity["memory"]["available"] < 8 * GIB


async def test_a_channel_with_many_messages_does_not_starve_the_others(short_tmp: Path, gates: Any) -> None:
    order: list[str] = []
    gate = gates()

    async def took(channel: str, turn_id: str) -> None:
        order.append(channel)

    cfg = config(short_tmp, server={"max_turns": 1}, agents={"a": script_agent(AGENT), "b": script_agent(AGENT)})
    async with running(cfg, Hooks(took=took)) as sup:
        await sup.send("hold", f"gate={gate}")
        await ready(sup, "hold")
        await sup.send("busy", "one", agent="a")
        await sup.send("busy", "two", agent="b")
        await sup.send("quiet", "one")
        await settled()
        assert waiting(sup) == [("busy", "a", 1, "turn limit"), ("quiet", "a", 2, "turn limit"),
                                ("busy", "b", 3, "turn limit")]
        lane = sup.status()["channels"]["quiet"]["agents"]["a"]
        assert lane["state"] == "queued" and lane["waiting"]["position"] == 2
        gate.open()
        for channel in ("hold", "busy", "quiet"):
            await done(sup, channel)
        assert order == ["hold", "busy", "quiet", "busy"]


async def test_an_agents_max_concurrent_below_the_hosts_limit_holds_only_that_agent(
    short_tmp: Path, gates: Any
) -> None:
    gate = gates()
    cfg = config(short_tmp, server={"max_turns": 4},
                 agents={"x": {**script_agent(AGENT), "max_concurrent": 1}, "y": script_agent(AGENT)})
    async with running(cfg) as sup:
        await sup.send("one", f"gate={gate}", agent="x")
        await ready(sup, "one")
        await sup.send("two", "hi", agent="x")
        await sup.send("three", "hi", agent="y")
        await done(sup, "three")
        await settled()
        assert waiting(sup) == [("two", "x", 1, "agent limit")]
        assert sup.status()["capacity"]["agents"]["x"] == {"max_concurrent": 1, "running": 1}
        gate.open()
        await done(sup, "one")
        await done(sup, "two")
        assert waiting(sup) == []


# ---------------------------------------------------------------- memory


async def test_memory_admission_holds_turns_while_a_simulated_reading_is_low(short_tmp: Path) -> None:
    reading = {"available": 256 * 1024**2}

    def memory(now: float) -> MemoryReading:
        return MemoryReading(reading["available"], now, pressure=None)

    cfg = config(short_tmp, server={"max_turns": 10, "memory_reserve": "1G"})
    async with running(cfg, Hooks(memory=memory)) as sup:
        await sup.send("ch", "hello")
        await settled()
        assert waiting(sup) == [("ch", "a", 1, "memory")]
        assert sup.status()["capacity"]["memory"]["available"] == 256 * 1024**2
        assert turn_processes() == []
        reading["available"] = 8 * GIB  # (the next recheck sees it)
        await done(sup, "ch")
        assert [e.text for e in await sup.entries("ch") if e.kind == "message"][-1] == "done hello"


# ---------------------------------------------------------------- the stop contract: a waiting turn is a queued message


async def test_contract_03_a_stop_drops_a_waiting_turn_and_it_never_starts(short_tmp: Path, gates: Any) -> None:
    took: list[str] = []
    gate = gates()

    async def on_take(channel: str, turn_id: str) -> None:
        took.append(channel)

    async with running(config(short_tmp, server={"max_turns": 1}), Hooks(took=on_take)) as sup:
        await sup.send("run", f"gate={gate}")
        await ready(sup, "run")
        await sup.send("wait", "never")
        await settled()
        assert waiting(sup) == [("wait", "a", 1, "turn limit")]
        result = await sup.stop("wait")
        assert result.ok and result.dropped == 1 and result.stopped_turns == []
        assert waiting(sup) == []
        gate.open()
        await done(sup, "run")
        await done(sup, "wait")
        assert took == ["run"]
        entries = await sup.entries("wait")
        assert [e.author for e in entries] == ["human:user", "system"] and entries[-1].text.startswith(STOP_NOTICE)
        # New work runs (4): a message after the stop waits its turn and runs.
        await sup.send("wait", "after the stop")
        await done(sup, "wait")
        assert took == ["run", "wait"]


async def test_contract_03_a_stop_between_the_grant_and_the_take_drops_the_message(
    short_tmp: Path, gates: Any
) -> None:
    # The slot is granted (the running turn ended and gave it up), and the worker is parked
    # right after the grant, before it takes its message: the stop lands there.
    parked, go = trio.Event(), trio.Event()
    took: list[str] = []
    gate = gates()

    async def admitted(channel: str, agent: str) -> None:
        if channel == "wait":
            parked.set()
            await go.wait()

    async def on_take(channel: str, turn_id: str) -> None:
        took.append(channel)

    cfg = config(short_tmp, server={"max_turns": 1})
    async with running(cfg, Hooks(admitted=admitted, took=on_take)) as sup:
        await sup.send("run", f"gate={gate}")
        await ready(sup, "run")
        await sup.send("wait", "never")
        await settled()
        gate.open()
        with trio.fail_after(SLOW):
            await parked.wait()
        assert waiting(sup) == [] and sup.status()["capacity"]["used"] == 1
        result = await sup.stop("wait")
        assert result.ok and result.dropped == 1
        go.set()
        await done(sup, "wait")
        await settled()
        assert took == ["run"] and sup.status()["capacity"]["used"] == 0


async def test_a_stop_all_and_a_stop_of_a_running_channel_let_the_waiters_through_in_order(
    short_tmp: Path, gates: Any
) -> None:
    took: list[str] = []
    gate = gates()

    async def on_take(channel: str, turn_id: str) -> None:
        took.append(channel)

    async with running(config(short_tmp, server={"max_turns": 1}), Hooks(took=on_take)) as sup:
        await sup.send("run", f"gate={gate}")
        await ready(sup, "run")
        for channel in ("w1", "w2"):
            await sup.send(channel, "hi")
        await settled()
        result = await sup.stop("run")  # the running channel: its slot goes to the first waiter
        assert result.ok and len(result.stopped_turns) == 1
        await done(sup, "w1")
        await done(sup, "w2")
        assert took == ["run", "w1", "w2"]
        await sup.send("run", f"gate={gate}")
        await ready(sup, "run")
        await sup.send("w1", "dropped")
        await sup.send("w2", "dropped")
        await settled()
        result = await sup.stop()
        assert result.ok and result.dropped == 2
        assert waiting(sup) == []
        await done(sup, "run")
        assert took == ["run", "w1", "w2", "run"]


async def test_a_restart_with_turns_waiting_runs_them_after_it(short_tmp: Path, gates: Any) -> None:
    gate = gates()
    cfg = config(short_tmp, server={"max_turns": 1})
    async with running(cfg) as sup:
        await sup.send("run", f"gate={gate}")
        await ready(sup, "run")
        await sup.send("w1", "one")
        await sup.send("w2", "two")
        await settled()
        assert [w[0] for w in waiting(sup)] == ["w1", "w2"]
        await sup.flush()
    gate.open()
    async with running(cfg) as sup:
        for channel in ("w1", "w2"):
            await done(sup, channel)
            texts = [e.text for e in await sup.entries(channel) if e.kind == "message"]
            assert texts[-1] in ("done one", "done two")


# ---------------------------------------------------------------- resident ACP agents


async def test_an_idle_acp_agent_counts_and_the_one_unused_longest_is_closed_for_a_slot(short_tmp: Path) -> None:
    cfg = config(short_tmp, server={"max_turns": 2}, agents={"acp": fake(short_tmp), "a": script_agent(AGENT)})
    async with running(cfg) as sup:
        for channel in ("old", "new"):
            await sup.send(channel, "hello", agent="acp")
            await done(sup, channel)
        capacity = sup.status()["capacity"]
        assert capacity["residents"] == 2 and capacity["used"] == 2 and capacity["running"] == 0
        old, new = sup._lanes.acp.get(("old", "acp")), sup._lanes.acp.get(("new", "acp"))
        assert old is not None and new is not None
        await sup.send("third", "hi", agent="a")
        await done(sup, "third")
        assert sup._lanes.acp.get(("old", "acp")) is None and sup._lanes.acp.get(("new", "acp")) is new
        # Its session resumes later: the next message starts a fresh process for it.
        await sup.send("old", "again", agent="acp")
        await done(sup, "old")
        assert sup._lanes.acp.get(("old", "acp")) is not None and sup.status()["capacity"]["used"] <= 2


def test_bad_limits_are_config_errors_with_the_key_and_the_fix(short_tmp: Path) -> None:
    from supervisor.config.settings import ConfigError

    for server, key in (({"max_turns": 0}, "server.max_turns"), ({"max_turns": -3}, "server.max_turns"),
                        ({"memory_reserve": "64T"}, "server.memory_reserve"),
                        ({"memory_reserve": "lots"}, "server.memory_reserve"),
                        ({"memory_pressure": 0}, "server.memory_pressure")):
        with pytest.raises(ConfigError) as caught:
            config(short_tmp, server=server)
        (problem,) = caught.value.problems
        assert problem.key == key and problem.fix, problem
    with pytest.raises(ConfigError) as caught:
        config(short_tmp, agents={"a": {**script_agent(AGENT), "max_concurrent": 0}})
    assert [p.key for p in caught.value.problems] == ["agents.a.max_concurrent"]
    with pytest.raises(ConfigError, match="machine's memory"):
        config(short_tmp, server={"memory_reserve": "64T"})


def test_corral_status_says_the_limit_what_waits_and_why() -> None:
    from supervisor.cli import _capacity_line, _lane_state

    capacity = {"max_turns": 4, "max_turns_from": "config", "memory_reserve": 512 << 20, "used": 4, "running": 3,
                "residents": 1, "agents": {"x": {"max_concurrent": 1, "running": 1}, "y": {"max_concurrent": None}},
                "memory": {"available": 8 << 30, "source": "cgroup", "pressure": 0.5},
                "waiting": [{"channel": "c", "agent": "x", "position": 1, "why": "agent limit", "waited": 2.0}]}
    assert _capacity_line(capacity) == (
        "capacity: 4 of 4 slots used (from the config): 3 turn(s), 1 idle ACP agent(s); 1 waiting; "
        "memory available 8192 MiB (cgroup, pressure 0.5%), reserve 512 MiB; agent limits: x 1/1"
    )
    lane = {"state": "queued", "queued": 1, "turn": None, "waiting": capacity["waiting"][0]}
    assert _lane_state(lane) == "queued 1, waiting #1 for a slot (agent limit)"


# ---------------------------------------------------------------- a fleet places by capacity


async def test_a_fleet_of_two_hosts_with_2_slots_each_and_10_busy_channels_uses_both_and_neither_exceeds(
    short_tmp: Path, postgres_url: str, gates: Any
) -> None:
    from test_fleet import agents, texts

    lease = 3.0  # (a loaded machine's heartbeat can miss a 1 s lease; placement goes by heartbeats anyway)

    async def until(probe: Callable[[], bool]) -> None:
        with trio.fail_after(90):
            while not await trio.to_thread.run_sync(probe):
                await trio.sleep(0.05)  # (polling the database for a condition; not settling)

    def host_config(name: str) -> Config:
        folder = short_tmp / name
        folder.mkdir()
        return parse_config({
            "server": {"socket": "corral.sock", "cgroup": "off", "max_turns": 2}, "store": {"url": postgres_url},
            "cluster": {"host": name, "lease": lease}, "agents": agents(folder),
        }, file=str(folder / "corral.toml"), base=folder)

    gate = gates()
    channels = [f"b{i}" for i in range(10)]
    peak = {"h1": 0, "h2": 0}
    async with open_supervisor(host_config("h1")) as one, open_supervisor(host_config("h2")) as two:
        hosts = {"h1": one, "h2": two}
        assert one.fleet is not None and two.fleet is not None
        with trio.fail_after(SLOW):  # (both hosts see each other)
            while not all(len(f.view) == 2 for f in (one.fleet, two.fleet)):
                await trio.sleep(0.02)

        async def sample(scope: trio.CancelScope) -> None:
            with scope:
                while True:
                    for name, sup in hosts.items():
                        peak[name] = max(peak[name], sup.status()["capacity"]["running"])
                    await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            nursery.start_soon(sample, scope)
            for channel in channels:  # every message through h1
                await one.send(channel, f"gate={gate}")
            # Both hosts fill up: 2 turns each, the rest wait (on either host, or in the store).
            with trio.fail_after(90):  # (both hosts at their limit)
                while not all(sup.status()["capacity"]["running"] == 2 for sup in hosts.values()):
                    await trio.sleep(0.02)  # (polling a condition; not settling)
            gate.open(len(channels))
            await until(lambda: all(any(t.startswith("done") for t in texts(postgres_url, c)) for c in channels))
            scope.cancel()
        assert peak == {"h1": 2, "h2": 2}
        with psycopg.connect(postgres_url) as conn:
            ran = dict(conn.execute("SELECT host, count(*) FROM turns GROUP BY host").fetchall())
        assert set(ran) == {"h1", "h2"} and min(ran.values()) >= 2 and sum(ran.values()) == 10, ran


# ---------------------------------------------------------------- GET /metrics


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def test_metrics_on_the_socket_and_behind_the_token_say_what_runs_waits_and_how_stops_went(
    short_tmp: Path, gates: Any
) -> None:
    import socket

    import httpx

    from supervisor.serve.daemon import run_daemon

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (short_tmp / "token").write_text("s3cret\n")
    (short_tmp / "token").chmod(0o600)
    gate = gates()
    cfg = config(short_tmp, server={"max_turns": 1, "tcp": f"127.0.0.1:{port}", "token_file": "token"})
    local = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(short_tmp / "corral.sock")),
                              base_url="http://corral")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(cfg, handle_signals=False, subreaper=False,
                                                            task_status=task_status))
        async with local:
            await local.post("/v1/channels/run/messages", json={"text": f"gate={gate}"})
            await local.post("/v1/channels/wait/messages", json={"text": "hi"})
            with trio.fail_after(SLOW):
                while (await local.get("/v1/status")).json()["capacity"]["waiting"] == []:
                    await trio.sleep(0.02)  # (polling a condition through the API; not settling)
            page = await local.get("/metrics")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain; version=0.0.4")
            found = _samples(page.text)
            assert found['corral_turns_running{agent="a"}'] == 1 and found['corral_turns_waiting{agent="a"}'] == 1
            assert found["corral_channels_waiting"] == 1 and found["corral_max_turns"] == 1
            assert "# TYPE corral_stop_seconds histogram" in page.text
            assert (await local.post("/v1/channels/wait/stop")).json()["ok"]
            gate.open()
            await local.post("/v1/channels/run/wait", params={"timeout": SLOW})
            found = _samples((await local.get("/metrics")).text)
            assert found['corral_stops_total{result="ok"}'] == 1 and found["corral_stop_seconds_count"] == 1
            assert found['corral_stop_seconds_bucket{le="+Inf"}'] == 1
            assert found['corral_turns_begun_total{agent="a"}'] == found['corral_turns_ended_total{agent="a"}'] == 1
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as tcp:
                assert (await tcp.get("/metrics")).status_code == 401
                good = await tcp.get("/metrics", headers={"authorization": "Bearer s3cret"})
                assert good.status_code == 200 and "corral_turns_running" in good.text
            await local.post("/v1/shutdown")


async def test_a_cancelled_wait_leaves_no_slot_and_no_waiter_behind(short_tmp: Path) -> None:
    from supervisor.host.capacity import Capacity

    async with trio.open_nursery() as nursery:
        capacity = Capacity(config(short_tmp, server={"max_turns": 1}), nursery, read=lambda now: None)
        assert await capacity.admit("a", "a")

        async def waiter(task_status: Any) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await capacity.admit("b", "a")

        scope = await nursery.start(waiter)
        await settled()
        assert [w["channel"] for w in capacity.status()["waiting"]] == ["b"]
        scope.cancel()
        await settled()
        assert capacity.status()["waiting"] == [] and capacity.admission.used == 1
        capacity.release("a", "a")
        assert capacity.admission.used == 0 and capacity.room() == 1
