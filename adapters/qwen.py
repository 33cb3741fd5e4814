"""The ``qwen`` adapter: Qwen Code (``@qwen-code/qwen-code``) in headless stream-json mode.

Launch
------

``qwen [ARGS] [--resume ID] [--model M] --auth-type openai --output-format stream-json
--include-partial-messages [--yolo]`` with the prompt written on stdin.

* Qwen's option parser (yargs) turns a repeated option into an array, and then crashes
  ("Cannot read properties of undefined") or silently falls back to text output; so an
  option the agent's ``args`` already carry is never added a second time. ``--yolo`` and
  ``--approval-mode`` together are refused, so ``--yolo`` is left out when ``args`` pick a mode.
* The prompt goes on stdin, which headless qwen reads as the query (measured with 0.15.10
  against a fake model): out of argv, where every user can read it, and never parsed as
  options. In argv it could not be the positional query (yargs reads ``-x…`` as an option
  and turns ``0x10`` into ``16``; after ``--`` it is not taken at all, "No input
  provided"), and ``--prompt=`` is deprecated.
* ``~/.qwen/settings.json`` turns off what phones home or spends tokens behind the user's
  back: usage statistics (on by default; they go to an Alibaba RUM host), telemetry, the
  update check, and the managed auto-memory side job (an extra model call with tools after
  each turn). The ``settings`` option is merged over these defaults.

Output
------

One JSON object per line, shaped like Claude Code's: ``system``/``init`` (session id),
``assistant`` (text / ``tool_use`` / ``thinking`` blocks), ``user`` (``tool_result``
blocks), ``stream_event`` (partial text, with ``--include-partial-messages``) and a closing
``result``. Facts this parser relies on, from captures of qwen 0.15.10:

* an API failure is *not* an error result: qwen prints an assistant text
  ``[API Error: 400 …]`` and a ``result`` with ``subtype: success`` and exit status 0;
* resuming an unknown session prints nothing on stdout, and on stderr
  ``No saved session found with ID …`` (or ``… with title "…"`` for a non-UUID), status 1;
* a turn stopped with SIGINT prints the cancelled ``tool_result``
  (``[Operation Cancelled] …``) and no ``result`` line; stderr says ``Operation cancelled.``.

Usage (:class:`Usage`) is each ``assistant`` message's own ``usage``, once per message id,
as the turn goes; qwen's ``input_tokens`` is the whole prompt (the cached part included,
Gemini's count) and its output leaves out the thoughts that ``total_tokens`` has. The
``result`` line's ``usage`` is **not** used: after ``--resume`` it is the whole session's
(the captured resume: one message of 100 input tokens, a result of 200), so it would count
the earlier turns again. qwen prices nothing.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._base import (
    Adapter,
    Event,
    Launch,
    Result,
    SessionId,
    Status,
    Text,
    ToolUse,
    TurnRequest,
    parse_todos,
    preview,
)
from ._common import (
    PartialText,
    TurnEnd,
    UsageTotals,
    by_type,
    count,
    feed_json,
    fresh_session_id,
    json_file,
    optional_preview,
    permission_denials,
    prompt_figures,
    text_of,
    tool_result,
    unfinished_turn,
)

#: ``[agents.NAME]`` keys this adapter reads: ``auth_type`` (default ``"openai"``; empty to
#: let qwen choose), ``settings`` (a table merged into ``~/.qwen/settings.json``),
#: ``partial_messages`` (default true: stream text as it is written).
OPTION_KEYS = frozenset({"auth_type", "settings", "partial_messages"})

#: The settings written to ``~/.qwen/settings.json`` before each turn.
DEFAULT_SETTINGS: dict[str, Any] = {
    # The schema version qwen 0.15 migrates to; written as-is so qwen does not rewrite the file.
    "$version": 4,
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False},
    "memory": {"enableManagedAutoMemory": False},
}

SETTINGS_PATH = ".qwen/settings.json"

#: qwen's todo tool; its calls become :class:`Todos` instead of tool entries.
TODO_TOOL = "todo_write"

# Option names (long and short) that must not be given twice.
_RESUME_OPTS = ("--resume", "-r", "--continue", "-c", "--session-id")
_MODEL_OPTS = ("--model", "-m")
_AUTH_OPTS = ("--auth-type",)
_FORMAT_OPTS = ("--output-format", "-o")
_PARTIAL_OPTS = ("--include-partial-messages",)
_APPROVAL_OPTS = ("--yolo", "-y", "--approval-mode")

# qwen reports a failed model call as answer text of this shape.
_API_ERROR = re.compile(r"^\s*\[API Error\b")
# What qwen prints on stderr for a session it does not have.
_STALE = re.compile(r"No saved session found with (ID|title)\b")


def _has_option(args: tuple[str, ...], names: tuple[str, ...]) -> bool:
    """Whether ``args`` carry one of ``names``, as ``--opt value``, ``--opt=value`` or a flag."""
    for arg in args:
        if arg == "--":
            return False
        for name in names:
            if arg == name or arg.startswith(name + "="):
                return True
    return False


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, tables recursively."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _flag(options: Mapping[str, object], key: str, default: bool) -> bool:
    """A boolean option, tolerant of the strings a config file may hold."""
    value = options.get(key, default)
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


def build_launch(request: TurnRequest) -> Launch:
    """The headless qwen command for one turn (see the module docstring)."""
    args = tuple(request.args)
    argv: list[str] = [*request.command, *args]
    if request.session_id and not _has_option(args, _RESUME_OPTS):
        argv += ["--resume", request.session_id]
    if request.model and not _has_option(args, _MODEL_OPTS):
        argv += ["--model", request.model]
    auth_type = request.options.get("auth_type", "openai")
    if auth_type and not _has_option(args, _AUTH_OPTS):
        argv += ["--auth-type", str(auth_type)]
    if not _has_option(args, _FORMAT_OPTS):
        argv += ["--output-format", "stream-json"]
    if _flag(request.options, "partial_messages", True) and not _has_option(args, _PARTIAL_OPTS):
        argv.append("--include-partial-messages")
    # Nobody in a chat can answer a permission prompt; headless qwen would deny the tool.
    if request.unattended and not _has_option(args, _APPROVAL_OPTS):
        argv.append("--yolo")

    extra = request.options.get("settings") or {}
    settings = _merge(DEFAULT_SETTINGS, extra if isinstance(extra, Mapping) else {})
    env = {
        # Belt and braces with the settings file: OpenTelemetry export and the session
        # title side call stay off whatever the settings say.
        "QWEN_TELEMETRY_ENABLED": "false",
        "QWEN_DISABLE_AUTO_TITLE": "1",
        # The bundled update-notifier would spawn a detached checker that calls npm.
        "NO_UPDATE_NOTIFIER": "1",
    }
    return Launch(
        argv=tuple(argv),
        env=env,
        cwd=request.cwd,
        stdin=request.prompt.encode(),
        files={SETTINGS_PATH: json_file(settings)},
    )


def _result_block(block: object) -> str | None:
    """A ``tool_result`` content block: a text block's text, or a bare string."""
    text = block.get("text") if isinstance(block, dict) else None
    if isinstance(text, str):
        return text
    if isinstance(block, str):
        return block
    return None


@dataclass(slots=True)
class QwenParser:
    """Parser for ``qwen --output-format stream-json`` (with or without partial messages)."""

    session_id: str | None = None
    end: TurnEnd = field(default_factory=TurnEnd)
    _partial: PartialText = field(default_factory=PartialText)
    _todo_calls: set[str] = field(default_factory=set)
    _usage: UsageTotals = field(default_factory=UsageTotals)

    # ------------------------------------------------------------- stdout

    def feed(self, line: str) -> list[Event]:
        """Parse one stdout line."""
        return feed_json(line, self._dispatch)

    def _dispatch(self, obj: dict[str, Any], line: str) -> list[Event] | None:
        events = by_type(_HANDLERS, self, obj, line)
        # Every qwen line carries the session id; the first one seen is reported first.
        return None if events is None else self._session(obj) + events

    def _system(self, obj: dict[str, Any], line: str) -> list[Event]:
        return []

    def _session(self, obj: dict[str, Any]) -> list[Event]:
        """A SessionId the first time an id shows up (every qwen line carries it)."""
        sid = fresh_session_id(obj, self.session_id)
        if sid is None:
            return []
        self.session_id = sid
        return [SessionId(sid)]

    def _assistant(self, obj: dict[str, Any], line: str) -> list[Event]:
        message = obj.get("message") or {}
        blocks = message.get("content") or []
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        # Lines of a subagent (the ``agent`` tool) are its work, not the answer.
        nested = obj.get("parent_tool_use_id") is not None
        # With partial messages the text was already sent as deltas under this id.
        streamed = self._partial.streamed(message)
        events: list[Event] = self._message_usage(message)
        for block in blocks:
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text":
                text = block.get("text")
                if not isinstance(text, str) or not text:
                    continue
                if _API_ERROR.match(text):
                    events.append(self.end.error(text.strip()))
                elif nested:
                    events.append(Status(preview(text)))
                elif not streamed:
                    events.append(Text(text))
            elif btype == "tool_use":
                name = block.get("name")
                if not isinstance(name, str):
                    continue
                tool_input = block.get("input")
                if name == TODO_TOOL and isinstance(tool_input, dict):
                    todos = parse_todos(tool_input.get("todos"))
                    if todos is not None:
                        if isinstance(block.get("id"), str):
                            self._todo_calls.add(block["id"])
                        events.append(todos)
                        continue
                events.append(ToolUse(name, optional_preview(tool_input)))
            # thinking blocks are the model's scratchpad: not shown.
        return events

    def _message_usage(self, message: Mapping[str, Any]) -> list[Event]:
        """One message's usage, once per message id (see the module docstring)."""
        usage = message.get("usage")
        mid = message.get("id")
        if not isinstance(usage, Mapping) or not isinstance(mid, str):
            return []
        figures = prompt_figures(usage.get("input_tokens"), usage.get("output_tokens"),
                                 usage.get("cache_read_input_tokens"), usage.get("total_tokens"))
        model = message.get("model")
        figures = (figures[0], figures[1], figures[2], count(usage.get("cache_creation_input_tokens")))
        return self._usage.message(mid, figures, model=model if isinstance(model, str) and model else None)

    def _user(self, obj: dict[str, Any], line: str) -> list[Event]:
        message = obj.get("message") or {}
        blocks = message.get("content") or []
        events: list[Event] = []
        if not isinstance(blocks, list):
            return events
        for block in blocks:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            if block.get("tool_use_id") in self._todo_calls:
                # The plan is already shown as Todos; its "updated" note adds nothing.
                continue
            events.append(tool_result(block, _result_block))
        return events

    def _stream_event(self, obj: dict[str, Any], line: str) -> list[Event]:
        # A failed model call, dressed as answer text: the whole message that follows becomes
        # an Error instead, so its first delta is held back.
        return self._partial.delta(obj, held=lambda text: _API_ERROR.match(text) is not None)

    def _result(self, obj: dict[str, Any], line: str) -> list[Event]:
        self.end.result()
        events = permission_denials(
            obj.get("permission_denials"), lambda _name, denial: preview(denial.get("tool_input", ""), 120), strip=True
        )
        text = text_of(obj.get("result"))
        if obj.get("is_error") or (isinstance(obj.get("subtype"), str) and obj["subtype"] != "success"):
            err = obj.get("error")
            message = err.get("message") if isinstance(err, dict) else None
            why = message if isinstance(message, str) and message else f"qwen: {obj.get('subtype', 'error')}"
            events.append(self.end.error(why))
            events.append(Result("", ok=False))
        elif _API_ERROR.match(text) or self.end.saw_error:
            # qwen reports a failed model call as a "successful" result whose text is the
            # error; the Error is already out (from the assistant line, or now).
            if not self.end.saw_error:
                events.append(self.end.error(text.strip()))
            events.append(Result("", ok=False))
        else:
            events.append(Result(text, ok=True))
        return events

    # ------------------------------------------------------------- stderr

    def feed_stderr(self, line: str) -> list[Event]:
        """Spot an unknown session id on stderr; keep the last lines for a failure message."""
        text = line.strip()
        if not text:
            return []
        # Stack frames say nothing to a chat user; the message line above them does.
        if not text.startswith("at "):
            self.end.keep_stderr(text)
        if _STALE.search(text):
            return self.end.stale(text)
        return []

    # ------------------------------------------------------------- end

    def finish(self, returncode: int | None, *, interrupted: bool) -> list[Event]:
        """Close the turn: an Error unless a result line (or a stale session) already did."""
        if interrupted or self.end.closed:
            return []
        if self.end.saw_error:
            return [Result("", ok=False)]
        hint = self.end.last_stderr()
        return [unfinished_turn("qwen", returncode, clean_exit="ended without a result", detail=hint)]


#: The handler of each line type (``system`` lines carry only the session id).
_HANDLERS: dict[str, Callable[[QwenParser, dict[str, Any], str], list[Event]]] = {
    "system": QwenParser._system,
    "assistant": QwenParser._assistant,
    "user": QwenParser._user,
    "stream_event": QwenParser._stream_event,
    "result": QwenParser._result,
}


def new_parser(request: TurnRequest) -> QwenParser:
    """A fresh parser for one turn."""
    return QwenParser()


ADAPTER = Adapter(
    name="qwen",
    install="npm install -g @qwen-code/qwen-code",
    login=("~/.qwen/oauth_creds.json", "OPENAI_API_KEY"),
    default_command=("qwen",),
    model_hosts=("dashscope.aliyuncs.com", "dashscope-intl.aliyuncs.com", "chat.qwen.ai", "portal.qwen.ai"),
    build_launch=build_launch,
    new_parser=new_parser,
    # Measured: SIGINT to the group makes qwen cancel the tool and kill its tree (~1 s).
    interrupt_signal=signal.SIGINT,
    option_keys=OPTION_KEYS,
    memory_estimate=512 << 20,
)
