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
from supervisor._ledger import OutputKind, StopLedger
from supervisor._turn import (
    Post,
    SavePlan,
    SaveSession,
    SessionRetry,
    TurnAccount,
    TurnOutcome,
    Warn,
    retry_without_session,
)

PACKAGE = Path(supervisor.__file__).parent


# ---------------------------------------------------------------- imports


def _imports(module: str) -> set[str]:
    """The ``supervisor`` modules ``module`` imports, at any level (TYPE_CHECKING blocks too:
    a cycle only the type checker sees is still two modules that cannot be read apart)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module)
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("supervisor."):
            found.add(node.module.removeprefix("supervisor."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if (PACKAGE / f"{name}.py").exists()}


def _graph() -> dict[str, set[str]]:
    return {path.stem: _imports(path.stem) for path in PACKAGE.glob("*.py")}


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
    assert _cycle(_graph()) is None


def test_a_turn_imports_nothing_of_the_supervisor() -> None:
    assert "_supervisor" not in _imports("_turn")
    assert "_supervisor" not in _imports("_hooks")


# ---------------------------------------------------------------- a turn's account (pure)


def test_deltas_make_one_message_when_the_run_closes() -> None:
    account = TurnAccount("agent:bot")
    assert account.on_event(Text("Hel", delta=True), silenced=False) == []
    assert account.on_event(Text("lo", delta=True), silenced=False) == []
    assert account.on_event(Status("working"), silenced=False) == [Post("message", "Hello"), Post("status", "working")]
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


def test_the_supervisors_internals_are_private() -> None:
    from supervisor._supervisor import Supervisor

    for name in ("ledger", "store", "registry", "hooks"):
        assert not hasattr(Supervisor, name)
