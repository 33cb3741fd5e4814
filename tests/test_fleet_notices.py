"""The fleet's notices (supervisor/core/notices.py): every kind comes back from its payload as
it was sent, whatever its text (lone surrogates included); a payload that is no notice is
refused with NoticeError and nothing else; a value that could not be sent is refused when it is
made. On a real database: the store's and the engine's own notices decode, and a malformed
payload on the wire is dropped, logged once, while the listener goes on delivering."""

from __future__ import annotations

import json
import logging
from typing import Any

import psycopg
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from supervisor.fleet.fleet import Fleet
from supervisor.core.notices import (
    CHANNEL,
    Beat,
    Entries,
    Notice,
    NoticeError,
    Queued,
    Stop,
    Stopped,
    Stopping,
    decode,
)
from supervisor.store.store import open_store

DEADLINE = 30.0

#: Names as a host, channel or request id can be: any non-empty text of real characters.
names = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30)
#: Any text, lone surrogates included (an error message naming a file, say).
texts = st.text(max_size=30)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
notices = st.one_of(
    st.builds(Beat, names),
    st.builds(Queued, names, names),
    st.builds(Entries, names, st.none() | st.integers(min_value=0, max_value=2**63)),
    st.builds(Stop, names, to=names, channel=names, id=names),
    st.builds(Stopping, names, to=names, id=names),
    st.builds(Stopped, names, to=names, id=names, result=st.dictionaries(texts, json_values, max_size=6)),
)


@given(notices)
def test_every_kind_comes_back_from_its_payload_as_it_was_sent(notice: Notice) -> None:
    payload = notice.encode()
    payload.encode("ascii")  # (sendable whatever it holds: every other character is escaped)
    assert decode(payload) == notice
    assert json.loads(payload)["kind"] == notice.KIND


def test_the_wire_form_of_each_kind() -> None:
    assert json.loads(Beat("h1").encode()) == {"kind": "beat", "from": "h1"}
    assert json.loads(Queued("h1", "ch").encode()) == {"kind": "queued", "from": "h1", "channel": "ch"}
    assert json.loads(Entries("h1", 7).encode()) == {"kind": "entries", "from": "h1", "last": 7}
    assert json.loads(Stop("h1", to="h2", channel="ch", id="r").encode()) == {
        "kind": "stop", "from": "h1", "to": "h2", "channel": "ch", "id": "r"}
    assert json.loads(Stopping("h2", to="h1", id="r").encode()) == {"kind": "stopping", "from": "h2", "to": "h1",
                                                                    "id": "r"}
    assert json.loads(Stopped("h2", to="h1", id="r", result={"ok": True}).encode()) == {
        "kind": "stopped", "from": "h2", "to": "h1", "id": "r", "result": {"ok": True}}


def test_a_lone_surrogate_in_a_result_travels_and_comes_back_as_it_was() -> None:
    notice = Stopped("h2", to="h1", id="r", result={"error": "cannot open /tmp/\udcff: gone", "\ud800": [1]})
    payload = notice.encode()
    assert "\\udcff" in payload and payload.isascii()
    back = decode(payload)
    assert isinstance(back, Stopped) and back.result["error"] == "cannot open /tmp/\udcff: gone"


@pytest.mark.parametrize("make", [
    lambda: Queued("h1", "ch\udc80"),  # (a name keys rows and files: it must be real text)
    lambda: Beat("\ud800"),
    lambda: Beat(""),
    lambda: Stop("h1", to="h2", channel="", id="r"),
    lambda: Entries("h1", True),  # type: ignore[arg-type]
    lambda: Entries("h1", "3"),  # type: ignore[arg-type]
    lambda: Stopped("h2", to="h1", id="r", result=[1]),  # type: ignore[arg-type]
    lambda: Stopped("h2", to="h1", id="r", result={1: 2}),  # type: ignore[dict-item]
    lambda: Queued(None, "ch"),  # type: ignore[arg-type]
])
def test_a_notice_that_could_not_be_read_back_cannot_be_made(make: Any) -> None:
    with pytest.raises(NoticeError):
        make()


@pytest.mark.parametrize(("payload", "why"), [
    ("", "not JSON"),
    ("stop", "not JSON"),
    ('{"kind": "beat", "from": "h1"', "not JSON"),
    ("[" * 100_000, "not JSON"),  # (deeper than the parser recurses)
    ('{"kind": "entries", "from": "h1", "last": NaN}', "NaN"),
    ('{"kind": "stopped", "from": "h2", "to": "h1", "id": "r", "result": {"cpu_ms": 1e400}}', "out of range"),
    ('["stop"]', "JSON object"),
    ('"stop"', "JSON object"),
    ("null", "JSON object"),
    ("{}", "unknown kind"),
    ('{"kind": "halt", "from": "h1"}', "unknown kind str 'halt'"),
    ('{"kind": ["stop"], "from": "h1"}', "unknown kind"),
    ('{"kind": "beat"}', "without 'from'"),
    ('{"kind": "queued", "from": "h1"}', "without 'channel'"),
    ('{"kind": "stop", "from": "h1", "to": "h2", "id": "r"}', "without 'channel'"),
    ('{"kind": "stopped", "from": "h2", "to": "h1", "id": "r"}', "without 'result'"),
    ('{"kind": "stopped", "from": "h2", "to": "h1", "id": "r", "result": "ok"}', "'result' must be a JSON object"),
    ('{"kind": "stop", "from": "h1", "to": 2, "channel": "ch", "id": "r"}', "'to' must be a non-empty string"),
    ('{"kind": "queued", "from": "", "channel": "ch"}', "'from' must be a non-empty string"),
    ('{"kind": "queued", "from": "h1", "channel": "\\udc80"}', "lone surrogate"),
    ('{"kind": "entries", "from": "h1", "last": "7"}', "'last' must be an integer"),
    ('{"kind": "entries", "from": "h1", "last": false}', "'last' must be an integer"),
    ('{"kind": "entries", "from": "h1", "last": 1.5}', "'last' must be an integer"),
    ('{"kind": "entries", "from": "h1", "last": 1' + "0" * 5000 + "}", "not JSON"),  # (past int's digit limit)
])
def test_a_payload_that_is_no_notice_is_refused_with_the_reason(payload: str, why: str) -> None:
    with pytest.raises(NoticeError, match=why):
        decode(payload)


@given(st.text(max_size=200))
def test_any_text_decodes_to_a_notice_or_raises_notice_error_and_nothing_else(payload: str) -> None:
    try:
        decode(payload)
    except NoticeError:
        pass


def test_keys_a_kind_does_not_know_are_ignored() -> None:
    # (A host of a newer version may add one: the fleet's hosts are not upgraded at once.)
    assert decode('{"kind": "queued", "from": "h1", "channel": "ch", "agent": "bot"}') == Queued("h1", "ch")


# ---------------------------------------------------------------- on the wire


async def test_the_stores_notices_decode_and_a_malformed_one_is_dropped_while_the_listener_goes_on(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[Notice] = []
    got: dict[str, trio.Event] = {"ready": trio.Event(), "last": trio.Event()}

    def deliver(notice: Notice) -> None:
        heard.append(notice)
        if isinstance(notice, Stop):
            got[notice.id].set()

    def notify(*payloads: str) -> None:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for payload in payloads:
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))

    caplog.set_level(logging.DEBUG, logger="corral.fleet")
    async with open_store(postgres_url, host="h1", lease=2.0) as store, trio.open_nursery() as nursery:
        fleet = Fleet(store, "h1", 2.0)
        await nursery.start(fleet.listen, deliver)
        with trio.fail_after(DEADLINE):
            while not got["ready"].is_set():  # (the listener's connection LISTENs once its thread is in)
                await trio.to_thread.run_sync(notify, Stop("h2", to="h1", channel="ch", id="ready").encode())
                with trio.move_on_after(0.1):
                    await got["ready"].wait()
        heard.clear()
        # The store's own: a message row's (queue_insert) and its commit's positions (the engine's SQL).
        entry = await store.accept_message("ch", "bot", "human:ann", "hello", generation=0, nudge=False).committed()
        assert entry is not None and entry.pos is not None
        await trio.to_thread.run_sync(notify, "not json", '{"kind": "stop", "from": "h2"}', '{"kind": "halt"}',
                                      Beat("h2").encode(), Stop("h2", to="h1", channel="ch", id="last").encode())
        with trio.fail_after(DEADLINE):
            await got["last"].wait()
        nursery.cancel_scope.cancel()
    # Each in its order; the beat is the listener's own (proof of life), never delivered.
    assert heard == [Queued("h1", "ch"), Entries("h1", entry.pos), Stop("h2", to="h1", channel="ch", id="last")]
    assert fleet.malformed == 3
    dropped = [r for r in caplog.records if "malformed fleet notice" in r.getMessage()]
    assert [r.levelno for r in dropped] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "not JSON" in dropped[0].getMessage() and "without 'to'" in dropped[1].getMessage()
