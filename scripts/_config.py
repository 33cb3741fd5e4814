"""What the scripts and tests write a ``corral.toml`` with: its tables from Python values.

Their configs are small tables of agents and settings, written out as TOML text (so that a
benchmark's config reads as the operator's would): :func:`toml` renders the tables in order,
:func:`toml_value` each value of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """A ``corral.toml`` of ``tables``, in order: ``{"server": {"socket": "corral.sock"},
    "agents.demo": {...}}`` is ``[server]`` then ``[agents.demo]``, each key a line."""
    return "".join(
        f"[{name}]\n" + "".join(f"{key} = {toml_value(value)}\n" for key, value in table.items())
        for name, table in tables.items()
    )


def toml_value(value: Any) -> str:
    """A TOML rendering of the values an agent table holds (JSON strings are TOML strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)
