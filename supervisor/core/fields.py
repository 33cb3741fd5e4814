"""A dataclass's JSON form, derived from its fields.

Theory of operation
-------------------

A result that crosses a boundary (the control API, a stop answered by another fleet host) is
written as JSON by :func:`to_json` and read back by :func:`from_json`, both from the class's own
fields, so a field added to the class is a field carried: nothing is listed twice (a stop
forwarded to another fleet host once lost ``ended`` to a hand-written copy that predated it).

* **Out.** Every field by its name, in the order the class declares them; a nested dataclass
  (alone or in a list) by its own fields; a tuple as a list. A field's metadata may ask for
  :data:`ROUNDED` (a float of milliseconds, to three places) or :data:`OMITTED_IF_NONE` (left
  out while it is None).
* **In.** Each value is checked against its field's type (``str``, ``int``, ``float``,
  ``bool``, ``X | None``, ``list``, ``tuple``, ``dict``, a nested dataclass, ``Any``): a value
  of another type raises ``ValueError`` naming the field, as does a field with no default that
  is missing. A missing field with a default takes it (a sender of an older version); a key no
  field names is ignored (a newer one).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

#: Field metadata: a float written rounded to three places (milliseconds to the microsecond).
ROUNDED: Mapping[str, Any] = types.MappingProxyType({"round": 3})
#: Field metadata: the field is left out of the JSON form while it is None.
OMITTED_IF_NONE: Mapping[str, Any] = types.MappingProxyType({"omit_none": True})


def to_json(obj: DataclassInstance) -> dict[str, Any]:
    """``obj``'s fields as a JSON object (see the module's theory)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None and f.metadata.get("omit_none"):
            continue
        places = f.metadata.get("round")
        out[f.name] = round(value, places) if places is not None else _dump(value)
    return out


def _dump(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: object) -> T:
    """A ``cls`` made from its JSON form (see the module's theory); ``ValueError`` if ``data``
    is not one."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in data:
            values[f.name] = _load(hints[f.name], data[f.name], f"{cls.__name__}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ValueError(f"a {cls.__name__} without {f.name!r}")
    return cls(**values)


def _load(kind: Any, value: Any, where: str) -> Any:
    """``value`` as a ``kind``, or ValueError naming ``where``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        (one,) = [a for a in args if a is not type(None)]  # (only ``X | None`` is written)
        return _load(one, value, where)
    if kind is bool or kind is str:
        if not isinstance(value, kind):
            raise ValueError(f"{where} is a {kind.__name__}, not {type(value).__name__}")
        return value
    if kind is int or kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise ValueError(f"{where} is a number ({kind.__name__}), not {type(value).__name__}")
        return kind(value)
    if origin is list or origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} is a list, not {type(value).__name__}")
        items = [_load(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"{where} is a JSON object, not {type(value).__name__}")
        return {k: _load(args[1], v, f"{where}[{k!r}]") for k, v in value.items()}
    if is_dataclass(kind) and isinstance(kind, type):
        return from_json(kind, value)
    raise TypeError(f"{where}: no JSON form for {kind!r}")  # (a field of a type this module does not know)
