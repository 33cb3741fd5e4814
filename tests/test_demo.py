"""``corral demo`` and the demo agent: the demo judges only its own work, cleans up when
interrupted, and the demo agent finishes its plan when nudged and hands work to another
agent (a hand-off, a ping-pong the hop limit ends, a stop in the middle of a chain)."""

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

from adapters import demo_agent
from supervisor import open_supervisor
from supervisor.core.catchup import Missed, catch_up_prompt
from supervisor.host.supervisor import NUDGE_TEXT
from supervisor.procs.tree import TURN_MARKER
from supervisor.testing import host_pid

ROOT = Path(__file__).resolve().parent.parent
SLOW = 60


#: The demo agent's status line while its tool runs: the pids are its pid namespace's (a
#: sandboxed turn has its own), so it names the namespace too.
TOOL_RUNNING = re.compile(r"tool running \(pid (\d+), setsid helper pid (\d+), pid namespace (\d+)\)")


def tool_pids(text: str) -> list[int]:
    """This process's pids for the tool and its setsid helper a ``tool running`` line names:
    read while they live (a dead process's pid no longer exists in its namespace)."""
    found = TOOL_RUNNING.search(text)
    assert found, text
    tool, helper, namespace = (int(n) for n in found.groups())
    return [host_pid(tool, namespace), host_pid(helper, namespace)]


def corral_env() -> dict[str, str]:
    """This checkout's ``supervisor`` first on the path, as the tests import it."""
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def readme_demo_transcript() -> list[str]:
    """The lines of the README's demo transcript (the block after ``<!-- demo transcript -->``)."""
    block = re.search(r"<!-- demo transcript -->\n```text\n(.*?)```\n", (ROOT / "README.md").read_text(), re.S)
    assert block, "the README shows a demo transcript"
    return block.group(1).splitlines()


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
        assert "demo finished: every step did what it should" in out
        # The README's demo transcript is what the demo prints: its lines, in order, among the demo's.
        shown = iter(out.splitlines())
        for line in readme_demo_transcript():
            assert any(printed == line for printed in shown), f"the demo never printed (in order): {line!r}\n{out}"
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
            while not TOOL_RUNNING.search(out.decode(errors="replace")):
                chunk = await process.stdout.receive_some()
                assert chunk, out.decode()
                out += chunk
            folder = Path(out.decode().split(" in ", 1)[1].split("\n", 1)[0])
            assert folder.is_dir()
            try:
                pids = tool_pids(out.decode())
            except LookupError:
                pids = []  # gone already: the demo's own stop of step 2 came first
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
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


async def test_a_failed_check_says_which_and_why(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor import _demo

    async def one_left(turn_ids: set[str]) -> list[int]:
        return [4242]

    monkeypatch.setattr(_demo, "leftovers_of", one_left)
    said: list[str] = []
    with trio.fail_after(SLOW):
        assert await _demo.run_demo(short_tmp, said.append) is False
    assert said[-4:] == [
        "demo FAILED:",
        "  - the stop: processes of the stopped turn are still alive: [4242]",
        "  - the channel-wide stop: processes of the stopped turns are still alive: [4242]",
        "  - the end: processes of the demo's turns are still alive: [4242]",
    ]


# ---------------------------------------------------------------- hand-offs


def two_agents(folder: Path, max_hops: int = 4) -> object:
    """alice (the default) and bob, two demo agents in every channel."""
    return make_config(
        folder, {"alice": {"adapter": "demo", "delay": 0.01}, "bob": {"adapter": "demo", "delay": 0.01}},
        agent="alice", max_hops=max_hops,
    )


def test_the_demo_agent_obeys_the_message_it_answers_not_the_catch_up() -> None:
    prompt = catch_up_prompt(
        [Missed("human:ana", "Please do a long task"), Missed("agent:bob", "@alice ping — bob")],
        "@alice hello", author="human:ana",
    )
    request = demo_agent.read_request(prompt)
    assert (request.text, request.caught_up, request.sender) == ("@alice hello", 2, None)
    assert demo_agent.hand_off(request, "alice") is None
    # Without a catch-up the prompt is the message itself; a signed hand-off names its sender.
    signed = demo_agent.read_request("@alice ping — bob")
    assert (signed.caught_up, signed.sender) == (0, "bob")
    assert demo_agent.hand_off(signed, "alice") == "@bob pong — alice"
    assert demo_agent.hand_off(demo_agent.read_request("@bob pong — alice"), "bob") == "@alice ping — bob"
    # A human's request names the other agent; a quote of it hands nothing off.
    ask = demo_agent.read_request("@alice write the fix, then ask bob to review it")
    assert demo_agent.hand_off(ask, "alice") == "@bob please review it — alice"
    assert demo_agent.hand_off(ask, "bob") is None  # "ask bob" is not bob's to do
    assert demo_agent.quote("@alice ask @bob, me@x") == "alice ask bob, me@x"


async def test_the_demo_agent_hands_off_to_the_agent_it_is_asked_to(short_tmp: Path) -> None:
    async with open_supervisor(two_agents(short_tmp)) as sup:
        accepted = await sup.send("c", "@alice write the fix, then ask bob to review it", author="human:you")
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
    assert accepted.to == ("alice",), "the human's message went to alice only"
    said = [(e.author, e.text) for e in entries if e.kind == "message"]
    assert said[-2:] == [
        ("agent:alice", "@bob please review it — alice"),
        ("agent:bob", "Reviewed alice's change: two small nits, nothing blocking. — bob"),
    ]
    assert said[0][0] == "agent:alice" and said[0][1].startswith("You said: alice write the fix")
    assert not [e for e in entries if e.kind in ("error", "notice")]


@pytest.mark.parametrize("max_hops", [1, 3])
async def test_a_demo_ping_pong_ends_at_the_hop_limit_with_a_status_entry(short_tmp: Path, max_hops: int) -> None:
    async with open_supervisor(two_agents(short_tmp, max_hops)) as sup:
        accepted = await sup.send("c", "@alice play ping-pong with bob", author="human:you")
        with trio.fail_after(SLOW):
            assert await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
    balls = [(e.author, e.text) for e in entries if e.kind == "message" and re.search(r"\b(ping|pong) — ", e.text)]
    # Each routed ball is one hop: max_hops of them, then the one the limit holds back.
    expected = [
        ("agent:alice", "@bob ping — alice") if i % 2 == 0 else ("agent:bob", "@alice pong — bob")
        for i in range(max_hops + 1)
    ]
    assert balls == expected
    assert entries[-1].author == "system" and entries[-1].kind == "status"
    assert entries[-1].text == (
        f"The hand-off chain stopped at {max_hops} hops (max_hops); it waits for a human to continue."
    )
    turns = [t for t in dict.fromkeys(e.turn for e in entries if e.author.startswith("agent:"))]
    assert len(turns) == max_hops + 1, "one turn for the human's message, one per hop"


async def test_one_stop_in_the_middle_of_a_demo_hand_off_stops_both_agents(short_tmp: Path) -> None:
    async with open_supervisor(two_agents(short_tmp)) as sup:
        accepted = await sup.send(
            "c", "@alice do a long task and ask bob to run a long task too", author="human:you"
        )
        running: dict[str, list[int]] = {}
        with trio.fail_after(SLOW):
            async for entry in sup.follow("c", after=accepted.seq):
                if entry.kind == "status" and "tool running" in entry.text:
                    running[entry.author] = tool_pids(entry.text)
                    if len(running) == 2:
                        break
        result = await sup.stop("c")
        entries = await sup.entries("c", after=accepted.seq)
        rests = sup.status()["channels"]["c"]["rests"]
    assert sorted(t["agent"] for t in result.turns) == ["alice", "bob"]
    assert result.ok, result.error
    assert entries[-1].kind == "notice" and entries[-1].seq == result.notice_seq
    assert [e.kind for e in entries].count("notice") == 1
    assert rests, "hand-offs rest until a human speaks"
    tools = [pid for pids in running.values() for pid in pids]
    assert len(set(tools)) == 4  # each agent's tool and its setsid helper
    for pid in [*tools, *result.killed, *result.swept]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
