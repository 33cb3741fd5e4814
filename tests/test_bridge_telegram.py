"""The Telegram bridge against the fake Bot API server (``scripts/_telegram.py``, checked against
python-telegram-bot), through an embedded supervisor with the demo agent: real HTTP on
127.0.0.1, real turns. Every wait is for something the chat shows, bounded by ``trio.fail_after``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from scripts._telegram import FakeBot, FakeBotApi
from conftest import KILL, METERED_LINE, METERED_MODEL, DaemonProcess, metered_agent, script_agent, turn_processes
from test_sandbox import _needs_sandbox

from supervisor import Config, Supervisor, open_supervisor, parse_config
from supervisor.bridges.core import STOPPING
from supervisor.bridges.runner import Bridge, run_bridge
from supervisor.bridges.telegram import STOP_DATA, neutral, slash_command, split_message
from supervisor.host.supervisor import STOP_NOTICE

ALICE = {"id": 101, "is_bot": False, "first_name": "Alice"}
BOB = {"id": 202, "is_bot": False, "first_name": "Bob"}
MALLORY = {"id": 666, "is_bot": False, "first_name": "Mallory"}
CHAT = 101  # (a private chat's id is its user's)
GROUP = -100500


def telegram_config(folder: Path, api: FakeBotApi, bot: FakeBot, **extra: Any) -> Config:
    (folder / "telegram.token").write_text(bot.token + "\n")
    table = {"type": "telegram", "api_url": api.url, "token_file": "telegram.token", "poll_timeout": 5,
             "admins": [str(ALICE["id"])], "users": [str(BOB["id"])],
             "rooms": {str(CHAT): "general", str(GROUP): "team"}, **extra}
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]},
        "store": {"path": "corral.db"},
        "agents": {"demo": {"adapter": "demo", "delay": 0.01, "sandbox_write": [str(folder)]},
                   "meter": metered_agent(folder)},
        "bridges": {"tg": table},
        "defaults": {"agent": "demo"},
    }
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


@dataclass
class World:
    api: FakeBotApi
    bot: FakeBot
    folder: Path

    @asynccontextmanager
    async def supervisor(self, **extra: Any) -> AsyncIterator[tuple[Supervisor, Config]]:
        config = telegram_config(self.folder, self.api, self.bot, **extra)
        async with open_supervisor(config) as sup:
            yield sup, config

    @asynccontextmanager
    async def bridge(self, sup: Supervisor, config: Config) -> AsyncIterator[Bridge]:
        async with trio.open_nursery() as nursery:
            bridge = await nursery.start(run_bridge, sup, config.bridges["tg"])
            try:
                yield bridge
            finally:
                nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def running(self, **extra: Any) -> AsyncIterator[tuple[Supervisor, Bridge]]:
        async with self.supervisor(**extra) as (sup, config), self.bridge(sup, config) as bridge:
            yield sup, bridge

    async def wait_for(self, chat: int, found: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        """The first of the bot's messages in ``chat`` (as it stands now) that ``found`` accepts."""
        with trio.move_on_after(timeout):
            while True:
                for message in self.bot.sent(chat):
                    if found(message):
                        return message
                await trio.sleep(0.02)
        raise AssertionError(f"not shown in {timeout} s; the chat shows: {[text(m) for m in self.bot.sent(chat)]}")


@pytest.fixture
def world(telegram_api: FakeBotApi, short_tmp: Path) -> World:
    bot = telegram_api.bot()
    for chat in (CHAT, GROUP):
        bot.chat(chat)
    return World(telegram_api, bot, short_tmp)


def text(message: dict[str, Any]) -> str:
    return str(message.get("text", ""))


def has_button(message: dict[str, Any]) -> bool:
    rows = (message.get("reply_markup") or {}).get("inline_keyboard") or []
    return any(b.get("callback_data") == STOP_DATA for row in rows for b in row)


def humans(entries: list[Any]) -> list[str]:
    return [e.text for e in entries if e.author.startswith("human:")]


async def test_hello_runs_once_and_its_answer_shows_as_plain_text(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # (httpx logs every request's URL, and the token is in it)
    async with world.running() as (sup, _):
        world.bot.say(CHAT, ALICE, "hello")
        reply = await world.wait_for(CHAT, lambda m: "hello" in text(m).lower() and "demo" in text(m))
        assert reply["chat"]["id"] == CHAT
        entries = await sup.entries("general")
        assert [(e.author, e.text, e.meta.get("origin")) for e in entries if e.author.startswith("human:")] == [
            ("human:101", "hello", f"tg:{CHAT}:1")]
    assert "HTTP Request: POST" in caplog.text and "/bot<token>/getUpdates" in caplog.text
    assert world.bot.token not in caplog.text
    # Nothing the bridge sent asked for markup: no parse_mode, no entities of its own.
    sends = [params for method, params, _ in world.bot.calls if method in ("sendMessage", "editMessageText")]
    assert sends and not [p for p in sends if "parse_mode" in p or "entities" in p]


async def test_an_agent_cannot_mention_or_format_anyone(world: World) -> None:
    """Telegram finds @mentions in plain text too: the bridge breaks each, so none is found."""
    async with world.running() as (sup, bridge):
        hostile = "ping @everyone_here and *bold* <b>x</b> [a](tg://user?id=1)"
        # (a message from elsewhere, relayed as a notice naming its author: the post every
        # agent's text takes too; the demo agent itself drops the @ of what it quotes)
        await sup.send("general", hostile, author="human:cli")
        echoed = await world.wait_for(CHAT, lambda m: text(m).startswith("cli: ping"))
        assert "mention" not in [e["type"] for e in echoed.get("entities", [])], echoed
        assert "@\u2060everyone_here" in text(echoed) and "<b>x</b>" in text(echoed) and "*bold*" in text(echoed)
        # A turn's line of what it spent ends its status message, in plain text: its CLI's model
        # name (markup, a mention, a newline, control codes) mentions and formats nobody; the
        # Stop button goes with the turn's end.
        await sup.send("general", "count", to=["meter"])
        spent = await world.wait_for(CHAT, lambda m: METERED_LINE in text(m))
        assert text(spent).startswith("⚙ Read: notes.txt\n" + METERED_LINE), spent
        assert text(spent).endswith(" s · " + neutral(METERED_MODEL)) and "\x03" not in text(spent), spent
        assert "mention" not in [e["type"] for e in spent.get("entities", [])] and not has_button(spent), spent
    assert neutral("mail a@b.org or @someone") == "mail a@\u2060b.org or @\u2060someone"


async def test_a_strangers_message_and_button_press_are_ignored(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "corral.bridges")
    async with world.running() as (sup, _):
        world.bot.say(CHAT, MALLORY, "hello from mallory")
        world.bot.say(CHAT, ALICE, "start a long task")
        status = await world.wait_for(CHAT, has_button)
        query = world.bot.press(CHAT, MALLORY, status["message_id"], STOP_DATA)
        world.bot.say(CHAT, MALLORY, "/stop")
        # Answered (the presser's spinner stops), and nothing else: the turn runs on.
        with trio.fail_after(30):
            while query not in world.bot.answered or "666 may not stop work" not in caplog.text:
                await trio.sleep(0.02)
        assert "text" not in world.bot.answered[query]
        assert humans(await sup.entries("general")) == ["start a long task"]
        assert not [m for m in world.bot.sent(CHAT) if text(m) == STOPPING]
        assert turn_processes() != []
        world.bot.say(CHAT, ALICE, "/stop")
        await world.wait_for(CHAT, lambda m: text(m).startswith(STOP_NOTICE))
    assert "666 may not talk to agents" in caplog.text
    assert not [m for m in world.bot.sent(CHAT) if "mallory" in text(m).lower()]


async def _stopped(world: World, chat: int) -> None:
    """"Stopping…", then the notice, last; no process left; the Stop button taken off."""
    ack = await world.wait_for(chat, lambda m: text(m) == STOPPING)
    notice = await world.wait_for(chat, lambda m: text(m).startswith(STOP_NOTICE))
    assert ack["message_id"] < notice["message_id"]
    assert turn_processes() == []
    with trio.fail_after(30):
        while any(has_button(m) for m in world.bot.sent(chat)):
            await trio.sleep(0.02)


async def test_stop_by_the_button_is_acknowledged_and_the_notice_comes_last(world: World) -> None:
    async with world.running() as (sup, _):
        world.bot.say(CHAT, BOB, "start a long task")
        status = await world.wait_for(CHAT, lambda m: has_button(m) and "tool running" in text(m))
        query = world.bot.press(CHAT, BOB, status["message_id"], STOP_DATA)
        await _stopped(world, CHAT)
        assert query in world.bot.answered
        world.bot.say(CHAT, BOB, "hello again")
        await world.wait_for(CHAT, lambda m: "hello again" in text(m) and "demo" in text(m))
        sent = world.bot.sent(CHAT)
        notice = max(i for i, m in enumerate(sent) if text(m).startswith(STOP_NOTICE))
        # Nothing of the stopped turn after its notice (the new turn's own status is the new turn's).
        assert not [m for m in sent[notice + 1:] if "tool running" in text(m) or text(m).startswith("Plan")]
        assert [e.text for e in await sup.entries("general") if e.kind == "notice"] == [STOP_NOTICE]
        # The same button pressed again stops nothing more.
        world.bot.press(CHAT, BOB, status["message_id"], STOP_DATA)
        world.bot.say(CHAT, BOB, "and hello")
        await world.wait_for(CHAT, lambda m: "and hello" in text(m) and "demo" in text(m))
        assert [e.text for e in await sup.entries("general") if e.kind == "notice"] == [STOP_NOTICE]


async def test_stop_by_command_in_a_group_and_by_reaction(world: World) -> None:
    async with world.running() as (sup, bridge):
        username = bridge.platform.username  # type: ignore[attr-defined]
        world.bot.say(GROUP, ALICE, "start a long task")
        await world.wait_for(GROUP, has_button)
        world.bot.say(GROUP, ALICE, "/stop@some_other_bot")  # (another bot's command: not ours)
        world.bot.say(GROUP, ALICE, f"/stop@{username}")
        await _stopped(world, GROUP)
        assert [e.text for e in await sup.entries("team") if e.kind == "notice"] == [STOP_NOTICE]
        # 🛑 as a reaction on the running turn's message stops it too.
        world.bot.say(GROUP, ALICE, "start a long task again")
        status = await world.wait_for(GROUP, lambda m: has_button(m))
        world.bot.react(GROUP, ALICE, status["message_id"], "🛑")
        with trio.fail_after(60):
            while len([e for e in await sup.entries("team") if e.kind == "notice"]) < 2:
                await trio.sleep(0.05)
        assert turn_processes() == []


async def _shown(sup: Supervisor) -> None:
    """Until the bridge has recorded as posted every entry of the chat's channel (a bridge
    cancelled between Telegram's answer and that record posts the entry again: no idempotency key)."""
    with trio.fail_after(30):
        last = [e.seq for e in await sup.entries("general") if e.author == "agent:demo" and e.kind == "message"][-1]
        while int(await sup.cursor(f"bridge:tg:posted:{CHAT}") or 0) < last:
            await trio.sleep(0.02)


async def test_a_redelivered_update_runs_once_across_a_restart(world: World) -> None:
    async with world.supervisor() as (sup, config):
        async with world.bridge(sup, config):
            offset = await sup.cursor("bridge:tg:since")
            world.bot.say(CHAT, ALICE, "hello once")
            await world.wait_for(CHAT, lambda m: "hello once" in text(m) and "conversation" in text(m))
            await _shown(sup)
        # The bridge died before it confirmed: Telegram hands the update out again, and twice
        # within one poll (a server repeating itself).
        said = next(m for m in world.bot.messages.values() if m.get("text") == "hello once")
        redelivered = {"update_id": int(offset or 0), "message": said}
        assert offset is not None
        await sup.save_cursor("bridge:tg:since", offset)
        world.bot.redeliver(redelivered)
        world.bot.redeliver(dict(redelivered))
        async with world.bridge(sup, config) as bridge:
            world.bot.say(CHAT, ALICE, "hello twice")
            await world.wait_for(CHAT, lambda m: "hello twice" in text(m) and "demo" in text(m))
            assert bridge.platform.offset > int(offset)  # type: ignore[attr-defined]
        assert humans(await sup.entries("general")) == ["hello once", "hello twice"]
        replies = [m for m in world.bot.sent(CHAT) if "You said" in text(m) or "hello" in text(m)]
        assert len([m for m in replies if "hello once" in text(m)]) == 1, [text(m) for m in world.bot.sent(CHAT)]


async def test_a_bridge_restarted_mid_draft_edits_its_message_into_the_saved_text(world: World) -> None:
    async with world.supervisor() as (sup, config):
        async with world.bridge(sup, config):
            world.bot.say(CHAT, ALICE, "stream 3")
            draft = await world.wait_for(CHAT, lambda m: "Streaming line" in text(m))
            # (once the bridge has recorded the draft's message: a crash between Telegram's
            # answer and that record leaves the draft as it was, and the saved text comes new)
            with trio.fail_after(30):
                while await sup.cursor(f"bridge:tg:draft:{CHAT}") is None:
                    await trio.sleep(0.02)
        # (the bridge is gone; the turn streams on, and is saved while no bridge runs)
        assert await sup.wait_idle("general", 60)
        saved = [e for e in await sup.entries("general") if e.kind == "message" and e.meta.get("draft")]
        assert saved
        async with world.bridge(sup, config):
            final = await world.wait_for(CHAT, lambda m: m["message_id"] == draft["message_id"]
                                         and text(m).endswith(neutral(saved[-1].text)))
            assert final.get("edit_date")
        # One message holds the saved text: no second one was posted for it.
        assert [m for m in world.bot.sent(CHAT) if "Streaming line" in text(m)] == [final]


async def test_a_429_waits_its_retry_after_and_nothing_is_lost_or_doubled(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "corral.bridges")
    async with world.running() as (sup, _):
        world.bot.fail("sendMessage", "429", retry_after=1)
        world.bot.say(CHAT, ALICE, "hello limited")
        await world.wait_for(CHAT, lambda m: "hello limited" in text(m) and "demo" in text(m))
    assert "rate limited (429 Too Many Requests: retry after 1)" in caplog.text
    [(_, _, limited_at)] = [f for f in world.bot.faulted if f[0] == "sendMessage"]
    retried = [at for method, _, at in world.bot.calls if method == "sendMessage" and at > limited_at]
    assert retried and retried[0] - limited_at >= 0.95
    assert len([m for m in world.bot.sent(CHAT) if "hello limited" in text(m)]) == 1


async def test_a_server_that_drops_the_connection_mid_poll_loses_nothing(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "corral.bridges")
    async with world.running() as (sup, bridge):
        world.bot.fail("getUpdates", "drop")
        world.bot.fail("getUpdates", "500")
        world.bot.fail("getUpdates", "409")
        with trio.fail_after(30):
            while len(world.bot.faulted) < 3:
                await trio.sleep(0.02)
        world.bot.say(CHAT, ALICE, "hello after the drop")
        await world.wait_for(CHAT, lambda m: "hello after the drop" in text(m) and "demo" in text(m))
        assert humans(await sup.entries("general")) == ["hello after the drop"]
    assert "getUpdates: RemoteProtocolError" in caplog.text
    assert "getUpdates: 409 Conflict: terminated by other getUpdates request" in caplog.text
    assert world.bot.token not in caplog.text


async def test_new_interrupt_and_steer_are_the_cores_commands(world: World) -> None:
    async with world.running() as (sup, _):
        world.bot.say(CHAT, ALICE, "start a long task")
        await world.wait_for(CHAT, has_button)
        world.bot.say(CHAT, ALICE, "/interrupt just say hi instead")
        await world.wait_for(CHAT, lambda m: "You said: just say hi instead" in text(m))
        assert await sup.wait_idle("general", 60)
        world.bot.say(CHAT, ALICE, "/new")
        await world.wait_for(CHAT, lambda m: text(m).startswith("Conversation reset: demo starts a new conversation"))
    assert slash_command("/steer mind the tests", "corral_bot") == "!steer mind the tests"
    assert slash_command("/start", "corral_bot") is None
    assert slash_command("/help", "corral_bot") == "/help"


def test_long_text_is_split_at_telegrams_limit_in_utf16_units() -> None:
    text_ = ("é" * 3000 + "\n") + "😀" * 3000  # (an emoji is two UTF-16 units)
    parts = split_message(text_)
    assert all(len(p.encode("utf-16-le")) // 2 <= 4096 for p in parts) and "".join(parts) == text_
    assert parts[0] == "é" * 3000 + "\n"
    assert split_message("   ") == ["…"]


async def test_a_long_answer_arrives_whole_in_messages_telegram_accepts(world: World) -> None:
    async with world.running() as (sup, _):
        world.bot.fail("sendMessage", "429", retry_after=1, skip=1)  # (its second part: the first is not sent again)
        await sup.send("general", "x" * 9000, author="agent:demo")
        with trio.fail_after(30):
            while sum(len(text(m)) for m in world.bot.sent(CHAT)) < 9000:
                await trio.sleep(0.02)
    parts = [text(m) for m in world.bot.sent(CHAT)]
    assert "".join(parts).endswith("x" * 9000) and all(len(p) <= 4096 for p in parts) and len(parts) == 3


async def test_an_allowed_users_group_becomes_a_channel_and_a_strangers_does_not(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "corral.bridges")
    async with world.running(invites=True) as (sup, bridge):
        world.bot.add_to(-100777, MALLORY)
        world.bot.add_to(-100778, ALICE)
        with trio.fail_after(30):
            while "-100778" not in bridge.rooms:
                await trio.sleep(0.02)
        world.bot.say(-100778, ALICE, "hello new group")
        await world.wait_for(-100778, lambda m: "hello new group" in text(m) and "demo" in text(m))
        assert "-100777" not in bridge.rooms
        assert "666 may not talk to agents; ignored the invitation to -100777" in caplog.text
        assert humans(await sup.entries("tg/-100778")) == ["hello new group"]


async def test_a_photo_is_answered_with_the_reason_and_runs_nothing(world: World) -> None:
    async with world.running() as (sup, _):
        photo = world.bot.say(CHAT, ALICE, None, photo=[{"file_id": "f", "file_unique_id": "u", "width": 1,
                                                         "height": 1}])
        answer = await world.wait_for(CHAT, lambda m: "not run" in text(m))
        assert text(answer) == "not run: agents read text messages, not a photo"
        assert answer["reply_to_message"]["message_id"] == photo["message_id"]
        world.bot.say(CHAT, ALICE, "hello")
        await world.wait_for(CHAT, lambda m: "hello" in text(m) and "demo" in text(m))
        assert humans(await sup.entries("general")) == ["hello"]


async def test_a_turn_cannot_read_the_bots_token(world: World, telegram_api: FakeBotApi) -> None:
    _needs_sandbox()
    code = (f"try:\n    print(open({str(world.folder / 'telegram.token')!r}).read().strip())\n"
            "except OSError as e:\n    print('refused', type(e).__name__)\n")
    config = telegram_config(world.folder, telegram_api, world.bot)
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]}, "store": {"path": "corral.db"},
        "agents": {"probe": script_agent(code, sandbox_write=[str(world.folder / "w")])},
        "bridges": {"tg": {"type": "telegram", "token_file": str(config.bridges["tg"].options["token_file"]),
                           "admins": ["1"], "rooms": {"1": "general"}}},
    }
    (world.folder / "w").mkdir()
    probe = parse_config(data, file=str(world.folder / "corral.toml"), base=world.folder)
    async with open_supervisor(probe) as sup:
        accepted = await sup.send("general", "read it")
        assert await sup.wait_idle("general", 60)
        said = " ".join(e.text for e in await sup.entries("general", after=accepted.seq) if e.kind == "message")
        assert world.bot.token not in said and "refused" in said, said


async def test_sends_into_a_group_are_paced_at_telegrams_rate(autojump_clock: trio.testing.MockClock) -> None:
    from supervisor.bridges.telegram import _Pace

    pace = _Pace()
    start = trio.current_time()
    for _ in range(20):
        await pace.wait("-100500")
    assert trio.current_time() - start < 1  # (a burst of 20 goes at once)
    # Live edits keep out of the minute's last messages: a stop's never wait behind a draft.
    assert pace.crowded("-100500") and not pace.crowded("101")
    await pace.wait("-100500")  # the 21st waits for the first to leave the minute
    assert trio.current_time() - start >= 60
    await pace.wait("101")  # (a private chat has only the bot's own rate)
    assert trio.current_time() - start < 61
    await trio.sleep(61)
    assert not pace.crowded("-100500")


def _until(found: Callable[[], Any], timeout: float = 60) -> Any:
    """Polls the fake server (a thread: this test is the daemon's outside) until ``found`` gives something."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not seen in {timeout} s")


def test_a_real_daemon_runs_the_bridge_stops_by_button_and_loses_nothing_across_its_restart(
    world: World, telegram_api: FakeBotApi
) -> None:
    """`corral run` finds the platform by its entry point, in a process of its own; a message
    written while the daemon is down runs once after its restart, and nothing earlier again."""
    (world.folder / "telegram.token").write_text(world.bot.token + "\n")
    config = f"""
[server]
socket = "corral.sock"
cgroup = "{KILL['cgroup']}"
[store]
path = "corral.db"
[defaults]
stop_grace = 2
[agents.demo]
adapter = "demo"
delay = 0.01
[bridges.tg]
type = "telegram"
api_url = "{telegram_api.url}"
token_file = "telegram.token"
poll_timeout = 5
admins = ["{ALICE['id']}"]
[bridges.tg.rooms]
"{CHAT}" = "general"
"""

    def shown(test: Callable[[str], bool]) -> Callable[[], list[dict[str, Any]]]:
        return lambda: [m for m in world.bot.sent(CHAT) if test(text(m))]

    daemon = DaemonProcess(world.folder, config)
    try:
        _until(lambda: world.bot.polls)  # (listening)
        world.bot.say(CHAT, ALICE, "hello daemon")
        _until(shown(lambda t: "You said: hello daemon" in t))
        world.bot.say(CHAT, ALICE, "start a long task")
        [status] = _until(lambda: [m for m in world.bot.sent(CHAT) if has_button(m) and "tool running" in text(m)])
        world.bot.press(CHAT, ALICE, status["message_id"], STOP_DATA)
        _until(shown(lambda t: t.startswith(STOP_NOTICE)))
        assert [t for t in world.bot.texts(CHAT) if t == STOPPING] == [STOPPING]
        assert turn_processes() == []
        assert daemon.stop() == 0
        world.bot.say(CHAT, ALICE, "hello while you were away")
        daemon = DaemonProcess(world.folder, config)
        _until(shown(lambda t: "You said: hello while you were away" in t))
        out = daemon.cli("tail", "general", "--json")
        assert "hello daemon" in out.stdout
    finally:
        daemon.stop()
    # (httpx's line per request is not the daemon's log: a long poll would write one a second)
    assert not [line for line in daemon.log if "HTTP Request" in line], daemon.log[-5:]
    texts = world.bot.texts(CHAT)
    assert len([t for t in texts if "You said: hello daemon" in t]) == 1
    assert len([t for t in texts if "You said: hello while you were away" in t]) == 1
    assert len([t for t in texts if t.startswith(STOP_NOTICE)]) == 1


async def test_a_dropped_message_is_named_back_with_a_button_that_sends_it_again(world: World) -> None:
    async with world.running() as (sup, _):
        world.bot.say(CHAT, ALICE, "start a long task")
        await world.wait_for(CHAT, has_button)
        world.bot.say(CHAT, BOB, "then say hello to bob")
        with trio.fail_after(30):
            while "then say hello to bob" not in humans(await sup.entries("general")):
                await trio.sleep(0.02)
        world.bot.say(CHAT, ALICE, "/stop")
        answer = await world.wait_for(CHAT, lambda m: "not run" in text(m) and "202" in text(m))
        assert "> then say hello to bob" in text(answer) and text(answer).endswith("Press 🔁 to send it again.")
        [[button]] = answer["reply_markup"]["inline_keyboard"]
        # Only its sender (or an admin) may send it again: mallory's press does nothing.
        world.bot.press(CHAT, MALLORY, answer["message_id"], button["callback_data"])
        world.bot.press(CHAT, BOB, answer["message_id"], button["callback_data"])
        await world.wait_for(CHAT, lambda m: "You said: then say hello to bob" in text(m))
        sent = [e for e in await sup.entries("general") if e.author == "human:202"]
        assert len(sent) == 2


async def test_a_refused_token_is_said_with_its_file_and_never_logged(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    from supervisor.bridges.runner import run_bridges

    caplog.set_level(logging.DEBUG)
    config = telegram_config(world.folder, world.api, world.bot)
    (world.folder / "telegram.token").write_text("1:revoked-token\n")
    async with open_supervisor(config) as sup, trio.open_nursery() as nursery:
        await nursery.start(run_bridges, sup, list(config.bridges.values()))
        with trio.fail_after(30):
            while "bridge tg " not in caplog.text:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    # Contained (the daemon serves on), said with the file to fix, and retried after a backoff.
    assert (f"bridge tg failed: the token in {world.folder / 'telegram.token'} is refused "
            "(getMe: 401 Unauthorized); starting it again in") in caplog.text
    assert "revoked-token" not in caplog.text
