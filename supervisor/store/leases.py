"""The fleet's statements: the ``hosts`` and ``leases`` tables, a heartbeat, the notices.

Theory of operation
-------------------

The store's SQL, for the fleet (:mod:`supervisor.fleet.fleet`). Each method is one transaction's
work, synchronous, on the engine it is given: the fleet runs it on a connection of its own under
a deadline (:class:`~supervisor.fleet.fleet.Link`), never in the store's thread or behind its
commits, and decides what the answers mean. So what is here is *what* is asked of the database
and how a row lock is waited for; *when*, and for how long, is the fleet's.

* **Lock waits are bounded.** A lease statement waits at most a quarter of the lease for a row
  lock (``lock_timeout``). A lock held longer than that by a session idle in a transaction is a
  cut-off or paused host's half-done transaction: once the lease it fences has run out, its
  sessions are ended (:func:`end_stuck`) and the statement is tried again.
* **A new owner moves the seqs on.** Taking a lease reads the greatest seq stored so far in the
  same transaction (:func:`~supervisor.store.statements.newest_seq`): the taker's seqs follow every
  seq the last owner stored.
* **A heartbeat is ONE round trip** (:meth:`Leases.beat`): its statements go to the server
  pipelined, with their ``BEGIN`` and ``COMMIT``, and their answers are read together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..core.notices import CHANNEL, Beat
from .engines import Engine, PostgresEngine
from .statements import NOTIFY, newest_seq

log = logging.getLogger("corral.fleet")

LOCK_NOT_AVAILABLE = "55P03"
"""PostgreSQL's SQLSTATE for a lock wait that hit ``lock_timeout``."""
TAKEOVER_ATTEMPTS = 10
"""A forced takeover waits 1 s per attempt for the lease row before ending stuck sessions."""

#: A lease taken: free, expired, or already this host's (then its token is kept).
_TAKE = (
    "INSERT INTO leases (channel, owner, expires, token)"
    " VALUES (?, ?, {now} + ?, 1) ON CONFLICT (channel) DO UPDATE SET"
    " owner = excluded.owner, expires = excluded.expires, token = CASE"
    " WHEN leases.owner = excluded.owner AND leases.expires > {now} THEN leases.token"
    " ELSE leases.token + 1 END"
    " WHERE leases.owner = excluded.owner OR leases.expires <= {now}"
    " RETURNING token"
)
#: A lease taken whoever holds it: always a new token.
_FORCE = (
    "INSERT INTO leases (channel, owner, expires, token)"
    " VALUES (?, ?, {now} + ?, 1) ON CONFLICT (channel) DO UPDATE SET"
    " owner = excluded.owner, expires = excluded.expires, token = leases.token + 1 RETURNING token"
)
#: A lease given back (it runs out now), if it is still the host's with the token.
_GIVE_BACK = "UPDATE leases SET expires = 0 WHERE channel = ? AND owner = ? AND token = ?"
_HOSTS = "SELECT host, heartbeat, pid, started, room FROM hosts ORDER BY host"
_LEASES = "SELECT channel, owner, expires, token FROM leases ORDER BY channel"


def end_stuck(db: Engine, host: str, channel: str, idle: float) -> None:
    """(In a lease transaction) end the database sessions idle in a transaction for ``idle``
    seconds while holding a lock on the leases table: a paused or cut-off host's, which would
    hold a taker up for as long as it lives (its store reconnects, to find its lease gone)."""
    ended = db.query(
        "SELECT a.pid, pg_terminate_backend(a.pid) FROM pg_locks l JOIN pg_stat_activity a"
        " ON a.pid = l.pid WHERE l.relation = 'leases'::regclass AND l.granted"
        " AND a.pid <> pg_backend_pid() AND a.state IN ('idle in transaction',"
        " 'idle in transaction (aborted)') AND a.state_change < clock_timestamp() - ? * interval '1 second'",
        (idle,),
    )
    log.warning("host %s: ended %d database session(s) stuck holding the lease of %r", host, len(ended), channel)


@dataclass(frozen=True, slots=True)
class Renewal:
    """What one heartbeat read, in its own transaction."""

    kept: frozenset[tuple[str, int]]
    """The held leases renewed: (channel, token) of each whose token was still this host's."""
    orphans: tuple[str, ...]
    """Channels with work (a queued message, a running turn) under no lease, or under an
    expired lease this host does not hold."""
    queued: tuple[tuple[str, int], ...]
    """(channel, seq) of every queued message of a channel this host holds."""
    soonest: float | None
    """Seconds until another host's lease on a channel with work runs out (None: none)."""
    now: float
    """The database's clock."""
    hosts: list[tuple[Any, ...]]
    """Every host's row: host, heartbeat, pid, started, room (free slots less waiting turns)."""
    leases: list[tuple[Any, ...]]
    """Every lease's row: channel, owner, expires, token."""


class Leases:
    """The statements of one fleet host (``host``, holding its leases for ``lease`` seconds)."""

    def __init__(self, host: str, lease: float) -> None:
        self.host = host
        self.lease = lease
        self._lock_ms = max(100, int(lease * 250))
        """A quarter of the lease, in milliseconds: the longest wait for a row lock."""

    def _lock_wait(self, db: Engine) -> None:
        """(In a lease transaction) wait at most a quarter of the lease for a row lock."""
        db.execute(f"SET LOCAL lock_timeout = {self._lock_ms}")

    def take(self, db: Engine, channel: str) -> tuple[int | None, int]:
        """Take the channel's lease (free, expired, or already this host's): its token (None:
        another host holds it), and the greatest seq stored so far."""
        # A row lock held past a quarter of the lease is a cut-off host's half-done
        # transaction (a fencing read): the server ends a session idle in a transaction for
        # half the lease, but not one left so after a pipelined batch (PostgreSQL arms that
        # timeout only after a Sync that no Flush followed). If the lease has run out, the
        # holder is fenced out anyway: end its stuck sessions and try once more.
        for attempt in range(2):
            db.execute("SAVEPOINT take_lease")
            self._lock_wait(db)
            try:
                rows = db.query(_TAKE.format(now=db.now), (channel, self.host, self.lease))
                break
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                db.execute("ROLLBACK TO SAVEPOINT take_lease")
            expired = db.query(f"SELECT 1 FROM leases WHERE channel = ? AND expires <= {db.now}", (channel,))
            if attempt or not expired:
                return None, 0  # (held: not this host's now; the next heartbeat looks again)
            end_stuck(db, self.host, channel, self.lease / 2)
        return (int(rows[0][0]) if rows else None), newest_seq(db)

    def force(self, db: Engine, channel: str) -> tuple[int, int, float]:
        """Take the channel's lease whoever holds it: its new token, the greatest seq stored so
        far, and the seconds the last owner's lease had left (0: none, or this host's)."""
        # The silent owner may be paused (SIGSTOP) inside a transaction that share-locks
        # the lease row (a fencing check): its session holds the lock for as long as it
        # lives, and the takeover would wait with it. Wait a moment, then end the sessions
        # stuck idle in a transaction on the leases table — the host is being fenced out
        # anyway, and its store reconnects (to find its lease gone) when it resumes.
        for attempt in range(TAKEOVER_ATTEMPTS):
            db.execute("SAVEPOINT take_lease")
            db.execute("SET LOCAL lock_timeout = '1s'")
            try:
                old = db.query(f"SELECT owner, expires - {db.now} FROM leases WHERE channel = ? FOR UPDATE",
                               (channel,))
                ((token,),) = db.query(_FORCE.format(now=db.now), (channel, self.host, self.lease))
                break
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != LOCK_NOT_AVAILABLE or attempt == TAKEOVER_ATTEMPTS - 1:
                    raise
                db.execute("ROLLBACK TO SAVEPOINT take_lease")
            end_stuck(db, self.host, channel, 1.0)
        left = float(old[0][1]) if old and old[0][0] != self.host else 0.0
        return int(token), newest_seq(db), left

    def give_back(self, db: Engine, channel: str, token: int) -> None:
        """Let the channel's lease run out now, if it is still this host's with ``token``."""
        self._lock_wait(db)
        db.execute(_GIVE_BACK, (channel, self.host, token))

    def give_back_all(self, db: Engine, held: dict[str, int]) -> None:
        """Let every lease of ``held`` (channel → token) run out now (a clean shutdown)."""
        db.executemany(_GIVE_BACK, [(c, self.host, t) for c, t in held.items()])

    def beat(self, db: Engine, held: list[str], room: int | None = None) -> Renewal:
        """(A transaction of its own: it begins and commits it) one heartbeat as ONE round trip:
        the host's row, every held lease whose token is still this host's, the channels with
        work under an expired lease not held here, the queued messages of the held ones, the
        fleet's view, and a ``beat`` notice."""
        assert isinstance(db, PostgresEngine)
        now, channels = db.now, held
        answers = db.pipelined([
            ("BEGIN", ()),
            (f"SET LOCAL lock_timeout = {self._lock_ms}", ()),
            (f"UPDATE hosts SET heartbeat = {now}, room = ? WHERE host = ?", (room, self.host)),
            (f"UPDATE leases SET expires = {now} + ? WHERE owner = ? AND channel = ANY(?) RETURNING channel, token",
             (self.lease, self.host, channels)),
            (  # (work under no lease at all: queued through a host that may not run it; or under
               # an expired lease this host does not hold, its own included: a host that gave a
               # channel up while cut off takes it again when nobody else did)
                "SELECT q.channel FROM queue q LEFT JOIN leases l ON l.channel = q.channel"
                f" WHERE l.channel IS NULL OR (l.expires <= {now} AND l.channel <> ALL(?))"
                " UNION SELECT t.channel FROM turns t JOIN leases l ON l.channel = t.channel"
                f" WHERE t.state = 'running' AND l.expires <= {now} AND l.channel <> ALL(?)",
                (channels, channels),
            ),
            ("SELECT channel, seq FROM queue WHERE channel = ANY(?)", (channels,)),
            (f"SELECT min(l.expires) - {now} FROM leases l WHERE l.owner != ? AND l.expires > {now}"
             " AND (EXISTS (SELECT 1 FROM queue q WHERE q.channel = l.channel)"
             " OR EXISTS (SELECT 1 FROM turns t WHERE t.channel = l.channel AND t.state = 'running'))", (self.host,)),
            (f"SELECT {now}", ()),
            (_HOSTS, ()),
            (_LEASES, ()),
            (NOTIFY, (CHANNEL, Beat(self.host).encode())),
            ("COMMIT", ()),
        ])
        ((soonest,),), ((now_value,),) = answers[6], answers[7]
        return Renewal(
            kept=frozenset((c, int(t)) for c, t in answers[3]),
            orphans=tuple(c for (c,) in answers[4]),
            queued=tuple((c, int(q)) for c, q in answers[5]),
            soonest=None if soonest is None else float(soonest),
            now=float(now_value),
            hosts=answers[8],
            leases=answers[9],
        )

    @staticmethod
    def view(db: Engine) -> tuple[float, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The database's clock, every host's row and every lease's (as :class:`Renewal` has them)."""
        ((now,),) = db.query(f"SELECT {db.now}")
        return float(now), db.query(_HOSTS), db.query(_LEASES)
