"""Run a script of ``scripts/`` with ``--json`` and return its summary (for the slice tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def run_json(script: str, *args: str, timeout: float = 240) -> dict[str, Any]:
    """``python -m scripts.SCRIPT --json ARGS`` from the repository root, this tree first on the
    path; its JSON summary."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", f"scripts.{script.removesuffix('.py')}", "--json", *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{script} printed no summary (status {proc.returncode}): {proc.stderr[-2000:]}"
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary
