"""corral: a supervisor for AI coding-agent CLIs, with a Stop that sticks on the first press.

Embedding::

    async with open_supervisor(load_config("corral.toml")) as sup:
        accepted = await sup.send("general", "hello")
        async for entry in sup.follow("general", after=accepted.seq):
            ...
        result = await sup.stop("general")
"""

from ._asyncio_host import AsyncioSupervisor, open_asyncio_supervisor
from ._config import AgentConfig, Config, ConfigError, Limits, Problem, ServerConfig, load_config, parse_config
from ._ledger import LedgerError, StopDecision, StopLedger
from ._store import Entry, StoreError
from ._supervisor import (
    Hooks,
    SHUTDOWN_NOTICE,
    STOP_NOTICE,
    Accepted,
    ShuttingDown,
    StopResult,
    Supervisor,
    UsageError,
    open_supervisor,
)

__all__ = [
    "SHUTDOWN_NOTICE",
    "STOP_NOTICE",
    "Accepted",
    "AsyncioSupervisor",
    "AgentConfig",
    "Config",
    "ConfigError",
    "Entry",
    "Hooks",
    "LedgerError",
    "Limits",
    "Problem",
    "ServerConfig",
    "ShuttingDown",
    "StopDecision",
    "StopLedger",
    "StopResult",
    "StoreError",
    "Supervisor",
    "UsageError",
    "load_config",
    "open_asyncio_supervisor",
    "open_supervisor",
    "parse_config",
]
