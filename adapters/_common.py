"""Pieces of parsing that several JSON-lines adapters share. Pure: no I/O.

Claude Code, Qwen Code (a fork of Gemini CLI whose ``stream-json`` copies Claude's),
Gemini CLI and Codex all print one JSON object per stdout line, so they decode and guard
a line the same way (:func:`feed_json`); Claude and Qwen also share the Anthropic message
shape of tool results and permission denials; and every CLI that can exit without its
end-of-turn line needs the same kind of :class:`Error` (:func:`unfinished_turn`) and the
same bookkeeping to know it (:class:`TurnEnd`). Every JSON-lines parser dispatches a line on
its ``type`` through a table of handlers (:func:`by_type`).

Usage: every CLI that reports what the model used reports running totals somewhere (a
message's usage that grows as it streams, a result line's totals for the whole run); a
:class:`UsageTotals` turns them into :class:`Usage` increments, so a figure reported twice
(per message, then again in the result) is counted once.

What differs between the CLIs is passed in (a dispatch function, a block renderer, a
preview function); nothing here knows a CLI by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from ._base import TOOL_PREVIEW_CHARS, Error, Event, StaleSession, Status, Text, ToolResult, Unparsed, Usage, preview

P = TypeVar("P")

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


def by_type(
    handlers: Mapping[str, Callable[[P, dict[str, Any], str], list[Event]]], parser: P, obj: dict[str, Any], line: str
) -> list[Event] | None:
    """The events of ``handlers[obj["type"]](parser, obj, line)``; ``None`` for an unknown type.

    The parsers' one dispatch style: a module-level table from a line's ``type`` to the
    parser method that handles it, so the line types a CLI prints are listed in one place.
    """
    kind = obj.get("type")
    handler = handlers.get(kind) if isinstance(kind, str) else None
    return None if handler is None else handler(parser, obj, line)


@dataclass(slots=True)
class TurnEnd:
    """What a parser has seen of the end of its turn, for ``finish`` to decide how it ended.

    Every CLI can exit without its end-of-turn line (killed, crashed, out of credit); its
    parser then owes an :class:`Error`, unless the turn is already closed: the CLI reported
    its result, or said the session to resume is unknown (the supervisor retries afresh).
    The last stderr lines explain a failure that stdout does not.
    """

    saw_result: bool = False
    """The CLI printed its end-of-turn line."""
    saw_error: bool = False
    """An :class:`Error` has gone out for this turn."""
    saw_stale: bool = False
    """A :class:`StaleSession` has gone out for this turn."""
    stderr_tail: list[str] = field(default_factory=list)
    """The last :data:`STDERR_TAIL` non-blank stderr lines kept by :meth:`keep_stderr`."""

    @property
    def closed(self) -> bool:
        """The turn needs no closing event from ``finish``: a result or a stale session was seen."""
        return self.saw_result or self.saw_stale

    def result(self) -> None:
        """The end-of-turn line arrived."""
        self.saw_result = True

    def error(self, text: str) -> Error:
        """An :class:`Error` to emit, remembered as seen."""
        self.saw_error = True
        return Error(text)

    def stale(self, text: str) -> list[Event]:
        """One :class:`StaleSession` for the turn: the first report gives it, repeats nothing."""
        if self.saw_stale:
            return []
        self.saw_stale = True
        return [StaleSession(text)]

    def keep_stderr(self, text: str) -> None:
        """Remember a stderr line (already stripped) for the failure message."""
        if text:
            self.stderr_tail = keep_tail(self.stderr_tail, text)

    def last_stderr(self) -> str:
        """The latest stderr line kept, or empty."""
        return self.stderr_tail[-1] if self.stderr_tail else ""


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


@dataclass(slots=True)
class PartialText:
    """Text deltas of the Anthropic-style ``stream_event`` lines that Claude Code and Qwen Code
    print with ``--include-partial-messages``, and which whole messages they already streamed.

    ``message_start`` names the message; each ``content_block_delta`` of type ``text_delta``
    is a :class:`Text` delta; the whole ``assistant`` message follows with the same id, and
    its text (already shown and saved as deltas) must not be posted again. A subagent's
    stream (``parent_tool_use_id``) is its work, not the answer: ignored here."""

    streaming_id: str | None = None
    streamed_ids: set[str] = field(default_factory=set)

    def delta(self, obj: Mapping[str, Any], *, held: Callable[[str], bool] | None = None) -> list[Event]:
        """The events of one ``stream_event`` line. ``held(text)``: the first delta of a message
        that the CLI's whole message will report as something else (an error), not as text."""
        if obj.get("parent_tool_use_id") is not None:
            return []
        event = obj.get("event")
        if not isinstance(event, Mapping):
            return []
        etype = event.get("type")
        if etype == "message_start":
            message = event.get("message")
            mid = message.get("id") if isinstance(message, Mapping) else None
            self.streaming_id = mid if isinstance(mid, str) else None
            return []
        if etype == "content_block_delta":
            delta = event.get("delta")
            text = delta.get("text") if isinstance(delta, Mapping) else None
            if isinstance(delta, Mapping) and delta.get("type") == "text_delta" and isinstance(text, str) and text:
                if held is not None and self.streaming_id not in self.streamed_ids and held(text):
                    return []
                if self.streaming_id is not None:
                    self.streamed_ids.add(self.streaming_id)
                return [Text(text, delta=True)]
        # Block starts/stops, tool-input and thinking deltas: the whole message follows.
        return []

    def streamed(self, message: Mapping[str, Any]) -> bool:
        """Whether this whole message's text was already sent as deltas."""
        return message.get("id") in self.streamed_ids



# ---------------------------------------------------------------- usage


def count(value: object) -> int:
    """A token count from a CLI's JSON: a non-negative integer, anything else (a missing
    field, a bool, a fraction, a negative) 0 — a report is never fatal, and never negative."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value) if value >= 0 and value == int(value) else 0


def money(value: object) -> Decimal | None:
    """A cost from a CLI's JSON as an exact decimal (``0.0021149999999999997`` as printed);
    None unless it is a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return None
    return amount if amount.is_finite() and amount >= 0 else None


#: A usage figure: fresh input, output, cache read, cache write (:class:`Usage`'s order).
Figures = tuple[int, int, int, int]


def anthropic_figures(usage: object) -> Figures | None:
    """The figures of an Anthropic-shaped ``usage`` object (Claude Code, Qwen Code's copy of
    it): ``input_tokens`` is already the fresh input there, the cache's are apart. None when
    it is not an object."""
    if not isinstance(usage, Mapping):
        return None
    return (count(usage.get("input_tokens")), count(usage.get("output_tokens")),
            count(usage.get("cache_read_input_tokens")), count(usage.get("cache_creation_input_tokens")))


def prompt_figures(prompt: object, output: object, cached: object = 0, total: object = 0) -> Figures:
    """The figures of a Gemini-style count (Gemini CLI, Qwen Code): the prompt *includes* the
    cached tokens, and the output excludes the model's thoughts, which the total has (they
    are billed as output, so they are counted as output here)."""
    fresh = max(0, count(prompt) - count(cached))
    written = max(count(output), count(total) - count(prompt))
    return (fresh, written, count(cached), 0)


@dataclass(slots=True)
class UsageTotals:
    """What a turn's parser has reported of its usage, so each new report adds only what is new.

    :meth:`message` takes one model call's figures, which a CLI may report more than once
    (Claude Code: at the message's start, on each of its content blocks, and in its
    ``message_delta``), each time as the call's totals so far: what goes out is the increase
    of each figure over its highest earlier report. :meth:`totals` takes the whole turn's
    totals (a result line) and adds only what they say beyond everything reported so far,
    figure by figure, and the cost beyond the cost so far; it never takes anything back.
    """

    _calls: dict[str, Figures] = field(default_factory=dict)
    _sum: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    _cost: dict[str, Decimal] = field(default_factory=dict)

    def message(self, key: str, figures: Figures, *, model: str | None = None) -> list[Event]:
        """The increase of model call ``key``'s ``figures`` over its earlier reports."""
        before = self._calls.get(key, (0, 0, 0, 0))
        now: Figures = (
            max(before[0], figures[0]), max(before[1], figures[1]),
            max(before[2], figures[2]), max(before[3], figures[3]),
        )
        self._calls[key] = now
        return self._add(tuple(a - b for a, b in zip(now, before, strict=True)), None, None, model)

    def totals(self, figures: Figures, cost: Decimal | None = None, currency: str | None = None,
               *, model: str | None = None) -> list[Event]:
        """What the turn's ``figures`` (and ``cost``) add over everything reported so far."""
        extra = tuple(max(0, total - done) for total, done in zip(figures, self._sum, strict=True))
        more: Decimal | None = None
        if cost is not None and currency:
            more = max(Decimal(0), cost - self._cost.get(currency, Decimal(0)))
        return self._add(extra, more, currency if more is not None else None, model)

    def _add(self, extra: tuple[int, ...], cost: Decimal | None, currency: str | None,
             model: str | None) -> list[Event]:
        if not any(extra) and not cost:
            return []
        for i, n in enumerate(extra):
            self._sum[i] += n
        if cost is not None and currency:
            self._cost[currency] = self._cost.get(currency, Decimal(0)) + cost
        return [Usage(extra[0], extra[1], extra[2], extra[3], cost=cost, currency=currency, model=model)]
