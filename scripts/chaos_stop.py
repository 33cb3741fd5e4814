#!/usr/bin/env python
"""Randomized stop trials against one real ``corral run`` daemon; exit 1 on any violation.

Run it as ``.venv/bin/python scripts/chaos_stop.py`` (``--trials N``, default 1000;
``--quick`` for 50; ``--seed S`` to replay a run). Several trials run at once, each on fresh
channels of the same daemon (restarted only if it dies, which is itself a violation).

Each trial sends a message (``long 30``: the demo agent's tool with a setsid grandchild, or a
short reply), then stops the channel at a random moment: right after the send returns
(usually before the spawn), after a random 0-300 ms, after a chosen entry kind appears, or
after the reply is complete. Sometimes the stop is repeated (after it returned, or as a
second concurrent call), sometimes a follow-up message goes right after the stop, sometimes
a second channel runs a turn at the same time. Then it checks the stop contract:

* no entry of the stopped turn after its notice;
* exactly one notice per non-repeat stop (and a repeat names that notice);
* no process of the trial alive: none of the stopped turn when the stop returned, none of
  any of the trial's turns at its end (``CORRAL_TURN`` marker, or a cwd in the channel's
  working folder);
* the message sent before the stop never ran after it (no agent entry with a generation
  older than the stop's and a seq after the notice);
* the follow-up ran (an agent message after it, under the stop's generation);
* the other channel was untouched (an agent message, no notice, no error).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import trio

from _bench import MARKER, Daemon, Found, kill_by_pid, marker_processes, short_tmp, sweep_leftovers

from supervisor._turn import channel_slug

#: Trials running at once (on different channels).
CONCURRENCY = 8
#: Longest a trial may wait for anything (a follow-up turn, an entry, idleness).
WAIT_S = 60.0

LONG_KINDS = ["status:thinking", "todos", "tool", "status:tool running"]
SHORT_KINDS = ["status:thinking", "message"]


# ---------------------------------------------------------------- the API, async


class API:
    """The control API over the Unix socket, for many concurrent requests from one Trio loop."""

    def __init__(self, socket: Path) -> None:
        self.http = httpx.AsyncClient(
            # The limits go on the transport: a client's own limits do not apply to a transport passed in.
            transport=httpx.AsyncHTTPTransport(uds=str(socket), limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)),
            base_url="http://corral", timeout=WAIT_S + 30,
        )

    async def aclose(self) -> None:
        """Close every connection."""
        await self.http.aclose()

    async def send(self, channel: str, text: str) -> dict[str, Any]:
        """POST a message; the accepted seq and generation."""
        r = await self.http.post(f"/v1/channels/{quote(channel, safe='')}/messages", json={"text": text})
        if r.status_code != 202:
            raise RuntimeError(f"send to {channel}: HTTP {r.status_code} {r.text[:200]}")
        return r.json()

    async def stop(self, channel: str) -> dict[str, Any]:
        """POST a stop; the stop result (with the HTTP status)."""
        r = await self.http.post(f"/v1/channels/{quote(channel, safe='')}/stop")
        body = r.json()
        body["http_status"] = r.status_code
        return body

    async def wait(self, channel: str) -> bool:
        """True once the channel is idle (False after WAIT_S)."""
        r = await self.http.post(f"/v1/channels/{quote(channel, safe='')}/wait", params={"timeout": WAIT_S})
        return bool(r.json().get("idle"))

    async def entries(self, channel: str) -> list[dict[str, Any]]:
        """Every committed entry of the channel."""
        r = await self.http.get(f"/v1/channels/{quote(channel, safe='')}/entries")
        r.raise_for_status()
        return r.json()["entries"]

    async def wait_for(self, channel: str, kind: str, got: trio.Event) -> None:
        """Follow the channel until an agent entry of ``kind`` (``kind:text-prefix``) appears."""
        kind, _, prefix = kind.partition(":")
        async with self.http.stream("GET", f"/v1/channels/{quote(channel, safe='')}/events") as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                entry = json.loads(line[6:])
                if entry["author"].startswith("agent:") and entry["kind"] == kind and entry["text"].startswith(prefix):
                    got.set()
                    return


# ---------------------------------------------------------------- one trial


@dataclass
class Trial:
    """What a trial did and what it found."""

    index: int
    long: bool
    moment: str
    """now | delay | entry:KIND | done"""
    delay: float
    repeat: str | None
    """None | after | concurrent"""
    follow_up: bool
    other: bool
    violations: list[str] = field(default_factory=list)
    stop_ms: float = 0.0
    ended_turn: bool = False
    """The stop ended a turn (preparing or running), not an idle channel."""
    killed: int = 0
    swept: int = 0

    def describe(self) -> str:
        """The trial's choices, for a violation report."""
        moment = f"delay {self.delay * 1000:.0f} ms" if self.moment == "delay" else self.moment
        return (
            f"trial {self.index}: {'long 30' if self.long else 'short'}, stop at {moment}, repeat={self.repeat}, "
            f"follow-up={self.follow_up}, other channel={self.other}"
        )


def choose(index: int, rng: random.Random) -> Trial:
    """The trial's random choices."""
    long = rng.random() < 0.5
    moment = rng.choice(["now", "delay", "delay", "entry", "entry"] + ([] if long else ["done"]))
    if moment == "entry":
        moment = "entry:" + rng.choice(LONG_KINDS if long else SHORT_KINDS)
    return Trial(
        index=index, long=long, moment=moment, delay=rng.uniform(0.0, 0.3),
        repeat=rng.choice([None, None, None, "after", "concurrent"]),
        follow_up=rng.random() < 0.5, other=rng.random() < 0.3,
    )


class Runner:
    """Runs the trials against one daemon, restarting it only if it dies."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.daemon = Daemon(folder)
        self.api = API(self.daemon.socket)
        self.home = str(folder)
        self.work = folder / "corral.d" / "work" / "demo"
        self.restarts = 0
        self._restarting = trio.Lock()

    def cwd_of(self, channel: str) -> str:
        """The channel's working folder (every process of its turns runs there)."""
        return str(self.work / channel_slug(channel))

    async def ensure_daemon(self, trial: Trial) -> None:
        """If the daemon died, say so in the trial and start it again."""
        async with self._restarting:
            if self.daemon.alive():
                return
            trial.violations.append(f"the daemon died (status {self.daemon.proc.returncode}); see {self.daemon.log_path}")
            await self.api.aclose()
            self.daemon.stop()
            self.daemon = await trio.to_thread.run_sync(Daemon, self.folder)
            self.api = API(self.daemon.socket)
            self.restarts += 1

    async def run(self, trial: Trial) -> None:
        """Run one trial; its violations end up in ``trial.violations``."""
        try:
            await self._run(trial)
        except Exception as exc:  # noqa: BLE001 - a harness failure is reported like a violation
            leaves = list(_leaves(exc))
            trial.violations.append("the trial failed: " + "; ".join(f"{type(e).__name__}: {e}" for e in leaves))
            await self.ensure_daemon(trial)

    async def _run(self, trial: Trial) -> None:
        api, v = self.api, trial.violations
        channel, other = f"c{trial.index}", f"c{trial.index}-other"
        text = "long 30" if trial.long else f"hello {trial.index}"
        got = trio.Event()
        watch, watch_idle = trio.CancelScope(), trio.CancelScope()
        waited_for: str | None = None

        async def watch_entries() -> None:
            with watch:
                await api.wait_for(channel, trial.moment[6:], got)

        async with trio.open_nursery() as nursery:
            if trial.moment.startswith("entry:"):
                nursery.start_soon(watch_entries)
            if trial.other:
                nursery.start_soon(api.send, other, f"other {trial.index}")
            accepted = await api.send(channel, text)
            if trial.moment.startswith("entry:"):
                # Only once the message is in: a wait sent before it would find the channel idle.
                async def idle_then_give_up() -> None:
                    with watch_idle:
                        await api.wait(channel)
                        got.set()  # the turn ended without that entry: stop now, and say so below

                nursery.start_soon(idle_then_give_up)
            # The stop moment.
            if trial.moment == "delay":
                await trio.sleep(trial.delay)
            elif trial.moment == "done":
                await api.wait(channel)
            elif trial.moment.startswith("entry:"):
                with trio.move_on_after(WAIT_S):
                    await got.wait()
                watch.cancel()
                watch_idle.cancel()
                if not got.is_set():
                    v.append(f"harness: no {trial.moment[6:]!r} entry within {WAIT_S:g} s")
                    waited_for = None
                else:
                    waited_for = trial.moment[6:]
            t0 = time.perf_counter()
            results: list[dict[str, Any]] = []
            if trial.repeat == "concurrent":
                async with trio.open_nursery() as both:
                    for _ in range(2):
                        both.start_soon(_append, results, api, channel)
            else:
                results.append(await api.stop(channel))
            trial.stop_ms = (time.perf_counter() - t0) * 1000
        # No process of the stopped turn may outlive the stop's return.
        stopped = {t for r in results for t in r.get("stopped_turns", [])}
        trial.ended_turn = bool(stopped)
        trial.killed = sum(len(r.get("killed", [])) for r in results)
        trial.swept = sum(len(r.get("swept", [])) for r in results)
        if stopped:
            alive = await trio.to_thread.run_sync(_turn_processes, self.home, stopped)
            if alive:
                v.append(f"processes of the stopped turn alive when the stop returned: {alive}")
                kill_by_pid(alive, wait=None)
        if trial.repeat == "after":
            results.append(await api.stop(channel))
        follow = await api.send(channel, f"after the stop {trial.index}") if trial.follow_up else None
        for name in (channel, other) if trial.other else (channel,):
            if not await api.wait(name):
                v.append(f"{name} still busy after {WAIT_S:g} s")
        entries = await api.entries(channel)
        if trial.moment.startswith("entry:") and waited_for:
            kind, _, prefix = waited_for.partition(":")
            if not any(e["kind"] == kind and e["text"].startswith(prefix) for e in entries if e["author"].startswith("agent:")):
                v.append(f"the turn ended without a {waited_for!r} entry: {_brief([e for e in entries if e['kind'] in ('error', 'notice')])}")
        self.check_stop(trial, accepted, results, follow, entries)
        turns = {e["turn"] for e in entries if e["turn"]} | stopped
        cwds: tuple[str, ...] = (self.cwd_of(channel),)
        if trial.other:
            other_entries = await api.entries(other)
            turns |= {e["turn"] for e in other_entries if e["turn"]}
            cwds += (self.cwd_of(other),)
            agent = [e for e in other_entries if e["author"].startswith("agent:")]
            if not any(e["kind"] == "message" for e in agent):
                v.append(f"the other channel never got its reply: {_brief(other_entries)}")
            bad = [e for e in other_entries if e["kind"] in ("notice", "error")]
            if bad:
                v.append(f"the other channel was disturbed: {_brief(bad)}")
        alive = await trio.to_thread.run_sync(_turn_processes, self.home, turns, cwds)
        if alive:
            v.append(f"processes of the trial alive at its end: {alive}")
            kill_by_pid(alive, wait=None)

    def check_stop(
        self, trial: Trial, accepted: dict[str, Any], results: list[dict[str, Any]],
        follow: dict[str, Any] | None, entries: list[dict[str, Any]],
    ) -> None:
        """The stop contract, from the stop results and the channel's transcript."""
        v = trial.violations
        for r in results:
            if r.get("http_status") != 200 or not r.get("ok"):
                v.append(f"a stop failed: HTTP {r.get('http_status')}: {r.get('error')}")
        first = [r for r in results if not r.get("repeat")]
        repeats = [r for r in results if r.get("repeat")]
        if len(first) != 1:
            v.append(f"{len(first)} non-repeat stop(s) among {len(results)} (expected exactly 1)")
            return
        stop = first[0]
        notices = [e for e in entries if e["kind"] == "notice"]
        if len(notices) != 1:
            v.append(f"{len(notices)} notice(s) for one stop: {_brief(notices)}")
        notice = next((e for e in notices if e["seq"] == stop.get("notice_seq")), None)
        if notice is None:
            v.append(f"the stop's notice_seq {stop.get('notice_seq')} is not a notice in the channel")
            return
        for r in repeats:
            if r.get("notice_seq") != notice["seq"]:
                v.append(f"a repeat stop names notice {r.get('notice_seq')}, not {notice['seq']}")
        generation = stop["generation"]
        if notice["generation"] != generation or generation <= accepted["generation"]:
            v.append(f"generations: message {accepted['generation']}, stop {generation}, notice {notice['generation']}")
        if notice["turn"] is not None:
            late = [e for e in entries if e["turn"] == notice["turn"] and e["seq"] > notice["seq"]]
            if late:
                v.append(f"entries of the stopped turn after its notice: {_brief(late)}")
        if stop.get("stopped_turns") and notice["turn"] not in stop["stopped_turns"]:
            v.append(f"the notice names turn {notice['turn']}, the stop stopped {stop['stopped_turns']}")
        old = [e for e in entries if e["author"].startswith("agent:") and e["generation"] < generation and e["seq"] > notice["seq"]]
        if old:
            v.append(f"the message sent before the stop ran after it: {_brief(old)}")
        if follow is not None:
            if follow["generation"] != generation:
                v.append(f"the follow-up got generation {follow['generation']}, the stop made {generation}")
            replies = [
                e for e in entries
                if e["author"].startswith("agent:") and e["kind"] == "message" and e["seq"] > follow["seq"]
                and e["generation"] == follow["generation"]
            ]
            if not replies:
                after = [e for e in entries if e["seq"] > follow["seq"]]
                v.append(f"the follow-up never got a reply; after it: {_brief(after)}")


def _turn_processes(home: str, turns: set[str], cwds: tuple[str, ...] = ()) -> list[Found]:
    """Living processes of ``turns`` or with a cwd in ``cwds`` (HOME under ``home``): ``(pid, turn, cwd)``."""
    return marker_processes(home, turns, cwds=cwds, detail="cwd")


def _leaves(exc: BaseException) -> Any:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


async def _append(results: list[dict[str, Any]], api: API, channel: str) -> None:
    results.append(await api.stop(channel))


def _brief(entries: list[dict[str, Any]]) -> str:
    return "; ".join(f"#{e['seq']} {e['author']} {e['kind']} g{e['generation']} {e['turn']} {e['text'][:60]!r}" for e in entries[:6])


# ---------------------------------------------------------------- main


async def run_all(runner: Runner, trials: list[Trial], concurrency: int) -> None:
    """Run every trial, ``concurrency`` at a time; print progress every 10 %."""
    pending = iter(trials)
    done = 0
    started = time.monotonic()

    async def worker() -> None:
        nonlocal done
        for trial in pending:
            await runner.run(trial)
            done += 1
            if done % max(1, len(trials) // 10) == 0:
                bad = sum(1 for t in trials if t.violations)
                print(f"  {done:>5}/{len(trials)} trials, {time.monotonic() - started:6.1f} s, {bad} with violations", flush=True)

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    await runner.api.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000, help="how many trials (default 1000)")
    parser.add_argument("--quick", action="store_true", help="50 trials")
    parser.add_argument("--seed", type=int, default=None, help="replay a run with this seed")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help=f"trials at once (default {CONCURRENCY})")
    args = parser.parse_args()
    count = 50 if args.quick else args.trials
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    trials = [choose(i, rng) for i in range(count)]
    root = short_tmp("cc-")
    print(f"chaos stop: {count} trials, {args.concurrency} at a time, seed {seed}, one `corral run` daemon in {root}")
    started = time.monotonic()
    failures: list[str] = []
    runner: Runner | None = None
    try:
        runner = Runner(root)
        trio.run(run_all, runner, trials, args.concurrency)
    finally:
        if runner is not None:
            code = runner.daemon.stop()
            if code != 0:
                failures.append(f"the daemon exited with status {code} at the end")
        left = sweep_leftovers(str(root), (MARKER,), detail="cwd")
        if left:
            failures.append(f"{len(left)} turn process(es) alive after the daemon stopped: {left[:5]}")
    elapsed = time.monotonic() - started
    bad = [t for t in trials if t.violations]
    violations = sum(len(t.violations) for t in trials) + len(failures)
    stops = sorted(t.stop_ms for t in trials if t.stop_ms)
    kinds: dict[str, int] = {}
    for t in trials:
        key = f"{'long' if t.long else 'short'}/{t.moment.split(':')[0]}"
        kinds[key] = kinds.get(key, 0) + 1
    print(f"\ntrials: {count} in {elapsed:.1f} s ({count / elapsed:.1f}/s); daemon restarts: {runner.restarts if runner else '?'}")
    print(f"mix: {', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}; repeats "
          f"{sum(1 for t in trials if t.repeat)}, follow-ups {sum(1 for t in trials if t.follow_up)}, "
          f"second channel {sum(1 for t in trials if t.other)}")
    print(f"stops that ended a turn: {sum(1 for t in trials if t.ended_turn)} (killed a process: "
          f"{sum(1 for t in trials if t.killed)}, swept a setsid grandchild: {sum(1 for t in trials if t.swept)}); "
          f"the rest stopped an idle channel")
    if stops:
        print(f"stop call (client side): median {stops[len(stops) // 2]:.1f} ms, p95 {stops[int(len(stops) * 0.95)]:.1f} ms, max {stops[-1]:.1f} ms")
    print(f"processes left after the daemon stopped: {len(left)}")
    print(f"violations: {violations} (in {len(bad)} trial(s))")
    by_kind: dict[str, int] = {}
    for t in bad:
        for line in t.violations:
            key = line.split(":")[0][:70]
            by_kind[key] = by_kind.get(key, 0) + 1
    for key, n in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {n:>4} x {key}")
    for t in bad[:5]:
        print(f"  {t.describe()}")
        for line in t.violations[:4]:
            print(f"    - {line}")
    for line in failures:
        print(f"  - {line}")
    if violations:
        print(f"(replay with --seed {seed}{' --quick' if args.quick else f' --trials {count}'}; daemon log kept in {root}/daemon.log)")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
