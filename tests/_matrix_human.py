"""The human's side of the Matrix tests: a second, independent Matrix client over httpx
(it shares nothing with corral's bridge), and the set-up of a bridged room."""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import trio
from scripts._synapse import Synapse


def _p(value: str) -> str:
    return quote(value, safe="")


@dataclass
class Human:
    """One Matrix user, with a sync loop of its own to see what the room shows."""

    url: str
    user: str
    token: str
    http: httpx.AsyncClient
    since: str | None = None
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _txn: Any = field(default_factory=lambda: itertools.count())

    async def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                   params: dict[str, str] | None = None, timeout: float = 40) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        if raw is not None:
            headers["Content-Type"] = "application/json"
        reply = await self.http.request(method, f"{self.url}/_matrix/client/v3{path}", json=body,
                                        content=raw, headers=headers, params=params, timeout=timeout)
        reply.raise_for_status()
        return reply.json()

    async def start(self) -> None:
        data = await self.call("GET", "/sync", params={"timeout": "0"})
        self.since = data["next_batch"]

    async def sync(self, timeout_ms: int = 5000) -> None:
        params = {"timeout": str(timeout_ms)}
        if self.since:
            params["since"] = self.since
        data = await self.call("GET", "/sync", params=params)
        self.since = data["next_batch"]
        for room, joined in data.get("rooms", {}).get("join", {}).items():
            self.events.setdefault(room, []).extend(joined.get("timeline", {}).get("events", []))

    async def wait_for(self, room: str, test: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        """The first event of ``room`` (seen so far or to come) that passes ``test``."""
        with trio.fail_after(timeout):
            while True:
                for event in self.events.get(room, []):
                    if test(event):
                        return event
                await self.sync()

    async def say(self, room: str, text: str, **content: Any) -> str:
        body = {"msgtype": "m.text", "body": text, **content}
        txn = f"h{next(self._txn)}{secrets.token_hex(3)}"
        reply = await self.call("PUT", f"/rooms/{_p(room)}/send/m.room.message/{txn}", body)
        return str(reply["event_id"])

    async def send_raw(self, room: str, kind: str, raw: bytes) -> str:
        reply = await self.call("PUT", f"/rooms/{_p(room)}/send/{kind}/r{secrets.token_hex(4)}", raw=raw)
        return str(reply["event_id"])

    async def react(self, room: str, target: str, key: str) -> str:
        body = {"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": key}}
        reply = await self.call("PUT", f"/rooms/{_p(room)}/send/m.reaction/x{secrets.token_hex(4)}", body)
        return str(reply["event_id"])

    async def create_room(self, invite: list[str], **extra: Any) -> str:
        body = {"preset": "private_chat", "invite": invite, **extra}
        return str((await self.call("POST", "/createRoom", body))["room_id"])


def body(event: dict[str, Any]) -> str:
    content = event.get("content", {})
    new = content.get("m.new_content")
    return str((new or content).get("body", ""))


def is_text(event: dict[str, Any], sender: str | None = None, contains: str = "") -> bool:
    return (event.get("type") == "m.room.message" and (sender is None or event.get("sender") == sender)
            and contains in body(event))


def messages(events: list[dict[str, Any]], sender: str) -> list[dict[str, Any]]:
    """``sender``'s messages, not counting edits (a draft's message is edited into the saved text)."""
    return [e for e in events if is_text(e, sender) and "m.new_content" not in e.get("content", {})]


@dataclass
class Accounts:
    """The session's users: registered once with ``register_new_matrix_user``."""

    bot: tuple[str, str]
    demo: tuple[str, str]
    reviewer: tuple[str, str]
    alice: tuple[str, str]
    bob: tuple[str, str]
    mallory: tuple[str, str]


def register_accounts(synapse: Synapse) -> Accounts:
    names = ["corralbot", "demo", "reviewer", "alice", "bob", "mallory"]
    got = {name: synapse.register(name, admin=(name == "alice")) for name in names}
    return Accounts(got["corralbot"], got["demo"], got["reviewer"], got["alice"], got["bob"], got["mallory"])


def write_token(folder: Path, name: str, token: str) -> Path:
    path = folder / f"{name}.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def bridge_table(folder: Path, synapse: Synapse, accounts: Accounts, rooms: dict[str, str], *,
                 agents: tuple[str, ...] = ("demo",), **extra: Any) -> dict[str, Any]:
    """A ``[bridges.matrix]`` table as a user writes it."""
    table: dict[str, Any] = {
        "type": "matrix",
        "homeserver": synapse.url,
        "user": accounts.bot[0],
        "token_file": str(write_token(folder, "bot", accounts.bot[1])),
        "admins": [accounts.alice[0]],
        "users": [accounts.bob[0]],
        "rooms": rooms,
        "retry_max": 2.0,
        "agents": {
            name: {"user": getattr(accounts, name)[0],
                   "token_file": str(write_token(folder, name, getattr(accounts, name)[1]))}
            for name in agents
        },
    }
    table.update(extra)
    return table


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()
