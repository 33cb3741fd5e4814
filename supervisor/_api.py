"""The control API: HTTP/1.1 + JSON (and Server-Sent Events) as a plain ASGI app.

Routes (a channel is one percent-encoded path segment, so it may contain ``/``):

===============================================  =============================================
``POST /v1/channels/{channel}/messages``         ``{"text", "agent"?, "author"?}`` → 202 ``{seq, …}``
``POST /v1/channels/{channel}/stop``             → the stop result, once the stop is complete
``POST /v1/stop``                                stop every busy channel
``GET  /v1/channels/{channel}/entries?after=N``  committed entries after ``seq`` N
``GET  /v1/channels/{channel}/events?after=N``   the same, then live, as Server-Sent Events
``POST /v1/channels/{channel}/wait?timeout=S``   200 when idle, 408 on timeout
``GET  /v1/status``                              daemon, agents, channels, running turns
``POST /v1/shutdown``                            202, then an orderly shutdown
===============================================  =============================================

Every error is JSON: ``{"error": {"code": …, "message": …}}`` with a 4xx/5xx status. A bad
request never disturbs the daemon or anything it has accepted.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, unquote

import trio

from ._store import StoreError
from ._supervisor import MAX_MESSAGE_BYTES, ShuttingDown, Supervisor, UsageError

log = logging.getLogger("corral.api")

#: Largest request body read: a maximal message plus room for its JSON envelope.
MAX_BODY = MAX_MESSAGE_BYTES + 64 * 1024

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class HTTPError(Exception):
    """An error answered to the client, translated once at the boundary."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


async def _respond(send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body, ensure_ascii=False).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPError(400, "disconnected", "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise HTTPError(413, "too_large", f"the request body is over {MAX_BODY} bytes (a message may be {MAX_MESSAGE_BYTES})")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _json_object(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HTTPError(400, "bad_json", "the body must be a JSON object")
    return value


def _query_number(query: dict[str, list[str]], key: str, default: float | None, *, integer: bool = False) -> Any:
    if key not in query:
        return default
    raw = query[key][-1]
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise HTTPError(400, "bad_query", f"{key} must be a {'whole ' if integer else ''}number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise HTTPError(400, "bad_query", f"{key} must be >= 0, got {raw!r}")
    return value


class ControlAPI:
    """The ASGI application. ``token`` (for the TCP listener) makes every request need it."""

    def __init__(self, sup: Supervisor, *, shutdown: Callable[[], None], token: str | None = None) -> None:
        self.sup = sup
        self.shutdown = shutdown
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        try:
            self._authorize(scope)
            await self._route(scope, receive, send)
        except HTTPError as exc:
            await _respond(send, exc.status, {"error": {"code": exc.code, "message": exc.message}})
        except UsageError as exc:
            await _respond(send, 400, {"error": {"code": "bad_request", "message": str(exc)}})
        except ShuttingDown as exc:
            await _respond(send, 503, {"error": {"code": "shutting_down", "message": str(exc)}})
        except StoreError as exc:
            await _respond(send, 500, {"error": {"code": "store_failed", "message": str(exc)}})

    def _authorize(self, scope: Scope) -> None:
        if self.token is None:
            return
        headers = dict(scope.get("headers", []))
        given = headers.get(b"authorization", b"").decode("latin-1")
        if not hmac.compare_digest(given, f"Bearer {self.token}"):
            raise HTTPError(401, "unauthorized", "this listener needs 'Authorization: Bearer <token>'")

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        raw = scope.get("raw_path") or scope["path"].encode()
        path = raw.split(b"?", 1)[0].decode("latin-1")
        parts = [unquote(p) for p in path.strip("/").split("/")]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if parts[:1] != ["v1"]:
            raise HTTPError(404, "not_found", f"no route {method} {path}; the API lives under /v1/")
        rest = parts[1:]
        if rest == ["status"] and method == "GET":
            return await _respond(send, 200, self.sup.status())
        if rest == ["stop"] and method == "POST":
            await _read_body(receive)
            result = await self.sup.stop_all()
            return await _respond(send, 200 if result.ok else 500, result.to_json())
        if rest == ["shutdown"] and method == "POST":
            await _read_body(receive)
            self.shutdown()
            return await _respond(send, 202, {"shutting_down": True})
        if len(rest) == 3 and rest[0] == "channels":
            channel, action = rest[1], rest[2]
            handler = {
                ("messages", "POST"): self._send,
                ("stop", "POST"): self._stop,
                ("entries", "GET"): self._entries,
                ("events", "GET"): self._events,
                ("wait", "POST"): self._wait,
            }.get((action, method))
            if handler is not None:
                return await handler(channel, query, receive, send)
            if action in ("messages", "stop", "entries", "events", "wait"):
                raise HTTPError(405, "method_not_allowed", f"{method} is not allowed on {path}")
        raise HTTPError(404, "not_found", f"no route {method} {path}")

    async def _send(self, channel: str, query: Any, receive: Receive, send: Send) -> None:
        body = _json_object(await _read_body(receive))
        text = body.get("text")
        if not isinstance(text, str):
            raise HTTPError(400, "missing_field", "'text' (a string) is required")
        agent = body.get("agent")
        if agent is not None and not isinstance(agent, str):
            raise HTTPError(400, "bad_field", "'agent' must be a string")
        author = body.get("author", "user")
        if not isinstance(author, str) or not author:
            raise HTTPError(400, "bad_field", "'author' must be a non-empty string")
        if not author.startswith("human:"):
            author = f"human:{author}"
        accepted = await self.sup.send(channel, text, agent=agent, author=author)
        await _respond(send, 202, accepted.to_json())

    async def _stop(self, channel: str, query: Any, receive: Receive, send: Send) -> None:
        await _read_body(receive)
        result = await self.sup.stop(channel)
        await _respond(send, 200 if result.ok else 500, result.to_json())

    async def _entries(self, channel: str, query: Any, receive: Receive, send: Send) -> None:
        after = _query_number(query, "after", 0, integer=True)
        limit = _query_number(query, "limit", 10_000, integer=True)
        entries = await self.sup.entries(channel, after=after, limit=limit)
        await _respond(send, 200, {"channel": channel, "entries": [e.to_json() for e in entries]})

    async def _wait(self, channel: str, query: Any, receive: Receive, send: Send) -> None:
        await _read_body(receive)
        timeout = _query_number(query, "timeout", None)
        idle = await self.sup.wait_idle(channel, timeout)
        await _respond(send, 200 if idle else 408, {"channel": channel, "idle": idle})

    async def _events(self, channel: str, query: Any, receive: Receive, send: Send) -> None:
        after = _query_number(query, "after", 0, integer=True)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )
        async with trio.open_nursery() as nursery:

            async def until_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_disconnect)
            async for entry in self.sup.follow(channel, after):
                data = json.dumps(entry.to_json(), ensure_ascii=False)
                await send({"type": "http.response.body", "body": f"id: {entry.seq}\ndata: {data}\n\n".encode(), "more_body": True})
            nursery.cancel_scope.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
