"""The fleet: many hosts sharing one PostgreSQL store, each channel owned by one host.

Leases with fencing generations, the notices hosts send each other, forwarding a stop to the
owner, and the watchdog that stops a host's turns before its lease can run out under a cut
cable (:mod:`.fleet`). Internal.
"""
