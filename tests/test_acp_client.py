"""The pure parts of corral's ACP client that the review against the official SDKs changed
(adapters/acp.py): the cancel's two notifications and ``-32800``; the reason of an error,
bounded and sanitised; the protocol version refused; authentication methods read, named and
checked; ``session/resume`` and ``session/close`` by capability."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters._base import SessionId
from adapters._jsonrpc import Notification, Request, decode
from adapters.acp import (
    ERROR_TEXT_CHARS,
    UNSUPPORTED_VERSION,
    AcpConnection,
    AcpProtocolError,
    Authenticated,
    AuthMethod,
    Initialized,
    PromptEnded,
    RequestFailed,
    SessionClosed,
    SessionReady,
    acp_settings,
    auth_advice,
    auth_problem,
    error_text,
)


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **obj}).encode()


def sent(conn: AcpConnection) -> list[Any]:
    return [decode(raw) for raw in conn.data_to_send().splitlines()]


def initialized(result: dict[str, Any] | None = None) -> AcpConnection:
    conn = AcpConnection()
    conn.initialize()
    conn.receive(line({"id": 1, "result": {"protocolVersion": 1, **(result or {})}}))
    conn.data_to_send()
    return conn


def prompting() -> AcpConnection:
    conn = initialized()
    conn.new_session("/w")
    conn.receive(line({"id": 2, "result": {"sessionId": "S1"}}))
    conn.prompt("hi")
    conn.data_to_send()
    return conn


# ---------------------------------------------------------------- the cancel


def test_a_cancel_sends_session_cancel_then_cancel_request_for_the_prompt_once() -> None:
    conn = prompting()
    conn.cancel()
    conn.cancel()
    assert sent(conn) == [Notification("session/cancel", {"sessionId": "S1"}),
                          Notification("$/cancel_request", {"requestId": 3})]


def test_request_cancelled_after_a_cancel_ends_the_prompt_cancelled() -> None:
    conn = prompting()
    conn.cancel()
    events = conn.receive(line({"id": 3, "error": {"code": -32800, "message": "Request cancelled"}}))
    assert events[-1] == PromptEnded("cancelled", cancelled=True)
    assert conn.prompt_id is None


def test_request_cancelled_without_a_cancel_is_an_error() -> None:
    conn = prompting()
    events = conn.receive(line({"id": 3, "error": {"code": -32800, "message": "Request cancelled"}}))
    assert events[-1] == PromptEnded("error", error="Request cancelled")


# ---------------------------------------------------------------- the reason of an error


@pytest.mark.parametrize(("message", "data", "shown"), [
    ("Internal error", {"details": "model quota exceeded (429)"}, "Internal error: model quota exceeded (429)"),
    ("Internal error", "rate limited", "Internal error: rate limited"),
    ("Authentication required", {"reason": "invalid API key (401)"}, "Authentication required: invalid API key (401)"),
    ("Internal error", None, "Internal error"),
    ("Internal error", {}, "Internal error"),
    ("Internal error", {"code": 7, "where": "x"}, 'Internal error: {"code":7,"where":"x"}'),
    ("Internal error", {"details": "Internal error"}, "Internal error"),
    ("Unsupported protocol version", {"requested": 1, "supported": [2, 3]},
     "Unsupported protocol version: the agent speaks ACP version 2, 3; corral speaks version 1"),
    ("boom\x1b[31m red\x1b[0m\n", {"details": "line one\nline\ttwo\x07"}, "boom red: line one line two"),
    ("", None, "error"),
])
def test_error_text_shows_the_reason_from_data(message: str, data: object, shown: str) -> None:
    assert error_text(message, data) == shown


@given(st.text(), st.one_of(st.none(), st.text(), st.dictionaries(st.text(), st.text())))
def test_error_text_is_one_bounded_line_of_printable_text(message: str, data: object) -> None:
    text = error_text(message, data)
    assert 0 < len(text) <= ERROR_TEXT_CHARS
    assert text.isprintable() and "\x1b" not in text


def test_a_failed_request_keeps_its_data_and_the_prompts_end_its_reason() -> None:
    conn = prompting()
    events = conn.receive(line({"id": 3, "error": {"code": -32603, "message": "Internal error",
                                                   "data": {"details": "model quota exceeded (429)"}}}))
    assert events == [
        RequestFailed("session/prompt", -32603, "Internal error", {"details": "model quota exceeded (429)"}),
        PromptEnded("error", error="Internal error: model quota exceeded (429)"),
    ]


# ---------------------------------------------------------------- the protocol version


@pytest.mark.parametrize("version", [2, 0, None, True, "1"])
def test_an_answer_in_another_protocol_version_is_refused(version: object) -> None:
    conn = AcpConnection()
    conn.initialize()
    (event,) = conn.receive(line({"id": 1, "result": {"protocolVersion": version}}))
    assert isinstance(event, RequestFailed) and event.code == UNSUPPORTED_VERSION
    assert "corral speaks version 1 only" in event.message
    assert not conn.initialized
    with pytest.raises(AcpProtocolError):
        conn.new_session("/w")


# ---------------------------------------------------------------- authentication


OFFERED = {"authMethods": [
    {"id": "api-key", "name": "API key", "type": "env_var",
     "vars": [{"name": "KEY"}, {"name": "ORG", "optional": True}]},
    {"id": "login", "name": "Log in", "type": "terminal", "args": ["--login"]},
    {"id": "oauth", "name": "Browser"},
    {"name": "no id"},
    "junk",
]}


def test_offered_methods_are_read_with_their_needs() -> None:
    conn = AcpConnection()
    conn.initialize()
    (event,) = conn.receive(line({"id": 1, "result": {"protocolVersion": 1, **OFFERED}}))
    conn.data_to_send()
    assert isinstance(event, Initialized)
    assert event.auth_methods == (
        AuthMethod("api-key", "API key", "env_var", ("KEY",)),
        AuthMethod("login", "Log in", "terminal", (), ("--login",)),
        AuthMethod("oauth", "Browser"),
    )
    conn.authenticate("api-key")
    assert sent(conn) == [Request(2, "authenticate", {"methodId": "api-key"})]
    assert conn.receive(line({"id": 2, "result": {}})) == [Authenticated("api-key")]


def test_offered_methods_are_one_bounded_line_each() -> None:
    conn = AcpConnection()
    conn.initialize()
    hostile = {"id": "k\x1b[2J" + "x" * 500, "name": "a\nb", "type": "env_var",
               "vars": [{"name": "V\r\n"}] * 50, "args": "not a list"}
    (event,) = conn.receive(line({"id": 1, "result": {"protocolVersion": 1, "authMethods": [hostile, {"id": "\n"}]}}))
    assert isinstance(event, Initialized)
    (method,) = event.auth_methods
    assert method.id == "k" + "x" * 79 and method.name == "a b" and method.vars == ("V",) * 10 and method.args == ()


def test_auth_advice_names_every_method_and_what_configures_it() -> None:
    methods = (AuthMethod("api-key", "API key", "env_var", ("KEY",)), AuthMethod("login", "Log in", "terminal", (),
                                                                                ("--login",)))
    assert auth_advice(methods, "/bin/agent") == (
        "the agent offers 'api-key' (API key): set KEY in the agent's env and acp_auth = \"api-key\"; "
        "'login' (Log in): a login in a terminal — run `/bin/agent --login` once yourself, then name the files it "
        "writes in credentials = [...] (each agent has a private HOME)"
    )
    assert "offers no authentication method" in auth_advice(())


@pytest.mark.parametrize(("method", "env", "problem"), [
    ("api-key", {"KEY": "k"}, None),
    ("api-key", {}, "'api-key' needs KEY in the agent's env"),
    ("login", {}, "'login' is a terminal login, not done over ACP"),
    ("oauth", {}, None),
    ("nope", {}, "acp_auth = 'nope' is not a method the agent offers"),
])
def test_auth_problem_says_why_a_configured_method_cannot_be_used(
    method: str, env: dict[str, str], problem: str | None
) -> None:
    methods = (AuthMethod("api-key", "API key", "env_var", ("KEY",)), AuthMethod("login", "Log in", "terminal"),
               AuthMethod("oauth", "Browser"))
    found = auth_problem(method, methods, env)
    assert (found is None) if problem is None else (found is not None and found.startswith(problem))
    assert auth_problem("anything", (), {}) is None, "an agent that lists none is taken at its word"


def test_acp_settings_read_the_start_timeout_and_the_auth_method() -> None:
    settings = acp_settings({"acp_start_timeout": 5, "acp_auth": "api-key"})
    assert settings.start_timeout == 5.0 and settings.auth == "api-key"
    assert acp_settings({"acp_start_timeout": 0}).start_timeout == 60.0
    assert acp_settings({}).auth is None


# ---------------------------------------------------------------- resume and close


def test_resume_and_close_are_offered_by_capability_objects() -> None:
    conn = AcpConnection()
    conn.initialize()
    (event,) = conn.receive(line({"id": 1, "result": {"protocolVersion": 1, "agentCapabilities": {
        "sessionCapabilities": {"resume": {}, "close": {}, "list": None}}}}))
    assert isinstance(event, Initialized) and event.resume_session and event.close_session and not event.list_sessions
    conn.data_to_send()
    conn.resume_session("S1", "/w")
    assert sent(conn) == [Request(2, "session/resume", {"sessionId": "S1", "cwd": "/w", "mcpServers": []})]
    assert conn.receive(line({"id": 2, "result": {}})) == [SessionId("S1"), SessionReady("S1", loaded=True)]
    conn.prompt("hi")
    assert conn.close_session() is None, "not while a prompt runs"
    conn.receive(line({"id": 3, "result": {"stopReason": "end_turn"}}))
    conn.data_to_send()
    assert conn.close_session() == 4
    assert sent(conn) == [Request(4, "session/close", {"sessionId": "S1"})]
    assert conn.receive(line({"id": 4, "result": {}})) == [SessionClosed("S1")]


def test_without_the_capabilities_close_sends_nothing() -> None:
    conn = initialized({"agentCapabilities": {"sessionCapabilities": {"resume": None, "close": True}}})
    conn.new_session("/w")
    conn.receive(line({"id": 2, "result": {"sessionId": "S1"}}))
    conn.data_to_send()
    assert not conn.resume_session_supported and conn.close_session() is None and conn.data_to_send() == b""
