"""A fleet: several daemons (hosts) on one PostgreSQL store, a lease per channel.

Theory of operation
-------------------

* **One owner per channel.** A host runs a channel's turns only while it holds the
  channel's row of ``leases``: its owner, an expiry on the database's clock, and a fencing
  token that grows with every new owner. :meth:`Fleet.acquire` takes a free or expired
  lease (or keeps its own) in one statement; placement is the caller's (a pinned channel
  is taken only by its host, see ``[channels.NAME] host``).
* **Heartbeat, one task, a deadline.** :meth:`Fleet.run` sleeps until the next renewal
  (every third of the lease) or the first local expiry, whichever is sooner: no busy loop,
  and it runs only on PostgreSQL (the SQLite default has no fleet and no wake-ups). A
  renewal is one transaction: the host's heartbeat, and each held lease's expiry, only
  where the token is still this host's.
* **Two ways to lose a lease, both acted on at once.** The local deadline (the monotonic
  clock at the renewal's start plus the lease: it keeps counting through a SIGSTOP) passes
  before a renewal succeeded; or a renewal finds the row taken. Either way ``on_lost`` is
  called synchronously, and the supervisor kills the channel's turns in the same step.
  Fencing makes a late write harmless anyway: every write of a turn carries the token
  its host held when the turn began (``Store.check_fence``).
* **Taking a dead host's channels.** Each heartbeat also asks for channels that have work
  (a queued message or a running turn) under an expired lease of another host; the
  supervisor takes those its placement allows (``on_orphans``). The next heartbeat comes
  no later than the moment the first such lease runs out, so a dead host's channels move
  within the lease plus one round trip (a live host renews every third of its lease, so
  this adds no wake-ups while every host answers).
* **Notices between hosts.** :meth:`Fleet.listen` keeps a connection of its own on
  ``LISTEN corral_fleet`` in a worker thread; :meth:`Fleet.notify` sends a JSON notice
  (delivered at its transaction's commit). A stop through a host that does not own the
  channel is one: the owner acknowledges at once, carries the stop out and answers with
  its result. A notice can be lost (a connection replaced): every waiter has a deadline,
  and a stop whose owner stays silent for the lease takes the lease by force
  (:meth:`Fleet.force`). Two more kinds go to every host: ``queued`` (a message row,
  below) and ``entries`` (the range of seqs a host's commit stored in a channel, which
  every other host reads back for its followers: see the store's theory of operation; each
  heartbeat also looks, for a notice lost while a listening connection was replaced).
* **The shared queue.** A message accepted by a host that does not own its channel stays
  in the store's queue; the transaction that inserts the row also sends a ``queued`` notice
  (delivered at its commit, so the row is there when it arrives). The owner — the host
  holding the lease, or the one the channel is pinned to — takes the channel's unknown rows
  up at once; a lost notice is made good by the owner's next heartbeat (the rows of its held
  channels it has never queued). Rows are not taken ``FOR UPDATE SKIP LOCKED``: only the
  lease holder runs a channel, and it dequeues a row in the commit that begins its turn,
  checked against its fencing token, so two hosts can never both begin one row; a row
  lock would add nothing the lease does not already give.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from ._engines import Engine
from ._store import FLEET_NOTICES, Store, StoreError

log = logging.getLogger("corral.fleet")

LOCK_NOT_AVAILABLE = "55P03"
"""PostgreSQL's SQLSTATE for a lock wait that hit ``lock_timeout``."""
TAKEOVER_ATTEMPTS = 10
"""A forced takeover waits 1 s per attempt for the lease row before ending stuck sessions."""

#: The ``LISTEN``/``NOTIFY`` channel of a fleet's notices between hosts.
NOTICES = FLEET_NOTICES


@dataclass(frozen=True, slots=True)
class Lease:
    """A channel's lease as this host holds it."""

    channel: str
    token: int


class Fleet:
    """This host's leases in a fleet; run :meth:`run` as the heartbeat task."""

    def __init__(
        self, store: Store, host: str, lease: float, *, on_lost: Callable[[str, str], None],
        on_orphans: Callable[[list[str], list[tuple[str, int]]], None] | None = None,
    ) -> None:
        self.store = store
        self.host = host
        self.lease = lease
        self._on_lost = on_lost
        self._on_orphans = on_orphans
        self._tokens: dict[str, int] = {}
        """Held leases: channel → fencing token."""
        self._until: dict[str, float] = {}
        """Each held lease's local deadline (``trio.current_time``)."""
        self._changed = trio.Event()
        self._acquiring: dict[str, list[trio.Event]] = {}
        """Acquisitions in flight, by channel: each event is set when its answer is in."""
        self.renewals = 0
        """Heartbeats that reached the database, each counted once its view of the fleet
        (``view``) is read (for tests and the benchmark)."""
        self.paused = False
        """(Tests) take and renew nothing, as a host cut off from the database."""
        self.view: list[dict[str, Any]] = []
        """Every host of the fleet as the last heartbeat read it (``status`` shows it)."""

    # ------------------------------------------------------------ leases

    def token(self, channel: str) -> int | None:
        """The fencing token of the channel's lease, if this host holds it."""
        return self._tokens.get(channel)

    def holds(self, channel: str) -> bool:
        """The lease is this host's and its local deadline has not passed (the point of no return asks)."""
        until = self._until.get(channel)
        return until is not None and trio.current_time() < until

    def held(self) -> dict[str, int]:
        """Every lease this host holds, with its token."""
        return dict(self._tokens)

    async def settled(self, channel: str) -> None:
        """Wait for this host's acquisitions of the channel's lease in flight: the database
        may already name this host the owner (another host just read so, and asks it to
        stop the channel) while the answer is on its way here."""
        for taken in list(self._acquiring.get(channel, ())):
            await taken.wait()

    async def force(self, channel: str) -> int:
        """Take the channel's lease whoever holds it (a stop its owner did not answer): a new
        token, so the last owner's writes fail from now on and it kills its turns when it
        next looks."""
        started = trio.current_time()
        host, lease = self.host, self.lease

        upsert = (
            "INSERT INTO leases (channel, owner, expires, token)"
            " VALUES (?, ?, {now} + ?, 1) ON CONFLICT (channel) DO UPDATE SET"
            " owner = excluded.owner, expires = excluded.expires, token = leases.token + 1 RETURNING token"
        )

        def take(db: Engine) -> tuple[int, int]:
            # The silent owner may be paused (SIGSTOP) inside a transaction that share-locks
            # the lease row (a fencing check): its session holds the lock for as long as it
            # lives, and the takeover would wait with it. Wait a moment, then end the sessions
            # stuck idle in a transaction on the leases table — the host is being fenced out
            # anyway, and its store reconnects (to find its lease gone) when it resumes.
            for attempt in range(TAKEOVER_ATTEMPTS):
                db.execute("SAVEPOINT take_lease")
                db.execute("SET LOCAL lock_timeout = '1s'")
                try:
                    ((token,),) = db.query(upsert.format(now=db.now), (channel, host, lease))
                    break
                except Exception as exc:
                    if getattr(exc, "sqlstate", None) != LOCK_NOT_AVAILABLE or attempt == TAKEOVER_ATTEMPTS - 1:
                        raise
                    db.execute("ROLLBACK TO SAVEPOINT take_lease")
                ended = db.query(
                    "SELECT a.pid, pg_terminate_backend(a.pid) FROM pg_locks l JOIN pg_stat_activity a"
                    " ON a.pid = l.pid WHERE l.relation = 'leases'::regclass AND l.granted"
                    " AND a.pid <> pg_backend_pid() AND a.state IN ('idle in transaction',"
                    " 'idle in transaction (aborted)') AND a.state_change < clock_timestamp() - interval '1 second'"
                )
                log.warning("host %s: ended %d database session(s) stuck holding the lease of %r",
                            host, len(ended), channel)
            ((newest,),) = db.query(
                "SELECT coalesce(max(m), 0) FROM (SELECT max(seq) m FROM entries UNION ALL SELECT max(seq) FROM stops"
                " UNION ALL SELECT max(seq) FROM queue) AS seqs"
            )
            return int(token), int(newest)

        token, newest = await self.store.transact(take)
        self.store.seq_floor(newest)
        self._tokens[channel] = token
        self._until[channel] = started + lease
        log.warning("host %s took channel %r by force (fencing token %d)", host, channel, token)
        self._changed.set()
        return token

    async def give_back(self, channel: str) -> None:
        """Let the channel's lease run out now (a pinned channel taken only for a stop)."""
        token = self._tokens.pop(channel, None)
        self._until.pop(channel, None)
        if token is None:
            return
        host = self.host

        def give(db: Engine) -> None:
            db.execute("UPDATE leases SET expires = 0 WHERE channel = ? AND owner = ? AND token = ?",
                       (channel, host, token))

        await self.store.transact(give)

    # ------------------------------------------------------------ notices between hosts

    async def notify(self, payload: str) -> None:
        """Send a notice to every host of the fleet (``NOTIFY``, delivered at the commit)."""
        def send(db: Engine) -> None:
            db.query("SELECT pg_notify(?, ?)", (NOTICES, payload))

        await self.store.transact(send)

    async def listen(
        self, deliver: Callable[[str], None], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Deliver every notice of the fleet to ``deliver`` (in Trio), until cancelled.

        A connection of its own waits in a worker thread; it wakes once a second to see
        whether it should end (PostgreSQL only: the fleet has no SQLite mode). A lost
        connection is replaced; notices sent meanwhile are lost, and every waiter has a
        deadline (a stop answers ``ok: false`` when its owner's answer does not come)."""
        token = trio.lowlevel.current_trio_token()
        closing = False

        def wait() -> None:
            import psycopg

            conn = None
            try:
                while not closing:
                    try:
                        if conn is None or conn.closed or conn.broken:
                            conn = self.store.listener()
                            conn.execute(f"LISTEN {NOTICES}")
                        for notice in conn.notifies(timeout=1.0):
                            trio.from_thread.run_sync(deliver, notice.payload, trio_token=token)
                    except psycopg.OperationalError as exc:
                        log.warning("host %s: the fleet's notices were cut off (%s); listening again", self.host, exc)
                        time.sleep(1.0)
            except trio.RunFinishedError:
                pass
            finally:
                if conn is not None:
                    conn.close()

        task_status.started()
        try:
            await trio.to_thread.run_sync(wait, abandon_on_cancel=True)
        finally:
            closing = True

    async def acquire(self, channel: str) -> int | None:
        """Take the channel's lease (free, expired, or already this host's); its token, or
        None if another host holds it. A new owner's token is the last one plus one, and the
        store's seqs move past every seq stored so far, in the same transaction."""
        if self.paused:
            return None
        taken = trio.Event()
        self._acquiring.setdefault(channel, []).append(taken)
        try:
            return await self._acquire(channel)
        finally:
            taken.set()
            waiting = self._acquiring[channel]
            waiting.remove(taken)
            if not waiting:
                del self._acquiring[channel]

    async def _acquire(self, channel: str) -> int | None:
        started = trio.current_time()
        host, lease = self.host, self.lease

        def take(db: Engine) -> tuple[int | None, int]:
            rows = db.query(
                "INSERT INTO leases (channel, owner, expires, token)"
                f" VALUES (?, ?, {db.now} + ?, 1) ON CONFLICT (channel) DO UPDATE SET"
                " owner = excluded.owner, expires = excluded.expires, token = CASE"
                f" WHEN leases.owner = excluded.owner AND leases.expires > {db.now} THEN leases.token"
                " ELSE leases.token + 1 END"
                f" WHERE leases.owner = excluded.owner OR leases.expires <= {db.now}"
                " RETURNING token",
                (channel, host, lease),
            )
            ((newest,),) = db.query(
                "SELECT coalesce(max(m), 0) FROM (SELECT max(seq) m FROM entries UNION ALL SELECT max(seq) FROM stops"
                " UNION ALL SELECT max(seq) FROM queue) AS seqs"
            )
            return (int(rows[0][0]) if rows else None), int(newest)

        token, newest = await self.store.transact(take)
        if token is None:
            return None
        self.store.seq_floor(newest)
        previous = self._tokens.get(channel)
        self._tokens[channel] = token
        self._until[channel] = started + lease
        if previous != token:
            log.info("host %s took channel %r (fencing token %d)", host, channel, token)
        self._changed.set()
        return token

    def _lose(self, channel: str, why: str) -> None:
        token = self._tokens.pop(channel, None)
        self._until.pop(channel, None)
        if token is not None:
            log.warning("host %s lost channel %r (token %d): %s", self.host, channel, token, why)
            self._on_lost(channel, why)

    async def release(self) -> None:
        """Give every lease back (a clean shutdown): other hosts may take them at once."""
        held, self._tokens, self._until = self._tokens, {}, {}
        if not held:
            return
        host = self.host

        def give(db: Engine) -> None:
            db.executemany(
                "UPDATE leases SET expires = 0 WHERE channel = ? AND owner = ? AND token = ?",
                [(c, host, t) for c, t in held.items()],
            )

        try:
            await self.store.transact(give)
        except StoreError as exc:
            log.warning("host %s could not give its leases back (they expire on their own): %s", host, exc)

    # ------------------------------------------------------------ the heartbeat

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew this host's heartbeat and leases every third of the lease; act on a lost lease."""
        task_status.started()
        renew_at = trio.current_time()
        while True:
            first_expiry = min(self._until.values(), default=math.inf)
            self._changed = trio.Event()
            with trio.move_on_at(min(renew_at, first_expiry)):
                await self._changed.wait()
                continue  # a lease was taken: its deadline may be the first now
            now = trio.current_time()
            for channel, until in list(self._until.items()):
                if until <= now:
                    self._lose(channel, f"its lease ran out ({self.lease:g} s) before it could be renewed")
            if now >= renew_at:
                renew_at = now + self.lease / 3
                if not self.paused:
                    soonest = await self.beat()
                    if soonest is not None:  # (a dead host's lease: look again the moment it runs out)
                        renew_at = min(renew_at, trio.current_time() + soonest + 0.01)

    async def beat(self) -> float | None:
        """One heartbeat: the host's row, every held lease whose token is still this host's,
        and the channels with work under another host's expired lease. Returns the seconds
        until another host's lease on a channel with work runs out (None: no such lease)."""
        started = trio.current_time()
        host, lease, held = self.host, self.lease, dict(self._tokens)

        def renew(db: Engine) -> tuple[set[tuple[str, int]], list[str], list[tuple[str, int]], float | None]:
            db.execute(f"UPDATE hosts SET heartbeat = {db.now} WHERE host = ?", (host,))
            kept = db.query(
                f"UPDATE leases SET expires = {db.now} + ? WHERE owner = ? AND channel = ANY(?)"
                " RETURNING channel, token",
                (lease, host, list(held)),
            )
            orphans = db.query(  # (work under no lease at all: queued through a host that may not run it)
                "SELECT q.channel FROM queue q LEFT JOIN leases l ON l.channel = q.channel"
                f" WHERE l.channel IS NULL OR (l.owner != ? AND l.expires <= {db.now})"
                " UNION SELECT t.channel FROM turns t JOIN leases l ON l.channel = t.channel"
                f" WHERE t.state = 'running' AND l.owner != ? AND l.expires <= {db.now}",
                (host, host),
            )
            queued = db.query("SELECT channel, seq FROM queue WHERE channel = ANY(?)", (list(held),))
            ((soonest,),) = db.query(
                f"SELECT min(l.expires) - {db.now} FROM leases l WHERE l.owner != ? AND l.expires > {db.now}"
                " AND (EXISTS (SELECT 1 FROM queue q WHERE q.channel = l.channel)"
                " OR EXISTS (SELECT 1 FROM turns t WHERE t.channel = l.channel AND t.state = 'running'))",
                (host,),
            )
            return ({(c, int(t)) for c, t in kept}, [c for (c,) in orphans], [(c, int(q)) for c, q in queued],
                    None if soonest is None else float(soonest))

        try:
            kept, orphans, queued, soonest = await self.store.transact(renew)
        except StoreError as exc:
            log.warning("host %s: heartbeat failed (%s); its leases run out unless the next one succeeds", host, exc)
            return None
        self.store.others_committed()  # (a notice of other hosts' entries lost in a reconnect: read them now)
        for channel, token in held.items():
            if self._tokens.get(channel) != token:
                continue  # (lost or taken anew while the heartbeat ran)
            if (channel, token) in kept:
                self._until[channel] = started + lease
            else:
                self._lose(channel, "another host holds its lease now")
        if (orphans or queued) and self._on_orphans is not None:
            self._on_orphans(orphans, queued)
        try:
            self.view = await self.hosts()
        except StoreError as exc:
            log.warning("host %s: could not read the fleet's hosts: %s", host, exc)
        self.renewals += 1  # (counted once its view of the fleet is in: status shows this beat's)
        return soonest

    async def hosts(self) -> list[dict[str, Any]]:
        """Every host of the fleet: its name, last heartbeat (database clock), age, and channels."""
        def read(db: Engine) -> tuple[float, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
            ((now,),) = db.query(f"SELECT {db.now}")
            hosts = db.query("SELECT host, heartbeat, pid, started FROM hosts ORDER BY host")
            leases = db.query("SELECT channel, owner, expires, token FROM leases ORDER BY channel")
            return float(now), hosts, leases

        now, hosts, leases = await self.store.transact(read)
        out = []
        for host, heartbeat, pid, started in hosts:
            out.append({
                "host": host, "heartbeat": heartbeat, "age": round(now - heartbeat, 3), "pid": pid, "started": started,
                "alive": now - heartbeat < self.lease,
                "channels": {c: {"token": t, "expired": e <= now} for c, o, e, t in leases if o == host},
            })
        return out
