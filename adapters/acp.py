"""The ``acp`` adapter: any agent that speaks the Agent Client Protocol, and the presets of
the real ones (their programs, the files their HOME needs, what their usage covers).

The protocol itself — the sans-I/O client state machine, its events, the permission policy,
errors and authentication — is :mod:`adapters.acp_protocol`; its names are re-exported here,
so ``from adapters.acp import AcpConnection`` keeps working. This module holds what corral
adds around it: :class:`Preset` and :data:`PRESETS`, :func:`preset_launch` and
:func:`build_launch` (the agent's process), :class:`AcpSettings` (its ``acp_*`` keys) and the
:data:`ADAPTER`, with :func:`check_options`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._base import (
    Adapter,
    CheckedOptions,
    Launch,
    OptionProblem,
    Parser,
    TurnRequest,
)
from ._common import json_file
from .acp_protocol import (
    AUTH_REQUIRED,
    CLIENT_CAPABILITIES,
    ERROR_TEXT_CHARS,
    PROTOCOL_VERSION,
    REQUEST_CANCELLED,
    STOP_ERROR,
    UNSUPPORTED_VERSION,
    AcpConnection,
    AcpEvent,
    AcpProtocolError,
    Authenticated,
    AuthMethod,
    Initialized,
    PermissionDecided,
    PermissionKind,
    PermissionOption,
    PermissionRequested,
    PromptEnded,
    RequestFailed,
    SessionClosed,
    SessionReady,
    auth_advice,
    auth_problem,
    decide_permission,
    describe_auth_method,
    error_text,
)

__all__ = [
    "ADAPTER",
    "AUTH_REQUIRED",
    "CLIENT_CAPABILITIES",
    "DEFAULT_CANCEL_GRACE",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "ERROR_TEXT_CHARS",
    "OPTION_KEYS",
    "PRESETS",
    "PROTOCOL_VERSION",
    "REQUEST_CANCELLED",
    "STOP_ERROR",
    "UNSUPPORTED_VERSION",
    "AcpConnection",
    "AcpEvent",
    "AcpProtocolError",
    "AcpSettings",
    "AuthMethod",
    "Authenticated",
    "Initialized",
    "PermissionDecided",
    "PermissionKind",
    "PermissionOption",
    "PermissionRequested",
    "Preset",
    "PromptEnded",
    "RequestFailed",
    "SessionClosed",
    "SessionReady",
    "acp_settings",
    "auth_advice",
    "auth_problem",
    "build_launch",
    "check_options",
    "decide_permission",
    "describe_auth_method",
    "error_text",
    "preset_launch",
]

# ---------------------------------------------------------------- presets


@dataclass(frozen=True, slots=True)
class Preset:
    """How to start one known ACP agent: its arguments after the binary, and its quirks."""

    binary: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    note: str = ""
    restart_after_cancel: bool = False
    """The agent's session is out of step after a cancel: restart it (session/load) instead."""
    files: Callable[[TurnRequest], Mapping[str, str]] | None = None
    """The private files a bare install needs in the agent's HOME (settings that keep it quiet)."""
    home_env: Mapping[str, str] = field(default_factory=dict)
    """Variables naming a place under the agent's HOME (the value is relative to it)."""
    unattended_args: tuple[str, ...] = ()
    """Arguments only an unattended agent gets: a tool the agent runs without asking over ACP,
    which an attended agent (``unattended = false``) must not have."""
    usage_totals: Literal["turn", "session"] = "turn"
    """What the ``usage`` of its ``session/prompt`` answers covers (:attr:`AcpConnection.usage_totals`)."""


def _gemini_files(request: TurnRequest) -> Mapping[str, str]:
    from . import gemini

    return {gemini.SETTINGS_PATH: json_file(gemini.settings(request))}


def _qwen_files(request: TurnRequest) -> Mapping[str, str]:
    from . import qwen

    return {qwen.SETTINGS_PATH: json_file(qwen.DEFAULT_SETTINGS)}


def _codex_files(request: TurnRequest) -> Mapping[str, str]:
    from . import codex

    # Over ACP codex asks before running a command (``untrusted``) and corral's policy
    # answers; full access, or its sandbox refuses what the policy allowed.
    config = codex.config_toml(request).replace('approval_policy = "never"', 'approval_policy = "untrusted"')
    return {f"{codex.CODEX_DIR}/config.toml": config}


def _kimi_files(request: TurnRequest) -> Mapping[str, str]:
    # kimi acp refuses every session/new ("Authentication required") until a Kimi Code login
    # is stored, even when the configured model is one's own: an empty login that never
    # expires lets a bring-your-own model run (the vendor's models then fail, as without one).
    return {".kimi/credentials/kimi-code.json": json_file({"access_token": "corral-no-login", "token_type": "none"})}


#: Known ACP agents. ``binary`` is the default command; a configured ``command`` replaces it.
PRESETS: dict[str, Preset] = {
    "gemini": Preset(
        "gemini",
        ("--acp",),
        {
            # Without it gemini re-spawns itself as a child node whose parent ignores
            # SIGINT/SIGTERM: the process corral talks to would not be the one working.
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_TELEMETRY_ENABLED": "false",
            "NO_COLOR": "1",
        },
        "gemini >= 0.61: --acp (--experimental-acp is the deprecated spelling)",
        files=_gemini_files,
    ),
    "qwen": Preset(
        "qwen",
        ("--acp",),
        {"QWEN_TELEMETRY_ENABLED": "false", "NO_UPDATE_NOTIFIER": "1", "NO_COLOR": "1"},
        "qwen 0.15: --acp",
        files=_qwen_files,
    ),
    # opencode runs bash without asking unless its config says permission.bash = "ask".
    "opencode": Preset("opencode", ("acp",), {"OPENCODE_DISABLE_AUTOUPDATE": "true"}, "opencode acp"),
    # claude-agent-acp 0.23 interrupts the query on a cancel, and the next prompt then ends at
    # once with the interrupted query's result (each later answer one prompt late): a fresh
    # process with session/load after every cancel keeps the conversation in step.
    "claude": Preset(
        "claude-agent-acp",
        (),
        {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1"},
        "the Zed bridge",
        restart_after_cancel=True,
    ),
    "codex": Preset("codex-acp", (), {}, "the Zed bridge", files=_codex_files, home_env={"CODEX_HOME": ".codex"}),
    # GitHub Copilot CLI: a model of your own (COPILOT_PROVIDER_BASE_URL, COPILOT_MODEL) needs
    # no GitHub login; COPILOT_OFFLINE=true then keeps it off the network altogether.
    "copilot": Preset(
        "copilot",
        ("--acp",),
        {"COPILOT_AUTO_UPDATE": "false", "USE_TGREP": "false", "NO_COLOR": "1"},
        "copilot >= 1.0: --acp",
        usage_totals="session",
    ),
    # Mistral Vibe: its ACP server is a binary of its own; the provider is ~/.vibe/config.toml
    # (or $VIBE_HOME/config.toml).
    "vibe": Preset("vibe-acp", (), {"NO_COLOR": "1"}, "mistral-vibe 2.26: vibe-acp", usage_totals="session"),
    # Kilo Code CLI, an opencode fork: the provider in KILO_CONFIG_CONTENT (or its config file).
    "kilo": Preset(
        "kilo",
        ("acp",),
        {"KILO_DISABLE_AUTOUPDATE": "1", "KILO_DISABLE_SHARE": "1", "KILO_DISABLE_MODELS_FETCH": "1", "NO_COLOR": "1"},
        "kilo 7.7: kilo acp",
    ),
    # Kimi CLI: the provider is ~/.kimi/config.toml (or --config-file before ``acp``).
    "kimi": Preset("kimi", ("acp",), {"NO_COLOR": "1"}, "kimi-cli 1.51: kimi acp", files=_kimi_files),
    # fast-agent (PyPI fast-agent-mcp): ``--shell`` gives it its local shell tool (corral offers
    # no ``terminal``); its state (sessions, process records) goes under HOME, not the cwd.
    # The model: FAST_AGENT_MODEL or ``--model`` (e.g. ``generic.M`` with GENERIC_BASE_URL).
    # Its local shell asks no permission over ACP (only a client's terminal is asked for), so
    # an attended agent does without it.
    "fast-agent": Preset(
        "fast-agent", ("acp",), {"NO_COLOR": "1"}, "fast-agent-mcp 0.10: fast-agent acp --shell",
        home_env={"FAST_AGENT_HOME": ".fast-agent"}, unattended_args=("--shell",),
    ),
}


def preset_launch(
    name: str,
    *,
    cwd: str,
    command: Sequence[str] | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    files: Mapping[str, str] | None = None,
    unattended: bool = True,
) -> Launch:
    """The launch of preset ``name``: its command (or ``command``), its args (and those of an
    unattended agent, when it is one), then ``args``.

    The preset's environment comes first, so a configured ``env`` overrides a quirk.
    ``KeyError`` names the known presets.
    """
    try:
        preset = PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown ACP preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
    argv = (*(command or (preset.binary,)), *preset.args, *(preset.unattended_args if unattended else ()), *args)
    return Launch(argv=argv, env={**preset.env, **(env or {})}, cwd=cwd, stdin=b"", files=dict(files or {}))


# ---------------------------------------------------------------- the adapter

#: ``[agents.NAME]`` keys of ``adapter = "acp"``: ``preset`` (a key of :data:`PRESETS`: the
#: command, environment and files a bare install needs), ``acp_cancel_grace`` (seconds a
#: stop waits for the typed cancel's answer before killing the agent's whole tree),
#: ``acp_idle_timeout`` (seconds an agent process may sit idle before it is closed),
#: ``acp_start_timeout`` (seconds the agent may take to open a session) and ``acp_auth``
#: (the id of the authentication method corral calls ``authenticate`` with before a session).
OPTION_KEYS = frozenset({"preset", "acp_cancel_grace", "acp_idle_timeout", "acp_start_timeout", "acp_auth"})
#: Default ``acp_cancel_grace``.
DEFAULT_CANCEL_GRACE = 3.0
#: Default ``acp_idle_timeout``: ten minutes.
DEFAULT_IDLE_TIMEOUT = 600.0
#: Default ``acp_start_timeout``: node agents start slowly.
DEFAULT_START_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class AcpSettings:
    """What an ACP agent's options mean, read totally (the config loader checked their types)."""

    preset: str | None
    cancel_grace: float
    idle_timeout: float
    start_timeout: float = DEFAULT_START_TIMEOUT
    auth: str | None = None
    """``acp_auth``: the method to ``authenticate`` with (None: none, unless the agent asks)."""

    @property
    def restart_after_cancel(self) -> bool:
        """The preset's quirk: a fresh process (session/load) after every cancel."""
        return self.preset is not None and PRESETS[self.preset].restart_after_cancel

    @property
    def usage_totals(self) -> Literal["turn", "session"]:
        """What the preset's prompt answers' ``usage`` covers (``turn`` for an agent of no preset)."""
        return PRESETS[self.preset].usage_totals if self.preset is not None else "turn"


def acp_settings(options: Mapping[str, object]) -> AcpSettings:
    """The agent's ACP options, with their defaults."""
    preset = options.get("preset")
    grace = options.get("acp_cancel_grace", DEFAULT_CANCEL_GRACE)
    idle = options.get("acp_idle_timeout", DEFAULT_IDLE_TIMEOUT)
    start = options.get("acp_start_timeout", DEFAULT_START_TIMEOUT)
    auth = options.get("acp_auth")
    return AcpSettings(
        preset if isinstance(preset, str) and preset in PRESETS else None,
        float(grace) if isinstance(grace, int | float) else DEFAULT_CANCEL_GRACE,
        float(idle) if isinstance(idle, int | float) else DEFAULT_IDLE_TIMEOUT,
        float(start) if isinstance(start, int | float) and not isinstance(start, bool) and start > 0
        else DEFAULT_START_TIMEOUT,
        auth if isinstance(auth, str) and auth else None,
    )


def build_launch(request: TurnRequest) -> Launch:
    """The agent process's launch: the preset's (if any) with the configured command and args.

    Started once per (channel, agent) and kept; the prompt never goes in argv or on stdin at
    start (it is a ``session/prompt``). The model, if configured, is not passed: ACP has no
    portable way to choose one (use the agent's own ``args`` or settings).
    """
    settings = acp_settings(request.options)
    if settings.preset is None:
        return Launch(argv=(*request.command, *request.args), cwd=request.cwd, stdin=b"")
    preset = PRESETS[settings.preset]
    files = preset.files(request) if preset.files is not None else {}
    env = {key: f"{request.home.rstrip('/')}/{rel}" for key, rel in preset.home_env.items()}
    return preset_launch(settings.preset, cwd=request.cwd, command=request.command, args=request.args, env=env,
                         files=files, unattended=request.unattended)


def _no_line_parser(request: TurnRequest) -> Parser:
    raise TypeError("an ACP agent's output is not parsed line by line: supervisor.turns.acp drives it")


def _seconds(value: object, *, above_zero: bool = False) -> bool:
    # ``not value >= 0`` also rejects NaN (valid TOML), which trio's timeouts refuse.
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and (value > 0 if above_zero else value >= 0))


def check_options(raw: Mapping[str, Any]) -> CheckedOptions:
    """An ACP agent's own keys (pure): the three times, ``acp_auth``, and ``preset``, whose
    program is the agent's command unless ``command`` says otherwise."""
    problems: list[OptionProblem] = []
    options = dict(raw)
    for key, default in (("acp_cancel_grace", DEFAULT_CANCEL_GRACE), ("acp_idle_timeout", DEFAULT_IDLE_TIMEOUT)):
        if key in options and not _seconds(options[key]):
            problems.append(OptionProblem(key, f"expected a number of seconds (>= 0), got {options[key]!r}",
                                          f"write {key} = {default:g}"))
            options.pop(key)  # (the default stands)
    start = options.get("acp_start_timeout")
    if start is not None and not _seconds(start, above_zero=True):
        problems.append(OptionProblem("acp_start_timeout", f"expected a number of seconds (> 0), got {start!r}",
                                      f"write acp_start_timeout = {DEFAULT_START_TIMEOUT:g}"))
        options.pop("acp_start_timeout")
    auth = options.get("acp_auth")
    if auth is not None and not isinstance(auth, str):
        problems.append(OptionProblem("acp_auth", f"expected a string, got {auth!r}", 'write acp_auth = "..."'))
        options.pop("acp_auth")
    elif auth is not None and not auth.strip():
        problems.append(OptionProblem("acp_auth", "is empty", "write the id of a method the agent offers (corral "
                                      "names them when the agent asks for authentication), or remove it"))
    preset = options.get("preset")
    command: tuple[str, ...] | None = None
    if preset is not None and not isinstance(preset, str):
        problems.append(OptionProblem("preset", f"expected a string, got {preset!r}", 'write preset = "..."'))
    elif preset is not None and preset not in PRESETS:
        close = difflib.get_close_matches(preset, sorted(PRESETS), n=1)
        problems.append(OptionProblem("preset", f"unknown ACP preset {preset!r}",
                                      f"did you mean {close[0]!r}?" if close else
                                      f"use one of: {', '.join(sorted(PRESETS))}"))
    elif preset is not None:
        command = (PRESETS[preset].binary,)
    return CheckedOptions(options, tuple(problems), command, "preset" if "preset" in raw else None)


ADAPTER = Adapter(
    name="acp",
    default_command=(),
    build_launch=build_launch,
    new_parser=_no_line_parser,
    option_keys=OPTION_KEYS,
    runs="persistent",
    check_options=check_options,
    needs_command=("needs a command or a preset", 'add preset = "gemini" (or command = ["agent", "--acp"])'),
    logs_in=True,
    memory_estimate=512 << 20,
)
