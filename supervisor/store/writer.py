"""The store's writer: one task commits every accepted write, in batches (group commit).

Theory of operation
-------------------

What the store's theory of operation promises of writes is kept here (:mod:`.store`):

* A write is a :class:`Pending` the moment the store accepts it (its seq already final), queued
  in accept order. One task, :meth:`Writer.run`, takes everything queued as one batch and commits
  it in one transaction in the store's thread (:func:`commit_batch`); writes accepted meanwhile
  wait for the next batch. An idle writer sleeps on an event.
* **Saved before shown**: a batch's entries go to the store's feed (``shown``) only after their
  commit; a failed write's never do.
* **One bad write fails only itself**: a failed batch is tried again write by write, in order,
  unless the failure is the disk's or the connection's (:meth:`.Engine.fatal`): then every write
  left fails with it. A caller is told :func:`describe_failure`, never anyone's data; a failure
  whose kind callers act on (:class:`.Fenced`, :class:`.Dropped`) keeps its kind.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import replace

import trio

from ..core.notices import CHANNEL as FLEET_NOTICES
from ..core.records import Entry
from .engines import Engine, StoreError, describe_postgres, disk_failure, is_postgres_error
from .statements import Dropped, Fenced

log = logging.getLogger("corral.store")


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
    disk = disk_failure(exc)
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


def commit_batch(db: Engine, batch: list[Pending], host: str | None) -> None:
    """(In the store's thread) the batch's writes in one transaction (pipelined: :meth:`.Engine.batch`).

    In a fleet (``host``), the commit gives the batch's entries the positions after every entry
    committed so far, under a lock held to the commit's end: a commit that comes later has a
    greater position, so a reader that sees position P sees every position below it too.
    Every host is told how far the positions go."""
    db.begin()
    with db.rolling_back():
        placed = [p for p in batch if p.entry is not None] if host is not None else []
        with db.batch():
            for pending in batch:
                pending._apply(db)
        if not placed:
            db.commit()
            return
        entries = [p.entry for p in placed if p.entry is not None]
        top = db.commit_in_order([e.seq for e in entries], (FLEET_NOTICES, host or ""))
        for n, pending in enumerate(placed, start=1):
            assert pending.entry is not None
            pending.entry = replace(pending.entry, pos=top + n)


class Writer:
    """The one writer task of a store (``path``, as messages name it).

    ``commit`` commits a batch (in the store's thread, which ``thread`` runs a call in);
    ``fatal`` says whether a failure is the disk's or the connection's; ``shown`` takes the
    entries of each committed batch, in commit order."""

    def __init__(
        self, path: str, *, commit: Callable[[list[Pending]], None],
        thread: Callable[[Callable[[], None]], Awaitable[None]], fatal: Callable[[BaseException], str | None],
        shown: Callable[[list[Entry]], None],
    ) -> None:
        self.path = path
        self._commit, self._thread, self._fatal, self._shown = commit, thread, fatal, shown
        self.scope = trio.CancelScope(shield=True)
        """The writer's own scope: only :func:`~.store.open_store` ends it, after the last commit.
        Shielded, so a scope cancelled around the whole block (a ``move_on_after``, a Ctrl-C)
        cannot take the writer away from a shutdown that still awaits its commits."""
        self.pending: list[Pending] = []
        self.last: Pending | None = None
        """The newest accepted write: batches commit in order, so when it is done, all are.
        (``pending`` alone is not enough: the writer empties it when it takes a batch.)"""
        self._wake = trio.Event()
        self.commits = 0
        """Transactions committed so far (for tests and status)."""
        self.closed = False

    def submit(self, apply: Callable[[Engine], None], entry: Entry | None = None) -> Pending:
        """Accept a write (``apply``, run in its batch's transaction) for the next batch."""
        if self.closed:
            raise StoreError("the store is closed")
        pending = Pending(apply, entry)
        self.pending.append(pending)
        self.last = pending
        self._wake.set()
        return pending

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit queued writes in batches until :func:`~.store.open_store` ends it."""
        with self.scope:
            task_status.started()
            while True:
                if not self.pending:
                    self._wake = trio.Event()
                    await self._wake.wait()
                await self.commit_pending()

    async def drain(self) -> None:
        """Commit everything accepted so far (a shutdown's last batches)."""
        while self.pending:
            await self.commit_pending()

    async def commit_pending(self) -> None:
        """Commit what is queued now, as one batch (write by write if the batch fails)."""
        batch, self.pending = self.pending, []
        if not batch:
            return
        try:
            await self._thread(functools.partial(self._commit, batch))
        except Exception as exc:  # noqa: BLE001 - a failed batch is retried write by write
            log.log(_level(exc), "store commit of %d writes failed: %s", len(batch), describe_failure(exc, self.path))
            if len(batch) > 1 and self._fatal(exc) is None:
                await self._commit_one_by_one(batch)
            else:
                self.fail(batch, exc)
            return
        self.commits += 1
        self._succeed(batch)

    async def _commit_one_by_one(self, batch: list[Pending]) -> None:
        """Commit each write of a failed batch alone, in order, so only the bad ones fail."""
        for i, pending in enumerate(batch):
            try:
                await self._thread(functools.partial(self._commit, [pending]))
            except Exception as exc:  # noqa: BLE001 - this write fails, visibly, and alone
                log.log(_level(exc), "store write %d of a failed batch failed alone: %s", i + 1,
                        describe_failure(exc, self.path))
                if self._fatal(exc) is not None:
                    self.fail(batch[i:], exc)  # the disk or the link, not the write: the rest cannot go either
                    return
                self.fail([pending], exc)
            else:
                self.commits += 1
                self._succeed([pending])

    def _succeed(self, batch: list[Pending]) -> None:
        for pending in batch:
            pending._done.set()
        self._shown([p.entry for p in batch if p.entry is not None])

    def fail(self, batch: list[Pending], exc: BaseException) -> None:
        """Fail every write of ``batch`` with ``exc`` (described: no data of anyone's)."""
        reason = describe_failure(exc, self.path)
        for pending in batch:
            pending._error = _kind(exc)(reason)
            pending._done.set()

    async def flush(self) -> None:
        """Wait until everything accepted so far is committed (failures are not raised here)."""
        if self.last is not None:
            await self.last._done.wait()
