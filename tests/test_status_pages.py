"""``status`` on a host with many channels: paged, busy channels first, the idle ones counted (issue 40.3).

The channels are made through the supervisor's ledger, as a restart restores a store's
channels (idle) and as acceptance and a turn's take leave them (queued, running): hundreds
of channels in milliseconds, no agent process started.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_config

from supervisor import cli
from supervisor.core import paging
from supervisor.core.errors import UsageError
from supervisor.core.names import SortedNames
from supervisor.host.supervisor import Supervisor, open_supervisor
from supervisor.serve.client import Client
from supervisor.serve.dashboard import list_view
from supervisor.serve.metrics import render
from supervisor.serve.systemd import status_line

IDLE, QUEUED, RUNNING = 300, 5, 3


def _fill(sup: Supervisor) -> None:
    ledger = sup._ledger
    for i in range(IDLE):
        ledger.restore(f"idle-{i:03}", 0)
    for i in range(QUEUED):
        ledger.accept(f"queued-{i}", "demo", 10_000 + i, human=True)
    for i in range(RUNNING):
        ledger.accept(f"run-{i}", "demo", 20_000 + i, human=True)
        ledger.take(f"run-{i}", "demo", f"t-run-{i}")


def _groups(channels: dict[str, object]) -> list[str]:
    return [name.split("-")[0] for name in channels]


async def test_a_page_lists_busy_channels_first_counts_the_idle_and_stays_bounded(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        _fill(sup)
        page = sup.status(limit=paging.DEFAULT_PAGE)
        assert _groups(page["channels"]) == ["run"] * RUNNING + ["queued"] * QUEUED, "busy only, running first"
        assert page["channel_counts"] == {"running": RUNNING, "queued": QUEUED, "idle": IDLE,
                                          "total": RUNNING + QUEUED + IDLE}
        assert page["idle_listed"] is False and page["next"] is None
        assert page["channels"]["run-0"]["agents"]["demo"]["state"] == "running"
        assert page["channels"]["queued-0"]["queued"] == 1
        # Asked for, the idle channels follow the busy ones, at most a page of them.
        full = sup.status(limit=paging.DEFAULT_PAGE, idle=True)
        assert len(full["channels"]) == paging.DEFAULT_PAGE and full["idle_listed"] is True
        assert _groups(full["channels"])[: RUNNING + QUEUED + 1] == ["run"] * RUNNING + ["queued"] * QUEUED + ["idle"]
        assert full["next"] == f"2:{list(full['channels'])[-1]}"
        assert len(json.dumps(full)) <= 64 * 1024
        # The dashboard's list: the same order, the idle count when they are not listed.
        view = list_view(page)
        assert [c["name"] for c in view["channels"]] == list(page["channels"])
        assert (view["idle"], view["total"], view["running"]) == (IDLE, RUNNING + QUEUED + IDLE, 0)
        assert list_view(full)["idle"] == 0 and list_view(full)["next"] == full["next"]


async def test_paging_with_the_cursor_reaches_every_channel_once(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        _fill(sup)
        seen: list[str] = []
        after, pages = None, 0
        while True:
            page = sup.status(after=after, limit=70, idle=True)
            assert len(page["channels"]) <= 70
            seen += page["channels"]
            pages += 1
            after = page["next"]
            if after is None:
                break
        assert pages == 5 and len(seen) == len(set(seen)) == IDLE + QUEUED + RUNNING
        assert seen == sorted(seen, key=lambda n: (("run", "queued", "idle").index(n.split("-")[0]), n))
        # Every channel, for the daemon's own readers: no limit, no cursor.
        assert list(sup.status()["channels"]) == seen


async def test_a_page_stops_before_64_kb_whatever_its_limit(short_tmp: Path) -> None:
    long = {f"agent-{i:02}-{'x' * 40}": {"adapter": "demo"} for i in range(4)}
    async with open_supervisor(make_config(short_tmp, long, agent=next(iter(long)))) as sup:
        for i in range(IDLE):
            for agent in long:
                sup._ledger.accept(f"c-{i:03}", agent, i, human=True)
        page = sup.status(limit=paging.MAX_PAGE, idle=True)
        assert 0 < len(page["channels"]) < IDLE and page["next"] is not None, "cut by its size, not its limit"
        assert len(json.dumps(page)) <= 64 * 1024


async def test_metrics_and_the_service_line_read_counts_not_every_channel(short_tmp: Path) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        _fill(sup)
        summary = sup.summary()
        assert summary["channel_counts"]["total"] == IDLE + QUEUED + RUNNING and "channels" not in summary
        assert summary["running_channels"] == [f"run-{i}" for i in range(RUNNING)]
        line = status_line(summary)
        assert line.startswith(f"0 turn(s) running, {QUEUED} queued, {IDLE + QUEUED + RUNNING} channel(s)")
        assert "corral_channels_running 0" in render(summary, sup.metrics)


def test_a_bad_cursor_or_limit_is_refused_with_the_fix() -> None:
    for bad in ("x", "3:a", "idle-1"):
        with pytest.raises(UsageError, match="cursor from a status page"):
            paging.plan(set(), set(), SortedNames(), after=bad, limit=10, idle=False)
    with pytest.raises(UsageError, match="limit must be between 1 and"):
        paging.plan(set(), set(), SortedNames(), after=None, limit=paging.MAX_PAGE + 1, idle=False)
    # A small host's page lists its idle channels too, as status always did.
    small = paging.plan({"a"}, set(), SortedNames(["b", "a"]), after=None, limit=10, idle=False)
    assert small.keys == ((0, "a"), (2, "b")) and small.idle_listed



async def test_the_cli_says_how_many_idle_channels_it_did_not_list_and_how_to_see_them(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_supervisor(make_config(short_tmp)) as sup:
        _fill(sup)
        asked: list[dict[str, object]] = []

        def status(self: Client, after: str | None = None, limit: int = 200, idle: bool = False) -> dict[str, object]:
            asked.append({"after": after, "limit": limit, "idle": idle})
            return sup.status(after=after, limit=limit, idle=idle)

        monkeypatch.setattr(Client, "status", status)
        runner = CliRunner()
        out = runner.invoke(cli.main, ["--socket", str(short_tmp / "none.sock"), "status"]).output
        assert "channel run-0" in out and "channel queued-4" in out and "idle-000" not in out, out
        assert f"{IDLE} idle channel(s) not listed (of {IDLE + QUEUED + RUNNING}): `corral status --all`" in out
        socket = ["--socket", str(short_tmp / "none.sock")]
        out = runner.invoke(cli.main, [*socket, "status", "--all", "--limit", "10"]).output
        assert "channel idle-001" in out and "channel idle-002" not in out and "not listed" not in out, out
        assert "more channels: `corral status --all --after 2:idle-001`" in out, out
        assert asked[-1] == {"after": None, "limit": 10, "idle": True}


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
async def test_after_a_restart_status_knows_every_stored_channel(
    short_tmp: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    # Before: a restarted host knew only the channels with a stored state row or queue (0 of 250).
    config = make_config(short_tmp)
    if engine == "postgresql":
        config = dataclasses.replace(config, store_url=request.getfixturevalue("postgres_url"))
    async with open_supervisor(config) as sup:
        for i in range(250):
            sup._store.submit_entry(f"told-{i:03}", "human", "message", "hi")
        await sup._store.append("told-250", "human", "message", "hi")
    async with open_supervisor(config) as sup:
        page = sup.status(limit=paging.DEFAULT_PAGE)
        assert page["channel_counts"] == {"running": 0, "queued": 0, "idle": 251, "total": 251}
        assert page["channels"] == {} and page["idle_listed"] is False
        listed = sup.status(limit=paging.DEFAULT_PAGE, idle=True, after="2:told-100")
        assert list(listed["channels"])[:2] == ["told-101", "told-102"] and listed["next"] is None
        assert sup.summary()["channel_counts"]["total"] == 251
        await sup.require_channel("told-007")
