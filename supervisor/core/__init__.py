"""The pure core: every decision corral makes, with no Trio and no I/O.

The stop ledger (:mod:`.ledger`), the router's address gate (:mod:`.router`), the catch-up
prompt (:mod:`.catchup`), the text rules (:mod:`.text`), the turn's account from events to
effects (:mod:`.account`), a CLI that is not logged in (:mod:`.login`), admission: which waiting
turn may start and what must close first (:mod:`.admission`), starting a channel over and
sending a dropped message again (:mod:`.restart`), the errors a caller can see (:mod:`.errors`),
the answers and notice texts (:mod:`.results`), the notices fleet hosts send each other
(:mod:`.notices`), the JSON form of a result, derived from its fields (:mod:`.fields`), the
counters ``GET /metrics`` shows (:mod:`.counters`), the store's value types (entries,
drafts, queued messages, stop records: :mod:`.records`), a turn's network policy with the
proxy's one decision (:mod:`.netpolicy`), what a turn used (tokens, cost, tool calls:
:mod:`.usage`), whether a budget ran out (:mod:`.budget`), what a day has spent against the daily budgets
(:mod:`.daily`), a status page of many channels (busy first, the idle counted: :mod:`.paging`,
:mod:`.names`: the names in order),
and a queue seen and edited by people
(its view, the depth policy, an idempotent send's origin: :mod:`.queue`). Each is synchronous code in the style
of h11's ``_state.py``: the Trio layer drives it, passing events in and carrying out the work it
returns. A test imports this package in a fresh interpreter and checks that Trio was not loaded.
Internal: the public names are re-exported by ``supervisor``.
"""
