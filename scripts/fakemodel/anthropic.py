"""A fake Anthropic Messages API for the real ``claude`` CLI, scripted by prompt markers.

The CLI posts ``/v1/messages?beta=true`` with ``"stream": true`` and reads Server-Sent
Events: ``message_start``, then per content block ``content_block_start`` /
``content_block_delta`` / ``content_block_stop``, then ``message_delta`` (the stop reason)
and ``message_stop``. A tool call is a ``tool_use`` block whose input is streamed as
``input_json_delta`` fragments, ended with ``stop_reason: "tool_use"``; the CLI runs the
tool and posts again with the ``tool_result`` as the last user message.

What the model does is read from the markers (see :mod:`scripts.fakemodel.script`) in the
latest prompt the user typed — never from tool output, so a command that echoes a marker
cannot steer the fake model. Side calls (token counting, model listing, any request that
offers no tools, such as a title or classifier call) get a short, plausible answer at once.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from ._http import FakeModelServer, Request, Responder
from .script import Script, read_script

#: The shell tool of Claude Code and the shape of its input.
SHELL_TOOL = "Bash"
#: The plan tool of Claude Code.
TODO_TOOL = "TodoWrite"

#: The plan the fake model writes for ``[[todos]]``: one item of each status.
TODO_PLAN: list[dict[str, str]] = [
    {"content": "Read the code", "status": "completed", "activeForm": "Reading the code"},
    {"content": "Write the fix", "status": "in_progress", "activeForm": "Writing the fix"},
    {"content": "Run the tests", "status": "pending", "activeForm": "Running the tests"},
]

#: Text blocks the CLI adds to a user message on its own (context, reminders), not typed.
_INJECTED_PREFIXES = ("<system-reminder>", "<command-", "<local-command", "Caveat:")


#: The ``error.type`` the real API gives with each status.
_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def agent_env(server_url: str) -> dict[str, str]:
    """Environment variables that point ``claude`` at the fake server, offline and quiet."""
    return {
        "ANTHROPIC_BASE_URL": server_url,
        "ANTHROPIC_API_KEY": "sk-ant-fake-key-for-tests",
        # Without it the CLI also calls api.anthropic.com (telemetry, feature flags).
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1",
    }


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The content of a message as a list of blocks (a bare string is one text block)."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _typed_text(message: dict[str, Any]) -> str | None:
    """The text the user typed in ``message``, or None if it holds none (tool results only)."""
    if message.get("role") != "user":
        return None
    blocks = _blocks(message)
    if any(b.get("type") == "tool_result" for b in blocks):
        return None
    texts = [
        b.get("text", "")
        for b in blocks
        if b.get("type") == "text" and isinstance(b.get("text"), str) and not b["text"].lstrip().startswith(_INJECTED_PREFIXES)
    ]
    texts = [t for t in texts if t.strip()]
    return "\n".join(texts) if texts else None


def latest_prompt(messages: list[dict[str, Any]]) -> tuple[int, str]:
    """Index and text of the latest user-typed message; ``(-1, "")`` when there is none."""
    for index in range(len(messages) - 1, -1, -1):
        text = _typed_text(messages[index])
        if text is not None:
            return index, text
    return -1, ""


def _tool_calls_since(messages: list[dict[str, Any]], start: int) -> dict[str, str]:
    """``tool_use`` id -> tool name for every call the assistant made after ``start``."""
    calls: dict[str, str] = {}
    for message in messages[start + 1 :]:
        if message.get("role") != "assistant":
            continue
        for block in _blocks(message):
            if block.get("type") == "tool_use":
                calls[str(block.get("id"))] = str(block.get("name"))
    return calls


class FakeAnthropicServer(FakeModelServer):
    """The Anthropic Messages API as Claude Code uses it, following the prompt markers.

    Tool calls are counted from the latest typed prompt on, so every new turn of a
    resumed conversation runs its own ``[[shell:…]]`` once.
    """

    def __init__(self, *, fail_status: int | None = None, fail_message: str = "fake failure") -> None:
        super().__init__()
        self._ids = itertools.count(1)
        #: When set, every model call is answered with this HTTP error (an API error turn).
        self.fail_status = fail_status
        self.fail_message = fail_message
        #: Streamed responses begun, and text pieces sent: lets a test act mid-answer.
        self.streams_started = 0
        self.text_pieces_sent = 0

    # ------------------------------------------------------------ routing

    def handle(self, req: Request, out: Responder) -> None:
        """Route one request of the CLI."""
        path = req.path.split("?", 1)[0].rstrip("/")
        if req.method == "POST" and path.endswith("/messages/count_tokens"):
            out.json(200, {"input_tokens": self._estimate_tokens(req.body)})
        elif req.method == "POST" and path.endswith("/messages"):
            self._messages(req, out)
        elif req.method == "GET" and path.endswith("/models"):
            out.json(200, {"data": [self._model_info("claude-sonnet-4-5")], "has_more": False, "first_id": None, "last_id": None})
        elif req.method == "GET" and "/models/" in path:
            out.json(200, self._model_info(path.rsplit("/", 1)[1]))
        elif req.method in ("HEAD", "GET") and path in ("", "/"):
            out.json(200, {"ok": True})
        else:
            out.json(404, {"type": "error", "error": {"type": "not_found_error", "message": f"no route for {req.method} {req.path}"}})

    @staticmethod
    def _model_info(model: str) -> dict[str, Any]:
        return {"type": "model", "id": model, "display_name": model, "created_at": "2025-01-01T00:00:00Z"}

    @staticmethod
    def _estimate_tokens(body: Any) -> int:
        return max(1, len(json.dumps(body)) // 4) if body is not None else 1

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):06d}"

    # ------------------------------------------------------------ the model

    def decide(self, body: dict[str, Any]) -> tuple[Script, dict[str, Any] | None]:
        """The script of this request, and the tool call to make (``{"name", "input"}``) if any."""
        raw_messages = body.get("messages")
        messages: list[dict[str, Any]] = raw_messages if isinstance(raw_messages, list) else []
        start, prompt = latest_prompt(messages)
        script = read_script(prompt)
        offered = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        calls = _tool_calls_since(messages, start)
        last = messages[-1] if messages else {}
        answered_shell = last.get("role") == "user" and any(
            b.get("type") == "tool_result" and calls.get(str(b.get("tool_use_id"))) == SHELL_TOOL for b in _blocks(last)
        )
        shells = list(calls.values()).count(SHELL_TOOL)
        if answered_shell and not (script.loop is not None and script.shell_again(shells)):
            return script, None
        if script.todos and TODO_TOOL in offered and TODO_TOOL not in calls.values():
            return script, {"name": TODO_TOOL, "input": {"todos": TODO_PLAN}}
        if script.shell and SHELL_TOOL in offered and script.shell_again(shells):
            return script, {"name": SHELL_TOOL, "input": {"command": script.shell, "description": "Run the requested command"}}
        return script, None

    def _messages(self, req: Request, out: Responder) -> None:
        body = req.body if isinstance(req.body, dict) else {}
        model = str(body.get("model") or "claude-sonnet-4-5")
        if self.fail_status is not None:
            kind = _ERROR_TYPES.get(self.fail_status, "api_error")
            out.json(self.fail_status, {"type": "error", "error": {"type": kind, "message": self.fail_message}})
            return
        if not body.get("tools"):
            # A side call (title, classifier, quota probe): a short answer, never a tool.
            self._answer(out, body, model, Script(say=self._side_answer(body)), None)
            return
        script, tool = self.decide(body)
        if script.silent:
            out.start_sse()
            with self._lock:
                self.streams_started += 1
            out.go_silent()
            return
        self._answer(out, body, model, script, tool)

    @staticmethod
    def _side_answer(body: dict[str, Any]) -> str:
        """A plausible reply to a side call: JSON when the system prompt asks for JSON."""
        system = json.dumps(body.get("system") or "")
        if "json" in system.lower():
            return '{"isNewTopic": false, "title": "Fake conversation"}'
        return "Fake conversation"

    def _answer(self, out: Responder, body: dict[str, Any], model: str, script: Script, tool: dict[str, Any] | None) -> None:
        """Send the text answer or the tool call, streamed or whole as the request asks."""
        if tool is not None:
            block = {"type": "tool_use", "id": self._new_id("toolu"), "name": tool["name"], "input": tool["input"]}
            stop_reason = "tool_use"
        else:
            block = {"type": "text", "text": script.say}
            stop_reason = "end_turn"
        usage_in = {"input_tokens": self._estimate_tokens(body.get("messages")), "output_tokens": 1,
                    "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        message: dict[str, Any] = {"id": self._new_id("msg"), "type": "message", "role": "assistant", "model": model,
                   "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_in}
        if not body.get("stream"):
            whole = dict(message, content=[block], stop_reason=stop_reason,
                         usage=dict(usage_in, output_tokens=max(1, len(json.dumps(block)) // 4)))
            out.json(200, whole)
            return
        out.start_sse()
        with self._lock:
            self.streams_started += 1
        out.event({"type": "message_start", "message": message}, "message_start")
        if tool is not None:
            out.event({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}},
                      "content_block_start")
            encoded = json.dumps(block["input"])
            # Split the input JSON like the real API does: fragments that are not valid JSON alone.
            step = max(1, len(encoded) // 3)
            for i in range(0, len(encoded), step):
                out.event({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "input_json_delta", "partial_json": encoded[i : i + step]}},
                          "content_block_delta")
        else:
            out.event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                      "content_block_start")
            pieces = script.chunks()
            gap = script.slow / len(pieces) if script.slow else 0.0
            for piece in pieces:
                if gap:
                    out.pause(gap)
                out.event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
                          "content_block_delta")
                with self._lock:
                    self.text_pieces_sent += 1
        out.event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        out.event({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                   "usage": {"output_tokens": max(1, len(json.dumps(block)) // 4)}}, "message_delta")
        out.event({"type": "message_stop"}, "message_stop")


__all__ = ["SHELL_TOOL", "TODO_PLAN", "TODO_TOOL", "FakeAnthropicServer", "agent_env", "latest_prompt"]
