"""A fleet under network faults: each host reaches PostgreSQL over TCP through a fault proxy
on 127.0.0.1 (``scripts/_faultproxy.py``) that forwards, delays, blackholes (a cut cable:
connections open, nothing arrives), resets and heals.

Proven here: a fleet call on a silent connection is abandoned at its deadline and the next
one gets a new connection; a host whose heartbeat is stuck on a cut connection still gives its
lease up (and kills its turns) before the lease runs out in the database; a slow database
keeps the leases while renewals get through, and a host steps down before the lease runs out
when they cannot; a host blackholed mid-commit holds no other host up and its commit is not
stored; and, with real daemons (``scripts/_partition.py``, the harness of ``faults.py --fleet
--partition``): a partitioned owner's turn is dead before another host's turn of the channel
begins; a stop through another host while the owner is cut off is answered within the lease
plus a bound; a partition that heals before the lease runs out moves nothing; a stop while
only the hosts' notices are cut is answered and carried out.

Real servers and daemons get real time: every wait is a condition under a generous deadline.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from scripts._postgres import PostgresServer
from psycopg.conninfo import conninfo_to_dict
from test_fleet import host_config, texts
from test_stop_contract import Gate

from scripts._bench import short_tmp as make_tmp
from scripts._faultproxy import FaultProxy
from scripts._partition import STOP_BOUND, PartitionFleet, largest_overlap, trial
from supervisor.fleet.fleet import Fleet, LinkTimeout, check_leases, kill_margin
from supervisor.host.supervisor import open_supervisor
from supervisor.store.store import open_store

DEADLINE = 60.0
LEASE = 2.0


def proxy_to(server: PostgresServer, url: str) -> tuple[FaultProxy, str]:
    """A fault proxy to the server, and ``url``'s database through it."""
    proxy = FaultProxy(str(server.folder / ".s.PGSQL.5432"))
    return proxy, proxy.url(str(conninfo_to_dict(url)["dbname"]))


def lease_left(url: str, channel: str) -> float:
    """Seconds until the channel's lease runs out in the database (its clock)."""
    with psycopg.connect(url) as conn:
        ((left,),) = conn.execute(
            "SELECT expires - extract(epoch from clock_timestamp()) FROM leases WHERE channel = %s", (channel,)
        ).fetchall()
        return float(left)


# ---------------------------------------------------------------- pure parts


def test_the_watchdog_gives_a_lease_up_at_its_deadline_minus_the_margin() -> None:
    until = {"a": 10.0, "b": 12.0}
    assert check_leases(until, 7.9, 2.0).lost == () and check_leases(until, 7.9, 2.0).wake_at == 8.0
    at_eight = check_leases(until, 8.0, 2.0)
    assert at_eight.lost == ("a",) and at_eight.wake_at == 10.0
    assert check_leases({}, 0.0, 2.0).wake_at == float("inf")
    assert kill_margin(10.0) == 2.0 and kill_margin(1.0) == 0.2


def test_the_largest_overlap_counts_only_different_hosts() -> None:
    assert largest_overlap([("a", 0.0, 2.0), ("a", 1.0, 3.0)]) == 0.0
    assert largest_overlap([("a", 0.0, 2.0), ("b", 2.5, 3.0)]) == 0.0
    assert largest_overlap([("a", 0.0, 2.0), ("b", 1.5, 3.0)]) == 0.5


# ---------------------------------------------------------------- one host, through a proxy


async def test_a_fleet_call_on_a_silent_connection_is_abandoned_at_its_deadline_and_replaced(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    proxy, via = proxy_to(postgres_server, postgres_url)
    try:
        async with open_store(via, host="h1", lease=LEASE) as store:
            fleet = Fleet(store, "h1", LEASE)
            assert await fleet.acquire("ch") == 1
            proxy.blackhole()
            started = trio.current_time()
            try:
                with trio.fail_after(DEADLINE), pytest.raises(LinkTimeout):
                    await fleet.acquire("ch")
            finally:
                proxy.heal()  # (so that the store can close, whatever failed)
            assert trio.current_time() - started < fleet.call_deadline + 2.0  # (its deadline, not the cut's)
            assert fleet.link.abandoned == 1
            with trio.fail_after(DEADLINE):
                assert await fleet.acquire("ch") == 1  # a new connection: still this host's lease
    finally:
        proxy.close()


async def test_a_heartbeat_stuck_on_a_cut_connection_still_gives_the_lease_up_before_it_runs_out(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    proxy, via = proxy_to(postgres_server, postgres_url)
    lost: list[tuple[str, float]] = []
    gone = trio.Event()

    def on_lost(channel: str, why: str) -> None:
        # (Synchronously, as the supervisor kills there: the database must still name this host.)
        lost.append((channel, lease_left(postgres_url, channel)))
        gone.set()

    try:
        async with open_store(via, host="h1", lease=LEASE) as store, trio.open_nursery() as nursery:
            try:
                fleet = Fleet(store, "h1", LEASE)
                await nursery.start(fleet.run, lambda found: [on_lost(c, w) for c, w in found.lost])
                assert await fleet.acquire("ch") == 1
                renewals = fleet.renewals
                with trio.fail_after(DEADLINE):
                    while fleet.renewals == renewals:
                        await trio.sleep(0.01)  # (polling a condition; not settling)
                proxy.blackhole()
                cut = trio.current_time()
                with trio.fail_after(DEADLINE):
                    await gone.wait()
                assert trio.current_time() - cut <= LEASE  # (at its local deadline minus the margin)
                ((channel, left),) = lost
                assert channel == "ch" and left > 0, left  # before the database lets another host take it
                assert not fleet.holds("ch")
            finally:
                proxy.heal()  # (so that the store can close, whatever failed)
                nursery.cancel_scope.cancel()
    finally:
        proxy.close()


async def test_a_slow_database_keeps_the_leases_while_renewals_get_through_and_else_steps_down_in_time(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    lease = 6.0  # answers of up to 2 s: two renewals fit in the lease minus the margin
    proxy, via = proxy_to(postgres_server, postgres_url)
    lost: list[float] = []
    try:
        async with open_store(via, host="h1", lease=lease) as store, trio.open_nursery() as nursery:
            try:
                fleet = Fleet(store, "h1", lease)
                await nursery.start(fleet.run, lambda found: lost.extend(lease_left(postgres_url, c) for c, _ in found.lost))
                assert await fleet.acquire("ch") == 1
                proxy.delay(0.5, 2.0, seed=1)  # every answer 0.5-2 s late, jittered
                renewals = fleet.renewals
                with trio.fail_after(DEADLINE):
                    while fleet.renewals < renewals + 3:
                        await trio.sleep(0.05)  # (polling a condition; not settling)
                assert not lost and fleet.holds("ch")
                proxy.delay(lease)  # slower than the lease: the host steps down, before the database lets go
                with trio.fail_after(DEADLINE):
                    while not lost:
                        await trio.sleep(0.05)  # (polling a condition; not settling)
                assert lost[0] > 0, lost
            finally:
                proxy.heal()  # (so that the store can close, whatever failed)
                nursery.cancel_scope.cancel()
    finally:
        proxy.close()


async def test_a_host_blackholed_mid_commit_holds_no_one_up_and_its_commit_is_not_stored(
    postgres_server: PostgresServer, postgres_url: str, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = postgres_url
    proxy, via = proxy_to(postgres_server, url)
    gate = Gate(short_tmp / "gate")
    try:
        one_config = host_config(short_tmp / "h1", url, "h1", LEASE)
        two_config = host_config(short_tmp / "h2", via, "h2", LEASE)
        async with open_supervisor(one_config) as one, open_supervisor(two_config) as two:
            try:
                await two.send("ch", f"gate={gate}")
                with trio.fail_after(DEADLINE):
                    while "ready" not in texts(url):
                        await trio.sleep(0.02)  # (polling a condition; not settling)
                engine: Any = two._store._db
                commit = engine.commit_in_order
                cut = trio.Event()
                token = trio.lowlevel.current_trio_token()

                def cut_mid_commit(seqs: Any, notice: Any) -> int:
                    # (In h2's store thread: the batch's fencing read holds the lease row; the
                    # commit's message is the first thing the cut cable swallows.)
                    proxy.blackhole()
                    trio.from_thread.run_sync(cut.set, trio_token=token)
                    return int(commit(seqs, notice))

                monkeypatch.setattr(engine, "commit_in_order", cut_mid_commit)
                gate.open()  # the agent answers: h2 commits its answer, and the cable is cut
                with trio.fail_after(DEADLINE):
                    await cut.wait()
                monkeypatch.setattr(engine, "commit_in_order", commit)
                await one.send("ch", "after the cut")
                with trio.fail_after(DEADLINE):
                    while "done: after the cut" not in texts(url):
                        await trio.sleep(0.05)  # (polling a condition; not settling)
                assert f"done: gate={gate}" not in texts(url)  # h2's half-sent commit stored nothing
                proxy.heal()
                assert two.fleet is not None
                renewals = two.fleet.renewals
                with trio.fail_after(DEADLINE):
                    while two.fleet.renewals < renewals + 2:
                        await trio.sleep(0.05)  # (polling a condition; not settling)
                await two.send("other", "h2 serves again")  # rejoined without a restart
                with trio.fail_after(DEADLINE):
                    while "done: h2 serves again" not in texts(url, "other"):
                        await trio.sleep(0.05)  # (polling a condition; not settling)
                assert f"done: gate={gate}" not in texts(url)
            finally:
                proxy.heal()  # (so that h2 can shut down, whatever failed)
    finally:
        gate.open(4)
        gate.close()
        proxy.close()


# ---------------------------------------------------------------- real daemons


@pytest.fixture(scope="module")
def partitioned(postgres_server: PostgresServer) -> Iterator[PartitionFleet]:
    made = PartitionFleet(postgres_server, make_tmp("corral-tp-"), LEASE)
    try:
        yield made
    finally:
        made.close()


def faulted(fleet: PartitionFleet, i: int, fault: str) -> dict[str, Any]:
    fleet.heal()
    bad, drawn = trial(fleet, random.Random(i), i, fault)
    assert bad == [], drawn
    assert drawn["overlap_s"] == 0.0, drawn
    return drawn


def test_a_partitioned_owner_s_turn_is_dead_before_another_host_s_turn_of_the_channel_begins(
    partitioned: PartitionFleet
) -> None:
    drawn = faulted(partitioned, 1, "owner-cut")
    assert drawn["owner_killed_s"] is not None and drawn["owner_killed_s"] < drawn["moved_s"], drawn
    assert drawn["owner_killed_s"] <= LEASE, drawn  # (its local deadline, minus the margin)


def test_a_stop_through_another_host_while_the_owner_is_cut_off_is_answered_within_the_lease_plus_a_bound(
    partitioned: PartitionFleet
) -> None:
    drawn = faulted(partitioned, 2, "stop-while-cut")
    assert drawn["stop_s"] <= LEASE + STOP_BOUND, drawn


def test_a_partition_that_heals_before_the_lease_runs_out_moves_nothing(partitioned: PartitionFleet) -> None:
    faulted(partitioned, 3, "heal-early")


def test_a_stop_while_only_the_hosts_notices_are_cut_is_answered_and_carried_out(
    partitioned: PartitionFleet
) -> None:
    started = time.monotonic()
    drawn = faulted(partitioned, 4, "notices-cut")
    assert drawn["stop_s"] <= LEASE + STOP_BOUND and time.monotonic() - started < DEADLINE, drawn


def test_a_stop_through_the_cut_off_owner_itself_is_answered_within_the_lease_plus_a_bound(
    partitioned: PartitionFleet
) -> None:
    drawn = faulted(partitioned, 5, "stop-via-cut-owner")  # (ok: false: its record cannot be stored)
    assert drawn["stop_s"] <= LEASE + STOP_BOUND, drawn
