"""Hosting a supervisor inside an asyncio program, with Trio in guest mode.

Most chat bots and web backends run on asyncio. Trio's guest mode runs a Trio event loop
*on top of* the host's loop, in the same thread: no second thread, no locks. The supervisor
lives in the Trio guest; each call from asyncio starts a Trio task and hands its result
back as an asyncio future. ::

    async with open_asyncio_supervisor(load_config("corral.toml")) as sup:
        accepted = await sup.send("general", "hello")
        async for entry in sup.follow("general", after=accepted.seq):
            ...
        await sup.stop("general")

Like :func:`open_supervisor`, it installs no signal handlers and changes no process-wide
setting unless asked (``subreaper=True``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar, overload

import outcome
import trio

from ..config.settings import Config
from ..core.queue import QueueEditResult
from ..host.supervisor import Accepted, StopResult, Supervisor, open_supervisor
from ..store.store import Draft, Entry
from .routes import DEFAULT_AUTHOR, DEFAULT_LIMIT, DEFAULT_STATUS_PAGE

T = TypeVar("T")


class AsyncioSupervisor:
    """The asyncio face of a supervisor running in a Trio guest loop."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken, nursery: trio.Nursery, sup: Supervisor
    ) -> None:
        self._loop = loop
        self._token = token
        self._nursery = nursery
        self.supervisor = sup
        """The Trio-side supervisor (only to be touched from Trio code)."""

    def _call(self, fn: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self._loop.create_future()

        async def run() -> None:
            try:
                result = await fn()
            except BaseException as exc:  # handed to the asyncio caller
                if isinstance(exc, trio.Cancelled):
                    self._loop.call_soon(_settle, future, None, asyncio.CancelledError())
                    raise
                self._loop.call_soon(_settle, future, None, exc)
            else:
                self._loop.call_soon(_settle, future, result, None)

        self._token.run_sync_soon(self._nursery.start_soon, run)
        return future

    async def send(
        self, channel: str, text: str, *, agent: str | None = None, to: Sequence[str] | None = None,
        author: str = DEFAULT_AUTHOR, delivery: str | None = None, idempotency_key: str | None = None,
    ) -> Accepted:
        """See :meth:`Supervisor.send`."""
        return await self._call(
            lambda: self.supervisor.send(channel, text, agent=agent, to=to, author=author, delivery=delivery,
                                         idempotency_key=idempotency_key)
        )

    async def send_from(
        self, origin: str, channel: str, text: str, *, to: Sequence[str] | None = None, author: str = DEFAULT_AUTHOR,
        delivery: str | None = None,
    ) -> Accepted:
        """See :meth:`Supervisor.send_from`: the exactly-once path of the chat bridges (a second
        message of one ``origin`` fails with :class:`~supervisor.store.store.StoreError`)."""
        return await self._call(
            lambda: self.supervisor.send_from(origin, channel, text, to=to, author=author, delivery=delivery)
        )

    async def origin_seq(self, origin: str) -> int | None:
        """See :meth:`Supervisor.origin_seq`: whether (as which seq) ``origin`` was accepted."""
        return await self._call(lambda: self.supervisor.origin_seq(origin))

    async def queue(self, channel: str) -> dict[str, Any]:
        """See :meth:`Supervisor.queue`."""
        return await self._call(lambda: self.supervisor.queue(channel))

    async def cancel(self, channel: str, seq: int, *, author: str = DEFAULT_AUTHOR) -> QueueEditResult:
        """See :meth:`Supervisor.cancel`."""
        return await self._call(lambda: self.supervisor.cancel(channel, seq, author=author))

    async def move_first(self, channel: str, seq: int, *, author: str = DEFAULT_AUTHOR) -> QueueEditResult:
        """See :meth:`Supervisor.move_first`."""
        return await self._call(lambda: self.supervisor.move_first(channel, seq, author=author))

    async def stop(self, channel: str | None = None) -> StopResult:
        """See :meth:`Supervisor.stop`."""
        return await self._call(lambda: self.supervisor.stop(channel))

    async def stop_all(self) -> StopResult:
        """See :meth:`Supervisor.stop_all`."""
        return await self._call(self.supervisor.stop_all)

    async def reset(self, channel: str, *, agent: str | None = None, stop: bool = False) -> Entry:
        """See :meth:`Supervisor.reset`."""
        return await self._call(lambda: self.supervisor.reset(channel, agent=agent, stop=stop))

    async def resend(self, channel: str, seq: int) -> Accepted:
        """See :meth:`Supervisor.resend`."""
        return await self._call(lambda: self.supervisor.resend(channel, seq))

    async def wait_idle(self, channel: str, timeout: float | None = None) -> bool:
        """See :meth:`Supervisor.wait_idle`."""
        return await self._call(lambda: self.supervisor.wait_idle(channel, timeout))

    async def entries(
        self, channel: str, after: int = 0, limit: int = DEFAULT_LIMIT, newest: bool = False
    ) -> list[Entry]:
        """See :meth:`Supervisor.entries`."""
        return await self._call(lambda: self.supervisor.entries(channel, after, limit, newest))

    async def usage(self, channel: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """See :meth:`Supervisor.usage`."""
        return await self._call(lambda: self.supervisor.usage(channel, since))

    async def budget_reset(self, name: str | None = None) -> dict[str, Any]:
        """See :meth:`Supervisor.budget_reset`."""
        async def reset() -> dict[str, Any]:
            return self.supervisor.budget_reset(name)

        return await self._call(reset)

    async def status(
        self, after: str | None = None, limit: int | None = DEFAULT_STATUS_PAGE, idle: bool = False
    ) -> dict[str, Any]:
        """See :meth:`Supervisor.status` (``limit`` None: every channel)."""
        async def status() -> dict[str, Any]:
            return self.supervisor.status(after=after, limit=limit, idle=idle)

        return await self._call(status)

    @overload
    def follow(self, channel: str | None, after: int = 0, *, drafts: Literal[False] = False) -> AsyncIterator[Entry]:
        ...

    @overload
    def follow(self, channel: str | None, after: int = 0, *, drafts: bool) -> AsyncIterator[Entry | Draft]: ...

    async def follow(
        self, channel: str | None, after: int = 0, *, drafts: bool = False
    ) -> AsyncIterator[Entry | Draft]:
        """See :meth:`Supervisor.follow` (``drafts``: also the text agents are writing now);
        stops when the caller stops iterating."""
        queue: asyncio.Queue[Entry | Draft] = asyncio.Queue()
        scope = trio.CancelScope()

        async def pump() -> None:
            with scope:
                async for entry in self.supervisor.follow(channel, after, drafts=drafts):
                    self._loop.call_soon(queue.put_nowait, entry)

        self._token.run_sync_soon(self._nursery.start_soon, pump)
        try:
            while True:
                yield await queue.get()
        finally:
            self._token.run_sync_soon(scope.cancel)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@asynccontextmanager
async def open_asyncio_supervisor(config: Config, **options: Any) -> AsyncIterator[AsyncioSupervisor]:
    """Run :func:`open_supervisor` (same options) in a Trio guest loop for the block's duration."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[AsyncioSupervisor] = loop.create_future()
    finished: asyncio.Future[None] = loop.create_future()
    release = trio.Event()

    async def guest() -> None:
        async with open_supervisor(config, **options) as sup, trio.open_nursery() as nursery:
            host = AsyncioSupervisor(loop, trio.lowlevel.current_trio_token(), nursery, sup)
            loop.call_soon(_settle, ready, host, None)
            await release.wait()
            nursery.cancel_scope.cancel()

    def done(result: outcome.Outcome[None]) -> None:
        try:
            result.unwrap()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the asyncio side
            loop.call_soon_threadsafe(_settle, ready, None, exc)
            loop.call_soon_threadsafe(_settle, finished, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, finished, None, None)

    trio.lowlevel.start_guest_run(
        guest,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        done_callback=done,
        host_uses_signal_set_wakeup_fd=True,
    )
    try:
        host = await ready
    except BaseException:
        if ready.done() and not ready.cancelled():
            # The guest ended before it was ready (a store in use, say): its end carries the
            # same error. Take it, or asyncio logs it with a traceback as "never retrieved".
            await asyncio.wait([finished])
            finished.exception()
        raise
    try:
        yield host
    finally:
        host._token.run_sync_soon(release.set)
        await finished
