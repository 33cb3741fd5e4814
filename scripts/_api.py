"""The control API for the scripts: the project's own synchronous client, and its async twin.

A script that asks one thing at a time uses :class:`supervisor.serve.client.Client` (re-exported
here with its errors). A script that asks thousands of things at once from one Trio loop (the
chaos run's trials, the daemon benchmark's followers) uses :class:`AsyncAPI`, the same
operations over ``httpx``, each path built from the one declaration of the operation in
:data:`supervisor.serve.routes.OPERATIONS`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from supervisor.serve.client import APIError, Client, DaemonUnavailable
from supervisor.serve.routes import OPERATIONS

__all__ = ["APIError", "AsyncAPI", "Client", "DaemonUnavailable", "api_path"]


def api_path(name: str, channel: str) -> str:
    """The path of operation ``name`` for ``channel`` (from the route table)."""
    return OPERATIONS[name].target(channel=channel)


class AsyncAPI:
    """The control API over the Unix socket, for many concurrent requests from one Trio loop.

    ``timeout`` bounds each request (None: unbounded); ``keepalive`` is how many idle
    connections are kept (None: all of them).
    """

    def __init__(self, socket: Path, *, timeout: float | None, keepalive: int | None = 64) -> None:
        self.http = httpx.AsyncClient(
            # The limits go on the transport: a client's own limits do not apply to a transport passed in.
            # An idle connection is dropped after 4 s, before the daemon closes it (hypercorn's
            # keep-alive timeout, 5 s, httpx's default expiry too): a request reusing a connection
            # as the daemon closes it gets no answer ("Server disconnected"), a harness failure.
            transport=httpx.AsyncHTTPTransport(
                uds=str(socket),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=keepalive, keepalive_expiry=4.0),
            ),
            base_url="http://corral",
            timeout=timeout,
        )
        #: Connections being opened at once, for a caller that opens very many. The daemon's
        #: listener keeps hypercorn's default backlog of 100: past that a non-blocking AF_UNIX
        #: connect fails with EAGAIN, which Trio takes for "in progress" (the read then fails with EINVAL).
        self.connecting = trio.CapacityLimiter(64)

    async def aclose(self) -> None:
        """Close every connection."""
        await self.http.aclose()

    async def send(
        self, channel: str, text: str, agent: str | None = None, author: str | None = None,
        delivery: str | None = None,
    ) -> dict[str, Any]:
        """POST a message (to ``agent``, or as addressed; by ``author``; ``delivery``); the accepted
        seq, generation, ``to`` (and what an interrupt interrupted and dropped)."""
        body = {"text": text, **({"agent": agent} if agent else {}), **({"author": author} if author else {}),
                **({"delivery": delivery} if delivery else {})}
        # Sent with an idempotency key and sent again once if the connection drops before the
        # answer (a kept-alive connection the daemon closed as it was reused): the daemon
        # answers the first acceptance again, so a retried send queues nothing twice.
        headers = {"Idempotency-Key": secrets.token_hex(16)}
        try:
            r = await self.http.post(api_path("send", channel), json=body, headers=headers)
        except httpx.RemoteProtocolError:
            r = await self.http.post(api_path("send", channel), json=body, headers=headers)
        if r.status_code != 202:
            raise RuntimeError(f"send to {channel}: HTTP {r.status_code} {r.text[:200]}")
        accepted: dict[str, Any] = r.json()
        return accepted

    async def stop(self, channel: str) -> dict[str, Any]:
        """POST a stop; the stop result (with the HTTP status)."""
        r = await self.http.post(api_path("stop", channel))
        body: dict[str, Any] = r.json()
        body["http_status"] = r.status_code
        return body

    async def cancel(self, channel: str, seq: int, *, first: bool = False) -> dict[str, Any]:
        """Take the queued message ``seq`` back (``first``: move it first instead); the answer
        (an edit's result, or the error object) with the HTTP status."""
        name = "move_first" if first else "cancel"
        op = OPERATIONS[name]
        r = await self.http.request(op.method, op.target(channel=channel, seq=str(seq)))
        body: dict[str, Any] = r.json()
        body["http_status"] = r.status_code
        return body

    async def wait(self, channel: str, timeout: float) -> bool:
        """True once the channel is idle (False after ``timeout`` seconds)."""
        try:
            r = await self.http.post(api_path("wait", channel), params={"timeout": timeout})
        except httpx.RemoteProtocolError:  # (a wait changes nothing: asked again)
            r = await self.http.post(api_path("wait", channel), params={"timeout": timeout})
        return bool(r.json().get("idle"))

    async def entries(self, channel: str) -> list[dict[str, Any]]:
        """Every committed entry of the channel."""
        try:
            r = await self.http.get(api_path("entries", channel))
        except httpx.RemoteProtocolError:  # (a read: asked again)
            r = await self.http.get(api_path("entries", channel))
        r.raise_for_status()
        entries: list[dict[str, Any]] = r.json()["entries"]
        return entries

    @asynccontextmanager
    async def events(
        self, channel: str, after: int | None = None, *, drafts: bool = False
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """The channel's entries as they are committed (after ``after``; with ``drafts``, the
        drafts too), while the block lasts. The stream is open once the block is entered."""
        params = {**({"after": after} if after is not None else {}), **({"drafts": 1} if drafts else {})}
        async with self.http.stream("GET", api_path("follow", channel), params=params or None) as response:

            async def entries() -> AsyncIterator[dict[str, Any]]:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        yield json.loads(line[6:])

            yield entries()

    async def follow_until(self, channel: str, until: Callable[[dict[str, Any]], Any], after: int = 0) -> None:
        """Follow the channel (from ``after``) until ``until(entry)`` is true."""
        async with self.events(channel, after) as entries:
            async for entry in entries:
                if until(entry):
                    return

    async def wait_for(self, channel: str, kind: str, got: trio.Event) -> None:
        """Follow the channel until an agent entry of ``kind`` (``kind:text-prefix``) appears."""
        kind, _, prefix = kind.partition(":")
        async with self.events(channel) as entries:
            async for entry in entries:
                if entry["author"].startswith("agent:") and entry["kind"] == kind and entry["text"].startswith(prefix):
                    got.set()
                    return
