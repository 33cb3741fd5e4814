"""The ``aider`` adapter: Aider (PyPI ``aider-chat``) in one-shot ``--message-file`` mode.

Aider prints plain text, not JSON, and has no session ids. Its conversation lives in a
markdown chat history file that ``--restore-chat-history`` reads back, so corral's
"session id" for aider is the *name of that file* inside the channel's working directory
(aider runs with ``cwd=request.cwd``, so a bare name resolves there):

* a fresh turn writes a new file, ``.aider.chat.history.<turn id>.md``. A new name per
  conversation matters: aider only ever appends, so reusing one fixed name after corral
  dropped a session would silently restore the old conversation on the next resume;
* a turn with ``request.session_id`` passes ``--chat-history-file <id> --restore-chat-history``.
  A missing file is not an error for aider (it creates it and starts afresh), so there is
  no stale-session case to report.

Measured facts about aider 0.86.2 that shape the launch (see the report in
``tests/data/captures/aider/README.md``):

* The prompt is passed with ``--message-file=PATH``, a 0600 file in the agent's private
  home: out of argv, where every user of the machine could read it, and never parsed as
  an option (``--message TEXT`` fails on a prompt that starts with ``-``).
* Without a TTY aider still answers every confirmation: ``--yes-always`` says yes to all of
  them *except* running shell commands (it refuses those); without ``--yes-always``, stdin
  at EOF makes every question take its default — which is yes, shell commands included.
  So an attended turn (``unattended=False``) gets ``--no-suggest-shell-commands``: nobody can
  approve a command, and EOF must not count as approval.
* Tool messages wrap at 80 columns when stdout is not a terminal; ``COLUMNS`` widens them so
  one error stays on one line. ``--no-pretty`` stops the rule lines and 80-column padding.
* A failing model API is retried for about a minute, then aider exits **0**; the parser
  therefore turns "errors and no answer" into ``Result(ok=False)``.
* SIGINT while streaming: aider prints ``^C again to exit`` and exits 0 with the partial
  answer saved in the history file; during a shell command it dies with a traceback (-2).

Usage, as it goes: after each model call aider prints ``Tokens: 2.3k sent[, N cache write][,
N cache hit], 13 received.`` — that call's figures, rounded as printed (``2.3k``: to a
hundred below 10k, to a thousand above) — and, when it has a price for the model, ``Cost:
$0.01 message, $0.05 session.`` (on the same line, or on the next when both cache figures
are there). Each Tokens line is one :class:`Usage`; "sent" includes the cache's tokens
(litellm's prompt count), which are taken out of the fresh input. The cost is the
*session's* figure, less what was already reported: rounded once, not once per call.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from ._base import (
    Adapter,
    Error,
    Event,
    Launch,
    Result,
    SessionId,
    Status,
    Text,
    ToolResult,
    ToolUse,
    TurnRequest,
    preview,
)
from ._common import UsageTotals, money

#: Flags every turn gets, before the configured args so that a configured ``--git`` or
#: ``--pretty`` (aider's flags are last-one-wins) can undo them.
BASE_ARGS: tuple[str, ...] = (
    # Plain text: no horizontal rules, no markdown rendering padded to the terminal width.
    "--no-pretty",
    "--no-fancy-input",
    # No network calls and no questions that have nothing to do with the prompt.
    "--no-check-update",
    "--no-show-release-notes",
    "--no-analytics",
    "--no-show-model-warnings",
    # Without git, aider would (with --yes-always) create a repository in the channel's
    # directory, edit its .gitignore and commit every change; opt in with ``--git``.
    "--no-git",
    # A URL in the prompt would otherwise make aider offer to pip-install Playwright.
    "--disable-playwright",
    # The input history only feeds aider's interactive prompt, which corral never shows.
    "--input-history-file",
    "/dev/null",
)

#: Added to the environment: wide enough that aider's messages are never wrapped.
ENV: dict[str, str] = {"COLUMNS": "4096"}

#: What a fresh conversation's history file is called (``{}`` is the sanitised turn id).
HISTORY_FILE_TEMPLATE = ".aider.chat.history.{}.md"

_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
#: A plain file name: safe characters, no "/", not "." or "..", not an option ("-x").
_SAFE_NAME = re.compile(r"(?!\.{1,2}\Z)[A-Za-z0-9._][A-Za-z0-9._-]{0,199}")


def history_file_for(turn_id: str) -> str:
    """The history file name a fresh conversation started by turn ``turn_id`` uses."""
    stem = _UNSAFE_CHARS.sub("-", turn_id).strip("-.")[:80] or "session"
    return HISTORY_FILE_TEMPLATE.format(stem)


def is_valid_session(session_id: str | None) -> bool:
    """Whether ``session_id`` is a plain file name in the working directory.

    A session id comes back from corral's store, so it must not be able to point aider at a
    file elsewhere (``../x``, ``/etc/passwd``) or read as an option (``-x``).
    """
    return session_id is not None and _SAFE_NAME.fullmatch(session_id) is not None


def session_file(request: TurnRequest) -> str:
    """The chat history file this turn reads and appends to."""
    if request.session_id is not None and is_valid_session(request.session_id):
        return request.session_id
    return history_file_for(request.turn_id)


def build_launch(request: TurnRequest) -> Launch:
    """Defaults, model, configured args, the history file, then ``--message=PROMPT``."""
    argv: list[str] = [*request.command, *BASE_ARGS]
    if request.unattended:
        argv.append("--yes-always")
    else:
        # Nobody can answer "Run shell command?"; with stdin at EOF aider would take the
        # default answer, yes, so the only way to not run commands is not to suggest them.
        argv.append("--no-suggest-shell-commands")
    if request.model:
        argv += ["--model", request.model]
    argv += request.args
    argv += ["--chat-history-file", session_file(request)]
    if is_valid_session(request.session_id):
        argv.append("--restore-chat-history")
    # The prompt goes in a 0600 file in the agent's private home, not in argv where every
    # user of the machine can read it; one file per channel, rewritten each turn.
    message = message_file(request)
    argv.append(f"--message-file={posixpath.join(request.home, message)}")
    return Launch(argv=tuple(argv), env=dict(ENV), cwd=request.cwd, stdin=None, files={message: request.prompt})


def message_file(request: TurnRequest) -> str:
    """Where (relative to the agent's home) this channel's prompt is written for ``--message-file``."""
    return f"tmp/aider-message-{hashlib.sha256(request.channel.encode()).hexdigest()[:16]}.txt"


# ---------------------------------------------------------------- parsing

#: Banner lines that repeat identically every turn; dropped so they do not fill the
#: channel's transcript (the model is in the agent's config anyway).
_BANNER = re.compile(
    r"^(?:Aider v\d\S*|(?:Main |Weak |Editor )?[Mm]odel: .*|Git repo: .*|Repo-map: .*"
    r"|Analytics have been permanently disabled\.)$"
)
_BANNER_START = re.compile(r"^Aider v\d")
_USAGE = re.compile(r"^Tokens: \S+ sent\b.* received\.(?: Cost: .*)?$|^Cost: \$\S+ message, \$\S+ session\.$")
_TOKENS = re.compile(r"^Tokens: (?P<sent>[\d.]+k?) sent, (?:(?P<write>[\d.]+k?) cache write, )?"
                     r"(?:(?P<hit>[\d.]+k?) cache hit, )?(?P<received>[\d.]+k?) received\.")
_COST = re.compile(r"Cost: \$[\d.]+ message, \$(?P<session>[\d.]+) session\.$")
_RETRY = re.compile(r"^Retrying in [\d.]+ seconds\.\.\.$")
_RUNNING = re.compile(r"^Running (.+)$")
_OUTPUT_ADDED = re.compile(r"^Added \d+ lines? of output to the chat\.$")
_EDITED = re.compile(r"^Applied edit to (.+)$")
_COMMIT = re.compile(r"^Commit [0-9a-f]{7,40} .+$")
_INTERRUPT = re.compile(r"^\^C (?:again to exit|KeyboardInterrupt)$")
#: aider rejecting the reply's edit blocks and asking the model again (it recovers itself).
_REFLECTION = re.compile(r"^The LLM did not conform to the edit format\.$|^https://aider\.chat/docs/\S*$")
#: aider's model-metadata download failing offline is harmless: it falls back to defaults.
_METADATA_FETCH = re.compile(r"model_prices_and_context_window\.json")
#: Errors aider prints during or after an answer: phrased so that a reply rarely matches.
_ERROR = re.compile(
    r"^(?:litellm\.[A-Za-z]+: "  # litellm.AuthenticationError: …, litellm.InternalServerError: …
    r"|The API provider\b"  # aider's explanations of litellm errors
    r"|Empty response received from LLM\."
    r"|Only \d+ reflections allowed, stopping\."
    r"|Unable to commit: |Unable to create .*, skipping edits\.$"
    r"|Exception while updating files:$)"
    r"|: (?:file not found error|is a directory|unable to read: .*)$"
)
#: Further error shapes trusted only before the answer starts, where no reply can be.
_PREAMBLE_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception): |Error\b|Unable to )")


def looks_like_error(line: str, *, in_answer: bool = True) -> bool:
    """Whether aider printed ``line`` as an error (it has no colour to tell us without a TTY).

    Inside an answer only aider's own phrasings count, so a reply that says "Error: …" or
    quotes a traceback stays text; before the answer, Python-style errors count too.
    """
    if _METADATA_FETCH.search(line):
        return False
    return bool(_ERROR.search(line)) or (not in_answer and bool(_PREAMBLE_ERROR.match(line)))


@dataclass(slots=True)
class AiderParser:
    """Plain aider output to events.

    States: ``preamble`` (banner, up to the first blank line after ``Aider vX``), ``answer``
    (the model's reply; every line a :class:`Text` delta), ``tool`` (output of a command
    aider runs, up to ``Added N lines of output``). A usage line (``Tokens: …``) ends an
    answer; text after it (aider's reflection round) continues the same answer.
    """

    session: str
    state: Literal["preamble", "answer", "tool"] = "preamble"
    saw_banner: bool = False
    sent_session: bool = False
    errors: int = 0
    answer: list[str] = field(default_factory=list)
    """Every Text delta emitted, in order; joined, it is the Result text."""
    _blank_lines: int = 0
    _block_open: bool = False
    _text_since_error: bool = False
    _tool_output: list[str] = field(default_factory=list)
    _after_usage: bool = False
    _in_fence: bool = False
    _fenced: set[str] = field(default_factory=set)
    """Lines inside the answer's fenced code blocks, to recognise echoed shell commands."""
    _reported: set[str] = field(default_factory=set)
    _usage: UsageTotals = field(default_factory=UsageTotals)
    _calls: int = 0
    model: str | None = None
    """The agent's configured model, which the usage is of."""

    def feed(self, line: str) -> list[Event]:
        """Parse one stdout line."""
        events: list[Event] = []
        if not self.sent_session:
            # First thing: aider has already created the history file when it prints, and
            # after a stop the supervisor keeps only SessionId from the leftover lines.
            self.sent_session = True
            events.append(SessionId(self.session))
        events += self._line(line.rstrip())
        return events

    def feed_stderr(self, line: str) -> list[Event]:
        """Nothing: aider's errors are on stdout; its stderr has argparse's usage errors,
        which the exit status already tells (:meth:`finish`), and terminal warnings."""
        return []

    def _line(self, line: str) -> list[Event]:
        if self.state == "tool":
            return self._tool_line(line)
        if _METADATA_FETCH.search(line):
            return [Status(preview(line))]
        in_fence = self._in_fence and self.state == "answer"
        if not in_fence and looks_like_error(line, in_answer=self.state != "preamble"):
            self.errors += 1
            self._text_since_error = False
            self._close_block()
            if line in self._reported:
                # aider retries a failing API ~9 times, printing the same two lines each time;
                # the "Retrying in …" statuses already show that it is still trying.
                return []
            self._reported.add(line)
            return [Error(line)]
        if self.state == "preamble":
            return self._preamble_line(line)
        return self._answer_line(line)

    def _preamble_line(self, line: str) -> list[Event]:
        if not line:
            if self.saw_banner:
                self.state = "answer"
            return []
        if _BANNER_START.match(line):
            self.saw_banner = True
            return []
        if _BANNER.match(line):
            return []
        # "Restored previous conversation history.", "Added x.py to the chat.", warnings.
        return [Status(line)]

    def _answer_line(self, line: str) -> list[Event]:
        if not line:
            # Held back: a blank line matters between paragraphs, not at the end.
            if self._block_open:
                self._blank_lines += 1
            return []
        if _USAGE.match(line):
            self._close_block()
            self._after_usage = True
            return [*self._usage_of(line), Status(line)]
        if _RETRY.match(line) or _INTERRUPT.match(line):
            self._close_block()
            return [Status(line)]
        if _COMMIT.match(line) or _OUTPUT_ADDED.match(line) or _REFLECTION.match(line):
            self._close_block()
            return [Status(line)]
        if self._after_usage and line.strip() in self._fenced:
            # aider echoes a shell command the reply suggested before asking to run it;
            # under --yes-always it then declines without printing anything more.
            return [Status(f"suggested command: {line.strip()}")]
        if m := _EDITED.match(line):
            self._close_block()
            return [ToolUse("edit", preview(m.group(1)))]
        if m := _RUNNING.match(line):
            self._close_block()
            self.state = "tool"
            self._tool_output = []
            return [ToolUse("shell", preview(m.group(1)))]
        return [self._text(line)]

    def _usage_of(self, line: str) -> list[Event]:
        """A usage line's figures and the session's cost (see the module docstring)."""
        events: list[Event] = []
        if m := _TOKENS.match(line):
            sent, write, hit = (_tokens(m.group(g)) for g in ("sent", "write", "hit"))
            self._calls += 1
            figures = (max(0, sent - write - hit), _tokens(m.group("received")), hit, write)
            events += self._usage.message(str(self._calls), figures, model=self.model)
        if m := _COST.search(line):
            cost = money(m.group("session"))
            events += self._usage.totals((0, 0, 0, 0), cost, "USD", model=self.model)
        return events

    def _tool_line(self, line: str) -> list[Event]:
        if _OUTPUT_ADDED.match(line):
            return [*self._end_tool(), Status(line)]
        if _RUNNING.match(line) or _USAGE.match(line):
            # The next command, or the model's next round: the output is complete.
            events = self._end_tool()
            return events + self._line(line)
        self._tool_output.append(line)
        return []

    def _end_tool(self) -> list[Event]:
        self.state = "answer"
        output = "\n".join(self._tool_output).strip()
        self._tool_output = []
        return [ToolResult(preview(output))]

    def _text(self, line: str) -> Text:
        if self._block_open:
            sep = "\n" * (1 + self._blank_lines)
        elif self.answer:
            sep = "\n\n"  # a later round of the same turn: a new paragraph
        else:
            sep = ""
        self._blank_lines = 0
        self._block_open = True
        self._text_since_error = True
        self._after_usage = False
        if line.startswith("```"):
            self._in_fence = not self._in_fence
        elif self._in_fence:
            self._fenced.add(line.strip())
        piece = sep + line
        self.answer.append(piece)
        return Text(piece, delta=True)

    def _close_block(self) -> None:
        self._block_open = False
        self._blank_lines = 0

    def finish(self, returncode: int | None, *, interrupted: bool) -> list[Event]:
        """Exit 0 is a Result (not ok if aider only printed errors); anything else an Error."""
        events: list[Event] = []
        if not self.sent_session:
            # Even a silent or killed turn leaves a history file worth resuming.
            self.sent_session = True
            events.append(SessionId(self.session))
        if self.state == "tool":
            events += self._end_tool()
        text = "".join(self.answer)
        if interrupted:
            return events
        if returncode == 0:
            # aider exits 0 after giving up on a failing API: errors and no answer since.
            ok = not (self.errors and not self._text_since_error)
            return [*events, Result(text, ok=ok)]
        if returncode is None:
            return [*events, Error("aider ended without an exit status")]
        if returncode < 0:
            return [*events, Error(f"aider was killed by signal {-returncode}")]
        if returncode == 2 and not self.saw_banner:
            return [*events, Error("aider rejected its arguments (exit status 2); see the agent's args")]
        return [*events, Error(f"aider exited with status {returncode}")]


def _tokens(printed: str | None) -> int:
    """aider's rounded count (``604``, ``2.3k``, ``12k``) as a number; none is 0."""
    if not printed:
        return 0
    if printed.endswith("k"):
        return int(Decimal(printed[:-1]) * 1000)
    return int(Decimal(printed))


def new_parser(request: TurnRequest) -> AiderParser:
    """A fresh parser for one turn; it reports the history file as the session id."""
    return AiderParser(session=session_file(request), model=request.model)


ADAPTER = Adapter(
    name="aider",
    install="pip install aider-chat",
    default_command=("aider",),
    model_hosts=("api.openai.com", "api.anthropic.com", "generativelanguage.googleapis.com", "openrouter.ai",
                 "api.deepseek.com"),
    build_launch=build_launch,
    new_parser=new_parser,
    memory_estimate=256 << 20,
)
