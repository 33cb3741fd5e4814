"""The ``gemini`` adapter: Google's Gemini CLI in headless ``stream-json`` mode.

Launch
------

``gemini --output-format=stream-json [--approval-mode=yolo] [--model=M] ARGS
[--resume=ID]`` with the prompt written on stdin, which headless gemini reads as the prompt:
it is out of argv (where every user can read it) and out of reach of the option parser,
so a prompt that starts with ``-`` is never a flag. Without yolo, headless gemini
offers the model no shell tool at all (there is nobody to approve it), so unattended
turns need it. The environment adds:

* ``GEMINI_CLI_NO_RELAUNCH=true`` — otherwise the CLI re-spawns itself as a child node
  whose parent ignores SIGINT/SIGTERM/SIGHUP, one more process between a stop and the work;
* ``GEMINI_CLI_TRUST_WORKSPACE=true`` — headless gemini refuses an untrusted folder;
* ``GEMINI_TELEMETRY_ENABLED=false``;
* ``NO_COLOR=1`` — fatal errors on stderr are otherwise wrapped in ANSI colour codes.

``~/.gemini/settings.json`` (in the agent's private HOME) selects API-key auth
(``GEMINI_API_KEY`` comes from the agent's configured environment) and turns usage
statistics and telemetry off.

Output
------

One JSON object per line (``packages/core/src/output/stream-json-formatter``)::

    {"type":"init","session_id":…,"model":…}
    {"type":"message","role":"user","content":…}            the prompt, echoed
    {"type":"message","role":"assistant","content":…,"delta":true}
    {"type":"tool_use","tool_name":…,"tool_id":…,"parameters":{…}}
    {"type":"tool_result","tool_id":…,"status":"success"|"error","output":…,"error":{…}}
    {"type":"error","severity":"warning"|"error","message":…}
    {"type":"result","status":"success"|"error","error":{"type":…,"message":…},"stats":{…}}

The ``result`` line carries no text: the final answer is the assistant text after the
last tool call. A SIGINT kills gemini with exit status 0 and no ``result`` line, and a
stale ``--resume`` id is reported only on stderr (``Error resuming session: …``,
exit 42), so :meth:`GeminiParser.finish` and :meth:`GeminiParser.feed_stderr` matter.

Usage comes only at the end: the ``result`` line's ``stats`` (this process's, so this
turn's: a resumed turn's are its own, captured) give one :class:`Usage` per model of
``stats.models`` (gemini routes a turn over several: a small one to pick the model, then the
model), or one for the totals when there is no per-model list. Gemini's ``input_tokens`` is
the whole prompt, the ``cached`` part included, and its output leaves out the thoughts that
``total_tokens`` has (counted as output here: they are billed as output). gemini prices
nothing. A turn stopped before its ``result`` reports no usage.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._base import (
    TODO_STATUSES,
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
from ._common import TurnEnd, by_type, feed_json, json_file, optional_preview, prompt_figures, unfinished_turn

#: ``auth_type``: the ``security.auth.selectedType`` written to settings.json
#: (``gemini-api-key`` by default; ``vertex-ai`` for Vertex credentials in the env).
OPTION_KEYS = frozenset({"auth_type"})

#: Where the CLI reads its user settings, relative to HOME.
SETTINGS_PATH = ".gemini/settings.json"

#: What gemini prints on stderr when ``--resume`` names a session it does not have,
#: whether the id is unknown or the working directory has no sessions at all.
STALE_PREFIX = "Error resuming session:"

#: gemini's exit status for a fatal input error, which a failed resume is.
EXIT_FATAL_INPUT = 42

#: gemini's todo tool; its ``todos`` are ``[{"description", "status"}]``.
TODO_TOOL = "write_todos"

#: An ANSI escape sequence (CSI), as gemini's fatal errors may carry.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def settings(request: TurnRequest) -> dict[str, object]:
    """The settings.json for the agent's private HOME."""
    auth = request.options.get("auth_type") or "gemini-api-key"
    return {
        "security": {"auth": {"selectedType": str(auth)}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }


def build_launch(request: TurnRequest) -> Launch:
    """Command, output and approval flags, model, configured args, resume; the prompt on stdin."""
    argv: list[str] = [*request.command, "--output-format=stream-json"]
    if request.unattended:
        argv.append("--approval-mode=yolo")
    if request.model:
        argv.append(f"--model={request.model}")
    # Configured args come after corral's own flags and before the resume. (gemini rejects
    # --yolo next to --approval-mode: an agent that wants another approval mode sets
    # unattended = false and passes its own.)
    argv.extend(request.args)
    if request.session_id:
        argv.append(f"--resume={request.session_id}")
    env = {
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_TELEMETRY_ENABLED": "false",
        "NO_COLOR": "1",
    }
    files = {SETTINGS_PATH: json_file(settings(request))}
    return Launch(argv=tuple(argv), env=env, cwd=request.cwd, stdin=request.prompt.encode(), files=files)


def _todos(parameters: object) -> Todos | None:
    """gemini's ``write_todos`` input as a plan; ``blocked`` (unknown to corral) is pending."""
    if not isinstance(parameters, dict) or not isinstance(parameters.get("todos"), list):
        return None
    items = []
    for item in parameters["todos"]:
        if not isinstance(item, dict):
            return None
        content = item.get("description", item.get("content"))
        status = item.get("status")
        if status == "blocked":
            status = "pending"
        if not isinstance(content, str) or status not in TODO_STATUSES:
            return None
        items.append(TodoItem(content=content, status=status))
    return Todos(tuple(items))


@dataclass(slots=True)
class GeminiParser:
    """Parser for ``gemini --output-format stream-json``."""

    resuming: str | None = None
    """The session id this turn asked to resume, if any."""
    saw_output: bool = False
    end: TurnEnd = field(default_factory=TurnEnd)
    answer: list[str] = field(default_factory=list)
    """Assistant text since the last tool call: the final answer so far."""
    todo_calls: set[str] = field(default_factory=set)

    def feed(self, line: str) -> list[Event]:
        """Parse one stdout line."""
        return feed_json(line, self._dispatch)

    def _dispatch(self, obj: dict[str, Any], line: str) -> list[Event] | None:
        self.saw_output = True
        return by_type(_HANDLERS, self, obj, line)

    def feed_stderr(self, line: str) -> list[Event]:
        """Spot a failed resume, which gemini reports only on stderr; keep a short tail."""
        # Colour codes, should any get through, must not hide the message.
        text = _ANSI.sub("", line).strip()
        if not text:
            return []
        self.end.keep_stderr(text)
        if text.startswith(STALE_PREFIX):
            return self.end.stale(text)
        return []

    # ------------------------------------------------------------ stdout types

    def _init(self, obj: dict[str, Any], line: str) -> list[Event]:
        sid = obj.get("session_id")
        if not isinstance(sid, str) or not sid:
            return [Unparsed(line, "'init' without a session_id")]
        return [SessionId(sid)]

    def _message(self, obj: dict[str, Any], line: str) -> list[Event]:
        content = obj.get("content")
        if not isinstance(content, str):
            return [Unparsed(line, "'message' without a string content")]
        role = obj.get("role")
        if role == "user":
            # The prompt echoed back: corral already shows it.
            return []
        if role != "assistant":
            return [Unparsed(line, f"'message' from unknown role {role!r}")]
        if not content:
            return []
        self.answer.append(content)
        return [Text(content, delta=obj.get("delta") is True)]

    def _tool_use(self, obj: dict[str, Any], line: str) -> list[Event]:
        name = obj.get("tool_name")
        if not isinstance(name, str) or not name:
            return [Unparsed(line, "'tool_use' without a tool_name")]
        # Text before a tool call is commentary; the final answer is what follows the last call.
        self.answer.clear()
        parameters = obj.get("parameters", {})
        if name == TODO_TOOL:
            todos = _todos(parameters)
            if todos is not None:
                if isinstance(obj.get("tool_id"), str):
                    self.todo_calls.add(obj["tool_id"])
                return [todos]
        return [ToolUse(name, preview(parameters))]

    def _tool_result(self, obj: dict[str, Any], line: str) -> list[Event]:
        status = obj.get("status")
        if status not in ("success", "error"):
            return [Unparsed(line, f"'tool_result' with unknown status {status!r}")]
        self.answer.clear()
        is_error = status == "error"
        if obj.get("tool_id") in self.todo_calls and not is_error:
            # The plan is already shown as the channel's todos; its "ok" adds nothing.
            return []
        output = obj.get("output")
        error = obj.get("error")
        if is_error and isinstance(error, dict) and isinstance(error.get("message"), str):
            output = error["message"]
        return [ToolResult(optional_preview(output), is_error=is_error)]

    def _error(self, obj: dict[str, Any], line: str) -> list[Event]:
        message = obj.get("message")
        if not isinstance(message, str):
            return [Unparsed(line, "'error' without a message")]
        if obj.get("severity") == "warning":
            return [Status(message)]
        return [self.end.error(message)]

    def _result(self, obj: dict[str, Any], line: str) -> list[Event]:
        status = obj.get("status")
        self.end.result()
        events: list[Event] = _stats_usage(obj.get("stats"))
        if status == "success":
            return [*events, Result("".join(self.answer), ok=True)]
        error = obj.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str) and message:
            events.append(self.end.error(message))
        elif not self.end.saw_error:
            events.append(self.end.error(f"gemini ended the turn with status {status!r}"))
        # No text: whatever was streamed is already shown, and this is not an answer.
        events.append(Result("", ok=False))
        return events

    # ------------------------------------------------------------ the end

    def finish(self, returncode: int | None, *, interrupted: bool) -> list[Event]:
        """Make sure every turn ends: an Error unless gemini printed its ``result``.

        gemini exits 0 without a ``result`` line when it is killed by SIGINT, so status 0
        alone does not mean success. A stopped turn gets nothing here: the supervisor
        reports the stop itself, and it must never look like a success.
        """
        if interrupted or self.end.closed:
            return []
        if self.resuming and returncode == EXIT_FATAL_INPUT and not self.saw_output:
            # The stale-session message is on stderr; if nobody fed it to us, the exit
            # status before any output still tells a failed resume.
            return self.end.stale(f"gemini could not resume session {self.resuming} (exit {returncode})")
        detail = self.end.last_stderr()
        return [unfinished_turn("gemini", returncode, clean_exit="exited without ending the turn", detail=detail)]


#: The handler of each line type.
_HANDLERS: dict[str, Callable[[GeminiParser, dict[str, Any], str], list[Event]]] = {
    "init": GeminiParser._init,
    "message": GeminiParser._message,
    "tool_use": GeminiParser._tool_use,
    "tool_result": GeminiParser._tool_result,
    "error": GeminiParser._error,
    "result": GeminiParser._result,
}


def _stats_usage(stats: object) -> list[Event]:
    """The ``result`` line's ``stats``: one Usage per model, or one for the totals."""
    if not isinstance(stats, dict):
        return []
    models = stats.get("models")
    counts = models.items() if isinstance(models, dict) and models else [(None, stats)]
    events: list[Event] = []
    for model, each in counts:
        if not isinstance(each, dict):
            continue
        figures = prompt_figures(each.get("input_tokens"), each.get("output_tokens"), each.get("cached"),
                                 each.get("total_tokens"))
        if any(figures):
            events.append(Usage(*figures, model=model))
    return events


def new_parser(request: TurnRequest) -> GeminiParser:
    """A fresh parser for one turn."""
    return GeminiParser(resuming=request.session_id)


ADAPTER = Adapter(
    name="gemini",
    install="npm install -g @google/gemini-cli",
    login=("~/.gemini/oauth_creds.json", "GEMINI_API_KEY"),
    default_command=("gemini",),
    model_hosts=("generativelanguage.googleapis.com", "cloudcode-pa.googleapis.com", "oauth2.googleapis.com"),
    build_launch=build_launch,
    new_parser=new_parser,
    option_keys=OPTION_KEYS,
    memory_estimate=512 << 20,
)
