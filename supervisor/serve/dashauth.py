"""Who may use the web dashboard: one-time login codes, session cookies, the same-origin rule.

Theory of operation. The browser never holds the bearer token, so the token never sits in
its history, its cache or a screenshot of its address bar:

* ``corral dashboard`` asks the daemon, with the token, for a **login code**: random, kept in
  the daemon's memory, spent on first use and void after :data:`CODE_SECONDS`. The login URL
  carries it; visiting it spends it, sets a session cookie and redirects to the dashboard.
* A **session cookie** is ``EXPIRY.NONCE.MAC``: HMAC-SHA256, under a key derived from the
  token, of the expiry and a random nonce. Nothing is stored, so a session survives a daemon
  restart (the open page reconnects by itself), and every session ends when the token
  changes. It is ``HttpOnly`` (no script reads it) and ``SameSite=Strict``.
* With a cookie the page may do only what it needs: read the status and channels, send,
  stop one channel or all, start a channel over, send a dropped message again. Never shut
  down, never mint codes: those need the token.
* A browser sends a cookie to **every port** of a host, and another port of ``127.0.0.1`` is
  the same *site*, so ``SameSite`` alone does not keep out a page that some other local
  program serves. A request that changes state must therefore carry an ``Origin`` equal to
  the listener's own, and a script's read (``Sec-Fetch-Site``) must be same-origin.
* Every request without the token must name a loopback ``Host`` (a DNS-rebinding page names
  its own host): ``127.0.0.1``, ``localhost`` or ``[::1]``, with a port. Any port: a browser
  puts in ``Host`` the authority it connected to, so a loopback name with another port reaches
  this listener only through a forwarder on a loopback port, an ssh tunnel (``ssh -L
  9000:127.0.0.1:8765``: ``Host: localhost:9000``) above all. That loosens nothing of the
  same-origin rule: ``Origin`` must still equal ``http://`` + that ``Host``, so a page of
  another port (another origin) still cannot change anything nor read the API. One with
  neither the token nor a session is told it needs one (401) before anything else.

Everything here is pure: the clock and the randomness are arguments; :func:`decide` is the
one decision, the control API's one auth site calls it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

#: How long a login URL works, in seconds: long enough to paste it into a browser.
CODE_SECONDS = 120.0
#: How long a session lasts, in seconds: a working day and then some; log in again after.
SESSION_SECONDS = 24 * 3600
#: Login codes not yet spent that the daemon keeps at most (the oldest is dropped first).
MAX_CODES = 64

#: Hosts a browser may use to reach the loopback listener.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")

Headers = Iterable[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: an HTTP status, an error code and a message with the fix."""

    status: int
    code: str
    message: str


def session_key(token: str) -> bytes:
    """The key session cookies are signed with, derived from the bearer token."""
    return hmac.new(token.encode(), b"corral dashboard session v1", hashlib.sha256).digest()


def _mac(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def new_session(key: bytes, now: float, nonce: Callable[[], str] = lambda: secrets.token_hex(16)) -> str:
    """A session cookie's value, valid for :data:`SESSION_SECONDS` from ``now``."""
    payload = f"{int(now) + SESSION_SECONDS}.{nonce()}"
    return f"{payload}.{_mac(key, payload)}"


def session_valid(key: bytes, value: str, now: float) -> bool:
    """True if ``value`` is a session cookie signed with ``key`` that has not expired."""
    expiry, _, rest = value.partition(".")
    nonce, _, mac = rest.partition(".")
    if not (expiry.isdigit() and nonce and mac):
        return False
    if not hmac.compare_digest(mac, _mac(key, f"{expiry}.{nonce}")):
        return False
    return now < int(expiry)


def cookie_name(port: int) -> str:
    """The session cookie's name: per port, since browsers share cookies between a host's ports."""
    return f"corral-session-{port}"


def set_cookie(port: int, value: str) -> bytes:
    """The ``Set-Cookie`` header value that starts a session."""
    return (
        f"{cookie_name(port)}={value}; Path=/; Max-Age={SESSION_SECONDS}; HttpOnly; SameSite=Strict"
    ).encode()


def cookies(headers: Headers) -> dict[str, str]:
    """The request's cookies (every ``Cookie`` header), name to value."""
    found: dict[str, str] = {}
    for name, value in headers:
        if name.lower() != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key, sep, val = part.strip().partition("=")
            if sep:
                found.setdefault(key, val)
    return found


class LoginCodes:
    """The login codes minted and not yet spent: each works once, for :data:`CODE_SECONDS`."""

    def __init__(self) -> None:
        self._codes: dict[str, float] = {}

    def mint(self, now: float, code: str | None = None) -> str:
        """A new code, valid until ``now + CODE_SECONDS``."""
        self._prune(now)
        while len(self._codes) >= MAX_CODES:
            del self._codes[next(iter(self._codes))]
        code = code or secrets.token_urlsafe(24)
        self._codes[code] = now + CODE_SECONDS
        return code

    def spend(self, code: str, now: float) -> bool:
        """True, once, for a code minted less than :data:`CODE_SECONDS` ago."""
        self._prune(now)
        return self._codes.pop(code, 0.0) > now

    def _prune(self, now: float) -> None:
        for code in [c for c, expiry in self._codes.items() if expiry <= now]:
            del self._codes[code]


#: What a session may call: (method, path with ``*`` for one channel segment).
SESSION_ROUTES = frozenset(
    {
        ("GET", ("dashboard",)),
        ("GET", ("dashboard", "channels", "*")),
        ("GET", ("dashboard", "events")),
        ("GET", ("v1", "status")),
        ("GET", ("v1", "channels", "*", "entries")),
        ("GET", ("v1", "channels", "*", "events")),
        ("POST", ("v1", "channels", "*", "messages")),
        ("POST", ("v1", "channels", "*", "stop")),
        ("POST", ("v1", "channels", "*", "reset")),
        ("POST", ("v1", "channels", "*", "resend")),
        ("GET", ("v1", "channels", "*", "queue")),
        ("GET", ("v1", "usage")),
        ("DELETE", ("v1", "channels", "*", "queue", "*")),
        ("POST", ("v1", "stop")),
    }
)
#: What anyone who reaches the listener may fetch: the page's own files, and the login URL.
PUBLIC_PREFIXES = (("dashboard", "static"), ("dashboard", "login"))


def loopback_host(host: str) -> bool:
    """``Host`` names a loopback name and a port: ``localhost:8765``, ``[::1]:9000`` (see the module)."""
    name, colon, port = host.rpartition(":")
    return (bool(colon) and name in LOOPBACK_HOSTS and port.isascii() and port.isdigit()
            and not port.startswith("0") and 0 < int(port) < 65536)


def _shape(parts: list[str]) -> tuple[str, ...]:
    """The route's shape: the channel segment (the third of ``channels/NAME/...``) as ``*``, and
    a queued message's seq (``…/queue/SEQ``) too."""
    if len(parts) >= 3 and parts[1] == "channels":
        rest = parts[3:]
        if rest[:1] == ["queue"] and len(rest) >= 2:
            rest = ["queue", "*", *rest[2:]]
        return (parts[0], "channels", "*", *rest)
    return tuple(parts)


def decide(
    method: str, parts: list[str], headers: Headers, *, port: int, key: bytes, now: float, bearer: bool
) -> Refusal | None:
    """None if the request may go on; else why not. ``parts``: the decoded path segments.

    A request with the bearer token may do anything (the control API's own rule); every
    other one must come from the dashboard as described in the module's docstring.
    """
    if bearer:
        return None
    fields: Mapping[bytes, bytes] = {name.lower(): value for name, value in headers}
    public = method == "GET" and any(tuple(parts[: len(prefix)]) == prefix for prefix in PUBLIC_PREFIXES)
    if not public:
        session = cookies(headers).get(cookie_name(port))
        if session is None or not session_valid(key, session, now):
            return Refusal(
                401, "unauthorized",
                "this listener needs 'Authorization: Bearer <token>' or a dashboard session: "
                "run `corral dashboard` and open the URL it prints",
            )
    host = fields.get(b"host", b"").decode("latin-1")
    if not loopback_host(host):
        return Refusal(
            403, "bad_host",
            f"the Host {host[:80]!r} is not a loopback name (127.0.0.1, localhost, [::1]) with a port; open the URL "
            "`corral dashboard` prints (through an ssh tunnel: `corral dashboard --port LOCAL_PORT`)",
        )
    if public:
        return None
    shape = _shape(parts)
    if (method, shape) not in SESSION_ROUTES:
        return Refusal(
            403, "forbidden",
            f"a dashboard session may not {method} /{'/'.join(parts)}; use the CLI (it has the token)",
        )
    origin = fields.get(b"origin", b"").decode("latin-1")
    if method not in ("GET", "HEAD") and origin != f"http://{host}":
        return Refusal(
            403, "cross_origin",
            f"refused a {method} from origin {origin[:80] or '(none)'!r}: only the dashboard's own pages "
            f"(http://{host}) may change anything",
        )
    site = fields.get(b"sec-fetch-site", b"").decode("latin-1")
    reads_api = shape[:1] == ("v1",) or shape == ("dashboard", "events")
    if reads_api and site and site != "same-origin":
        return Refusal(403, "cross_origin", f"refused a {site} read of the API: only the dashboard's pages")
    return None
