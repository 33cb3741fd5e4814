"""Which chat platforms corral can bridge: the ``corral.bridges`` entry points.

The public place a platform's distribution imports :class:`BridgeType` and
:class:`ConfigProblem` from (docs/bridges.md, "Adding a platform"); they live in
:mod:`supervisor.config.platforms`, the config's wing, which reads the registry to check a
``[bridges.NAME]`` table.
"""

from __future__ import annotations

from ..config.platforms import (
    GROUP,
    BridgeType,
    ConfigProblem,
    UnknownBridgeType,
    bridge_type,
    known_types,
    platform_options,
)

__all__ = ["GROUP", "BridgeType", "ConfigProblem", "UnknownBridgeType", "bridge_type", "known_types",
           "platform_options"]
