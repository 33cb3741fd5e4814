"""What the scripts and tests write a ``corral.toml`` with: a TOML value from a Python one.

Their configs are small tables of agents and settings, written as text (so that a benchmark's
config reads as the operator's would); this renders each value of them.
"""

from __future__ import annotations

import json
from typing import Any


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
