"""The pure ACP client: JSON-RPC framing, the connection state machine, the permission policy,
and replays of exchanges captured from real agents (tests/data/captures/acp-*/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest

from adapters._base import SessionId, Text, TodoItem, Todos, ToolResult, ToolUse, TurnRequest, Unparsed
from adapters._jsonrpc import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorResponse,
    JsonRpcError,
    Notification,
    Request,
    Response,
    decode,
    encode,
)
from adapters.acp import (
    CLIENT_CAPABILITIES,
    PRESETS,
    AcpConnection,
    AcpEvent,
    AcpProtocolError,
    Initialized,
    PermissionDecided,
    PermissionOption,
    PermissionRequested,
    PromptEnded,
    RequestFailed,
    SessionReady,
    build_launch,
    decide_permission,
    preset_launch,
)

CAPTURES = Path(__file__).parent / "data" / "captures"

# ---------------------------------------------------------------- framing


@pytest.mark.parametrize(
    "message",
    [
        Request(1, "session/prompt", {"sessionId": "s", "prompt": [{"type": "text", "text": "a\nb \u2603"}]}),
        Request("x", "initialize"),
        Notification("session/cancel", {"sessionId": "s"}),
        Response(7, {"stopReason": "end_turn"}),
        Response(7, None),
        ErrorResponse(3, METHOD_NOT_FOUND, "no", {"detail": 1}),
        ErrorResponse(None, PARSE_ERROR, "bad"),
    ],
)
def test_encode_is_one_line_and_decodes_back(message: Any) -> None:
    line = encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == message


@pytest.mark.parametrize(
    ("line", "code", "words"),
    [
        (b"{not json", PARSE_ERROR, "not JSON"),
        (b"[1, 2]", INVALID_REQUEST, "JSON object, not list"),
        (b'"text"', INVALID_REQUEST, "not str"),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "x"}', INVALID_REQUEST, '"jsonrpc" must be "2.0"'),
        (b'{"id": 1, "method": "x"}', INVALID_REQUEST, '"jsonrpc" must be "2.0"'),
        (b'{"jsonrpc": "2.0", "id": true, "method": "x"}', INVALID_REQUEST, '"id" must be'),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', INVALID_REQUEST, '"method" must be a string'),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "x", "params": 3}', INVALID_REQUEST, '"params" must be'),
        (b'{"jsonrpc": "2.0", "id": 1, "result": 1, "error": {}}', INVALID_REQUEST, "not both"),
        (b'{"jsonrpc": "2.0", "id": 1, "error": {"code": "x"}}', INVALID_REQUEST, '"error" must be'),
        (b'{"jsonrpc": "2.0", "result": 1}', INVALID_REQUEST, 'needs an "id"'),
        (b'{"jsonrpc": "2.0", "id": 1}', INVALID_REQUEST, "neither a request"),
    ],
)
def test_decode_says_what_is_wrong(line: bytes, code: int, words: str) -> None:
    with pytest.raises(JsonRpcError) as info:
        decode(line)
    assert info.value.code == code
    assert words in info.value.message


def test_decode_refuses_an_oversized_line() -> None:
    line = encode(Notification("session/update", {"text": "x" * 100}))
    with pytest.raises(JsonRpcError) as info:
        decode(line, max_bytes=50)
    assert info.value.code == PARSE_ERROR and "50-byte limit" in info.value.message


def test_decode_keeps_the_id_of_an_invalid_request_so_it_can_be_answered() -> None:
    with pytest.raises(JsonRpcError) as info:
        decode(b'{"jsonrpc": "2.0", "id": 9, "method": "x", "params": "no"}')
    assert info.value.id == 9


# ---------------------------------------------------------------- the connection


def sent(conn: AcpConnection) -> list[Any]:
    """The messages the connection queued since the last call."""
    return [decode(line) for line in conn.data_to_send().splitlines()]


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **obj}).encode()


def update(body: dict[str, Any], session: str = "S1") -> bytes:
    return line({"method": "session/update", "params": {"sessionId": session, "update": body}})


def chunk(text: str) -> bytes:
    return update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})


def opened(*, unattended: bool = True, policy: bool = True) -> AcpConnection:
    """A connection with an open session ``S1`` (initialize id 1, session/new id 2)."""
    conn = AcpConnection(unattended=unattended, policy=policy)
    conn.initialize()
    conn.receive(line({"id": 1, "result": {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}}))
    conn.new_session("/work")
    assert conn.receive(line({"id": 2, "result": {"sessionId": "S1"}})) == [
        SessionId("S1"),
        SessionReady("S1", loaded=False),
    ]
    conn.data_to_send()
    return conn


def prompting(**kwargs: Any) -> AcpConnection:
    conn = opened(**kwargs)
    conn.prompt("hello")
    conn.data_to_send()
    return conn


def test_initialize_declares_no_fs_and_no_terminal() -> None:
    conn = AcpConnection()
    conn.initialize()
    (request,) = sent(conn)
    assert request.method == "initialize"
    assert request.params["protocolVersion"] == 1
    assert request.params["clientCapabilities"] == CLIENT_CAPABILITIES
    assert request.params["clientCapabilities"]["terminal"] is False
    assert not any(request.params["clientCapabilities"]["fs"].values())
    events = conn.receive(
        line(
            {
                "id": request.id,
                "result": {
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": True},
                    "agentInfo": {"name": "a"},
                },
            }
        )
    )
    assert events == [Initialized(1, load_session=True, agent_name="a")]


def test_session_requests_carry_cwd_and_no_mcp_servers() -> None:
    conn = AcpConnection()
    with pytest.raises(AcpProtocolError):
        conn.new_session("/w")
    conn.initialize()
    conn.receive(line({"id": 1, "result": {"protocolVersion": 1}}))
    assert conn.load_session_supported is False
    conn.data_to_send()
    conn.new_session("/w")
    conn.load_session("old", "/w")
    new, load = sent(conn)
    assert new.params == {"cwd": "/w", "mcpServers": []}
    assert load.params == {"sessionId": "old", "cwd": "/w", "mcpServers": []}


def test_load_is_ready_with_the_loaded_id_and_its_replay_is_dropped() -> None:
    conn = AcpConnection()
    conn.initialize()
    conn.receive(line({"id": 1, "result": {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}}))
    conn.load_session("old", "/w")
    assert (
        conn.receive(update({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "hi"}}, "old"))
        == []
    )
    assert conn.receive(chunk("earlier answer")) == []
    assert conn.receive(line({"id": 2, "result": None})) == [SessionId("old"), SessionReady("old", loaded=True)]


def test_a_failed_load_is_reported_so_the_owner_can_start_anew() -> None:
    conn = AcpConnection()
    conn.initialize()
    conn.receive(line({"id": 1, "result": {"protocolVersion": 1}}))
    conn.load_session("old", "/w")
    events = conn.receive(line({"id": 2, "error": {"code": -32603, "message": "Internal error"}}))
    assert events == [RequestFailed("session/load", -32603, "Internal error")]
    assert conn.session_id is None


def test_prompt_needs_a_session_and_only_one_at_a_time() -> None:
    with pytest.raises(AcpProtocolError):
        AcpConnection().prompt("x")
    conn = prompting()
    with pytest.raises(AcpProtocolError):
        conn.prompt("again")


def test_prompt_sends_one_text_block_and_ends_with_the_stop_reason() -> None:
    conn = opened()
    rid = conn.prompt("say -x hi")
    (request,) = sent(conn)
    assert request.params == {"sessionId": "S1", "prompt": [{"type": "text", "text": "say -x hi"}]}
    assert conn.receive(line({"id": rid, "result": {"stopReason": "max_tokens"}})) == [PromptEnded("max_tokens")]
    assert conn.prompt_id is None


def test_message_chunks_are_text_deltas_and_empty_ones_are_dropped() -> None:
    conn = prompting()
    events = [e for raw in (chunk("Hel"), chunk(""), chunk("lo")) for e in conn.receive(raw)]
    assert events == [Text("Hel", delta=True), Text("lo", delta=True)]


def test_thoughts_and_bookkeeping_updates_are_dropped() -> None:
    conn = prompting()
    for kind in ("agent_thought_chunk", "user_message_chunk"):
        assert conn.receive(update({"sessionUpdate": kind, "content": {"type": "text", "text": "x"}})) == []
    assert conn.receive(update({"sessionUpdate": "available_commands_update", "availableCommands": []})) == []
    assert conn.receive(update({"sessionUpdate": "usage_update", "used": 1})) == []


def test_tool_call_and_its_completion_are_tool_use_and_one_tool_result() -> None:
    conn = prompting()
    announce = {
        "sessionUpdate": "tool_call",
        "toolCallId": "t1",
        "title": "Shell",
        "status": "pending",
        "rawInput": {"command": "ls"},
    }
    assert conn.receive(update(announce)) == [ToolUse("Shell", '{"command":"ls"}')]
    assert (
        conn.receive(update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress"})) == []
    )
    done = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "t1",
        "status": "completed",
        "content": [{"type": "content", "content": {"type": "text", "text": "a.txt"}}],
    }
    assert conn.receive(update(done)) == [ToolResult("a.txt")]
    assert conn.receive(update(done)) == []  # once per call


def test_a_call_announced_without_its_input_is_a_tool_use_once_the_input_is_known() -> None:
    conn = prompting()
    empty = {"sessionUpdate": "tool_call", "toolCallId": "t2", "title": "Terminal", "status": "pending", "rawInput": {}}
    assert conn.receive(update(empty)) == []
    filled = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "t2",
        "title": "ls -l",
        "rawInput": {"command": "ls -l"},
    }
    assert conn.receive(update(filled)) == [ToolUse("ls -l", '{"command":"ls -l"}')]
    assert (
        conn.receive(update({"sessionUpdate": "tool_call_update", "toolCallId": "t2", "status": "in_progress"})) == []
    )


def test_a_failed_tool_is_an_error_result_and_an_unannounced_update_is_announced() -> None:
    conn = prompting()
    events = conn.receive(
        update(
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": "t9",
                "title": "rm",
                "status": "failed",
                "rawOutput": "denied",
            }
        )
    )
    assert events == [ToolUse("rm", "rm"), ToolResult("denied", is_error=True)]


def test_plan_is_todos() -> None:
    conn = prompting()
    entries = [
        {"content": "a", "priority": "high", "status": "completed"},
        {"content": "b", "priority": "low", "status": "in_progress"},
        {"content": "c", "priority": "low", "status": "pending"},
    ]
    assert conn.receive(update({"sessionUpdate": "plan", "entries": entries})) == [
        Todos((TodoItem("a", "completed"), TodoItem("b", "in_progress"), TodoItem("c", "pending")))
    ]
    (bad,) = conn.receive(update({"sessionUpdate": "plan", "entries": [{"status": "pending"}]}))
    assert isinstance(bad, Unparsed)


def options(*kinds: str) -> tuple[PermissionOption, ...]:
    return tuple(PermissionOption(f"id-{k}", k, k) for k in kinds)


@pytest.mark.parametrize(
    ("offered", "unattended", "chosen"),
    [
        (("allow_always", "allow_once", "reject_once"), True, "allow_once"),
        (("allow_always", "reject_once"), True, "allow_always"),
        (("reject_once", "reject_always"), True, None),
        (("allow_once", "reject_always", "reject_once"), False, "reject_once"),
        (("allow_once", "reject_always"), False, "reject_always"),
        (("allow_once",), False, None),
        ((), True, None),
    ],
)
def test_permission_policy(offered: tuple[str, ...], unattended: bool, chosen: str | None) -> None:
    option = decide_permission(options(*offered), unattended=unattended)
    assert (option.kind if option else None) == chosen


def permission_request(rid: int = 50) -> bytes:
    return line(
        {
            "id": rid,
            "method": "session/request_permission",
            "params": {
                "sessionId": "S1",
                "toolCall": {"toolCallId": "t1", "title": "rm -rf build"},
                "options": [
                    {"optionId": "ok", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                ],
            },
        }
    )


@pytest.mark.parametrize(("unattended", "option", "verb"), [(True, "ok", "allowed"), (False, "no", "rejected")])
def test_permission_requests_are_answered_by_the_policy_at_once(unattended: bool, option: str, verb: str) -> None:
    conn = prompting(unattended=unattended)
    (decided,) = conn.receive(permission_request())
    assert isinstance(decided, PermissionDecided) and decided.option_id == option
    assert verb in decided.describe()
    assert sent(conn) == [Response(50, {"outcome": {"outcome": "selected", "optionId": option}})]


def test_a_cancel_sends_session_cancel_and_answers_pending_permissions_cancelled() -> None:
    conn = prompting(policy=False)
    (asked,) = conn.receive(permission_request(50))
    assert isinstance(asked, PermissionRequested) and [o.kind for o in asked.options] == ["allow_once", "reject_once"]
    conn.receive(permission_request(51))
    assert conn.pending_permissions == [50, 51]
    decisions = conn.cancel()
    assert [d.outcome for d in decisions if isinstance(d, PermissionDecided)] == ["cancelled", "cancelled"]
    assert sent(conn) == [
        Notification("session/cancel", {"sessionId": "S1"}),
        Notification("$/cancel_request", {"requestId": 3}),
        Response(50, {"outcome": {"outcome": "cancelled"}}),
        Response(51, {"outcome": {"outcome": "cancelled"}}),
    ]
    # A repeated cancel sends nothing more; a permission asked after it is cancelled at once.
    assert conn.cancel() == [] and sent(conn) == []
    (late,) = conn.receive(permission_request(52))
    assert isinstance(late, PermissionDecided) and late.outcome == "cancelled"


def test_a_cancel_with_no_prompt_sends_nothing() -> None:
    conn = opened()
    assert conn.cancel() == [] and conn.data_to_send() == b""


def test_output_after_a_cancel_is_dropped_and_the_answer_ends_the_turn() -> None:
    conn = prompting()
    assert conn.receive(chunk("before")) == [Text("before", delta=True)]
    conn.cancel()
    assert conn.receive(chunk("after")) == []
    assert conn.receive(update({"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x"})) == []
    assert conn.receive(line({"id": 3, "result": {"stopReason": "cancelled"}})) == [
        PromptEnded("cancelled", cancelled=True)
    ]
    assert conn.cancelling is False and conn.prompt_id is None


def test_an_error_answer_to_the_prompt_ends_the_turn() -> None:
    conn = prompting()
    events = conn.receive(line({"id": 3, "error": {"code": -32603, "message": "model overloaded"}}))
    assert events == [
        RequestFailed("session/prompt", -32603, "model overloaded"),
        PromptEnded("error", error="model overloaded"),
    ]


@pytest.mark.parametrize("method", ["fs/read_text_file", "terminal/create", "x/unknown"])
def test_methods_corral_does_not_offer_get_method_not_found(method: str) -> None:
    conn = prompting()
    conn.receive(line({"id": 77, "method": method, "params": {}}))
    (answer,) = sent(conn)
    assert isinstance(answer, ErrorResponse) and answer.id == 77 and answer.code == METHOD_NOT_FOUND


def test_malformed_lines_are_unparsed_and_an_invalid_request_is_still_answered() -> None:
    conn = prompting()
    (bad,) = conn.receive(b"Loading extensions...")
    assert isinstance(bad, Unparsed) and "not JSON" in bad.reason
    (bad,) = conn.receive(b'{"hello": "world"}')
    assert isinstance(bad, Unparsed) and '"jsonrpc" must be "2.0"' in bad.reason
    assert sent(conn) == []
    conn.receive(line({"id": 5, "method": "x", "params": "nope"}))
    (answer,) = sent(conn)
    assert isinstance(answer, ErrorResponse) and answer.id == 5 and answer.code == INVALID_REQUEST
    (stray,) = conn.receive(line({"id": 999, "result": {}}))
    assert isinstance(stray, Unparsed) and "no request of ours" in stray.reason
    assert conn.receive(b"   ") == []


def test_presets_fill_in_the_command_and_the_quirks() -> None:
    launch = preset_launch("gemini", cwd="/w", args=["--model=m"], env={"NO_COLOR": "0"})
    assert launch.argv == ("gemini", "--acp", "--model=m")
    assert launch.env["GEMINI_CLI_NO_RELAUNCH"] == "true" and launch.env["NO_COLOR"] == "0"
    assert preset_launch("opencode", cwd="/w", command=["/x/opencode"]).argv == ("/x/opencode", "acp")
    assert preset_launch("claude", cwd="/w").argv == ("claude-agent-acp",)
    assert preset_launch("copilot", cwd="/w").argv == ("copilot", "--acp")
    assert preset_launch("vibe", cwd="/w").argv == ("vibe-acp",)
    assert preset_launch("kilo", cwd="/w").argv == ("kilo", "acp")
    assert preset_launch("kimi", cwd="/w").argv == ("kimi", "acp")
    assert preset_launch("fast-agent", cwd="/w").argv == ("fast-agent", "acp", "--shell")
    known = ["claude", "codex", "copilot", "fast-agent", "gemini", "kilo", "kimi", "opencode", "qwen", "vibe"]
    with pytest.raises(KeyError, match="known: " + ", ".join(known)):
        preset_launch("nope", cwd="/w")
    assert sorted(PRESETS) == known


def test_an_attended_fast_agent_has_no_shell_tool_and_keeps_its_state_in_home() -> None:
    """fast-agent's local shell asks nothing over ACP: only an unattended agent gets it."""
    def launch(unattended: bool) -> tuple[str, ...]:
        request = TurnRequest(prompt="", channel="c", turn_id="t", agent="fa", command=(), home="/h", cwd="/w",
                              options={"preset": "fast-agent"}, unattended=unattended)
        built = build_launch(request)
        assert built.env["FAST_AGENT_HOME"] == "/h/.fast-agent"
        return built.argv

    assert launch(True) == ("fast-agent", "acp", "--shell")
    assert launch(False) == ("fast-agent", "acp")


def test_the_kimi_preset_stores_a_login_placeholder_that_never_expires() -> None:
    """kimi acp refuses session/new without a stored Kimi Code login, even for a model of
    one's own: the preset's file is one it accepts (an access token, no expiry)."""
    request = TurnRequest(prompt="", channel="c", turn_id="t", agent="kimi", command=("kimi",), home="/h",
                          options={"preset": "kimi"})
    files = build_launch(request).files
    token = json.loads(files[".kimi/credentials/kimi-code.json"])
    assert token["access_token"] and "expires_at" not in token


# ---------------------------------------------------------------- replays of real agents


def replay(
    path: Path, *, unattended: bool = True, usage_totals: Literal["turn", "session"] = "turn"
) -> dict[str, list[AcpEvent]]:
    """Feed a captured exchange to a fresh connection, making the same calls corral made.

    Every line corral sent in the capture must be reproduced byte for byte, in order; the
    events are returned per scenario.
    """
    conn = AcpConnection(unattended=unattended, usage_totals=usage_totals)
    produced: list[str] = []
    expected: list[str] = []
    events: dict[str, list[AcpEvent]] = {}
    for record in map(json.loads, path.read_text().splitlines()):
        scenario, raw = record["scenario"], record["line"]
        if record["dir"] == "recv":
            events.setdefault(scenario, []).extend(conn.receive(raw.encode()))
        else:
            expected.append(raw)
            message = decode(raw)
            if isinstance(message, Request) and message.method == "initialize":
                # A restarted agent process (after a kill, or a preset's restart_after_cancel)
                # begins a new connection.
                produced.extend(conn.data_to_send().decode().splitlines())
                conn = AcpConnection(unattended=unattended, usage_totals=usage_totals)
                conn.initialize()
            elif isinstance(message, Request) and message.method == "session/new":
                conn.new_session(message.params["cwd"])
            elif isinstance(message, Request) and message.method == "session/load":
                conn.load_session(message.params["sessionId"], message.params["cwd"])
            elif isinstance(message, Request) and message.method == "session/prompt":
                conn.prompt(message.params["prompt"][0]["text"])
            elif isinstance(message, Notification) and message.method == "session/cancel":
                events.setdefault(scenario, []).extend(conn.cancel())
        produced.extend(conn.data_to_send().decode().splitlines())
    if not any('"$/cancel_request"' in line for line in expected):
        # Recorded before corral sent ``$/cancel_request`` beside every ``session/cancel``.
        produced = [line for line in produced if '"$/cancel_request"' not in line]
    assert produced == expected
    return events


def text_of(events: list[AcpEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Text))


AGENTS = sorted(p.name.removeprefix("acp-") for p in CAPTURES.glob("acp-*") if (p / "session.jsonl").exists())


@pytest.fixture(params=AGENTS)
def agent(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_captures_exist_for_the_agents_that_run_offline() -> None:
    assert {"claude", "codex", "gemini", "opencode", "qwen"} <= set(AGENTS)


def test_replay_text_turn_joins_into_one_answer(agent: str) -> None:
    events = replay(CAPTURES / f"acp-{agent}" / "session.jsonl")
    assert any(isinstance(e, SessionReady) for e in events["start"])
    assert text_of(events["text"]) == "Hello from ACP."
    assert events["text"][-1] == PromptEnded("end_turn")


#: Agents whose shell tool asks no permission over ACP (an attended agent of theirs has none).
ASKS_NOTHING = {"fast-agent"}
#: Agents that announce a tool call ``pending`` with no input and never update it: no tool
#: entry to show (fast-agent 0.10.48's local shell; the answer carries the output).
TOOLS_UNREPORTED = {"fast-agent"}


def test_replay_tool_turn_is_tool_use_and_one_result(agent: str) -> None:
    events = replay(CAPTURES / f"acp-{agent}" / "session.jsonl")["tool"]
    # gemini deems ``echo`` safe and asks no permission; the others ask, and are allowed once.
    assert all(e.kind == "allow_once" for e in events if isinstance(e, PermissionDecided))
    uses = [e for e in events if isinstance(e, ToolUse)]
    results = [e for e in events if isinstance(e, ToolResult)]
    if agent in TOOLS_UNREPORTED:
        assert uses == [] and results == []
    else:
        assert uses and len(results) == 1 and not results[0].is_error
    assert "hi-from-tool" in text_of(events)
    assert events[-1] == PromptEnded("end_turn")


@pytest.mark.parametrize("scenario", ["cancel-tool", "cancel-silent"])
def test_replay_cancel_is_acknowledged_and_nothing_after_it_is_kept(agent: str, scenario: str) -> None:
    events = replay(CAPTURES / f"acp-{agent}" / "session.jsonl")[scenario]
    if scenario == "cancel-tool":  # the tool script is not deemed safe: the policy allowed it
        asked = [] if agent in ASKS_NOTHING else ["allow_once"]
        assert [e.kind for e in events if isinstance(e, PermissionDecided)] == asked
    assert events[-1] == PromptEnded("cancelled", cancelled=True)
    assert not [e for e in events if isinstance(e, Text | ToolResult)]


def test_replay_the_next_prompt_after_a_cancel_runs_in_the_same_process(agent: str) -> None:
    events = replay(CAPTURES / f"acp-{agent}" / "session.jsonl")
    assert events["after-silent"][-1] == PromptEnded("end_turn")
    assert text_of(events["after-silent"]) == "Back again."


def test_replay_attended_agent_rejects_the_tool(agent: str) -> None:
    events = replay(CAPTURES / f"acp-{agent}" / "attended.jsonl", unattended=False)["attended"]
    decided = [e for e in events if isinstance(e, PermissionDecided)]
    if agent in ASKS_NOTHING:  # no shell tool at all when attended: nothing to ask for
        assert decided == []
    else:
        assert decided and all(d.kind is not None and d.kind.startswith("reject") for d in decided)
    assert isinstance(events[-1], PromptEnded)


#: Agents that answer ``session/load`` of an unknown id as a success (an empty session).
STALE_LOAD_ACCEPTED = {"qwen"}


def test_replay_stale_load_fails_and_a_new_session_opens(agent: str) -> None:
    events = replay(CAPTURES / f"acp-{agent}" / "stale.jsonl")["start"]
    failed = [e for e in events if isinstance(e, RequestFailed)]
    ready = [e for e in events if isinstance(e, SessionReady)]
    if agent in STALE_LOAD_ACCEPTED:
        assert not failed and ready == [SessionReady("no-such-session", loaded=True)]
        return
    assert [f.method for f in failed] == ["session/load"]
    assert len(ready) == 1 and not ready[0].loaded
