"""Which chat platforms corral can bridge: the ``corral.bridges`` entry points.

A platform is found by name, the ``type`` of a ``[bridges.NAME]`` table, among the Python
entry points of the group ``corral.bridges``. Each names a :class:`BridgeType`: the config
keys the platform adds to the common ones, which of them name secret files, a pure check of
their values, and the ``module:Class`` of its :class:`supervisor.bridges.platform.Platform`,
imported only when a bridge starts (so ``corral check`` and the CLI never import a platform's HTTP client).
corral's own platforms register themselves the same way, in its ``pyproject.toml``::

    [project.entry-points."corral.bridges"]
    telegram = "supervisor.bridges.kinds:TELEGRAM"

so a third party ships a platform as a distribution of its own, without forking corral
(docs/bridges.md, "Adding a platform"). It lives in the config's wing, which reads it to
check a ``[bridges.NAME]`` table; third parties import it as :mod:`supervisor.bridges.registry`.
Nothing here imports Trio or does I/O beyond reading
the installed distributions' metadata, once per process.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from ..core.errors import UsageError

#: The entry-point group a platform registers in.
GROUP = "corral.bridges"


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong in a bridge's table: its key (under ``bridges.NAME.``), what, and the fix."""

    key: str
    message: str
    fix: str


def _no_problems(options: Mapping[str, Any], rooms: Mapping[str, str]) -> list[ConfigProblem]:
    return []


@dataclass(frozen=True, slots=True)
class BridgeType:
    """What a ``corral.bridges`` entry point names: one chat platform.

    ``check`` is pure (no I/O but what the values name: a path it may test): it gets the
    platform's own keys as written (a secret key's value already a :class:`~pathlib.Path`,
    resolved against the config's folder and checked to be a file) and the rooms table, and
    returns the problems ``corral check`` reports. The platform's class gets them as
    ``BridgeConfig.options`` (and the secret files as ``BridgeConfig.secrets``, which the
    sandbox hides from every turn)."""

    name: str
    platform: str
    """``"module:Class"`` of the :class:`supervisor.bridges.platform.Platform`; called with the ``BridgeConfig``."""
    keys: frozenset[str] = frozenset()
    """The keys of ``[bridges.NAME]`` the platform adds to the common ones (``type``, ``rooms``,
    ``admins``, ``users``, ``servers``, ``stoppers``, ``verbosity``, ``invites``,
    ``edit_interval``, ``retry_max``)."""
    secret_keys: frozenset[str] = frozenset()
    """Those of ``keys`` whose value is a file holding a secret (a token): hidden from turns."""
    check: Callable[[Mapping[str, Any], Mapping[str, str]], list[ConfigProblem]] = field(default=_no_problems)
    user_id: str | None = None
    """A regular expression every id in ``admins``, ``users`` and ``stoppers`` must match whole
    (Discord's numeric snowflakes): an allowlist that names someone by a display name would let
    nobody in, silently. None: any string."""

    def platform_class(self) -> Callable[[Any], Any]:
        """The platform's class, called with a :class:`~supervisor.config.settings.BridgeConfig`
        to make a :class:`supervisor.bridges.platform.Platform` (neither named in the types here:
        the settings read this module, and the bridges' wing comes after the config's), imported
        now (raises :class:`UsageError` saying what is missing)."""
        module, _, attr = self.platform.partition(":")
        try:
            found: Callable[[Any], Any] = getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            raise UsageError(f"the {self.name} bridge cannot load {self.platform}: {exc} "
                             f"(install what it needs, e.g. pip install 'corral[{self.name}]')") from None
        except AttributeError:
            raise UsageError(f"the {self.name} bridge names {self.platform}, which does not exist") from None
        return found


@functools.cache
def _found() -> tuple[dict[str, EntryPoint], dict[str, list[str]]]:
    named: dict[str, EntryPoint] = {}
    twice: dict[str, list[str]] = {}
    for point in entry_points(group=GROUP):
        if point.name in named and named[point.name].value != point.value:
            twice.setdefault(point.name, [named[point.name].value]).append(point.value)
            continue
        named[point.name] = point
    return named, twice


def known_types() -> list[str]:
    """The names of every registered platform, sorted."""
    return sorted(_found()[0])


@functools.cache
def bridge_type(name: str) -> BridgeType:
    """The platform registered as ``name``; :class:`UnknownBridgeType` (with the known names) if none is."""
    named, twice = _found()
    if name in twice:
        raise UnknownBridgeType(f"two installed distributions register the bridge type {name!r} "
                                f"({', '.join(twice[name])})", "uninstall one of them")
    point = named.get(name)
    if point is None:
        known = sorted(named)
        if not known:
            raise UnknownBridgeType(
                f"unknown bridge type {name!r}: no bridge types are registered (corral's own come from its "
                f"installed entry points, group {GROUP!r})", "install corral (pip install -e . in a checkout)")
        close = difflib.get_close_matches(name, known, n=1)
        fix = f"did you mean {close[0]!r}?" if close else f"write type = one of: {', '.join(known)}"
        raise UnknownBridgeType(f"unknown bridge type {name!r} (known: {', '.join(known)})", fix)
    try:
        spec = point.load()
    except Exception as exc:  # noqa: BLE001 (a third party's broken module: said, with whose it is)
        raise UnknownBridgeType(f"the bridge type {name!r} ({point.value}) does not load: "
                                f"{type(exc).__name__}: {exc}", "fix or uninstall the distribution that "
                                                                "registers it") from None
    if not isinstance(spec, BridgeType):
        raise UnknownBridgeType(f"the entry point {name!r} ({point.value}) is not a BridgeType",
                                "it must name a supervisor.bridges.registry.BridgeType")
    return spec


class UnknownBridgeType(UsageError):
    """A ``type`` no installed platform registers (or one that does not load)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


def platform_options(
    spec: BridgeType, raw: Mapping[str, Any], rooms: Mapping[str, str], secret: Callable[[str], Path | None]
) -> tuple[dict[str, Any], tuple[Path, ...], list[ConfigProblem]]:
    """A registered platform's part of a ``[bridges.NAME]`` table: its options (secret keys
    resolved by ``secret``, the config's own reader of secret files), the secret files, and
    what its ``check`` finds wrong. The config's ``_bridges`` calls it for every platform but
    the two whose tables it reads itself (Matrix, IRC: typed fields of ``BridgeConfig``)."""
    options = {key: raw[key] for key in spec.keys if key in raw}
    secrets: list[Path] = []
    for key in sorted(spec.secret_keys & set(options)):
        path = secret(key)
        if path is None:
            options.pop(key)
        else:
            options[key] = path
            secrets.append(path)
    problems = spec.check(options, rooms)
    if spec.user_id is not None:
        for key in ("admins", "users", "stoppers"):
            ids = raw.get(key)
            for i, who in enumerate(ids if isinstance(ids, list) else []):
                if not isinstance(who, str) or not re.fullmatch(spec.user_id, who):
                    problems.append(ConfigProblem(f"{key}[{i}]", f"{who!r} is not a {spec.name} user id",
                                                  f"write the user's id (it matches {spec.user_id})"))
    return options, tuple(secrets), problems
