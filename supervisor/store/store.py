"""The store: the transcript, stops, sessions, todos and queue, in SQLite or PostgreSQL.

:class:`Store` is the face the rest of corral calls; it accepts writes (each seq final at once)
and answers reads, and leaves the rest to its parts: what is asked of the database
(:mod:`.statements`), the writer task and its group commit (:mod:`.writer`), the followers
and a fleet's commit order (:mod:`.feed`), the sessions, plans and last-seen messages kept in
memory (:mod:`.memory`), the one connection and its thread (:mod:`.connection`), the schema
(:mod:`.schema`) and the two engines (:mod:`.engines`). The value types are the pure core's
(:mod:`supervisor.core.records`), re-exported here.

Theory of operation
-------------------

* ``seq`` is assigned synchronously, in memory, the moment the store accepts a write, so
  the order of ``seq`` is exactly the order in which the supervisor decided things (a
  message stamped by the ledger and then a stop can never swap places).
* Writes are queued and committed by one writer task (:mod:`.writer`). While a commit runs, new writes pile
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
* Reads and writes share one connection serialised by a capacity limiter of one thread
  (:mod:`.connection`).
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
  reads every entry past that point from the database, in order (:meth:`Store.show_others`,
  :mod:`.feed`),
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
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar, overload

import trio

from ..core.notices import Queued
from ..core.records import KINDS as KINDS  # (re-exported: the value types are imported from here too)
from ..core.records import ChannelState as ChannelState
from ..core.records import Draft as Draft
from ..core.records import Entry as Entry
from ..core.records import QueuedRow as QueuedRow
from ..core.records import StopRecord as StopRecord
from ..core.records import TakeOver as TakeOver
from ..core.text import repair
from ..core.usage import TurnRecord
from . import statements
from .connection import Connection
from .engines import (
    Engine,
    PostgresEngine,
    open_engine,
)
from .engines import StoreError as StoreError  # (re-exported: the store's errors are imported from here)
from .engines import StoreInUse as StoreInUse
from .feed import Feed
from .memory import ChannelMemory
from .schema import _MIGRATIONS as _MIGRATIONS  # (re-exported: tests read the migrations from here)
from .schema import _SCHEMA as _SCHEMA
from .schema import _statements as _statements
from .schema import migrate
from .statements import NOTIFY as NOTIFY  # (re-exported: callers import these from here)
from .statements import SEQ_STRIDE as SEQ_STRIDE
from .statements import TURN_ENDED as TURN_ENDED
from .statements import TURN_RUNNING as TURN_RUNNING
from .statements import TURN_STOPPED as TURN_STOPPED
from .statements import Dropped as Dropped
from .statements import Fenced as Fenced
from .statements import newest_seq as newest_seq
from .statements import notify as notify
from .writer import Pending as Pending
from .writer import Writer, commit_batch
from .writer import describe_failure as describe_failure

log = logging.getLogger("corral.store")
T = TypeVar("T")

class Store:
    """The store, on SQLite (a file path) or PostgreSQL (a URL). Open it with :func:`open_store`."""

    def __init__(
        self, path: str, *, synchronous: str = "FULL", host: str | None = None, lease: float | None = None
    ) -> None:
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
        self.store_id: str = statements.store_id(self._db)
        """This store's identity: every process of its turns carries it (``CORRAL_STORE``)."""
        self._db.own(self.store_id, self.host or "")
        self._conn = Connection(self._db, self.path)
        self._read = self._conn.read
        if self.host is not None:
            self.slot, self._stride = self._register(self.host), SEQ_STRIDE
            # Each host's processes carry their own mark: hosts sharing a machine (and the
            # database) never end each other's turns when recovering from an abrupt end.
            self.store_id = f"{self.store_id}{self.slot:02x}"
        self._seq = statements.newest_seq(self._db)
        shown = self._place_unplaced() if self.host is not None else 0
        self._feed = Feed(self._db, self._read, fleet=self.host is not None, shown=shown)
        self._writer = Writer(self.path, commit=lambda batch: self._commit(batch), thread=self._conn.run,
                              fatal=self._db.fatal, shown=self._feed.committed)
        self._memory = ChannelMemory(*statements.memory(self._db))

    # ------------------------------------------------------------ writing

    def _place_unplaced(self) -> int:
        """(A fleet host, at open) :func:`.statements.place_unplaced`, in a transaction."""
        with self._db.transaction():
            return statements.place_unplaced(self._db)

    def _register(self, host: str) -> int:
        """(At open) this host's row and seq slot: its own if it has one, else the lowest free."""
        with self._db.transaction():
            return statements.register_host(self._db, host, self.path)

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
        return await self._conn.transact(work)

    def listener(self) -> Any:
        """(A fleet, in a worker thread) a new PostgreSQL connection that listens to the fleet's
        notices (``LISTEN``), or None on SQLite."""
        return self._conn.listener()

    def link_engine(self) -> PostgresEngine:
        """(A fleet, in a worker thread) a new connection of the store's database for lease
        work, without the owner lock: the heartbeat never waits behind the store's thread."""
        return self._conn.sibling()

    def unstick(self, stall: float) -> bool:
        """(A fleet's heartbeat) if the store's thread has been in one call for ``stall``
        seconds (its connection silent: a cut cable), shut that connection down: the call
        fails as a lost connection (its writes fail visibly) and the next one reconnects.
        True if it did."""
        return self._conn.unstick(stall)

    def reachable(self) -> None:
        """(A fleet's heartbeat got through) a connection abandoned as silent is replaced at
        the next call, not after the pause (see :meth:`PostgresEngine._alive`)."""
        self._conn.reachable()

    check_fence = staticmethod(statements.check_fence)

    def _fenced(self, apply: Callable[[Engine], None], channel: str, token: int | None) -> Callable[[Engine], None]:
        if token is None or self.host is None:
            return apply
        host = self.host

        def fenced(db: Engine) -> None:
            statements.check_fence(db, channel, host, token)
            apply(db)

        return fenced

    def _submit(self, apply: Callable[[Engine], None], entry: Entry | None = None) -> Pending:
        return self._writer.submit(apply, entry)

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

        def apply(db: Engine) -> None:
            statements.insert_entry(db, entry)
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

    @property
    def commits(self) -> int:
        """Transactions the writer has committed so far."""
        return self._writer.commits

    async def run_writer(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit queued writes in batches until :func:`open_store` ends it."""
        await self._writer.run(task_status=task_status)

    def _commit(self, batch: list[Pending]) -> None:
        """(In the store's thread) one batch's transaction (tests replace it to fail commits)."""
        commit_batch(self._db, batch, self.host)

    def others_committed(self, last: int | None = None) -> None:
        """(A fleet) another host's commit placed entries up to position ``last`` (its notice;
        None: maybe, a heartbeat's look for notices lost): :meth:`show_others` reads them."""
        self._feed.others_committed(last)

    async def show_others(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """(A fleet, a task) show this host's followers what other hosts commit, in commit
        order, read back from the database (so only what is committed is shown)."""
        await self._feed.show_others(task_status=task_status)

    async def flush(self) -> None:
        """Wait until everything accepted so far is committed (failures are not raised here)."""
        await self._writer.flush()

    # ------------------------------------------------------------ followers

    def show_draft(self, draft: Draft) -> None:
        """Hand ``draft`` to the live followers that asked for drafts; nothing is written.

        A follower too far behind to take it skips it (the next draft of the run carries
        everything before it, and the entry that saves the run follows in any case): a draft
        never makes a follower re-read the database the way a full queue of entries does."""
        self._feed.show_draft(draft)

    @overload
    def follow(
        self, channel: str | None, after: int = 0, *, drafts: Literal[False] = False
    ) -> AsyncIterator[Entry]: ...

    @overload
    def follow(self, channel: str | None, after: int = 0, *, drafts: bool) -> AsyncIterator[Entry | Draft]: ...

    def follow(
        self, channel: str | None, after: int = 0, *, drafts: bool = False
    ) -> AsyncIterator[Entry | Draft]:
        """Every committed entry of ``channel`` (all channels if None) after the entry ``after``
        (a seq), then live, each once, in commit order (one store: seq order; a fleet: the
        entries' positions, see the theory above). With ``drafts``, the live part also carries
        the drafts this host's turns show (:meth:`show_draft`), in the order they were shown
        relative to the commits."""
        return self._feed.follow(channel, after, drafts=drafts)

    # ------------------------------------------------------------ reading

    async def entries(
        self, channel: str | None, *, after: int = 0, limit: int = 100_000, newest: bool = False
    ) -> list[Entry]:
        """Committed entries after the entry ``after`` (a seq), oldest first (in a fleet: in
        commit order, so a resume point misses no other host's later commit); at most
        ``limit``: the first ones, or with ``newest`` the last ones."""
        return await self._feed.entries(channel, after=after, limit=limit, newest=newest)

    async def has_entries(self, channel: str) -> bool:
        """Whether any entry of ``channel`` is stored (a channel exists once it has one)."""
        return await self._read(lambda: statements.has_entries(self._db, channel))

    async def channels(self) -> set[str]:
        """Every channel with a stored entry."""
        return await self._read(lambda: statements.channels(self._db))

    async def last_seq(self) -> int:
        """The seq of the newest committed entry (0: none)."""
        return await self._read(lambda: statements.last_seq(self._db))

    async def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only query (for status and tests)."""
        return await self._read(lambda: self._db.query(sql, params))

    # ------------------------------------------------------------ sessions, todos, stops, queue

    def session(self, channel: str, agent: str) -> tuple[str | None, str | None]:
        """``(session id, working directory)`` of this channel and agent."""
        return self._memory.session(channel, agent)

    def sessions_by_channel(self) -> dict[str, dict[str, str]]:
        """Every known session id, by channel and then agent."""
        return self._memory.sessions_by_channel()

    def save_session(
        self, channel: str, agent: str, session_id: str | None, cwd: str, *, fence: int | None = None
    ) -> Pending:
        """Remember the session id (None forgets it) and working directory (``fence``: under the lease)."""
        self._memory.set_session(channel, agent, session_id, cwd)
        stamp = time.time()

        def apply(db: Engine) -> None:
            statements.upsert_session(db, channel, agent, session_id, cwd, stamp)

        return self._submit(self._fenced(apply, channel, fence))

    def todos(self, channel: str, agent: str) -> list[dict[str, str]]:
        """The channel's current todo plan for ``agent``."""
        return self._memory.todos(channel, agent)

    def todo_agents(self, channel: str) -> list[str]:
        """Agents that have a todo plan in ``channel``."""
        return self._memory.todo_agents(channel)

    def save_todos(self, channel: str, agent: str, items: list[dict[str, str]], *, fence: int | None = None) -> Pending:
        """Replace the todo plan (``fence``: under the channel's lease)."""
        self._memory.set_todos(channel, agent, items)
        plans, stamp = {agent: [dict(i) for i in items]}, time.time()
        return self._submit(self._fenced(lambda db: statements.upsert_todos(db, channel, plans, stamp), channel, fence))

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
                statements.lift_rest(db, channel)
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
        self._memory.forget(channel, agents)
        stamp = time.time()
        return self.submit_entry(channel, "system", "status", text, generation=generation, meta={"reset": list(agents)},
                                 also=lambda db, _: statements.forget_conversations(db, channel, agents, stamp))

    mark_resent = staticmethod(statements.mark_resent)

    async def origin_seq(self, origin: str) -> int | None:
        """The seq ``origin`` was accepted as (0: handled without a message); None: never seen."""
        return await self._read(lambda: statements.origin_seq(self._db, origin))

    async def origin_at(self, origin: str) -> tuple[int, float] | None:
        """The seq ``origin`` was accepted as (0: handled without a message) and when (the
        wall clock of its commit's host); None: never seen."""
        return await self._read(lambda: statements.origin_at(self._db, origin))

    forget_origin = staticmethod(statements.forget_origin)

    async def entry(self, seq: int) -> Entry | None:
        """The committed entry ``seq``, whatever its channel (None: no such entry)."""
        return await self._read(lambda: statements.entry(self._db, seq))

    def mark_origin(self, origin: str) -> Pending:
        """Record ``origin`` as handled without a message (a command, an event ignored)."""
        stamp = time.time()
        return self._submit(lambda db: statements.mark_origin(db, origin, stamp))

    async def cursor(self, key: str) -> str | None:
        """A bridge's cursor (a sync token, the last entry posted), kept in ``meta``."""
        return await self._read(lambda: statements.cursor(self._db, key))

    def save_cursor(self, key: str, value: str) -> Pending:
        """Replace a bridge's cursor."""
        return self._submit(lambda db: statements.save_cursor(db, key, value))

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
            statements.complete_stop(db, stop_seq, {**result, "notice_seq": seq}, turn)
            for other in turns:
                statements.mark_turn_ended(db, other)

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
            also=lambda db, _: statements.mark_turn_ended(db, turn),
        )

    def queue_insert(self, db: Engine, row: QueuedRow) -> None:
        """(In a transaction) keep an accepted message until its turn begins."""
        statements.insert_queued(db, row)
        if self.host is not None:  # (a fleet: the owner, if another host, takes it up at this commit)
            statements.notify(db, Queued(self.host, row.channel))

    def submit_queue_edit(
        self, channel: str, action: str, entry: int, seqs: Sequence[int], text: str, *, by: str, generation: int,
    ) -> Pending:
        """The record of a queue edit (``take_back`` or ``move_first`` of the entry ``entry``,
        whose queue rows are ``seqs``): a ``status`` entry saying who did it, and the edit
        itself, in one transaction (stored and done, or neither)."""
        meta = {action: entry, "by": by, "rows": list(seqs)}

        def apply(db: Engine, seq: int) -> None:
            if action == "take_back":
                statements.take_back(db, seq, entry, seqs)
            else:
                statements.move_first(db, channel, seqs)

        return self.submit_entry(channel, "system", "status", text, generation=generation, meta=meta, also=apply)

    def dequeue(self, seqs: list[int]) -> Pending:
        """The messages have begun or been dropped: they are no longer waiting."""
        return self._submit(lambda db: statements.dequeue(db, seqs))

    async def load_queue(self, channel: str | None = None) -> list[QueuedRow]:
        """Messages accepted before a restart (or by another fleet host) and not yet run, oldest first."""
        return await self._read(lambda: statements.queued(self._db, channel))

    async def load_channel_states(self) -> dict[str, ChannelState]:
        """Every stopped channel's generation, routing rest and repeat window as of the last run."""
        return await self._read(lambda: statements.channel_states(self._db))

    def seen(self, channel: str, agent: str) -> int | None:
        """The seq of the last message the agent took up in the channel (None: never)."""
        return self._memory.seen(channel, agent)

    async def missed(
        self, channel: str, agent: str, *, after: int | None, before: int, skip: int | None, limit: int
    ) -> tuple[list[tuple[str, str]], int]:
        """The channel's ``message`` entries the agent has not seen: after ``after``, before
        ``before``, by a human or another agent, not dropped by a stop or taken back, not steered
        into the agent's own turn, not still queued for the agent (one moved first runs before
        them: their own turns answer them), not ``skip``.
        Returns the newest ``limit`` of them (author, text), oldest first, and how many
        there are in all."""
        return await self._read(functools.partial(statements.missed, self._db, channel, agent, after=after,
                                                  before=before, skip=skip, limit=limit))

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
        self._memory.saw(channel, agent, message)
        host = self.host

        def apply(db: Engine) -> None:
            statements.begin_turn(db, turn_id, channel, agent, generation, message, host)

        return self._submit(self._fenced(apply, channel, fence))

    def turn_spawned(
        self, turn_id: str, pid: int, started: int | None, *, channel: str = "", fence: int | None = None
    ) -> Pending:
        """Note the turn's leader (pid and start ticks: an identity no pid reuse can fake)."""
        return self._submit(self._fenced(lambda db: statements.turn_spawned(db, turn_id, pid, started), channel, fence))

    def end_turn(self, turn_id: str) -> Pending:
        """The turn ended on its own; a stopped turn is ended by its stop's notice instead."""
        return self._submit(lambda db: statements.end_turn(db, turn_id))

    mark_turn_ended = staticmethod(statements.mark_turn_ended)

    def record_usage(self, record: TurnRecord) -> Pending:
        """What an ended turn spent (``turn_usage``): ``corral usage`` and the daily sums read it."""
        stamp = time.time()
        return self._submit(lambda db: statements.record_usage(db, record, stamp))

    async def usage(self, channel: str | None = None, since: str = "") -> list[TurnRecord]:
        """What the turns that ended on UTC day ``since`` or later spent (of ``channel``, or all)."""
        return await self._read(lambda: statements.usage_records(self._db, channel, since))

    async def turn_agent(self, turn_id: str) -> str | None:
        """The agent of turn ``turn_id`` (None: no such turn)."""
        return await self._read(lambda: statements.turn_agent(self._db, turn_id))

    def submit_stop_records(self, records: list[StopRecord]) -> Pending:
        """Store the records of one or more stops as ONE transaction (a stop-all is one)."""
        stamp, host = time.time(), self.host

        def apply(db: Engine) -> None:
            statements.record_stops(db, records, host, stamp)

        return self._submit(apply)

    record_origin = staticmethod(statements.record_origin)
    record_interrupt = staticmethod(statements.record_interrupt)

    def submit_interrupt(
        self, channel: str, seq: int, dropped: Sequence[int], plans: Mapping[str, list[dict[str, str]]],
    ) -> Pending:
        """(A fleet's owner) the record of an interrupting message another host accepted, ``seq``:
        as :meth:`record_interrupt`, in a transaction of its own."""
        return self._submit(lambda db: statements.record_interrupt(db, channel, seq, dropped, plans))

    def remember_todos(self, channel: str, agent: str, items: list[dict[str, str]]) -> None:
        """Update the cached plan after a write that stored it (a stop's record) committed."""
        self._memory.set_todos(channel, agent, items)

    complete_stop = staticmethod(statements.complete_stop)

    async def unfinished(self) -> tuple[list[tuple[str, str, int, str]], list[tuple[int, str, int, int, str | None]]]:
        """What the last owner left: turns still ``running`` (id, channel, generation, state)
        and stops whose notice was never stored (seq, channel, generation, dropped, turn)."""
        return await self._read(lambda: statements.unfinished(self._db, self.host))  # (a fleet: this host's)

    async def take_over(
        self, channel: str, *, here: Callable[[str], bool], notice: str, skip: set[str]
    ) -> TakeOver:
        """(A fleet host that just took ``channel``'s lease) what the channel is in the store:
        its stop state, its queue, its plans; session ids move only where ``here(cwd)`` (the
        conversation's folder exists on this host), others are forgotten. Turns still
        ``running`` that are not this host's (``skip``) were the last owner's: each is ended
        with ``notice`` (its host's processes cannot be reached from here)."""
        found = await self.transact(lambda db: statements.take_over(db, channel, here, skip))
        self._memory.take_over(channel, found)
        for turn_id, generation, _ in found.ended:
            self.submit_turn_notice(channel, notice, turn=turn_id, generation=generation)
        return found

    def close(self) -> None:
        """Close the database (after the writer has stopped) and give up the store's lock."""
        self._writer.closed = True
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
                    await store._writer.drain()
                store._writer.scope.cancel()
                nursery.cancel_scope.cancel()
    finally:
        store.close()
