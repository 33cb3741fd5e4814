"""Chat bridges: rooms of a chat platform joined to corral channels, run under the daemon.

A platform-independent core (:mod:`.core`, pure) decides; a platform module (:mod:`.matrix`,
:mod:`.irc`, :mod:`.telegram`, :mod:`.slack`, :mod:`.discord`) speaks the wire through the interface
of :mod:`.platform`; the Trio layer (:mod:`.runner`) drives both against a
:class:`~supervisor.Supervisor` through its public methods. Platforms are found by their
``corral.bridges`` entry points (:mod:`.registry`; corral's own are declared in :mod:`.kinds`).
``[bridges.NAME]`` tables in ``corral.toml`` configure them; embedded::

    async with open_supervisor(config) as sup, trio.open_nursery() as nursery:
        await nursery.start(run_bridges, sup, list(config.bridges.values()))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import BridgeCore, Policy
    from .platform import Batch, Platform, PlatformError, Refused, Transient
    from .runner import Bridge, run_bridge, run_bridges

#: Imported when first used, so the pure core loads without Trio (a test checks it).
_LAZY = {
    "BridgeCore": ".core", "Policy": ".core",
    "Batch": ".platform", "Platform": ".platform", "PlatformError": ".platform", "Refused": ".platform",
    "Transient": ".platform",
    "Bridge": ".runner", "run_bridge": ".runner", "run_bridges": ".runner",
}

__all__ = [
    "Batch", "Bridge", "BridgeCore", "Platform", "PlatformError", "Policy", "Refused", "Transient", "run_bridge",
    "run_bridges",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
