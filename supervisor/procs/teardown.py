"""Ending the cgroup trees of a stop-all together: one task, one pass per step.

A stop of one turn ends its tree in the turn's own teardown (:meth:`ProcessTree.terminate`,
then :meth:`ProcessTree.sweep`): a wait for the leader, ``cgroup.kill``, a wait for the
cgroup to empty, the leader reaped, the cgroup removed — half a dozen Trio waits, each a
wake-up of that turn's task. A stop-all of 200 turns multiplied that by 200, and the
wake-ups, not the kernel, were most of corral's CPU per stopped turn. So a stop-all hands
every cgroup tree it interrupted (:meth:`ProcessTree.hand_over`) to one :class:`TreeBatch`,
which does each step for all of them at once:

1. **grace**: every leader's pidfd in one epoll set of the batch's own, waited on as one
   file; at each wake-up the trees whose leader has exited, or whose ``stop_grace`` is up,
   get their ``cgroup.kill`` in one pass (a leader that saves its session on the interrupt
   is given its grace; the others are not held up by it);
2. **empty**: the ``cgroup.events`` files of all killed cgroups watched through the root's
   one inotify instance, one wake-up per change of any of them (never polled in a loop);
3. **reap and remove**: escapees that re-parented to corral reaped by identity, each leader
   reaped last (its zombie held the group id), each empty cgroup removed, each tree's
   :class:`KillReport` written — the same report as the one-turn path's.

The turns' teardowns wait for the batch's ``done`` and carry on (drain, notice) as before.

**The garbage collector.** While 200 turns run, the daemon tracks ~70,000 objects, and a
full collection of them costs 40-50 ms of CPU (2 shared vCPUs) — a quarter of a millisecond
per turn, as much as everything else a stopped turn costs. A stop-all allocates enough to
trigger one, right when the turns' objects are about to be freed. So the daemon pauses the
cyclic collector for the length of a stop (:class:`CollectorPause`; reference counting
still frees almost everything at once) and resumes it after, when a full collection walks
the ~30,000 objects left (8 ms). Process-wide, so only where the process is corral's own
(``owns_children``, as ``corral run``), never in an embedding program.
A tree whose own teardown had already begun (a turn ending on its own, a timeout) is not
taken: it ends as it was. Sweep trees (no cgroup) end on their own: their sweep shares a
marker scan already (:class:`MarkerScanner`).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import select
from dataclasses import dataclass, field

import trio

from .cgroup import Changes, Watcher
from .tree import ProcessTree

log = logging.getLogger("corral.teardown")

#: How long the batch waits for a killed cgroup to empty (as :meth:`ProcessTree.sweep`'s budget).
EMPTY_BUDGET = 5.0


@dataclass(slots=True)
class _Member:
    tree: ProcessTree
    grace: float
    done: trio.Event = field(default_factory=trio.Event)
    """Set once this tree is ended: its turn's teardown carries on then, not when the last is."""
    deadline: float = 0.0
    """Grace: when it is killed whatever its leader does. Killed: when waiting for it ends."""
    watch: int | None = None
    emptied: bool = False


class TreeBatch:
    """The cgroup trees of one stop-all, ended together by :meth:`run` (one task, and one
    helper task for the grace), each released to its turn as soon as it is over."""

    def __init__(self, watcher: Watcher, *, budget: float = EMPTY_BUDGET) -> None:
        self.watcher = watcher
        """The store's shared inotify instance; it must be running (:meth:`Watcher.run`)."""
        self.budget = budget
        self.done = trio.Event()
        """Set once every tree of the batch is ended (or given up on: see its report)."""
        self._members: list[_Member] = []
        self._killed: dict[int, _Member] = {}
        """Killed, not yet empty, by ``id``; in the order killed, so by deadline too."""
        self._watched: dict[int, _Member] = {}
        """Killed, not yet empty, by the watch on its ``cgroup.events``."""
        self._due: list[_Member] = []
        """To read at the next pass: killed since the last one, or not watched."""
        self._graced = False
        """Every tree is killed (the grace is over for all)."""
        self._changes: Changes | None = None
        """What the collecting loop waits on: a change of a cgroup (which), or more trees killed."""

    def add(self, tree: ProcessTree, grace: float) -> bool:
        """Take over ending ``tree`` (already interrupted); False if it ends on its own."""
        member = _Member(tree, grace)
        if not tree.hand_over(member.done):
            return False
        self._members.append(member)
        return True

    def __len__(self) -> int:
        return len(self._members)

    async def run(self) -> None:
        """End every tree: grace, ``cgroup.kill``, wait for empty, reap, remove. Run it shielded.

        Should the batch itself fail (no epoll set, say, when out of file descriptors), each
        tree it has not finished is ended on its own, as a single stop ends it.
        """
        self._changes = self.watcher.changes()
        try:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._grace)
                    await self._collect()
            except Exception:
                log.exception("the batched teardown failed: each of its trees is ended on its own")
                for member in self._killed.values():
                    if member.watch is not None:
                        self.watcher.remove(member.watch)
                self._killed.clear()
                self._watched.clear()
                async with trio.open_nursery() as nursery:
                    for member in self._members:
                        if not member.done.is_set():
                            nursery.start_soon(self._alone, member)
        finally:
            self.watcher.forget(self._changes)
            for member in self._members:
                member.done.set()
            self.done.set()

    async def _alone(self, member: _Member) -> None:
        await member.tree.end_alone(member.grace, self.budget)
        member.done.set()

    async def _grace(self) -> None:
        """Kill each tree once its leader has exited or its grace is up, in passes."""
        start = trio.current_time()
        waiting: dict[int, _Member] = {}
        blind: list[_Member] = []
        """No pidfd (out of file descriptors?): its leader is checked at each wake-up."""
        poll = select.epoll()
        try:
            for member in self._members:
                member.deadline = start + member.grace
                if member.tree.process.returncode is not None:
                    self._kill(member)
                    continue
                try:
                    fd = os.pidfd_open(member.tree.pid)
                except OSError:
                    blind.append(member)
                    continue
                try:
                    poll.register(fd, select.EPOLLIN)
                except OSError:
                    os.close(fd)
                    blind.append(member)
                    continue
                waiting[fd] = member
            while waiting or blind:
                now = trio.current_time()
                ready = {fd for fd, _ in poll.poll(0)}
                for fd in [fd for fd, m in waiting.items() if fd in ready or m.deadline <= now]:
                    member = waiting.pop(fd)
                    poll.unregister(fd)
                    os.close(fd)
                    self._kill(member)
                for member in [m for m in blind if m.deadline <= now or m.tree.process.returncode is not None]:
                    blind.remove(member)
                    self._kill(member)
                self._poke()
                if waiting or blind:
                    deadlines = [m.deadline for m in waiting.values()] + [m.deadline for m in blind]
                    with trio.move_on_at(min(deadlines)):
                        await trio.lowlevel.wait_readable(poll.fileno())
        finally:
            for fd in waiting:
                os.close(fd)
            trio.lowlevel.notify_closing(poll.fileno())
            poll.close()
            self._graced = True
            self._poke()

    def _kill(self, member: _Member) -> None:
        member.tree.kill_group()
        member.deadline = trio.current_time() + self.budget
        cgroup = member.tree.cgroup
        assert cgroup is not None
        try:
            member.watch = self.watcher.add(os.path.join(cgroup.path, "cgroup.events"))
        except OSError:
            pass  # gone already (then it is empty), or no watch: its deadline bounds it
        else:
            assert self._changes is not None
            self._changes.wds.add(member.watch)
            self._watched[member.watch] = member
        self._killed[id(member)] = member
        self._due.append(member)

    def _poke(self) -> None:
        if self._changes is not None:
            self._changes.event.set()

    async def _collect(self) -> None:
        """Release each killed tree as soon as its cgroup says ``populated 0`` (or its deadline
        passes): reap, remove, report, and wake its turn.

        Each pass reads only the ``cgroup.events`` that may have changed: of the trees killed
        since the last pass, of those whose watch fired, of those without a watch, and of
        those whose deadline is up — not every killed tree's at every wake-up.
        """
        changes = self._changes
        assert changes is not None
        killed = self._killed
        stragglers: list[_Member] = []
        while True:
            # Taken before the reads below: a change after a read wakes the next wait.
            fired = changes.take()
            now = trio.current_time()
            due, self._due = self._due, []
            due.extend(self._watched[wd] for wd in fired if wd in self._watched)
            for member in killed.values():  # in the order killed: by deadline
                if member.deadline > now:
                    break
                due.append(member)
            for member in due:
                if id(member) not in killed:
                    continue  # released already (listed twice)
                assert member.tree.cgroup is not None
                if not member.tree.cgroup.populated():
                    member.emptied = True
                elif member.deadline > now:
                    if member.watch is None:
                        self._due.append(member)  # no watch: read again at the next wake-up
                    continue
                del killed[id(member)]
                if member.watch is not None:
                    del self._watched[member.watch]
                    changes.wds.discard(member.watch)
                    self.watcher.remove(member.watch)
                member.tree.reap_escapees()
                if member.tree.process.returncode is None:  # a leader killed before it entered its cgroup
                    stragglers.append(member)
                else:
                    self._close(member)
            if self._graced and not killed:
                break
            first = next(iter(killed.values()), None)
            with trio.move_on_at(first.deadline if first is not None else math.inf):
                await changes.event.wait()
        for member in stragglers:
            with trio.move_on_at(member.deadline):
                await member.tree.process.wait()
            self._close(member)

    def _close(self, member: _Member) -> None:
        member.tree.close_cgroup(member.emptied)
        member.done.set()


class CollectorPause:
    """Pause Python's cyclic garbage collector while any stop is in progress (nested stops
    share one pause); it is resumed, as it was, when the last one ends."""

    def __init__(self) -> None:
        self._depth = 0
        self._resume = False

    def __enter__(self) -> None:
        if self._depth == 0:
            self._resume = gc.isenabled()
            gc.disable()
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._resume:
            gc.enable()
