"""Fixtures shared by the test suite."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor import Config, parse_config
from supervisor._tree import TURN_MARKER

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path: a Unix socket path must stay under 108 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="corral-t-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def make_config(folder: Path, agents: dict[str, dict[str, Any]] | None = None, **defaults: Any) -> Config:
    """A valid config rooted in ``folder``; the demo agent unless ``agents`` says otherwise."""
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock"},
        "store": {"path": "corral.db"},
        "agents": agents or {"demo": {"adapter": "demo", "delay": 0.01}},
    }
    if defaults:
        data["defaults"] = defaults
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


def script_agent(code: str, **extra: Any) -> dict[str, Any]:
    """A generic agent running ``code`` with this Python; the prompt is ``sys.argv[1]``."""
    return {"adapter": "generic", "command": [PYTHON, "-c", code], **extra}


def turn_processes(turn_ids: list[str] | None = None) -> list[psutil.Process]:
    """Living (non-zombie) processes carrying the turn marker (of the given turns, or any)."""
    found = []
    for proc in psutil.process_iter(["environ", "status"]):
        env = proc.info.get("environ") or {}
        if TURN_MARKER not in env or proc.pid == os.getpid():
            continue
        if proc.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if turn_ids is None or env[TURN_MARKER] in turn_ids:
            found.append(proc)
    return found


@pytest.fixture(autouse=True)
def no_leftover_turn_processes() -> Iterator[None]:
    """Every test must leave no process of any turn alive (the contract's last word)."""
    before = {p.pid for p in turn_processes()}
    yield
    left = [p for p in turn_processes() if p.pid not in before]
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    assert not left, f"processes of turns left alive: {[(p.pid, p.info.get('name')) for p in left]}"
