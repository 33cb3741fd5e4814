"""The ``codex`` adapter: OpenAI Codex CLI in ``codex exec --json`` mode.

Launch
------

A fresh turn runs ``codex exec --json --skip-git-repo-check --disable plugins [-m MODEL]
[ARGS…] -- PROMPT``; once a thread id is known the turn runs ``codex exec resume … -- ID
PROMPT`` instead (codex resumes from any working directory). ``--disable plugins`` keeps codex
from syncing its plugin marketplace over the network at start-up.

Codex reads its settings from ``$CODEX_HOME/config.toml``, so the adapter writes that file
(``Launch.files``) into the agent's private HOME and points ``CODEX_HOME`` at ``HOME/.codex``:
analytics off, and for an unattended agent ``approval_policy = "never"`` with
``sandbox_mode = "danger-full-access"`` (nobody in a chat can answer an approval prompt; the
``resume`` subcommand has no ``--sandbox`` flag, so the config file is the one place that covers
both forms). Codex ignores ``OPENAI_BASE_URL``; an OpenAI-compatible endpoint is configured with
the ``base_url`` option (and ``env_key``, the variable holding its API key), which defines a
``corral`` model provider speaking the Responses API. Without ``base_url`` codex uses its
built-in OpenAI provider and whatever login lives in ``$CODEX_HOME``.

Output
------

One JSON object per stdout line (``codex exec --json``)::

    {"type":"thread.started","thread_id":"…"}            -> SessionId
    {"type":"turn.started"}                              -> (nothing)
    {"type":"item.started|item.updated|item.completed","item":{…}}
        agent_message {text}                             -> Text (whole messages, no deltas)
        reasoning {text}                                 -> Status
        command_execution {command, aggregated_output, exit_code, status}
                                                         -> ToolUse("exec_command"), ToolResult
        file_change {changes, status}                    -> ToolUse("apply_patch"), ToolResult
        mcp_tool_call {server, tool, arguments, result, error, status}
                                                         -> ToolUse("server.tool"), ToolResult
        web_search {query}                               -> ToolUse("web_search")
        todo_list {items: [{text, completed}]}           -> Todos
        error {message}  (a non-fatal warning)           -> Status
    {"type":"turn.completed","usage":{…}}                -> Result(last agent message)
    {"type":"turn.failed","error":{"message":…}}         -> Error
    {"type":"error","message":"Reconnecting... 1/5 …"}   -> Status (codex retries by itself)
    {"type":"error","message":…}  (anything else)        -> Error

Usage comes only at the end: ``turn.completed``'s ``usage`` is one :class:`Usage`, the
**thread's** totals (``cumulative``: a resumed thread's counts its earlier turns too — the
captured resume, one model call of 100 input tokens, reports 200), in OpenAI's convention:
``input_tokens`` includes ``cached_input_tokens`` (and ``cache_write_input_tokens``), and
``output_tokens`` includes ``reasoning_output_tokens``; the model is the agent's ``model``.
codex prices nothing. A turn stopped before ``turn.completed`` reports no usage at all.

A thread id that does not exist makes codex exit 1 with nothing on stdout and, on stderr,
``Error: thread/resume: thread/resume failed: no rollout found for thread id ID (code -32600)``:
:meth:`CodexParser.feed_stderr` turns that into :class:`StaleSession`.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
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
    TodoItem,
    Todos,
    ToolResult,
    ToolUse,
    TurnRequest,
    Unparsed,
    Usage,
    preview,
)
from ._common import TurnEnd, by_type, count, feed_json, optional_preview, text_of, unfinished_turn

OPTION_KEYS = frozenset({"base_url", "env_key"})

#: Where codex keeps its config, sessions and login, relative to the agent's HOME.
CODEX_DIR = ".codex"

#: The provider name the adapter defines when ``base_url`` is configured.
PROVIDER = "corral"

#: Flags every turn carries, fresh or resumed: JSON lines on stdout; no refusal outside a
#: git repository (a channel's cwd need not be one); no plugin marketplace sync at start-up.
COMMON_FLAGS: tuple[str, ...] = ("--json", "--skip-git-repo-check", "--disable", "plugins")

#: Codex's own message when the thread id given to ``resume`` has no saved rollout (0.171.0:
#: ``Error: thread/resume: thread/resume failed: no rollout found for thread id ID (code -32600)``).
STALE_PATTERNS: tuple[re.Pattern[str], ...] = (re.compile(r"no rollout found for thread id", re.I),)

#: Retry notices codex prints as ``error`` events while it reconnects on its own.
_RETRY = re.compile(r"^\s*Reconnecting\b", re.I)

#: Why a line that is JSON but not an event object is Unparsed.
_NOT_AN_EVENT = "not a JSON object with a string 'type'"

#: ``/bin/bash -lc 'CMD'``: how codex wraps every shell command it reports.
_SHELL_WRAPPER = re.compile(r"^(?:ba|z|da)?sh$")


def _toml_string(value: str) -> str:
    """A TOML basic string; JSON's escapes are valid TOML (non-ASCII is kept verbatim)."""
    return json.dumps(value, ensure_ascii=False)


def _option(options: Mapping[str, object], key: str) -> str | None:
    """A non-empty string option, or None (the config loader checks types; stay total here)."""
    value = options.get(key)
    return value if isinstance(value, str) and value.strip() else None


def config_toml(request: TurnRequest) -> str:
    """The ``$CODEX_HOME/config.toml`` for this turn (rewritten before every turn)."""
    lines = ["# Written by corral before every turn; edits here are overwritten."]
    if request.unattended:
        lines += ['approval_policy = "never"', 'sandbox_mode = "danger-full-access"']
    base_url = _option(request.options, "base_url")
    if base_url is not None:
        env_key = _option(request.options, "env_key") or "OPENAI_API_KEY"
        lines += [
            f"model_provider = {_toml_string(PROVIDER)}",
            "",
            f"[model_providers.{PROVIDER}]",
            f"name = {_toml_string(PROVIDER)}",
            f"base_url = {_toml_string(base_url)}",
            f"env_key = {_toml_string(env_key)}",
            'wire_api = "responses"',
        ]
    # Top-level keys must precede every table, so analytics comes last.
    lines += ["", "[analytics]", "enabled = false", ""]
    return "\n".join(lines)


def build_launch(request: TurnRequest) -> Launch:
    """``codex exec`` (or ``codex exec resume ID``) with the config file and CODEX_HOME."""
    command = request.command or ADAPTER.default_command
    model = ("--model", request.model) if request.model else ()
    # The prompt goes on stdin (a bare "-" tells codex to read it there): out of argv,
    # where every user of the machine can read it in /proc/PID/cmdline.
    stdin = request.prompt.encode()
    if request.session_id:
        head: tuple[str, ...] = (*command, "exec", "resume", *COMMON_FLAGS)
        tail: tuple[str, ...] = ("--", request.session_id, "-")
    else:
        head = (*command, "exec", *COMMON_FLAGS)
        tail = ("--", "-")
    # "--" ends the options, so a session id starting with "-" is never read as a flag.
    argv = (*head, *model, *request.args, *tail)
    env = {"CODEX_HOME": posixpath.join(request.home, CODEX_DIR)}
    return Launch(
        argv=argv,
        env=env,
        cwd=request.cwd,
        stdin=stdin,
        files={f"{CODEX_DIR}/config.toml": config_toml(request)},
    )


def _unwrap_shell(command: str) -> str:
    """``/bin/bash -lc 'echo hi'`` -> ``echo hi``; anything else unchanged."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if len(words) == 3 and _SHELL_WRAPPER.match(words[0].rsplit("/", 1)[-1]) and words[1] in ("-c", "-lc"):
        return words[2]
    return command


@dataclass(slots=True)
class CodexParser:
    """Parser for ``codex exec --json`` (one turn)."""

    session_id: str | None = None
    """The session id the turn was asked to resume, if any."""
    end: TurnEnd = field(default_factory=TurnEnd)
    """``turn.completed``/``turn.failed`` (a result), errors, and an unknown resumed thread (stale)."""
    last_message: str = ""
    """The latest whole ``agent_message``: the turn's final answer once it completes."""
    _last_error: str = ""
    _tools_seen: set[str] = field(default_factory=set)
    _tools_done: set[str] = field(default_factory=set)
    model: str | None = None
    """The agent's configured model, which the usage is of (codex does not name it)."""

    def feed(self, line: str) -> list[Event]:
        """Parse one stdout line; never raises."""
        # An unexpected shape is one codex never printed so far.
        return feed_json(line, self._event, not_object=_NOT_AN_EVENT, malformed="unexpected shape: {exc}")

    def feed_stderr(self, line: str) -> list[Event]:
        """Codex reports an unknown thread id on stderr only; everything else there is log."""
        # Only a resumed turn can have a stale id; elsewhere a look-alike log line is just log.
        if self.session_id and any(p.search(line) for p in STALE_PATTERNS):
            return self.end.stale(line.strip())
        return []

    def _event(self, obj: dict[str, Any], line: str) -> list[Event] | None:
        if not isinstance(obj.get("type"), str):
            return [Unparsed(line, _NOT_AN_EVENT)]
        return by_type(_HANDLERS, self, obj, line)

    def _thread_started(self, obj: dict[str, Any], line: str) -> list[Event]:
        tid = obj.get("thread_id")
        if not isinstance(tid, str) or not tid:
            return [Unparsed(line, "'thread.started' without a thread_id")]
        if self.session_id and tid != self.session_id:
            # ``resume NAME`` with an unknown thread *name* (not a UUID) silently starts a
            # new thread; the turn still runs, so say so rather than retry it.
            return [Status(f"codex could not resume {self.session_id}; started thread {tid}"), SessionId(tid)]
        return [SessionId(tid)]

    def _turn_started(self, obj: dict[str, Any], line: str) -> list[Event]:
        return []

    def _turn_completed(self, obj: dict[str, Any], line: str) -> list[Event]:
        self.end.result()
        return [*self._usage(obj.get("usage")), Result(self.last_message, ok=True)]

    def _usage(self, usage: object) -> list[Event]:
        """The thread's totals so far, in corral's disjoint figures (the module docstring)."""
        if not isinstance(usage, Mapping):
            return []
        cached, written = count(usage.get("cached_input_tokens")), count(usage.get("cache_write_input_tokens"))
        fresh = max(0, count(usage.get("input_tokens")) - cached - written)
        if not any((fresh, cached, written, count(usage.get("output_tokens")))):
            return []
        return [Usage(fresh, count(usage.get("output_tokens")), cached, written, model=self.model, cumulative=True)]

    def _turn_failed(self, obj: dict[str, Any], line: str) -> list[Event]:
        self.end.result()
        err = obj.get("error")
        message = text_of(err.get("message")) if isinstance(err, dict) else ""
        message = message or "codex reported a failed turn"
        if message == self._last_error:
            # The same text already went out as an ``error`` event just before.
            return []
        return [self.end.error(message)]

    def _error(self, obj: dict[str, Any], line: str) -> list[Event]:
        message = text_of(obj.get("message"))
        if _RETRY.match(message):
            return [Status(message)]
        if self.session_id and any(p.search(message) for p in STALE_PATTERNS):
            return self.end.stale(message)
        self._last_error = message
        return [self.end.error(message or "codex reported an error")]

    def _item_event(self, obj: dict[str, Any], line: str) -> list[Event]:
        item = obj.get("item")
        if not isinstance(item, dict):
            return [Unparsed(line, f"{obj['type']!r} without an item")]
        return self._item(item, done=obj["type"] == "item.completed", line=line)

    def _item(self, item: dict[str, object], *, done: bool, line: str) -> list[Event]:
        itype = item.get("type")
        iid = str(item.get("id", ""))
        if itype == "agent_message":
            text = text_of(item.get("text"))
            if not done:
                return []
            self.last_message = text
            return [Text(text)] if text else []
        if itype == "reasoning":
            text = text_of(item.get("text"))
            return [Status(text)] if done and text else []
        if itype == "error":
            # Non-fatal notices ("Model metadata for … not found"); the turn goes on.
            text = text_of(item.get("message"))
            return [Status(text)] if text else []
        if itype == "todo_list":
            return self._todos(item, line)
        if itype == "command_execution":
            use = ToolUse("exec_command", preview(_unwrap_shell(text_of(item.get("command")))))
            output = text_of(item.get("aggregated_output"))
            exit_code = item.get("exit_code")
            failed = item.get("status") in ("failed", "declined") or (isinstance(exit_code, int) and exit_code != 0)
            if failed and not output and isinstance(exit_code, int):
                output = f"exit code {exit_code}"
            return self._tool(iid, use, done, ToolResult(preview(output), is_error=failed))
        if itype == "file_change":
            changes = item.get("changes")
            parts = [
                f"{c.get('kind', '?')} {c.get('path', '?')}" for c in changes if isinstance(c, dict)
            ] if isinstance(changes, list) else []
            use = ToolUse("apply_patch", preview(", ".join(parts)))
            status = text_of(item.get("status"))
            return self._tool(iid, use, done, ToolResult(preview(status), is_error=status == "failed"))
        if itype == "mcp_tool_call":
            name = f"{text_of(item.get('server')) or 'mcp'}.{text_of(item.get('tool')) or '?'}"
            use = ToolUse(name, preview(item.get("arguments", "")))
            err = item.get("error")
            if isinstance(err, dict) and err.get("message"):
                result = ToolResult(preview(text_of(err.get("message"))), is_error=True)
            else:
                res = item.get("result")
                content = res.get("content") if isinstance(res, dict) else res
                result = ToolResult(optional_preview(content), is_error=item.get("status") == "failed")
            return self._tool(iid, use, done, result)
        if itype == "web_search":
            use = ToolUse("web_search", preview(text_of(item.get("query"))))
            # A search reports no output worth showing; its use is the whole story.
            return self._tool(iid, use, False, None)
        return [Unparsed(line, f"unknown item type {itype!r}")]

    def _tool(self, iid: str, use: ToolUse, done: bool, result: ToolResult | None) -> list[Event]:
        """A tool's use once (when first seen) and its result once (when completed)."""
        events: list[Event] = []
        if iid not in self._tools_seen:
            self._tools_seen.add(iid)
            events.append(use)
        if done and result is not None and iid not in self._tools_done:
            self._tools_done.add(iid)
            events.append(result)
        return events

    def _todos(self, item: dict[str, object], line: str) -> list[Event]:
        raw = item.get("items")
        if not isinstance(raw, list):
            return [Unparsed(line, "'todo_list' without items")]
        todos = []
        for entry in raw:
            if not isinstance(entry, dict) or not isinstance(entry.get("text"), str):
                return [Unparsed(line, "'todo_list' item without text")]
            # Codex only says done or not; "not done" is pending.
            todos.append(TodoItem(entry["text"], "completed" if entry.get("completed") is True else "pending"))
        return [Todos(tuple(todos))]

    def finish(self, returncode: int | None, *, interrupted: bool) -> list[Event]:
        """A turn that ended without ``turn.completed``/``turn.failed`` is an error, unless stopped."""
        if interrupted or self.end.closed:
            # A stop is the user's doing (never a success); a stale id is retried by the supervisor.
            return []
        return [unfinished_turn("codex", returncode, reason="without finishing the turn")]


#: The handler of each event type.
_HANDLERS: dict[str, Callable[[CodexParser, dict[str, Any], str], list[Event]]] = {
    "thread.started": CodexParser._thread_started,
    "turn.started": CodexParser._turn_started,
    "turn.completed": CodexParser._turn_completed,
    "turn.failed": CodexParser._turn_failed,
    "error": CodexParser._error,
    "item.started": CodexParser._item_event,
    "item.updated": CodexParser._item_event,
    "item.completed": CodexParser._item_event,
}


def new_parser(request: TurnRequest) -> CodexParser:
    """A fresh parser for one turn."""
    return CodexParser(session_id=request.session_id, model=request.model)


ADAPTER = Adapter(
    name="codex",
    install="npm install -g @openai/codex",
    login=("~/.codex/auth.json", "OPENAI_API_KEY"),
    default_command=("codex",),
    model_hosts=("api.openai.com", "chatgpt.com", "auth.openai.com"),
    build_launch=build_launch,
    new_parser=new_parser,
    # SIGINT makes codex kill its tool's whole tree and exit within ~70 ms (docs/agents.md, "Codex").
    interrupt_signal=signal.SIGINT,
    option_keys=OPTION_KEYS,
    memory_estimate=256 << 20,
)
