"""The dashboard in a real browser: Debian's Chromium driven by Playwright, against `corral run`.

One browser for the module; one daemon (a real `corral run` subprocess with the loopback
TCP listener) shared by the tests that need no restart, each in a channel of its own; the
reconnect test starts its own. The page talks to the daemon over loopback TCP exactly as a
person's browser does: logged in through the URL `corral dashboard` prints.

``CORRAL_DASHBOARD_SCREENSHOTS=1`` also saves the screenshots docs/dashboard.md shows (docs/).
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import METERED, METERED_LINE, METERED_MODEL, PYTHON, REPO, DaemonProcess

from scripts._config import toml_value

CHROMIUM = "/usr/bin/chromium"
#: Headless, and quiet on an offline machine (no update checks, no sync, no QUIC probes).
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync", "--disable-quic",
]
#: Generous: two cores shared with other test runs.
TIMEOUT_MS = 30_000

#: Skipped where Chromium is missing, except where CORRAL_REQUIRE_BROWSER=1 (CI): there they fail.
pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    not Path(CHROMIUM).exists() and os.environ.get("CORRAL_REQUIRE_BROWSER") != "1",
    reason=f"no Chromium at {CHROMIUM} (apt-get install -y chromium; .ci/run does)",
)]

if Path(CHROMIUM).exists() or os.environ.get("CORRAL_REQUIRE_BROWSER") == "1":
    from playwright.sync_api import Browser, BrowserContext, Page, Request, Route, expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class DashboardDaemon(DaemonProcess):
    """`corral run` with the demo agent and the loopback TCP listener the dashboard is served on."""

    def __init__(self, folder: Path, port: int) -> None:
        token = folder / "corral.token"
        if not token.exists():
            token.write_text("browser-test-token\n")
            token.chmod(0o600)
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        super().__init__(folder, f"""
[server]
socket = "corral.sock"
tcp = "127.0.0.1:{port}"
token_file = "corral.token"
[store]
path = "corral.db"
[defaults]
agent = "demo"
stop_grace = 2
[agents.demo]
adapter = "demo"
delay = 0.01
[agents.reviewer]
adapter = "demo"
delay = 0.01
[agents.meter]
adapter = "generic"
command = {toml_value([PYTHON, "-c", METERED])}
""")

    def login_url(self) -> str:
        """What `corral dashboard` prints."""
        done = self.cli("dashboard", check=True)
        return str(done.stdout.strip())

    def json(self, *args: str) -> Any:
        """``corral --json ARGS`` (over the Unix socket)."""
        return json.loads(self.cli("--json", *args, check=True).stdout)

    def tail(self, channel: str) -> list[dict[str, Any]]:
        """The channel's stored entries."""
        out = self.cli("--json", "tail", channel, check=True).stdout
        return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def daemon() -> Iterator[DashboardDaemon]:
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="corral-b-", dir="/tmp"))  # short: a Unix socket path
    d = DashboardDaemon(folder, _free_port())
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _logged_in(browser: Browser, daemon: DashboardDaemon) -> tuple[BrowserContext, Page]:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(daemon.login_url())
    expect(page).to_have_url(f"{daemon.base}/dashboard/")
    return context, page


def _channel(page: Page, daemon: DashboardDaemon, channel: str) -> None:
    from urllib.parse import quote

    page.goto(f"{daemon.base}/dashboard/channels/{quote(channel, safe='')}")


def _transcript(page: Page) -> list[dict[str, str | None]]:
    """The entries the page shows, in page order: seq, kind, turn, text."""
    result: list[dict[str, str | None]] = page.locator("#transcript > li").evaluate_all(
        "items => items.map(li => ({seq: li.dataset.seq, kind: li.dataset.kind, turn: li.dataset.turn || null,"
        " text: li.querySelector('.text') ? li.querySelector('.text').textContent : ''}))"
    )
    return result


def _screenshot(page: Page, name: str) -> None:
    if os.environ.get("CORRAL_DASHBOARD_SCREENSHOTS") == "1":
        page.screenshot(path=str(REPO / "docs" / name), full_page=True)


def _stops(page: Page) -> list[Request]:
    seen: list[Request] = []
    page.on("request", lambda r: seen.append(r) if r.method == "POST" and r.url.endswith("/stop") else None)
    return seen


def _start_long_task(page: Page, channel: str) -> None:
    """Send a long task from the page; return once its tool (a child and a setsid grandchild) runs."""
    page.get_by_role("textbox", name="Message").fill("please do a long task")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#transcript > li[data-kind=status]").filter(has_text="tool running")).to_have_count(1)


def test_login_through_the_url_sets_an_httponly_strict_cookie(browser: Browser, daemon: DashboardDaemon) -> None:
    url = daemon.login_url()
    assert url.startswith(f"{daemon.base}/dashboard/login?code=") and "browser-test-token" not in url
    context = browser.new_context()
    page = context.new_page()
    page.goto(url)
    expect(page).to_have_url(f"{daemon.base}/dashboard/")  # redirected: the code is not what stays shown
    expect(page.get_by_role("heading", name="Channels")).to_be_visible()
    expect(page.get_by_role("button", name="Stop all")).to_be_visible()
    (cookie,) = context.cookies()
    assert cookie["name"] == f"corral-session-{daemon.port}"
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and "browser-test-token" not in cookie["value"]
    assert page.evaluate("document.cookie") == "", "no script can read the session"
    # The URL works once: a second visit (a shoulder-surfer, a history entry) gets nothing.
    other = browser.new_context()
    again = other.new_page().goto(url)
    assert again is not None and again.status == 403 and "corral dashboard" in again.text()
    assert other.cookies() == []
    other.close()
    context.close()


def test_send_a_message_and_see_the_reply_stream_in(browser: Browser, daemon: DashboardDaemon) -> None:
    context, page = _logged_in(browser, daemon)
    _channel(page, daemon, "talk")
    expect(page.locator("#connection")).to_have_text(re.compile("No messages yet"))  # a channel not yet made
    page.get_by_role("textbox", name="Message").fill("Hello there")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#transcript > li.author-human .text")).to_have_text(["Hello there"])
    expect(page.locator("#transcript > li.author-agent.kind-message .text")).to_have_text(
        re.compile("You said: Hello there")
    )
    expect(page.locator("#connection")).to_have_text("Live")
    expect(page.get_by_role("textbox", name="Message")).to_have_value("")
    page.get_by_role("link", name="corral").click()
    expect(page.get_by_role("link", name="talk", exact=True)).to_be_visible()
    context.close()


def test_a_turns_usage_shows_under_its_answer_and_the_days_spend_above(
    browser: Browser, daemon: DashboardDaemon
) -> None:
    context, page = _logged_in(browser, daemon)
    _channel(page, daemon, "spend")
    page.get_by_label("Agent").select_option("meter")
    page.get_by_role("textbox", name="Message").fill("count")
    page.get_by_role("button", name="Send").click()
    spent = page.locator("#transcript > li.usage")
    expect(spent.locator(".text")).to_have_text(re.compile("^" + re.escape(METERED_LINE) + ".* s · "
                                                           + re.escape(METERED_MODEL) + "$"))
    kinds = [(e["kind"], (e["text"] or "")[:9]) for e in _transcript(page)]
    assert kinds[-2:] == [("message", "counted: "), ("status", "meter use")], kinds  # under the answer
    expect(page.locator("#spend")).to_have_text(re.compile(r"^Today \(UTC\): 1 turn · 1,200 tokens in · 34 out · "
                                                           r"1 tool · cost not known · [\d.]+ s$"))
    context.close()


def test_a_message_goes_by_its_mentions_or_to_the_chosen_agent(browser: Browser, daemon: DashboardDaemon) -> None:
    context, page = _logged_in(browser, daemon)
    _channel(page, daemon, "address")
    box = page.get_by_role("textbox", name="Message")
    box.fill("@reviewer have a look")  # the chooser's first choice: by @mentions, else the default
    page.get_by_role("button", name="Send").click()
    replies = page.locator("#transcript > li.author-agent.kind-message")
    expect(replies).to_have_count(1)
    expect(replies.locator(".author")).to_have_text([re.compile("reviewer")])
    page.get_by_label("Agent").select_option("demo")  # an explicit target: no mention needed
    box.fill("and you, please")
    page.get_by_role("button", name="Send").click()
    expect(replies).to_have_count(2)
    expect(replies.nth(1).locator(".author")).to_have_text(re.compile("demo"))
    messages = [e for e in daemon.tail("address") if e["kind"] == "message"]
    assert [e["author"].split(":")[0] for e in messages] == ["human", "agent", "human", "agent"]
    assert [e["author"] for e in messages][1::2] == ["agent:reviewer", "agent:demo"]
    context.close()


def test_stop_mid_tool_shows_the_apis_counts_and_the_notice_last(browser: Browser, daemon: DashboardDaemon) -> None:
    context, page = _logged_in(browser, daemon)
    try:
        _stop_mid_tool(page, daemon)
    finally:
        daemon.cli("stop", "busy")
        context.close()


def _stop_mid_tool(page: Page, daemon: DashboardDaemon) -> None:
    daemon.cli("send", "busy", "make the channel", check=True)
    daemon.cli("wait", "busy", check=True)
    _channel(page, daemon, "busy")
    _start_long_task(page, "busy")
    held: list[Route] = []
    page.route("**/v1/channels/busy/stop", lambda route: held.append(route))
    page.get_by_role("button", name="Stop").click()
    ack = page.get_by_role("status")
    # At once, before the server answered: "Stopping…", the button disabled, nothing claimed.
    expect(ack).to_have_text("Stopping…")
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()
    assert len(held) == 1
    with page.expect_response("**/v1/channels/busy/stop") as answered:
        held[0].continue_()
    result = answered.value.json()
    assert result["ok"] and not result["repeat"] and len(result["killed"]) >= 1
    expect(ack).to_have_text(re.compile(r"^Stopped in [\d.]+ ms: "))
    text = ack.text_content() or ""
    match = re.fullmatch(
        r"Stopped in ([\d.]+) ms: (\d+) process(?:es)? killed, (\d+) swept, (\d+) queued messages? dropped", text
    )
    assert match, text
    assert abs(float(match[1]) - result["elapsed_ms"]) <= 0.05
    assert [int(match[i]) for i in (2, 3, 4)] == [len(result["killed"]), len(result["swept"]), result["dropped"]]
    expect(page.get_by_role("button", name="Stop")).to_be_enabled()
    # The notice is the stopped turn's last entry; what comes next (a new message) is of another turn.
    expect(page.locator("#transcript > li").last).to_have_attribute("data-seq", str(result["notice_seq"]))
    _screenshot(page, "dashboard-channel.png")
    page.get_by_role("textbox", name="Message").fill("and now something short")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#transcript > li.author-agent.kind-message .text").last).to_have_text(
        re.compile("You said: and now something short")
    )
    shown = _transcript(page)
    stored = daemon.tail("busy")  # JSON lines
    assert [e["seq"] for e in shown] == [str(s["seq"]) for s in stored], "what the store saved, in seq order, once"
    (stopped_turn,) = result["stopped_turns"]
    notice = next(i for i, e in enumerate(shown) if e["seq"] == str(result["notice_seq"]))
    assert shown[notice]["kind"] == "notice" and shown[notice]["text"] == "Execution stopped by user."
    assert not [e for e in shown[notice + 1:] if e["turn"] == stopped_turn], "nothing of the stopped turn after it"
    assert [e["turn"] for e in shown[:notice] if e["turn"] == stopped_turn], "the turn's entries came before"


def test_a_second_press_during_stopping_sends_nothing_and_a_repeat_says_so(
    browser: Browser, daemon: DashboardDaemon
) -> None:
    context, page = _logged_in(browser, daemon)
    try:
        _press_twice(page, daemon)
    finally:
        daemon.cli("stop", "twice")
        context.close()


def _press_twice(page: Page, daemon: DashboardDaemon) -> None:
    daemon.cli("send", "twice", "make the channel", check=True)
    daemon.cli("wait", "twice", check=True)
    _channel(page, daemon, "twice")
    _start_long_task(page, "twice")
    sent = _stops(page)
    held: list[Route] = []
    page.route("**/v1/channels/twice/stop", lambda route: held.append(route))
    stop = page.get_by_role("button", name="Stop")
    stop.click()
    stop.click(force=True)  # a second, impatient press (the button is disabled: the browser drops it)
    stop.dispatch_event("click")  # and a synthetic one, which the script's own guard drops
    expect(page.get_by_role("status")).to_have_text("Stopping…")
    assert len(held) == 1 and len(sent) == 1, "one press, one request"
    held[0].continue_()
    expect(page.get_by_role("status")).to_have_text(re.compile("^Stopped in"))
    page.unroute("**/v1/channels/twice/stop")
    # Pressed again once it answered: nothing new ran since, so the server calls it a repeat.
    with page.expect_response("**/v1/channels/twice/stop") as answered:
        stop.click()
    assert answered.value.json()["repeat"] is True
    expect(page.get_by_role("status")).to_have_text(re.compile(r"^Already stopped: nothing new ran since the last stop"))
    assert len(sent) == 2
    notices = [e for e in _transcript(page) if e["kind"] == "notice"]
    assert len(notices) == 1, notices
    stored = [e for e in daemon.tail("twice") if e["kind"] == "notice"]
    assert [n["seq"] for n in notices] == [str(e["seq"]) for e in stored]


def test_a_stop_that_could_not_be_confirmed_is_shown_as_a_failure(browser: Browser, daemon: DashboardDaemon) -> None:
    """The answers the API documents for a failed stop (500, ``ok: false``) and a daemon that never answers."""
    context, page = _logged_in(browser, daemon)
    daemon.cli("send", "failing", "make the channel", check=True)
    daemon.cli("wait", "failing", check=True)
    _channel(page, daemon, "failing")
    failed = {"channel": "failing", "generation": 3, "repeat": False, "stopped_turns": ["t1"], "killed": [],
              "swept": [], "kill": None, "cpu_ms": 0.1, "dropped": 0, "notice_seq": None, "elapsed_ms": 2.0,
              "ok": False, "error": "cannot store the stop: database or disk is full (store corral.db)"}
    page.route("**/v1/channels/failing/stop",
               lambda route: route.fulfill(status=500, content_type="application/json", body=json.dumps(failed)))
    page.get_by_role("button", name="Stop").click()
    ack = page.get_by_role("status")
    expect(ack).to_have_text(
        "Stop FAILED, not confirmed: cannot store the stop: database or disk is full (store corral.db). "
        "The agents may still be running."
    )
    expect(ack).to_have_attribute("data-state", "failed")
    assert ack.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(179, 38, 30)", "red, not green"
    page.unroute("**/v1/channels/failing/stop")
    page.route("**/v1/channels/failing/stop", lambda route: route.abort("connectionrefused"))
    page.get_by_role("button", name="Stop").click()
    expect(ack).to_have_text(re.compile(r"^Stop NOT confirmed: the daemon did not answer .*press Stop again\.$"))
    expect(ack).to_have_attribute("data-state", "failed")
    expect(page.get_by_role("button", name="Stop")).to_be_enabled()
    context.close()


HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def test_hostile_agent_output_is_rendered_as_text(browser: Browser, daemon: DashboardDaemon) -> None:
    context, page = _logged_in(browser, daemon)
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    channel = '<b onmouseover="window.__pwned=3">bold</b>'
    daemon.cli("send", channel, HOSTILE, check=True)  # the demo agent echoes it: agent output
    daemon.cli("wait", channel, check=True)
    page.reload()
    link = page.get_by_role("link", name=channel, exact=True)
    expect(link).to_be_visible()
    link.click()
    expect(page.get_by_role("heading", name=channel, exact=True)).to_be_visible()
    reply = page.locator("#transcript > li.author-agent.kind-message .text")
    expect(reply).to_have_text(re.compile("You said: " + re.escape(HOSTILE)))
    assert page.locator("#transcript img, #transcript script, main b").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert violations == [], "nothing even tried to run (the CSP had nothing to block)"
    _screenshot(page, "dashboard-hostile.png")
    context.close()


def test_the_list_shows_each_agents_state_live_and_stop_all_is_acknowledged(
    browser: Browser, daemon: DashboardDaemon
) -> None:
    context, page = _logged_in(browser, daemon)
    try:
        expect(page.locator("#connection")).to_have_text("Live")
        for channel in ("list-a", "list-b"):
            daemon.cli("send", channel, "please do a long task", check=True)
        running = page.locator("tr", has=page.get_by_role("link", name=re.compile("^list-[ab]$")))
        expect(running.locator(".agent-state")).to_have_text(
            [re.compile(r"^demo: running since \d\d:\d\d:\d\d$")] * 2  # no raw turn id: it means nothing to a person
        )
        expect(page.locator("#running")).to_have_text("2")
        _screenshot(page, "dashboard-list.png")
        with page.expect_response("**/v1/stop") as answered:
            page.get_by_role("button", name="Stop all").click()
        result = answered.value.json()
        assert sorted(c["channel"] for c in result["channels"]) == ["list-a", "list-b"]
        ack = page.get_by_role("status")
        expect(ack).to_have_text(re.compile("^Stopped 2 channels in"))
        match = re.fullmatch(
            r"Stopped 2 channels in ([\d.]+) ms: (\d+) process(?:es)? killed, (\d+) swept, (\d+) queued messages? dropped",
            ack.text_content() or "",
        )
        assert match, ack.text_content()
        assert [int(match[i]) for i in (2, 3, 4)] == [len(result["killed"]), len(result["swept"]), result["dropped"]]
        expect(running.locator(".agent-state")).to_have_text(["demo: idle", "demo: idle"])
        expect(page.locator("#running")).to_have_text("0")
    finally:
        daemon.cli("stop", "--all")
        context.close()


def test_a_cookieless_request_is_refused(browser: Browser, daemon: DashboardDaemon) -> None:
    context = browser.new_context()
    page = context.new_page()
    response = page.goto(f"{daemon.base}/dashboard/")
    assert response is not None and response.status == 401 and "corral dashboard" in response.text()
    for method, path in [("GET", "/v1/status"), ("GET", "/dashboard/events"), ("POST", "/v1/stop")]:
        answer = context.request.fetch(f"{daemon.base}{path}", method=method,
                                       headers={"origin": daemon.base})
        assert answer.status == 401, (path, answer.text())
    context.close()


#: Another local program's pages: a script's POST (fetch), and a form's (a top-level navigation).
EVIL_PAGES = {
    "/fetch": """<!doctype html><html><body><script>
fetch("{base}/v1/channels/victim/stop", {{method: "POST", credentials: "include", mode: "no-cors", body: "{{}}"}});
</script></body></html>""",
    "/form": """<!doctype html><html><body><form id="f" method="POST" enctype="text/plain"
 action="{base}/v1/channels/victim/messages"><input name='{{"text": "injected", "x": "' value='"}}'></form>
<script>document.getElementById("f").submit();</script></body></html>""",
}


def test_a_cross_origin_post_is_refused(browser: Browser, daemon: DashboardDaemon) -> None:
    context, page = _logged_in(browser, daemon)
    daemon.cli("send", "victim", "please do a long task", check=True)
    _channel(page, daemon, "victim")
    expect(page.locator("#transcript > li[data-kind=status]").filter(has_text="tool running")).to_have_count(1)

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in EVIL_PAGES:
                self.send_error(404)
                return
            body = EVIL_PAGES[self.path].format(base=daemon.base).encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    evil = ThreadingHTTPServer(("127.0.0.1", 0), Evil)  # another local program: same site, other origin
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        attacker = context.new_page()
        with attacker.expect_response("**/v1/channels/victim/stop") as answered:
            attacker.goto(f"http://127.0.0.1:{evil.server_address[1]}/fetch")
        assert answered.value.status == 403  # an opaque answer: its body is the browser's secret
        answers = []
        with attacker.expect_response("**/v1/channels/victim/messages") as answered:
            attacker.goto(f"http://127.0.0.1:{evil.server_address[1]}/form")
        attacker.wait_for_url(f"{daemon.base}/v1/channels/victim/messages")  # the form navigated there
        answers.append((answered.value.status, json.loads(attacker.locator("body").text_content() or "")))
        for status, body in answers:
            # "cross_origin" is decided after the session: the browser sent a valid cookie along
            # (SameSite does not tell ports apart), and only the Origin check refused it.
            assert status == 403 and body["error"]["code"] == "cross_origin", body
            assert f"origin 'http://127.0.0.1:{evil.server_address[1]}'" in body["error"]["message"]
        status = daemon.json("status")["channels"]["victim"]
        assert status["turn"] is not None and status["generation"] == 0, "the long task runs on: nothing stopped it"
        assert not [e for e in daemon.tail("victim") if e["kind"] == "notice" or "injected" in e["text"]]
    finally:
        evil.shutdown()
        evil.server_close()
        daemon.cli("stop", "victim", check=True)
        context.close()


def test_the_page_reconnects_after_a_daemon_restart(browser: Browser, short_tmp: Path) -> None:
    port = _free_port()
    first = DashboardDaemon(short_tmp, port)
    second: DashboardDaemon | None = None
    try:
        first.cli("send", "again", "before the restart", check=True)
        first.cli("wait", "again", check=True)
        context, page = _logged_in(browser, first)
        _channel(page, first, "again")
        expect(page.locator("#transcript > li.author-agent.kind-message .text")).to_have_text(
            [re.compile("You said: before the restart")]
        )
        expect(page.locator("#connection")).to_have_text("Live")
        assert first.stop() == 0
        expect(page.locator("#connection")).to_have_text("Reconnecting…")
        second = DashboardDaemon(short_tmp, port)
        expect(page.locator("#connection")).to_have_text("Live")  # the same session: the cookie outlives a restart
        second.cli("send", "again", "after the restart", check=True)
        expect(page.locator("#transcript > li.author-agent.kind-message .text")).to_have_text(
            [re.compile("You said: before the restart"), re.compile("You said: after the restart")]
        )
        second.cli("wait", "again", check=True)
        stored = second.tail("again")
        expect(page.locator("#transcript > li")).to_have_count(len(stored))
        assert [e["seq"] for e in _transcript(page)] == [str(s["seq"]) for s in stored], "none lost, none twice"
        context.close()
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_streaming_reply_shows_as_an_unsaved_draft_until_its_entry_replaces_it(
    browser: Browser, daemon: DashboardDaemon
) -> None:
    """A turn that streams for 12 s: the page and an SSE follower (``corral tail -f --json``)
    show its text within a second of the agent printing it, all along (across two saved 5 s
    pieces, each followed by a new draft), and the saved entries then stand where the drafts
    were."""
    import subprocess
    import time

    from conftest import CORRAL

    seconds = 12
    context, page = _logged_in(browser, daemon)
    _channel(page, daemon, "drafts")
    page.get_by_role("textbox", name="Message").fill("hello")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#transcript > li.author-agent.kind-message")).to_have_count(1)
    after = daemon.tail("drafts")[-1]["seq"]
    env = {**os.environ, "CORRAL_SOCKET": str(daemon.socket)}
    follower = subprocess.Popen([*CORRAL, "tail", "drafts", "-f", "--json", "--after", str(after)], cwd=daemon.folder,
                                env=env, stdout=subprocess.PIPE, text=True)
    lags: list[float] = []

    def follow() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            item = json.loads(line)
            last = str(item["text"]).rsplit("\n", 1)[-1]
            if item["kind"] == "draft" and "printed at " in last:
                lags.append(time.time() - float(last.rsplit("printed at ", 1)[1].rstrip(".")))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        page.get_by_role("textbox", name="Message").fill(f"stream {seconds} please")
        page.get_by_role("button", name="Send").click()
        draft = page.locator("#transcript > li.draft")
        expect(draft).to_have_count(1)
        expect(draft.locator(".kind")).to_have_text("writing… (not saved yet)")
        assert draft.evaluate("li => getComputedStyle(li).opacity") != "1"
        # All along the stream (a 4 KiB or 5 s piece is saved meanwhile, and a new draft
        # takes over): the newest line is on the page within a second of being printed.
        for line in range(0, seconds * 10 - 10, 40):
            newest = page.locator("#transcript > li.draft .text").filter(has_text=f"Streaming line {line},")
            expect(newest).to_have_count(1)
            shown = newest.text_content() or ""
            printed = float(shown.rstrip(".").rsplit("printed at ", 1)[1])
            assert time.time() - printed < 1.0, f"line {line}: the page is {time.time() - printed:.2f} s behind"
        # Once saved, the entries stand where the drafts were; no draft is left.
        expect(page.locator("#transcript > li.author-agent.kind-message .text").last).to_contain_text(
            "You said: stream"
        )
        expect(page.locator("#transcript > li.draft")).to_have_count(0)
    finally:
        follower.kill()
        follower.wait()
        reader.join(timeout=10)
    assert len(lags) >= seconds * 5 and max(lags) < 1.0, (len(lags), max(lags, default=None))
    saved = [e for e in daemon.tail("drafts") if e["seq"] > after and e["author"] == "agent:demo"
             and e["kind"] == "message"]
    assert len(saved) >= seconds // 5 and all(e["meta"].get("draft") for e in saved), saved
    page_texts = [e["text"] for e in _transcript(page) if e["kind"] == "message" and e["seq"]]
    assert [e["text"] for e in saved] == page_texts[-len(saved):]
    context.close()


def test_run_again_start_over_and_the_newest_entries_in_view(browser: Browser, daemon: DashboardDaemon) -> None:
    """Issue 25: a dropped message runs again in one press; Start over is refused while a turn
    runs and then stops and starts over; a long transcript opens at its end, the send box in view."""
    for i in range(40):  # more than a screen
        daemon.cli("send", "over", f"filler {i}", check=True)
    daemon.cli("wait", "over", check=True)
    context, page = _logged_in(browser, daemon)
    try:
        _channel(page, daemon, "over")
        expect(page.locator("#transcript > li.author-agent .text").last).to_have_text(re.compile("filler 39"))
        expect(page.get_by_role("textbox", name="Message")).to_be_in_viewport()
        _start_long_task(page, "over")
        daemon.cli("send", "over", "dropped by the stop", check=True)
        page.get_by_role("button", name="Start over").click()
        ack = page.get_by_role("status")
        expect(ack).to_have_text(re.compile("A turn is running here"))
        assert daemon.json("status")["channels"]["over"]["agents"]["demo"]["state"] == "running", "nothing was done"
        page.get_by_role("button", name="Stop and start over").click()
        expect(ack).to_have_text(re.compile("^Stopped, then conversation reset: demo starts a new conversation"))
        again = page.locator("#transcript > li.author-human").filter(has_text="dropped by the stop")
        again.get_by_role("button", name="Run again").click()
        expect(again.locator(".dropped")).to_have_text(re.compile(r"sent again as \d+"))
        expect(page.locator("#transcript > li.author-agent.kind-message .text").last).to_have_text(
            re.compile("You said: dropped by the stop")
        )
        reply = [e for e in daemon.tail("over") if e["author"] == "agent:demo" and e["kind"] == "message"][-1]
        assert "start of conversation" in reply["text"], reply
    finally:
        daemon.cli("stop", "over")
        context.close()


def test_a_message_chosen_to_interrupt_replaces_the_running_turn(browser: Browser, daemon: DashboardDaemon) -> None:
    context, page = _logged_in(browser, daemon)
    try:
        daemon.cli("send", "swap", "make the channel", check=True)
        daemon.cli("wait", "swap", check=True)
        _channel(page, daemon, "swap")
        _start_long_task(page, "swap")
        daemon.cli("send", "swap", "queued behind it", check=True)
        expect(page.locator("#transcript > li.author-human .text").last).to_have_text("queued behind it")
        page.get_by_label("If busy").select_option("interrupt")
        page.get_by_role("textbox", name="Message").fill("do this instead")
        with page.expect_response("**/v1/channels/swap/messages") as answered:
            page.get_by_role("button", name="Send").click()
        result = answered.value.json()
        assert result["delivery"] == "interrupt" and len(result["interrupted"]) == 1
        expect(page.locator("#transcript > li.kind-notice .text")).to_have_text(
            ["Interrupted by a new message. 1 queued message was not run."]
        )
        # The message it dropped says so on the open page, as a stop's does, naming the interrupt.
        dropped_by = re.compile(rf"^not run: dropped by an interrupt \(message {result['seq']}\)")
        expect(page.locator("#transcript > li.author-human").filter(has_text="queued behind it").locator(".dropped")
               ).to_have_text(dropped_by)
        expect(page.locator("#transcript > li.author-agent.kind-message .text").last).to_have_text(
            re.compile("You said: do this instead")
        )
        shown = _transcript(page)
        notice = next(i for i, e in enumerate(shown) if e["kind"] == "notice")
        (interrupted,) = result["interrupted"]
        assert not [e for e in shown[notice + 1:] if e["turn"] == interrupted], "nothing of it after its notice"
        # The cancelled plan is said just before the notice; a page opened later says the same.
        assert shown[notice - 1]["kind"] == "todos" and "Plan cancelled (demo)." in str(shown[notice - 1]["text"])
        page.reload()
        expect(page.locator("#transcript > li.author-human").filter(has_text="queued behind it").locator(".dropped")
               ).to_have_text(dropped_by)
    finally:
        daemon.cli("stop", "swap")
        context.close()


def test_a_browser_whose_session_expired_gets_the_login_page_and_a_new_url_brings_it_back(
    browser: Browser, daemon: DashboardDaemon
) -> None:
    """Issue 32: an expired session showed the API's raw JSON 401 on a reload."""
    context, page = _logged_in(browser, daemon)
    try:
        # The session as it is after its 24 hours: a cookie the daemon signed, two days ago.
        import time

        from supervisor.serve import dashauth

        key = dashauth.session_key((daemon.folder / "corral.token").read_text().strip())
        (cookie,) = context.cookies()
        context.clear_cookies()
        context.add_cookies([{**cookie, "value": dashauth.new_session(key, time.time() - 2 * 86400)}])  # type: ignore[list-item]
        page.reload()
        expect(page.get_by_role("heading", name="Log in to the dashboard")).to_be_visible()
        expect(page.locator("#signed-out")).to_contain_text("corral dashboard")
        assert "unauthorized" not in page.content()
        page.goto(daemon.login_url())
        expect(page).to_have_url(f"{daemon.base}/dashboard/")
        expect(page.get_by_role("heading", name="Channels")).to_be_visible()
    finally:
        context.close()


def test_the_queue_shows_under_the_running_turn_and_its_cross_takes_one_back(
    browser: Browser, daemon: DashboardDaemon
) -> None:
    context, page = _logged_in(browser, daemon)
    try:
        daemon.cli("send", "lineup", "make the channel", check=True)
        daemon.cli("wait", "lineup", check=True)
        _channel(page, daemon, "lineup")
        _start_long_task(page, "lineup")
        first = daemon.json("send", "lineup", "first in line", "--as", "alice")["seq"]
        second = daemon.json("send", "lineup", "second in line")["seq"]
        rows = page.locator("#queue > li")
        expect(rows).to_have_count(2)
        expect(rows.first).to_contain_text(f"seq {first} · alice → demo")
        expect(rows.first.locator(".why")).to_contain_text("behind the running turn")
        with page.expect_response(f"**/v1/channels/lineup/queue/{first}") as answered:
            page.get_by_role("button", name=f"Take back seq {first}").click()
        assert answered.value.status == 200
        expect(page.locator("#ack")).to_have_text(f"Taken back: seq {first} will not run.")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text(f"seq {second}")
        assert [q["entry"] for q in daemon.json("queue", "lineup")["queued"]] == [second]
        assert any(e["text"] == f"seq {first} taken back by user" for e in daemon.tail("lineup"))
    finally:
        daemon.cli("stop", "lineup")
        context.close()
