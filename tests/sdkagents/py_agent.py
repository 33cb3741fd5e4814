"""A small ACP agent on the official Python SDK (``agent-client-protocol``), run by the SDK's
own ``run_agent`` on stdio. No model, no network. Prompt markers:

``[[say:TEXT]]``   answer TEXT in two ``agent_message_chunk`` updates (default ``ok: PROMPT``)
``[[fail:TEXT]]``  raise ``Exception(TEXT)``: the SDK answers -32603 "Internal error", the
                   reason in ``data`` ({"details": TEXT})
``[[silent]]``     say nothing until cancelled (``session/cancel``: answer ``cancelled``)
``[[exit]]``       exit with status 3 in the middle of the prompt

Start-up, from the environment:

``SDK_AGENT_VERSION``    the protocolVersion ``initialize`` answers (default: the SDK's)
``SDK_AGENT_REFUSE``     ``initialize`` fails with -32022 and ``data`` {requested, supported: [2]}
``SDK_AGENT_AUTH``       the API key an ``env_var`` method wants in ``SDK_AGENT_KEY``: every
                         ``session/new`` fails "Authentication required" until ``authenticate``
                         with ``api-key`` found it there (a wrong one fails, the reason in data)
``SDK_AGENT_NOISE``      print this many non-JSON lines on stdout before serving (a banner)
``SDK_AGENT_HOLD``       a path: ``initialize`` is not answered while it exists (a slow start)
``SDK_AGENT_DIE``        exit with status 4 instead of answering ``initialize``
``SDK_AGENT_LOG``        append each method received, one per line
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Any

import acp
from acp import PROTOCOL_VERSION, RequestError, run_agent
from acp.helpers import text_block, update_agent_message
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AuthenticateResponse,
    AuthEnvVar,
    AuthMethodAgent,
    EnvVarAuthMethod,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    TerminalAuthMethod,
)


def record(method: str) -> None:
    log = os.environ.get("SDK_AGENT_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(method + "\n")


def marker(text: str, name: str) -> str | None:
    start = text.find(f"[[{name}")
    if start < 0:
        return None
    end = text.find("]]", start)
    body = text[start + len(name) + 2 : end]
    return body[1:] if body.startswith(":") else ""


class SdkAgent:
    """The agent: the SDK calls these methods with the request's params."""

    def __init__(self) -> None:
        self.client: Client | None = None
        self.authenticated = not os.environ.get("SDK_AGENT_AUTH")
        self.cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Client) -> None:
        self.client = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        record(f"initialize {os.getpid()}")
        hold = os.environ.get("SDK_AGENT_HOLD")
        while hold and os.path.exists(hold):
            await asyncio.sleep(0.05)
        if os.environ.get("SDK_AGENT_DIE"):
            os._exit(4)
        if os.environ.get("SDK_AGENT_REFUSE"):
            raise RequestError(-32022, "Unsupported protocol version",
                               {"requested": protocol_version, "supported": [2]})
        methods: list[Any] = []
        if os.environ.get("SDK_AGENT_AUTH"):
            methods = [
                EnvVarAuthMethod(type="env_var", id="api-key", name="API key",
                                 vars=[AuthEnvVar(name="SDK_AGENT_KEY", label="Your key")]),
                TerminalAuthMethod(type="terminal", id="login", name="Log in", args=["--login"]),
                AuthMethodAgent(id="oauth", name="Sign in with a browser"),
            ]
        return InitializeResponse(
            protocol_version=int(os.environ.get("SDK_AGENT_VERSION", PROTOCOL_VERSION)),
            agent_capabilities=AgentCapabilities(load_session=False),
            agent_info=Implementation(name="corral-py-sdk-agent", version=acp.__name__),
            auth_methods=methods,
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> AuthenticateResponse:
        record(f"authenticate {method_id}")
        if method_id != "api-key":
            raise RequestError.auth_required({"reason": f"method {method_id} cannot be used here"})
        if os.environ.get("SDK_AGENT_KEY") != os.environ["SDK_AGENT_AUTH"]:
            raise RequestError.auth_required({"reason": "invalid API key (401)"})
        self.authenticated = True
        return AuthenticateResponse()

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        record("session/new")
        if not self.authenticated:
            raise RequestError.auth_required()
        return NewSessionResponse(session_id=f"py-{uuid.uuid4()}")

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        record("session/prompt")
        text = "".join(getattr(block, "text", "") for block in prompt)
        if marker(text, "exit") is not None:
            os._exit(3)
        failure = marker(text, "fail")
        if failure is not None:
            raise Exception(failure)
        if marker(text, "silent") is not None:
            event = self.cancelled.setdefault(session_id, asyncio.Event())
            await event.wait()
            return PromptResponse(stop_reason="cancelled")
        say = marker(text, "say")
        say = f"ok: {text}" if say is None else say
        assert self.client is not None
        half = (len(say) + 1) // 2
        for part in (say[:half], say[half:]):
            await self.client.session_update(session_id=session_id, update=update_agent_message(text_block(part)))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        record("session/cancel")
        self.cancelled.setdefault(session_id, asyncio.Event()).set()


def main() -> None:
    for n in range(int(os.environ.get("SDK_AGENT_NOISE", "0"))):
        sys.stdout.write(f"banner line {n}: corral-py-sdk-agent starting\n")
    sys.stdout.flush()
    asyncio.run(run_agent(SdkAgent()))


if __name__ == "__main__":
    main()
