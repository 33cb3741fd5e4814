"""The control API: bad input gets a clear 4xx and the daemon keeps serving; TCP needs a token."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest
import trio

from conftest import make_config
from supervisor import parse_config
from supervisor._daemon import DaemonError, bind_loopback_tcp, run_daemon
from supervisor._supervisor import MAX_MESSAGE_BYTES


def _client(folder: Path) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(folder / "corral.sock")), base_url="http://corral")


async def test_bad_input_is_answered_and_the_daemon_keeps_serving(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with _client(short_tmp) as http:
            ok = await http.post("/v1/channels/c/messages", json={"text": "first"})
            assert ok.status_code == 202
            accepted = ok.json()["seq"]
            cases = [
                ("POST", "/v1/channels/c/messages", {"content": b"{not json"}, 400, "bad_json"),
                ("POST", "/v1/channels/c/messages", {"content": b"[1, 2]"}, 400, "bad_json"),
                ("POST", "/v1/channels/c/messages", {"json": {"txt": "hi"}}, 400, "missing_field"),
                ("POST", "/v1/channels/c/messages", {"json": {"text": "hi", "agent": "nobody"}}, 400, "bad_request"),
                ("POST", "/v1/channels/c/messages", {"json": {"text": "x" * (MAX_MESSAGE_BYTES + 1)}}, 400, "bad_request"),
                ("POST", "/v1/channels/c/messages", {"content": b"x" * (MAX_MESSAGE_BYTES + 200_000)}, 413, "too_large"),
                ("GET", "/v1/nowhere", {}, 404, "not_found"),
                ("GET", "/elsewhere", {}, 404, "not_found"),
                ("GET", "/v1/channels/c/messages", {}, 405, "method_not_allowed"),
                ("GET", "/v1/channels/c/entries?after=minus", {}, 400, "bad_query"),
                ("POST", "/v1/channels/c/wait?timeout=-1", {}, 400, "bad_query"),
            ]
            for method, path, kw, status, code in cases:
                response = await http.request(method, path, **kw)
                assert response.status_code == status, (path, response.text)
                body = response.json()
                assert body["error"]["code"] == code and body["error"]["message"], body
            # Still serving, and what was accepted is there and runs.
            waited = await http.post("/v1/channels/c/wait", params={"timeout": 30})
            assert waited.json() == {"channel": "c", "idle": True}
            entries = (await http.get("/v1/channels/c/entries")).json()["entries"]
            assert entries[0]["seq"] == accepted and entries[0]["text"] == "first"
            assert any(e["author"] == "agent:demo" for e in entries)
            assert [e for e in entries if e["author"].startswith("human")] == entries[:1], "no rejected message was stored"
            await http.post("/v1/shutdown")


async def test_channel_names_with_slashes_round_trip(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with _client(short_tmp) as http:
            response = await http.post("/v1/channels/team%2Fthread%201/messages", json={"text": "hi"})
            assert response.json()["channel"] == "team/thread 1"
            await http.post("/v1/channels/team%2Fthread%201/wait", params={"timeout": 30})
            status = (await http.get("/v1/status")).json()
            assert "team/thread 1" in status["channels"]
            await http.post("/v1/shutdown")


async def test_tcp_listener_requires_the_token(short_tmp: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (short_tmp / "token").write_text("s3cret\n")
    config = parse_config(
        {
            "server": {"socket": "corral.sock", "tcp": f"127.0.0.1:{port}", "token_file": "token"},
            "store": {"path": "corral.db"},
            "agents": {"demo": {"adapter": "demo"}},
        },
        base=short_tmp,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/v1/status")).status_code == 401
            assert (await http.get("/v1/status", headers={"authorization": "Bearer wrong"})).status_code == 401
            good = await http.get("/v1/status", headers={"authorization": "Bearer s3cret"})
            assert good.status_code == 200 and "demo" in good.json()["agents"]
            shut = await http.post("/v1/shutdown")
            assert shut.status_code == 401
        async with _client(short_tmp) as local:
            await local.post("/v1/shutdown")


def test_tcp_listener_refuses_non_loopback_addresses() -> None:
    with pytest.raises(DaemonError, match="loopback"):
        bind_loopback_tcp("0.0.0.0:8765")


async def test_a_second_daemon_on_the_same_socket_is_refused(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        with pytest.raises(DaemonError, match="already running"):
            await run_daemon(config, handle_signals=False, subreaper=False)
        async with _client(short_tmp) as http:
            await http.post("/v1/shutdown")


async def test_follow_over_sse_delivers_committed_entries_live(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with _client(short_tmp) as http:
            seen: list[dict] = []
            async with http.stream("GET", "/v1/channels/live/events") as stream:
                await http.post("/v1/channels/live/messages", json={"text": "stream it"})
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if seen[-1]["author"] == "agent:demo" and seen[-1]["kind"] == "message":
                            break
            assert seen[0]["text"] == "stream it"
            assert [e["seq"] for e in seen] == sorted(e["seq"] for e in seen)
            await http.post("/v1/shutdown")
