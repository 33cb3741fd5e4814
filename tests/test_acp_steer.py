"""Steering an ACP turn (contract line 19), the pure half (adapters/acp.py): an agent that takes a
``session/prompt`` sent while one runs into the running turn (claude-agent-acp's
``_meta.claudeCode.promptQueueing``) is steered by a second prompt; the running one's ``end_turn``
is the hand-off, not the turn's end; a cancel names both; late answers end nothing."""

from __future__ import annotations

from typing import Any

import pytest
from test_acp_client import line, sent

from adapters._jsonrpc import Notification, Request
from adapters.acp import AcpConnection, AcpProtocolError, PromptEnded

QUEUEING = {"agentCapabilities": {"_meta": {"claudeCode": {"promptQueueing": True}}}}


def prompting(result: dict[str, Any] | None = None) -> AcpConnection:
    conn = AcpConnection()
    conn.initialize()
    conn.receive(line({"id": 1, "result": {"protocolVersion": 1, **(result or {})}}))
    conn.new_session("/w")
    conn.receive(line({"id": 2, "result": {"sessionId": "S1"}}))
    conn.prompt("hi")
    conn.data_to_send()
    return conn


def test_prompt_queueing_is_read_from_the_agents_capabilities() -> None:
    assert prompting(QUEUEING).prompt_queueing
    assert not prompting().prompt_queueing
    assert not prompting({"agentCapabilities": {"_meta": {"claudeCode": {"promptQueueing": "yes"}}}}).prompt_queueing


def test_a_steer_is_refused_by_an_agent_that_does_not_queue_outside_a_turn_and_while_cancelling() -> None:
    with pytest.raises(AcpProtocolError, match="does not take"):
        prompting().steer("x")
    conn = prompting(QUEUEING)
    conn.cancel()
    with pytest.raises(AcpProtocolError, match="no turn"):
        conn.steer("x")
    idle = prompting(QUEUEING)
    idle.receive(line({"id": 3, "result": {"stopReason": "end_turn"}}))
    with pytest.raises(AcpProtocolError, match="no turn"):
        idle.steer("x")


def test_the_running_prompts_end_turn_hands_off_and_the_turn_ends_with_the_steers_prompt() -> None:
    conn = prompting(QUEUEING)
    rid = conn.steer("also this")
    [request] = sent(conn)
    assert isinstance(request, Request) and request.method == "session/prompt" and request.id == rid
    assert request.params["prompt"] == [{"type": "text", "text": "also this"}]
    assert conn.receive(line({"id": 3, "result": {"stopReason": "end_turn"}})) == []  # the hand-off
    assert conn.prompt_id == rid
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "took it"}}
    assert conn.receive(line({"method": "session/update", "params": {"sessionId": "S1", "update": chunk}}))
    [ended] = conn.receive(line({"id": rid, "result": {"stopReason": "end_turn"}}))
    assert isinstance(ended, PromptEnded) and ended.stop_reason == "end_turn" and conn.prompt_id is None


def test_a_cancel_names_every_prompt_of_the_turn_and_their_late_answers_end_nothing() -> None:
    conn = prompting(QUEUEING)
    rid = conn.steer("also this")
    conn.data_to_send()
    conn.cancel()
    notes = [m for m in sent(conn) if isinstance(m, Notification)]
    assert [n.method for n in notes] == ["session/cancel", "$/cancel_request", "$/cancel_request"]
    assert [n.params["requestId"] for n in notes[1:]] == [3, rid]
    [ended] = conn.receive(line({"id": 3, "result": {"stopReason": "cancelled"}}))
    assert isinstance(ended, PromptEnded) and ended.cancelled
    # The steer's own answer comes after the turn is over: it ends nothing (not the next turn).
    conn.prompt("next")
    assert conn.receive(line({"id": rid, "result": {"stopReason": "cancelled"}})) == []
    assert conn.prompt_id is not None


def test_a_steer_answered_before_its_hand_off_ends_nothing() -> None:
    conn = prompting(QUEUEING)
    rid = conn.steer("also this")
    assert conn.receive(line({"id": rid, "result": {"stopReason": "end_turn"}})) == []
    [ended] = conn.receive(line({"id": 3, "result": {"stopReason": "end_turn"}}))
    assert isinstance(ended, PromptEnded)  # no steer left: the turn ends with its prompt
