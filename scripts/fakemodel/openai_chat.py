"""A fake OpenAI Chat Completions API, as spoken by Qwen Code (``qwen``).

``POST /v1/chat/completions`` with ``stream: true`` is answered with SSE chunks carrying
``choices[0].delta`` (text, or ``tool_calls`` fragments), a last chunk with a
``finish_reason`` and ``usage``, then ``data: [DONE]``; a request without ``stream`` gets
one whole completion. Side jobs of the CLI (memory extraction, titles, summaries: anything
whose system prompt is not the main agent's) get a short plausible answer, a JSON object
when they ask for JSON (``response_format``).

What to answer is read from the markers of :mod:`scripts.fakemodel.script` in the latest
user-typed message of the request — never from tool results, so a command's output that
happens to contain a marker changes nothing.

The shell tool is ``run_shell_command`` (argument ``command``); qwen's todo tool is
``todo_write`` (argument ``todos``), called first when the prompt has ``[[todos]]``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from ._http import FakeModelServer, Request, Responder
from .script import Script, read_script

#: The model name the CLI is told to use; any name works, the server ignores it.
MODEL = "fake-qwen"
SHELL_TOOL = "run_shell_command"
#: How the main agent's system prompt starts (side jobs have other prompts).
MAIN_SYSTEM_PROMPT = "You are Qwen Code"
TODO_TOOL = "todo_write"

#: The three-step plan sent with ``[[todos]]``.
TODO_PLAN: list[dict[str, str]] = [
    {"id": "1", "content": "Read the task", "status": "completed"},
    {"id": "2", "content": "Do the work", "status": "in_progress"},
    {"id": "3", "content": "Report back", "status": "pending"},
]

# Qwen adds user messages of its own: the session context first, reminders in tags. Such
# text is not what the user typed.
_CLI_TEXT = re.compile(r"^\s*(<(system-reminder|environment_context|context)\b|This is the Qwen Code\.)", re.I)


def agent_env(server_url: str) -> dict[str, str]:
    """The environment that points ``qwen`` at the fake server and keeps it offline."""
    return {
        "OPENAI_API_KEY": "sk-fake-corral",
        "OPENAI_BASE_URL": server_url.rstrip("/") + "/v1",
        "OPENAI_MODEL": MODEL,
        # Belt and braces: the adapter's settings file already keeps these off.
        "QWEN_TELEMETRY_ENABLED": "false",
        "NO_UPDATE_NOTIFIER": "1",
    }


def _text_of(content: Any) -> str:
    """The text of a message's ``content``: a string or a list of ``{type: text}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def user_prompt_index(messages: list[dict[str, Any]]) -> int | None:
    """Index of the latest user-typed message: a ``user`` message that is not CLI context.

    Tool results have their own role (``tool``), so they are never taken for a prompt.
    """
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.get("role") != "user":
            continue
        text = _text_of(msg.get("content"))
        if text.strip() and not _CLI_TEXT.match(text):
            return i
    return None


def is_main_agent(body: dict[str, Any], main_system_prompt: str = MAIN_SYSTEM_PROMPT) -> bool:
    """Whether ``body`` is the agent's own turn, not a side job (memory extraction, titles).

    Side jobs run with their own system prompt; only the main agent's starts like this.
    """
    messages = body.get("messages") or []
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    return first.get("role") == "system" and _text_of(first.get("content")).startswith(main_system_prompt)


def _tool_calls_since(messages: list[dict[str, Any]], start: int) -> list[str]:
    """Names of the tools the assistant called after message ``start``."""
    names = []
    for msg in messages[start + 1 :]:
        if msg.get("role") != "assistant":
            continue
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.append(fn["name"])
    return names


def _last_tool_result_name(messages: list[dict[str, Any]]) -> str | None:
    """The tool whose result ends the conversation, if the last message is a tool result."""
    if not messages or messages[-1].get("role") != "tool":
        return None
    call_id = messages[-1].get("tool_call_id")
    for msg in reversed(messages):
        for call in msg.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id") == call_id:
                fn = call.get("function") or {}
                return fn.get("name")
    return None


class OpenAIChatServer(FakeModelServer):
    """Answers ``/v1/chat/completions`` (streamed and not) and ``/v1/models``.

    ``fail_status`` makes every chat request fail with that HTTP status (for error
    captures); ``None`` serves normally.
    """

    #: How the main agent's system prompt starts; the tools it calls. A subclass speaks for
    #: another CLI of the same API (see :class:`OpenCodeChatServer`).
    main_system_prompt = MAIN_SYSTEM_PROMPT
    shell_tool = SHELL_TOOL
    todo_tool = TODO_TOOL

    def __init__(self, fail_status: int | None = None) -> None:
        super().__init__()
        self.fail_status = fail_status

    def shell_arguments(self, command: str) -> dict[str, Any]:
        """The arguments of a call of :attr:`shell_tool` running ``command``."""
        return {"command": command, "is_background": False, "description": "run the requested command"}

    # ------------------------------------------------------------- routing

    def handle(self, req: Request, out: Responder) -> None:
        """Route one request."""
        # One request per connection: a CLI retrying on errors otherwise leaves idle
        # keep-alive sockets that it resets, and the base server prints their tracebacks.
        out.handler.close_connection = True
        path = req.path.split("?", 1)[0].rstrip("/")
        if req.method == "GET" and path.endswith("/models"):
            out.json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "corral"}]})
            return
        if req.method == "POST" and path.endswith("/chat/completions") and isinstance(req.body, dict):
            if self.fail_status is not None:
                out.json(
                    self.fail_status,
                    {"error": {"message": f"fake server failure {self.fail_status}", "type": "server_error", "code": None}},
                )
                return
            self.chat(req.body, out)
            return
        if req.method == "POST" and path.endswith("/embeddings"):
            out.json(200, {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.0] * 8}], "model": MODEL})
            return
        super().handle(req, out)

    def plan(self, body: dict[str, Any]) -> tuple[Script, str, str | None]:
        """What to do for ``body``: the script, an action (say/shell/todos), the shell command."""
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        start = user_prompt_index(messages)
        prompt = _text_of(messages[start].get("content")) if start is not None else ""
        script = read_script(prompt)
        called = _tool_calls_since(messages, start if start is not None else -1)
        if _last_tool_result_name(messages) == self.shell_tool:
            return script, "say", None
        tools = {
            (t.get("function") or {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)
        }
        if script.todos and self.todo_tool in tools and self.todo_tool not in called:
            return script, "todos", None
        if script.shell and self.shell_tool not in called:
            return script, "shell", script.shell
        return script, "say", None

    def chat(self, body: dict[str, Any], out: Responder) -> None:
        """Answer one chat completion, streamed when the request asks for it."""
        stream = bool(body.get("stream"))
        if not is_main_agent(body, self.main_system_prompt):
            self._answer(out, stream, text=self._side_text(body))
            return
        script, action, command = self.plan(body)
        if script.silent:
            out.start_sse()
            out.go_silent()
            return
        if action == "shell":
            assert command is not None
            self._answer(out, stream, tool=(self.shell_tool, self.shell_arguments(command)))
        elif action == "todos":
            self._answer(out, stream, tool=(self.todo_tool, {"todos": TODO_PLAN}))
        else:
            self._answer(out, stream, text=script.say, pieces=script.chunks(), slow=script.slow)

    @staticmethod
    def _side_text(body: dict[str, Any]) -> str:
        """A plausible short answer to a side job (a JSON object when JSON is asked for)."""
        if body.get("response_format"):
            # The next-speaker check asks who talks next: "user" ends the turn.
            return json.dumps({"reasoning": "the model answered", "next_speaker": "user"})
        return "Nothing to add."

    def _answer(
        self,
        out: Responder,
        stream: bool,
        *,
        text: str = "",
        pieces: list[str] | None = None,
        slow: float = 0.0,
        tool: tuple[str, dict[str, Any]] | None = None,
    ) -> None:
        """Send a text answer or one tool call, as SSE chunks or as one whole completion."""
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        call_id = "call_" + uuid.uuid4().hex[:20]
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": None if tool else text}
            if tool:
                message["tool_calls"] = [
                    {"id": call_id, "type": "function", "function": {"name": tool[0], "arguments": json.dumps(tool[1])}}
                ]
            out.json(
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop"}],
                    "usage": usage,
                },
            )
            return

        def chunk(delta: dict[str, Any], finish: str | None = None, with_usage: bool = False) -> None:
            obj: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if with_usage:
                obj["usage"] = usage
            out.event(obj)

        out.start_sse()
        chunk({"role": "assistant", "content": ""})
        if tool:
            encoded = json.dumps(tool[1])
            half = len(encoded) // 2
            # Arguments arrive in fragments, as from a real model: the CLI must join them.
            chunk({"tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {"name": tool[0], "arguments": encoded[:half]}}]})
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": encoded[half:]}}]})
            chunk({}, finish="tool_calls", with_usage=True)
        else:
            parts = pieces or [text]
            gap = slow / len(parts) if slow else 0.0
            for part in parts:
                chunk({"content": part})
                if gap:
                    out.pause(gap)
            chunk({}, finish="stop", with_usage=True)
        out.event("[DONE]")


class OpenCodeChatServer(OpenAIChatServer):
    """The same API as spoken by OpenCode (``opencode acp``): its own system prompt, and its
    shell tool ``bash`` (arguments ``command``, ``description``)."""

    main_system_prompt = "You are opencode"
    shell_tool = "bash"
    todo_tool = "todowrite"

    def shell_arguments(self, command: str) -> dict[str, Any]:
        """opencode's ``bash`` tool takes the command and a short description."""
        return {"command": command, "description": "Run the requested command"}


class CopilotChatServer(OpenAIChatServer):
    """The same API as spoken by GitHub Copilot CLI (``copilot --acp``, a model of your own):
    its shell tool is ``bash`` (``command``, ``description``; ``mode`` sync waits for it)."""

    main_system_prompt = "You are GitHub Copilot"
    shell_tool = "bash"
    todo_tool = "update_todo"

    def shell_arguments(self, command: str) -> dict[str, Any]:
        """copilot's ``bash`` runs ``command`` synchronously in a fresh process."""
        return {"command": command, "description": "Run the requested command", "mode": "sync"}


def copilot_env(server_url: str) -> dict[str, str]:
    """The environment that points ``copilot`` at the fake server with no GitHub login."""
    return {
        "COPILOT_OFFLINE": "true",
        "COPILOT_PROVIDER_BASE_URL": server_url.rstrip("/") + "/v1",
        "COPILOT_PROVIDER_TYPE": "openai",
        "COPILOT_PROVIDER_API_KEY": "sk-fake-corral",
        "COPILOT_MODEL": MODEL,
    }


class VibeChatServer(OpenAIChatServer):
    """The same API as spoken by Mistral Vibe (``vibe-acp``): shell tool ``bash`` (``command``)."""

    main_system_prompt = "You help users get complex tasks done"
    shell_tool = "bash"
    todo_tool = "todo"

    def shell_arguments(self, command: str) -> dict[str, Any]:
        """vibe's ``bash`` takes the command (and an optional timeout)."""
        return {"command": command}


def vibe_config(server_url: str) -> str:
    """A ``config.toml`` for Mistral Vibe whose only model is the fake server's (key in
    ``FAKE_API_KEY``), with telemetry and update checks off."""
    return (
        'active_model = "fake"\n'
        "enable_telemetry = false\n"
        "enable_update_checks = false\n"
        "enable_auto_update = false\n"
        "enable_notifications = false\n"
        "[[providers]]\n"
        'name = "fake"\n'
        f'api_base = "{server_url.rstrip("/")}/v1"\n'
        'api_key_env_var = "FAKE_API_KEY"\n'
        'api_style = "openai"\n'
        'backend = "generic"\n'
        "[[models]]\n"
        f'name = "{MODEL}"\n'
        'provider = "fake"\n'
        'alias = "fake"\n'
    )


class KiloChatServer(OpenCodeChatServer):
    """The same API as spoken by Kilo Code CLI (``kilo acp``, an opencode fork)."""

    main_system_prompt = ""


class KimiChatServer(OpenAIChatServer):
    """The same API as spoken by Kimi CLI (``kimi acp``, provider ``openai_legacy``): shell
    tool ``Shell`` (``command``, ``timeout``), todos ``SetTodoList``."""

    main_system_prompt = "You are Kimi Code CLI"
    shell_tool = "Shell"
    todo_tool = "SetTodoList"

    def shell_arguments(self, command: str) -> dict[str, Any]:
        """kimi's ``Shell`` runs ``command`` in the foreground, with a timeout it kills at
        (at most 300 s in the foreground)."""
        return {"command": command, "timeout": 300}

    def chat(self, body: dict[str, Any], out: Responder) -> None:
        """After a cancelled prompt kimi sends the next one as a second text part of the same
        user message (the cancelled turn got no answer): the newest part is what was typed."""
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        start = user_prompt_index(messages)
        if start is None:
            super().chat(body, out)
            return
        content = messages[start].get("content")
        if isinstance(content, list) and len(content) > 1:
            messages[start] = {**messages[start], "content": content[-1:]}
            body = {**body, "messages": messages}
        super().chat(body, out)


def kimi_config(server_url: str) -> str:
    """A Kimi CLI ``config.toml`` whose only model is the fake server's."""
    return (
        'default_model = "fake"\n'
        "[providers.fake]\n"
        'type = "openai_legacy"\n'
        f'base_url = "{server_url.rstrip("/")}/v1"\n'
        'api_key = "sk-fake-corral"\n'
        "[models.fake]\n"
        'provider = "fake"\n'
        f'model = "{MODEL}"\n'
        "max_context_size = 128000\n"
    )


class PiChatServer(OpenAIChatServer):
    """The same API as spoken by the pi coding agent (``pi --mode json``, a provider of its
    ``models.json``): shell tool ``bash`` (``command``, an optional ``timeout``)."""

    main_system_prompt = "You are an expert coding assistant operating inside pi"
    shell_tool = "bash"

    def shell_arguments(self, command: str) -> dict[str, Any]:
        """pi's ``bash`` takes the command alone."""
        return {"command": command}


def pi_options(server_url: str) -> dict[str, str]:
    """The ``[agents.NAME]`` keys that point the ``pi`` adapter at the fake server."""
    return {"base_url": server_url.rstrip("/") + "/v1", "env_key": "FAKE_API_KEY"}


#: The key ``pi_options`` names, in the agent's environment.
PI_ENV = {"FAKE_API_KEY": "sk-fake-corral"}


class FastAgentChatServer(OpenAIChatServer):
    """The same API as spoken by fast-agent (``fast-agent acp --shell``, its ``generic``
    provider): shell tool ``bash`` (``command``, ``run_in_background``)."""

    main_system_prompt = ""
    shell_tool = "bash"

    def shell_arguments(self, command: str) -> dict[str, Any]:
        """fast-agent's ``bash`` runs ``command`` in the foreground."""
        return {"command": command}


def fast_agent_env(server_url: str) -> dict[str, str]:
    """The environment that points fast-agent's ``generic`` provider at the fake server."""
    return {"GENERIC_BASE_URL": server_url.rstrip("/") + "/v1", "GENERIC_API_KEY": "sk-fake-corral"}


class AiderChatServer(OpenAIChatServer):
    """The same API as spoken by Aider (through LiteLLM): no tools, the answer is the text."""

    main_system_prompt = "Act as an expert software developer"


def aider_env(server_url: str) -> dict[str, str]:
    """The environment that points ``aider --model openai/M`` at the fake server; LiteLLM's
    cost map is read from its package, not fetched."""
    return {
        "OPENAI_API_BASE": server_url.rstrip("/") + "/v1",
        "OPENAI_API_KEY": "sk-fake-corral",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
