"""The code's shape: no import cycle, a turn that sees only its ports, decisions that are
pure functions from events to effects (tested here without Trio), shutdown decided by the
ledger, one error base, and a public surface without the internals.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import supervisor
from adapters._base import Error, Result, SessionId, StaleSession, Status, Text, TodoItem, Todos, ToolUse, Unparsed
from supervisor.core.account import Post, SavePlan, SaveSession, ShowDraft, TurnAccount, Warn
from supervisor.core.ledger import OutputKind, StopLedger
from supervisor.turns.ports import SessionRetry, TurnOutcome, retry_without_session

PACKAGE = Path(supervisor.__file__).parent


# ---------------------------------------------------------------- imports


def _module_names() -> list[str]:
    """Every module of the package, dotted from it (``host.supervisor``; ``__init__`` for a
    package's own file: ``core.__init__``)."""
    return sorted(".".join(path.relative_to(PACKAGE).with_suffix("").parts) for path in PACKAGE.rglob("*.py"))


def _file(module: str) -> Path:
    return PACKAGE.joinpath(*module.split(".")).with_suffix(".py")


def _resolve(name: str) -> str | None:
    """The module a dotted name imports: itself, or its package's ``__init__``."""
    if _file(name).exists():
        return name
    if _file(f"{name}.__init__").exists() if name else False:
        return f"{name}.__init__"
    return None


def _imports(module: str) -> set[str]:
    """The ``supervisor`` modules ``module`` imports, at any level (TYPE_CHECKING blocks too:
    a cycle only the type checker sees is still two modules that cannot be read apart)."""
    tree = ast.parse(_file(module).read_text())
    package = module.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("supervisor.")):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                target = (node.module or "").removeprefix("supervisor.")
            for alias in node.names:
                # ``from . import systemd`` names a module; ``from .ledger import X`` names a value.
                if (sub := _resolve(f"{target}.{alias.name}" if target else alias.name)) is not None:
                    found.add(sub)
            if (resolved := _resolve(target)) is not None:
                found.add(resolved)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def _graph() -> dict[str, set[str]]:
    return {name: _imports(name) for name in _module_names()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph, as a path that returns to its start; None if there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package() -> None:
    graph = _graph()
    # The graph reaches into every wing: an empty one would pass this test without reading them.
    assert {"host.supervisor", "core.ledger", "turns.process"} <= set(graph)
    assert "core.ledger" in graph["host.supervisor"]
    assert _cycle(graph) is None


def test_a_turn_imports_nothing_of_the_supervisor() -> None:
    assert "host.supervisor" in _imports("__init__")
    for module in ("turns.process", "turns.acp", "procs.hooks"):
        assert "host.supervisor" not in _imports(module)


# ---------------------------------------------------------------- a turn's account (pure)


def test_deltas_make_one_message_when_the_run_closes() -> None:
    account = TurnAccount("agent:bot", "t1")
    assert account.on_event(Text("Hel", delta=True), silenced=False) == [ShowDraft("t1.1", "Hel")]
    assert account.on_event(Text("lo", delta=True), silenced=False) == [ShowDraft("t1.1", "Hello")]
    assert account.on_event(Status("working"), silenced=False) == [
        Post("message", "Hello", {"draft": "t1.1"}), Post("status", "working")
    ]
    assert account.streamed == "Hello"


def test_a_session_id_neither_closes_the_run_nor_is_silenced() -> None:
    account = TurnAccount("agent:bot")
    account.on_event(Text("a", delta=True), silenced=False)
    assert account.on_event(SessionId("s1"), silenced=True) == [SaveSession("s1")]
    assert account.text == ["a"]


def test_a_silenced_turn_posts_nothing_and_saves_no_plan() -> None:
    account = TurnAccount("agent:bot")
    account.on_event(Text("a", delta=True), silenced=True)
    plan = Todos((TodoItem("x", "pending"),))
    assert account.on_event(plan, silenced=True) == []
    assert account.on_event(Error("boom"), silenced=True) == []
    assert account.error == "boom"  # still known: the verdict depends on it


def test_a_plan_is_saved_and_shown() -> None:
    effects = TurnAccount("bot").on_event(Todos((TodoItem("x", "in_progress"),)), silenced=False)
    items = [{"content": "x", "status": "in_progress"}]
    assert effects == [SavePlan(items), Post("todos", "[~] x", {"todos": items, "agent": "bot"})]


def test_tools_and_unparsed_lines() -> None:
    account = TurnAccount("bot")
    tool = Post("tool", "sh: ls", {"tool": "sh", "input": "ls"})
    assert account.on_event(ToolUse("sh", "ls"), silenced=False) == [tool]
    assert account.on_event(Unparsed("{", "bad json"), silenced=False) == [Warn("bad json", "{")]


def test_last_words_post_a_final_answer_only_if_it_was_not_streamed() -> None:
    account = TurnAccount("bot")
    account.on_event(Text("the answer"), silenced=False)
    account.on_event(Result("the answer"), silenced=False)
    words = account.last_words(None)
    assert (words.effects, words.ok, words.error) == ([], True, None)
    account.on_event(Result("more"), silenced=False)
    assert account.last_words(None).effects == [Post("message", "more")]


def test_last_words_of_failures() -> None:
    failed = TurnAccount("bot")
    failed.on_event(Result("no", ok=False), silenced=False)
    assert failed.last_words(None) == failed.last_words(None)  # no state moves
    words = failed.last_words(None)
    assert (words.effects, words.ok, words.error) == ([Post("error", "no")], False, "no")
    timeout = TurnAccount("bot").last_words("Turn ended: stall")
    why = "Turn ended: stall"
    assert (timeout.effects, timeout.ok, timeout.error) == ([Post("error", why)], False, why)
    silent = TurnAccount("bot").last_words(None)
    assert (silent.ok, silent.error) == (False, "the agent ended without a result")


def test_a_stale_session_says_nothing_and_is_retried_once() -> None:
    account = TurnAccount("bot")
    account.on_event(StaleSession("gone"), silenced=False)
    words = account.last_words(None)
    assert (words.effects, words.ok, words.error) == ([], False, None)
    outcome = TurnOutcome(stale_session=True)
    retry = SessionRetry("Session s1 is gone; starting a new conversation.")
    assert retry_without_session(outcome, "s1", stale=False) == retry
    assert retry_without_session(outcome, None, stale=False) is None  # it already ran without one
    assert retry_without_session(outcome, "s1", stale=True) is None  # stopped meanwhile
    assert retry_without_session(TurnOutcome(stale_session=True, stopped=True), "s1", stale=False) is None


# ---------------------------------------------------------------- shutdown is a ledger decision


def test_shutdown_silences_running_turns_and_keeps_the_queues() -> None:
    ledger = StopLedger()
    for channel in ("a", "b", "c"):
        ledger.accept(channel, "bot", 1, human=True)
        ledger.accept(channel, "bot", 2, human=True)
    ta = ledger.take("a", "bot", "ta").ticket
    tb = ledger.take("b", "bot", "tb").ticket
    assert ta is not None and tb is not None
    ledger.stop("b")  # b's turn is its stop's to end
    decision = ledger.shut_down()
    assert decision.turns == (("a", "ta"),)
    assert ledger.is_stale("a", "ta") and not ledger.may_start("a", "ta") and not ledger.keep_process("a", "ta")
    assert ledger.keep_output("a", "ta", OutputKind.SESSION) and not ledger.keep_output("a", "ta", OutputKind.OTHER)
    assert ledger.generation("a") == 0 and [m.id for m in ledger.queued("a")] == [2]  # runs after the restart
    assert [m.id for m in ledger.queued("c")] == [1, 2]
    assert ledger.take("c", "bot", "tc").ticket is None  # nothing begins once shut down
    assert ledger.end_turn("a", "ta", ok=True, unfinished_todos=3).nudge is False
    assert ledger.shut_down().turns == ()


def test_a_turn_whose_stop_is_undone_stays_silenced_by_the_shutdown() -> None:
    ledger = StopLedger()
    ledger.accept("a", "bot", 1, human=True)
    ledger.take("a", "bot", "ta")
    stop = ledger.stop("a")
    assert ledger.shut_down().turns == ()
    assert ledger.abort_stop(stop)
    assert ledger.is_stale("a", "ta")


# ---------------------------------------------------------------- errors and the public surface


def test_every_error_of_corral_is_a_corral_error() -> None:
    base = supervisor.CorralError
    for name in ("ConfigError", "StoreError", "StoreInUse", "UsageError", "UnknownChannel", "ShuttingDown",
                 "DaemonError", "DaemonUnavailable", "APIError"):
        assert issubclass(getattr(supervisor, name), base), name
    assert issubclass(supervisor.UsageError, ValueError) and issubclass(supervisor.StoreError, RuntimeError)


@pytest.mark.parametrize("name", ["StopLedger", "StopDecision", "Hooks"])
def test_internals_are_not_in_the_top_level_namespace(name: str) -> None:
    assert name not in supervisor.__all__
    with pytest.raises(AttributeError):
        getattr(supervisor, name)
    assert hasattr(importlib.import_module("supervisor.testing"), name)


def test_every_public_name_resolves_and_the_package_imports_without_trio() -> None:
    for name in supervisor.__all__:
        assert getattr(supervisor, name) is not None, name
    code = "import sys, supervisor; supervisor.CorralError; supervisor.ConfigError; print('trio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    assert out.stdout.strip() == "False"


def test_the_public_names_are_these() -> None:
    # The public face: a name added or dropped here is a change to what embedders import.
    assert sorted(supervisor.__all__) == [
        "APIError", "Accepted", "AgentConfig", "AsyncioSupervisor", "ChannelBusy", "Config", "ConfigError",
        "CorralError", "DaemonError", "DaemonUnavailable", "Draft", "Entry", "LedgerError", "Limits", "Problem",
        "QueueEditRefused", "QueueEditResult", "QueueFull", "SHUTDOWN_NOTICE",
        "STOP_NOTICE", "ServerConfig", "ShuttingDown", "StopResult", "StoreError", "StoreInUse", "Supervisor",
        "UnknownChannel", "UsageError", "__version__", "load_config", "open_asyncio_supervisor", "open_supervisor",
        "parse_config",
    ]


def test_the_core_wing_is_pure() -> None:
    # Every module of supervisor.core, imported in a fresh interpreter, loads neither Trio nor
    # anything that does I/O of corral's: the decisions are plain code the Trio layer drives.
    core = [name for name in _module_names() if name.startswith("core.") and not name.endswith("__init__")]
    assert {"core.ledger", "core.router", "core.catchup", "core.text", "core.account", "core.usage",
            "core.budget"} <= set(core)
    code = (
        "import importlib, sys\n"
        f"for name in {core!r}: importlib.import_module('supervisor.' + name)\n"
        "print(sorted(m for m in ('trio', 'psutil', 'hypercorn', 'sqlite3', 'psycopg', 'socket')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    assert out.stdout.strip() == "[]"
    # and nothing of the core imports another wing
    for name in core:
        assert {dep for dep in _imports(name) if not dep.startswith("core.")} <= {"__init__"}, name


def test_the_supervisors_internals_are_private() -> None:
    from supervisor.host.supervisor import Supervisor

    for name in ("ledger", "store", "registry", "hooks"):
        assert not hasattr(Supervisor, name)
