#!/usr/bin/env python3
"""A small ACP agent for corral's tests: JSON-RPC 2.0 on stdin/stdout, no model, no network.

It behaves like a well-mannered ACP agent unless a marker in the prompt asks otherwise:

``[[say:TEXT]]``      answer TEXT in three ``agent_message_chunk`` updates (default ``ok: PROMPT``)
``[[tool:CMD]]``      announce a tool call, run ``sh -c CMD`` in a new session, wait for it; on
                      ``session/cancel`` answer ``cancelled`` at once and leave CMD running — as
                      claude-agent-acp does, so only corral's kill ends it
``[[silent]]``        say nothing until cancelled
``[[ignore-cancel]]`` never answer the prompt, cancel or not
``[[late:S]]``        answer a cancel only after S seconds
``[[die]]``           exit with status 3 in the middle of the prompt
``[[garbage]]``       print a line of non-JSON and a non-JSON-RPC object before answering
``[[permission]]``    ask ``session/request_permission`` first; say the outcome
``[[plan]]``          send a three-entry plan
``[[thought]]``       send an ``agent_thought_chunk``
``[[ask-fs]]``        call ``fs/read_text_file`` on the client (corral must refuse it)

Sessions are remembered in ``$FAKE_ACP_STATE/<id>.json`` (default: the cwd), so a fresh
process can ``session/load`` one; the answer then says how many earlier prompts it found
(``earlier: N``). ``FAKE_ACP_NO_LOAD=1`` hides the loadSession capability;
``FAKE_ACP_QUEUEING=1`` takes a ``session/prompt`` sent while one runs into the running turn,
as claude-agent-acp does (its ``_meta.claudeCode.promptQueueing``): at its tool's next step the
running prompt answers ``end_turn`` (the hand-off) and the turn goes on under the new one, which
says ``steered: TEXT`` and ends the turn; a steered ``enough`` ends the tool (its group).
``FAKE_ACP_HELPER=1`` starts a long ``sleep`` at start-up, like an MCP server a real agent
starts before any turn (it must survive a cancel). ``FAKE_ACP_HOLD_LOAD=PATH`` holds every
``session/load`` answer while PATH exists (a slow restart).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

MARKER = re.compile(r"\[\[([a-z-]+)(?::(.*?))?\]\]", re.S)

_write_lock = threading.Lock()
_cancelled: dict[str, threading.Event] = {}
_answers: dict[int, Any] = {}
_answer_ready = threading.Condition()
_next_id = 1000
_queued: dict[str, list[tuple[int, str]]] = {}
"""Prompts sent while one runs (FAKE_ACP_QUEUEING), by session: (request id, text)."""
_running: set[str] = set()


def send(obj: dict[str, Any]) -> None:
    obj = {"jsonrpc": "2.0", **obj}
    with _write_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def raw(line: str) -> None:
    with _write_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def update(session: str, body: dict[str, Any]) -> None:
    send({"method": "session/update", "params": {"sessionId": session, "update": body}})


def call(method: str, params: dict[str, Any]) -> Any:
    """A request to the client; waits for its answer."""
    global _next_id
    _next_id += 1
    rid = _next_id
    send({"id": rid, "method": method, "params": params})
    with _answer_ready:
        while rid not in _answers:
            _answer_ready.wait()
        return _answers.pop(rid)


def state_dir() -> Path:
    return Path(os.environ.get("FAKE_ACP_STATE") or os.getcwd())


def history(session: str) -> list[str]:
    path = state_dir() / f"{session}.json"
    return json.loads(path.read_text()) if path.exists() else []


def remember(session: str, prompt: str) -> None:
    seen = [*history(session), prompt]
    (state_dir() / f"{session}.json").write_text(json.dumps(seen))


def run_prompt(rid: int, session: str, prompt: str) -> None:
    marks = {kind: arg for kind, arg in MARKER.findall(prompt)}
    cancel = _cancelled.setdefault(session, threading.Event())
    cancel.clear()
    steered: list[str] = []
    _running.add(session)
    try:
        _run(rid, session, prompt, marks, cancel, steered)
    finally:
        _running.discard(session)
        later = _queued.pop(session, [])
        if later:  # (taken at no step of the turn: each runs as a turn of its own, in order)
            queued, text = later[0]
            _queued[session] = later[1:]
            threading.Thread(target=run_prompt, args=(queued, session, text), daemon=True).start()


def _run(rid: int, session: str, prompt: str, marks: dict[str, str], cancel: threading.Event,
         steered: list[str]) -> None:
    earlier = len(history(session))
    remember(session, prompt)

    def finish(reason: str) -> None:
        if reason == "cancelled" and "late" in marks:
            time.sleep(float(marks["late"] or 5))
        send({"id": rid, "result": {"stopReason": reason}})

    if "ignore-cancel" in marks:
        return  # never answered
    if "garbage" in marks:
        raw("this is not json")
        raw('{"hello": "world"}')
    if "thought" in marks:
        update(session, {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}})
    if "plan" in marks:
        update(
            session,
            {
                "sessionUpdate": "plan",
                "entries": [
                    {"content": "Read the task", "priority": "high", "status": "completed"},
                    {"content": "Do the work", "priority": "medium", "status": "in_progress"},
                    {"content": "Report back", "priority": "low", "status": "pending"},
                ],
            },
        )
    say = marks.get("say") or f"ok: {MARKER.sub('', prompt).strip()[:40]}"
    if "ask-fs" in marks:
        answer = call("fs/read_text_file", {"sessionId": session, "path": "/etc/hostname"})
        say = f"fs answer: {json.dumps(answer)}"
    if "permission" in marks:
        answer = call(
            "session/request_permission",
            {
                "sessionId": session,
                "toolCall": {"toolCallId": "perm-1", "title": "touch allowed.txt", "kind": "edit"},
                "options": [
                    {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
                    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                ],
            },
        )
        if cancel.is_set():
            return finish("cancelled")
        say = f"permission: {json.dumps(answer['outcome'], sort_keys=True)}"
    if "die" in marks:
        update(session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "dying"}})
        os._exit(3)
    if "tool" in marks:
        tid = uuid.uuid4().hex[:8]
        update(
            session,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": tid,
                "title": "Shell",
                "kind": "execute",
                "status": "pending",
                "rawInput": {"command": marks["tool"]},
            },
        )
        proc = subprocess.Popen(
            ["sh", "-c", marks["tool"]],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        update(session, {"sessionUpdate": "tool_call_update", "toolCallId": tid, "status": "in_progress"})
        while proc.poll() is None:
            if cancel.wait(0.02):
                for queued, _ in _queued.pop(session, []):
                    send({"id": queued, "result": {"stopReason": "cancelled"}})
                return finish("cancelled")  # the tool is left running
            if _queued.get(session):
                # The hand-off: this prompt ends, the turn goes on under the queued one.
                queued, steer = _queued[session].pop(0)
                finish("end_turn")
                rid, steered = queued, [*steered, steer]
                update(session, {"sessionUpdate": "agent_message_chunk",
                                 "content": {"type": "text", "text": f"steered: {steer}. "}})
                if "enough" in steer:
                    os.killpg(proc.pid, 9)
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        update(
            session,
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": tid,
                "status": "completed" if proc.returncode == 0 else "failed",
                "content": [{"type": "content", "content": {"type": "text", "text": out}}],
            },
        )
    if "silent" in marks:
        cancel.wait()
        return finish("cancelled")
    if cancel.is_set():
        return finish("cancelled")
    text = f"{say} (earlier: {earlier})" + "".join(f" You also said: {s}" for s in steered)
    third = max(1, len(text) // 3)
    for i in range(0, len(text), third):
        update(
            session, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text[i : i + third]}}
        )
    finish("end_turn")


def main() -> None:
    if os.environ.get("FAKE_ACP_HELPER") == "1":
        subprocess.Popen(["sleep", "3002"], stdin=subprocess.DEVNULL)
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        method = msg.get("method")
        rid = msg.get("id")
        params = msg.get("params") or {}
        if method is None:
            with _answer_ready:
                _answers[rid] = msg.get("result", msg.get("error"))
                _answer_ready.notify_all()
        elif method == "initialize":
            caps: dict[str, Any] = {"loadSession": os.environ.get("FAKE_ACP_NO_LOAD") != "1"}
            if os.environ.get("FAKE_ACP_QUEUEING") == "1":
                caps["_meta"] = {"claudeCode": {"promptQueueing": True}}
            send(
                {
                    "id": rid,
                    "result": {
                        "protocolVersion": 1,
                        "agentCapabilities": caps,
                        "agentInfo": {"name": "fake-acp"},
                        "authMethods": [],
                    },
                }
            )
        elif method == "session/new":
            send({"id": rid, "result": {"sessionId": "fake-" + uuid.uuid4().hex[:12]}})
        elif method == "session/load":
            sid = params.get("sessionId")
            hold = os.environ.get("FAKE_ACP_HOLD_LOAD")
            while hold and Path(hold).exists():
                time.sleep(0.02)
            if os.environ.get("FAKE_ACP_NO_LOAD") == "1" or not (state_dir() / f"{sid}.json").exists():
                send({"id": rid, "error": {"code": -32002, "message": f"session {sid} not found"}})
                continue
            for earlier in history(sid):
                update(sid, {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": earlier}})
            send({"id": rid, "result": None})
        elif method == "session/prompt":
            text = "".join(b.get("text", "") for b in params.get("prompt", []) if isinstance(b, dict))
            if os.environ.get("FAKE_ACP_QUEUEING") == "1" and params["sessionId"] in _running:
                _queued.setdefault(params["sessionId"], []).append((rid, text))
                continue
            threading.Thread(target=run_prompt, args=(rid, params["sessionId"], text), daemon=True).start()
        elif method == "session/cancel":
            _cancelled.setdefault(params.get("sessionId"), threading.Event()).set()
        elif rid is not None:
            send({"id": rid, "error": {"code": -32601, "message": f"unknown method {method}"}})
    if os.environ.get("FAKE_ACP_LINGER") == "1":
        # An agent that does not notice its client is gone (busy in its work): it stays
        # until something kills it, as an orphan after its daemon's kill -9.
        threading.Event().wait()


if __name__ == "__main__":
    main()
