"""The channels' memory: each agent's session, todo plan and last message seen, kept in memory.

Theory of operation
-------------------

A turn asks for its session id, its plan and what it has seen before it begins, many times a
second across channels: those answers come from memory, loaded once at open, never from the
database. The store changes the memory in the same call that accepts the write that stores the
change (a write that then fails is an error its caller sees), so memory is never behind what is
stored. A fleet host that takes a channel over merges in what the store holds of it
(:meth:`ChannelMemory.take_over`): the last owner's turns moved the channel on meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.records import TakeOver
from .statements import Plans, Sessions


class ChannelMemory:
    """Sessions, plans and last-seen messages by (channel, agent), as loaded at open."""

    def __init__(self, sessions: Sessions, todos: Plans, seen: dict[tuple[str, str], int]) -> None:
        self._sessions, self._todos, self._seen = sessions, todos, seen

    def session(self, channel: str, agent: str) -> tuple[str | None, str | None]:
        """``(session id, working directory)`` of this channel and agent."""
        return self._sessions.get((channel, agent), (None, None))

    def sessions_by_channel(self) -> dict[str, dict[str, str]]:
        """Every known session id, by channel and then agent."""
        out: dict[str, dict[str, str]] = {}
        for (channel, agent), (session_id, _) in self._sessions.items():
            if session_id:
                out.setdefault(channel, {})[agent] = session_id
        return out

    def set_session(self, channel: str, agent: str, session_id: str | None, cwd: str) -> None:
        """The agent's session id in the channel (None: forgotten) and its folder."""
        self._sessions[(channel, agent)] = (session_id, cwd)

    def todos(self, channel: str, agent: str) -> list[dict[str, str]]:
        """The channel's current todo plan for ``agent`` (a copy)."""
        return [dict(item) for item in self._todos.get((channel, agent), [])]

    def todo_agents(self, channel: str) -> list[str]:
        """Agents that have a todo plan in ``channel``."""
        return [a for (c, a) in self._todos if c == channel]

    def set_todos(self, channel: str, agent: str, items: list[dict[str, str]]) -> None:
        """The agent's plan in the channel, replaced (by a copy)."""
        self._todos[(channel, agent)] = [dict(i) for i in items]

    def forget(self, channel: str, agents: Sequence[str]) -> None:
        """``agents``' session ids (their folders are kept) and plans in ``channel``, forgotten."""
        for agent in agents:
            known = self._sessions.get((channel, agent))
            if known is not None:
                self._sessions[(channel, agent)] = (None, known[1])
            if (channel, agent) in self._todos:
                self._todos[(channel, agent)] = []

    def seen(self, channel: str, agent: str) -> int | None:
        """The seq of the last message the agent took up in the channel (None: never)."""
        return self._seen.get((channel, agent))

    def saw(self, channel: str, agent: str, message: int) -> None:
        """The agent took up ``message`` (the last seen only moves forward)."""
        self._seen[(channel, agent)] = max(message, self._seen.get((channel, agent), 0))

    def take_over(self, channel: str, found: TakeOver) -> None:
        """(A fleet host that took ``channel``) what the store holds of it replaces what this host
        remembered; the last messages seen only move forward (the last host's turns took some up)."""
        for agent, seq in found.seen.items():
            self.saw(channel, agent, seq)
        for agent, items in found.todos.items():
            self._todos[(channel, agent)] = items
        for agent, (sid, cwd) in found.sessions.items():
            self._sessions[(channel, agent)] = (sid, cwd)
