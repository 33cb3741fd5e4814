"""What a client says to the proxy, parsed: an HTTP request head, a SOCKS5 greeting and request.

Pure: bytes in, a frozen answer (or None: not all of it yet) out, :class:`WireError` for what
cannot be served. The proxy (:mod:`.proxy`) does the reading and writing.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

#: The longest request head the proxy reads (a client sending more is refused).
MAX_HEAD = 16 * 1024
#: Headers a proxy consumes and never passes on (RFC 9110 §7.6.1), besides ``Connection``'s own list.
_HOP = {b"proxy-connection", b"proxy-authorization", b"proxy-authenticate", b"keep-alive", b"te",
        b"trailer", b"upgrade", b"connection"}


class WireError(ValueError):
    """A request the proxy cannot serve; ``status`` is the HTTP status (or SOCKS reply) to answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Target:
    """Where the client wants to go, and what to send there first."""

    host: str
    port: int
    tunnel: bool
    """CONNECT (or SOCKS): answer "established" and relay bytes; else ``forward`` goes first."""
    forward: bytes = b""
    """A plain-HTTP request's head rewritten for the server (origin-form, ``Connection: close``)."""
    rest: bytes = b""
    """What the client sent after the head (the start of a body), to send on after ``forward``."""


def parse_http_head(data: bytes) -> Target | None:
    """An HTTP/1.x proxy request (CONNECT ``host:port``, or an absolute ``http://`` URI)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_HEAD:
            raise WireError("request head too long", 431)
        return None
    head, rest = data[:end], data[end + 4:]
    lines = head.split(b"\r\n")
    try:
        method, target, version = lines[0].decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise WireError("not an HTTP request line") from None
    if not version.startswith("HTTP/1."):
        raise WireError(f"unsupported protocol {version!r}", 505)
    if method == "CONNECT":
        host, port = split_host_port(target, None)
        return Target(host, port, tunnel=True, rest=rest)
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        raise WireError(f"a proxy request names an http:// URL (CONNECT for https), got {target[:200]!r}")
    try:
        port = parts.port or 80
    except ValueError:
        raise WireError(f"bad port in {target[:200]!r}") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    kept = [line for line in lines[1:] if line.split(b":", 1)[0].strip().lower() not in _HOP]
    if not any(line.split(b":", 1)[0].strip().lower() == b"host" for line in kept):
        kept.insert(0, b"Host: " + parts.netloc.encode("ascii", "replace"))
    forward = b"\r\n".join([f"{method} {path} {version}".encode("ascii"), *kept, b"Connection: close", b"", b""])
    return Target(_host(parts.hostname), port, tunnel=False, forward=forward, rest=rest)


def split_host_port(text: str, default: int | None) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` (``default`` when no port is given and one is allowed)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if not sep or (rest and not rest.startswith(":")):
            raise WireError(f"bad address {text[:200]!r}")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    if not port_text:
        if default is None:
            raise WireError(f"CONNECT needs host:port, got {text[:200]!r}")
        return _host(host), default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise WireError(f"bad port in {text[:200]!r}")
    return _host(host), int(port_text)


def _host(host: str) -> str:
    if not host or len(host) > 253 or any(c in host for c in " /\\@\0\r\n"):
        raise WireError(f"bad host {host[:200]!r}")
    return host.lower()


# ------------------------------------------------------------------ SOCKS5 (RFC 1928)

SOCKS_VERSION = 5
#: The reply codes the proxy uses.
SOCKS_OK, SOCKS_FAILURE, SOCKS_NOT_ALLOWED, SOCKS_HOST_UNREACHABLE, SOCKS_REFUSED = 0, 1, 2, 4, 5
SOCKS_BAD_COMMAND, SOCKS_BAD_ADDRESS = 7, 8
#: "No authentication required", and "no acceptable methods".
NO_AUTH, NO_METHOD = 0, 0xFF


def parse_socks_greeting(data: bytes) -> tuple[bool, int] | None:
    """The client's methods: (whether "no authentication" is offered, bytes used), or None."""
    if len(data) < 2:
        return None
    if data[0] != SOCKS_VERSION:
        raise WireError("not SOCKS5", SOCKS_FAILURE)
    count = data[1]
    if len(data) < 2 + count:
        return None
    return NO_AUTH in data[2:2 + count], 2 + count


def parse_socks_request(data: bytes) -> tuple[Target, int] | None:
    """A CONNECT request: the target and the bytes used, or None; other commands are refused."""
    if len(data) < 5:
        return None
    if data[0] != SOCKS_VERSION:
        raise WireError("not SOCKS5", SOCKS_FAILURE)
    if data[1] != 1:
        raise WireError("only CONNECT is served", SOCKS_BAD_COMMAND)
    kind = data[3]
    if kind == 1:
        end = 4 + 4
        host = str(ipaddress.IPv4Address(data[4:end])) if len(data) >= end else ""
    elif kind == 4:
        end = 4 + 16
        host = str(ipaddress.IPv6Address(data[4:end])) if len(data) >= end else ""
    elif kind == 3:
        end = 5 + data[4]
        try:
            host = data[5:end].decode("ascii") if len(data) >= end else ""
        except UnicodeDecodeError:
            raise WireError("bad host name", SOCKS_BAD_ADDRESS) from None
    else:
        raise WireError("unknown address type", SOCKS_BAD_ADDRESS)
    if len(data) < end + 2:
        return None
    port = int.from_bytes(data[end:end + 2], "big")
    if port == 0:
        raise WireError("port 0", SOCKS_BAD_ADDRESS)
    try:
        return Target(_host(host), port, tunnel=True), end + 2
    except WireError as exc:
        raise WireError(str(exc), SOCKS_BAD_ADDRESS) from None


def socks_reply(code: int) -> bytes:
    """A SOCKS5 reply (the bound address is not told: zeros, as many servers do)."""
    return bytes([SOCKS_VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])


def http_answer(status: int, reason: str, text: str) -> bytes:
    """A short plain-text answer that closes the connection (a refusal names its reason)."""
    body = f"corral: {text}\n".encode()
    safe = text.encode("ascii", "replace").replace(b"\r", b" ").replace(b"\n", b" ")[:512]
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode() + b"X-Corral-Proxy: " + safe + \
        b"\r\n\r\n" + body
