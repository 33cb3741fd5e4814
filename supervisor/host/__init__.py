"""One host's supervisor: the :class:`~.supervisor.Supervisor` that composes the wings.

It owns the nursery, the ledger, the store and the process registry, and wires a message
through the router to a turn and a stop through the ledger to the kill. Internal: embedders
use ``supervisor.open_supervisor``.
"""
