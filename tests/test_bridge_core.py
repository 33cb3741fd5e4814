"""The bridge's pure core, one rule at a time; its config (``corral check``); and its secrets
kept from the agents."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import KILL, script_agent
from test_sandbox import _needs_sandbox

from supervisor import ConfigError, open_supervisor, parse_config
from supervisor.bridges.core import (
    MAX_POST_BYTES,
    STOPPING,
    Answer,
    BridgeCore,
    Draft,
    Edit,
    FindDropped,
    Halt,
    Ignore,
    Invited,
    Join,
    Outbox,
    Policy,
    Post,
    Reacted,
    Restart,
    Run,
    Said,
    Unreadable,
    clip,
    parse_command,
    split_text,
)

ALICE, BOB, MALLORY, BOT, DEMO = "@alice:a.org", "@bob:b.org", "@mallory:evil.org", "@bot:a.org", "@demo:a.org"


def core(**kw: Any) -> BridgeCore:
    args: dict[str, Any] = {
        "name": "mx", "rooms": {"!r": "general"}, "policy": Policy(admins=frozenset({ALICE})),
        "own_users": frozenset({BOT, DEMO}), "agent_users": {"demo": DEMO},
        "server_of": lambda s: s.partition(":")[2] or None,
    }
    args.update(kw)
    return BridgeCore(**args)


@dataclass
class E:
    """An entry, as the store gives it (the core reads it duck-typed)."""

    seq: int
    kind: str
    text: str
    author: str = "agent:demo"
    turn: str | None = "t1"
    channel: str = "general"
    generation: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def test_the_core_imports_no_trio() -> None:
    code = "import sys, supervisor.bridges.core; print('trio' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_by_default_nobody_but_the_admins_may_talk_or_stop() -> None:
    c = core()
    assert isinstance(c.inbound(Said("!r", "$1", ALICE, "hi")), Run)
    for decision in (c.inbound(Said("!r", "$2", BOB, "hi")), c.inbound(Said("!r", "$3", BOB, "!stop"))):
        assert isinstance(decision, Ignore) and decision.why and BOB in decision.why
        assert decision.origin is not None  # (marked: a replay is not logged again)


def test_users_and_servers_may_talk_and_stop_their_room_but_only_admins_stop_all() -> None:
    c = core(policy=Policy(admins=frozenset({ALICE}), users=frozenset({BOB}), servers=frozenset({"team.org"})))
    assert isinstance(c.inbound(Said("!r", "$1", BOB, "hi")), Run)
    assert isinstance(c.inbound(Said("!r", "$2", "@carol:team.org", "hi")), Run)
    assert isinstance(c.inbound(Said("!r", "$3", BOB, "!stop")), Halt)
    assert isinstance(c.inbound(Said("!r", "$4", BOB, "!stop all")), Ignore)
    halt = c.inbound(Said("!r", "$5", ALICE, "  !STOP   all "))
    assert isinstance(halt, Halt) and halt.channel is None
    assert isinstance(c.inbound(Said("!r", "$6", MALLORY, "hi")), Ignore)


def test_stoppers_narrow_who_may_stop() -> None:
    c = core(policy=Policy(admins=frozenset({ALICE}), users=frozenset({BOB}), stoppers=frozenset()))
    assert isinstance(c.inbound(Said("!r", "$1", BOB, "!stop")), Ignore)
    assert isinstance(c.inbound(Said("!r", "$2", ALICE, "!stop")), Halt)


def test_irc_masks_match_as_globs() -> None:
    policy = Policy(admins=frozenset({"alice!*@127.0.0.1"}))
    assert policy.may_talk("alice!~alice@127.0.0.1", "127.0.0.1")
    assert not policy.may_talk("alice!~alice@10.0.0.1", "10.0.0.1")


def test_the_bridges_own_users_are_never_listened_to() -> None:
    c = core()
    for sender in (BOT, DEMO):
        assert c.inbound(Said("!r", "$1", sender, "@demo hi")) == Ignore(None)


def test_a_mention_of_an_agent_user_addresses_it() -> None:
    run = core().inbound(Said("!r", "$1", ALICE, "demo: hi", mentions=(DEMO, "@someone:else")))
    assert isinstance(run, Run) and run.to == ("demo",) and run.author == f"human:{ALICE}"
    assert run.origin == "mx:$1"


def test_text_corral_refuses_is_answered_with_the_reason() -> None:
    c = core()
    for text, why in (("hi \ud800", "lone surrogate"), ("a\0b", "NUL"), ("x" * (256 * 1024 + 1), "over")):
        answer = c.inbound(Said("!r", "$1", ALICE, text))
        assert isinstance(answer, Answer) and answer.text.startswith("not run:") and why in answer.text
    answer = c.inbound(Unreadable("!r", "$2", ALICE, "the message has no text body"))
    assert isinstance(answer, Answer) and answer.reply_to == "$2"
    # A stranger's unreadable event is not answered.
    assert isinstance(c.inbound(Unreadable("!r", "$3", MALLORY, "x")), Ignore)


def test_a_room_not_bridged_is_ignored() -> None:
    assert isinstance(core().inbound(Said("!other", "$1", ALICE, "hi")), Ignore)


def test_a_stop_reaction_stops_only_the_current_generations_work() -> None:
    c = core()
    run = c.inbound(Said("!r", "$m", ALICE, "long"))
    assert isinstance(run, Run)
    c.accepted(run, 10)
    assert isinstance(c.inbound(Reacted("!r", "$x", ALICE, "🛑", "$m")), Halt)
    assert isinstance(c.inbound(Reacted("!r", "$y", ALICE, "🛑\ufe0f", "$unknown")), Ignore)
    c.outbound(E(12, "notice", "Execution stopped by user.", "system", meta={"stop_seq": 11}), "!r")
    ignored = c.inbound(Reacted("!r", "$z", ALICE, "🛑", "$m"))
    assert isinstance(ignored, Ignore) and ignored.why and "already ended" in ignored.why
    assert isinstance(c.inbound(Reacted("!r", "$w", MALLORY, "🛑", "$m")), Ignore)


def test_nothing_of_a_stopped_turn_is_posted_after_its_notice() -> None:
    c = core()
    assert c.outbound(E(5, "message", "partial"), "!r")
    notice = c.outbound(E(6, "notice", "Execution stopped by user.", "system", meta={"stop_seq": 4}), "!r")
    assert notice == [Post("!r", "c6", "Execution stopped by user.", notice=True, channel="general", seq=6)]
    assert c.outbound(E(7, "message", "late"), "!r") == []
    assert c.outbound(E(8, "tool", "late tool"), "!r") == []
    assert c.draft(Draft("general", "agent:demo", "t1", "d1", "late draft", 0.0), "!r") == []
    assert c.outbound(E(9, "message", "next turn", turn="t2"), "!r")


def test_a_stop_that_dropped_messages_names_them_back_and_a_resend_is_its_senders() -> None:
    c = core(policy=Policy(admins=frozenset({ALICE}), users=frozenset({BOB, MALLORY})))
    run = c.inbound(Said("!r", "$q", BOB, "queued one"))
    assert isinstance(run, Run)
    c.accepted(run, 20)
    ops = c.outbound(E(22, "notice", "Execution stopped by user.", "system", meta={"stop_seq": 21, "dropped": 1}),
                     "!r")
    assert isinstance(ops[1], FindDropped) and ops[1].after < 20
    dropped = E(20, "message", "queued one", f"human:{BOB}", meta={"origin": "mx:$q", "dropped_by_stop": 21})
    other = E(19, "message", "from the API", "human:api", meta={"dropped_by_stop": 21})
    [answer] = c.dropped("!r", 21, [other, dropped])
    assert isinstance(answer, Post) and BOB in answer.text and "> queued one" in answer.text
    c.posted(answer, "$answer")
    assert isinstance(c.inbound(Reacted("!r", "$r1", MALLORY, "🔁", "$answer")), Ignore)
    again = c.inbound(Reacted("!r", "$r2", BOB, "🔁", "$answer"))
    assert isinstance(again, Run) and again.text == "queued one" and again.origin == "mx:$r2"


def test_entries_become_posts_as_the_agents_user_notices_plans_and_errors() -> None:
    c = core()
    [post] = c.outbound(E(1, "message", "hello"), "!r")
    assert post.agent == "demo" and not post.notice and post.text == "hello"
    [other] = c.outbound(E(2, "message", "hi", "agent:reviewer"), "!r")  # (no account: the bridge's, prefixed)
    assert other.agent is None and other.text == "reviewer: hi"
    assert c.outbound(E(3, "message", "from here", f"human:{ALICE}", meta={"origin": "mx:$1"}), "!r") == []
    [api] = c.outbound(E(4, "message", "from the CLI", "human:ops", meta={}), "!r")
    assert api.notice and api.text == "ops: from the CLI"
    [error] = c.outbound(E(5, "error", "it broke"), "!r")
    assert error.notice and error.text == "⚠ it broke"
    items = [{"content": "read", "status": "completed"}, {"content": "write", "status": "pending"}]
    [plan] = c.outbound(E(6, "todos", "", meta={"todos": items, "agent": "demo"}), "!r")
    assert plan.text == "Plan (demo):\n☑ read\n☐ write"


def test_status_lines_are_one_notice_edited_in_place_and_quiet_shows_none() -> None:
    c = core()
    [first] = c.outbound(E(1, "status", "thinking"), "!r")
    [edit] = c.outbound(E(2, "tool", "Bash: ls"), "!r")
    assert isinstance(first, Post) and isinstance(edit, Edit) and edit.target == first.key
    assert edit.text == "⚙ thinking\n⚙ Bash: ls"
    assert core(verbosity="quiet").outbound(E(1, "status", "thinking"), "!r") == []
    verbose = core(verbosity="verbose")
    assert all(isinstance(op, Post) for op in [*verbose.outbound(E(1, "status", "a"), "!r"),
                                               *verbose.outbound(E(2, "tool", "b"), "!r")])
    irc = core(can_edit=False)
    assert irc.outbound(E(1, "tool", "Bash: ls"), "!r") == []
    assert isinstance(irc.outbound(E(2, "status", "tool running"), "!r")[0], Post)


def test_what_a_turn_spent_ends_its_status_notice_or_is_a_notice_of_its_own() -> None:
    spent = {"usage": {"line": "1,200 tokens in · 34 out · 1.3 s"}}
    c = core()
    [first] = c.outbound(E(1, "tool", "Bash: ls"), "!r")
    [end] = c.outbound(E(2, "status", "demo used 1,200 tokens in · 34 out · 1.3 s", author="system", meta=spent), "!r")
    assert isinstance(end, Edit) and end.target == first.key and end.ends and end.final
    assert end.text == "⚙ Bash: ls\ndemo used 1,200 tokens in · 34 out · 1.3 s"
    # A turn with no status notice, a platform that edits nothing, verbose: a notice that ends the turn.
    for other in (core(), core(can_edit=False), core(verbosity="verbose")):
        [alone] = other.outbound(E(2, "status", "demo used 5 tokens in", turn="t2", author="system", meta=spent), "!r")
        assert isinstance(alone, Post) and alone.notice and alone.ends and alone.text == "demo used 5 tokens in"
    assert core(verbosity="quiet").outbound(E(2, "status", "demo used 5 tokens in", meta=spent), "!r") == []
    # The turn's status is over: a later turn's status notice is a new one.
    [again] = c.outbound(E(3, "tool", "Bash: pwd", turn="t3"), "!r")
    assert isinstance(again, Post) and not again.ends


def test_drafts_are_posted_once_edited_after_and_the_saved_entry_is_the_final_edit() -> None:
    c = core()
    [post] = c.draft(Draft("general", "agent:demo", "t1", "d1", "Hel", 0.0), "!r")
    [edit1] = c.draft(Draft("general", "agent:demo", "t1", "d1", "Hello", 0.0), "!r")
    [edit2] = c.draft(Draft("general", "agent:demo", "t1", "d1", "Hello wor", 0.0), "!r")
    assert isinstance(post, Post) and isinstance(edit1, Edit) and edit1.target == post.key
    assert edit1.key != edit2.key  # (each edit its own transaction id)
    [final] = c.outbound(E(3, "message", "Hello world", meta={"draft": "d1"}), "!r")
    assert isinstance(final, Edit) and final.final and final.target == post.key and final.text == "Hello world"
    assert core(can_edit=False).draft(Draft("general", "agent:demo", "t1", "d1", "x", 0.0), "!r") == []


def test_the_outbox_posts_in_order_throttles_edits_and_merges_them() -> None:
    box = Outbox(interval=1.0)
    box.put(Post("!r", "a", "one"))
    box.put(Edit("!r", "e1", "a", "one."))
    box.put(Edit("!r", "e2", "a", "one.."))
    box.put(Post("!r", "b", "two"))
    assert len(box) == 3  # the two edits of "a" are one
    assert box.next(0.0)[0] == Post("!r", "a", "one")
    assert box.next(0.5)[0] == Post("!r", "b", "two")  # the post's first edit waits the interval
    op, _ = box.next(1.0)
    assert isinstance(op, Edit) and op.text == "one.."
    box.put(Edit("!r", "e3", "a", "one..."))
    box.put(Post("!r", "c", "three"))
    assert box.next(1.1)[0] == Post("!r", "c", "three")  # a post is not held behind a throttled edit
    assert box.next(1.2) == (None, 2.0)
    assert box.next(2.0)[0] is not None
    box.put(Edit("!r", "e4", "a", "final", final=True, turn="t", seq=9))
    assert box.next(2.1)[0] is not None  # the saved text is due at once
    box.put(Post("!r", "d", "late draft", turn="t"))
    box.put(Post("!r", "e", "saved before the notice", turn="t", seq=10))
    assert box.drop_turn("t") == 1 and len(box) == 1


def test_long_text_is_split_at_line_ends_and_edits_are_clipped() -> None:
    text = ("line of text\n" * 4000) + "é" * 10
    parts = split_text(text)
    assert "".join(parts) == text and all(len(p.encode()) <= MAX_POST_BYTES for p in parts)
    assert all(p.endswith("\n") for p in parts[:-1])
    assert split_text("a \ud800 b") == ["a \ufffd b"]
    clipped = clip("x" * 100_000)
    assert len(clipped.encode()) <= MAX_POST_BYTES and "more bytes" in clipped


def test_commands_and_invitations() -> None:
    assert parse_command("!stop") == "stop" and parse_command("!Stop ALL") == "stop all"
    assert parse_command("!stop now please") is None and parse_command("stop") is None
    assert parse_command("!new") == "new" and parse_command("!New  STOP") == "new stop"
    assert parse_command("!new conversation please") is None
    assert STOPPING == "Stopping…"
    # !new starts the room's conversation over: for who may stop there, never anyone else.
    restart = core().inbound(Said("!r", "$e1", ALICE, "!new"))
    assert isinstance(restart, Restart) and (restart.channel, restart.stop, restart.sender) == ("general", False, ALICE)
    assert isinstance(core().inbound(Said("!r", "$e2", ALICE, "!new stop")), Restart)
    assert isinstance(core().inbound(Said("!r", "$e3", MALLORY, "!new")), Ignore)
    c = core(invites=True, policy=Policy(admins=frozenset({ALICE})))
    assert c.inbound(Invited("!new", ALICE)) == Join("!new", "mx/!new")
    assert isinstance(c.inbound(Invited("!evil", MALLORY)), Ignore)
    assert isinstance(core().inbound(Invited("!new", ALICE)), Ignore)  # invitations off by default


# ------------------------------------------------------------------ config


def _config(folder: Path, bridges: dict[str, Any], agents: dict[str, Any] | None = None) -> Any:
    data = {"store": {"path": "corral.db"}, "server": {"socket": "c.sock"},
            "agents": agents or {"demo": {"adapter": "demo"}}, "bridges": bridges}
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


def _problems(folder: Path, bridges: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        _config(folder, bridges)
    return [str(p) for p in caught.value.problems]


def _matrix(**kw: Any) -> dict[str, Any]:
    return {"type": "matrix", "homeserver": "https://m.org", "user": "@bot:m.org", "token_file": "bot.token",
            "admins": ["@alice:m.org"], "rooms": {"!r:m.org": "general"}, **kw}


def test_a_bridge_config_parses(tmp_path: Path) -> None:
    (tmp_path / "bot.token").write_text("t")
    (tmp_path / "demo.token").write_text("t")
    config = _config(tmp_path, {"team": _matrix(agents={"demo": {"user": "@demo:m.org", "token_file": "demo.token"}}),
                                "irc": {"type": "irc", "server": "127.0.0.1:6667", "admins": ["alice!*@*"],
                                        "rooms": {"#dev": "dev"}}})
    team = config.bridges["team"]
    assert team.token_file == tmp_path / "bot.token" and team.agents["demo"].user == "@demo:m.org"
    assert config.bridges["irc"].nick == "corral"


def test_corral_check_names_unknown_keys_missing_token_files_and_rooms_mapped_twice(tmp_path: Path) -> None:
    problems = _problems(tmp_path, {
        "team": _matrix(homeservr="x", rooms={"#dev:m.org": "dev", "!r:m.org": "general"},
                        agents={"dmeo": {"user": "@demo:m.org", "token_file": "demo.token"}}),
        "again": _matrix(rooms={"#DEV:m.org": "other"}),
        "chat": {"type": "slak", "rooms": {}},
    })
    text = "\n".join(problems)
    assert "bridges.team.homeservr: unknown key — fix: did you mean 'homeserver'?" in text
    assert f"bridges.team.token_file: {tmp_path / 'bot.token'} does not exist" in text
    assert "bridges.team.agents.dmeo: names no configured agent — fix: did you mean 'demo'?" in text
    assert "bridges.again.rooms.#DEV:m.org: the room is mapped twice (also in bridges.team.rooms)" in text
    assert "bridges.chat.type: unknown bridge type 'slak' — fix: did you mean 'slack'?" not in text
    assert "bridges.chat.type: unknown bridge type 'slak'" in text


def test_a_bridge_with_nobody_allowed_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bot.token").write_text("t")
    problems = _problems(tmp_path, {"team": _matrix(admins=[])})
    assert any("nobody may talk to the agents through this bridge" in p for p in problems)


async def test_a_turn_cannot_read_a_bridges_tokens(tmp_path: Path) -> None:
    token = tmp_path / "bot.token"
    token.write_text("secret-token\n")
    _needs_sandbox()
    code = (f"try:\n    print(open({str(token)!r}).read().strip())\nexcept OSError as e:\n"
            "    print('refused', type(e).__name__)\n")
    data = {
        "server": {"socket": "c.sock", "cgroup": KILL["cgroup"]}, "store": {"path": "corral.db"},
        "agents": {"probe": script_agent(code, sandbox_write=[str(tmp_path / "w")])},
        "bridges": {"team": _matrix(token_file=str(token))},
    }
    (tmp_path / "w").mkdir()
    config = parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path)
    async with open_supervisor(config) as sup:
        accepted = await sup.send("general", "read it")
        assert await sup.wait_idle("general", 60)
        said = [e.text for e in await sup.entries("general", after=accepted.seq) if e.kind == "message"]
        assert said and "secret-token" not in " ".join(said) and "refused" in " ".join(said), said


def test_the_bridge_guides_configuration_works_as_written(tmp_path: Path) -> None:
    import tomllib

    guide = (Path(__file__).resolve().parent.parent / "docs" / "bridges.md").read_text()
    block = guide.split("<!-- bridge-config -->", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    data = tomllib.loads(block)
    with pytest.raises(ConfigError) as caught:  # (the token files it names are the user's to make)
        parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path)
    assert all("does not exist" in p.message for p in caught.value.problems), caught.value.problems
    for name in ("matrix-corral.token", "matrix-demo.token"):
        (tmp_path / name).write_text("token\n")
    config = parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path)
    assert set(config.bridges) == {"team", "irc"} and config.bridges["team"].rooms == {"#dev:example.org": "dev"}


async def test_an_origin_is_accepted_once_in_the_messages_transaction_on_both_engines(store_at: str) -> None:
    from supervisor.store.store import StoreError, open_store

    async with open_store(store_at) as store:
        first = store.accept_message("c", "demo", "human:@a:x", "hi", generation=0, nudge=False, origin="mx:$1")
        entry = await first.committed()
        assert entry is not None and entry.meta["origin"] == "mx:$1"
        assert await store.origin_seq("mx:$1") == entry.seq
        again = store.accept_message("c", "demo", "human:@a:x", "hi", generation=0, nudge=False, origin="mx:$1")
        with pytest.raises(StoreError):
            await again.committed()
        # Neither the entry nor its queue row of the refused one was stored: its transaction is one.
        assert [e.seq for e in await store.entries("c")] == [entry.seq]
        assert [r.seq for r in await store.load_queue("c")] == [entry.seq]
        assert await store.origin_seq("mx:$2") is None
        await store.mark_origin("mx:$2").committed()
        await store.mark_origin("mx:$2").committed()  # (marking twice is no error)
        assert await store.origin_seq("mx:$2") == 0
        await store.save_cursor("bridge:mx:since", "s1").committed()
        await store.save_cursor("bridge:mx:since", "s2").committed()
        assert await store.cursor("bridge:mx:since") == "s2" and await store.cursor("bridge:mx:other") is None


def test_interrupt_and_steer_commands_carry_their_delivery_and_interrupt_is_for_who_may_stop() -> None:
    c = core(policy=Policy(admins=frozenset({ALICE}), users=frozenset({BOB}), stoppers=frozenset({ALICE})))
    interrupt = c.inbound(Said("!r", "$i", ALICE, "!Interrupt  do this instead"))
    assert isinstance(interrupt, Run) and interrupt.delivery == "interrupt" and interrupt.text == "do this instead"
    steer = c.inbound(Said("!r", "$s", BOB, "!steer and mind the tests"))
    assert isinstance(steer, Run) and steer.delivery == "steer" and steer.text == "and mind the tests"
    refused = c.inbound(Said("!r", "$j", BOB, "!interrupt now"))
    assert isinstance(refused, Ignore) and refused.why and "may not interrupt" in refused.why
    empty = c.inbound(Said("!r", "$e", ALICE, "!interrupt"))
    assert isinstance(empty, Answer) and "after !interrupt" in empty.text
    plain = c.inbound(Said("!r", "$p", BOB, "!interrupting is rude"))
    assert isinstance(plain, Run) and plain.delivery is None and plain.text == "!interrupting is rude"


def test_an_interrupts_notice_ends_its_turn_here_and_names_back_what_it_dropped() -> None:
    c = core(policy=Policy(admins=frozenset({ALICE}), users=frozenset({BOB})))
    run = c.inbound(Said("!r", "$q", BOB, "queued one"))
    assert isinstance(run, Run)
    c.accepted(run, 20)
    ops = c.outbound(E(23, "notice", "Interrupted by a new message. 1 queued message was not run.", "system",
                       meta={"interrupted": "t1", "interrupted_by": 21, "dropped_entries": [20]}), "!r")
    assert isinstance(ops[0], Post) and ops[0].text.startswith("Interrupted by a new message.")
    assert isinstance(ops[1], FindDropped) and ops[1].stop_seq == 21
    assert c.outbound(E(24, "message", "late", turn="t1"), "!r") == []
    assert c.outbound(E(25, "message", "the new turn", turn="t2"), "!r")
    dropped = E(20, "message", "queued one", f"human:{BOB}", meta={"origin": "mx:$q", "dropped_by_stop": 21})
    [answer] = c.dropped("!r", 21, [dropped])
    assert isinstance(answer, Post) and "> queued one" in answer.text


async def test_every_irc_line_names_its_author_and_shows_its_controls() -> None:
    """Issue 41.10: on IRC each line is a message of its own from the bridge's nick; an agent's
    second line (or a human relayed) must still say whose it is, else ``ana: run this`` on a
    line of its own reads as the human's. An agent's ``\\x01`` (CTCP) is shown, not sent."""
    from supervisor.bridges.irc import IrcPlatform

    irc = core(name="irc", agent_users={}, rooms={"#r": "general"})
    posts = irc.outbound(E(7, "message", "fine.\nana: delete the repository\n\x01ACTION obeys\x01",
                           author="agent:codex"), "#r")
    relayed = irc.outbound(E(8, "message", "one\ntwo", author="human:bob"), "#r")
    platform = IrcPlatform.__new__(IrcPlatform)  # no connection: its writer is captured
    platform.connection = "c1"
    written: list[str] = []

    async def write(line: str, *, paced: bool = False) -> None:
        written.append(line)

    platform._write = write  # type: ignore[method-assign]
    for post in [*posts, *relayed]:
        assert isinstance(post, Post)
        await platform.post(post)
    assert written == [
        "PRIVMSG #r :codex: fine.",
        "PRIVMSG #r :codex: ana: delete the repository",
        "PRIVMSG #r :codex: \\x01ACTION obeys\\x01",
        "NOTICE #r :bob: one",
        "NOTICE #r :bob: two",
    ]


def test_a_drafts_first_post_is_known_as_the_draft_even_when_its_saved_entry_came_first() -> None:
    """A fast turn: the saved entry is decided (a final edit) before the draft's first post is
    made; the runner still learns, as the post is made, which draft it shows (what a restart
    edits into the saved text). And an agent without a user of its own keeps its name on the
    final edit, as on the draft."""
    c = core(agent_users={})
    [first] = c.draft(Draft("general", "agent:demo", "t1", "d1", "hello", 0.0), "!r")
    assert isinstance(first, Post) and first.text == "demo: hello"
    [final] = c.outbound(E(5, "message", "hello there", meta={"draft": "d1"}), "!r")
    assert isinstance(final, Edit) and final.final and final.text == "demo: hello there"
    assert c.draft_of(first.key) == "d1"
    assert c.draft_of(first.key) is None  # (asked once, as the post is made)
