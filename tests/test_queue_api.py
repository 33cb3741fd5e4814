"""The queue and idempotent sends through the control API, the client, the CLI and the asyncio
host: the statuses (200, 404 not_queued, 409 running, 429 queue_full with the depth), a key that
answers its first acceptance again, and a daemon killed between a send's commit and its answer
whose CLI retry runs the message once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import CORRAL, PYTHON, SUPERVISOR_PIDS, DaemonProcess, _die_with_parent, make_config, script_agent
from test_stop_contract import AGENT, Gate

from supervisor.serve.asyncio_host import open_asyncio_supervisor
from supervisor.serve.client import APIError, Client
from supervisor.serve.daemon import run_daemon
from supervisor.store.store import StoreError


async def test_the_api_shows_edits_and_limits_the_queue_and_a_key_runs_a_message_once(short_tmp: Path) -> None:
    gate = Gate(short_tmp / "gate")
    config = make_config(short_tmp, {"bot": script_agent(AGENT)}, max_queued=1)
    c = Client(str(config.server.socket))

    def call(fn: Any) -> Any:
        return trio.to_thread.run_sync(fn)

    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status)
        )
        try:
            first = await call(lambda: c.send("ch", f"first gate={gate}", idempotency_key="k-1"))
            again = await call(lambda: c.send("ch", f"first gate={gate}", idempotency_key="k-1"))
            assert again["seq"] == first["seq"] and again["replayed"] and not first["replayed"]
            with trio.fail_after(30):
                while not (await call(lambda: c.queue("ch")))["running"]:
                    await trio.sleep(0.05)  # (polling the API for the turn to begin: real processes)
            with pytest.raises(APIError) as running:
                await call(lambda: c.cancel("ch", first["seq"], author="alice"))
            assert (running.value.status, running.value.code) == (409, "running")
            assert running.value.body["error"]["running"][0]["agent"] == "bot"

            one = await call(lambda: c.send("ch", "one", author="alice"))
            with pytest.raises(APIError) as full:
                await call(lambda: c.send("ch", "two"))
            assert (full.value.status, full.value.code) == (429, "queue_full")
            assert (full.value.body["error"]["depth"], full.value.body["error"]["limit"]) == (1, 1)
            # Another author's same key is another message (here: refused as the queue is full).
            with pytest.raises(APIError):
                await call(lambda: c.send("ch", "three", author="bob", idempotency_key="k-1"))

            view = await call(lambda: c.queue("ch"))
            assert [(r["entry"], r["author"]) for r in view["queued"]] == [(one["seq"], "human:alice")]
            cli = await call(lambda: subprocess.run(
                [*CORRAL, "--socket", str(config.server.socket), "queue", "ch"], capture_output=True, text=True,
                timeout=60))
            assert f"[{one['seq']:>5}] #1 bot" in cli.stdout and "behind the running turn" in cli.stdout
            done = await call(lambda: c.cancel("ch", one["seq"], author="alice"))
            assert done["agents"] == ["bot"] and done["by"] == "human:alice"
            with pytest.raises(APIError) as gone:
                await call(lambda: c.move_first("ch", one["seq"]))
            assert (gone.value.status, gone.value.code) == (404, "not_queued")
            gate.open()
            assert await call(lambda: c.wait("ch", 60))
            entries = await call(lambda: c.entries("ch"))
            assert [e["text"] for e in entries if e["author"] == "human:user"] == [f"first gate={gate}"]
        finally:
            await call(c.shutdown)
            c.close()
            gate.close()


#: A daemon that dies (SIGKILL) right after its first send is committed, before the answer.
_DIES = """
import os, signal, sys
from supervisor.serve import api
real = api.ControlAPI._send
async def send(self, op, path, query, body, peer):
    async def die(*args, **kw):
        await self.sup.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    peer.respond = die
    return await real(self, op, path, query, body, peer)
api.ControlAPI._send = send
from supervisor.cli import main
main(["run", "-c", "corral.toml"])
"""

_CONFIG = """
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[agents.demo]
adapter = "demo"
delay = 0.01
"""


def test_a_send_whose_daemon_is_killed_between_commit_and_answer_is_retried_by_the_cli_and_runs_once(
    short_tmp: Path,
) -> None:
    (short_tmp / "corral.toml").write_text(_CONFIG)
    dying = subprocess.Popen([PYTHON, "-c", _DIES], cwd=short_tmp, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=_die_with_parent)
    SUPERVISOR_PIDS.add(dying.pid)
    assert dying.stderr is not None
    deadline = time.monotonic() + 60
    while "ready on" not in dying.stderr.readline():
        assert time.monotonic() < deadline and dying.poll() is None, "the daemon did not start"
    env = {**os.environ, "CORRAL_SOCKET": str(short_tmp / "corral.sock")}
    sender = subprocess.Popen([*CORRAL, "send", "ch", "exactly once", "--json"], cwd=short_tmp, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert dying.wait(timeout=60) == -signal.SIGKILL  # it died between the commit and the answer
    daemon = DaemonProcess(short_tmp, _CONFIG)  # started again while the CLI retries
    try:
        out, err = sender.communicate(timeout=60)
        assert sender.returncode == 0, err
        answer = json.loads(out)
        assert answer["replayed"] is True  # the first acceptance, answered again
        assert daemon.cli("wait", "ch", "--timeout", "60").returncode == 0
    finally:
        daemon.stop()
    stored = subprocess.run([PYTHON, "-c", (
        "import sqlite3; db = sqlite3.connect('corral.db');"
        "print(db.execute(\"SELECT count(*) FROM entries WHERE text = 'exactly once'"
        " AND author = 'human:user'\").fetchone()[0])")],
        cwd=short_tmp, capture_output=True, text=True, check=True)
    assert stored.stdout.strip() == "1" and answer["seq"] > 0


def test_the_asyncio_host_sends_from_an_origin_once_and_edits_the_queue(short_tmp: Path) -> None:
    async def main() -> tuple[int, int | None, str, int]:
        async with open_asyncio_supervisor(make_config(short_tmp)) as sup:
            accepted = await sup.send_from("bot:event-1", "room", "hello")
            try:
                await sup.send_from("bot:event-1", "room", "hello")
            except StoreError:
                refused = "refused"
            else:
                refused = "accepted twice"
            seen = await sup.origin_seq("bot:event-1")
            await asyncio.wait_for(sup.wait_idle("room"), 30)
            view = await sup.queue("room")
            keyed = await sup.send("room", "keyed", idempotency_key="once")
            repeat = await sup.send("room", "keyed", idempotency_key="once")
            assert repeat.replayed and repeat.seq == keyed.seq
            await asyncio.wait_for(sup.wait_idle("room"), 30)
        return accepted.seq, seen, refused, view["depth"]

    seq, seen, refused, depth = asyncio.run(asyncio.wait_for(main(), 90))
    assert seen == seq and refused == "refused" and depth == 0
