#!/usr/bin/env python
"""The web dashboard in Debian's Chromium against a real ``corral run`` holding many channels.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_dashboard`` (``--quick``
for a small fast run). It needs Chromium at ``/usr/bin/chromium`` (``apt-get install chromium``)
and Playwright (the ``test`` extra); it never downloads a browser.

Figures:

* **first render**: with N channels (default 200, each with one finished turn), the time from
  starting the navigation to ``/dashboard/`` to the list showing a row for every channel
  (filled from the status stream's first event), median of ``--runs`` page loads.
  Target: under 1 s.
* **live update**: with the list open, a message sent to one channel through the API (Unix
  socket), then the time to the channel's row leaving "idle" (the message's entry wakes the
  status stream) and to it showing "running"; then a stop through the API and the time to
  the row showing "idle" again. Median over ``--runs`` channels. Target: under 1 s.
* **idle**: the daemon's event-loop thread's context switches while the list and one
  channel page stay open and nothing happens, over ``--idle`` seconds (after a settling
  time: Trio's idle worker threads exit after 10 s, idle keep-alive connections after 5 s).
  Each open event stream sends one keep-alive comment every ``KEEPALIVE_SECONDS``; nothing
  else should wake the daemon.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from scripts._bench import Daemon, server_tables, short_tmp, spread, sweep_leftovers
from scripts._config import toml
from scripts.bench_daemon import thread_switches
from supervisor.serve.client import Client
from supervisor.serve.dashboard import BUSY_REFRESH_SECONDS, KEEPALIVE_SECONDS

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync", "--disable-quic",
]
TARGET_MS = 1000.0
#: ``corral`` with the keep-alive interval made endless (``run -c FILE`` is appended).
KEEPALIVE_OFF = (
    "import sys; import supervisor.serve.api as api, supervisor.serve.dashboard as dashboard; "
    "api.KEEPALIVE_SECONDS = dashboard.KEEPALIVE_SECONDS = 1e9; "
    "from supervisor.cli import main; sys.argv[0] = 'corral'; main()"
)
#: Before counting idle wake-ups: Trio's idle worker threads exit after 10 s, hypercorn closes
#: an idle keep-alive connection (the page's fetches) after 5 s.
SETTLE_SECONDS = 12.0


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(port: int) -> str:
    return toml({
        **server_tables(tcp=f"127.0.0.1:{port}", token_file="corral.token"),
        "defaults": {"stop_grace": 2},
        "agents.demo": {"adapter": "demo", "delay": 0},
    })


def _state_of(page: Page, channel: str) -> str:
    return str(page.evaluate(
        "name => { const a = document.querySelector(`a[href=\"/dashboard/channels/${encodeURIComponent(name)}\"]`);"
        " return a ? a.closest('tr').querySelector('.agent-state').dataset.state : 'absent'; }",
        channel,
    ))


def _wait_state(page: Page, channel: str, states: tuple[str, ...]) -> None:
    page.wait_for_function(
        "([name, states]) => { const a = document.querySelector("
        "`a[href=\"/dashboard/channels/${encodeURIComponent(name)}\"]`);"
        " return a && states.includes(a.closest('tr').querySelector('.agent-state').dataset.state); }",
        arg=[channel, list(states)], polling="raf", timeout=30_000,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--channels", type=int, default=200, help="channels in the list (default 200)")
    parser.add_argument("--runs", type=int, default=5, help="page loads and live updates measured (default 5)")
    parser.add_argument("--idle", type=float, default=2 * KEEPALIVE_SECONDS + 5,
                        help=f"seconds of idleness counted (default {2 * KEEPALIVE_SECONDS + 5:g})")
    parser.add_argument("--quick", action="store_true", help="20 channels, 3 runs, 10 s idle")
    parser.add_argument("--keepalive-off", action="store_true",
                        help="run the daemon with the keep-alive off, to show that nothing else wakes it")
    args = parser.parse_args()
    if args.quick:
        args.channels, args.runs, args.idle = 20, 3, 10.0
    if not Path(CHROMIUM).exists():
        print(f"no Chromium at {CHROMIUM}: apt-get install chromium")
        return 2
    folder = short_tmp("corral-dash-")
    port = _free_port()
    token = "bench-token"
    (folder / "corral.token").write_text(token + "\n")
    (folder / "corral.token").chmod(0o600)
    wrapper = [sys.executable, "-c", KEEPALIVE_OFF] if args.keepalive_off else None
    daemon = Daemon(folder, _config(port), command=wrapper)
    base = f"http://127.0.0.1:{port}"
    failed = False
    try:
        api = Client(str(daemon.socket), timeout=120)
        started = time.perf_counter()
        names = [f"ch-{i:03d}" for i in range(args.channels)]
        for name in names:
            api.send(name, "hello")
        for name in names:
            api.wait(name, timeout=120)
        print(f"{args.channels} channels, each with one finished turn, in {time.perf_counter() - started:.1f} s")

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context()
            page = context.new_page()
            minted = Client(url=base, token=token).login_code()
            page.goto(f"{base}{minted['path']}")
            page.wait_for_selector(f'body[data-rendered="{args.channels}"]')

            renders = []
            for _ in range(args.runs):
                begin = time.perf_counter()
                page.goto(f"{base}/dashboard/", wait_until="commit")
                page.wait_for_selector(f'body[data-rendered="{args.channels}"]', timeout=30_000)
                renders.append((time.perf_counter() - begin) * 1000)
            print(f"first render of {args.channels} channels (navigation to every row shown): {spread(renders)}")

            first_change, running, idle_again = [], [], []
            for name in names[: args.runs]:
                begin = time.perf_counter()
                api.send(name, "please do a long task")
                _wait_state(page, name, ("queued", "running"))
                first_change.append((time.perf_counter() - begin) * 1000)
                _wait_state(page, name, ("running",))
                running.append((time.perf_counter() - begin) * 1000)
                # The tool is running once its status entry is stored: stop mid-tool.
                while not any("tool running" in e["text"] for e in api.entries(name)):
                    time.sleep(0.05)
                begin = time.perf_counter()
                result = api.stop(name)
                assert result["ok"], result
                _wait_state(page, name, ("idle",))
                idle_again.append((time.perf_counter() - begin) * 1000)
            print(f"live update, send -> row leaves idle:      {spread(first_change)}")
            print(f"live update, send -> row shows running:    {spread(running)}"
                  f"  (the turn's start stores no entry: seen by the {BUSY_REFRESH_SECONDS:g} s busy refresh"
                  " unless an entry comes first)")
            print(f"live update, stop returns -> row idle:     {spread(idle_again)}")
            worst = max(statistics.median(renders), statistics.median(running), statistics.median(idle_again))
            verdict = "met" if worst < TARGET_MS else "MISSED"
            failed = worst >= TARGET_MS
            print(f"target: medians under {TARGET_MS:.0f} ms: {verdict}")

            channel_page = context.new_page()
            channel_page.goto(f"{base}/dashboard/channels/{names[0]}")
            channel_page.wait_for_selector("#connection[data-state=live]")
            time.sleep(SETTLE_SECONDS)
            before = thread_switches(daemon.pid)
            time.sleep(args.idle)
            after = thread_switches(daemon.pid)
            loop = str(daemon.pid)
            woke = after[loop][1] - before[loop][1]
            others = {f"{n}/{tid}": total - before.get(tid, (n, 0))[1] for tid, (n, total) in after.items()
                      if tid != loop and total != before.get(tid, (n, 0))[1]}
            expected = 0 if args.keepalive_off else 2 * int(args.idle // KEEPALIVE_SECONDS)
            every = "off" if args.keepalive_off else f"one per stream every {KEEPALIVE_SECONDS:g} s"
            print(f"idle with the list and a channel open (2 event streams), {args.idle:g} s: event-loop thread"
                  f" context switches {woke}; keep-alive comments due about {expected} ({every});"
                  f" other threads: {json.dumps(others) if others else 'none'}")
            browser.close()
        api.close()
    finally:
        daemon.stop()
        left = sweep_leftovers(str(folder))
        shutil.rmtree(folder, ignore_errors=True)
    if left:
        print(f"LEFTOVER processes: {left}")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
