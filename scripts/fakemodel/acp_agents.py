"""The real ACP agents, each pointed at its fake model server: shared by the ACP tests,
``scripts/capture_acp.py`` and ``scripts/bench_acp.py``.

For each agent: the fake server it talks to, and the launch (preset command, environment,
private files) that keeps it offline. The binaries are installed by scripts/install-clis.sh.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adapters._base import Launch
from adapters.acp import PRESETS, preset_launch

from . import anthropic, gemini_api, openai_chat, openai_responses
from ._http import FakeModelServer
from .clis import installed_binary

#: The pinned npm package of each ACP agent binary; keep in step with scripts/install-clis.sh.
ACP_PACKAGES: dict[str, tuple[str, str]] = {
    "gemini": ("@google/gemini-cli@0.61.0", "gemini"),
    "qwen": ("@qwen-code/qwen-code@0.15.10", "qwen"),
    "claude": ("@zed-industries/claude-agent-acp@0.23.1", "claude-agent-acp"),
    "codex": ("@zed-industries/codex-acp@0.16.0", "codex-acp"),
    "opencode": ("opencode-ai@1.18.33", "opencode"),
    "copilot": ("@github/copilot@1.0.102", "copilot"),
    "vibe": ("pypi:mistral-vibe==2.26.1", "vibe-acp"),
    "kilo": ("@kilocode/cli@7.7.7", "kilo"),
    "kimi": ("pypi:kimi-cli==1.51.0", "kimi"),
    "fast-agent": ("pypi:fast-agent-mcp==0.10.48", "fast-agent"),
}


def acp_binary(name: str) -> Path:
    """The installed binary of ACP agent ``name``; raises with the fix when it is missing.

    Kilo's is the native binary of ``@kilocode/cli-linux-x64``, not the npm package's node
    wrapper (which only starts it): measured 9.8 s against 12.5 s to an open session (mean of
    four starts each, two cores under load), one node process fewer in the tree.
    """
    spec, binary = ACP_PACKAGES[name]
    path = installed_binary(spec, binary)
    if name == "kilo":
        native = path.parent.parent / "@kilocode" / "cli-linux-x64" / "bin" / "kilo"
        if not native.exists():
            raise FileNotFoundError(f"kilo's native binary is not installed at {native}; run scripts/install-clis.sh")
        return native
    return path


def _json(value: object) -> str:
    return json.dumps(value, indent=2) + "\n"


def _gemini(url: str, cwd: str, home: str) -> Launch:
    return preset_launch(
        "gemini",
        cwd=cwd,
        command=[str(acp_binary("gemini"))],
        env=gemini_api.agent_env(url),
        files={".gemini/settings.json": _json({**gemini_api.SETTINGS, "telemetry": {"enabled": False}})},
    )


def _qwen(url: str, cwd: str, home: str) -> Launch:
    from adapters.qwen import DEFAULT_SETTINGS

    return preset_launch(
        "qwen",
        cwd=cwd,
        command=[str(acp_binary("qwen"))],
        args=["--auth-type", "openai"],
        env=openai_chat.agent_env(url),
        files={".qwen/settings.json": _json(DEFAULT_SETTINGS)},
    )


def _claude(url: str, cwd: str, home: str) -> Launch:
    return preset_launch("claude", cwd=cwd, command=[str(acp_binary("claude"))], env=anthropic.agent_env(url))


def _codex(url: str, cwd: str, home: str) -> Launch:
    from adapters._base import TurnRequest
    from adapters.codex import config_toml

    request = TurnRequest(
        prompt="",
        channel="",
        turn_id="",
        agent="codex",
        command=(),
        home=home,
        options=openai_responses.agent_options(url),
    )
    # Over ACP, codex asks before running a command (``untrusted``) and corral's policy
    # answers; its bubblewrap sandbox cannot run in this container (the tool panics), so
    # it is off, as for the native adapter.
    config = config_toml(request).replace('approval_policy = "never"', 'approval_policy = "untrusted"')
    return preset_launch(
        "codex",
        cwd=cwd,
        command=[str(acp_binary("codex"))],
        env={**openai_responses.agent_env(url), "CODEX_HOME": f"{home}/.codex"},
        files={".codex/config.toml": config},
    )


def opencode_config(url: str) -> dict[str, object]:
    """An opencode.json whose only model is the fake OpenAI-compatible chat server."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": url.rstrip("/") + "/v1", "apiKey": "sk-fake-corral"},
                "models": {openai_chat.MODEL: {"name": "Fake"}},
            }
        },
        "model": f"fake/{openai_chat.MODEL}",
        "small_model": f"fake/{openai_chat.MODEL}",
        "autoupdate": False,
        "share": "disabled",
        # opencode runs bash without asking by default; asking goes over ACP to corral's policy.
        "permission": {"bash": "ask", "edit": "ask"},
    }


def _opencode(url: str, cwd: str, home: str) -> Launch:
    return preset_launch(
        "opencode",
        cwd=cwd,
        command=[str(acp_binary("opencode"))],
        env={
            "OPENCODE_CONFIG": f"{home}/opencode.json",
            "OPENCODE_DISABLE_MODELS_FETCH": "true",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "true",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "true",
            "OPENCODE_DISABLE_SHARE": "true",
        },
        files={"opencode.json": _json(opencode_config(url))},
    )


def _copilot(url: str, cwd: str, home: str) -> Launch:
    return preset_launch("copilot", cwd=cwd, command=[str(acp_binary("copilot"))], env=openai_chat.copilot_env(url))


def _vibe(url: str, cwd: str, home: str) -> Launch:
    return preset_launch(
        "vibe",
        cwd=cwd,
        command=[str(acp_binary("vibe"))],
        env={"FAKE_API_KEY": "sk-fake-corral"},
        files={".vibe/config.toml": openai_chat.vibe_config(url)},
    )


def kilo_env(url: str) -> dict[str, str]:
    """Kilo Code reads opencode's config from ``KILO_CONFIG_CONTENT``: the fake provider."""
    config = {**opencode_config(url), "$schema": "https://kilo.ai/config.json"}
    # What the node wrapper would set for the native binary: its tree-sitter grammars (kilo
    # parses a bash command with them before asking permission for it).
    grammars = acp_binary("kilo").parent / "tree-sitter"
    return {"KILO_CONFIG_CONTENT": json.dumps(config), "KILO_TREE_SITTER_WASM_DIR": str(grammars)}


def _kilo(url: str, cwd: str, home: str) -> Launch:
    return preset_launch("kilo", cwd=cwd, command=[str(acp_binary("kilo"))], env=kilo_env(url))


def _kimi(url: str, cwd: str, home: str) -> Launch:
    from adapters._base import TurnRequest

    request = TurnRequest(prompt="", channel="", turn_id="", agent="kimi", command=(), home=home)
    files = {**(PRESETS["kimi"].files or (lambda r: {}))(request), ".kimi/config.toml": openai_chat.kimi_config(url)}
    return preset_launch("kimi", cwd=cwd, command=[str(acp_binary("kimi"))], files=files)


def fast_agent_env(url: str, home: str) -> dict[str, str]:
    """fast-agent's ``generic`` provider at the fake server, its model, its state under ``home``."""
    return {**openai_chat.fast_agent_env(url), "FAST_AGENT_MODEL": f"generic.{openai_chat.MODEL}",
            "FAST_AGENT_HOME": f"{home}/.fast-agent"}


def _fast_agent(url: str, cwd: str, home: str, *, unattended: bool = True) -> Launch:
    return preset_launch("fast-agent", cwd=cwd, command=[str(acp_binary("fast-agent"))], env=fast_agent_env(url, home),
                         unattended=unattended)


def _fast_agent_attended(url: str, cwd: str, home: str) -> Launch:
    return _fast_agent(url, cwd, home, unattended=False)


def daemon_table(name: str, url: str, folder: Path) -> dict[str, object]:
    """The ``[agents.NAME]`` table of a daemon's ``adapter = "acp"`` agent: the preset, the
    installed binary, the environment that points it at the fake server at ``url``. What the
    preset cannot know (a fake provider) goes in files under ``folder``, named by ``env``."""
    # ``folder`` holds what the agent writes outside its HOME (a CODEX_HOME, the tools' pid
    # files): granted, as a user grants a folder it points an agent at.
    # And the fake server's loopback address, which the default network refuses.
    from supervisor.core.netpolicy import grant_for

    table: dict[str, object] = {
        "adapter": "acp", "preset": name, "command": [str(acp_binary(name))], "sandbox_write": [str(folder)],
        "network_allow": [grant_for(url)],
    }
    if name == "gemini":
        table["env"] = gemini_api.agent_env(url)
    elif name == "qwen":
        table["args"] = ["--auth-type", "openai"]
        table["env"] = openai_chat.agent_env(url)
    elif name == "claude":
        table["env"] = anthropic.agent_env(url)
    elif name == "codex":
        # codex reads its provider from $CODEX_HOME/config.toml: the preset's (no provider)
        # is replaced by one naming the fake server.
        from adapters._base import TurnRequest
        from adapters.codex import config_toml

        codex_home = folder / "codex-home"
        codex_home.mkdir(exist_ok=True)
        request = TurnRequest(
            prompt="", channel="", turn_id="", agent="codex", command=(), options=openai_responses.agent_options(url)
        )
        config = config_toml(request).replace('approval_policy = "never"', 'approval_policy = "untrusted"')
        (codex_home / "config.toml").write_text(config)
        table["env"] = {**openai_responses.agent_env(url), "CODEX_HOME": str(codex_home)}
    elif name == "opencode":
        config_file = folder / "opencode.json"
        config_file.write_text(_json(opencode_config(url)))
        table["env"] = {
            "OPENCODE_CONFIG": str(config_file),
            "OPENCODE_DISABLE_MODELS_FETCH": "true",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "true",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "true",
            "OPENCODE_DISABLE_SHARE": "true",
        }
    elif name == "copilot":
        table["env"] = openai_chat.copilot_env(url)
    elif name == "vibe":
        vibe_home = folder / "vibe-home"
        vibe_home.mkdir(exist_ok=True)
        (vibe_home / "config.toml").write_text(openai_chat.vibe_config(url))
        table["env"] = {"FAKE_API_KEY": "sk-fake-corral", "VIBE_HOME": str(vibe_home)}
    elif name == "kilo":
        table["env"] = kilo_env(url)
    elif name == "kimi":
        # ``kimi acp`` reads its provider only from its share folder (``--config-file`` is
        # ignored in ACP mode): a folder of the user's, with the preset's no-login placeholder.
        from adapters._base import TurnRequest

        share = folder / "kimi-share"
        request = TurnRequest(prompt="", channel="", turn_id="", agent="kimi", command=())
        for rel, content in (PRESETS["kimi"].files or (lambda r: {}))(request).items():
            target = share / Path(rel).relative_to(".kimi")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        (share / "config.toml").write_text(openai_chat.kimi_config(url))
        table["env"] = {"KIMI_SHARE_DIR": str(share)}
    elif name == "fast-agent":
        table["env"] = fast_agent_env(url, str(folder))
    return table


@dataclass(frozen=True)
class AcpAgentSpec:
    """One real ACP agent and its fake model server."""

    name: str
    server: Callable[[], FakeModelServer]
    launch: Callable[[str, str, str], Launch]
    """``(server_url, cwd, home) -> Launch``: ``home`` is the agent's private HOME."""
    attended: Callable[[str, str, str], Launch] | None = None
    """The launch of an attended agent (``unattended = false``), where the preset's differs."""

    @property
    def restart_after_cancel(self) -> bool:
        """The preset's quirk, passed to ``open_acp_agent``."""
        return PRESETS[self.name].restart_after_cancel


ACP_AGENTS: dict[str, AcpAgentSpec] = {
    "gemini": AcpAgentSpec("gemini", gemini_api.FakeGeminiServer, _gemini),
    "qwen": AcpAgentSpec("qwen", openai_chat.OpenAIChatServer, _qwen),
    "claude": AcpAgentSpec("claude", anthropic.FakeAnthropicServer, _claude),
    "codex": AcpAgentSpec("codex", openai_responses.OpenAIResponsesServer, _codex),
    "opencode": AcpAgentSpec("opencode", openai_chat.OpenCodeChatServer, _opencode),
    "copilot": AcpAgentSpec("copilot", openai_chat.CopilotChatServer, _copilot),
    "vibe": AcpAgentSpec("vibe", openai_chat.VibeChatServer, _vibe),
    "kilo": AcpAgentSpec("kilo", openai_chat.KiloChatServer, _kilo),
    "kimi": AcpAgentSpec("kimi", openai_chat.KimiChatServer, _kimi),
    "fast-agent": AcpAgentSpec("fast-agent", openai_chat.FastAgentChatServer, _fast_agent, _fast_agent_attended),
}
