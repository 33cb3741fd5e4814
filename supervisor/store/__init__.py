"""The store: the channel's entries, queue, stop records and sessions, on SQLite or PostgreSQL.

:mod:`.store` is what the rest of corral calls (:class:`~.store.Store`, :func:`~.store.open_store`:
seq order, group commit, the stop record written before any signal); behind it, :mod:`.statements`
is what it asks of the database, one plain function each; :mod:`.writer` the writer task and its
group commit; :mod:`.feed` the followers and a fleet's commit order; :mod:`.memory` the sessions,
plans and last-seen messages kept in memory; :mod:`.connection` the one connection and its thread;
:mod:`.schema` the schema and its migrations; :mod:`.engines` the two database engines; and
:mod:`.leases` the fleet's statements. The value types it keeps (entries, drafts, queued messages,
stop records) are the pure core's (:mod:`supervisor.core.records`). Internal.
"""
