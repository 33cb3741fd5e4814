"""The ledger's kept sets of busy channels (issue 40.3) under the calls the state machine of
``test_ledger_machine.py`` does not make: a fleet's ``lose``, ``forget_queue``, ``unbegin`` and
``adopt``, an interrupt and its undo, a queue edit's undo, ``know``. After every call the kept
sets equal the ones a walk of every channel computes, and the names are every channel in order.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.ledger import LedgerError, StopLedger
from supervisor.core.names import SortedNames

CHANNELS = ("a", "b", "c", "é", "A")
OPS = ("accept", "human", "take", "start", "end", "unbegin", "stop", "abort_stop", "interrupt", "abort_interrupt",
       "take_back", "move_first", "undo_edit", "lose", "forget_queue", "adopt", "shut_down", "know", "stop_all")

steps = st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(CHANNELS), st.sampled_from(("x", "y"))),
                 max_size=60)


def _walk(ledger: StopLedger) -> tuple[set[str], set[str]]:
    busy = {name for name in ledger.channels() if ledger.is_busy(name)}
    return busy, {name for name in ledger.channels() if ledger.current_turns(name)}


@given(steps)
@settings(max_examples=300, deadline=None)
def test_the_kept_busy_sets_equal_a_walk_of_every_channel(ops: list[tuple[str, str, str]]) -> None:
    ledger = StopLedger()
    known: set[str] = set()
    ids = iter(range(1, 10_000))
    undo: dict[str, object] = {}
    for op, channel, agent in ops:
        try:
            if op in ("accept", "human"):
                ledger.accept(channel, agent, next(ids), human=op == "human")
            elif op == "take":
                ledger.take(channel, agent, f"t{next(ids)}")
            elif op == "start":
                turn = ledger.current_turn(channel, agent)
                if turn is not None:
                    ledger.may_start(channel, turn)
            elif op in ("end", "unbegin"):
                turn = ledger.current_turn(channel, agent)
                if turn is not None:
                    if op == "end":
                        ledger.end_turn(channel, turn, ok=True, unfinished_todos=1)
                    else:
                        ledger.unbegin(channel, turn)
            elif op == "stop":
                undo["stop"] = ledger.stop(channel)
            elif op == "abort_stop" and "stop" in undo:
                ledger.abort_stop(undo.pop("stop"))  # type: ignore[arg-type]
            elif op == "interrupt":
                undo["interrupt"] = ledger.interrupt(channel, agent)
            elif op == "abort_interrupt" and "interrupt" in undo:
                ledger.abort_interrupt(undo.pop("interrupt"))  # type: ignore[arg-type]
            elif op in ("take_back", "move_first"):
                queued = ledger.queued(channel)
                if queued:
                    edit = getattr(ledger, op)(channel, queued[-1].entry_seq)
                    undo["edit"] = edit
            elif op == "undo_edit" and "edit" in undo:
                ledger.undo_edit(undo.pop("edit"))  # type: ignore[arg-type]
            elif op == "lose":
                ledger.lose(channel)
            elif op == "forget_queue":
                ledger.forget_queue(channel, agent)
            elif op == "adopt":
                ledger.adopt(channel)
            elif op == "shut_down":
                ledger.shut_down()
            elif op == "know":
                ledger.know([channel + "-stored", channel])
                known |= {channel + "-stored", channel}
            elif op == "stop_all":
                ledger.stop_all()
        except LedgerError:
            pass  # a call the protocol refuses changes nothing
        busy, with_turn = _walk(ledger)
        assert set(ledger.busy_channels()) == busy, (op, channel, agent)
        assert set(ledger.running_channels()) == with_turn, (op, channel, agent)
        assert list(ledger.names) == sorted(set(ledger.channels()) | known)


def test_sorted_names_add_one_or_many_and_page_after_a_name() -> None:
    names = SortedNames(["m", "c"])
    names.add("a")
    names.add("c")  # (once)
    names.update(["z", "b"])
    names.update(f"n{i:03}" for i in range(100))  # many: one sort
    assert list(names)[:4] == ["a", "b", "c", "m"] and len(names) == 105
    assert list(names) == sorted(names)
    assert list(names.after("m"))[:2] == ["n000", "n001"] and list(names.after("zz")) == []
    assert next(names.after(None)) == "a" and "b" in names and "q" not in names
