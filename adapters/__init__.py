"""Adapters: one module per agent CLI, each exposing ``ADAPTER``.

An adapter builds a turn's launch and parses its output; it does no I/O. See
:mod:`adapters._base` for the contract and :mod:`adapters.generic` for the line protocol
anyone can speak.
"""

from __future__ import annotations

import importlib

from ._base import (
    Adapter,
    Error,
    Event,
    Launch,
    Parser,
    Result,
    SessionId,
    StaleSession,
    Status,
    Text,
    TodoItem,
    Todos,
    ToolResult,
    ToolUse,
    TurnRequest,
    Unparsed,
    Usage,
)

#: Adapter names and the module that defines each.
KNOWN_ADAPTERS: dict[str, str] = {
    "generic": "adapters.generic",
    "demo": "adapters.demo",
    "claude": "adapters.claude",
    "codex": "adapters.codex",
    "gemini": "adapters.gemini",
    "qwen": "adapters.qwen",
    "aider": "adapters.aider",
    "pi": "adapters.pi",
    "acp": "adapters.acp",
}


def get_adapter(name: str) -> Adapter:
    """The adapter called ``name``; ``KeyError`` if corral has none by that name."""
    module = importlib.import_module(KNOWN_ADAPTERS[name])
    adapter = module.ADAPTER
    # Every adapter module defines ADAPTER; a module that does not is a bug, said plainly.
    if not isinstance(adapter, Adapter):
        raise TypeError(f"{KNOWN_ADAPTERS[name]}.ADAPTER is not an Adapter")
    return adapter


__all__ = [
    "KNOWN_ADAPTERS",
    "Adapter",
    "Error",
    "Event",
    "Launch",
    "Parser",
    "Result",
    "SessionId",
    "StaleSession",
    "Status",
    "Text",
    "TodoItem",
    "Todos",
    "ToolResult",
    "ToolUse",
    "TurnRequest",
    "Unparsed",
    "Usage",
    "get_adapter",
]
