"""The process registry: which process tree belongs to which channel and turn.

Two rules from the stop contract live here (line 6):

* a process registered for a turn the ledger already calls stale is killed on the spot —
  the stop that made it stale found nothing to kill, so registration is the last chance;
* a release removes an entry only if it still holds *that* tree, so a late exit of an old
  process can never unregister its successor.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator

from ._ledger import StopLedger
from ._tree import ProcessTree

log = logging.getLogger("corral.registry")


class ProcessRegistry:
    """Live process trees by (channel, turn id)."""

    def __init__(self, ledger: StopLedger) -> None:
        self._ledger = ledger
        self._trees: dict[tuple[str, str], ProcessTree] = {}

    def register(self, channel: str, turn_id: str, tree: ProcessTree) -> bool:
        """Record a freshly spawned tree. Synchronous: call it before any checkpoint.

        Returns False if the turn was already stopped; the tree has then been SIGKILLed
        (it stays registered until its owner releases it after the sweep).
        """
        self._trees[(channel, turn_id)] = tree
        if self._ledger.keep_process(channel, turn_id):
            return True
        log.info("killing process %d registered for stopped turn %s in %r", tree.pid, turn_id, channel)
        tree.kill_group()
        return False

    def release(self, channel: str, turn_id: str, tree: ProcessTree) -> bool:
        """Forget ``tree`` if it is still the one registered for this turn."""
        key = (channel, turn_id)
        if self._trees.get(key) is tree:
            del self._trees[key]
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

    def __iter__(self) -> Iterator[tuple[tuple[str, str], ProcessTree]]:
        return iter(list(self._trees.items()))

    def __len__(self) -> int:
        return len(self._trees)
