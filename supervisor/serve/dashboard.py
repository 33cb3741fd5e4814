"""The web dashboard: server-rendered pages, one small script, and a live status stream.

Served by the control API on the loopback TCP listener only (the one with a token); who
may use it is decided in :mod:`.dashauth`. Routes, under ``/dashboard``:

==========================================  ============================================
``GET  /dashboard/``                        the channel list (session)
``GET  /dashboard/channels/{channel}``      one channel's transcript (each turn's usage line under its
                                            answer), today's spend, its waiting messages (each with
                                            a ✕ that takes it back), send box and Stop (session)
``GET  /dashboard/events``                  the channel list's state, as Server-Sent Events (session)
``GET  /dashboard/login?code=C``            spend a login code: set the session cookie, redirect
``POST /dashboard/codes``                   mint a login code (the token only: ``corral dashboard``)
``GET  /dashboard/static/{file}``           the page's script and style sheet
==========================================  ============================================

The pages are HTML with every value escaped; what changes (entries, states) is filled in by
``static/dashboard.js`` with ``textContent`` only, from the control API's own endpoints: the
transcript from ``/v1/channels/{channel}/events``, the stop from ``/v1/channels/{channel}/stop``,
today's spend from ``/v1/usage`` (each row's ``line``: :func:`~supervisor.core.usage.spend_line`).
Nothing is shown that the store has not saved: the page renders entries as the SSE stream
delivers them, in ``seq`` order, and a stop's outcome only once the API has answered.

Every HTML answer carries a strict Content-Security-Policy: scripts from this origin only
(no inline script, no ``eval``), no plugins, no framing.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from importlib import resources
from typing import Any, Protocol
from urllib.parse import quote

import trio

from ..core.netpolicy import DEFAULT as DEFAULT_NETWORK
from ..host.supervisor import Supervisor
from . import dashauth
from .commits import open_commit_wakeups

#: Seconds between keep-alive comments on an idle event stream. Proxies and tunnels commonly
#: cut a response that is silent for 60 s (nginx's ``proxy_read_timeout``, cloud load
#: balancers' idle timeout): two comments per such window keep a stream open with one to
#: spare, at the cost of one wake-up per open stream every 30 s, and nothing else.
KEEPALIVE_SECONDS = 30.0
#: While any turn runs or a message waits, the status stream re-reads the state this often:
#: a turn that starts or ends stores no entry at that exact moment.
BUSY_REFRESH_SECONDS = 0.5
#: The status stream re-reads the state at most this often: a burst of entries (a stop-all of
#: 200 channels, many agents streaming) costs one re-read per interval, not one per entry.
MIN_REFRESH_SECONDS = 0.05

#: How many channels the list shows at once (busy ones first); the rest are a click away.
DASHBOARD_PAGE = 200

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
#: Headers of every page: the CSP, and nothing cached, sniffed, framed or referred.
PAGE_HEADERS = [
    (b"content-type", b"text/html; charset=utf-8"),
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
STATIC_TYPES = {
    "dashboard.js": b"text/javascript; charset=utf-8",
    "dashboard.css": b"text/css; charset=utf-8",
    "favicon.svg": b"image/svg+xml",
}

Emit = Callable[[bytes], Awaitable[None]]


class Peer(Protocol):
    """One request's connection, as the control API's exchange offers it."""

    gone: bool

    async def receive(self) -> dict[str, Any]:
        """The next ASGI message from the client."""

    async def send(self, message: dict[str, Any]) -> None:
        """Send an ASGI message (raises if the client hung up)."""

    async def respond(self, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """Answer with ``body`` as JSON."""


async def stream_events(peer: Peer, produce: Callable[[Emit], Awaitable[None]], *, keepalive: float) -> None:
    """Answer with Server-Sent Events: what ``produce`` emits, and a comment when idle ``keepalive`` s.

    The stream ends when the client hangs up or ``produce`` returns. Only this task sends,
    so the keep-alive never interleaves with an event.
    """
    await peer.send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream"),
                (b"cache-control", b"no-cache"),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    # At once, so the client sees the stream open (an EventSource's "open") before any event.
    await peer.send({"type": "http.response.body", "body": b": connected\n\n", "more_body": True})
    chunks_send, chunks = trio.open_memory_channel[bytes](0)
    async with trio.open_nursery() as nursery:

        async def until_disconnect() -> None:
            while (await peer.receive())["type"] != "http.disconnect":
                pass
            nursery.cancel_scope.cancel()

        async def producer() -> None:
            async with chunks_send:
                await produce(chunks_send.send)

        nursery.start_soon(until_disconnect)
        nursery.start_soon(producer)
        while True:
            chunk = b": keep-alive\n\n"
            with trio.move_on_after(keepalive):
                try:
                    chunk = await chunks.receive()
                except trio.EndOfChannel:
                    break
            if peer.gone:  # checked in the same step as the send: no _Gone inside the nursery
                break
            await peer.send({"type": "http.response.body", "body": chunk, "more_body": True})
        nursery.cancel_scope.cancel()
    if not peer.gone:
        await peer.send({"type": "http.response.body", "body": b"", "more_body": False})


def sse_event(data: str, *, event: str | None = None, event_id: int | None = None) -> bytes:
    """One Server-Sent Event (``data`` holds no newline: it is JSON)."""
    head = (f"event: {event}\n" if event else "") + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {data}\n\n".encode()


def last_event_id(headers: list[tuple[bytes, bytes]]) -> int:
    """The ``Last-Event-ID`` an EventSource sends when it reconnects by itself (0: none or not a seq)."""
    for name, value in headers:
        if name.lower() == b"last-event-id":
            raw = value.decode("latin-1").strip()
            if raw.isdigit() and len(raw) <= 19:
                return min(int(raw), 2**63 - 1)
    return 0


# ---------------------------------------------------------------- the channel list's state


def agent_states(channel: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each agent's state in a channel of ``status()``: idle, queued N, running since S (turn T), stopping;
    and, while it waits for a slot, its place in the admission queue and why (``waiting``).

    Reads a per-agent list (``"agents"``: a list, or an object keyed by agent) where status
    has one, else today's one-turn-per-channel shape.
    """
    per = channel.get("agents")
    if isinstance(per, Mapping):
        return [_agent_state({"agent": name, **dict(value)}) for name, value in sorted(per.items())]
    if isinstance(per, list):
        return [_agent_state(dict(value)) for value in per]
    turn = channel.get("turn")
    queued = int(channel.get("queued") or 0)
    if turn:
        return [{"agent": turn.get("agent"), "state": "running", "queued": queued, "turn": turn.get("id"),
                 "since": turn.get("started")}]
    return [{"agent": None, "state": "queued" if queued else "idle", "queued": queued, "turn": None, "since": None}]


def _agent_state(item: dict[str, Any]) -> dict[str, Any]:
    turn = item.get("turn")
    turn_id = turn.get("id") if isinstance(turn, Mapping) else turn
    since = item.get("since") or (turn.get("started") if isinstance(turn, Mapping) else None)
    queued = int(item.get("queued") or 0)
    state = item.get("state")
    if state not in ("idle", "queued", "running", "stopping"):
        state = "stopping" if item.get("stopping") else "running" if turn_id else "queued" if queued else "idle"
    waiting = item.get("waiting")
    return {"agent": item.get("agent") or item.get("name"), "state": state, "queued": queued, "turn": turn_id,
            "since": since, **({"waiting": dict(waiting)} if isinstance(waiting, Mapping) else {})}


def shown_network(network: Mapping[str, Any] | None) -> str | None:
    """An agent's network as a list row says it: only where the config chose it and it is not
    the default, enforced (``"internet"``, or the demo agent's own ``"none"``, would repeat on
    every row); a policy that is not enforced says so."""
    if not network:
        return None
    policy = str(network.get("policy"))
    if network.get("enforced") is False:
        return f"{policy}, NOT enforced"
    return None if policy == DEFAULT_NETWORK or network.get("implicit") else policy


def _group(agents: list[dict[str, Any]]) -> int:
    """A channel's place in the list: running (or stopping) first, then queued, then idle."""
    states = {a["state"] for a in agents}
    return 0 if states & {"running", "stopping"} else 1 if "queued" in states else 2


def list_view(status: Mapping[str, Any]) -> dict[str, Any]:
    """What the channel list shows, from a page of ``Supervisor.status()``: busy channels first
    (running, then queued), each group by name; agents (with each one's network where it is
    not the default's, see :func:`shown_network`); running turns; how many idle channels the
    page does not list (``idle``) and the cursor of the next page (``next``)."""
    agents = status.get("agents") or {}
    networks = {name: shown_network(agent.get("network")) for name, agent in agents.items()}
    channels = [
        {"name": name, "agents": [{**a, "network": networks.get(a["agent"])} if networks.get(a["agent"]) else a
                                  for a in agent_states(channel)]}
        for name, channel in status["channels"].items()
    ]
    channels.sort(key=lambda c: (_group(c["agents"]), c["name"]))
    running = status.get("running")
    if not isinstance(running, int):
        running = sum(1 for c in channels for a in c["agents"] if a["state"] in ("running", "stopping"))
    counts = status.get("channel_counts") or {}
    unlisted = 0 if status.get("idle_listed", True) else int(counts.get("idle") or 0)
    capacity = status.get("capacity") or {}
    return {"running": running, "channels": channels, "shutting_down": bool(status.get("shutting_down")),
            "waiting": len(capacity.get("waiting") or ()), "max_turns": capacity.get("max_turns"),
            "idle": unlisted, "total": int(counts.get("total") or len(channels)), "next": status.get("next")}


# ---------------------------------------------------------------- pages


#: The header's word for each sandbox state of :meth:`~supervisor.procs.sandbox.Sandbox.describe`.
SANDBOX_BADGES = {"on": "sandboxed", "unsandboxed": "NOT sandboxed", "off": "NOT sandboxed (off)",
                  "refused": "turns refused: no sandbox"}


def sandbox_badge(sandbox: Mapping[str, Any] | None) -> str:
    """The header's sandbox state: a word, and the supervisor's whole sentence on hover and
    for screen readers (a warning's colour when turns run unsandboxed or are refused)."""
    if not sandbox:
        return ""
    state = str(sandbox.get("state") or "")
    summary = str(sandbox.get("summary") or "")
    return (f"<span id=\"sandbox\" class=\"sandbox\" data-state=\"{html.escape(state)}\" "
            f"title=\"{html.escape(summary)}\" aria-label=\"{html.escape(summary)}\">"
            f"{html.escape(SANDBOX_BADGES.get(state, state))}</span>")


def _page(
    title: str, body_attrs: str, main: str, sandbox: Mapping[str, Any] | None = None, *, script: bool = True
) -> bytes:
    live = "<script src=\"/dashboard/static/dashboard.js\" defer></script>" if script else ""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{html.escape(title)}</title>"
        "<link rel=\"icon\" href=\"/dashboard/static/favicon.svg\">"
        "<link rel=\"stylesheet\" href=\"/dashboard/static/dashboard.css\">"
        f"{live}</head>"
        f"<body {body_attrs}><header><a class=\"home\" href=\"/dashboard/\">corral</a>{sandbox_badge(sandbox)}"
        "<span id=\"connection\" class=\"connection\" aria-live=\"polite\">Connecting…</span></header>"
        f"<main>{main}</main></body></html>\n"
    ).encode()


def list_page(sandbox: Mapping[str, Any] | None = None) -> bytes:
    """The channel list: filled in live by the script from ``/dashboard/events``; the header
    says whether turns are sandboxed (``sandbox``: the supervisor's ``describe()``)."""
    return _page(
        "corral — channels",
        "data-view=\"list\"",
        "<h1>Channels</h1>"
        "<div class=\"toolbar\"><p class=\"running\"><span id=\"running\">0</span> running"
        "<span id=\"waiting\"></span></p>"
        "<button id=\"stop-all\" type=\"button\" class=\"stop\">Stop all</button></div>"
        "<p id=\"ack\" class=\"ack\" role=\"status\"></p>"
        "<table id=\"channels\"><thead><tr><th scope=\"col\">Channel</th><th scope=\"col\">Agents</th></tr></thead>"
        "<tbody></tbody></table>"
        "<p id=\"more\" class=\"more\" hidden><span id=\"more-text\"></span> "
        "<a id=\"more-idle\" href=\"?idle=1\">List the idle channels</a> "
        "<a id=\"more-next\" href=\"?\">Next page</a></p>"
        "<p id=\"empty\" class=\"empty\" hidden>No channels yet: send a message with <code>corral send</code>.</p>",
        sandbox,
    )


def channel_page(
    channel: str, agents: list[str], default: str | None, sandbox: Mapping[str, Any] | None = None
) -> bytes:
    """One channel: the transcript (filled in live), the send box and the channel's Stop.

    The agent chooser's first choice sends no target: the server then addresses the
    message by its ``@mentions``, else to the channel's default agent.
    """
    automatic = f"@mentions, else {default}" if default else "@mentions"
    options = f"<option value=\"\">{html.escape(automatic)}</option>" + "".join(
        f"<option value=\"{html.escape(name)}\">{html.escape(name)}"
        f"{' (default)' if name == default else ''}</option>"
        for name in agents
    )
    return _page(
        f"corral — {channel}",
        f"data-view=\"channel\" data-channel=\"{html.escape(channel)}\"",
        f"<h1>{html.escape(channel)}</h1>"
        "<div class=\"toolbar\"><button id=\"stop\" type=\"button\" class=\"stop\">Stop</button>"
        "<button id=\"reset\" type=\"button\" title=\"Forget this channel's sessions and plans: the next message "
        "starts a new conversation\">Start over</button>"
        "<p id=\"ack\" class=\"ack\" role=\"status\"></p></div>"
        "<p id=\"spend\" class=\"spend\" aria-live=\"polite\"></p>"
        "<ol id=\"transcript\" class=\"transcript\" aria-label=\"Transcript\"></ol>"
        "<section id=\"waiting\" class=\"waiting\" hidden><h2>Waiting</h2>"
        "<ol id=\"queue\" class=\"queue\" aria-label=\"Waiting messages\"></ol></section>"
        "<form id=\"send\" class=\"send\">"
        "<label for=\"message\">Message</label>"
        "<textarea id=\"message\" name=\"text\" rows=\"2\" required></textarea>"
        "<div class=\"send-row\"><label for=\"agent\">Agent</label>"
        f"<select id=\"agent\" name=\"agent\">{options}</select>"
        "<label for=\"delivery\">If busy</label>"
        "<select id=\"delivery\" name=\"delivery\" title=\"What this message does to a turn the agent is running\">"
        "<option value=\"\">the channel's default</option><option value=\"queue\">queue it</option>"
        "<option value=\"interrupt\">interrupt the turn</option><option value=\"steer\">steer the turn</option>"
        "</select>"
        "<button type=\"submit\">Send</button></div>"
        "<p id=\"send-error\" class=\"send-error\" role=\"alert\"></p></form>",
        sandbox,
    )


def signed_out_page() -> bytes:
    """What a browser opening a page without a valid session gets (its cookie expired, the
    token changed, or it never logged in): how to log in, not the API's JSON 401."""
    return _page(
        "corral — log in",
        "data-view=\"signed-out\"",
        "<h1>Log in to the dashboard</h1>"
        "<p id=\"signed-out\">This browser has no dashboard session here (a session lasts 24 hours, and ends "
        "when the daemon's token changes). On the daemon's machine run <code>corral dashboard</code> and open the "
        "login URL it prints: it works once, for 2 minutes, and brings you back to the channel list.</p>",
        script=False,
    )


def is_page(method: str, parts: list[str]) -> bool:
    """A dashboard page a browser navigates to (HTML), not one of the script's requests."""
    rest = parts[1:]
    return method == "GET" and parts[:1] == ["dashboard"] and (
        rest in ([], [""]) or (len(rest) == 2 and rest[0] == "channels"))


def _static(name: str) -> bytes:
    return (resources.files("supervisor") / "static" / name).read_bytes()


class Dashboard:
    """The dashboard of one TCP listener: its login codes and its session key."""

    def __init__(self, sup: Supervisor, token: str, *, clock: Callable[[], float] = time.time) -> None:
        self.sup = sup
        self.key = dashauth.session_key(token)
        self.codes = dashauth.LoginCodes()
        self.clock = clock
        self.static = {name: _static(name) for name in STATIC_TYPES}

    def refusal(
        self, method: str, parts: list[str], scope: Mapping[str, Any], *, bearer: bool
    ) -> dashauth.Refusal | None:
        """Why this request may not go on (None: it may); see :func:`.dashauth.decide`."""
        server = scope.get("server") or ("", 0)
        return dashauth.decide(
            method, parts, scope.get("headers", []), port=int(server[1] or 0), key=self.key, now=self.clock(),
            bearer=bearer,
        )

    async def answer(self, method: str, parts: list[str], query: Mapping[str, list[str]], scope: Mapping[str, Any],
                     peer: Peer) -> bool:
        """Answer a ``/dashboard`` request (already authorized); False if there is no such route."""
        rest = parts[1:]
        if method == "GET" and rest in ([], [""]):
            await _send(peer, 200, PAGE_HEADERS, list_page(self.sup.sandbox.describe()))
        elif method == "GET" and len(rest) == 2 and rest[0] == "channels":
            config = self.sup.config
            members = list(config.members(rest[1]))  # the channel's default agent first
            page = channel_page(rest[1], members, members[0] if members else None, self.sup.sandbox.describe())
            await _send(peer, 200, PAGE_HEADERS, page)
        elif method == "GET" and rest == ["events"]:
            idle = (query.get("idle") or ["0"])[-1] in ("1", "true")
            after = (query.get("after") or [""])[-1] or None
            await stream_events(peer, partial(self._status_events, idle=idle, after=after),
                                keepalive=KEEPALIVE_SECONDS)
        elif method == "GET" and rest == ["login"]:
            await self._login(query, scope, peer)
        elif method == "POST" and rest == ["codes"]:
            code = self.codes.mint(self.clock())
            await peer.respond(
                201, {"code": code, "path": f"/dashboard/login?code={quote(code)}",
                      "expires_in": dashauth.CODE_SECONDS},
            )
        elif method == "GET" and len(rest) == 2 and rest[0] == "static" and rest[1] in self.static:
            headers = [(b"content-type", STATIC_TYPES[rest[1]]), (b"x-content-type-options", b"nosniff"),
                       (b"cache-control", b"no-cache")]
            await _send(peer, 200, headers, self.static[rest[1]])
        else:
            return False
        return True

    async def signed_out(self, peer: Peer) -> None:
        """Answer a page request refused for want of a session with the login page (401)."""
        await _send(peer, 401, PAGE_HEADERS, signed_out_page())

    async def _login(self, query: Mapping[str, list[str]], scope: Mapping[str, Any], peer: Peer) -> None:
        code = (query.get("code") or [""])[-1]
        now = self.clock()
        if not code or not self.codes.spend(code, now):
            await peer.respond(
                403, {"error": {"code": "bad_login_code", "message": (
                    "this login URL was used already or has expired (each works once, for "
                    f"{dashauth.CODE_SECONDS:g} s); run `corral dashboard` for a new one")}},
                [(b"cache-control", b"no-store"), (b"referrer-policy", b"no-referrer")],
            )
            return
        port = int((scope.get("server") or ("", 0))[1] or 0)
        headers = [
            (b"location", b"/dashboard/"),
            (b"set-cookie", dashauth.set_cookie(port, dashauth.new_session(self.key, now))),
            (b"cache-control", b"no-store"),
            (b"referrer-policy", b"no-referrer"),
            (b"content-type", b"text/plain; charset=utf-8"),
        ]
        await _send(peer, 303, headers, b"Logged in: go to /dashboard/\n")

    async def _status_events(self, emit: Emit, *, idle: bool = False, after: str | None = None) -> None:
        """The channel list's state now, then each time it changes: a page of ``status``
        (busy channels first; the idle ones too with ``idle``; from the cursor ``after``).

        A committed entry (of any channel) wakes it; while anything is running or queued it
        also re-reads every :data:`BUSY_REFRESH_SECONDS` (a turn starting or ending stores
        no entry at that moment). An idle daemon: nothing wakes it.
        """
        async with open_commit_wakeups(self.sup) as changes:
            last = ""
            while True:
                view = list_view(self.sup.status(after=after, limit=DASHBOARD_PAGE, idle=idle))
                data = json.dumps(view, ensure_ascii=False)
                if data != last:
                    await emit(sse_event(data, event="status"))
                    last = data
                busy = bool(view["channels"]) and _group(view["channels"][0]["agents"]) < 2  # busy ones come first
                read_at = trio.current_time()
                with trio.move_on_after(BUSY_REFRESH_SECONDS if busy else math.inf):
                    await changes.receive()
                await trio.sleep_until(read_at + MIN_REFRESH_SECONDS)  # at once if that time is past


async def _send(peer: Peer, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await peer.send(
        {"type": "http.response.start", "status": status,
         "headers": [*headers, (b"content-length", str(len(body)).encode())]}
    )
    await peer.send({"type": "http.response.body", "body": body})
