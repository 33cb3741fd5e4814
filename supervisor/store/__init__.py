"""The store: the channel's entries, queue, stop records and sessions, on SQLite or PostgreSQL.

:mod:`.store` is what the rest of corral calls (group commit, the stop record written before any
signal); :mod:`.engines` holds the two database engines, the schema and its migrations.
Internal.
"""
