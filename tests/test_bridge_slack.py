"""The Slack bridge against the fake Slack (``scripts/_slack.py``, checked against slack_sdk),
through an embedded supervisor with the demo agent: real HTTP and a real WebSocket on
127.0.0.1, real turns. Every wait is for something the channel shows, bounded by ``trio.fail_after``."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from scripts._slack import FakeApp, FakeSlack
from conftest import KILL, METERED_LINE, METERED_MODEL, metered_agent, turn_processes

from supervisor import Config, Supervisor, open_supervisor, parse_config
from supervisor.bridges.core import STOPPING
from supervisor.bridges.runner import Bridge, run_bridge
from supervisor.bridges.slack import STOP_ACTION, incoming, neutral, slash_text, split_message
from supervisor.host.supervisor import STOP_NOTICE

ALICE, BOB, MALLORY = "UALICE001", "UBOB00002", "UMALLORY9"
DEV, TEAM = "C0DEV0001", "C0TEAM002"


def slack_config(folder: Path, api: FakeSlack, app: FakeApp, **extra: Any) -> Config:
    (folder / "slack-bot.token").write_text(app.bot_token + "\n")
    (folder / "slack-app.token").write_text(app.app_token + "\n")
    table = {"type": "slack", "api_url": f"{api.url}/api", "bot_token_file": "slack-bot.token",
             "app_token_file": "slack-app.token", "admins": [ALICE], "users": [BOB],
             "rooms": {DEV: "general", TEAM: "team"}, **extra}
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]},
        "store": {"path": "corral.db"},
        "agents": {"demo": {"adapter": "demo", "delay": 0.01, "sandbox_write": [str(folder)]},
                   "meter": metered_agent(folder)},
        "bridges": {"sl": table},
        "defaults": {"agent": "demo"},
    }
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


def text(message: dict[str, Any]) -> str:
    return str(message.get("text", ""))


def has_button(message: dict[str, Any]) -> bool:
    return any(e.get("action_id") == STOP_ACTION for b in message.get("blocks") or [] for e in b.get("elements", []))


def humans(entries: list[Any]) -> list[str]:
    return [e.text for e in entries if e.author.startswith("human:")]


@dataclass
class World:
    api: FakeSlack
    app: FakeApp
    folder: Path

    @asynccontextmanager
    async def supervisor(self, **extra: Any) -> AsyncIterator[tuple[Supervisor, Config]]:
        config = slack_config(self.folder, self.api, self.app, **extra)
        async with open_supervisor(config) as sup:
            yield sup, config

    @asynccontextmanager
    async def bridge(self, sup: Supervisor, config: Config) -> AsyncIterator[Bridge]:
        async with trio.open_nursery() as nursery:
            bridge = await nursery.start(run_bridge, sup, config.bridges["sl"])
            try:
                yield bridge
            finally:
                nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def running(self, **extra: Any) -> AsyncIterator[tuple[Supervisor, Bridge]]:
        async with self.supervisor(**extra) as (sup, config), self.bridge(sup, config) as bridge:
            yield sup, bridge

    async def wait_for(self, channel: str, found: Callable[[dict[str, Any]], bool],
                       timeout: float = 60) -> dict[str, Any]:
        """The first of the bot's messages in ``channel`` (as it stands now) that ``found`` accepts."""
        with trio.move_on_after(timeout):
            while True:
                for message in self.app.sent(channel):
                    if found(message):
                        return message
                await trio.sleep(0.02)
        shows = [text(m) for m in self.app.sent(channel)]
        raise AssertionError(f"not shown in {timeout} s; the channel shows: {shows}")


@pytest.fixture
def world(slack_api: FakeSlack, short_tmp: Path) -> World:
    app = slack_api.app()
    for channel in (DEV, TEAM):
        app.channel(channel)
    return World(slack_api, app, short_tmp)


async def test_hello_runs_once_and_a_stranger_is_ignored(world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "corral.bridges")
    async with world.running() as (sup, _):
        world.app.say(DEV, MALLORY, "hello from mallory")
        said = world.app.say(DEV, ALICE, "hello &lt;there&gt;")
        reply = await world.wait_for(DEV, lambda m: "hello" in text(m).lower() and "demo" in text(m))
        entries = await sup.entries("general")
        assert [(e.author, e.text, e.meta.get("origin")) for e in entries if e.author.startswith("human:")] == [
            (f"human:{ALICE}", "hello <there>", f"sl:{DEV}:{said['ts']}")]
        assert "&lt;there&gt;" in text(reply)  # (as typed: escaped on its way back)
    assert f"{MALLORY} may not talk to agents" in caplog.text
    assert not [m for m in world.app.sent(DEV) if "mallory" in text(m).lower()]
    # Every envelope was acknowledged (the bot's own messages' too), each within Slack's 3 s.
    assert world.app.acked and not world.app.unacked
    assert max(world.app.acked[e] - world.app.delivered[e] for e in world.app.acked) < 3
    posts = [p for method, p, _ in world.app.calls if method == "chat.postMessage"]
    assert posts and all(p["mrkdwn"] is False and p["parse"] == "none" and p["link_names"] is False for p in posts)


async def test_an_agent_cannot_mention_anyone(world: World) -> None:
    async with world.running() as (sup, _):
        hostile = "ping <!channel> <!here> <@UALICE001> <https://evil.example|docs> @here & @everyone"
        await sup.send("general", hostile, author="human:cli")
        shown = await world.wait_for(DEV, lambda m: text(m).startswith("cli: ping"))
        assert text(shown) == ("cli: ping &lt;!channel&gt; &lt;!here&gt; &lt;@UALICE001&gt; "
                               "&lt;https://evil.example|docs&gt; @\u2060here &amp; @\u2060everyone")
        assert "<" not in text(shown) and ">" not in text(shown)
        # A turn's line of what it spent ends its status message, in plain text whatever its
        # CLI names its model; the Stop button goes with the turn's end.
        await sup.send("general", "count", to=["meter"])
        spent = await world.wait_for(DEV, lambda m: METERED_LINE in text(m))
        assert text(spent).startswith("⚙ Read: notes.txt\n" + METERED_LINE), spent
        assert text(spent).endswith(" s · " + neutral(METERED_MODEL)) and "<" not in text(spent), spent
        assert "\x03" not in text(spent) and not has_button(spent), spent
    assert incoming("hi <@UBOT0001> &amp; <https://a.b/c|a.b/c> &lt;x&gt;") == (
        "hi @UBOT0001 & https://a.b/c <x>", ("UBOT0001",))
    assert neutral("@Channel") == "@\u2060Channel"
    assert slash_text("stop") == "!stop" and slash_text("interrupt say hi") == "!interrupt say hi"
    parts = split_message("<" * 2500 + "\n" + "x" * 3000)
    assert [len(neutral(p)) <= 4000 for p in parts] == [True] * len(parts) and "".join(parts).count("<") == 2500


async def _stopped(world: World, channel: str) -> None:
    """"Stopping…", then the notice, last; no process left; the Stop button taken off."""
    ack = await world.wait_for(channel, lambda m: text(m) == STOPPING)
    notice = await world.wait_for(channel, lambda m: text(m).startswith(STOP_NOTICE))
    assert float(ack["ts"]) < float(notice["ts"])
    assert turn_processes() == []
    with trio.fail_after(30):
        while any(has_button(m) for m in world.app.sent(channel)):
            await trio.sleep(0.02)


async def test_stop_by_button_reaction_and_slash_command_acknowledged_with_the_notice_last(world: World) -> None:
    async with world.running() as (sup, _):
        world.app.say(DEV, BOB, "start a long task")
        status = await world.wait_for(DEV, lambda m: has_button(m) and "tool running" in text(m))
        press = world.app.press(DEV, BOB, status["ts"], STOP_ACTION)
        await _stopped(world, DEV)
        assert world.app.acked[press["envelope_id"]] - world.app.delivered[press["envelope_id"]] < 3
        sent = world.app.sent(DEV)
        notice = max(i for i, m in enumerate(sent) if text(m).startswith(STOP_NOTICE))
        assert not [m for m in sent[notice + 1:] if "tool running" in text(m)]
        # The same button again stops nothing more; :octagonal_sign: on the next turn's message does.
        world.app.press(DEV, BOB, status["ts"], STOP_ACTION)
        world.app.say(DEV, BOB, "start a long task again")
        status = await world.wait_for(DEV, lambda m: has_button(m) and "tool running" in text(m)
                                      and m["ts"] != status["ts"])
        world.app.react(DEV, BOB, status["ts"], "octagonal_sign")
        with trio.fail_after(60):
            while len([e for e in await sup.entries("general") if e.kind == "notice"]) < 2:
                await trio.sleep(0.05)
        assert turn_processes() == []
        # /corral stop, in another channel.
        world.app.say(TEAM, ALICE, "start a long task")
        await world.wait_for(TEAM, has_button)
        world.app.slash(TEAM, ALICE, "/corral", "stop")
        await _stopped(world, TEAM)


async def _shown(sup: Supervisor) -> None:
    """Until the bridge has recorded as posted every agent entry of the channel (a bridge
    cancelled between Slack's answer and that record posts it again: no idempotency key)."""
    with trio.fail_after(30):
        last = [e.seq for e in await sup.entries("general") if e.author == "agent:demo" and e.kind == "message"][-1]
        while int(await sup.cursor(f"bridge:sl:posted:{DEV}") or 0) < last:
            await trio.sleep(0.02)


async def test_a_redelivered_envelope_runs_once_and_a_dropped_socket_loses_nothing(world: World) -> None:
    async with world.supervisor() as (sup, config):
        async with world.bridge(sup, config):
            world.app.say(DEV, ALICE, "hello once")
            await world.wait_for(DEV, lambda m: "hello once" in text(m) and "conversation" in text(m))
            await _shown(sup)
            said = next(e for e in list(world.app.acked) if e)  # (the first envelope: the message)
        # Slack did not get the ack (the bridge died): the envelope comes again, twice.
        envelope = {"envelope_id": said, "type": "events_api", "retry_attempt": 0, "retry_reason": "",
                    "accepts_response_payload": False,
                    "payload": {"event_id": "EvAGAIN", "type": "event_callback",
                                "event": {"type": "message", "channel": DEV, "user": ALICE, "text": "hello once",
                                          "ts": world.app.messages[DEV][0]["ts"]}}}
        world.app.redeliver(envelope)
        world.app.redeliver(envelope)
        async with world.bridge(sup, config):
            world.app.drop_socket()
            world.app.say(DEV, ALICE, "hello after the drop")
            await world.wait_for(DEV, lambda m: "hello after the drop" in text(m) and "demo" in text(m))
            assert world.app.connections >= 3
        assert humans(await sup.entries("general")) == ["hello once", "hello after the drop"]
        # (the answer to "hello after the drop" quotes "hello once" as the conversation's last message)
        assert len([m for m in world.app.sent(DEV) if text(m).startswith("demo: You said: hello once")]) == 1


async def test_a_bridge_restarted_mid_draft_edits_its_message_into_the_saved_text(world: World) -> None:
    async with world.supervisor() as (sup, config):
        async with world.bridge(sup, config):
            world.app.say(DEV, ALICE, "stream 3")
            draft = await world.wait_for(DEV, lambda m: "Streaming line" in text(m))
            with trio.fail_after(30):
                while await sup.cursor(f"bridge:sl:draft:{DEV}") is None:
                    await trio.sleep(0.02)
        assert await sup.wait_idle("general", 60)
        saved = [e for e in await sup.entries("general") if e.kind == "message" and e.meta.get("draft")]
        assert saved
        async with world.bridge(sup, config):
            final = await world.wait_for(DEV, lambda m: m["ts"] == draft["ts"]
                                         and text(m).endswith(neutral(saved[-1].text)))
            assert final.get("edited")
        assert [m for m in world.app.sent(DEV) if "Streaming line" in text(m)] == [final]


async def test_429s_wait_their_retry_after_and_a_long_answer_arrives_whole(world: World) -> None:
    async with world.running() as (sup, _):
        world.app.fail("chat.postMessage", "429", retry_after=1, skip=1)  # (its second part: not sent twice)
        await sup.send("general", "x" * 9000, author="agent:demo")
        with trio.fail_after(30):
            while sum(text(m).count("x") for m in world.app.sent(DEV)) < 9000:
                await trio.sleep(0.02)
        parts = [m for m in world.app.sent(DEV) if "xxx" in text(m)]
        assert len(parts) == 3 and all(len(text(m)) <= 4000 for m in parts)
    [(_, _, limited_at)] = [f for f in world.app.faulted if f[0] == "chat.postMessage"]
    retried = [at for method, _, at in world.app.calls if method == "chat.postMessage" and at > limited_at]
    assert retried and retried[0] - limited_at >= 0.95


async def test_threads_hold_each_conversation_and_a_dropped_message_has_a_resend_button() -> None:
    """No network: the platform's posts captured. With ``threads = true`` an answer goes to the
    thread of the message it answers (a top-level message starts one), output to the newest."""
    from supervisor.bridges.core import Post, Reacted
    from supervisor.bridges.slack import RESEND_ACTION, SlackPlatform

    platform = SlackPlatform.__new__(SlackPlatform)
    platform.threads, platform.user_id = True, "UBOT"
    platform._seen, platform._thread, platform._thread_of = deque(maxlen=99), {}, {}
    platform._button, platform._progress = {}, {}
    calls: list[tuple[str, dict[str, Any]]] = []

    async def call(method: str, params: Any, *, token: str | None = None) -> dict[str, Any]:
        calls.append((method, dict(params)))
        return {"ok": True, "ts": f"9.{len(calls)}"}

    platform.call = call  # type: ignore[method-assign]

    def envelope(n: int, event: dict[str, Any]) -> dict[str, Any]:
        return {"envelope_id": f"e{n}", "type": "events_api", "payload": {"event_id": f"Ev{n}", "event": event}}

    said = {"type": "message", "channel": DEV, "user": ALICE}
    [top] = platform._envelope(envelope(1, {**said, "text": "a", "ts": "1.1"}))
    [reply] = platform._envelope(envelope(2, {"type": "message", "channel": DEV, "user": ALICE, "text": "b",
                                              "ts": "1.5", "thread_ts": "1.1"}))
    assert platform._envelope(envelope(2, {"type": "message"})) == []  # (the same envelope again)
    await platform.post(Post(DEV, "a1", "not run: x", notice=True, reply_to=top.event))
    await platform.post(Post(DEV, "c2", "output", agent=None))
    assert [p.get("thread_ts") for _, p in calls] == ["1.1", "1.1"] and reply.event == f"{DEV}:1.5"
    platform._envelope(envelope(3, {"type": "message", "channel": DEV, "user": ALICE, "text": "c", "ts": "2.0"}))
    await platform.post(Post(DEV, "c3", "output", agent=None))
    assert calls[-1][1]["thread_ts"] == "2.0"  # (a new top-level message: a thread of its own)
    calls.clear()
    await platform.post(Post(DEV, "n7", "UBOB: not run (stopped before it started):\n> hi\nReact 🔁 to send it again.",
                             notice=True))
    [(_, sent)] = calls
    assert [e["action_id"] for b in sent["blocks"] if b["type"] == "actions" for e in b["elements"]] == [RESEND_ACTION]
    pressed = platform._envelope({"envelope_id": "e9", "type": "interactive", "payload": {
        "type": "block_actions", "user": {"id": BOB}, "container": {"channel_id": DEV, "message_ts": "9.1"},
        "actions": [{"action_id": RESEND_ACTION, "action_ts": "3.3"}]}})
    assert pressed == [Reacted(DEV, f"b{DEV}:9.1:3.3", BOB, "🔁", f"{DEV}:9.1")]


async def test_a_refused_token_is_said_with_its_file(world: World) -> None:
    from supervisor.bridges.platform import Refused
    from supervisor.bridges.slack import SlackPlatform

    config = slack_config(world.folder, world.api, world.app)
    (world.folder / "slack-bot.token").write_text("xoxb-not-this-one\n")
    platform = SlackPlatform(config.bridges["sl"])
    try:
        with pytest.raises(Refused, match=r"slack-bot\.token is refused \(auth\.test: invalid_auth\)"):
            await platform.connect()
        (world.folder / "slack-bot.token").write_text(world.app.bot_token)
        (world.folder / "slack-app.token").write_text(world.app.bot_token)  # (a bot token where the app's goes)
        await platform.connect()
        with pytest.raises(Refused, match=r"slack-app\.token is refused \(apps\.connections\.open: "
                                          r"not_allowed_token_type\)"):
            async for _ in platform.events(None):
                pass
    finally:
        await platform.aclose()


async def test_a_quiet_socket_is_kept_by_its_pongs_and_a_dead_one_is_given_up(
    world: World, mock_clock: trio.testing.MockClock
) -> None:
    """Pings after 10 s of silence; a pong keeps a quiet connection; 20 s without a frame drops it."""
    from supervisor.bridges.platform import Transient
    from supervisor.bridges.slack import SlackPlatform

    mock_clock.autojump_threshold = 0.3  # (real seconds all tasks wait before the clock jumps: the fake answers first)
    platform = SlackPlatform(slack_config(world.folder, world.api, world.app).bridges["sl"])
    try:
        await platform.connect()
        events = platform.events(None)
        await events.__anext__()  # hello
        given_up: list[tuple[float, Exception]] = []

        async def read() -> None:
            try:
                await events.__anext__()
            except Transient as exc:
                given_up.append((trio.current_time(), exc))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.sleep(45)  # (virtual: quiet, its pings answered)
            assert world.app.pings >= 3 and world.app.connections == 1 and not given_up
            world.app.deaf = True
            deaf_at = trio.current_time()
        [(at, exc)] = given_up
        assert "nothing heard for 20 s" in str(exc) and at - deaf_at <= 30
        await events.aclose()
    finally:
        await platform.aclose()
