"""Starting a channel over (reset) and sending again what a stop dropped (resend): the decisions.

Pure, no I/O, like the ledger: the supervisor reads what they need, asks, and carries the
answer out in the same synchronous step.

* **Reset** forgets a channel's conversation for some agents (all of them, or one): their
  session ids (the next turn starts a new conversation; the working folder stays) and their
  todo plans (no nudge follows), recorded as a ``status`` entry that says so. It never acts
  on a running turn behind the user's back: while one of those agents runs (or prepares) a
  turn there, the reset is refused with :class:`ChannelBusy`, naming the turns and the fix
  (stop first, or ask for ``stop=True``: the supervisor then stops the channel, and resets
  once the stop is complete). Queued messages stay queued: they run in the new conversation.
* **Resend** sends again, once, a person's message that a stop dropped: the same text, by
  the same author, to the agents it went to. The original entry records the new one's seq
  (``resent_as``) in the new message's own transaction, so a second resend, even after a
  restart, is refused and names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import CorralError, UsageError


class ChannelBusy(CorralError, RuntimeError):
    """The request would act on a running turn; the message says which, and the fix."""


def reset_refusal(channel: str, running: Mapping[str, str]) -> ChannelBusy | None:
    """Why a reset of ``channel`` cannot go on now (``running``: agent -> turn id), or None."""
    if not running:
        return None
    turns = ", ".join(f"{agent}'s turn {turn}" for agent, turn in sorted(running.items()))
    return ChannelBusy(
        f"channel {channel!r} is running {turns}; a reset never acts on a running turn — fix: stop it first "
        f"(`corral stop {channel}`), or reset with --stop (the API's {{\"stop\": true}}) to stop it and then reset"
    )


def reset_text(agents: Sequence[str], *, stopped: bool) -> str:
    """The entry that records a reset."""
    who = ", ".join(agents)
    first = "Stopped, then conversation reset" if stopped else "Conversation reset"
    if not agents:
        return f"{first}: no agent has a conversation here yet, so there was nothing to forget."
    return (f"{first}: {who} start{'s' if len(agents) == 1 else ''} a new conversation here "
            f"(session and plan forgotten); earlier messages stay in the transcript.")


def resend_refusal(channel: str, seq: int, entry: Mapping[str, Any] | None, *, in_flight: bool) -> str | None:
    """Why entry ``seq`` (its ``author``, ``kind`` and ``meta``) cannot be sent again, or None."""
    if entry is None:
        return f"channel {channel!r} has no entry {seq}; `corral tail {channel}` lists them"
    meta = entry.get("meta") or {}
    if entry.get("kind") != "message" or not str(entry.get("author", "")).startswith("human:"):
        return f"entry {seq} of {channel!r} is not a person's message; only those are sent again"
    if not meta.get("dropped_by_stop"):
        return f"entry {seq} of {channel!r} was not dropped by a stop (it ran, or waits to); nothing to send again"
    if meta.get("resent_as") is not None:
        return f"entry {seq} of {channel!r} was sent again already, as entry {meta['resent_as']}"
    if in_flight:
        return f"entry {seq} of {channel!r} is being sent again right now"
    return None


def resend_targets(meta: Mapping[str, Any]) -> list[str]:
    """The agents a dropped message went to (its entry's ``to``, else its ``agent``)."""
    to = meta.get("to")
    if isinstance(to, list) and to:
        return [str(t) for t in to]
    agent = meta.get("agent")
    return [str(agent)] if agent else []


def check_resend(channel: str, seq: int, entry: Mapping[str, Any] | None, *, in_flight: bool) -> None:
    """Raise :class:`UsageError` with :func:`resend_refusal`'s reason, if there is one."""
    why = resend_refusal(channel, seq, entry, in_flight=in_flight)
    if why is not None:
        raise UsageError(why)
