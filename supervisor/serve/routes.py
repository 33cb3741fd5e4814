"""The control API's operations, declared once: method, path, parameters, what each returns.

Every face of a supervisor offers the same fifteen operations — send, stop, stop-all, reset,
resend, wait, entries, follow, queue, cancel, move-first, status, usage, budget-reset,
shutdown — and this
table is where they are written down. The
control API (:mod:`.api`) routes by it and reads its parameters' defaults and bounds from it;
the client (:mod:`.client`) builds its requests from it; the asyncio host
(:mod:`.asyncio_host`) and the CLI are checked against it by a test (``tests/test_routes.py``),
so a parameter added to one face and forgotten in another, or a default that drifts, fails
the build.

Standard library only, and only what the CLI has loaded anyway (``typing``, ``urllib.parse``):
the client imports it, and ``corral --version`` stays fast.

A channel is one percent-encoded path segment (``{channel}``), so a channel name may contain
``/``. ``after=N`` names an entry by its seq: what was committed after it.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple
from urllib.parse import quote

#: Who speaks when a message names no author: a human called ``user``.
DEFAULT_AUTHOR: Final = "human:user"
#: The largest ``after`` (a seq is a SQLite integer) and ``limit`` a query may ask for.
MAX_SEQ: Final = 2**63 - 1
MAX_LIMIT: Final = 100_000
#: How many entries ``entries`` answers when the query names no ``limit``.
DEFAULT_LIMIT: Final = 10_000
#: How many channels a ``status`` page lists by default, and at most (``core.paging`` holds
#: the same numbers; a test checks they agree).
DEFAULT_STATUS_PAGE: Final = 200
MAX_STATUS_PAGE: Final = 1000
#: The longest ``wait?timeout=`` in seconds (a year): anything longer is a mistake.
MAX_WAIT: Final = 365 * 86400.0


class Required:
    """The default of a parameter that has none: it must be given."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = Required()


class Param(NamedTuple):
    """One parameter of an operation.

    ``where`` is ``path`` (a ``{name}`` segment), ``query``, ``body`` (a field of the JSON
    object) or ``header`` (a request header, named in ``header``). ``kind`` is its type:
    ``str``, ``int``, ``float``, ``bool`` (a query's ``1``/``0``) or ``list`` (of strings).
    ``maximum`` bounds a number (its minimum is 0).
    """

    name: str
    kind: type
    where: str
    default: Any = REQUIRED
    maximum: float | None = None
    optional: bool = False
    """May be ``null`` / left out, and then means "not given" (``default`` is None)."""
    header: str | None = None
    """The request header that carries it (``where`` is ``header``)."""


class Operation(NamedTuple):
    """One operation of the control API."""

    name: str
    method: str
    path: str
    params: tuple[Param, ...]
    ok: tuple[int, ...]
    """The statuses that carry the operation's answer (any other is an error object)."""
    returns: str

    @property
    def segments(self) -> tuple[str, ...]:
        """The path's segments, ``{name}`` standing for a path parameter."""
        return tuple(self.path.strip("/").split("/"))

    def match(self, parts: list[str]) -> dict[str, str] | None:
        """The path parameters if ``parts`` (decoded segments) is this operation's path, else None."""
        if len(parts) != len(self.segments):
            return None
        found: dict[str, str] = {}
        for pattern, part in zip(self.segments, parts, strict=True):
            if pattern.startswith("{"):
                found[pattern[1:-1]] = part
            elif pattern != part:
                return None
        return found

    def target(self, **values: str) -> str:
        """The path with its parameters percent-encoded (each one segment)."""
        return "/" + "/".join(
            quote(values[p[1:-1]], safe="") if p.startswith("{") else p for p in self.segments
        )

    def param(self, name: str) -> Param:
        """The parameter called ``name``."""
        for param in self.params:
            if param.name == name:
                return param
        raise KeyError(f"{self.name} has no parameter {name!r}")


_CHANNEL = Param("channel", str, "path")
_AFTER = Param("after", int, "query", 0, MAX_SEQ)
_SEQ = Param("seq", int, "path", REQUIRED, MAX_SEQ)
_BY = Param("author", str, "query", DEFAULT_AUTHOR)

#: Every operation, by name, in the order the API documents them.
OPERATIONS: Final[dict[str, Operation]] = {
    op.name: op
    for op in (
        Operation(
            "send", "POST", "/v1/channels/{channel}/messages",
            (_CHANNEL, Param("text", str, "body"), Param("agent", str, "body", None, optional=True),
             Param("to", list, "body", None, optional=True), Param("author", str, "body", DEFAULT_AUTHOR),
             Param("delivery", str, "body", None, optional=True),
             Param("idempotency_key", str, "header", None, optional=True, header="Idempotency-Key")),
            (202,), "the accepted message once it is stored: {seq, to, generation, delivery, …}; a repeated "
            "Idempotency-Key (same author, within the window) answers the first acceptance again, "
            "`replayed: true`, and queues nothing (429 queue_full: the channel's max_queued refuses it)",
        ),
        Operation("stop", "POST", "/v1/channels/{channel}/stop", (_CHANNEL,), (200, 500),
                  "the stop result once the stop is complete (500: it could not be carried out)"),
        Operation("stop_all", "POST", "/v1/stop", (), (200, 500),
                  "the stop result of every busy channel, under \"channels\""),
        Operation("reset", "POST", "/v1/channels/{channel}/reset",
                  (_CHANNEL, Param("agent", str, "body", None, optional=True), Param("stop", bool, "body", False)),
                  (200,), "the entry that records the reset (409 busy while a turn runs there, unless `stop`)"),
        Operation("resend", "POST", "/v1/channels/{channel}/resend",
                  (_CHANNEL, Param("seq", int, "body", REQUIRED, MAX_SEQ)), (202,),
                  "the message a stop dropped, accepted again (once) as `send` answers"),
        Operation("wait", "POST", "/v1/channels/{channel}/wait",
                  (_CHANNEL, Param("timeout", float, "query", None, MAX_WAIT, optional=True)), (200, 408),
                  "{channel, idle}: 200 when idle, 408 on timeout"),
        Operation("entries", "GET", "/v1/channels/{channel}/entries",
                  (_CHANNEL, _AFTER, Param("limit", int, "query", DEFAULT_LIMIT, MAX_LIMIT),
                   Param("newest", bool, "query", False)), (200,),
                  "{channel, entries}: committed entries after seq `after`, at most `limit`, oldest first "
                  "(`newest`: the newest `limit` of them, as `tail -n` shows)"),
        Operation("follow", "GET", "/v1/channels/{channel}/events",
                  (_CHANNEL, _AFTER, Param("drafts", bool, "query", False)), (200,),
                  "the entries after `after`, then live ones, as Server-Sent Events (`drafts`: also the "
                  "text agents are writing now, as `draft` events)"),
        Operation("queue", "GET", "/v1/channels/{channel}/queue", (_CHANNEL,), (200,),
                  "{channel, depth, queued, running}: each waiting message's seq, entry, place, agent, author, "
                  "text, age and why it waits; each lane's running turn"),
        Operation("cancel", "DELETE", "/v1/channels/{channel}/queue/{seq}", (_CHANNEL, _SEQ, _BY), (200,),
                  "the queued message taken back (every agent's copy), with its record's seq; 409 running "
                  "(a turn took it: it is not taken back, stop the channel), 404 not_queued"),
        Operation("move_first", "POST", "/v1/channels/{channel}/queue/{seq}/first", (_CHANNEL, _SEQ, _BY), (200,),
                  "the queued message moved to the front of its lane(s), with its record's seq; 409, 404 "
                  "as cancel"),
        Operation("status", "GET", "/v1/status",
                  (Param("after", str, "query", None, optional=True),
                   Param("limit", int, "query", DEFAULT_STATUS_PAGE, MAX_STATUS_PAGE),
                   Param("idle", bool, "query", False)), (200,),
                  "the daemon, its agents, running turns and a page of its channels: busy ones first (running, "
                  "then queued), then the idle ones if `idle` (or if every channel fits in the page), at most "
                  "`limit` and about 56 KB; `channel_counts` counts them all, `next` is the `after` of the next "
                  "page (null: the last)"),
        Operation("usage", "GET", "/v1/usage",
                  (Param("channel", str, "query", None, optional=True),
                   Param("since", str, "query", None, optional=True)),
                  (200,), "{days}: what turns spent (tokens, tool calls, wall time, cost per currency), summed per "
                  "UTC day, channel and agent, from day `since` (YYYY-MM-DD; default: today) on"),
        Operation("budget_reset", "POST", "/v1/budget/reset", (Param("name", str, "body", None, optional=True),),
                  (200,), "{reset, day}: today's spend of the channel or agent `name` (default: every one) "
                  "forgotten, so its daily budget starts again and its waiting messages run; `reset` names "
                  "what had spent (400: no channel or agent of that name)"),
        Operation("shutdown", "POST", "/v1/shutdown", (), (202,), "{shutting_down: true}, then an orderly shutdown"),
    )
}


def author_of(name: str) -> str:
    """The author a face was given, in full: a bare ``NAME`` is the human ``human:NAME``
    (``agent:NAME`` is another bot posting for an agent)."""
    return name if name.startswith(("human:", "agent:")) else f"human:{name}"
