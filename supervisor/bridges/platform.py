"""The interface a chat platform implements for a bridge: connect, receive, post, edit, react.

A platform module (:mod:`.matrix`, :mod:`.irc`) knows its wire and nothing of corral: it
turns what arrives into :data:`.core.Inbound` events, in batches that end with a cursor
(Matrix's sync token; IRC has none), and carries out :data:`.core.Op` operations. It
raises :class:`Transient` for what a retry may cure (the server down, slow, restarted, a
rate limit with its ``retry_after``) and :class:`Refused` for what it will not (a
forbidden room, an event the server rejects); the runner (:mod:`.runner`) decides what to
do with either. A platform is found by the ``type`` of its table among the ``corral.bridges``
entry points (:mod:`.registry`): a third party adds one without forking corral.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..core.errors import CorralError
from .core import Edit, Inbound, Post, React


class PlatformError(CorralError):
    """A platform's failure."""


class Transient(PlatformError):
    """Worth a retry: after ``retry_after`` seconds if the server said so, else after a backoff."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Refused(PlatformError):
    """The server refused for good (forbidden, too large, malformed): a retry would not help."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Events that arrived together, and the cursor to resume after them (None: the platform has none)."""

    events: tuple[Inbound, ...]
    cursor: str | None


class Platform(Protocol):
    """One connection of a bridge to its chat service."""

    kind: str
    """``"matrix"``, ``"irc"``: what the logs call it."""
    can_edit: bool
    """Whether :meth:`edit` changes a posted message (else drafts are not shown and edits are skipped)."""
    idempotent_posts: bool
    """Whether posting the same op key twice shows it once (then a post is marked done after it
    is made: at least once, deduplicated by the server; else before: at most once)."""
    # Optional: ``confirms_on_read = True`` where asking for the next batch makes the server forget
    # the last (Telegram's offset): the runner then asks only once the last batch is handled.
    scope: str
    """Set by the runner before :meth:`connect`: a short id of the store, for what must be unique
    per store (Matrix's transaction ids)."""

    async def connect(self) -> None:
        """Log in and check who the bridge is (raises :class:`Refused` for a bad token)."""

    async def rooms(self, configured: Mapping[str, str]) -> dict[str, str]:
        """Resolve the configured rooms (ids, aliases) to room ids and join them; returns room id →
        channel for the rooms that can be bridged (an end-to-end encrypted one is refused, logged)."""

    async def join(self, room: str) -> bool:
        """Join a room the bridge was invited to; False if it cannot be bridged."""

    def events(self, cursor: str | None) -> AsyncIterator[Batch]:
        """Batches of events after ``cursor`` (None: from now on, skipping history), forever."""

    async def post(self, op: Post) -> str:
        """Post; returns the platform's event id."""

    async def edit(self, op: Edit, target: str) -> str:
        """Replace the text of the platform event ``target``; returns the edit's event id."""

    async def react(self, op: React) -> str:
        """React to an event; returns the reaction's event id."""

    def server_of(self, sender: str) -> str | None:
        """The server a sender id belongs to (what ``servers`` allowlists), if the platform has one."""

    async def aclose(self) -> None:
        """Close the connection."""
