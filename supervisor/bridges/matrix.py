"""Matrix: a small client of the Client-Server API over httpx (which runs on Trio).

Why not matrix-nio or mautrix: both are asyncio clients (aiohttp) and corral is Trio; each
would need an asyncio loop beside Trio's, or nio's sans-I/O half with most of its weight
(its crypto and schema dependencies) for eight endpoints. End-to-end encryption, the one
thing that would justify a library, is out of scope: an encrypted room is refused with a
log line. So: whoami, the room directory, join, the encryption state, sync, send (with a
transaction id, which makes a repeated send one event), edits (``m.replace``) and
reactions (``m.annotation``). One account per agent, each with its own access token, posts
the agent's messages (no application service: it needs the homeserver's admin to install
a registration file and a listener the homeserver can reach; ordinary accounts work on
any homeserver, matrix.org included).

Errors: a connection failure, a timeout, a 5xx and ``M_LIMIT_EXCEEDED`` (its
``retry_after_ms``, or the ``Retry-After`` header) are :class:`.platform.Transient`; any
other 4xx is :class:`.platform.Refused`.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from .core import Edit, Inbound, Invited, Post, React, Reacted, Said, Unreadable, safe
from .platform import Batch, Refused, Transient

if TYPE_CHECKING:
    from ..config.settings import BridgeConfig

log = logging.getLogger("corral.bridges.matrix")

#: How long one sync long-polls (ms); the HTTP timeout is longer.
SYNC_TIMEOUT_MS = 30_000
#: Events per room per sync: a gap beyond it is logged (the sync says ``limited``).
TIMELINE_LIMIT = 200
def _filter(nonce: str) -> str:
    """The sync filter. ``nonce`` (a type no event has) makes it this connection's own:
    Synapse answers a repeated sync request from a cache for minutes, and a new store's
    first sync must not get an old token from another connection's request."""
    return json.dumps({**_FILTER, "account_data": {"not_types": ["*", f"org.corral.nonce.{nonce}"]}},
                      separators=(",", ":"))


_FILTER: dict[str, Any] = {
    "presence": {"not_types": ["*"]},
    "account_data": {"not_types": ["*"]},
    "room": {
        "timeline": {"limit": TIMELINE_LIMIT,
                     "types": ["m.room.message", "m.reaction", "m.room.encrypted", "m.room.encryption",
                               "m.room.member"]},
        "state": {"types": ["m.room.encryption"]},
        "ephemeral": {"not_types": ["*"]},
        "account_data": {"not_types": ["*"]},
    },
}


def _path(value: str) -> str:
    return quote(value, safe="")


class MatrixClient:
    """One account's calls (its own access token)."""

    def __init__(self, homeserver: str, token: str, http: httpx.AsyncClient) -> None:
        self.homeserver = homeserver.rstrip("/")
        self.token = token
        self.http = http

    async def call(self, method: str, path: str, body: Mapping[str, Any] | None = None,
                   params: Mapping[str, str] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        url = f"{self.homeserver}/_matrix/client/v3{path}"
        try:
            reply = await self.http.request(
                method, url, json=None if body is None else safe(body), params=params,
                headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout,
            )
        except httpx.TransportError as exc:  # refused, reset, timed out: the server is down or slow
            raise Transient(f"{method} {path}: {type(exc).__name__}: {exc or 'no answer'}") from None
        try:
            data = reply.json()
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        if reply.status_code == 429 or data.get("errcode") == "M_LIMIT_EXCEEDED":
            after = data.get("retry_after_ms")
            if not isinstance(after, int | float):
                header = reply.headers.get("retry-after")
                after = float(header) * 1000 if header and header.isdigit() else None
            raise Transient(f"{method} {path}: rate limited (M_LIMIT_EXCEEDED)",
                            retry_after=None if after is None else after / 1000)
        if reply.status_code >= 500:
            raise Transient(f"{method} {path}: {reply.status_code} {data.get('error', '')}".rstrip())
        if reply.status_code >= 400:
            raise Refused(f"{method} {path}: {reply.status_code} {data.get('errcode', '')} {data.get('error', '')}")
        return data


class MatrixPlatform:
    """A Matrix bridge's connection: the bridge account syncs; agents' accounts post."""

    kind = "matrix"
    can_edit = True
    idempotent_posts = True

    def __init__(self, config: BridgeConfig) -> None:
        assert config.homeserver and config.user and config.token_file
        self.config = config
        self.user = config.user
        self.http = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_keepalive_connections=8))
        self.bot = MatrixClient(config.homeserver, "", self.http)
        self.agents: dict[str, MatrixClient] = {}
        self.bridged: set[str] = set()
        self.scope = "0"
        self.filter = _filter(secrets.token_hex(6))
        self.own = {config.user, *(agent.user for agent in config.agents.values())}
        self.fresh: set[str] = set()
        """Rooms joined since the last sync: their timeline's events before the join are skipped."""

    async def connect(self) -> None:
        assert self.config.token_file is not None and self.config.homeserver is not None
        self.bot.token = self.config.token_file.read_text().strip()
        me = await self.bot.call("GET", "/account/whoami")
        if me.get("user_id") != self.user:
            raise Refused(f"the token in {self.config.token_file} is {me.get('user_id')!r}'s, not {self.user}'s")
        for name, agent in self.config.agents.items():
            client = MatrixClient(self.config.homeserver, agent.token_file.read_text().strip(), self.http)
            them = await client.call("GET", "/account/whoami")
            if them.get("user_id") != agent.user:
                raise Refused(f"agent {name}'s token in {agent.token_file} is {them.get('user_id')!r}'s, "
                              f"not {agent.user}'s")
            self.agents[name] = client

    async def rooms(self, configured: Mapping[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for room, channel in configured.items():
            room_id = room
            if room.startswith("#"):
                try:
                    found = await self.bot.call("GET", f"/directory/room/{_path(room)}")
                except Refused as exc:
                    log.error("matrix: the alias %s does not resolve (%s); it is not bridged", room, exc)
                    continue
                room_id = str(found.get("room_id"))
            if await self.join(room_id):
                out[room_id] = channel
        return out

    async def join(self, room: str) -> bool:
        try:
            await self.bot.call("POST", f"/join/{_path(room)}", {})
        except Refused as exc:
            log.error("matrix: cannot join %s (%s); it is not bridged", room, exc)
            return False
        if await self._encrypted(room):
            log.error("matrix: %s is end-to-end encrypted; corral's bridge does not support encrypted rooms "
                      "(out of scope): the room is not bridged. Use a room without encryption.", room)
            return False
        for name, client in self.agents.items():
            try:
                await client.call("POST", f"/join/{_path(room)}", {})
            except Refused as exc:
                log.error("matrix: agent %s cannot join %s (%s); invite it (its messages come from the bridge "
                          "account until then)", name, room, exc)
        self.bridged.add(room)
        self.fresh.add(room)
        return True

    async def _encrypted(self, room: str) -> bool:
        try:
            await self.bot.call("GET", f"/rooms/{_path(room)}/state/m.room.encryption/")
        except Refused:
            return False  # (404 M_NOT_FOUND: no encryption state)
        return True

    async def events(self, cursor: str | None) -> AsyncIterator[Batch]:
        since = cursor
        first = True  # (answered at once: the runner says it listens after the first batch)
        while True:
            params = {"filter": self.filter, "timeout": str(0 if first else SYNC_TIMEOUT_MS)}
            first = False
            if since:
                params["since"] = since
            data = await self.bot.call("GET", "/sync", params=params, timeout=SYNC_TIMEOUT_MS / 1000 + 30)
            token = data.get("next_batch")
            if not isinstance(token, str):
                raise Transient("sync: the answer has no next_batch")
            events = [] if since is None else self._read(data)  # (first sync: history is not replayed)
            since = token
            yield Batch(tuple(events), token)

    def _read(self, data: Mapping[str, Any]) -> list[Inbound]:
        out: list[Inbound] = []
        rooms = data.get("rooms") if isinstance(data.get("rooms"), dict) else {}
        assert isinstance(rooms, dict)
        for room, joined in (rooms.get("join") or {}).items():
            if not isinstance(joined, dict):
                continue
            timeline = joined.get("timeline") or {}
            if timeline.get("limited") and room in self.bridged and len(timeline.get("events") or []) >= TIMELINE_LIMIT:
                log.warning("matrix: more than %d events in %s since the last sync; the oldest are not read",
                            TIMELINE_LIMIT, room)
            events = timeline.get("events") or []
            if room in self.fresh:
                # Just joined: what was said before the bridge came is not replayed into the channel.
                self.fresh.discard(room)
                for i, event in enumerate(events):
                    if (isinstance(event, dict) and event.get("type") == "m.room.member"
                            and event.get("state_key") == self.user):
                        events = events[i + 1:]
            log.debug("matrix: sync: %d event(s) in %s: %s", len(events), room,
                      [(e.get("type"), e.get("sender")) for e in events if isinstance(e, dict)])
            for event in events:
                inbound = self._event(room, event)
                if inbound is not None:
                    out.append(inbound)
        for room, invited in (rooms.get("invite") or {}).items():
            for event in ((invited or {}).get("invite_state") or {}).get("events") or []:
                if (isinstance(event, dict) and event.get("type") == "m.room.member"
                        and event.get("state_key") == self.user
                        and (event.get("content") or {}).get("membership") == "invite"):
                    out.append(Invited(room, str(event.get("sender"))))
        return out

    def _event(self, room: str, event: Any) -> Inbound | None:
        if not isinstance(event, dict):
            return None
        kind, sender, event_id = event.get("type"), event.get("sender"), event.get("event_id")
        if not isinstance(sender, str) or not isinstance(event_id, str) or sender in self.own:
            return None  # (the bridge's own users: never listened to)
        content = event.get("content")
        if not isinstance(content, dict):
            return Unreadable(room, event_id, sender, "the event has no content")
        if kind == "m.room.encryption" or kind == "m.room.encrypted":
            if room in self.bridged:
                log.error("matrix: %s turned on end-to-end encryption; corral's bridge does not support encrypted "
                          "rooms: it stops reading the room (its messages are ignored)", room)
                self.bridged.discard(room)
            return None
        if room not in self.bridged:
            return None
        if kind == "m.reaction":
            relates = content.get("m.relates_to")
            if not isinstance(relates, dict) or not isinstance(relates.get("key"), str):
                return None
            return Reacted(room, event_id, sender, str(relates["key"]), str(relates.get("event_id")))
        if kind != "m.room.message":
            return None
        relates = content.get("m.relates_to")
        if isinstance(relates, dict) and relates.get("rel_type") == "m.replace":
            log.info("matrix: %s edited a message in %s; an edit is not run again", sender, room)
            return None
        msgtype, body = content.get("msgtype"), content.get("body")
        if msgtype == "m.notice":
            return None  # (bots speak in notices; answering one is how echo loops start)
        if msgtype not in ("m.text", "m.emote"):
            return Unreadable(room, event_id, sender, f"agents read text messages, not {msgtype!s}")
        if not isinstance(body, str):
            return Unreadable(room, event_id, sender, "the message has no text body")
        mentions: list[str] = []
        declared = content.get("m.mentions")
        if isinstance(declared, dict) and isinstance(declared.get("user_ids"), list):
            mentions += [u for u in declared["user_ids"] if isinstance(u, str)]
        mentions += [user for user in self._agent_users() if user in body]
        # The formatted (HTML) body is not read: the plain body is what a prompt gets.
        return Said(room, event_id, sender, body, tuple(dict.fromkeys(mentions)))

    def _agent_users(self) -> list[str]:
        return [agent.user for agent in self.config.agents.values()]

    def _client(self, agent: str | None) -> MatrixClient:
        return self.agents.get(agent, self.bot) if agent is not None else self.bot

    def _txn(self, key: str) -> str:
        return _path(f"corral.{self.scope}.{self.config.name}.{key}")

    async def post(self, op: Post) -> str:
        content: dict[str, Any] = {"msgtype": "m.notice" if op.notice else "m.text", "body": op.text}
        if op.reply_to:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": op.reply_to}}
        if not op.notice:
            content["m.mentions"] = {}
        reply = await self._client(op.agent).call(
            "PUT", f"/rooms/{_path(op.room)}/send/m.room.message/{self._txn(op.key)}", content)
        return str(reply.get("event_id"))

    async def edit(self, op: Edit, target: str) -> str:
        new = {"msgtype": "m.notice" if op.notice else "m.text", "body": op.text}
        content = {**new, "body": f"* {op.text}", "m.new_content": new,
                   "m.relates_to": {"rel_type": "m.replace", "event_id": target}}
        reply = await self._client(op.agent).call(
            "PUT", f"/rooms/{_path(op.room)}/send/m.room.message/{self._txn(op.key)}", content)
        return str(reply.get("event_id"))

    async def react(self, op: React) -> str:
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": op.target, "key": op.emoji}}
        reply = await self.bot.call("PUT", f"/rooms/{_path(op.room)}/send/m.reaction/{self._txn(op.key)}", content)
        return str(reply.get("event_id"))

    def server_of(self, sender: str) -> str | None:
        _, colon, server = sender.partition(":")
        return server if colon else None

    async def aclose(self) -> None:
        await self.http.aclose()
