"""The control API: bad input gets a clear 4xx and the daemon keeps serving; TCP needs a token."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from conftest import make_config

from supervisor import Config, Supervisor, UsageError, open_supervisor, parse_config
from supervisor.host.supervisor import MAX_MESSAGE_BYTES, UnknownChannel
from supervisor.serve import http as _http
from supervisor.serve.daemon import DaemonError, bind_loopback_tcp, run_daemon


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
                ("POST", "/v1/channels/c/messages", {"json": {"text": "hi", "delivery": "now"}}, 400, "bad_field"),
                ("POST", "/v1/channels/c/messages", {"json": {"text": "hi", "agent": "nobody"}}, 400, "bad_request"),
                ("POST", "/v1/channels/c/messages", {"json": {"text": "x" * (MAX_MESSAGE_BYTES + 1)}}, 400, "bad_request"),
                ("POST", "/v1/channels/c/messages", {"content": b"x" * (MAX_MESSAGE_BYTES + 200_000)}, 413, "too_large"),
                ("GET", "/v1/nowhere", {}, 404, "not_found"),
                ("GET", "/elsewhere", {}, 404, "not_found"),
                ("GET", "/v1/channels/c/messages", {}, 405, "method_not_allowed"),
                ("GET", "/v1/channels/c/entries?after=minus", {}, 400, "bad_query"),
                ("POST", "/v1/channels/c/wait?timeout=-1", {}, 400, "bad_query"),
                ("GET", "/v1/status?after=c", {}, 400, "bad_request"),  # a cursor is GROUP:CHANNEL
                ("GET", "/v1/status?limit=0", {}, 400, "bad_request"),
                ("GET", "/v1/status?limit=1001", {}, 400, "bad_query"),
                ("GET", "/v1/status?idle=yes", {}, 400, "bad_query"),
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
    (short_tmp / "token").chmod(0o600)
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
            # A channel exists once it has a message: make it, then follow what comes next.
            first = (await http.post("/v1/channels/live/messages", json={"text": "make it"})).json()["seq"]
            await http.post("/v1/channels/live/wait", params={"timeout": 30})
            last = (await http.get("/v1/channels/live/entries", params={"after": first})).json()["entries"][-1]["seq"]
            async with http.stream("GET", "/v1/channels/live/events", params={"after": last}) as stream:
                await http.post("/v1/channels/live/messages", json={"text": "stream it"})
                async for line in stream.aiter_lines():
                    if line.startswith("data: "):
                        seen.append(json.loads(line[6:]))
                        if seen[-1]["author"] == "agent:demo" and seen[-1]["kind"] == "message":
                            break
            assert seen[0]["text"] == "stream it"
            assert [e["seq"] for e in seen] == sorted(e["seq"] for e in seen)
            await http.post("/v1/shutdown")


def _tcp_config(folder: Path) -> tuple[Config, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (folder / "token").write_text("s3cret\n")
    (folder / "token").chmod(0o600)
    data = {
        "server": {"socket": "corral.sock", "tcp": f"127.0.0.1:{port}", "token_file": "token"},
        "store": {"path": "corral.db"},
        "agents": {"demo": {"adapter": "demo", "delay": 0.01}},
    }
    return parse_config(data, base=folder), port


async def _abandon(family: int, address: str | tuple[str, int], request: bytes) -> None:
    """Send ``request`` (headers promising a body that never comes) and hang up."""
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    with sock:
        await sock.connect(address)
        await sock.send(request)


async def test_clients_that_abandon_requests_cannot_end_the_daemon(short_tmp: Path) -> None:
    """Issue 7 finding 1: half-sent bodies, then a hang-up, on both listeners, many times."""
    config, port = _tcp_config(short_tmp)
    unix = str(short_tmp / "corral.sock")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with _client(short_tmp) as http:
            assert (await http.post("/v1/channels/x/messages", json={"text": "hello"})).status_code == 202
            await http.post("/v1/channels/x/wait", params={"timeout": 30})
            with trio.fail_after(60):
                for _ in range(40):
                    # No token, and a body promised but never sent.
                    await _abandon(socket.AF_INET, ("127.0.0.1", port), b"POST /v1/shutdown HTTP/1.1\r\nhost: c\r\ncontent-length: 100\r\n\r\n")
                    await _abandon(socket.AF_UNIX, unix, b"POST /v1/channels/x/stop HTTP/1.1\r\nhost: c\r\ncontent-length: 10\r\n\r\n")
                    # A shutdown whose body never arrives is not a shutdown.
                    await _abandon(socket.AF_UNIX, unix, b"POST /v1/shutdown HTTP/1.1\r\nhost: c\r\ncontent-length: 100\r\n\r\n")
                    await _abandon(socket.AF_INET, ("127.0.0.1", port), b"POST /v1/shutdown HTTP/1.1\r\nhost: c\r\nauthorization: Bearer s3cret\r\ncontent-length: 5\r\n\r\n{")
            # Alive, serving, not shutting down, and the half-sent stops stopped nothing.
            status = (await http.get("/v1/status")).json()
            assert status["shutting_down"] is False and status["channels"]["x"]["generation"] == 0
            assert (await http.post("/v1/channels/x/messages", json={"text": "still here"})).status_code == 202
            assert (await http.post("/v1/channels/x/wait", params={"timeout": 30})).json()["idle"] is True
            await http.post("/v1/shutdown")


async def test_an_error_in_one_connection_or_in_the_accept_loop_is_isolated(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_server, real_serve = _http.TCPServer, _http._serve_listeners
    broken = {"connection": 1, "listener": 1}

    def flaky_server(*args: Any) -> Any:
        if broken["connection"]:
            broken["connection"] -= 1
            raise RuntimeError("injected connection fault")
        return real_server(*args)

    async def flaky_serve(*args: Any, **kw: Any) -> Any:
        if broken["listener"]:
            broken["listener"] -= 1
            raise OSError("injected listener fault")
        return await real_serve(*args, **kw)

    monkeypatch.setattr(_http, "TCPServer", flaky_server)
    monkeypatch.setattr(_http, "_serve_listeners", flaky_serve)
    monkeypatch.setattr(_http, "RETRY_SECONDS", 0)
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with _client(short_tmp) as http:
            with pytest.raises(httpx.TransportError):
                await http.get("/v1/status")  # the connection that fails
            assert (await http.get("/v1/status")).status_code == 200
            await http.post("/v1/shutdown")
    assert broken == {"connection": 0, "listener": 0}
    logged = [r for r in caplog.records if r.name == "corral.http" and r.exc_info]
    assert any("injected connection fault" in str(r.exc_info[1]) for r in logged)
    assert any("injected listener fault" in str(r.exc_info[1]) for r in logged)


async def test_an_unexpected_handler_error_is_a_json_500_and_logged(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_status(self: Supervisor, **page: object) -> dict[str, Any]:
        raise ZeroDivisionError("injected handler fault")

    monkeypatch.setattr(Supervisor, "status", broken_status)
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with _client(short_tmp) as http:
            response = await http.get("/v1/status")
            assert response.status_code == 500
            error = response.json()["error"]
            assert error["code"] == "internal" and "ZeroDivisionError" in error["message"]
            assert (await http.post("/v1/channels/c/messages", json={"text": "hi"})).status_code == 202
            await http.post("/v1/shutdown")
    logged = [r for r in caplog.records if r.name == "corral.api" and r.exc_info]
    assert logged and "injected handler fault" in str(logged[0].exc_info[1])


async def test_hostile_inputs_are_clear_400s(short_tmp: Path) -> None:
    """Issue 7 finding 7: deep JSON, huge numbers, invalid UTF-8 and dot segments in a channel."""
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with _client(short_tmp) as http:
            await http.post("/v1/channels/c/messages", json={"text": "hi"})
            cases = [
                ("POST", "/v1/channels/c/messages", {"content": b"[" * 100_000 + b"]" * 100_000}, "bad_json"),
                ("POST", "/v1/channels/c/messages", {"content": b'{"a":' * 100_000 + b"1" + b"}" * 100_000}, "bad_json"),
                ("GET", f"/v1/channels/c/entries?after={10**25}", {}, "bad_query"),
                ("GET", f"/v1/channels/c/entries?limit={10**25}", {}, "bad_query"),
                ("GET", f"/v1/channels/c/events?after={10**25}", {}, "bad_query"),
                ("POST", "/v1/channels/%FF/messages", {"json": {"text": "hi"}}, "bad_channel"),
                ("POST", "/v1/channels/%FE/stop", {}, "bad_channel"),
                ("POST", "/v1/channels/%2E/messages", {"json": {"text": "hi"}}, "bad_request"),
                ("POST", "/v1/channels/%2E%2E/stop", {}, "bad_request"),
            ]
            for method, path, kw, code in cases:
                with trio.fail_after(30):
                    response = await http.request(method, path, **kw)
                assert response.status_code == 400, (path, response.text[:200])
                assert response.json()["error"]["code"] == code, path
            status = (await http.get("/v1/status")).json()
            assert sorted(status["channels"]) == ["c"], "no bad name made a channel"
            await http.post("/v1/shutdown")


async def test_a_mistyped_channel_is_a_404_with_a_suggestion(short_tmp: Path) -> None:
    """Issue 9 item 7: stop, entries, events and wait on a channel that never existed."""
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status))
        async with _client(short_tmp) as http:
            await http.post("/v1/channels/general/messages", json={"text": "hi"})
            await http.post("/v1/channels/general/wait", params={"timeout": 30})
            for method, action in [("POST", "stop"), ("GET", "entries"), ("GET", "events"), ("POST", "wait")]:
                response = await http.request(method, f"/v1/channels/generl/{action}")
                assert response.status_code == 404, (action, response.text)
                error = response.json()["error"]
                assert error["code"] == "unknown_channel" and "did you mean 'general'?" in error["message"], error
            status = (await http.get("/v1/status")).json()
            assert sorted(status["channels"]) == ["general"], "a mistyped stop created no channel"
            # An existing idle channel still gets its stop and notice (contract line 10).
            stopped = (await http.post("/v1/channels/general/stop")).json()
            assert stopped["ok"] and stopped["notice_seq"] is not None
            await http.post("/v1/shutdown")


async def test_embedded_supervisor_raises_unknown_channel_and_knows_stored_channels(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    async with open_supervisor(config) as sup:
        await sup.send("general", "hi")
        assert await sup.wait_idle("general", 30)
        with pytest.raises(UnknownChannel, match="did you mean 'general'") as caught:
            await sup.stop("genral")
        assert isinstance(caught.value, UsageError) and caught.value.suggestions == ("general",)
    # After a restart the channel is known from its stored entries alone.
    async with open_supervisor(config) as sup:
        assert [e.text for e in await sup.entries("general")][0] == "hi"
        with pytest.raises(UnknownChannel):
            await sup.wait_idle("nowhere", 1)
