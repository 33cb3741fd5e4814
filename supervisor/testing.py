"""What tests of corral (and of a program embedding it) use to reach inside a supervisor.

:class:`Hooks` park a turn at exact points to drive a race deterministically (pass them to
``open_supervisor(config, hooks=...)``); the accessors return the supervisor's ledger,
store and process registry, which are not part of its public surface.
"""

from __future__ import annotations

from ._hooks import Hooks, Spawner, TurnHook
from ._ledger import StopDecision, StopLedger
from ._registry import ProcessRegistry
from ._store import Store
from ._supervisor import Supervisor

__all__ = ["Hooks", "Spawner", "StopDecision", "StopLedger", "TurnHook", "ledger", "registry", "store"]


def ledger(sup: Supervisor) -> StopLedger:
    """The supervisor's stop ledger."""
    return sup._ledger


def store(sup: Supervisor) -> Store:
    """The supervisor's store."""
    return sup._store


def registry(sup: Supervisor) -> ProcessRegistry:
    """The supervisor's process registry."""
    return sup._registry
