"""``corral demo``: the main job, end to end, with the bundled demo agent and no setup."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil
import trio

from ._config import parse_config
from ._store import Entry
from ._supervisor import Supervisor, open_supervisor
from ._tree import TURN_MARKER


def _line(entry: Entry) -> str:
    who = entry.author.replace("agent:", "").replace("human:", "")
    if entry.kind == "message":
        return f"  {who:>8} │ {entry.text}"
    return f"  {who:>8} │ ({entry.kind}) {entry.text}"


async def _turn(
    sup: Supervisor, say: Callable[[str], None], channel: str, text: str, until: Callable[[Entry], bool] | None = None
) -> int:
    """Send ``text`` and print the entries live, until ``until`` or the channel is idle.

    Returns the seq of the last entry printed.
    """
    accepted = await sup.send(channel, text, author="human:you")
    say(f"  {'you':>8} │ {text}")
    seen = accepted.seq
    target: list[int] = []
    async with trio.open_nursery() as nursery:

        async def show() -> None:
            nonlocal seen
            async for entry in sup.follow(channel, after=accepted.seq):
                say(_line(entry))
                seen = entry.seq
                if (until is not None and until(entry)) or (target and seen >= target[0]):
                    nursery.cancel_scope.cancel()

        nursery.start_soon(show)
        if until is None:
            await sup.wait_idle(channel)
            await sup.store.flush()
            rest = await sup.entries(channel, after=accepted.seq)
            target.append(rest[-1].seq if rest else accepted.seq)
            if seen >= target[0]:
                nursery.cancel_scope.cancel()
    return seen


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


async def run_demo(folder: Path, say: Callable[[str], None]) -> bool:
    """Run the demo in ``folder``; return True if every step did what it should."""
    config = parse_config(
        {"store": {"path": "corral.db"}, "agents": {"demo": {"adapter": "demo"}}},
        file="(demo)",
        base=folder,
    )
    channel = "demo"
    ok = True
    say(f"corral demo — a supervisor with the demo agent in {folder}\n")
    async with open_supervisor(config, subreaper=True) as sup:
        say("1. A message; the reply streams into the transcript.")
        await _turn(sup, say, channel, "Hello! Who are you?")
        session, _ = sup.store.session(channel, "demo")
        say(f"     (session id saved: {session})\n")

        say("2. A long task; stop it while its tool runs (a child plus a setsid grandchild).")
        seen = await _turn(
            sup, say, channel, "Please do a long task", until=lambda e: e.kind == "status" and "tool running" in e.text
        )
        result = await sup.stop(channel)
        for entry in await sup.entries(channel, after=seen):
            say(_line(entry))
        left = _alive(result.killed + result.swept)
        say(
            f"     stop returned in {result.elapsed_ms:.1f} ms: killed {result.killed} (the process group), "
            f"swept {result.swept} (escaped the group); alive now: {left or 'none'}"
        )
        leftovers = [p.pid for p in psutil.process_iter(["environ"]) if TURN_MARKER in (p.info["environ"] or {})]
        ok = ok and result.ok and not left and not leftovers and bool(result.swept)
        again = await sup.stop(channel)
        say(f"     a second press is a repeat: repeat={again.repeat}, same notice #{again.notice_seq}\n")

        say("3. A follow-up resumes the same conversation.")
        await _turn(sup, say, channel, "What did I ask you before?")
        resumed, _ = sup.store.session(channel, "demo")
        say(f"     (same session: {resumed == session})\n")
        ok = ok and resumed == session
    say("demo " + ("finished: every step did what it should." if ok else "FAILED: see above."))
    return ok
