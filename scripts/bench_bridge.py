#!/usr/bin/env python
"""What the Matrix bridge costs: a chat message to its turn, a chat ``!stop`` to its
acknowledgement and to its notice in the room, and the messages per second one bridge takes in.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_bridge`` (``--rounds N``,
default 20; ``--burst N``, default 200). It starts a real Synapse (the tests' pinned one, from
``~/.cache/corral``; made on first use), an embedded supervisor with the demo agent, and the
bridge; a second Matrix client (plain httpx) is the human. Each figure is printed beside its
floor measured in the same run, rounds alternating:

* **message → turn started**: from the human's send to the turn's first entry, against the
  same message given to ``Supervisor.send`` directly.
* **!stop → acknowledgement / → notice in the room** (as the human's sync sees them), against
  the daemon's own stop (``Supervisor.stop`` of the same kind of turn, its ``elapsed_ms``), and
  the acknowledgement against two hops of the homeserver (one hop: a message from a second
  client seen by the human; the acknowledgement is two: the command in, "Stopping…" out).
* **messages per second**: a burst of messages sent by the human (20 at a time), until the
  bridge has accepted the last, against ``Supervisor.send`` of as many messages, and against
  the homeserver's own rate (the same burst's sends to a room without the bridge); and the
  bridge's own capacity (1 / the time it spends deciding and accepting one message).

``--platform telegram``: the Telegram bridge against the tests' fake Bot API server
(``scripts/_telegram.py``, a thread on loopback that answers at once and wakes a pending long
poll the moment an update comes), so the figures are the bridge's own share: a chat message
→ its turn's first entry (against ``Supervisor.send``), and ``/stop`` → "Stopping…" /
→ the notice as the server receives them (against the daemon's own stop), and the bridge's
own part of the acknowledgement (the update read off ``getUpdates`` → "Stopping…" sent).

``--platform slack``: the Slack bridge against the tests' fake Slack (``scripts/_slack.py``: the
Web API and a Socket Mode WebSocket on loopback, an envelope sent the moment it is made), the
same figures with ``!stop``: the bridge's own part is the envelope read off the socket →
"Stopping…" posted (``chat.postMessage`` received).

``--platform discord``: the Discord bridge against the tests' fake Discord (``scripts/_discord.py``:
REST and the Gateway on loopback, answering at once): a chat message → its turn's first entry,
and a press of the **Stop button** → the press answered (Discord allows 3 s) / → "Stopping…"
/ → the notice as the server receives them, and the bridge's own part (the interaction read
off the Gateway → "Stopping…" sent).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from typing import Any
from urllib.parse import quote

import httpx
import trio

from scripts._bench import pct, short_tmp
from scripts._discord import FakeDiscord
from scripts._slack import FakeSlack
from scripts._synapse import Synapse
from scripts._telegram import FakeBotApi
from supervisor import Supervisor, open_supervisor
from supervisor.bridges.runner import run_bridge
from supervisor.config.settings import parse_config
from supervisor.host.supervisor import STOP_NOTICE


class Human:
    def __init__(self, url: str, token: str, http: httpx.AsyncClient) -> None:
        self.url, self.token, self.http = url, token, http
        self.since: str | None = None

    async def call(self, method: str, path: str, body: Any = None, params: Any = None) -> Any:
        reply = await self.http.request(method, f"{self.url}/_matrix/client/v3{path}", json=body, params=params,
                                        headers={"Authorization": f"Bearer {self.token}"}, timeout=60)
        reply.raise_for_status()
        return reply.json()

    async def say(self, room: str, text: str) -> None:
        await self.call("PUT", f"/rooms/{quote(room, safe='')}/send/m.room.message/{secrets.token_hex(8)}",
                        {"msgtype": "m.text", "body": text})

    async def sync(self) -> list[dict[str, Any]]:
        params = {"timeout": "10000", "filter": '{"room": {"timeline": {"limit": 1000}}}',
                  **({"since": self.since} if self.since else {})}
        data = await self.call("GET", "/sync", params=params)
        self.since = data["next_batch"]
        return [e for joined in data.get("rooms", {}).get("join", {}).values()
                for e in joined.get("timeline", {}).get("events", [])]

    async def until(self, test: Any) -> float:
        with trio.fail_after(60):
            while True:
                for event in await self.sync():
                    if test(event):
                        return trio.current_time()


def _body(event: dict[str, Any]) -> str:
    return str(event.get("content", {}).get("body", ""))


async def first_entry_of_a_turn(sup: Supervisor, channel: str, after: int) -> float:
    async for entry in sup.follow(channel, after=after):
        if entry.turn is not None and entry.author.startswith("agent:"):
            return trio.current_time()
    raise AssertionError("unreachable")


async def bench(rounds: int, burst: int) -> None:
    folder = short_tmp("corral-bb-")
    synapse = await trio.to_thread.run_sync(Synapse)
    try:
        bot = await trio.to_thread.run_sync(synapse.register, "bot")
        demo = await trio.to_thread.run_sync(synapse.register, "demo")
        alice = await trio.to_thread.run_sync(synapse.register, "alice")
        carol = await trio.to_thread.run_sync(synapse.register, "carol")
        for name, (_, token) in (("bot", bot), ("demo", demo)):
            (folder / f"{name}.token").write_text(token)
        async with httpx.AsyncClient() as http:
            human = Human(synapse.url, alice[1], http)
            room = (await human.call("POST", "/createRoom", {"invite": [bot[0], demo[0], carol[0]]}))["room_id"]
            other = Human(synapse.url, carol[1], http)
            await other.call("POST", f"/join/{quote(room, safe='')}", {})
            await human.sync()
            data = {
                "server": {"socket": "corral.sock"}, "store": {"path": "corral.db"},
                "defaults": {"stop_grace": 2},
                "agents": {"demo": {"adapter": "demo", "delay": 0.01}},
                "bridges": {"matrix": {
                    "type": "matrix", "homeserver": synapse.url, "user": bot[0],
                    "token_file": str(folder / "bot.token"), "admins": [alice[0]], "rooms": {room: "chat"},
                    "agents": {"demo": {"user": demo[0], "token_file": str(folder / "demo.token")}},
                }},
            }
            config = parse_config(data, file=str(folder / "corral.toml"), base=folder)
            async with open_supervisor(config) as sup, trio.open_nursery() as nursery:
                bridge = await nursery.start(run_bridge, sup, config.bridges["matrix"])
                # The bridge's own share of an acknowledgement: from the !stop read off the sync to
                # "Stopping…" posted (the homeserver's answer to the PUT).
                received: list[float] = []
                posted: list[float] = []
                handle, post = bridge.handle, bridge.platform.post

                handling: list[float] = []

                async def timed_handle(event: Any) -> Any:
                    text = getattr(event, "text", None)
                    if text == "!stop":
                        received.append(trio.current_time())
                    t0 = time.perf_counter()
                    try:
                        return await handle(event)
                    finally:
                        if isinstance(text, str) and text.startswith("burst "):
                            handling.append(time.perf_counter() - t0)

                async def timed_post(op: Any) -> str:
                    event: str = await post(op)
                    if op.text == "Stopping…":
                        posted.append(trio.current_time())
                    return event

                bridge.handle = timed_handle
                bridge.platform.post = timed_post
                started: dict[str, list[float]] = {"bridge": [], "floor": []}
                ack: list[float] = []
                notice: list[float] = []
                floor_stop: list[float] = []
                hop: list[float] = []
                for n in range(rounds):
                    # one hop: a message from one Matrix client seen by another (the homeserver's floor)
                    t0 = trio.current_time()
                    await other.say(room, f"hop {n}")
                    hop.append((await human.until(lambda e, n=n: _body(e) == f"hop {n}") - t0) * 1000)
                    # message → turn started, through the room and directly
                    after = await sup.last_seq()
                    t0 = trio.current_time()
                    await human.say(room, f"hello {n}")
                    started["bridge"].append((await first_entry_of_a_turn(sup, "chat", after) - t0) * 1000)
                    await sup.wait_idle("chat", 60)
                    after = await sup.last_seq()
                    t0 = trio.current_time()
                    await sup.send("direct", f"hello {n}")
                    started["floor"].append((await first_entry_of_a_turn(sup, "direct", after) - t0) * 1000)
                    await sup.wait_idle("direct", 60)
                    # !stop in the room, and the daemon's own stop
                    after = await sup.last_seq()
                    await human.say(room, f"long task {n}")
                    await first_entry_of_a_turn(sup, "chat", after)
                    t0 = trio.current_time()
                    await human.say(room, "!stop")
                    ack.append((await human.until(lambda e: _body(e) == "Stopping…") - t0) * 1000)
                    notice.append((await human.until(lambda e: _body(e).startswith(STOP_NOTICE)) - t0) * 1000)
                    await sup.wait_idle("chat", 60)
                    after = await sup.last_seq()
                    await sup.send("direct", f"long task {n}")
                    await first_entry_of_a_turn(sup, "direct", after)
                    result = await sup.stop("direct")
                    floor_stop.append(result.elapsed_ms)
                # messages per second: a burst through the room, then as many directly
                def burst_in(entries: list[Any]) -> int:
                    return sum(1 for e in entries if e.author.startswith("human:") and e.text.startswith("burst "))

                t0 = time.perf_counter()
                async with trio.open_nursery() as senders:  # (20 at a time: the human is not the bottleneck)
                    limit = trio.Semaphore(20)
                    for n in range(burst):
                        async def one(n: int = n) -> None:
                            async with limit:
                                await human.say(room, f"burst {n}")
                        senders.start_soon(one)
                with trio.fail_after(120):
                    while burst_in(await sup.entries("chat")) < burst:
                        await trio.sleep(0.05)  # (polling the store: the bench's own loop, not the bridge's)
                bridge_rate = burst / (time.perf_counter() - t0)
                await sup.stop("chat")
                # The homeserver's own floor: as many messages, as sent, seen by a second client
                # in a room without the bridge.
                quiet = (await other.call("POST", "/createRoom", {"invite": [alice[0]]}))["room_id"]
                await human.call("POST", f"/join/{quote(quiet, safe='')}", {})
                t0 = time.perf_counter()
                async with trio.open_nursery() as senders:
                    limit = trio.Semaphore(20)
                    for n in range(burst):
                        async def hop_one(n: int = n) -> None:
                            async with limit:
                                await other.say(quiet, f"hop burst {n}")
                        senders.start_soon(hop_one)
                hop_rate = burst / (time.perf_counter() - t0)  # (sent: a sync shows at most 100 at once)
                t0 = time.perf_counter()
                for n in range(burst):
                    await sup.send("direct2", f"burst {n}")
                floor_rate = burst / (time.perf_counter() - t0)
                await sup.stop("direct2")
                nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(synapse.close)

    def row(name: str, values: list[float], floor: list[float]) -> None:
        m, f = statistics.median(values), statistics.median(floor)
        print(f"{name:<44} median {m:8.1f} ms  p95 {pct(values, 0.95):8.1f} ms   floor median {f:7.1f} ms"
              f"  p95 {pct(floor, 0.95):7.1f} ms   ratio {m / f:5.2f} x")

    print(f"bench_bridge: {rounds} rounds, burst of {burst}, Synapse on loopback, demo agent")
    row("chat message -> turn started", started["bridge"], started["floor"])
    row("one hop: a client's message seen by another", hop, hop)
    row("!stop -> 'Stopping…' in the room (vs 2 hops)", ack, [2 * h for h in hop])
    row("!stop -> 'Stopping…' in the room", ack, floor_stop)
    row("!stop -> notice in the room", notice, floor_stop)
    own = [(b - a) * 1000 for a, b in zip(received, posted, strict=False)]
    row("  of which the bridge: read -> 'Stopping…' posted", own, floor_stop)
    print(f"{'messages per second one bridge takes in':<44} {bridge_rate:8.1f} /s   floor (Supervisor.send) "
          f"{floor_rate:8.1f} /s   ratio {bridge_rate / floor_rate:5.2f} x")
    print(f"{'  against the homeserver (the same PUTs, no bridge)':<44} {bridge_rate:8.1f} /s   floor "
          f"{hop_rate:8.1f} /s   ratio {bridge_rate / hop_rate:5.2f} x")
    capacity = len(handling) / sum(handling)
    print(f"{'  the bridge alone (1 / its time per message)':<44} {capacity:8.1f} /s   floor (Supervisor.send) "
          f"{floor_rate:8.1f} /s   ratio {capacity / floor_rate:5.2f} x")


def _sent_at(calls: list[tuple[str, dict[str, Any], float]], after: float, test: Any) -> float:
    """When the fake server received the first sendMessage since ``after`` whose text passes ``test``."""
    return next(at for method, params, at in calls
                if at >= after and method == "sendMessage" and test(str(params.get("text", ""))))


async def bench_telegram(rounds: int) -> None:
    folder = short_tmp("corral-bt-")
    api = FakeBotApi()
    try:
        bot = api.bot()
        chat = 101
        alice = {"id": 101, "is_bot": False, "first_name": "Alice"}
        bot.chat(chat)
        (folder / "telegram.token").write_text(bot.token)
        data = {
            "server": {"socket": "corral.sock"}, "store": {"path": "corral.db"},
            "defaults": {"stop_grace": 2},
            "agents": {"demo": {"adapter": "demo", "delay": 0.01}},
            "bridges": {"tg": {"type": "telegram", "api_url": api.url, "token_file": str(folder / "telegram.token"),
                               "admins": ["101"], "rooms": {str(chat): "chat"}}},
        }
        config = parse_config(data, file=str(folder / "corral.toml"), base=folder)
        async with open_supervisor(config) as sup, trio.open_nursery() as nursery:
            bridge = await nursery.start(run_bridge, sup, config.bridges["tg"])
            received: list[float] = []
            handle = bridge.handle

            async def timed_handle(event: Any) -> Any:
                if getattr(event, "text", None) == "!stop":
                    received.append(time.monotonic())
                return await handle(event)

            bridge.handle = timed_handle
            started: dict[str, list[float]] = {"bridge": [], "floor": []}
            ack: list[float] = []
            notice: list[float] = []
            own: list[float] = []
            floor_stop: list[float] = []
            for n in range(rounds):
                after = await sup.last_seq()
                t0 = trio.current_time()
                bot.say(chat, alice, f"hello {n}")
                started["bridge"].append((await first_entry_of_a_turn(sup, "chat", after) - t0) * 1000)
                await sup.wait_idle("chat", 60)
                after = await sup.last_seq()
                t0 = trio.current_time()
                await sup.send("direct", f"hello {n}")
                started["floor"].append((await first_entry_of_a_turn(sup, "direct", after) - t0) * 1000)
                await sup.wait_idle("direct", 60)
                after = await sup.last_seq()
                bot.say(chat, alice, f"long task {n}")
                await first_entry_of_a_turn(sup, "chat", after)
                asked = time.monotonic()
                bot.say(chat, alice, "/stop")
                with trio.fail_after(60):
                    while not [e for e in await sup.entries("chat", after=after) if e.kind == "notice"]:
                        await trio.sleep(0.01)
                    while True:  # (the notice reaches the server after it is stored)
                        try:
                            noticed = _sent_at(bot.calls, asked, lambda t: t.startswith(STOP_NOTICE))
                            break
                        except StopIteration:
                            await trio.sleep(0.01)
                acked = _sent_at(bot.calls, asked, lambda t: t == "Stopping…")
                ack.append((acked - asked) * 1000)
                notice.append((noticed - asked) * 1000)
                own.append((acked - received[-1]) * 1000)
                await sup.wait_idle("chat", 60)
                after = await sup.last_seq()
                await sup.send("direct", f"long task {n}")
                await first_entry_of_a_turn(sup, "direct", after)
                result = await sup.stop("direct")
                floor_stop.append(result.elapsed_ms)
            nursery.cancel_scope.cancel()
    finally:
        api.close()

    def row(name: str, values: list[float], floor: list[float]) -> None:
        m, f = statistics.median(values), statistics.median(floor)
        print(f"{name:<44} median {m:8.1f} ms  p95 {pct(values, 0.95):8.1f} ms   floor median {f:7.1f} ms"
              f"  p95 {pct(floor, 0.95):7.1f} ms   ratio {m / f:5.2f} x")

    print(f"bench_bridge --platform telegram: {rounds} rounds, the fake Bot API on loopback, demo agent")
    row("chat message -> turn started", started["bridge"], started["floor"])
    row("/stop -> 'Stopping…' at the server", ack, floor_stop)
    row("/stop -> notice at the server", notice, floor_stop)
    row("  of which the bridge: read -> 'Stopping…' sent", own, floor_stop)


def _posted_at(calls: list[tuple[str, str, Any, float]], after: float, test: Any) -> float:
    """When the fake Discord received the first message post since ``after`` whose content passes ``test``."""
    return next(at for method, path, body, at in calls if at >= after and method == "POST"
                and path.endswith("/messages") and test(str((body or {}).get("content", ""))))


async def bench_discord(rounds: int) -> None:
    from supervisor.bridges.discord import STOP_ID

    folder = short_tmp("corral-bd-")
    api = FakeDiscord()
    try:
        bot = api.bot()
        channel = bot.channel()
        alice = {"id": "1000000000000000001", "username": "alice", "discriminator": "0", "avatar": None}
        (folder / "discord.token").write_text(bot.token)
        data = {
            "server": {"socket": "corral.sock"}, "store": {"path": "corral.db"},
            "defaults": {"stop_grace": 2},
            "agents": {"demo": {"adapter": "demo", "delay": 0.01}},
            "bridges": {"dc": {"type": "discord", "api_url": api.url, "token_file": str(folder / "discord.token"),
                               "admins": [alice["id"]], "rooms": {channel: "chat"}}},
        }
        config = parse_config(data, file=str(folder / "corral.toml"), base=folder)
        async with open_supervisor(config) as sup, trio.open_nursery() as nursery:
            bridge = await nursery.start(run_bridge, sup, config.bridges["dc"])
            received: list[float] = []
            handle = bridge.handle

            async def timed_handle(event: Any) -> Any:
                if getattr(event, "event", "").startswith("i"):  # (a button press)
                    received.append(time.monotonic())
                return await handle(event)

            bridge.handle = timed_handle
            started: dict[str, list[float]] = {"bridge": [], "floor": []}
            answered: list[float] = []
            ack: list[float] = []
            notice: list[float] = []
            own: list[float] = []
            floor_stop: list[float] = []
            for n in range(rounds):
                after = await sup.last_seq()
                t0 = trio.current_time()
                bot.say(channel, alice, f"hello {n}")
                started["bridge"].append((await first_entry_of_a_turn(sup, "chat", after) - t0) * 1000)
                await sup.wait_idle("chat", 60)
                after = await sup.last_seq()
                t0 = trio.current_time()
                await sup.send("direct", f"hello {n}")
                started["floor"].append((await first_entry_of_a_turn(sup, "direct", after) - t0) * 1000)
                await sup.wait_idle("direct", 60)
                after = await sup.last_seq()
                bot.say(channel, alice, f"long task {n}")
                with trio.fail_after(60):
                    while True:
                        shown = [m for m in bot.sent(channel) if any(
                            c.get("custom_id") == STOP_ID for row in m.get("components") or []
                            for c in row["components"])]
                        if shown:
                            break
                        await trio.sleep(0.005)
                asked = time.monotonic()
                press = bot.press(channel, alice, shown[-1]["id"], STOP_ID)
                with trio.fail_after(60):
                    while not [e for e in await sup.entries("chat", after=after) if e.kind == "notice"]:
                        await trio.sleep(0.01)
                    while True:  # (the notice reaches the server after it is stored)
                        try:
                            noticed = _posted_at(bot.calls, asked, lambda t: t.startswith(STOP_NOTICE))
                            break
                        except StopIteration:
                            await trio.sleep(0.01)
                answered.append((bot.answered[press][1] - asked) * 1000)
                acked = _posted_at(bot.calls, asked, lambda t: t == "Stopping…")
                ack.append((acked - asked) * 1000)
                notice.append((noticed - asked) * 1000)
                own.append((acked - received[-1]) * 1000)
                await sup.wait_idle("chat", 60)
                after = await sup.last_seq()
                await sup.send("direct", f"long task {n}")
                await first_entry_of_a_turn(sup, "direct", after)
                result = await sup.stop("direct")
                floor_stop.append(result.elapsed_ms)
            nursery.cancel_scope.cancel()
    finally:
        api.close()

    def row(name: str, values: list[float], floor: list[float]) -> None:
        m, f = statistics.median(values), statistics.median(floor)
        print(f"{name:<44} median {m:8.1f} ms  p95 {pct(values, 0.95):8.1f} ms   floor median {f:7.1f} ms"
              f"  p95 {pct(floor, 0.95):7.1f} ms   ratio {m / f:5.2f} x")

    print(f"bench_bridge --platform discord: {rounds} rounds, the fake Discord on loopback, demo agent")
    row("chat message -> turn started", started["bridge"], started["floor"])
    row("Stop pressed -> press answered", answered, floor_stop)
    row("Stop pressed -> 'Stopping…' at the server", ack, floor_stop)
    row("Stop pressed -> notice at the server", notice, floor_stop)
    row("  of which the bridge: read -> 'Stopping…' sent", own, floor_stop)


def _slack_posted_at(calls: list[tuple[str, dict[str, Any], float]], after: float, test: Any) -> float:
    """When the fake Slack received the first chat.postMessage since ``after`` whose text passes ``test``."""
    return next(at for method, params, at in calls
                if at >= after and method == "chat.postMessage" and test(str(params.get("text", ""))))


async def bench_slack(rounds: int) -> None:
    from supervisor.bridges.slack import neutral

    folder = short_tmp("corral-bs-")
    api = FakeSlack()
    try:
        app = api.app()
        channel, alice = "C0BENCH01", "UALICE001"
        app.channel(channel)
        (folder / "bot.token").write_text(app.bot_token)
        (folder / "app.token").write_text(app.app_token)
        data = {
            "server": {"socket": "corral.sock"}, "store": {"path": "corral.db"},
            "defaults": {"stop_grace": 2},
            "agents": {"demo": {"adapter": "demo", "delay": 0.01}},
            "bridges": {"sl": {"type": "slack", "api_url": f"{api.url}/api", "admins": [alice],
                               "bot_token_file": str(folder / "bot.token"), "app_token_file": str(folder / "app.token"),
                               "rooms": {channel: "chat"}}},
        }
        config = parse_config(data, file=str(folder / "corral.toml"), base=folder)
        notice_text = neutral(STOP_NOTICE)
        async with open_supervisor(config) as sup, trio.open_nursery() as nursery:
            bridge = await nursery.start(run_bridge, sup, config.bridges["sl"])
            received: list[float] = []
            handle = bridge.handle

            async def timed_handle(event: Any) -> Any:
                if getattr(event, "text", None) == "!stop":
                    received.append(time.monotonic())
                return await handle(event)

            bridge.handle = timed_handle
            started: dict[str, list[float]] = {"bridge": [], "floor": []}
            ack: list[float] = []
            notice: list[float] = []
            own: list[float] = []
            floor_stop: list[float] = []
            for n in range(rounds):
                after = await sup.last_seq()
                t0 = trio.current_time()
                app.say(channel, alice, f"hello {n}")
                started["bridge"].append((await first_entry_of_a_turn(sup, "chat", after) - t0) * 1000)
                await sup.wait_idle("chat", 60)
                after = await sup.last_seq()
                t0 = trio.current_time()
                await sup.send("direct", f"hello {n}")
                started["floor"].append((await first_entry_of_a_turn(sup, "direct", after) - t0) * 1000)
                await sup.wait_idle("direct", 60)
                after = await sup.last_seq()
                app.say(channel, alice, f"long task {n}")
                await first_entry_of_a_turn(sup, "chat", after)
                asked = time.monotonic()
                app.say(channel, alice, "!stop")
                with trio.fail_after(60):
                    while not [e for e in await sup.entries("chat", after=after) if e.kind == "notice"]:
                        await trio.sleep(0.01)
                    while True:  # (the notice reaches the server after it is stored)
                        try:
                            noticed = _slack_posted_at(app.calls, asked, lambda t: t.startswith(notice_text))
                            break
                        except StopIteration:
                            await trio.sleep(0.01)
                acked = _slack_posted_at(app.calls, asked, lambda t: t == "Stopping…")
                ack.append((acked - asked) * 1000)
                notice.append((noticed - asked) * 1000)
                own.append((acked - received[-1]) * 1000)
                await sup.wait_idle("chat", 60)
                after = await sup.last_seq()
                await sup.send("direct", f"long task {n}")
                await first_entry_of_a_turn(sup, "direct", after)
                result = await sup.stop("direct")
                floor_stop.append(result.elapsed_ms)
            nursery.cancel_scope.cancel()
    finally:
        api.close()

    def row(name: str, values: list[float], floor: list[float]) -> None:
        m, f = statistics.median(values), statistics.median(floor)
        print(f"{name:<44} median {m:8.1f} ms  p95 {pct(values, 0.95):8.1f} ms   floor median {f:7.1f} ms"
              f"  p95 {pct(floor, 0.95):7.1f} ms   ratio {m / f:5.2f} x")

    print(f"bench_bridge --platform slack: {rounds} rounds, the fake Slack on loopback, demo agent")
    row("chat message -> turn started", started["bridge"], started["floor"])
    row("!stop -> 'Stopping…' at the server", ack, floor_stop)
    row("!stop -> notice at the server", notice, floor_stop)
    row("  of which the bridge: read -> 'Stopping…' sent", own, floor_stop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--platform", choices=("matrix", "telegram", "slack", "discord"), default="matrix")
    args = parser.parse_args(argv)
    if args.platform == "telegram":
        trio.run(bench_telegram, args.rounds)
    elif args.platform == "slack":
        trio.run(bench_slack, args.rounds)
    elif args.platform == "discord":
        trio.run(bench_discord, args.rounds)
    else:
        trio.run(bench, args.rounds, args.burst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
