"""A fault proxy on loopback between fleet hosts and PostgreSQL (tests, ``faults.py --fleet
--partition``, ``bench_fleet``).

A :class:`FaultProxy` listens on 127.0.0.1 (a port of its own) and forwards every connection
to the server's Unix socket, with one of these faults at a time, switched at any moment:

* **forward**: bytes pass as they come;
* **delay** (fixed, or jittered between two bounds): each chunk the server sends is held
  that long before it is passed on, in order (a statement's round trip costs the delay);
* **blackhole**: nothing is read from either side of any connection, old or new (new
  connections are still accepted): the way a cut cable looks to both ends — connections
  stay open, the kernels still acknowledge, nothing arrives. A chunk read just before the
  cut is held, not passed on;
* **reset**: every connection open now is reset (RST to the host, EOF to the server);
* **heal**: back to forwarding; what the blackhole held flows on, as TCP would retransmit it.

``blackhole(notices_only=True)`` cuts only the connections that sent ``LISTEN`` (a host's
notices from the other hosts) while its other connections go on: a partition of the inter-
host notices with the database reachable. A partition of the database from every host is
every host's proxy blackholed at once (:func:`cut_all`).

Traffic stays on 127.0.0.1 (and the server's Unix socket). A fault proxy is for tests: it
holds data in memory and uses a thread per direction of each connection.
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable

#: How often a pump looks for a change of fault while its side is quiet (seconds).
_POLL = 0.05


class _Pair:
    """One proxied connection: the host's side and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.listener = False
        """The host sent ``LISTEN`` on it (its notices' connection)."""
        self.released = 0.0
        """When the last delayed chunk toward the host was (or is to be) passed on."""
        self.closed = False


class FaultProxy:
    """A TCP proxy on 127.0.0.1 to a PostgreSQL server's Unix socket, with switchable faults."""

    def __init__(self, upstream: str, name: str = "") -> None:
        """``upstream``: the server's Unix socket path (``.../.s.PGSQL.5432``)."""
        self.upstream = upstream
        self.name = name
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._cond = threading.Condition()
        self._mode = "forward"
        self._notices_only = False
        self._delay = (0.0, 0.0)
        self._rng = random.Random(0)
        self._pairs: set[_Pair] = set()
        self._closing = False
        self.faults: Counter[str] = Counter()
        """How many times each fault was switched on."""
        self._accepting = threading.Thread(target=self._accept, name=f"proxy-{name}", daemon=True)
        self._accepting.start()

    def url(self, database: str) -> str:
        """The libpq URL of ``database`` through this proxy."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    # ------------------------------------------------------------ faults

    def forward(self) -> None:
        """Pass every byte on as it comes (also ends a delay)."""
        self._set("forward")

    def heal(self) -> None:
        """End any fault: forward again, and let what a blackhole held flow on."""
        self._set("forward")

    def delay(self, low: float, high: float | None = None, *, seed: int = 0) -> None:
        """Hold each chunk from the server ``low`` seconds (or a uniform draw in [low, high])."""
        with self._cond:
            self._delay = (low, low if high is None else high)
            self._rng = random.Random(seed)
        self._set("delay")

    def blackhole(self, *, notices_only: bool = False) -> None:
        """Read nothing from either side (``notices_only``: of the connections that sent
        LISTEN); connections stay open."""
        with self._cond:
            self._notices_only = notices_only
        self._set("blackhole-notices" if notices_only else "blackhole")

    def reset(self) -> None:
        """Reset every connection open now (the host sees ECONNRESET, the server EOF); new
        connections are forwarded."""
        with self._cond:
            pairs = list(self._pairs)
            self.faults["reset"] += 1
        for pair in pairs:
            with contextlib.suppress(OSError):
                pair.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self._drop(pair)

    def close(self) -> None:
        """Stop accepting and close every connection."""
        with self._cond:
            self._closing = True
            pairs = list(self._pairs)
            self._cond.notify_all()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for pair in pairs:
            self._drop(pair)

    def _set(self, mode: str) -> None:
        with self._cond:
            if mode != "forward":
                self.faults[mode] += 1
            self._mode = mode
            self._cond.notify_all()

    # ------------------------------------------------------------ the pumps

    def _cut(self, pair: _Pair) -> bool:
        return self._mode == "blackhole" or (self._mode == "blackhole-notices" and pair.listener)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.upstream)
            except OSError:
                client.close()
                server.close()
                continue
            pair = _Pair(client, server)
            with self._cond:
                if self._closing:
                    client.close()
                    server.close()
                    return
                self._pairs.add(pair)
            for up in (True, False):
                threading.Thread(target=self._pump, args=(pair, up), daemon=True,
                                 name=f"proxy-{self.name}-{'up' if up else 'down'}").start()

    def _wait_while_cut(self, pair: _Pair) -> bool:
        """Block while the fault cuts this connection; False once it is closed."""
        with self._cond:
            while self._cut(pair) and not (self._closing or pair.closed):
                self._cond.wait()
            return not (self._closing or pair.closed)

    def _pump(self, pair: _Pair, up: bool) -> None:
        src, dst = (pair.client, pair.server) if up else (pair.server, pair.client)
        try:
            while self._wait_while_cut(pair):
                ready, _, _ = select.select([src], [], [], _POLL)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                if up and b"LISTEN " in data:
                    pair.listener = True
                if not self._wait_while_cut(pair):  # (read just as the cut began: held, not passed on)
                    break
                if not up:
                    self._hold(pair)
                dst.sendall(data)
        except OSError:
            pass
        self._drop(pair)

    def _hold(self, pair: _Pair) -> None:
        """(Toward the host, delay mode) wait until this chunk's turn, order kept."""
        with self._cond:
            if self._mode != "delay":
                return
            low, high = self._delay
            pair.released = max(pair.released, time.monotonic() + self._rng.uniform(low, high))
            release = pair.released
        pause = release - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # (the fault itself: the answer is late by this much)

    def _drop(self, pair: _Pair) -> None:
        with self._cond:
            pair.closed = True
            self._pairs.discard(pair)
            self._cond.notify_all()
        for sock in (pair.client, pair.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def cut_all(proxies: Iterable[FaultProxy]) -> None:
    """A partition of the database from every host: every proxy blackholed."""
    for proxy in proxies:
        proxy.blackhole()


def heal_all(proxies: Iterable[FaultProxy]) -> None:
    """Every proxy forwards again."""
    for proxy in proxies:
        proxy.heal()
