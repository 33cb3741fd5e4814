"""A turn's account: what the agent has said so far, and what each new parser event adds.

Pure: no Trio, no I/O. :class:`TurnAccount` maps the adapter's events (text, tool use, todos,
session id, result, error) to :data:`Effect` values — an entry to store, a session or a plan
to save, a line to warn about — and a turn's I/O side (a per-turn CLI or an ACP agent alike)
carries them out in order. A stopped or shut-down turn is *silenced*: the ledger says so in the
same synchronous step as the event, and the account then owes nothing but the session id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from adapters import (
    Error,
    Event,
    Result,
    SessionId,
    StaleSession,
    Status,
    Text,
    Todos,
    ToolResult,
    ToolUse,
    Unparsed,
)

from .login import META_KEY as LOGIN_META
from .login import login_failure
from .text import repair_text

#: A message longer than this is the agent talking (about logins, say), not a CLI's refusal.
LOGIN_MESSAGE_CHARS = 200


@dataclass(frozen=True, slots=True)
class Post:
    """Store a transcript entry of the turn."""

    kind: str
    text: str
    meta: Mapping[str, object] | None = None


@dataclass(frozen=True, slots=True)
class SaveSession:
    """Remember the agent's session id for the channel (even a stopped turn's)."""

    session_id: str


@dataclass(frozen=True, slots=True)
class SavePlan:
    """Replace the agent's plan (its todos) for the channel."""

    items: list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class Warn:
    """A line the parser could not read: logged, never stored."""

    reason: str
    line: str


@dataclass(frozen=True, slots=True)
class ShowDraft:
    """Show the open run of text to the channel's followers as it is written: never stored.

    ``text`` is the whole run so far (a follower that joins mid-run needs nothing else); the
    entry that saves it names ``draft`` in its ``meta`` and replaces it. A turn's I/O side may
    show only the last of several drafts of one read: each carries everything before it."""

    draft: str
    text: str


Effect = Post | SaveSession | SavePlan | Warn | ShowDraft
"""What the turn's I/O side carries out, in order."""

#: A run of text longer than this is saved in pieces (each a message entry), so a daemon
#: that dies mid-run loses at most one piece; what follows a piece is a new draft.
PIECE_CHARS = 4096
#: Likewise for a run older than this (seconds on the caller's clock): a slow stream of
#: tokens is saved at least this often.
PIECE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class LastWords:
    """How the turn's account ends: the entries it still owes and its verdict."""

    effects: list[Effect]
    ok: bool
    error: str | None


@dataclass(slots=True)
class TurnAccount:
    """What a turn has said so far, and what each new event adds. Pure: no I/O, no Trio.

    ``silenced`` (a stop or a shutdown made the turn stale: the ledger's answer, asked by the
    caller in the same synchronous step) drops every entry but still tracks the text, so
    the final answer is compared with what was streamed.
    """

    agent: str
    turn: str = ""
    """The turn's id: the prefix of its drafts' ids."""
    text: list[str] = field(default_factory=list)
    """An open run of text deltas: one message once closed."""
    drafts: int = 0
    """Runs opened so far: the open run's draft is ``{turn}.{drafts}``."""
    run_chars: int = 0
    run_started: float | None = None
    streamed: str = ""
    last_message: str = ""
    result: Result | None = None
    error: str | None = None
    stale_session: bool = False
    login_help: str | None = None
    """corral's error for this agent when its CLI says it is not logged in (:mod:`.login`);
    None: the CLI's own words are stored as they are."""
    login_said: bool = False

    @property
    def draft(self) -> str:
        """The id of the open run's draft (of the last run, once it is closed)."""
        return f"{self.turn}.{self.drafts}"

    def on_event(self, event: Event, *, silenced: bool, now: float | None = None) -> list[Effect]:
        """Map one parser event to the transcript, the session, the plan or a draft.

        ``now`` (the caller's clock, for :data:`PIECE_SECONDS`): None saves pieces by size only."""
        if isinstance(event, SessionId):
            return [SaveSession(event.id)]
        if isinstance(event, Text) and event.delta:
            if not event.text:
                return []
            if not self.text:
                self.drafts += 1
                self.run_chars = 0
                self.run_started = now
            self.text.append(event.text)
            self.run_chars += len(event.text)
            old = now is not None and self.run_started is not None and now - self.run_started >= PIECE_SECONDS
            if self.run_chars >= PIECE_CHARS or old:
                return self.close_text(silenced=silenced)
            # A silenced turn shows nothing: text received after a stop is never shown.
            return [] if silenced else [ShowDraft(self.draft, "".join(self.text))]
        effects = self.close_text(silenced=silenced)
        post: Post | None = None
        if self._not_logged_in(event):
            post = self._login_post(event.text)  # type: ignore[union-attr]
        elif isinstance(event, Text):
            self.streamed += event.text
            self.last_message = event.text
            post = Post("message", event.text)
        elif isinstance(event, Status):
            post = Post("status", event.text)
        elif isinstance(event, ToolUse):
            post = Post("tool", f"{event.name}: {event.preview}", {"tool": event.name, "input": event.preview})
        elif isinstance(event, ToolResult):
            post = Post("tool", f"→ {event.preview}", {"result": event.preview, "is_error": event.is_error})
        elif isinstance(event, Todos):
            if not silenced:
                # Repaired here, not only in the entry: the plan is saved as a write of its own.
                items = [{"content": repair_text(i.content), "status": i.status} for i in event.items]
                effects.append(SavePlan(items))
                post = Post("todos", _todo_summary(items), {"todos": items, "agent": self.agent})
        elif isinstance(event, Result):
            self.result = event
        elif isinstance(event, Error):
            self.error = event.text
            post = Post("error", event.text)
        elif isinstance(event, StaleSession):
            self.stale_session = True
        elif isinstance(event, Unparsed):
            effects.append(Warn(event.reason, event.line))
        if post is not None and not silenced:
            effects.append(post)
        return effects

    def _not_logged_in(self, event: Event) -> bool:
        """A CLI's own "not logged in" (an error, or a short message that is only that)."""
        if self.login_help is None:
            return False
        if isinstance(event, Error):
            return login_failure(event.text)
        return isinstance(event, Text) and len(event.text) < LOGIN_MESSAGE_CHARS and login_failure(event.text)

    def _login_post(self, said: str) -> Post | None:
        """corral's login error in place of the CLI's ``said`` (once a turn)."""
        assert self.login_help is not None
        self.error = self.login_help
        if self.login_said:
            return None
        self.login_said = True
        return Post("error", self.login_help, {LOGIN_META: said})

    def close_text(self, *, silenced: bool) -> list[Effect]:
        """Close the open run of text deltas, if any: one message, replacing its draft."""
        if not self.text:
            return []
        text = "".join(self.text)
        self.text.clear()
        self.streamed += text
        self.last_message = text
        return [] if silenced else [Post("message", text, {"draft": self.draft})]

    def cut_off(self, reason: str) -> Post | None:
        """The open run as the stop decision found it: saved, marked as cut off by ``reason``
        (``"stop"``, ``"shutdown"``), so what a follower was shown is what the transcript keeps.

        Called in the step that decides the stop, before its notice is submitted; the turn
        is silenced from then on, so nothing of the run is saved twice."""
        if not self.text:
            return None
        text = "".join(self.text)
        self.text.clear()
        self.streamed += text
        self.last_message = text
        return Post("message", text, {"draft": self.draft, "cut_off": reason})

    def last_words(self, error: str | None) -> LastWords:
        """The turn's final answer or the reason it failed (``error``: the turn's own failure)."""
        if self.stale_session and error is None:
            return LastWords([], False, None)  # the supervisor retries without the session
        if error and self.login_help is not None and login_failure(error):
            post = self._login_post(error)
            return LastWords([post] if post else [], False, self.login_help)
        if error:
            return LastWords([Post("error", error)], False, error)
        result = self.result
        if result is not None and result.ok and self.error is None:
            # The final answer is often what was just streamed (or all of it): post it
            # only if the transcript does not already end with it.
            already = {self.last_message.strip(), self.streamed.strip()}
            fresh = bool(result.text) and result.text.strip() not in already
            return LastWords([Post("message", result.text)] if fresh else [], True, None)
        if result is not None and not result.ok and self.login_help is not None and login_failure(result.text):
            post = self._login_post(result.text)
            return LastWords([post] if post else [], False, self.login_help)
        if result is not None and not result.ok:
            return LastWords(
                [Post("error", result.text)] if result.text else [],
                False,
                result.text or "the agent reported a failure",
            )
        return LastWords([], False, self.error or "the agent ended without a result")


def _todo_summary(items: list[dict[str, str]]) -> str:
    marks = {"completed": "[x]", "in_progress": "[~]", "pending": "[ ]", "cancelled": "[-]"}
    return "; ".join(f"{marks.get(i['status'], '[?]')} {i['content']}" for i in items)


def unfinished(items: list[dict[str, str]]) -> int:
    """How many todos are pending or in progress."""
    return sum(1 for i in items if i.get("status") in ("pending", "in_progress"))


def cancelled(items: list[dict[str, str]]) -> list[dict[str, str]] | None:
    """The plan with every unfinished todo cancelled (what a stop or an interrupt stores);
    None when nothing in it is unfinished (the plan does not change)."""
    if not unfinished(items):
        return None
    return [{**i, "status": "cancelled"} if i.get("status") in ("pending", "in_progress") else i for i in items]
