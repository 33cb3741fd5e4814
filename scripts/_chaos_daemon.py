#!/usr/bin/env python
"""``corral`` with a trace of the stop's decisive moments, and optionally one seeded bug.

Usage: ``python scripts/_chaos_daemon.py --trace FILE [--seed-bug NAME] run -c corral.toml``
(the arguments after the options go to ``corral``). chaos_stop.py starts its daemon this way.

The trace is one JSON object per line, ``t`` being ``time.monotonic()`` (the clock the chaos
agent stamps its start with, so the two can be compared):

* ``stop`` — the ledger decided a stop: channel, the turn it stopped (``turns``: every one,
  with several agents), repeat or not;
* ``accept`` — the ledger queued a message: channel, agent, hops, whether corral routed it
  from an agent, and whether the channel rested just before (a routed message then is a
  violation of contract line 12);
* ``preparing`` — a turn reached its point of no return (channel, turn);
* ``spawn`` — the turn passed it and its process is being spawned (turn);
* ``register`` — a process was registered (turn, pid, whether the turn was already stale, whether
  the leader had exited, whether it is sandboxed; for a stale sandboxed one, bwrap's ``init``, pid 1
  of its namespace, and whether that was alive);
* ``registered`` — a stale turn's registration is over: the registry's kill or freeze is sent;
* ``signal`` — a signal sent, once sent: to a process group (``pgid``, sig: ``killpg``, or a
  ``cgroup.kill`` traced as one SIGKILL of each member) or to one process by pid (``pid``, sig:
  ``kill``, as the sweep, the interrupt of a cgroup's other members and Trio do);
* ``release`` — a turn's process tree was released after its teardown (turn, pid, the leader's
  ``returncode``: negative for the signal that ended it, else it exited by itself).

It also widens the windows a stop must hit: the preparing phase lasts 0-50 ms and a spawn
0-30 ms longer, both shielded as the work they stand for is (writing the agent's files in a
thread, the spawn itself: neither can be cancelled). Production code has the same phases, only
shorter.

A seeded bug puts back, in this process only, a mistake the stop contract forbids; chaos_stop.py
must then report violations. See :data:`SEEDED_BUGS`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

from supervisor.core import account as _account
from supervisor.core import ledger as _ledger
from supervisor.host import stopper as _stopper
from supervisor.host import supervisor as _supervisor
from supervisor.procs import cgroup as _cgroup
from supervisor.procs import registry as _registry
from supervisor.procs import tree as _tree
from supervisor.testing import Hooks
from supervisor.turns import process as _turn

#: The supervisors started in this process (one: the daemon's), for the seeded bugs.
SUPERVISORS: list[_supervisor.Supervisor] = []

#: Every patch made in this process: (the object patched, the name, what it was set to).
PATCHES: list[tuple[object, str, object]] = []


def patch(owner: object, name: str, new: object) -> None:
    """Set ``owner.name`` to ``new``; raise if ``owner`` has no such name yet.

    A bare assignment to a name that was renamed or moved makes a new attribute nobody reads:
    the trace goes quiet or the seeded bug is never seeded, and the chaos run passes while it
    no longer tests what it says. So every patch of this module goes through here (a test
    applies them all and checks that each one landed: ``tests/test_chaos_patches.py``)."""
    if not hasattr(owner, name):
        where = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
        raise AttributeError(f"chaos daemon: {where} has no {name!r} to patch (renamed or moved?): "
                             "update scripts/_chaos_daemon.py")
    setattr(owner, name, new)
    PATCHES.append((owner, name, new))

_trace_fd: int | None = None


def trace(event: str, **fields: Any) -> None:
    """Append one event (one write, so concurrent lines never interleave)."""
    if _trace_fd is not None:
        os.write(_trace_fd, (json.dumps({"ev": event, "t": time.monotonic(), **fields}) + "\n").encode())


# ---------------------------------------------------------------- the trace


def _exited(pid: int) -> bool:
    """Has the process already exited (a zombie, not reaped here)? The widened spawn window
    lets a quick agent finish before it is registered: then there is nothing left to kill."""
    stat = _tree.read_stat(pid)
    return stat is None or stat.state == "Z"


def _ns_pid(pid: int) -> int | None:
    """The pid of ``pid`` in its own (innermost) pid namespace, from ``NSpid``; None if gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def _namespace_init(tree: _tree.ProcessTree, turn: str) -> dict[str, Any]:
    """A sandboxed tree's bwrap init (pid 1 of the turn's pid namespace), as this process's pid,
    and whether it is alive: ``{"init": PID, "init_alive": bool}``, or ``{}`` if none is seen.

    The monitor (the leader) exits with its program's status the moment its init reports it,
    before the init itself (which stays for whatever the program left): a registration can
    find the leader gone and the init alive. The init is the leader's child while the leader
    runs; after, the one of the turn's processes (its cgroup's, else its marker's) that is
    pid 1 in its namespace. The kernel ends every process of a pid namespace when its init
    dies, so a kill of the init is a kill of the whole sandbox.
    """
    candidates = _tree.child_pids(tree.pid)
    if not candidates and tree.cgroup is not None:
        candidates = tree.cgroup.procs()
    if not candidates:
        candidates = [p.pid for p in _tree.scan_markers([turn]).get(turn, set())]
    for pid in candidates:
        if pid != tree.pid and _ns_pid(pid) == 1:
            return {"init": pid, "init_alive": not _exited(pid)}
    return {}


def install_trace(path: str) -> None:
    """Trace the ledger's stops, the point of no return, spawns and registrations."""
    global _trace_fd
    _trace_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    rng = random.Random()

    ledger_stop = _ledger.StopLedger.stop

    def stop(self: _ledger.StopLedger, channel: str) -> _ledger.StopDecision:
        decision = ledger_stop(self, channel)
        trace("stop", channel=channel, turn=decision.stopped_turn, repeat=decision.repeat,
              generation=decision.generation, dropped=len(decision.dropped),
              turns=[turn for _, turn in decision.stopped_turns])
        return decision

    patch(_ledger.StopLedger, "stop", stop)

    ledger_accept = _ledger.StopLedger.accept

    def accept(self: _ledger.StopLedger, channel: str, agent: str, message_id: int, **kw: Any) -> _ledger.QueuedMessage:
        trace("accept", channel=channel, agent=agent, seq=message_id, hops=kw.get("hops", 0),
              routed=kw.get("routed", False), rests=self.rests(channel))
        return ledger_accept(self, channel, agent, message_id, **kw)

    patch(_ledger.StopLedger, "accept", accept)

    async def preparing(channel: str, turn_id: str) -> None:
        trace("preparing", channel=channel, turn=turn_id)
        # Shielded like the preparing work it stands for (the thread writing the agent's
        # files cannot be cancelled): a stop landing now is caught by the point of no return.
        with trio.CancelScope(shield=True):
            await trio.sleep(rng.uniform(0.0, 0.05))

    async def spawn(argv: Any, **kwargs: Any) -> trio.Process:
        trace("spawn", turn=kwargs["env"].get(_tree.TURN_MARKER))
        # A slow spawn, which cannot be cancelled once begun: a stop landing meanwhile finds no
        # process to kill, and the registration that follows must kill it.
        with trio.CancelScope(shield=True):
            process = await _tree.spawn(argv, **kwargs)
            await trio.sleep(rng.uniform(0.0, 0.03))
        return process

    supervisor_init = _supervisor.Supervisor.__init__

    def init(
        self: _supervisor.Supervisor, config: Any, store: Any, nursery: trio.Nursery, hooks: Any = None, **kw: Any
    ) -> None:
        supervisor_init(self, config, store, nursery, hooks or Hooks(preparing=preparing, spawn=spawn), **kw)
        SUPERVISORS.append(self)

    patch(_supervisor.Supervisor, "__init__", init)

    signal_group = _tree.signal_group

    def traced_signal_group(pgid: int, sig: int) -> bool:
        # Traced once sent: a process may run on (another core) until the kernel delivers it.
        sent = signal_group(pgid, sig)
        trace("signal", pgid=pgid, sig=int(sig))
        return sent

    patch(_tree, "signal_group", traced_signal_group)
    # The freeze of a registration while its stop is stored (the registry's own import).
    patch(_registry, "signal_group", traced_signal_group)

    os_kill = os.kill

    def traced_kill(pid: int, sig: int) -> None:
        # Kills by pid too (the sweep's kill_exact, a cgroup's other members, Trio's own
        # Process.kill): every module calls os.kill through the module, so this sees them all.
        os_kill(pid, sig)
        trace("signal", pid=pid, sig=int(sig))

    patch(os, "kill", traced_kill)

    cgroup_kill = _cgroup.TurnCgroup.kill

    def traced_cgroup_kill(self: _cgroup.TurnCgroup) -> None:
        # cgroup.kill SIGKILLs every member (the kernel does it): traced as one SIGKILL each,
        # the leader's pid being its group's id.
        members = self.procs()
        cgroup_kill(self)
        for pid in members:
            trace("signal", pgid=pid, sig=int(signal.SIGKILL))

    patch(_cgroup.TurnCgroup, "kill", traced_cgroup_kill)

    register = _registry.ProcessRegistry.register

    def traced_register(self: _registry.ProcessRegistry, channel: str, turn_id: str, tree: _tree.ProcessTree) -> bool:
        stale = self._ledger.is_stale(channel, turn_id)
        trace("register", channel=channel, turn=turn_id, pid=tree.pid, stale=stale, exited=_exited(tree.pid),
              sandboxed=tree.sandboxed, **(_namespace_init(tree, turn_id) if stale and tree.sandboxed else {}))
        kept = register(self, channel, turn_id, tree)
        if stale:
            # Once the registry's kill (or freeze) is sent: what ran before this is not "after".
            trace("registered", turn=turn_id, pid=tree.pid, kept=kept)
        return kept

    patch(_registry.ProcessRegistry, "register", traced_register)

    release = _registry.ProcessRegistry.release

    def traced_release(self: _registry.ProcessRegistry, channel: str, turn_id: str, tree: _tree.ProcessTree) -> bool:
        # After the sweep, which reaps the leader: how it ended (-9: a SIGKILL; >= 0: by itself).
        trace("release", channel=channel, turn=turn_id, pid=tree.pid, returncode=tree.process.returncode)
        return release(self, channel, turn_id, tree)

    patch(_registry.ProcessRegistry, "release", traced_release)


# ---------------------------------------------------------------- seeded bugs


def _no_point_of_no_return() -> None:
    may_start = _ledger.StopLedger.may_start

    def always(self: _ledger.StopLedger, channel: str, turn_id: str) -> bool:
        if not may_start(self, channel, turn_id):
            lane = self._channels[channel].lane_of(turn_id)
            turn = lane.turn if lane is not None else None
            if turn is not None:
                turn.phase = _ledger.Phase.STARTED
        return True

    patch(_ledger.StopLedger, "may_start", always)


def _no_late_kill() -> None:
    def register(self: _registry.ProcessRegistry, channel: str, turn_id: str, tree: _tree.ProcessTree) -> bool:
        trace("register", channel=channel, turn=turn_id, pid=tree.pid, stale=self._ledger.is_stale(channel, turn_id),
              exited=_exited(tree.pid))
        self._trees[(channel, turn_id)] = tree
        return True

    patch(_registry.ProcessRegistry, "register", register)


def _todos_kept() -> None:
    patch(_stopper.Stopper, "_cancelled_plans", lambda self, channel: {})


def _keep_everything(self: _turn.Turn, kind: str, text: str, meta: dict[str, Any] | None = None) -> None:
    self._last = self.ports.store.submit_entry(
        self.channel, self.author, kind, text, turn=self.turn_id, generation=self.generation, meta=meta
    )


def _account_ignores_silence() -> None:
    """The turn's account decides as if no stop had silenced the turn."""
    on_event, close_text = _account.TurnAccount.on_event, _account.TurnAccount.close_text

    def loud_event(
        self: _account.TurnAccount, event: Any, *, silenced: bool, now: float | None = None
    ) -> list[_account.Effect]:
        return on_event(self, event, silenced=False, now=now)

    def loud_close(self: _account.TurnAccount, *, silenced: bool) -> list[_account.Effect]:
        return close_text(self, silenced=False)

    patch(_account.TurnAccount, "on_event", loud_event)
    patch(_account.TurnAccount, "close_text", loud_close)


def _output_before_notice() -> None:
    _account_ignores_silence()
    patch(_turn.Turn, "_post", _keep_everything)


def _output_after_notice() -> None:
    _account_ignores_silence()
    post = _turn.Turn._post

    def later(self: _turn.Turn, kind: str, text: str, meta: dict[str, Any] | None = None) -> None:
        if not self._silenced():
            post(self, kind, text, meta)
            return

        async def store_it() -> None:
            with trio.CancelScope(shield=True):
                await self.done.wait()
                stopping = SUPERVISORS[-1]._stopper.stops.get(self.channel)
                if stopping is not None:
                    await stopping.done.wait()  # set once the stop's notice is stored
                _keep_everything(self, kind, text, meta)

        SUPERVISORS[-1]._nursery.start_soon(store_it)

    patch(_turn.Turn, "_post", later)


def _no_marker_scan() -> None:
    async def scan(self: _tree.MarkerScanner, marker: str, *, not_before: float) -> set[_tree.ProcId]:
        return set()

    patch(_tree.MarkerScanner, "scan", scan)


def _rest_forgotten() -> None:
    """A stop forgets to put agent-to-agent routing to rest (the router and the ledger's guard
    then both let another bot's agent message be handed on)."""
    stop = _ledger.StopLedger.stop

    def restless(self: _ledger.StopLedger, channel: str) -> _ledger.StopDecision:
        decision = stop(self, channel)
        self._channels[channel].routing_rests = False
        return decision

    patch(_ledger.StopLedger, "stop", restless)


#: Each seeded bug: what it reintroduces.
SEEDED_BUGS: dict[str, tuple[Callable[[], None], str]] = {
    "no-point-of-no-return": (_no_point_of_no_return, "the generation check before the spawn removed"),
    "no-late-kill": (_no_late_kill, "a process registered for a stopped turn is not killed"),
    "todos-kept": (_todos_kept, "a stop does not cancel the plan's pending todos"),
    "output-before-notice": (_output_before_notice, "a stopped turn's leftover output is stored (before the notice)"),
    "output-after-notice": (_output_after_notice, "a stopped turn's leftover output is stored after the notice"),
    "no-marker-scan": (_no_marker_scan, "the sweep's environment-marker scan removed"),
    "rest-forgotten": (_rest_forgotten, "a stop does not put agent-to-agent routing to rest (multi-agent trials)"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", required=True, help="append the trace to this file")
    parser.add_argument("--seed-bug", choices=sorted(SEEDED_BUGS), help="reintroduce this bug")
    args, rest = parser.parse_known_args()
    install_trace(args.trace)
    if args.seed_bug:
        SEEDED_BUGS[args.seed_bug][0]()
        print(f"chaos daemon: seeded bug {args.seed_bug}: {SEEDED_BUGS[args.seed_bug][1]}", file=sys.stderr, flush=True)
    from supervisor.cli import main as corral

    sys.argv = ["corral", *rest]
    corral()


if __name__ == "__main__":
    main()
