"""The fleet: many hosts sharing one PostgreSQL store, each channel owned by one host.

Leases with fencing generations, the heartbeat, and the watchdog that gives a lease up before
it can run out under a cut cable (:mod:`.fleet`: it decides and returns what it found, as a
:class:`~.fleet.Found`). What hosts tell each other is typed in
:mod:`supervisor.core.notices`; the SQL is the store's (:mod:`supervisor.store.leases`); the
supervisor's side — taking channels, forwarding a stop to the owner, killing a lost lease's
turns — applies what the fleet found (:mod:`supervisor.host.fleet_ownership`). Internal.
"""
