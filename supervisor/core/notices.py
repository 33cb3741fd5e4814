"""The notices hosts of a fleet send each other: typed values, one encoder each, one decoder.

Theory of operation
-------------------

* **One wire.** Every notice goes through PostgreSQL's ``NOTIFY`` on one channel
  (:data:`CHANNEL`), delivered to every listening host at its transaction's commit (and never
  for a rolled-back one). A payload is one JSON object whose ``kind`` names its type; a host
  reads only the notices addressed to it (``to``) or sent by another host (``from``).
* **Six kinds, each a frozen value.** :class:`Beat` (a heartbeat's proof of life, which the
  listener consumes), :class:`Queued` (a message row another host may have to take up),
  :class:`Entries` (a commit placed entries up to position ``last``), and a stop through a
  host that does not own the channel: :class:`Stop` (asked of the owner), :class:`Stopping`
  (the owner's acknowledgement) and :class:`Stopped` (its result). Each knows its wire form
  (:meth:`encode`); :func:`decode` is the only way back.
* **Self-validating.** A value checks its fields when it is made — by the sender or by the
  decoder alike — so a notice that exists is well formed: names (hosts, channels, request ids)
  are non-empty strings of real characters (no lone surrogate: they name rows and files), a
  position is an integer or None, a result is a JSON object. Anything else raises
  :class:`NoticeError`, a ``ValueError``.
* **The wire is not trusted to be well formed.** Anyone who may ``NOTIFY`` on the database can
  send anything: :func:`decode` turns every malformed payload (not JSON, nested too deep, not
  an object, an unknown kind, a field missing or of the wrong type) into :class:`NoticeError`
  and never another exception; the listener logs it and drops it
  (:meth:`supervisor.fleet.fleet.Fleet.listen`). Keys a kind does not know are ignored: a host
  of a newer version may add one.
* **ASCII on the wire.** A payload is JSON with every non-ASCII character escaped, so text
  that cannot be encoded as UTF-8 (a lone surrogate in an error message naming a file) still
  travels, and comes back as it was. PostgreSQL refuses a payload of 8000 bytes or more: a
  notice is small by design (a stop's result names its pids and turns; nothing carries a
  transcript).

The ``entries`` notice alone is written in SQL, by the engine's commit script
(:meth:`supervisor.store.engines.PostgresEngine.commit_in_order`): its ``last`` is read in the
committing transaction itself. Its shape is :class:`Entries`'s, and a test decodes a real one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

#: The ``LISTEN``/``NOTIFY`` channel of a fleet's notices between hosts.
CHANNEL = "corral_fleet"


class NoticeError(ValueError):
    """A notice that is not well formed (made here, or read from the wire)."""


def _name(value: object, key: str) -> str:
    """A host, channel or request id: a non-empty string of real characters."""
    if not isinstance(value, str) or not value:
        raise NoticeError(f"{key!r} must be a non-empty string, not {_shown(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise NoticeError(f"{key!r} holds a lone surrogate") from None
    return value


def _position(value: object, key: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise NoticeError(f"{key!r} must be an integer or null, not {_shown(value)}")
    return value


def _object(value: object, key: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise NoticeError(f"{key!r} must be a JSON object, not {_shown(value)}")
    return value


def _shown(value: object) -> str:
    """A value in an error message: its type, and a short view of it."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"


#: The check of a field, by its declared type: it raises :class:`NoticeError`, or returns the value.
_CHECKS: dict[str, Callable[[object, str], object]] = {"str": _name, "int | None": _position, "dict[str, Any]": _object}


_Wire = tuple[tuple[str, str, Callable[[object, str], object]], ...]


def _wire(kind: type[_Notice]) -> _Wire:
    """Each field of a kind: its name, its wire key (``from`` for ``sender``), its check."""
    return _WIRES[kind.KIND]


@dataclass(frozen=True, slots=True)
class _Notice:
    """What every notice has: its kind (the class's) and the host that sent it."""

    KIND: ClassVar[str]

    sender: str = field(metadata={"key": "from"})
    """The host that sent it (``from`` on the wire)."""

    def __post_init__(self) -> None:
        for name, key, check in _wire(type(self)):
            check(getattr(self, name), key)

    def encode(self) -> str:
        """The payload: a JSON object, ASCII only (lone surrogates escaped, so always sendable)."""
        body: dict[str, Any] = {"kind": self.KIND}
        for name, key, _ in _wire(type(self)):
            body[key] = getattr(self, name)
        return json.dumps(body, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Beat(_Notice):
    """A heartbeat reached the database: every listener hears from the fleet at least once
    a third of a lease (a silent listening connection is replaced)."""

    KIND = "beat"


@dataclass(frozen=True, slots=True)
class Queued(_Notice):
    """A message row of ``channel`` was committed: its owner takes it up at once."""

    KIND = "queued"

    channel: str


@dataclass(frozen=True, slots=True)
class Entries(_Notice):
    """A commit placed entries up to position ``last`` (None: none placed yet): every other
    host reads them back for its followers."""

    KIND = "entries"

    last: int | None


@dataclass(frozen=True, slots=True)
class Stop(_Notice):
    """Asked of the host ``to`` that owns ``channel``: carry out a stop and answer ``id``."""

    KIND = "stop"

    to: str
    channel: str
    id: str


@dataclass(frozen=True, slots=True)
class Stopping(_Notice):
    """The owner's acknowledgement of the stop ``id``: it is carrying it out."""

    KIND = "stopping"

    to: str
    id: str


@dataclass(frozen=True, slots=True)
class Stopped(_Notice):
    """The owner carried out the stop ``id``: ``result`` is its ``StopResult.to_json()``."""

    KIND = "stopped"

    to: str
    id: str
    result: dict[str, Any] = field(hash=False)


Notice = Beat | Queued | Entries | Stop | Stopping | Stopped
"""Any notice of the fleet."""

_KINDS: dict[str, type[Beat | Queued | Entries | Stop | Stopping | Stopped]] = {
    kind.KIND: kind for kind in (Beat, Queued, Entries, Stop, Stopping, Stopped)
}
_WIRES: dict[str, _Wire] = {
    name: tuple((f.name, f.metadata.get("key", f.name), _CHECKS[str(f.type)]) for f in fields(kind))
    for name, kind in _KINDS.items()
}


def _no_constant(name: str) -> object:
    raise NoticeError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NoticeError(f"{text[:20]} is out of range")
    return value


def decode(payload: str) -> Notice:
    """The notice a payload holds; :class:`NoticeError` (and nothing else) if it holds none."""
    try:
        body = json.loads(payload, parse_constant=_no_constant, parse_float=_finite)
    except NoticeError:
        raise
    except (ValueError, TypeError, RecursionError) as exc:
        raise NoticeError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(body, dict):
        raise NoticeError(f"a notice is a JSON object, not {_shown(body)}")
    kind = _KINDS.get(body["kind"]) if isinstance(body.get("kind"), str) else None
    if kind is None:
        raise NoticeError(f"unknown kind {_shown(body.get('kind'))}")
    values: dict[str, Any] = {}
    for name, key, _ in _wire(kind):
        if key not in body:
            raise NoticeError(f"a {kind.KIND!r} notice without {key!r}")
        values[name] = body[key]
    return kind(**values)
