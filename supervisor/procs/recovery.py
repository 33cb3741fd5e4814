"""Recovery after an abrupt death: end the processes the last owner of the store left running.

A supervisor killed with SIGKILL (or by the OOM killer, or a power cut) cannot end its
turns. Their processes live on, re-parented, still working in the channels' folders and
sessions; a restart that ignored them would start queued turns beside them. So the next
owner of the store, before it serves or re-queues anything (:mod:`supervisor.host.recovery`
runs the start-up job: this module's part, then the store's):

1. finds every process whose environment carries ``CORRAL_STORE=<this store's id>`` — the
   store's identity, not the supervisor's pid, so two corral instances on one machine never
   touch each other's processes (escapees that clear their environment are out of reach of
   any marker; a cgroup per turn is what catches those: every leftover turn cgroup of the
   store's own subtree, ``corral-<store id>``, is interrupted, given the grace, killed with
   ``cgroup.kill``, watched until empty and removed — before the marker scan,
   :func:`end_cgroups`);
2. sends each its interrupt signal (SIGINT, what the real CLIs expect), waits out a grace,
   SIGKILLs each process and every process group one of them leads, and waits until all are
   gone (a pidfd waits for a process that is not our child: :func:`end_orphans`);
3. (the host's, :mod:`supervisor.host.recovery`) stores, for each turn the store still calls
   ``running``, the entry "Task interrupted — corral restarted. Send another message to
   continue." (the turn's last; where the turn's plan has unfinished tasks it adds that they
   are kept and will be nudged, as a crash is not a stop:
   :func:`~supervisor.core.results.restart_notice_text`), and for each stop whose record was
   stored but whose notice was not, that notice.

Only then are queued messages re-queued: a channel whose turn was interrupted runs its next
message only once the orphan is dead. Nothing here reads or writes the store.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from .cgroup import CgroupRoot, TurnCgroup
from .tree import STORE_MARKER, ProcId, kill_exact, read_stat, scan_markers, wait_gone

log = logging.getLogger("corral.recovery")

#: Rounds of scan-and-kill: a process may fork while it is being killed.
KILL_ROUNDS = 5
#: How long to wait for SIGKILLed processes to be gone.
KILL_WAIT = 5.0


@dataclass(slots=True)
class Recovery:
    """What a start recovered from the previous owner of the store."""

    at: float = field(default_factory=time.time)
    killed: list[int] = field(default_factory=list)
    """Orphaned processes of the previous owner's turns, ended before serving."""
    survivors: list[int] = field(default_factory=list)
    """Orphans that could not be confirmed dead (logged as errors)."""
    turns: list[str] = field(default_factory=list)
    """Turns marked "interrupted — corral restarted"."""
    stops: list[int] = field(default_factory=list)
    """Stops (by seq) whose record was stored but whose notice was not: posted now."""
    cgroups: list[str] = field(default_factory=list)
    """Turn cgroups the previous owner left (their processes killed, the cgroups removed)."""

    def to_json(self) -> dict[str, Any]:
        """As ``corral status`` prints it."""
        return {
            "at": self.at, "killed": self.killed, "survivors": self.survivors, "turns": self.turns, "stops": self.stops,
            "cgroups": self.cgroups,
        }


def _signal_exact(proc: ProcId, sig: int) -> None:
    if proc.pid != os.getpid() and proc.matches():
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def _leads_group(proc: ProcId) -> bool:
    stat = read_stat(proc.pid)
    return stat is not None and stat.started == proc.started and stat.pgid == proc.pid


async def _scan(store_id: str) -> set[ProcId]:
    found = await trio.to_thread.run_sync(
        functools.partial(scan_markers, [store_id], marker=STORE_MARKER)
    )
    return found[store_id]


async def end_orphans(store_id: str, grace: float, report: Recovery) -> None:
    """Interrupt, grace, SIGKILL every process carrying this store's id; wait until gone."""
    found = await _scan(store_id)
    if not found:
        return
    log.warning("found %d orphaned process(es) of store %s: %s", len(found), store_id, sorted(p.pid for p in found))
    for proc in found:
        _signal_exact(proc, signal.SIGINT)
    await wait_gone(found, trio.current_time() + grace)
    seen = set(found)
    for _ in range(KILL_ROUNDS):
        now = await _scan(store_id) | {p for p in seen if p.matches()}
        if not now:
            break
        seen |= now
        for proc in now:
            # The group first (it also reaches members that cleared their environment), and
            # only while its leader is the very process we found: a group id is a pid.
            if _leads_group(proc):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            kill_exact(proc)
        await wait_gone(now, trio.current_time() + KILL_WAIT)
    survivors = {p for p in seen if p.matches()}
    report.killed = sorted(set(report.killed) | {p.pid for p in seen - survivors})
    report.survivors = sorted(set(report.survivors) | {p.pid for p in survivors})
    if survivors:
        log.error("orphaned processes %s of store %s could not be confirmed dead", report.survivors, store_id)


async def end_cgroups(root: CgroupRoot, grace: float, report: Recovery) -> None:
    """Interrupt, grace, ``cgroup.kill`` every leftover turn cgroup of this store; remove them.

    Only the store's own subtree is read: another corral's cgroups are never touched.
    """
    left = root.leftovers()
    if not left:
        return
    seen: set[int] = set()
    for cgroup in left:
        for pid in cgroup.procs():
            seen.add(pid)
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    log.warning("found %d leftover turn cgroup(s) of store %s holding %s", len(left), root.store_id, sorted(seen))

    async def end(cgroup: TurnCgroup) -> None:
        await cgroup.wait_empty(trio.current_time() + grace)
        seen.update(cgroup.procs())
        cgroup.kill()
        if await cgroup.wait_empty(trio.current_time() + KILL_WAIT) and cgroup.remove():
            report.cgroups.append(os.path.basename(cgroup.path))
        else:
            report.survivors.extend(cgroup.procs())

    async with trio.open_nursery() as nursery:
        for cgroup in left:
            nursery.start_soon(end, cgroup)
    report.killed.extend(sorted(seen - set(report.survivors)))
    if report.survivors:
        log.error(
            "processes %s in turn cgroups of store %s could not be confirmed dead", report.survivors, root.store_id
        )
