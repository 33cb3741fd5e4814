"""A hypothesis state machine for the stop ledger, checked against an independent model.

The driver's calls (accept, stop, stop_all, take, may_start, keep_process, keep_output,
end_turn, notice_stored, and a daemon restart that restores generations and requeues
messages) are interleaved in any order over three channels. The model below is written
from the stop contract (docs/stop-contract.md), not from the ledger's code: it tracks each message's fate
(queued, taken, dropped) and each turn's staleness. Every step checks the ledger's answer
against the model, and every invariant is rechecked for every channel after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from supervisor._ledger import LedgerError, OutputKind, Phase, QueuedMessage, StopDecision, StopLedger

CHANNELS = ("a", "b", "c")
channels = st.sampled_from(CHANNELS)
# Few distinct values: what matters is zero versus some, and hitting the nudge limit.
todo_counts = st.sampled_from((0, 1, 3))
nudge_limits = st.one_of(st.none(), st.integers(min_value=0, max_value=3))


@dataclass
class _Msg:
    channel: str
    human: bool
    nudge: bool
    generation: int
    stops_before: int
    """How many non-repeat stops of its channel happened before it was accepted."""
    fate: str = "queued"  # queued | taken | dropped


@dataclass
class _Chan:
    generation: int = 0
    queue: list[int] = field(default_factory=list)
    """Live messages, oldest first."""
    ghosts: list[int] = field(default_factory=list)
    """Dropped messages a restart put back (the store missed their dequeue); never run."""
    turn: str | None = None
    started: bool = False
    ticket_since_stop: bool = True
    """A take returned a ticket since the last stop (vacuously true before any stop)."""
    stops: int = 0
    """Non-repeat stops so far."""
    notices_due: int = 0
    notice_seq: int | None = None
    routing_rests: bool = False
    nudges_in_row: int = 0
    """Nudges granted since the row began: a human turn began, or a turn that was not a
    nudge ended without one."""


class LedgerMachine(RuleBasedStateMachine):
    """Drive a StopLedger and an independent model side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.max_nudges = 2
        self.ledger = StopLedger(max_nudges=self.max_nudges)
        self.chans: dict[str, _Chan] = {name: _Chan() for name in CHANNELS}
        self.msgs: dict[int, _Msg] = {}
        self.turns: list[tuple[str, str]] = []  # every turn ever taken: (channel, turn_id)
        self.stale: set[str] = set()  # turns a non-repeat stop made stale
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
        return self.chans[channel].turn == turn_id and turn_id not in self.stale

    def _snapshot(self, channel: str) -> tuple[object, ...]:
        turn = self.ledger.current_turn(channel)
        return (
            self.ledger.generation(channel),
            self.ledger.queued(channel),
            turn,
            self.ledger.turn_phase(channel),
            self.ledger.is_busy(channel),
            self.ledger.is_stale(channel, turn) if turn else None,
            self.ledger.may_route(channel, from_human=False),
        )

    def _accept(self, channel: str, *, human: bool, nudge: bool) -> None:
        model = self.chans[channel]
        message_id = self._new_id()
        message = self.ledger.accept(channel, "bot", message_id, human=human, nudge=nudge)
        assert (message.id, message.human, message.nudge) == (message_id, human, nudge)
        assert message.generation == model.generation  # stamped with the current generation
        self.msgs[message_id] = _Msg(channel, human, nudge, model.generation, model.stops)
        model.queue.append(message_id)
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
            assert decision.stopped_turn is None
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
        # Contract 3: exactly the messages queued before the stop are dropped, oldest first.
        assert [m.id for m in decision.dropped] == model.ghosts + model.queue
        for message in decision.dropped:
            record = self.msgs[message.id]
            assert record.channel == channel
            assert record.stops_before < model.stops  # accepted before this stop
            assert record.fate == ("dropped" if message.id in model.ghosts else "queued")
            record.fate = "dropped"
        model.queue.clear()
        model.ghosts.clear()
        assert decision.stopped_turn == model.turn
        if model.turn is not None:
            self.stale.add(model.turn)

    def _take(self, channel: str) -> None:
        model = self.chans[channel]
        turn_id = f"t{self._new_id()}"
        if model.turn is not None:
            before = self._snapshot(channel)
            with pytest.raises(LedgerError):  # a second turn in a busy channel is a driver bug
                self.ledger.take(channel, "bot", turn_id)
            assert self._snapshot(channel) == before
            return
        result = self.ledger.take(channel, "bot", turn_id)
        # Messages from before a stop that a restart put back are dropped, never run.
        assert [m.id for m in result.dropped] == model.ghosts
        assert all(self.msgs[m.id].fate == "dropped" for m in result.dropped)
        model.ghosts.clear()
        if not model.queue:
            assert result.ticket is None
            return
        ticket = result.ticket
        assert ticket is not None and ticket.turn_id == turn_id
        assert ticket.message.id == model.queue[0]  # oldest first
        record = self.msgs[ticket.message.id]
        # Contract 3: no message accepted before a (non-repeat) stop of its channel runs after it.
        assert record.fate == "queued" and record.channel == channel
        assert record.stops_before == model.stops
        assert ticket.generation == model.generation == ticket.message.generation
        record.fate = "taken"
        model.queue.pop(0)
        model.turn = turn_id
        model.started = False
        model.ticket_since_stop = True
        if record.human:
            model.nudges_in_row = 0
        self.turns.append((channel, turn_id))
        self.turn_message[turn_id] = ticket.message.id

    def _end(self, channel: str, ok: bool, todos: int, limit: int | None) -> None:
        model = self.chans[channel]
        turn_id = model.turn
        assert turn_id is not None
        stale = turn_id in self.stale
        queued = bool(model.queue or model.ghosts)
        was_nudge = self.msgs[self.turn_message[turn_id]].nudge
        decision = self.ledger.end_turn(channel, turn_id, ok=ok, unfinished_todos=todos, max_nudges=limit)
        model.turn = None
        model.started = False
        assert decision.stale == stale
        # Contract 9 and the nudge rules: only after an ok, current turn with unfinished todos
        # and nothing queued; never after a stop; at most the limit in a row (0 turns it off).
        row_limit = self.max_nudges if limit is None else limit
        expected = not stale and ok and todos > 0 and not queued and model.nudges_in_row < row_limit
        assert decision.nudge == expected
        if decision.nudge:
            model.nudges_in_row += 1
            assert model.nudges_in_row <= row_limit
            self._accept(channel, human=False, nudge=True)  # the driver queues the nudge at once
        elif not was_nudge:
            model.nudges_in_row = 0

    # ------------------------------------------------------------ rules

    @rule(channel=channels, human=st.booleans())
    def accept(self, channel: str, human: bool) -> None:
        self._accept(channel, human=human, nudge=False)

    @rule(channel=channels, human=st.booleans())
    def accept_and_run(self, channel: str, human: bool) -> None:
        """What a worker does for a message on an idle channel: accept, take, start."""
        self._accept(channel, human=human, nudge=False)
        if self.chans[channel].turn is None:
            self._take(channel)
            turn = self.chans[channel].turn
            assert turn is not None
            assert self.ledger.may_start(channel, turn) is True
            self.chans[channel].started = True

    @rule(channel=channels, ok=st.booleans(), todos=todo_counts)
    def full_turn(self, channel: str, ok: bool, todos: int) -> None:
        """A worker's whole cycle: take if idle, start unless stopped, end."""
        model = self.chans[channel]
        if model.turn is None:
            self._take(channel)
        if model.turn is None:
            return
        if self._current(channel, model.turn):
            assert self.ledger.may_start(channel, model.turn) is True
            model.started = True
        self._end(channel, ok, todos, None)

    @rule(channel=channels, rounds=st.integers(min_value=1, max_value=5))
    def agent_keeps_going(self, channel: str, rounds: int) -> None:
        """Turns that end well with work left over: the nudge chain a stop must break."""
        for _ in range(rounds):
            model = self.chans[channel]
            if model.turn is None and not model.queue:
                break
            self.full_turn(channel, True, 1)

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
        busy = {name for name, m in self.chans.items() if m.queue or m.ghosts or m.turn is not None}
        idle = {name: self._snapshot(name) for name in CHANNELS if name not in busy}
        decisions = self.ledger.stop_all()
        names = [d.channel for d in decisions]
        assert len(names) == len(set(names))
        assert set(names) == busy  # only channels with work are stopped
        for decision in decisions:
            self._check_stop(decision)
        assert {name: self._snapshot(name) for name in idle} == idle

    @rule(channel=channels, window=st.lists(st.booleans(), max_size=3))
    def stop_then_abort(self, channel: str, window: list[bool]) -> None:
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
        accepted = [(self._new_id(), human) for human in window]
        for message_id, human in accepted:
            self.ledger.accept(channel, "bot", message_id, human=human)
        assert self.ledger.abort_stop(decision) is True
        # The model never saw the stop: the window's messages join the queue under the
        # restored generation, and a human among them lifts the routing rest.
        for message_id, human in accepted:
            self.msgs[message_id] = _Msg(channel, human, False, model.generation, model.stops)
            model.queue.append(message_id)
            if human:
                model.routing_rests = False
        assert self.ledger.notice_seq(channel) == model.notice_seq
        assert {name: self._snapshot(name) for name in others} == others

    @rule(channel=channels)
    def take(self, channel: str) -> None:
        self._take(channel)

    @precondition(lambda self: bool(self.turns))
    @rule(data=st.data())
    def may_start(self, data: st.DataObject) -> None:
        channel, turn_id = data.draw(st.sampled_from(self.turns), label="turn")
        answer = self.ledger.may_start(channel, turn_id)
        # Contract 5: a stopped (or finished) turn never passes the point of no return.
        assert answer == self._current(channel, turn_id)
        if answer:
            self.chans[channel].started = True

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

    @rule(channel=channels, ok=st.booleans(), todos=todo_counts, limit=nudge_limits)
    def end_turn(self, channel: str, ok: bool, todos: int, limit: int | None) -> None:
        if self.chans[channel].turn is not None:
            self._end(channel, ok, todos, limit)

    @rule(channel=channels, data=st.data())
    def end_wrong_turn(self, channel: str, data: st.DataObject) -> None:
        """Ending a turn that is not the one running is a driver bug, and changes nothing."""
        current = self.chans[channel].turn
        wrong = [t for c, t in self.turns if c == channel and t != current] + ["never-taken"]
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

    @rule(ghosts=st.booleans(), lower=st.booleans())
    def restart(self, ghosts: bool, lower: bool) -> None:
        """The daemon restarts: running turns end, queued messages and generations come back
        from the store; with ``ghosts`` the store also missed dequeuing dropped messages."""
        self.ledger = StopLedger(max_nudges=self.max_nudges)
        for name, model in self.chans.items():
            self.ledger.restore(name, model.generation)
            if lower:
                self.ledger.restore(name, model.generation - 1)  # never moves a generation back
            model.turn = None
            model.started = False
            # A fresh ledger starts a fresh repeat window, routing rest and nudge row.
            model.ticket_since_stop = True
            model.routing_rests = False
            model.notice_seq = None
            model.nudges_in_row = 0
            dropped = sorted(i for i, r in self.msgs.items() if r.channel == name and r.fate == "dropped")
            model.ghosts = dropped if ghosts else []
            for message_id in model.ghosts + model.queue:
                record = self.msgs[message_id]
                self.ledger.requeue(name, QueuedMessage(message_id, record.generation, record.human, record.nudge, agent="bot"))

    # ------------------------------------------------------------ invariants

    @invariant()
    def channels_match_the_model(self) -> None:
        for name, model in self.chans.items():
            assert self.ledger.generation(name) == model.generation
            queued = self.ledger.queued(name)
            assert [m.id for m in queued] == model.ghosts + model.queue
            assert all(m.generation == model.generation for m in queued if m.id in model.queue)
            assert self.ledger.current_turn(name) == model.turn
            assert self.ledger.is_busy(name) == bool(model.queue or model.ghosts or model.turn)
            if model.turn is not None:
                assert self.ledger.turn_phase(name) is (Phase.STARTED if model.started else Phase.PREPARING)
                assert self.ledger.is_stale(name, model.turn) == (model.turn in self.stale)
            else:
                assert self.ledger.turn_phase(name) is None
            # Contract 12: routing rests after a stop until a human speaks; humans never gated.
            assert self.ledger.may_route(name, from_human=False) == (not model.routing_rests)
            assert self.ledger.may_route(name, from_human=True)
            # Contract 10: one notice per non-repeat stop; only such stops move the generation.
            assert model.notices_due == model.stops == model.generation

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
            assert (message_id in model.queue) == (record.fate == "queued")
            if message_id in model.ghosts:
                assert record.fate == "dropped"
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
