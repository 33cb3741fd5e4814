"""The store: the transcript, stops, sessions, todos and queue, in SQLite or PostgreSQL.

Theory of operation
-------------------

* ``seq`` is assigned synchronously, in memory, the moment the store accepts a write, so
  the order of ``seq`` is exactly the order in which the supervisor decided things (a
  message stamped by the ledger and then a stop can never swap places).
* Writes are queued and committed by one writer task. While a commit runs, new writes pile
  up and go into the next commit together (group commit): a fast stream costs one commit
  per batch, not per line, and an idle store costs nothing — the writer sleeps on an event.
* **Saved before shown**: an entry reaches followers only after its transaction commits. A
  failed write fails its caller with :class:`StoreError`, and nothing of it is ever published.
* **One bad write fails only itself.** Entries are made storable when accepted (lone
  surrogates repaired, see :mod:`supervisor.core.text`), and if a batch still fails, its writes are retried one
  transaction each, so only the bad one fails. A failure of the disk itself (full, I/O
  error) is not retried: every write of the batch fails with it. The error a caller sees
  is described by :func:`describe_failure`: it names the store and the cause, never the
  data of anyone's write.
* Reads and writes share one connection serialised by a capacity limiter of one thread.
* **Two engines, one store.** A SQLite file (``[store] path``, the default) or a PostgreSQL
  database (``[store] url``): everything above and below holds on both; the connection, the
  owner lock and the few SQL fragments that differ are the engine's (:mod:`.engines`).
* **One owner.** The store holds a lock for as long as it is open (SQLite: ``flock`` on
  ``<store>.lock``, which names the owner's pid; PostgreSQL: an advisory lock of its
  connection): a second daemon or embedded supervisor on the same store is refused at
  start (:class:`StoreInUse`) instead of interleaving its writes. In a fleet the lock is
  the host's: another host shares the database, a second daemon with the same host name
  is refused.
* **Identity and turns.** Each store has a stable random id (``meta.store_id``); every
  process of a turn carries it in its environment, so after an abrupt death the next
  owner finds exactly its own orphans. A ``turns`` row is written for every turn in the
  same commit as its message's dequeue, before its point of no return, and marked when
  the turn ends: a row still ``running`` at start is a turn the last owner left behind.
* **A stop's record** (its generation, the dequeue and mark of every dropped message, the
  cancelled plan) is one write, committed before the stop kills anything; its row stays
  ``pending`` until the notice is stored in the same commit that completes it. The same
  write puts the channel at rest and opens its repeat window (``generations.rests`` and
  ``.stopped``); a human's message lifts the rest and a turn's begin closes the window,
  each in its own write, so both survive a restart.
* **A fleet (PostgreSQL, ``host`` given).** Several daemons write one database. Each
  registers as a host (``hosts``) with a slot ``k`` < :data:`SEQ_STRIDE` and assigns seqs
  in memory as above, but only of the form ``n * SEQ_STRIDE + k``: unique across hosts with
  no round trip. ``n`` is never below the wall clock in milliseconds (and then counts on),
  so the seqs of different hosts follow real time as closely as their clocks agree (a seq
  stays below 2^53: JSON readers keep it exact). Within a channel, seq order is the order
  its *owner* decided things: a host runs a channel's turns only under its lease
  (:mod:`supervisor.fleet.fleet`), and taking a lease moves the taker's counter past every seq stored so
  far, in the lease's transaction.
* **Fencing.** A write made for a turn carries the fencing token its host held when the
  turn began, and its transaction reads the lease row ``FOR SHARE`` first: a stale token
  fails the write (:class:`Fenced`) and stores nothing. A taker's ``UPDATE`` of the row
  waits for such a transaction, so no stale write commits after the lease moved.
* **Acceptance is not seq order across hosts.** A message another host accepts for the
  channel takes that host's seq, ordered against the owner's by two clocks only (and in one
  millisecond by the hosts' slots). So nothing decides by comparing two hosts' seqs: a stop's
  record deletes *every* committed queue row of its channel (this host's later messages
  are written after it, in submit order), and in a fleet a turn begins only if its row is
  still there (``begin_turn`` fails with :class:`Dropped` otherwise).
* **Commit order: positions.** Every fleet commit that stores entries gives them the next
  positions (``entries.pos``: the greatest so far plus one) under a transaction-level
  advisory lock held to its end, so positions follow commit order across hosts: a reader
  that sees position P sees every position below it. Entries a single daemon stored
  before the store became a fleet's take their seq as position (its seqs were its commit
  order), once, when the first host opens it.
* **Followers in a fleet** go by positions. A commit's ``NOTIFY`` (delivered at the commit,
  never for a rolled-back one) tells every host how far positions go; a host shows its own
  entries at once when they come right after what its followers were shown, and otherwise
  reads every entry past that point from the database, in order (:meth:`Store.show_others`),
  so saved-before-shown holds for every host's entries and a follower sees one order. A
  notice lost while a listening connection is replaced is made good at the next notice or
  heartbeat, whichever comes first. A resume point is an entry's seq: ``follow(after=S)``
  and ``entries(after=S)`` give what was committed after S, other hosts' too, whatever
  their seqs.
* **Migrations** are :mod:`.schema`'s: the first version and one step per later version,
  each in one transaction at open. Never edit one that has shipped: add the next.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import sqlite3
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Literal, TypeVar, overload

import trio

from ..core.notices import CHANNEL as FLEET_NOTICES
from ..core.notices import Notice, Queued
from ..core.records import KINDS as KINDS  # (re-exported: the value types are imported from here too)
from ..core.records import ChannelState as ChannelState
from ..core.records import Draft as Draft
from ..core.records import Entry as Entry
from ..core.records import QueuedRow as QueuedRow
from ..core.records import StopRecord as StopRecord
from ..core.records import TakeOver as TakeOver
from ..core.text import repair
from .engines import (
    LOCK_SPACE,
    ORDER_LOCK,
    Engine,
    PostgresEngine,
    describe_postgres,
    disk_failure,
    is_postgres_error,
    open_engine,
)
from .engines import StoreError as StoreError  # (re-exported: the store's errors are imported from here)
from .engines import StoreInUse as StoreInUse
from .schema import _MIGRATIONS as _MIGRATIONS  # (re-exported: tests read the migrations from here)
from .schema import _SCHEMA as _SCHEMA
from .schema import _statements as _statements
from .schema import migrate

log = logging.getLogger("corral.store")
T = TypeVar("T")

#: How many hosts one database can hold: a host of slot ``k`` takes only the seqs
#: ``n * SEQ_STRIDE + k`` (seqs stay unique without asking the database for each one).
SEQ_STRIDE = 64

#: The advisory lock (second key) a host takes to pick its seq slot.
_SLOT_LOCK = 1
#: How many other hosts' entries a fleet host reads back for its followers at a time.
_SHOW_BATCH = 1000


#: A notice to every host of a fleet (PostgreSQL's ``NOTIFY``, delivered at the commit).
NOTIFY = "SELECT pg_notify(?, ?)"


def notify(db: Engine, notice: Notice) -> None:
    """(In a transaction, PostgreSQL) send ``notice`` to every host of the fleet at the commit."""
    db.execute(NOTIFY, (FLEET_NOTICES, notice.encode()))


def newest_seq(db: Engine) -> int:
    """(In a transaction) the greatest seq stored anywhere (0: none): an entry's, a stop's, a
    queued message's, or a begun turn's message (whose queue row is gone). The store counts on
    from it at open; a fleet host that takes a lease, in the lease's transaction."""
    ((newest,),) = db.query(
        "SELECT coalesce(max(m), 0) FROM (SELECT max(seq) m FROM entries UNION ALL SELECT max(seq) FROM stops"
        " UNION ALL SELECT max(seq) FROM queue UNION ALL SELECT max(message) FROM turns) AS seqs"
    )
    return int(newest)


#: A turn row's states: ``running`` until it ends; ``stopped`` once a stop's record names it
#: (the stop's notice then ends it); ``ended``.
TURN_RUNNING, TURN_STOPPED, TURN_ENDED = "running", "stopped", "ended"


#: (Kept importable from here: the disk's failure, as the engines classify it.)
_disk_failure = disk_failure


def describe_failure(exc: BaseException, path: str) -> str:
    """What a caller is told when a write failed: the store, the cause, and no data.

    A text encoding error quotes the offending character, which may be someone else's
    text; an unknown exception may quote anything. Only SQLite's own messages (which name
    tables and constraints, not values), PostgreSQL's of the classes that name no value
    (see :func:`.engines.describe_postgres`) and OS error strings are passed on.
    """
    if isinstance(exc, StoreError):
        return str(exc)
    if is_postgres_error(exc):
        return describe_postgres(exc, path)
    disk = _disk_failure(exc)
    if disk == "disk full":
        return f"disk full: cannot write the store {path}; free space on its filesystem"
    if disk == "I/O error":
        return f"I/O error writing the store {path}; check the disk"
    if isinstance(exc, UnicodeError):
        return f"the write holds text that is not valid Unicode; it was not stored in {path}"
    if isinstance(exc, sqlite3.Error):
        return f"{exc} (store {path})"
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__} (store {path})"
    return f"internal error {type(exc).__name__} (store {path}; see the log)"


_COLUMNS = "seq, channel, author, kind, text, turn, generation, ts, meta, pos"
"""An entry's columns, in :func:`_entry`'s order."""


def _entry(row: tuple[Any, ...]) -> Entry:
    seq, channel, author, kind, text, turn, generation, ts, meta, pos = row
    return Entry(seq, channel, author, kind, text, turn, generation, ts, json.loads(meta), pos)


class Fenced(StoreError):
    """A write for a channel whose lease this host no longer holds (its fencing token is stale)."""


class Dropped(StoreError):
    """(A fleet) a turn's message is no longer queued in the store: a stop dropped it (stored
    by this host while the row was being taken up, or by another host), so the turn must not begin."""


_KEPT_KINDS: tuple[type[StoreError], ...] = (Fenced, Dropped)
"""Failures whose kind callers act on: a batch's failure keeps it (else a plain StoreError)."""


def _kind(exc: BaseException) -> type[StoreError]:
    return next((k for k in _KEPT_KINDS if isinstance(exc, k)), StoreError)


def _level(exc: BaseException) -> int:
    """A dropped message's begin is the fleet working as designed; anything else is an error."""
    return logging.INFO if isinstance(exc, Dropped) else logging.ERROR


class Pending:
    """A write accepted but maybe not yet committed."""

    __slots__ = ("_apply", "_done", "_error", "entry")

    def __init__(self, apply: Callable[[Engine], None], entry: Entry | None) -> None:
        self.entry = entry
        self._apply = apply
        self._done = trio.Event()
        self._error: BaseException | None = None

    @property
    def failed(self) -> bool:
        """The commit has failed."""
        return self._error is not None

    async def committed(self) -> Entry | None:
        """Wait for the commit; raise :class:`StoreError` if it failed.

        No checkpoint once it is committed: a stop-all's teardowns ask this of hundreds of
        writes long committed, and each needless wake-up costs every one of them.
        """
        if not self._done.is_set():
            await self._done.wait()
        if self._error is not None:
            raise _kind(self._error)(f"could not store: {self._error}") from self._error
        return self.entry


class _Subscription:
    def __init__(self, channel: str | None, *, drafts: bool = False) -> None:
        self.channel = channel
        self.drafts = drafts
        self.send, self.receive = trio.open_memory_channel[Entry | Draft](10_000)
        self.overflowed = False


class Store:
    """The store, on SQLite (a file path) or PostgreSQL (a URL). Open it with :func:`open_store`."""

    def __init__(
        self, path: str, *, synchronous: str = "FULL", host: str | None = None, lease: float | None = None
    ) -> None:
        self._writer_scope = trio.CancelScope(shield=True)
        """The writer's own scope: only :func:`open_store` ends it, after the last commit.
        Shielded, so a scope cancelled around the whole block (a ``move_on_after``, a Ctrl-C)
        cannot take the writer away from a shutdown that still awaits its commits."""
        self._db = open_engine(path, synchronous=synchronous, lease=lease if host is not None else None)
        self.path = self._db.name
        """What messages call the store: its file, or its URL without a password."""
        self.host = host if host is not None and self._db.kind == "postgresql" else None
        """This daemon's name in a fleet (None: the store's one owner)."""
        self.slot = 0
        """The fleet host's seq slot (0 for the one owner)."""
        self._stride = 1
        try:
            self._open()
        except BaseException:
            self._db.close()
            raise

    def _open(self) -> None:
        migrate(self._db)
        self._db.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?) ON CONFLICT (key) DO NOTHING",
                         (secrets.token_hex(8),))
        self.store_id: str = self._db.query("SELECT value FROM meta WHERE key = 'store_id'")[0][0]
        """This store's identity: every process of its turns carries it (``CORRAL_STORE``)."""
        self._db.own(self.store_id, self.host or "")
        self._limiter = trio.CapacityLimiter(1)
        if self.host is not None:
            self.slot, self._stride = self._register(self.host), SEQ_STRIDE
            # Each host's processes carry their own mark: hosts sharing a machine (and the
            # database) never end each other's turns when recovering from an abrupt end.
            self.store_id = f"{self.store_id}{self.slot:02x}"
        self._seq = newest_seq(self._db)
        self._shown = 0
        """(A fleet) the commit position up to which followers have been shown every entry."""
        self._behind = trio.Event()
        """(A fleet) set when another host committed entries (or this host's came out of turn)."""
        if self.host is not None:
            self._shown = self._place_unplaced()
        self._pending: list[Pending] = []
        # The newest accepted write: batches commit in order, so when it is done, all are.
        # (``_pending`` alone is not enough: the writer empties it when it takes a batch.)
        self._last: Pending | None = None
        self._wake = trio.Event()
        self._subs: dict[str | None, set[_Subscription]] = defaultdict(set)
        self._sessions: dict[tuple[str, str], tuple[str | None, str]] = {
            (c, a): (s, d) for c, a, s, d in self._db.query("SELECT channel, agent, session_id, cwd FROM sessions")
        }
        self._seen: dict[tuple[str, str], int] = {
            (c, a): s for c, a, s in self._db.query("SELECT channel, agent, seq FROM seen")
        }
        self._todos: dict[tuple[str, str], list[dict[str, str]]] = {
            (c, a): json.loads(items) for c, a, items in self._db.query("SELECT channel, agent, items FROM todos")
        }
        self.commits = 0
        self._closed = False
        self._busy_since: float | None = None
        """(Monotonic) when the store's thread began the call it is in, if it is in one."""

    # ------------------------------------------------------------ writing

    def _place_unplaced(self) -> int:
        """(A fleet host, at open) entries stored before the store was a fleet's (by a single
        daemon, in seq order = commit order) take their seq as their position, once; the
        position every entry committed so far is at or below."""
        db = self._db
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(?, ?)", (LOCK_SPACE, ORDER_LOCK))
            db.execute("UPDATE entries SET pos = seq WHERE pos IS NULL")
            top = self._top_position()
        return top

    def _register(self, host: str) -> int:
        """(At open) this host's row and seq slot: its own if it has one, else the lowest free."""
        db = self._db
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(?, ?)", (LOCK_SPACE, _SLOT_LOCK))
            mine = db.query("SELECT slot FROM hosts WHERE host = ?", (host,))
            taken = {k for (k,) in db.query("SELECT slot FROM hosts")}
            slot = int(mine[0][0]) if mine else next((k for k in range(SEQ_STRIDE) if k not in taken), -1)
            if slot < 0:
                raise StoreError(f"the store {self.path} already has {SEQ_STRIDE} fleet hosts; remove the rows of "
                                 "hosts gone for good from its hosts table")
            db.execute(
                f"INSERT INTO hosts (host, slot, heartbeat, pid, started) VALUES (?, ?, {db.now}, ?, {db.now})"
                f" ON CONFLICT (host) DO UPDATE SET heartbeat = {db.now}, pid = excluded.pid, started = {db.now}",
                (host, slot, os.getpid()),
            )
        return slot

    def next_seq(self) -> int:
        """Allocate the next ``seq`` (in a fleet: the next of this host's slot, and not below
        the wall clock's milliseconds times the stride, so hosts' seqs follow real time)."""
        n = self._seq // self._stride + 1
        if self.host is not None:
            n = max(n, int(time.time() * 1000))
        self._seq = n * self._stride + self.slot
        return self._seq

    @property
    def seq_step(self) -> int:
        """The distance between two seqs this store assigns in a row (1; in a fleet, the stride)."""
        return self._stride

    def seq_floor(self, seq: int) -> None:
        """Every seq from now on is above ``seq`` (a lease taken: the last owner's are below)."""
        self._seq = max(self._seq, seq)

    async def transact(self, work: Callable[[Engine], T]) -> T:
        """Run ``work`` in a transaction of its own now, in the store's thread (the fleet's
        lease and heartbeat writes: they must not wait behind a batch of entries)."""
        def run() -> T:
            with self._db.transaction():
                return work(self._db)

        return await self._read(run)

    def listener(self) -> Any:
        """(A fleet, in a worker thread) a new PostgreSQL connection that listens to the fleet's
        notices (``LISTEN``), or None on SQLite."""
        if not isinstance(self._db, PostgresEngine):
            return None
        conn = self._db.listener()
        try:
            conn.execute(f"LISTEN {FLEET_NOTICES}")
        except BaseException:
            conn.close()
            raise
        return conn

    def link_engine(self) -> PostgresEngine:
        """(A fleet, in a worker thread) a new connection of the store's database for lease
        work, without the owner lock: the heartbeat never waits behind the store's thread."""
        if not isinstance(self._db, PostgresEngine):
            raise StoreError(f"{self._db.kind} stores have no fleet")
        return self._db.sibling()

    def unstick(self, stall: float) -> bool:
        """(A fleet's heartbeat) if the store's thread has been in one call for ``stall``
        seconds (its connection silent: a cut cable), shut that connection down: the call
        fails as a lost connection (its writes fail visibly) and the next one reconnects.
        True if it did."""
        since = self._busy_since
        if since is None or time.monotonic() - since < stall or not isinstance(self._db, PostgresEngine):
            return False
        log.warning("store %s: a database call has had no answer for %.1f s; abandoning its connection",
                    self.path, time.monotonic() - since)
        self._db.interrupt()
        return True

    def reachable(self) -> None:
        """(A fleet's heartbeat got through) a connection abandoned as silent is replaced at
        the next call, not after the pause (see :meth:`PostgresEngine._alive`)."""
        if isinstance(self._db, PostgresEngine):
            self._db.reachable()

    def _timed(self, call: Callable[[], T]) -> T:
        """(In the store's thread) ``call``, with its start kept for :meth:`unstick`."""
        self._busy_since = time.monotonic()
        try:
            return call()
        finally:
            self._busy_since = None

    @staticmethod
    def check_fence(db: Engine, channel: str, host: str, token: int) -> None:
        """(In a transaction) raise :class:`Fenced` unless ``host`` still holds ``channel``'s
        lease with ``token``; the row stays share-locked until the commit, so a taker waits."""
        rows = db.query("SELECT owner, token FROM leases WHERE channel = ? FOR SHARE", (channel,))
        if not rows or rows[0][0] != host or int(rows[0][1]) != token:
            owner = rows[0][0] if rows else "nobody"
            raise Fenced(f"host {host} no longer holds channel {channel!r} (fencing token {token} is stale;"
                         f" the lease is {owner}'s)")

    def _fenced(self, apply: Callable[[Engine], None], channel: str, token: int | None) -> Callable[[Engine], None]:
        if token is None or self.host is None:
            return apply
        host = self.host

        def fenced(db: Engine) -> None:
            Store.check_fence(db, channel, host, token)
            apply(db)

        return fenced

    def _submit(self, apply: Callable[[Engine], None], entry: Entry | None = None) -> Pending:
        if self._closed:
            raise StoreError("the store is closed")
        pending = Pending(apply, entry)
        self._pending.append(pending)
        self._last = pending
        self._wake.set()
        return pending

    def submit_entry(
        self,
        channel: str,
        author: str,
        kind: str,
        text: str,
        *,
        turn: str | None = None,
        generation: int = 0,
        meta: Mapping[str, Any] | None = None,
        also: Callable[[Engine, int], None] | None = None,
        fence: int | None = None,
    ) -> Pending:
        """Accept a transcript entry now (its ``seq`` is final); it commits shortly.

        ``also`` runs in the same transaction with the entry's seq (e.g. to queue a message).
        ``fence``: the fencing token the write is made under (fails with :class:`Fenced` if stale).
        """
        if kind not in KINDS:
            raise ValueError(f"unknown entry kind {kind!r}")
        # Made storable here, before it can join (and fail) anyone's batch: a human's text
        # was checked by the supervisor; what remains (agent output, previews, meta) is repaired.
        text = self._db.storable(text)
        entry = Entry(self.next_seq(), channel, author, kind, text, turn, generation, time.time(), repair(meta or {}))
        meta_json = json.dumps(entry.meta, ensure_ascii=False)

        def apply(db: Engine) -> None:
            db.execute(
                "INSERT INTO entries (seq, channel, author, kind, text, turn, generation, ts, meta)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (entry.seq, channel, author, kind, text, turn, generation, entry.ts, meta_json),
            )
            if also is not None:
                also(db, entry.seq)

        return self._submit(self._fenced(apply, channel, fence), entry)

    async def append(self, channel: str, author: str, kind: str, text: str, **kw: Any) -> Entry:
        """Store an entry and wait until it is committed (and shown)."""
        entry = await self.submit_entry(channel, author, kind, text, **kw).committed()
        assert entry is not None
        return entry

    def submit_write(
        self, sql: str, params: tuple[Any, ...], *, channel: str = "", fence: int | None = None
    ) -> Pending:
        """Queue a plain write in the same commit order as entries (``fence``: under ``channel``'s lease)."""
        def apply(db: Engine) -> None:
            db.execute(sql, params)

        return self._submit(self._fenced(apply, channel, fence))

    # ------------------------------------------------------------ the writer

    async def run_writer(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit queued writes in batches until :func:`open_store` ends it."""
        with self._writer_scope:
            task_status.started()
            while True:
                if not self._pending:
                    self._wake = trio.Event()
                    await self._wake.wait()
                await self._commit_pending()

    async def _commit_pending(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            await trio.to_thread.run_sync(self._timed, functools.partial(self._commit, batch), limiter=self._limiter)
        except Exception as exc:  # noqa: BLE001 - a failed batch is retried write by write
            log.log(_level(exc), "store commit of %d writes failed: %s", len(batch), describe_failure(exc, self.path))
            if len(batch) > 1 and self._db.fatal(exc) is None:
                await self._commit_one_by_one(batch)
            else:
                self._fail(batch, exc)
            return
        self.commits += 1
        self._succeed(batch)

    async def _commit_one_by_one(self, batch: list[Pending]) -> None:
        """Commit each write of a failed batch alone, in order, so only the bad ones fail."""
        for i, pending in enumerate(batch):
            try:
                await trio.to_thread.run_sync(self._timed, functools.partial(self._commit, [pending]),
                                              limiter=self._limiter)
            except Exception as exc:  # noqa: BLE001 - this write fails, visibly, and alone
                log.log(_level(exc), "store write %d of a failed batch failed alone: %s", i + 1,
                        describe_failure(exc, self.path))
                if self._db.fatal(exc) is not None:
                    self._fail(batch[i:], exc)  # the disk or the link, not the write: the rest cannot go either
                    return
                self._fail([pending], exc)
            else:
                self.commits += 1
                self._succeed([pending])

    def _succeed(self, batch: list[Pending]) -> None:
        for pending in batch:
            pending._done.set()
        entries = [p.entry for p in batch if p.entry is not None]
        if self.host is not None:
            self._show_own(entries)
            return
        for entry in entries:
            self._publish(entry)

    def _fail(self, batch: list[Pending], exc: BaseException) -> None:
        reason = describe_failure(exc, self.path)
        for pending in batch:
            pending._error = _kind(exc)(reason)
            pending._done.set()

    def _commit(self, batch: list[Pending]) -> None:
        db = self._db
        db.begin()
        with db.rolling_back():
            placed = [p for p in batch if p.entry is not None] if self.host is not None else []
            with db.batch():
                for pending in batch:
                    pending._apply(db)
            if placed:
                self._commit_placed(db, placed)  # (the commit, in the fleet's order)
            else:
                db.commit()

    def _commit_placed(self, db: Engine, placed: list[Pending]) -> None:
        """(A fleet, after a batch's writes) commit, giving the commit's entries the positions after
        every entry committed so far, under a lock held to the commit's end: a commit that
        comes later has a greater position, so a reader that sees position P sees every
        position below it too. Every host is told how far the positions go."""
        entries = [p.entry for p in placed if p.entry is not None]
        top = db.commit_in_order([e.seq for e in entries], (FLEET_NOTICES, self.host or ""))
        for n, pending in enumerate(placed, start=1):
            assert pending.entry is not None
            pending.entry = replace(pending.entry, pos=top + n)

    def others_committed(self, last: int | None = None) -> None:
        """(A fleet) another host's commit placed entries up to position ``last`` (its notice;
        None: maybe, a heartbeat's look for notices lost): :meth:`show_others` reads them."""
        if last is None or last > self._shown:
            self._behind.set()

    async def show_others(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """(A fleet, a task) show this host's followers what other hosts commit, in commit
        order, read back from the database (so only what is committed is shown)."""
        task_status.started()
        while True:
            await self._behind.wait()
            self._behind = trio.Event()
            try:
                await self._show_committed()
            except StoreError as exc:
                log.warning("could not read other hosts' entries for followers (the next notice or"
                            " heartbeat tries again): %s", exc)

    async def _show_committed(self) -> None:
        if not any(self._subs.values()):
            # Nobody to show them to: only how far they go (a follower to come reads the database).
            self._shown = max(self._shown, await self._read(self._top_position))
            return
        while True:
            rows = await self._read(functools.partial(self._placed_after, self._shown, _SHOW_BATCH))
            for entry in rows:
                assert entry.pos is not None
                if entry.pos > self._shown:
                    self._publish(entry)
                    self._shown = entry.pos
            if len(rows) < _SHOW_BATCH:
                return

    def _top_position(self) -> int:
        ((top,),) = self._db.query("SELECT coalesce(max(pos), 0) FROM entries")
        return int(top)

    def _placed_after(self, after: int, limit: int) -> list[Entry]:
        return [_entry(row) for row in self._db.query(
            f"SELECT {_COLUMNS} FROM entries WHERE pos > ? ORDER BY pos LIMIT ?", (after, limit)
        )]

    def _show_own(self, entries: list[Entry]) -> None:
        """(A fleet) this host's committed entries: shown now if they come right after what
        followers were shown; else other hosts' commits came between, and the reader shows
        everything from there in order."""
        fresh = [e for e in entries if e.pos is not None and e.pos > self._shown]
        if not fresh:
            return
        if not any(self._subs.values()):
            self._shown = max(self._shown, fresh[-1].pos or 0)  # (a follower to come reads from the database)
        elif fresh[0].pos == self._shown + 1:
            for entry in fresh:
                self._publish(entry)
            self._shown = fresh[-1].pos or 0
        else:
            self._behind.set()

    async def flush(self) -> None:
        """Wait until everything accepted so far is committed (failures are not raised here)."""
        if self._last is not None:
            await self._last._done.wait()

    # ------------------------------------------------------------ followers

    def _publish(self, entry: Entry) -> None:
        for key in (entry.channel, None):
            for sub in list(self._subs.get(key, ())):
                try:
                    sub.send.send_nowait(entry)
                except trio.WouldBlock:
                    sub.overflowed = True
                    sub.send.close()
                    self._subs[key].discard(sub)

    def show_draft(self, draft: Draft) -> None:
        """Hand ``draft`` to the live followers that asked for drafts; nothing is written.

        A follower too far behind to take it skips it (the next draft of the run carries
        everything before it, and the entry that saves the run follows in any case): a draft
        never makes a follower re-read the database the way a full queue of entries does."""
        for key in (draft.channel, None):
            for sub in list(self._subs.get(key, ())):
                if sub.drafts:
                    try:
                        sub.send.send_nowait(draft)
                    except trio.WouldBlock:
                        pass

    @overload
    def follow(
        self, channel: str | None, after: int = 0, *, drafts: Literal[False] = False
    ) -> AsyncIterator[Entry]: ...

    @overload
    def follow(self, channel: str | None, after: int = 0, *, drafts: bool) -> AsyncIterator[Entry | Draft]: ...

    async def follow(
        self, channel: str | None, after: int = 0, *, drafts: bool = False
    ) -> AsyncIterator[Entry | Draft]:
        """Every committed entry of ``channel`` (all channels if None) after the entry ``after``
        (a seq), then live, each once, in commit order (one store: seq order; a fleet: the
        entries' positions, see the theory above). With ``drafts``, the live part also carries
        the drafts this host's turns show (:meth:`show_draft`), in the order they were shown
        relative to the commits."""
        column = "pos" if self.host is not None else "seq"
        floor = await self._read(lambda: self._position(after)) if self.host is not None else after

        def key(entry: Entry) -> int:
            return (entry.pos or 0) if self.host is not None else entry.seq

        while True:
            sub = _Subscription(channel, drafts=drafts)
            self._subs[channel].add(sub)
            try:
                for entry in await self._rows(channel, column, floor, 100_000):
                    if key(entry) > floor:
                        yield entry
                        floor = key(entry)
                async for item in sub.receive:
                    if isinstance(item, Draft):
                        yield item
                    elif key(item) > floor:
                        yield item
                        floor = key(item)
            finally:
                self._subs[channel].discard(sub)
                sub.send.close()
            if not sub.overflowed:
                return
            # A follower that fell 10,000 entries behind re-reads from the database.

    # ------------------------------------------------------------ reading

    async def entries(
        self, channel: str | None, *, after: int = 0, limit: int = 100_000, newest: bool = False
    ) -> list[Entry]:
        """Committed entries after the entry ``after`` (a seq), oldest first (in a fleet: in
        commit order, so a resume point misses no other host's later commit); at most
        ``limit``: the first ones, or with ``newest`` the last ones."""
        if self.host is None:
            return await self._rows(channel, "seq", after, limit, newest)
        return await self._rows(channel, "pos", await self._read(lambda: self._position(after)), limit, newest)

    def _position(self, after: int) -> int:
        """(A fleet, in the store's thread) the commit position of entry ``after``; for a seq
        that names no entry, the last position of an entry with a seq at or below it."""
        if after <= 0:
            return 0
        found = self._db.query("SELECT pos FROM entries WHERE seq = ?", (after,))
        if found and found[0][0] is not None:
            return int(found[0][0])
        ((pos,),) = self._db.query("SELECT coalesce(max(pos), 0) FROM entries WHERE seq <= ?", (after,))
        return int(pos)

    async def _rows(
        self, channel: str | None, column: str, after: int, limit: int, newest: bool = False
    ) -> list[Entry]:
        where, params = (f"{column} > ?", (after,)) if channel is None else (
            f"channel = ? AND {column} > ?", (channel, after))
        order = f"{column} DESC" if newest else column

        def read() -> list[Entry]:
            rows = self._db.query(f"SELECT {_COLUMNS} FROM entries WHERE {where} ORDER BY {order} LIMIT ?",
                                  (*params, limit))
            return [_entry(row) for row in (reversed(rows) if newest else rows)]

        return await self._read(read)

    async def has_entries(self, channel: str) -> bool:
        """Whether any entry of ``channel`` is stored (a channel exists once it has one)."""
        return bool(await self.query("SELECT 1 FROM entries WHERE channel = ? LIMIT 1", (channel,)))

    async def channels(self) -> set[str]:
        """Every channel with a stored entry."""
        return {name for (name,) in await self.query("SELECT DISTINCT channel FROM entries")}

    async def last_seq(self) -> int:
        """The seq of the newest committed entry (0: none)."""
        ((newest,),) = await self.query("SELECT coalesce(max(seq), 0) FROM entries")
        return int(newest)

    async def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only query (for status and tests)."""
        return await self._read(lambda: self._db.query(sql, params))

    async def _read(self, read: Callable[[], T]) -> T:
        """Run ``read`` in the store's thread; a PostgreSQL failure (the server gone, say) is a
        :class:`StoreError` naming the store, like a failed write's."""
        try:
            return await trio.to_thread.run_sync(self._timed, read, limiter=self._limiter)
        except Exception as exc:
            if not is_postgres_error(exc):
                raise
            raise StoreError(f"could not read the store: {describe_failure(exc, self.path)}") from exc

    # ------------------------------------------------------------ sessions, todos, stops, queue

    def session(self, channel: str, agent: str) -> tuple[str | None, str | None]:
        """``(session id, working directory)`` of this channel and agent."""
        return self._sessions.get((channel, agent), (None, None))

    def sessions_by_channel(self) -> dict[str, dict[str, str]]:
        """Every known session id, by channel and then agent."""
        out: dict[str, dict[str, str]] = {}
        for (channel, agent), (session_id, _) in self._sessions.items():
            if session_id:
                out.setdefault(channel, {})[agent] = session_id
        return out

    def save_session(
        self, channel: str, agent: str, session_id: str | None, cwd: str, *, fence: int | None = None
    ) -> Pending:
        """Remember the session id (None forgets it) and working directory (``fence``: under the lease)."""
        self._sessions[(channel, agent)] = (session_id, cwd)
        return self.submit_write(
            "INSERT INTO sessions (channel, agent, session_id, cwd, updated) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT(channel, agent) DO UPDATE SET session_id=excluded.session_id, cwd=excluded.cwd,"
            " updated=excluded.updated",
            (channel, agent, session_id, cwd, time.time()), channel=channel, fence=fence,
        )

    def todos(self, channel: str, agent: str) -> list[dict[str, str]]:
        """The channel's current todo plan for ``agent``."""
        return [dict(item) for item in self._todos.get((channel, agent), [])]

    def todo_agents(self, channel: str) -> list[str]:
        """Agents that have a todo plan in ``channel``."""
        return [a for (c, a) in self._todos if c == channel]

    def save_todos(self, channel: str, agent: str, items: list[dict[str, str]], *, fence: int | None = None) -> Pending:
        """Replace the todo plan (``fence``: under the channel's lease)."""
        self._todos[(channel, agent)] = [dict(i) for i in items]
        return self.submit_write(
            "INSERT INTO todos (channel, agent, items, updated) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(channel, agent) DO UPDATE SET items=excluded.items, updated=excluded.updated",
            (channel, agent, json.dumps(items, ensure_ascii=False), time.time()), channel=channel, fence=fence,
        )

    def accept_message(
        self, channel: str, agent: str | None, author: str, text: str, *, generation: int, nudge: bool,
        to: tuple[str, ...] = (), hops: int = 0, also: Callable[[Engine, int], None] | None = None,
        origin: str | None = None, meta: Mapping[str, object] | None = None, delivery: str | None = None,
    ) -> Pending:
        """A message for ``agent`` (and ``to``, its other targets): its entry and its place in
        each target's queue, in one transaction (stored and queued, or neither). Its seq is
        final at once (``pending.entry.seq``); the other targets' queue rows take the seqs
        right after it (``pending.entry.seq + i * seq_step``). A human's message lifts the channel's
        routing rest in the same transaction. ``agent`` None: stored, queued nowhere. ``origin``
        (a bridge's event id) is recorded in ``origins`` in the same transaction: a second
        message of the same origin fails to commit.
        """
        targets = ((agent,) if agent is not None else ()) + tuple(t for t in to if t != agent)
        extra: list[int] = []  # the other targets' seqs: taken right after the entry's, below

        def keep_queued(db: Engine, seq: int) -> None:
            for target, row_seq in zip(targets, [seq, *extra][: len(targets)], strict=True):
                # A later target's row repeats the entry: it names it (its catch-up skips it).
                source = seq if row_seq != seq else None
                row = QueuedRow(row_seq, channel, target, author, text, generation, nudge, hops, source, delivery)
                self.queue_insert(db, row)
            if author.startswith("human:"):
                db.execute("UPDATE generations SET rests = 0 WHERE channel = ?", (channel,))
            if also is not None:
                also(db, seq)
            if origin is not None:
                self.record_origin(db, origin, seq)

        meta = {"agent": agent, **({"nudge": True} if nudge else {}), **(meta or {})}
        if len(targets) > 1:
            meta["to"] = list(targets)
        if hops:
            meta["hops"] = hops
        if origin is not None:
            meta["origin"] = origin
        pending = self.submit_entry(
            channel, author, "message", text, generation=generation, meta=meta, also=keep_queued
        )
        extra.extend(self.next_seq() for _ in targets[1:])  # (keep_queued runs at commit, later)
        return pending

    def reset_conversation(self, channel: str, agents: Sequence[str], text: str, *, generation: int) -> Pending:
        """Forget ``agents``' session ids (keeping each one's working folder) and todo plans in
        ``channel``, with the ``status`` entry ``text`` that records it: one transaction."""
        for agent in agents:
            known = self._sessions.get((channel, agent))
            if known is not None:
                self._sessions[(channel, agent)] = (None, known[1])
            if (channel, agent) in self._todos:
                self._todos[(channel, agent)] = []
        stamp = time.time()

        def forget(db: Engine, seq: int) -> None:
            for agent in agents:
                db.execute("UPDATE sessions SET session_id = NULL, updated = ? WHERE channel = ? AND agent = ?",
                           (stamp, channel, agent))
                db.execute("UPDATE todos SET items = '[]', updated = ? WHERE channel = ? AND agent = ?",
                           (stamp, channel, agent))

        return self.submit_entry(channel, "system", "status", text, generation=generation,
                                 meta={"reset": list(agents)}, also=forget)

    @staticmethod
    def mark_resent(db: Engine, seq: int, meta: Mapping[str, Any], resent_as: int) -> None:
        """(In the new message's transaction) entry ``seq`` was sent again as ``resent_as``."""
        db.execute("UPDATE entries SET meta = ? WHERE seq = ?",
                   (json.dumps({**meta, "resent_as": resent_as}, ensure_ascii=False), seq))

    async def origin_seq(self, origin: str) -> int | None:
        """The seq ``origin`` was accepted as (0: handled without a message); None: never seen."""
        rows = await self.query("SELECT coalesce(seq, 0) FROM origins WHERE origin = ?", (origin,))
        return int(rows[0][0]) if rows else None

    def mark_origin(self, origin: str) -> Pending:
        """Record ``origin`` as handled without a message (a command, an event ignored)."""
        return self.submit_write(
            "INSERT INTO origins (origin, seq, ts) VALUES (?, NULL, ?) ON CONFLICT (origin) DO NOTHING",
            (origin, time.time()),
        )

    async def cursor(self, key: str) -> str | None:
        """A bridge's cursor (a sync token, the last entry posted), kept in ``meta``."""
        rows = await self.query("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def save_cursor(self, key: str, value: str) -> Pending:
        return self.submit_write(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def accept_routed(
        self, channel: str, agents: tuple[str, ...], author: str, text: str, *, generation: int, hops: int,
        source: int,
    ) -> tuple[list[int], Pending]:
        """Hand an agent's stored entry ``source`` on to ``agents``: a queue row each (no new
        entry: the transcript holds it once), in one transaction. Returns their seqs."""
        rows = [QueuedRow(self.next_seq(), channel, a, author, text, generation, False, hops, source) for a in agents]

        def apply(db: Engine) -> None:
            for row in rows:
                self.queue_insert(db, row)

        return [r.seq for r in rows], self._submit(apply)

    def submit_stop_notice(
        self, channel: str, text: str, *, stop_seq: int, turn: str | None, generation: int, result: Mapping[str, Any],
        turns: tuple[str, ...] = (), dropped_entries: tuple[int, ...] = (),
    ) -> Pending:
        """A stop's notice, last: it completes the stop's record (its final ``result``, with
        ``notice_seq``) and ends its turns' rows (``turn`` and ``turns``), in the notice's
        own transaction. ``dropped_entries``: the entries of the messages it dropped (a page
        that showed them before the stop marks them "not run" by it)."""
        meta: dict[str, Any] = {"stop_seq": stop_seq, "ok": result.get("ok"), "dropped": result.get("dropped")}
        if dropped_entries:
            meta["dropped_entries"] = list(dropped_entries)
        if len(turns) > 1:
            meta["turns"] = list(turns)

        def complete(db: Engine, seq: int) -> None:
            Store.complete_stop(db, stop_seq, {**result, "notice_seq": seq}, turn)
            for other in turns:
                Store.mark_turn_ended(db, other)

        return self.submit_entry(
            channel, "system", "notice", text, turn=turn, generation=generation, meta=meta, also=complete,
        )

    def submit_turn_notice(
        self, channel: str, text: str, *, turn: str, generation: int, meta: Mapping[str, Any] | None = None,
    ) -> Pending:
        """A notice that ends a turn (a shutdown's, an interrupt's, a take-over's): the entry and
        the turn's row ended, together. A notice stored with its row still ``running`` would
        make the next start take the turn for a crash's and post a false "restarted" notice."""
        return self.submit_entry(
            channel, "system", "notice", text, turn=turn, generation=generation, meta=meta,
            also=lambda db, _: Store.mark_turn_ended(db, turn),
        )

    def queue_insert(self, db: Engine, row: QueuedRow) -> None:
        """(In a transaction) keep an accepted message until its turn begins."""
        db.execute(
            "INSERT INTO queue (seq, channel, agent, author, text, generation, nudge, hops, routed_from, delivery)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.seq, row.channel, row.agent, row.author, row.text, row.generation, int(row.nudge), row.hops,
             row.routed_from, row.delivery),
        )
        if self.host is not None:  # (a fleet: the owner, if another host, takes it up at this commit)
            notify(db, Queued(self.host, row.channel))

    def dequeue(self, seqs: list[int]) -> Pending:
        """The messages have begun or been dropped: they are no longer waiting."""
        def apply(db: Engine) -> None:
            db.executemany("DELETE FROM queue WHERE seq = ?", [(s,) for s in seqs])

        return self._submit(apply)

    async def load_queue(self, channel: str | None = None) -> list[QueuedRow]:
        """Messages accepted before a restart (or by another fleet host) and not yet run, oldest first."""
        where, params = ("WHERE channel = ?", (channel,)) if channel is not None else ("", ())
        rows = await self.query(
            "SELECT seq, channel, agent, author, text, generation, nudge, hops, routed_from, delivery"
            f" FROM queue {where} ORDER BY seq", params,
        )
        return [QueuedRow(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8], r[9]) for r in rows]

    async def load_channel_states(self) -> dict[str, ChannelState]:
        """Every stopped channel's generation, routing rest and repeat window as of the last run."""
        rows = await self.query("SELECT channel, generation, rests, stopped FROM generations")
        return {c: ChannelState(g, bool(r), bool(s)) for c, g, r, s in rows}

    def seen(self, channel: str, agent: str) -> int | None:
        """The seq of the last message the agent took up in the channel (None: never)."""
        return self._seen.get((channel, agent))

    async def missed(
        self, channel: str, agent: str, *, after: int | None, before: int, skip: int | None, limit: int
    ) -> tuple[list[tuple[str, str]], int]:
        """The channel's ``message`` entries the agent has not seen: after ``after``, before
        ``before``, by a human or another agent, not dropped by a stop, not steered into the
        agent's own turn, not ``skip``.
        Returns the newest ``limit`` of them (author, text), oldest first, and how many
        there are in all."""
        where = (
            "channel = ? AND kind = 'message' AND seq > ? AND seq < ? AND seq != ? AND author != ?"
            " AND (author LIKE 'human:%' OR author LIKE 'agent:%')"
            f" AND {self._db.json_get('meta', 'dropped_by_stop')} IS NULL"
            # A message steered into this agent's turn reached it then: not again.
            f" AND ({self._db.json_get('meta', 'steered')} IS NULL OR {self._db.json_get('meta', 'agent')} != ?)"
        )
        params = (
            channel, after if after is not None else 0, before, skip if skip is not None else -1, f"agent:{agent}",
            agent,
        )
        ((total,),) = await self.query(f"SELECT count(*) FROM entries WHERE {where}", params)
        rows = await self.query(f"SELECT author, text FROM entries WHERE {where} ORDER BY seq DESC LIMIT ?",
                                (*params, limit))
        return [(a, t) for a, t in reversed(rows)], int(total)

    # ------------------------------------------------------------ turns and stop records

    def begin_turn(
        self, turn_id: str, channel: str, agent: str, generation: int, message: int, *, fence: int | None = None
    ) -> Pending:
        """Dequeue the turn's message and keep a ``running`` row for the turn, in one commit
        (in a fleet: under the channel's lease, ``fence``; a stale token stores nothing).

        The same commit closes the channel's repeat window (a turn has begun since its stop)
        and records the message as the last one the agent has seen (for its next catch-up).

        In a fleet the row decides: a message that is no longer queued was dropped by a stop
        (another host's, or this host's while the row was being read) and fails the write
        with :class:`Dropped`. One host's ledger alone cannot know: it takes other hosts'
        rows up under its current generation, and their seqs do not say whether they were
        accepted before or after a stop (two clocks; two hosts in one millisecond).
        """
        self._seen[(channel, agent)] = max(message, self._seen.get((channel, agent), 0))
        fleet = self.host is not None

        def apply(db: Engine) -> None:
            if fleet:
                if not db.query("DELETE FROM queue WHERE seq = ? RETURNING seq", (message,)):
                    raise Dropped(f"message {message} of channel {channel!r} was dropped by a stop")
            else:
                db.execute("DELETE FROM queue WHERE seq = ?", (message,))
            db.execute("UPDATE generations SET stopped = 0 WHERE channel = ? AND stopped = 1", (channel,))
            db.execute(
                "INSERT INTO seen (channel, agent, seq) VALUES (?, ?, ?)"
                f" ON CONFLICT(channel, agent) DO UPDATE SET seq = {db.greatest('seen.seq', 'excluded.seq')}",
                (channel, agent, message),
            )
            db.execute(
                "INSERT INTO turns (id, channel, agent, generation, message, state, began, host)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (turn_id, channel, agent, generation, message, TURN_RUNNING, time.time(), self.host),
            )

        return self._submit(self._fenced(apply, channel, fence))

    def turn_spawned(
        self, turn_id: str, pid: int, started: int | None, *, channel: str = "", fence: int | None = None
    ) -> Pending:
        """Note the turn's leader (pid and start ticks: an identity no pid reuse can fake)."""
        return self.submit_write("UPDATE turns SET pid = ?, pid_started = ? WHERE id = ?", (pid, started, turn_id),
                                 channel=channel, fence=fence)

    def end_turn(self, turn_id: str) -> Pending:
        """The turn ended on its own; a stopped turn is ended by its stop's notice instead."""
        return self.submit_write(
            "UPDATE turns SET state = ? WHERE id = ? AND state = ?", (TURN_ENDED, turn_id, TURN_RUNNING)
        )

    @staticmethod
    def mark_turn_ended(db: Engine, turn_id: str | None) -> None:
        """(In a transaction) the turn's last entry is being stored: it is over."""
        if turn_id is not None:
            db.execute("UPDATE turns SET state = ? WHERE id = ?", (TURN_ENDED, turn_id))

    def submit_stop_records(self, records: list[StopRecord]) -> Pending:
        """Store the records of one or more stops as ONE transaction (a stop-all is one)."""
        stamp = time.time()

        def apply(db: Engine) -> None:
            for r in records:
                summary = {
                    "pending": True, "generation": r.generation, "dropped": list(r.dropped),
                    "stopped_turn": r.stopped_turns[0] if r.stopped_turns else None,
                    "stopped_turns": list(r.stopped_turns),
                }
                db.execute(
                    "INSERT INTO stops (seq, channel, generation, ts, result, host) VALUES (?, ?, ?, ?, ?, ?)",
                    (r.seq, r.channel, r.generation, stamp, json.dumps(summary), self.host),
                )
                db.execute(
                    "INSERT INTO generations (channel, generation, rests, stopped) VALUES (?, ?, 1, 1)"
                    " ON CONFLICT(channel) DO UPDATE SET"
                    f" generation={db.greatest('generations.generation', 'excluded.generation')}, rests=1, stopped=1",
                    (r.channel, r.generation),
                )
                db.executemany("DELETE FROM queue WHERE seq = ?", [(s,) for s in r.dropped])
                dropped = list(r.dropped)
                if self.host is not None:
                    # (A fleet) and every row other hosts queued that is committed now, taken
                    # up here or not: those were accepted before the stop answered, whatever
                    # their seqs (another host's clock, or the same millisecond, can put one
                    # above the stop's). This host's own later messages are written after
                    # this, in submit order; a row taken up before the stop and begun after
                    # it finds itself gone (``begin_turn``: Dropped).
                    dropped += [int(s) for (s,) in db.query(
                        "DELETE FROM queue WHERE channel = ? RETURNING seq", (r.channel,)
                    )]
                db.executemany(
                    f"UPDATE entries SET meta = {db.mark_dropped()} WHERE seq = ?",
                    [(r.seq, s) for s in dropped],
                )
                for agent, items in r.plans.items():
                    db.execute(
                        "INSERT INTO todos (channel, agent, items, updated) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT(channel, agent) DO UPDATE SET items=excluded.items, updated=excluded.updated",
                        (r.channel, agent, json.dumps(items, ensure_ascii=False), stamp),
                    )
                db.executemany("UPDATE turns SET state = ? WHERE id = ?", [(TURN_STOPPED, t) for t in r.stopped_turns])

        return self._submit(apply)

    @staticmethod
    def record_origin(db: Engine, origin: str, seq: int) -> None:
        """(In a message's transaction) the outside event it came from: a second fails to commit."""
        db.execute("INSERT INTO origins (origin, seq, ts) VALUES (?, ?, ?)", (origin, seq, time.time()))

    def record_interrupt(
        self, db: Engine, channel: str, seq: int, dropped: Sequence[int], plans: Mapping[str, list[dict[str, str]]],
    ) -> None:
        """(In the interrupting message's transaction, ``seq``) its record: the lanes' queued
        messages it dropped dequeued and marked (as a stop marks them, and as an interrupt's:
        their pages say "dropped by an interrupt"), the plans cancelled."""
        db.executemany("DELETE FROM queue WHERE seq = ?", [(s,) for s in dropped])
        db.executemany(f"UPDATE entries SET meta = {db.mark_dropped()} WHERE seq = ?", [(seq, s) for s in dropped])
        db.executemany(f"UPDATE entries SET meta = {db.mark_dropped('dropped_by_interrupt')} WHERE seq = ?",
                       [(seq, s) for s in dropped])
        db.execute("UPDATE queue SET delivery = NULL WHERE seq = ?", (seq,))  # (a fleet's: carried out now)
        stamp = time.time()
        for agent, items in plans.items():
            db.execute(
                "INSERT INTO todos (channel, agent, items, updated) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(channel, agent) DO UPDATE SET items=excluded.items, updated=excluded.updated",
                (channel, agent, json.dumps(items, ensure_ascii=False), stamp),
            )

    def submit_interrupt(
        self, channel: str, seq: int, dropped: Sequence[int], plans: Mapping[str, list[dict[str, str]]],
    ) -> Pending:
        """(A fleet's owner) the record of an interrupting message another host accepted, ``seq``:
        as :meth:`record_interrupt`, in a transaction of its own."""
        return self._submit(lambda db: self.record_interrupt(db, channel, seq, dropped, plans))

    def remember_todos(self, channel: str, agent: str, items: list[dict[str, str]]) -> None:
        """Update the cached plan after a write that stored it (a stop's record) committed."""
        self._todos[(channel, agent)] = [dict(i) for i in items]

    @staticmethod
    def complete_stop(db: Engine, seq: int, result: Mapping[str, Any], turn: str | None) -> None:
        """(In the notice's transaction) the stop is complete: its final result, its turns ended
        (``turn`` and every turn its record names: a stop of several agents' turns)."""
        rows = db.query("SELECT result FROM stops WHERE seq = ?", (seq,))
        recorded = json.loads(rows[0][0]).get("stopped_turns", []) if rows else []
        db.execute("UPDATE stops SET result = ? WHERE seq = ?", (json.dumps(result, ensure_ascii=False), seq))
        for stopped in {turn, *recorded}:
            Store.mark_turn_ended(db, stopped)

    async def unfinished(self) -> tuple[list[tuple[str, str, int, str]], list[tuple[int, str, int, int, str | None]]]:
        """What the last owner left: turns still ``running`` (id, channel, generation, state)
        and stops whose notice was never stored (seq, channel, generation, dropped, turn)."""
        mine, host = ("", ()) if self.host is None else (" AND host = ?", (self.host,))  # (a fleet: this host's)
        turns = await self.query(
            f"SELECT id, channel, generation, state FROM turns WHERE state = ?{mine} ORDER BY began",
            (TURN_RUNNING, *host),
        )
        stops = await self.query(
            "SELECT seq, channel, generation, result FROM stops"
            f" WHERE {self._db.json_get('result', 'pending')} = {self._db.json_true}{mine} ORDER BY seq", host,
        )
        pending = []
        for seq, channel, generation, result in stops:
            summary = json.loads(result)
            pending.append((seq, channel, generation, len(summary.get("dropped", [])), summary.get("stopped_turn")))
        return [(t[0], t[1], t[2], t[3]) for t in turns], pending

    async def take_over(
        self, channel: str, *, here: Callable[[str], bool], notice: str, skip: set[str]
    ) -> TakeOver:
        """(A fleet host that just took ``channel``'s lease) what the channel is in the store:
        its stop state, its queue, its plans; session ids move only where ``here(cwd)`` (the
        conversation's folder exists on this host), others are forgotten. Turns still
        ``running`` that are not this host's (``skip``) were the last owner's: each is ended
        with ``notice`` (its host's processes cannot be reached from here)."""
        def take(db: Engine) -> TakeOver:
            state = db.query("SELECT generation, rests, stopped FROM generations WHERE channel = ?", (channel,))
            rows = db.query(
                "SELECT seq, channel, agent, author, text, generation, nudge, hops, routed_from, delivery FROM queue"
                " WHERE channel = ? ORDER BY seq", (channel,),
            )
            todos = db.query("SELECT agent, items FROM todos WHERE channel = ?", (channel,))
            seen = db.query("SELECT agent, seq FROM seen WHERE channel = ?", (channel,))
            sessions = db.query("SELECT agent, session_id, cwd FROM sessions WHERE channel = ?", (channel,))
            forgotten = [a for a, sid, cwd in sessions if sid and not here(cwd)]
            db.executemany("UPDATE sessions SET session_id = NULL WHERE channel = ? AND agent = ?",
                           [(channel, a) for a in forgotten])
            ended = [(t, g, h) for t, g, h in db.query(
                "SELECT id, generation, host FROM turns WHERE channel = ? AND state != ?", (channel, TURN_ENDED)
            ) if t not in skip]
            beats = dict(db.query("SELECT host, heartbeat FROM hosts"))
            return TakeOver(
                ChannelState(int(state[0][0]), bool(state[0][1]), bool(state[0][2])) if state else None,
                [QueuedRow(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], r[8], r[9]) for r in rows],
                {a: json.loads(items) for a, items in todos},
                {a: (None if a in forgotten else sid, cwd) for a, sid, cwd in sessions},
                ended,
                {h: float(b) for h, b in beats.items()},
                {a: int(q) for a, q in seen},
            )

        found = await self.transact(take)
        for agent, seq in found.seen.items():  # (the last host's turns took up messages too)
            self._seen[(channel, agent)] = max(seq, self._seen.get((channel, agent), 0))
        for agent, items in found.todos.items():
            self._todos[(channel, agent)] = items
        for agent, (sid, cwd) in found.sessions.items():
            self._sessions[(channel, agent)] = (sid, cwd)
        for turn_id, generation, _ in found.ended:
            self.submit_turn_notice(channel, notice, turn=turn_id, generation=generation)
        return found

    def close(self) -> None:
        """Close the database (after the writer has stopped) and give up the store's lock."""
        self._closed = True
        self._db.close()


@asynccontextmanager
async def open_store(
    path: str, *, synchronous: str = "FULL", host: str | None = None, lease: float | None = None
) -> AsyncIterator[Store]:
    """Open the store and run its writer (in a fleet, and its reader of other hosts'
    entries for followers); on exit, commit what is pending and close.

    ``path`` is a SQLite file, or a ``postgresql://`` URL (any libpq URL; ``synchronous``
    is SQLite's alone; ``host``: this daemon's name in a fleet, PostgreSQL's alone;
    ``lease``: the fleet's, which its connections' timeouts follow)."""
    store = await trio.to_thread.run_sync(lambda: Store(path, synchronous=synchronous, host=host, lease=lease))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run_writer)
            if store.host is not None:
                await nursery.start(store.show_others)
            try:
                yield store
            finally:
                with trio.CancelScope(shield=True):
                    while store._pending:
                        await store._commit_pending()
                store._writer_scope.cancel()
                nursery.cancel_scope.cancel()
    finally:
        store.close()
