"""corral: a supervisor for AI coding-agent CLIs, with a Stop that sticks on the first press.

Embedding::

    async with open_supervisor(load_config("corral.toml")) as sup:
        accepted = await sup.send("general", "hello")
        async for entry in sup.follow("general", after=accepted.seq):
            ...
        result = await sup.stop("general")

The names below are imported when first used (PEP 562), so ``import supervisor`` (and the
``corral`` CLI's client commands) start without importing Trio, psutil or hypercorn.
Every error corral raises on purpose derives from :class:`CorralError`. What tests use to
reach inside a supervisor (``Hooks``, its ledger and store) is in :mod:`supervisor.testing`.

The code is in wings, sub-packages that import one way, each only from the wings before it:
core < procs < net < store < config < turns < fleet < host < bridges < serve. The top-level modules
(``cli``, ``testing``, ``_demo``) may import any; ``adapters`` is reached through its package's
public names and public modules, never an adapter's private module (``tests/test_wings.py``
reads every import).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config.settings import (
        AgentConfig,
        Config,
        ConfigError,
        Limits,
        Problem,
        ServerConfig,
        load_config,
        parse_config,
    )
    from .core.errors import CorralError, ShuttingDown, UsageError
    from .core.ledger import LedgerError
    from .core.queue import QueueEditRefused, QueueEditResult, QueueFull
    from .core.records import Draft, Entry
    from .core.restart import ChannelBusy
    from .host.supervisor import (
        SHUTDOWN_NOTICE,
        STOP_NOTICE,
        Accepted,
        StopResult,
        Supervisor,
        UnknownChannel,
        open_supervisor,
    )
    from .serve.asyncio_host import AsyncioSupervisor, open_asyncio_supervisor
    from .serve.client import APIError, DaemonUnavailable
    from .serve.daemon import DaemonError
    from .store.store import StoreError, StoreInUse

#: Where each public name lives: ``from supervisor import X`` imports only X's module.
_LAZY = {
    "AsyncioSupervisor": ".serve.asyncio_host",
    "open_asyncio_supervisor": ".serve.asyncio_host",
    "AgentConfig": ".config.settings",
    "Config": ".config.settings",
    "ConfigError": ".config.settings",
    "Limits": ".config.settings",
    "Problem": ".config.settings",
    "ServerConfig": ".config.settings",
    "load_config": ".config.settings",
    "parse_config": ".config.settings",
    "APIError": ".serve.client",
    "DaemonUnavailable": ".serve.client",
    "DaemonError": ".serve.daemon",
    "CorralError": ".core.errors",
    "ShuttingDown": ".core.errors",
    "UsageError": ".core.errors",
    "LedgerError": ".core.ledger",
    "ChannelBusy": ".core.restart",
    "QueueEditRefused": ".core.queue",
    "QueueEditResult": ".core.queue",
    "QueueFull": ".core.queue",
    "Draft": ".core.records",
    "Entry": ".core.records",
    "StoreError": ".store.store",
    "StoreInUse": ".store.store",
    "SHUTDOWN_NOTICE": ".host.supervisor",
    "STOP_NOTICE": ".host.supervisor",
    "Accepted": ".host.supervisor",
    "StopResult": ".host.supervisor",
    "Supervisor": ".host.supervisor",
    "UnknownChannel": ".host.supervisor",
    "open_supervisor": ".host.supervisor",
}

__all__ = [
    "SHUTDOWN_NOTICE",
    "STOP_NOTICE",
    "APIError",
    "Accepted",
    "AgentConfig",
    "AsyncioSupervisor",
    "ChannelBusy",
    "Config",
    "ConfigError",
    "CorralError",
    "DaemonError",
    "DaemonUnavailable",
    "Draft",
    "Entry",
    "LedgerError",
    "Limits",
    "Problem",
    "QueueEditRefused",
    "QueueEditResult",
    "QueueFull",
    "ServerConfig",
    "ShuttingDown",
    "StopResult",
    "StoreError",
    "StoreInUse",
    "Supervisor",
    "UnknownChannel",
    "UsageError",
    "__version__",
    "load_config",
    "open_asyncio_supervisor",
    "open_supervisor",
    "parse_config",
]


def _version() -> str:
    """The installed distribution's version: pyproject.toml's ``[project] version`` is the one source.

    Read straight from the ``corral-*.dist-info/METADATA`` on ``sys.path`` (``corral --version``
    must start fast, and ``importlib.metadata`` costs more than the rest of it); that
    module is the fallback for any other kind of installation.
    """
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("corral-") and name.endswith(".dist-info"):
                try:
                    with open(os.path.join(folder or ".", name, "METADATA"), encoding="utf-8") as metadata:
                        for line in metadata:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break  # the headers end at the first blank line
                except OSError:
                    continue
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("corral")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    if name == "__version__":
        value: Any = _version()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
