"""The store's two database engines: SQLite (the embedded default) and PostgreSQL.

Theory of operation
-------------------

One :class:`~supervisor.store.store.Store` holds everything that makes the store mean what it
means — the in-memory ``seq``, the one writer task and its group commit, saved before
shown, the per-write retry (:mod:`~supervisor.store.writer`), and every SQL statement, written
once (:mod:`~supervisor.store.statements`; the fleet's leases, hosts and heartbeat in
:class:`~supervisor.store.leases.Leases` beside it, which the fleet runs on connections of
its own). An engine is the connection under it: what differs between
SQLite and PostgreSQL and nothing more (and the owner lock and a fleet's ordered commit,
which are the connection's). Outside the store, only ``corral check`` reads SQL: the
catalog of a SQLite file no store has opened (:mod:`supervisor.config.preflight`).

* **Why one store over two engines, not a store per engine.** The semantics are the hard
  part and the tests pin them; two store classes would be two places for them to drift.
  The SQL the two share is nearly all of it, so it is written once in one dialect
  (SQLite's, with ``?`` placeholders), and an engine translates what differs: ``?`` to
  ``%s`` (``%`` doubled), ``INTEGER``/``REAL`` column types to ``BIGINT``/``DOUBLE
  PRECISION`` in DDL, and four fragments it writes itself — :meth:`Engine.greatest`,
  :meth:`Engine.json_get`, :attr:`Engine.json_true`, :meth:`Engine.mark_dropped`. The
  ``apply(db)`` callbacks of writes get the engine and call :meth:`Engine.execute`.
* **Transactions.** :meth:`Engine.begin` / :meth:`Engine.commit` / :meth:`Engine.rollback`,
  written once as :meth:`Engine.transaction` (and :meth:`Engine.rolling_back` for work that
  begins or commits itself), on one connection used by one worker thread at a time (the store's limiter). A rollback
  after a failure never raises: it would hide the failure. On PostgreSQL a batch's writes
  are pipelined (:meth:`Engine.batch`: one round trip, not one per statement); a read in
  the batch syncs the pipeline first, so it sees the batch's writes and raises their error.
* **Failures that are not the write's fault** (:meth:`Engine.fatal`): a full disk, an I/O
  error, a lost database connection. The store does not retry such a batch write by write
  (every write would fail the same way); it fails the batch visibly.
* **Companions corral did not write** (SQLite, :func:`quarantine_companions`). The store is
  in WAL mode, so corral never leaves a rollback journal (``<store>-journal``); SQLite replays
  a hot one at the next read-write open, whoever wrote it — an image of any store an agent
  likes, written over the real one, where an agent could write the store's folder. So before
  SQLite opens the file, a ``-journal`` beside it is renamed aside (``<store>-journal.untrusted-
  <UTC time>``), never replayed, and so is a companion that is a symlink (``-wal``, ``-shm``,
  ``.lock``: SQLite and the lock would follow it); the log says what was moved, where and why.
  Nothing of the store is lost: its file and its own ``-wal`` are kept. (Config validation
  refuses an agent that may write the store's folder: this is the wall behind that one.)
* **The owner lock.** SQLite: ``flock`` on ``<store>.lock`` (:func:`lock_store`).
  PostgreSQL: a session-level advisory lock keyed from the store id, held by the store's
  connection; a second daemon on the same database is refused with :class:`StoreInUse`
  naming the holder's ``application_name`` (``corral pid N on HOST``), after retrying for
  a second (a closed session's locks are freed only once its server process has exited; the
  store unlocks before it closes for the same reason). In a fleet the lock is per host
  (keyed from the store id and ``[cluster] host``): two daemons calling themselves the same
  host are refused; hosts share the channels through leases with fencing tokens
  (:mod:`supervisor.fleet.fleet`).
* **Reconnecting (PostgreSQL).** A connection that broke (the server restarted) is replaced
  at the next transaction or read, and the owner lock is taken again first; if another
  daemon took it meanwhile, the store has lost its ownership and every later write fails
  with :class:`StoreInUse`. A ``BEGIN`` or a read that fails on a broken connection is
  retried once on a new one (nothing was written); a failure inside a transaction fails
  its batch. A connection lost during ``COMMIT`` leaves the outcome unknown to the client:
  the writes are reported failed though the server may have kept them (PostgreSQL cannot
  say; the fleet's fencing will make a retry safe).
* **A fleet's connections (PostgreSQL with a lease).** A cut cable keeps a TCP connection
  open and silent: a read on it waits forever. So a fleet host's connections carry TCP
  keepalives and ``tcp_user_timeout`` (unless the URL sets them), a short ``connect_timeout``,
  and ``idle_in_transaction_session_timeout`` of half the lease: the server ends a cut-off
  host's session stuck in a transaction (and frees its row locks) before the host's leases
  run out (:func:`fleet_settings`). Those protect a real network; they cannot see a silence
  the far kernel still acknowledges, so every fleet call also has a deadline of its own: a
  connection still busy at its deadline is shut down from the Trio thread
  (:meth:`PostgresEngine.interrupt`: ``shutdown(2)`` wakes the worker thread blocked on it),
  abandoned, and replaced by a new one at the next call (:class:`~supervisor.fleet.fleet.Link`).
* **seq on PostgreSQL** is assigned in memory, as on SQLite, but in a stride: each host has
  a slot (its row in ``hosts``) and takes only seqs ``n * SEQ_STRIDE + slot``, so hosts
  writing one database never collide (see the store's theory of operation).
* **Text.** PostgreSQL text cannot hold NUL: agent output's NUL becomes U+FFFD there
  (:meth:`Engine.storable`), the one difference a reader can see. JSON columns are kept as
  text on both engines (the exact JSON written is read back: ``jsonb`` would reorder it,
  and PostgreSQL's JSON types refuse the ``\\u0000`` escape JSON gives a NUL), and read
  in SQL only through :meth:`Engine.json_get`.
"""

from __future__ import annotations

import abc
import errno
import fcntl
import hashlib
import logging
import math
import os
import re
import socket
import sqlite3
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from ..core.errors import CorralError
from ..core.text import REPLACEMENT, repair_text

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("corral.store")

#: The URL schemes that select PostgreSQL (libpq's own).
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class StoreError(CorralError, RuntimeError):
    """A write could not be committed; nothing of it was shown to anyone."""


class StoreInUse(StoreError):
    """Another process owns the store (it holds the store's lock)."""


def is_postgres(where: str) -> bool:
    """True if ``where`` is a PostgreSQL URL rather than a SQLite file path."""
    return where.startswith(POSTGRES_SCHEMES)


def redact(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` parameter), for
    logs, errors and ``status``."""
    url = re.sub(r"^([a-z]+://[^:/@?]*):[^@/?]*@", r"\1:***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


#: Companions of a SQLite store that SQLite or the lock would open, follow or replay.
STORE_COMPANIONS = ("-journal", "-wal", "-shm", ".lock")


def quarantine_companions(path: str, *, now: float | None = None) -> list[tuple[str, str]]:
    """Move aside, before SQLite opens ``path``, the companions corral did not write.

    A ``-journal`` (a WAL store never has one: SQLite would replay it over the store), and a
    companion that is a symlink. Each is renamed to ``NAME.untrusted-<UTC time>`` in the
    same folder (nothing is deleted: the operator may look); returns the (from, to) pairs,
    each logged as a warning.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    moved = []
    for suffix in STORE_COMPANIONS:
        name = path + suffix
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            continue
        if suffix != "-journal" and not stat.S_ISLNK(st.st_mode):
            continue
        aside = f"{name}.untrusted-{stamp}"
        n = 1
        while os.path.lexists(aside):
            aside = f"{name}.untrusted-{stamp}.{n}"
            n += 1
        os.rename(name, aside)
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "a rollback journal"
        log.warning(
            "moved %s aside to %s, unread: it is %s beside the store that corral did not write "
            "(the store is in WAL mode; SQLite would have replayed or followed it over the store). "
            "The store itself is kept. An agent that may write %s can plant one: see docs/security.md",
            name, aside, what, os.path.dirname(os.path.abspath(path)),
        )
        moved.append((name, aside))
    return moved


def lock_store(path: str) -> int:
    """Take the store's lock (``<path>.lock``, 0600) for this process; return its descriptor.

    ``flock`` is released by the kernel when the owner dies, however it dies, and the
    descriptor is close-on-exec, so no agent inherits it. Raises :class:`StoreInUse`
    naming the owner's pid.
    """
    lock_path = path + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreInUse(
            f"store {path} is in use by pid {owner}; stop that corral first (`corral shutdown`), "
            "or give this one another [store] path"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


#: SQLite's primary result codes for a failing disk (the extended codes keep them in the low byte).
SQLITE_IOERR = 10
SQLITE_FULL = 13


def disk_failure(exc: BaseException) -> str | None:
    """"disk full" or "I/O error" if ``exc`` is the disk failing (SQLite or the OS), else None."""
    if isinstance(exc, sqlite3.Error):
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code == SQLITE_FULL:
            return "disk full"
        if code == SQLITE_IOERR:
            return "I/O error"
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk full"
        if exc.errno == errno.EIO:
            return "I/O error"
    return None


def is_postgres_error(exc: BaseException) -> bool:
    """True for psycopg's exceptions (checked by module: the driver is an optional extra)."""
    return type(exc).__module__.split(".")[0] == "psycopg"


#: SQLSTATE classes whose primary message names objects (tables, constraints, settings,
#: connections) but never a value: safe to pass on. Class 22 (data exception) quotes values.
_SAFE_CLASSES = ("08", "23", "25", "40", "42", "53", "54", "55", "57", "58", "0A")


def postgres_failure(exc: BaseException) -> str | None:
    """"disk full", "I/O error" or "connection lost" if ``exc`` is PostgreSQL's server or
    connection failing rather than the write, else None."""
    if not is_postgres_error(exc):
        return None
    state: str | None = getattr(exc, "sqlstate", None)
    if state == "53100":
        return "disk full"
    if state in ("58030", "XX001", "XX002"):
        return "I/O error"
    import psycopg

    if isinstance(exc, psycopg.OperationalError) and (state is None or state[:2] in ("08", "57")):
        return "connection lost"
    return None


def describe_postgres(exc: BaseException, name: str) -> str:
    """A psycopg error as a caller may see it: the store, the cause, no value of any write."""
    failure = postgres_failure(exc)
    state: str | None = getattr(exc, "sqlstate", None)
    first = str(exc).split("\n", 1)[0].strip()
    if failure == "disk full":
        return f"disk full: the PostgreSQL server cannot write the store {name}; free space on its disk"
    if failure == "I/O error":
        return f"I/O error in the PostgreSQL server of the store {name}; check its disk"
    if failure == "connection lost":
        return f"the database connection failed: {first} (store {name}); corral reconnects at the next write"
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) or first
    if state is not None and state[:2] in _SAFE_CLASSES:
        return f"{primary} (store {name})"
    table = getattr(diag, "table_name", None)
    where = f" in table {table}" if table else ""
    return f"PostgreSQL refused a value of the write{where} (SQLSTATE {state or 'client'}); it was not stored in {name}"


class Engine(abc.ABC):
    """One database connection under the store, and the dialect of its SQL.

    Used from one worker thread at a time. ``name`` is what messages call the store (a
    file path, or a URL without its password).
    """

    name: str
    kind: str

    @abc.abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement (SQLite dialect, ``?`` placeholders) in the current transaction."""

    @abc.abstractmethod
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter row."""

    @abc.abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a read and return its rows."""

    @abc.abstractmethod
    def begin(self, *, schema: bool = False) -> None:
        """Open a write transaction (``schema``: also serialise with other openers' migrations)."""

    def batch(self) -> AbstractContextManager[object]:
        """Around a transaction's writes: nothing here; PostgreSQL pipelines them (one round
        trip for the batch, its first error raised when the block ends)."""
        return nullcontext()

    @abc.abstractmethod
    def commit(self) -> None:
        """Commit the transaction."""

    def commit_in_order(self, seqs: Sequence[int], notice: tuple[str, str]) -> int:
        """(A fleet, in a batch) give the entries ``seqs`` the next commit positions, notify
        ``notice`` (channel, host) how far positions go, and commit; the position before the
        first. Only a fleet calls it, and a fleet's store is PostgreSQL."""
        raise StoreError(f"{self.kind} stores have no fleet commit order")

    @abc.abstractmethod
    def rollback(self) -> None:
        """Roll back if a transaction is open; log (never raise) a rollback that fails."""

    @contextmanager
    def rolling_back(self) -> Iterator[None]:
        """Around a transaction's work: roll it back if the work raised (the rollback never
        raises: it would hide the work's error), then let the error go on."""
        try:
            yield
        except BaseException:
            self.rollback()
            raise

    @contextmanager
    def transaction(self, *, schema: bool = False) -> Iterator[None]:
        """A transaction around the block: :meth:`begin` (``schema``: under the migration lock),
        then :meth:`commit` at its end, or :meth:`rollback` if it raised (a rollback with no
        transaction open does nothing: a ``BEGIN`` that failed leaves none, unless its lock wait did)."""
        with self.rolling_back():
            self.begin(schema=schema)
            yield
            self.commit()

    @abc.abstractmethod
    def own(self, store_id: str, host: str = "") -> None:
        """Hold the owner lock for ``store_id`` (raise :class:`StoreInUse`), if not held yet;
        ``host``: the lock is this fleet host's (PostgreSQL)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection and give up the owner lock."""

    @abc.abstractmethod
    def fatal(self, exc: BaseException) -> str | None:
        """Why ``exc`` is not the write's fault (disk full, I/O error, connection lost), or None."""

    @abc.abstractmethod
    def legacy_version(self) -> int:
        """The schema version kept before the ``schema_migrations`` table (SQLite's user_version)."""

    def storable(self, text: str) -> str:
        """``text`` as this engine can keep it (lone surrogates repaired)."""
        return repair_text(text)

    def ddl(self, sql: str) -> str:
        """A schema statement in this engine's column types."""
        return sql

    @abc.abstractmethod
    def greatest(self, a: str, b: str) -> str:
        """SQL for the larger of two values."""

    @abc.abstractmethod
    def json_get(self, column: str, key: str) -> str:
        """SQL for the scalar at ``key`` of a JSON text column (NULL if absent)."""

    json_true: str
    """How :meth:`json_get` of a JSON ``true`` compares."""

    @abc.abstractmethod
    def mark_dropped(self, key: str = "dropped_by_stop") -> str:
        """SQL for ``meta`` with ``key`` (a constant of corral's, never text from outside) set
        to the one parameter: ``dropped_by_stop``, and for an interrupt's drops also
        ``dropped_by_interrupt``."""

    now: str
    """SQL for the database's clock in seconds since the epoch (one clock for every host)."""


class SQLiteEngine(Engine):
    """A SQLite file in WAL mode, owned through ``flock`` on ``<path>.lock``."""

    kind = "sqlite"
    json_true = "1"
    now = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str, *, synchronous: str = "FULL") -> None:
        self.name = path
        if path != ":memory:":
            quarantine_companions(path)  # before the lock (a symlinked .lock) and before SQLite
        self._lock_fd = lock_store(path) if path != ":memory:" else -1
        try:
            if path != ":memory:":
                quarantine_companions(path)  # again, under the lock: nothing planted since
            if path != ":memory:" and not os.path.exists(path):
                # Transcripts can hold secrets: the file (and SQLite's -wal/-shm, which copy its
                # mode) is readable by its owner only.
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._db.execute("PRAGMA busy_timeout=5000")
        except BaseException:
            self._unlock()
            raise

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement."""
        self._db.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement per row."""
        self._db.executemany(sql, rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read."""
        return self._db.execute(sql, params).fetchall()

    def begin(self, *, schema: bool = False) -> None:
        """``BEGIN IMMEDIATE``: the write lock now, not at the first write."""
        self._db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        """Commit."""
        self._db.execute("COMMIT")

    def rollback(self) -> None:
        """Roll back, unless SQLite already did (it does on SQLITE_FULL and SQLITE_IOERR)."""
        # A ROLLBACK then fails with "no transaction is active" and would hide the real error.
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error as rollback:
                log.error("store rollback failed after a failed commit: %s", rollback)

    def own(self, store_id: str, host: str = "") -> None:
        """The flock was taken before the file was opened: nothing more to hold."""

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor releases the lock
            self._lock_fd = -1

    def close(self) -> None:
        """Close the file, then release the lock."""
        try:
            self._db.close()
        finally:
            self._unlock()

    def fatal(self, exc: BaseException) -> str | None:
        """A full or failing disk."""
        return disk_failure(exc)

    def legacy_version(self) -> int:
        """``PRAGMA user_version``: where stores before ``schema_migrations`` kept it."""
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def greatest(self, a: str, b: str) -> str:
        """SQLite's two-argument scalar ``max``."""
        return f"max({a}, {b})"

    def json_get(self, column: str, key: str) -> str:
        """``json_extract``."""
        return f"json_extract({column}, '$.{key}')"

    def mark_dropped(self, key: str = "dropped_by_stop") -> str:
        """``json_set``."""
        return f"json_set(meta, '$.{key}', ?)"


#: The advisory lock's first key: corral's namespace in the database ("corr").
LOCK_SPACE = 0x636F7272
#: The second key of the lock that serialises schema migrations between openers.
_SCHEMA_LOCK = 0
#: The second key of the lock a fleet commit holds from placing its entries to its end
#: (``entries.pos``), so positions follow commit order.
ORDER_LOCK = 2
#: How long an opener retries a held owner lock before it is refused (seconds).
_LOCK_PATIENCE = 1.0


def fleet_settings(lease: float) -> tuple[dict[str, str], int]:
    """(A fleet host, lease seconds) the libpq options its connections take unless the URL
    sets them, and the ``idle_in_transaction_session_timeout`` (ms) each session sets.

    Keepalives probe an idle connection every second after a third of the lease (three
    unanswered probes end it); ``tcp_user_timeout`` ends one whose sent data goes
    unacknowledged for half the lease; a connection attempt gives up after about half the
    lease (libpq's floor is 2 s). The server ends a session idle inside a transaction for half
    the lease: a cut-off host's half-done transaction frees its locks before its leases run
    out in the database, so a taker is never held up by them."""
    half_ms = max(500, int(lease * 500))
    options = {
        "keepalives": "1", "keepalives_idle": str(max(1, int(lease / 3))), "keepalives_interval": "1",
        "keepalives_count": "3", "tcp_user_timeout": str(half_ms),
        "connect_timeout": str(max(2, math.ceil(lease / 2))),
    }
    return options, half_ms


class PostgresEngine(Engine):
    """A PostgreSQL database over psycopg 3 (its sync API, in the store's worker thread)."""

    kind = "postgresql"
    json_true = "'true'"
    now = "extract(epoch from clock_timestamp())::double precision"

    def __init__(self, url: str, *, lease: float | None = None) -> None:
        self.name = redact(url)
        self._url = url
        self.lease = lease
        """(A fleet host) its lease: the connections' timeouts follow it (:func:`fleet_settings`)."""
        self._abandoned_at: float | None = None
        """(Monotonic) when :meth:`interrupt` last shut a silent connection down."""
        self._store_id: str | None = None
        self._host = ""
        self._pipeline: psycopg.Pipeline | None = None
        self._order_scripts: dict[tuple[str, str], str] = {}
        """:meth:`commit_in_order`'s script for each (notice channel, host), but its seqs."""
        self._lost: StoreInUse | None = None
        try:
            import psycopg  # noqa: F401 - the optional extra; checked here, used below
        except ImportError:
            raise StoreError(
                f"the store {self.name} is on PostgreSQL, which needs the driver: pip install 'psycopg[binary]>=3.2'"
            ) from None
        self._conn = self._connect()

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        options: dict[str, Any] = {"connect_timeout": 10}
        idle_ms = 0
        if self.lease is not None:
            given = conninfo_to_dict(self._url)
            fleet, idle_ms = fleet_settings(self.lease)
            options = {k: v for k, v in fleet.items() if k not in given}
        conn = psycopg.connect(
            self._url, autocommit=True, **options,
            application_name=f"corral pid {os.getpid()} on {socket.gethostname()}"[:63],
        )
        if idle_ms:
            try:
                conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
            except BaseException:
                conn.close()
                raise
        return conn

    def usable(self) -> bool:
        """The connection can take the next call (not closed, not broken, no transaction left open)."""
        from psycopg.pq import TransactionStatus

        conn = self._conn
        return not (conn.closed or conn.broken) and conn.info.transaction_status == TransactionStatus.IDLE

    def reachable(self) -> None:
        """The database answered another connection (a fleet's heartbeat): reconnect at the next call."""
        self._abandoned_at = None

    def sibling(self) -> PostgresEngine:
        """A new engine on the same database and settings, without the owner lock (a fleet's
        lease work: its own connection, so it never waits behind the store's)."""
        return PostgresEngine(self._url, lease=self.lease)

    def interrupt(self) -> None:
        """(From another thread) shut the connection's socket down: a worker thread blocked
        on it wakes with an error at once, and the connection counts as broken (a silent
        connection is abandoned, never waited on). Nothing to do if it is closed."""
        conn = self._conn
        self._abandoned_at = time.monotonic()
        try:
            fd = conn.pgconn.socket
        except Exception:  # noqa: BLE001 - closed or never connected: nothing blocks on it
            return
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:  # (a duplicate: the shutdown is the socket's)
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def pipelined(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Run ``statements`` (this engine's dialect) in ONE round trip: every statement
        goes out before any answer is read (psycopg's pipeline), then each one's rows. A
        renewal over a slow link costs one delay, not one per statement."""
        self._alive()
        with self._conn.pipeline():
            cursors = [self._conn.execute(self._sql(sql), params) for sql, params in statements]
        return [c.fetchall() if c.description is not None else [] for c in cursors]

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    def _alive(self) -> None:
        """A new connection (and the owner lock again) if the last one broke; not for half a
        lease after a silent one was abandoned (a connection attempt through a cut cable
        waits out its ``connect_timeout``: the calls meanwhile fail at once instead)."""
        if self._lost is not None:
            raise self._lost
        if self._conn.broken or self._conn.closed:
            if self._abandoned_at is not None and self.lease is not None:
                if time.monotonic() - self._abandoned_at < self.lease / 2:
                    import psycopg

                    raise psycopg.OperationalError("the database did not answer; its connection was abandoned"
                                                   " a moment ago")
                self._abandoned_at = None
            log.warning("store %s: the database connection was lost; reconnecting", self.name)
            self._conn.close()
            self._conn = self._connect()
            if self._store_id is not None:
                try:
                    self._take(self._store_id, self._host)
                except StoreInUse as exc:
                    self._lost = StoreInUse(f"lost the store: {exc}")
                    self._conn.close()
                    raise self._lost from None
            log.warning("store %s: reconnected", self.name)

    def _retrying(self, sql: str, params: Sequence[Any]) -> psycopg.Cursor[tuple[Any, ...]]:
        """Run a statement that wrote nothing yet (a BEGIN, a read): once more on a new
        connection if this one turns out broken."""
        import psycopg

        self._alive()
        try:
            return self._conn.execute(self._sql(sql), params)
        except psycopg.OperationalError:
            if not self._conn.broken:
                raise
        self._alive()
        return self._conn.execute(self._sql(sql), params)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Run one statement."""
        self._conn.execute(self._sql(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement per row."""
        with self._conn.cursor() as cursor:
            cursor.executemany(self._sql(sql), rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read (outside a transaction: reconnects once if needed)."""
        from psycopg.pq import TransactionStatus

        if self._pipeline is not None:  # (a read in a batch: its answer is needed now)
            cursor = self._conn.execute(self._sql(sql), params)
            self._pipeline.sync()
        elif self._conn.info.transaction_status == TransactionStatus.IDLE or self._conn.broken:
            cursor = self._retrying(sql, params)
        else:
            cursor = self._conn.execute(self._sql(sql), params)
            if self._pipeline is not None:
                self._pipeline.sync()  # (a read inside a pipelined batch, a fencing check: its rows now)
        return cursor.fetchall() if cursor.description is not None else []

    def begin(self, *, schema: bool = False) -> None:
        """``BEGIN`` (reconnecting first if needed); ``schema`` also waits for the migration lock."""
        self._retrying("BEGIN", ())
        if schema:
            self.execute("SELECT pg_advisory_xact_lock(?, ?)", (LOCK_SPACE, _SCHEMA_LOCK))

    @contextmanager
    def batch(self) -> Iterator[object]:
        """psycopg's pipeline mode: a group commit's statements go out without waiting for
        each other's answers (the first error is raised when the block ends, or at a read)."""
        with self._conn.pipeline() as pipeline:
            self._pipeline = pipeline
            try:
                yield pipeline
            finally:
                self._pipeline = None

    def commit(self) -> None:
        """Commit."""
        self._conn.execute("COMMIT")

    def commit_in_order(self, seqs: Sequence[int], notice: tuple[str, str]) -> int:
        """The lock, the positions, the notice and the ``COMMIT`` go to the server as ONE
        message (a multi-statement simple query, values inlined as literals): the server runs
        it to the end without waiting for this process, so a host paused (SIGSTOP) or cut
        off can never hold the fleet's commits up with the lock. Its answers are read after.
        The notice is an ``entries`` one (:class:`supervisor.core.notices.Entries`), written
        in SQL: its ``last`` is read in this transaction."""
        assert self._pipeline is None, "commit_in_order runs after the batch's pipeline"
        script = self._order_scripts.get(notice)
        if script is None:
            from psycopg import sql

            # (Literals, quoted by psycopg; braces doubled for the format below.)
            channel, host = (sql.Literal(v).as_string(self._conn).replace("{", "{{").replace("}", "}}")
                             for v in notice)
            script = self._order_scripts[notice] = (
                f"SELECT pg_advisory_xact_lock({LOCK_SPACE}, {ORDER_LOCK});"
                " UPDATE entries SET pos = t.top + o.n FROM (SELECT coalesce(max(pos), 0) AS top FROM entries) AS t,"
                " unnest('{{{seqs}}}'::bigint[]) WITH ORDINALITY AS o(seq, n) WHERE entries.seq = o.seq"
                " RETURNING t.top;"
                f" SELECT pg_notify({channel}, json_build_object('kind', 'entries', 'from', {host}::text,"
                " 'last', (SELECT max(pos) FROM entries))::text);"
                " COMMIT"
            )
        cursor = self._conn.execute(script.format(seqs=",".join(str(int(s)) for s in seqs)).encode())
        cursor.nextset()  # (past the lock's result: the positions')
        ((top,), *_) = cursor.fetchall()  # (one row per entry, each the same: they were inserted in this commit)
        while cursor.nextset():  # (the notice's, the COMMIT's)
            pass
        return int(top)

    def rollback(self) -> None:
        """Roll back an open or failed transaction; nothing to do on a broken connection."""
        import psycopg
        from psycopg.pq import TransactionStatus

        if self._conn.broken or self._conn.info.transaction_status not in (
            TransactionStatus.INTRANS, TransactionStatus.INERROR
        ):
            return
        try:
            self._conn.execute("ROLLBACK")
        except psycopg.Error as rollback:
            log.error("store rollback failed after a failed commit: %s", describe_postgres(rollback, self.name))

    def _key(self, store_id: str, host: str) -> int:
        if not host:
            return int(store_id[:8], 16) & 0x7FFFFFFF
        # (A stable hash: Python's hash() of a str changes with every process.)
        return int(hashlib.sha256(f"{store_id}/{host}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF

    def _take(self, store_id: str, host: str) -> None:
        key = self._key(store_id, host)
        # A session that just ended holds its locks until its server process has exited, a
        # moment after its client closed: a restart right after a `kill -9` waits that out.
        deadline = time.monotonic() + _LOCK_PATIENCE
        while True:
            ((taken,),) = self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_SPACE, key)).fetchall()
            if taken:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)  # (in the store's worker thread, at open or reconnect only)
        holders = self._conn.execute(
            "SELECT a.application_name, a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s AND l.objsubid = 2",
            (LOCK_SPACE, key),
        ).fetchall()
        holder = (holders[0][0] or f"database session {holders[0][1]}") if holders else "another session"
        named = f" (as fleet host {host!r})" if host else ""
        raise StoreInUse(
            f"store {self.name} is in use by {holder}{named}; stop that corral first (`corral shutdown`), "
            "or give this one another [store] url (another database) or another [cluster] host"
        )

    def listener(self) -> psycopg.Connection[tuple[Any, ...]]:
        """A connection of its own for ``LISTEN`` (a fleet's notices), used by one thread."""
        return self._connect()

    def own(self, store_id: str, host: str = "") -> None:
        """Take the session-level advisory lock of this store and host (kept until the connection ends)."""
        self._take(store_id, host)
        self._store_id, self._host = store_id, host

    def close(self) -> None:
        """Give up the advisory lock, then close the connection (the server would release the
        lock with the session too, but only once its process has exited: a moment later)."""
        import psycopg

        if self._store_id is not None and not (self._conn.closed or self._conn.broken):
            try:
                key = self._key(self._store_id, self._host)
                self._conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_SPACE, key))
            except psycopg.Error as exc:
                log.warning("store %s: could not release its lock (%s); the server does at disconnect",
                            self.name, describe_postgres(exc, self.name))
        self._conn.close()

    def fatal(self, exc: BaseException) -> str | None:
        """The server's disk, or the connection."""
        if isinstance(exc, StoreInUse):
            return "store lost"
        return postgres_failure(exc) or disk_failure(exc)

    def legacy_version(self) -> int:
        """Always 0: PostgreSQL stores began with ``schema_migrations``."""
        return 0

    def storable(self, text: str) -> str:
        """Repaired, and NUL (which PostgreSQL text cannot hold) as U+FFFD."""
        return repair_text(text).replace("\0", REPLACEMENT)

    def ddl(self, sql: str) -> str:
        """64-bit integers and double precision: SQLite's INTEGER and REAL are both."""
        return re.sub(r"\bREAL\b", "DOUBLE PRECISION", re.sub(r"\bINTEGER\b", "BIGINT", sql))

    def greatest(self, a: str, b: str) -> str:
        """``greatest``."""
        return f"greatest({a}, {b})"

    def json_get(self, column: str, key: str) -> str:
        """``->>``, on the text with each ``\\u0000`` escape made ``\\ufffd`` first: PostgreSQL's
        JSON functions refuse that escape anywhere in the document. Only other values than
        the one read can change (corral reads its own numbers and booleans this way)."""
        return f"(replace({column}, '\\u0000', '\\ufffd')::json ->> '{key}')"

    def mark_dropped(self, key: str = "dropped_by_stop") -> str:
        """Text surgery on the JSON object: appends the key as ``json_set`` does, with no parse."""
        return ("CASE WHEN meta = '{}' THEN '{' ELSE left(meta, -1) || ', ' END"
                f" || '\"{key}\": ' || CAST(? AS BIGINT) || '}}'")


def open_engine(where: str, *, synchronous: str = "FULL", lease: float | None = None) -> Engine:
    """The engine for a store: a PostgreSQL URL, or else a SQLite file path (``lease``: a
    fleet host's, for its connections' timeouts)."""
    if is_postgres(where):
        return PostgresEngine(where, lease=lease)
    return SQLiteEngine(where, synchronous=synchronous)
