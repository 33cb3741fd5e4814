"""How a prompt reaches an agent: never as options, intact on stdin, never after a stop.

Each test runs a real supervisor with a generic script agent that reports what it got.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from conftest import make_config, script_agent

from supervisor import open_supervisor
from supervisor.host.supervisor import MAX_MESSAGE_BYTES, STOP_NOTICE, Supervisor
from supervisor.procs.tree import spawn
from supervisor.testing import Hooks

#: Generous bound for real processes on a loaded machine.
SLOW = 30

#: Parses its argv with a real option parser and reports both the raw argv and the parse.
ARGV_AGENT = r"""
import argparse, json, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("-S", action="store_true")
parser.add_argument("words", nargs="*")
args = parser.parse_args()
if args.S:
    open("touched", "w").close()
print(json.dumps({"type": "result", "text": json.dumps({"argv": sys.argv[1:], "S": args.S, "words": args.words})}))
"""

#: Reads its whole stdin and reports its size, its hash, a head of it, and its argv.
STDIN_AGENT = r"""
import hashlib, json, sys
data = sys.stdin.buffer.read()
report = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "head": data[:200].decode("utf-8", "replace"),
          "argv": sys.argv[1:]}
print(json.dumps({"type": "result", "text": json.dumps(report)}))
"""


async def final_answer(sup: Supervisor, channel: str) -> dict[str, Any]:
    """Wait for the channel to go idle; the JSON its agent's result carried."""
    assert await sup.wait_idle(channel, timeout=SLOW)
    answers = [e for e in await sup.entries(channel) if e.author.startswith("agent:") and e.kind == "message"]
    assert len(answers) == 1, [(e.kind, e.text) for e in await sup.entries(channel)]
    report: dict[str, Any] = json.loads(answers[0].text)
    return report


# ---------------------------------------------------------------- argv


async def test_generic_prompt_that_looks_like_options_is_never_parsed_as_options(short_tmp: Path) -> None:
    work = short_tmp / "work"
    work.mkdir()
    config = make_config(short_tmp, {"argv": script_agent(ARGV_AGENT, cwd=str(work))})
    async with open_supervisor(config) as sup:
        for channel, text in (("a", "-S touch x"), ("b", "-S"), ("c", "--help")):
            await sup.send(channel, text)
            report = await final_answer(sup, channel)
            # "--" ends the options: the text is one positional argument, verbatim.
            assert report["argv"] == ["--", text]
            assert report["S"] is False and report["words"] == [text]
    assert not (work / "touched").exists()


# ---------------------------------------------------------------- stdin


async def test_generic_prompt_on_stdin_arrives_intact_and_not_in_argv(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"reader": script_agent(STDIN_AGENT, prompt="stdin")})
    small = "héllo — 世界 🎉\nsecond line\twith a tab, -S and --help"
    # A maximal message (1 MiB in UTF-8), mixed ASCII and multi-byte characters: far more
    # than a pipe holds, so the write must wait for the agent to read.
    unit = "abc 世界 🎉\n"
    big = unit * (MAX_MESSAGE_BYTES // len(unit.encode()))
    big += "x" * (MAX_MESSAGE_BYTES - len(big.encode()))
    assert len(big.encode()) == MAX_MESSAGE_BYTES
    async with open_supervisor(config) as sup:
        for channel, text in (("small", small), ("big", big)):
            await sup.send(channel, text)
            report = await final_answer(sup, channel)
            data = text.encode()
            assert report["bytes"] == len(data)
            assert report["sha256"] == hashlib.sha256(data).hexdigest()
            assert report["head"] == data[:200].decode(errors="replace")
            assert report["argv"] == [], "a prompt on stdin is not in argv"


class RecordingStdin:
    """Wraps a process's stdin pipe and records every write attempted on it."""

    def __init__(self, inner: trio.abc.SendStream) -> None:
        self.inner = inner
        self.written: list[bytes] = []

    async def send_all(self, data: bytes) -> None:
        self.written.append(bytes(data))  # recorded before any checkpoint: an attempt counts
        await self.inner.send_all(data)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class ParkAfterSpawn:
    """A spawner that starts the real process, then parks (shielded) until released."""

    arrived: trio.Event = field(default_factory=trio.Event)
    go: trio.Event = field(default_factory=trio.Event)
    stdins: list[RecordingStdin] = field(default_factory=list)

    async def __call__(self, argv: tuple[str, ...], **kw: Any) -> trio.Process:
        process = await spawn(argv, **kw)
        assert process.stdin is not None
        recorder = RecordingStdin(process.stdin)
        process.stdin = recorder  # type: ignore[assignment]
        self.stdins.append(recorder)
        self.arrived.set()
        # Shielded: the stop cancels the turn's scope, but the spawn has happened and the
        # turn must go on to its stdin write (the point of no return) to be tested there.
        with trio.CancelScope(shield=True), trio.fail_after(SLOW):
            await self.go.wait()
        return process


async def test_a_stop_between_spawn_and_stdin_write_means_the_prompt_is_never_written(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"reader": script_agent(STDIN_AGENT, prompt="stdin")})
    parked = ParkAfterSpawn()
    async with open_supervisor(config, hooks=Hooks(spawn=parked)) as sup:
        await sup.send("c", "the secret prompt")
        with trio.fail_after(SLOW):
            await parked.arrived.wait()
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def stop() -> None:
                results.append(await sup.stop("c"))

            nursery.start_soon(stop)
            # The stop has moved the generation and waits for the turn's teardown.
            await trio.testing.wait_all_tasks_blocked()
            assert sup._ledger.is_stale("c", sup.status()["channels"]["c"]["turn"]["id"])
            parked.go.set()
        [result] = results
        assert result.ok and len(result.stopped_turns) == 1
        assert parked.stdins and parked.stdins[0].written == [], "the prompt was written after the stop"
        entries = await sup.entries("c")
        assert [e.kind for e in entries] == ["message", "notice"] and entries[-1].text == STOP_NOTICE
        assert not any(e.author.startswith("agent:") for e in entries)


async def test_the_stdin_write_runs_when_nothing_stops_the_turn(short_tmp: Path) -> None:
    """The same parked spawn without a stop: the prompt is written once, whole (the
    counterpart that shows the test above can see a write)."""
    config = make_config(short_tmp, {"reader": script_agent(STDIN_AGENT, prompt="stdin")})
    parked = ParkAfterSpawn()
    parked.go.set()
    async with open_supervisor(config, hooks=Hooks(spawn=parked)) as sup:
        await sup.send("c", "the prompt")
        report = await final_answer(sup, "c")
        assert report["head"] == "the prompt"
        assert b"".join(parked.stdins[0].written) == b"the prompt"

