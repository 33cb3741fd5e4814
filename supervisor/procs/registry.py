"""The process registry: which process tree belongs to which channel and turn.

Two rules from the stop contract live here (line 6):

* a process registered for a turn the ledger already calls stale is killed on the spot —
  the stop that made it stale found nothing to kill, so registration is the last chance;
* a release removes an entry only if it still holds *that* tree, so a late exit of an old
  process can never unregister its successor.

One exception keeps line 17 true: while the stop that made the turn stale is still storing
its record, nothing may be killed yet (a stop whose record cannot be stored kills nothing).
Such a process is frozen instead (SIGSTOP to its group: it runs none of its code meanwhile),
and ``settle`` carries out the kill the moment the record is committed (SIGKILL, as on
registration) — or resumes it (SIGCONT) if the stop was undone.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..core.ledger import StopLedger
from .tree import ProcessTree, signal_group

log = logging.getLogger("corral.registry")


def _kill_late(channel: str, turn_id: str, tree: ProcessTree) -> None:
    """SIGKILL a stale turn's tree, then log the processes the kill found alive — the pids its
    stop's result names (killed, or swept: of another group). Its leader may have ended by
    itself first: sandboxed, bwrap's monitor exits with its program's status as soon as its
    init reports it, and the init, still there for what the program left, is what dies."""
    killed = tree.kill_group()
    leader = "" if tree.pid in killed else f"; its leader {tree.pid} had exited (status {tree.process.returncode})"
    rest = "" if tree.cgroup is not None or tree.pid in killed else ", the rest is its sweep's"
    log.info(
        "killed %s registered for stopped turn %s in %r%s%s",
        f"processes {killed}" if killed else "nothing", turn_id, channel, leader, rest,
    )


class ProcessRegistry:
    """Live process trees by (channel, turn id)."""

    def __init__(self, ledger: StopLedger, *, recording: Callable[[str], bool] | None = None) -> None:
        self._ledger = ledger
        self._recording = recording
        """Is a stop of this channel still storing its record?"""
        self._trees: dict[tuple[str, str], ProcessTree] = {}
        self._deferred: set[tuple[str, str]] = set()
        self._spawning = 0

    def register(self, channel: str, turn_id: str, tree: ProcessTree) -> bool:
        """Record a freshly spawned tree. Synchronous: call it before any checkpoint.

        Returns False if the turn was already stopped; the tree has then been SIGKILLed
        (it stays registered until its owner releases it after the sweep).
        """
        self._trees[(channel, turn_id)] = tree
        if self._ledger.keep_process(channel, turn_id):
            return True
        if self._recording is not None and self._recording(channel):
            log.info(
                "process %d registered for turn %s in %r while its stop is stored: frozen, killed once it is",
                tree.pid, turn_id, channel,
            )
            signal_group(tree.pgid, signal.SIGSTOP)  # just spawned, unreaped: the group id is its own
            self._deferred.add((channel, turn_id))
            return True
        _kill_late(channel, turn_id, tree)
        return False

    def settle(self, channel: str) -> None:
        """The channel's stop is stored (or undone): kill what registered meanwhile, if stale."""
        for key in [k for k in self._deferred if k[0] == channel]:
            self._deferred.discard(key)
            tree = self._trees.get(key)
            if tree is not None and not self._ledger.keep_process(*key):
                _kill_late(channel, key[1], tree)
            elif tree is not None and tree.process.returncode is None:
                signal_group(tree.pgid, signal.SIGCONT)  # the stop was undone: the turn runs on

    def release(self, channel: str, turn_id: str, tree: ProcessTree) -> bool:
        """Forget ``tree`` if it is still the one registered for this turn."""
        key = (channel, turn_id)
        if self._trees.get(key) is tree:
            del self._trees[key]
            self._deferred.discard(key)
            return True
        return False

    def get(self, channel: str, turn_id: str) -> ProcessTree | None:
        """The tree registered for this turn, if any."""
        return self._trees.get((channel, turn_id))

    def interrupt(self, channel: str, turn_id: str, sig: int = signal.SIGINT) -> ProcessTree | None:
        """Send a stopped turn's group its interrupt signal now, if it has a process."""
        tree = self._trees.get((channel, turn_id))
        if tree is not None and tree.process.returncode is None:
            tree.interrupt(sig)
        return tree

    def leader_pids(self) -> set[int]:
        """Pids of every registered leader (Trio reaps these; nobody else may)."""
        return {tree.pid for tree in self._trees.values()}

    @property
    def spawning(self) -> int:
        """Spawns in flight: their children exist before Trio can wait for them, so no
        reaper may touch this process's children while any is."""
        return self._spawning

    @contextmanager
    def spawn_in_flight(self) -> Iterator[None]:
        """Count a spawn from its start until it returns (or fails); see :attr:`spawning`."""
        self._spawning += 1
        try:
            yield
        finally:
            self._spawning -= 1
