"""A start's recovery: end what the last owner of the store left running, then close its turns
and stops on the record.

The processes first (:mod:`supervisor.procs.recovery`: the leftover turn cgroups, then every
process carrying the store's id, interrupted, given the grace, killed, waited for); then, for
each turn the store still calls ``running``, its last entry "Task interrupted — corral
restarted. …" (:func:`~supervisor.core.results.restart_notice_text`: with a plan left, that it
is kept and will be nudged), and for each stop whose record was stored but whose notice was
not, that notice, which completes the stop. Each entry ends its turn's row in its own
transaction. The supervisor runs this before it serves or re-queues anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..core.account import unfinished
from ..core.results import restart_notice_text, stop_notice_text
from ..procs.cgroup import CgroupRoot
from ..procs.recovery import Recovery, end_cgroups, end_orphans
from ..store.engines import Engine
from ..store.store import Pending, Store

log = logging.getLogger("corral.recovery")

__all__ = ["Recovery", "recover"]


def _completes_stop(seq: int, result: dict[str, Any], turn: str | None) -> Callable[[Engine, int], None]:
    """The write, in the notice's transaction, that completes stop ``seq``."""
    return lambda db, _entry: Store.complete_stop(db, seq, result, turn)


def _ends_turn(turn_id: str) -> Callable[[Engine, int], None]:
    """The write, in the notice's transaction, that marks turn ``turn_id`` ended."""
    return lambda db, _entry: Store.mark_turn_ended(db, turn_id)


async def recover(store: Store, grace: float, stop_notice: str, cgroups: CgroupRoot | None = None) -> Recovery:
    """End the previous owner's orphans (its turn cgroups first), then close its turns and
    stops on the record."""
    report = Recovery()
    if cgroups is not None:
        await end_cgroups(cgroups, grace, report)
    await end_orphans(store.store_id, grace, report)
    turns, stops = await store.unfinished()
    writes: list[Pending] = []
    for seq, channel, generation, dropped, turn in stops:
        result = {"channel": channel, "generation": generation, "dropped": dropped, "ok": True, "recovered": True}
        writes.append(
            store.submit_entry(
                channel, "system", "notice", stop_notice_text(stop_notice, dropped), turn=turn, generation=generation,
                meta={"stop_seq": seq, "ok": True, "recovered": True},
                also=_completes_stop(seq, result, turn),
            )
        )
        report.stops.append(seq)
    for turn_id, channel, generation, _ in turns:
        agent = await store.turn_agent(turn_id)
        left = unfinished(store.todos(channel, agent)) if agent is not None else 0
        writes.append(
            store.submit_entry(
                channel, "system", "notice", restart_notice_text(left), turn=turn_id, generation=generation,
                meta={"recovered": True},
                also=_ends_turn(turn_id),
            )
        )
        report.turns.append(turn_id)
    for write in writes:
        await write.committed()
    if report.killed or report.turns or report.stops:
        log.warning(
            "recovered after an abrupt end: killed %s, interrupted turns %s, stop notices %s",
            report.killed, report.turns, report.stops,
        )
    return report
