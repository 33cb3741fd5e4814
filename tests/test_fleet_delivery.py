"""Interrupt and steer through a fleet host that does not run the channel (contract line 19):
the accepting host stores the message with its delivery on the queue row; the owner carries it
out as it takes the message up. Two real hosts on one real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import trio
from test_fleet import count, gate, host_config, texts, until  # noqa: F401 - gate: a fixture
from test_stop_contract import Gate

from supervisor import parse_config
from supervisor.config.settings import Config
from supervisor.core.results import INTERRUPT_NOTICE
from supervisor.host.supervisor import open_supervisor


async def test_contract_19_an_interrupt_through_a_host_that_does_not_own_the_channel_is_carried_out_by_its_owner(
    short_tmp: Path, postgres_url: str, gate: Gate
) -> None:
    url = postgres_url
    configs = [host_config(short_tmp / n, url, n, 60.0) for n in ("h1", "h2")]
    async with open_supervisor(configs[0]) as one, open_supervisor(configs[1]) as two:
        await one.send("ch", f"whoami gate={gate}")
        await until("h1's turn", lambda: "ready" in texts(url))
        turn = one._ledger.current_turn("ch")
        assert turn is not None
        queued = await one.send("ch", "queued on h1")
        accepted = await two.send("ch", "instead", delivery="interrupt")
        assert accepted.delivery == "interrupt" and accepted.interrupted == ()  # (h1 carries it out)
        await until("the interrupt's notice", lambda: any(t.startswith(INTERRUPT_NOTICE) for t in texts(url)))
        await until("the interrupting message's answer", lambda: "done: instead" in texts(url))
        with trio.fail_after(30):
            assert await one.wait_idle("ch", timeout=30)
        entries = await one.entries("ch")
    notice = next(e for e in entries if e.kind == "notice")
    assert notice.turn == turn and notice.meta["interrupted_by"] == accepted.seq
    assert notice.text == f"{INTERRUPT_NOTICE} 1 queued message was not run."
    assert all(e.seq < notice.seq or e.turn != turn for e in entries if e is not notice)
    assert "done: queued on h1" not in [e.text for e in entries]
    marked = next(e for e in entries if e.seq == queued.seq).meta
    assert marked.get("dropped_by_stop") == accepted.seq and marked.get("dropped_by_interrupt") == accepted.seq
    assert count(url, "SELECT count(*) FROM queue") == 0
    assert count(url, "SELECT count(*) FROM queue WHERE delivery IS NOT NULL") == 0


async def test_contract_19_a_steer_through_another_host_to_an_agent_that_cannot_take_one_is_queued_there(
    short_tmp: Path, postgres_url: str, gate: Gate
) -> None:
    url = postgres_url
    configs = [host_config(short_tmp / n, url, n, 60.0) for n in ("h1", "h2")]
    async with open_supervisor(configs[0]) as one, open_supervisor(configs[1]) as two:
        await one.send("ch", f"gate={gate}")
        await until("h1's turn", lambda: "ready" in texts(url))
        accepted = await two.send("ch", "also this", delivery="steer")
        assert accepted.delivery == "steer"
        await until("the fallback's status", lambda: any(t.startswith("Not steered") for t in texts(url)))
        gate.open()
        await until("its answer", lambda: "done: also this" in texts(url))
        entries = await one.entries("ch")
    status = next(e for e in entries if e.kind == "status" and e.text.startswith("Not steered"))
    assert str(accepted.seq) in status.text and "cannot take a message mid-turn" in status.text


async def test_contract_19_a_steer_through_another_host_reaches_the_owners_running_turn(
    short_tmp: Path, postgres_url: str
) -> None:
    url = postgres_url

    def demo_host(name: str) -> Config:
        folder = short_tmp / name
        folder.mkdir()
        data = {"server": {"socket": "corral.sock", "cgroup": "off"}, "store": {"url": url},
                "cluster": {"host": name, "lease": 60.0}, "agents": {"demo": {"adapter": "demo", "delay": 0.01}}}
        return parse_config(data, file=str(folder / "corral.toml"), base=folder)

    async with open_supervisor(demo_host("h1")) as one, open_supervisor(demo_host("h2")) as two:
        await one.send("ch", "long 600")
        await until("h1's tool", lambda: any(t.startswith("tool running") for t in texts(url)))
        turn = one._ledger.current_turn("ch")
        accepted = await two.send("ch", "that is enough, and mention the otter", delivery="steer")
        assert accepted.delivery == "steer"
        await until("the steer's status", lambda: f"Message {accepted.seq} was steered into demo's running turn."
                    in texts(url))
        await until("the reply", lambda: any("You also said: that is enough" in t for t in texts(url)))
        with trio.fail_after(30):
            assert await one.wait_idle("ch", timeout=30)
        entries = await one.entries("ch")
    reply = next(e for e in entries if "You also said: that is enough" in e.text)
    assert reply.turn == turn
    assert count(url, "SELECT count(*) FROM queue") == 0
