"""``corral demo`` and the demo agent: the demo judges only its own work, cleans up when
interrupted, and the demo agent finishes its plan when nudged."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import trio

from conftest import make_config
from supervisor import open_supervisor
from supervisor._supervisor import NUDGE_TEXT
from supervisor._tree import TURN_MARKER

ROOT = Path(__file__).resolve().parent.parent
SLOW = 60


def corral_env() -> dict[str, str]:
    """This checkout's ``supervisor`` first on the path, as the tests import it."""
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


async def test_the_demo_agent_finishes_its_plan_on_the_first_nudge(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        accepted = await sup.send("c", "make a plan")
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
        todos = sup._store.todos("c", "demo")
    nudges = [e for e in entries if e.meta.get("nudge")]
    assert [e.text for e in nudges] == [NUDGE_TEXT.format(n=2)]
    assert [t["status"] for t in todos] == ["completed"] * 3
    after_nudge = [e for e in entries if e.seq > nudges[0].seq]
    assert any(e.kind == "message" and "make the change, run the tests — done" in e.text for e in after_nudge)
    assert not [e for e in entries if e.kind == "error"]


async def test_demo_passes_while_another_supervisors_turn_process_is_alive() -> None:
    # A process carrying another corral's turn marker, as on any server running corral.
    foreign = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, TURN_MARKER: "t1-foreign-turn"}
    )
    try:
        with trio.fail_after(SLOW):
            done = await trio.run_process(
                [sys.executable, "-m", "supervisor.cli", "demo"], capture_stdout=True, capture_stderr=True,
                check=False, env=corral_env(), cwd=ROOT,
            )
        out = done.stdout.decode()
        assert done.returncode == 0, out + done.stderr.decode()
        assert "demo finished: every step did what it should." in out
        assert foreign.poll() is None, "the demo must not touch another corral's processes"
    finally:
        foreign.kill()
        foreign.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_an_interrupted_demo_removes_its_folder_and_its_processes(signum: signal.Signals) -> None:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "supervisor.cli", "demo"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=corral_env(), cwd=ROOT,
    )
    assert process.stdout is not None
    out = b""
    try:
        with trio.fail_after(SLOW):
            # Interrupt it mid-tool, the worst moment: a turn's tree is running.
            while b"tool running" not in out:
                chunk = await process.stdout.receive_some()
                assert chunk, out.decode()
                out += chunk
            folder = Path(out.decode().split(" in ", 1)[1].split("\n", 1)[0])
            assert folder.is_dir()
            process.send_signal(signum)
            while chunk := await process.stdout.receive_some():
                out += chunk
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = out.decode()
    assert process.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], text
    assert f"demo interrupted by {signum.name}; its temporary folder was removed" in text
    assert not folder.exists()
    assert "Traceback" not in text
    tool, helper = (int(n) for n in re.search(r"tool running \(pid (\d+), setsid helper pid (\d+)\)", text).groups())
    for pid in (tool, helper):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


async def test_a_failed_check_says_which_and_why(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor import _demo

    async def one_left(turn_ids: set[str]) -> list[int]:
        return [4242]

    monkeypatch.setattr(_demo, "leftovers_of", one_left)
    said: list[str] = []
    with trio.fail_after(SLOW):
        assert await _demo.run_demo(short_tmp, said.append) is False
    assert said[-3:] == [
        "demo FAILED:",
        "  - the stop: processes of the stopped turn are still alive: [4242]",
        "  - the end: processes of the demo's turns are still alive: [4242]",
    ]
