"""Text that cannot be stored never fails anyone else: refused from humans, repaired from agents.

The pure rules (``supervisor.core.text``) first, then through the supervisor and the HTTP API
with real agents and concurrent clients.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from conftest import make_config, script_agent

from supervisor import open_supervisor
from supervisor.core.errors import UsageError
from supervisor.core.text import REPLACEMENT, BadText, check_message, repair, repair_text
from supervisor.host.supervisor import UnknownChannel
from supervisor.serve.daemon import run_daemon

SLOW = 30


# ---------------------------------------------------------------- the pure rules


def test_a_human_message_with_a_lone_surrogate_is_refused_by_position_without_its_text() -> None:
    with pytest.raises(BadText) as refused:
        check_message("my password is hunter2 \ud800 ok")
    message = str(refused.value)
    assert "U+D800" in message and "character 23" in message
    assert "hunter2" not in message and "\ud800" not in message


def test_a_nul_in_a_human_message_is_refused() -> None:
    with pytest.raises(BadText, match="NUL character at character 2"):
        check_message("ab\0c")


@pytest.mark.parametrize("text", ["", "plain", "héllo 世界 🎉", "\U0001f600", "\ufffd", "tab\tnewline\n"])
def test_valid_text_passes_and_is_not_changed(text: str) -> None:
    check_message(text)
    assert repair_text(text) is text


def test_repair_replaces_each_lone_surrogate_and_keeps_nul() -> None:
    assert repair_text("a\ud83db\ude00c\udfff\0") == f"a{REPLACEMENT}b{REPLACEMENT}c{REPLACEMENT}\0"
    # Two surrogate code points side by side are still two (only JSON decoding pairs them).
    assert repair_text("\ud83d\ude00") == REPLACEMENT * 2


def test_repair_walks_meta_keys_and_values() -> None:
    meta = {"k\ud800": ["x\udc00", {"n": 1, "t": ("\ud801",)}], "ok": None, "f": 1.5}
    assert repair(meta) == {f"k{REPLACEMENT}": [f"x{REPLACEMENT}", {"n": 1, "t": [REPLACEMENT]}], "ok": None, "f": 1.5}
    for value in (repair(meta), repair_text("\ud800")):
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # storable: no error


# ---------------------------------------------------------------- through the supervisor


async def test_send_refuses_unstorable_text_author_and_channel(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        for call, what in (
            (lambda: sup.send("c", "secret \ud800"), "the message text has a lone surrogate U+D800 at character 7"),
            (lambda: sup.send("c", "hi", author="human:\udc00"), "the author has a lone surrogate"),
            (lambda: sup.send("c\ud800", "hi"), "the channel name has a lone surrogate"),
            (lambda: sup.send("c", "a\0b"), "NUL"),
        ):
            with pytest.raises(UsageError) as refused:
                await call()
            assert what in str(refused.value) and "secret" not in str(refused.value)
        with pytest.raises(UnknownChannel):  # nothing of the refused sends was stored
            await sup.entries("c")
        ok = await sup.send("c", "fine")
        assert await sup.wait_idle("c", timeout=SLOW)
        assert (await sup.entries("c"))[0].seq == ok.seq


#: Streams half an emoji (a lone surrogate as a JSON escape), in text, a tool call and a plan.
HALF_EMOJI = r"""
import sys
print('{"type": "text", "text": "half \\ud83d here"}', flush=True)
print('{"type": "tool", "name": "sh\\udc00", "input": {"cmd\\ud800": "x\\udfff"}}', flush=True)
print('{"type": "todos", "todos": [{"content": "plan \\ud83d", "status": "completed"}]}', flush=True)
print('{"type": "result", "text": "done \\ude00"}', flush=True)
"""

#: A well-behaved agent for the other channels.
GOOD = r"""
import json, sys
print(json.dumps({"type": "result", "text": "ok " + sys.argv[-1]}))
"""


async def test_an_agent_printing_lone_surrogates_is_stored_repaired_and_others_are_unaffected(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"bad": script_agent(HALF_EMOJI), "good": script_agent(GOOD)}, agent="good")
    async with open_supervisor(config) as sup:
        channels = [f"good-{i}" for i in range(8)]
        await sup.send("poisoned", "go", agent="bad")
        for channel in channels:
            await sup.send(channel, f"m-{channel}", agent="good")
        for channel in ["poisoned", *channels]:
            assert await sup.wait_idle(channel, timeout=SLOW)
        stored = [(e.kind, e.text) for e in await sup.entries("poisoned") if e.author == "agent:bad"]
        assert stored == [
            ("message", f"half {REPLACEMENT} here"),
            ("tool", f"sh{REPLACEMENT}: {{\"cmd{REPLACEMENT}\":\"x{REPLACEMENT}\"}}"),
            ("todos", f"[x] plan {REPLACEMENT}"),
            ("message", f"done {REPLACEMENT}"),
        ]
        assert not [e for e in await sup.entries("poisoned") if e.kind == "error"]
        assert sup._store.todos("poisoned", "bad") == [{"content": f"plan {REPLACEMENT}", "status": "completed"}]
        for channel in channels:
            entries = await sup.entries(channel)
            assert [(e.kind, e.text) for e in entries] == [("message", f"m-{channel}"), ("message", f"ok m-{channel}")]


# ---------------------------------------------------------------- through the HTTP API


async def test_a_poisoned_message_gets_400_while_concurrent_sends_and_stops_all_succeed(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    results: list[tuple[str, int, Any]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        transport = httpx.AsyncHTTPTransport(uds=str(short_tmp / "corral.sock"))
        async with httpx.AsyncClient(transport=transport, base_url="http://corral", timeout=SLOW) as http:

            async def post(kind: str, path: str, body: bytes = b"") -> None:
                response = await http.post(path, content=body)
                results.append((kind, response.status_code, response.json()))

            try:
                for i in range(5):  # the stopped channels exist (a stop of an unknown one is a 404)
                    assert (await http.post(f"/v1/channels/g{i}/messages", json={"text": "seed"})).status_code == 202
                await _hammer(http, post)
            finally:
                # Shut the daemon down even when an assertion failed, or the test hangs.
                nursery.cancel_scope.deadline = trio.current_time() + SLOW
                await http.post("/v1/shutdown")
    for kind, status, body in results:
        if kind == "bad":
            assert status == 400 and body["error"]["code"] == "bad_request", body
            assert "U+D800 at character 11" in body["error"]["message"]
            assert "hunter2" not in body["error"]["message"]
        elif kind == "good":
            assert status == 202, body
        else:
            assert status == 200 and body["ok"] is True, body
        # Nobody's answer shows anyone else's text.
        assert "hunter2" not in json.dumps(body) and "good \u00e9" not in json.dumps(body)
    assert len([r for r in results if r[0] == "good"]) == 20
    assert len([r for r in results if r[0] == "bad"]) == 20


async def _hammer(http: httpx.AsyncClient, post: Any) -> None:
    """Poisoned sends, good sends and stops, all at once; no poisoned message is stored."""
    with trio.fail_after(SLOW):
        async with trio.open_nursery() as clients:
            for i in range(20):
                # Valid JSON, invalid Unicode: a lone surrogate escape in the text.
                clients.start_soon(post, "bad", f"/v1/channels/p{i % 3}/messages", b'{"text": "pw hunter2 \\ud800"}')
                clients.start_soon(post, "good", f"/v1/channels/g{i}/messages", json.dumps({"text": f"good \u00e9 {i}"}).encode())
                clients.start_soon(post, "stop", f"/v1/channels/g{i % 5}/stop")
    for i in range(3):  # nothing of a poisoned message was stored: its channel does not exist
        response = await http.get(f"/v1/channels/p{i}/entries")
        assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_channel"
