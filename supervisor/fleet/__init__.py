"""The fleet: many hosts sharing one PostgreSQL store, each channel owned by one host.

Leases with fencing generations, the notices hosts send each other, and the watchdog that
gives a lease up before it can run out under a cut cable (:mod:`.fleet`: it decides and
returns what it found); the supervisor's side — taking channels, forwarding a stop to the
owner, killing a lost lease's turns — behind the host's ownership port (:mod:`.owner`).
Internal.
"""
