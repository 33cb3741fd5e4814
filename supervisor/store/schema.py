"""The store's schema and its migrations, in SQLite's dialect (an engine maps the column types).

Theory of operation
-------------------

``_SCHEMA`` is the first version; ``_MIGRATIONS[i]`` takes a store from version i to i + 1,
each in one transaction at open (:func:`migrate`, under the engine's migration lock, so
openers never race), recorded as a row of ``schema_migrations`` (SQLite stores that kept it
in ``PRAGMA user_version`` are carried over). Never edit one that has shipped: add the next.
"""

from __future__ import annotations

import time

from .engines import Engine

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, author TEXT NOT NULL, kind TEXT NOT NULL,
    text TEXT NOT NULL, turn TEXT, generation INTEGER NOT NULL, ts REAL NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS entries_by_channel ON entries(channel, seq);
CREATE TABLE IF NOT EXISTS stops (
    seq INTEGER PRIMARY KEY, channel TEXT, generation INTEGER NOT NULL, ts REAL NOT NULL,
    result TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS generations (channel TEXT PRIMARY KEY, generation INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    channel TEXT NOT NULL, agent TEXT NOT NULL, session_id TEXT, cwd TEXT NOT NULL,
    updated REAL NOT NULL, PRIMARY KEY (channel, agent));
CREATE TABLE IF NOT EXISTS todos (
    channel TEXT NOT NULL, agent TEXT NOT NULL, items TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (channel, agent));
CREATE TABLE IF NOT EXISTS queue (
    seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, agent TEXT NOT NULL, author TEXT NOT NULL,
    text TEXT NOT NULL, generation INTEGER NOT NULL, nudge INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS turns (
    id TEXT PRIMARY KEY, channel TEXT NOT NULL, agent TEXT NOT NULL, generation INTEGER NOT NULL,
    message INTEGER, pid INTEGER, pid_started INTEGER, state TEXT NOT NULL, began REAL NOT NULL);
CREATE INDEX IF NOT EXISTS turns_by_state ON turns(state);
"""

_MIGRATIONS: tuple[str, ...] = (
    # 1: several agents per channel. A queued message's hand-off hops and source entry;
    # the channel's routing rest and repeat window; the last message each agent answered.
    """
    ALTER TABLE queue ADD COLUMN hops INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE queue ADD COLUMN routed_from INTEGER;
    ALTER TABLE generations ADD COLUMN rests INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE generations ADD COLUMN stopped INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE IF NOT EXISTS seen (
        channel TEXT NOT NULL, agent TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (channel, agent));
    """,
    # 2: a fleet. Every host of one database, its seq slot and last heartbeat (database
    # clock); each channel's lease: its owner, until when, and the fencing token.
    """
    CREATE TABLE IF NOT EXISTS hosts (
        host TEXT PRIMARY KEY, slot INTEGER NOT NULL UNIQUE, heartbeat REAL NOT NULL, pid INTEGER NOT NULL,
        started REAL NOT NULL);
    CREATE TABLE IF NOT EXISTS leases (
        channel TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL, token INTEGER NOT NULL);
    ALTER TABLE turns ADD COLUMN host TEXT;
    ALTER TABLE stops ADD COLUMN host TEXT;
    """,
    # 3: a fleet's commit order. An entry's place among every host's commits (assigned in
    # its commit, under one lock): what followers and resume points go by in a fleet.
    """
    ALTER TABLE entries ADD COLUMN pos INTEGER;
    CREATE INDEX IF NOT EXISTS entries_pos ON entries (pos);
    """,
    # 4: chat bridges. Every outside event a bridge has acted on (its origin, e.g. a Matrix
    # event id), with the seq of the message it was accepted as (NULL: a command, or ignored),
    # written in the message's own transaction: an event replayed by a sync, a reconnect or a
    # restart is found here and runs at most once. A bridge's cursors live in ``meta``.
    """
    CREATE TABLE IF NOT EXISTS origins (origin TEXT PRIMARY KEY, seq INTEGER, ts REAL NOT NULL);
    """,
    # 5: a fleet places by capacity. Each host's room at its last heartbeat: free slots less
    # the turns waiting for one (negative: more waits than fits; NULL: not said).
    """
    ALTER TABLE hosts ADD COLUMN room INTEGER;
    """,
    # 6: a message accepted by a fleet host that does not run its channel, asking to interrupt
    # or steer the running turn: its delivery, for the owner to carry out as it takes it up
    # (NULL: queued, or already carried out).
    """
    ALTER TABLE queue ADD COLUMN delivery TEXT;
    """,
    # 7: what each turn spent (issue 36), written when it ends, stopped or not: its tokens
    # (fresh input, output, cache read and write), tool calls started, wall time, its cost
    # (a decimal's text, in ``currency``; NULL: not known) and the UTC day it ended on, which
    # ``corral usage`` and the daily sums go by. ``budget``: the budget that stopped it.
    """
    CREATE TABLE IF NOT EXISTS turn_usage (
        turn TEXT PRIMARY KEY, channel TEXT NOT NULL, agent TEXT NOT NULL, day TEXT NOT NULL,
        ended REAL NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
        cache_read_tokens INTEGER NOT NULL, cache_write_tokens INTEGER NOT NULL, tool_calls INTEGER NOT NULL,
        wall_seconds REAL, cost TEXT, currency TEXT, models TEXT NOT NULL DEFAULT '[]', budget TEXT);
    CREATE INDEX IF NOT EXISTS turn_usage_by_day ON turn_usage (day, channel, agent);
    """,
    # 8: the queue in people's hands. A message moved to the front of its lane: its place
    # (below every seq of the lane; NULL: its seq is its place), so the order survives a restart.
    """
    ALTER TABLE queue ADD COLUMN place INTEGER;
    """,
)

_VERSIONS = "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied REAL NOT NULL)"


def _statements(script: str) -> list[str]:
    return [s for s in script.split(";") if s.strip()]


def _version(db: Engine) -> int:
    ((version,),) = db.query("SELECT coalesce(max(version), 0) FROM schema_migrations")
    return int(version)


def migrate(db: Engine) -> None:
    """Create the first schema if missing, then bring it up to date, one version per
    transaction (each under the engine's migration lock, so openers never race)."""
    with db.transaction(schema=True):
        for statement in [*_statements(_SCHEMA), _VERSIONS]:
            db.execute(db.ddl(statement))
        if _version(db) == 0:  # (a store from before the table: its version is carried over)
            db.executemany("INSERT INTO schema_migrations (version, applied) VALUES (?, ?)",
                           [(n, time.time()) for n in range(1, db.legacy_version() + 1)])
    for number in range(len(_MIGRATIONS)):
        with db.transaction(schema=True):
            if _version(db) == number:
                for statement in _statements(_MIGRATIONS[number]):
                    db.execute(db.ddl(statement))
                db.execute("INSERT INTO schema_migrations (version, applied) VALUES (?, ?)", (number + 1, time.time()))
