"""Telegram: a small client of the Bot API over httpx (which runs on Trio), by long polling.

Why not python-telegram-bot or aiogram: both are asyncio frameworks and corral is Trio, and
the bridge needs nine methods (getMe, getChat, getUpdates, sendMessage, editMessageText,
editMessageReplyMarkup, answerCallbackQuery, setMessageReaction). The tests check their fake
Bot API server against python-telegram-bot, so the fake speaks the API as Telegram's own
client library reads it.

* **Updates by long polling**: ``getUpdates`` with the bridge's cursor as its ``offset`` (no
  webhook, so no public URL). The first poll of a new bridge (no cursor) asks for the newest
  update only (``offset = -1``) and skips it and everything before: what was said before the
  bridge came is not replayed. The cursor moves after the runner has handled a batch (a crash
  in between gets the batch again; the store's origins make that a no-op); within one
  connection an update whose ``update_id`` is below the offset is skipped, however often a
  server sends it.
* **Origins**: a message is ``CHAT:MESSAGE_ID`` (what a button press or a reaction names), a
  button press or a reaction is ``uUPDATE_ID``: each runs once across restarts.
* **Stop**: ``/stop`` (``/stop@bot`` in a group), ``!stop``, the **Stop button** (an inline
  keyboard on the running turn's status message: a ``callback_query``, answered with
  ``answerCallbackQuery`` as it is read, so the presser's client stops its spinner whoever
  pressed), and the ``stop_reaction`` (🛑 unless configured: Telegram's standard reactions
  may not offer 🛑). A chat shows one Stop button: it is taken off when a newer one is posted,
  when the turn's saved answer is, or when a stop's or interrupt's notice is. ``/new``,
  ``/interrupt TEXT``, ``/steer TEXT`` are the core's ``!`` commands; ``/start`` (what a
  client sends when a user first opens the bot) is not a message to anyone. A message a stop
  dropped is named back with a **🔁 Send again** button (the core's 🔁 reaction).
* **Text is plain**: no ``parse_mode`` and no entities are ever sent, so an agent cannot
  format, link or hide text; ``@name`` gets a word joiner after its ``@`` so Telegram finds
  no mention in it (an agent cannot notify a member). Long text is split into messages of
  4096 UTF-16 code units (Telegram's limit); an edit, which cannot be split, shows the first
  4096 and a final edit posts the rest as messages after it.
* **Rates**: at most 30 requests a second from the bot and 20 messages a minute into one
  group (Telegram's published limits), paced here; live output's edits use at most
  :data:`GROUP_LIVE_EDITS` of a group's minute (past it they are skipped, so a stop's messages
  never wait behind a draft); a ``429`` waits its ``parameters.retry_after``. Drafts are edited
  at most once per ``edit_interval``.
* **The token** is read from ``token_file`` (hidden from every turn by the sandbox); it is
  part of every request's URL, so httpx's own log lines are rewritten without it.

Errors: a connection failure, a timeout, a 5xx, a 409 (another poller, or a webhook set) and
a 429 are :class:`.platform.Transient`; any other error (400, 401, 403) is
:class:`.platform.Refused`.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import httpx
import trio

from .core import (
    ENDINGS,
    RESEND_REACTION,
    STOP_REACTION,
    Edit,
    Inbound,
    Invited,
    Post,
    React,
    Reacted,
    Said,
    Unreadable,
    safe,
    split_by,
    utf16_units,
)
from .kinds import TELEGRAM_API, TELEGRAM_POLL
from .platform import Batch, Refused, Transient

if TYPE_CHECKING:
    from ..config.settings import BridgeConfig

log = logging.getLogger("corral.bridges.telegram")

#: Telegram's limit on one message's text, in UTF-16 code units.
MAX_TEXT = 4096
#: The updates the bridge asks for (Telegram leaves ``message_reaction`` out unless asked).
ALLOWED_UPDATES = ("message", "edited_message", "callback_query", "message_reaction", "my_chat_member")
#: The Stop button's ``callback_data``.
STOP_DATA = "corral:stop"
STOP_BUTTON = {"inline_keyboard": [[{"text": "🛑 Stop", "callback_data": STOP_DATA}]]}
NO_BUTTON: dict[str, Any] = {"inline_keyboard": []}
#: The button on a dropped message's answer that sends it again (the core's 🔁 reaction, which
#: Telegram's standard reactions do not offer).
RESEND_DATA = "corral:resend"
RESEND_BUTTON = {"inline_keyboard": [[{"text": f"{RESEND_REACTION} Send again", "callback_data": RESEND_DATA}]]}
_RESEND_HINT = f"React {RESEND_REACTION} to send it again."
#: The notices that end a turn: the chat's Stop button goes with them.
#: Slash commands → the core's commands.
COMMANDS = {"stop": "!stop", "new": "!new", "interrupt": "!interrupt", "steer": "!steer"}
#: (requests, seconds): the bot's whole rate, and one group's (Telegram's bots FAQ).
BOT_RATE = (30, 1.0)
GROUP_RATE = (20, 60.0)
#: Of a group's 20 a minute, what live output's edits may use: the rest is kept for posts (a
#: stop's "Stopping…" and notice never wait behind a draft). An edit past it is skipped, not
#: waited for: the next one carries the newest text, and the saved text is a final edit.
GROUP_LIVE_EDITS = 14
_WORD_JOINER = "\u2060"


def neutral(text: str) -> str:
    """``text`` with every ``@name`` broken by a word joiner: Telegram finds mentions in plain
    text too, and an agent must not notify (or ping) anyone by writing one."""
    return re.sub(r"@(?=[A-Za-z0-9_])", "@" + _WORD_JOINER, text)


def split_message(text: str, limit: int = MAX_TEXT) -> list[str]:
    """``text`` in parts of at most ``limit`` UTF-16 code units, cut at a line end where one is
    near; parts Telegram would refuse as empty (whitespace only) are left out."""
    return split_by(text, limit, utf16_units)


def slash_command(text: str, bot: str) -> str | None:
    """The core's form of a slash command (``/stop@bot`` → ``!stop``), ``text`` itself if it is
    none, None for a command that is not for this bot (``/stop@other_bot``) or for nobody (``/start``)."""
    if not text.startswith("/"):
        return text
    head, space, rest = text.partition(" ")
    name, at, addressee = head[1:].partition("@")
    if at and addressee.lower() != bot.lower():
        return None
    if name.lower() == "start":
        return None
    command = COMMANDS.get(name.lower())
    if command is None:
        return text
    return f"{command}{space}{rest}"


class _Pace:
    """Sliding windows of request times: the bot's, and each group's."""

    def __init__(self) -> None:
        self.sent: dict[str, deque[float]] = {}

    def _windows(self, chat: str | None) -> list[tuple[str, int, float]]:
        windows = [("", *BOT_RATE)]
        if chat is not None and chat.startswith("-"):
            windows.append((chat, *GROUP_RATE))
        for key, _, period in windows:
            times = self.sent.setdefault(key, deque())
            while times and times[0] <= trio.current_time() - period:
                times.popleft()
        return windows

    def crowded(self, chat: str | None) -> bool:
        """Whether a group's minute has no room left for a live edit (see :data:`GROUP_LIVE_EDITS`)."""
        self._windows(chat)
        return chat is not None and chat.startswith("-") and len(self.sent[chat]) >= GROUP_LIVE_EDITS

    async def wait(self, chat: str | None) -> None:
        windows = self._windows(chat)
        for key, count, period in windows:
            times = self.sent[key]
            if len(times) >= count:
                await trio.sleep_until(times[0] + period)
        for key, _, _ in windows:
            self.sent[key].append(trio.current_time())


class _Redact(logging.Filter):
    """httpx logs each request's URL, and a Bot API URL holds the token: written without it."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        if self.token and self.token in record.getMessage():
            record.msg, record.args = record.getMessage().replace(self.token, "<token>"), ()
        return True


class TelegramPlatform:
    """One bot's connection: it polls for updates and posts as itself."""

    kind = "telegram"
    can_edit = True
    idempotent_posts = False  # (the Bot API has no idempotency key: a post is marked before it is made)
    confirms_on_read = True
    """A ``getUpdates`` with a higher offset makes Telegram forget the updates below it: the runner
    asks for the next batch only once the last is handled (:mod:`.runner`)."""

    def __init__(self, config: BridgeConfig) -> None:
        options = config.options
        self.config = config
        self.token_file = options["token_file"]
        self.api = str(options.get("api_url", TELEGRAM_API)).rstrip("/")
        self.poll = float(options.get("poll_timeout", TELEGRAM_POLL))
        self.stop_reaction = str(options.get("stop_reaction", STOP_REACTION)).replace("\ufe0f", "")
        self.http = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_keepalive_connections=4))
        self.token = ""
        self.username = ""
        self.bot_id = 0
        self.chats: set[str] = set()
        self.scope = "0"
        self.offset = 0
        self.pace = _Pace()
        self._button: dict[str, tuple[int, str | None]] = {}
        """Chat → the message that shows its Stop button, and that message's turn."""
        self._redact: _Redact | None = None
        self._progress: dict[str, list[int]] = {}
        """Op key → the messages of it already sent: a post (or a final edit's tail) retried after
        a failure part-way resumes where it stopped, instead of sending its first parts again."""

    # ---------------------------------------------------------- the wire

    async def call(self, method: str, params: Mapping[str, Any], *, chat: str | None = None,
                   timeout: float = 30.0) -> Any:
        """One Bot API call; its ``result``, or :class:`Transient` / :class:`Refused` (the one
        place Bot API errors are read)."""
        if method not in ("getUpdates", "getMe", "answerCallbackQuery"):
            await self.pace.wait(chat)
        try:
            reply = await self.http.post(f"{self.api}/bot{self.token}/{method}", json=safe(dict(params)),
                                         timeout=timeout)
        except httpx.TransportError as exc:  # refused, reset, dropped mid-poll, timed out
            raise Transient(f"{method}: {type(exc).__name__}: {self._hide(str(exc)) or 'no answer'}") from None
        try:
            data = reply.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            if reply.status_code >= 500 or reply.status_code == 429:
                raise Transient(f"{method}: {reply.status_code}, and no Bot API answer")
            raise Refused(f"{method}: {reply.status_code}, and no Bot API answer (is api_url a Bot API server?)")
        if data.get("ok") is True:
            return data.get("result")
        code = data.get("error_code", reply.status_code)
        code = code if isinstance(code, int) else reply.status_code
        what = self._hide(str(data.get("description", "")))
        parameters = data.get("parameters") if isinstance(data.get("parameters"), dict) else {}
        assert isinstance(parameters, dict)
        if code == 429:
            after = parameters.get("retry_after")
            if not isinstance(after, int | float):
                header = reply.headers.get("retry-after", "")
                after = float(header) if header.isdigit() else None
            raise Transient(f"{method}: rate limited (429 {what})", retry_after=after)
        if code >= 500 or code == 409:  # (409: another getUpdates, or a webhook set: said, and tried again)
            raise Transient(f"{method}: {code} {what}")
        if isinstance(parameters.get("migrate_to_chat_id"), int):
            raise Refused(f"{method}: the group is now the supergroup {parameters['migrate_to_chat_id']}: map "
                          f"that id in [bridges.{self.config.name}.rooms] ({code} {what})")
        raise Refused(f"{method}: {code} {what}")

    def _hide(self, text: str) -> str:
        return text.replace(self.token, "<token>") if self.token else text

    # ---------------------------------------------------------- Platform

    async def connect(self) -> None:
        self.token = self.token_file.read_text().strip()
        if self._redact is None:
            self._redact = _Redact(self.token)
            for name in ("httpx", "httpcore"):
                logging.getLogger(name).addFilter(self._redact)
        self._redact.token = self.token  # (a connect retried after the file changed: the new one)
        try:
            me = await self.call("getMe", {})
        except Refused as exc:
            raise Refused(f"the token in {self.token_file} is refused ({exc})") from None
        if not isinstance(me, dict) or not me.get("is_bot"):
            raise Refused(f"the token in {self.token_file} is not a bot's (getMe: {me!r})")
        self.bot_id, self.username = int(me.get("id", 0)), str(me.get("username", ""))
        log.info("telegram: bridge %s is @%s (%d)", self.config.name, self.username, self.bot_id)

    async def rooms(self, configured: Mapping[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for room, channel in configured.items():
            if await self.join(room):
                out[room] = channel
        return out

    async def join(self, room: str) -> bool:
        """A chat is bridged if the bot can see it (``getChat``): it is added to groups by a member."""
        try:
            await self.call("getChat", {"chat_id": int(room)})
        except (Refused, ValueError) as exc:
            log.error("telegram: the bot cannot see the chat %s (%s): add the bot to it (a private chat: the user "
                      "writes to the bot first); it is not bridged", room, exc)
            return False
        self.chats.add(room)
        return True

    async def events(self, cursor: str | None) -> AsyncIterator[Batch]:
        first = True  # (answered at once: the runner says it listens after the first batch)
        if cursor is None:
            # A new bridge: the newest update, and with it everything before, is skipped.
            newest = await self.call("getUpdates", {"offset": -1, "timeout": 0, "allowed_updates": ALLOWED_UPDATES})
            ids = [u["update_id"] for u in newest or [] if isinstance(u, dict) and isinstance(u.get("update_id"), int)]
            self.offset = max(ids) + 1 if ids else 0
            first = False
            yield Batch((), str(self.offset))
        else:
            self.offset = max(self.offset, int(cursor))
        while True:
            timeout = 0 if first else self.poll
            first = False
            updates = await self.call("getUpdates", {"offset": self.offset, "timeout": int(timeout), "limit": 100,
                                                     "allowed_updates": ALLOWED_UPDATES}, timeout=timeout + 15)
            if not isinstance(updates, list):
                raise Transient("getUpdates: the result is not a list of updates")
            events: list[Inbound] = []
            answers: list[str] = []
            for update in sorted((u for u in updates if isinstance(u, dict) and isinstance(u.get("update_id"), int)),
                                 key=lambda u: int(u["update_id"])):
                if update["update_id"] < self.offset:
                    log.debug("telegram: update %s came again; skipped", update["update_id"])
                    continue
                self.offset = update["update_id"] + 1
                events += self._update(update, answers)
            for query in answers:
                await self._answer(query)
            yield Batch(tuple(events), str(self.offset))

    async def _answer(self, query: str) -> None:
        try:
            await self.call("answerCallbackQuery", {"callback_query_id": query})
        except (Refused, Transient) as exc:  # (too old, after a restart: the presser's spinner has gone anyway)
            log.info("telegram: a button press was not answered: %s", exc)

    def _update(self, update: Mapping[str, Any], answers: list[str]) -> list[Inbound]:
        uid = update["update_id"]
        if isinstance(update.get("message"), dict):
            inbound = self._message(update["message"])
            return [inbound] if inbound is not None else []
        if isinstance(update.get("edited_message"), dict):
            log.info("telegram: a message was edited in %s; an edit is not run again",
                     (update["edited_message"].get("chat") or {}).get("id"))
            return []
        query = update.get("callback_query")
        if isinstance(query, dict):
            if isinstance(query.get("id"), str):
                answers.append(query["id"])
            sender, message = query.get("from") or {}, query.get("message")
            key = {STOP_DATA: STOP_REACTION, RESEND_DATA: RESEND_REACTION}.get(str(query.get("data")))
            if key is None or not isinstance(message, dict) or not isinstance(sender, dict) or sender.get("is_bot"):
                return []
            chat = str((message.get("chat") or {}).get("id"))
            target = f"{chat}:{message.get('message_id')}"
            return [Reacted(chat, f"u{uid}", str(sender.get("id")), key, target)]
        reaction = update.get("message_reaction")
        if isinstance(reaction, dict):
            user = reaction.get("user")
            if not isinstance(user, dict) or user.get("is_bot"):
                return []  # (an anonymous reaction has no user to allowlist)
            chat = str((reaction.get("chat") or {}).get("id"))
            old = {r.get("emoji") for r in reaction.get("old_reaction") or [] if isinstance(r, dict)}
            new = [r.get("emoji") for r in reaction.get("new_reaction") or []
                   if isinstance(r, dict) and r.get("type") == "emoji" and r.get("emoji") not in old]
            return [
                Reacted(chat, f"u{uid}:{i}", str(user.get("id")),
                        STOP_REACTION if str(emoji).replace("\ufe0f", "") == self.stop_reaction else str(emoji),
                        f"{chat}:{reaction.get('message_id')}")
                for i, emoji in enumerate(new)
            ]
        member = update.get("my_chat_member")
        if isinstance(member, dict):
            before = (member.get("old_chat_member") or {}).get("status")
            after = (member.get("new_chat_member") or {}).get("status")
            if after in ("member", "administrator") and before not in ("member", "administrator", "creator"):
                chat = str((member.get("chat") or {}).get("id"))
                return [Invited(chat, str((member.get("from") or {}).get("id")))]
        return []

    def _message(self, message: Mapping[str, Any]) -> Inbound | None:
        sender = message.get("from")
        chat = str((message.get("chat") or {}).get("id"))
        event = f"{chat}:{message.get('message_id')}"
        if not isinstance(sender, dict):
            return None  # (a channel's post, an anonymous admin: nobody to allowlist)
        if sender.get("is_bot"):
            return None  # (bots' speech, this bot's included: answering one is how loops start)
        who = str(sender.get("id"))
        text = message.get("text")
        if not isinstance(text, str):
            what = next((k for k in ("photo", "sticker", "document", "voice", "video", "audio", "location", "poll")
                         if k in message), None)
            if what is None:
                return None  # (a service message: someone joined, the title changed)
            return Unreadable(chat, event, who, f"agents read text messages, not a {what}")
        command = slash_command(text, self.username)
        if command is None:
            return None
        return Said(chat, event, who, command)

    # ---------------------------------------------------------- posting

    def _target(self, event: str) -> tuple[int, int]:
        chat, _, message = event.rpartition(":")
        return int(chat), int(message)

    async def _send(self, room: str, text: str, *, reply_to: str | None = None,
                    button: bool = False, markup: Mapping[str, Any] | None = None) -> int:
        params: dict[str, Any] = {"chat_id": int(room), "text": text, "link_preview_options": {"is_disabled": True}}
        if reply_to is not None and reply_to.startswith(f"{room}:"):
            params["reply_parameters"] = {"message_id": self._target(reply_to)[1], "allow_sending_without_reply": True}
        if button or markup is not None:
            params["reply_markup"] = STOP_BUTTON if button else markup
        sent = await self.call("sendMessage", params, chat=room)
        if not isinstance(sent, dict) or not isinstance(sent.get("message_id"), int):
            raise Refused(f"sendMessage: the result is not a message: {sent!r}")
        return int(sent["message_id"])

    async def post(self, op: Post) -> str:
        text, markup = op.text, None
        if op.notice and op.text.endswith(_RESEND_HINT):  # (a dropped message's answer: a button sends it again)
            text = op.text.removesuffix(_RESEND_HINT) + f"Press {RESEND_REACTION} to send it again."
            markup = RESEND_BUTTON
        parts = split_message(neutral(text))
        # The turn's first notice (its status message) carries its Stop button; one per chat.
        button = (op.notice and op.turn is not None and not op.ends
                  and self._button.get(op.room, (0, None))[1] != op.turn)
        done = self._progress.setdefault(op.key, [])
        try:
            for i, part in enumerate(parts[len(done):], start=len(done)):
                done.append(await self._send(op.room, part, reply_to=op.reply_to if i == 0 else None,
                                             button=button and i == len(parts) - 1,
                                             markup=markup if i == 0 else None))
        except Refused:
            del self._progress[op.key]  # (dropped for good: not resumed)
            raise
        del self._progress[op.key]
        # (after the post: a stop's "Stopping…" is not kept waiting for the button's removal)
        if button:
            await self._take_off(op.room)  # (one Stop button in a chat: the newest turn's)
            self._button[op.room] = (done[-1], op.turn)
        else:
            await self._unbutton(op.room, op.turn, op.text, saved=(op.seq is not None and not op.notice) or op.ends)
        return f"{op.room}:{done[0]}"

    async def edit(self, op: Edit, target: str) -> str:
        chat, message = self._target(target)
        if not op.final and self.pace.crowded(op.room):
            log.debug("telegram: %s's minute is full; a live edit of %s is skipped", op.room, target)
            return target
        parts = split_message(neutral(op.text))
        params: dict[str, Any] = {"chat_id": chat, "message_id": message, "text": parts[0],
                                  "link_preview_options": {"is_disabled": True}}
        if self._button.get(op.room, (None,))[0] == message:
            if op.ends:  # (the turn's status ends: this edit, without the keyboard, takes it off)
                del self._button[op.room]
            else:
                params["reply_markup"] = STOP_BUTTON  # (an edit without it takes the keyboard away)
        await self._unbutton(op.room, op.turn, op.text, saved=op.final or op.ends)
        try:
            await self.call("editMessageText", params, chat=op.room)
        except Refused as exc:
            if "message is not modified" not in str(exc):  # (a retried edit that had been made)
                raise
        if op.final:  # (the saved text: what an edit cannot hold follows as messages)
            done = self._progress.setdefault(op.key, [])
            for part in parts[1 + len(done):]:
                done.append(await self._send(op.room, part))
            del self._progress[op.key]
        return target

    async def _unbutton(self, room: str, turn: str | None, text: str, *, saved: bool) -> None:
        """Take the chat's Stop button off when its turn has ended: a newer button comes, the
        turn's answer is saved, a stop's or interrupt's notice is posted."""
        shown = self._button.get(room)
        if shown is not None and ((saved and turn == shown[1]) or (turn is None and text.startswith(ENDINGS))):
            await self._take_off(room)

    async def _take_off(self, room: str) -> None:
        shown = self._button.pop(room, None)
        if shown is None:
            return
        message = shown[0]
        try:
            await self.call("editMessageReplyMarkup", {"chat_id": int(room), "message_id": message,
                                                       "reply_markup": NO_BUTTON}, chat=room)
        except (Refused, Transient) as exc:
            # Not retried: the post it follows is made, and a retry would make it twice. A button
            # left on an ended turn stops nothing more (the core judges a press on it).
            log.info("telegram: the Stop button of %s:%s was not taken off: %s", room, message, exc)

    async def react(self, op: React) -> str:
        chat, message = self._target(op.target)
        await self.call("setMessageReaction", {"chat_id": chat, "message_id": message,
                                               "reaction": [{"type": "emoji", "emoji": op.emoji}]}, chat=op.room)
        return f"{op.target}:r"

    def server_of(self, sender: str) -> str | None:
        return None  # (Telegram has one server: allowlist user ids)

    async def aclose(self) -> None:
        if self._redact is not None:
            for name in ("httpx", "httpcore"):
                logging.getLogger(name).removeFilter(self._redact)
        await self.http.aclose()
