"""The ledger's interrupt: a stop of one lane for a message that replaces its work (contract line 19).

Plain synchronous scenarios, as in ``tests/test_ledger.py``: driver calls, then assertions on
the decisions the ledger returns.
"""

from __future__ import annotations

from supervisor.core.ledger import OutputKind, StopLedger


def _running(ledger: StopLedger, channel: str, agent: str, message_id: int, turn_id: str) -> None:
    ledger.accept(channel, agent, message_id, human=True)
    take = ledger.take(channel, agent, turn_id)
    assert take.ticket is not None and take.ticket.message.id == message_id
    assert ledger.may_start(channel, turn_id)


def test_contract_19_an_interrupt_makes_the_lanes_turn_stale_and_drops_its_queue() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "bot", 1, "t1")
    ledger.accept("c", "bot", 2, human=True)
    ledger.accept("c", "bot", 3, human=True)
    decision = ledger.interrupt("c", "bot")
    assert decision.turn_id == "t1"
    assert [m.id for m in decision.dropped] == [2, 3]
    assert ledger.is_stale("c", "t1")
    assert not ledger.keep_process("c", "t1")
    assert not ledger.keep_output("c", "t1", OutputKind.OTHER)
    assert ledger.keep_output("c", "t1", OutputKind.SESSION)  # the conversation resumes
    assert ledger.queued("c", "bot") == ()
    assert ledger.generation("c") == 0  # no stop: the channel's generation stays
    # The interrupting message, accepted in the same step, runs next, once the turn has ended.
    ledger.accept("c", "bot", 4, human=True)
    end = ledger.end_turn("c", "t1", ok=False, unfinished_todos=0)
    assert end.stale and end.interrupted and not end.nudge
    take = ledger.take("c", "bot", "t2")
    assert take.ticket is not None and take.ticket.message.id == 4
    assert ledger.may_start("c", "t2")


def test_contract_19_an_interrupt_touches_only_the_addressed_agents_lane() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "alice", 1, "ta")
    _running(ledger, "c", "bob", 2, "tb")
    ledger.accept("c", "bob", 3, human=True)
    decision = ledger.interrupt("c", "alice")
    assert decision.turn_id == "ta" and decision.dropped == ()
    assert ledger.is_stale("c", "ta")
    assert not ledger.is_stale("c", "tb")
    assert [m.id for m in ledger.queued("c", "bob")] == [3]
    assert not ledger.in_repeat_window("c")
    assert ledger.may_route("c", from_human=False, turn_id="tb")  # routing does not rest


def test_contract_19_an_interrupt_of_an_idle_lane_interrupts_nothing() -> None:
    ledger = StopLedger()
    decision = ledger.interrupt("c", "bot")
    assert decision.turn_id is None and decision.dropped == ()


def test_contract_19_a_second_interrupt_drops_the_firsts_message_while_its_turn_winds_down() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "bot", 1, "t1")
    first = ledger.interrupt("c", "bot")
    ledger.accept("c", "bot", 2, human=True)  # the first interrupt's message
    second = ledger.interrupt("c", "bot")
    assert first.turn_id == "t1"
    assert second.turn_id is None  # t1 is already the first interrupt's to end
    assert [m.id for m in second.dropped] == [2]
    ledger.accept("c", "bot", 3, human=True)
    assert ledger.end_turn("c", "t1", ok=False, unfinished_todos=0).interrupted
    take = ledger.take("c", "bot", "t3")
    assert take.ticket is not None and take.ticket.message.id == 3


def test_contract_19_a_second_interrupt_interrupts_the_firsts_turn() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "bot", 1, "t1")
    ledger.interrupt("c", "bot")
    ledger.accept("c", "bot", 2, human=True)
    ledger.end_turn("c", "t1", ok=False, unfinished_todos=0)
    _take = ledger.take("c", "bot", "t2")
    assert ledger.may_start("c", "t2")
    second = ledger.interrupt("c", "bot")
    assert second.turn_id == "t2" and ledger.is_stale("c", "t2")


def test_contract_19_a_stop_after_an_interrupt_owes_the_notice_instead() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "bot", 1, "t1")
    ledger.interrupt("c", "bot")
    ledger.accept("c", "bot", 2, human=True)
    stop = ledger.stop("c")
    assert stop.stopped_turns == (("bot", "t1"),)
    assert [m.id for m in stop.dropped] == [2]  # the interrupting message too: it came before the stop
    end = ledger.end_turn("c", "t1", ok=False, unfinished_todos=0)
    assert end.stale and not end.interrupted  # the stop's notice, not the interrupt's


def test_contract_19_an_interrupt_after_a_stop_interrupts_nothing_and_keeps_the_stops_notice() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "bot", 1, "t1")
    ledger.stop("c")
    decision = ledger.interrupt("c", "bot")
    assert decision.turn_id is None
    assert not ledger.end_turn("c", "t1", ok=False, unfinished_todos=0).interrupted


def test_contract_19_an_interrupt_of_a_turn_not_yet_started_keeps_it_from_starting() -> None:
    ledger = StopLedger()
    ledger.accept("c", "bot", 1, human=True)
    take = ledger.take("c", "bot", "t1")
    assert take.ticket is not None
    assert ledger.interrupt("c", "bot").turn_id == "t1"
    assert not ledger.may_start("c", "t1")


def test_abort_interrupt_puts_the_turn_and_the_queue_back() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "bot", 1, "t1")
    ledger.accept("c", "bot", 2, human=True)
    decision = ledger.interrupt("c", "bot")
    ledger.accept("c", "bot", 3, human=True)  # the interrupting message, whose write failed
    ledger.abort_interrupt(decision)
    assert not ledger.is_stale("c", "t1")
    assert [m.id for m in ledger.queued("c", "bot")] == [2, 3]
    assert not ledger.end_turn("c", "t1", ok=True, unfinished_todos=0).interrupted


def test_abort_interrupt_after_a_stop_leaves_the_stop_alone() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "bot", 1, "t1")
    ledger.accept("c", "bot", 2, human=True)
    decision = ledger.interrupt("c", "bot")
    ledger.stop("c")
    ledger.abort_interrupt(decision)
    assert ledger.is_stale("c", "t1")
    assert ledger.queued("c", "bot") == ()  # message 2 came before the stop: it stays dropped


def test_a_shutdown_silences_an_interrupted_turn_and_owes_its_notice() -> None:
    ledger = StopLedger()
    _running(ledger, "c", "bot", 1, "t1")
    ledger.interrupt("c", "bot")
    assert ledger.shut_down().turns == (("c", "t1"),)
    assert not ledger.end_turn("c", "t1", ok=False, unfinished_todos=0).interrupted
