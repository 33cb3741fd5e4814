"""The ``claude`` adapter: Claude Code in print mode with ``stream-json`` input and output.

Theory of operation
-------------------

A turn is ``claude -p --input-format stream-json --output-format stream-json --verbose
--include-partial-messages [flags]`` with the prompt on stdin, as one JSON line
``{"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": …}]}}``:
out of argv, where other users could read it, and out of reach of the option parser, so a
prompt that starts with ``-`` is never an option and the variadic options a user may put in
``args`` (``--allowedTools A B``) cannot eat it.
A resumed turn adds ``--resume SESSION_ID``; Claude Code keeps the same id on resume, and
finds the conversation only from the same working directory.

stdin stays open after the prompt (``keep_stdin``) so that a message handed to the running
turn (:func:`user_message`, the adapter's ``steer``) is written there as another such line.
Measured with 2.1.197: one written while a tool runs is carried into the *next* model
request, as a message "The user sent a new message while you were working:\nTEXT" — the
turn takes it mid-turn; one written while the model streams text, with no tool boundary
left, is answered after the first ``result`` as a second answer of the same process
(another ``system/init`` … ``result``), even when stdin is closed right after the first
``result``. corral closes stdin at that first ``result`` (the CLI would otherwise wait for
more input), so a later message is queued, and reads stdout to its end: the second answer
belongs to this turn. Only user messages are written, never a control request (which would
need a ``request_id``).

stdout is one JSON object per line (measured with 2.1.197, see
``tests/data/captures/claude/``):

==========================  =====================================================
line                        events
==========================  =====================================================
``system/init``             :class:`SessionId` (first line of every turn)
``system/api_retry``        :class:`Status` (the CLI retries a failed model call)
``stream_event``            :class:`Text` deltas as the model writes (the partial
                            messages): shown as a draft at once; the whole
                            ``assistant`` message's text then is not posted again
``assistant``               :class:`Text` per text block, :class:`ToolUse` per tool
                            call, :class:`Todos` for a ``TodoWrite`` call; a
                            synthetic message with an ``error`` key is an
                            :class:`Error` ("API Error: 400 …")
``user``                    :class:`ToolResult` per ``tool_result`` block;
                            ``[Request interrupted by user…]`` is a :class:`Status`
``result``                  :class:`Result` on success; :class:`Error` then
                            ``Result(ok=False)`` when ``is_error``;
                            :class:`StaleSession` when the resumed id is unknown
==========================  =====================================================

Usage (:class:`Usage`), as it goes and at the end. Each model call's ``usage`` comes three
times: in the ``stream_event`` ``message_start`` (its input and cache figures, and
``output_tokens: 1``), on every ``assistant`` line of the message (one per content block,
all with the message's id and that same start-of-message usage), and in the
``message_delta`` (its final ``output_tokens``). They are counted once per message id, each
figure at its highest, as soon as it is reported: the input when the call starts, the output
when it ends (:class:`~adapters._common.UsageTotals`). The ``result`` line then has the
whole run's ``usage`` and ``total_cost_usd`` (per process: a resumed session starts again
at 0, measured), and **it wins**: it adds what it says beyond the messages' sum, figure by
figure, and is the only cost Claude Code reports. Why it wins: without the partial
messages, or for a call whose ``message_delta`` never came, the messages' output is the
start-of-message 1 (the captures: 2 output tokens over two messages, 54 in the result),
and the result also covers what the stream never shows (side calls, which it prices);
it never takes anything back, so nothing counted as it went is uncounted at the end.
A subagent's messages (``parent_tool_use_id``) are counted too: what it spends is the turn's.

A stale session id ("No conversation found with session ID: …", or "--resume requires a
valid session ID …" for a value that is not a UUID) is reported in the ``result`` line's
``errors`` *and* on stderr; both paths yield one :class:`StaleSession`, and the stale
line's ``session_id`` (the unknown id itself, or a throwaway one) is never reported as a
:class:`SessionId`.

On SIGINT to its process group the CLI kills its tool tree (which runs in a session of its
own), prints a ``result`` line with ``subtype: error_during_execution`` and exits with 0, 1
or, now and then, -9: the exit status alone says nothing, so the parser goes by the lines.

The plan tool: Claude Code 2.1 replaced ``TodoWrite`` by ``TaskCreate``/``TaskUpdate``
(one call per item, ids assigned by the CLI). ``CLAUDE_CODE_ENABLE_TASKS=0`` brings
``TodoWrite`` back, whose input is the whole plan: that is what :class:`Todos` needs.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._base import (
    Adapter,
    Error,
    Event,
    Launch,
    Result,
    SessionId,
    Status,
    Text,
    ToolUse,
    TurnRequest,
    Unparsed,
    parse_todos,
    preview,
)
from ._common import (
    PartialText,
    TurnEnd,
    UsageTotals,
    anthropic_figures,
    blocks_text,
    by_type,
    feed_json,
    fresh_session_id,
    money,
    permission_denials,
    text_of,
    tool_result,
    unfinished_turn,
)

#: The CLI's plan tool; its calls become :class:`Todos`, not tool entries.
TODO_TOOL = "TodoWrite"

#: Environment of every turn. Telemetry and update checks would reach api.anthropic.com
#: (and hang or fail offline); ``CLAUDE_CODE_ENABLE_TASKS=0`` restores ``TodoWrite``.
BASE_ENV: Mapping[str, str] = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_ENABLE_TASKS": "0",
}

#: Unattended turns bypass permission prompts; as root the CLI refuses the bypass unless
#: it is told it runs in a sandbox.
UNATTENDED_ARGS: tuple[str, ...] = ("--dangerously-skip-permissions",)
UNATTENDED_ENV: Mapping[str, str] = {"IS_SANDBOX": "1"}

#: What the CLI says, on stderr and in the ``result`` line, when it cannot resume.
STALE_MARKERS: tuple[str, ...] = (
    "No conversation found with session ID",
    "--resume requires a valid session ID",
)

#: The input key that says the most about a call of each well-known tool.
PREVIEW_KEYS: Mapping[str, str] = {
    "Bash": "command",
    "Read": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "Write": "file_path",
    "NotebookEdit": "notebook_path",
    "Grep": "pattern",
    "Glob": "pattern",
    "WebFetch": "url",
    "WebSearch": "query",
    "Task": "description",
}

#: ``system`` subtypes that carry nothing for the transcript.
QUIET_SYSTEM: frozenset[str] = frozenset({"hook_started", "hook_response", "status", "task_started", "task_progress",
                                          "task_notification", "files_persisted"})
#: Line types that carry nothing for the transcript.
#: The API Claude Code calls when the agent's ``env`` sets no ``ANTHROPIC_BASE_URL``.
DEFAULT_API = "https://api.anthropic.com"
#: What Claude Code's "API Error: Unable to connect to API (…)" names, in words (captured:
#: ``tests/data/captures/claude/api-unreachable.jsonl``; Node's error codes for the rest).
UNREACHABLE_REASONS: tuple[tuple[str, str], ...] = (
    ("ConnectionRefused", "the connection was refused (nothing listens there)"),
    ("ECONNREFUSED", "the connection was refused (nothing listens there)"),
    ("ENOTFOUND", "its host name did not resolve (DNS)"),
    ("EAI_AGAIN", "its host name did not resolve (DNS)"),
    ("ETIMEDOUT", "the connection timed out"),
    ("Timeout", "the connection timed out"),
    ("ECONNRESET", "the connection was reset"),
    ("CERT", "its TLS certificate was not accepted"),
)
QUIET_TYPES: frozenset[str] = frozenset({"rate_limit_event", "keep_alive", "tool_progress"})
#: Stream text as the model writes it (``stream_event`` lines): what a follower sees at once.
PARTIAL_ARGS: tuple[str, ...] = ("--include-partial-messages",)


#: Read the prompt, and every message after it, as JSON lines on stdin.
INPUT_ARGS: tuple[str, ...] = ("--input-format", "stream-json")


def user_message(text: str) -> bytes:
    """One message from the user as a line of the CLI's stream-json input (the prompt, and
    each message handed to the running turn): JSON escapes every newline of ``text``, so a
    message is always exactly one line, and (ASCII escapes) any string encodes, even one with
    a lone surrogate."""
    message = {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]}}
    return json.dumps(message).encode() + b"\n"


def build_launch(request: TurnRequest) -> Launch:
    """Print mode, stream-json in and out; bypass permissions when unattended; the prompt
    on stdin, which stays open for messages handed to the running turn."""
    argv: list[str] = [*request.command, "-p", *INPUT_ARGS, "--output-format", "stream-json", "--verbose",
                       *PARTIAL_ARGS]
    env = dict(BASE_ENV)
    if request.unattended:
        argv += UNATTENDED_ARGS
        env.update(UNATTENDED_ENV)
    if request.model:
        argv += ["--model", request.model]
    if request.session_id:
        argv += ["--resume", request.session_id]
    argv += request.args
    # The prompt goes on stdin (print mode reads it there when argv has none): out of argv,
    # where every user of the machine can read it in /proc/PID/cmdline.
    return Launch(argv=tuple(argv), env=env, cwd=request.cwd, stdin=user_message(request.prompt), keep_stdin=True)


def tool_preview(name: str, tool_input: object) -> str:
    """The telling field of a well-known tool's input, or the whole input, bounded."""
    key = PREVIEW_KEYS.get(name)
    if key and isinstance(tool_input, dict) and isinstance(tool_input.get(key), str):
        return preview(tool_input[key])
    return preview(tool_input)


def _result_block(block: object) -> str | None:
    """A ``tool_result`` content block: its text, or ``[image]`` and the like for the rest."""
    if not isinstance(block, dict):
        return None
    text = block.get("text")
    if block.get("type") == "text" and isinstance(text, str):
        return text
    return f"[{block.get('type', 'block')}]"


def result_text(content: object) -> str:
    """The text of a ``tool_result``'s content: a string, or a list of text/image blocks."""
    return blocks_text(content, _result_block)


def stale_text(text: str) -> bool:
    """Whether ``text`` is the CLI saying it cannot resume the session it was given."""
    return any(marker in text for marker in STALE_MARKERS)


@dataclass(slots=True)
class ClaudeParser:
    """Turns Claude Code's stream-json lines into events; see the module docstring."""

    session_id: str | None = None
    """The last session id reported, so a repeated one is not reported twice."""
    end: TurnEnd = field(default_factory=TurnEnd)
    _todo_calls: set[str] = field(default_factory=set)
    """Ids of TodoWrite calls: their results are bookkeeping, not tool output."""
    _errors: set[str] = field(default_factory=set)
    """Error texts already reported (the result line repeats the synthetic message's)."""
    _partial: PartialText = field(default_factory=PartialText)
    """The messages whose text came as ``stream_event`` deltas."""
    _usage: UsageTotals = field(default_factory=UsageTotals)
    """The usage reported so far (per message id), so no model call is counted twice."""
    _streaming: dict[str, tuple[str, object]] = field(default_factory=dict)
    """The id and model of the message each stream (the main one, each subagent's) is writing."""
    api: str = DEFAULT_API
    """The model API the CLI calls (``ANTHROPIC_BASE_URL`` of the agent's ``env``, else Anthropic's):
    named when a call fails, so "which endpoint, and why" is said while it retries."""

    # ------------------------------------------------------------ entry points

    def feed(self, line: str) -> list[Event]:
        """Parse one stdout line; never raises."""
        return feed_json(line, self._dispatch, malformed="malformed {kind!r} line: {exc}")

    def _dispatch(self, obj: dict[str, Any], line: str) -> list[Event] | None:
        return by_type(_HANDLERS, self, obj, line)

    def feed_stderr(self, line: str) -> list[Event]:
        """Spot the stale-session message, which the CLI also prints on stderr."""
        if stale_text(line):
            return self.end.stale(line.strip())
        return []

    def finish(self, returncode: int | None, *, interrupted: bool) -> list[Event]:
        """An Error when the CLI ended without its ``result`` line (killed, crashed)."""
        if self.end.closed:
            return []
        if interrupted:
            return [Error("claude was stopped before the end of its turn")]
        return [unfinished_turn("claude", returncode, reason="before the end of its turn")]

    # ------------------------------------------------------------ line types

    def _session(self, obj: dict[str, Any]) -> list[Event]:
        # After a stale resume the line's id is the unknown one, or a throwaway.
        sid = None if self.end.saw_stale else fresh_session_id(obj, self.session_id)
        if sid is None:
            return []
        self.session_id = sid
        return [SessionId(sid)]

    def _error(self, text: str) -> list[Event]:
        if text in self._errors:
            return []
        self._errors.add(text)
        return [self.end.error(self._explained(text))]

    def _quiet(self, obj: dict[str, Any], line: str) -> list[Event]:
        return []

    def _system(self, obj: dict[str, Any], line: str) -> list[Event]:
        subtype = obj.get("subtype")
        if subtype == "init":
            return self._session(obj)
        if subtype == "api_retry":
            status = obj.get("error_status")
            what = obj.get("error") or "error"
            attempt = f"attempt {obj.get('attempt')} of {obj.get('max_retries')}"
            if status is None and what == "unknown":
                # No HTTP answer at all; Claude Code says which failure only when it gives up.
                return [Status(f"model API at {self.api} unreachable (no answer: the connection was refused, "
                               f"its name did not resolve, or it timed out); retrying, {attempt}")]
            code = f" {status}" if status is not None else ""
            return [Status(f"model API at {self.api} answered{code} ({what}); retrying, {attempt}")]
        if subtype == "compact_boundary":
            return [Status("conversation compacted")]
        if subtype in QUIET_SYSTEM:
            return []
        return [Unparsed(line, f"unhandled system subtype {subtype!r}")]

    def _stream_event(self, obj: dict[str, Any], line: str) -> list[Event]:
        return self._stream_usage(obj) + self._partial.delta(obj)

    def _stream_usage(self, obj: dict[str, Any]) -> list[Event]:
        """A message's usage at its start (``message_start``) and end (``message_delta``)."""
        event = obj.get("event")
        if not isinstance(event, Mapping):
            return []
        stream = str(obj.get("parent_tool_use_id") or "")
        if event.get("type") == "message_start":
            message = event.get("message")
            if not isinstance(message, Mapping) or not isinstance(message.get("id"), str):
                return []
            self._streaming[stream] = (message["id"], message.get("model"))
            return self._message_usage(message["id"], message.get("usage"), message.get("model"))
        writing = self._streaming.get(stream)
        if event.get("type") == "message_delta" and writing is not None:
            return self._message_usage(writing[0], event.get("usage"), writing[1])
        return []

    def _message_usage(self, mid: str, usage: object, model: object) -> list[Event]:
        figures = anthropic_figures(usage)
        if figures is None:
            return []
        return self._usage.message(mid, figures, model=model if isinstance(model, str) and model else None)

    def _assistant(self, obj: dict[str, Any], line: str) -> list[Event]:
        message = obj.get("message")
        if not isinstance(message, dict):
            return [Unparsed(line, "'assistant' without a message")]
        blocks = message.get("content")
        if not isinstance(blocks, list):
            return [Unparsed(line, "'assistant' message without content blocks")]
        # A subagent's words are progress, not the answer; the CLI marks them with the
        # id of the Task call they belong to.
        nested = bool(obj.get("parent_tool_use_id"))
        failed = obj.get("error") is not None
        streamed = self._partial.streamed(message)
        events: list[Event] = []
        if isinstance(message.get("id"), str):
            events += self._message_usage(message["id"], message.get("usage"), message.get("model"))
        for block in blocks:
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text" and isinstance(block.get("text"), str):
                text = block["text"]
                if failed:
                    events += self._error(text)
                elif nested:
                    events.append(Status(text))
                elif text and not streamed:
                    events.append(Text(text))
            elif btype == "tool_use":
                events += self._tool_use(block)
        return events

    def _tool_use(self, block: dict[str, Any]) -> list[Event]:
        name = str(block.get("name") or "?")
        tool_input = block.get("input")
        if name == TODO_TOOL and isinstance(tool_input, dict):
            todos = parse_todos(tool_input.get("todos"))
            if todos is not None:
                self._todo_calls.add(str(block.get("id")))
                return [todos]
        return [ToolUse(name, tool_preview(name, tool_input))]

    def _user(self, obj: dict[str, Any], line: str) -> list[Event]:
        message = obj.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            return [Unparsed(line, "'user' message without content")]
        events: list[Event] = []
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                if str(block.get("tool_use_id")) in self._todo_calls:
                    continue
                events.append(tool_result(block, _result_block))
            elif block.get("type") == "text" and str(block.get("text", "")).startswith("[Request interrupted"):
                # The CLI's own record of the stop (SIGINT), echoed as a user message.
                events.append(Status(block["text"].strip("[]")))
        return events

    def _result(self, obj: dict[str, Any], line: str) -> list[Event]:
        self.end.result()
        errors = [str(e) for e in obj.get("errors") or [] if e]
        text = text_of(obj.get("result"))
        failed = bool(obj.get("is_error")) or obj.get("subtype") != "success"
        if failed:
            stale = [e for e in errors if stale_text(e)]
            if stale:
                return self.end.stale(stale[0])
        events: list[Event] = self._session(obj)
        events += self._result_usage(obj)
        events += permission_denials(
            obj.get("permission_denials"),
            lambda name, denial: tool_preview(name, denial.get("tool_input")),
            unnamed="?",
        )
        if not failed:
            events.append(Result(text or "", ok=True))
            return events
        events += self._error(text or self._failure_text(obj, errors))
        events.append(Result("", ok=False))
        return events

    def _result_usage(self, obj: dict[str, Any]) -> list[Event]:
        """The run's totals: what they add beyond the messages' (the module docstring)."""
        figures = anthropic_figures(obj.get("usage")) or (0, 0, 0, 0)
        models = obj.get("modelUsage")
        model = next(iter(models)) if isinstance(models, Mapping) and len(models) == 1 else None
        cost = money(obj.get("total_cost_usd"))
        return self._usage.totals(figures, cost, "USD" if cost is not None else None,
                                  model=model if isinstance(model, str) else None)

    def _explained(self, text: str) -> str:
        """A failed model call's words with the reason in plain words and the API it tried
        ("API Error: Unable to connect to API (ConnectionRefused)" says neither plainly)."""
        if not text.startswith("API Error:"):
            return text
        if text.startswith("API Error: Unable to connect"):
            for marker, reason in UNREACHABLE_REASONS:
                if marker in text:
                    return f"Claude Code could not reach the model API at {self.api}: {reason} ({text})"
            return f"Claude Code could not reach the model API at {self.api} ({text})"
        return f"{text} (model API at {self.api})"

    @staticmethod
    def _failure_text(obj: dict[str, Any], errors: list[str]) -> str:
        """Words for a failed turn whose result line has no text of its own."""
        reason = obj.get("terminal_reason")
        if isinstance(reason, str) and reason.startswith("aborted"):
            return "claude: turn interrupted"
        # "[ede_diagnostic] …" entries are the CLI's internal bookkeeping, not a message.
        useful = [e for e in errors if not e.startswith("[ede_diagnostic]")]
        if useful:
            return "; ".join(useful)
        return f"claude: {obj.get('subtype') or 'error'}"


#: The handler of each line type; the quiet types carry nothing for the transcript.
_HANDLERS: dict[str, Callable[[ClaudeParser, dict[str, Any], str], list[Event]]] = {
    "system": ClaudeParser._system,
    "assistant": ClaudeParser._assistant,
    "user": ClaudeParser._user,
    "result": ClaudeParser._result,
    "stream_event": ClaudeParser._stream_event,
    **dict.fromkeys(QUIET_TYPES, ClaudeParser._quiet),
}


def new_parser(request: TurnRequest) -> ClaudeParser:
    """A fresh parser for one turn (it names the API the agent's ``env`` points it at)."""
    return ClaudeParser(api=request.env.get("ANTHROPIC_BASE_URL") or DEFAULT_API)


ADAPTER = Adapter(
    name="claude",
    install="npm install -g @anthropic-ai/claude-code",
    login=("~/.claude/.credentials.json", "ANTHROPIC_API_KEY"),
    default_command=("claude",),
    model_hosts=("api.anthropic.com", "statsig.anthropic.com", "console.anthropic.com"),
    build_launch=build_launch,
    new_parser=new_parser,
    # Measured: SIGINT makes the CLI kill its tool tree (in a session of its own) and exit
    # within ~0.15 s; SIGTERM can leave the tool running, SIGKILL always does.
    interrupt_signal=signal.SIGINT,
    steer=user_message,
    memory_estimate=512 << 20,
)
