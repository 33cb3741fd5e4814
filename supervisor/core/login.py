"""A CLI that is not logged in, said as corral's own error with the fix.

corral gives every agent a private HOME (one per agent and channel), so a login the user made
in their own session (``claude /login``, ``codex login``, Gemini's or Qwen's OAuth) is not
seen there, and the CLI answers with its own text — "Not logged in · Please run /login" —
which nobody can act on from a chat. :func:`login_failure` recognises those texts;
:func:`login_error` is what corral stores instead: what happened, and the two fixes (hand the
agent its login files with ``credentials``, or an API key in ``env``); where each CLI keeps
its login is its adapter's data (``Adapter.login``). Pure: no I/O.
"""

from __future__ import annotations

import re

#: What the real CLIs print when they have no usable login (matched case-insensitively).
_PATTERNS = re.compile(
    r"not logged in|please run /login|invalid api key|please set an auth method"
    r"|no api key (?:was )?(?:found|provided)|401 unauthorized|authentication_error|run `?codex login`?",
    re.IGNORECASE,
)

#: The meta key of the error entry that replaced the CLI's own text (which it keeps).
META_KEY = "not_logged_in"


def login_failure(text: str | None) -> bool:
    """Does the CLI's ``text`` say it has no usable login?"""
    return bool(text) and _PATTERNS.search(text or "") is not None


def login_help(agent: str, adapter: str) -> str | None:
    """:func:`login_error` for the adapters of CLIs that log in (and ACP agents); None for the
    others (the demo agent, a generic command: their words are theirs)."""
    from adapters import get_adapter  # (the adapters' data: where each CLI keeps its login)

    spec = get_adapter(adapter)
    logs_in = spec.logs_in if spec.logs_in is not None else spec.login is not None
    return login_error(agent, adapter) if logs_in else None


def login_error(agent: str, adapter: str) -> str:
    """corral's error for agent ``agent`` (of ``adapter``) that is not logged in, with the fix."""
    from adapters import get_adapter

    file, key = get_adapter(adapter).login or ("", "")
    login = (f'hand it your own login read-only with credentials = ["{file}"] in [agents.{agent}]'
             if file else f"hand it its login files with credentials = [\"~/...\"] in [agents.{agent}]")
    api = f' or give it an API key: env = {{ {key} = "..." }}' if key else " or give it an API key in env"
    return (f"{agent} is not logged in: corral runs it with a private HOME, where your own login is not "
            f"seen — fix: {login},{api} (docs/agents.md, \"Logging agents in\"); then send the message again")
