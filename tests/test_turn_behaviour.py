"""A turn survives what real CLIs print, retries a forgotten session, and keeps its limits."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from conftest import make_config, script_agent

from supervisor import open_supervisor
from supervisor.procs.lines import MAX_LINE

MESSY = r"""
import json, sys
out = sys.stdout.buffer
out.write(json.dumps({"type": "session", "id": "s-1"}).encode() + b"\n")
out.write(b"caf\xe9 \xff\xfe not utf-8\n")
out.write(b"x" * (2 * 1024 * 1024) + b"\n")
out.write(b'{"type": "text", "text": "unterminated\n')
out.write(b'{"type": "mystery", "text": "?"}\n')
out.write(b'{"type": "todos", "todos": "not a list"}\n')
out.write(json.dumps({"type": "result", "text": "still fine"}).encode() + b"\n")
out.flush()
"""


async def test_bad_bytes_overlong_lines_and_garbage_do_not_break_the_turn(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"messy": script_agent(MESSY)})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "go")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
    texts = [e.text for e in entries]
    # The plain lines up to the unknown type are one message, a line each.
    lines = [e.text for e in entries if e.kind == "message"][0].split("\n")
    assert lines[0] == "caf\ufffd \ufffd\ufffd not utf-8"
    assert lines[1].startswith("xxxx") and len(lines[1].encode()) == MAX_LINE, "an over-long line is capped, not dropped"
    assert texts[-1] == "still fine"
    assert not [e for e in entries if e.kind == "error"]
    assert sup._store.session("c", "messy")[0] == "s-1"


async def test_a_forgotten_session_is_dropped_and_the_turn_retried_once(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    async with open_supervisor(config) as sup:
        await sup.send("c", "hello")
        with trio.fail_after(60):
            await sup.wait_idle("c")
        _, cwd = sup._store.session("c", "demo")
        sup._store.save_session("c", "demo", "no-such-session", cwd)
        accepted = await sup.send("c", "are you there?")
        with trio.fail_after(60):
            await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
        new_session = sup._store.session("c", "demo")[0]
    kinds = [(e.kind, e.text) for e in entries]
    assert ("status", "Session no-such-session is gone; starting a new conversation.") in kinds
    assert not [e for e in entries if e.kind == "error"], kinds
    assert any(e.kind == "message" and "You said: are you there?" in e.text for e in entries)
    assert new_session not in (None, "no-such-session")


async def test_the_agent_gets_a_scrubbed_environment_plus_its_own(short_tmp: Path, monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "1000")
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("CORRAL_SOCKET", "/tmp/x.sock")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    code = "import json, os; print(json.dumps({'type': 'result', 'text': json.dumps(dict(os.environ))}))"
    config = make_config(short_tmp, {"env": script_agent(code, env={"MY_TOKEN": "mine"})})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "env?")
        with trio.fail_after(60):
            await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
    import json

    env = json.loads(entries[-1].text)
    for leaked in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "LISTEN_FDS", "CORRAL_SOCKET", "AWS_SECRET_ACCESS_KEY"):
        assert leaked not in env
    assert env["MY_TOKEN"] == "mine"
    assert env["CORRAL_TURN"] == entries[-1].turn
    assert env["HOME"].startswith(str(short_tmp)) and env["TMPDIR"].startswith(env["HOME"])


async def test_message_text_never_reaches_a_shell(short_tmp: Path) -> None:
    code = "import sys, json; print(json.dumps({'type': 'result', 'text': sys.argv[-1]}))"
    config = make_config(short_tmp, {"echo": script_agent(code)})
    nasty = "$(touch pwned) `touch pwned2`; touch pwned3 && echo '\"' | cat"
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", nasty)
        with trio.fail_after(60):
            await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
        cwd = Path(sup._store.session("c", "echo")[1] or sup.channel_cwd("c", config.agents["echo"]))
    assert entries[-1].text == nasty
    assert not list(cwd.glob("pwned*")) and not list(short_tmp.glob("pwned*"))


async def test_each_channel_keeps_a_fixed_working_directory_per_agent(short_tmp: Path) -> None:
    code = "import os, json; print(json.dumps({'type': 'session', 'id': 'x'})); print(json.dumps({'type': 'result', 'text': os.getcwd()}))"
    config = make_config(short_tmp, {"pwd": script_agent(code)})
    async with open_supervisor(config) as sup:
        seen = []
        for channel in ("a", "a", "b"):
            accepted = await sup.send(channel, "where?")
            with trio.fail_after(60):
                await sup.wait_idle(channel)
            seen.append((await sup.entries(channel, after=accepted.seq))[-1].text)
    assert seen[0] == seen[1] != seen[2]
    assert all(Path(p).is_dir() for p in seen)


async def test_messages_for_a_busy_channel_queue_and_run_in_order(short_tmp: Path) -> None:
    code = "import sys, json; print(json.dumps({'type': 'result', 'text': 'echo ' + sys.argv[-1]}))"
    config = make_config(short_tmp, {"echo": script_agent(code)})
    async with open_supervisor(config) as sup:
        accepted = [await sup.send("c", f"m{i}") for i in range(5)]
        assert [a.queued for a in accepted] == [0, 1, 2, 3, 4]
        with trio.fail_after(60):
            await sup.wait_idle("c")
        entries = await sup.entries("c")
    answers = [e.text for e in entries if e.author == "agent:echo"]
    assert answers == [f"echo m{i}" for i in range(5)]
    turns = [e.turn for e in entries if e.author == "agent:echo"]
    assert len(set(turns)) == 5, "each message is its own turn"


ORPHAN_THAT_DIES = r"""
import json, os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        while os.getppid() != int(sys.argv[2]):  # until re-parented to the subreaper
            time.sleep(0.005)
        os.write(w, str(os.getpid()).encode())
        os._exit(0)  # dies on its own: a zombie of the subreaper, with no environment left
    os._exit(0)
os.close(w)
os.wait()
pid = int(os.read(r, 32))
while True:  # wait until it is a zombie of the subreaper
    with open(f"/proc/{pid}/stat") as fh:
        if fh.read().rsplit(") ", 1)[1][0] == "Z":
            break
    time.sleep(0.005)
print(json.dumps({"type": "result", "text": str(pid)}))
"""


async def test_the_daemon_reaps_adopted_processes_that_died_on_their_own(short_tmp: Path) -> None:
    import os
    from dataclasses import replace

    agent = script_agent(ORPHAN_THAT_DIES, args=["--", str(os.getpid())])
    config = make_config(short_tmp, {"orphans": agent})
    # Unsandboxed: the premise is the subreaper adopting a turn's orphan. In the sandbox an
    # orphan re-parents to bwrap's init inside the turn's pid namespace (the next test).
    config = replace(config, server=replace(config.server, sandbox="off"))
    async with open_supervisor(config, subreaper=True, owns_children=True) as sup:
        accepted = await sup.send("c", "go")
        with trio.fail_after(60):
            await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
        zombie = int(entries[-1].text)
        await trio.testing.wait_all_tasks_blocked()  # the reaping pass after the turn has run
        assert not Path(f"/proc/{zombie}").exists(), "a dead adoptee was left as a zombie"


# In the sandbox: the orphan re-parents to bwrap's init (pid 1 of the turn's namespace), says
# "PID NS" in a file, and dies once the file "go" beside it exists; the agent waits until it
# is gone from its namespace (reaped there), then answers.
ORPHAN_IN_THE_SANDBOX = r"""
import json, os, sys, time
pidfile = sys.argv[-1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while os.getppid() != 1:  # until re-parented to the namespace's init
            time.sleep(0.005)
        with open(pidfile + ".tmp", "w") as fh:
            fh.write(f"{os.getpid()} {os.stat('/proc/self/ns/pid').st_ino}")
        os.rename(pidfile + ".tmp", pidfile)
        while not os.path.exists(pidfile + ".go"):
            time.sleep(0.005)
        os._exit(0)  # dies on its own, an orphan
    os._exit(0)
os.wait()
while not os.path.exists(pidfile):
    time.sleep(0.005)
pid = int(open(pidfile).read().split()[0])
while os.path.exists(f"/proc/{pid}"):  # until reaped, zombie and all
    time.sleep(0.005)
print(json.dumps({"type": "result", "text": "reaped"}))
"""


async def test_in_the_sandbox_an_orphan_that_dies_is_reaped_by_bwraps_init(short_tmp: Path) -> None:
    import os

    import psutil

    from supervisor.testing import host_pid, read_pid

    pidfile = short_tmp / "orphan.pid"
    config = make_config(short_tmp, {"orphans": script_agent(ORPHAN_IN_THE_SANDBOX)})
    async with open_supervisor(config, subreaper=True, owns_children=True) as sup:
        accepted = await sup.send("c", str(pidfile))
        with trio.fail_after(60):
            while not pidfile.exists():
                await trio.sleep(0.01)  # a file another process writes: polled, within a bound
        orphan = read_pid(pidfile)
        ns = int(pidfile.read_text().split()[1])
        assert ns != os.stat("/proc/self/ns/pid").st_ino  # sandboxed: a namespace of its own
        assert psutil.Process(orphan).ppid() == host_pid(1, ns) != os.getpid()  # bwrap's init, not us
        (short_tmp / "orphan.pid.go").touch()
        with trio.fail_after(60):
            await sup.wait_idle("c")
        entries = await sup.entries("c", after=accepted.seq)
        assert entries[-1].text == "reaped"  # by the init, before the turn ended
        assert not Path(f"/proc/{orphan}").exists(), "a dead orphan was left as a zombie"


async def test_stderr_goes_to_the_log_with_channel_and_turn(short_tmp: Path, caplog) -> None:
    import logging

    code = "import sys, json; print('warming up', file=sys.stderr, flush=True); print(json.dumps({'type': 'result', 'text': 'ok'}))"
    config = make_config(short_tmp, {"noisy": script_agent(code)})
    caplog.set_level(logging.INFO, logger="corral.turn")
    async with open_supervisor(config) as sup:
        accepted = await sup.send("chan-x", "go")
        with trio.fail_after(60):
            await sup.wait_idle("chan-x")
        turn = (await sup.entries("chan-x", after=accepted.seq))[-1].turn
    lines = [r.getMessage() for r in caplog.records if "stderr" in r.getMessage()]
    assert lines == [f"[chan-x {turn}] stderr: warming up"]


async def test_a_bug_in_one_turn_is_contained_and_the_channel_goes_on(short_tmp: Path, monkeypatch) -> None:
    from supervisor.turns import process as _turn

    config = make_config(short_tmp)
    original = _turn.Turn._request
    calls = []

    def broken_once(self, session_id):  # type: ignore[no-untyped-def]
        calls.append(session_id)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return original(self, session_id)

    monkeypatch.setattr(_turn.Turn, "_request", broken_once)
    async with open_supervisor(config) as sup:
        first = await sup.send("c", "one")
        second = await sup.send("c", "two")
        await sup.send("other", "unaffected")
        with trio.fail_after(60):
            await sup.wait_idle("c")
            await sup.wait_idle("other")
        entries = await sup.entries("c", after=first.seq)
        other = await sup.entries("other")
    assert any(e.kind == "error" and "Internal error" in e.text and "a bug" in e.text for e in entries)
    assert any(e.kind == "message" and "You said: two" in e.text for e in entries if e.seq > second.seq)
    assert any("You said: unaffected" in e.text for e in other)
