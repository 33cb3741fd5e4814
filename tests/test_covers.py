"""A file hidden from a turn and replaced on the host while it runs ends that turn (issue 41.1).

A cover is a mount on a dentry: ``mv new corral.toml`` (an editor's save, ``sed -i``) detaches
it in the turn's namespace, and the turn would read the new file. The watch
(:mod:`supervisor.procs.covers`) kills the turn in the step the event is read. The hostile
agent here reads the config every half second; without the watch it reads the new secret (the
control: the hole is real), with it the turn ends with corral's words first, its processes gone.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import make_config, script_agent, turn_processes

import supervisor.host.supervisor as host_supervisor
from supervisor import open_supervisor
from supervisor.procs.covers import (
    IN_CREATE,
    IN_DELETE_SELF,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    CoverWatch,
    open_cover_watch,
    parse_events,
)
from supervisor.procs.sandbox import Reach, detachable, probe

READER = """
import sys, time
path = sys.argv[1]
while True:
    try:
        with open(path) as f:
            data = f.read().strip()
    except OSError as exc:
        data = f"refused {exc.errno}"
    print("saw:", data[:60] or "(nothing)", flush=True)
    time.sleep(0.5)
"""


def _event(wd: int, mask: int, name: str = "") -> bytes:
    raw = name.encode()
    padded = raw + b"\0" * ((16 - len(raw) % 16) if raw else 0)
    return struct.pack("iIII", wd, mask, 0, len(padded)) + padded


def test_the_events_of_one_read_are_parsed_whole() -> None:
    data = _event(1, IN_MOVED_TO, "corral.toml") + _event(2, IN_DELETE_SELF) + _event(-1, IN_Q_OVERFLOW)
    events = parse_events(data)
    assert [(e.wd, e.name, e.whole, e.overflow) for e in events] == [
        (1, "corral.toml", False, False), (2, "", True, False), (-1, "", False, True)]


def test_a_replaced_path_calls_back_each_turn_that_covers_it_once() -> None:
    added: list[bytes] = []

    def add(fd: int, path: bytes, mask: int) -> int:
        added.append(path)
        return len(added)

    watch = CoverWatch(-1, add)
    calls: list[tuple[str, str]] = []
    watch.register(["/srv/p/corral.toml", "/srv/p/corral.db"], lambda p: calls.append(("a", p)))
    watch.register(["/srv/q/x"], lambda p: calls.append(("b", p)))
    watch.register(["/srv/r/y"], lambda p: calls.append(("d", p)))
    watch.register(["/srv/p/corral.toml"], lambda p: calls.append(("c", p)))
    assert sorted(added) == [b"/srv/p", b"/srv/q", b"/srv/r"]  # (a folder is watched once)
    epoch = watch.epoch
    assert watch.handle(parse_events(_event(1, IN_CREATE, "other.txt"))) == ["/srv/p/other.txt"]
    assert calls == []  # (a name nobody covers)
    assert watch.handle(parse_events(_event(2, IN_DELETE_SELF))) == []
    assert calls == []  # (the folder went, its covered entries with it: nothing shows through)
    watch.handle(parse_events(_event(1, IN_MOVED_TO, "corral.toml") * 2))
    assert sorted(calls) == [("a", "/srv/p/corral.toml"), ("c", "/srv/p/corral.toml")]
    assert watch.replaced_after(["/srv/p/corral.toml"], epoch) == "/srv/p/corral.toml"
    assert watch.replaced_after(["/srv/q/x"], epoch) is None
    watch.handle(parse_events(_event(1, IN_MOVED_TO, "corral.toml")))
    assert len(calls) == 2  # (a turn is ended once)
    watch.handle(parse_events(_event(-1, IN_Q_OVERFLOW)))
    assert sorted(calls[2:]) == [("b", "/srv/q/x"), ("d", "/srv/r/y")]  # (events lost: any may have been replaced)


def test_only_covers_whose_folder_the_turn_sees_can_detach() -> None:
    reach = Reach(cwd="/w", writable=("/w",), hidden_dirs=("/state", "/state/inner", "/home"),
                  hidden_files=("/srv/p/corral.toml", "/state/corral.token"))
    assert detachable(reach) == ("/srv/p/corral.toml", "/state", "/home")


async def test_a_real_rename_over_a_watched_file_is_seen_at_once(tmp_path: Path) -> None:
    watch = open_cover_watch()
    assert watch is not None
    target = tmp_path / "corral.toml"
    target.write_text("old")
    seen = trio.Event()
    at: list[float] = []
    watch.register([str(target)], lambda path: (at.append(time.perf_counter()), seen.set()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        (tmp_path / "new").write_text("new")
        t0 = time.perf_counter()
        os.replace(tmp_path / "new", target)
        with trio.fail_after(10):
            await seen.wait()
        nursery.cancel_scope.cancel()
    assert at[0] - t0 < 5


def _sandboxed() -> None:
    support = probe()
    if not support.available:
        pytest.skip(f"no sandbox here: {'; '.join(support.missing)}")


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "control-without-the-watch"])
async def test_a_config_replaced_while_a_turn_runs_ends_the_turn_before_it_reads_the_new_file(
    short_tmp: Path, watched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sandboxed()
    config_file = short_tmp / "corral.toml"
    config_file.write_text("# api key: SECRET-OLD\n")
    (short_tmp / "notes.md").write_text("the project's own file: the folder is not corral's alone\n")
    agent: dict[str, Any] = script_agent(READER, args=[str(config_file)], sandbox_write=[])
    config = dataclasses.replace(make_config(short_tmp, {"reader": agent}), path=config_file)  # (as loaded from it)
    if not watched:
        monkeypatch.setattr(host_supervisor, "open_cover_watch", lambda: None)
    async with open_supervisor(config) as sup:
        await sup.send("c", "go")
        with trio.fail_after(60):
            while not any("saw: refused" in e.text for e in await sup.entries("c")):
                await trio.sleep(0.05)  # (polling the transcript until the agent has read the cover)
        replacement = short_tmp / "corral.toml.new"
        replacement.write_text("# api key: SECRET-NEW\n")
        os.replace(replacement, config_file)
        with trio.fail_after(60):
            while True:
                texts = [e.text for e in await sup.entries("c")]
                if any("SECRET-NEW" in t for t in texts) or any("was replaced on the host" in t for t in texts):
                    break
                await trio.sleep(0.05)
        if watched:
            with trio.fail_after(30):
                assert await sup.wait_idle("c")
            texts = [e.text for e in await sup.entries("c")]
            assert not any("SECRET-NEW" in t for t in texts), texts
            assert any(f"{config_file} was replaced on the host" in t for t in texts), texts
            assert not turn_processes()
        else:
            assert any("SECRET-NEW" in t for t in texts), texts  # (the hole the watch closes)
            await sup.stop("c")
    assert not any("SECRET-OLD" in t for t in texts)  # (the cover held until the replacement)
