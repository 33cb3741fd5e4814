"""``make test`` says what it needs: the CLI installer checks for Node.js and npm before
downloading anything, and every test that runs a real agent CLI is marked ``realcli`` (so
``make test-core``, ``pytest -m "not realcli"``, runs everything else)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "scripts" / "install-clis.sh"


def run_installer(bin_dir: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """The installer with only ``bin_dir`` on PATH (bash's builtins still work)."""
    return subprocess.run(
        ["/bin/bash", str(INSTALL)], env={"PATH": str(bin_dir), "HOME": str(home)},
        capture_output=True, text=True, timeout=60, check=False,
    )


def fake(bin_dir: Path, name: str, version: str) -> None:
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\necho {version}\n")
    script.chmod(0o755)


@pytest.mark.parametrize(
    ("tools", "problem"),
    [
        ({}, "Node.js (node) is not installed or not on PATH."),
        ({"node": "v20.11.0"}, "npm is not installed or not on PATH."),
        ({"node": "v18.19.0", "npm": "9.2.0"}, "Node.js v18.19.0 is too old."),
    ],
)
def test_the_cli_installer_says_what_to_install_before_downloading(tmp_path: Path, tools: dict[str, str], problem: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, version in tools.items():
        fake(bin_dir, name, version)
    done = run_installer(bin_dir, tmp_path)
    assert done.returncode == 1
    assert problem in done.stderr
    assert "Node.js >= 20 and npm" in done.stderr and "make test-core" in done.stderr
    assert not (tmp_path / ".cache").exists(), "nothing is created before the check passes"


def test_every_test_that_runs_an_agent_cli_is_marked_realcli() -> None:
    # What finds an installed CLI (clis, and acp_agents through it); the rig's tool scripts
    # run under fake agents too. The module names are the full ones the tests import.
    checked = 0
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        uses_cli = any(
            isinstance(node, ast.ImportFrom) and node.module in ("scripts.fakemodel.clis", "scripts.fakemodel.acp_agents")
            for node in ast.walk(tree)
        )
        if uses_cli:
            assert "pytestmark = pytest.mark.realcli" in path.read_text(), f"{path.name} runs agent CLIs: mark it realcli"
            checked += 1
    assert checked >= 3, "the check found no test that runs a CLI: did the fake servers' modules move?"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_core_runs_the_tests_that_need_no_cli_and_make_test_checks_node_first() -> None:
    # ... and both lint and type-check before the tests: the checks are part of the build.
    def planned(target: str) -> list[str]:
        # Under CI this test runs inside `make test`: a nested make would print its directory.
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        done = subprocess.run(
            ["make", "--no-print-directory", "-n", "-B", target],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
        )
        return done.stdout.splitlines()

    core = planned("test-core")
    assert core[-1] == '.venv/bin/pytest -q -m "not realcli"'
    assert not [line for line in core if "install-clis" in line]
    full = planned("test")
    assert full[0] == "bash scripts/install-clis.sh", "the Node.js check comes before the setup"
    assert full[-1] == ".venv/bin/pytest -q"
    for plan in (core, full):
        checks = [line for line in plan if line.startswith((".venv/bin/ruff check", ".venv/bin/mypy"))]
        assert len(checks) == 2 and plan.index(checks[-1]) < len(plan) - 1, plan


def test_bench_stop_without_the_agent_clis_says_which_rows_it_skipped(tmp_path: Path) -> None:
    # An empty CLI cache: as on a machine where scripts/install-clis.sh never ran.
    env = {**os.environ, "CORRAL_CLI_CACHE": str(tmp_path / "no-clis"),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-m", "scripts.bench_stop", "--quick", "--no-demo"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("claude", "codex", "gemini", "qwen"):
        assert f"skipping the {name} rows: not installed under {tmp_path / 'no-clis'}" in done.stdout
    assert "skipped: the rows of claude, codex, gemini, qwen" in done.stdout
    assert "Traceback" not in done.stderr


def test_every_folder_of_package_data_is_a_package_setuptools_finds() -> None:
    """Issue 25: `pip install` printed ~40 warnings that supervisor.static was not in `packages`.

    Every folder under supervisor/ and adapters/ that ships files must be one of the packages
    the `[tool.setuptools.packages.find]` table finds (a namespace package for static/), so
    setuptools installs it as a package, not as deprecated "data".
    """
    import tomllib

    from setuptools import find_namespace_packages

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" not in table or isinstance(table["packages"], dict), "an explicit list leaves static/ out"
    find = table["packages"]["find"]
    assert find.get("namespaces", True), "static/ has no __init__.py: only a namespace search finds it"
    found = set(find_namespace_packages(where=str(ROOT), include=find["include"]))
    for top in ("supervisor", "adapters"):
        for folder in (ROOT / top).rglob("*"):
            if folder.is_dir() and folder.name != "__pycache__" and any(f.is_file() for f in folder.iterdir()):
                name = ".".join(folder.relative_to(ROOT).parts)
                assert name in found, f"{name} ships files but is no package setuptools finds"


def test_a_turn_of_another_run_whose_supervisor_got_a_pid_of_ours_is_not_ours() -> None:
    """The leftover check counts only this run's turns, though pids are reused.

    Another suite on the machine (the engineers share it) can start a daemon under a pid that
    a daemon of this run had: its turns then carry ``t<that pid>-…``. Counting them as ours
    made a teardown "find" a foreign sandbox (bwrap, bwrap, node) still alive, and kill it.
    """
    import time

    import psutil
    from conftest import SUPERVISOR_PIDS, turn_processes

    from supervisor.procs.tree import TURN_MARKER

    theirs = subprocess.Popen(["sleep", "60"])  # stands in for the other run's daemon
    turn = None
    try:
        SUPERVISOR_PIDS.add(theirs.pid)
        born = SUPERVISOR_PIDS.born[theirs.pid]
        SUPERVISOR_PIDS.born[theirs.pid] = born - 100  # ours had this pid, earlier, and died
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), TURN_MARKER: f"t{theirs.pid:x}-acp-0"}
        turn = subprocess.Popen(["sleep", "60"], env=env)
        deadline = time.monotonic() + 30
        while psutil.Process(turn.pid).environ().get(TURN_MARKER) is None:  # until it has exec'd
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert turn.pid not in {p.pid for p in turn_processes()}, "a reused pid's turns are not ours"
        SUPERVISOR_PIDS.born[theirs.pid] = born  # the very process we started: its turns are ours
        assert turn.pid in {p.pid for p in turn_processes()}
    finally:
        for proc in (turn, theirs):
            if proc is not None:
                proc.kill()
                proc.wait()
        SUPERVISOR_PIDS.discard(theirs.pid)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_installs_corrals_runtime_only_and_the_test_targets_add_the_test_tools() -> None:
    """Issue 32: a fresh clone's `make demo` virtualenv holds no test tools (pytest, mypy,
    ruff, Playwright); `make test` and `make test-core` install them on top."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}

    def installs(target: str) -> list[str]:
        done = subprocess.run(["make", "--no-print-directory", "-n", "-B", target], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        return [line for line in done.stdout.splitlines() if "pip install" in line and "--upgrade pip" not in line]

    assert installs("demo") == [".venv/bin/pip install --quiet -c constraints.txt -e ."]
    for target in ("test-core", "setup"):
        assert installs(target)[-1] == ".venv/bin/pip install --quiet -c constraints.txt -e '.[test,postgres,matrix]'"
