"""A small synchronous client of the control API, used by the CLI (and handy in scripts)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx


class DaemonUnavailable(Exception):
    """No daemon answers on the socket."""


class APIError(Exception):
    """The daemon answered with an error."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.body = body


def _channel(channel: str) -> str:
    return quote(channel, safe="")


class Client:
    """Talks to a corral daemon over its Unix socket (or a loopback TCP URL with a token)."""

    def __init__(self, socket_path: str | None = None, *, url: str | None = None, token: str | None = None) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        if url is not None:
            self._http = httpx.Client(base_url=url, headers=headers, timeout=None)
        else:
            # No pool cap: each follower holds a connection for as long as it follows.
            transport = httpx.HTTPTransport(uds=socket_path, limits=httpx.Limits(max_connections=None, max_keepalive_connections=20))
            self._http = httpx.Client(base_url="http://corral", transport=transport, headers=headers, timeout=None)
        self.where = url or socket_path

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, ok: tuple[int, ...] = (200, 202), **kw: Any) -> Any:
        try:
            response = self._http.request(method, path, **kw)
        except (httpx.ConnectError, httpx.RemoteProtocolError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonUnavailable(str(exc)) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code not in ok:
            error = (body or {}).get("error", {}) if isinstance(body, dict) else {}
            raise APIError(response.status_code, error.get("code", "error"), error.get("message", response.text), body)
        return body

    def send(self, channel: str, text: str, *, agent: str | None = None, author: str | None = None) -> dict[str, Any]:
        """Queue a message; returns ``{"seq": …}`` once it is stored."""
        payload: dict[str, Any] = {"text": text}
        if agent:
            payload["agent"] = agent
        if author:
            payload["author"] = author
        return self._request("POST", f"/v1/channels/{_channel(channel)}/messages", json=payload)

    def stop(self, channel: str | None) -> dict[str, Any]:
        """Stop a channel (or all with None); returns the stop result, even a failed one."""
        path = "/v1/stop" if channel is None else f"/v1/channels/{_channel(channel)}/stop"
        return self._request("POST", path, ok=(200, 500))

    def status(self) -> dict[str, Any]:
        """The daemon's status."""
        return self._request("GET", "/v1/status")

    def entries(self, channel: str, after: int = 0) -> list[dict[str, Any]]:
        """Committed entries after ``after``."""
        return self._request("GET", f"/v1/channels/{_channel(channel)}/entries", params={"after": after})["entries"]

    def wait(self, channel: str, timeout: float | None = None) -> bool:
        """True once the channel is idle; False if ``timeout`` passed first."""
        params = {"timeout": timeout} if timeout is not None else {}
        body = self._request("POST", f"/v1/channels/{_channel(channel)}/wait", params=params, ok=(200, 408))
        return bool(body["idle"])

    def follow(self, channel: str, after: int = 0) -> Iterator[dict[str, Any]]:
        """Entries after ``after``, then live ones, until the daemon closes the stream."""
        try:
            with self._http.stream("GET", f"/v1/channels/{_channel(channel)}/events", params={"after": after}) as response:
                if response.status_code != 200:
                    response.read()
                    raise APIError(response.status_code, "error", response.text)
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        yield json.loads(line[6:])
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonUnavailable(str(exc)) from None
        except httpx.RemoteProtocolError:
            return

    def shutdown(self) -> None:
        """Ask the daemon to shut down in order."""
        self._request("POST", "/v1/shutdown")
