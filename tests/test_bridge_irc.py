"""The IRC bridge against a real ngircd: the same Stop command, exactly-once and allowlist
rules as Matrix, with a raw IRC client as each human."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _ngircd import Ngircd, missing
from scripts._synapse import free_port
from conftest import KILL, METERED_LINE, METERED_MODEL, metered_agent, turn_processes

from supervisor import Supervisor, open_supervisor, parse_config
from supervisor.bridges.irc import parse_line
from supervisor.bridges.runner import Bridge, run_bridge
from supervisor.host.supervisor import STOP_NOTICE
from supervisor.serve.daemon import run_daemon

pytestmark = pytest.mark.bridges
ROOM = "#general"


@pytest.fixture(scope="session")
def ngircd() -> Iterator[Ngircd]:
    reason = missing()
    if reason is not None:
        pytest.fail(reason) if _required() else pytest.skip(reason)
    server = Ngircd()
    try:
        yield server
    finally:
        server.close()


def _required() -> bool:
    import os

    return bool(os.environ.get("CI"))


class Person:
    """A human on IRC: a raw client that keeps every line it saw in the room."""

    def __init__(self, nick: str, port: int) -> None:
        self.nick, self.port = nick, port
        self.lines: list[tuple[str, str, str]] = []  # (sender nick, command, text)
        self.stream: trio.SocketStream | None = None
        self._buffer = b""

    async def connect(self) -> None:
        self.stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        await self.send(f"NICK {self.nick}")
        await self.send(f"USER {self.nick} 0 * :{self.nick}")
        await self.until(lambda line: line[1] == "001")
        await self.send(f"JOIN {ROOM}")
        await self.until(lambda line: line[1] == "JOIN" and line[0] == self.nick)

    async def send(self, line: str) -> None:
        assert self.stream is not None
        await self.stream.send_all(line.encode() + b"\r\n")

    async def say(self, text: str) -> None:
        await self.send(f"PRIVMSG {ROOM} :{text}")

    async def until(self, test: Any, timeout: float = 60) -> tuple[str, str, str]:
        assert self.stream is not None
        with trio.fail_after(timeout):
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if test(line):
                        return line
                seen = len(self.lines)
                while b"\n" not in self._buffer:
                    data = await self.stream.receive_some(4096)
                    assert data, "the server closed the connection"
                    self._buffer += data
                while b"\n" in self._buffer:
                    raw, self._buffer = self._buffer.split(b"\n", 1)
                    prefix, command, params = parse_line(raw.rstrip(b"\r").decode())
                    if command == "PING":
                        await self.send(f"PONG :{params[-1]}")
                    self.lines.append((prefix.split("!")[0], command, params[-1] if params else ""))

    def room_says(self, nick: str, contains: str) -> Any:
        return lambda line: line[0] == nick and line[1] in ("PRIVMSG", "NOTICE") and contains in line[2]

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


@asynccontextmanager
async def bridged(folder: Path, server: Ngircd, **extra: Any) -> AsyncIterator[tuple[Supervisor, Bridge]]:
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]},
        "store": {"path": "corral.db"},
        "agents": {"demo": {"adapter": "demo", "delay": 0.01, "sandbox_write": [str(folder)]},
                   "meter": metered_agent(folder)},
        "bridges": {"irc": {
            "type": "irc", "server": f"127.0.0.1:{server.port}", "nick": "corral",
            "admins": ["alice!*@127.0.0.1"], "users": ["bob!*@*"], "rooms": {ROOM: "general"}, "retry_max": 1.0,
            **extra,
        }},
        "defaults": {"agent": "demo"},
    }
    config = parse_config(data, file=str(folder / "corral.toml"), base=folder)
    async with open_supervisor(config) as sup, trio.open_nursery() as nursery:
        bridge = await nursery.start(run_bridge, sup, config.bridges["irc"])
        try:
            yield sup, bridge
        finally:
            nursery.cancel_scope.cancel()


@pytest.fixture
async def people(ngircd: Ngircd) -> AsyncIterator[dict[str, Person]]:
    found = {nick: Person(nick, ngircd.port) for nick in ("alice", "bob", "mallory")}
    for person in found.values():
        await person.connect()
    yield found
    for person in found.values():
        await person.close()


async def test_irc_hello_gets_a_reply_in_the_channel(short_tmp: Path, ngircd: Ngircd,
                                                      people: dict[str, Person]) -> None:
    alice = people["alice"]
    async with bridged(short_tmp, ngircd) as (sup, _):
        await alice.say("hello")
        await alice.until(alice.room_says("corral", "demo: "))
        humans = [e for e in await sup.entries("general") if e.author.startswith("human:")]
        assert [e.text for e in humans] == ["hello"] and humans[0].author.startswith("human:alice!")
        # A turn's line of what it spent is a notice of its own (IRC edits nothing), one line,
        # with no control code whatever its CLI names its model.
        await sup.send("general", "count", to=["meter"])
        _, command, said = await alice.until(alice.room_says("corral", METERED_LINE))
        assert command == "NOTICE" and said.startswith(METERED_LINE) and said.endswith(" s · " + METERED_MODEL), said


async def test_irc_stop_is_acknowledged_then_the_notice_comes_last(short_tmp: Path, ngircd: Ngircd,
                                                                   people: dict[str, Person]) -> None:
    alice = people["alice"]
    async with bridged(short_tmp, ngircd) as (sup, _):
        await alice.say("start a long task")
        await alice.until(alice.room_says("corral", "tool running"))
        await alice.say("!stop")
        ack = await alice.until(alice.room_says("corral", "Stopping…"))
        notice = await alice.until(alice.room_says("corral", STOP_NOTICE))
        assert alice.lines.index(ack) < alice.lines.index(notice)
        assert turn_processes() == []
        asked = len(alice.lines)
        await alice.say("hello again")
        await alice.until(alice.room_says("corral", "hello again"))
        between = alice.lines[alice.lines.index(notice) + 1: asked]
        assert [line for line in between if line[0] == "corral"] == []
        # And in the store: the notice is the stopped turn's last entry.
        entries = await sup.entries("general")
        stopped = next(e for e in entries if e.kind == "notice").turn
        assert [e.kind for e in entries if e.turn == stopped][-1] == "notice"


async def test_irc_allowlists_ignore_strangers_and_keep_stop_all_for_admins(
    short_tmp: Path, ngircd: Ngircd, people: dict[str, Person], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "corral.bridges")
    alice, bob, mallory = people["alice"], people["bob"], people["mallory"]
    async with bridged(short_tmp, ngircd) as (sup, _):
        await mallory.say("hello from mallory")
        await bob.say("hello from bob")
        await alice.until(alice.room_says("corral", "hello from bob"))
        await alice.say("start a long task")
        await alice.until(alice.room_says("corral", "tool running"))
        await mallory.say("!stop")
        await bob.say("!stop all")
        await bob.say("!stop")
        await alice.until(alice.room_says("corral", STOP_NOTICE))
        humans = [e.text for e in await sup.entries("general") if e.author.startswith("human:")]
        assert humans == ["hello from bob", "start a long task"]
        assert "mallory!~mallory@127.0.0.1 may not talk to agents in #general; ignored" in caplog.text
        assert "mallory!~mallory@127.0.0.1 may not stop work in #general; ignored" in caplog.text
        assert "bob!~bob@127.0.0.1 may not !stop all (admins only); ignored" in caplog.text
        assert not [line for line in alice.lines if line[0] == "corral" and "mallory" in line[2]]


async def test_irc_server_restarted_runs_nothing_twice_and_a_stop_from_outside_shows(
    short_tmp: Path, ngircd: Ngircd, people: dict[str, Person]
) -> None:
    alice = people["alice"]
    async with bridged(short_tmp, ngircd) as (sup, bridge):
        await alice.say("hello before")
        await alice.until(alice.room_says("corral", "hello before"))
        await trio.to_thread.run_sync(ngircd.restart)
        alice = Person("alice", ngircd.port)
        await alice.connect()
        # The bridge is back once its nick is in the channel again: already (NAMES), or when it joins.
        await alice.send(f"NAMES {ROOM}")
        await alice.until(lambda line: line[1] == "366")
        if not any(line[1] == "353" and "corral" in line[2].replace("@", "").replace("+", "").split()
                   for line in alice.lines):
            await alice.until(lambda line: line[1] == "JOIN" and line[0] == "corral")
        await alice.say("start a long task after")
        await alice.until(alice.room_says("corral", "tool running"))
        result = await sup.stop("general")  # (the dashboard's Stop)
        assert result.ok
        await alice.until(alice.room_says("corral", STOP_NOTICE))
        humans = [e.text for e in await sup.entries("general") if e.author.startswith("human:")]
        assert humans == ["hello before", "start a long task after"]
        await alice.close()


async def test_a_failing_bridge_takes_neither_the_daemon_nor_another_bridge_down(
    short_tmp: Path, ngircd: Ngircd, people: dict[str, Person], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "corral.bridges")
    token = short_tmp / "nobody.token"
    token.write_text("not-a-token\n")
    down = f"http://127.0.0.1:{free_port()}"  # (nothing listens there: a homeserver that is down)
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]},
        "store": {"path": "corral.db"},
        "agents": {"demo": {"adapter": "demo", "delay": 0.01, "sandbox_write": [str(short_tmp)]}},
        "bridges": {
            "down": {"type": "matrix", "homeserver": down, "user": "@bot:x", "token_file": str(token),
                     "admins": ["@a:x"], "rooms": {"!r:x": "elsewhere"}, "retry_max": 0.5},
            "irc": {"type": "irc", "server": f"127.0.0.1:{ngircd.port}", "nick": "corral",
                    "admins": ["alice!*@127.0.0.1"], "rooms": {ROOM: "general"}},
        },
    }
    config = parse_config(data, file=str(short_tmp / "corral.toml"), base=short_tmp)
    alice = people["alice"]
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_daemon(config, handle_signals=False, subreaper=False,
                                                           task_status=task_status))
        transport = httpx.AsyncHTTPTransport(uds=str(short_tmp / "corral.sock"))
        async with httpx.AsyncClient(transport=transport, base_url="http://corral") as http:
            assert (await http.get("/v1/status")).status_code == 200  # served while a bridge cannot connect
            await alice.until(lambda line: line[1] == "JOIN" and line[0] == "corral")
            await alice.say("hello through the daemon")
            await alice.until(alice.room_says("corral", "hello through the daemon"))
            assert "bridge down: connecting:" in caplog.text and "trying again" in caplog.text
            await http.post("/v1/shutdown")


async def test_irc_new_starts_the_conversation_over_and_never_acts_on_a_running_turn_unasked(
    short_tmp: Path, ngircd: Ngircd, people: dict[str, Person]
) -> None:
    alice = people["alice"]
    async with bridged(short_tmp, ngircd) as (sup, _):
        await alice.say("hello")
        await alice.until(alice.room_says("corral", "start of conversation"))
        assert sup.session("general", "demo") is not None
        # A turn runs: !new says so and leaves it alone; !new stop stops it, then starts over.
        await alice.say("start a long task")
        await alice.until(alice.room_says("corral", "tool running"))
        await alice.say("!new")
        await alice.until(alice.room_says("corral", "Not started over"))
        assert sup.session("general", "demo") is not None and turn_processes() != []
        await alice.say("!new stop")
        await alice.until(alice.room_says("corral", STOP_NOTICE))
        await alice.until(alice.room_says("corral", "Stopped, then conversation reset"))
        assert sup.session("general", "demo") is None and turn_processes() == []
        # The next message is a new conversation.
        await alice.say("hello again")
        await alice.until(alice.room_says("corral", "This is the start of conversation"))


async def test_irc_interrupt_replaces_the_running_turn_and_nothing_of_it_follows_its_notice(
    short_tmp: Path, ngircd: Ngircd, people: dict[str, Person]
) -> None:
    alice = people["alice"]
    async with bridged(short_tmp, ngircd) as (sup, _):
        await alice.say("start a long task")
        await alice.until(alice.room_says("corral", "tool running"))
        await alice.say("!interrupt say hello instead")
        notice = await alice.until(alice.room_says("corral", "Interrupted by a new message."))
        answer = await alice.until(alice.room_says("corral", "You said: say hello instead"))
        assert alice.lines.index(notice) < alice.lines.index(answer)
        entries = await sup.entries("general")
        interrupted = next(e for e in entries if e.kind == "notice").turn
        assert interrupted is not None and turn_processes([interrupted]) == []
        assert [e.kind for e in entries if e.turn == interrupted][-1] == "notice"
        humans = [e for e in entries if e.author.startswith("human:")]
        assert [e.text for e in humans] == ["start a long task", "say hello instead"]
        assert humans[1].meta.get("delivery") == "interrupt"


async def test_irc_queue_lists_what_waits_and_cancel_is_for_its_sender_or_an_admin(
    short_tmp: Path, ngircd: Ngircd, people: dict[str, Person]
) -> None:
    alice, bob = people["alice"], people["bob"]
    async with bridged(short_tmp, ngircd) as (sup, _):
        await alice.say("start a long task")
        await alice.until(alice.room_says("corral", "tool running"))
        await alice.say("alice's next")
        await bob.say("bob's next")
        with trio.fail_after(60):
            while (await sup.queue("general"))["depth"] < 2:
                await trio.sleep(0.05)  # (the bridge hands each line on as the server relays it)
        mine, his = [row["entry"] for row in (await sup.queue("general"))["queued"]]
        await bob.say("!queue")
        await bob.until(bob.room_says("corral", "2 waiting"))
        await bob.until(bob.room_says("corral", f"seq {his} bob"))
        await bob.say(f"!cancel {mine}")  # not his: refused, and said so
        await bob.until(bob.room_says("corral", f"seq {mine} is not yours"))
        await bob.say(f"!cancel {his}")
        await bob.until(bob.room_says("corral", f"seq {his} taken back"))
        await alice.say(f"!cancel {mine}")
        await alice.until(alice.room_says("corral", f"seq {mine} taken back"))
        assert (await sup.queue("general"))["depth"] == 0
        await alice.say("!stop")
        await alice.until(alice.room_says("corral", STOP_NOTICE))
        entries = await sup.entries("general")
    assert not any("You said: alice's next" in e.text or "You said: bob's next" in e.text for e in entries)
    said = [e.text for e in entries if e.meta.get("take_back")]  # (an IRC sender is its nick!user@host)
    assert [t.split("!")[0] for t in said] == [f"seq {his} taken back by bob", f"seq {mine} taken back by alice"]
