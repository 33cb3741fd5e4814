"""A chat bridge's decisions, platform-independent. Pure: no Trio, no I/O.

Theory of operation
-------------------

A bridge joins chat rooms to corral channels. Its platform module (Matrix, IRC, …) turns
the wire into :data:`Inbound` events and carries out :data:`Op` operations (post, edit,
react); the Trio layer (:mod:`.runner`) feeds both sides through this module and does the
I/O it returns, in the order returned. Everything that decides lives here:

* **Who may do what** (:class:`Policy`). Nobody but the configured admins, unless the
  allowlists say so: ``users`` and ``servers`` may talk to agents (and, unless ``stoppers``
  is given, stop their room's work); ``!stop all`` is for admins only. Anyone else is
  ignored with a log line and no answer (an answer to a stranger is a spam reflector).
  The bridge's own users (its account and the agents') are never listened to: no echo loops.
* **Member messages** become :class:`Run` (``send`` with author ``human:SENDER``, ``to`` from
  the agent users it mentions, ``origin`` the event's id, so the store refuses it twice).
  Text corral would refuse (a lone surrogate, a NUL, too long) is :class:`Answer`-ed back
  with the reason, never passed on and never dropped silently.
* **Interrupt and steer**: ``!interrupt TEXT`` sends TEXT as a message that replaces the
  addressed agent's running turn (for whoever may stop the room's work: it stops one); ``!steer
  TEXT`` hands TEXT to the running turn where the agent can take it (for whoever may talk; else
  it is queued, and corral's status entry says why). The interrupted turn's notice ends it here
  as a stop's does, and names back the queued messages it dropped.
* **The queue**: ``!queue`` (whoever may talk) lists what waits in the room's channel
  (:class:`ShowQueue`); ``!cancel SEQ`` takes one queued message back (:class:`TakeBack`) —
  the runner lets its sender or an admin do it (``admin`` says which the sender is), and
  answers in the room either way (taken back; or it runs already, and ``!stop`` ends it).
* **Stop** is ``!stop`` (the room's channel), ``!stop all`` (admins), or a 🛑 reaction on an
  event of the channel's current generation (a message of the running turn, or one still
  queued). It is :class:`Halt`: the runner acknowledges in the room *before* it awaits the
  stop, in the room's one ordered outbox, so "Stopping…" always comes before the notice.
* **Agent entries** become posts (:meth:`BridgeCore.outbound`): messages as the agent's own
  user, the stop notice exactly as stored, errors, plans as a list, tools and status as
  one compact notice per turn that is edited in place (``verbosity``), whose last line is
  what the turn spent (its end entry, "claude used 12,340 tokens in · …"; a notice of its own
  where the turn had no status notice, or the platform edits nothing). A **draft** (live
  output, before it is saved) is posted once and edited, and the saved entry that names the
  draft is its final edit. After a stop's notice nothing of the stopped turn is posted.
* **The outbox** (:class:`Outbox`) is one room's ordered queue: posts go in order; an edit
  waits until ``edit_interval`` has passed since the last edit of the same event and is
  merged with any later edit of it (only the newest text is sent).
* **Dropped messages** are named back to their senders ("not run: …", quoted) once the
  stop's notice arrives; a 🔁 reaction on that answer by its sender (or an admin) sends the
  message again, as a new event (its own origin).

Errors a platform can see on the wire (a rate limit, a server down) are the runner's:
nothing here waits or retries.
"""

from __future__ import annotations

import fnmatch
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..core.records import Draft as Draft  # (live output, as the store shows it)
from ..core.results import INTERRUPT_NOTICE, SHUTDOWN_NOTICE, STOP_NOTICE
from ..core.text import BadText, check_message, repair, repair_text

#: The reaction that stops a running turn, and the one that sends a dropped message again.
STOP_REACTION = "🛑"
RESEND_REACTION = "🔁"
#: What the room is told at once when a stop is asked for.
STOPPING = "Stopping…"
#: The notices that end a turn: a chat's Stop button goes with them.
ENDINGS = (STOPPING, STOP_NOTICE, INTERRUPT_NOTICE, SHUTDOWN_NOTICE, "Task interrupted")
#: corral's limit on one message (as the supervisor's).
MAX_MESSAGE_BYTES = 256 * 1024
#: A platform message is split into parts of at most this many bytes (Matrix caps an event at 64 KiB).
MAX_POST_BYTES = 16 * 1024

Verbosity = Literal["quiet", "normal", "verbose"]
VERBOSITIES: tuple[Verbosity, ...] = ("quiet", "normal", "verbose")


# ------------------------------------------------------------------ inbound events


@dataclass(frozen=True, slots=True)
class Said:
    """A member's message in a room."""

    room: str
    event: str
    sender: str
    text: str
    mentions: tuple[str, ...] = ()
    """Platform user ids the message mentions (Matrix: ``m.mentions``, or named in the body)."""


@dataclass(frozen=True, slots=True)
class Reacted:
    """A reaction ``key`` on the event ``target``."""

    room: str
    event: str
    sender: str
    key: str
    target: str


@dataclass(frozen=True, slots=True)
class Invited:
    """The bridge's user was invited to a room."""

    room: str
    sender: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """An event the platform could not read (malformed, not text, oversized)."""

    room: str
    event: str
    sender: str
    why: str


Inbound = Said | Reacted | Invited | Unreadable


# ------------------------------------------------------------------ decisions


@dataclass(frozen=True, slots=True)
class Ignore:
    """Nothing to do; ``why`` goes to the log (None: not worth a line, e.g. our own echo)."""

    why: str | None
    origin: str | None = None
    """Recorded as handled (so a replay is not logged again), if set."""


@dataclass(frozen=True, slots=True)
class Run:
    """``send`` a member's message to the channel."""

    room: str
    channel: str
    text: str
    author: str
    to: tuple[str, ...]
    origin: str
    event: str
    """The platform event it came from (replies and reactions point at it)."""
    delivery: str | None = None
    """``"interrupt"`` or ``"steer"`` (``!interrupt``, ``!steer``); None: the channel's default."""


@dataclass(frozen=True, slots=True)
class Halt:
    """Stop ``channel`` (None: every channel): acknowledge in ``room`` first, then stop."""

    room: str
    channel: str | None
    origin: str
    event: str
    sender: str


@dataclass(frozen=True, slots=True)
class Restart:
    """Start ``channel``'s conversation over (``corral reset``): its agents forget their
    sessions and plans. Refused while a turn runs, unless ``stop`` (``!new stop``) stops it first."""

    room: str
    channel: str
    stop: bool
    origin: str
    event: str
    sender: str


@dataclass(frozen=True, slots=True)
class ShowQueue:
    """``!queue``: answer in ``room`` with what waits in ``channel``."""

    room: str
    channel: str
    origin: str
    event: str


@dataclass(frozen=True, slots=True)
class TakeBack:
    """``!cancel SEQ``: take the queued message ``seq`` of ``channel`` back, if ``sender`` sent it
    or is an admin (``admin``); the runner checks the author against the queue and answers."""

    room: str
    channel: str
    seq: int
    origin: str
    event: str
    sender: str
    admin: bool


@dataclass(frozen=True, slots=True)
class Answer:
    """Tell the room something about one event (a refusal with its reason)."""

    room: str
    text: str
    reply_to: str | None
    origin: str | None = None


@dataclass(frozen=True, slots=True)
class Join:
    """Join ``room`` as ``channel`` (an invitation from an allowed user)."""

    room: str
    channel: str


Decision = Ignore | Run | Halt | Restart | ShowQueue | TakeBack | Answer | Join


# ------------------------------------------------------------------ outbound operations


@dataclass(frozen=True, slots=True)
class Post:
    """Post ``text`` in ``room`` as ``agent``'s user (None: the bridge's); ``key`` names it for
    later edits and reactions and makes the platform's send idempotent where it can be."""

    room: str
    key: str
    text: str
    agent: str | None = None
    notice: bool = False
    reply_to: str | None = None
    turn: str | None = None
    channel: str | None = None
    seq: int | None = None
    """The entry it shows (the runner's cursor moves past it once posted)."""
    speaker: str | None = None
    """Who ``text`` is from, where it starts ``"speaker: "`` (an agent without a user of its
    own, a human relayed): a platform that posts each line apart (IRC) names them on each."""
    ends: bool = False
    """It ends its turn's status (the line of what the turn spent): it carries no Stop button,
    and takes the turn's off."""


@dataclass(frozen=True, slots=True)
class Edit:
    """Replace the text of the post ``target`` (a :class:`Post`'s key) — Matrix's ``m.replace``."""

    room: str
    key: str
    target: str
    text: str
    agent: str | None = None
    notice: bool = False
    turn: str | None = None
    final: bool = False
    """The saved text: due at once, whatever the interval."""
    seq: int | None = None
    ends: bool = False
    """As :attr:`Post.ends`: the post it edits carries no Stop button from now on."""


@dataclass(frozen=True, slots=True)
class React:
    """React with ``emoji`` on the platform event ``target`` (a platform event id)."""

    room: str
    key: str
    target: str
    emoji: str


@dataclass(frozen=True, slots=True)
class FindDropped:
    """A stop dropped messages: read the channel's entries after ``after`` and pass them to
    :meth:`BridgeCore.dropped`."""

    room: str
    channel: str
    stop_seq: int
    after: int


Op = Post | Edit | React | FindDropped


# ------------------------------------------------------------------ who may do what


def _matches(identity: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(identity, p) if any(c in p for c in "*?[") else identity == p for p in patterns)


@dataclass(frozen=True, slots=True)
class Policy:
    """The allowlists. ``server_of`` is applied by the platform (Matrix: after the first ``:``)."""

    admins: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()
    servers: frozenset[str] = frozenset()
    stoppers: frozenset[str] | None = None
    """Who may ``!stop`` a room's work (None: whoever may talk there)."""

    def may_talk(self, sender: str, server: str | None) -> bool:
        return (
            _matches(sender, self.admins) or _matches(sender, self.users)
            or (server is not None and server in self.servers)
        )

    def may_stop(self, sender: str, server: str | None) -> bool:
        if _matches(sender, self.admins):
            return True
        if self.stoppers is None:
            return self.may_talk(sender, server)
        return _matches(sender, self.stoppers)

    def is_admin(self, sender: str) -> bool:
        return _matches(sender, self.admins)


# ------------------------------------------------------------------ text


def _one_line(text: str) -> str:
    """A status notice's line: the first of ``text``, at most 160 characters."""
    line = text.splitlines()[0] if text else ""
    return line[:159] + "…" if len(line) > 160 else line


def split_text(text: str, limit: int = MAX_POST_BYTES) -> list[str]:
    """``text`` in parts of at most ``limit`` UTF-8 bytes, cut at a line end where one is near."""
    text = repair_text(text)
    parts: list[str] = []
    while len(text.encode("utf-8")) > limit:
        cut = len(text.encode("utf-8")[:limit].decode("utf-8", errors="ignore"))
        newline = text.rfind("\n", 0, cut)
        if newline > cut // 2:
            cut = newline + 1
        parts.append(text[:cut])
        text = text[cut:]
    parts.append(text)
    return parts


def utf16_units(ch: str) -> int:
    """A character's length in UTF-16 code units, as Telegram and Discord count a message."""
    return 2 if ord(ch) > 0xFFFF else 1


def split_by(text: str, limit: int, cost: Callable[[str], int], reserve: int = 0) -> list[str]:
    """``text`` in parts whose characters' ``cost`` sums to at most ``limit`` (each cut
    ``reserve`` short of it), cut at a line end where one is near; whitespace-only parts are
    left out (a platform refuses them as empty). A platform's own measure of a message's
    length: Telegram's UTF-16 units, Slack's escaped characters."""
    parts: list[str] = []
    while sum(map(cost, text)) > limit:
        cut, used = 0, 0
        for i, ch in enumerate(text):
            used += cost(ch)
            if used > limit - reserve:
                cut = i
                break
        newline = text.rfind("\n", 0, cut)
        if newline > cut // 2:
            cut = newline + 1
        parts.append(text[:cut])
        text = text[cut:]
    parts.append(text)
    return [part for part in parts if part.strip()] or ["…"]


def clip(text: str, limit: int = MAX_POST_BYTES) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes, saying so (for edits, which cannot be split)."""
    text = repair_text(text)
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[: limit - 64].decode("utf-8", errors="ignore") + f"\n… ({len(raw) - limit + 64} more bytes)"


def quote(text: str, limit: int = 300) -> str:
    """``text`` as a one-paragraph quote (``> …``), shortened to ``limit`` characters."""
    text = repair_text(text).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return "\n".join(f"> {line}" for line in text.splitlines() or [""])


def plan_text(agent: str, items: list[Mapping[str, Any]], head: str | None = None) -> str:
    marks = {"completed": "☑", "in_progress": "▶", "pending": "☐", "cancelled": "✗"}
    lines = [head or f"Plan ({agent.removeprefix('agent:')}):"]
    lines += [f"{marks.get(str(i.get('status')), '•')} {i.get('content', i.get('text', ''))}" for i in items]
    return "\n".join(lines)


#: The commands that send their text with a delivery of their own (``!interrupt TEXT``).
DELIVERY_COMMANDS = {"!interrupt": "interrupt", "!steer": "steer"}


def parse_delivery(text: str) -> tuple[str, str] | None:
    """``(delivery, rest)`` for ``!interrupt TEXT`` and ``!steer TEXT`` (the command's case
    forgiven; the text kept as written); else None."""
    head, _, rest = text.strip().partition(" ")
    delivery = DELIVERY_COMMANDS.get(head.lower())
    return (delivery, rest.strip()) if delivery is not None else None


def parse_command(text: str) -> str | None:
    """``"stop"`` or ``"stop all"`` for the stop commands, ``"new"`` or ``"new stop"`` for
    starting the room's conversation over (case and spacing forgiven); else None."""
    words = text.strip().lower().split()
    if words == ["!stop"]:
        return "stop"
    if words == ["!stop", "all"]:
        return "stop all"
    if words == ["!new"]:
        return "new"
    if words == ["!new", "stop"]:
        return "new stop"
    return None


def parse_queue_command(text: str) -> tuple[str, int | None] | None:
    """``("queue", None)`` for ``!queue``; ``("cancel", SEQ)`` for ``!cancel SEQ`` (SEQ None when
    it is missing or not a positive number); else None."""
    words = text.strip().split()
    if not words or words[0].lower() not in ("!queue", "!cancel"):
        return None
    if words[0].lower() == "!queue":
        return ("queue", None) if len(words) == 1 else None
    seq = words[1].lstrip("#") if len(words) == 2 else ""
    return "cancel", int(seq) if seq.isdigit() and 0 < int(seq) < 2**63 else None


def queue_text(view: Mapping[str, Any]) -> str:
    """``!queue``'s answer: each waiting message with its place, sender, agent, age and why."""
    rows = view.get("queued") or []
    if not rows:
        return "Nothing waits in this channel."
    lines = [f"{len(rows)} waiting (!cancel SEQ takes one back):"]
    for row in rows:
        age = "" if row.get("age") is None else f", {row['age']:.0f}s"
        who = str(row.get("author", "")).removeprefix("human:")
        lines.append(f"#{row['place']} seq {row['entry']} {who} → {row['agent']}{age}, {row['why']}: {row['text']}")
    return "\n".join(lines)


# ------------------------------------------------------------------ the outbox


@dataclass(slots=True)
class Outbox:
    """One room's ordered operations. Posts (and reactions) go in order; an edit is due once
    ``interval`` has passed since the last edit of its target, and a newer edit of the same
    target replaces a queued one. :meth:`next` hands out the first due operation."""

    interval: float = 1.0
    _ops: deque[Op] = field(default_factory=deque)
    _last_edit: dict[str, float] = field(default_factory=dict)

    def put(self, op: Op) -> None:
        if isinstance(op, Edit):
            for i, queued in enumerate(self._ops):
                if isinstance(queued, Edit) and queued.target == op.target:
                    self._ops[i] = replace(op, final=op.final or queued.final)
                    return
        self._ops.append(op)

    def drop_turn(self, turn: str) -> int:
        """Forget the queued drafts of a stopped turn (nothing of it after the notice). What it
        saved before the notice stays: its entries, and a draft's final edit (the text a stop
        saved as it stood)."""
        before = len(self._ops)
        self._ops = deque(
            op for op in self._ops
            if getattr(op, "turn", None) != turn or getattr(op, "seq", None) is not None
        )
        return before - len(self._ops)

    def next(self, now: float) -> tuple[Op | None, float | None]:
        """The first due operation (taken off the queue), else None and when one will be due."""
        wake: float | None = None
        for i, op in enumerate(self._ops):
            if isinstance(op, Edit) and not op.final:
                due = self._last_edit.get(op.target, -1e18) + self.interval
                if due > now:
                    wake = due if wake is None else min(wake, due)
                    continue
            del self._ops[i]
            if isinstance(op, Edit):
                self._last_edit[op.target] = now
            elif isinstance(op, Post):
                self._last_edit[op.key] = now  # (its first edit waits the interval too)
            return op, None
        return None, wake

    def __len__(self) -> int:
        return len(self._ops)


# ------------------------------------------------------------------ the core


@dataclass(slots=True)
class _Known:
    """A platform event the bridge knows the channel of: the entry seq and generation epoch."""

    channel: str
    seq: int


@dataclass(slots=True)
class _NotRun:
    channel: str
    author: str
    text: str


@dataclass(slots=True)
class BridgeCore:
    """The mapping of one bridge: rooms ↔ channels, people ↔ authors, entries ↔ posts."""

    name: str
    rooms: dict[str, str]
    """Room id → channel."""
    policy: Policy
    own_users: frozenset[str]
    """The bridge's account and every agent's: their events are never listened to."""
    agent_users: Mapping[str, str]
    """Agent name → its platform user id (an agent without one posts through the bridge's)."""
    verbosity: Verbosity = "normal"
    invites: bool = False
    can_edit: bool = True
    """Whether the platform edits posts (else no drafts, and status lines are posts of their own)."""
    server_of: Any = None
    """A function from a sender id to its server (None: no servers)."""
    _known: dict[str, _Known] = field(default_factory=dict)
    _stopped_at: dict[str, int] = field(default_factory=dict)
    """Channel → seq of its last stop's notice (a reaction stops only newer work)."""
    _not_run: dict[str, _NotRun] = field(default_factory=dict)
    """Key of a "not run" answer → the message, for 🔁."""
    _status_post: dict[str, str] = field(default_factory=dict)
    """Turn → key of its compact status notice."""
    _status_lines: dict[str, list[str]] = field(default_factory=dict)
    _drafts: dict[str, str] = field(default_factory=dict)
    """Draft id → key of the post that shows it."""
    _draft_posts: dict[str, str] = field(default_factory=dict)
    """Key of a draft's first post → its draft id, until posted (its saved entry may come first)."""
    _draft_edits: dict[str, int] = field(default_factory=dict)
    _ended: set[str] = field(default_factory=set)
    """Turns a stop's notice has ended: nothing more of them is posted."""
    _posted: dict[str, str] = field(default_factory=dict)
    """Post key → platform event id, once posted."""

    # ---------------------------------------------------------- identities

    def origin(self, event: str) -> str:
        return f"{self.name}:{event}"

    def channel_rooms(self, channel: str) -> list[str]:
        return [room for room, c in self.rooms.items() if c == channel]

    def _server(self, sender: str) -> str | None:
        return self.server_of(sender) if self.server_of is not None else None

    # ---------------------------------------------------------- inbound

    def inbound(self, event: Inbound) -> Decision:
        """Decide what one platform event does. The caller has checked it is not a replay."""
        if event.sender in self.own_users:
            return Ignore(None)
        if isinstance(event, Invited):
            return self._invited(event)
        channel = self.rooms.get(event.room)
        if channel is None:
            return Ignore(f"{event.room} is not bridged; ignored {event.sender}'s event", self.origin(event.event))
        server = self._server(event.sender)
        origin = self.origin(event.event)
        if isinstance(event, Unreadable):
            if not self.policy.may_talk(event.sender, server):
                return Ignore(f"{event.sender} may not talk to agents here; ignored an unreadable event", origin)
            return Answer(event.room, f"not run: {event.why}", event.event, origin)
        if isinstance(event, Reacted):
            return self._reacted(event, channel, origin, server)
        command = parse_command(event.text)
        if command is not None:
            if command == "stop all":
                if not self.policy.is_admin(event.sender):
                    return Ignore(f"{event.sender} may not !stop all (admins only); ignored", origin)
                return Halt(event.room, None, origin, event.event, event.sender)
            if not self.policy.may_stop(event.sender, server):
                return Ignore(f"{event.sender} may not stop work in {event.room}; ignored", origin)
            if command in ("new", "new stop"):
                # Who may stop a room's work may start it over: both end what its agents hold.
                return Restart(event.room, channel, command == "new stop", origin, event.event, event.sender)
            return Halt(event.room, channel, origin, event.event, event.sender)
        if not self.policy.may_talk(event.sender, server):
            return Ignore(f"{event.sender} may not talk to agents in {event.room}; ignored", origin)
        queued = parse_queue_command(event.text)
        if queued is not None:
            word, seq = queued
            if word == "queue":
                return ShowQueue(event.room, channel, origin, event.event)
            if seq is None:
                return Answer(event.room, "not run: write the message's seq after !cancel (!queue shows them)",
                              event.event, origin)
            return TakeBack(event.room, channel, seq, origin, event.event, event.sender,
                            self.policy.is_admin(event.sender))
        delivered = parse_delivery(event.text)
        if delivered is not None:
            delivery, rest = delivered
            if delivery == "interrupt" and not self.policy.may_stop(event.sender, server):
                return Ignore(f"{event.sender} may not interrupt work in {event.room} (it stops a turn); ignored",
                              origin)
            if not rest:
                return Answer(event.room, f"not run: write the message after !{delivery}", event.event, origin)
            decision = self._said(replace(event, text=rest), channel, origin)
            return replace(decision, delivery=delivery) if isinstance(decision, Run) else decision
        return self._said(event, channel, origin)

    def _said(self, event: Said, channel: str, origin: str) -> Decision:
        text = event.text
        if not text.strip():
            return Ignore(f"an empty message from {event.sender}", origin)
        try:
            check_message(text)
        except BadText as exc:
            return Answer(event.room, f"not run: {exc}", event.event, origin)
        if len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
            return Answer(event.room, f"not run: the message is over {MAX_MESSAGE_BYTES} bytes", event.event, origin)
        by_user = {user: agent for agent, user in self.agent_users.items()}
        to = tuple(dict.fromkeys(by_user[m] for m in event.mentions if m in by_user))
        return Run(event.room, channel, text, f"human:{event.sender}", to, origin, event.event)

    def _reacted(self, event: Reacted, channel: str, origin: str, server: str | None) -> Decision:
        key = event.key.replace("\ufe0f", "")
        if key == STOP_REACTION:
            if not self.policy.may_stop(event.sender, server):
                return Ignore(f"{event.sender} may not stop work in {event.room}; ignored a reaction", origin)
            known = self._known.get(event.target)
            if known is None or known.channel != channel:
                return Ignore(f"{event.sender} reacted {STOP_REACTION} on an event the bridge does not know", origin)
            if known.seq <= self._stopped_at.get(channel, 0):
                return Ignore(f"{event.sender} reacted {STOP_REACTION} on work a stop already ended", origin)
            return Halt(event.room, channel, origin, event.event, event.sender)
        if key == RESEND_REACTION:
            not_run = self._not_run_of(event.target)
            if not_run is None:
                return Ignore(None, origin)
            if event.sender != not_run.author.removeprefix("human:") and not self.policy.is_admin(event.sender):
                return Ignore(f"{event.sender} may not send {not_run.author}'s message again", origin)
            if not self.policy.may_talk(event.sender, server):
                return Ignore(f"{event.sender} may not talk to agents in {event.room}; ignored", origin)
            return Run(event.room, not_run.channel, not_run.text, not_run.author, (), origin, event.event)
        return Ignore(None, origin)

    def _not_run_of(self, event: str) -> _NotRun | None:
        for key, posted in self._posted.items():
            if posted == event and key in self._not_run:
                return self._not_run[key]
        return None

    def _invited(self, event: Invited) -> Decision:
        if event.room in self.rooms:
            return Join(event.room, self.rooms[event.room])
        if not self.invites:
            return Ignore(f"{event.sender} invited the bridge to {event.room}; invitations are off (invites = false)")
        if not self.policy.may_talk(event.sender, self._server(event.sender)):
            return Ignore(f"{event.sender} may not talk to agents; ignored the invitation to {event.room}")
        return Join(event.room, f"{self.name}/{event.room}")

    def joined(self, room: str, channel: str) -> None:
        self.rooms[room] = channel

    def left(self, room: str) -> None:
        self.rooms.pop(room, None)

    def accepted(self, run: Run, seq: int) -> None:
        """A :class:`Run` was accepted as ``seq``: a 🛑 on its event stops its turn."""
        self._known[run.event] = _Known(run.channel, seq)

    def posted(self, op: Post, event: str) -> None:
        """The platform posted ``op`` as ``event``."""
        self._posted[op.key] = event
        if op.channel is not None and op.seq is not None:
            self._known[event] = _Known(op.channel, op.seq)

    def edited(self, op: Edit, event: str) -> None:
        """The platform posted the edit ``op`` as ``event``: a reaction on it is one on its target."""
        target = self._posted.get(op.target)
        known = self._known.get(target) if target is not None else None
        if known is not None:
            self._known[event] = known

    def knows_draft(self, draft: str) -> bool:
        return draft in self._drafts

    def draft_of(self, key: str) -> str | None:
        """The draft a post key shows, if it is a draft's first post (asked once, as it is posted:
        also when the draft's saved entry came before the post was made, a fast turn's)."""
        return self._draft_posts.pop(key, None)

    def adopt_draft(self, draft: str, event: str) -> None:
        """A draft shown before a restart, as the platform event ``event``: its saved entry edits it."""
        key = f"d{draft}"
        self._drafts[draft] = key
        self._posted[key] = event

    def event_of(self, key: str) -> str | None:
        return self._posted.get(key)

    # ---------------------------------------------------------- outbound

    def outbound(self, entry: Any, room: str) -> list[Op]:
        """The operations that show one committed entry in ``room`` (an ``Entry``: duck-typed
        to keep this module free of the store)."""
        kind, author, turn, seq = entry.kind, entry.author, entry.turn, entry.seq
        meta: Mapping[str, Any] = entry.meta or {}
        text = repair_text(entry.text)
        key = f"c{seq}"
        channel = entry.channel
        if turn is not None and turn in self._ended and kind != "notice":
            return []
        if kind == "notice":
            ops: list[Op] = [Post(room, key, text, notice=True, channel=channel, seq=seq)]
            interrupted = meta.get("interrupted")
            if isinstance(interrupted, str):
                # Nothing of the interrupted turn after its notice, as after a stop's.
                self._ended.add(interrupted)
                if meta.get("dropped_entries") and isinstance(meta.get("interrupted_by"), int):
                    ops.append(FindDropped(room, channel, int(meta["interrupted_by"]), self._oldest_known(channel)))
            if "stop_seq" in meta:
                self._stopped_at[channel] = max(self._stopped_at.get(channel, 0), seq)
                for ended in [turn, *meta.get("turns", [])]:
                    if ended:
                        self._ended.add(ended)
                if meta.get("dropped"):
                    ops.append(FindDropped(room, channel, int(meta["stop_seq"]), self._oldest_known(channel)))
            return ops
        if kind == "message":
            if author.startswith("agent:"):
                agent = author.removeprefix("agent:")
                draft = meta.get("draft")
                if isinstance(draft, str) and draft in self._drafts:
                    return [Edit(room, f"{key}e", self._drafts.pop(draft), clip(self._prefixed(agent, text)),
                                 agent=self._as(agent),
                                 turn=turn, final=True, seq=seq)]
                parts = split_text(self._prefixed(agent, text))
                speaker = None if agent in self.agent_users else agent
                return [
                    Post(room, key if i == 0 else f"{key}p{i}", part, agent=self._as(agent), turn=turn,
                         channel=channel, seq=seq, speaker=speaker)
                    for i, part in enumerate(parts)
                ]
            origin = meta.get("origin")
            if isinstance(origin, str) and origin.startswith(f"{self.name}:"):
                return []  # it came from a room of this bridge: members saw it there
            who = author.removeprefix("human:") if author.startswith("human:") else author
            return [Post(room, key, clip(f"{who}: {text}"), notice=True, channel=channel, seq=seq, speaker=who)]
        if kind == "error":
            return [Post(room, key, clip(f"⚠ {text}"), notice=True, turn=turn, channel=channel, seq=seq)]
        if kind == "todos":
            items = meta.get("todos")
            if self.verbosity == "quiet" or not isinstance(items, list):
                return []
            head = text if text.startswith("Plan cancelled") else None
            return [Post(room, key, clip(plan_text(str(meta.get("agent", "")), items, head)), notice=True,
                         turn=turn, channel=channel, seq=seq)]
        if kind in ("tool", "status"):
            if not self.can_edit and self.verbosity == "normal" and kind == "tool":
                return []  # (a platform without edits gets the status lines, one post each; tools: verbose)
            if kind == "status" and isinstance(meta.get("usage"), Mapping) and turn is not None:
                return self._spent(room, key, text, turn, channel, seq)
            return self._status(room, key, text, turn, channel, seq)
        return []

    def _status_text(self, lines: list[str]) -> str:
        return "⚙ " + "\n⚙ ".join(lines[-5:]) + (f"\n(+{len(lines) - 5} earlier)" if len(lines) > 5 else "")

    def _status(self, room: str, key: str, text: str, turn: str | None, channel: str, seq: int) -> list[Op]:
        if self.verbosity == "quiet":
            return []
        line = _one_line(text)
        if self.verbosity == "verbose" or turn is None or not self.can_edit:
            return [Post(room, key, clip(line), notice=True, turn=turn, channel=channel, seq=seq)]
        lines = self._status_lines.setdefault(turn, [])
        lines.append(line)
        shown = self._status_text(lines)
        post = self._status_post.get(turn)
        if post is None:
            self._status_post[turn] = key
            return [Post(room, key, shown, notice=True, turn=turn, channel=channel, seq=seq)]
        return [Edit(room, f"{key}e", post, clip(shown), notice=True, turn=turn, seq=seq)]

    def _spent(self, room: str, key: str, text: str, turn: str, channel: str, seq: int) -> list[Op]:
        """The line of what a turn spent (its end entry: "AGENT used …"), the last line of the
        turn's status notice where it has one (an edit, due at once), else a notice of its own;
        either ends the turn's status, so a platform takes the turn's Stop button off with it."""
        if self.verbosity == "quiet":
            return []
        line = _one_line(text)
        lines = self._status_lines.pop(turn, [])
        post = self._status_post.pop(turn, None)
        if post is None or self.verbosity == "verbose" or not self.can_edit:
            return [Post(room, key, clip(line), notice=True, turn=turn, channel=channel, seq=seq, ends=True)]
        shown = self._status_text(lines) + "\n" + line
        return [Edit(room, f"{key}e", post, clip(shown), notice=True, turn=turn, final=True, seq=seq, ends=True)]

    def draft(self, event: Draft, room: str) -> list[Op]:
        """Live output (a :class:`Draft`): the first draft of an id is posted, later
        ones edit it (merged and throttled by the outbox)."""
        if event.turn in self._ended or not self.can_edit or not event.author.startswith("agent:"):
            return []
        agent = event.author.removeprefix("agent:")
        key = self._drafts.get(event.draft)
        text = clip(self._prefixed(agent, repair_text(event.text)))
        if key is None:
            key = f"d{event.draft}"
            self._drafts[event.draft] = key
            self._draft_posts[key] = event.draft
            return [Post(room, key, text, agent=self._as(agent), turn=event.turn, channel=event.channel)]
        self._draft_edits[event.draft] = n = self._draft_edits.get(event.draft, 0) + 1
        return [Edit(room, f"{key}e{n}", key, text, agent=self._as(agent), turn=event.turn)]

    def dropped(self, room: str, stop_seq: int, entries: Iterable[Any]) -> list[Op]:
        """The answers that name a stop's dropped messages back to their senders (from this bridge)."""
        ops: list[Op] = []
        for entry in entries:
            meta = entry.meta or {}
            if entry.kind != "message" or meta.get("dropped_by_stop") != stop_seq:
                continue
            origin = meta.get("origin")
            if not (isinstance(origin, str) and origin.startswith(f"{self.name}:")):
                continue
            sender = entry.author.removeprefix("human:")
            key = f"n{entry.seq}"
            self._not_run[key] = _NotRun(entry.channel, entry.author, entry.text)
            ops.append(Post(room, key, f"{sender}: not run (stopped before it started):\n{quote(entry.text)}\n"
                                       f"React {RESEND_REACTION} to send it again.", notice=True))
        return ops

    def _oldest_known(self, channel: str) -> int:
        stopped = self._stopped_at.get(channel, 0)
        seqs = [k.seq for k in self._known.values() if k.channel == channel and k.seq > stopped]
        return (min(seqs) - 1) if seqs else max(stopped - 10_000, 0)

    def _as(self, agent: str) -> str | None:
        return agent if agent in self.agent_users else None

    def _prefixed(self, agent: str, text: str) -> str:
        return text if agent in self.agent_users else f"{agent}: {text}"


def safe(value: Any) -> Any:
    """What may go into a platform's JSON: strings without lone surrogates."""
    return repair(value)
