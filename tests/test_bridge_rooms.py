"""A bridge handles its rooms concurrently (issue 38): a stop awaited in one room never delays
another room's events, while each room keeps its own order and a batch's cursor is saved only
once all of it is handled. Pure Trio: a platform and a supervisor of the test's own, the stop
parked at an exact point with a ``trio.Event``."""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from supervisor.bridges.core import STOPPING, Edit, Post, React, Said
from supervisor.bridges.platform import Batch
from supervisor.bridges.runner import run_bridge
from supervisor.config.model import BridgeConfig


class Platform:
    """Batches the test sends; posts recorded."""

    kind, can_edit, idempotent_posts, scope = "test", True, False, "0"

    def __init__(self) -> None:
        self.batches, self._batches = trio.open_memory_channel[Batch](math.inf)
        self.posts: list[Post] = []

    async def connect(self) -> None:
        pass

    async def rooms(self, configured: Mapping[str, str]) -> dict[str, str]:
        return dict(configured)

    async def join(self, room: str) -> bool:
        return True

    async def events(self, cursor: str | None) -> AsyncIterator[Batch]:
        yield Batch((), cursor)
        async for batch in self._batches:
            yield batch

    async def post(self, op: Post) -> str:
        self.posts.append(op)
        return f"p{len(self.posts)}"

    async def edit(self, op: Edit, target: str) -> str:
        return target

    async def react(self, op: React) -> str:
        return "r"

    def server_of(self, sender: str) -> str | None:
        return None

    async def aclose(self) -> None:
        pass


class Sup:
    """The supervisor's side a bridge uses; ``stop`` parks until ``release``."""

    def __init__(self) -> None:
        self.cursors: dict[str, str] = {}
        self.origins: set[str] = set()
        self.sent: list[str] = []
        self.stopping, self.release = trio.Event(), trio.Event()
        self.sent_to: dict[str, trio.Event] = {"a": trio.Event(), "b": trio.Event()}

    async def cursor(self, key: str) -> str | None:
        return self.cursors.get(key)

    async def save_cursor(self, key: str, value: str) -> None:
        self.cursors[key] = value

    async def last_seq(self) -> int:
        return 0

    async def follow(self, channel: str, **_: Any) -> AsyncIterator[Any]:
        await trio.sleep_forever()
        yield  # (an async generator that shows nothing)

    async def origin_seq(self, origin: str) -> int | None:
        return 1 if origin in self.origins else None

    async def mark_origin(self, origin: str) -> None:
        self.origins.add(origin)

    async def send_from(self, origin: str, channel: str, text: str, **_: Any) -> Any:
        self.origins.add(origin)
        self.sent.append(text)
        self.sent_to[channel].set()
        return SimpleNamespace(seq=len(self.sent))

    async def stop(self, channel: str | None) -> Any:
        self.stopping.set()
        await self.release.wait()
        return SimpleNamespace(ok=True, error=None)


async def test_a_stop_awaited_in_one_room_never_delays_another_rooms_message() -> None:
    sup, platform = Sup(), Platform()
    config = BridgeConfig(name="t", type="test", rooms={"A": "a", "B": "b"}, admins=("alice",))
    since = "bridge:t:since"
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(run_bridge, sup, config, platform=platform))  # type: ignore[arg-type]
            platform.batches.send_nowait(Batch((Said("A", "e1", "alice", "!stop"),), "1"))
            await sup.stopping.wait()  # room A's handling is parked inside its stop
            platform.batches.send_nowait(Batch((Said("A", "e2", "alice", "after the stop"),
                                                Said("B", "e3", "alice", "hello")), "2"))
            await sup.sent_to["b"].wait()  # (without rooms of their own this waits for A's stop: fail_after)
            await trio.testing.wait_all_tasks_blocked()
            assert sup.sent == ["hello"]  # A's next message waits for A's stop: each room keeps its order
            assert [p.text for p in platform.posts if p.room == "A"] == [STOPPING]  # acknowledged before it ends
            assert since not in sup.cursors  # batch 1 is not handled: no cursor past it is saved
            sup.release.set()
            await sup.sent_to["a"].wait()
            await trio.testing.wait_all_tasks_blocked()
            assert sup.sent == ["hello", "after the stop"]
            assert sup.cursors[since] == "2"
            nursery.cancel_scope.cancel()


async def test_a_platform_whose_read_confirms_is_asked_again_only_once_its_batch_is_handled() -> None:
    """Telegram forgets the updates below the offset of the next ``getUpdates``: asking for the
    next batch while a room's stop is parked would lose that room's queued events in a crash."""
    sup, platform = Sup(), Platform()
    platform.confirms_on_read = True  # type: ignore[attr-defined]
    asked: list[int] = []
    events = platform.events

    async def counted(cursor: str | None) -> AsyncIterator[Batch]:
        async for batch in events(cursor):
            yield batch
            asked.append(1)

    platform.events = counted  # type: ignore[method-assign]
    config = BridgeConfig(name="t", type="test", rooms={"A": "a", "B": "b"}, admins=("alice",))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(run_bridge, sup, config, platform=platform))  # type: ignore[arg-type]
            platform.batches.send_nowait(Batch((Said("A", "e1", "alice", "!stop"), Said("B", "e2", "alice", "hi")),
                                               "1"))
            await sup.stopping.wait()
            await sup.sent_to["b"].wait()  # (within the batch, rooms are still side by side)
            await trio.testing.wait_all_tasks_blocked()
            assert len(asked) == 1  # (the empty first batch only: batch 1 is not handled)
            sup.release.set()
            await trio.testing.wait_all_tasks_blocked()
            assert len(asked) == 2 and sup.cursors["bridge:t:since"] == "1"
            nursery.cancel_scope.cancel()
