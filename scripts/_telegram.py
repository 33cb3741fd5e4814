"""A fake Telegram Bot API server, real HTTP on 127.0.0.1, for the Telegram bridge's tests.

It speaks the Bot API as https://core.telegram.org/bots/api documents it: ``POST
/bot<token>/<method>`` with JSON, form-encoded (each value JSON, strings as they are: what
python-telegram-bot sends) or query parameters; answers ``{"ok": true, "result": …}`` or
``{"ok": false, "error_code": …, "description": …, "parameters": {"retry_after": …}}``;
``getUpdates`` long-polls, confirms updates below its ``offset``, keeps only the newest
``-offset`` for a negative one, and leaves ``message_reaction`` out unless
``allowed_updates`` names it; ``editMessageText`` without ``reply_markup`` takes the inline
keyboard away, and an edit that changes nothing is the documented 400. Plain text gets the
entities Telegram finds in it by itself (mentions, bot commands). ``tests/test_telegram_fake.py``
checks all of it against python-telegram-bot, a client no one here wrote.

One server (a thread) serves every test; each test has a bot of its own (a token), so nothing
of one test reaches another. The human side: :meth:`FakeBot.say`, :meth:`FakeBot.press`,
:meth:`FakeBot.react`; faults: :meth:`FakeBot.fail` (a 429 with ``retry_after``, a dropped
connection).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

#: Parameters that are strings as sent (a form's other values are JSON).
STRINGS = {"text", "callback_query_id", "emoji", "url", "caption", "parse_mode", "description", "title"}
#: What getUpdates leaves out unless ``allowed_updates`` names it.
NOT_BY_DEFAULT = {"chat_member", "message_reaction", "message_reaction_count"}
MENTION = re.compile(r"(?<![\w@])@[A-Za-z][A-Za-z0-9_]{4,31}\b")
COMMAND = re.compile(r"^/[A-Za-z0-9_]{1,32}(@[A-Za-z0-9_]{5,32})?")


class ApiError(Exception):
    def __init__(self, code: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.code, self.description, self.retry_after = code, description, retry_after


def units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _offset(text: str, index: int) -> int:
    return units(text[:index])


def entities(text: str) -> list[dict[str, Any]]:
    """The entities Telegram finds in plain text by itself (the two that matter here)."""
    found = [{"type": "mention", "offset": _offset(text, m.start()), "length": units(m.group())}
             for m in MENTION.finditer(text)]
    command = COMMAND.match(text)
    if command:
        found.insert(0, {"type": "bot_command", "offset": 0, "length": units(command.group())})
    return found


@dataclass
class Fault:
    kind: str  # "429" | "409" | "drop" | "500"
    retry_after: int = 1
    skip: int = 0
    """Calls of the method that pass before it fails."""


@dataclass
class FakeBot:
    """One bot's state on the fake server."""

    server: FakeBotApi
    token: str
    user: dict[str, Any]
    updates: list[dict[str, Any]] = field(default_factory=list)
    allowed: list[str] | None = None
    chats: dict[int, dict[str, Any]] = field(default_factory=dict)
    messages: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    timeline: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """What the bot did that a chat shows, in order: ("send" | "edit" | "markup", the message after)."""
    calls: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    answered: dict[str, dict[str, Any]] = field(default_factory=dict)
    queries: set[str] = field(default_factory=set)
    faults: dict[str, deque[Fault]] = field(default_factory=dict)
    faulted: list[tuple[str, str, float]] = field(default_factory=list)
    polls: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _message_ids: dict[int, itertools.count[int]] = field(default_factory=dict)

    # ---------------------------------------------------------- the human side

    def chat(self, chat_id: int, title: str | None = None) -> dict[str, Any]:
        """A chat the bot is in: private (a user's id, > 0) or a supergroup (< 0)."""
        with self.server.lock:
            if chat_id not in self.chats:
                self.chats[chat_id] = ({"id": chat_id, "type": "private", "first_name": f"user{chat_id}"}
                                       if chat_id > 0 else {"id": chat_id, "type": "supergroup",
                                                            "title": title or f"group {chat_id}"})
            return self.chats[chat_id]

    def _message_id(self, chat: int) -> int:
        return next(self._message_ids.setdefault(chat, itertools.count(1)))

    def _push(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        update = {"update_id": next(self._ids), kind: payload}
        self.updates.append(update)
        self.server.changed.notify_all()
        return update

    def say(self, chat_id: int, user: dict[str, Any], text: str | None = None, **extra: Any) -> dict[str, Any]:
        """``user`` writes ``text`` (or a photo…: ``extra``) in the chat; returns the message."""
        with self.server.lock:
            chat = self.chat(chat_id)
            message: dict[str, Any] = {"message_id": self._message_id(chat_id), "from": user, "chat": chat,
                                       "date": int(time.time()), **extra}
            if text is not None:
                message["text"] = text
                if entities(text):
                    message["entities"] = entities(text)
            self.messages[(chat_id, message["message_id"])] = message
            self._push("message", message)
            return message

    def press(self, chat_id: int, user: dict[str, Any], message_id: int, data: str) -> str:
        """``user`` presses an inline button (its ``callback_data``) of a bot message; the query id."""
        with self.server.lock:
            query = f"q{next(self._ids)}"
            self.queries.add(query)
            self._push("callback_query", {"id": query, "from": user, "message": self.messages[(chat_id, message_id)],
                                          "chat_instance": f"ci{chat_id}", "data": data})
            return query

    def react(self, chat_id: int, user: dict[str, Any], message_id: int, emoji: str) -> None:
        with self.server.lock:
            self._push("message_reaction", {"chat": self.chat(chat_id), "message_id": message_id, "user": user,
                                            "date": int(time.time()), "old_reaction": [],
                                            "new_reaction": [{"type": "emoji", "emoji": emoji}]})

    def add_to(self, chat_id: int, user: dict[str, Any]) -> None:
        """``user`` adds the bot to a group (a ``my_chat_member`` update)."""
        with self.server.lock:
            self._push("my_chat_member", {"chat": self.chat(chat_id), "from": user, "date": int(time.time()),
                                          "old_chat_member": {"user": self.user, "status": "left"},
                                          "new_chat_member": {"user": self.user, "status": "member"}})

    def redeliver(self, update: dict[str, Any]) -> None:
        """Hand an update out again, as Telegram does with one a poller never confirmed."""
        with self.server.lock:
            self.updates.append(update)
            self.updates.sort(key=lambda u: u["update_id"])
            self.server.changed.notify_all()

    def fail(self, method: str, kind: str, retry_after: int = 1, skip: int = 0) -> None:
        """The next call of ``method`` fails: ``"429"`` (with ``retry_after``), ``"409"`` (another
        poller), ``"500"``, or
        ``"drop"`` (the connection is closed without an answer: for getUpdates, mid-poll); after
        ``skip`` calls that pass."""
        with self.server.lock:
            self.faults.setdefault(method, deque()).append(Fault(kind, retry_after, skip))

    def sent(self, chat_id: int) -> list[dict[str, Any]]:
        """The bot's messages in a chat as they stand now, in the order sent."""
        with self.server.lock:
            return [dict(m) for (c, _), m in sorted(self.messages.items()) if c == chat_id
                    and m["from"]["id"] == self.user["id"]]

    def texts(self, chat_id: int) -> list[str]:
        return [m.get("text", "") for m in self.sent(chat_id)]

    # ---------------------------------------------------------- the API

    def api(self, method: str, params: dict[str, Any]) -> Any:
        handler = getattr(self, f"m_{method}", None)
        if handler is None:
            raise ApiError(404, "Not Found")
        return handler(params)

    def m_getMe(self, params: dict[str, Any]) -> Any:
        return {**self.user, "can_join_groups": True, "can_read_all_group_messages": False,
                "supports_inline_queries": False}

    def _chat_of(self, params: dict[str, Any]) -> dict[str, Any]:
        chat_id = params.get("chat_id")
        if not isinstance(chat_id, int) or chat_id not in self.chats:
            raise ApiError(400, "Bad Request: chat not found")
        return self.chats[chat_id]

    def m_getChat(self, params: dict[str, Any]) -> Any:
        return {**self._chat_of(params), "accent_color_id": 0, "max_reaction_count": 11}

    def m_getUpdates(self, params: dict[str, Any]) -> Any:
        offset, limit = int(params.get("offset", 0)), int(params.get("limit", 100))
        timeout = float(params.get("timeout", 0))
        if "allowed_updates" in params:
            self.allowed = list(params["allowed_updates"]) or None
        self.polls += 1
        if offset < 0:
            self.updates = self.updates[offset:]
        elif offset:
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
        deadline = time.monotonic() + timeout
        while True:
            wanted = [u for u in self.updates if self._allowed(u)]
            if wanted or time.monotonic() >= deadline or self.server.closing:
                return wanted[:limit]
            self.server.changed.wait(deadline - time.monotonic())

    def _allowed(self, update: dict[str, Any]) -> bool:
        kind = next(k for k in update if k != "update_id")
        return kind in self.allowed if self.allowed else kind not in NOT_BY_DEFAULT

    def _text(self, params: dict[str, Any]) -> str:
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if units(text) > 4096:
            raise ApiError(400, "Bad Request: message is too long")
        if "parse_mode" in params and params["parse_mode"] not in ("HTML", "Markdown", "MarkdownV2"):
            raise ApiError(400, f"Bad Request: unsupported parse_mode {params['parse_mode']}")
        return text

    def _markup(self, params: dict[str, Any]) -> dict[str, Any] | None:
        markup = params.get("reply_markup")
        if markup is None:
            return None
        rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise ApiError(400, "Bad Request: can't parse reply keyboard markup JSON object")
        for button in (b for row in rows for b in row):
            data = button.get("callback_data", "")
            if not isinstance(button.get("text"), str) or len(data.encode()) > 64:
                raise ApiError(400, "Bad Request: BUTTON_DATA_INVALID")
        return markup if rows else None

    def m_sendMessage(self, params: dict[str, Any]) -> Any:
        chat = self._chat_of(params)
        text = self._text(params)
        message: dict[str, Any] = {"message_id": self._message_id(chat["id"]), "from": self.user, "chat": chat,
                                   "date": int(time.time()), "text": text}
        found = params.get("entities") or ([] if "parse_mode" in params else entities(text))
        if found:
            message["entities"] = found
        markup = self._markup(params)
        if markup is not None:
            message["reply_markup"] = markup
        reply = params.get("reply_parameters")
        if isinstance(reply, dict):
            target = self.messages.get((chat["id"], int(reply.get("message_id", 0))))
            if target is None and not reply.get("allow_sending_without_reply"):
                raise ApiError(400, "Bad Request: message to be replied not found")
            if target is not None:
                message["reply_to_message"] = {k: v for k, v in target.items() if k != "reply_to_message"}
        if "parse_mode" in params:
            message["parse_mode_used"] = params["parse_mode"]  # (seen by the tests: the bridge never sends one)
        self.messages[(chat["id"], message["message_id"])] = message
        self.timeline.append(("send", dict(message)))
        return message

    def _own(self, params: dict[str, Any]) -> dict[str, Any]:
        chat = self._chat_of(params)
        message = self.messages.get((chat["id"], int(params.get("message_id", 0))))
        if message is None or message["from"]["id"] != self.user["id"]:
            raise ApiError(400, "Bad Request: message to edit not found")
        return message

    def m_editMessageText(self, params: dict[str, Any]) -> Any:
        message = self._own(params)
        text = self._text(params)
        markup = self._markup(params)
        if text == message.get("text") and markup == message.get("reply_markup"):
            raise ApiError(400, "Bad Request: message is not modified: specified new message content and reply "
                                "markup are exactly the same as a current content and reply markup of the message")
        message["text"], message["edit_date"] = text, int(time.time())
        message.pop("entities", None)
        if entities(text) and "parse_mode" not in params:
            message["entities"] = entities(text)
        if markup is None:
            message.pop("reply_markup", None)  # (an edit without a keyboard takes it away)
        else:
            message["reply_markup"] = markup
        self.timeline.append(("edit", dict(message)))
        return message

    def m_editMessageReplyMarkup(self, params: dict[str, Any]) -> Any:
        message = self._own(params)
        markup = self._markup(params)
        if markup == message.get("reply_markup"):
            raise ApiError(400, "Bad Request: message is not modified")
        if markup is None:
            message.pop("reply_markup", None)
        else:
            message["reply_markup"] = markup
        self.timeline.append(("markup", dict(message)))
        return message

    def m_answerCallbackQuery(self, params: dict[str, Any]) -> Any:
        query = params.get("callback_query_id")
        if query not in self.queries or query in self.answered:
            raise ApiError(400, "Bad Request: query is too old and response timeout expired or query ID is invalid")
        self.answered[str(query)] = params
        return True

    def m_setMessageReaction(self, params: dict[str, Any]) -> Any:
        chat = self._chat_of(params)
        if (chat["id"], int(params.get("message_id", 0))) not in self.messages:
            raise ApiError(400, "Bad Request: message to react not found")
        return True


class FakeBotApi:
    """The server: ``url`` is what the bridge's ``api_url`` names."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.bots: dict[str, FakeBot] = {}
        self.closing = False
        self._count = itertools.count(1)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                match = re.fullmatch(r"/bot([^/]+)/([A-Za-z]+)", url.path)
                status, answer = fake.handle(match, self.headers.get("Content-Type", ""), url.query, body)
                if answer is None:  # (a dropped connection: closed with no answer)
                    self.close_connection = True
                    return
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                if status == 429 and answer.get("parameters"):
                    self.send_header("Retry-After", str(answer["parameters"]["retry_after"]))
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except OSError:  # (the client went away mid-poll: a bridge stopped)
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # (a client that hung up mid-answer: nothing to report)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-bot-api", daemon=True)
        self.thread.start()

    def bot(self, username: str = "corral_bot") -> FakeBot:
        """A new bot (its own token and updates)."""
        n = next(self._count)
        user = {"id": 7000000 + n, "is_bot": True, "first_name": "corral", "username": f"{username}{n}"}
        bot = FakeBot(self, f"{user['id']}:AAfake-token-{n}", user)
        with self.lock:
            self.bots[bot.token] = bot
        return bot

    def handle(self, match: re.Match[str] | None, kind: str, query: str,
               body: bytes) -> tuple[int, dict[str, Any] | None]:
        if match is None:
            return 404, {"ok": False, "error_code": 404, "description": "Not Found"}
        token, method = match.groups()
        try:
            params = self._params(kind, query, body)
        except ValueError as exc:
            return 400, {"ok": False, "error_code": 400, "description": f"Bad Request: {exc}"}
        with self.lock:
            bot = self.bots.get(token)
            if bot is None:
                return 401, {"ok": False, "error_code": 401, "description": "Unauthorized"}
            bot.calls.append((method, params, time.monotonic()))
            faults = bot.faults.get(method)
            fault = None
            if faults and faults[0].skip:
                faults[0].skip -= 1
            elif faults:
                fault = faults.popleft()
            if fault is not None:
                bot.faulted.append((method, fault.kind, time.monotonic()))
            if fault is not None and fault.kind == "drop":
                if method == "getUpdates":  # (mid-poll: it waits as a poll does, then the line goes dead)
                    self.changed.wait(min(float(params.get("timeout", 0)), 0.3))
                return 0, None
            if fault is not None and fault.kind == "429":
                return 429, {"ok": False, "error_code": 429,
                             "description": f"Too Many Requests: retry after {fault.retry_after}",
                             "parameters": {"retry_after": fault.retry_after}}
            if fault is not None and fault.kind == "409":
                return 409, {"ok": False, "error_code": 409, "description": "Conflict: terminated by other "
                             "getUpdates request; make sure that only one bot instance is running"}
            if fault is not None:
                return 500, {"ok": False, "error_code": 500, "description": "Internal Server Error"}
            try:
                return 200, {"ok": True, "result": bot.api(method, params)}
            except ApiError as exc:
                answer: dict[str, Any] = {"ok": False, "error_code": exc.code, "description": exc.description}
                return exc.code, answer

    @staticmethod
    def _params(kind: str, query: str, body: bytes) -> dict[str, Any]:
        if kind.startswith("application/json"):
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            return data
        pairs = parse_qsl(query) + (parse_qsl(body.decode()) if kind.startswith("application/x-www-form") else [])
        if kind.startswith("multipart/form-data"):
            raise ValueError("multipart (files) is not faked here")
        params: dict[str, Any] = {}
        for key, value in pairs:
            if key in STRINGS:
                params[key] = value
                continue
            try:
                params[key] = json.loads(value)
            except ValueError:
                params[key] = value
        return params

    def close(self) -> None:
        with self.lock:
            self.closing = True
            self.changed.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()
