"""The Discord bridge against the fake Discord (``scripts/_discord.py``: REST and the Gateway),
which the first test checks against discord.py, then through an embedded supervisor with the
demo agent: real HTTP and WebSocket on 127.0.0.1, real turns. One fake server for the module;
each test has a bot of its own. Every wait is for something the chat shows, bounded by
``trio.fail_after``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from scripts._discord import FakeBot, FakeDiscord, snowflake
from conftest import KILL, METERED_LINE, METERED_MODEL, metered_agent, turn_processes

from supervisor import Config, ConfigError, Supervisor, open_supervisor, parse_config
from supervisor.bridges.core import STOPPING
from supervisor.bridges.discord import (
    INTENTS,
    STOP_ID,
    RateLimits,
    Session,
    after_close,
    neutral,
)
from supervisor.bridges.runner import Bridge, run_bridge
from supervisor.host.supervisor import STOP_NOTICE

ROOT = Path(__file__).resolve().parent.parent


def person(name: str) -> dict[str, Any]:
    return {"id": snowflake(), "username": name, "discriminator": "0", "global_name": name.title(), "avatar": None}


ALICE, BOB, MALLORY = person("alice"), person("bob"), person("mallory")


@pytest.fixture(scope="module")
def discord_api() -> Iterator[FakeDiscord]:
    server = FakeDiscord()
    try:
        yield server
    finally:
        server.close()


def discord_config(folder: Path, api: FakeDiscord, bot: FakeBot, rooms: dict[str, str]) -> Config:
    (folder / "discord.token").write_text(bot.token + "\n")
    table = {"type": "discord", "api_url": api.url, "token_file": "discord.token",
             "admins": [ALICE["id"]], "users": [BOB["id"]], "rooms": rooms}
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]},
        "store": {"path": "corral.db"},
        "agents": {"demo": {"adapter": "demo", "delay": 0.01, "sandbox_write": [str(folder)]},
                   "meter": metered_agent(folder)},
        "bridges": {"dc": table},
        "defaults": {"agent": "demo"},
    }
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


@dataclass
class World:
    api: FakeDiscord
    bot: FakeBot
    folder: Path
    channel: str

    @asynccontextmanager
    async def supervisor(self) -> AsyncIterator[tuple[Supervisor, Config]]:
        config = discord_config(self.folder, self.api, self.bot, {self.channel: "general"})
        async with open_supervisor(config) as sup:
            yield sup, config

    @asynccontextmanager
    async def bridge(self, sup: Supervisor, config: Config) -> AsyncIterator[Bridge]:
        async with trio.open_nursery() as nursery:
            bridge = await nursery.start(run_bridge, sup, config.bridges["dc"])
            try:
                yield bridge
            finally:
                nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[tuple[Supervisor, Bridge]]:
        async with self.supervisor() as (sup, config), self.bridge(sup, config) as bridge:
            yield sup, bridge

    async def wait_for(self, found: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        """The first of the bot's messages in the channel (as it stands now) that ``found`` accepts."""
        with trio.move_on_after(timeout):
            while True:
                for message in self.bot.sent(self.channel):
                    if found(message):
                        return message
                await trio.sleep(0.02)
        raise AssertionError(f"not shown in {timeout} s; the channel shows: {self.texts()}")

    def texts(self) -> list[str]:
        return [text(m) for m in self.bot.sent(self.channel)]


@pytest.fixture
def world(discord_api: FakeDiscord, short_tmp: Path) -> Iterator[World]:
    discord_api.heartbeat_ms = 41250
    bot = discord_api.bot()
    yield World(discord_api, bot, short_tmp, bot.channel())


def text(message: dict[str, Any]) -> str:
    return str(message.get("content", ""))


def has_button(message: dict[str, Any]) -> bool:
    return any(c.get("custom_id") == STOP_ID for row in message.get("components") or [] for c in row["components"])


def humans(entries: list[Any]) -> list[str]:
    return [e.text for e in entries if e.author.startswith("human:")]


def test_the_fake_is_read_by_discord_py(discord_api: FakeDiscord) -> None:
    """discord.py (asyncio, a client no one here wrote) logs in, connects (zlib-stream), reads
    a message, a reaction and a button press (deferring it), posts, edits, reacts, waits out a
    bucket's and the global 429, and resumes after op 7 and after a dropped socket."""
    import discord
    import yarl
    from discord.gateway import DiscordWebSocket

    bot = discord_api.bot()
    channel_id = bot.channel()
    base, gateway = discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY
    discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = discord_api.url, yarl.URL(discord_api.gateway + "/")

    async def main() -> list[Any]:
        intents = discord.Intents.default()
        intents.message_content = True
        client = discord.Client(intents=intents, guild_ready_timeout=0.1)
        ready, got = asyncio.Event(), asyncio.Queue[tuple[Any, ...]]()

        @client.event
        async def on_ready() -> None:
            ready.set()

        @client.event
        async def on_message(m: discord.Message) -> None:
            await got.put(("message", m.content, str(m.author.id)))

        @client.event
        async def on_raw_reaction_add(p: discord.RawReactionActionEvent) -> None:
            await got.put(("reaction", str(p.emoji), str(p.user_id)))

        @client.event
        async def on_interaction(i: discord.Interaction) -> None:
            await i.response.defer()
            await got.put(("press", (i.data or {}).get("custom_id"), str(i.user.id)))

        task = asyncio.create_task(client.start(bot.token))
        seen: list[Any] = []
        try:
            await asyncio.wait_for(ready.wait(), 30)
            channel = await client.fetch_channel(int(channel_id))
            assert isinstance(channel, discord.TextChannel)
            message = await channel.send("hi @everyone", allowed_mentions=discord.AllowedMentions.none())
            await message.edit(content="hi there")
            await message.add_reaction("🛑")
            bot.say(channel_id, ALICE, "hello")
            seen.append(await asyncio.wait_for(got.get(), 10))
            bot.react(channel_id, ALICE, str(message.id), "🛑")
            seen.append(await asyncio.wait_for(got.get(), 10))
            bot.press(channel_id, ALICE, str(message.id), STOP_ID)
            seen.append(await asyncio.wait_for(got.get(), 10))
            bot.fail("POST /channels/#/messages", "429", retry_after=0.3)
            bot.fail("POST /channels/#/messages", "global", retry_after=0.3)
            await channel.send("after the limits")
            bot.reconnect()
            bot.say(channel_id, ALICE, "after op 7")
            seen.append(await asyncio.wait_for(got.get(), 10))
            bot.drop(None)
            bot.say(channel_id, ALICE, "after a drop")
            seen.append(await asyncio.wait_for(got.get(), 10))
        finally:
            await client.close()
            task.cancel()
        return seen

    try:
        seen = asyncio.run(main())
    finally:
        discord.http.Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY = base, gateway
    me = ALICE["id"]
    assert seen == [("message", "hello", me), ("reaction", "🛑", me), ("press", STOP_ID, me),
                    ("message", "after op 7", me), ("message", "after a drop", me)]
    assert [kind for kind, _ in bot.gateway_log if kind in ("identify", "resume")] == ["identify", "resume", "resume"]
    assert [body for body, _ in bot.answered.values()] == [{"type": 6}]
    assert [kind for _, kind, _ in bot.faulted] == ["429", "global"]
    assert [text(m) for m in bot.sent(channel_id)] == ["hi there", "after the limits"]
    assert bot.sent(channel_id)[0]["reactions"] == [{"emoji": {"id": None, "name": "🛑"}, "me": True}]


# ------------------------------------------------------------------ pure parts


def test_mentions_are_neutralised_and_close_codes_and_cursors_read() -> None:
    assert neutral("@everyone @here <@123> <@!45> <@&678> a@b.org") == (
        "@\u200beveryone @\u200bhere <@\u200b123> <@\u200b!45> <@\u200b&678> a@b.org")
    assert [after_close(c) for c in (4004, 4014, 4007, 4009, 4000, 1001, None)] == [
        "fatal", "fatal", "identify", "identify", "resume", "resume", "resume"]
    session = Session("abc", 42, "wss://gateway-us-east1-b.discord.gg")
    assert Session.parse(session.cursor()) == session and Session.parse("17") is None
    assert INTENTS & (1 << 15) and INTENTS & (1 << 9) and INTENTS & (1 << 10)
    limits = RateLimits()
    limits.update("POST /channels/#/messages", "1", {"x-ratelimit-bucket": "b", "x-ratelimit-remaining": "0",
                                                     "x-ratelimit-reset-after": "2.5"}, now=10.0)
    assert limits.wait_until("POST /channels/#/messages", "1", 10.0) == 12.5
    assert limits.wait_until("POST /channels/#/messages", "2", 10.0) == 10.0  # (another channel's bucket)
    limits.limited("GET /users/@me", "", 1.0, True, now=11.0)
    assert limits.wait_until("POST /channels/#/messages", "2", 11.0) == 12.0  # (a global 429 holds every route)


def test_corral_check_names_what_is_wrong_in_a_discord_table(tmp_path: Path) -> None:
    table = {"type": "discord", "api_url": "http://discord.example.org", "admins": ["alice#1234"],
             "users": ["123456789012345678"], "rooms": {"#general": "dev"}}
    with pytest.raises(ConfigError) as caught:
        parse_config({"agents": {"demo": {"adapter": "demo"}}, "bridges": {"dc": table}},
                     file=str(tmp_path / "corral.toml"), base=tmp_path)
    text_ = "\n".join(str(p) for p in caught.value.problems)
    assert "bridges.dc.token_file: missing" in text_
    assert "bridges.dc.api_url: http://discord.example.org is plain HTTP" in text_
    assert "bridges.dc.rooms.#general: is not a Discord channel id (a number)" in text_
    assert "bridges.dc.admins[0]: 'alice#1234' is not a discord user id" in text_
    assert "users" not in text_


def test_the_bridges_pages_discord_config_works_as_written(tmp_path: Path) -> None:
    import tomllib

    page = (ROOT / "docs" / "bridges.md").read_text()
    data = tomllib.loads(page.split("<!-- discord-config -->", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0])
    (tmp_path / "discord.token").write_text("MTE.x.y\n")
    bridge = parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path).bridges["dc"]
    assert bridge.type == "discord" and bridge.secrets == (tmp_path / "discord.token",)
    assert all(room.isdigit() for room in bridge.rooms) and all(a.isdigit() for a in bridge.admins)
    # config.example.toml's commented Discord bridge, uncommented, works too.
    lines = (ROOT / "config.example.toml").read_text().split("# [bridges.dc]\n", 1)[1].split("#\n", 1)[0].splitlines()
    block = "[bridges.dc]\n" + "\n".join(line.removeprefix("# ") for line in lines if line.startswith("# "))
    data = {"agents": {"demo": {"adapter": "demo"}}, **tomllib.loads(block)}
    example = parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path).bridges["dc"]
    assert example.type == "discord" and example.rooms == {"1234567890123456789": "dev"}


# ------------------------------------------------------------------ through a supervisor


async def test_hello_runs_once_a_stranger_is_ignored_and_nobody_can_be_mentioned(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "corral.bridges")
    async with world.running() as (sup, _):
        world.bot.say(world.channel, MALLORY, "hello from mallory")
        world.bot.say(world.channel, ALICE, "hello")
        reply = await world.wait_for(lambda m: "hello" in text(m).lower() and "demo" in text(m))
        assert reply["channel_id"] == world.channel
        hostile = "ping @everyone and @here, <@&1234567890> and <@987654321>"
        await sup.send("general", hostile, author="human:cli")
        echoed = await world.wait_for(lambda m: text(m).startswith("cli: ping"))
        assert text(echoed) == "cli: " + neutral(hostile) and "@everyone" not in text(echoed)
        assert humans(await sup.entries("general")) == ["hello", hostile]
        # A turn's line of what it spent ends its status message, in plain text whatever its
        # CLI names its model (@everyone, a mention, markdown); the Stop button goes with it.
        await sup.send("general", "count", to=["meter"])
        spent = await world.wait_for(lambda m: METERED_LINE in text(m))
        assert text(spent).startswith("⚙ Read: notes.txt\n" + METERED_LINE), spent
        assert text(spent).endswith(" s · " + neutral(METERED_MODEL)) and "@everyone" not in text(spent), spent
        assert "**" not in text(spent) and "<@" not in text(spent) and not has_button(spent), spent
    assert f"{MALLORY['id']} may not talk to agents" in caplog.text
    assert not [t for t in world.texts() if "mallory" in t]
    [identify] = [d for kind, d in world.bot.gateway_log if kind == "identify"]
    assert identify["intents"] == INTENTS
    posts = [body for method, path, body, _ in world.bot.calls if method in ("POST", "PATCH") and "/messages" in path
             and "content" in body]
    assert posts and all(body["allowed_mentions"]["parse"] == [] for body in posts)


async def _stopped(world: World, stops: int) -> None:
    """"Stopping…", then the notice, last; no process left; no Stop button left."""
    with trio.fail_after(60):
        while len([t for t in world.texts() if t.startswith(STOP_NOTICE)]) < stops:
            await trio.sleep(0.02)
    texts = world.texts()
    assert texts.index(STOPPING) < max(i for i, t in enumerate(texts) if t.startswith(STOP_NOTICE))
    assert turn_processes() == []
    with trio.fail_after(30):
        while any(has_button(m) for m in world.bot.sent(world.channel)):
            await trio.sleep(0.02)


async def test_stop_by_the_button_and_by_reaction_is_acknowledged_with_the_notice_last(world: World) -> None:
    async with world.running() as (sup, _):
        world.bot.say(world.channel, BOB, "start a long task")
        status = await world.wait_for(lambda m: has_button(m) and "tool running" in text(m))
        stranger = world.bot.press(world.channel, MALLORY, status["id"], STOP_ID)
        press = world.bot.press(world.channel, BOB, status["id"], STOP_ID)
        await _stopped(world, 1)
        # Both presses answered (a deferred update) within Discord's 3 s; the stranger's stopped nothing.
        assert {i: body for i, (body, _) in world.bot.answered.items()} == {stranger: {"type": 6}, press: {"type": 6}}
        sent = world.bot.sent(world.channel)
        notice = max(i for i, m in enumerate(sent) if text(m).startswith(STOP_NOTICE))
        assert not [m for m in sent[notice + 1:] if "tool running" in text(m)]
        # 🛑 as a reaction on the next turn's status message.
        world.bot.say(world.channel, ALICE, "start a long task again")
        await world.wait_for(lambda m: has_button(m) and "again" not in text(m) and m["id"] != status["id"])
        latest = [m for m in world.bot.sent(world.channel) if has_button(m)][-1]
        world.bot.react(world.channel, ALICE, latest["id"], "🛑")
        await _stopped(world, 2)
        assert [e.text for e in await sup.entries("general") if e.kind == "notice"] == [STOP_NOTICE, STOP_NOTICE]


async def _shown(world: World, sup: Supervisor) -> None:
    """Until the bridge has recorded as posted every agent entry of the channel."""
    with trio.fail_after(30):
        # (a live draft is posted before its entry is saved: wait for the entry first)
        while not (saved := [e.seq for e in await sup.entries("general")
                             if e.author == "agent:demo" and e.kind == "message"]):
            await trio.sleep(0.02)
        last = saved[-1]
        while int(await sup.cursor(f"bridge:dc:posted:{world.channel}") or 0) < last:
            await trio.sleep(0.02)


async def test_a_resumed_session_runs_its_events_once_and_a_restart_resumes_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("supervisor.bridges.discord.INVALID_SESSION_WAIT", (0.01, 0.02))
    async with world.supervisor() as (sup, config):
        async with world.bridge(sup, config) as bridge:
            early = await sup.cursor("bridge:dc:since")
            world.bot.say(world.channel, ALICE, "hello once")
            await world.wait_for(lambda m: "hello once" in text(m) and "demo" in text(m))
            await _shown(world, sup)
            # The Gateway asks for a reconnect: the bridge resumes where it was, nothing again.
            world.bot.reconnect()
            world.bot.say(world.channel, ALICE, "hello after op 7")
            await world.wait_for(lambda m: "hello after op 7" in text(m) and "demo" in text(m))
            session = bridge.platform.session  # type: ignore[attr-defined]
        # The bridge is gone; a message comes while it is; it restarts from an older cursor (a
        # crash before it was saved): the session resumes, and replays "hello once" too.
        world.bot.say(world.channel, ALICE, "hello while away")
        assert early is not None and Session.parse(early) is not None
        await sup.save_cursor("bridge:dc:since", early)
        async with world.bridge(sup, config):
            await world.wait_for(lambda m: "hello while away" in text(m) and "demo" in text(m))
        # Away longer than Discord keeps a session: the resume is refused (op 9), a new session
        # reads back what was said in the channel meanwhile, and nothing before it.
        world.bot.expire()
        world.bot.say(world.channel, ALICE, "hello after the session ended")
        async with world.bridge(sup, config):
            await world.wait_for(lambda m: "hello after the session ended" in text(m) and "demo" in text(m))
        assert humans(await sup.entries("general")) == ["hello once", "hello after op 7", "hello while away",
                                                        "hello after the session ended"]
    resumes = [d for kind, d in world.bot.gateway_log if kind == "resume"]
    assert [r["session_id"] for r in resumes] == [session.session_id] * 3
    assert resumes[1]["seq"] == Session.parse(early).seq  # type: ignore[union-attr]
    assert len([kind for kind, _ in world.bot.gateway_log if kind == "identify"]) == 2
    assert len([t for t in world.texts() if "You said: hello once" in t]) == 1


async def test_a_bridge_restarted_mid_draft_edits_its_message_into_the_saved_text(world: World) -> None:
    async with world.supervisor() as (sup, config):
        async with world.bridge(sup, config):
            world.bot.say(world.channel, ALICE, "stream 3")
            draft = await world.wait_for(lambda m: "Streaming line" in text(m))
            with trio.fail_after(30):
                while await sup.cursor(f"bridge:dc:draft:{world.channel}") is None:
                    await trio.sleep(0.02)
        assert await sup.wait_idle("general", 60)
        saved = [e for e in await sup.entries("general") if e.kind == "message" and e.meta.get("draft")]
        assert saved
        async with world.bridge(sup, config):
            final = await world.wait_for(lambda m: m["id"] == draft["id"] and text(m).endswith(saved[-1].text))
            assert final["edited_timestamp"]
        assert [m for m in world.bot.sent(world.channel) if "Streaming line" in text(m)] == [final]


async def test_429s_by_bucket_and_global_are_waited_and_nothing_is_lost_or_doubled(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "corral.bridges")
    world.bot.limit = (2, 0.5)  # (two messages per half a second per channel: a long answer meets it)
    async with world.running() as (sup, _):
        world.bot.fail("POST /channels/#/messages", "429", retry_after=0.3)
        world.bot.fail("POST /channels/#/messages", "global", retry_after=0.3, skip=1)
        await sup.send("general", "\n".join(f"line {i:04d} " + "x" * 90 for i in range(100)), author="agent:demo")
        with trio.fail_after(60):
            while not [t for t in world.texts() if "line 0099" in t]:
                await trio.sleep(0.02)
    texts = world.texts()
    assert len(texts) == 6 and all(len(t.encode("utf-16-le")) <= 4000 for t in texts)
    lines = [line[:9] for t in texts for line in t.removeprefix("demo: ").splitlines() if line]
    assert lines == [f"line {i:04d}" for i in range(100)]
    assert [kind for _, kind, _ in world.bot.faulted] == ["429", "global"]  # (the buckets' headers were kept)
    assert "rate limited (429, global, retry after 0.30 s)" in caplog.text
    posts = [at for method, path, _, at in world.bot.calls if method == "POST" and path.endswith("/messages")]
    for _, _, limited_at in world.bot.faulted:
        assert min(at for at in posts if at > limited_at) - limited_at >= 0.28
    # The bucket's 2 per 0.5 s held (its headers read, its reset waited): no 429 of its own.
    made = sorted(at for at in posts if at not in {f[2] for f in world.bot.faulted})
    assert all(made[i + 2] - made[i] >= 0.45 for i in range(len(made) - 2))


async def test_a_server_that_drops_the_socket_or_stops_acking_is_resumed(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "corral.bridges")
    world.api.heartbeat_ms = 300
    async with world.running() as (sup, _):
        world.bot.drop(None)  # (no close frame: the TCP connection ends)
        world.bot.say(world.channel, ALICE, "hello after the drop")
        await world.wait_for(lambda m: "hello after the drop" in text(m) and "demo" in text(m))
        world.bot.drop(4000)  # (a close code that keeps the session)
        world.bot.say(world.channel, ALICE, "hello after the close")
        await world.wait_for(lambda m: "hello after the close" in text(m) and "demo" in text(m))
        world.bot.ack = False  # (a zombie connection: heartbeats go unanswered)
        with trio.fail_after(30):
            while "no heartbeat ACK" not in caplog.text:
                await trio.sleep(0.02)
        world.bot.ack = True
        world.bot.say(world.channel, ALICE, "hello after the zombie")
        await world.wait_for(lambda m: "hello after the zombie" in text(m) and "demo" in text(m))
        assert humans(await sup.entries("general")) == ["hello after the drop", "hello after the close",
                                                        "hello after the zombie"]
    kinds = [kind for kind, _ in world.bot.gateway_log if kind in ("identify", "resume", "client-close")]
    assert kinds[0] == "identify" and kinds.count("identify") == 1 and kinds.count("resume") >= 3
    assert ("client-close", 4000) in world.bot.gateway_log  # (not 1000: that would end the session)
    assert "the connection was dropped" in caplog.text and "closed (4000" in caplog.text


async def test_a_fatal_close_is_said_with_its_fix(world: World, caplog: pytest.LogCaptureFixture) -> None:
    from supervisor.bridges.runner import run_bridges

    caplog.set_level(logging.INFO)
    async with world.supervisor() as (sup, config), trio.open_nursery() as nursery:
        await nursery.start(run_bridges, sup, list(config.bridges.values()))
        with trio.fail_after(30):
            while not world.bot.current or world.bot.current.conn is None:
                await trio.sleep(0.02)
        world.bot.drop(4014)
        with trio.fail_after(30):
            while "bridge dc failed" not in caplog.text:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert "disallowed intents: enable the Message Content intent" in caplog.text
    assert world.bot.token not in caplog.text


async def test_a_dropped_message_has_a_send_again_button_and_the_cores_commands_work(world: World) -> None:
    async with world.running() as (sup, _):
        world.bot.say(world.channel, ALICE, "start a long task")
        await world.wait_for(has_button)
        world.bot.say(world.channel, BOB, "then say hello to bob")
        with trio.fail_after(30):
            while "then say hello to bob" not in humans(await sup.entries("general")):
                await trio.sleep(0.02)
        world.bot.say(world.channel, ALICE, "!stop")
        answer = await world.wait_for(lambda m: "not run" in text(m) and BOB["id"] in text(m))
        assert "> then say hello to bob" in text(answer) and text(answer).endswith("Press 🔁 to send it again.")
        [[button]] = [row["components"] for row in answer["components"]]
        world.bot.press(world.channel, MALLORY, answer["id"], button["custom_id"])  # (not its sender: nothing)
        world.bot.press(world.channel, BOB, answer["id"], button["custom_id"])
        await world.wait_for(lambda m: "You said: then say hello to bob" in text(m))
        assert len([e for e in await sup.entries("general") if e.author == f"human:{BOB['id']}"]) == 2
        world.bot.say(world.channel, ALICE, "start a long task")
        await world.wait_for(lambda m: has_button(m) and m["id"] != answer["id"])
        world.bot.say(world.channel, ALICE, "!interrupt just say hi instead")
        await world.wait_for(lambda m: "You said: just say hi instead" in text(m))
        assert await sup.wait_idle("general", 60)
        picture = world.bot.say(world.channel, ALICE, "", attachments=[{"id": snowflake(), "filename": "a.png"}])
        unread = await world.wait_for(lambda m: "not run" in text(m) and "attachment" in text(m))
        assert unread["message_reference"]["message_id"] == picture["id"]
        world.bot.say(world.channel, ALICE, f"<@{world.bot.user['id']}> !new")  # (a mention of the bot first)
        await world.wait_for(lambda m: text(m).startswith("Conversation reset: demo starts a new conversation"))


async def test_an_ack_left_unread_while_the_runner_held_the_events_is_not_a_zombie(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The runner holds the generator past a heartbeat's deadline (a long event): the ACK that
    came meanwhile is read before the connection is called a zombie; one that never comes is not."""
    from types import SimpleNamespace

    from supervisor.bridges.discord import DiscordPlatform
    from supervisor.bridges.platform import Transient

    class Socket:
        def __init__(self, ack: bool) -> None:
            self.ack = ack
            self.put, self.get = trio.open_memory_channel[dict[str, Any]](100)
            self.put.send_nowait({"op": 10, "d": {"heartbeat_interval": 1000}})

        async def receive(self) -> dict[str, Any]:
            return await self.get.receive()

        async def send(self, payload: dict[str, Any]) -> None:
            if payload["op"] == 2:
                self.put.send_nowait({"op": 0, "t": "READY", "s": 1, "d": {"session_id": "s", "resume_gateway_url":
                                                                            "ws://127.0.0.1:9"}})
            if payload["op"] == 1:  # (an event came just before the heartbeat's ACK)
                self.put.send_nowait({"op": 0, "t": "MESSAGE_CREATE", "s": 2, "d": {
                    "id": snowflake(), "channel_id": "1", "author": ALICE, "content": "hi", "type": 0}})
                if self.ack:
                    self.put.send_nowait({"op": 11})

    for ack in (True, False):
        platform = DiscordPlatform(SimpleNamespace(options={"token_file": Path("/nonexistent")}, name="dc"))
        read = platform._read(Socket(ack), resuming=False)  # type: ignore[arg-type]
        batches = 0
        with pytest.raises(Transient, match="no heartbeat ACK") if not ack else trio.move_on_after(30):
            async for batch in read:
                batches += 1
                if batch.events:
                    await trio.sleep(5)  # (the runner handles a long event: five heartbeat intervals)
        await platform.http.aclose()
        assert batches >= 2
