"""Where scripts/install-clis.sh put the real agent CLIs."""

from __future__ import annotations

import os
from pathlib import Path

#: The pinned npm package of each CLI; keep in step with scripts/install-clis.sh.
PACKAGES: dict[str, str] = {
    "claude": "@anthropic-ai/claude-code@2.1.197",
    "codex": "@openai/codex@0.171.0",
    "gemini": "@google/gemini-cli@0.61.0",
    "qwen": "@qwen-code/qwen-code@0.15.10",
    "aider": "pypi:aider-chat==0.86.2",
    "pi": "@mariozechner/pi-coding-agent@0.73.1",
}


def cache_dir() -> Path:
    """The folder the CLIs are installed under."""
    if "CORRAL_CLI_CACHE" in os.environ:
        return Path(os.environ["CORRAL_CLI_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "corral" / "clis"


def installed_binary(spec: str, binary: str) -> Path:
    """Where install-clis.sh put ``binary`` of package ``spec``; raises with the fix when missing.

    ``spec`` is an npm spec (``@scope/name@1.2.3``: under ``node_modules/.bin`` of a folder
    named by it) or a PyPI one (``pypi:name==1.2.3``: the ``bin/`` of a virtualenv named
    ``pypi_name_1.2.3``).
    """
    if spec.startswith("pypi:"):
        name, version = spec.removeprefix("pypi:").split("==")
        path = cache_dir() / f"pypi_{name}_{version}" / "bin" / binary
    else:
        path = cache_dir() / spec.replace("@", "_").replace("/", "_") / "node_modules" / ".bin" / binary
    if not path.exists():
        raise FileNotFoundError(f"{binary} is not installed at {path}; run scripts/install-clis.sh")
    return path


def cli_path(name: str) -> Path:
    """The installed binary of CLI ``name``; raises with the fix when it is missing."""
    return installed_binary(PACKAGES[name], name)
