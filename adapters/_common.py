"""Pieces of parsing that several JSON-lines adapters share. Pure: no I/O.

Claude Code, Qwen Code (a fork of Gemini CLI whose ``stream-json`` copies Claude's),
Gemini CLI and Codex all print one JSON object per stdout line, so they decode and guard
a line the same way (:func:`feed_json`); Claude and Qwen also share the Anthropic message
shape of tool results and permission denials; and every CLI that can exit without its
end-of-turn line needs the same kind of :class:`Error` (:func:`unfinished_turn`).

What differs between the CLIs is passed in (a dispatch function, a block renderer, a
preview function); nothing here knows a CLI by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._base import TOOL_PREVIEW_CHARS, Error, Event, Status, ToolResult, Unparsed, preview

#: What a handler raises on a line of a known type in a shape the CLI never printed so far
#: (``RecursionError``: a pathologically nested value); such a line is Unparsed, not fatal.
SHAPE_ERRORS: tuple[type[Exception], ...] = (AttributeError, TypeError, KeyError, ValueError, RecursionError)

#: How many stderr lines a parser keeps to explain a failure that stdout does not.
STDERR_TAIL = 5

#: Handles one decoded line: its events, or ``None`` when its ``type`` is unknown.
Dispatch = Callable[[dict[str, Any], str], list[Event] | None]


def feed_json(
    line: str,
    dispatch: Dispatch,
    *,
    not_object: str = "not a JSON object",
    malformed: str = "malformed {kind!r}: {exc}",
) -> list[Event]:
    """Decode one JSON-lines stdout line and hand the object to ``dispatch``; never raises.

    A blank line gives nothing; a line that is not JSON, or JSON that is not an object
    (reason ``not_object``), is :class:`Unparsed`. ``dispatch(obj, line)`` returns the events,
    or ``None`` for an unknown ``type`` (``Unparsed("unknown type …")``). An exception of
    :data:`SHAPE_ERRORS` from it makes the line Unparsed with ``malformed`` formatted with
    ``kind`` (the line's ``type``) and ``exc``.
    """
    stripped = line.strip()
    if not stripped:
        return []
    try:
        obj = json.loads(stripped)
    except (ValueError, RecursionError):
        return [Unparsed(line, "not JSON")]
    if not isinstance(obj, dict):
        return [Unparsed(line, not_object)]
    kind = obj.get("type")
    try:
        events = dispatch(obj, line)
    except SHAPE_ERRORS as exc:
        return [Unparsed(line, malformed.format(kind=kind, exc=exc))]
    if events is None:
        return [Unparsed(line, f"unknown type {kind!r}")]
    return events


def json_file(value: object) -> str:
    """The text of a JSON settings file the adapter asks the supervisor to write."""
    return json.dumps(value, indent=2) + "\n"


def text_of(value: object) -> str:
    """``value`` if it is a string, else empty: the CLIs' text fields are optional in practice."""
    return value if isinstance(value, str) else ""


def fresh_session_id(obj: Mapping[str, Any], known: str | None) -> str | None:
    """The line's non-empty string ``session_id`` if it differs from ``known``, else ``None``.

    Claude and Qwen repeat the id on many lines; only a new one is worth a SessionId.
    """
    sid = obj.get("session_id")
    if isinstance(sid, str) and sid and sid != known:
        return sid
    return None


def blocks_text(content: object, render_block: Callable[[object], str | None]) -> str:
    """The text of a message content that is a string or a list of blocks.

    Each block of a list is rendered by ``render_block`` (``None`` drops it) and the parts
    are joined by newlines; no content is empty, anything else a bounded preview.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part for block in content if (part := render_block(block)) is not None)
    return "" if content is None else preview(content)


def tool_result(block: Mapping[str, Any], render_block: Callable[[object], str | None]) -> ToolResult:
    """The :class:`ToolResult` of a ``tool_result`` content block (Anthropic message shape)."""
    text = blocks_text(block.get("content"), render_block)
    return ToolResult(preview(text), is_error=bool(block.get("is_error")))


def optional_preview(value: object, limit: int = TOOL_PREVIEW_CHARS) -> str:
    """:func:`preview` of a tool's input or output, with a missing one (``None``) as empty."""
    return preview(value if value is not None else "", limit)


def permission_denials(
    denials: Any,
    render_input: Callable[[str, Mapping[str, Any]], str],
    *,
    unnamed: str | None = None,
    strip: bool = False,
) -> list[Event]:
    """One ``permission denied: NAME INPUT`` :class:`Status` per entry of a result line's
    ``permission_denials`` (the tool calls the CLI refused to run without asking).

    Entries that are not objects are skipped. An entry whose ``tool_name`` is not a string
    is skipped too, unless ``unnamed`` is given: then the name is ``str(tool_name)``, or
    ``unnamed`` when it is missing or empty. ``render_input(name, entry)`` previews the
    input; ``strip`` drops trailing whitespace (an empty preview) from the text.
    """
    events: list[Event] = []
    # Iterated as is: a non-iterable value raises TypeError, which the caller's guard
    # turns into an Unparsed line.
    for denial in denials or []:
        if not isinstance(denial, dict):
            continue
        raw = denial.get("tool_name")
        if unnamed is not None:
            name = str(raw or unnamed)
        elif isinstance(raw, str):
            name = raw
        else:
            continue
        text = f"permission denied: {name} {render_input(name, denial)}"
        events.append(Status(text.rstrip() if strip else text))
    return events


def keep_tail(tail: Iterable[str], line: str, size: int = STDERR_TAIL) -> list[str]:
    """``tail`` with ``line`` appended, cut to its last ``size`` lines."""
    return [*tail, line][-size:]


def unfinished_turn(
    cli: str,
    returncode: int | None,
    *,
    reason: str = "",
    clean_exit: str | None = None,
    detail: str = "",
) -> Error:
    """The :class:`Error` for a CLI that exited without its end-of-turn line.

    ``"CLI exited with status N[ reason][: detail]"``; with ``clean_exit``, an exit status 0
    reads ``"CLI clean_exit[: detail]"`` instead (the CLIs that exit 0 when killed by SIGINT).
    ``detail`` is typically the last stderr line.
    """
    suffix = f": {detail}" if detail else ""
    if returncode == 0 and clean_exit is not None:
        return Error(f"{cli} {clean_exit}{suffix}")
    because = f" {reason}" if reason else ""
    return Error(f"{cli} exited with status {returncode}{because}{suffix}")
