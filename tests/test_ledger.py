"""Ordinary tests for the pure stop ledger, one or more per line of the stop contract.

Each test is named after the docs/stop-contract.md line (or ledger rule) it proves. The
ledger is synchronous and does no I/O, so these are plain sync tests: a scenario is a
sequence of driver calls, and the assertions are on the decisions the ledger returns.
"""

from __future__ import annotations

import pytest

from supervisor.core.ledger import (
    EditOutcome,
    LedgerError,
    OutputKind,
    Phase,
    QueuedMessage,
    StopLedger,
)


def _snapshot(ledger: StopLedger, channel: str) -> tuple[object, ...]:
    """Everything observable about one channel, to prove a stop elsewhere left it alone."""
    turn = ledger.current_turn(channel)
    return (
        ledger.generation(channel),
        ledger.queued(channel),
        turn,
        ledger.turn_phase(channel),
        ledger.is_busy(channel),
        ledger.is_stale(channel, turn) if turn else None,
        ledger.may_route(channel, from_human=False),
    )


def _run_turn(ledger: StopLedger, channel: str, message_id: int, turn_id: str, *, human: bool = True) -> None:
    """Accept a message and take it as the channel's current turn, past the point of no return."""
    ledger.accept(channel, "bot", message_id, human=human)
    take = ledger.take(channel, "bot", turn_id)
    assert take.ticket is not None and take.ticket.message.id == message_id
    assert ledger.may_start(channel, turn_id)


# ---------------------------------------------------------------- 1. scoped


def test_contract_01_stop_is_scoped_to_its_channel() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "ta")
    _run_turn(ledger, "b", 2, "tb")
    ledger.accept("b", "bot", 3, human=True)
    before = _snapshot(ledger, "b")

    decision = ledger.stop("a")

    assert decision.channel == "a"
    assert decision.stopped_turn == "ta"
    assert _snapshot(ledger, "b") == before
    # B's turn lives on and B's queued message still runs.
    assert ledger.keep_process("b", "tb")
    assert ledger.keep_output("b", "tb", OutputKind.OTHER)
    assert ledger.end_turn("b", "tb", ok=True, unfinished_todos=0).stale is False
    take = ledger.take("b", "bot", "tb2")
    assert take.ticket is not None and take.ticket.message.id == 3


def test_contract_01_stop_of_an_idle_channel_stays_in_that_channel() -> None:
    # openagents #656: a stop naming an idle channel fell through to stop-everything.
    ledger = StopLedger()
    _run_turn(ledger, "busy", 1, "t1")
    before = _snapshot(ledger, "busy")

    decision = ledger.stop("idle")

    assert decision.channel == "idle" and decision.stopped_turn is None
    assert _snapshot(ledger, "busy") == before
    assert ledger.generation("idle") == 1


def test_stop_all_stops_only_busy_channels() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "running", 1, "t1")
    ledger.accept("queued", "bot", 2, human=True)
    _run_turn(ledger, "idle", 3, "t3")  # a channel that has worked, and is done
    ledger.end_turn("idle", "t3", ok=True, unfinished_todos=0)
    idle_before = _snapshot(ledger, "idle")

    decisions = ledger.stop_all()

    assert {d.channel for d in decisions} == {"running", "queued"}
    by_channel = {d.channel: d for d in decisions}
    assert by_channel["running"].stopped_turn == "t1"
    assert [m.id for m in by_channel["queued"].dropped] == [2]
    assert all(d.notice_due and not d.repeat for d in decisions)
    assert ledger.generation("running") == 1 and ledger.generation("queued") == 1
    assert _snapshot(ledger, "idle") == idle_before


def test_stop_all_with_nothing_running_stops_nothing() -> None:
    ledger = StopLedger()
    ledger.stop("a")  # a seen, idle channel
    assert ledger.stop_all() == []
    assert ledger.generation("a") == 1


# ---------------------------------------------------------------- 2. on record at once


def test_contract_02_stop_moves_generation_before_it_returns() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    assert not ledger.is_stale("a", "t1")

    decision = ledger.stop("a")

    # Nothing else has been called: the returned decision and the ledger's state agree now.
    assert decision.generation == ledger.generation("a") == 1
    assert ledger.is_stale("a", "t1")


# ---------------------------------------------------------------- 3. queued work dropped


def test_contract_03_queued_message_is_dropped_by_stop() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.accept("a", "bot", 2, human=True)
    ledger.accept("a", "bot", 3, human=False)

    decision = ledger.stop("a")

    assert [m.id for m in decision.dropped] == [2, 3]
    assert ledger.queued("a") == ()
    ledger.end_turn("a", "t1", ok=True, unfinished_todos=0)
    assert ledger.take("a", "bot", "t2").ticket is None


def test_contract_03_message_taken_off_queue_before_stop_never_starts() -> None:
    # openagents #676 hole 1: the message had left the queue when the stop cleared it.
    ledger = StopLedger()
    ledger.accept("a", "bot", 1, human=True)
    ticket = ledger.take("a", "bot", "t1").ticket
    assert ticket is not None

    decision = ledger.stop("a")

    assert decision.stopped_turn == "t1"
    assert decision.dropped == ()
    assert ledger.may_start("a", "t1") is False
    assert ledger.keep_process("a", "t1") is False


def test_contract_03_half_prepared_turn_never_starts_at_any_later_point_of_no_return() -> None:
    # openagents #676 hole 2: the stop landed during the turn's preparation round trips.
    ledger = StopLedger()
    ledger.accept("a", "bot", 1, human=True)
    ledger.take("a", "bot", "t1")
    assert ledger.turn_phase("a") is Phase.PREPARING
    ledger.stop("a")
    for _ in range(3):  # every later point of no return says no
        assert ledger.may_start("a", "t1") is False
    assert ledger.turn_phase("a") is Phase.PREPARING


def test_contract_03_restored_message_from_an_older_generation_is_dropped_on_take() -> None:
    ledger = StopLedger()
    ledger.restore("a", 2)
    ledger.requeue("a", QueuedMessage(1, 1, True, agent="bot"))
    ledger.requeue("a", QueuedMessage(2, 2, True, agent="bot"))

    take = ledger.take("a", "bot", "t1")

    assert [m.id for m in take.dropped] == [1]
    assert take.ticket is not None and take.ticket.message.id == 2


# ---------------------------------------------------------------- 4. new work runs


def test_contract_04_message_accepted_after_stop_runs_while_stopped_turn_winds_down() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.stop("a")
    message = ledger.accept("a", "bot", 2, human=True)
    assert message.generation == 1

    # The stopped turn is still tearing down: its message waits, it is not dropped.
    assert ledger.queued("a") == (message,)
    assert ledger.end_turn("a", "t1", ok=False, unfinished_todos=0).stale is True

    take = ledger.take("a", "bot", "t2")
    assert take.dropped == ()
    assert take.ticket is not None and take.ticket.message.id == 2
    assert ledger.may_start("a", "t2") is True
    assert ledger.keep_process("a", "t2") is True


# ---------------------------------------------------------------- 5. point of no return


def test_contract_05_may_start_true_moves_turn_to_started() -> None:
    ledger = StopLedger()
    ledger.accept("a", "bot", 1, human=True)
    ledger.take("a", "bot", "t1")
    assert ledger.turn_phase("a") is Phase.PREPARING
    assert ledger.may_start("a", "t1") is True
    assert ledger.turn_phase("a") is Phase.STARTED


def test_contract_05_may_start_false_after_stop() -> None:
    ledger = StopLedger()
    ledger.accept("a", "bot", 1, human=True)
    ledger.take("a", "bot", "t1")
    ledger.stop("a")
    assert ledger.may_start("a", "t1") is False


def test_contract_05_may_start_false_for_a_turn_that_is_not_current() -> None:
    ledger = StopLedger()
    assert ledger.may_start("a", "never-taken") is False
    _run_turn(ledger, "a", 1, "t1")
    ledger.end_turn("a", "t1", ok=True, unfinished_todos=0)
    assert ledger.may_start("a", "t1") is False


# ---------------------------------------------------------------- 6. late registrations die


def test_contract_06_keep_process_false_after_stop() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.keep_process("a", "t1") is True
    ledger.stop("a")
    assert ledger.keep_process("a", "t1") is False


def test_contract_06_keep_process_false_for_previous_turn_after_successor_started() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.stop("a")
    ledger.accept("a", "bot", 2, human=True)
    ledger.end_turn("a", "t1", ok=False, unfinished_todos=0)
    ledger.take("a", "bot", "t2")
    # A late registration for the stopped turn dies; the successor's processes live.
    assert ledger.keep_process("a", "t1") is False
    assert ledger.keep_process("a", "t2") is True


# ---------------------------------------------------------------- 8. output discarded


def test_contract_08_keep_output_keeps_only_session_for_stale_turn() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.keep_output("a", "t1", OutputKind.OTHER) is True
    assert ledger.keep_output("a", "t1", OutputKind.SESSION) is True
    ledger.stop("a")
    assert ledger.keep_output("a", "t1", OutputKind.OTHER) is False
    assert ledger.keep_output("a", "t1", OutputKind.SESSION) is True


# ---------------------------------------------------------------- 9. nudges


def _nudge_turn(ledger: StopLedger, channel: str, message_id: int, turn_id: str) -> None:
    """Queue and take the supervisor's own "please continue" message, as the driver does."""
    ledger.accept(channel, "bot", message_id, human=False, nudge=True)
    ticket = ledger.take(channel, "bot", turn_id).ticket
    assert ticket is not None and ticket.message.nudge


def test_nudge_only_after_ok_turn_with_unfinished_todos() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=2).nudge is True


def test_nudge_not_after_failed_turn() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=False, unfinished_todos=2).nudge is False


def test_nudge_not_when_todos_are_finished() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=0).nudge is False


def test_nudge_at_most_max_nudges_in_a_row() -> None:
    ledger = StopLedger(max_nudges=2)
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=5).nudge is True
    _nudge_turn(ledger, "a", 2, "t2")
    assert ledger.end_turn("a", "t2", ok=True, unfinished_todos=5).nudge is True
    _nudge_turn(ledger, "a", 3, "t3")
    assert ledger.end_turn("a", "t3", ok=True, unfinished_todos=5).nudge is False


def test_nudge_count_is_reset_by_a_human_message() -> None:
    ledger = StopLedger(max_nudges=1)
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=5).nudge is True
    _nudge_turn(ledger, "a", 2, "t2")
    assert ledger.end_turn("a", "t2", ok=True, unfinished_todos=5).nudge is False  # limit reached
    _run_turn(ledger, "a", 3, "t3", human=True)
    assert ledger.end_turn("a", "t3", ok=True, unfinished_todos=5).nudge is True


def test_nudge_count_is_not_reset_by_the_nudge_itself() -> None:
    ledger = StopLedger(max_nudges=1)
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=5).nudge is True
    for n in range(2, 5):  # even if the driver keeps feeding nudges, none is granted
        _nudge_turn(ledger, "a", n, f"t{n}")
        assert ledger.end_turn("a", f"t{n}", ok=True, unfinished_todos=5).nudge is False


def test_contract_09_no_nudge_for_a_stale_turn() -> None:
    # openagents #676: the nudge of the turn being stopped brought the agent back to life.
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.stop("a")
    decision = ledger.end_turn("a", "t1", ok=True, unfinished_todos=4)
    assert decision.nudge is False
    assert decision.stale is True


def test_contract_09_queued_nudge_is_dropped_by_stop() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=4).nudge is True
    ledger.accept("a", "bot", 2, human=False, nudge=True)
    decision = ledger.stop("a")
    assert [m.id for m in decision.dropped] == [2]
    assert ledger.take("a", "bot", "t2").ticket is None


def test_nudge_max_nudges_zero_turns_it_off() -> None:
    ledger = StopLedger(max_nudges=0)
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=4).nudge is False


def test_nudge_per_call_max_nudges_zero_turns_it_off() -> None:
    ledger = StopLedger(max_nudges=3)
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=4, max_nudges=0).nudge is False


def test_nudge_per_call_max_nudges_overrides_the_default() -> None:
    ledger = StopLedger(max_nudges=0)
    _run_turn(ledger, "a", 1, "t1")
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=4, max_nudges=1).nudge is True


def test_nudge_not_when_a_message_is_queued() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.accept("a", "bot", 2, human=True)
    assert ledger.end_turn("a", "t1", ok=True, unfinished_todos=4).nudge is False


def test_negative_max_nudges_is_rejected() -> None:
    with pytest.raises(ValueError):
        StopLedger(max_nudges=-1)


# ---------------------------------------------------------------- 10. the notice


def test_contract_10_stop_with_nothing_running_still_owes_a_notice() -> None:
    ledger = StopLedger()
    decision = ledger.stop("a")
    assert decision.notice_due is True
    assert decision.repeat is False
    assert decision.stopped_turn is None and decision.dropped == ()


def test_contract_10_a_burst_of_stops_owes_one_notice() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    decisions = [ledger.stop("a") for _ in range(5)]
    assert [d.notice_due for d in decisions] == [True, False, False, False, False]


def test_contract_10_repeat_names_the_stored_notice() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    first = ledger.stop("a")
    assert ledger.stop("a").notice_seq is None  # notice still pending
    ledger.notice_stored("a", first.generation, 42)
    repeat = ledger.stop("a")
    assert repeat.repeat and repeat.notice_seq == 42


def test_contract_10_notice_of_an_older_stop_is_not_recorded_for_a_newer_one() -> None:
    ledger = StopLedger()
    first = ledger.stop("a")
    _run_turn(ledger, "a", 1, "t1")
    ledger.stop("a")
    ledger.notice_stored("a", first.generation, 7)  # the first stop's notice lands late
    assert ledger.stop("a").notice_seq is None


def test_contract_10_a_genuinely_newer_stop_owes_its_own_notice() -> None:
    ledger = StopLedger()
    first = ledger.stop("a")
    ledger.notice_stored("a", first.generation, 1)
    _run_turn(ledger, "a", 1, "t1")
    second = ledger.stop("a")
    assert second.notice_due and not second.repeat and second.notice_seq is None
    # Until the second stop's notice is stored, a repeat must not name the first one's.
    assert ledger.stop("a").notice_seq is None


# ---------------------------------------------------------------- 11. repeats


def test_contract_11_repeat_stop_does_not_move_generation_or_drop_message_typed_after_first_press() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    first = ledger.stop("a")
    typed = ledger.accept("a", "bot", 2, human=True)

    repeat = ledger.stop("a")  # a client's automatic re-send

    assert repeat.repeat is True
    assert repeat.generation == first.generation == ledger.generation("a")
    assert repeat.dropped == () and repeat.stopped_turn is None and not repeat.notice_due
    assert ledger.queued("a") == (typed,)
    ledger.end_turn("a", "t1", ok=False, unfinished_todos=0)
    take = ledger.take("a", "bot", "t2")
    assert take.ticket is not None and take.ticket.message.id == 2


def test_contract_11_stop_after_a_new_turn_began_is_not_a_repeat() -> None:
    ledger = StopLedger()
    ledger.stop("a")
    _run_turn(ledger, "a", 1, "t1")
    decision = ledger.stop("a")
    assert decision.repeat is False
    assert decision.generation == 2
    assert decision.stopped_turn == "t1"


def test_contract_11_take_that_only_drops_does_not_end_the_repeat_window() -> None:
    ledger = StopLedger()
    ledger.stop("a")
    ledger.requeue("a", QueuedMessage(1, 0, True, agent="bot"))  # restored, from before the stop
    take = ledger.take("a", "bot", "t1")
    assert take.ticket is None and [m.id for m in take.dropped] == [1]
    assert ledger.stop("a").repeat is True


def test_contract_11_a_turn_the_store_refused_to_begin_does_not_end_the_repeat_window() -> None:
    # (A fleet) a row queued under the new generation, dropped by the stop in the store.
    ledger = StopLedger()
    ledger.stop("a")
    ledger.requeue("a", QueuedMessage(1, 1, True, agent="bot"))
    take = ledger.take("a", "bot", "t1")
    assert take.ticket is not None
    ledger.unbegin("a", "t1")
    assert ledger.current_turn("a", "bot") is None
    assert ledger.stop("a").repeat is True
    ledger.accept("a", "bot", 2, human=True)
    assert ledger.take("a", "bot", "t2").ticket is not None and ledger.may_start("a", "t2")
    with pytest.raises(LedgerError):
        ledger.unbegin("a", "t2")  # past its point of no return: it began


def test_contract_11_repeat_via_stop_all_keeps_message_typed_after_first_press() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.stop("a")
    ledger.accept("a", "bot", 2, human=True)
    (decision,) = ledger.stop_all()
    assert decision.repeat is True and decision.dropped == ()
    assert [m.id for m in ledger.queued("a")] == [2]


# ---------------------------------------------------------------- 12. routing rests


def test_contract_12_may_route_rests_after_stop_until_human_message_accepted() -> None:
    ledger = StopLedger()
    assert ledger.may_route("a", from_human=False) is True
    ledger.stop("a")
    assert ledger.may_route("a", from_human=False) is False
    ledger.accept("a", "bot", 1, human=False)  # an agent's message does not lift the rest
    assert ledger.may_route("a", from_human=False) is False
    ledger.accept("a", "bot", 2, human=True)
    assert ledger.may_route("a", from_human=False) is True


def test_contract_12_human_messages_are_never_gated() -> None:
    ledger = StopLedger()
    ledger.stop("a")
    assert ledger.may_route("a", from_human=True) is True


def test_contract_12_routing_rest_is_per_channel() -> None:
    ledger = StopLedger()
    ledger.stop("a")
    assert ledger.may_route("b", from_human=False) is True


def test_contract_12_human_message_dropped_by_a_later_stop_does_not_lift_the_later_rest() -> None:
    ledger = StopLedger()
    ledger.accept("a", "bot", 1, human=True)
    ledger.stop("a")
    assert ledger.may_route("a", from_human=False) is False


# ---------------------------------------------------------------- restore


def test_restore_never_moves_a_generation_back() -> None:
    ledger = StopLedger()
    ledger.stop("a")
    _run_turn(ledger, "a", 1, "t1")
    ledger.stop("a")
    assert ledger.generation("a") == 2
    ledger.restore("a", 1)
    assert ledger.generation("a") == 2
    assert ledger.is_stale("a", "t1")  # the stopped turn stays stopped
    ledger.restore("a", 5)
    assert ledger.generation("a") == 5


def test_restore_sets_generation_of_new_messages() -> None:
    ledger = StopLedger()
    ledger.restore("a", 3)
    assert ledger.accept("a", "bot", 1, human=True).generation == 3


# ---------------------------------------------------------------- protocol violations


def test_ledger_error_when_taking_a_second_turn_in_a_busy_channel() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.accept("a", "bot", 2, human=True)
    with pytest.raises(LedgerError):
        ledger.take("a", "bot", "t2")
    # Nothing moved: the queued message is still there for the right take.
    assert [m.id for m in ledger.queued("a")] == [2]
    assert ledger.current_turn("a") == "t1"


def test_ledger_error_when_taking_during_a_stopped_turn_teardown() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.stop("a")
    with pytest.raises(LedgerError):
        ledger.take("a", "bot", "t2")


def test_ledger_error_when_ending_a_turn_that_is_not_running() -> None:
    ledger = StopLedger()
    with pytest.raises(LedgerError):
        ledger.end_turn("a", "t1", ok=True, unfinished_todos=0)
    _run_turn(ledger, "a", 1, "t1")
    with pytest.raises(LedgerError):
        ledger.end_turn("a", "other", ok=True, unfinished_todos=0)
    assert ledger.current_turn("a") == "t1"
    ledger.end_turn("a", "t1", ok=True, unfinished_todos=0)
    with pytest.raises(LedgerError):
        ledger.end_turn("a", "t1", ok=True, unfinished_todos=0)


def test_ledger_error_is_a_runtime_error() -> None:
    # The boundary translates one internal type; callers that catch RuntimeError still see it.
    assert issubclass(LedgerError, RuntimeError)


# ---------------------------------------------------------------- 17. a stop that cannot be stored is undone


def test_contract_17_abort_stop_restores_the_channel_exactly() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1")
    ledger.accept("a", "bot", 2, human=True)
    ledger.accept("a", "bot", 3, human=False)
    _run_turn(ledger, "b", 4, "t4")
    before = {name: _snapshot(ledger, name) for name in ("a", "b")}

    decision = ledger.stop("a")
    assert ledger.is_stale("a", "t1") and ledger.queued("a") == ()
    assert ledger.abort_stop(decision) is True

    assert {name: _snapshot(ledger, name) for name in ("a", "b")} == before
    assert [m.id for m in ledger.queued("a")] == [2, 3]
    assert not ledger.is_stale("a", "t1") and ledger.may_start("a", "t1")
    # A retried stop is a real stop: the generation moves, the messages drop, a notice is due.
    retry = ledger.stop("a")
    assert not retry.repeat and retry.notice_due and retry.generation == 1
    assert [m.id for m in retry.dropped] == [2, 3] and retry.stopped_turn == "t1"


def test_contract_17_abort_stop_restamps_work_begun_while_the_record_was_stored() -> None:
    ledger = StopLedger()
    ledger.accept("a", "bot", 1, human=False)
    decision = ledger.stop("a")
    late = ledger.accept("a", "bot", 2, human=True)  # stamped with the stop's generation
    assert late.generation == 1 and ledger.may_route("a", from_human=False)  # a human spoke
    assert ledger.abort_stop(decision) is True
    assert ledger.generation("a") == 0
    assert [(m.id, m.generation) for m in ledger.queued("a")] == [(1, 0), (2, 0)]
    assert ledger.may_route("a", from_human=False)  # the human lifted the rest; it stays lifted
    take = ledger.take("a", "bot", "t1")
    assert take.ticket is not None and take.ticket.message.id == 1 and take.dropped == ()


def test_contract_17_abort_stop_keeps_the_rest_and_notice_of_an_earlier_stop() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "a", 1, "t1", human=False)
    first = ledger.stop("a")
    ledger.notice_stored("a", first.generation, 99)
    ledger.end_turn("a", "t1", ok=True, unfinished_todos=0)
    _run_turn(ledger, "a", 2, "t2", human=False)  # an agent message: routing still rests
    second = ledger.stop("a")
    assert ledger.abort_stop(second) is True
    assert ledger.generation("a") == 1 and ledger.notice_seq("a") == 99
    assert not ledger.may_route("a", from_human=False)
    assert not ledger.is_stale("a", "t2")


def test_contract_17_abort_of_a_superseded_stop_changes_nothing() -> None:
    ledger = StopLedger()
    ledger.accept("a", "bot", 1, human=True)
    first = ledger.stop("a")
    ledger.accept("a", "bot", 2, human=True)
    take = ledger.take("a", "bot", "t2")  # a turn began: the next stop is not a repeat
    assert take.ticket is not None
    second = ledger.stop("a")
    assert ledger.abort_stop(first) is False
    assert ledger.generation("a") == second.generation == 2 and ledger.queued("a") == ()
    with pytest.raises(LedgerError):
        ledger.abort_stop(ledger.stop("a"))  # a repeat has nothing to undo


# ---------------------------------------------------------------- several agents per channel


def test_lanes_of_one_channel_run_turns_at_the_same_time() -> None:
    ledger = StopLedger()
    ledger.accept("ch", "ann", 1, human=True)
    ledger.accept("ch", "bob", 2, human=True)
    ann = ledger.take("ch", "ann", "ta").ticket
    bob = ledger.take("ch", "bob", "tb").ticket
    assert ann is not None and bob is not None and (ann.agent, bob.agent) == ("ann", "bob")
    assert ledger.current_turns("ch") == {"ann": "ta", "bob": "tb"}
    assert ledger.may_start("ch", "ta") and ledger.may_start("ch", "tb")
    with pytest.raises(LedgerError):  # one turn at a time per lane
        ledger.take("ch", "ann", "ta2")


def test_contract_12_one_stop_names_every_turn_of_the_channel_with_its_agent_and_drops_every_lane() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "ch", 1, "ta")  # lane "bot"
    ledger.accept("ch", "ann", 2, human=True)
    ledger.take("ch", "ann", "tann")
    ledger.accept("ch", "ann", 3, human=True)
    ledger.accept("ch", "bob", 4, human=False)

    decision = ledger.stop("ch")

    assert sorted(decision.stopped_turns) == [("ann", "tann"), ("bot", "ta")]
    assert [(m.id, m.agent) for m in decision.dropped] == [(3, "ann"), (4, "bob")]
    assert decision.notice_due and all(ledger.is_stale("ch", t) for _, t in decision.stopped_turns)
    assert ledger.queued("ch") == ()


def test_contract_17_abort_stop_restores_every_lane_exactly() -> None:
    ledger = StopLedger()
    ledger.accept("ch", "ann", 1, human=True)
    ledger.take("ch", "ann", "tann")
    ledger.accept("ch", "ann", 2, human=True)
    ledger.accept("ch", "bob", 3, human=False)
    ledger.accept("ch", "bob", 4, human=False)
    before = {a: ledger.queued("ch", a) for a in ("ann", "bob")}

    decision = ledger.stop("ch")
    ledger.accept("ch", "bob", 5, human=False)  # while the record was being stored
    assert ledger.abort_stop(decision)

    assert ledger.queued("ch", "ann") == before["ann"]
    assert [m.id for m in ledger.queued("ch", "bob")] == [3, 4, 5]
    assert all(m.generation == 0 for m in ledger.queued("ch"))
    assert not ledger.is_stale("ch", "tann") and not ledger.rests("ch")


def test_contract_12_a_routed_message_is_refused_while_the_channel_rests_and_a_human_lifts_it() -> None:
    ledger = StopLedger()
    ledger.stop("ch")
    assert ledger.rests("ch") and not ledger.may_route("ch", from_human=False)
    with pytest.raises(LedgerError):
        ledger.accept("ch", "bob", 1, human=False, routed=True, hops=1)
    assert ledger.queued("ch") == ()
    ledger.accept("ch", "ann", 2, human=True)
    assert ledger.may_route("ch", from_human=False)
    assert ledger.accept("ch", "bob", 3, human=False, routed=True, hops=1).hops == 1


def test_contract_12_a_stale_turn_may_not_route() -> None:
    ledger = StopLedger()
    _run_turn(ledger, "ch", 1, "t1")
    assert ledger.may_route("ch", from_human=False, turn_id="t1")
    ledger.stop("ch")
    ledger.accept("ch", "bot", 2, human=True)  # the rest is lifted; the stopped turn is still stale
    assert not ledger.may_route("ch", from_human=False, turn_id="t1")


def test_restore_brings_back_the_rest_and_the_repeat_window() -> None:
    ledger = StopLedger()
    ledger.restore("ch", 3, rests=True, stopped=True)
    assert ledger.rests("ch") and ledger.in_repeat_window("ch")
    assert ledger.stop("ch").repeat  # a re-sent stop after the restart does not move the generation
    assert ledger.generation("ch") == 3


# ---------------------------------------------------------------- 20: queue edits


def test_contract_21_taking_back_a_message_sent_to_two_agents_takes_each_lanes_copy() -> None:
    ledger = StopLedger()
    ledger.accept("c", "x", 10, human=True)
    ledger.accept("c", "y", 11, human=True, entry=10)  # (the second agent's row repeats entry 10)
    ledger.accept("c", "x", 12, human=True)
    edit = ledger.take_back("c", 10)
    assert edit.outcome is EditOutcome.DONE and [(m.id, m.agent) for m in edit.messages] == [(10, "x"), (11, "y")]
    assert [m.id for m in ledger.queued("c")] == [12]
    assert ledger.take("c", "y", "t1").ticket is None  # nothing of it starts in y's lane
    assert [m.id for m in ledger.stop("c").dropped] == [12]  # a stop after it drops only the rest
    assert ledger.take_back("c", 10).outcome is EditOutcome.NOT_QUEUED


def test_contract_21_a_message_a_turn_took_is_running_and_stays_taken() -> None:
    ledger = StopLedger()
    ledger.accept("c", "x", 10, human=True)
    ticket = ledger.take("c", "x", "t1").ticket
    assert ticket is not None
    for edit in (ledger.take_back("c", 10), ledger.move_first("c", 10)):
        assert edit.outcome is EditOutcome.RUNNING and edit.running == (("x", "t1"),)
    assert ledger.may_start("c", "t1")  # the turn runs on: an edit never makes it stale
    ledger.end_turn("c", "t1", ok=True, unfinished_todos=0)
    assert ledger.take_back("c", 10).outcome is EditOutcome.NOT_QUEUED


def test_contract_21_a_move_first_heads_its_lane_and_an_undo_puts_each_edit_back() -> None:
    ledger = StopLedger()
    for seq in (1, 2, 3):
        ledger.accept("c", "x", seq, human=True)
    moved = ledger.move_first("c", 3)
    assert [m.id for m in ledger.queued("c", "x")] == [3, 1, 2]
    ledger.undo_edit(moved)
    assert [m.id for m in ledger.queued("c", "x")] == [1, 2, 3]
    taken = ledger.take_back("c", 2)
    ledger.undo_edit(taken)
    assert [m.id for m in ledger.queued("c", "x")] == [1, 2, 3]
    taken = ledger.take_back("c", 2)
    ledger.stop("c")  # a stop since the take-back: its undo brings back nothing the stop would have dropped
    ledger.undo_edit(taken)
    assert ledger.queued("c") == ()
