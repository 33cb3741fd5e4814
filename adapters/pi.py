"""The ``pi`` adapter: the pi coding agent (``@mariozechner/pi-coding-agent``) in ``--mode json``.

Why a native adapter: pi speaks no ACP itself (``--mode rpc`` is its own JSON protocol;
ACP comes only through a third-party bridge that drives that mode), while ``--mode json``
prints every session event as a JSON line and ``--session ID`` resumes a conversation: the
per-turn shape the other native adapters have, whose whole tree is one process group.

Launch
------

``pi --mode json [--model M] [--session ID] [--tools read,grep,find,ls] [ARGS]`` with the
prompt on stdin (headless pi reads piped stdin as its prompt; argv is readable by every user).

* ``base_url`` (an OpenAI-compatible endpoint, or another API with ``api``) defines a provider
  ``corral`` in ``~/.pi/agent/models.json`` whose one model is the agent's ``model`` (``--model
  corral/M``), its key read from the variable ``env_key`` (default ``OPENAI_API_KEY``). Without
  it pi uses its built-in providers and their usual keys (``ANTHROPIC_API_KEY``, …).
* pi has no permission prompts: it runs every tool call. An attended agent (``unattended =
  false``) therefore gets only pi's read-only tools (``--tools read,grep,find,ls``).
* ``PI_OFFLINE=1`` (no update check, package check or install ping at start-up) and a
  ``settings.json`` with the install telemetry off and a quiet start.
* Sessions are kept per working directory (``~/.pi/agent/sessions/--CWD--/``), so a resume
  needs the channel's fixed cwd, which corral keeps.

Output
------

One JSON object per stdout line (pi 0.73.1, from the captures in ``tests/data/captures/pi``)::

    {"type":"session","id":…,"cwd":…}                     -> SessionId
    {"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":…}}
                                                          -> Text (delta)
    {"type":"message_end","message":{"role":"assistant","content":[…],"stopReason":…}}
        text not streamed as deltas                       -> Text
        stopReason "error" (errorMessage)                 -> held (pi may retry)
    {"type":"tool_execution_start","toolName":…,"args":…} -> ToolUse
    {"type":"tool_execution_end","result":{"content":[…]},"isError":…}
                                                          -> ToolResult
    {"type":"auto_retry_start","attempt":…,"errorMessage":…} -> Status
    {"type":"auto_retry_end","success":false,"finalError":…} -> Error
    {"type":"agent_end",…}                                -> Result (the last answer),
                                                             unless an error is held

A failed model request ends the run with ``agent_end`` and then, for an error pi retries (a
5xx), ``auto_retry_start`` and a whole new run (``agent_start`` … ``agent_end``), three times,
then ``auto_retry_end``; so an error is held until it is final: the retries' end, or pi's exit
without one. pi has no SIGINT handler: it dies of the signal (status -2) within ~15 ms and
leaves its tool's whole tree running (the tool's shell has a session of its own).

Usage, as it goes: each assistant ``message_end`` has the model call's final ``usage``
(``input`` fresh, ``output``, ``cacheRead``, ``cacheWrite``: already corral's disjoint
figures) and pi's ``cost.total`` in USD (its built-in models' prices): one :class:`Usage`
per message, its ``model`` as pi names it. The same message is repeated in ``turn_end``,
its growing copies in ``message_update`` and all of them in ``agent_end``: none is counted.
A model pi has no price for (a ``base_url`` model of one's own) costs 0 there, which means
*not priced*, not free: a cost of 0 with tokens is reported as no cost.

``--session`` with an id pi does not know prints ``No session found matching 'ID'`` on stderr
and exits 1 (:class:`StaleSession`).
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
    ToolResult,
    ToolUse,
    TurnRequest,
    Usage,
    preview,
)
from ._common import TurnEnd, by_type, count, feed_json, json_file, money, text_of, unfinished_turn

#: ``[agents.NAME]`` keys this adapter reads: ``base_url`` (an endpoint of one's own: a
#: provider ``corral`` in models.json), ``api`` (its API, default ``openai-completions``;
#: also ``openai-responses``, ``anthropic-messages``, ``google-generative-ai``) and
#: ``env_key`` (the variable holding its key, default ``OPENAI_API_KEY``).
OPTION_KEYS = frozenset({"base_url", "api", "env_key"})
#: pi's folder of settings, models and sessions, relative to the agent's HOME.
PI_DIR = ".pi/agent"
#: The provider the adapter defines when ``base_url`` is configured.
PROVIDER = "corral"
DEFAULT_API = "openai-completions"
#: The model of the ``corral`` provider when the agent names none.
DEFAULT_MODEL = "default"
#: pi's read-only tools: all an attended agent gets (pi asks no permission for anything).
READ_ONLY_TOOLS = "read,grep,find,ls"
#: ``settings.json``: no install ping, no start-up banner.
SETTINGS: dict[str, Any] = {"enableInstallTelemetry": False, "quietStartup": True, "collapseChangelog": True}
#: pi's words for a ``--session`` id it does not know (0.73.1).
STALE_PATTERNS: tuple[re.Pattern[str], ...] = (re.compile(r"No session found matching", re.I),)
#: Lines of no consequence for the transcript: lifecycle, the echo of the user's message,
#: tool progress (the end carries the output), queue and compaction notices.
_QUIET = frozenset({
    "agent_start", "turn_start", "turn_end", "message_start", "tool_execution_update", "queue_update",
    "compaction_start", "compaction_end",
})


def _option(options: Mapping[str, object], key: str) -> str | None:
    value = options.get(key)
    return value if isinstance(value, str) and value.strip() else None


def models_json(request: TurnRequest) -> dict[str, Any] | None:
    """``~/.pi/agent/models.json`` with the ``corral`` provider, or ``None`` without ``base_url``."""
    base_url = _option(request.options, "base_url")
    if base_url is None:
        return None
    provider = {
        "baseUrl": base_url,
        "api": _option(request.options, "api") or DEFAULT_API,
        # pi reads a value that names a variable from the environment: the key stays out of files.
        "apiKey": _option(request.options, "env_key") or "OPENAI_API_KEY",
        "models": [{"id": request.model or DEFAULT_MODEL}],
    }
    return {"providers": {PROVIDER: provider}}


def build_launch(request: TurnRequest) -> Launch:
    """``pi --mode json`` with the model, the session to resume and the tools allowed."""
    command = request.command or ADAPTER.default_command
    files = {f"{PI_DIR}/settings.json": json_file(SETTINGS)}
    models = models_json(request)
    argv: list[str] = [*command, "--mode", "json"]
    if models is not None:
        files[f"{PI_DIR}/models.json"] = json_file(models)
        argv += ["--model", f"{PROVIDER}/{request.model or DEFAULT_MODEL}"]
    elif request.model:
        argv += ["--model", request.model]
    if request.session_id:
        # pi's parser knows no "--session=ID" form; the id is one pi printed (a UUID).
        argv += ["--session", request.session_id]
    if not request.unattended:
        argv += ["--tools", READ_ONLY_TOOLS]
    argv += request.args
    env = {"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}
    return Launch(argv=tuple(argv), env=env, cwd=request.cwd, stdin=request.prompt.encode(), files=files)


def _message_usage(message: Mapping[str, Any]) -> list[Event]:
    """One assistant message's usage and pi's price of it (see the module docstring)."""
    usage = message.get("usage")
    if not isinstance(usage, Mapping):
        return []
    figures = (count(usage.get("input")), count(usage.get("output")), count(usage.get("cacheRead")),
               count(usage.get("cacheWrite")))
    cost_of = usage.get("cost")
    cost = money(cost_of.get("total")) if isinstance(cost_of, Mapping) else None
    if not cost and any(figures):
        cost = None  # 0 for tokens: pi has no price for this model
    if not any(figures) and not cost:
        return []
    model = message.get("model")
    return [Usage(*figures, cost=cost, currency="USD" if cost is not None else None,
                  model=model if isinstance(model, str) and model else None)]


def _content_text(content: object) -> str:
    """The text parts of a pi message's (or tool result's) ``content`` list, joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = (part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text")
    return "".join(text_of(t) for t in texts)


def _tool_input(name: str, args: object) -> str:
    """A bash call previews as its command; any other tool as its arguments."""
    if isinstance(args, dict) and name == "bash" and isinstance(args.get("command"), str):
        return preview(args["command"])
    return preview(args if args is not None else "")


@dataclass(slots=True)
class PiParser:
    """Parser for ``pi --mode json`` (one turn)."""

    session_id: str | None = None
    """The session id the turn was asked to resume, if any."""
    end: TurnEnd = field(default_factory=TurnEnd)
    last_text: str = ""
    """The latest assistant message's text: the turn's answer once it ends."""
    held_error: str = ""
    """A failed model request's message, until pi's retries (if any) say it is final."""
    _streamed: bool = False
    """Text deltas of the current assistant message went out: its whole text is not repeated."""

    def feed(self, line: str) -> list[Event]:
        """Parse one stdout line; never raises."""
        return feed_json(line, self._event)

    def feed_stderr(self, line: str) -> list[Event]:
        """pi reports an unknown session on stderr; the rest explains a failure, if any."""
        text = line.strip()
        if self.session_id and any(p.search(text) for p in STALE_PATTERNS):
            return self.end.stale(text)
        self.end.keep_stderr(text)
        return []

    def _event(self, obj: dict[str, Any], line: str) -> list[Event] | None:
        kind = obj.get("type")
        if isinstance(kind, str) and kind in _QUIET:
            return []
        return by_type(_HANDLERS, self, obj, line)

    def _session(self, obj: dict[str, Any], line: str) -> list[Event]:
        sid = text_of(obj.get("id"))
        if not sid:
            return []
        if self.session_id and sid != self.session_id:
            return [Status(f"pi could not resume {self.session_id}; started session {sid}"), SessionId(sid)]
        return [SessionId(sid)]

    def _message_update(self, obj: dict[str, Any], line: str) -> list[Event]:
        event = obj.get("assistantMessageEvent")
        if isinstance(event, dict) and event.get("type") == "text_delta":
            delta = text_of(event.get("delta"))
            if delta:
                self._streamed = True
                return [Text(delta, delta=True)]
        return []

    def _message_end(self, obj: dict[str, Any], line: str) -> list[Event]:
        message = obj.get("message")
        if not isinstance(message, dict) or message.get("role") != "assistant":
            return []  # the user's message, a tool result (reported by tool_execution_end)
        streamed, self._streamed = self._streamed, False
        usage = _message_usage(message)
        if message.get("stopReason") == "error":
            self.held_error = text_of(message.get("errorMessage")) or "pi: the model request failed"
            return usage
        self.held_error = ""
        text = _content_text(message.get("content"))
        if text:
            self.last_text = text
        return [*usage, Text(text)] if text and not streamed else usage

    def _tool_start(self, obj: dict[str, Any], line: str) -> list[Event]:
        name = text_of(obj.get("toolName")) or "tool"
        return [ToolUse(name, _tool_input(name, obj.get("args")))]

    def _tool_end(self, obj: dict[str, Any], line: str) -> list[Event]:
        result = obj.get("result")
        text = _content_text(result.get("content")) if isinstance(result, dict) else text_of(result)
        return [ToolResult(preview(text), is_error=obj.get("isError") is True)]

    def _retry_start(self, obj: dict[str, Any], line: str) -> list[Event]:
        attempt, most = obj.get("attempt"), obj.get("maxAttempts")
        count = f" ({attempt}/{most})" if isinstance(attempt, int) and isinstance(most, int) else ""
        return [Status(f"retrying{count}: {text_of(obj.get('errorMessage'))}".rstrip(": "))]

    def _retry_end(self, obj: dict[str, Any], line: str) -> list[Event]:
        if obj.get("success") is True or self.end.saw_error:
            return []
        message = text_of(obj.get("finalError")) or self.held_error or "pi: the model request failed"
        self.held_error = ""
        return [self.end.error(message)]

    def _agent_end(self, obj: dict[str, Any], line: str) -> list[Event]:
        if self.held_error:
            return []  # a retry may follow; if not, finish() reports it
        self.end.result()
        return [Result(self.last_text, ok=True)]

    def finish(self, returncode: int | None, *, interrupted: bool) -> list[Event]:
        """A turn that ended without a result is an error (the held one, if any), unless stopped."""
        if interrupted or self.end.closed or self.end.saw_error:
            return []
        if self.held_error:
            return [self.end.error(self.held_error)]
        return [unfinished_turn("pi", returncode, reason="without finishing the turn", detail=self.end.last_stderr())]


_HANDLERS: dict[str, Callable[[PiParser, dict[str, Any], str], list[Event]]] = {
    "session": PiParser._session,
    "message_update": PiParser._message_update,
    "message_end": PiParser._message_end,
    "tool_execution_start": PiParser._tool_start,
    "tool_execution_end": PiParser._tool_end,
    "auto_retry_start": PiParser._retry_start,
    "auto_retry_end": PiParser._retry_end,
    "agent_end": PiParser._agent_end,
}


def new_parser(request: TurnRequest) -> PiParser:
    """A fresh parser for one turn."""
    return PiParser(session_id=request.session_id)


ADAPTER = Adapter(
    name="pi",
    install="npm install -g @mariozechner/pi-coding-agent",
    default_command=("pi",),
    model_hosts=("api.anthropic.com", "api.openai.com", "generativelanguage.googleapis.com", "openrouter.ai"),
    build_launch=build_launch,
    new_parser=new_parser,
    interrupt_signal=signal.SIGINT,
    option_keys=OPTION_KEYS,
)

