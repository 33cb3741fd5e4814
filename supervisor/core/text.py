"""Text the store can keep: what is refused, what is repaired. Pure: no I/O.

Theory of operation
-------------------

SQLite stores text as UTF-8, and a Python ``str`` can hold what UTF-8 cannot: a lone
surrogate (``"\\ud800"``), which JSON allows as an escape and which a CLI streaming half
an emoji prints. Such a string fails its write — and, in a group commit, used to fail
everyone else's writes in the same transaction. So every entry is made storable when it
is accepted, before it joins a batch:

* **A human's message is refused** (:func:`check_message`): the sender is there to fix it,
  and a prompt is passed on to a CLI as is. The error names the position and the code
  point, never the text around it. A NUL is refused too: a prompt may travel in argv,
  which cannot hold one.
* **Everything else is repaired** (:func:`repair`): agent output, tool previews, todos and
  every string in ``meta`` (keys too) get U+FFFD for each lone surrogate. Nobody could fix
  them, and losing a whole line of output for half a character is worse. A NUL in agent
  output is kept as is: SQLite stores it, Python reads it back whole, and JSON escapes it.

Anything in a Python ``str`` that UTF-8 refuses is a surrogate code point (a valid pair
from JSON is decoded to one character by :mod:`json`), so one character class finds all.

Text that reaches a terminal or a log is another matter: it is stored as written, and
*shown* through :func:`shown` (``corral tail``, ``tail -f``'s drafts, agent stderr in
corral's log, IRC lines). An agent's text is not trusted, and a terminal obeys what it
prints: ``ESC[2K\\r`` erases the real prefix of a line, OSC 52 writes the clipboard, a
newline starts a line that looks like an entry of its own. So every C0 and C1 control, and
DEL, is shown as a visible escape (``\\x1b``), except a newline and a tab where the place
can take them; and a newline is followed by an indent (:func:`shown`'s ``indent``), so no
line of an entry's text can begin where a real entry's line begins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: The code points UTF-8 cannot encode.
_SURROGATE = re.compile("[\ud800-\udfff]")

#: What a lone surrogate becomes in repaired text.
REPLACEMENT = "\ufffd"


#: C0 controls but tab and newline, DEL, and C1 controls: what a terminal acts on.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: The same with tab and newline.
_ANY_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def shown(text: str, *, indent: str | None = "    ", lines: bool = True) -> str:
    """``text`` as it may reach a terminal or a log: controls made visible, lines indented.

    Every C0 control but tab and newline, DEL and every C1 control becomes ``\\xNN``. With
    ``lines`` false (a log record, one line) tab and newline are escaped too. Otherwise each
    newline is followed by ``indent`` (None: none), so a continuation line cannot pass for
    the start of another entry.
    """
    if not lines:
        return _ANY_CONTROL.sub(_escape, text)
    out = _CONTROL.sub(_escape, text)
    if indent and "\n" in out:
        out = out.replace("\n", "\n" + indent)
    return out


class BadText(ValueError):
    """A human's text that cannot be stored or passed on; the message says where and why."""


def check_message(text: str, what: str = "the message text") -> None:
    """Raise :class:`BadText` unless ``text`` is valid Unicode without NUL.

    The message gives the 0-based character position and the code point, not the text.
    """
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise BadText(
            f"{what} has a lone surrogate U+{ord(bad.group()):04X} at character {bad.start()}; "
            "send valid UTF-8 (a surrogate must be half of a pair)"
        )
    nul = text.find("\0")
    if nul >= 0:
        raise BadText(f"{what} has a NUL character at character {nul}; remove it")


def repair_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (the same object if none)."""
    if _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(REPLACEMENT, text)


def repair(value: Any) -> Any:
    """``value`` with :func:`repair_text` applied to every string in it, keys included.

    Walks dicts (any mapping), lists and tuples; other values are returned as they are.
    """
    if isinstance(value, str):
        return repair_text(value)
    if isinstance(value, Mapping):
        return {repair(k): repair(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [repair(v) for v in value]
    return value
