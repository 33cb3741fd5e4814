"""The serving faces: how people and programs reach a running supervisor.

The operations every face offers, declared once (:mod:`.routes`); the control API
(:mod:`.api`) over HTTP on a unix socket or loopback TCP (:mod:`.http`), its server-sent
events and the dashboard (:mod:`.dashboard`, logins in :mod:`.dashauth`), the
standard-library client the CLI uses (:mod:`.client`), the daemon that serves them
(:mod:`.daemon`) with systemd's notify and socket activation (:mod:`.systemd`), the log format
(:mod:`.logformat`), the host for asyncio programs (:mod:`.asyncio_host`), the wake-up on
every committed entry that the dashboard's and systemd's status lines re-read on
(:mod:`.commits`), and ``GET /metrics`` in Prometheus' text format (:mod:`.metrics`). Internal.
"""
