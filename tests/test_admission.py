"""The admission gate (supervisor/core/admission.py): limits, memory, residents, fairness, stops.

The decisions one by one first, then two hypothesis properties: the fair order (while a
channel waits, no other channel goes twice in one round of its own channel; every waiter is
granted in the end), and
the stop contract with admission in front of the ledger (a waiting turn is a queued
message: whatever the interleaving, no message accepted before a stop starts a turn).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from supervisor.core.admission import (
    MIB,
    MIN_DERIVED_TURNS,
    Admission,
    AdmissionError,
    Limits,
    MemoryReading,
    Why,
    derive_max_turns,
)
from supervisor.core.ledger import StopLedger

GIB = 1024 * MIB


def lanes(decision: object) -> list[tuple[str, str]]:
    return [(g.channel, g.agent) for g in decision.grants]  # type: ignore[attr-defined]


# ---------------------------------------------------------------- limits


def test_the_turn_limit_holds_the_rest_and_a_release_lets_the_next_go() -> None:
    gate = Admission(Limits(max_turns=2))
    for c in "abc":
        gate.offer(c, "x", estimate=1, now=0)
    assert lanes(gate.decide(None, 0)) == [("a", "x"), ("b", "x")]
    assert [(w.channel, w.position, w.why) for w in gate.waiting()] == [("c", 1, Why.TURN_LIMIT)]
    assert lanes(gate.decide(None, 1)) == []
    gate.release("a", "x")
    assert lanes(gate.decide(None, 2)) == [("c", "x")]
    assert gate.used == 2 and gate.waiting() == []


def test_an_agents_max_concurrent_below_the_hosts_limit_holds_only_that_agent() -> None:
    gate = Admission(Limits(max_turns=10, per_agent={"x": 1}))
    gate.offer("a", "x", estimate=1, now=0)
    gate.offer("b", "x", estimate=1, now=0)
    gate.offer("c", "y", estimate=1, now=0)
    assert lanes(gate.decide(None, 0)) == [("a", "x"), ("c", "y")]
    assert [(w.channel, w.why) for w in gate.waiting()] == [("b", Why.AGENT_LIMIT)]
    gate.release("a", "x")
    assert lanes(gate.decide(None, 1)) == [("b", "x")]


def test_limits_below_one_are_a_bug() -> None:
    with pytest.raises(AdmissionError):
        Admission(Limits(max_turns=0))
    with pytest.raises(AdmissionError):
        Admission(Limits(max_turns=3, per_agent={"x": 0}))


def test_offering_a_lane_twice_or_releasing_one_without_a_slot_is_a_bug() -> None:
    gate = Admission(Limits(max_turns=1))
    gate.offer("a", "x", estimate=1, now=0)
    with pytest.raises(AdmissionError):
        gate.offer("a", "x", estimate=1, now=0)
    with pytest.raises(AdmissionError):
        gate.release("b", "x")
    gate.decide(None, 0)
    with pytest.raises(AdmissionError):
        gate.offer("a", "x", estimate=1, now=0)


def test_the_default_limit_lets_200_light_turns_run_on_24_gb_and_has_a_floor() -> None:
    assert derive_max_turns(23 * GIB, 512 * MIB, [32 * MIB]) >= 200
    assert derive_max_turns(23 * GIB, 512 * MIB, [32 * MIB, 512 * MIB]) == 45
    assert derive_max_turns(2 * GIB, 512 * MIB, [512 * MIB]) == MIN_DERIVED_TURNS
    assert derive_max_turns(0, 512 * MIB, []) == MIN_DERIVED_TURNS


# ---------------------------------------------------------------- memory


def test_a_low_memory_reading_holds_turns_and_asks_for_a_new_reading() -> None:
    gate = Admission(Limits(max_turns=10, memory_reserve=1 * GIB))
    gate.offer("a", "x", estimate=512 * MIB, now=0)
    low = MemoryReading(available=1 * GIB + 100 * MIB, at=0)
    decision = gate.decide(low, 0)
    assert decision.grants == () and decision.recheck
    assert gate.waiting()[0].why is Why.MEMORY
    assert lanes(gate.decide(MemoryReading(available=4 * GIB, at=1), 1)) == [("a", "x")]


def test_turns_granted_too_recently_for_the_reading_to_show_count_against_it() -> None:
    gate = Admission(Limits(max_turns=10, memory_reserve=0), settle=3.0)
    for c in "abcd":
        gate.offer(c, "x", estimate=1 * GIB, now=0)
    reading = MemoryReading(available=int(2.5 * GIB), at=0)
    assert lanes(gate.decide(reading, 0)) == [("a", "x"), ("b", "x")]
    # Ten seconds on, the reading shows what they hold: it decides again from there.
    assert lanes(gate.decide(MemoryReading(available=int(1.5 * GIB), at=10), 10)) == [("c", "x")]


def test_memory_pressure_holds_turns() -> None:
    gate = Admission(Limits(max_turns=10, memory_pressure=20.0))
    gate.offer("a", "x", estimate=1, now=0)
    decision = gate.decide(MemoryReading(available=8 * GIB, at=0, pressure=35.0), 0)
    assert decision.grants == () and decision.recheck
    assert gate.waiting()[0].why is Why.PRESSURE
    assert lanes(gate.decide(MemoryReading(available=8 * GIB, at=1, pressure=0.5), 1)) == [("a", "x")]


def test_no_reading_means_no_memory_gate() -> None:
    gate = Admission(Limits(max_turns=10, memory_reserve=100 * GIB))
    gate.offer("a", "x", estimate=GIB, now=0)
    assert lanes(gate.decide(None, 0)) == [("a", "x")]


def test_a_big_turn_held_by_memory_is_not_overtaken_by_small_ones() -> None:
    gate = Admission(Limits(max_turns=10, memory_reserve=0))
    gate.offer("big", "x", estimate=3 * GIB, now=0)
    gate.offer("small", "y", estimate=1 * MIB, now=0)
    assert lanes(gate.decide(MemoryReading(available=2 * GIB, at=0), 0)) == []
    assert [w.why for w in gate.waiting()] == [Why.MEMORY, Why.MEMORY]


# ---------------------------------------------------------------- residents


def test_an_idle_resident_keeps_its_slot_and_its_own_lane_reuses_it() -> None:
    gate = Admission(Limits(max_turns=1))
    gate.offer("a", "acp", estimate=1, now=0)
    gate.decide(None, 0)
    gate.release("a", "acp", resident=True, now=1)
    assert gate.used == 1 and gate.residents() == 1 and gate.running() == 0
    gate.offer("a", "acp", estimate=1, now=2)
    decision = gate.decide(MemoryReading(available=0, at=2), 2)  # (no new process: no memory needed)
    assert lanes(decision) == [("a", "acp")] and decision.grants[0].close_first == ()


def test_when_a_slot_is_needed_the_idle_resident_unused_longest_is_closed_first() -> None:
    gate = Admission(Limits(max_turns=2))
    for c, t in (("a", 5), ("b", 3)):
        gate.offer(c, "acp", estimate=1, now=0)
        gate.decide(None, 0)
        gate.release(c, "acp", resident=True, now=t)
    gate.offer("c", "x", estimate=1, now=6)
    decision = gate.decide(None, 6)
    assert lanes(decision) == [("c", "x")]
    assert decision.grants[0].close_first == (("b", "acp"),)
    assert not gate.holds("b", "acp") and gate.holds("a", "acp")


def test_an_agent_limit_closes_that_agents_idle_resident_not_another_one() -> None:
    gate = Admission(Limits(max_turns=10, per_agent={"acp": 1}))
    gate.offer("o", "other", estimate=1, now=0)
    gate.offer("a", "acp", estimate=1, now=0)
    gate.decide(None, 0)
    gate.release("o", "other", resident=True, now=0)
    gate.release("a", "acp", resident=True, now=1)
    gate.offer("b", "acp", estimate=1, now=2)
    assert gate.decide(None, 2).grants[0].close_first == (("a", "acp"),)


def test_a_resident_whose_lane_waits_is_not_the_one_closed() -> None:
    gate = Admission(Limits(max_turns=2))
    for c, t in (("a", 1), ("b", 2)):
        gate.offer(c, "acp", estimate=1, now=0)
        gate.decide(None, 0)
        gate.release(c, "acp", resident=True, now=t)
    gate.offer("n", "x", estimate=1, now=3)
    gate.offer("a", "acp", estimate=1, now=3)  # (a would reuse its own)
    decision = gate.decide(None, 3)
    assert [(g.channel, g.close_first) for g in decision.grants] == [("n", (("b", "acp"),)), ("a", ())]


def test_a_resident_that_ends_frees_its_slot() -> None:
    gate = Admission(Limits(max_turns=1))
    gate.offer("a", "acp", estimate=1, now=0)
    gate.decide(None, 0)
    assert not gate.gone("a", "acp")  # (running: the turn keeps the slot)
    gate.release("a", "acp", resident=True, now=1)
    assert gate.gone("a", "acp") and gate.used == 0


# ---------------------------------------------------------------- stops


def test_a_stop_drops_its_channels_waiters_and_no_other() -> None:
    gate = Admission(Limits(max_turns=1))
    gate.offer("busy", "x", estimate=1, now=0)
    gate.decide(None, 0)
    gate.offer("a", "x", estimate=1, now=0)
    gate.offer("a", "y", estimate=1, now=0)
    gate.offer("b", "x", estimate=1, now=0)
    assert gate.drop("a") == (("a", "x"), ("a", "y"))
    assert [(w.channel, w.position) for w in gate.waiting()] == [("b", 1)]
    assert gate.drop("a") == ()
    assert gate.drop_all() == (("b", "x"),) and gate.waiting() == []
    assert gate.holds("busy", "x")  # (a running turn's slot is the stop's teardown's to free)


def test_a_withdrawn_waiter_leaves_the_rotation() -> None:
    gate = Admission(Limits(max_turns=1))
    gate.offer("a", "x", estimate=1, now=0)
    assert gate.withdraw("a", "x") and not gate.withdraw("a", "x")
    assert gate.waiting() == [] and lanes(gate.decide(None, 0)) == []


# ---------------------------------------------------------------- fairness


def test_round_robin_across_channels_and_fifo_within_one() -> None:
    gate = Admission(Limits(max_turns=1))
    gate.offer("busy", "x", estimate=1, now=0)
    gate.offer("busy", "y", estimate=1, now=0)
    gate.offer("quiet", "x", estimate=1, now=0)
    order = []
    for _ in range(3):
        (grant,) = gate.decide(None, 0).grants
        order.append((grant.channel, grant.agent))
        gate.release(grant.channel, grant.agent)
        if grant.channel == "busy" and len(order) == 1:
            gate.offer("busy", "x", estimate=1, now=0)  # (its next message, behind y)
    assert order == [("busy", "x"), ("quiet", "x"), ("busy", "y")]
    assert [(w.channel, w.agent) for w in gate.waiting()] == [("busy", "x")]


CHANNELS = ("a", "b", "c", "d")
AGENTS = ("x", "y", "z")


_ops = st.one_of(
    st.tuples(st.just("offer"), st.integers(0, len(CHANNELS) - 1), st.integers(0, len(AGENTS) - 1)),
    st.tuples(st.just("finish"), st.integers(0, 50), st.just(0)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ops, max_size=60), st.integers(1, 3), st.sampled_from([{}, {"x": 1}]))
def test_no_channel_starves_and_others_go_at_most_once_per_round_while_one_waits(
    program: list[tuple[str, int, int]], max_turns: int, per_agent: dict[str, int]
) -> None:
    gate = Admission(Limits(max_turns=max_turns, per_agent=per_agent))
    running: list[tuple[str, str]] = []
    since: dict[tuple[str, str], dict[str, int]] = {}
    """Per waiting lane: grants of each other channel since it offered."""

    def decide() -> None:
        for grant in gate.decide(None, 0).grants:
            lane = (grant.channel, grant.agent)
            since.pop(lane)
            running.append(lane)
            for waiter, counts in since.items():
                counts[grant.channel] = counts.get(grant.channel, 0) + 1
                # Without agent limits a waiting channel is never skipped: every other
                # channel is granted at most once per grant of the waiter's own channel
                # (the lanes ahead of it there), and once more before it.
                if not per_agent and waiter[0] != grant.channel:
                    assert counts[grant.channel] <= counts.get(waiter[0], 0) + 1, (waiter, grant, counts)

    for op, i, j in program:
        if op == "offer":
            lane = (CHANNELS[i], AGENTS[j])
            if lane not in since and lane not in running:
                gate.offer(*lane, estimate=1, now=0)
                since[lane] = {}
        elif running:
            gate.release(*running.pop(i % len(running)))
        decide()
        assert gate.used <= max_turns
        for agent, cap in per_agent.items():
            assert sum(1 for _, a in running if a == agent) <= cap
    # Liveness: finishing what runs, every waiter is granted in the end.
    while running:
        gate.release(*running.pop(0))
        decide()
    assert since == {} and gate.waiting() == []


# ---------------------------------------------------------------- the stop contract with admission in front


@dataclass
class _Msg:
    channel: str
    stops_at_accept: int


@dataclass
class _Pending:
    """A granted lane on its way to the point of no return."""

    channel: str
    agent: str
    turn_id: str | None = None
    message: int | None = None


@dataclass
class _Model:
    stops: dict[str, int] = field(default_factory=dict)
    messages: dict[int, _Msg] = field(default_factory=dict)


class AdmissionBeforeTheLedger(RuleBasedStateMachine):
    """The host's driver, step by step: accept → offer; decide → grant; take; may_start;
    end → release (and offer again if more is queued). Stops land anywhere in between.

    Property: a turn that passes ``may_start`` runs a message accepted after its channel's
    last stop (a waiting turn is a queued message: it never starts after the stop)."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = StopLedger()
        self.gate = Admission(Limits(max_turns=2))
        self.model = _Model()
        self.pending: list[_Pending] = []
        self.started: list[_Pending] = []
        self.n = 0

    def _offer_if_queued(self, channel: str, agent: str) -> None:
        if (self.ledger.queued(channel, agent) and not self.gate.is_waiting(channel, agent)
                and not self.gate.holds(channel, agent)):
            self.gate.offer(channel, agent, estimate=1, now=0)

    @rule(channel=st.sampled_from(CHANNELS[:3]), agent=st.sampled_from(AGENTS[:2]))
    def accept(self, channel: str, agent: str) -> None:
        self.n += 1
        queued = self.ledger.accept(channel, agent, self.n, human=True)
        self.model.messages[queued.id] = _Msg(channel, self.model.stops.get(channel, 0))
        self._offer_if_queued(channel, agent)

    @rule(channel=st.sampled_from(CHANNELS[:3]))
    def stop(self, channel: str) -> None:
        decision = self.ledger.stop(channel)
        for lane in self.gate.drop(channel):
            # (Woken, the worker looks again: a repeat stop keeps what was typed after the first.)
            self._offer_if_queued(*lane)
        if not decision.repeat:
            self.model.stops[channel] = self.model.stops.get(channel, 0) + 1

    @rule()
    def decide(self) -> None:
        for grant in self.gate.decide(None, 0).grants:
            self.pending.append(_Pending(grant.channel, grant.agent))

    @precondition(lambda self: any(p.turn_id is None for p in self.pending))
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        pending = data.draw(st.sampled_from([p for p in self.pending if p.turn_id is None]))
        self.n += 1
        take = self.ledger.take(pending.channel, pending.agent, f"t{self.n}")
        if take.ticket is None:  # (a stop emptied the queue): the slot is given back
            self.pending.remove(pending)
            self.gate.release(pending.channel, pending.agent)
            return
        pending.turn_id, pending.message = take.ticket.turn_id, take.ticket.message.id

    @precondition(lambda self: any(p.turn_id is not None for p in self.pending))
    @rule(data=st.data())
    def point_of_no_return(self, data: st.DataObject) -> None:
        pending = data.draw(st.sampled_from([p for p in self.pending if p.turn_id is not None]))
        self.pending.remove(pending)
        assert pending.turn_id is not None and pending.message is not None
        if self.ledger.may_start(pending.channel, pending.turn_id):
            message = self.model.messages[pending.message]
            assert message.stops_at_accept == self.model.stops.get(pending.channel, 0), "started after a stop"
            self.started.append(pending)
        else:
            self._end(pending)

    @precondition(lambda self: bool(self.started))
    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        turn = data.draw(st.sampled_from(self.started))
        self.started.remove(turn)
        self._end(turn)

    def _end(self, turn: _Pending) -> None:
        assert turn.turn_id is not None
        self.ledger.end_turn(turn.channel, turn.turn_id, ok=True, unfinished_todos=0)
        self.gate.release(turn.channel, turn.agent)
        self._offer_if_queued(turn.channel, turn.agent)

    @invariant()
    def within_the_limit(self) -> None:
        assert self.gate.used <= 2
        assert self.gate.used == len(self.pending) + len(self.started)

    @invariant()
    def every_queued_lane_waits_or_holds_a_slot(self) -> None:
        for channel in self.ledger.channels():
            for agent in self.ledger.lanes(channel):
                if self.ledger.queued(channel, agent):
                    assert self.gate.is_waiting(channel, agent) or self.gate.holds(channel, agent)


TestAdmissionBeforeTheLedger = AdmissionBeforeTheLedger.TestCase
TestAdmissionBeforeTheLedger.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
