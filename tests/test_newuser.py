"""What a new user hit (issue 25), in-process: errors that name their path, starting a
channel over (reset), sending again what a stop dropped (resend)."""

from __future__ import annotations

import os
from pathlib import Path

import trio
from conftest import make_config, script_agent

from supervisor import open_supervisor


async def test_a_program_gone_since_the_check_is_named_with_its_path(short_tmp: Path) -> None:
    program = short_tmp / "bin" / "mybot"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\necho hi\n")
    program.chmod(0o755)
    config = make_config(short_tmp, {"mybot": {"adapter": "generic", "command": [str(program)]}})
    os.unlink(program)  # after the config was checked: the spawn fails
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "hello")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        errors = [e.text for e in await sup.entries("c", after=accepted.seq) if e.kind == "error"]
    assert errors, "the failed start is an error entry"
    assert str(program) in errors[0] and "could not start mybot" in errors[0], errors
    assert "[agents.mybot]" in errors[0], errors


async def test_the_interrupted_turn_entry_says_a_kept_plan_will_be_nudged(tmp_path: Path) -> None:
    """After kill -9 the plan is kept and nudged (a crash is not a stop): the entry says so."""
    from supervisor.core.results import RESTART_NOTICE
    from supervisor.host.recovery import recover
    from supervisor.store.store import open_store

    plan = [{"content": "a", "status": "completed"}, {"content": "b", "status": "in_progress"},
            {"content": "c", "status": "pending"}]
    async with open_store(str(tmp_path / "c.db")) as store:
        first = store.accept_message("c", "bot", "human:u", "go", generation=0, nudge=False)
        quiet = store.accept_message("d", "bot", "human:u", "go", generation=0, nudge=False)
        await first.committed()
        await quiet.committed()
        assert first.entry is not None and quiet.entry is not None
        await store.begin_turn("t1", "c", "bot", 0, first.entry.seq).committed()
        await store.begin_turn("t2", "d", "bot", 0, quiet.entry.seq).committed()
        await store.save_todos("c", "bot", plan).committed()
    async with open_store(str(tmp_path / "c.db")) as store:  # the restart after the crash
        report = await recover(store, 0.1, "Stopped.")
        assert sorted(report.turns) == ["t1", "t2"]
        [with_plan] = [e for e in await store.entries("c") if e.turn == "t1" and e.kind == "notice"]
        [without] = [e for e in await store.entries("d") if e.turn == "t2" and e.kind == "notice"]
    assert with_plan.text.startswith(RESTART_NOTICE)
    assert "2 unfinished task(s) are kept" in with_plan.text and "reminds" in with_plan.text, with_plan.text
    assert without.text == RESTART_NOTICE, "no plan, nothing more to say"


async def _until(sup: object, channel: str, after: int, text: str) -> None:
    """Follow ``channel`` until an entry holds ``text`` (no sleeps: the entries say when)."""
    with trio.fail_after(60):
        async for entry in sup.follow(channel, after=after):  # type: ignore[attr-defined]
            if text in entry.text:
                return


async def test_reset_starts_a_new_conversation_and_clears_the_plan_with_an_entry(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        await sup.send("c", "hello, make a plan")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        before = sup.session("c", "demo")
        assert before is not None and sup.todos("c", "demo"), "the demo agent left a session and a plan"
        entry = await sup.reset("c")
        assert (entry.kind, entry.author, entry.meta) == ("status", "system", {"reset": ["demo"]})
        assert "demo starts a new conversation" in entry.text
        assert sup.session("c", "demo") is None and sup.todos("c", "demo") == []
        accepted = await sup.send("c", "who are you now?")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        replies = [e.text for e in await sup.entries("c", after=accepted.seq) if e.author == "agent:demo"]
        assert any("This is the start of conversation" in r for r in replies), replies
        assert sup.session("c", "demo") not in (None, before)
    async with open_supervisor(make_config(short_tmp)) as sup:  # what a restart finds: still forgotten
        assert sup.session("c", "demo") != before


async def test_reset_refuses_a_running_turn_and_with_stop_stops_it_first(short_tmp: Path) -> None:
    from supervisor.core.restart import ChannelBusy

    async with open_supervisor(make_config(short_tmp)) as sup:
        accepted = await sup.send("c", "please do a long task")
        await _until(sup, "c", accepted.seq, "tool running")
        session = sup.session("c", "demo")
        try:
            await sup.reset("c")
        except ChannelBusy as exc:
            assert "corral stop c" in str(exc) and "--stop" in str(exc) and "demo's turn" in str(exc), exc
        else:
            raise AssertionError("a reset acted on a running turn")
        assert sup.session("c", "demo") == session, "a refused reset changed nothing"
        entry = await sup.reset("c", stop=True)
        assert entry.text.startswith("Stopped, then conversation reset")
        kinds = [(e.kind, e.text) for e in await sup.entries("c", after=accepted.seq)]
        notice = kinds.index(("notice", "Execution stopped by user."))
        assert kinds[-1] == ("status", entry.text) and notice < len(kinds) - 1, kinds
        assert sup.session("c", "demo") is None


async def test_resend_sends_a_dropped_message_again_once(short_tmp: Path) -> None:
    from supervisor import UsageError

    async with open_supervisor(make_config(short_tmp)) as sup:
        first = await sup.send("c", "please do a long task")
        await _until(sup, "c", first.seq, "tool running")
        queued = await sup.send("c", "the message a stop drops")
        await sup.stop("c")
        try:
            await sup.resend("c", first.seq)
        except UsageError as exc:
            assert "not dropped by a stop" in str(exc), exc
        else:
            raise AssertionError("a message that ran was sent again")
        again = await sup.resend("c", queued.seq)
        assert again.seq > queued.seq and again.to == ("demo",)
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        entries = await sup.entries("c", after=queued.seq - 1)
        [original] = [e for e in entries if e.seq == queued.seq]
        assert original.meta.get("resent_as") == again.seq and original.meta.get("dropped_by_stop")
        assert any(e.author == "agent:demo" and "the message a stop drops" in e.text for e in entries), entries
        try:
            await sup.resend("c", queued.seq)
        except UsageError as exc:
            assert f"sent again already, as entry {again.seq}" in str(exc), exc
        else:
            raise AssertionError("a dropped message was sent twice")
    async with open_supervisor(make_config(short_tmp)) as sup:  # once, across a restart too
        try:
            await sup.resend("c", queued.seq)
        except UsageError as exc:
            assert "sent again already" in str(exc)
        else:
            raise AssertionError("a restart forgot the message was sent again")


async def test_two_resends_at_once_send_it_once(short_tmp: Path) -> None:
    from supervisor import UsageError

    async with open_supervisor(make_config(short_tmp)) as sup:
        first = await sup.send("c", "please do a long task")
        await _until(sup, "c", first.seq, "tool running")
        queued = await sup.send("c", "dropped")
        await sup.stop("c")
        outcomes: list[object] = []

        async def one() -> None:
            try:
                outcomes.append(await sup.resend("c", queued.seq))
            except UsageError as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
        assert sum(not isinstance(o, UsageError) for o in outcomes) == 1, outcomes
        with trio.fail_after(60):
            assert await sup.wait_idle("c")


# ---------------------------------------------------------------- credentials

READ_LOGIN = r"""
import os, sys
path = os.path.join(os.environ["HOME"], ".fake", "login.json")
print("read:", open(path).read().strip())
try:
    with open(path, "w") as out:
        out.write("overwritten")
    print("write: allowed")
except OSError as exc:
    print("write: refused", exc.errno)
print("home is private:", os.environ["HOME"] != os.environ["CORRAL_TEST_REAL_HOME"])
"""


def _login_home(short_tmp: Path, monkeypatch: object) -> Path:
    """A user's HOME with a login file (and something else that must stay out of reach)."""
    home = short_tmp / "user-home"
    (home / ".fake").mkdir(parents=True)
    (home / ".fake" / "login.json").write_text('{"token": "t-1"}\n')
    (home / "secret-notes.txt").write_text("not for agents\n")
    monkeypatch.setenv("HOME", str(home))  # type: ignore[attr-defined]
    return home


def test_credentials_must_be_files_of_the_users_home(short_tmp: Path, monkeypatch) -> None:
    from supervisor import ConfigError, parse_config

    home = _login_home(short_tmp, monkeypatch)

    def problems(value: list[str]) -> list[str]:
        data = {"agents": {"a": {"adapter": "demo", "credentials": value}}}
        try:
            config = parse_config(data, file="c.toml", base=short_tmp)
        except ConfigError as exc:
            return [str(p) for p in exc.problems]
        assert config.agents["a"].credentials == ((home / ".fake" / "login.json", ".fake/login.json"),)
        return []

    assert problems(["~/.fake/login.json"]) == []
    [folder] = problems(["~/.fake"])
    assert "agents.a.credentials" in folder and "is a folder" in folder and "only the files named" in folder
    [missing] = problems(["~/.fake/gone.json"])
    assert "does not exist" in missing and "log in with the CLI once" in missing
    [absolute] = problems(["/etc/hostname"])
    assert "~/PATH" in absolute
    [outside] = problems(["~/../etc/hostname"])
    assert "leaves your HOME" in outside
    [whole] = problems(["~/"])
    assert "leaves your HOME" in whole or "is a folder" in whole


async def test_an_agent_reads_its_credentials_and_cannot_change_them(
    short_tmp: Path, monkeypatch
) -> None:
    from supervisor.procs.sandbox import probe

    home = _login_home(short_tmp, monkeypatch)
    agent = script_agent(READ_LOGIN, credentials=["~/.fake/login.json"], env={"CORRAL_TEST_REAL_HOME": str(home)})
    agent["sandbox_write"] = []  # (make_config grants the test folder, which holds this HOME)
    config = make_config(short_tmp, {"reader": agent})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "go")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        said = "\n".join(e.text for e in await sup.entries("c", after=accepted.seq) if e.author == "agent:reader")
        placed = sup.agent_home("reader", "c") / ".fake" / "login.json"
    assert 'read: {"token": "t-1"}' in said and "home is private: True" in said, said
    assert (home / ".fake" / "login.json").read_text() == '{"token": "t-1"}\n', "the user's file is never changed"
    assert oct(placed.stat().st_mode & 0o777) == "0o400"
    if probe().available:
        assert "write: refused 30" in said, said  # EROFS: bound read-only over itself
    else:
        assert "write: refused" in said or os.geteuid() == 0, said


STALLS = r"""
import signal, sys, time
def interrupted(*_):
    print("Request interrupted by user", flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, interrupted)
signal.signal(signal.SIGTERM, interrupted)
print("working on it", flush=True)
time.sleep(120)
"""


async def test_a_stalled_turn_says_once_as_corral_what_ended_it(short_tmp: Path) -> None:
    config = make_config(short_tmp, {"slow": {**script_agent(STALLS), "stall_timeout": 0.5}})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "go")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        entries = [(e.kind, e.text) for e in await sup.entries("c", after=accepted.seq)]
    texts = " | ".join(t for _, t in entries)
    assert "working on it" in texts, entries
    assert "Request interrupted by user" not in texts, entries
    assert [k for k, t in entries if "stall_timeout" in t] == ["error"], entries


# ---------------------------------------------------------------- not logged in

NOT_LOGGED_IN = r"""
import json, sys
sid = "84bc2d3b-bd03-401d-b604-1e791aec90c1"
for obj in (
    {"type": "system", "subtype": "init", "cwd": ".", "session_id": sid, "tools": []},
    {"type": "assistant", "message": {"id": "m", "model": "<synthetic>", "role": "assistant", "type": "message",
     "content": [{"type": "text", "text": "Not logged in · Please run /login"}]},
     "parent_tool_use_id": None, "session_id": sid, "uuid": "u", "error": "authentication_failed"},
    {"type": "result", "subtype": "success", "is_error": True, "num_turns": 1,
     "result": "Not logged in · Please run /login", "session_id": sid},
):
    print(json.dumps(obj), flush=True)
"""


async def test_a_cli_that_is_not_logged_in_is_said_once_as_corrals_error_with_the_fix(short_tmp: Path) -> None:
    """What Claude Code 2.1 prints in an empty HOME (captured), through the claude adapter."""
    import sys

    fake = short_tmp / "claude"
    fake.write_text(NOT_LOGGED_IN)
    config = make_config(short_tmp, {"claude": {"adapter": "claude", "command": [sys.executable, str(fake)]}})
    async with open_supervisor(config) as sup:
        accepted = await sup.send("c", "hello")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        entries = [e for e in await sup.entries("c", after=accepted.seq) if e.author == "agent:claude"]
    assert [e.kind for e in entries] == ["error"], [(e.kind, e.text) for e in entries]
    [error] = entries
    assert error.text.startswith("claude is not logged in: corral runs it with a private HOME"), error.text
    assert 'credentials = ["~/.claude/.credentials.json"] in [agents.claude]' in error.text
    assert "ANTHROPIC_API_KEY" in error.text and "Not logged in" not in error.text
    assert error.meta["not_logged_in"] == "Not logged in · Please run /login", "the CLI's words are kept in meta"


def test_only_a_short_message_that_is_a_login_refusal_is_replaced() -> None:
    from adapters._base import Text

    from supervisor.core.account import TurnAccount
    from supervisor.core.login import login_help

    account = TurnAccount("agent:claude", "t", login_help=login_help("claude", "claude"))
    talk = "Here is how 401 Unauthorized works: " + "the server refuses a request without valid credentials. " * 5
    [post] = account.on_event(Text(talk), silenced=False)
    assert post.text == talk, "an agent talking about logins is not a login failure"  # type: ignore[union-attr]
    assert login_help("demo", "demo") is None and login_help("bot", "generic") is None


async def test_reset_ends_a_live_acp_agent_so_its_next_prompt_starts_a_new_session(short_tmp: Path) -> None:
    """An ACP agent keeps its process (and the session it loaded) between turns: a reset that
    only forgot the stored id would change nothing there, so it ends that process too."""
    import sys

    fake = str(Path(__file__).parent / "fakes" / "fake_acp.py")
    state = short_tmp / "fake-state"
    state.mkdir()
    table = {"adapter": "acp", "command": [sys.executable, fake], "env": {"FAKE_ACP_STATE": str(state)},
             "sandbox_write": [str(short_tmp)]}
    async with open_supervisor(make_config(short_tmp, {"acp": table})) as sup:
        await sup.send("c", "hello")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        first = sup.session("c", "acp")
        assert first is not None and sup._lanes.acp._agents.get(("c", "acp")) is not None
        await sup.reset("c")
        assert sup._lanes.acp._agents.get(("c", "acp")) is None, "the live agent (and its session) is gone"
        await sup.send("c", "who are you now?")
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        assert sup.session("c", "acp") not in (None, first)
