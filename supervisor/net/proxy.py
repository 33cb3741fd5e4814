"""The daemon's proxy: a turn's only way to the network, and the policy applied to each connection.

Theory of operation
-------------------

A turn whose ``network`` is a policy (:mod:`supervisor.core.netpolicy`) runs in a network
namespace of its own (:mod:`supervisor.procs.netns`) whose one listener,
``127.0.0.1:PROXY_PORT`` on its own loopback, belongs to this proxy: :meth:`NetworkService.open`
takes a namespace and serves its listener for that turn (a :class:`TurnNetwork`), and the
turn gets ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` (and lower case) pointing there, and
``NO_PROXY`` its own loopback. A loopback port of the host granted one by one
(``network_allow = ["127.0.0.1:11434"]``) also has a listener at the same address on the
turn's loopback, served here: each connection to it is forwarded to the host's, so a tool
that keeps loopback off the proxy (as ``NO_PROXY`` says) reaches it directly.

One port speaks three ways, told apart by the first byte: SOCKS5 (``0x05``: CONNECT, no
authentication), HTTP ``CONNECT host:port`` (a tunnel: TLS passes through untouched), and a
plain-HTTP request with an absolute URI (forwarded once, with ``Connection: close``).

For every connection the proxy **resolves the name itself** and asks
:func:`~supervisor.core.netpolicy.decide` about each address it is about to connect to; it
connects to the first allowed one. So what is checked is what is reached: a name that
resolves to ``127.0.0.1`` or ``169.254.169.254`` is refused, whatever it looks like (no
DNS rebinding: the address asked about is the address connected to, never re-resolved). A
refusal is answered at once — HTTP 403 with the reason (``X-Corral-Proxy`` and the body),
SOCKS reply 2, "not allowed by ruleset" — never a hang, and logged once per turn and host.

**Bounds.** At most ``max_connections`` connections in all and ``per_turn`` per turn (past
either, 503 / SOCKS 1 at once); a request head of at most 16 KiB, read within 30 s; relayed
in the kernel (``splice`` through a pipe of 64 KiB per direction, never copied into Python;
each ``splice`` is tried before any wait, which costs a trip through Trio's scheduler, with a
checkpoint every :data:`STEPS` moves): at most 128 KiB in flight per connection, 128 MiB at
the default bound. **A turn's
connections end with it**: each turn's are tasks of its own cancel scope, and
:meth:`TurnNetwork.aclose` (the turn's teardown, after its processes are ended) cancels it
and waits until every socket is closed (no wait when none is open); the namespace's holder
ends right after.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket as stdsocket
from collections.abc import Mapping
from dataclasses import dataclass, field

import trio

from ..core.netpolicy import Allowed, IPAddress, Policy, Refused, decide, parse_address, screen
from ..procs.netns import PROXY_PORT, NetNamespace, NetnsPool, nsenter_program
from . import wire

log = logging.getLogger("corral.proxy")

#: Bytes moved per step, and a relay pipe's size (Linux's default pipe: no resize needed).
CHUNK = 64 * 1024
#: Moves between checkpoints while both sides stay ready (1 MiB at 64 KiB a move).
STEPS = 16
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 15.0
#: Defaults of the bounds (see the module's docstring).
MAX_CONNECTIONS = 1024
PER_TURN = 128


#: What a turn's tools keep off the proxy: loopback is the turn's own (a CLI's own local
#: server, as opencode's and kilo's ACP agents talk to theirs), where the host's granted
#: loopback ports are forwarded (:attr:`~supervisor.core.netpolicy.Policy.forwarded`).
NO_PROXY = "localhost,127.0.0.1,::1"


def proxy_environment(port: int = PROXY_PORT) -> dict[str, str]:
    """What a turn behind the proxy gets: every proxy variable the common tools read
    (``docs/agents.md`` says, per CLI, which it honours), and :data:`NO_PROXY`."""
    url = f"http://127.0.0.1:{port}"
    # ALL_PROXY names the HTTP proxy too, not SOCKS (which the same port also speaks): httpx
    # refuses a socks5h:// ALL_PROXY unless its optional socksio is installed (Mistral Vibe).
    env = {"HTTPS_PROXY": url, "HTTP_PROXY": url, "ALL_PROXY": url, "NO_PROXY": NO_PROXY}
    # Node's own fetch (undici) reads them only when told to (Node 24.5+, 22.21+; older ones
    # ignore the variable): a bare fetch in a tool then works, where otherwise it fails closed.
    return {**env, **{key.lower(): value for key, value in env.items()}, "NODE_USE_ENV_PROXY": "1"}


@dataclass(eq=False)
class TurnNetwork:
    """One turn's network: its namespace, served by the proxy under its policy, until closed."""

    turn_id: str
    policy: Policy
    netns: NetNamespace
    entering: tuple[str, ...]
    """The argv words that put the turn's program into its namespace (before the sandbox)."""
    env: Mapping[str, str]
    """The proxy variables for the turn's environment."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    refusals: dict[str, str] = field(default_factory=dict)
    """Each host:port refused, and why (logged once each)."""
    connections: int = 0
    """Connections open now."""
    served: int = 0
    """Connections taken in all."""
    closed: trio.Event = field(default_factory=trio.Event)

    async def aclose(self) -> None:
        """End every connection of the turn (shielded; idempotent); its namespace's holder
        ends right after, in the proxy's own task (it is corral's process, not the turn's:
        a stop need not wait for it).

        With no connection open there is nothing to wait for: the turn's processes are ended
        (its teardown closes the network after them), its listeners only ever hand out new
        connections, and any the cancelled scope still takes ends at its first checkpoint.
        So the turn goes on at once, and the proxy's task closes the listeners and the holder
        in its own step (a stop-all's turns each saved a wake-up on it)."""
        self.scope.cancel()
        if self.connections == 0:
            return
        with trio.CancelScope(shield=True):
            await self.closed.wait()


class NetworkService:
    """The proxy of one supervisor: namespaces from ``pool``, one :class:`TurnNetwork` per turn."""

    def __init__(self, nursery: trio.Nursery, pool: NetnsPool, *, max_connections: int = MAX_CONNECTIONS,
                 per_turn: int = PER_TURN) -> None:
        self._nursery = nursery
        self._pool = pool
        self.max_connections = max_connections
        self.per_turn = per_turn
        self.open_connections = 0
        self.turns: dict[str, TurnNetwork] = {}
        """The turns served now (a turn's entry goes when its network is closed)."""
        nsenter = nsenter_program()
        self.nsenter = nsenter

    @property
    def available(self) -> str | None:
        """Why a policy cannot be enforced here (None: it can)."""
        return None if self.nsenter else "nsenter (util-linux) is not installed"

    async def open(self, turn_id: str, policy: Policy) -> TurnNetwork:
        """Take a namespace and serve it for ``turn_id`` under ``policy``."""
        if self.nsenter is None:
            raise OSError(errno.ENOENT, "the network policy needs nsenter (util-linux), which is not installed")
        # (A grant of the proxy's own port stays reached through the proxy.)
        forwards = tuple(f for f in policy.forwarded if f[1] != PROXY_PORT)
        netns = await self._pool.take(forwards)
        net = TurnNetwork(turn_id, policy, netns, netns.entering(self.nsenter), proxy_environment())
        self.turns[turn_id] = net
        self._nursery.start_soon(self._serve, net)
        return net

    async def _serve(self, net: TurnNetwork) -> None:
        listeners: list[tuple[trio.socket.SocketType, tuple[str, int] | None]] = [
            (trio.socket.from_stdlib_socket(net.netns.listener), None),
            *((trio.socket.from_stdlib_socket(sock), target) for target, sock in net.netns.forwards.items()),
        ]
        try:
            with net.scope:
                async with trio.open_nursery() as nursery:
                    for listener, target in listeners:
                        nursery.start_soon(self._accept, net, listener, target, nursery)
        finally:
            for listener, _ in listeners:
                listener.close()
            self.turns.pop(net.turn_id, None)
            net.closed.set()
            with trio.CancelScope(shield=True):
                await net.netns.aclose()

    async def _accept(self, net: TurnNetwork, listener: trio.socket.SocketType, target: tuple[str, int] | None,
                      nursery: trio.Nursery) -> None:
        """Take ``listener``'s connections: the proxy's (``target`` None), or a forwarded port's."""
        while True:
            sock, _ = await listener.accept()
            stream = trio.SocketStream(sock)
            if self.open_connections >= self.max_connections or net.connections >= self.per_turn:
                if target is None:
                    nursery.start_soon(self._busy, stream)
                else:
                    await trio.aclose_forcefully(stream)
                continue
            self.open_connections += 1
            net.connections += 1
            net.served += 1
            nursery.start_soon(self._connection, net, stream, target)

    async def _busy(self, stream: trio.SocketStream) -> None:
        with trio.move_on_after(5):
            try:
                first = await stream.receive_some(wire.MAX_HEAD)
                if first[:1] == b"\x05":
                    await stream.send_all(bytes([5, wire.NO_METHOD]))
                else:
                    await stream.send_all(wire.http_answer(503, "Service Unavailable", "too many connections"))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        await trio.aclose_forcefully(stream)

    async def _connection(self, net: TurnNetwork, client: trio.SocketStream,
                          target: tuple[str, int] | None = None) -> None:
        try:
            if target is None:
                await self._handle(net, client)
            else:
                await self._forward(net, client, *target)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception:  # one connection's bug must not end the daemon's nursery
            log.exception("[%s] proxy connection failed", net.turn_id)
        finally:
            self.open_connections -= 1
            net.connections -= 1
            await trio.aclose_forcefully(client)

    async def _handle(self, net: TurnNetwork, client: trio.SocketStream) -> None:
        buffer = b""
        target: wire.Target | None = None
        socks = False
        with trio.move_on_after(HEAD_TIMEOUT) as head_scope:
            buffer = await client.receive_some(wire.MAX_HEAD)
            socks = buffer[:1] == b"\x05"
            try:
                if socks:
                    target, buffer = await self._socks_head(client, buffer)
                else:
                    while (target := wire.parse_http_head(buffer)) is None:
                        more = await client.receive_some(wire.MAX_HEAD)
                        if not more:
                            return
                        buffer += more
            except wire.WireError as exc:
                if socks:
                    await client.send_all(wire.socks_reply(exc.status))
                else:
                    await client.send_all(wire.http_answer(exc.status, "Bad Request", str(exc)))
                return
        if head_scope.cancelled_caught or target is None:
            return
        upstream, why = await self._connect(net, target)
        if upstream is None:
            if socks:
                await client.send_all(wire.socks_reply(why[0]))
            else:
                await client.send_all(wire.http_answer(*why[1:]))
            return
        try:
            if socks:
                await client.send_all(wire.socks_reply(wire.SOCKS_OK))
            elif target.tunnel:
                await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if target.forward:
                await upstream.send_all(target.forward)
            if target.rest:
                await upstream.send_all(target.rest)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, client, upstream)
                nursery.start_soon(_pump, upstream, client)
        finally:
            await trio.aclose_forcefully(upstream)

    async def _forward(self, net: TurnNetwork, client: trio.SocketStream, address: str, port: int) -> None:
        """A connection to a forwarded port on the turn's loopback: to the same address and
        port on the host's, as the policy's grant allows (asked again: the one decision)."""
        upstream, _ = await self._connect(net, wire.Target(address, port, tunnel=True))
        if upstream is None:
            return  # (refused or unreachable: logged by _connect's refusal; the client sees the close)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pump, client, upstream)
                nursery.start_soon(_pump, upstream, client)
        finally:
            await trio.aclose_forcefully(upstream)

    async def _socks_head(self, client: trio.SocketStream, buffer: bytes) -> tuple[wire.Target, bytes]:
        while (greeting := wire.parse_socks_greeting(buffer)) is None:
            buffer += await self._more(client)
        no_auth, used = greeting
        if not no_auth:
            await client.send_all(bytes([5, wire.NO_METHOD]))
            raise trio.BrokenResourceError("no acceptable SOCKS method")
        await client.send_all(bytes([5, wire.NO_AUTH]))
        buffer = buffer[used:]
        while (request := wire.parse_socks_request(buffer)) is None:
            buffer += await self._more(client)
        target, used = request
        return wire.Target(target.host, target.port, tunnel=True, rest=buffer[used:]), b""

    @staticmethod
    async def _more(client: trio.SocketStream) -> bytes:
        more = await client.receive_some(wire.MAX_HEAD)
        if not more:
            raise trio.BrokenResourceError("the client left mid-request")
        return more

    async def _connect(
        self, net: TurnNetwork, target: wire.Target
    ) -> tuple[trio.SocketStream | None, tuple[int, int, str, str]]:
        """Resolve, decide on each address, connect to the first allowed one.

        Returns the stream, or None and (SOCKS code, HTTP status, reason phrase, text)."""
        host, port = target.host, target.port
        early = screen(net.policy, host, port)
        if early is not None:
            return None, self._refused(net, host, port, early)
        literal = parse_address(host)
        addresses: list[IPAddress]
        if literal is not None:
            addresses = [literal]
        else:
            try:
                infos = await trio.socket.getaddrinfo(host, port, type=stdsocket.SOCK_STREAM)
            except OSError as exc:
                return None, (wire.SOCKS_HOST_UNREACHABLE, 502, "Bad Gateway", f"cannot resolve {host}: {exc}")
            addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos))
        refusal: Refused | None = None
        failure = ""
        for address in addresses:
            decision = decide(net.policy, host, port, address)
            if isinstance(decision, Refused):
                refusal = refusal or decision
                continue
            assert isinstance(decision, Allowed)
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    stream = await connect_to(address, port)
            except (OSError, trio.TooSlowError) as exc:
                failure = f"cannot connect to {host}:{port} ({address}): {exc or 'timed out'}"
                continue
            return stream, (0, 200, "", "")
        if refusal is not None and not failure:
            return None, self._refused(net, host, port, refusal)
        return None, (wire.SOCKS_REFUSED, 502, "Bad Gateway", failure or f"no address for {host}")


    @staticmethod
    def _refused(net: TurnNetwork, host: str, port: int, refusal: Refused) -> tuple[int, int, str, str]:
        """Log a refusal once per turn and host:port; the answer to give."""
        key = f"{host}:{port}"
        if key not in net.refusals:
            net.refusals[key] = refusal.reason
            log.warning("[%s] network refused: %s", net.turn_id, refusal.reason)
        return wire.SOCKS_NOT_ALLOWED, 403, "Forbidden", refusal.reason


async def connect_to(address: IPAddress, port: int) -> trio.SocketStream:
    """Connect to an address the policy allowed (the one place the proxy opens a connection)."""
    family = stdsocket.AF_INET6 if address.version == 6 else stdsocket.AF_INET
    sock = trio.socket.socket(family, stdsocket.SOCK_STREAM)
    try:
        await sock.connect((str(address), port))
    except BaseException:
        sock.close()
        raise
    sock.setsockopt(stdsocket.IPPROTO_TCP, stdsocket.TCP_NODELAY, 1)
    return trio.SocketStream(sock)


async def _pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    """Copy one direction until its end, then pass the end on (a half-close).

    The bytes move inside the kernel (``splice`` through a pipe: never copied into Python),
    which is what keeps a stream's throughput near a direct connection's; the pipe holds at
    most one chunk, so memory stays bounded per connection."""
    try:
        try:
            await _splice(source, sink)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            while data := await source.receive_some(CHUNK):  # (no splice for these sockets)
                await sink.send_all(data)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await trio.aclose_forcefully(source)
        await trio.aclose_forcefully(sink)


async def _splice(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    """Move one direction's bytes through a pipe, trying each ``splice`` before waiting: a
    wait is a trip through Trio's scheduler, and most steps need none (the socket has data,
    the other can take it). A checkpoint every :data:`STEPS` moves keeps it fair to the
    daemon's other tasks and cancellable."""
    src, dst = source.socket.fileno(), sink.socket.fileno()
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
    steps = 0
    try:
        while True:
            try:
                moved = os.splice(src, write_end, CHUNK, flags=flags)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(source.socket)
                steps = 0
                continue
            if moved == 0:
                return
            while moved:
                try:
                    moved -= os.splice(read_end, dst, moved, flags=flags)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sink.socket)
                    steps = 0
            steps += 1
            if steps >= STEPS:
                await trio.lowlevel.checkpoint()
                steps = 0
    finally:
        os.close(read_end)
        os.close(write_end)
