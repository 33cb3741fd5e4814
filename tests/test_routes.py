"""The operations are declared once (``supervisor.serve.routes``): every face is checked against it.

The control API routes by the table; the client builds its requests from it; the asyncio host,
the Trio ``Supervisor`` and the CLI offer each operation with the table's parameters and defaults.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import click
import pytest
import trio
from conftest import make_config

from supervisor import cli
from supervisor.core import paging
from supervisor.host.supervisor import Supervisor
from supervisor.serve.api import ControlAPI
from supervisor.serve.asyncio_host import AsyncioSupervisor, open_asyncio_supervisor
from supervisor.serve.client import APIError, Client
from supervisor.serve.daemon import run_daemon
from supervisor.serve.routes import DEFAULT_AUTHOR, DEFAULT_LIMIT, OPERATIONS, REQUIRED, Operation, author_of

#: The fifteen operations every face offers.
NAMES = ["send", "stop", "stop_all", "reset", "resend", "wait", "entries", "follow", "queue", "cancel", "move_first",
         "status", "usage", "budget_reset", "shutdown"]

#: Each face's method for an operation (None: the face offers it otherwise, and why).
CLIENT = {name: name for name in NAMES}
TRIO = {**CLIENT, "wait": "wait_idle"}
ASYNCIO = {**TRIO, "shutdown": None}  # the end of the `async with` block shuts it down
#: Where a face's parameter may differ from the table's, and why.
DIFFERENCES = {
    # stop(None) stops every channel, as stop_all does.
    ("trio", "stop", "channel"): None,
    ("asyncio", "stop", "channel"): None,
    # A follow of None follows every channel (the dashboard's and the daemon's status watch).
    ("trio", "follow", "channel"): REQUIRED,
    ("asyncio", "follow", "channel"): REQUIRED,
    # The daemon's own readers (the service manager's line, the demo) want every channel; the
    # API asks the supervisor for the table's page.
    ("trio", "status", "limit"): None,
}


def test_the_table_declares_the_fifteen_operations() -> None:
    assert list(OPERATIONS) == NAMES
    for op in OPERATIONS.values():
        paths = [p.name for p in op.params if p.where == "path"]
        assert paths == [s[1:-1] for s in op.segments if s.startswith("{")], op.name
        assert op.ok and op.method in ("GET", "POST", "DELETE") and op.returns
    assert OPERATIONS["entries"].param("limit").default == DEFAULT_LIMIT
    assert OPERATIONS["send"].param("author").default == DEFAULT_AUTHOR
    status = OPERATIONS["status"]
    assert (status.param("limit").default, status.param("limit").maximum) == (paging.DEFAULT_PAGE, paging.MAX_PAGE)


def test_a_path_is_built_and_matched_the_same_way() -> None:
    op = OPERATIONS["entries"]
    assert op.target(channel="a/b c") == "/v1/channels/a%2Fb%20c/entries"
    assert op.match(["v1", "channels", "a/b c", "entries"]) == {"channel": "a/b c"}
    assert op.match(["v1", "channels", "a", "events"]) is None
    assert OPERATIONS["status"].match(["v1", "status"]) == {}


def _signature(fn: Callable[..., Any]) -> dict[str, Any]:
    """A method's parameters (self left out) and their defaults (REQUIRED: none)."""
    params = list(inspect.signature(fn).parameters.values())
    return {
        p.name: REQUIRED if p.default is inspect.Parameter.empty else p.default
        for p in params
        if p.name != "self"
    }


def _expected(face: str, op: Operation) -> dict[str, Any]:
    return {p.name: DIFFERENCES.get((face, op.name, p.name), p.default) for p in op.params}


@pytest.mark.parametrize(
    ("face", "cls", "methods"),
    [("client", Client, CLIENT), ("trio", Supervisor, TRIO), ("asyncio", AsyncioSupervisor, ASYNCIO)],
)
def test_each_face_offers_every_operation_with_the_tables_parameters(
    face: str, cls: type, methods: dict[str, str | None]
) -> None:
    assert set(methods) == set(OPERATIONS)
    for name, method in methods.items():
        if method is None:
            continue
        assert _signature(getattr(cls, method)) == _expected(face, OPERATIONS[name]), (face, name)


def test_the_api_has_a_handler_for_every_operation() -> None:
    for name in OPERATIONS:
        assert inspect.iscoroutinefunction(getattr(ControlAPI, f"_{name}")), name


def test_the_client_requests_what_the_table_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each client method sends its operation's method and path, and only its parameters."""
    sent: list[tuple[str, str, tuple[int, ...], dict[str, Any], dict[str, Any]]] = []
    headed: list[dict[str, str]] = []

    def request(self: Client, method: str, path: str, *, ok: tuple[int, ...] = (200, 202),
                params: dict[str, Any] | None = None, json_body: Any = None,
                headers: dict[str, str] | None = None) -> Any:
        sent.append((method, path, ok, params or {}, json_body or {}))
        headed.append(headers or {})
        return {"entries": [], "idle": True, "days": []}

    monkeypatch.setattr(Client, "_request", request)
    c = Client("/nowhere")
    calls: dict[str, Callable[[], object]] = {
        "send": lambda: c.send("a/b", "hi", agent="demo", to=["demo"]),
        "stop": lambda: c.stop("a/b"),
        "stop_all": lambda: c.stop_all(),
        "reset": lambda: c.reset("a/b", agent="demo", stop=True),
        "resend": lambda: c.resend("a/b", 9),
        "wait": lambda: c.wait("a/b", 3),
        "entries": lambda: c.entries("a/b", 5, 7),
        "queue": lambda: c.queue("a/b"),
        "cancel": lambda: c.cancel("a/b", 9),
        "move_first": lambda: c.move_first("a/b", 9),
        "status": lambda: c.status(),
        "usage": lambda: c.usage("a/b", "2026-12-01"),
        "budget_reset": lambda: c.budget_reset("bot"),
        "shutdown": lambda: c.shutdown(),
    }
    for name, call in calls.items():
        sent.clear()
        call()
        op = OPERATIONS[name]
        ((method, path, ok, params, body),) = sent
        target = op.target(channel="a/b", seq="9") if "{" in op.path else op.path
        assert (method, path, ok) == (op.method, target, op.ok), name
        assert set(params) <= {p.name for p in op.params if p.where == "query"}, name
        assert set(body) <= {p.name for p in op.params if p.where == "body"}, name
    assert sent[-1][3] == {}  # shutdown: nothing
    sent.clear()
    c.entries("x")
    assert sent[0][3] == {"after": 0, "limit": DEFAULT_LIMIT}
    sent.clear()
    headed.clear()
    c.send("x", "hi")
    assert sent[0][4] == {"text": "hi", "author": DEFAULT_AUTHOR} and headed == [{}]
    c.send("x", "hi", idempotency_key="k-1")  # a header parameter travels as its header
    assert headed[-1] == {OPERATIONS["send"].param("idempotency_key").header: "k-1"}


#: The CLI's command for each operation, and the flag that selects it there (if any).
COMMANDS = {
    "send": ("send", None), "stop": ("stop", None), "stop_all": ("stop", "stop_all"), "wait": ("wait", None),
    "reset": ("reset", None), "resend": ("resend", None),
    "entries": ("tail", None), "follow": ("tail", "follow"), "status": ("status", None), "usage": ("usage", None),
    "shutdown": ("shutdown", None), "queue": ("queue", None), "cancel": ("cancel", None),
    "move_first": ("first", None), "budget_reset": ("budget reset", None),
}


def _cli_default(command: click.Command, param: click.Parameter) -> Any:
    if param.required:
        return REQUIRED
    default = param.get_default(click.Context(command))
    # No default (click's sentinel, or an empty `multiple`): the option is simply not given.
    return None if type(default).__name__ == "Sentinel" or (param.multiple and default in ((), None)) else default


def test_the_cli_offers_every_operation_with_the_tables_defaults() -> None:
    assert set(COMMANDS) == set(OPERATIONS)
    for name, (command, flag) in COMMANDS.items():
        cmd: click.Command = cli.main
        for word in command.split():  # (`budget reset`: a command of a group)
            assert isinstance(cmd, click.Group)
            cmd = cmd.commands[word]
        params = {p.name: p for p in cmd.params}
        if flag is not None:
            assert isinstance(params[flag], click.Option) and params[flag].is_flag, (name, flag)
        for p in OPERATIONS[name].params:
            assert p.name in params or (name, p.name) in (("follow", "drafts"), ("entries", "newest")), (name, p.name)
            if (name, p.name) in (("follow", "drafts"), ("entries", "newest")):
                continue  # not options: `tail --follow` always shows the drafts, `tail` the newest entries
            default = _cli_default(cmd, params[p.name])
            if (name, p.name) == ("entries", "limit"):
                assert default is None  # a screenful for a person, every entry for --json (`tail --all`)
                continue
            if (name, p.name) == ("stop", "channel"):
                assert default is None  # optional there: `--all` instead
                continue
            if p.name == "author":
                default = author_of(default)
            assert default == p.default, (name, p.name)


def test_every_face_defaults_the_author_alike() -> None:
    """The API reads the table's default; every other face's default is the table's."""
    assert _signature(Client.send)["author"] == DEFAULT_AUTHOR
    assert _signature(AsyncioSupervisor.send)["author"] == DEFAULT_AUTHOR
    assert _signature(Supervisor.send)["author"] == DEFAULT_AUTHOR
    author = next(p for p in cli.main.commands["send"].params if p.name == "author")
    assert author_of(cast(str, author.default)) == DEFAULT_AUTHOR
    assert author_of("alice") == "human:alice" and author_of("agent:demo") == "agent:demo"


async def test_the_client_limits_entries_and_a_wrong_method_is_405(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    c = Client(str(config.server.socket))
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: run_daemon(config, handle_signals=False, subreaper=False, task_status=task_status)
        )
        try:
            await trio.to_thread.run_sync(lambda: c.send("c", "hi"))
            await trio.to_thread.run_sync(lambda: c.send("c", "hello", author="alice"))
            assert await trio.to_thread.run_sync(lambda: c.wait("c", 30))
            everything = await trio.to_thread.run_sync(lambda: c.entries("c"))
            assert len(everything) > 2
            first = await trio.to_thread.run_sync(lambda: c.entries("c", limit=1))
            assert first == everything[:1]
            last_two = await trio.to_thread.run_sync(lambda: c.entries("c", limit=2, newest=True))
            assert last_two == everything[-2:]
            assert [e["author"] for e in everything if e["author"].startswith("human:")] == ["human:user", "human:alice"]
            for method, path in (("GET", "/v1/stop"), ("POST", "/v1/status"), ("GET", "/v1/shutdown")):
                with pytest.raises(APIError) as caught:
                    await trio.to_thread.run_sync(lambda: c._request(method, path))
                assert (caught.value.status, caught.value.code) == (405, "method_not_allowed"), path
        finally:
            await trio.to_thread.run_sync(c.shutdown)
            c.close()


def test_the_asyncio_host_limits_entries(short_tmp: Path) -> None:
    async def main() -> tuple[int, int]:
        async with open_asyncio_supervisor(make_config(short_tmp)) as sup:
            await sup.send("bot", "hi")
            await asyncio.wait_for(sup.wait_idle("bot"), 30)
            everything = await sup.entries("bot")
            one = await sup.entries("bot", limit=1)
            await sup.stop_all()
        return len(everything), len(one)

    total, limited = asyncio.run(asyncio.wait_for(main(), 60))
    assert total > 1 and limited == 1

