"""What every adapter is made of: the launch it builds, the events its parser emits.

Theory of operation
-------------------

An adapter is data plus two pure functions, in the style of h11: it never touches a
process, a file or a socket. The supervisor asks it

1. ``build_launch(request) -> Launch``: the argv, the environment additions, the working
   directory, what to write on stdin (or ``None`` for ``/dev/null``) and whether stdin then
   stays open for messages handed to the running turn, and any private files the CLI needs
   in its HOME (written by the supervisor before the spawn);
2. ``new_parser(request) -> Parser``: a small state machine that turns one decoded stdout
   line into zero or more events, and is told once how the process ended.

An adapter whose CLI takes a message mid-turn ("steering") says so as data too: its
``steer`` encodes one message as the bytes written on that open stdin (pure; the
supervisor writes them, asking the ledger first, and closes stdin at the turn's
:class:`Result`).

Events are frozen, slotted dataclasses. The supervisor maps them to transcript entries;
after a stop it keeps only :class:`SessionId` from the leftover lines — and counts every
:class:`Usage`, which is never an entry: what a stopped turn spent was still spent.

:class:`Usage` is each parser's reading of its CLI's own reports of what the model used.
A CLI reports running totals (Claude Code's result, a message's usage that grows as it
streams, ACP's cumulative session cost) or one figure per model call; its parser turns them
into *increments* over what it has already reported, so the turn's account only adds them
up, and never counts one model call twice. The one exception is a report that covers the
whole conversation, earlier turns included (Codex's ``turn.completed`` of a resumed thread):
it says so with ``cumulative``, and the account counts what it adds to the session's totals.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, Protocol

TodoStatus = Literal["pending", "in_progress", "completed", "cancelled"]
TODO_STATUSES: tuple[str, ...] = ("pending", "in_progress", "completed", "cancelled")

#: Longest preview of a tool's input kept in a ``tool`` entry.
TOOL_PREVIEW_CHARS = 200


# ---------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Text:
    """A piece of the agent's answer. ``delta`` marks a fragment of a longer text."""

    text: str
    delta: bool = False


@dataclass(frozen=True, slots=True)
class Status:
    """A progress line that is not part of the answer ("thinking…", "retrying…")."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The agent called a tool; ``preview`` is a bounded rendering of its input."""

    name: str
    preview: str


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool finished; ``preview`` is a bounded rendering of its output."""

    preview: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class TodoItem:
    """One item of an agent's plan."""

    content: str
    status: TodoStatus


@dataclass(frozen=True, slots=True)
class Todos:
    """The agent's whole current plan (it replaces the previous one)."""

    items: tuple[TodoItem, ...]


@dataclass(frozen=True, slots=True)
class SessionId:
    """The id the next turn passes to resume this conversation."""

    id: str


@dataclass(frozen=True, slots=True)
class Result:
    """The end of the turn as the CLI reports it; ``text`` is the final answer if any."""

    text: str = ""
    ok: bool = True


@dataclass(frozen=True, slots=True)
class Error:
    """Something went wrong that the user should see."""

    text: str


@dataclass(frozen=True, slots=True)
class StaleSession:
    """The CLI does not know the session id it was asked to resume."""

    text: str


@dataclass(frozen=True, slots=True)
class Unparsed:
    """A line the parser could not make sense of; logged, never fatal."""

    line: str
    reason: str


@dataclass(frozen=True, slots=True)
class Usage:
    """What the model used, as the CLI reported it: an increment over the parser's earlier
    reports of the turn (unless ``cumulative``). Never a transcript entry.

    The token counts are disjoint, whatever the CLI's own convention: ``input_tokens`` is the
    input read afresh (neither from the prompt cache nor written to it), ``cache_read_tokens``
    the input read from the cache, ``cache_write_tokens`` the input written to it, and
    ``output_tokens`` everything the model wrote (its reasoning included). ``cost`` is the
    CLI's own price of this increment in ``currency`` (ISO 4217, or another unit such as
    ``credits``); None when the CLI priced nothing. ``model``: the model the CLI names, if any.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: Decimal | None = None
    currency: str | None = None
    model: str | None = None
    cumulative: bool = False
    """The figures are the conversation's totals so far, earlier turns included (Codex reports
    its thread's): the turn's part is what they add to the session's totals before the turn."""

    @property
    def tokens(self) -> int:
        """Every token of the report: input (fresh, cached and cache-written) and output."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens


Event = Text | Status | ToolUse | ToolResult | Todos | SessionId | Result | Error | StaleSession | Unparsed | Usage


# ---------------------------------------------------------------- launch


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """Everything an adapter may use to build a turn's launch. Pure data."""

    prompt: str
    channel: str
    turn_id: str
    agent: str
    command: tuple[str, ...]
    """The configured command, or the adapter's default binary when not configured."""
    args: tuple[str, ...] = ()
    """Extra arguments from the agent's config, placed before the prompt."""
    session_id: str | None = None
    model: str | None = None
    cwd: str = "."
    """The fixed working directory of this channel and agent."""
    home: str = "."
    """A private HOME (and TMPDIR parent) for this agent in this channel; the CLI writes its state there."""
    options: Mapping[str, object] = field(default_factory=dict)
    """Adapter-specific keys from the agent's config (e.g. ``resume_args``, ``prompt``)."""
    unattended: bool = True
    """Run without permission prompts: nobody in a chat can answer one."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The agent's configured ``env`` (the supervisor adds it to the environment itself): a
    parser may read it to name what the CLI was pointed at (a gateway's base URL)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one turn's process."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added to the scrubbed environment."""
    cwd: str = "."
    stdin: bytes | None = None
    """``None``: stdin is ``/dev/null``. Bytes: written to a pipe (nothing, if empty), then
    closed — unless ``keep_stdin``."""
    keep_stdin: bool = False
    """The pipe stays open after ``stdin`` for the adapter's ``steer`` messages, until the
    parser reports the turn's :class:`Result` (or the process ends); then it is closed."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Files to create before the spawn, by path (absolute, or relative to HOME)."""


class Parser(Protocol):
    """Turns a CLI's stdout lines into events. No I/O."""

    def feed(self, line: str) -> list[Event]:
        """Parse one line (without its newline)."""
        ...

    def feed_stderr(self, line: str) -> list[Event]:
        """Parse one stderr line (without its newline): a stale session, a failure's words.

        Most of what a CLI prints there is log; a parser keeps what explains a failure and
        returns events only for what the turn's outcome depends on.
        """
        ...

    def finish(self, returncode: int | None, *, interrupted: bool) -> list[Event]:
        """Called once when the process has ended; may add a final Result or Error."""
        ...

    # Optional: ``end_text_run()`` — a parser whose text deltas are whole lines has it: the
    # turn then stores an open run once the agent goes quiet, and calls it to start a new run.


@dataclass(frozen=True, slots=True)
class OptionProblem:
    """One thing wrong in an agent's adapter options: the key (under ``agents.NAME.``), what, and the fix."""

    key: str
    message: str
    fix: str


@dataclass(frozen=True, slots=True)
class CheckedOptions:
    """What an adapter makes of its own ``[agents.NAME]`` keys (:attr:`Adapter.check_options`):
    the options a turn gets (a bad value left out, so its default stands), what is wrong with
    the rest, and the command they name instead of ``command`` (an ACP preset's program), with
    the key that named it."""

    options: Mapping[str, Any]
    problems: tuple[OptionProblem, ...] = ()
    command: tuple[str, ...] | None = None
    command_key: str | None = None
    """The key that names (or tried to name) the command: a problem there is reported, not "no command"."""


def keep_options(options: Mapping[str, Any]) -> CheckedOptions:
    """The check of an adapter whose options take any value: all of them kept."""
    return CheckedOptions(dict(options))


@dataclass(frozen=True, slots=True)
class Adapter:
    """A CLI corral knows how to run."""

    name: str
    default_command: tuple[str, ...]
    build_launch: Callable[[TurnRequest], Launch]
    new_parser: Callable[[TurnRequest], Parser]
    interrupt_signal: signal.Signals = signal.SIGINT
    """Sent to the process group first on a stop; the CLI's chance to clean up."""
    option_keys: frozenset[str] = frozenset()
    """Extra ``[agents.NAME]`` keys this adapter accepts."""
    runs: Literal["per_turn", "persistent"] = "per_turn"
    """``per_turn``: a CLI process per turn, its stdout parsed line by line (``new_parser``).
    ``persistent``: one long-lived agent process per (channel, agent) that each turn prompts
    (ACP); ``build_launch`` then starts that process and ``new_parser`` is never called."""
    model_hosts: tuple[str, ...] = ()
    """The hosts its CLI's model API lives on (names or ``*.domain``): what ``network =
    "model"`` allows, besides a base URL the agent's config names. Data, like the rest."""
    steer: Callable[[str], bytes] | None = None
    """How one message handed to the running turn is written on its stdin (a launch with
    ``keep_stdin``); None: this CLI cannot take a message mid-turn, and it is queued."""
    install: str | None = None
    """The command that installs the CLI (``npm install -g …``): what the config check says
    when its default command is not on PATH."""
    check_options: Callable[[Mapping[str, Any]], CheckedOptions] = keep_options
    """Checks the agent's own keys (those of :attr:`option_keys` it has), pure: the config asks
    it, and knows nothing of any adapter's options."""
    needs_command: tuple[str, str] = ("needs a command", 'add command = ["program"]')
    """What the config says, and the fix, when an adapter without a default command is given
    none (neither ``command`` nor an option that names one)."""
    login: tuple[str, str] | None = None
    """Where its CLI keeps its login and the variable of its API key (``("~/.claude/.credentials.json",
    "ANTHROPIC_API_KEY")``): what corral's not-logged-in error names."""
    memory_estimate: int = 256 << 20
    """Bytes one of its turns is assumed to hold unless the agent's ``memory_estimate`` says
    (admission and the derived turn limit): measured, the Node CLIs hold 150 to 700 MB."""
    logs_in: bool | None = None
    """Its CLI logs in to a model service, so corral says its not-logged-in error with the fix
    (None: when it has a :attr:`login`)."""
    network: str | None = None
    """The network policy its agents get when neither the agent nor ``[server]`` names one
    (None: corral's default, ``"internet"``): an adapter whose CLI talks to no one declares
    ``"none"``, so its turns get no proxy and no namespace helper they would never use."""


def preview(value: object, limit: int = TOOL_PREVIEW_CHARS) -> str:
    """A one-line rendering of ``value`` bounded to ``limit`` characters."""
    if isinstance(value, str):
        text = value
    else:
        import json

        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError):
            text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_todos(raw: object) -> Todos | None:
    """Read a todo list shaped like ``[{"content": str, "status": str}, …]``; None if it is not one."""
    if not isinstance(raw, list):
        return None
    items = []
    for item in raw:
        if not isinstance(item, dict):
            return None
        content = item.get("content")
        status = item.get("status")
        if not isinstance(content, str) or status not in TODO_STATUSES:
            return None
        items.append(TodoItem(content=content, status=status))
    return Todos(tuple(items))
