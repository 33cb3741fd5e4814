"""The Agent Client Protocol (ACP), client side, as a sans-I/O state machine.

Theory of operation
-------------------

An ACP agent is a long-lived process that speaks JSON-RPC 2.0, one message per line, on
its stdin/stdout (:mod:`adapters._jsonrpc` does the framing). corral is the *client*.
:class:`AcpConnection` holds the whole client state and does no I/O, like h11: the owner

1. calls a method that *sends* (:meth:`~AcpConnection.initialize`,
   :meth:`~AcpConnection.authenticate`, :meth:`~AcpConnection.new_session`,
   :meth:`~AcpConnection.resume_session`, :meth:`~AcpConnection.load_session`,
   :meth:`~AcpConnection.prompt`, :meth:`~AcpConnection.cancel`,
   :meth:`~AcpConnection.close_session`), which queues bytes;
2. feeds every stdout line to :meth:`~AcpConnection.receive`, which returns events and may
   queue answers (permission decisions, errors for methods corral does not offer);
3. writes :meth:`~AcpConnection.data_to_send` to the agent's stdin after each call.

A session's life is ``initialize`` → (``authenticate``) → ``session/new`` (or, for a saved
id, ``session/resume`` — reconnect without a replay — or ``session/load``) → any number of
``session/prompt`` turns, one at a time → (``session/close``). ``initialize`` is answered with
the protocol version the agent speaks: anything but corral's (:data:`PROTOCOL_VERSION`) is
refused as a :class:`RequestFailed` (ACP: a client that does not speak the agent's version
disconnects; driving it anyway misreads its answers). The answer also lists the agent's
authentication methods (:class:`AuthMethod`: :func:`auth_advice` names them and what
configures each, :func:`auth_problem` checks a configured one) and its session
capabilities: ``resume`` and ``close`` are used only when advertised (a capability object).
A turn's ``session/update`` notifications become corral's ordinary adapter events:

* ``agent_message_chunk`` → :class:`Text` with ``delta=True``: contiguous chunks join into
  one message, and any other event ends the run (as with the other streaming adapters);
* ``tool_call`` → :class:`ToolUse` (its title, or kind, and a preview of its input), and
  ``tool_call_update`` with status ``completed``/``failed`` → :class:`ToolResult`
  (``is_error`` for ``failed``), once per tool call;
* ``plan`` → :class:`Todos` (ACP's plan statuses are corral's todo statuses);
* ``agent_thought_chunk`` is **dropped**: thoughts arrive as many small fragments, are not
  the answer, and a chat transcript full of them helps nobody; ``user_message_chunk``,
  ``available_commands_update``, ``current_mode_update`` and other bookkeeping are dropped
  too;
* the session id (from ``session/new``, or the id loaded) → :class:`SessionId`;
* ``usage_update`` → :class:`Usage` with the cost it adds, as the turn goes (below).

Usage. ACP's ``usage_update`` (stable since ACP 1.7) has ``used`` and ``size`` — the tokens
*in the context window now*, and its size: not what the model consumed, so they are not
counted — and an optional ``cost`` ``{amount, currency}``, the session's *cumulative* cost.
The connection keeps the last amount per currency and reports what each update adds; an
amount lower than the last is a count that started again (claude-agent-acp restarted with
``session/load`` after a cancel: captured, 0.0107 then 0.0033 for the next turn alone) and
counts whole. An update outside a turn (a ``session/load`` replay) only sets the baseline;
one after a cancel still counts (the money was spent), though no other output does. The
tokens come with the prompt's answer: ``usage`` in the ``session/prompt`` result (an
unstable field: ``inputTokens``, ``outputTokens``, ``cachedReadTokens``,
``cachedWriteTokens``, ``thoughtTokens``, ``totalTokens``) — at the end of the turn only.
Agents disagree on its scope: the turn's (claude-agent-acp), the session's so far (copilot,
vibe: 100, 300, 400 over three turns, captured), which :attr:`AcpConnection.usage_totals`
says (``"session"``: reported as what it adds), or only the turn's last model call's
(opencode, kilo: 100 for a tool turn of two calls of 100 each, captured — a count too low,
reported as it is). ``_meta`` figures (vibe's per-step ``promptTokens``) are not read: ACP
forbids relying on them.

The end of a turn is :class:`PromptEnded` with ACP's ``stopReason`` (``end_turn``,
``max_tokens``, ``max_turn_requests``, ``refusal``, ``cancelled``), or ``error`` when the
agent answered the prompt with an error. An error's text is :func:`error_text`: the message
*and* the reason from ``error.data``, where both official SDKs put it ("Internal error:
model quota exceeded (429)"), on one line, without control characters, bounded.

Client capabilities: corral declares **no** ``fs`` and **no** ``terminal`` capability. The
agent then reads and writes files and runs commands with its own tools, in its own process
tree, which corral can snapshot and kill; a terminal run by the client would live outside
that tree and outside the turn. Requests for those methods (or any other) are answered
with JSON-RPC error ``-32601``.

Permission requests (``session/request_permission``) are decided by a pure policy
(:func:`decide_permission`): unattended agents allow once (or always, if that is all the
agent offers), attended ones reject. With ``policy=False`` the connection surfaces them as
:class:`PermissionRequested` and the owner answers with
:meth:`~AcpConnection.answer_permission`; a cancel answers every one still pending with the
outcome ``cancelled``, as ACP requires.

:meth:`~AcpConnection.cancel` sends ``session/cancel`` *and* ``$/cancel_request`` for the
prompt's id: an agent on the TypeScript SDK 2.x may stop only on the second (its prompt
follows the request's abort signal) and then answers the prompt with error ``-32800``, which
ends the turn as ``cancelled``; others know only the first, and ignore the other.
After a cancel the turn's output is dropped — only a :class:`SessionId`
would still pass (stop contract: leftover output is discarded, except the session id) — and
permission requests are answered ``cancelled``, until the prompt's answer ends the turn.
While a ``session/load`` is pending the agent replays the conversation as updates; they are
history, not a turn, and are dropped.

A line that is not JSON-RPC is an :class:`Unparsed` event (logged, never fatal); an invalid
*request* from the agent is also answered with an error so it does not wait forever.
"""

from __future__ import annotations

import difflib
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from ._base import (
    Event,
    SessionId,
    Status,
    Text,
    TodoItem,
    Todos,
    ToolResult,
    ToolUse,
    Unparsed,
    Usage,
    preview,
)
from ._common import Figures, count, money
from ._jsonrpc import (
    INVALID_PARAMS,
    MAX_LINE_BYTES,
    METHOD_NOT_FOUND,
    ErrorResponse,
    JsonRpcError,
    Message,
    Notification,
    Request,
    RequestId,
    Response,
    decode,
    encode,
)

#: The ACP protocol version corral speaks.
PROTOCOL_VERSION = 1

#: What corral offers the agent: no file system, no terminal (see the module docstring).
CLIENT_CAPABILITIES: dict[str, Any] = {
    "fs": {"readTextFile": False, "writeTextFile": False},
    "terminal": False,
}

#: corral's own ``stopReason`` for a turn whose prompt got an error response.
STOP_ERROR = "error"

#: JSON-RPC's code for a request cancelled by ``$/cancel_request`` (the TypeScript SDK's answer).
REQUEST_CANCELLED = -32800
#: ACP's "Authentication required".
AUTH_REQUIRED = -32000
#: ACP's "Unsupported protocol version" (``data``: ``{requested, supported}``).
UNSUPPORTED_VERSION = -32022
#: Longest reason :func:`error_text` shows (characters): an agent's error lands in a chat.
ERROR_TEXT_CHARS = 300

#: ACP's plan entry statuses, all of which are corral todo statuses.
_PLAN_STATUSES = ("pending", "in_progress", "completed")

PermissionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always"]

# ---------------------------------------------------------------- events only ACP has


@dataclass(frozen=True, slots=True)
class AuthMethod:
    """One way to authenticate that the agent offers in its ``initialize`` answer."""

    id: str
    name: str
    type: str = "agent"
    """``agent`` (``authenticate`` does it), ``env_var`` (set :attr:`vars`, then
    ``authenticate``) or ``terminal`` (a login the user runs in a terminal: not over ACP)."""
    vars: tuple[str, ...] = ()
    """``env_var``: the variables the method needs (the optional ones left out)."""
    args: tuple[str, ...] = ()
    """``terminal``: the arguments that start the agent's own login."""
    description: str = ""


@dataclass(frozen=True, slots=True)
class Initialized:
    """The agent answered ``initialize`` (with a protocol version corral speaks)."""

    protocol_version: int
    load_session: bool
    """Does the agent support ``session/load``?"""
    agent_name: str = ""
    auth_methods: tuple[AuthMethod, ...] = ()
    resume_session: bool = False
    """``sessionCapabilities.resume``: ``session/resume`` reconnects without a replay."""
    close_session: bool = False
    """``sessionCapabilities.close``: ``session/close`` ends a session's work and frees it."""
    list_sessions: bool = False
    """``sessionCapabilities.list``."""


@dataclass(frozen=True, slots=True)
class SessionReady:
    """A session is open (``session/new`` answered, or ``session/load`` done)."""

    session_id: str
    loaded: bool


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The agent accepted ``authenticate`` with ``method_id``."""

    method_id: str


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """The agent answered ``session/close``: the session's work is over, its resources freed."""

    session_id: str


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """The agent answered one of corral's requests with an error."""

    method: str
    code: int
    message: str
    data: Any = None
    """The error's ``data``, where both official SDKs put the reason."""

    @property
    def reason(self) -> str:
        """The message with the reason from ``data``: bounded, one line (:func:`error_text`)."""
        return error_text(self.message, self.data)


@dataclass(frozen=True, slots=True)
class PromptEnded:
    """The prompt was answered: the turn is over. ``cancelled``: corral had sent a cancel."""

    stop_reason: str
    cancelled: bool = False
    error: str = ""


@dataclass(frozen=True, slots=True)
class PermissionRequested:
    """The agent asks to run a tool; the owner must answer (``policy=False`` only)."""

    request_id: RequestId
    title: str
    options: tuple[PermissionOption, ...]


@dataclass(frozen=True, slots=True)
class PermissionDecided:
    """A permission request was answered; ``outcome`` is ``selected`` or ``cancelled``."""

    title: str
    outcome: Literal["selected", "cancelled"]
    option_id: str | None = None
    kind: str | None = None

    def describe(self) -> str:
        """The status line a transcript stores for this decision."""
        if self.outcome == "cancelled":
            return f"permission for {self.title!r}: cancelled"
        verb = "allowed" if (self.kind or "").startswith("allow") else "rejected"
        return f"permission for {self.title!r}: {verb} ({self.kind or self.option_id})"


AcpEvent = (
    Event | Initialized | Authenticated | SessionReady | SessionClosed | RequestFailed | PromptEnded
    | PermissionRequested | PermissionDecided
)


# ---------------------------------------------------------------- permission policy


@dataclass(frozen=True, slots=True)
class PermissionOption:
    """One choice an agent offers in a permission request."""

    option_id: str
    name: str
    kind: str


#: Preferred option kinds, best first, for each policy.
_ALLOW: tuple[str, ...] = ("allow_once", "allow_always")
_REJECT: tuple[str, ...] = ("reject_once", "reject_always")


def decide_permission(options: Sequence[PermissionOption], *, unattended: bool) -> PermissionOption | None:
    """The option the policy picks, or ``None`` (answer ``cancelled``) when none fits.

    Unattended agents run without a human to ask: allow, once rather than always when the
    agent offers both. Attended agents (nobody answers in a chat yet): reject. When the
    wanted kind is not offered, the other is never chosen in its place — an allow for a
    rejecting policy would be a privilege nobody granted; the request is cancelled instead.
    """
    wanted = _ALLOW if unattended else _REJECT
    for kind in wanted:
        for option in options:
            if option.kind == kind:
                return option
    return None


def _options(raw: object) -> tuple[PermissionOption, ...]:
    if not isinstance(raw, list):
        return ()
    found = []
    for item in raw:
        if isinstance(item, dict) and isinstance(item.get("optionId"), str):
            found.append(PermissionOption(item["optionId"], str(item.get("name", "")), str(item.get("kind", ""))))
    return tuple(found)


# ---------------------------------------------------------------- errors and authentication


def _one_line(text: str) -> str:
    """``text`` without control characters (terminal escapes included) on one line."""
    text = _ANSI.sub("", text)
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")

#: Keys of an error's ``data`` object that carry its reason, best first (``details``: both
#: SDKs' wrapping of an exception's text).
_REASON_KEYS = ("details", "message", "reason", "error", "detail")


def error_text(message: str, data: object = None, *, limit: int = ERROR_TEXT_CHARS) -> str:
    """An agent's error as corral shows it: the message, then the reason from ``data``.

    Both official SDKs answer a failure with a generic message ("Internal error") and put the
    reason in ``data`` — a string, or an object whose ``details`` (or ``message``, ``reason``,
    ``error``) holds it; any other ``data`` is shown as compact JSON. The text is one line
    without control characters or terminal escapes, and at most ``limit`` characters: an
    agent is not trusted, and this lands in a chat.
    """
    head = _one_line(message) or "error"
    detail = ""
    if isinstance(data, str):
        detail = data
    elif isinstance(data, dict):
        found = [data[key] for key in _REASON_KEYS if isinstance(data.get(key), str) and data[key].strip()]
        if "supported" in data and isinstance(data["supported"], list):
            detail = "the agent speaks ACP version " + ", ".join(str(v) for v in data["supported"][:10])
            detail += f"; corral speaks version {PROTOCOL_VERSION}"
        elif found:
            detail = found[0]
        elif data:
            detail = preview(data, limit)
    elif data is not None:
        detail = preview(data, limit)
    detail = _one_line(detail)
    text = f"{head}: {detail}" if detail and detail.lower() != head.lower() else head
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _auth_methods(raw: object) -> tuple[AuthMethod, ...]:
    if not isinstance(raw, list):
        return ()
    methods = []
    for item in raw[:20]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        # Everything here may reach a chat in an error: one line each, bounded.
        method_id = _one_line(item["id"])[:80]
        if not method_id:
            continue
        raw_kind = item.get("type")
        kind = _one_line(raw_kind)[:40] if isinstance(raw_kind, str) else "agent"
        raw_vars, raw_args = item.get("vars"), item.get("args")
        names = tuple(
            _one_line(var["name"])[:80] for var in (raw_vars if isinstance(raw_vars, list) else ())[:10]
            if isinstance(var, dict) and isinstance(var.get("name"), str) and not var.get("optional")
        )
        args = tuple(_one_line(a)[:80] for a in (raw_args if isinstance(raw_args, list) else ())[:10]
                     if isinstance(a, str))
        methods.append(AuthMethod(method_id, _one_line(str(item.get("name") or ""))[:80], kind, names, args,
                                  _one_line(str(item.get("description") or ""))[:200]))
    return tuple(methods)


def describe_auth_method(method: AuthMethod, command: str = "the agent") -> str:
    """One offered method and what configures it, for an error that names them all."""
    label = f"{method.id!r}" + (f" ({method.name})" if method.name and method.name != method.id else "")
    if method.type == "env_var":
        names = ", ".join(method.vars) or "its variables"
        return f'{label}: set {names} in the agent\'s env and acp_auth = "{method.id}"'
    if method.type == "terminal":
        login = " ".join((command, *method.args))
        return (f"{label}: a login in a terminal — run `{login}` once yourself, then name the files it writes in "
                "credentials = [...] (each agent has a private HOME)")
    if method.type == "agent":
        return f'{label}: acp_auth = "{method.id}" (the agent does it itself; unattended only without a browser)'
    return f"{label}: a {method.type!r} method corral cannot use"


def auth_advice(methods: Sequence[AuthMethod], command: str = "the agent") -> str:
    """What to configure for an agent that wants authentication: every method it offers."""
    if not methods:
        return "the agent offers no authentication method: log in with the agent's own CLI"
    return "the agent offers " + "; ".join(describe_auth_method(m, command) for m in methods)


def auth_problem(method_id: str, methods: Sequence[AuthMethod], env: Mapping[str, str]) -> str | None:
    """Why ``acp_auth = method_id`` cannot be used with what the agent offers (None: it can).

    A ``terminal`` method is not called over ACP, an ``env_var`` one needs its variables set
    in the agent's ``env``. An agent that lists no methods is taken at its word when asked.
    """
    if not methods:
        return None
    found = next((m for m in methods if m.id == method_id), None)
    if found is None:
        close = difflib.get_close_matches(method_id, [m.id for m in methods], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"acp_auth = {method_id!r} is not a method the agent offers; {hint}{auth_advice(methods)}"
    if found.type == "terminal":
        return f"{method_id!r} is a terminal login, not done over ACP: {describe_auth_method(found)}"
    missing = [name for name in found.vars if not env.get(name)]
    if found.type == "env_var" and missing:
        return f"{method_id!r} needs {', '.join(missing)} in the agent's env ([agents.NAME] env)"
    return None


# ---------------------------------------------------------------- the connection


class AcpProtocolError(Exception):
    """The owner asked for something the connection's state forbids (a bug of the owner)."""


@dataclass(slots=True)
class _Pending:
    method: str
    params: Any = None


@dataclass(slots=True)
class _Tool:
    title: str
    announced: bool = False
    done: bool = False


@dataclass(slots=True)
class AcpConnection:
    """The client side of one ACP agent connection. No I/O; see the module docstring."""

    unattended: bool = True
    policy: bool = True
    """Answer permission requests with :func:`decide_permission` (False: the owner answers)."""
    client_info: Mapping[str, str] = field(default_factory=lambda: {"name": "corral", "version": "0"})
    max_line: int = MAX_LINE_BYTES

    session_id: str | None = None
    load_session_supported: bool = False
    resume_session_supported: bool = False
    close_session_supported: bool = False
    initialized: bool = False
    prompt_id: RequestId | None = None
    """The id of the ``session/prompt`` in flight, if any (after a hand-off: the steer's)."""
    cancelling: bool = False
    """A cancel was sent for the prompt in flight."""
    prompt_queueing: bool = False
    """The agent takes a ``session/prompt`` sent while one runs into the running turn
    (claude-agent-acp's ``_meta.claudeCode.promptQueueing``): the running prompt then answers
    ``end_turn`` as it hands off, and the turn goes on under the new one (:meth:`steer`)."""
    _steers: deque[RequestId] = field(default_factory=deque)
    """Steering prompts sent during the turn, not yet handed off to, oldest first."""
    _spent: set[RequestId] = field(default_factory=set)
    """Prompts of a turn that has ended: their late answers end nothing."""
    _next_id: int = 0
    _pending: dict[RequestId, _Pending] = field(default_factory=dict)
    _permissions: dict[RequestId, str] = field(default_factory=dict)
    _tools: dict[str, _Tool] = field(default_factory=dict)
    _out: bytearray = field(default_factory=bytearray)
    usage_totals: Literal["turn", "session"] = "turn"
    """What the agent's ``session/prompt`` ``usage`` covers: the turn, or the session so far
    (a preset's :attr:`Preset.usage_totals`)."""
    _session_cost: dict[str, Decimal] = field(default_factory=dict)
    """The last cumulative cost the agent reported, per currency."""
    _session_tokens: Figures = (0, 0, 0, 0)
    """The last session totals of a ``"session"`` agent's prompt answers."""

    # ------------------------------------------------------------ sending

    def data_to_send(self) -> bytes:
        """Everything queued for the agent's stdin since the last call."""
        data = bytes(self._out)
        self._out.clear()
        return data

    @property
    def pending_methods(self) -> list[str]:
        """The methods of corral's requests still waiting for an answer."""
        return [p.method for p in self._pending.values()]

    @property
    def pending_permissions(self) -> list[RequestId]:
        """Permission requests the owner has not answered yet (policy off)."""
        return list(self._permissions)

    def _send(self, message: Message) -> None:
        self._out += encode(message)

    def _request(self, method: str, params: dict[str, Any]) -> RequestId:
        self._next_id += 1
        rid = self._next_id
        self._pending[rid] = _Pending(method, params)
        self._send(Request(rid, method, params))
        return rid

    def initialize(self) -> RequestId:
        """Queue ``initialize``: protocol version and corral's (empty) capabilities."""
        return self._request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": CLIENT_CAPABILITIES,
                "clientInfo": dict(self.client_info),
            },
        )

    def new_session(self, cwd: str) -> RequestId:
        """Queue ``session/new`` in ``cwd`` (absolute), with no MCP servers of corral's."""
        self._need_initialized("session/new")
        return self._request("session/new", {"cwd": cwd, "mcpServers": []})

    def load_session(self, session_id: str, cwd: str) -> RequestId:
        """Queue ``session/load`` of a saved id; the replayed history is dropped."""
        self._need_initialized("session/load")
        return self._request("session/load", {"sessionId": session_id, "cwd": cwd, "mcpServers": []})

    def resume_session(self, session_id: str, cwd: str) -> RequestId:
        """Queue ``session/resume`` of a saved id: reconnect without a replay (the agent
        advertised ``sessionCapabilities.resume``)."""
        self._need_initialized("session/resume")
        return self._request("session/resume", {"sessionId": session_id, "cwd": cwd, "mcpServers": []})

    def authenticate(self, method_id: str) -> RequestId:
        """Queue ``authenticate`` with one of the methods the agent offered."""
        self._need_initialized("authenticate")
        return self._request("authenticate", {"methodId": method_id})

    def close_session(self) -> RequestId | None:
        """Queue ``session/close`` of the open session, if the agent supports it and no
        prompt is in flight (the agent would cancel it; a stop cancels first). None: nothing sent."""
        if not self.close_session_supported or self.session_id is None or self.prompt_id is not None:
            return None
        return self._request("session/close", {"sessionId": self.session_id})

    def prompt(self, text: str) -> RequestId:
        """Queue ``session/prompt`` with ``text`` as its one text block; starts a turn."""
        if self.session_id is None:
            raise AcpProtocolError("session/prompt before a session is open")
        if self.prompt_id is not None:
            raise AcpProtocolError("session/prompt while another prompt is in flight")
        self.cancelling = False
        self._tools.clear()
        self.prompt_id = self._request(
            "session/prompt", {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]}
        )
        return self.prompt_id

    def steer(self, text: str) -> RequestId:
        """Queue another ``session/prompt`` with ``text`` into the turn in flight, for an agent
        that takes one (``prompt_queueing``): the running prompt hands off to it and the turn
        goes on under it. Refused (:class:`AcpProtocolError`) for any other agent, outside a
        turn, or once the turn is being cancelled."""
        if not self.prompt_queueing:
            raise AcpProtocolError("the agent does not take a prompt into a running turn")
        if self.prompt_id is None or self.session_id is None or self.cancelling:
            raise AcpProtocolError("no turn in flight to steer")
        rid = self._request(
            "session/prompt", {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]}
        )
        self._steers.append(rid)
        return rid

    def cancel(self) -> list[AcpEvent]:
        """Queue ``session/cancel`` and ``$/cancel_request`` for the prompt (two notifications)
        and answer pending permissions ``cancelled``.

        Both, because agents stop on one or the other: ``session/cancel`` is ACP's cancel of a
        session's work; ``$/cancel_request`` the protocol's cancel of one request, which is
        all an agent on the TypeScript SDK 2.x hears when its prompt handler follows the
        request's abort signal (it then answers the prompt with error -32800, which ends the
        turn as ``cancelled``). An agent that knows only one ignores the other.

        From now on the turn's output is dropped. Returns the decisions made. A cancel with
        no prompt in flight sends nothing.
        """
        if self.prompt_id is None or self.session_id is None:
            return []
        events: list[AcpEvent] = []
        if not self.cancelling:
            self.cancelling = True
            self._send(Notification("session/cancel", {"sessionId": self.session_id}))
            for rid in (self.prompt_id, *self._steers):
                self._send(Notification("$/cancel_request", {"requestId": rid}))
        for rid, title in list(self._permissions.items()):
            events.append(self._answer(rid, title, None))
        return events

    def answer_permission(self, request_id: RequestId, option: PermissionOption | None) -> PermissionDecided:
        """Answer a :class:`PermissionRequested`: ``option`` selected, or ``None`` = cancelled."""
        title = self._permissions.get(request_id)
        if title is None:
            raise AcpProtocolError(f"no pending permission request {request_id!r}")
        return self._answer(request_id, title, option)

    def _answer(self, rid: RequestId, title: str, option: PermissionOption | None) -> PermissionDecided:
        self._permissions.pop(rid, None)
        if option is None:
            self._send(Response(rid, {"outcome": {"outcome": "cancelled"}}))
            return PermissionDecided(title, "cancelled")
        self._send(Response(rid, {"outcome": {"outcome": "selected", "optionId": option.option_id}}))
        return PermissionDecided(title, "selected", option.option_id, option.kind)

    def _need_initialized(self, method: str) -> None:
        if not self.initialized:
            raise AcpProtocolError(f"{method} before initialize was answered")

    # ------------------------------------------------------------ receiving

    def receive(self, line: bytes | str) -> list[AcpEvent]:
        """Handle one stdout line of the agent; never raises for anything the agent sends."""
        if not line.strip():
            return []
        text = line if isinstance(line, str) else line.decode("utf-8", errors="replace")
        try:
            message = decode(line, max_bytes=self.max_line)
        except JsonRpcError as exc:
            if exc.id is not None:
                # A request we could not read still has an id: answer it, or the agent waits.
                self._send(ErrorResponse(exc.id, exc.code, exc.message))
            return [Unparsed(text[:1000], f"invalid JSON-RPC: {exc.message}")]
        if isinstance(message, Request):
            return self._on_request(message)
        if isinstance(message, Notification):
            return self._on_notification(message, text)
        return self._on_response(message, text)

    def _on_response(self, message: Response | ErrorResponse, text: str) -> list[AcpEvent]:
        pending = self._pending.pop(message.id, None) if message.id is not None else None
        if pending is None:
            return [Unparsed(text[:1000], f"a response to no request of ours (id {message.id!r})")]
        method = pending.method
        if method == "session/prompt" and message.id is not None and message.id != self.prompt_id:
            # A steer answered before its hand-off, or a prompt of a turn already over: it
            # ends nothing (the turn ends with the prompt in flight).
            if message.id in self._steers:
                self._steers.remove(message.id)
            self._spent.discard(message.id)
            return []
        if method == "session/prompt" and isinstance(message, Response) and isinstance(message.result, dict):
            usage = self._prompt_usage(message.result.get("usage"))
        else:
            usage = []
        if isinstance(message, ErrorResponse):
            failed = RequestFailed(method, message.code, message.message, message.data)
            events: list[AcpEvent] = [failed]
            if method == "session/prompt":
                if self.cancelling and message.code == REQUEST_CANCELLED:
                    events.append(self._end_prompt("cancelled"))  # $/cancel_request's answer
                else:
                    events.append(self._end_prompt(STOP_ERROR, error=failed.reason))
            return events
        result = message.result if isinstance(message.result, dict) else {}
        if method == "initialize":
            return [self._initialized(result)]
        if method in ("session/new", "session/load", "session/resume"):
            sid = result.get("sessionId") if method == "session/new" else pending.params["sessionId"]
            if not isinstance(sid, str) or not sid:
                return [RequestFailed(method, INVALID_PARAMS, "the answer carries no sessionId")]
            self.session_id = sid
            return [SessionId(sid), SessionReady(sid, loaded=method != "session/new")]
        if method == "session/prompt":
            reason = result.get("stopReason")
            reason = reason if isinstance(reason, str) else "end_turn"
            if reason == "end_turn" and self._steers and not self.cancelling:
                # Handed off: the turn goes on under the steer it took.
                self.prompt_id = self._steers.popleft()
                return usage
            return [*usage, self._end_prompt(reason)]
        if method == "authenticate":
            return [Authenticated(str(pending.params["methodId"]))]
        if method == "session/close":
            return [SessionClosed(str(pending.params["sessionId"]))]
        return []

    def _initialized(self, result: dict[str, Any]) -> Initialized | RequestFailed:
        """The ``initialize`` answer: refused unless its protocol version is corral's."""
        version = result.get("protocolVersion")
        if version != PROTOCOL_VERSION or isinstance(version, bool):
            # ACP: the agent answers the client's version if it supports it, else its latest;
            # a client that does not speak that one disconnects. Driving a version-2 agent
            # as version 1 reads its answers wrong (a prompt reply without stopReason).
            shown = preview(version, 40)
            return RequestFailed("initialize", UNSUPPORTED_VERSION,
                                 f"the agent speaks ACP version {shown}; corral speaks version {PROTOCOL_VERSION} "
                                 "only: use a version of the agent that supports ACP version 1")
        self.initialized = True
        caps = result.get("agentCapabilities")
        caps = caps if isinstance(caps, dict) else {}
        session_caps = caps.get("sessionCapabilities")
        session_caps = session_caps if isinstance(session_caps, dict) else {}
        self.load_session_supported = caps.get("loadSession") is True
        # A capability object ({}) means supported; omitted or null means not.
        self.resume_session_supported = isinstance(session_caps.get("resume"), dict)
        self.close_session_supported = isinstance(session_caps.get("close"), dict)
        meta = caps.get("_meta")
        claude = meta.get("claudeCode") if isinstance(meta, dict) else None
        self.prompt_queueing = isinstance(claude, dict) and claude.get("promptQueueing") is True
        info = result.get("agentInfo")
        name = _one_line(str(info.get("name", "")))[:80] if isinstance(info, dict) else ""
        return Initialized(PROTOCOL_VERSION, self.load_session_supported, name,
                           _auth_methods(result.get("authMethods")), self.resume_session_supported,
                           self.close_session_supported, isinstance(session_caps.get("list"), dict))

    def _end_prompt(self, reason: str, *, error: str = "") -> PromptEnded:
        ended = PromptEnded(reason, cancelled=self.cancelling, error=error)
        self.prompt_id = None
        self.cancelling = False
        self._spent.update(self._steers)  # (answered later, they end nothing)
        self._steers.clear()
        # A permission request can only belong to the turn that just ended.
        for rid, title in list(self._permissions.items()):
            self._answer(rid, title, None)
        return ended

    def _on_request(self, message: Request) -> list[AcpEvent]:
        if message.method != "session/request_permission":
            self._send(ErrorResponse(message.id, METHOD_NOT_FOUND, f"corral does not offer {message.method!r}"))
            return [Status(f"agent asked for {message.method!r}, which corral does not offer")]
        params = message.params if isinstance(message.params, dict) else {}
        tool = params.get("toolCall")
        title = ""
        if isinstance(tool, dict):
            title = str(tool.get("title") or tool.get("kind") or tool.get("toolCallId") or "")
        options = _options(params.get("options"))
        self._permissions[message.id] = title
        if self.cancelling or self.prompt_id is None:
            return [self._answer(message.id, title, None)]
        if not self.policy:
            return [PermissionRequested(message.id, title, options)]
        return [self._answer(message.id, title, decide_permission(options, unattended=self.unattended))]

    def _on_notification(self, message: Notification, text: str) -> list[AcpEvent]:
        if message.method != "session/update":
            return []
        params = message.params if isinstance(message.params, dict) else {}
        update = params.get("update")
        if not isinstance(update, dict):
            return [Unparsed(text[:1000], "session/update without an update object")]
        kind = update.get("sessionUpdate")
        if kind == "usage_update":
            # Before the leftovers' rule: spent money counts after a cancel too.
            cost = self._cost_update(update.get("cost"))
            return cost if self.prompt_id is not None else []
        if self.cancelling or self.prompt_id is None:
            # After a cancel: leftovers. Outside a turn: a session/load replaying history.
            return []
        if kind == "agent_message_chunk":
            content = update.get("content")
            # Empty chunks (qwen and claude-agent-acp send them to carry usage) say nothing.
            if isinstance(content, dict) and content.get("type") == "text" and isinstance(content.get("text"), str):
                return [Text(content["text"], delta=True)] if content["text"] else []
            return []
        if kind == "tool_call":
            return self._tool_call(update)
        if kind == "tool_call_update":
            return self._tool_update(update)
        if kind == "plan":
            return self._plan(update, text)
        return []

    def _cost_update(self, cost: object) -> list[AcpEvent]:
        """What a ``usage_update``'s cumulative session cost adds (the module docstring)."""
        if not isinstance(cost, dict) or not isinstance(cost.get("currency"), str) or not cost["currency"]:
            return []
        amount = money(cost.get("amount"))
        if amount is None:
            return []
        currency = cost["currency"]
        last = self._session_cost.get(currency, Decimal(0))
        self._session_cost[currency] = amount
        added = amount - last if amount >= last else amount  # lower: the agent's count restarted
        return [Usage(cost=added, currency=currency)] if added else []

    def _prompt_usage(self, usage: object) -> list[AcpEvent]:
        """The tokens of a prompt's answer: the turn's, or what the session's totals add."""
        if not isinstance(usage, dict):
            return []
        fresh, cached, written = count(usage.get("inputTokens")), count(usage.get("cachedReadTokens")), \
            count(usage.get("cachedWriteTokens"))
        # Thoughts: in the output, or beside it (then the total has them).
        output = max(count(usage.get("outputTokens")), count(usage.get("totalTokens")) - fresh - cached - written)
        figures: Figures = (fresh, output, cached, written)
        if self.usage_totals == "session":
            last = self._session_tokens
            self._session_tokens = figures
            if all(now >= before for now, before in zip(figures, last, strict=True)):
                figures = (fresh - last[0], output - last[1], cached - last[2], written - last[3])
        return [Usage(*figures)] if any(figures) else []

    def _tool_call(self, update: dict[str, Any]) -> list[AcpEvent]:
        tid = str(update.get("toolCallId", ""))
        tool = self._tools.setdefault(tid, _Tool(str(update.get("title") or update.get("kind") or "tool")))
        return self._tool_announce(tool, update) + self._tool_done(tool, update)

    def _tool_update(self, update: dict[str, Any]) -> list[AcpEvent]:
        tid = str(update.get("toolCallId", ""))
        tool = self._tools.get(tid)
        if tool is None:
            # An update for a call we never saw announced: it announces the call.
            return self._tool_call(update)
        if update.get("title"):
            tool.title = str(update["title"])
        return self._tool_announce(tool, update) + self._tool_done(tool, update)

    def _tool_announce(self, tool: _Tool, update: dict[str, Any]) -> list[AcpEvent]:
        """One ToolUse per call, once its input is known.

        Some agents announce a call ``pending`` with an empty input and fill it in with the
        next update (claude-agent-acp: ``Terminal``, ``{}``, then the command): such a call is
        announced with that update, or when it runs or ends, whichever comes first.
        """
        if tool.announced:
            return []
        raw = update.get("rawInput")
        if not raw and update.get("status") in (None, "pending"):
            return []
        tool.announced = True
        return [ToolUse(tool.title, preview(raw if raw else tool.title))]

    def _tool_done(self, tool: _Tool, update: dict[str, Any]) -> list[AcpEvent]:
        status = update.get("status")
        if tool.done or status not in ("completed", "failed"):
            return []
        tool.done = True
        output = update.get("rawOutput")
        if output is None:
            output = _content_text(update.get("content"))
        return [ToolResult(preview(output if output not in (None, "") else status), is_error=status == "failed")]

    def _plan(self, update: dict[str, Any], text: str) -> list[AcpEvent]:
        entries = update.get("entries")
        if not isinstance(entries, list):
            return [Unparsed(text[:1000], "plan without entries")]
        items = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
                return [Unparsed(text[:1000], "plan entry without content")]
            status = entry.get("status")
            items.append(TodoItem(entry["content"], status if status in _PLAN_STATUSES else "pending"))
        return [Todos(tuple(items))]


def _content_text(content: object) -> str | None:
    """The text of a tool call's ``content`` list (``{type: content, content: {type: text}}``)."""
    if not isinstance(content, list):
        return None
    parts = []
    for item in content:
        if not isinstance(item, dict):
            continue
        inner = item.get("content")
        if isinstance(inner, dict) and isinstance(inner.get("text"), str):
            parts.append(inner["text"])
        elif item.get("type") == "diff" and isinstance(item.get("path"), str):
            parts.append(f"diff {item['path']}")
    return "\n".join(parts) if parts else None
