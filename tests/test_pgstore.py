"""The store on PostgreSQL: the config key, the owner lock, reconnecting, errors that quote
no data, and `corral run` on PostgreSQL end to end, including the server restarted under a
running daemon. The store's own suite runs on both engines in test_store.py.

Every test here needs the session's PostgreSQL server (``conftest.postgres_server``) and
is skipped, with the missing binaries named, where it cannot run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import trio
import trio.testing
from scripts._postgres import PostgresServer
from conftest import CORRAL, PYTHON, DaemonProcess, make_config
from test_stop_contract import AGENT, Gate

from supervisor import ConfigError, parse_config
from supervisor.host.supervisor import open_supervisor
from supervisor.store.engines import _LOCK_PATIENCE, LOCK_SPACE, redact
from supervisor.store.store import _MIGRATIONS, Entry, StoreError, StoreInUse, describe_failure, open_store

T = TypeVar("T")
DEADLINE = 30.0


# ---------------------------------------------------------------- the config key


def test_store_url_selects_postgresql_and_path_stays_the_default(tmp_path: Path) -> None:
    agents = {"d": {"adapter": "demo"}}
    url = "postgresql://corral@/corral?host=/run/postgresql"
    config = parse_config({"agents": agents, "store": {"url": url}}, base=tmp_path)
    assert config.store_url == url and config.store_location == url
    assert config.state_dir == tmp_path / "corral.d"
    default = parse_config({"agents": agents}, base=tmp_path)
    assert default.store_url is None and default.store_location == str(tmp_path / "corral.db")


def test_the_docs_postgresql_block_is_a_store_url(tmp_path: Path) -> None:
    import re
    import tomllib

    page = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    section = page[page.index("## Storing on PostgreSQL"):]
    (block,) = re.findall(r"```toml\n(.*?)```\n", section.split("\n## ", 1)[0], re.S)
    data = {**tomllib.loads(block), "agents": {"d": {"adapter": "demo"}}}
    config = parse_config(data, base=tmp_path)
    assert config.store_url == "postgresql://corral@/corral?host=/run/postgresql"
    assert config.state_dir == tmp_path / "corral.d"


@pytest.mark.parametrize(
    ("store", "message", "fix"),
    [
        ({"url": "postgresql:///c", "path": "corral.db"}, "both [store] path and url are set", "remove one"),
        ({"url": "mysql://x/y"}, "expected a PostgreSQL URL", "postgresql://"),
        ({"url": 5}, "expected a string", 'write url = "..."'),
    ],
)
def test_a_bad_store_url_is_a_config_error_with_the_key_and_the_fix(
    tmp_path: Path, store: dict[str, Any], message: str, fix: str
) -> None:
    with pytest.raises(ConfigError) as failed:
        parse_config({"agents": {"d": {"adapter": "demo"}}, "store": store}, file="corral.toml", base=tmp_path)
    (problem,) = failed.value.problems
    assert (problem.file, problem.key) == ("corral.toml", "store.url")
    assert message in problem.message and fix in problem.fix


def test_a_password_never_shows() -> None:
    assert redact("postgresql://me:s3cret@db.example/corral") == "postgresql://me:***@db.example/corral"
    assert redact("postgresql:///corral?host=/tmp&password=s3cret&sslmode=require") == (
        "postgresql:///corral?host=/tmp&password=***&sslmode=require"
    )
    assert redact("postgresql://me@/corral?host=/tmp") == "postgresql://me@/corral?host=/tmp"


def pg_config(folder: Path, url: str, grace: float = 2.0) -> str:
    (folder / "agent.py").write_text(AGENT)
    return f"""
[server]
socket = "corral.sock"
[store]
url = {json.dumps(url)}
[agents.bot]
adapter = "generic"
command = [{json.dumps(PYTHON)}, {json.dumps(str(folder / "agent.py"))}]
stop_grace = {grace}
"""


def test_check_says_whether_the_database_answers(short_tmp: Path, postgres_server: PostgresServer) -> None:
    url = postgres_server.new_database()
    (short_tmp / "corral.toml").write_text(pg_config(short_tmp, url))
    good = subprocess.run([*CORRAL, "check", "-c", "corral.toml"], cwd=short_tmp, capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    assert f"store {url} (connected)" in good.stdout
    missing = url.replace("/t", "/nosuchdb", 1)
    (short_tmp / "corral.toml").write_text(pg_config(short_tmp, missing))
    bad = subprocess.run([*CORRAL, "check", "-c", "corral.toml"], cwd=short_tmp, capture_output=True, text=True)
    assert bad.returncode != 0
    out = bad.stdout + bad.stderr
    assert "store.url" in out and "cannot connect" in out and "nosuchdb" in out and "Traceback" not in out


# ---------------------------------------------------------------- one owner, reconnecting, errors


async def test_a_second_owner_of_one_database_is_refused_naming_the_holder(postgres_url: str) -> None:
    async with open_store(postgres_url) as first:
        await first.append("c", "u", "message", "mine")
        with pytest.raises(StoreInUse, match=rf"is in use by corral pid {os.getpid()} on "):
            async with open_store(postgres_url):
                pass
        store_id = first.store_id
    async with open_store(postgres_url) as again:  # released with its connection; the id is stable
        assert again.store_id == store_id
        assert [e.text for e in await again.entries("c")] == ["mine"]
        versions = await again.query("SELECT version FROM schema_migrations ORDER BY version")
        assert versions == [(n,) for n in range(1, len(_MIGRATIONS) + 1)]


def advisory_locks(url: str) -> int:
    """How many corral advisory locks the database's sessions hold (seen from a new session)."""
    with psycopg.connect(url) as conn:
        ((count,),) = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objsubid = 2",
            (LOCK_SPACE,),
        ).fetchall()
    return int(count)


async def test_a_closed_store_has_given_its_lock_up_and_a_reopen_waits_out_a_leaving_holder(
    postgres_url: str,
) -> None:
    # The server releases a closed session's locks only once its process has exited, a moment
    # after the client closed: the store unlocks before it closes, so none is left behind ...
    for i in range(5):
        async with open_store(postgres_url) as store:
            await store.append("c", "u", "message", f"open {i}")
            assert advisory_locks(postgres_url) == 1
        assert advisory_locks(postgres_url) == 0
    # ... and an opener retries a held lock for a moment (a restart right after a kill -9).
    holder = psycopg.connect(postgres_url, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_SPACE, int(store.store_id[:8], 16) & 0x7FFFFFFF))
    assert _LOCK_PATIENCE >= 1.0
    leaving = threading.Timer(0.25, holder.close)  # the fault: the holder goes away a moment later
    leaving.start()
    try:
        async with open_store(postgres_url) as again:
            assert [e.text for e in await again.entries("c")][-1] == "open 4"
    finally:
        leaving.join()


async def test_a_restarted_server_fails_writes_visibly_then_the_store_reconnects(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    async with open_store(postgres_url) as store:
        kept = await store.append("c", "u", "message", "before")
        seen: list[Entry] = []

        async def follow() -> None:
            async for entry in store.follow("c"):
                seen.append(entry)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.to_thread.run_sync(postgres_server.stop)
            with pytest.raises(StoreError) as failed:
                await store.append("c", "u", "message", "secret while down")
            assert "database connection failed" in str(failed.value) and postgres_url in str(failed.value)
            assert "secret" not in str(failed.value)
            with pytest.raises(StoreError, match="could not read the store"):
                await store.entries("c")
            await trio.to_thread.run_sync(postgres_server.start)
            after = await store.append("c", "u", "message", "after")
            assert [e.text for e in await store.entries("c")] == ["before", "after"]
            with trio.fail_after(DEADLINE):
                while len(seen) < 2:
                    await trio.sleep(0.01)  # a condition polled under a deadline
            await trio.testing.wait_all_tasks_blocked()
            assert seen == [kept, after]  # the failed write was never shown
            nursery.cancel_scope.cancel()
        assert after.seq > kept.seq + 1  # (the failed write's seq is not reused)


async def test_a_value_postgresql_refuses_is_described_without_quoting_it(postgres_url: str) -> None:
    async with open_store(postgres_url) as store:
        bad = store.submit_write("UPDATE turns SET pid = ? WHERE id = ?", ("secret-not-a-number", "t"))
        with pytest.raises(StoreError) as failed:
            await bad.committed()
        message = str(failed.value)
        assert "secret" not in message and "SQLSTATE 22P02" in message and postgres_url in message
        with psycopg.connect(postgres_url) as conn:
            try:
                conn.execute("INSERT INTO meta (key, value) VALUES ('store_id', 'secret value')")
            except psycopg.Error as exc:
                unique = describe_failure(exc, "S")
        assert "meta_pkey" in unique and "secret" not in unique  # the DETAIL line quotes the key: dropped


async def test_a_sqlite_store_from_before_the_migrations_table_keeps_its_version(tmp_path: Path) -> None:
    path = str(tmp_path / "corral.db")
    async with open_store(path):
        pass
    db = sqlite3.connect(path)
    db.execute("DROP TABLE schema_migrations")  # as the multi-agent branch left it: user_version 1
    for undo in ("DROP TABLE hosts", "DROP TABLE leases", "ALTER TABLE turns DROP COLUMN host",
                 "ALTER TABLE stops DROP COLUMN host",  # (migration 2, the fleet's, came after)
                 "DROP INDEX entries_pos", "ALTER TABLE entries DROP COLUMN pos",  # (and 3, its commit order)
                 "DROP TABLE origins",  # (and 4, the bridges' origins)
                 "ALTER TABLE queue DROP COLUMN delivery",  # (and 6, a fleet's deliveries; 5's went with hosts)
                 "DROP TABLE turn_usage",  # (and 7, what each turn spent)
                 "ALTER TABLE queue DROP COLUMN place"):  # (and 8, a queue's order by hand)
        db.execute(undo)
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    async with open_store(path) as store:  # migration 1 is not run again (it would fail: columns exist); 2-8 are
        assert [v for (v,) in await store.query("SELECT version FROM schema_migrations")] == [1, 2, 3, 4, 5, 6, 7, 8]
        assert (await store.append("c", "u", "message", "x")).text == "x"


async def test_an_embedded_supervisor_runs_on_postgresql(short_tmp: Path, postgres_url: str) -> None:
    config = dataclasses.replace(make_config(short_tmp), store_url=postgres_url)
    async with open_supervisor(config) as sup:
        assert sup.status()["store"] == postgres_url
        await sup.send("ch", "hello")
        assert await sup.wait_idle("ch", timeout=DEADLINE)
        assert any(e.author == "agent:demo" for e in await sup.entries("ch"))


# ---------------------------------------------------------------- `corral run` on PostgreSQL


def rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Committed rows of the daemon's store, read through a connection of the test's own."""
    try:
        with psycopg.connect(url) as conn:
            return conn.execute(sql.replace("?", "%s"), params).fetchall()
    except psycopg.OperationalError:
        return []  # (the server is being restarted)


def texts(url: str) -> list[str]:
    return [t for (t,) in rows(url, "SELECT text FROM entries WHERE channel = 'ch' ORDER BY seq")]


def until(what: str, probe: Callable[[], T | None], timeout: float = DEADLINE) -> T:
    """Poll ``probe`` until it returns something truthy (a condition, not a settling sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def gate(short_tmp: Path) -> Iterator[Gate]:
    made = Gate(short_tmp / "gate")
    try:
        yield made
    finally:
        made.close()


def ready_turn(daemon: DaemonProcess, url: str, prompt: str) -> None:
    """Send ``prompt`` (with a gate) and wait until its agent says "ready"."""
    before = texts(url).count("ready")
    daemon.cli("send", "ch", prompt, check=True)
    until("the agent to be ready", lambda: texts(url).count("ready") > before)


def test_corral_run_on_postgresql_sends_stops_and_restarts_with_everything_kept(
    short_tmp: Path, postgres_url: str, gate: Gate
) -> None:
    url = postgres_url
    daemon = DaemonProcess(short_tmp, pg_config(short_tmp, url))
    restarted = None
    try:
        daemon.cli("send", "ch", "hello", check=True)
        until("the reply", lambda: "done: hello" in texts(url))
        ready_turn(daemon, url, f"gate={gate}")
        daemon.cli("send", "ch", "dropped by the stop", check=True)
        stop = json.loads(daemon.cli("--json", "stop", "ch", check=True).stdout)
        assert stop["ok"] and stop["dropped"] == 1 and stop["notice_seq"] is not None
        ready_turn(daemon, url, f"gate={gate}")
        daemon.cli("send", "ch", "queued across the restart", check=True)
        status = json.loads(daemon.cli("--json", "status", check=True).stdout)
        assert status["store"] == url and status["channels"]["ch"]["queued"] == 1
        other = short_tmp / "other"
        other.mkdir()
        (other / "corral.toml").write_text(pg_config(short_tmp, url).replace('"corral.sock"', '"other.sock"'))
        second = subprocess.run([*CORRAL, "run", "-c", "corral.toml"], cwd=other, capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 1 and "Traceback" not in second.stderr
        assert f"store {url} is in use by corral pid {daemon.proc.pid} on " in second.stderr
        assert daemon.stop() == 0
        before = texts(url)

        restarted = DaemonProcess(short_tmp, pg_config(short_tmp, url))
        until("the queued message to run", lambda: "done: queued across the restart" in texts(url))
        assert texts(url)[: len(before)] == before  # the transcript is kept as it was
        assert "done: dropped by the stop" not in texts(url)  # the stop is not undone
        ((notice,),) = rows(url, "SELECT meta FROM entries WHERE seq = ?", (stop["notice_seq"],))
        stop_seq = json.loads(notice)["stop_seq"]
        ((meta,),) = rows(url, "SELECT meta FROM entries WHERE text = 'dropped by the stop'")
        assert json.loads(meta)["dropped_by_stop"] == stop_seq
        ((result,),) = rows(url, "SELECT result FROM stops WHERE seq = ?", (stop_seq,))
        assert json.loads(result)["notice_seq"] == stop["notice_seq"]
        assert restarted.cli("wait", "ch", "--timeout", "30").returncode == 0
        tail = restarted.cli("tail", "ch", check=True).stdout
        assert "done: hello" in tail and "not run: dropped by a stop" in tail
    finally:
        if restarted is not None:
            assert restarted.stop() == 0
        daemon.stop()


def test_the_database_restarted_under_a_running_daemon(
    short_tmp: Path, postgres_server: PostgresServer, postgres_url: str, gate: Gate
) -> None:
    url = postgres_url
    daemon = DaemonProcess(short_tmp, pg_config(short_tmp, url))
    try:
        daemon.cli("send", "ch", "one", check=True)
        until("the reply", lambda: "done: one" in texts(url))
        ready_turn(daemon, url, f"gate={gate}")
        daemon.cli("send", "ch", "dropped by the stop", check=True)
        stop = json.loads(daemon.cli("--json", "stop", "ch", check=True).stdout)
        assert stop["ok"] and stop["dropped"] == 1

        postgres_server.stop()
        try:
            refused = daemon.cli("send", "ch", "sent while the database is down")
            assert refused.returncode != 0
            # (the CLI's send carries an idempotency key: the daemon reads the key's record first)
            assert re.search(r"could not (store|read the store)", refused.stderr), refused.stderr
            assert "database connection failed" in refused.stderr, refused.stderr
            assert daemon.cli("status").returncode == 0  # the daemon serves on
            down = json.loads(daemon.cli("--json", "stop", "ch").stdout or "{}")
            # A stop that cannot be stored says so; this one is a repeat of the stop before (the
            # refused send, read-checked first for its key, never reached the channel), which
            # needs nothing stored and is answered as such.
            assert down.get("ok") is not True or (down["repeat"] and down["generation"] == stop["generation"]), down
        finally:
            postgres_server.start()  # (the server is the session's: never left down for the next tests)

        daemon.cli("send", "ch", "three", check=True)
        until("the reply after the restart", lambda: "done: three" in texts(url))
        got = texts(url)
        assert {"one", "done: one", f"gate={gate}", "dropped by the stop"} <= set(got)  # all kept
        assert "sent while the database is down" not in got  # refused, so never accepted
        assert "done: dropped by the stop" not in got  # the stop stored before is not undone
        ((generation,),) = rows(url, "SELECT generation FROM generations WHERE channel = 'ch'")
        assert generation >= stop["generation"]
        assert rows(url, "SELECT count(*) FROM queue") == [(0,)]
        assert daemon.cli("wait", "ch", "--timeout", "30").returncode == 0
    finally:
        assert daemon.stop() == 0
    log = "".join(daemon.log)
    assert "reconnected" in log
