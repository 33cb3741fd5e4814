"""The router: who a message goes to, and whether an agent's message is handed on.

Theory of operation
-------------------

Pure decisions, no I/O, like the ledger: the supervisor asks, then carries the answer out
in the same synchronous step.

* **Addressing** (:func:`address`). A message goes to its explicit targets (the API's
  ``"to"``, the CLI's ``--to``/``--agent``) if it has any; otherwise to the agents it
  ``@mentions``; otherwise to the channel's default agent. An explicit target that is not
  a configured agent, or not a member of the channel, is an error that names it and
  suggests the closest name. A mention of an unknown name is plain text.
* **Mentions** (:func:`mentions`). ``@NAME`` for NAME a candidate agent, on a word
  boundary: ``@claude,`` and ``(@claude)`` count, ``me@claude.dev`` and ``@claudette``
  do not. Each agent once, in the order first mentioned.
* **Hand-offs** (:func:`route`). An agent's message that mentions other members of the
  channel is routed to each of them (never back to its author), one hop further than
  the message its turn answered (a human's message has 0 hops). While the channel rests
  (a stop, and no human since: the ledger's ``may_route``) nothing is routed, silently:
  the stop's notice has said so. A hand-off that would exceed ``max_hops`` is not
  routed either; the decision says the chain stopped, so the channel can be told.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

#: Characters that may continue a name: a mention must not be followed by one.
_NAME_TAIL = r"[\w-]"


class AddressError(ValueError):
    """An explicit target that cannot be addressed; the message names it and the fix."""

    def __init__(self, name: str, problem: str, suggestion: str | None) -> None:
        self.name = name
        self.suggestion = suggestion
        hint = f"; did you mean {suggestion!r}?" if suggestion else ""
        super().__init__(f"{problem}{hint}")


def did_you_mean(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name``, if any is close."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return close[0] if close else None


@lru_cache(maxsize=64)
def _mention_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    # Longest first, so "@claude-2" is not read as "@claude" (the tail check would also refuse it).
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![\w@.])@({alternatives})(?!{_NAME_TAIL})")


def mentions(text: str, names: Iterable[str]) -> tuple[str, ...]:
    """The names of ``names`` that ``text`` @mentions, each once, in order of first mention."""
    candidates = tuple(sorted(set(names)))
    if not candidates:
        return ()
    found: list[str] = []
    for match in _mention_pattern(candidates).finditer(text):
        if match.group(1) not in found:
            found.append(match.group(1))
    return tuple(found)


_ANY_MENTION = re.compile(rf"(?<![\w@.])@({_NAME_TAIL}+)")


def near_misses(text: str, names: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``(mention, closest name)`` for each ``@word`` of ``text`` that is no name of ``names``
    but close to one (``@revewer``: ``reviewer``): most likely a typo that went elsewhere.

    A mention close to no name (``@everyone``, ``@alice``) is plain text and not listed.
    """
    known = set(names)
    found: list[tuple[str, str]] = []
    for match in _ANY_MENTION.finditer(text):
        word = match.group(1).rstrip("-")
        if word in known or any(word == f for f, _ in found):
            continue
        close = did_you_mean(word, known)
        if close is not None:
            found.append((word, close))
    return tuple(found)


def address(
    text: str, *, to: Sequence[str], members: Sequence[str], default: str, configured: Iterable[str]
) -> tuple[str, ...]:
    """The agents a new message goes to (see the module's theory). Raises :class:`AddressError`.

    ``members`` are the channel's agents (its default first), ``configured`` every agent.
    """
    known = set(configured)
    if to:
        targets: list[str] = []
        for name in to:
            if name not in known:
                raise AddressError(name, f"unknown agent {name!r}", did_you_mean(name, known))
            if name not in members:
                raise AddressError(
                    name, f"agent {name!r} is not a member of this channel (members: {', '.join(members)})",
                    did_you_mean(name, members),
                )
            if name not in targets:
                targets.append(name)
        return tuple(targets)
    return mentions(text, members) or (default,)


@dataclass(frozen=True, slots=True)
class Route:
    """What becomes of an agent's message: hand it to ``targets`` at ``hops``, or not."""

    targets: tuple[str, ...] = ()
    hops: int = 0
    """The hop count each routed message carries."""
    chain_stopped_at: int | None = None
    """Set when the hop limit held a hand-off back: the hops the chain reached."""

    def status(self) -> str | None:
        """The channel's status entry for a chain the hop limit ended, if it did."""
        if self.chain_stopped_at is None:
            return None
        return (
            f"The hand-off chain stopped at {self.chain_stopped_at} hops (max_hops); "
            "it waits for a human to continue."
        )


def route(
    text: str, *, author: str, hops: int, members: Sequence[str], may_route: bool, max_hops: int
) -> Route:
    """Where an agent's stored ``message`` entry goes next.

    ``author`` is the agent that wrote it, ``hops`` the hop count of the message its turn
    answered, ``may_route`` the ledger's answer (the channel does not rest, the turn is
    not stale).
    """
    targets = tuple(name for name in mentions(text, members) if name != author)
    if not targets or not may_route:
        return Route()
    if hops + 1 > max_hops:
        return Route(chain_stopped_at=hops)
    return Route(targets, hops + 1)
