"""The store's one connection and the one thread that uses it.

Theory of operation
-------------------

Reads and writes share one connection (:class:`~.engines.Engine`), serialised by a capacity
limiter of one worker thread: the writer's batches (:mod:`.writer`), the reads, and the
transactions that must not wait behind a batch (:meth:`Connection.transact`: a fleet's lease
work on this connection). A read's PostgreSQL failure is a :class:`~.engines.StoreError` naming
the store, as a failed write's is. A fleet host also opens connections of its own here: one that
listens to the fleet's notices, one per lease call (:meth:`Connection.sibling`); and its
heartbeat watches this one: a call that has had no answer for too long (a cut cable) has its
connection shut down, so it fails visibly and the next call reconnects (:meth:`Connection.unstick`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from ..core.notices import CHANNEL as FLEET_NOTICES
from .engines import Engine, PostgresEngine, StoreError, is_postgres_error
from .writer import describe_failure

log = logging.getLogger("corral.store")
T = TypeVar("T")


class Connection:
    """The store's connection ``db`` (``path``: what messages call the store) and its thread."""

    def __init__(self, db: Engine, path: str) -> None:
        self.db, self.path = db, path
        self._limiter = trio.CapacityLimiter(1)
        self._busy_since: float | None = None
        """(Monotonic) when the store's thread began the call it is in, if it is in one."""

    def _timed(self, call: Callable[[], T]) -> T:
        """(In the store's thread) ``call``, with its start kept for :meth:`unstick`."""
        self._busy_since = time.monotonic()
        try:
            return call()
        finally:
            self._busy_since = None

    async def run(self, call: Callable[[], None]) -> None:
        """Run ``call`` in the store's thread (the writer's batches: their failures are its own)."""
        await trio.to_thread.run_sync(self._timed, call, limiter=self._limiter)

    async def read(self, read: Callable[[], T]) -> T:
        """Run ``read`` in the store's thread; a PostgreSQL failure (the server gone, say) is a
        :class:`StoreError` naming the store, like a failed write's."""
        try:
            return await trio.to_thread.run_sync(self._timed, read, limiter=self._limiter)
        except Exception as exc:
            if not is_postgres_error(exc):
                raise
            raise StoreError(f"could not read the store: {describe_failure(exc, self.path)}") from exc

    async def transact(self, work: Callable[[Engine], T]) -> T:
        """Run ``work`` in a transaction of its own now, in the store's thread."""
        def run() -> T:
            with self.db.transaction():
                return work(self.db)

        return await self.read(run)

    def listener(self) -> Any:
        """(A fleet, in a worker thread) a new PostgreSQL connection that listens to the fleet's
        notices (``LISTEN``), or None on SQLite."""
        if not isinstance(self.db, PostgresEngine):
            return None
        conn = self.db.listener()
        try:
            conn.execute(f"LISTEN {FLEET_NOTICES}")
        except BaseException:
            conn.close()
            raise
        return conn

    def sibling(self) -> PostgresEngine:
        """(A fleet, in a worker thread) a new connection of the store's database for lease
        work, without the owner lock: the heartbeat never waits behind the store's thread."""
        if not isinstance(self.db, PostgresEngine):
            raise StoreError(f"{self.db.kind} stores have no fleet")
        return self.db.sibling()

    def unstick(self, stall: float) -> bool:
        """(A fleet's heartbeat) if the store's thread has been in one call for ``stall``
        seconds (its connection silent: a cut cable), shut that connection down: the call
        fails as a lost connection (its writes fail visibly) and the next one reconnects.
        True if it did."""
        since = self._busy_since
        if since is None or time.monotonic() - since < stall or not isinstance(self.db, PostgresEngine):
            return False
        log.warning("store %s: a database call has had no answer for %.1f s; abandoning its connection",
                    self.path, time.monotonic() - since)
        self.db.interrupt()
        return True

    def reachable(self) -> None:
        """(A fleet's heartbeat got through) a connection abandoned as silent is replaced at
        the next call, not after the pause (see :meth:`PostgresEngine._alive`)."""
        if isinstance(self.db, PostgresEngine):
            self.db.reachable()
