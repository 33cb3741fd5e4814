"""One host's supervisor: the :class:`~.supervisor.Supervisor` that composes the parts.

Read :mod:`.supervisor` first (what it composes), then the part you change: :mod:`.lanes`
(accepting, hand-offs, workers, running a turn), :mod:`.delivery` (a message to a busy lane:
queued, interrupting its turn, or steering it), :mod:`.capacity` (the admission gate's Trio
driver: a worker waits for a slot), :mod:`.stopper` (a stop's record, its kill, its notice;
the one kill step), :mod:`.ownership` (who runs a channel: this host alone, or a fleet's
lease holder, :mod:`.fleet_ownership`), :mod:`.disk` (the reserve that keeps a turn filling
its HOME from filling the store's disk), and a start's recovery from an abrupt end
(:mod:`.recovery`); what it answers is typed in :mod:`supervisor.core.results`.
Internal: embedders use ``supervisor.open_supervisor``.
"""
