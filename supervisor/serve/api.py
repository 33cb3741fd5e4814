"""The control API: HTTP/1.1 + JSON (and Server-Sent Events) as a plain ASGI app.

Routes (a channel is one percent-encoded path segment, so it may contain ``/``), as
:mod:`.routes` declares them — the one table the client, the asyncio host and the CLI are
checked against:

===============================================  =============================================
``POST /v1/channels/{channel}/messages``         ``{"text", "agent"?, "to"?, "author"?, "delivery"?}``
                                                 (header ``Idempotency-Key``?) → 202 ``{seq, to, delivery, …}``
                                                 (429 ``queue_full``: the channel's ``max_queued``)
``POST /v1/channels/{channel}/stop``             → the stop result, once the stop is complete
``POST /v1/stop``                                stop every busy channel
``GET  /v1/channels/{channel}/entries?after=N``  committed entries after ``seq`` N (``&limit=``)
``GET  /v1/channels/{channel}/events?after=N``   the same, then live, as Server-Sent Events
``POST /v1/channels/{channel}/wait?timeout=S``   200 when idle, 408 on timeout
``POST /v1/channels/{channel}/reset``            ``{"agent"?, "stop"?}`` → 200 its entry; 409 while a turn runs
``POST /v1/channels/{channel}/resend``           ``{"seq"}``: a message a stop dropped, once → 202 as ``messages``
``GET  /v1/channels/{channel}/queue``            the waiting messages: place, author, agent, age, why
``DELETE /v1/channels/{channel}/queue/{seq}``     take one back (``?author=``) → 200; 409 running, 404
``POST /v1/channels/{channel}/queue/{seq}/first`` move one to the front of its lane → 200; 409, 404
``GET  /v1/status``                              daemon, agents, channels, running turns
``GET  /v1/usage?channel=&since=DAY``            what turns spent, per UTC day, channel and agent
``POST /v1/budget/reset``                        ``{"name"?}``: a daily budget starts again → 200
``POST /v1/shutdown``                            202, then an orderly shutdown
``GET  /metrics``                                what runs and waits, limits, stops, turns (Prometheus text)
===============================================  =============================================

On the loopback TCP listener (the one with a token) the same application serves the web
dashboard under ``/dashboard/`` (:mod:`.dashboard`); who may call what is decided in one
place, :meth:`ControlAPI._authorize`, with :mod:`.dashauth`.

``after=N`` names an entry by its seq: what was committed after it (one daemon: the greater
seqs; a fleet: the fleet's commit order, whatever each host's seqs). ``events?drafts=1`` also
streams the text agents are writing now, as ``draft`` events (``{"kind": "draft", "draft",
"text", …}``, no ``id:``: never stored); the ``message`` entry that saves a run names its draft
in ``meta.draft`` and replaces it.

Every error is JSON: ``{"error": {"code": …, "message": …}}`` with a 4xx/5xx status. A bad
request never disturbs the daemon or anything it has accepted.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote

from ..core.errors import ShuttingDown, UsageError
from ..core.queue import QueueEditRefused, QueueFull
from ..core.restart import ChannelBusy
from ..core.results import DELIVERIES
from ..host.supervisor import MAX_MESSAGE_BYTES, Supervisor, UnknownChannel
from ..store.store import Draft, StoreError
from .dashboard import KEEPALIVE_SECONDS, Dashboard, Emit, is_page, last_event_id, sse_event, stream_events
from .http import PEER_REFUSAL
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import render as render_metrics
from .routes import MAX_SEQ, OPERATIONS, Operation, Param, author_of

log = logging.getLogger("corral.api")

#: Largest request body read: a maximal message plus room for its JSON envelope.
MAX_BODY = MAX_MESSAGE_BYTES + 64 * 1024

Scope = dict[str, Any]
Query = dict[str, list[str]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class HTTPError(Exception):
    """An error answered to the client, translated once at the boundary."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class _Gone(Exception):
    """The client hung up: nothing more is sent on this request."""


class _Exchange:
    """One request's receive and send, so nothing is ever sent after the client hung up.

    ``gone`` is set by the ``http.disconnect`` message; ``started`` once a response began.
    """

    def __init__(self, receive: Receive, send: Send, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self._receive = receive
        self._send = send
        self.headers = headers or []
        """The request's headers, as ASGI gives them."""
        self.gone = False
        self.started = False

    async def receive(self) -> dict[str, Any]:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.gone = True
        return message

    async def send(self, message: dict[str, Any]) -> None:
        if self.gone:
            raise _Gone
        self.started = True
        await self._send(message)

    async def body(self) -> bytes:
        """The whole request body (read before anything is answered); :class:`_Gone` if the client left."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if self.gone:
                raise _Gone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                raise HTTPError(
                    413, "too_large",
                    f"the request body is over {MAX_BODY} bytes (a message may be {MAX_MESSAGE_BYTES})",
                )
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def respond(self, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Answer with ``body`` as JSON."""
        data = json.dumps(body, ensure_ascii=False).encode()
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
                + (headers or []),
            }
        )
        await self.send({"type": "http.response.body", "body": data})


def _json_object(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPError(400, "bad_json", f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise HTTPError(400, "bad_json", "the body is nested too deeply; send a flat JSON object") from None
    if not isinstance(value, dict):
        raise HTTPError(400, "bad_json", "the body must be a JSON object")
    return value


def _query_number(query: Query, param: Param) -> Any:
    """A number of the query, as its operation declares it (its default if absent)."""
    key, integer = param.name, param.kind is int
    if key not in query:
        return param.default
    raw = query[key][-1]
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise HTTPError(400, "bad_query", f"{key} must be a {'whole ' if integer else ''}number, got {raw!r}") from None
    maximum = param.maximum if param.maximum is not None else math.inf
    if not math.isfinite(value) or not 0 <= value <= maximum:
        raise HTTPError(400, "bad_query", f"{key} must be between 0 and {maximum:g}, got {raw[:40]!r}")
    return value


def _query_flag(query: dict[str, list[str]], key: str) -> bool:
    if key not in query:
        return False
    raw = query[key][-1]
    if raw not in ("0", "1", "true", "false"):
        raise HTTPError(400, "bad_query", f"{key} must be 1 or 0 (true or false), got {raw[:40]!r}")
    return raw in ("1", "true")


def _header(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    """A request header's value (the last one given), or None."""
    wanted = name.lower().encode()
    found = [value for key, value in headers if key.lower() == wanted]
    return found[-1].decode("latin-1") if found else None


def _path_seq(path: dict[str, str]) -> int:
    """A ``{seq}`` path segment: a positive whole number."""
    raw = path["seq"]
    if not raw.isdigit() or not 0 < int(raw) <= MAX_SEQ:
        raise HTTPError(400, "bad_seq", f"the seq in the path must be a positive whole number, got {raw[:40]!r}")
    return int(raw)


def _query_author(op: Operation, query: Query) -> str:
    """``?author=``: who edits the queue (a bare NAME is the human NAME)."""
    raw = query.get("author", [op.param("author").default])[-1]
    if not raw:
        raise HTTPError(400, "bad_query", "author must be a non-empty name")
    return author_of(raw)


class Request(NamedTuple):
    """The request's target, parsed once: method, path (without the query), decoded path
    segments and the query."""

    method: str
    path: str
    parts: list[str]
    query: Query


def _target(scope: Scope) -> Request:
    """Parse the request's target (a channel segment that is not UTF-8: :class:`HTTPError`)."""
    raw = scope.get("raw_path") or scope["path"].encode()
    path = raw.split(b"?", 1)[0].decode("latin-1")
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return Request(scope["method"], path, [_segment(p) for p in path.strip("/").split("/")], query)


def _segment(raw: str) -> str:
    """Decode one percent-encoded path segment; a channel name must be valid UTF-8."""
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise HTTPError(
            400, "bad_channel",
            f"{raw[:80]!r} is not valid UTF-8 once decoded; percent-encode the channel name's UTF-8 bytes",
        ) from None


class ControlAPI:
    """The ASGI application. ``token`` (for the TCP listener) makes every request need it."""

    def __init__(self, sup: Supervisor, *, shutdown: Callable[[], None], token: str | None = None) -> None:
        self.sup = sup
        self.shutdown = shutdown
        self.token = token
        #: The web dashboard, served where a token guards the listener (the loopback TCP one).
        self.dashboard = Dashboard(sup, token) if token is not None else None

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
        peer = _Exchange(receive, send, scope.get("headers"))
        try:
            await self._answer(scope, peer)
        except _Gone:
            log.debug("client went away during %s %s", scope.get("method"), scope.get("path"))

    async def _answer(self, scope: Scope, peer: _Exchange) -> None:
        """Route one request and map every error to JSON: the one error-mapping site (a
        browser's page without a session gets the dashboard's login page instead)."""
        request: Request | None = None
        extra: dict[str, Any] = {}
        try:
            # The whole request is read before anything is answered (a 401 included), so
            # the answer never races hypercorn's own reply to a half-sent body.
            body = await peer.body()
            request = _target(scope)
            self._authorize(scope, request.method, request.parts)
            await self._route(request, scope, body, peer)
            return
        except HTTPError as exc:
            if exc.status == 401 and self.dashboard is not None and request is not None \
                    and is_page(request.method, request.parts) and not peer.started:
                await self.dashboard.signed_out(peer)
                return
            status, code, message = exc.status, exc.code, exc.message
        except UnknownChannel as exc:
            status, code, message = 404, "unknown_channel", str(exc)
        except UsageError as exc:
            status, code, message = 400, "bad_request", str(exc)
        except ShuttingDown as exc:
            status, code, message = 503, "shutting_down", str(exc)
        except ChannelBusy as exc:
            status, code, message = 409, "busy", str(exc)
        except QueueEditRefused as exc:
            status, code, message = (409 if exc.code == "running" else 404), exc.code, str(exc)
            extra = {"running": [{"agent": a, "turn": t} for a, t in exc.running]} if exc.running else {}
        except QueueFull as exc:
            status, code, message = 429, "queue_full", str(exc)
            extra = {"depth": exc.depth, "limit": exc.limit}
        except StoreError as exc:
            status, code, message = 500, "store_failed", str(exc)
        except _Gone:
            raise
        except Exception as exc:
            log.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
            status, code = 500, "internal"
            message = f"internal error ({type(exc).__name__}); the daemon logged it and serves on"
        if not peer.started:
            await peer.respond(status, {"error": {"code": code, "message": message, **extra}})

    def _authorize(self, scope: Scope, method: str, parts: list[str]) -> None:
        """The one auth site: never a turn's process (nor a peer not identified); the bearer token, or a dashboard
        session (see :mod:`.dashauth`)."""
        refusal = scope.get("state", {}).get(PEER_REFUSAL)
        if refusal is not None:
            raise HTTPError(403, refusal.code, refusal.message)
        if self.token is None:
            return
        headers = dict(scope.get("headers", []))
        given = headers.get(b"authorization", b"").decode("latin-1")
        bearer = hmac.compare_digest(given, f"Bearer {self.token}")
        if self.dashboard is None:
            if not bearer:
                raise HTTPError(401, "unauthorized", "this listener needs 'Authorization: Bearer <token>'")
            return
        refusal = self.dashboard.refusal(method, parts, scope, bearer=bearer)
        if refusal is not None:
            raise HTTPError(refusal.status, refusal.code, refusal.message)

    async def _route(self, request: Request, scope: Scope, body: bytes, peer: _Exchange) -> None:
        method, path, parts, query = request
        if parts[:1] == ["dashboard"] and self.dashboard is not None:
            if await self.dashboard.answer(method, parts, query, scope, peer):
                return
            raise HTTPError(404, "not_found", f"no route {method} {path}")
        if parts == ["metrics"] and method == "GET":
            page = render_metrics(self.sup.summary(), self.sup.metrics).encode()
            await peer.send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", METRICS_TYPE), (b"content-length", str(len(page)).encode())]})
            return await peer.send({"type": "http.response.body", "body": page})
        if parts[:1] != ["v1"]:
            raise HTTPError(404, "not_found", f"no route {method} {path}; the API lives under /v1/")
        elsewhere = False  # the path is an operation's, of another method
        for op in OPERATIONS.values():
            found = op.match(parts)
            if found is None:
                continue
            if op.method != method:
                elsewhere = True
                continue
            handler: Callable[[Operation, dict[str, str], Query, bytes, _Exchange], Awaitable[None]] = getattr(
                self, f"_{op.name}"
            )
            return await handler(op, found, query, body, peer)
        if elsewhere:
            raise HTTPError(405, "method_not_allowed", f"{method} is not allowed on {path}")
        raise HTTPError(404, "not_found", f"no route {method} {path}")

    async def _status(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        after = query["after"][-1] if "after" in query else None
        limit = _query_number(query, op.param("limit"))
        await peer.respond(200, self.sup.status(after=after, limit=limit, idle=_query_flag(query, "idle")))

    async def _usage(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        channel = query["channel"][-1] if "channel" in query else None
        since = query["since"][-1] if "since" in query else None
        await peer.respond(200, {"days": await self.sup.usage(channel, since)})

    async def _budget_reset(
        self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange
    ) -> None:
        name = _json_object(body).get("name", op.param("name").default)
        if name is not None and not isinstance(name, str):
            raise HTTPError(400, "bad_field", "'name' must be a string (a channel or an agent)")
        await peer.respond(200, self.sup.budget_reset(name))

    async def _stop_all(
        self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange
    ) -> None:
        result = await self.sup.stop_all()
        await peer.respond(200 if result.ok else 500, result.to_json())

    async def _shutdown(
        self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange
    ) -> None:
        self.shutdown()
        await peer.respond(202, {"shutting_down": True})

    async def _send(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        channel = path["channel"]
        fields = _json_object(body)
        text = fields.get("text")
        if not isinstance(text, str):
            raise HTTPError(400, "missing_field", "'text' (a string) is required")
        agent = fields.get("agent")
        if agent is not None and not isinstance(agent, str):
            raise HTTPError(400, "bad_field", "'agent' must be a string")
        to = fields.get("to")
        if to is not None and (not isinstance(to, list) or not all(isinstance(t, str) and t for t in to)):
            raise HTTPError(400, "bad_field", "'to' must be a list of agent names, e.g. [\"claude\", \"codex\"]")
        author = fields.get("author", op.param("author").default)
        if not isinstance(author, str) or not author:
            raise HTTPError(400, "bad_field", "'author' must be a non-empty string")
        delivery = fields.get("delivery")
        if delivery is not None and delivery not in DELIVERIES:
            raise HTTPError(400, "bad_field", f"'delivery' must be one of {', '.join(map(repr, DELIVERIES))}")
        key = _header(peer.headers, op.param("idempotency_key").header or "")
        accepted = await self.sup.send(channel, text, agent=agent, to=to, author=author_of(author), delivery=delivery,
                                       idempotency_key=key)
        await peer.respond(202, accepted.to_json())

    async def _queue(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        await peer.respond(200, await self.sup.queue(path["channel"]))

    async def _cancel(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        result = await self.sup.cancel(path["channel"], _path_seq(path), author=_query_author(op, query))
        await peer.respond(200, result.to_json())

    async def _move_first(
        self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange
    ) -> None:
        result = await self.sup.move_first(path["channel"], _path_seq(path), author=_query_author(op, query))
        await peer.respond(200, result.to_json())

    async def _reset(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        fields = _json_object(body)
        agent = fields.get("agent", op.param("agent").default)
        if agent is not None and not isinstance(agent, str):
            raise HTTPError(400, "bad_field", "'agent' must be a string")
        stop = fields.get("stop", op.param("stop").default)
        if not isinstance(stop, bool):
            raise HTTPError(400, "bad_field", "'stop' must be true or false")
        entry = await self.sup.reset(path["channel"], agent=agent, stop=stop)
        await peer.respond(200, entry.to_json())

    async def _resend(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        seq = _json_object(body).get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 < seq <= MAX_SEQ:
            raise HTTPError(400, "missing_field", "'seq' (the dropped message's seq, a positive integer) is required")
        accepted = await self.sup.resend(path["channel"], seq)
        await peer.respond(202, accepted.to_json())

    async def _stop(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        result = await self.sup.stop(path["channel"])
        await peer.respond(200 if result.ok else 500, result.to_json())

    async def _entries(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        channel = path["channel"]
        after = _query_number(query, op.param("after"))
        limit = _query_number(query, op.param("limit"))
        newest = _query_flag(query, "newest")
        entries = await self.sup.entries(channel, after=after, limit=limit, newest=newest)
        await peer.respond(200, {"channel": channel, "entries": [e.to_json() for e in entries]})

    async def _wait(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        channel = path["channel"]
        timeout = _query_number(query, op.param("timeout"))
        idle = await self.sup.wait_idle(channel, timeout)
        await peer.respond(200 if idle else 408, {"channel": channel, "idle": idle})

    async def _follow(self, op: Operation, path: dict[str, str], query: Query, body: bytes, peer: _Exchange) -> None:
        channel = path["channel"]
        after = _query_number(query, op.param("after"))
        # An EventSource that reconnects by itself names the last seq it saw, not a new ?after=;
        # that entry came later in the stream (in a fleet the stream's order is the commit
        # order, which seqs from two hosts' clocks need not follow: not the greater seq).
        after = last_event_id(peer.headers) or after
        drafts = _query_flag(query, "drafts")
        await self.sup.require_channel(channel)  # an unknown channel is a 404, not an empty stream

        async def produce(emit: Emit) -> None:
            async with contextlib.aclosing(self.sup.follow(channel, after, drafts=drafts)) as items:  # type: ignore[type-var]
                async for item in items:
                    data = json.dumps(item.to_json(), ensure_ascii=False)
                    if isinstance(item, Draft):
                        # No id: a reconnect resumes after the last saved entry, never a draft.
                        await emit(sse_event(data, event="draft"))
                    else:
                        await emit(sse_event(data, event_id=item.seq))

        await stream_events(peer, produce, keepalive=KEEPALIVE_SECONDS)
