"""A hypothesis state machine for the stop ledger, checked against an independent model.

The driver's calls (accept, stop, stop_all, take, may_start, keep_process, keep_output,
end_turn, notice_stored, a hand-off routed from a turn's output, and a daemon restart that
restores generations and requeues messages) are interleaved in any order over three
channels, each with two agents (two lanes). The model below is written
from the stop contract (docs/stop-contract.md), not from the ledger's code: it tracks each message's fate
(queued, taken, dropped) and each turn's staleness. Every step checks the ledger's answer
against the model, and every invariant is rechecked for every channel after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from supervisor.core.ledger import EditOutcome, LedgerError, OutputKind, Phase, QueuedMessage, StopDecision, StopLedger
from supervisor.core.router import route as router_route

CHANNELS = ("a", "b", "c")
channels = st.sampled_from(CHANNELS)
AGENTS = ("x", "y")
agents = st.sampled_from(AGENTS)
MAX_HOPS = 3
# Few distinct values: what matters is zero versus some, and hitting the nudge limit.
todo_counts = st.sampled_from((0, 1, 3))
nudge_limits = st.one_of(st.none(), st.integers(min_value=0, max_value=3))


@dataclass
class _Msg:
    channel: str
    agent: str
    human: bool
    nudge: bool
    generation: int
    stops_before: int
    """How many non-repeat stops of its channel happened before it was accepted."""
    fate: str = "queued"  # queued | taken | dropped | replaced (dropped by an interrupt) | taken_back
    hops: int = 0
    routed: bool = False


@dataclass
class _Lane:
    queue: list[int] = field(default_factory=list)
    """Live messages, oldest first."""
    ghosts: list[int] = field(default_factory=list)
    """Dropped messages a restart put back (the store missed their dequeue); never run."""
    turn: str | None = None
    started: bool = False
    nudges_in_row: int = 0
    """Nudges granted since the row began: a human turn began, or a turn that was not a
    nudge ended without one."""


@dataclass
class _Chan:
    generation: int = 0
    lanes: dict[str, _Lane] = field(default_factory=lambda: {a: _Lane() for a in AGENTS})
    ticket_since_stop: bool = True
    """A take returned a ticket since the last stop (vacuously true before any stop)."""
    stops: int = 0
    """Non-repeat stops so far."""
    notices_due: int = 0
    notice_seq: int | None = None
    routing_rests: bool = False

    def waiting(self) -> list[int]:
        """Every lane's ghosts and queue, in acceptance order."""
        return sorted(i for lane in self.lanes.values() for i in lane.ghosts + lane.queue)

    def busy(self) -> bool:
        return any(lane.queue or lane.ghosts or lane.turn is not None for lane in self.lanes.values())

    def first_turn(self) -> str | None:
        return next((lane.turn for lane in self.lanes.values() if lane.turn is not None), None)


class LedgerMachine(RuleBasedStateMachine):
    """Drive a StopLedger and an independent model side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.max_nudges = 2
        self.ledger = StopLedger(max_nudges=self.max_nudges)
        self.chans: dict[str, _Chan] = {name: _Chan() for name in CHANNELS}
        self.msgs: dict[int, _Msg] = {}
        self.turns: list[tuple[str, str]] = []  # every turn ever taken: (channel, turn_id)
        self.turn_agent: dict[str, str] = {}
        self.stale: set[str] = set()  # turns a non-repeat stop (or an interrupt) made stale
        self.stopped: set[str] = set()  # turns a non-repeat stop made stale
        self.interrupted: set[str] = set()  # turns an interrupt made stale
        self.turn_message: dict[str, int] = {}
        self.next_id = 0

    @initialize(max_nudges=st.integers(min_value=0, max_value=3))
    def make_ledger(self, max_nudges: int) -> None:
        self.max_nudges = max_nudges
        self.ledger = StopLedger(max_nudges=max_nudges)

    # ------------------------------------------------------------ helpers

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _current(self, channel: str, turn_id: str) -> bool:
        """The model's answer to "may this turn still act?"."""
        agent = self.turn_agent.get(turn_id)
        return agent is not None and self.chans[channel].lanes[agent].turn == turn_id and turn_id not in self.stale

    def _snapshot(self, channel: str) -> tuple[object, ...]:
        turns = self.ledger.current_turns(channel)
        return (
            self.ledger.generation(channel),
            self.ledger.queued(channel),
            tuple(sorted(turns.items())),
            tuple(self.ledger.turn_phase(channel, a) for a in AGENTS),
            self.ledger.is_busy(channel),
            tuple(self.ledger.is_stale(channel, t) for t in turns.values()),
            self.ledger.may_route(channel, from_human=False),
        )

    def _accept(
        self, channel: str, agent: str, *, human: bool, nudge: bool, hops: int = 0, routed: bool = False
    ) -> None:
        model = self.chans[channel]
        # Contract 12: no routed message is ever accepted while the channel rests.
        assert not (routed and model.routing_rests)
        message_id = self._new_id()
        message = self.ledger.accept(channel, agent, message_id, human=human, nudge=nudge, hops=hops, routed=routed)
        assert (message.id, message.human, message.nudge, message.agent) == (message_id, human, nudge, agent)
        assert message.generation == model.generation  # stamped with the current generation
        self.msgs[message_id] = _Msg(channel, agent, human, nudge, model.generation, model.stops, hops=hops,
                                     routed=routed)
        model.lanes[agent].queue.append(message_id)
        if human:
            model.routing_rests = False

    def _check_stop(self, decision: StopDecision) -> None:
        """Check one channel's stop decision against the model, then apply it to the model."""
        channel = decision.channel
        model = self.chans[channel]
        # Contract 11: a repeat iff no turn began (take returned a ticket) since the last stop.
        assert decision.repeat == (not model.ticket_since_stop)
        # Contract 10: exactly one notice per non-repeat stop, none for a repeat.
        assert decision.notice_due == (not decision.repeat)
        if decision.repeat:
            assert decision.generation == model.generation
            assert decision.dropped == ()  # a message typed after the first press survives
            assert decision.stopped_turns == ()
            assert decision.notice_seq == model.notice_seq
            return
        model.generation += 1
        model.stops += 1
        model.notices_due += 1
        model.notice_seq = None
        model.ticket_since_stop = False
        model.routing_rests = True
        assert decision.generation == model.generation
        assert decision.notice_seq is None
        # Contract 3: exactly the messages queued (in every lane) before the stop are dropped,
        # oldest first.
        assert [m.id for m in decision.dropped] == model.waiting()
        for message in decision.dropped:
            record = self.msgs[message.id]
            assert record.channel == channel and record.agent == message.agent
            assert record.stops_before < model.stops  # accepted before this stop
            ghost = message.id in model.lanes[record.agent].ghosts
            assert record.fate == ("dropped" if ghost else "queued")
            record.fate = "dropped"
        # Contract 12: every running turn of every agent in the channel is stopped, by one decision.
        assert sorted(decision.stopped_turns) == sorted(
            (agent, lane.turn) for agent, lane in model.lanes.items() if lane.turn is not None
        )
        for lane in model.lanes.values():
            lane.queue.clear()
            lane.ghosts.clear()
            if lane.turn is not None:
                self.stale.add(lane.turn)
                self.stopped.add(lane.turn)

    def _take(self, channel: str, agent: str) -> None:
        model = self.chans[channel]
        lane = model.lanes[agent]
        turn_id = f"t{self._new_id()}"
        if lane.turn is not None:
            before = self._snapshot(channel)
            with pytest.raises(LedgerError):  # a second turn in a busy lane is a driver bug
                self.ledger.take(channel, agent, turn_id)
            assert self._snapshot(channel) == before
            return
        result = self.ledger.take(channel, agent, turn_id)
        # Messages from before a stop that a restart put back are dropped, never run.
        assert [m.id for m in result.dropped] == lane.ghosts
        assert all(self.msgs[m.id].fate == "dropped" for m in result.dropped)
        lane.ghosts.clear()
        if not lane.queue:
            assert result.ticket is None
            return
        ticket = result.ticket
        assert ticket is not None and ticket.turn_id == turn_id and ticket.agent == agent
        assert ticket.message.id == lane.queue[0]  # oldest first
        record = self.msgs[ticket.message.id]
        # Contract 3: no message accepted before a (non-repeat) stop of its channel runs after it.
        assert record.fate == "queued" and record.channel == channel and record.agent == agent
        assert record.stops_before == model.stops
        assert ticket.generation == model.generation == ticket.message.generation
        record.fate = "taken"
        lane.queue.pop(0)
        lane.turn = turn_id
        lane.started = False
        model.ticket_since_stop = True
        if record.human:
            lane.nudges_in_row = 0
        self.turns.append((channel, turn_id))
        self.turn_agent[turn_id] = agent
        self.turn_message[turn_id] = ticket.message.id

    def _end(self, channel: str, agent: str, ok: bool, todos: int, limit: int | None) -> None:
        lane = self.chans[channel].lanes[agent]
        turn_id = lane.turn
        assert turn_id is not None
        stale = turn_id in self.stale
        queued = bool(lane.queue or lane.ghosts)
        was_nudge = self.msgs[self.turn_message[turn_id]].nudge
        decision = self.ledger.end_turn(channel, turn_id, ok=ok, unfinished_todos=todos, max_nudges=limit)
        lane.turn = None
        lane.started = False
        assert decision.stale == stale
        # Contract 19: the interrupt's notice is owed by the turn's end, unless a stop came since.
        assert decision.interrupted == (turn_id in self.interrupted and turn_id not in self.stopped)
        # Contract 9 and the nudge rules: only after an ok, current turn with unfinished todos
        # and nothing queued in its lane; never after a stop; at most the limit in a row.
        row_limit = self.max_nudges if limit is None else limit
        expected = not stale and ok and todos > 0 and not queued and lane.nudges_in_row < row_limit
        assert decision.nudge == expected
        if decision.nudge:
            lane.nudges_in_row += 1
            assert lane.nudges_in_row <= row_limit
            self._accept(channel, agent, human=False, nudge=True)  # the driver queues the nudge at once
        elif not was_nudge:
            lane.nudges_in_row = 0

    # ------------------------------------------------------------ rules

    @rule(channel=channels, agent=agents, human=st.booleans())
    def accept(self, channel: str, agent: str, human: bool) -> None:
        self._accept(channel, agent, human=human, nudge=False)

    @rule(channel=channels, agent=agents, human=st.booleans())
    def accept_and_run(self, channel: str, agent: str, human: bool) -> None:
        """What a worker does for a message on an idle lane: accept, take, start."""
        self._accept(channel, agent, human=human, nudge=False)
        lane = self.chans[channel].lanes[agent]
        if lane.turn is None:
            self._take(channel, agent)
            turn = lane.turn
            assert turn is not None
            assert self.ledger.may_start(channel, turn) is True
            lane.started = True

    @rule(channel=channels, agent=agents, ok=st.booleans(), todos=todo_counts)
    def full_turn(self, channel: str, agent: str, ok: bool, todos: int) -> None:
        """A worker's whole cycle: take if idle, start unless stopped, end."""
        lane = self.chans[channel].lanes[agent]
        if lane.turn is None:
            self._take(channel, agent)
        if lane.turn is None:
            return
        if self._current(channel, lane.turn):
            assert self.ledger.may_start(channel, lane.turn) is True
            lane.started = True
        self._end(channel, agent, ok, todos, None)

    @rule(channel=channels, agent=agents, rounds=st.integers(min_value=1, max_value=5))
    def agent_keeps_going(self, channel: str, agent: str, rounds: int) -> None:
        """Turns that end well with work left over: the nudge chain a stop must break."""
        for _ in range(rounds):
            lane = self.chans[channel].lanes[agent]
            if lane.turn is None and not lane.queue:
                break
            self.full_turn(channel, agent, True, 1)

    @rule(channel=channels, agent=agents, to=agents)
    def hand_off(self, channel: str, agent: str, to: str) -> None:
        """The agent's running turn stores a message mentioning ``to``: the driver asks
        the ledger and the router, and accepts what they allow, in the same step."""
        lane = self.chans[channel].lanes[agent]
        model = self.chans[channel]
        if lane.turn is None:
            return
        turn_id = lane.turn
        if not self.ledger.keep_output(channel, turn_id, OutputKind.OTHER):
            assert not self._current(channel, turn_id)  # a stale turn's message is never stored
            return
        parent = self.msgs[self.turn_message[turn_id]].hops
        may = self.ledger.may_route(channel, from_human=False, turn_id=turn_id)
        assert may == (not model.routing_rests)
        decision = router_route(
            f"@{to} over", author=agent, hops=parent, members=AGENTS, may_route=may, max_hops=MAX_HOPS
        )
        if to == agent or not may:
            assert decision.targets == () and decision.chain_stopped_at is None  # never back to its author
            return
        if parent + 1 > MAX_HOPS:
            event("hand-off held back at the hop limit")
            assert decision.targets == () and decision.chain_stopped_at == parent
            return
        assert decision.targets == (to,) and decision.hops == parent + 1
        for name in decision.targets:
            self._accept(channel, name, human=False, nudge=False, hops=decision.hops, routed=True)

    @rule(channel=channels, rounds=st.integers(min_value=1, max_value=6))
    def ping_pong(self, channel: str, rounds: int) -> None:
        """Each agent in turn takes its message, hands off to the other, and ends: a chain
        that only the hop limit (or a stop, or a rest) ends."""
        lanes = self.chans[channel].lanes
        for _ in range(rounds):
            for agent, other in zip(AGENTS, reversed(AGENTS), strict=True):
                if lanes[agent].turn is None:
                    self._take(channel, agent)
                turn_id = lanes[agent].turn
                if turn_id is None:
                    continue
                if self._current(channel, turn_id):
                    assert self.ledger.may_start(channel, turn_id) is True
                    lanes[agent].started = True
                self.hand_off(channel, agent, other)
                self._end(channel, agent, True, 0, None)

    @rule(channel=channels, agent=agents)
    def route_while_resting_is_refused(self, channel: str, agent: str) -> None:
        """A routed message while the channel rests is a driver bug: refused, nothing changes."""
        if not self.chans[channel].routing_rests:
            return
        before = self._snapshot(channel)
        with pytest.raises(LedgerError):
            self.ledger.accept(channel, agent, self._new_id(), human=False, hops=1, routed=True)
        assert self._snapshot(channel) == before

    @rule(channel=channels)
    def stop(self, channel: str) -> None:
        others = {name: self._snapshot(name) for name in CHANNELS if name != channel}
        decision = self.ledger.stop(channel)
        assert decision.channel == channel
        # Contract 2: the generation has moved by the time stop returns.
        assert self.ledger.generation(channel) == decision.generation
        self._check_stop(decision)
        # Contract 1: nothing of another channel changed.
        assert {name: self._snapshot(name) for name in others} == others

    @rule()
    def stop_all(self) -> None:
        busy = {name for name, m in self.chans.items() if m.busy()}
        idle = {name: self._snapshot(name) for name in CHANNELS if name not in busy}
        decisions = self.ledger.stop_all()
        names = [d.channel for d in decisions]
        assert len(names) == len(set(names))
        assert set(names) == busy  # only channels with work are stopped
        for decision in decisions:
            self._check_stop(decision)
        assert {name: self._snapshot(name) for name in idle} == idle

    @rule(channel=channels, window=st.lists(st.tuples(agents, st.booleans()), max_size=3))
    def stop_then_abort(self, channel: str, window: list[tuple[str, bool]]) -> None:
        """A stop whose record could not be stored (contract 17), with messages accepted
        (human or not) while it was being stored: ``abort_stop`` restores the channel exactly."""
        model = self.chans[channel]
        others = {name: self._snapshot(name) for name in CHANNELS if name != channel}
        decision = self.ledger.stop(channel)
        if decision.repeat:
            self._check_stop(decision)  # a repeat changed nothing, so has nothing to undo
            with pytest.raises(LedgerError):
                self.ledger.abort_stop(decision)
            return
        assert decision.generation == model.generation + 1
        accepted = [(self._new_id(), agent, human) for agent, human in window]
        for message_id, agent, human in accepted:
            self.ledger.accept(channel, agent, message_id, human=human)
        assert self.ledger.abort_stop(decision) is True
        # The model never saw the stop: every lane's dropped messages are back at its head,
        # the window's messages join the lanes under the restored generation, and a human
        # among them lifts the routing rest.
        for message_id, agent, human in accepted:
            self.msgs[message_id] = _Msg(channel, agent, human, False, model.generation, model.stops)
            model.lanes[agent].queue.append(message_id)
            if human:
                model.routing_rests = False
        assert self.ledger.notice_seq(channel) == model.notice_seq
        assert {name: self._snapshot(name) for name in others} == others

    @rule(channel=channels, agent=agents)
    def interrupt(self, channel: str, agent: str) -> None:
        """A human's message interrupts the agent's lane: decided, then accepted in the same step."""
        model = self.chans[channel]
        lane = model.lanes[agent]
        others = {a: (list(o.queue), o.turn) for a, o in model.lanes.items() if a != agent}
        window = model.ticket_since_stop
        decision = self.ledger.interrupt(channel, agent)
        # Contract 19: only this lane; its running turn unless a stop (or interrupt) already made it stale.
        assert decision.channel == channel and decision.agent == agent
        assert decision.turn_id == (lane.turn if lane.turn is not None and lane.turn not in self.stale else None)
        assert sorted(m.id for m in decision.dropped) == sorted(lane.ghosts + lane.queue)
        for message in decision.dropped:
            record = self.msgs[message.id]
            if record.fate == "queued":
                record.fate = "replaced"
        lane.queue.clear()
        lane.ghosts.clear()
        if decision.turn_id is not None:
            self.stale.add(decision.turn_id)
            self.interrupted.add(decision.turn_id)
        assert self.ledger.generation(channel) == model.generation  # no stop: the generation stays
        assert {a: (list(o.queue), o.turn) for a, o in model.lanes.items() if a != agent} == others
        assert model.ticket_since_stop == window
        self._accept(channel, agent, human=True, nudge=False)

    @rule(channel=channels, agent=agents)
    def take(self, channel: str, agent: str) -> None:
        self._take(channel, agent)

    @precondition(lambda self: bool(self.turns))
    @rule(data=st.data())
    def may_start(self, data: st.DataObject) -> None:
        channel, turn_id = data.draw(st.sampled_from(self.turns), label="turn")
        answer = self.ledger.may_start(channel, turn_id)
        # Contract 5: a stopped (or finished) turn never passes the point of no return.
        assert answer == self._current(channel, turn_id)
        if answer:
            self.chans[channel].lanes[self.turn_agent[turn_id]].started = True

    @precondition(lambda self: bool(self.turns))
    @rule(data=st.data())
    def keep_process(self, data: st.DataObject) -> None:
        channel, turn_id = data.draw(st.sampled_from(self.turns), label="turn")
        # Contract 6: a process registered for a stopped turn is killed on the spot.
        assert self.ledger.keep_process(channel, turn_id) == self._current(channel, turn_id)

    @precondition(lambda self: bool(self.turns))
    @rule(data=st.data(), kind=st.sampled_from(OutputKind))
    def keep_output(self, data: st.DataObject, kind: OutputKind) -> None:
        channel, turn_id = data.draw(st.sampled_from(self.turns), label="turn")
        # Contract 8: a stopped turn's output is discarded, except its session id.
        expected = kind is OutputKind.SESSION or self._current(channel, turn_id)
        assert self.ledger.keep_output(channel, turn_id, kind) == expected

    @rule(channel=channels, agent=agents, ok=st.booleans(), todos=todo_counts, limit=nudge_limits)
    def end_turn(self, channel: str, agent: str, ok: bool, todos: int, limit: int | None) -> None:
        if self.chans[channel].lanes[agent].turn is not None:
            self._end(channel, agent, ok, todos, limit)

    @rule(channel=channels, data=st.data())
    def end_wrong_turn(self, channel: str, data: st.DataObject) -> None:
        """Ending a turn that is not one running is a driver bug, and changes nothing."""
        current = {lane.turn for lane in self.chans[channel].lanes.values()}
        wrong = [t for c, t in self.turns if c == channel and t not in current] + ["never-taken"]
        turn_id = data.draw(st.sampled_from(wrong), label="not running")
        before = self._snapshot(channel)
        with pytest.raises(LedgerError):
            self.ledger.end_turn(channel, turn_id, ok=True, unfinished_todos=1)
        assert self._snapshot(channel) == before

    @rule(channel=channels, old=st.booleans())
    def notice_stored(self, channel: str, old: bool) -> None:
        model = self.chans[channel]
        seq = self._new_id()
        generation = model.generation - 1 if old else model.generation
        self.ledger.notice_stored(channel, generation, seq)
        if not old:
            model.notice_seq = seq

    @rule(data=st.data(), first=st.booleans(), stored=st.booleans())
    def edit_the_queue(self, data: st.DataObject, first: bool, stored: bool) -> None:
        """Contract 20: a person takes a message back, or moves it first, at any moment: a
        queued one leaves its lane (or heads it) in that step, one a turn took is named as
        running and left alone; ``stored`` False: its record failed and the edit is undone."""
        if not self.msgs:
            return
        message_id = data.draw(st.sampled_from(sorted(self.msgs)))
        record = self.msgs[message_id]
        model = self.chans[record.channel]
        lane = model.lanes[record.agent]
        edit = (self.ledger.move_first if first else self.ledger.take_back)(record.channel, message_id)
        if record.fate != "queued":
            running = [(a, l.turn) for a, l in model.lanes.items()
                       if l.turn is not None and self.turn_message.get(l.turn) == message_id]
            assert edit.outcome is (EditOutcome.RUNNING if running else EditOutcome.NOT_QUEUED)
            assert list(edit.running) == running and edit.messages == ()
            return
        assert edit.outcome is EditOutcome.DONE and [m.id for m in edit.messages] == [message_id]
        place = lane.queue.index(message_id)
        lane.queue.remove(message_id)
        if first:
            lane.queue.insert(0, message_id)
        else:
            record.fate = "taken_back"  # (and `_take` asserts no such message is ever taken)
        if not stored:
            self.ledger.undo_edit(edit)
            if message_id in lane.queue:
                lane.queue.remove(message_id)
            lane.queue.insert(place, message_id)
            record.fate = "queued"

    @rule(ghosts=st.booleans(), lower=st.booleans())
    def restart(self, ghosts: bool, lower: bool) -> None:
        """The daemon restarts: running turns end, queued messages and generations come back
        from the store; with ``ghosts`` the store also missed dequeuing dropped messages."""
        self.ledger = StopLedger(max_nudges=self.max_nudges)
        for name, model in self.chans.items():
            # The store keeps the routing rest and the repeat window: they survive the restart.
            self.ledger.restore(name, model.generation, rests=model.routing_rests, stopped=not model.ticket_since_stop)
            if lower:
                self.ledger.restore(name, model.generation - 1)  # never moves a generation back
            # A fresh ledger starts no notice and fresh nudge rows.
            model.notice_seq = None
            for agent, lane in model.lanes.items():
                lane.turn = None
                lane.started = False
                lane.nudges_in_row = 0
                # (Only a stop's drops can come back: an interrupt's record is the interrupting
                # message's own transaction, so its drops are gone from the store with it.)
                dropped = sorted(
                    i for i, r in self.msgs.items() if r.channel == name and r.agent == agent and r.fate == "dropped"
                )
                lane.ghosts = dropped if ghosts else []
                for message_id in lane.ghosts + lane.queue:
                    record = self.msgs[message_id]
                    self.ledger.requeue(name, QueuedMessage(
                        message_id, record.generation, record.human, record.nudge, agent=agent, hops=record.hops,
                        routed=record.routed,
                    ))

    # ------------------------------------------------------------ invariants

    @invariant()
    def channels_match_the_model(self) -> None:
        for name, model in self.chans.items():
            assert self.ledger.generation(name) == model.generation
            assert [m.id for m in self.ledger.queued(name)] == model.waiting()
            for agent, lane in model.lanes.items():
                queued = self.ledger.queued(name, agent)
                assert [m.id for m in queued] == lane.ghosts + lane.queue
                assert all(m.generation == model.generation for m in queued if m.id in lane.queue)
                assert self.ledger.current_turn(name, agent) == lane.turn
                assert self.ledger.is_busy(name, agent) == bool(lane.queue or lane.ghosts or lane.turn)
                if lane.turn is not None:
                    assert self.ledger.turn_phase(name, agent) is (Phase.STARTED if lane.started else Phase.PREPARING)
                    assert self.ledger.is_stale(name, lane.turn) == (lane.turn in self.stale)
                else:
                    assert self.ledger.turn_phase(name, agent) is None
            assert self.ledger.is_busy(name) == model.busy()
            assert self.ledger.current_turns(name) == {
                a: lane.turn for a, lane in model.lanes.items() if lane.turn is not None
            }
            # Contract 12: routing rests after a stop until a human speaks; humans never gated.
            assert self.ledger.may_route(name, from_human=False) == (not model.routing_rests)
            assert self.ledger.may_route(name, from_human=True)
            # Contract 10: one notice per non-repeat stop; only such stops move the generation.
            assert model.notices_due == model.stops == model.generation

    @invariant()
    def the_kept_busy_sets_are_exact(self) -> None:
        # Kept where lanes change (issue 40.3: a status page costs the busy channels, not every one):
        # against the model, and against a walk of every channel.
        busy = {name for name, model in self.chans.items() if model.busy()}
        with_turn = {name for name, model in self.chans.items() if any(lane.turn for lane in model.lanes.values())}
        assert set(self.ledger.busy_channels()) == busy == {n for n in self.ledger.channels() if self.ledger.is_busy(n)}
        assert set(self.ledger.running_channels()) == with_turn
        assert list(self.ledger.names) == sorted(self.ledger.channels())
        assert [self.ledger.queue_size(n) for n in CHANNELS] == [len(self.ledger.queued(n)) for n in CHANNELS]

    @invariant()
    def stale_turns_stay_stale(self) -> None:
        for channel, turn_id in self.turns:
            if turn_id in self.stale:
                assert self.ledger.is_stale(channel, turn_id)
                assert not self.ledger.may_start(channel, turn_id)
                assert not self.ledger.keep_process(channel, turn_id)
                assert not self.ledger.keep_output(channel, turn_id, OutputKind.OTHER)
                assert self.ledger.keep_output(channel, turn_id, OutputKind.SESSION)

    @invariant()
    def every_message_has_one_fate(self) -> None:
        for message_id, record in self.msgs.items():
            model = self.chans[record.channel]
            lane = model.lanes[record.agent]
            assert (message_id in lane.queue) == (record.fate == "queued")
            if message_id in lane.ghosts:
                assert record.fate == "dropped"
            # Hand-offs: no routed message ever exceeds the hop limit.
            assert record.hops <= MAX_HOPS
            if record.fate == "queued":
                # Contract 4: a message accepted after the last stop is still waiting to run.
                assert record.stops_before == model.stops


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
