"""A fleet: several hosts on one PostgreSQL store. The config keys, seqs that never collide,
leases with fencing tokens (a stale token stores nothing), a host that loses its lease
killing its turns at once, placement (a pinned channel runs on its host), a stop through a
host that does not own the channel, and `status` showing every host.

The hosts here are embedded supervisors in one process (each with its own state folder),
so each race is set up exactly; test_fleet_daemons.py runs real `corral run` daemons.
Leases are short (1 s) and every wait is a condition under a generous deadline.
"""

from __future__ import annotations

import dataclasses

import json
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from conftest import PYTHON
from test_acp_turns import fake as fake_acp
from test_acp_turns import wait_file
from test_stop_contract import AGENT, Gate

from supervisor import ConfigError, parse_config
from supervisor.config.settings import DEFAULT_LEASE, Config
from supervisor.fleet.fleet import Fleet
from supervisor.host.supervisor import Supervisor, open_supervisor
from supervisor.store.store import SEQ_STRIDE, Fenced, StoreInUse, open_store
from scripts.fakemodel.rig import write_tool_script

DEADLINE = 30.0
LEASE = 1.0


# ---------------------------------------------------------------- the config keys


def agents(folder: Path) -> dict[str, Any]:
    (folder / "agent.py").write_text(AGENT)
    # The test's folder (its gates, beside every host's folder) is granted: a turn's /tmp is its own.
    return {"bot": {"adapter": "generic", "command": [PYTHON, str(folder / "agent.py")], "stop_grace": 2.0,
                    "sandbox_write": [str(folder.parent)]}}


def test_cluster_host_defaults_to_the_hostname_and_the_lease_to_ten_seconds(tmp_path: Path) -> None:
    config = parse_config({"store": {"url": "postgresql:///c"}, "agents": {"d": {"adapter": "demo"}}}, base=tmp_path)
    assert config.cluster.host == socket.gethostname() and config.cluster.lease == DEFAULT_LEASE == 10.0


def test_cluster_keys_and_a_pinned_channel(tmp_path: Path) -> None:
    config = parse_config({
        "store": {"url": "postgresql:///c"}, "agents": {"d": {"adapter": "demo"}},
        "cluster": {"host": "h1", "lease": 2}, "channels": {"p": {"host": "h2"}},
    }, base=tmp_path)
    assert (config.cluster.host, config.cluster.lease) == ("h1", 2.0)
    assert config.channels["p"].host == "h2" and config.channels["p"].pinned_elsewhere("h1")
    assert config.members("p") == ("d",)  # a table that only pins admits every agent


@pytest.mark.parametrize(("data", "key", "fix"), [
    ({"cluster": {"host": "h 1"}}, "cluster.host", 'host = "h1"'),
    ({"cluster": {"lease": 0.5}}, "cluster.lease", "lease = 10"),
    ({"cluster": {"hots": "h1"}}, "cluster.hots", "'host'"),
])
def test_bad_cluster_keys_are_config_errors_naming_the_key_and_the_fix(
    tmp_path: Path, data: dict[str, Any], key: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config({"store": {"url": "postgresql:///c"}, "agents": {"d": {"adapter": "demo"}}, **data},
                     base=tmp_path)
    assert key in str(error.value) and fix in str(error.value)


def test_a_fleet_without_a_postgresql_store_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config({"agents": {"d": {"adapter": "demo"}}, "cluster": {"host": "h1"},
                      "channels": {"p": {"host": "h2"}}}, base=tmp_path)
    assert "cluster" in str(error.value) and "channels.p.host" in str(error.value)
    assert "[store] url" in str(error.value)


# ---------------------------------------------------------------- seqs and fencing


async def test_hosts_of_one_database_take_seqs_that_never_collide(postgres_url: str) -> None:
    async with open_store(postgres_url, host="h1") as one, open_store(postgres_url, host="h2") as two:
        assert {one.slot, two.slot} == {0, 1}
        written = []
        for i in range(20):
            written.append((await (one if i % 3 else two).append("c", "u", "message", str(i))).seq)
        assert len(set(written)) == 20
        assert {s % SEQ_STRIDE for s in written} == {one.slot, two.slot}
        with pytest.raises(StoreInUse, match="as fleet host 'h1'"):
            async with open_store(postgres_url, host="h1"):
                pass
    async with open_store(postgres_url, host="h2") as again:  # a host keeps its slot across restarts
        assert again.slot == 1 and again.next_seq() > max(written)


@pytest.mark.parametrize("taken", ["acquire", "force"])
async def test_a_new_owners_seqs_pass_every_seq_stored_a_begun_turns_message_included(
    postgres_url: str, taken: str
) -> None:
    # A routed message's queue row has a seq of its own and no entry: once its turn begins, the
    # row is gone and only the turn's row keeps the seq. The store counts on past it at open; a
    # lease's taker must too (one statement for both: supervisor.store.statements.newest_seq).
    ahead = 2**52  # (past any seq the wall clock gives)
    async with open_store(postgres_url, host="h1") as one:
        fleet = Fleet(one, "h1", LEASE)
        await one.transact(lambda db: db.execute(
            "INSERT INTO turns (id, channel, agent, generation, message, state, began) VALUES (?, ?, ?, ?, ?, ?, ?)",
            ("t1", "c", "bot", 0, ahead, "ended", 0.0)))
        assert one.next_seq() < ahead
        assert await (fleet.acquire("c") if taken == "acquire" else fleet.force("c")) == 1
        assert one.next_seq() > ahead


def expire(url: str, channel: str) -> None:
    """The channel's lease runs out now (as if its host had stopped answering for a lease)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE leases SET expires = 0 WHERE channel = %s", (channel,))


def count(url: str, sql: str, params: tuple[Any, ...] = ()) -> int:
    with psycopg.connect(url) as conn:
        ((n,),) = conn.execute(sql.replace("?", "%s"), params).fetchall()
        return int(n)


async def test_a_write_with_a_stale_fencing_token_fails_and_stores_nothing(postgres_url: str) -> None:
    async with open_store(postgres_url, host="h1") as one, open_store(postgres_url, host="h2") as two:
        first, second = Fleet(one, "h1", LEASE), Fleet(two, "h2", LEASE)
        old = await first.acquire("c")
        assert old == 1 and await second.acquire("c") is None  # held: another host cannot take it
        assert await first.acquire("c") == old  # its own host keeps it, and its token
        kept = await one.append("c", "agent:bot", "message", "under the lease", fence=old)
        expire(postgres_url, "c")
        new = await second.acquire("c")
        assert new == old + 1  # a new owner, a greater token
        with pytest.raises(Fenced, match=r"host h1 no longer holds channel 'c' \(fencing token 1 is stale"):
            await one.append("c", "agent:bot", "message", "after the lease moved", fence=old)
        with pytest.raises(Fenced):
            await one.begin_turn("t1", "c", "bot", 0, kept.seq, fence=old).committed()
        with pytest.raises(Fenced):
            await one.save_todos("c", "bot", [{"content": "x", "status": "pending"}], fence=old).committed()
        taker = await two.append("c", "agent:bot", "message", "the new owner's", fence=new)
        assert taker.seq > kept.seq  # the taker's seqs continue past the last owner's
        assert count(postgres_url, "SELECT count(*) FROM entries WHERE text = 'after the lease moved'") == 0
        assert count(postgres_url, "SELECT count(*) FROM turns") == 0
        assert count(postgres_url, "SELECT count(*) FROM todos") == 0
        # Unfenced writes (a message any host accepts) are not the lease's.
        assert (await one.append("c", "human:u", "message", "accepted anywhere")).text == "accepted anywhere"


async def test_a_heartbeat_returns_what_it_found_and_acts_on_none_of_it(postgres_url: str) -> None:
    """Decide, then act: a beat drops a lease it finds taken and reports it, with the orphans
    and the queued work, as one frozen value; nothing is called back from inside the I/O."""
    async with open_store(postgres_url, host="h1") as one, open_store(postgres_url, host="h2") as two:
        first, second = Fleet(one, "h1", LEASE), Fleet(two, "h2", LEASE)
        assert await first.acquire("taken") == 1 and await first.acquire("held") == 1
        queued = one.accept_message("held", "bot", "human:u", "for h1", generation=0, nudge=False)
        await queued.committed()
        assert queued.entry is not None
        await two.accept_message("orphan", "bot", "human:u", "nobody's", generation=0, nudge=False).committed()
        expire(postgres_url, "taken")
        assert await second.acquire("taken") == 2
        found = await first.beat()
        assert found is not None
        with pytest.raises(dataclasses.FrozenInstanceError):
            found.lost = ()  # type: ignore[misc]
        assert found.lost == (("taken", "another host holds its lease now"),)
        assert first.token("taken") is None and first.holds("held")  # (dropped here already; the owner kills)
        assert "orphan" in found.orphans and "held" not in found.orphans
        assert ("held", queued.entry.seq) in found.queued
        assert found.soonest is None or found.soonest > 0


async def test_a_takeover_is_not_held_up_by_a_paused_owner_inside_a_fencing_check(postgres_url: str) -> None:
    # A host SIGSTOPped between its fencing check (the lease row share-locked) and its commit
    # keeps that lock for as long as its session lives; a stop through another host must still
    # take the lease within its bound (found by `faults --fleet`, and once as a hung CI run).
    async with open_store(postgres_url, host="h1") as one, open_store(postgres_url, host="h2") as two:
        first = Fleet(one, "h1", LEASE)
        second = Fleet(two, "h2", LEASE)
        old = await first.acquire("c")
        assert old is not None
        paused = psycopg.connect(postgres_url.replace("postgresql://", "postgresql://", 1), autocommit=False)
        try:
            paused.execute("SELECT owner FROM leases WHERE channel = 'c' FOR SHARE").fetchall()  # and then: silence
            with trio.fail_after(15):
                new = await second.force("c")
            assert new == old + 1
            with pytest.raises(psycopg.OperationalError):
                paused.execute("SELECT 1").fetchall()  # its session was ended, its lock with it
        finally:
            paused.close()


async def test_a_fenced_write_in_a_batch_fails_alone(postgres_url: str) -> None:
    async with open_store(postgres_url, host="h1") as one:
        fleet = Fleet(one, "h1", LEASE)
        token = await fleet.acquire("c")
        assert token is not None
        stale = one.submit_entry("c", "agent:bot", "message", "stale", fence=token + 5)
        fine = one.submit_entry("c", "agent:bot", "message", "fine", fence=token)
        plain = one.submit_entry("d", "human:u", "message", "other channel")
        assert (await fine.committed()) is not None and (await plain.committed()) is not None
        with pytest.raises(Fenced):
            await stale.committed()


# ---------------------------------------------------------------- supervisors as hosts


def host_config(folder: Path, url: str, host: str, lease: float = LEASE, **channels: dict[str, Any]) -> Config:
    folder.mkdir(exist_ok=True)
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": "off"}, "store": {"url": url},
        "cluster": {"host": host, "lease": lease}, "agents": agents(folder),
    }
    if channels:
        data["channels"] = channels
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


@asynccontextmanager
async def host(folder: Path, url: str, name: str, **channels: dict[str, Any]) -> AsyncIterator[Supervisor]:
    async with open_supervisor(host_config(folder / name, url, name, **channels)) as sup:
        yield sup


def texts(url: str, channel: str = "ch") -> list[str]:
    with psycopg.connect(url) as conn:
        return [t for (t,) in conn.execute("SELECT text FROM entries WHERE channel = %s ORDER BY seq",
                                           (channel,)).fetchall()]


async def until(what: str, probe: Any) -> Any:
    """Wait for a condition, checked on the database or the supervisor, under a deadline."""
    with trio.fail_after(DEADLINE):
        while True:
            found = await trio.to_thread.run_sync(probe)
            if found:
                return found
            await trio.sleep(0.02)  # (polling a condition; not settling)


@pytest.fixture
def gate(short_tmp: Path) -> Any:
    made = Gate(short_tmp / "gate")
    yield made
    made.close()


async def test_a_host_that_loses_its_lease_kills_the_channels_turn_at_once_and_stores_nothing_more(
    short_tmp: Path, postgres_url: str, gate: Gate
) -> None:
    url = postgres_url
    async with host(short_tmp, url, "h1") as one:
        # h1 alone when the turn begins: with h2 up, a lease h1 is slow to take (a loaded machine)
        # leaves the queued message to whichever host takes the channel up first (seen once in a
        # fresh-clone run: h2 ran the turn, and h1 had none to lose).
        await one.send("ch", f"flush gate={gate}")  # on SIGINT it prints, plans and answers at once
        await until("h1's turn to be ready", lambda: "ready" in texts(url))
        turn = one._lanes.turns[("ch", "bot")]
        async with host(short_tmp, url, "h2") as two:
            assert one.fleet is not None and two.fleet is not None
            one.fleet.paused = True  # h1 stops renewing, as a host cut off from the database would
            lost_at = trio.current_time()
            with trio.fail_after(LEASE + 2):
                await turn.done.wait()  # killed when the local deadline passed, not later
            killed_after = trio.current_time() - lost_at
            assert killed_after <= LEASE + 1, killed_after
            assert one.fleet.token("ch") is None and turn.outcome.report.killed
            before = texts(url)
            # h2 takes the channel over (the lease ran out) and runs what is sent through it.
            gate.open()  # (h2's prompt catches up on h1's message, gate included)
            await two.send("ch", "after the move")
            await until("h2 to run it", lambda: any(t.startswith("done:") and "after the move" in t for t in texts(url)))
            assert two.fleet.token("ch") == 2
            after = texts(url)
            assert after[: len(before)] == before and not any("flushed" in t for t in after)  # nothing of h1's
            assert count(url, "SELECT count(*) FROM todos") == 0
            with psycopg.connect(url) as conn:
                hosts = dict(conn.execute("SELECT id, host FROM turns").fetchall())
            assert hosts[turn.turn_id] == "h1" and "h2" in hosts.values()


async def test_a_channel_pinned_to_another_host_runs_there(short_tmp: Path, postgres_url: str) -> None:
    url = postgres_url
    pinned = {"p": {"host": "h2"}}
    async with host(short_tmp, url, "h1", **pinned) as one, host(short_tmp, url, "h2", **pinned) as two:
        assert two.fleet is not None
        accepted = await one.send("p", "hello")  # accepted by h1, which may not run it
        await until("h2 to run it", lambda: "done: hello" in texts(url, "p"))
        assert one.fleet is not None and one.fleet.token("p") is None and two.fleet.token("p") == 1
        with psycopg.connect(url) as conn:
            ((ran_on, message),) = conn.execute("SELECT host, message FROM turns WHERE channel = 'p'").fetchall()
        assert (ran_on, message) == ("h2", accepted.seq)


async def test_a_stop_through_another_host_is_carried_out_by_the_owner(
    short_tmp: Path, postgres_url: str, gate: Gate
) -> None:
    url = postgres_url
    async with host(short_tmp, url, "h1") as one, host(short_tmp, url, "h2") as two:
        await two.send("ch", f"gate={gate}")
        await until("h2's turn", lambda: "ready" in texts(url))
        turn = two._lanes.turns[("ch", "bot")]
        await two.send("ch", "dropped by the stop")
        await one.require_channel("ch")
        result = await one.stop("ch")  # through h1: h2 records, kills and stores the notice
        assert result.ok and result.stopped_turns == [turn.turn_id] and result.dropped == 1, result
        assert turn.done.is_set() and turn.outcome.report.killed
        notice = "Execution stopped by user. 1 queued message was not run."
        assert result.notice_seq is not None and texts(url)[-1] == notice
        with psycopg.connect(url) as conn:
            ((stopped_by, record),) = conn.execute("SELECT host, result FROM stops").fetchall()
        assert stopped_by == "h2" and json.loads(record)["notice_seq"] == result.notice_seq
        assert two.fleet is not None and two.fleet.token("ch") == 1  # nothing moved: the owner stopped it


async def test_a_stop_through_another_host_answers_with_every_field_of_the_owners_result(
    short_tmp: Path, postgres_url: str
) -> None:
    # (The asker once rebuilt the owner's result field by field and left ``ended`` out: an ACP
    # turn's stop through another host answered ended None though the agent had acknowledged it.)
    url = postgres_url
    tool, pid_file = write_tool_script(short_tmp), short_tmp / "tool.pid"
    configs = []
    for name in ("h1", "h2"):
        folder = short_tmp / name
        folder.mkdir()
        configs.append(parse_config({
            "server": {"socket": "corral.sock", "cgroup": "off"}, "store": {"url": url},
            "cluster": {"host": name, "lease": LEASE}, "agents": {"acp": fake_acp(short_tmp)},
        }, file=str(folder / "corral.toml"), base=folder))
    async with open_supervisor(configs[0]) as one, open_supervisor(configs[1]) as two:
        await two.send("ch", f"[[tool:sh {tool} {pid_file}]] [[say:never said]]")
        child = await wait_file(pid_file)  # (the prompt is with the agent: its tool runs)
        await one.require_channel("ch")
        with trio.fail_after(DEADLINE):
            result = await one.stop("ch")  # through h1: h2 cancels the prompt, kills, answers
        assert result.ok and result.stopped_turns and result.ended == "cancelled", result
        assert child in result.killed and result.kill == "sweep" and result.notice_seq is not None, result
        with psycopg.connect(url) as conn:
            ((record,),) = conn.execute("SELECT result FROM stops WHERE host = 'h2'").fetchall()
        owners = json.loads(record)
        assert {k: v for k, v in result.to_json().items() if k not in ("elapsed_ms", "cpu_ms")} == {
            k: v for k, v in owners.items() if k not in ("elapsed_ms", "cpu_ms", "pending")}


async def test_a_malformed_notice_on_the_wire_is_dropped_and_the_owner_still_answers_stops(
    short_tmp: Path, postgres_url: str, gate: Gate
) -> None:
    # (Before the notices were typed, a ``stop`` addressed to a host without its channel or id
    # raised in the listener, and the host's supervisor ended with it.)
    url = postgres_url
    async with host(short_tmp, url, "h1") as one, host(short_tmp, url, "h2") as two:
        await two.send("ch", f"gate={gate}")
        await until("h2's turn", lambda: "ready" in texts(url))
        turn = two._lanes.turns[("ch", "bot")]
        with psycopg.connect(url, autocommit=True) as conn:
            for payload in ('{"kind": "stop", "to": "h2", "from": "h1"}', "[1", '{"kind": "stopped", "to": "h2"}',
                            '{"kind": "queued", "from": "h1", "channel": 7}'):
                conn.execute("SELECT pg_notify('corral_fleet', %s)", (payload,))
        assert two.fleet is not None
        await until("h2 to drop them", lambda: two.fleet is not None and two.fleet.malformed == 4)
        result = await one.stop("ch")  # through h1: h2, still listening, carries it out
        assert result.ok and result.stopped_turns == [turn.turn_id], result
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT host FROM stops").fetchall() == [("h2",)]


async def test_status_shows_every_host_its_channels_and_its_last_heartbeat(
    short_tmp: Path, postgres_url: str
) -> None:
    url = postgres_url
    async with host(short_tmp, url, "h1") as one, host(short_tmp, url, "h2") as two:
        await one.send("ch", "hello")
        await until("the reply", lambda: "done: hello" in texts(url))
        assert two.fleet is not None
        renewals = two.fleet.renewals
        await until("a heartbeat of h2", lambda: two.fleet is not None and two.fleet.renewals > renewals)
        fleet = two.status()["fleet"]
        assert fleet["host"] == "h2" and fleet["lease"] == LEASE
        by_host = {h["host"]: h for h in fleet["hosts"]}
        assert set(by_host) == {"h1", "h2"} and by_host["h2"]["alive"]
        assert "ch" in by_host["h1"]["channels"] and by_host["h1"]["age"] >= 0 and by_host["h1"]["heartbeat"] > 0
        json.dumps(fleet)  # (as the API prints it)


def test_the_docs_fleet_block_is_a_fleet_config(tmp_path: Path) -> None:
    import re
    import tomllib

    page = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    section = page[page.index("## Running a fleet"):]
    (block,) = re.findall(r"```toml\n(.*?)```\n", section.split("\n## ", 1)[0], re.S)
    data = tomllib.loads(block)
    data["agents"] = {"claude": {"adapter": "demo"}}  # (the claude CLI need not be installed here)
    config = parse_config(data, base=tmp_path)
    assert (config.cluster.host, config.cluster.lease) == ("h1", 10.0)
    assert config.channels["webapp"].pinned_elsewhere("h1") and config.members("webapp") == ("claude",)
    assert config.store_url == "postgresql://corral@db.internal/corral"


async def test_a_message_accepted_by_a_host_that_then_takes_the_channel_runs_after_an_earlier_stop(
    short_tmp: Path, postgres_url: str, gate: Gate
) -> None:
    url = postgres_url
    async with host(short_tmp, url, "h1") as one, host(short_tmp, url, "h2") as two:
        await one.send("ch", f"gate={gate}")
        await until("h1's turn", lambda: "ready" in texts(url))
        assert (await one.stop("ch")).ok  # generation 1, on h1 and in the store; h2 never saw it
        assert one.fleet is not None
        one.fleet.paused = True  # h1 stops answering: once its own deadline passes, it lets go
        await until("h1 to let go", lambda: one.fleet is not None and one.fleet.token("ch") is None)
        expire(url, "ch")  # (and its lease is free: no need to wait for the database's clock)
        await two.send("ch", "after the stop")  # stamped by h2 before it took the channel
        await until("h2 to run it", lambda: any(t.startswith("done:") and "after the stop" in t for t in texts(url)))
        assert two.fleet is not None and two.fleet.token("ch") == 2


async def test_a_message_sent_through_another_host_wakes_the_owner_at_once_not_at_its_next_heartbeat(
    short_tmp: Path, postgres_url: str
) -> None:
    url = postgres_url
    slow = 60.0  # a heartbeat every 20 s: a message taken up within 10 s was not taken up by one
    channels: dict[str, dict[str, Any]] = {"p": {"host": "h2"}}
    configs = [host_config(short_tmp / n, url, n, slow, **channels) for n in ("h1", "h2")]
    async with open_supervisor(configs[0]) as one, open_supervisor(configs[1]) as two:
        fleets = [one.fleet, two.fleet]
        assert fleets[0] is not None and fleets[1] is not None
        await until("both first heartbeats", lambda: all(f is not None and f.renewals for f in fleets))
        beats = fleets[1].renewals
        for n, (via, channel) in enumerate([(one, "p"), (two, "ch"), (one, "ch")]):
            # a pinned channel h2 holds no lease for yet; one h2 holds (sent through h1 next)
            with trio.fail_after(slow / 6):
                await via.send(channel, f"m{n}")
                await until(f"m{n} to run", lambda n=n, c=channel: f"done: m{n}" in texts(url, c))
        assert fleets[1].renewals == beats  # (no heartbeat took them up)
        with psycopg.connect(url) as conn:
            ran = conn.execute("SELECT channel, host FROM turns ORDER BY began").fetchall()
        assert ran == [("p", "h2"), ("ch", "h2"), ("ch", "h2")]


async def test_a_send_retried_through_another_host_with_its_key_runs_once(short_tmp: Path, postgres_url: str) -> None:
    """Issue 37: an idempotency key holds through any host of a fleet — a retry through another
    host answers the first acceptance, and the same key sent through two hosts at once is
    accepted by one of them, answered to both (the key is stored in the message's transaction,
    in the shared database)."""
    url = postgres_url
    async with host(short_tmp, url, "h1") as one, host(short_tmp, url, "h2") as two:
        first = await one.send("ch", "once", idempotency_key="retry-1")
        again = await two.send("ch", "once", idempotency_key="retry-1")
        assert again.replayed and again.seq == first.seq and not first.replayed
        answers = []

        async def send(via: Supervisor) -> None:
            answers.append(await via.send("ch", "at once", idempotency_key="both-2"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, one)
            nursery.start_soon(send, two)
        assert len({a.seq for a in answers}) == 1 and [a.replayed for a in answers].count(False) == 1, answers
        await until("both to run", lambda: "done: at once" in texts(url) and "done: once" in texts(url))
        with trio.fail_after(DEADLINE):
            assert await one.wait_idle("ch") and await two.wait_idle("ch")
    assert texts(url).count("once") == 1 and texts(url).count("at once") == 1, texts(url)
    assert texts(url).count("done: once") == 1 and texts(url).count("done: at once") == 1, texts(url)


async def test_follow_through_any_host_streams_every_hosts_entries_live_and_misses_none(
    short_tmp: Path, postgres_url: str
) -> None:
    url = postgres_url
    async with host(short_tmp, url, "h1") as one, host(short_tmp, url, "h2") as two:
        seen: dict[str, list[Any]] = {"h1": [], "h2": []}

        async def follow(sup: Supervisor, name: str, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            stream = sup.follow("ch")
            task_status.started()
            async for entry in stream:
                seen[name].append(entry)

        async with trio.open_nursery() as nursery:
            await nursery.start(follow, one, "h1")
            await nursery.start(follow, two, "h2")
            await two.send("ch", "first")  # h2 takes the channel and runs it: h1's follower sees it live
            await two.send("ch", "second")
            await until("h1's follower to show h2's answers", lambda: sum(
                e.text.startswith("done:") for e in seen["h1"]) == 2)
            await one.send("ch", "third")  # accepted by h1 (its entry), run by h2 (its entries)
            for name in seen:
                await until(f"{name}'s follower to show the third answer", lambda n=name: any(
                    e.text == "done: third" for e in seen[n]))
            nursery.cancel_scope.cancel()
        stored = texts(url)
        for name, entries in seen.items():
            assert sorted(e.text for e in entries) == sorted(stored), name  # every row, once
            assert all(e.text in stored for e in entries)
        writers = {e.seq % SEQ_STRIDE for e in seen["h1"]}
        assert len(writers) == 2  # (both hosts wrote the channel's entries)
        assert [e.seq for e in seen["h1"]] == [e.seq for e in seen["h2"]]  # (one commit order, both hosts)
        # A follower that resumes after an entry it was shown gets exactly the rest, in order.
        middle = len(seen["h1"]) // 2
        async with trio.open_nursery() as nursery:
            resumed: list[Any] = []

            async def rest() -> None:
                async for entry in one.follow("ch", after=seen["h1"][middle].seq):
                    resumed.append(entry)

            nursery.start_soon(rest)
            expected = seen["h1"][middle + 1:]
            await until("the rest", lambda: len(resumed) >= len(expected))
            nursery.cancel_scope.cancel()
        assert [e.seq for e in resumed] == [e.seq for e in expected]


async def test_followers_and_resume_points_go_by_commit_order_not_by_seq(postgres_url: str) -> None:
    # Two hosts' seqs do not follow their commits: h2's clock is behind h1's here, so its
    # row committed after h1's has the lower seq. Followers, and a resume after h1's row,
    # still see it, and a notice lost on the way is made good by the next one.
    async with open_store(postgres_url, host="h1") as one, open_store(postgres_url, host="h2") as two:
        shown: list[int] = []
        got = trio.Event()

        async def follow(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            stream = one.follow("c")
            task_status.started()
            async for entry in stream:
                shown.append(entry.seq)
                got.set()

        async def until_shown(seq: int) -> None:
            nonlocal got
            with trio.fail_after(DEADLINE):
                while seq not in shown:
                    got = trio.Event()
                    await got.wait()

        async with trio.open_nursery() as nursery:
            await nursery.start(follow)
            one.seq_floor(two.next_seq() + 1000 * SEQ_STRIDE)
            first = await one.append("c", "agent:bot", "message", "h1's, the greater seq, committed first")
            await until_shown(first.seq)
            late = await two.append("c", "human:u", "message", "h2's, a lower seq, committed later")
            assert late.seq < first.seq and late.pos is not None and first.pos is not None and late.pos > first.pos
            lost = await two.append("c", "human:u", "message", "h2's, its notice lost")
            last = await two.append("c", "human:u", "message", "h2's, its notice delivered")
            assert last.pos is not None
            one.others_committed(last.pos)  # (the listener's part: only the last notice arrives)
            await until_shown(last.seq)
            nursery.cancel_scope.cancel()
        assert shown == [first.seq, late.seq, lost.seq, last.seq]
        resumed = [e.seq for e in await one.entries("c", after=first.seq)]
        assert resumed == [late.seq, lost.seq, last.seq]  # (by seq, `late` would be left out)
        async with trio.open_nursery() as nursery:
            again: list[int] = []

            async def resume() -> None:
                async for entry in one.follow("c", after=late.seq):
                    again.append(entry.seq)

            nursery.start_soon(resume)
            with trio.fail_after(DEADLINE):
                while len(again) < 2:
                    await trio.sleep(0.01)  # (polling a condition; not settling)
            nursery.cancel_scope.cancel()
        assert again == [lost.seq, last.seq]


async def test_a_store_that_becomes_a_fleets_keeps_its_transcript_in_order(postgres_url: str) -> None:
    async with open_store(postgres_url) as alone:  # one daemon, no fleet: entries are not placed
        before = [await alone.append("c", "human:u", "message", f"m{i}") for i in range(3)]
    async with open_store(postgres_url, host="h1") as one:
        after = await one.append("c", "human:u", "message", "in the fleet")
        listed = [e.seq for e in await one.entries("c")]
        assert listed == [e.seq for e in before] + [after.seq]
        assert [e.seq for e in await one.entries("c", after=before[1].seq)] == [before[2].seq, after.seq]


async def test_a_message_whose_turn_a_stale_token_kept_from_starting_runs_once_the_lease_is_retaken(
    short_tmp: Path, postgres_url: str
) -> None:
    # (Found by chaos_stop --fleet: a stop through another host took a pinned channel's lease by
    # force while its host began the next message under its old token; that message never ran.)
    url = postgres_url
    async with host(short_tmp, url, "h1") as one:
        assert one.fleet is not None
        await one.send("ch", "first")
        await until("h1 to run it", lambda: "done: first" in texts(url))
        with psycopg.connect(url, autocommit=True) as conn:  # a third host takes it by force, for a stop
            conn.execute("UPDATE leases SET owner = 'h3', token = token + 1,"
                         " expires = extract(epoch from clock_timestamp()) + 60 WHERE channel = 'ch'")
        await one.send("ch", "second")  # h1 has not noticed: begun under the stale token, fenced, not started
        await until("h1 to notice", lambda: one.fleet is not None and one.fleet.token("ch") is None)
        expire(url, "ch")  # h3 gives it back (a pinned channel's lease after such a stop)
        with trio.fail_after(10 * LEASE):
            await until("h1 to take the channel back and run it", lambda: "done: second" in texts(url))
        assert count(url, "SELECT count(*) FROM queue") == 0
        assert not any("did not run" in t for t in texts(url))  # (fenced: h1 stored nothing about it)


@pytest.mark.parametrize("runs_next", ["the owner", "the accepting host"])
async def test_a_message_accepted_through_another_host_before_a_stop_never_runs_whatever_its_seq(
    short_tmp: Path, postgres_url: str, gate: Gate, monkeypatch: pytest.MonkeyPatch, runs_next: str
) -> None:
    # (Found by chaos_stop --fleet: a message accepted by host B in the same millisecond as a
    # stop through the owner A took a seq above the stop's, from B's slot; the stop's record
    # dropped only the rows below its seq, and the message ran after the stop.)
    url = postgres_url
    slow = 60.0  # (no heartbeat takes h2's row up during the test)
    configs = [host_config(short_tmp / n, url, n, slow) for n in ("h1", "h2")]
    async with open_supervisor(configs[0]) as one, open_supervisor(configs[1]) as two:
        await one.send("ch", f"gate={gate}")
        await until("h1's turn", lambda: "ready" in texts(url))
        monkeypatch.setattr(one._ownership, "_queued_elsewhere", lambda channel: None)  # h1 has not taken it up
        two._store.seq_floor(one._store.next_seq() + 1000 * SEQ_STRIDE)  # h2's clock runs ahead of h1's
        early = await two.send("ch", "accepted before the stop")
        result = await one.stop("ch")
        assert result.ok and result.notice_seq is not None and early.seq > result.notice_seq
        assert count(url, "SELECT count(*) FROM queue") == 0  # dropped by the stop's record
        if runs_next == "the owner":
            await one._ownership.pick_up("ch")
            await one.send("ch", "after the stop")
        else:
            assert one.fleet is not None
            one.fleet.paused = True
            expire(url, "ch")
            await two.send("ch", "after the stop")  # h2 takes the channel over from the store
        await until("the follow-up", lambda: "done: after the stop" in texts(url))
        assert "done: accepted before the stop" not in texts(url)


async def test_a_row_read_before_a_stop_and_queued_after_it_never_runs_and_the_next_stop_is_a_repeat(
    short_tmp: Path, postgres_url: str, gate: Gate, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The owner reads another host's queued row, the stop lands (its record deletes the row),
    # then the owner queues what it read, under the new generation: the store says no.
    url = postgres_url
    caplog.set_level(logging.INFO, logger="corral")
    configs = [host_config(short_tmp / n, url, n, 60.0) for n in ("h1", "h2")]
    async with open_supervisor(configs[0]) as one, open_supervisor(configs[1]) as two:
        await one.send("ch", f"gate={gate}")
        await until("h1's turn", lambda: "ready" in texts(url))
        monkeypatch.setattr(one._ownership, "_queued_elsewhere", lambda channel: None)
        await two.send("ch", "read before the stop")
        load, read, go_on = one._store.load_queue, trio.Event(), trio.Event()

        async def parked_load(channel: str | None = None) -> Any:
            rows = await load(channel)
            read.set()
            await go_on.wait()
            return rows

        monkeypatch.setattr(one._store, "load_queue", parked_load)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one._ownership.pick_up, "ch")
            await read.wait()
            assert (await one.stop("ch")).ok
            go_on.set()
        # Queued here under the new generation; its begin finds the row gone.
        await until("h1 to try it", lambda: "a stop dropped its message" in caplog.text)
        await until("h1's lane to be idle", lambda: ("ch", "bot") not in one._lanes.workers)
        assert (await one.stop("ch")).repeat  # no turn began since the stop
        await one.send("ch", "after the stop")
        await until("the follow-up", lambda: "done: after the stop" in texts(url))
        assert "done: read before the stop" not in texts(url)
        assert count(url, "SELECT count(*) FROM entries WHERE kind = 'notice'") == 1


class Parked:
    """A fleet host held at an exact point: right after the first of its transactions (the
    store's, or its fleet calls') that ``which`` names has committed (``parked`` is set;
    ``release`` lets it go on). From
    ``note_asks`` on, ``asked`` is set when anything (a stop, a turn) waits for the host's
    lease or take-over to settle."""

    def __init__(self, fleet: Fleet, monkeypatch: pytest.MonkeyPatch, which: Any) -> None:
        self.parked, self.asked, self._go_on = trio.Event(), trio.Event(), trio.Event()
        self._fleet, self._monkeypatch = fleet, monkeypatch
        transact = fleet.store.transact

        async def parked_transact(work: Any) -> Any:
            out = await transact(work)
            if not self.parked.is_set() and which(work):
                self.parked.set()
                await self._go_on.wait()
            return out

        monkeypatch.setattr(fleet.store, "transact", parked_transact)
        call = fleet.link.transact

        async def parked_call(work: Any, deadline: float, **kw: Any) -> Any:
            out = await call(work, deadline, **kw)
            if not self.parked.is_set() and which(work):
                self.parked.set()
                await self._go_on.wait()
            return out

        monkeypatch.setattr(fleet.link, "transact", parked_call)

    def note_asks(self) -> None:
        settled = self._fleet.settled

        async def noted_settled(channel: str) -> None:
            self.asked.set()
            await settled(channel)

        self._monkeypatch.setattr(self._fleet, "settled", noted_settled)

    def release(self) -> None:
        self._go_on.set()


async def test_a_stop_asked_of_a_host_whose_lease_is_still_on_its_way_is_carried_out_not_ignored(
    short_tmp: Path, postgres_url: str, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (Found by chaos_stop --fleet: h1 read h2 as the owner the moment h2's lease committed; the
    # stop notice reached h2 before its own answer did, h2 ignored it as not its channel, and
    # the stop waited out the lease and answered ok: false.)
    url = postgres_url
    slow = 60.0  # (an ignored stop would wait the whole lease)
    configs = [host_config(short_tmp / n, url, n, slow) for n in ("h1", "h2")]
    async with open_supervisor(configs[0]) as one, open_supervisor(configs[1]) as two:
        assert two.fleet is not None
        # Parked once the lease is h2's in the database: h2 does not know yet.
        h2 = Parked(two.fleet, monkeypatch, lambda work: getattr(work, "func", None) == two.fleet.leases.take)
        await two.send("ch", f"gate={gate}")
        with trio.fail_after(DEADLINE):
            await h2.parked.wait()
        h2.note_asks()  # (h2's worker asked before its acquisition; from here only the stop asks)
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def stop() -> None:
                results.append(await one.stop("ch"))

            nursery.start_soon(stop)
            with trio.fail_after(DEADLINE):
                await h2.asked.wait()  # h2 has the notice, its lease's answer still on the way
            h2.release()
            with trio.fail_after(slow / 6):
                while not results:
                    await trio.sleep(0.01)  # (polling a condition; not settling)
        (result,) = results
        # Carried out by h2, not waited out: its message dropped, or its turn (begun the moment
        # the channel was taken over) stopped.
        assert result.ok and (result.dropped == 1) != bool(result.stopped_turns), result
        stopped_by = count(url, "SELECT count(*) FROM stops WHERE host = 'h2'")
        assert stopped_by == 1


@pytest.mark.parametrize("through", ["another host", "the owner"])
async def test_a_stop_that_comes_while_the_owner_takes_the_channel_over_moves_the_stored_generation_on(
    short_tmp: Path, postgres_url: str, gate: Gate, monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    # h2 has just taken the channel's lease and is reading its state from the store (a stop
    # of h1's made it generation 1) when a stop through h1 reaches it: decided on h2's state
    # of before the read, it would record generation 1 again, a stop that moves nothing.
    url = postgres_url
    configs = [host_config(short_tmp / n, url, n, 60.0) for n in ("h1", "h2")]
    async with open_supervisor(configs[0]) as one, open_supervisor(configs[1]) as two:
        await one.send("ch", f"gate={gate}")
        await until("h1's turn", lambda: "ready" in texts(url))
        assert (await one.stop("ch")).generation == 1
        assert one.fleet is not None and two.fleet is not None
        one.fleet.paused = True
        await one.fleet.give_back("ch")  # (h1 lets the channel go; it stays paused, so takes nothing)
        # Parked once h2 holds the lease and has read the channel's state, not yet applied it.
        h2 = Parked(two.fleet, monkeypatch,
                    lambda work: getattr(work, "__qualname__", "").startswith("Store.take_over"))
        await two.send("ch", "taken over")
        with trio.fail_after(DEADLINE):
            await h2.parked.wait()
        h2.note_asks()
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def stop() -> None:
                results.append(await (one if through == "another host" else two).stop("ch"))

            nursery.start_soon(stop)
            with trio.fail_after(DEADLINE):
                await h2.asked.wait()  # h2 has the stop; its take-over is still parked
            h2.release()
        (result,) = results
        assert result.ok and result.generation == 2, result
        assert count(url, "SELECT generation FROM generations WHERE channel = 'ch'") == 2
        assert "done: taken over" not in texts(url)
