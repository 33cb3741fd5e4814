"""``corral demo``: the main job, end to end, with the bundled demo agent and no setup.

The demo judges only its own work: its checks look at the processes of its own turns (by
their ``CORRAL_TURN`` marker, whose value is a turn id of this demo), never at other corral
instances running on the same machine. Each check that fails says which and why. The
temporary folder goes away however the demo ends, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import trio

from .config.settings import parse_config
from .host.supervisor import Supervisor, open_supervisor
from .procs.tree import scan_markers
from .store.store import Entry

#: Exit statuses of an interrupted demo, as a shell reports a death by that signal.
INTERRUPTED_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _line(entry: Entry) -> str:
    who = entry.author.replace("agent:", "").replace("human:", "")
    if entry.kind == "message":
        text = entry.text.replace("\n", f"\n  {'':>8} │ ")
        return f"  {who:>8} │ {text}"
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
            await sup.flush()
            rest = await sup.entries(channel, after=accepted.seq)
            target.append(rest[-1].seq if rest else accepted.seq)
            if seen >= target[0]:
                nursery.cancel_scope.cancel()
    return seen


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


async def leftovers_of(turn_ids: set[str]) -> list[int]:
    """Living processes whose ``CORRAL_TURN`` marker names one of ``turn_ids`` (only these)."""
    found = await trio.to_thread.run_sync(scan_markers, sorted(turn_ids))
    return _alive(sorted({proc.pid for procs in found.values() for proc in procs}))


#: The demo's config: two demo agents in one channel, ``demo`` its default, hand-offs ended
#: after ``max_hops``.
DEMO_CONFIG: dict[str, object] = {
    "store": {"path": "corral.db"},
    "defaults": {"agent": "demo"},
    "agents": {"demo": {"adapter": "demo"}, "reviewer": {"adapter": "demo"}},
    "channels": {"demo": {"agents": ["demo", "reviewer"], "max_hops": 4}},
}
#: The demo channel's hop limit (``DEMO_CONFIG``).
DEMO_MAX_HOPS = 4


@dataclass
class Checks:
    """What the demo verified: each check with why it failed, if it did."""

    failed: list[str] = field(default_factory=list)
    """One line per failed check: its name, then why."""

    def check(self, name: str, passed: bool, why: str) -> None:
        """Record one check; ``why`` says what went wrong when it did not pass."""
        if not passed:
            self.failed.append(f"{name}: {why}")


async def run_demo(folder: Path, say: Callable[[str], None], steps: trio.CancelScope | None = None) -> bool:
    """Run the demo in ``folder``; return True if every step did what it should.

    Cancelling ``steps`` ends the demo early but in order: the supervisor shuts down as on
    SIGTERM (its turns' trees killed and swept), and the demo returns False.
    """
    steps = steps or trio.CancelScope()
    config = parse_config(DEMO_CONFIG, file="(demo)", base=folder)
    channel = "demo"
    checks = Checks()
    say(f"corral demo — a supervisor with the demo agent in {folder}\n")
    async with open_supervisor(config, subreaper=True) as sup:
        sandbox = sup.sandbox.describe()
        with steps:
            say("1. A message; the reply streams into the transcript.")
            await _turn(sup, say, channel, "Hello! Who are you?")
            session = sup.session(channel, "demo")
            say(f"     (session id saved: {session})\n")
            checks.check("the first reply", session is not None, "the demo agent saved no session id")

            say("2. A long task; stop it while its tool runs (a child plus a setsid grandchild).")
            seen = await _turn(
                sup, say, channel, "Please do a long task",
                until=lambda e: e.kind == "status" and "tool running" in e.text,
            )
            result = await sup.stop(channel)
            for entry in await sup.entries(channel, after=seen):
                say(_line(entry))
            left = _alive(result.killed + result.swept)
            say(
                f"     stop returned in {result.elapsed_ms:.1f} ms: killed {result.killed} (the process group), "
                f"swept {result.swept} (escaped the group); alive now: {left or 'none'}"
            )
            checks.check("the stop", result.ok, f"the stop reported an error: {result.error}")
            checks.check("the stop", not left, f"processes it killed or swept are still alive: {left}")
            checks.check("the stop", bool(result.swept), "the tool's setsid grandchild was not swept (swept is empty)")
            stray = await leftovers_of(set(result.stopped_turns))
            checks.check("the stop", not stray, f"processes of the stopped turn are still alive: {stray}")
            again = await sup.stop(channel)
            say(f"     a second press is a repeat: repeat={again.repeat}, same notice #{again.notice_seq}\n")
            checks.check("the second press", again.repeat and again.notice_seq == result.notice_seq,
                         f"not a repeat (repeat={again.repeat}, notice #{again.notice_seq} vs #{result.notice_seq})")

            say("3. A follow-up resumes the same conversation.")
            await _turn(sup, say, channel, "What did I ask you before?")
            resumed = sup.session(channel, "demo")
            say(f"     (same session: {resumed == session})\n")
            checks.check("the follow-up", resumed == session, f"session {resumed} is not the first one, {session}")

            say("4. A plan left unfinished: one nudge from corral, and the agent finishes it.")
            await _turn(sup, say, channel, "Make a plan for the fix")
            nudges = [e for e in await sup.entries(channel, after=0) if e.meta.get("nudge")]
            todos = sup.todos(channel, "demo")
            open_items = [t["content"] for t in todos if t["status"] in ("pending", "in_progress")]
            say(f"     (nudges: {len(nudges)}; unfinished todos now: {open_items or 'none'})\n")
            checks.check("the nudge", len(nudges) == 1, f"{len(nudges)} nudges were sent, not 1")
            checks.check(
                "the nudge", not open_items and bool(todos), f"the plan is not complete: {open_items or 'no plan'}"
            )

            await _hand_offs(sup, say, channel, checks)

            turns = {e.turn for e in await sup.entries(channel, after=0) if e.turn}
            stray = await leftovers_of(turns)
            checks.check("the end", not stray, f"processes of the demo's turns are still alive: {stray}")
    if steps.cancelled_caught:
        return False
    if checks.failed:
        say("demo FAILED:")
        for failure in checks.failed:
            say(f"  - {failure}")
        return False
    say(verdict(sandbox))
    return True


def verdict(sandbox: Mapping[str, object]) -> str:
    """The demo's last line when every step passed: with the sandbox's state (``describe()``),
    a warning when its turns ran without one: said where the eye lands, not only among the
    log lines at the start."""
    if sandbox.get("state") != "on":
        return f"demo finished: every step did what it should — but WARNING: {sandbox.get('summary')}."
    return f"demo finished: every step did what it should ({sandbox.get('summary')})."


async def _hand_offs(sup: Supervisor, say: Callable[[str], None], channel: str, checks: Checks) -> None:
    """Steps 5-7: a hand-off, a ping-pong the hop limit ends, a stop in the middle of a chain."""
    say("5. A hand-off: the demo agent asks the reviewer (an @mention corral routes to it).")
    await _turn(sup, say, channel, "@demo write the fix, then ask reviewer to review it")
    reviews = [e for e in await sup.entries(channel, after=0) if e.author == "agent:reviewer" and e.kind == "message"]
    say("")
    checks.check("the hand-off", any("Reviewed demo's change" in e.text for e in reviews),
                 f"the reviewer never answered the hand-off: {[e.text for e in reviews]}")

    say(f"6. A ping-pong between the two agents: the hop limit (max_hops = {DEMO_MAX_HOPS}) ends it.")
    await _turn(sup, say, channel, "@demo play ping-pong with reviewer")
    ended = [e for e in await sup.entries(channel, after=0) if e.kind == "status" and "chain stopped at" in e.text]
    say("")
    checks.check("the hop limit", bool(ended) and f"stopped at {DEMO_MAX_HOPS} hops" in ended[-1].text,
                 f"no 'chain stopped at {DEMO_MAX_HOPS} hops' status entry: {[e.text for e in ended]}")

    say("7. A stop in the middle of a hand-off chain: both agents run a tool; one press stops them both.")
    running: set[str] = set()

    def both_running(entry: Entry) -> bool:
        if entry.kind == "status" and "tool running" in entry.text:
            running.add(entry.author)
        return len(running) == 2

    seen = await _turn(sup, say, channel, "@demo do a long task and ask reviewer to run a long task too",
                       until=both_running)
    result = await sup.stop(channel)
    after = await sup.entries(channel, after=seen)
    for entry in after:
        say(_line(entry))
    agents = sorted(t["agent"] for t in result.turns)
    left = _alive(result.killed + result.swept)
    say(f"     one stop, {len(result.turns)} turns: {', '.join(agents)}; killed {len(result.killed)},"
        f" swept {len(result.swept)} in {result.elapsed_ms:.1f} ms; alive now: {left or 'none'}")
    rests = sup.status()["channels"][channel]["rests"]
    say(f"     hand-offs now rest until a human speaks in the channel: {rests}\n")
    checks.check("the channel-wide stop", result.ok, f"the stop reported an error: {result.error}")
    checks.check("the channel-wide stop", agents == ["demo", "reviewer"],
                 f"it stopped the turns of {agents}, not of both agents")
    notices = [e for e in after if e.kind == "notice"]
    checks.check("the channel-wide stop", len(notices) == 1 and after[-1] is notices[0],
                 f"not one notice, last: {[(e.kind, e.author) for e in after]}")
    checks.check("the channel-wide stop", not left, f"processes it killed or swept are still alive: {left}")
    stray = await leftovers_of(set(result.stopped_turns))
    checks.check("the channel-wide stop", not stray, f"processes of the stopped turns are still alive: {stray}")
    checks.check("the channel-wide stop", rests, "agent-to-agent routing does not rest after the stop")


async def _until_signalled(folder: Path, say: Callable[[str], None]) -> bool | signal.Signals:
    """The demo, or the signal (SIGINT, SIGTERM) that interrupted it, after an orderly teardown."""
    got: list[signal.Signals] = []
    passed: list[bool] = []
    steps = trio.CancelScope()
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    # Not the nursery: the supervisor must shut down in order (cancelling it
                    # from outside mid-turn is not a clean shutdown).
                    got.append(signal.Signals(signum))
                    steps.cancel()
                    return

        async def demo() -> None:
            passed.append(await run_demo(folder, say, steps))
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        nursery.start_soon(demo)
    return got[0] if got else passed[0]


def demo_main(keep: bool, say: Callable[[str], None]) -> int:
    """``corral demo``: run it in a temporary folder, removed at the end (kept with ``keep``);
    return the exit status: 0 passed, 1 a check failed, 130/143 interrupted by SIGINT/SIGTERM."""
    folder = Path(tempfile.mkdtemp(prefix="corral-demo-"))
    try:
        outcome = trio.run(_until_signalled, folder, say)
    finally:
        if keep:
            say(f"(files kept in {folder})")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    if isinstance(outcome, signal.Signals):
        say(f"demo interrupted by {outcome.name}" + ("" if keep else "; its temporary folder was removed"))
        return INTERRUPTED_STATUS[outcome]
    return 0 if outcome else 1
