"""The one base of every error corral raises on purpose.

An embedding program (or a script driving the CLI's client) catches :class:`CorralError`
for anything corral refuses or cannot do — a bad config, a refused request, a write that
could not be stored, a daemon that cannot start or does not answer — and lets anything
else (a bug) propagate. Each subclass keeps its older base too (``ValueError``,
``RuntimeError``), so code that caught those still does.

This module imports nothing: the CLI's client commands import it without Trio.
"""

from __future__ import annotations


class CorralError(Exception):
    """Base of corral's own errors; the message says what is wrong and how to fix it."""


class UsageError(CorralError, ValueError):
    """A request the supervisor refuses: unknown agent, oversized message, bad channel name."""


class ShuttingDown(CorralError, RuntimeError):
    """The supervisor no longer accepts work."""
