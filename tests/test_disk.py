"""A turn that fills its HOME does not fill the store's disk (issue 41.7): the disk reserve.

On a small file system of the test's own (a tmpfs it mounts, as root) holding the store and
corral's state, a hostile agent writes into its HOME until the disk is full. With the reserve
(:mod:`supervisor.host.disk`) the turn is ended in corral's words, the store still writes,
no turn starts while the disk is low, and turns run again once it has room; without it (the
control) the store's own writes fail.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import script_agent, turn_processes

from supervisor import open_supervisor
from supervisor.config.settings import ConfigError, parse_config
from supervisor.host.disk import RESERVE_NAME, DiskGuard, judge
from supervisor.store.store import StoreError

FILLER = """
import os, sys, time
try:
    with open(os.path.join(os.environ["HOME"], "fill"), "wb") as f:
        while True:
            f.write(b"x" * (1 << 20))
            f.flush()
except OSError as exc:
    print("the disk is full:", exc.errno, flush=True)
time.sleep(600)
"""


def test_the_verdicts() -> None:
    assert judge(100, 50, low=False) == "ok"
    assert judge(49, 50, low=False) == "low"
    assert judge(99, 50, low=True) == "still low"
    assert judge(100, 50, low=True) == "recovered"


class _Turn:
    def __init__(self) -> None:
        self.why: list[str] = []

    def end_early(self, why: str) -> None:
        self.why.append(why)


def test_the_guard_ends_every_turn_then_lets_the_reserve_go(tmp_path: Path) -> None:
    free = [1 << 30]
    turns = [_Turn(), _Turn()]
    guard = DiskGuard(tmp_path, 1 << 20, turns=lambda: turns, free=lambda _: free[0])
    assert guard.take() and (tmp_path / RESERVE_NAME).stat().st_size == 1 << 20
    assert guard.check() == "ok" and guard.refusal() is None
    free[0] = 1000
    assert guard.check() == "low"
    assert all(len(t.why) == 1 and "server.disk_reserve" in t.why[0] for t in turns)
    assert (tmp_path / RESERVE_NAME).stat().st_size == 0  # (its room is the store's now)
    refusal = guard.refusal()
    assert refusal is not None and "free space" in refusal
    assert guard.check() == "still low" and all(len(t.why) == 1 for t in turns)
    free[0] = 3 << 20
    assert guard.check() == "recovered" and guard.refusal() is None
    assert (tmp_path / RESERVE_NAME).stat().st_size == 1 << 20


def test_disk_reserve_is_checked_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as bad:
        parse_config({"server": {"disk_reserve": "lots"}, "agents": {"a": {"adapter": "demo"}}},
                     file="c.toml", base=tmp_path)
    assert "server.disk_reserve" in str(bad.value) and 'disk_reserve = "64M"' in str(bad.value)
    config = parse_config({"server": {"disk_reserve": 0}, "agents": {"a": {"adapter": "demo"}}},
                          file="c.toml", base=tmp_path)
    assert config.server.disk_reserve == 0


@pytest.fixture
def small_disk(short_tmp: Path) -> Any:
    if os.geteuid() != 0:
        pytest.skip("mounting the test's own small file system needs root")
    disk = short_tmp / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=0700", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("reserve", ["8M", 0], ids=["reserved", "control-without-a-reserve"])
async def test_a_turn_filling_its_home_ends_and_the_store_keeps_writing(small_disk: Path, reserve: Any) -> None:
    config = parse_config(
        {"server": {"socket": "corral.sock", "disk_reserve": reserve}, "store": {"path": "corral.db"},
         "agents": {"filler": script_agent(FILLER, sandbox_write=[]), "demo": {"adapter": "demo", "delay": 0.01}},
         "defaults": {"agent": "demo"}, "channels": {"c": {"agents": ["filler"]}, "d": {"agents": ["demo"]}}},
        file=str(small_disk / "corral.toml"), base=small_disk,
    )
    async with open_supervisor(config) as sup:
        await sup.send("c", "fill it")
        if reserve == 0:
            with trio.fail_after(60):
                while True:
                    try:
                        await sup.send("d", "hello")
                    except StoreError:
                        break  # (the hole the reserve closes: the store's own writes fail)
                    await trio.sleep(0.1)
            await sup.stop("c")
            return
        with trio.fail_after(60):
            assert await sup.wait_idle("c")
        texts = [e.text for e in await sup.entries("c")]
        assert any("fell below 8 MiB free (server.disk_reserve)" in t for t in texts), texts
        assert not turn_processes()
        # The store still writes; no turn starts while the disk is low, and it says why.
        await sup.send("d", "hello")
        with trio.fail_after(60):
            assert await sup.wait_idle("d")
        said = [e.text for e in await sup.entries("d")]
        assert any("has less than 8 MiB free" in t and "free space on it" in t for t in said), said
        # Room again: turns run.
        for home_file in (small_disk / "corral.d").rglob("fill"):
            home_file.unlink()
        with trio.fail_after(30):
            while sup.disk is not None and sup.disk.low:
                await trio.sleep(0.05)  # (polling the guard until its next read of the free space)
        await sup.send("d", "hello again")
        with trio.fail_after(60):
            assert await sup.wait_idle("d")
        last = (await sup.entries("d"))[-1]
        assert last.author == "agent:demo" and "hello again" in last.text, last
    assert not (small_disk / "corral.d" / RESERVE_NAME).exists()  # (it goes with the supervisor)
