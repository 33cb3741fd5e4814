"""What the store asks of the database: one plain function per statement or transaction's work.

Theory of operation
-------------------

Every SQL statement of the store (but the fleet's leases and heartbeat, :mod:`.leases`, and the
schema, :mod:`.schema`) is written here once, in SQLite's dialect, as a synchronous function of
the :class:`~.engines.Engine` it is given: what to ask and what the rows mean. *When* to ask,
in which transaction and in which thread, is the caller's — the writer's batch
(:mod:`.writer`) for writes, the store's one thread for reads (:class:`~.store.Store`). A write
made for a turn in a fleet is fenced by :func:`check_fence` in its own transaction; a
message's begin in a fleet fails with :class:`Dropped` when its queue row is gone.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from ..core.notices import CHANNEL as FLEET_NOTICES
from ..core.notices import Notice
from ..core.records import ChannelState, Entry, QueuedRow, StopRecord, TakeOver
from ..core.usage import TurnRecord
from .engines import LOCK_SPACE, ORDER_LOCK, Engine, StoreError

#: A turn row's states: ``running`` until it ends; ``stopped`` once a stop's record names it
#: (the stop's notice then ends it); ``ended``.
TURN_RUNNING, TURN_STOPPED, TURN_ENDED = "running", "stopped", "ended"

#: How many hosts one database can hold: a host of slot ``k`` takes only the seqs
#: ``n * SEQ_STRIDE + k`` (seqs stay unique without asking the database for each one).
SEQ_STRIDE = 64
#: The advisory lock (second key) a host takes to pick its seq slot.
_SLOT_LOCK = 1

#: A notice to every host of a fleet (PostgreSQL's ``NOTIFY``, delivered at the commit).
NOTIFY = "SELECT pg_notify(?, ?)"

_COLUMNS = "seq, channel, author, kind, text, turn, generation, ts, meta, pos"
"""An entry's columns, in :func:`_entry`'s order."""
_QUEUED = "seq, channel, agent, author, text, generation, nudge, hops, routed_from, delivery"
"""A queue row's columns, in :func:`_queued`'s order (and :class:`QueuedRow`'s)."""
_DEQUEUE = "DELETE FROM queue WHERE seq = ?"
_TODOS = (
    "INSERT INTO todos (channel, agent, items, updated) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(channel, agent) DO UPDATE SET items=excluded.items, updated=excluded.updated"
)


class Fenced(StoreError):
    """A write for a channel whose lease this host no longer holds (its fencing token is stale)."""


class Dropped(StoreError):
    """(A fleet) a turn's message is no longer queued in the store: a stop dropped it (stored
    by this host while the row was being taken up, or by another host), so the turn must not begin."""


def _entry(row: tuple[Any, ...]) -> Entry:
    seq, channel, author, kind, text, turn, generation, ts, meta, pos = row
    return Entry(seq, channel, author, kind, text, turn, generation, ts, json.loads(meta), pos)


def _queued(row: tuple[Any, ...]) -> QueuedRow:
    return QueuedRow(row[0], row[1], row[2], row[3], row[4], row[5], bool(row[6]), row[7], row[8], row[9], row[10])


# ---------------------------------------------------------------- the seq clock and the fleet's order


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


def register_host(db: Engine, host: str, store: str) -> int:
    """(A transaction) this host's row and seq slot: its own if it has one, else the lowest free."""
    db.execute("SELECT pg_advisory_xact_lock(?, ?)", (LOCK_SPACE, _SLOT_LOCK))
    mine = db.query("SELECT slot FROM hosts WHERE host = ?", (host,))
    taken = {k for (k,) in db.query("SELECT slot FROM hosts")}
    slot = int(mine[0][0]) if mine else next((k for k in range(SEQ_STRIDE) if k not in taken), -1)
    if slot < 0:
        raise StoreError(f"the store {store} already has {SEQ_STRIDE} fleet hosts; remove the rows of "
                         "hosts gone for good from its hosts table")
    db.execute(
        f"INSERT INTO hosts (host, slot, heartbeat, pid, started) VALUES (?, ?, {db.now}, ?, {db.now})"
        f" ON CONFLICT (host) DO UPDATE SET heartbeat = {db.now}, pid = excluded.pid, started = {db.now}",
        (host, slot, os.getpid()),
    )
    return slot


def place_unplaced(db: Engine) -> int:
    """(A transaction; a fleet host, at open) entries stored before the store was a fleet's (by
    a single daemon, in seq order = commit order) take their seq as their position, once; the
    position every entry committed so far is at or below."""
    db.execute("SELECT pg_advisory_xact_lock(?, ?)", (LOCK_SPACE, ORDER_LOCK))
    db.execute("UPDATE entries SET pos = seq WHERE pos IS NULL")
    return top_position(db)


def top_position(db: Engine) -> int:
    """(A fleet) the greatest commit position so far (0: none)."""
    ((top,),) = db.query("SELECT coalesce(max(pos), 0) FROM entries")
    return int(top)


def check_fence(db: Engine, channel: str, host: str, token: int) -> None:
    """(In a transaction) raise :class:`Fenced` unless ``host`` still holds ``channel``'s
    lease with ``token``; the row stays share-locked until the commit, so a taker waits."""
    rows = db.query("SELECT owner, token FROM leases WHERE channel = ? FOR SHARE", (channel,))
    if not rows or rows[0][0] != host or int(rows[0][1]) != token:
        owner = rows[0][0] if rows else "nobody"
        raise Fenced(f"host {host} no longer holds channel {channel!r} (fencing token {token} is stale;"
                     f" the lease is {owner}'s)")


def store_id(db: Engine) -> str:
    """The store's identity, made at its first open (``meta.store_id``)."""
    db.execute("INSERT INTO meta (key, value) VALUES ('store_id', ?) ON CONFLICT (key) DO NOTHING",
               (secrets.token_hex(8),))
    return str(db.query("SELECT value FROM meta WHERE key = 'store_id'")[0][0])


# ---------------------------------------------------------------- the transcript


def insert_entry(db: Engine, entry: Entry) -> None:
    """(In a transaction) store a transcript entry (its meta as JSON)."""
    db.execute(
        "INSERT INTO entries (seq, channel, author, kind, text, turn, generation, ts, meta)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (entry.seq, entry.channel, entry.author, entry.kind, entry.text, entry.turn, entry.generation, entry.ts,
         json.dumps(entry.meta, ensure_ascii=False)),
    )


def entries(db: Engine, channel: str | None, column: str, after: int, limit: int, newest: bool = False) -> list[Entry]:
    """Entries (of ``channel``, or all) whose ``column`` (``seq``, or a fleet's ``pos``) is past
    ``after``, oldest first; at most ``limit``: the first ones, or with ``newest`` the last ones."""
    where, params = (f"{column} > ?", (after,)) if channel is None else (
        f"channel = ? AND {column} > ?", (channel, after))
    order = f"{column} DESC" if newest else column
    rows = db.query(f"SELECT {_COLUMNS} FROM entries WHERE {where} ORDER BY {order} LIMIT ?", (*params, limit))
    return [_entry(row) for row in (reversed(rows) if newest else rows)]


def entry(db: Engine, seq: int) -> Entry | None:
    """The entry ``seq`` (None: none)."""
    rows = db.query(f"SELECT {_COLUMNS} FROM entries WHERE seq = ?", (seq,))
    return _entry(rows[0]) if rows else None


def placed_after(db: Engine, after: int, limit: int) -> list[Entry]:
    """(A fleet) every host's entries past commit position ``after``, in commit order, at most ``limit``."""
    return [_entry(row) for row in db.query(
        f"SELECT {_COLUMNS} FROM entries WHERE pos > ? ORDER BY pos LIMIT ?", (after, limit)
    )]


def position(db: Engine, after: int) -> int:
    """(A fleet) the commit position of entry ``after``; for a seq that names no entry, the last
    position of an entry with a seq at or below it."""
    if after <= 0:
        return 0
    found = db.query("SELECT pos FROM entries WHERE seq = ?", (after,))
    if found and found[0][0] is not None:
        return int(found[0][0])
    ((pos,),) = db.query("SELECT coalesce(max(pos), 0) FROM entries WHERE seq <= ?", (after,))
    return int(pos)


def has_entries(db: Engine, channel: str) -> bool:
    """Whether any entry of ``channel`` is stored."""
    return bool(db.query("SELECT 1 FROM entries WHERE channel = ? LIMIT 1", (channel,)))


def channels(db: Engine) -> set[str]:
    """Every channel with a stored entry."""
    return {name for (name,) in db.query("SELECT DISTINCT channel FROM entries")}


def last_seq(db: Engine) -> int:
    """The seq of the newest entry (0: none)."""
    ((newest,),) = db.query("SELECT coalesce(max(seq), 0) FROM entries")
    return int(newest)


def mark_resent(db: Engine, seq: int, meta: Mapping[str, Any], resent_as: int) -> None:
    """(In the new message's transaction) entry ``seq`` was sent again as ``resent_as``."""
    db.execute("UPDATE entries SET meta = ? WHERE seq = ?",
               (json.dumps({**meta, "resent_as": resent_as}, ensure_ascii=False), seq))


def missed(
    db: Engine, channel: str, agent: str, *, after: int | None, before: int, skip: int | None, limit: int
) -> tuple[list[tuple[str, str]], int]:
    """The channel's ``message`` entries the agent has not seen (see :meth:`.Store.missed`): the
    newest ``limit`` of them (author, text), oldest first, and how many there are in all."""
    where = (
        "channel = ? AND kind = 'message' AND seq > ? AND seq < ? AND seq != ? AND author != ?"
        " AND (author LIKE 'human:%' OR author LIKE 'agent:%')"
        f" AND {db.json_get('meta', 'dropped_by_stop')} IS NULL"
        f" AND {db.json_get('meta', 'taken_back')} IS NULL"  # (its author took it back: never meant)
        # Still waiting for this agent (behind one moved first): its own turn answers it.
        " AND seq NOT IN (SELECT coalesce(q.routed_from, q.seq) FROM queue q WHERE q.channel = ? AND q.agent = ?)"
        # A message steered into this agent's turn reached it then: not again.
        f" AND ({db.json_get('meta', 'steered')} IS NULL OR {db.json_get('meta', 'agent')} != ?)"
    )
    params = (
        channel, after if after is not None else 0, before, skip if skip is not None else -1, f"agent:{agent}",
        channel, agent, agent,
    )
    ((total,),) = db.query(f"SELECT count(*) FROM entries WHERE {where}", params)
    rows = db.query(f"SELECT author, text FROM entries WHERE {where} ORDER BY seq DESC LIMIT ?", (*params, limit))
    return [(a, t) for a, t in reversed(rows)], int(total)


# ---------------------------------------------------------------- the queue


def insert_queued(db: Engine, row: QueuedRow) -> None:
    """(In a transaction) keep an accepted message until its turn begins."""
    db.execute(
        f"INSERT INTO queue ({_QUEUED}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (row.seq, row.channel, row.agent, row.author, row.text, row.generation, int(row.nudge), row.hops,
         row.routed_from, row.delivery),
    )


def queued(db: Engine, channel: str | None = None) -> list[QueuedRow]:
    """The queue (of ``channel``, or all), oldest first."""
    where, params = ("WHERE channel = ?", (channel,)) if channel is not None else ("", ())
    # A message moved first has a ``place`` below every seq of its lane; the others keep their seq's.
    ts = "(SELECT e.ts FROM entries e WHERE e.seq = coalesce(queue.routed_from, queue.seq))"
    rows = db.query(f"SELECT {_QUEUED}, {ts} FROM queue {where} ORDER BY coalesce(place, seq), seq", params)
    return [_queued(r) for r in rows]


def take_back(db: Engine, record: int, entry: int, seqs: Sequence[int]) -> None:
    """(In the record's transaction) the queued messages ``seqs`` of ``entry`` are taken back:
    off the queue, and the entry marked ``taken_back`` by the record ``record``."""
    db.executemany(_DEQUEUE, [(s,) for s in seqs])
    db.execute(f"UPDATE entries SET meta = {db.mark_dropped('taken_back')} WHERE seq = ?", (record, entry))


def move_first(db: Engine, channel: str, seqs: Sequence[int]) -> None:
    """(In the record's transaction) the queued messages ``seqs`` go to the head of their lanes."""
    for seq in seqs:
        db.execute(
            "UPDATE queue SET place = (SELECT min(coalesce(q.place, q.seq)) - 1 FROM queue q"
            " WHERE q.channel = ? AND q.agent = queue.agent) WHERE seq = ?", (channel, seq),
        )


def dequeue(db: Engine, seqs: Sequence[int]) -> None:
    """(In a transaction) the messages ``seqs`` have begun or been dropped: no longer waiting."""
    db.executemany(_DEQUEUE, [(s,) for s in seqs])


def mark_dropped(db: Engine, by: int, seqs: Sequence[int], key: str = "dropped_by_stop") -> None:
    """(In a transaction) the entries ``seqs`` were dropped by ``by`` (a stop's, an interrupt's seq)."""
    db.executemany(f"UPDATE entries SET meta = {db.mark_dropped(key)} WHERE seq = ?", [(by, s) for s in seqs])


def lift_rest(db: Engine, channel: str) -> None:
    """(In a human's message's transaction) the channel's routing rest is over."""
    db.execute("UPDATE generations SET rests = 0 WHERE channel = ?", (channel,))


def channel_states(db: Engine) -> dict[str, ChannelState]:
    """Every stopped channel's generation, routing rest and repeat window."""
    rows = db.query("SELECT channel, generation, rests, stopped FROM generations")
    return {c: ChannelState(g, bool(r), bool(s)) for c, g, r, s in rows}


def record_origin(db: Engine, origin: str, seq: int) -> None:
    """(In a message's transaction) the outside event it came from: a second fails to commit."""
    db.execute("INSERT INTO origins (origin, seq, ts) VALUES (?, ?, ?)", (origin, seq, time.time()))


def origin_seq(db: Engine, origin: str) -> int | None:
    """The seq ``origin`` was accepted as (0: handled without a message); None: never seen."""
    rows = db.query("SELECT coalesce(seq, 0) FROM origins WHERE origin = ?", (origin,))
    return int(rows[0][0]) if rows else None


def origin_at(db: Engine, origin: str) -> tuple[int, float] | None:
    """The seq ``origin`` was accepted as (0: handled without a message) and when; None: never seen."""
    rows = db.query("SELECT coalesce(seq, 0), ts FROM origins WHERE origin = ?", (origin,))
    return (int(rows[0][0]), float(rows[0][1])) if rows else None


def forget_origin(db: Engine, origin: str) -> None:
    """(In a new message's transaction) an expired idempotency key's row makes way for the new one."""
    db.execute("DELETE FROM origins WHERE origin = ?", (origin,))


def mark_origin(db: Engine, origin: str, stamp: float) -> None:
    """``origin`` handled without a message (a command, an event ignored), unless it is known."""
    db.execute("INSERT INTO origins (origin, seq, ts) VALUES (?, NULL, ?) ON CONFLICT (origin) DO NOTHING",
               (origin, stamp))


def cursor(db: Engine, key: str) -> str | None:
    """A bridge's cursor, kept in ``meta``."""
    rows = db.query("SELECT value FROM meta WHERE key = ?", (key,))
    return str(rows[0][0]) if rows else None


def save_cursor(db: Engine, key: str, value: str) -> None:
    """(In a transaction) a bridge's cursor, replaced."""
    db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
               (key, value))


# ---------------------------------------------------------------- the channel's memory


def upsert_session(db: Engine, channel: str, agent: str, session_id: str | None, cwd: str, stamp: float) -> None:
    """(In a transaction) the agent's session id in the channel (None: forgotten) and its folder."""
    db.execute(
        "INSERT INTO sessions (channel, agent, session_id, cwd, updated) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT(channel, agent) DO UPDATE SET session_id=excluded.session_id, cwd=excluded.cwd,"
        " updated=excluded.updated",
        (channel, agent, session_id, cwd, stamp),
    )


def upsert_todos(db: Engine, channel: str, plans: Mapping[str, list[dict[str, str]]], stamp: float) -> None:
    """(In a transaction) each agent's todo plan in the channel, replaced."""
    for agent, items in plans.items():
        db.execute(_TODOS, (channel, agent, json.dumps(items, ensure_ascii=False), stamp))


def forget_conversations(db: Engine, channel: str, agents: Sequence[str], stamp: float) -> None:
    """(In a transaction) ``agents``' session ids (their folders are kept) and plans in ``channel``, forgotten."""
    for agent in agents:
        db.execute("UPDATE sessions SET session_id = NULL, updated = ? WHERE channel = ? AND agent = ?",
                   (stamp, channel, agent))
        db.execute("UPDATE todos SET items = '[]', updated = ? WHERE channel = ? AND agent = ?",
                   (stamp, channel, agent))


Sessions = dict[tuple[str, str], tuple[str | None, str]]
"""By (channel, agent): the session id (None: none) and its working folder."""
Plans = dict[tuple[str, str], list[dict[str, str]]]
"""By (channel, agent): the todo plan."""


def memory(db: Engine) -> tuple[Sessions, Plans, dict[tuple[str, str], int]]:
    """Every (channel, agent)'s session (id, folder), todo plan, and last message taken up."""
    sessions = {(c, a): (s, d) for c, a, s, d in db.query("SELECT channel, agent, session_id, cwd FROM sessions")}
    todos = {(c, a): json.loads(items) for c, a, items in db.query("SELECT channel, agent, items FROM todos")}
    seen = {(c, a): s for c, a, s in db.query("SELECT channel, agent, seq FROM seen")}
    return sessions, todos, seen


# ---------------------------------------------------------------- turns and stops


def begin_turn(
    db: Engine, turn_id: str, channel: str, agent: str, generation: int, message: int, host: str | None
) -> None:
    """(In a transaction) the turn's message dequeued (in a fleet: :class:`Dropped` if it is no
    longer queued), the channel's repeat window closed, the message recorded as the last the
    agent has seen, and the turn's ``running`` row."""
    if host is not None:
        if not db.query(f"{_DEQUEUE} RETURNING seq", (message,)):
            raise Dropped(f"message {message} of channel {channel!r} was dropped by a stop")
    else:
        db.execute(_DEQUEUE, (message,))
    db.execute("UPDATE generations SET stopped = 0 WHERE channel = ? AND stopped = 1", (channel,))
    db.execute(
        "INSERT INTO seen (channel, agent, seq) VALUES (?, ?, ?)"
        f" ON CONFLICT(channel, agent) DO UPDATE SET seq = {db.greatest('seen.seq', 'excluded.seq')}",
        (channel, agent, message),
    )
    db.execute(
        "INSERT INTO turns (id, channel, agent, generation, message, state, began, host)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (turn_id, channel, agent, generation, message, TURN_RUNNING, time.time(), host),
    )


def turn_spawned(db: Engine, turn_id: str, pid: int, started: int | None) -> None:
    """(In a transaction) the turn's leader: its pid and start ticks."""
    db.execute("UPDATE turns SET pid = ?, pid_started = ? WHERE id = ?", (pid, started, turn_id))


def end_turn(db: Engine, turn_id: str) -> None:
    """(In a transaction) the turn ended on its own (a stopped one is ended by its stop's notice)."""
    db.execute("UPDATE turns SET state = ? WHERE id = ? AND state = ?", (TURN_ENDED, turn_id, TURN_RUNNING))


def turn_agent(db: Engine, turn_id: str) -> str | None:
    """The agent of turn ``turn_id`` (None: no such turn)."""
    rows = db.query("SELECT agent FROM turns WHERE id = ?", (turn_id,))
    return str(rows[0][0]) if rows else None


def mark_turn_ended(db: Engine, turn_id: str | None) -> None:
    """(In a transaction) the turn's last entry is being stored: it is over."""
    if turn_id is not None:
        db.execute("UPDATE turns SET state = ? WHERE id = ?", (TURN_ENDED, turn_id))


def record_stops(db: Engine, records: Sequence[StopRecord], host: str | None, stamp: float) -> None:
    """(In a transaction) the records of one or more stops (see :meth:`.Store.submit_stop_records`)."""
    for r in records:
        summary = {
            "pending": True, "generation": r.generation, "dropped": list(r.dropped),
            "stopped_turn": r.stopped_turns[0] if r.stopped_turns else None,
            "stopped_turns": list(r.stopped_turns),
        }
        db.execute(
            "INSERT INTO stops (seq, channel, generation, ts, result, host) VALUES (?, ?, ?, ?, ?, ?)",
            (r.seq, r.channel, r.generation, stamp, json.dumps(summary), host),
        )
        db.execute(
            "INSERT INTO generations (channel, generation, rests, stopped) VALUES (?, ?, 1, 1)"
            " ON CONFLICT(channel) DO UPDATE SET"
            f" generation={db.greatest('generations.generation', 'excluded.generation')}, rests=1, stopped=1",
            (r.channel, r.generation),
        )
        dequeue(db, r.dropped)
        dropped = list(r.dropped)
        if host is not None:
            # (A fleet) and every row other hosts queued that is committed now, taken
            # up here or not: those were accepted before the stop answered, whatever
            # their seqs (another host's clock, or the same millisecond, can put one
            # above the stop's). This host's own later messages are written after
            # this, in submit order; a row taken up before the stop and begun after
            # it finds itself gone (``begin_turn``: Dropped).
            dropped += [int(s) for (s,) in db.query(
                "DELETE FROM queue WHERE channel = ? RETURNING seq", (r.channel,)
            )]
        mark_dropped(db, r.seq, dropped)
        upsert_todos(db, r.channel, r.plans, stamp)
        db.executemany("UPDATE turns SET state = ? WHERE id = ?", [(TURN_STOPPED, t) for t in r.stopped_turns])


def record_interrupt(
    db: Engine, channel: str, seq: int, dropped: Sequence[int], plans: Mapping[str, list[dict[str, str]]],
) -> None:
    """(In the interrupting message's transaction, ``seq``) its record: the lanes' queued
    messages it dropped dequeued and marked (as a stop marks them, and as an interrupt's:
    their pages say "dropped by an interrupt"), the plans cancelled."""
    dequeue(db, dropped)
    mark_dropped(db, seq, dropped)
    mark_dropped(db, seq, dropped, "dropped_by_interrupt")
    db.execute("UPDATE queue SET delivery = NULL WHERE seq = ?", (seq,))  # (a fleet's: carried out now)
    upsert_todos(db, channel, plans, time.time())


def complete_stop(db: Engine, seq: int, result: Mapping[str, Any], turn: str | None) -> None:
    """(In the notice's transaction) the stop is complete: its final result, its turns ended
    (``turn`` and every turn its record names: a stop of several agents' turns)."""
    rows = db.query("SELECT result FROM stops WHERE seq = ?", (seq,))
    recorded = json.loads(rows[0][0]).get("stopped_turns", []) if rows else []
    db.execute("UPDATE stops SET result = ? WHERE seq = ?", (json.dumps(result, ensure_ascii=False), seq))
    for stopped in {turn, *recorded}:
        mark_turn_ended(db, stopped)


def unfinished(
    db: Engine, host: str | None
) -> tuple[list[tuple[str, str, int, str]], list[tuple[int, str, int, int, str | None]]]:
    """What the last owner (in a fleet: this ``host``'s last run) left: turns still ``running``
    (id, channel, generation, state) and stops whose notice was never stored (seq, channel,
    generation, dropped, turn)."""
    mine, hosts = ("", ()) if host is None else (" AND host = ?", (host,))
    turns = db.query(
        f"SELECT id, channel, generation, state FROM turns WHERE state = ?{mine} ORDER BY began",
        (TURN_RUNNING, *hosts),
    )
    stops = db.query(
        "SELECT seq, channel, generation, result FROM stops"
        f" WHERE {db.json_get('result', 'pending')} = {db.json_true}{mine} ORDER BY seq", hosts,
    )
    pending = []
    for seq, channel, generation, result in stops:
        summary = json.loads(result)
        pending.append((seq, channel, generation, len(summary.get("dropped", [])), summary.get("stopped_turn")))
    return [(t[0], t[1], t[2], t[3]) for t in turns], pending


def take_over(db: Engine, channel: str, here: Callable[[str], bool], skip: set[str]) -> TakeOver:
    """(A transaction; a fleet host that just took ``channel``'s lease) what the channel is in
    the store (see :meth:`.Store.take_over`); the session ids whose folder is not ``here`` are
    forgotten in the store."""
    state = db.query("SELECT generation, rests, stopped FROM generations WHERE channel = ?", (channel,))
    rows = queued(db, channel)
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
        rows,
        {a: json.loads(items) for a, items in todos},
        {a: (None if a in forgotten else sid, cwd) for a, sid, cwd in sessions},
        ended,
        {h: float(b) for h, b in beats.items()},
        {a: int(q) for a, q in seen},
    )


# ---------------------------------------------------------------- what turns spent


def record_usage(db: Engine, r: TurnRecord, ended: float) -> None:
    """(In a transaction) what an ended turn spent: one row a turn (a second write replaces it)."""
    db.execute("DELETE FROM turn_usage WHERE turn = ?", (r.turn,))
    db.execute(
        "INSERT INTO turn_usage (turn, channel, agent, day, ended, input_tokens, output_tokens, cache_read_tokens,"
        " cache_write_tokens, tool_calls, wall_seconds, cost, currency, models, budget)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (r.turn, r.channel, r.agent, r.day, ended, r.input_tokens, r.output_tokens, r.cache_read_tokens,
         r.cache_write_tokens, r.tool_calls, r.wall_seconds, None if r.cost is None else str(r.cost), r.currency,
         json.dumps(list(r.models)), r.budget),
    )


def usage_records(db: Engine, channel: str | None, since: str) -> list[TurnRecord]:
    """What the turns that ended on ``since`` (a UTC day) or later spent (of ``channel``, or all)."""
    where, args = ("day >= ? AND channel = ?", (since, channel)) if channel is not None else ("day >= ?", (since,))
    rows = db.query(
        "SELECT turn, channel, agent, day, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,"
        f" tool_calls, wall_seconds, cost, currency, models, budget FROM turn_usage WHERE {where} ORDER BY ended",
        args,
    )
    return [
        TurnRecord(str(t), str(c), str(a), str(d), int(i), int(o), int(cr), int(cw), int(tc),
                   None if w is None else float(w), None if cost is None else Decimal(str(cost)),
                   None if cur is None else str(cur), tuple(json.loads(m)), None if b is None else str(b))
        for t, c, a, d, i, o, cr, cw, tc, w, cost, cur, m, b in rows
    ]
