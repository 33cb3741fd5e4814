"""A stop's result and an accepted message as JSON (supervisor/core/fields.py): derived from
the dataclass's fields, so every field goes out and comes back (a stop forwarded to another
fleet host once lost ``ended`` to a hand-written copy), in the order the API has always
printed; a value that is not one is refused, naming the field."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor import Accepted, StopResult
from supervisor.core.fields import from_json

names = st.text(max_size=12)
maybe_names = st.none() | names
pids = st.lists(st.integers(min_value=1, max_value=2**22), max_size=4)
# (Milliseconds as the result keeps them: rounded to the microsecond, as to_json writes them.)
millis = st.floats(min_value=0, max_value=1e7, allow_nan=False).map(lambda v: round(v, 3))
turns = st.lists(st.fixed_dictionaries({"agent": names, "turn": names, "killed": pids, "swept": pids}), max_size=3)


def results(channels: st.SearchStrategy[list[StopResult] | None]) -> st.SearchStrategy[StopResult]:
    return st.builds(
        StopResult, channel=maybe_names, generation=st.integers(min_value=0, max_value=2**40),
        repeat=st.booleans(), stopped_turns=st.lists(names, max_size=3), turns=turns, killed=pids, swept=pids,
        kill=st.sampled_from([None, "cgroup", "sweep"]), ended=st.sampled_from([None, "cancelled", "killed"]),
        cpu_ms=millis, dropped=st.integers(min_value=0, max_value=1000), notice_seq=st.none() | st.integers(0, 2**53),
        elapsed_ms=millis, ok=st.booleans(), error=maybe_names, channels=channels,
    )


stop_results = results(st.none() | st.lists(results(st.none()), max_size=3))
accepted = st.builds(Accepted, seq=st.integers(0, 2**53), channel=names, agent=names, generation=st.integers(0, 99),
                     queued=st.integers(0, 99), to=st.lists(names, max_size=3).map(tuple))


@given(stop_results)
def test_a_stop_result_comes_back_from_its_json_with_every_field(result: StopResult) -> None:
    sent = json.loads(json.dumps(result.to_json()))  # (as another host's answer arrives)
    assert StopResult.from_json(sent) == result


@given(accepted)
def test_an_accepted_message_comes_back_from_its_json_with_every_field(message: Accepted) -> None:
    assert from_json(Accepted, json.loads(json.dumps(message.to_json()))) == message


def test_the_json_forms_keep_the_apis_keys_in_its_order() -> None:
    assert list(StopResult("c", 1).to_json()) == [
        "channel", "generation", "repeat", "stopped_turns", "turns", "killed", "swept", "kill", "ended", "cpu_ms",
        "dropped", "notice_seq", "elapsed_ms", "ok", "error",
    ]  # (a stop-all's also has "channels")
    assert [f.name for f in fields(StopResult)][-1] == "channels"
    assert "channels" in StopResult(None, 0, channels=[StopResult("c", 1)]).to_json()
    assert StopResult("c", 1, cpu_ms=1.23456, elapsed_ms=2.0004).to_json()["cpu_ms"] == 1.235
    assert Accepted(5, "c", "bot", 1, 0, ("bot", "rev")).to_json() == {
        "seq": 5, "channel": "c", "agent": "bot", "generation": 1, "queued": 0, "to": ["bot", "rev"], "hints": [],
        "delivery": "queue", "interrupted": [], "dropped": [], "steered": None, "fallback": None,
        "replayed": False}


def test_a_field_missing_takes_its_default_and_a_key_no_field_names_is_ignored() -> None:
    # (An older host's answer lacks a field added since; a newer host's has one not known here.)
    assert StopResult.from_json({"channel": "c", "generation": 2, "ended": "killed", "new": 1}) == StopResult(
        "c", 2, ended="killed")


@pytest.mark.parametrize(("data", "why"), [
    ([], "a StopResult is a JSON object"),
    ({"channel": "c"}, "without 'generation'"),
    ({"channel": "c", "generation": "2"}, r"StopResult.generation is a number \(int\), not str"),
    ({"channel": "c", "generation": True}, "StopResult.generation is a number"),
    ({"channel": "c", "generation": 2.5}, "StopResult.generation is a number"),
    ({"channel": 3, "generation": 2}, "StopResult.channel is a str, not int"),
    ({"channel": "c", "generation": 2, "ok": "yes"}, "StopResult.ok is a bool"),
    ({"channel": "c", "generation": 2, "killed": [1, "2"]}, r"StopResult.killed\[1\] is a number"),
    ({"channel": "c", "generation": 2, "killed": 7}, "StopResult.killed is a list"),
    ({"channel": "c", "generation": 2, "turns": ["t1"]}, r"StopResult.turns\[0\] is a JSON object"),
    ({"channel": "c", "generation": 2, "cpu_ms": "1"}, "StopResult.cpu_ms is a number"),
    ({"channel": None, "generation": 0, "channels": [{"channel": "c"}]}, "without 'generation'"),
])
def test_a_value_that_is_no_stop_result_is_refused_naming_the_field(data: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        StopResult.from_json(data)
