"""Tests for ``supervisor.store.store``: ordering, saved-before-shown, group commit, persistence.

Every test that takes ``store_at`` runs twice: on SQLite and on a real PostgreSQL database
(``conftest.postgres_server``; skipped, with the reason, where the server cannot run).
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing, asynccontextmanager, contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from supervisor.store.engines import Engine, is_postgres
from supervisor.store.store import ChannelState, Entry, Pending, QueuedRow, StopRecord, Store, StoreError, open_store

#: Upper bound for a blocked commit thread, so a failing test cannot hang the run forever.
GATE_TIMEOUT = 30


@asynccontextmanager
async def following(store: Store, channel: str | None, after: int = 0) -> AsyncIterator[trio.MemoryReceiveChannel[Entry]]:
    """Run ``store.follow`` in a task; what it yields arrives on the returned channel."""
    send, receive = trio.open_memory_channel[Entry](10_000)

    async def run() -> None:
        async with aclosing(store.follow(channel, after)) as entries:
            async for entry in entries:
                send.send_nowait(entry)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        yield receive
        nursery.cancel_scope.cancel()


async def receive(channel: trio.MemoryReceiveChannel[Entry]) -> Entry:
    """The follower's next entry; fail (rather than hang) if it never comes."""
    with trio.fail_after(GATE_TIMEOUT):
        return await channel.receive()


def nothing_received(receive: trio.MemoryReceiveChannel[Entry]) -> bool:
    """True if the follower has yielded nothing more."""
    try:
        receive.receive_nowait()
    except trio.WouldBlock:
        return True
    return False


class BlockedCommits:
    """Makes ``Store._commit`` wait on a gate (in its worker thread) before committing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gate = threading.Event()
        self.entered = trio.Event()
        self.calls = 0
        original: Callable[[Store, list[Pending]], None] = Store._commit

        def blocked(store: Store, batch: list[Pending]) -> None:
            self.calls += 1
            trio.from_thread.run_sync(self.entered.set)
            if not self.gate.wait(GATE_TIMEOUT):
                raise RuntimeError("test gate never opened")
            original(store, batch)

        monkeypatch.setattr(Store, "_commit", blocked)


def record_stop(store: Store, seq: int, channel: str, generation: int) -> Pending:
    """A stop's record as the supervisor submits it (here nothing dropped, no turn, no plan)."""
    return store.submit_stop_records([StopRecord(seq, channel, generation, (), (), {})])


# ---------------------------------------------------------------- ordering


async def test_seq_strictly_increases_in_submit_order_across_channels(store_at: str) -> None:
    async with open_store(store_at) as store:
        pendings = [store.submit_entry(ch, "u", "message", f"m{i}") for i, ch in enumerate("abacbca")]
        stop_seq = store.next_seq()
        record_stop(store, stop_seq, "a", 1)
        last = await store.append("b", "u", "status", "after the stop")
        seqs = [p.entry.seq for p in pendings if p.entry]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert seqs[-1] < stop_seq < last.seq
        for p in pendings:
            assert await p.committed() == p.entry
        stored = await store.entries(None)
        assert [e.seq for e in stored] == [*seqs, last.seq]
        assert [e.text for e in stored] == [f"m{i}" for i in range(7)] + ["after the stop"]
        assert [e.channel for e in stored] == [*"abacbca", "b"]


async def test_unknown_kind_is_refused(store_at: str) -> None:
    async with open_store(store_at) as store:
        with pytest.raises(ValueError, match="kind"):
            store.submit_entry("a", "u", "shout", "x")


# ---------------------------------------------------------------- saved before shown


async def test_follower_sees_an_entry_only_after_its_commit(store_at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(store_at) as store:
        first = await store.append("c", "u", "message", "first")
        async with following(store, "c") as chan, following(store, None) as everything:
            assert await receive(chan) == first
            assert await receive(everything) == first
            blocked = BlockedCommits(monkeypatch)
            try:
                pending = store.submit_entry("c", "agent", "message", "second")
                await blocked.entered.wait()
                await trio.testing.wait_all_tasks_blocked()
                # The commit is running but not finished: nobody may see the entry yet.
                assert nothing_received(chan) and nothing_received(everything)
                assert not pending._done.is_set()
            finally:
                blocked.gate.set()
            entry = await pending.committed()
            assert entry is not None and entry.text == "second"
            assert await receive(chan) == entry
            assert await receive(everything) == entry


async def test_failed_commit_shows_nothing_and_append_raises(store_at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(store_at) as store:
        first = await store.append("c", "u", "message", "first")
        async with following(store, "c") as chan:
            assert await receive(chan) == first
            await trio.testing.wait_all_tasks_blocked()

            def broken(self: Store, batch: list[Pending]) -> None:
                raise sqlite3.OperationalError("disk I/O error")

            monkeypatch.setattr(Store, "_commit", broken)
            commits = store.commits
            with pytest.raises(StoreError, match="disk I/O error"):
                await store.append("c", "agent", "message", "lost")
            await trio.testing.wait_all_tasks_blocked()
            assert nothing_received(chan)
            assert store.commits == commits
            monkeypatch.undo()
            later = await store.append("c", "agent", "message", "kept")
            assert await receive(chan) == later
            assert [e.text for e in await store.entries("c")] == ["first", "kept"]


async def test_a_poisoned_write_fails_alone_and_the_good_ones_in_its_batch_commit(store_at: str, tmp_path: Path) -> None:
    async with open_store(store_at) as store, following(store, None) as everything:
        await trio.testing.wait_all_tasks_blocked()
        # Submitted without a checkpoint in between, so they form one batch. Two writes
        # cannot be stored: a session id with a lone surrogate (an agent's half emoji) and
        # a statement on a missing table. The batch's transaction fails as a whole.
        batch = [
            store.submit_entry("a", "u", "message", "secret of a"),
            store.save_session("b", "agent", "half \ud83d emoji", str(tmp_path)),
            store.submit_entry("c", "u", "message", "secret of c"),
            store.submit_write("INSERT INTO no_such_table VALUES (?)", (1,)),
            store.submit_entry("d", "u", "message", "secret of d"),
        ]
        good = [batch[0], batch[2], batch[4]]
        for pending in good:
            assert await pending.committed() == pending.entry
        for pending in (batch[1], batch[3]):
            with pytest.raises(StoreError) as failed:
                await pending.committed()
            assert pending.failed
            message = str(failed.value)
            # It names nothing of anyone's data: not the bad character, no other text.
            assert "\ud83d" not in message and "secret" not in message and "emoji" not in message
            assert store_at in message
        assert "not valid Unicode" in str(await _error_of(batch[1]))
        assert "no_such_table" in str(await _error_of(batch[3]))
        # The good ones are stored and published in seq order, exactly once each.
        published = [await receive(everything) for _ in good]
        assert published == [p.entry for p in good]
        await trio.testing.wait_all_tasks_blocked()
        assert nothing_received(everything)
        assert [e.text for e in await store.entries(None)] == ["secret of a", "secret of c", "secret of d"]
        assert await store.query("SELECT * FROM sessions") == []
        later = await store.append("a", "u", "message", "three")
        assert later.seq > batch[4].entry.seq  # type: ignore[union-attr]
        assert await receive(everything) == later


async def _error_of(pending: Pending) -> StoreError:
    try:
        await pending.committed()
    except StoreError as exc:
        return exc
    raise AssertionError("the write did not fail")


async def test_agent_text_and_meta_with_lone_surrogates_are_stored_repaired(store_at: str) -> None:
    async with open_store(store_at) as store:
        # An agent streaming half an emoji, a tool preview and meta (keys too) with one.
        text = await store.append("a", "agent:x", "message", "half \ud83d, other half \ude00, NUL \0 kept")
        tool = await store.append("a", "agent:x", "tool", "t", meta={"input": ["\udfff", "\0"], "k\ud800": {"n": 1}})
        # PostgreSQL text cannot hold NUL: there (only) it is repaired too. JSON escapes it on both.
        nul = "\ufffd" if is_postgres(store_at) else "\0"
        assert text.text == f"half \ufffd, other half \ufffd, NUL {nul} kept"
        assert tool.meta == {"input": ["\ufffd", "\0"], "k\ufffd": {"n": 1}}
        assert await store.entries("a") == [text, tool]


async def test_a_failed_commit_is_not_masked_by_its_rollback(store_at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(store_at) as store:
        # SQLite rolls back by itself on SQLITE_FULL; a second ROLLBACK would raise
        # "cannot rollback - no transaction is active" and hide the real error.
        def full(db: Engine) -> None:
            db.execute("ROLLBACK")
            if is_postgres(store_at):
                import psycopg

                raise psycopg.errors.DiskFull("could not extend file")
            error = sqlite3.OperationalError("database or disk is full")
            error.sqlite_errorcode = 13  # type: ignore[attr-defined]
            raise error

        with pytest.raises(StoreError) as failed:
            await store._submit(full).committed()
        assert "disk full" in str(failed.value) and store_at in str(failed.value)
        assert "rollback" not in str(failed.value)
        assert (await store.append("a", "u", "message", "after")).text == "after"


# ---------------------------------------------------------------- group commit


async def test_quick_submits_share_one_commit(store_at: str) -> None:
    async with open_store(store_at) as store:
        before = store.commits
        pendings = [store.submit_entry("a", "u", "message", str(i)) for i in range(200)]
        await store.flush()
        for p in pendings:
            await p.committed()
        assert store.commits - before == 1
        assert len(await store.entries("a")) == 200


async def test_writes_made_during_a_commit_go_into_the_next_one(store_at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(store_at) as store:
        blocked = BlockedCommits(monkeypatch)
        try:
            first = store.submit_entry("a", "u", "message", "first")
            await blocked.entered.wait()
            rest = []
            for i in range(50):
                rest.append(store.submit_entry("a", "u", "message", str(i)))
                await trio.lowlevel.checkpoint()  # let the writer run: it must not start a commit
            await trio.testing.wait_all_tasks_blocked()
            assert blocked.calls == 1
        finally:
            blocked.gate.set()
        await first.committed()
        for p in rest:
            await p.committed()
        assert blocked.calls == 2
        assert store.commits == 2


async def test_flush_waits_for_a_batch_already_committing(store_at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_store(store_at) as store:
        blocked = BlockedCommits(monkeypatch)
        flushed = trio.Event()

        async def flush() -> None:
            await store.flush()
            flushed.set()

        try:
            pending = store.submit_entry("a", "u", "message", "x")
            await blocked.entered.wait()  # the writer has taken the batch: nothing is queued
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flush)
                await trio.testing.wait_all_tasks_blocked()
                assert not flushed.is_set(), "flush returned before the write was committed"
                blocked.gate.set()
        finally:
            blocked.gate.set()
        assert pending._done.is_set() and not pending.failed


# ---------------------------------------------------------------- following


async def test_follow_gives_history_then_live_entries_per_channel(store_at: str) -> None:
    async with open_store(store_at) as store:
        a1 = await store.append("a", "u", "message", "a1")
        b1 = await store.append("b", "u", "message", "b1")
        a2 = await store.append("a", "u", "message", "a2")
        async with following(store, "a") as only_a, following(store, None) as every, following(store, "a", a1.seq) as later_a:
            assert [await receive(only_a) for _ in range(2)] == [a1, a2]
            assert [await receive(every) for _ in range(3)] == [a1, b1, a2]
            assert await receive(later_a) == a2
            b2 = await store.append("b", "u", "message", "b2")
            a3 = await store.append("a", "agent", "status", "a3", turn="t1", generation=2, meta={"k": [1]})
            assert await receive(only_a) == a3
            assert await receive(later_a) == a3
            assert [await receive(every) for _ in range(2)] == [b2, a3]
            await trio.testing.wait_all_tasks_blocked()
            assert nothing_received(only_a) and nothing_received(every) and nothing_received(later_a)
        assert (a3.turn, a3.generation, dict(a3.meta)) == ("t1", 2, {"k": [1]})


# ---------------------------------------------------------------- persistence


async def test_entries_persist_and_seq_continues_after_reopen(store_at: str) -> None:
    path = store_at
    async with open_store(path) as store:
        written = [
            await store.append("a", "u", "message", "héllo", meta={"x": 1}),
            await store.append("b", "agent", "tool", "ls", turn="t", generation=3),
        ]
        stop_seq = store.next_seq()
        await record_stop(store, stop_seq, "a", 1).committed()
        # Accepted but not awaited: closing the store must still commit it.
        unawaited = store.submit_entry("a", "u", "notice", "last words").entry
    async with open_store(path) as store:
        assert await store.entries(None) == [*written, unawaited]
        assert unawaited is not None and unawaited.seq > stop_seq
        nxt = await store.append("a", "u", "message", "again")
        assert nxt.seq == unawaited.seq + 1
        ((seq, result),) = await store.query("SELECT seq, result FROM stops")
        assert seq == stop_seq and json.loads(result)["generation"] == 1


async def test_seq_continues_after_a_stop_or_queued_row_with_the_highest_seq(store_at: str) -> None:
    path = store_at
    async with open_store(path) as store:
        await store.append("a", "u", "message", "m")
        stop_seq = store.next_seq()
        await record_stop(store, stop_seq, "a", 1).committed()
    async with open_store(path) as store:
        assert store.next_seq() == stop_seq + 1
        q_seq = store.next_seq()
        row = QueuedRow(q_seq, "a", "demo", "u", "queued", 1, False)
        await store.submit_write(
            "INSERT INTO queue (seq, channel, agent, author, text, generation, nudge) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row.seq, row.channel, row.agent, row.author, row.text, row.generation, 0),
        ).committed()
    async with open_store(path) as store:
        assert store.next_seq() == q_seq + 1


async def test_sessions_todos_queue_and_generations_survive_a_reopen(store_at: str) -> None:
    path = store_at
    todos = [{"content": "write tests", "status": "in_progress"}, {"content": "ship", "status": "pending"}]
    async with open_store(path) as store:
        store.save_session("c1", "claude", "sess-1", "/w/c1")
        store.save_session("c1", "claude", "sess-2", "/w/c1b")  # replaces
        store.save_session("c2", "codex", None, "/w/c2")
        store.save_todos("c1", "claude", todos)
        assert store.todos("c1", "claude") == todos
        rows = []
        for text, nudge in (("first", False), ("second", True), ("third", False)):
            row_box: list[QueuedRow] = []

            def also(db: Engine, seq: int, text: str = text, nudge: bool = nudge) -> None:
                row = QueuedRow(seq, "c1", "claude", "u", text, 4, nudge)
                row_box.append(row)
                store.queue_insert(db, row)

            await store.append("c1", "u", "message", text, also=also)
            rows.extend(row_box)
        await store.dequeue([rows[0].seq]).committed()
        await record_stop(store, store.next_seq(), "c1", 4).committed()
        await record_stop(store, store.next_seq(), "c1", 2).committed()  # never goes back
        await record_stop(store, store.next_seq(), "c2", 1).committed()
    async with open_store(path) as store:
        assert store.session("c1", "claude") == ("sess-2", "/w/c1b")
        assert store.session("c2", "codex") == (None, "/w/c2")
        assert store.session("c3", "claude") == (None, None)
        assert store.todos("c1", "claude") == todos
        assert store.todos("c2", "claude") == []
        assert store.todo_agents("c1") == ["claude"]
        assert await store.load_queue() == rows[1:]
        assert (await store.load_queue())[0].nudge is True
        stopped = {"c1": ChannelState(4, True, True), "c2": ChannelState(1, True, True)}
        assert await store.load_channel_states() == stopped


async def test_closed_store_refuses_writes(store_at: str) -> None:
    async with open_store(store_at) as store:
        pass
    with pytest.raises(StoreError):
        store.submit_entry("a", "u", "message", "x")


# ---------------------------------------------------------------- a failing disk


@contextmanager
def tiny_filesystem(folder: Path, size: str = "512k") -> Iterator[Path]:
    """A real filesystem of ``size`` mounted on ``folder`` (tmpfs; needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tiny tmpfs to fill needs root")
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Write a file into ``folder`` until its filesystem has no byte left."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


async def test_a_full_disk_says_disk_full_with_the_store_path(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "disk") as disk:
        path = str(disk / "corral.db")
        async with open_store(path) as store:
            first = await store.append("a", "u", "message", "before")
            filler = fill(disk)
            with pytest.raises(StoreError) as failed:
                await store.append("a", "agent:x", "message", "y" * 200_000)
            message = str(failed.value)
            assert "disk full" in message and path in message, message
            assert "rollback" not in message
            # Space back, the store goes on: nothing of the failed write was kept.
            filler.unlink()
            after = await store.append("a", "u", "message", "after")
            assert [e.text for e in await store.entries("a")] == [first.text, after.text]


# ---------------------------------------------------------------- stop records, queue, turns (both engines)


async def test_a_stop_record_the_queue_and_turns_mean_the_same_on_both_engines(store_at: str) -> None:
    plan = [{"content": "ship", "status": "cancelled"}]
    async with open_store(store_at) as store:
        first = store.accept_message("c", "bot", "human:u", "first", generation=0, nudge=False)
        reply = store.submit_entry("c", "agent:bot", "message", "hi", meta={"raw": "NUL \0 in meta"})
        dropped = store.accept_message("c", "bot", "human:u", "dropped", generation=0, nudge=False, to=("other",))
        await dropped.committed()
        assert first.entry is not None and reply.entry is not None and dropped.entry is not None
        await store.begin_turn("t1", "c", "bot", 0, first.entry.seq).committed()
        await store.turn_spawned("t1", 123, 2**40).committed()  # start ticks past 32 bits
        await store.begin_turn("t2", "c", "other", 0, first.entry.seq).committed()
        await store.begin_turn("t9", "d", "bot", 0, first.entry.seq).committed()  # another channel's, left running
        stop_seq = store.next_seq()
        record = StopRecord(stop_seq, "c", 3, (dropped.entry.seq, dropped.entry.seq + 1), ("t1", "t2"), {"bot": plan})
        await store.submit_stop_records([record]).committed()
    async with open_store(store_at) as store:  # what a restart finds
        turns, stops = await store.unfinished()
        assert turns == [("t9", "d", 0, "running")]
        assert stops == [(stop_seq, "c", 3, 2, "t1")]
        assert await store.load_queue() == []
        assert await store.load_channel_states() == {"c": ChannelState(3, True, True)}
        assert await store.query("SELECT pid, pid_started, state FROM turns WHERE id = ?", ("t1",)) == [
            (123, 2**40, "stopped")
        ]
        assert store.todos("c", "bot") == plan and store.seen("c", "bot") == first.entry.seq
        (marked,) = [e for e in await store.entries("c") if e.seq == dropped.entry.seq]
        assert marked.meta == {"agent": "bot", "to": ["bot", "other"], "dropped_by_stop": stop_seq}
        missed = await store.missed("c", "other", after=None, before=10_000, skip=None, limit=10)
        assert missed == ([("human:u", "first"), ("agent:bot", "hi")], 2)  # not the dropped one
        notice = store.submit_stop_notice("c", "Stopped.", stop_seq=stop_seq, turn="t1", generation=3,
                                          result={"ok": True})  # t2 ends too: its record names it
        await notice.committed()
        assert await store.unfinished() == ([("t9", "d", 0, "running")], [])
        ((result,),) = await store.query("SELECT result FROM stops WHERE seq = ?", (stop_seq,))
        assert json.loads(result) == {"ok": True, "notice_seq": notice.entry.seq}  # type: ignore[union-attr]
        await store.append("c", "human:u", "message", "again")  # (a plain entry does not lift the rest)
        lifted = store.accept_message("c", "bot", "human:u", "go on", generation=3, nudge=False)
        await lifted.committed()
        assert await store.load_channel_states() == {"c": ChannelState(3, False, True)}
        await store.begin_turn("t3", "c", "bot", 3, lifted.entry.seq).committed()  # type: ignore[union-attr]
        assert await store.load_channel_states() == {"c": ChannelState(3, False, False)}


async def test_a_store_of_the_first_schema_is_migrated_and_keeps_its_rows(store_at: str) -> None:
    from supervisor.store.engines import open_engine
    from supervisor.store.store import _MIGRATIONS, _SCHEMA, _statements

    old = open_engine(store_at)  # the first version, as shipped: no hops, no rest, no seen table
    old.begin()
    for statement in _statements(_SCHEMA):
        old.execute(old.ddl(statement))
    old.execute("INSERT INTO queue (seq, channel, agent, author, text, generation, nudge)"
                " VALUES (7, 'c', 'claude', 'human:u', 'queued before the upgrade', 2, 0)")
    old.execute("INSERT INTO generations (channel, generation) VALUES ('c', 2)")
    old.commit()
    old.close()
    async with open_store(store_at) as store:
        assert await store.load_queue() == [QueuedRow(7, "c", "claude", "human:u", "queued before the upgrade", 2, False)]
        states = await store.load_channel_states()
        assert (states["c"].generation, states["c"].rests, states["c"].stopped) == (2, False, False)
        assert store.seen("c", "claude") is None
        assert store.next_seq() == 8
        versions = await store.query("SELECT version FROM schema_migrations ORDER BY version")
        assert versions == [(n,) for n in range(1, len(_MIGRATIONS) + 1)]
    async with open_store(store_at) as store:  # a second open migrates nothing again
        assert await store.query("SELECT version FROM schema_migrations ORDER BY version") == versions


async def test_the_rest_the_repeat_window_and_what_each_agent_saw_survive_a_reopen(store_at: str) -> None:
    from supervisor.store.store import StopRecord

    path = store_at
    async with open_store(path) as store:
        await store.accept_message("c", "ann", "human:u", "hi", generation=0, nudge=False).committed()
        await store.begin_turn("t1", "c", "ann", 0, 1).committed()
        await store.submit_stop_records([StopRecord(store.next_seq(), "c", 1, (), ("t1",), {})]).committed()
    async with open_store(path) as store:
        state = (await store.load_channel_states())["c"]
        assert (state.generation, state.rests, state.stopped) == (1, True, True)
        assert store.seen("c", "ann") == 1
        # A human's message lifts the rest; a turn's begin closes the repeat window.
        pending = store.accept_message("c", "bob", "human:u", "go", generation=1, nudge=False, to=("bob", "ann"))
        await pending.committed()
        assert pending.entry is not None
        assert [(r.seq, r.agent) for r in await store.load_queue()] == [(pending.entry.seq, "bob"),
                                                                        (pending.entry.seq + 1, "ann")]
        await store.begin_turn("t2", "c", "bob", 1, pending.entry.seq).committed()
    async with open_store(path) as store:
        state = (await store.load_channel_states())["c"]
        assert (state.rests, state.stopped) == (False, False)


async def test_completing_a_stop_ends_every_turn_its_record_names(store_at: str) -> None:
    # After a kill -9 mid-stop, recovery completes the stop naming one turn: every turn the
    # record names (one per agent of the channel) is ended with it.
    from supervisor.store.store import StopRecord

    async with open_store(store_at) as store:
        for turn, agent, seq in (("t1", "ann", 1), ("t2", "bob", 2)):
            await store.begin_turn(turn, "c", agent, 0, seq).committed()
        stop_seq = store.next_seq()
        await store.submit_stop_records([StopRecord(stop_seq, "c", 1, (), ("t1", "t2"), {})]).committed()
        await store.append("c", "system", "notice", "stopped", also=lambda db, _: Store.complete_stop(
            db, stop_seq, {"ok": True}, "t1"))
        assert await store.query("SELECT id, state FROM turns ORDER BY id") == [("t1", "ended"), ("t2", "ended")]


async def test_a_turn_notice_ends_its_turns_row_in_its_own_commit_and_keeps_its_meta(store_at: str) -> None:
    """An interrupt's (or a shutdown's) notice: once it is committed, the turn's row is ended,
    so a restart does not take the turn for a crash's (issue 32); the notice keeps its meta."""
    async with open_store(store_at) as store:
        first = store.accept_message("c", "bot", "human:u", "long task", generation=0, nudge=False)
        assert first.entry is not None
        await store.begin_turn("t1", "c", "bot", 0, first.entry.seq).committed()
        notice = await store.submit_turn_notice(
            "c", "Interrupted by a new message.", turn="t1", generation=0, meta={"interrupted": "t1", "killed": [7]}
        ).committed()
        assert notice is not None and notice.meta == {"interrupted": "t1", "killed": [7]}
        assert await store.query("SELECT state FROM turns WHERE id = ?", ("t1",)) == [("ended",)]
    async with open_store(store_at) as store:  # what a restart finds: nothing to recover
        assert (await store.unfinished())[0] == []
