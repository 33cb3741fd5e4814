"""The Matrix bridge against a real Synapse, driven by a second real Matrix client as the human.

Synapse (``matrix-synapse`` from PyPI, pinned, in a virtualenv of its own under
``~/.cache/corral``) starts once per session on loopback with SQLite; users are registered
with ``register_new_matrix_user`` and the shared secret. Agents are the demo agent. Every
wait is for something the room shows, bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _matrix_human import Accounts, Human, body, bridge_table, is_text, messages, register_accounts
from scripts._synapse import Synapse
from conftest import KILL, METERED_LINE, METERED_MODEL, metered_agent, turn_processes

from supervisor import Config, Supervisor, open_supervisor, parse_config
from supervisor.bridges.core import STOP_REACTION
from supervisor.bridges.runner import Bridge, run_bridge
from supervisor.core.results import INTERRUPT_NOTICE
from supervisor.host.supervisor import STOP_NOTICE

pytestmark = pytest.mark.bridges


@pytest.fixture(scope="session")
def synapse() -> Iterator[Synapse]:
    server = Synapse()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def accounts(synapse: Synapse) -> Accounts:
    return register_accounts(synapse)


def bridge_config(folder: Path, bridge: dict[str, Any], agents: tuple[str, ...] = ("demo",)) -> Config:
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]},
        "store": {"path": "corral.db"},
        "agents": {**{name: {"adapter": "demo", "delay": 0.01, "sandbox_write": [str(folder)]} for name in agents},
                   "meter": metered_agent(folder)},
        "bridges": {"matrix": bridge},
        "defaults": {"agent": agents[0]},
    }
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


@dataclass
class World:
    synapse: Synapse
    accounts: Accounts
    folder: Path
    http: httpx.AsyncClient
    alice: Human
    room: str
    channel: str = "general"

    def human(self, who: str) -> Human:
        user, token = getattr(self.accounts, who)
        return Human(self.synapse.url, user, token, self.http)

    @asynccontextmanager
    async def running(self, agents: tuple[str, ...] = ("demo",), rooms: dict[str, str] | None = None,
                      **extra: Any) -> AsyncIterator[tuple[Supervisor, Bridge]]:
        table = bridge_table(self.folder, self.synapse, self.accounts, rooms or {self.room: self.channel},
                             agents=agents, **extra)
        config = bridge_config(self.folder, table, agents)
        async with open_supervisor(config) as sup, trio.open_nursery() as nursery:
            bridge = await nursery.start(run_bridge, sup, config.bridges["matrix"])
            try:
                yield sup, bridge
            finally:
                nursery.cancel_scope.cancel()


async def new_room(alice: Human, accounts: Accounts, **extra: Any) -> str:
    invite = [accounts.bot[0], accounts.demo[0], accounts.reviewer[0], accounts.bob[0], accounts.mallory[0]]
    room = await alice.create_room(invite, **extra)
    for who in ("bob", "mallory"):
        user, token = getattr(accounts, who)
        await Human(alice.url, user, token, alice.http).call("POST", f"/join/{room}", {})
    return room


@pytest.fixture
async def world(synapse: Synapse, accounts: Accounts, short_tmp: Path) -> AsyncIterator[World]:
    async with httpx.AsyncClient() as http:
        alice = Human(synapse.url, *accounts.alice, http)
        room = await new_room(alice, accounts)
        await alice.start()
        yield World(synapse, accounts, short_tmp, http, alice, room)


def notices(events: list[dict[str, Any]]) -> list[str]:
    return [body(e) for e in events if e.get("content", {}).get("msgtype") == "m.notice"]


async def test_hello_gets_a_reply_in_the_room_from_the_agents_own_user(world: World) -> None:
    async with world.running() as (sup, _):
        asked = await world.alice.say(world.room, "hello")
        reply = await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0]))
        assert "hello" in body(reply).lower()
        entries = await sup.entries(world.channel)
        human = [e for e in entries if e.author.startswith("human:")]
        assert [(e.author, e.text, e.meta.get("origin")) for e in human] == [
            (f"human:{world.accounts.alice[0]}", "hello", f"matrix:{asked}")
        ]
        # The agent's own message came back through the sync: it is not a message to anyone.
        assert not [e for e in entries if e.kind == "message" and e.author == f"human:{world.accounts.demo[0]}"]
        # A turn's line of what it spent ends its status notice (an edit, in plain text: no
        # formatted body; a notice, which notifies nobody, whatever its CLI names its model).
        await sup.send(world.channel, "count", to=["meter"])
        bot = world.accounts.bot[0]
        spent = await world.alice.wait_for(world.room, lambda e: is_text(e, bot, METERED_LINE))
        content = spent["content"].get("m.new_content") or spent["content"]
        assert content["msgtype"] == "m.notice" and "formatted_body" not in content and "format" not in content
        assert body(spent).startswith("⚙ Read: notes.txt\n" + METERED_LINE), spent
        assert body(spent).endswith(" s · " + METERED_MODEL), spent


async def _long_task(world: World, sup: Supervisor) -> dict[str, Any]:
    await world.alice.say(world.room, "start a long task")
    # The compact status notice of the turn says the tool runs.
    return await world.alice.wait_for(
        world.room, lambda e: e.get("sender") == world.accounts.bot[0] and "tool running" in body(e))


async def _stopped(world: World, sup: Supervisor, asked_at: float) -> tuple[float, float]:
    """Wait for the acknowledgement, then the notice; returns their delays from ``asked_at``."""
    bot = world.accounts.bot[0]
    ack = await world.alice.wait_for(world.room, lambda e: e.get("sender") == bot and body(e) == "Stopping…")
    ack_at = trio.current_time()
    notice = await world.alice.wait_for(
        world.room, lambda e: e.get("sender") == bot and body(e).startswith(STOP_NOTICE))
    notice_at = trio.current_time()
    events = world.alice.events[world.room]
    assert events.index(ack) < events.index(notice)
    assert turn_processes() == []
    return ack_at - asked_at, notice_at - asked_at


async def _nothing_after_the_notice(world: World) -> None:
    """A new message gets its reply; between the notice and it, nothing of the stopped turn."""
    await world.alice.say(world.room, "hello again")
    await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "hello again"))
    events = world.alice.events[world.room]
    notice = max(i for i, e in enumerate(events) if body(e).startswith(STOP_NOTICE))
    asked = max(i for i, e in enumerate(events) if body(e) == "hello again" and e["sender"] == world.alice.user)
    between = [e for e in events[notice + 1: asked] if e.get("type") == "m.room.message"]
    assert between == []


async def test_stop_command_is_acknowledged_at_once_then_the_notice_comes_last(world: World) -> None:
    async with world.running() as (sup, _):
        await _long_task(world, sup)
        asked_at = trio.current_time()
        await world.alice.say(world.room, "!stop")
        ack, notice = await _stopped(world, sup, asked_at)
        assert ack < 2.0  # (the figure: scripts/bench_bridge.py; here a bound a loaded machine keeps)
        await _nothing_after_the_notice(world)
        stops = [e for e in await sup.entries(world.channel) if e.kind == "notice"]
        assert [e.text for e in stops] == [STOP_NOTICE]


async def test_a_stop_reaction_on_the_running_turns_message_stops_it(world: World) -> None:
    async with world.running() as (sup, _):
        status = await _long_task(world, sup)
        asked_at = trio.current_time()
        await world.alice.react(world.room, status["event_id"], STOP_REACTION)
        await _stopped(world, sup, asked_at)
        await _nothing_after_the_notice(world)
        # The same reaction on the ended turn's message stops nothing more.
        await world.alice.react(world.room, status["event_id"], STOP_REACTION + "\ufe0f")
        await world.alice.say(world.room, "and hello")
        await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "and hello"))
        assert [e.text for e in await sup.entries(world.channel) if e.kind == "notice"] == [STOP_NOTICE]


async def test_a_dropped_message_is_named_back_and_a_reaction_sends_it_again(world: World) -> None:
    async with world.running() as (sup, _):
        await _long_task(world, sup)
        bob = world.human("bob")
        await bob.say(world.room, "then say hello to bob")
        await world.alice.wait_for(world.room, lambda e: is_text(e, bob.user, "then say hello"))
        await world.alice.say(world.room, "!stop")
        answer = await world.alice.wait_for(world.room, lambda e: "not run" in body(e) and bob.user in body(e))
        assert "> then say hello to bob" in body(answer)
        events = world.alice.events[world.room]
        assert events.index(answer) > max(i for i, e in enumerate(events) if body(e).startswith(STOP_NOTICE))
        # Only its sender (or an admin) may send it again: mallory's reaction does nothing.
        await world.human("mallory").react(world.room, answer["event_id"], "🔁")
        await bob.react(world.room, answer["event_id"], "🔁")
        reply = await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "say hello"))
        assert reply
        sent = [e for e in await sup.entries(world.channel) if e.kind == "message" and e.author == f"human:{bob.user}"]
        assert len(sent) == 2


async def test_a_mention_addresses_an_agent_and_its_hand_off_shows_as_both_agents_users(world: World) -> None:
    async with world.running(agents=("demo", "reviewer")) as (sup, _):
        reviewer = world.accounts.reviewer[0]
        await world.alice.say(world.room, f"{reviewer}: fix it, then ask demo to review it",
                              **{"m.mentions": {"user_ids": [reviewer]}})
        handoff = await world.alice.wait_for(world.room, lambda e: is_text(e, reviewer, "@demo"))
        assert "please review" in body(handoff)
        review = await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0]))
        assert review
        humans = [e for e in await sup.entries(world.channel) if e.author.startswith("human:")]
        assert len(humans) == 1 and humans[0].meta.get("to") is None and humans[0].meta["agent"] == "reviewer"


async def test_a_replayed_sync_and_a_restarted_bridge_run_nothing_twice(world: World) -> None:
    async with world.running() as (sup, bridge):
        token = await sup.cursor("bridge:matrix:since")
        await world.alice.say(world.room, "hello once")
        await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "hello once")
                                   and "m.new_content" in e["content"])  # (the saved text: the draft's final edit)
        # The bridge dies; its sync token is put back to before the message (a sync replayed).
        assert token is not None
    async with world.running() as (sup, bridge):
        await sup.save_cursor("bridge:matrix:since", token)
    async with world.running() as (sup, bridge):
        await world.alice.say(world.room, "hello twice")
        await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "hello twice"))
        # And the same events fed to it again, by hand, after it has run.
        async for batch in bridge.platform.events(token):
            for event in batch.events:
                await bridge.handle(event)
            break
        entries = await sup.entries(world.channel)
        assert [e.text for e in entries if e.author.startswith("human:")] == ["hello once", "hello twice"]
        replies = [e for e in entries if e.author == "agent:demo" and e.kind == "message"]
        assert len(replies) == 2
    # Nothing was posted twice either (the room's cursor and the transaction ids).
    assert len(messages(world.alice.events[world.room], world.accounts.demo[0])) == 2


async def test_synapse_restarted_mid_conversation_loses_and_repeats_nothing(world: World) -> None:
    async with world.running() as (sup, _):
        await world.alice.say(world.room, "hello before")
        await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "hello before"))
        await trio.to_thread.run_sync(world.synapse.restart)
        await world.alice.say(world.room, "hello after")
        await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "hello after"), 120)
        humans = [e.text for e in await sup.entries(world.channel) if e.author.startswith("human:")]
        assert humans == ["hello before", "hello after"]
    assert len(messages(world.alice.events[world.room], world.accounts.demo[0])) == 2


async def test_an_unauthorised_user_is_ignored_with_a_log_line(world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "corral.bridges")
    async with world.running() as (sup, _):
        mallory = world.human("mallory")
        await mallory.say(world.room, "hello from mallory")
        await world.alice.say(world.room, "hello from alice")
        await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "hello from alice"))
        await _long_task(world, sup)
        await mallory.say(world.room, "!stop")
        await world.alice.say(world.room, "!stop")
        await world.alice.wait_for(world.room, lambda e: body(e).startswith(STOP_NOTICE))
        humans = [e.text for e in await sup.entries(world.channel) if e.author.startswith("human:")]
        assert humans == ["hello from alice", "start a long task"]
        assert f"{mallory.user} may not talk to agents in {world.room}; ignored" in caplog.text
        assert f"{mallory.user} may not stop work in {world.room}; ignored" in caplog.text
        # Nobody answered mallory (an answer to a stranger is a reflector for spam).
        assert not [e for e in world.alice.events[world.room] if mallory.user in body(e)]
        # bob may talk, and stop his room's work, but not every channel's.
        bob = world.human("bob")
        await bob.say(world.room, "!stop all")
        await world.alice.say(world.room, "hello at last")
        await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0], "hello at last"))
        assert f"{bob.user} may not !stop all (admins only); ignored" in caplog.text


async def test_a_stop_from_the_dashboard_shows_in_the_room(world: World) -> None:
    async with world.running() as (sup, _):
        await _long_task(world, sup)
        result = await sup.stop(world.channel)  # (what the dashboard's Stop and `corral stop` call)
        assert result.ok and result.killed
        await world.alice.wait_for(world.room, lambda e: body(e).startswith(STOP_NOTICE))
        assert turn_processes() == []


async def test_rate_limits_are_honoured_and_nothing_is_lost_or_repeated(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "corral.bridges")
    demo = world.accounts.demo[0]
    # Synapse's own limiter for the agent's user: one message, then one a second.
    admin = httpx.URL(f"{world.synapse.url}/_synapse/admin/v1/users/{demo}/override_ratelimit")
    reply = await world.http.post(admin, json={"messages_per_second": 1, "burst_count": 1},
                                  headers={"Authorization": f"Bearer {world.accounts.alice[1]}"})
    reply.raise_for_status()
    try:
        async with world.running() as (sup, _):
            for n in range(3):
                await world.alice.say(world.room, f"hello number {n}")
            for n in range(3):
                await world.alice.wait_for(world.room, lambda e, n=n: is_text(e, demo, f"hello number {n}"))
        assert "rate limited (M_LIMIT_EXCEEDED)" in caplog.text
        events = world.alice.events[world.room]
        replies = messages(events, demo)
        assert len(replies) == 3
        for n, reply in enumerate(replies):  # each in order, its final text its own (edits included)
            final = [body(e) for e in events if e.get("sender") == demo and (
                e["event_id"] == reply["event_id"]
                or e["content"].get("m.relates_to", {}).get("event_id") == reply["event_id"])][-1]
            assert f"number {n}" in final
    finally:
        await world.http.delete(admin, headers={"Authorization": f"Bearer {world.accounts.alice[1]}"})


async def test_html_malformed_events_and_lone_surrogates_get_a_clear_result(world: World) -> None:
    async with world.running() as (sup, bridge):
        room, bot = world.room, world.accounts.bot[0]
        # HTML: the plain body is the prompt; the formatted body is never read or sent back.
        await world.alice.say(room, "hello <b>there</b>", format="org.matrix.custom.html",
                              formatted_body="<script>alert(1)</script>")
        reply = await world.alice.wait_for(room, lambda e: is_text(e, world.accounts.demo[0]))
        assert "<b>there</b>" in body(reply) and "formatted_body" not in reply["content"]
        # A lone surrogate (valid JSON, not valid Unicode): Synapse itself refuses to store one
        # (500), so it is handed to the bridge as a sync would carry it; refused with the reason.
        raw = json.loads(b'{"type": "m.room.message", "sender": "%s", "event_id": "$surrogate",'
                         b' "content": {"msgtype": "m.text", "body": "hi \\ud800 there"}}' % world.alice.user.encode())
        event = bridge.platform._event(room, raw)  # type: ignore[attr-defined]
        assert event is not None and "\ud800" in event.text
        await bridge.handle(event)
        refused = await world.alice.wait_for(room, lambda e: e["sender"] == bot and "lone surrogate" in body(e))
        assert body(refused).startswith("not run:")
        # No body, a body that is not text, an image.
        raw["event_id"], raw["content"] = "$nobody", {"msgtype": "m.text", "body": 42}  # (Synapse refuses it: 400)
        event = bridge.platform._event(room, raw)  # type: ignore[attr-defined]
        assert event is not None
        await bridge.handle(event)
        await world.alice.wait_for(room, lambda e: e["sender"] == bot and "has no text body" in body(e))
        await world.alice.send_raw(room, "m.room.message", json.dumps({"msgtype": "m.image", "body": "x.png",
                                                                        "url": "mxc://x/y"}).encode())
        await world.alice.wait_for(room, lambda e: e["sender"] == bot and "not m.image" in body(e))
        humans = [e.text for e in await sup.entries(world.channel) if e.author.startswith("human:")]
        assert humans == ["hello <b>there</b>"]


async def test_an_encrypted_room_is_refused_with_a_clear_log_line(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "corral.bridges")
    encrypted = await new_room(world.alice, world.accounts, initial_state=[
        {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}])
    async with world.running(rooms={world.room: "general", encrypted: "secret"}) as (sup, bridge):
        assert set(bridge.rooms) == {world.room}
        assert f"{encrypted} is end-to-end encrypted" in caplog.text


async def test_an_invitation_from_an_allowed_user_makes_a_channel_and_a_strangers_does_not(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "corral.bridges")
    async with world.running(invites=True) as (sup, bridge):
        mallory = world.human("mallory")
        theirs = await mallory.create_room([world.accounts.bot[0]])
        ours = await world.alice.create_room([world.accounts.bot[0], world.accounts.demo[0]])
        await world.alice.say(ours, "hello new room")  # (before the bridge joins: not replayed into it)
        with trio.fail_after(60):
            while ours not in bridge.rooms:
                await world.alice.sync(1000)
        await world.alice.say(ours, "hello in the new room")
        await world.alice.wait_for(ours, lambda e: is_text(e, world.accounts.demo[0], "new room"))
        assert theirs not in bridge.rooms
        assert f"{mallory.user} may not talk to agents; ignored the invitation to {theirs}" in caplog.text
        humans = [e.text for e in await sup.entries(f"matrix/{ours}") if e.author.startswith("human:")]
        assert humans == ["hello in the new room"]


async def test_live_output_is_one_message_edited_at_most_once_a_second_and_the_saved_text_is_the_final_edit(
    world: World,
) -> None:
    demo = world.accounts.demo[0]
    async with world.running() as (sup, bridge):
        await world.alice.say(world.room, "stream 4")
        saved = None
        with trio.fail_after(60):
            async for entry in sup.follow(world.channel):
                if entry.kind == "message" and entry.meta.get("draft"):
                    saved = entry
                    break
        assert saved is not None and "Streaming line" in saved.text
        final = await world.alice.wait_for(world.room, lambda e: e.get("sender") == demo
                                           and "m.new_content" in e["content"] and body(e) == saved.text)
        events = [e for e in world.alice.events[world.room] if e.get("sender") == demo]
        first = next(e for e in events if e["event_id"] == final["content"]["m.relates_to"]["event_id"])
        assert "m.new_content" not in first["content"] and "Streaming line 0" in body(first)
        edits = [e for e in events if e["content"].get("m.relates_to", {}).get("event_id") == first["event_id"]]
        assert all(e["content"]["m.relates_to"]["rel_type"] == "m.replace" for e in edits)
        assert edits[-1] is final and len(edits) >= 2
        # At most about one edit a second (the final one is due at once).
        stamps = [first["origin_server_ts"], *(e["origin_server_ts"] for e in edits[:-1])]
        assert all(b - a >= 900 for a, b in zip(stamps, stamps[1:], strict=False)), stamps
        # No second message for the saved text: the draft's message became it.
        assert not [e for e in events if body(e) == saved.text and "m.new_content" not in e["content"]]


async def test_interrupt_from_the_room_replaces_the_turn_and_names_back_what_it_dropped(world: World) -> None:
    async with world.running() as (sup, _):
        await _long_task(world, sup)
        bob = world.human("bob")
        await bob.say(world.room, "then say hello to bob")
        await world.alice.wait_for(world.room, lambda e: is_text(e, bob.user, "then say hello"))
        await world.alice.say(world.room, "!interrupt just say hi instead")
        notice = await world.alice.wait_for(world.room, lambda e: body(e).startswith(INTERRUPT_NOTICE))
        answer = await world.alice.wait_for(world.room, lambda e: is_text(e, world.accounts.demo[0],
                                                                           "You said: just say hi instead"))
        named = await world.alice.wait_for(world.room, lambda e: "not run" in body(e) and bob.user in body(e))
        events = world.alice.events[world.room]
        assert events.index(notice) < events.index(answer) and "> then say hello to bob" in body(named)
        entries = await sup.entries(world.channel)
        interrupted = next(e for e in entries if e.kind == "notice").turn
        assert interrupted is not None and turn_processes([interrupted]) == []
        assert [e.kind for e in entries if e.turn == interrupted][-1] == "notice"
