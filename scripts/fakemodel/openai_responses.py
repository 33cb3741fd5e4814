"""A fake OpenAI Responses API (``POST /v1/responses``, streamed as SSE) for the ``codex`` CLI.

Codex sends the whole conversation on every request as a list of ``input`` items: developer
and user ``message`` items (its own context blocks such as ``<environment_context>`` are user
messages too), earlier assistant ``message`` items, ``function_call`` items and their
``function_call_output`` items. The behaviour is read from the markers of the latest prompt the
user typed (see :mod:`scripts.fakemodel.script`):

* the last input item is the output of our shell call -> answer with the ``say`` text;
* ``[[shell:CMD]]`` and no ``exec_command`` call yet for the latest prompt -> call
  ``exec_command`` with ``{"cmd": CMD}`` (codex's shell tool);
* otherwise -> answer with ``say`` (slowly with ``[[slow:S]]``; ``[[silent]]`` goes silent).

``[[todos]]`` is ignored: codex exec advertises no plan tool.

For error captures a test sets :attr:`OpenAIResponsesServer.fail` to ``(status, body)``;
every model request is then answered with that status.

Codex takes its endpoint from ``$CODEX_HOME/config.toml`` only (it ignores ``OPENAI_BASE_URL``),
so pointing it here takes the codex adapter's options (:func:`agent_options`) plus the key in
:func:`agent_env`::

    with OpenAIResponsesServer() as server:
        request = TurnRequest(..., options=agent_options(server.url))
        env = {**scrubbed, **launch.env, **agent_env(server.url)}
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from ._http import FakeModelServer, Request, Responder
from .script import Script, read_script

#: The model name the fake reports back (codex does not check it).
MODEL = "gpt-5.5"

#: The env var holding the fake API key (the provider's ``env_key``).
API_KEY_ENV = "OPENAI_API_KEY"

#: Codex's own context blocks arrive as user messages; they are not what the user typed.
_CONTEXT_BLOCK = re.compile(r"^\s*<([A-Za-z_][\w-]*)>.*</\1>\s*$", re.S)
_CONTEXT_PREFIXES = ("# AGENTS.md instructions",)

SHELL_TOOL = "exec_command"


def _is_context(text: str) -> bool:
    return bool(_CONTEXT_BLOCK.match(text)) or text.lstrip().startswith(_CONTEXT_PREFIXES)


def _latest_prompt_at(items: list[Any]) -> tuple[int, str]:
    """The index and text of the latest user message that codex did not generate itself."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if not isinstance(item, dict) or item.get("type", "message") != "message" or item.get("role") != "user":
            continue
        content = item.get("content")
        texts = [content] if isinstance(content, str) else [
            p.get("text", "") for p in content or () if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
        typed = [t for t in texts if not _is_context(t)]
        if typed:
            return index, "\n".join(typed)
    return -1, ""


def latest_prompt(items: list[Any]) -> str:
    """The text of the latest user message that codex did not generate itself."""
    return _latest_prompt_at(items)[1]


def shell_called(items: list[Any]) -> bool:
    """Whether the shell tool was already called for the latest prompt.

    Calls made for earlier prompts of the same conversation (a persistent ACP session asks
    for a tool in several turns) do not count.
    """
    start = max(_latest_prompt_at(items)[0], 0)
    return any(
        isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == SHELL_TOOL
        for item in items[start:]
    )


def shell_calls(items: list[Any]) -> int:
    """How many times the shell tool was called for the latest prompt."""
    start = max(_latest_prompt_at(items)[0], 0)
    return sum(
        1 for item in items[start:]
        if isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == SHELL_TOOL
    )


def last_is_shell_output(items: list[Any]) -> bool:
    """Whether the last input item is the output of a shell call made earlier."""
    if not items or not isinstance(items[-1], dict) or items[-1].get("type") != "function_call_output":
        return False
    call_id = items[-1].get("call_id")
    return any(
        isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("name") == SHELL_TOOL
        and item.get("call_id") == call_id
        for item in items
    )


class OpenAIResponsesServer(FakeModelServer):
    """The fake Responses API, scripted by the markers in the user's latest prompt."""

    def __init__(self) -> None:
        super().__init__()
        self._ids = itertools.count(1)
        #: ``(status, json body)``: answer every model request with this error instead.
        self.fail: tuple[int, Any] | None = None

    def _id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):04d}"

    def model_requests(self) -> list[Request]:
        """The recorded ``/responses`` requests, oldest first."""
        return [r for r in self.requests if r.method == "POST" and r.path.split("?")[0].endswith("/responses")]

    def handle(self, req: Request, out: Responder) -> None:
        """Route one request: model turns, a model list, anything else a quick empty answer."""
        path = req.path.split("?")[0]
        if req.method == "GET" and path.endswith("/models"):
            out.json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}], "models": []})
            return
        if req.method != "POST" or not path.endswith("/responses"):
            # Side calls (compaction, telemetry if it slips through): a plausible empty answer.
            out.json(200, {})
            return
        if self.fail is not None:
            status, body = self.fail
            out.json(status, body)
            return
        body = req.body if isinstance(req.body, dict) else {}
        raw_items = body.get("input")
        items: list[Any] = raw_items if isinstance(raw_items, list) else []
        script = read_script(latest_prompt(items))
        if script.silent:
            out.start_sse()
            out.go_silent()
            return
        if script.loop is not None and script.shell is not None and script.shell_again(shell_calls(items)):
            self._call_shell(out, script.shell)
        elif last_is_shell_output(items):
            self._answer(out, script)
        elif script.shell is not None and not shell_called(items):
            self._call_shell(out, script.shell)
        else:
            self._answer(out, script)

    # ------------------------------------------------------------ SSE

    def _send(self, out: Responder, obj: dict[str, Any]) -> None:
        out.event(obj, event=obj["type"])

    def _created(self, out: Responder) -> str:
        rid = self._id("resp")
        out.start_sse()
        self._send(out, {"type": "response.created", "response": {"id": rid, "object": "response", "status": "in_progress", "model": MODEL}})
        return rid

    def _completed(self, out: Responder, rid: str, output: list[dict[str, Any]]) -> None:
        usage = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 110,
        }
        self._send(out, {
            "type": "response.completed",
            "response": {"id": rid, "object": "response", "status": "completed", "model": MODEL, "output": output, "usage": usage},
        })

    def _answer(self, out: Responder, script: Script) -> None:
        rid = self._created(out)
        mid = self._id("msg")
        self._send(out, {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "message", "id": mid, "role": "assistant", "status": "in_progress", "content": []},
        })
        self._send(out, {
            "type": "response.content_part.added", "item_id": mid, "output_index": 0, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        })
        chunks = script.chunks()
        for chunk in chunks:
            if script.slow:
                out.pause(script.slow / len(chunks))
            self._send(out, {"type": "response.output_text.delta", "item_id": mid, "output_index": 0, "content_index": 0, "delta": chunk})
        self._send(out, {"type": "response.output_text.done", "item_id": mid, "output_index": 0, "content_index": 0, "text": script.say})
        item = {
            "type": "message", "id": mid, "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": script.say, "annotations": []}],
        }
        self._send(out, {"type": "response.output_item.done", "output_index": 0, "item": item})
        self._completed(out, rid, [item])

    def _call_shell(self, out: Responder, command: str) -> None:
        rid = self._created(out)
        # A long yield keeps a slow command inside one call instead of a write_stdin poll loop.
        arguments = json.dumps({"cmd": command, "yield_time_ms": 30000})
        item = {
            "type": "function_call", "id": self._id("fc"), "call_id": self._id("call"),
            "name": SHELL_TOOL, "arguments": arguments, "status": "completed",
        }
        self._send(out, {"type": "response.output_item.added", "output_index": 0, "item": {**item, "arguments": "", "status": "in_progress"}})
        self._send(out, {"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": 0, "delta": arguments})
        self._send(out, {"type": "response.function_call_arguments.done", "item_id": item["id"], "output_index": 0, "arguments": arguments})
        self._send(out, {"type": "response.output_item.done", "output_index": 0, "item": item})
        self._completed(out, rid, [item])


def agent_env(server_url: str) -> dict[str, str]:
    """Env vars for a codex agent talking to the fake server at ``server_url``.

    Codex ignores ``OPENAI_BASE_URL``: the endpoint itself is the adapter's ``base_url``
    option (see :func:`agent_options`), which defines a provider whose ``env_key`` is
    ``OPENAI_API_KEY``; this supplies that key. Analytics are switched off by the adapter's
    config.toml, and codex has no other telemetry switch in the environment.
    """
    return {API_KEY_ENV: "sk-fake-corral"}


def agent_options(server_url: str) -> dict[str, str]:
    """The ``[agents.NAME]`` options (``TurnRequest.options``) that point codex at the server."""
    return {"base_url": f"{server_url}/v1", "env_key": API_KEY_ENV}
