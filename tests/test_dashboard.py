"""The dashboard over plain HTTP: login codes, session cookies, the same-origin rule, CSP, streams.

The browser itself is driven in tests/test_dashboard_browser.py; here each rule is checked
at the HTTP level (headers, status codes), and the pure parts (``_dashauth``, the list's
state) directly.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from conftest import CORRAL

from supervisor import parse_config
from supervisor.serve import api as _api
from supervisor.serve import dashauth as _dashauth
from supervisor.serve.daemon import run_daemon
from supervisor.serve.dashboard import CSP, agent_states, list_view

TOKEN = "s3cret"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def _daemon(folder: Path) -> AsyncIterator[tuple[httpx.AsyncClient, int]]:
    """A daemon with the TCP listener; yields a client of it (no token, no cookie) and the port."""
    port = _free_port()
    (folder / "token").write_text(TOKEN + "\n")
    (folder / "token").chmod(0o600)
    config = parse_config(
        {
            "server": {"socket": "corral.sock", "tcp": f"127.0.0.1:{port}", "token_file": "token"},
            "store": {"path": "corral.db"},
            "agents": {"demo": {"adapter": "demo", "delay": 0.01}},
        },
        base=folder,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", follow_redirects=False) as http:
            try:
                yield http, port
            finally:
                await http.post("/v1/shutdown", headers=_bearer())


def _bearer() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


async def _login(http: httpx.AsyncClient, port: int) -> dict[str, str]:
    """Log in as the browser does; returns the headers a page's same-origin POST carries."""
    minted = await http.post("/dashboard/codes", headers=_bearer())
    assert minted.status_code == 201, minted.text
    response = await http.get(minted.json()["path"])
    assert response.status_code == 303
    cookie = response.headers["set-cookie"].split(";", 1)[0]
    return {"cookie": cookie, "origin": f"http://127.0.0.1:{port}"}


async def test_a_login_code_works_once_and_sets_a_strict_httponly_cookie(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        minted = (await http.post("/dashboard/codes", headers=_bearer())).json()
        assert minted["path"] == f"/dashboard/login?code={minted['code']}" and TOKEN not in minted["path"]
        first = await http.get(minted["path"])
        assert first.status_code == 303 and first.headers["location"] == "/dashboard/"
        attributes = [a.strip() for a in first.headers["set-cookie"].split(";")]
        assert attributes[0].startswith(f"corral-session-{port}=")
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(attributes)
        assert TOKEN not in first.headers["set-cookie"]
        again = await http.get(minted["path"])
        assert again.status_code == 403 and again.json()["error"]["code"] == "bad_login_code"
        assert "corral dashboard" in again.json()["error"]["message"]
        assert (await http.get("/dashboard/login?code=made-up")).status_code == 403
        cookie = {"cookie": attributes[0]}
        page = await http.get("/dashboard/", headers=cookie)
        assert page.status_code == 200 and "<h1>Channels</h1>" in page.text


async def test_without_a_cookie_or_the_token_nothing_is_served_but_the_pages_files(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        for method, path in [("GET", "/dashboard/"), ("GET", "/dashboard/channels/c"), ("GET", "/dashboard/events"),
                             ("GET", "/v1/status"), ("POST", "/v1/stop"), ("POST", "/dashboard/codes")]:
            response = await http.request(method, path, headers={"origin": f"http://127.0.0.1:{port}"})
            assert response.status_code == 401, (path, response.text)
            if path in ("/dashboard/", "/dashboard/channels/c"):
                # A page a browser opens gets the login page (issue 32), not the API's JSON.
                assert response.headers["content-type"] == "text/html; charset=utf-8"
                assert response.headers["content-security-policy"] == CSP
                assert "<h1>Log in to the dashboard</h1>" in response.text and "corral dashboard" in response.text
                assert "<script" not in response.text
            else:
                assert "corral dashboard" in response.json()["error"]["message"]
        forged = {"cookie": f"corral-session-{port}=9999999999.abc.{'0' * 64}"}
        assert (await http.get("/v1/status", headers=forged)).status_code == 401
        expired = await http.get("/dashboard/channels/c", headers=forged)
        assert expired.status_code == 401 and "Log in to the dashboard" in expired.text
        script = await http.get("/dashboard/static/dashboard.js")
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
        assert script.headers["x-content-type-options"] == "nosniff"
        assert (await http.get("/dashboard/static/../_api.py")).status_code in (401, 404)


async def test_a_session_may_read_send_and_stop_but_not_shut_down_or_mint_codes(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        page = await _login(http, port)
        sent = await http.post("/v1/channels/c/messages", json={"text": "hi"}, headers=page)
        assert sent.status_code == 202, sent.text
        assert (await http.get("/v1/status", headers=page)).status_code == 200
        assert (await http.get("/v1/channels/c/entries", headers=page)).status_code == 200
        assert (await http.get("/v1/usage?channel=c", headers=page)).status_code == 200  # (the day's spend)
        stopped = await http.post("/v1/channels/c/stop", headers=page)
        assert stopped.status_code == 200 and stopped.json()["ok"]
        for method, path in [("POST", "/v1/shutdown"), ("POST", "/dashboard/codes"), ("POST", "/v1/channels/c/wait")]:
            response = await http.request(method, path, headers=page)
            assert response.status_code == 403, (path, response.text)
            assert "token" in response.json()["error"]["message"]
        assert (await http.get("/v1/status", headers=_bearer())).json()["shutting_down"] is False


async def test_a_state_changing_request_needs_the_listeners_own_origin(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        page = await _login(http, port)
        await http.post("/v1/channels/c/messages", json={"text": "make the channel"}, headers=page)
        await http.post("/v1/channels/c/wait", headers=_bearer())
        before = len((await http.get("/v1/channels/c/entries", headers=_bearer())).json()["entries"])
        other_port = {**page, "origin": f"http://127.0.0.1:{port + 1}"}  # another local program's page
        for headers in (other_port, {**page, "origin": "http://evil.example"}, {"cookie": page["cookie"]},
                        {**page, "origin": "null"}):
            for path in ("/v1/channels/c/stop", "/v1/stop", "/v1/channels/c/messages"):
                response = await http.post(path, json={"text": "injected"}, headers=headers)
                assert response.status_code == 403, (path, headers, response.text)
                assert response.json()["error"]["code"] == "cross_origin"
        await http.post("/v1/channels/c/wait", headers=_bearer())
        after = (await http.get("/v1/channels/c/entries", headers=_bearer())).json()["entries"]
        assert len(after) == before, "a refused request stopped or sent nothing"
        assert not any(e["kind"] == "notice" or e["text"] == "injected" for e in after)


async def test_reads_from_another_site_and_foreign_hosts_are_refused(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        page = await _login(http, port)
        cookie = {"cookie": page["cookie"]}
        assert (await http.get("/v1/status", headers={**cookie, "sec-fetch-site": "same-origin"})).status_code == 200
        for site in ("same-site", "cross-site"):
            response = await http.get("/v1/status", headers={**cookie, "sec-fetch-site": site})
            assert response.status_code == 403 and response.json()["error"]["code"] == "cross_origin"
        # DNS rebinding: a page of evil.example that resolves to 127.0.0.1 names its own host.
        rebound = await http.get("/dashboard/", headers={**cookie, "host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "bad_host"
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            assert (await http.get("/dashboard/", headers={**cookie, "host": host})).status_code == 200
        # The token still works from anywhere on loopback, as before.
        assert (await http.get("/v1/status", headers={**_bearer(), "host": "whatever"})).status_code == 200


async def test_a_browser_through_an_ssh_tunnel_logs_in_and_sends(short_tmp: Path) -> None:
    """Issue 25: `ssh -L 9000:127.0.0.1:PORT` makes the browser say `Host: localhost:9000`.

    `corral dashboard --port 9000` prints the URL that browser opens; the login, the pages and a
    same-origin send work through it, and another origin is still refused.
    """
    async with _daemon(short_tmp) as (http, port):
        (short_tmp / "corral.toml").write_text(
            f'[server]\nsocket = "corral.sock"\ntcp = "127.0.0.1:{port}"\ntoken_file = "token"\n')
        done = await trio.run_process([*CORRAL, "-c", "corral.toml", "dashboard", "--port", "9000"], cwd=short_tmp,
                                      capture_stdout=True, capture_stderr=True, check=False)
        url = done.stdout.decode().strip()
        assert done.returncode == 0 and url.startswith("http://localhost:9000/dashboard/login?code="), done
        tunnel = {"host": "localhost:9000"}  # what the forwarded connection carries
        login = await http.get(url.removeprefix("http://localhost:9000"), headers=tunnel)
        assert login.status_code == 303, login.text
        cookie = {"cookie": login.headers["set-cookie"].split(";", 1)[0], **tunnel}
        assert (await http.get("/dashboard/", headers=cookie)).status_code == 200
        sent = await http.post("/v1/channels/c/messages", json={"text": "hi"},
                               headers={**cookie, "origin": "http://localhost:9000"})
        assert sent.status_code == 202, sent.text
        other = await http.post("/v1/channels/c/messages", json={"text": "injected"},
                                headers={**cookie, "origin": "http://localhost:3000"})
        assert other.status_code == 403 and other.json()["error"]["code"] == "cross_origin"


async def test_pages_carry_a_strict_csp_and_hold_no_inline_script(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        cookie = {"cookie": (await _login(http, port))["cookie"]}
        for path in ("/dashboard/", "/dashboard/channels/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E"):
            page = await http.get(path, headers=cookie)
            assert page.status_code == 200
            assert page.headers["content-security-policy"] == CSP
            assert "script-src 'self'" in CSP and "unsafe" not in CSP and "default-src 'none'" in CSP
            assert page.headers["x-frame-options"] == "DENY" and page.headers["referrer-policy"] == "no-referrer"
            tags = _tags(page.text)
            assert [attrs for tag, attrs in tags if tag == "script"] == [
                {"src": "/dashboard/static/dashboard.js", "defer": None}]
            assert re.findall(r"<script[^>]*>(.*?)</script>", page.text, re.S) == [""], "no inline script"
            assert not [a for _, attrs in tags for a in attrs if a.startswith("on")], "no inline event handler"
            assert "img" not in {tag for tag, _ in tags}, "the channel name is escaped"
        channel = (await http.get("/dashboard/channels/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E", headers=cookie)).text
        assert "&lt;img src=x onerror=alert(1)&gt;" in channel
        # Each page's header says whether turns are sandboxed: the daemon's own state.
        sandbox = (await http.get("/v1/status", headers=_bearer())).json()["sandbox"]
        for text in (channel, (await http.get("/dashboard/", headers=cookie)).text):
            (badge,) = [attrs for tag, attrs in _tags(text) if attrs.get("id") == "sandbox"]
            assert badge["data-state"] == sandbox["state"] and badge["title"] == sandbox["summary"]


def _tags(text: str) -> list[tuple[str, dict[str, str | None]]]:
    tags: list[tuple[str, dict[str, str | None]]] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            tags.append((tag, dict(attrs)))

    Parser().feed(text)
    return tags


async def test_the_unix_socket_serves_no_dashboard(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        transport = httpx.AsyncHTTPTransport(uds=str(short_tmp / "corral.sock"))
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as local:
            for path in ("/dashboard/", "/dashboard/codes"):
                assert (await local.get(path)).status_code == 404


async def _events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event name, data) of each event, and ("comment", text) of each comment line."""
    name = "message"
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, line[6:]
            name = "message"


async def test_an_idle_stream_sends_keepalive_comments(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_api, "KEEPALIVE_SECONDS", 0.2)
    async with _daemon(short_tmp) as (http, port):
        await http.post("/v1/channels/c/messages", json={"text": "hi"}, headers=_bearer())
        seen: list[tuple[str, str]] = []
        with trio.fail_after(30):
            async with http.stream("GET", "/v1/channels/c/events", headers=_bearer()) as stream:
                async for kind, data in _events(stream):
                    seen.append((kind, data))
                    if kind == "comment" and data == "keep-alive":
                        break
        assert seen[0] == ("comment", "connected"), "the stream opens at once, before any event"
        assert any(kind == "message" and json.loads(data)["text"] == "hi" for kind, data in seen)


async def test_the_events_endpoint_resumes_after_last_event_id(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        await http.post("/v1/channels/c/messages", json={"text": "one"}, headers=_bearer())
        await http.post("/v1/channels/c/wait", headers=_bearer())
        entries = (await http.get("/v1/channels/c/entries", headers=_bearer())).json()["entries"]
        middle = entries[len(entries) // 2]["seq"]
        with trio.fail_after(30):
            async with http.stream(
                "GET", "/v1/channels/c/events", headers={**_bearer(), "last-event-id": str(middle)}
            ) as stream:
                async for kind, data in _events(stream):
                    if kind == "message":
                        assert json.loads(data)["seq"] == entries[len(entries) // 2 + 1]["seq"]
                        break
            # It wins over the page's own ?after=, even a greater seq: it is where the stream was
            # (in a fleet, entries come in commit order, and a later one can have a lower seq).
            async with http.stream(
                "GET", f"/v1/channels/c/events?after={entries[-1]['seq']}",
                headers={**_bearer(), "last-event-id": str(middle)},
            ) as stream:
                async for kind, data in _events(stream):
                    if kind == "message":
                        assert json.loads(data)["seq"] == entries[len(entries) // 2 + 1]["seq"]
                        break


async def test_the_status_stream_follows_a_turn_from_running_to_idle(short_tmp: Path) -> None:
    async with _daemon(short_tmp) as (http, port):
        await http.post("/v1/channels/c/messages", json={"text": "hi"}, headers=_bearer())
        await http.post("/v1/channels/c/wait", headers=_bearer())
        states: list[dict[str, Any]] = []
        with trio.fail_after(60):
            async with http.stream("GET", "/dashboard/events", headers=_bearer()) as stream:
                async for kind, data in _events(stream):
                    if kind != "status":
                        continue
                    view = json.loads(data)
                    states.append(view)
                    if len(states) == 1:
                        assert view["running"] == 0 and view["channels"][0]["agents"][0]["state"] == "idle"
                        await http.post("/v1/channels/c/messages", json={"text": "a long task"}, headers=_bearer())
                    elif view["running"] == 1 and not any(s.get("stopped") for s in states):
                        agent = view["channels"][0]["agents"][0]
                        assert agent["state"] == "running" and agent["agent"] == "demo" and agent["turn"]
                        states.append({"stopped": (await http.post("/v1/channels/c/stop", headers=_bearer())).json()})
                    elif view["running"] == 0 and any(s.get("stopped") for s in states):
                        break


def test_agent_states_read_todays_status_and_a_per_agent_one() -> None:
    assert agent_states({"queued": 0, "turn": None}) == [
        {"agent": None, "state": "idle", "queued": 0, "turn": None, "since": None}]
    assert agent_states({"queued": 2, "turn": None})[0]["state"] == "queued"
    running = agent_states({"queued": 1, "turn": {"id": "t1", "agent": "demo", "started": 5.0, "phase": "started"}})
    assert running == [{"agent": "demo", "state": "running", "queued": 1, "turn": "t1", "since": 5.0}]
    per_agent = {"agents": {"codex": {"state": "stopping", "turn": {"id": "t2", "started": 7.0}},
                            "claude": {"queued": 3}, "gemini": {}}}
    assert agent_states(per_agent) == [
        {"agent": "claude", "state": "queued", "queued": 3, "turn": None, "since": None},
        {"agent": "codex", "state": "stopping", "queued": 0, "turn": "t2", "since": 7.0},
        {"agent": "gemini", "state": "idle", "queued": 0, "turn": None, "since": None},
    ]
    as_list = agent_states({"agents": [{"name": "claude", "turn": "t3", "since": 9.0}]})
    assert as_list == [{"agent": "claude", "state": "running", "queued": 0, "turn": "t3", "since": 9.0}]
    view = list_view({"channels": {"b": {"queued": 0, "turn": None}, "a": per_agent}, "shutting_down": False})
    assert [c["name"] for c in view["channels"]] == ["a", "b"] and view["running"] == 1
    waiting = {"position": 2, "why": "turn limit", "waited": 1.5}
    assert agent_states({"agents": {"claude": {"state": "queued", "queued": 1, "waiting": waiting}}}) == [
        {"agent": "claude", "state": "queued", "queued": 1, "turn": None, "since": None, "waiting": waiting}]
    view = list_view({"channels": {}, "capacity": {"max_turns": 4, "waiting": [{"channel": "c"}] * 3}})
    assert (view["waiting"], view["max_turns"]) == (3, 4)


def test_sessions_are_signed_expire_and_are_bound_to_the_token() -> None:
    key = _dashauth.session_key("token-a")
    value = _dashauth.new_session(key, now=1000.0, nonce=lambda: "n")
    assert _dashauth.session_valid(key, value, now=1000.0 + _dashauth.SESSION_SECONDS - 1)
    assert not _dashauth.session_valid(key, value, now=1000.0 + _dashauth.SESSION_SECONDS)
    assert not _dashauth.session_valid(_dashauth.session_key("token-b"), value, now=1000.0)
    expiry, nonce, mac = value.split(".")
    assert not _dashauth.session_valid(key, f"{int(expiry) + 10**6}.{nonce}.{mac}", now=1000.0), "expiry is signed"
    for junk in ("", "x", "1.2", "..", "abc.def.ghi"):
        assert not _dashauth.session_valid(key, junk, now=0.0)


def test_login_codes_work_once_within_their_time() -> None:
    codes = _dashauth.LoginCodes()
    a = codes.mint(now=0.0)
    b = codes.mint(now=0.0)
    assert codes.spend(a, now=1.0) and not codes.spend(a, now=1.0)
    assert not codes.spend(b, now=_dashauth.CODE_SECONDS), "expired"
    assert not codes.spend("never-minted", now=0.0)
    many = [codes.mint(now=0.0) for _ in range(_dashauth.MAX_CODES + 5)]
    assert not codes.spend(many[0], now=0.0) and codes.spend(many[-1], now=0.0), "bounded: the oldest go first"


def test_corral_dashboard_without_a_tcp_listener_says_how_to_fix_it(short_tmp: Path) -> None:
    (short_tmp / "corral.toml").write_text('[server]\nsocket = "corral.sock"\n\n[agents.demo]\nadapter = "demo"\n')
    done = subprocess.run([*CORRAL, "-c", "corral.toml", "dashboard"], cwd=short_tmp, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "corral.toml: server.tcp:" in done.stderr and "token_file" in done.stderr and "fix:" in done.stderr
    # Issue 32: everything it takes, in one message: both lines, the token, the restart.
    assert 'tcp = "127.0.0.1:8765"\n    token_file = "corral.token"\n' in done.stderr
    assert "dashboard --write-token" in done.stderr and "restart the daemon" in done.stderr


def test_corral_dashboard_writes_a_missing_token_file_when_asked_and_only_then(short_tmp: Path) -> None:
    import stat

    port = _free_port()
    (short_tmp / "corral.toml").write_text(
        f'[server]\nsocket = "corral.sock"\ntcp = "127.0.0.1:{port}"\ntoken_file = "corral.token"\n'
    )

    def dashboard(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CORRAL, "-c", "corral.toml", "dashboard", *args], cwd=short_tmp,
                              capture_output=True, text=True, timeout=60)

    told = dashboard()
    assert told.returncode == 1 and "does not exist" in told.stderr and "--write-token` creates it" in told.stderr
    assert not (short_tmp / "corral.token").exists()
    wrote = dashboard("--write-token")
    token = short_tmp / "corral.token"
    assert f"wrote a new token to {token} (mode 0600)" in wrote.stderr
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and re.fullmatch(r"[0-9a-f]{64}\n", token.read_text())
    assert wrote.returncode == 3 and "no daemon" in wrote.stderr  # (none runs here: the next step is `corral run`)
    secret = token.read_text()
    again = dashboard("--write-token")  # never overwritten
    assert token.read_text() == secret and again.returncode == 3


async def test_dashboard_open_without_a_browser_prints_the_url_and_exits_0(short_tmp: Path) -> None:
    import os

    empty = short_tmp / "nobrowser"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}
    async with _daemon(short_tmp) as (http, port):
        (short_tmp / "corral.toml").write_text(
            f'[server]\nsocket = "corral.sock"\ntcp = "127.0.0.1:{port}"\ntoken_file = "token"\n')
        done = await trio.run_process(
            [*CORRAL, "-c", "corral.toml", "dashboard", "--open"], cwd=short_tmp, capture_stdout=True,
            capture_stderr=True, check=False, env={**env, "PATH": str(empty)},
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    assert re.fullmatch(rf"http://127\.0\.0\.1:{port}/dashboard/login\?code=[\w-]+\n", out), out
    assert "no web browser here: open the URL above in one" in err


def test_corral_dashboard_without_a_daemon_exits_3(short_tmp: Path) -> None:
    port = _free_port()
    (short_tmp / "token").write_text("t\n")
    (short_tmp / "token").chmod(0o600)
    (short_tmp / "corral.toml").write_text(
        f'[server]\nsocket = "corral.sock"\ntcp = "127.0.0.1:{port}"\ntoken_file = "token"\n'
    )
    done = subprocess.run([*CORRAL, "-c", "corral.toml", "dashboard"], cwd=short_tmp, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3 and "no daemon" in done.stderr


def test_the_docs_dashboard_example_prints_a_login_url(short_tmp: Path) -> None:
    import os
    import sys

    port = _free_port()
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PORT": str(port), "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    script = subprocess.Popen(["sh", str(root / "examples" / "dashboard.sh")], cwd=short_tmp, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert script.stdout is not None and script.stdin is not None
    try:
        lines = []
        while not (lines and lines[-1].startswith("the dashboard is served until")):
            line = script.stdout.readline()
            assert line, "".join(lines) + (script.stderr.read() if script.stderr else "")
            lines.append(line)
        url = next(line.strip() for line in lines if line.startswith("http://"))
        assert re.fullmatch(rf"http://127\.0\.0\.1:{port}/dashboard/login\?code=[\w-]+", url), url
        # Issue 25: the URL it printed is alive while the script waits (it used to shut down at once).
        assert httpx.get(url, follow_redirects=False).status_code == 303
        out, err = script.communicate("\n", timeout=120)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert script.returncode == 0, out + err
    assert "corral is shutting down" in out
    assert oct((short_tmp / "corral.token").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    ("method", "path", "headers", "expected"),
    [
        ("GET", "v1/status", {}, None),  # with the token (bearer=True below)
        ("GET", "dashboard/static/dashboard.js", {"host": "127.0.0.1:8765"}, "public"),
        ("GET", "dashboard/login", {"host": "localhost:8765"}, "public"),
        ("GET", "dashboard/login", {"host": "evil.example:8765"}, "bad_host"),
        ("POST", "dashboard/login", {"host": "127.0.0.1:8765"}, "unauthorized"),
        ("GET", "v1/status", {"host": "127.0.0.1:8765"}, "unauthorized"),
        ("GET", "v1/status", {"host": "127.0.0.1:8765", "cookie": "corral-session-9999=SESSION"}, "unauthorized"),
        # Another port of a loopback name: what an ssh tunnel presents (ssh -L 9000:127.0.0.1:8765).
        ("GET", "v1/status", {"host": "localhost:9000", "cookie": "SESSION"}, None),
        ("GET", "v1/status", {"host": "127.0.0.1:8766", "cookie": "SESSION"}, None),
        ("POST", "v1/channels/c/stop", {"host": "localhost:9000", "cookie": "SESSION",
                                         "origin": "http://localhost:9000"}, None),
        ("POST", "v1/channels/c/stop", {"host": "localhost:9000", "cookie": "SESSION",
                                         "origin": "http://localhost:3000"}, "cross_origin"),
        ("GET", "v1/status", {"host": "localhost:9000", "cookie": "SESSION", "sec-fetch-site": "same-site"},
         "cross_origin"),
        ("GET", "v1/status", {"host": "evil.example:9000", "cookie": "SESSION"}, "bad_host"),
        ("GET", "v1/status", {"host": "localhost", "cookie": "SESSION"}, "bad_host"),
        ("GET", "v1/status", {"host": "localhost:90x", "cookie": "SESSION"}, "bad_host"),
        ("GET", "v1/status", {"host": "localhost:0", "cookie": "SESSION"}, "bad_host"),
        ("GET", "v1/status", {"host": "localhost:99999", "cookie": "SESSION"}, "bad_host"),
        ("GET", "v1/status", {"host": "localhost.evil.example:9000", "cookie": "SESSION"}, "bad_host"),
        ("GET", "v1/status", {"cookie": "SESSION"}, "bad_host"),
        ("GET", "v1/status", {"host": "[::1]:8765", "cookie": "SESSION"}, None),
        ("GET", "v1/status", {"host": "127.0.0.1:8765", "cookie": "SESSION", "sec-fetch-site": "same-site"},
         "cross_origin"),
        ("GET", "dashboard", {"host": "127.0.0.1:8765", "cookie": "SESSION", "sec-fetch-site": "same-site"}, None),
        ("GET", "dashboard/events", {"host": "127.0.0.1:8765", "cookie": "SESSION", "sec-fetch-site": "cross-site"},
         "cross_origin"),
        ("GET", "v1/channels/a%2Fb/events", {"host": "127.0.0.1:8765", "cookie": "SESSION"}, None),
        ("POST", "v1/channels/c/stop", {"host": "127.0.0.1:8765", "cookie": "SESSION"}, "cross_origin"),
        ("POST", "v1/channels/c/stop", {"host": "127.0.0.1:8765", "cookie": "SESSION",
                                         "origin": "http://127.0.0.1:8765"}, None),
        ("POST", "v1/channels/c/stop", {"host": "localhost:8765", "cookie": "SESSION",
                                         "origin": "http://127.0.0.1:8765"}, "cross_origin"),
        ("POST", "v1/stop", {"host": "127.0.0.1:8765", "cookie": "SESSION", "origin": "http://127.0.0.1:9"},
         "cross_origin"),
        ("POST", "v1/shutdown", {"host": "127.0.0.1:8765", "cookie": "SESSION", "origin": "http://127.0.0.1:8765"},
         "forbidden"),
        ("POST", "dashboard/codes", {"host": "127.0.0.1:8765", "cookie": "SESSION",
                                      "origin": "http://127.0.0.1:8765"}, "forbidden"),
        ("DELETE", "v1/channels/c/stop", {"host": "127.0.0.1:8765", "cookie": "SESSION",
                                           "origin": "http://127.0.0.1:8765"}, "forbidden"),
    ],
)
def test_decide_who_may_do_what(method: str, path: str, headers: dict[str, str], expected: str | None) -> None:
    key = _dashauth.session_key("t")
    session = f"corral-session-8765={_dashauth.new_session(key, now=0.0)}"
    raw = [(k.encode(), v.replace("SESSION", session).encode()) for k, v in headers.items()]
    parts = [part.replace("%2F", "/") for part in path.split("/")]
    refusal = _dashauth.decide(method, parts, raw, port=8765, key=key, now=1.0, bearer=expected is None and not raw)
    if expected in (None, "public"):
        assert refusal is None, refusal
    else:
        assert refusal is not None and refusal.code == expected, refusal
        assert refusal.message


async def test_one_wake_up_stands_for_every_entry_committed_since(short_tmp: Path) -> None:
    """The dashboard's status stream and systemd's STATUS= line wake on commits the same way."""
    from conftest import make_config

    from supervisor import open_supervisor
    from supervisor.serve.commits import open_commit_wakeups

    async with open_supervisor(make_config(short_tmp)) as sup:
        await sup.send("early", "hi")
        await sup.wait_idle("early")
        await sup.flush()
        async with open_commit_wakeups(sup) as wake:
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.WouldBlock):
                wake.receive_nowait()  # what was committed before wakes nothing
            await sup.send("c", "hi")
            await wake.receive()
            await sup.wait_idle("c")  # the reply's entries, several, while nobody read
            await sup.flush()
            await trio.testing.wait_all_tasks_blocked()
            wake.receive_nowait()  # one wake-up for all of them
            with pytest.raises(trio.WouldBlock):
                wake.receive_nowait()
