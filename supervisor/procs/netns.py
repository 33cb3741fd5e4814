"""A network namespace per turn whose only way out is the daemon's proxy.

Theory of operation
-------------------

A turn whose ``network`` is a policy (``"internet"``, ``"model"``, a list:
:mod:`supervisor.core.netpolicy`) must reach nothing but what the proxy
(:mod:`supervisor.net.proxy`) allows, whatever its tools do. So its sandbox lives in a
network namespace with nothing in it but ``lo``, and on ``lo`` one listener: the proxy's.

The namespace is made *before* the turn, by a small helper (:mod:`._netns_helper`, run
outside any sandbox): it makes a user namespace owning a network namespace, brings ``lo``
up, binds ``127.0.0.1:PROXY_PORT`` there and sends that listening socket to the daemon
(``SCM_RIGHTS``), then holds the namespaces (it ``exec``\\ s ``cat`` on a pipe the daemon
keeps). The daemon's proxy accepts on that socket itself: a connection the turn makes to
``127.0.0.1:PROXY_PORT`` lands in the daemon, with no relay process and no extra hop. It
binds the turn's forwarded ports the same way (a loopback port of the host its policy grants
one by one: :attr:`~supervisor.core.netpolicy.Policy.forwarded`), so spares are kept per set
of forwarded ports (most agents: none). The
turn's program then starts behind ``nsenter --target HOLDER --user --net
--preserve-credentials`` in front of bwrap (which makes its own user namespace inside, with
no capability in the helper's), so nothing of the turn ever runs in the host's network.

Why not ``bwrap --unshare-net`` and a relay inside? Something inside must bind the port,
and every way to run code there is a program's start on the turn's critical path (a Python
relay: 10 to 20 ms here); ``nsenter`` is one ``execve`` of a small C program (about 1 ms), and
the helper's own start is off the critical path: :class:`NetnsPool` keeps ``spares``
namespaces made ahead, and makes the next while a turn runs (at ``nice 19``, so that making
it does not slow the turn's own start on a busy machine). A tool that ignores the proxy
variables finds a network with no route anywhere: it fails closed.

The holder is ended (its pipe closed, then the process reaped) when the turn's network is
released; a daemon that dies closes the pipe too, so no holder outlives it. Whatever the
turn left in the namespace dies with the turn's processes.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

log = logging.getLogger("corral.netns")

#: The port the proxy listens on inside every turn's namespace (its own loopback: no clash).
PROXY_PORT = 3128
_HELPER = Path(__file__).with_name("_netns_helper.py")
#: Namespaces kept ready: one, so a turn's start waits for none while turns come one at a
#: time; a burst makes the rest on the spot (about 40 ms of CPU each), and none is wasted
#: by a supervisor that runs few turns.
SPARES = 1
#: How long a helper may take to make its namespace before the turn fails to start.
MAKE_TIMEOUT = 30.0


#: The helpers and holders alive now, children Trio waits for itself: the subreaper's pass
#: over dead children (:func:`supervisor.procs.tree.reap_orphans`) must leave them alone.
_OURS: set[int] = set()


def holder_pids() -> set[int]:
    """The pids of every helper and holder this process runs now."""
    return set(_OURS)


class NetnsUnavailable(OSError):
    """No network namespace could be made here (the reason, and the fix)."""


@dataclass(eq=False)
class NetNamespace:
    """One turn's network namespace: the holder process and the proxy's listener inside it."""

    holder: trio.Process
    listener: socket.socket
    forwards: dict[tuple[str, int], socket.socket] = field(default_factory=dict)
    """The listeners on the namespace's loopback for the host's granted loopback ports, by
    (address, port): what the proxy forwards to the same address on the host."""
    _closed: bool = field(default=False, repr=False)

    def entering(self, nsenter: str) -> tuple[str, ...]:
        """The argv words that put a program into this namespace (before bwrap)."""
        return (nsenter, f"--target={self.holder.pid}", "--user", "--net", "--preserve-credentials", "--")

    async def aclose(self) -> None:
        """End the holder and close the listener (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.listener.close()
        for sock in self.forwards.values():
            sock.close()
        stdin = self.holder.stdin
        if isinstance(stdin, trio.lowlevel.FdStream):
            stdin.close()  # cat reads EOF and exits (no checkpoint: a stop of many turns waits on these)
        elif stdin is not None:
            await stdin.aclose()
        with trio.move_on_after(5):
            await self.holder.wait()
        if self.holder.returncode is None:
            self.holder.kill()
            await self.holder.wait()
        _OURS.discard(self.holder.pid)


def nsenter_program() -> str | None:
    """util-linux's ``nsenter``, if installed."""
    return shutil.which("nsenter") or next((p for p in ("/usr/bin/nsenter", "/bin/nsenter") if os.path.exists(p)), None)


async def make_netns(port: int = PROXY_PORT, forwards: tuple[tuple[str, int], ...] = ()) -> NetNamespace:
    """Make one namespace (see the module's docstring), with a listener on its loopback for
    each of ``forwards`` too (an address it lacks is left out); raises :class:`NetnsUnavailable`."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # At the lowest priority: a spare is made while a turn starts, and must not slow it.
        nice = shutil.which("nice")
        holder = await trio.lowlevel.open_process(
            [*((nice, "-n", "19") if nice else ()), sys.executable, "-I", "-S", str(_HELPER),
             str(theirs.fileno()), str(port), *(str(w) for forward in forwards for w in forward)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),), start_new_session=True,
        )
        _OURS.add(holder.pid)
        theirs.close()
        try:
            with trio.fail_after(MAKE_TIMEOUT):
                await trio.lowlevel.wait_readable(ours)
                message, fds, _, _ = socket.recv_fds(ours, 4096, 1 + len(forwards))
        except BaseException:
            holder.kill()
            with trio.CancelScope(shield=True):
                await holder.wait()
            _OURS.discard(holder.pid)
            raise
        if not fds:
            holder.kill()
            with trio.CancelScope(shield=True):
                await holder.wait()
            _OURS.discard(holder.pid)
            why = message.decode(errors="replace").removeprefix("error ").strip() or "the helper exited"
            raise NetnsUnavailable(f"cannot make a network namespace: {why}")
        listener, *extra = (socket.socket(fileno=fd) for fd in fds)
        words = message.decode().split()[1:]
        bound = [(address, int(p)) for address, p in zip(words[::2], words[1::2], strict=True)]
        for sock in (listener, *extra):
            sock.setblocking(False)
        return NetNamespace(holder, listener, dict(zip(bound, extra, strict=True)))
    finally:
        ours.close()
        if theirs.fileno() != -1:
            theirs.close()


class NetnsPool:
    """Namespaces made ahead (``spares``), so a turn's start waits for none; see the module."""

    def __init__(self, nursery: trio.Nursery, spares: int = SPARES) -> None:
        self._nursery = nursery
        self._spares = spares
        self._ready: dict[tuple[tuple[str, int], ...], list[NetNamespace]] = {}
        """Spares by the loopback ports they forward (most agents: none)."""
        self._making: dict[tuple[tuple[str, int], ...], int] = {}
        self._closed = False
        self.made = 0
        """Namespaces made so far (for tests and ``status``)."""

    def spares(self, forwards: tuple[tuple[str, int], ...] = ()) -> int:
        """How many namespaces for ``forwards`` are ready now."""
        return len(self._ready.get(forwards, ()))

    async def take(self, forwards: tuple[tuple[str, int], ...] = ()) -> NetNamespace:
        """A fresh namespace for one turn, listening on ``forwards`` too (a spare made for the
        same ones if there is one), and start making the next."""
        if self._closed:
            raise NetnsUnavailable("the supervisor is shutting down")
        ready = self._ready.get(forwards)
        ns = ready.pop() if ready else None
        self._refill(forwards)
        if ns is None:
            ns = await make_netns(forwards=forwards)
            self.made += 1
        return ns

    def _refill(self, forwards: tuple[tuple[str, int], ...]) -> None:
        while not self._closed and len(self._ready.get(forwards, ())) + self._making.get(forwards, 0) < self._spares:
            self._making[forwards] = self._making.get(forwards, 0) + 1
            self._nursery.start_soon(self._make_spare, forwards)

    async def _make_spare(self, forwards: tuple[tuple[str, int], ...]) -> None:
        try:
            ns = await make_netns(forwards=forwards)
        except (OSError, trio.TooSlowError) as exc:
            log.warning("could not make a spare network namespace: %s", exc)
            return
        finally:
            self._making[forwards] -= 1
        self.made += 1
        if self._closed:
            with trio.CancelScope(shield=True):
                await ns.aclose()
        else:
            self._ready.setdefault(forwards, []).append(ns)

    async def aclose(self) -> None:
        """End the spares (a turn's own namespace is its to close)."""
        self._closed = True
        spares, self._ready = [ns for ready in self._ready.values() for ns in ready], {}
        with trio.CancelScope(shield=True):
            for ns in spares:
                await ns.aclose()


@asynccontextmanager
async def open_netns_pool(spares: int = SPARES) -> AsyncIterator[NetnsPool]:
    """A :class:`NetnsPool` whose helpers run in a nursery of its own, closed on exit."""
    async with trio.open_nursery() as nursery:
        pool = NetnsPool(nursery, spares)
        try:
            yield pool
        finally:
            await pool.aclose()
            nursery.cancel_scope.cancel()
