"""The store: the channel's entries, queue, stop records and sessions, on SQLite or PostgreSQL.

:mod:`.store` is what the rest of corral calls (group commit, the stop record written before any
signal); :mod:`.statements` is what it asks of the database, one plain function each; :mod:`.schema`
holds the schema and its migrations; :mod:`.engines` the two database engines; :mod:`.leases`
the fleet's statements. The value types it keeps (entries, drafts,
queued messages, stop records) are the pure core's (:mod:`supervisor.core.records`).
Internal.
"""
