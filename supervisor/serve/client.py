"""A small synchronous client of the control API, used by the CLI (and handy in scripts).

It uses only the standard library (``http.client`` over an ``AF_UNIX`` socket, or loopback
TCP with a token), so a client command starts without importing an HTTP stack: an
emergency ``corral stop`` is as quick to start as it can be. Each request is built from the
operation :mod:`.routes` declares: its method, path, parameters' defaults and answering statuses.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

from ..core.errors import CorralError
from .routes import DEFAULT_AUTHOR, DEFAULT_LIMIT, DEFAULT_STATUS_PAGE, OPERATIONS

#: The daemon closes idle keep-alive connections after 5 s; reconnect before that.
_REUSE_SECONDS = 4.0


class DaemonUnavailable(CorralError):
    """No daemon answers on the socket."""


class DaemonGone(DaemonUnavailable):
    """The daemon went away in the middle of an answer (a follow's stream ended)."""


class ConnectionLost(DaemonUnavailable):
    """The request was sent and no answer came: the daemon may have acted on it (a send with an
    idempotency key is safe to retry)."""


class APIError(CorralError):
    """The daemon answered with an error."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.body = body


class _UnixConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket."""

    def __init__(self, path: str, timeout: float | None = None) -> None:
        super().__init__("corral", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


#: What a dead, absent or vanishing daemon looks like to ``http.client``.
_UNAVAILABLE = (ConnectionError, FileNotFoundError, http.client.HTTPException, socket.timeout)


class Client:
    """Talks to a corral daemon over its Unix socket (or a loopback TCP URL with a token).

    ``timeout``: the seconds a request may wait for the daemon (None, the default: no bound; a
    request that runs out is :class:`DaemonUnavailable`)."""

    def __init__(
        self, socket_path: str | None = None, *, url: str | None = None, token: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if url is None and socket_path is None:
            raise ValueError("give a socket path or a url")
        self._socket_path = socket_path
        self._url = urlsplit(url) if url is not None else None
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._conn: http.client.HTTPConnection | None = None
        self._last_used = 0.0
        self._timeout = timeout
        self.where = url or socket_path

    def _connect(self) -> http.client.HTTPConnection:
        if self._url is not None:
            return http.client.HTTPConnection(self._url.hostname or "127.0.0.1", self._url.port, timeout=self._timeout)
        assert self._socket_path is not None
        return _UnixConnection(self._socket_path, self._timeout)

    def close(self) -> None:
        """Close the kept-alive connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        ok: tuple[int, ...] = (200, 202),
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        return _decode(*self._exchange(method, path, params=params, json_body=json_body, headers=headers), ok)

    def _exchange(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, json_body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """One request on the kept-alive connection: the answer's status and body."""
        if params:
            path = f"{path}?{urlencode(params)}"
        body = json.dumps(json_body).encode() if json_body is not None else b""
        headers = {**self._headers, **(headers or {})}
        if json_body is not None:
            headers["content-type"] = "application/json"
        if self._conn is not None and time.monotonic() - self._last_used > _REUSE_SECONDS:
            self.close()
        sent = False
        try:
            if self._conn is None:
                self._conn = self._connect()
            self._conn.request(method, path, body=body, headers=headers)
            sent = True
            response = self._conn.getresponse()
            data = response.read()
        except _UNAVAILABLE as exc:
            self.close()
            raise (ConnectionLost if sent else DaemonUnavailable)(str(exc) or type(exc).__name__) from None
        self._last_used = time.monotonic()
        return response.status, data

    def _call(
        self, name: str, *, path: dict[str, str] | None = None, params: dict[str, Any] | None = None,
        json_body: Any = None, headers: dict[str, str] | None = None,
    ) -> Any:
        """Perform the operation ``name`` of :data:`.routes.OPERATIONS`."""
        op = OPERATIONS[name]
        return self._request(op.method, op.target(**(path or {})), ok=op.ok, params=params, json_body=json_body,
                             headers=headers)

    def answer(
        self, name: str, *, path: dict[str, str] | None = None, params: dict[str, Any] | None = None,
        json_body: Any = None,
    ) -> tuple[int, Any]:
        """Perform the operation ``name`` of :data:`.routes.OPERATIONS`: its HTTP status and body
        whatever the status (the body decoded from JSON, else its text), for a tool that judges
        the answers itself; :class:`DaemonUnavailable` if no answer comes."""
        op = OPERATIONS[name]
        status, data = self._exchange(op.method, op.target(**(path or {})), params=params, json_body=json_body)
        try:
            return status, json.loads(data) if data else None
        except ValueError:
            return status, data.decode("utf-8", "replace")

    def send(
        self, channel: str, text: str, *, agent: str | None = None, to: list[str] | None = None,
        author: str = DEFAULT_AUTHOR, delivery: str | None = None, idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Queue a message (for ``agent`` and ``to``); returns ``{"seq": …}`` once it is stored.

        ``author``: ``human:NAME`` or ``agent:NAME``; a bare ``NAME`` is the human ``human:NAME``.
        ``delivery``: ``"queue"``, ``"interrupt"`` or ``"steer"`` (None: the configured default).
        ``idempotency_key``: sent as the ``Idempotency-Key`` header; a retry with the same key
        answers the first acceptance again (``replayed``) and queues nothing.
        """
        payload: dict[str, Any] = {"text": text, "author": author}
        if delivery:
            payload["delivery"] = delivery
        if agent:
            payload["agent"] = agent
        if to:
            payload["to"] = to
        header = OPERATIONS["send"].param("idempotency_key").header
        headers = {header: idempotency_key} if idempotency_key and header else None
        accepted: dict[str, Any] = self._call("send", path={"channel": channel}, json_body=payload, headers=headers)
        return accepted

    def queue(self, channel: str) -> dict[str, Any]:
        """The channel's waiting messages (``queued``: seq, entry, place, agent, author, age, why)."""
        view: dict[str, Any] = self._call("queue", path={"channel": channel})
        return view

    def cancel(self, channel: str, seq: int, *, author: str = DEFAULT_AUTHOR) -> dict[str, Any]:
        """Take the queued message ``seq`` back; :class:`APIError` 409 ``running`` if a turn took it."""
        result: dict[str, Any] = self._call("cancel", path={"channel": channel, "seq": str(seq)},
                                            params={"author": author})
        return result

    def move_first(self, channel: str, seq: int, *, author: str = DEFAULT_AUTHOR) -> dict[str, Any]:
        """Move the queued message ``seq`` to the front of its agent's lane."""
        result: dict[str, Any] = self._call("move_first", path={"channel": channel, "seq": str(seq)},
                                            params={"author": author})
        return result

    def stop(self, channel: str | None) -> dict[str, Any]:
        """Stop a channel (or all with None); returns the stop result, even a failed one."""
        if channel is None:
            everything: dict[str, Any] = self._call("stop_all")
            return everything
        result: dict[str, Any] = self._call("stop", path={"channel": channel})
        return result

    def stop_all(self) -> dict[str, Any]:
        """Stop every busy channel; the result lists each under ``channels``."""
        return self.stop(None)

    def reset(self, channel: str, *, agent: str | None = None, stop: bool = False) -> dict[str, Any]:
        """Start the channel over (for ``agent``, else every agent); the entry that records it."""
        payload: dict[str, Any] = {"stop": stop}
        if agent:
            payload["agent"] = agent
        entry: dict[str, Any] = self._call("reset", path={"channel": channel}, json_body=payload)
        return entry

    def resend(self, channel: str, seq: int) -> dict[str, Any]:
        """Send again, once, the message ``seq`` a stop dropped; ``{"seq": …}`` of the new one."""
        accepted: dict[str, Any] = self._call("resend", path={"channel": channel}, json_body={"seq": seq})
        return accepted

    def status(self, after: str | None = None, limit: int = DEFAULT_STATUS_PAGE, idle: bool = False) -> dict[str, Any]:
        """The daemon's status, with a page of its channels (see :meth:`Supervisor.status`)."""
        params: dict[str, Any] = {"limit": limit}
        if after is not None:
            params["after"] = after
        if idle:
            params["idle"] = 1
        status: dict[str, Any] = self._call("status", params=params)
        return status

    def usage(self, channel: str | None = None, since: str | None = None) -> list[dict[str, Any]]:
        """What turns spent, per UTC day, channel and agent, from day ``since`` on (default: today)."""
        params = {k: v for k, v in (("channel", channel), ("since", since)) if v is not None}
        days: list[dict[str, Any]] = self._call("usage", params=params)["days"]
        return days

    def budget_reset(self, name: str | None = None) -> dict[str, Any]:
        """Start the daily budget of the channel or agent ``name`` (None: every one) again."""
        answer: dict[str, Any] = self._call("budget_reset", json_body={"name": name} if name else {})
        return answer

    def entries(
        self, channel: str, after: int = 0, limit: int = DEFAULT_LIMIT, newest: bool = False
    ) -> list[dict[str, Any]]:
        """Committed entries after ``after``, at most ``limit`` of them (``newest``: the last ones), oldest first."""
        params: dict[str, Any] = {"after": after, "limit": limit, **({"newest": 1} if newest else {})}
        entries: list[dict[str, Any]] = self._call("entries", path={"channel": channel}, params=params)["entries"]
        return entries

    def wait(self, channel: str, timeout: float | None = None) -> bool:
        """True once the channel is idle; False if ``timeout`` passed first."""
        params = {"timeout": timeout} if timeout is not None else {}
        body = self._call("wait", path={"channel": channel}, params=params)
        return bool(body["idle"])

    def follow(self, channel: str, after: int = 0, *, drafts: bool = False) -> Iterator[dict[str, Any]]:
        """Entries after ``after``, then live ones; :class:`DaemonGone` when the daemon goes away.

        With ``drafts``, also the text agents are writing now (``{"kind": "draft", "draft", …}``,
        never stored; the entry that saves it has ``meta.draft``)."""
        op = OPERATIONS["follow"]
        conn = self._connect()  # a connection of its own, held for as long as it follows
        conn.timeout = None  # ... however long the channel stays quiet
        try:
            try:
                query = {"after": after, **({"drafts": 1} if drafts else {})}
                conn.request(op.method, f"{op.target(channel=channel)}?{urlencode(query)}", headers=self._headers)
                response = conn.getresponse()
            except _UNAVAILABLE as exc:
                raise DaemonUnavailable(str(exc) or type(exc).__name__) from None
            if response.status not in op.ok:
                _decode(response.status, response.read(), ())
            try:
                for raw in response:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line.startswith("data: "):
                        yield json.loads(line[6:])
            except _UNAVAILABLE:
                pass
            # The daemon ends a stream only when it shuts down (or dies).
            raise DaemonGone(f"the daemon on {self.where} went away")
        finally:
            conn.close()

    def login_code(self) -> dict[str, Any]:
        """A one-time dashboard login code (the token is needed): ``{"code", "path", "expires_in"}``."""
        minted: dict[str, Any] = self._request("POST", "/dashboard/codes", ok=(201,))
        return minted

    def shutdown(self) -> None:
        """Ask the daemon to shut down in order."""
        self._call("shutdown")


def _decode(status: int, data: bytes, ok: tuple[int, ...]) -> Any:
    try:
        body = json.loads(data) if data else None
    except ValueError:
        body = None
    if status not in ok:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        text = data.decode("utf-8", "replace")
        raise APIError(status, error.get("code", "error"), error.get("message", text), body)
    return body
