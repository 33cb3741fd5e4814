"""A fake Gemini API (``generativelanguage.googleapis.com`` shape) for the real ``gemini`` CLI.

The CLI, pointed here by ``GOOGLE_GEMINI_BASE_URL``, makes two kinds of model calls:

* ``POST /v1beta/models/MODEL:generateContent`` with a ``responseJsonSchema`` (or
  ``responseSchema``): side calls — the model router ("flash" or "pro"), the next-speaker
  check, loop detection. They get a quick JSON object shaped by the schema.
* ``POST /v1beta/models/MODEL:streamGenerateContent?alt=sse``: the turn itself, answered
  from the markers of :mod:`scripts.fakemodel.script`. The shell tool is
  ``run_shell_command``; ``[[todos]]`` calls ``write_todos`` when the request offers it
  (the CLI does so only for a Gemini 2 model).

``countTokens`` and model listing get plausible answers too, so the CLI never stalls on
a request this server does not know.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ._http import FakeModelServer, Request, Responder
from .script import Script, read_script

SHELL_TOOL = "run_shell_command"

#: gemini's plan tool; the CLI offers it only with a Gemini 2 model (``--model gemini-2.5-pro``).
TODO_TOOL = "write_todos"

#: The three-step plan ``[[todos]]`` asks for.
TODO_PLAN: list[dict[str, str]] = [
    {"description": "Read the request", "status": "completed"},
    {"description": "Run the command", "status": "in_progress"},
    {"description": "Report back", "status": "pending"},
]

#: ``/v1beta/models/gemini-2.5-pro:streamGenerateContent`` -> model, method.
_MODEL_CALL = re.compile(r"^/v1(?:beta|alpha)?/models/([^:/?]+):([A-Za-z]+)")


def agent_env(server_url: str) -> dict[str, str]:
    """Environment variables that point the real ``gemini`` CLI at a fake server.

    Without ``GEMINI_CLI_NO_RELAUNCH`` the CLI re-spawns itself as a child node process
    (whose parent ignores SIGINT/SIGTERM); without ``GEMINI_CLI_TRUST_WORKSPACE`` it
    refuses to run yolo in an untrusted folder.
    """
    return {
        "GEMINI_API_KEY": "fake-gemini-key",
        "GOOGLE_GEMINI_BASE_URL": server_url,
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        "GEMINI_TELEMETRY_ENABLED": "false",
        "NO_COLOR": "1",
    }


#: ``~/.gemini/settings.json`` for an offline run: API-key auth, no usage statistics.
SETTINGS: dict[str, Any] = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
}


def _usage() -> dict[str, int]:
    return {"promptTokenCount": 12, "candidatesTokenCount": 5, "totalTokenCount": 17}


def _fill_schema(schema: Any, key: str = "") -> Any:
    """A plausible value for a JSON schema (upper- or lower-case Gemini ``Type`` names)."""
    if not isinstance(schema, dict):
        return "ok"
    kind = str(schema.get("type", "object")).lower()
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        # The next-speaker check must say "user", or the CLI would keep the turn going.
        if "user" in enum:
            return "user"
        return "flash" if "flash" in enum else enum[0]
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: _fill_schema(sub, name) for name, sub in props.items()}
    if kind == "array":
        return []
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return 10
    return f"fake {key}".strip()


class FakeGeminiServer(FakeModelServer):
    """The Gemini API, scripted by prompt markers.

    Set :attr:`fail_status` to make every turn call (``streamGenerateContent``; the side
    calls still succeed) fail with that HTTP status and a Gemini-shaped error body, to
    capture how the CLI reports it.
    """

    #: When set, every turn call is answered with this HTTP error status.
    fail_status: int | None = None

    def handle(self, req: Request, out: Responder) -> None:
        """Route one request of the CLI."""
        path = req.path.split("?", 1)[0]
        match = _MODEL_CALL.match(path)
        if req.method == "GET" and re.match(r"^/v1(beta|alpha)?/models/?$", path):
            out.json(200, {"models": [{"name": "models/gemini-2.5-pro"}, {"name": "models/gemini-2.5-flash"}]})
            return
        if not match or req.method != "POST":
            out.json(404, {"error": {"code": 404, "message": f"no route for {req.method} {req.path}", "status": "NOT_FOUND"}})
            return
        model, method = match.groups()
        body = req.body if isinstance(req.body, dict) else {}
        if self.fail_status is not None and method == "streamGenerateContent":
            out.json(self.fail_status, _error_body(self.fail_status))
            return
        if method == "countTokens":
            out.json(200, {"totalTokens": 42})
        elif method == "generateContent":
            self._side_call(body, model, out)
        elif method == "streamGenerateContent":
            self._turn(body, model, out)
        else:
            out.json(404, {"error": {"code": 404, "message": f"unknown method {method}", "status": "NOT_FOUND"}})

    # ------------------------------------------------------------ side calls

    def _side_call(self, body: dict[str, Any], model: str, out: Responder) -> None:
        config = body.get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        # A plain side call (a summary, a title, no schema): any short text will do.
        text = json.dumps(_fill_schema(schema)) if schema is not None else "fake summary"
        out.json(200, self._candidate([{"text": text}], model, finish="STOP"))

    # ------------------------------------------------------------ the turn

    def _turn(self, body: dict[str, Any], model: str, out: Responder) -> None:
        contents = body.get("contents") or []
        prompt, after = _latest_prompt(contents)
        script = read_script(prompt)
        # Calls made since the prompt: each scripted call happens once per prompt, so the
        # function response that comes back moves the script on to its next step.
        called = {name for content in after for name in _calls(content)}
        if script.silent:
            out.start_sse()
            out.go_silent()
            return
        if script.todos and TODO_TOOL in _offered(body) and TODO_TOOL not in called:
            self._call(TODO_TOOL, {"todos": TODO_PLAN}, model, out)
        elif script.shell and SHELL_TOOL not in called:
            self._call(SHELL_TOOL, {"command": script.shell, "description": "run a command"}, model, out)
        else:
            self._stream_text(script, model, out)

    def _call(self, name: str, args: dict[str, Any], model: str, out: Responder) -> None:
        out.start_sse()
        out.event(self._candidate([{"functionCall": {"name": name, "args": args}}], model, finish="STOP"))

    def _stream_text(self, script: Script, model: str, out: Responder) -> None:
        out.start_sse()
        chunks = script.chunks() if script.slow else [script.say]
        pause = script.slow / max(1, len(chunks))
        for i, chunk in enumerate(chunks):
            if i and pause:
                out.pause(pause)
            last = i == len(chunks) - 1
            out.event(self._candidate([{"text": chunk}], model, finish="STOP" if last else None))

    @staticmethod
    def _candidate(parts: list[dict[str, Any]], model: str, finish: str | None) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        return {"candidates": [candidate], "usageMetadata": _usage(), "modelVersion": model}


_STATUS_NAMES = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def _error_body(status: int) -> dict[str, Any]:
    """The error object Google APIs send."""
    name = _STATUS_NAMES.get(status, "UNKNOWN")
    return {"error": {"code": status, "message": f"fake server error {status} ({name})", "status": name}}


def _has_part(content: Any, kind: str) -> bool:
    parts = content.get("parts") if isinstance(content, dict) else None
    return isinstance(parts, list) and any(isinstance(p, dict) and kind in p for p in parts)


def _calls(content: Any) -> list[str]:
    """The names of the functions a model message calls."""
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return []
    return [
        p["functionCall"]["name"]
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("functionCall"), dict) and isinstance(p["functionCall"].get("name"), str)
    ]


def _offered(body: dict[str, Any]) -> set[str]:
    """The tool names a request offers the model."""
    names = set()
    for tool in body.get("tools") or []:
        for decl in (tool.get("functionDeclarations") or []) if isinstance(tool, dict) else []:
            if isinstance(decl, dict) and isinstance(decl.get("name"), str):
                names.add(decl["name"])
    return names


#: How the user-role texts the CLI writes itself begin.
_CLI_WRITTEN = ("<session_context>", "[System:")


def _latest_prompt(contents: list[Any]) -> tuple[str, list[Any]]:
    """The latest user-typed prompt, and the contents that follow its message.

    The CLI merges consecutive user messages into one (its own ``<session_context>``
    block and the first prompt; or, after a killed turn whose model reply was empty, the
    old prompt and the new one), so the prompt is the message's LAST text part — leaving
    out what the CLI itself writes: the context block and its ``[System: …]`` nudges (sent
    after an empty model reply).
    """
    for index in range(len(contents) - 1, -1, -1):
        content = contents[index]
        if not isinstance(content, dict) or content.get("role") != "user" or _has_part(content, "functionResponse"):
            continue
        texts = [
            p["text"]
            for p in content.get("parts") or []
            if isinstance(p, dict)
            and isinstance(p.get("text"), str)
            and not p["text"].lstrip().startswith(_CLI_WRITTEN)
        ]
        if texts:
            return texts[-1], contents[index + 1 :]
    return "", []
