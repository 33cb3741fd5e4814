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
}


def cache_dir() -> Path:
    """The folder the CLIs are installed under."""
    if "CORRAL_CLI_CACHE" in os.environ:
        return Path(os.environ["CORRAL_CLI_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "corral" / "clis"


def cli_path(name: str) -> Path:
    """The installed binary of CLI ``name``; raises with the fix when it is missing."""
    spec = PACKAGES[name]
    folder = spec.replace("@", "_").replace("/", "_")
    path = cache_dir() / folder / "node_modules" / ".bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{name} is not installed at {path}; run scripts/install-clis.sh")
    return path
