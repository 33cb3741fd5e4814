"""Serving the control API on a listening socket, so that no client can end the daemon.

hypercorn's own ``serve()`` runs every connection in one nursery: an error in any one of
them ends the server, and the daemon with it. Clients can cause such errors at will: one
that hangs up in the middle of a request body makes hypercorn's reader answer 400 while
the application answers too, and the two writers collide (``trio.BusyResourceError``).

So corral runs hypercorn's per-connection protocol (its ``TCPServer``) itself, each
connection under its own ``try``: an error is logged with its traceback and ends only
that connection. The accept loop is supervised as well: if it fails, that is logged and
it serves again on the same listening socket, which corral (not hypercorn) owns and
closes. At shutdown it stops accepting, tells idle keep-alive connections to close, and
gives open requests (followers) ``graceful`` seconds before cancelling them.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from ..procs.peers import PeerFacts, PeerRefusal, read_peer

log = logging.getLogger("corral.http")

#: hypercorn's default backlog of 100 overflows when hundreds of clients connect at once.
BACKLOG = 1024
#: Pause before serving again after the accept loop failed, so a persistent fault cannot spin.
RETRY_SECONDS = 0.5

#: ``trio.serve_listeners``, named here so a test can make the accept loop fail.
_serve_listeners = trio.serve_listeners


#: The request scope's ``state`` key that holds why a Unix-socket peer is refused
#: (a :class:`~supervisor.procs.peers.PeerRefusal`: a turn's process, or one not identified).
PEER_REFUSAL = "corral.peer_refusal"


def _hypercorn_config() -> HypercornConfig:
    hc = HypercornConfig()
    hc.accesslog = None
    hc.errorlog = logging.getLogger("corral.http")
    hc.keep_alive_timeout = 5
    return hc


async def serve_socket(
    app: Callable[..., Awaitable[None]],
    sock: socket.socket,
    *,
    stopping: trio.Event,
    graceful: float,
    judge_peer: Callable[[PeerFacts], PeerRefusal | None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` (ASGI) on the bound ``sock`` until ``stopping`` is set.

    ``judge_peer`` (a Unix socket's): given the peer's facts, read as it is accepted
    (:func:`~supervisor.procs.peers.read_peer`), why it is refused, or None. The app finds the
    answer in the request scope's ``state`` under ``PEER_REFUSAL`` and refuses such a peer (the
    decision stays at the app's one error site).
    Returns once every connection has ended (or was cancelled after ``graceful`` seconds).
    The socket stays open: its owner closes it.
    """
    hc = _hypercorn_config()
    context = WorkerContext(None)
    wrapped = wrap_app(app, hc.wsgi_max_body_size, "asgi")
    sock.listen(BACKLOG)
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))

    async def connection(stream: trio.SocketStream) -> None:
        try:
            state: dict[str, PeerRefusal] = {}
            if judge_peer is not None:
                refusal = judge_peer(read_peer(stream.socket))
                if refusal is not None:
                    state[PEER_REFUSAL] = refusal
            # hypercorn types the stream as an SSLStream, yet handles a plain SocketStream (no TLS:
            # the missing do_handshake tells it so) and its own serve_listeners passes one.
            await TCPServer(wrapped, hc, context, ConnectionState(state), stream)  # type: ignore[arg-type]
        except Exception:
            log.exception("a connection failed; only it was closed, the daemon serves on")
        finally:
            await stream.aclose()  # idempotent: hypercorn has usually closed it already

    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            accepting.start_soon(_accept_forever, listener, connection, connections)
            task_status.started()
            await stopping.wait()
            accepting.cancel_scope.cancel()
        await context.terminated.set()
        connections.cancel_scope.deadline = trio.current_time() + graceful


async def _accept_forever(
    listener: trio.SocketListener, handler: Callable[[trio.SocketStream], Awaitable[None]], nursery: trio.Nursery
) -> None:
    while True:
        try:
            await _serve_listeners(handler, [listener], handler_nursery=nursery)
        except Exception:
            log.exception("the listener failed; serving again on the same socket")
            await trio.sleep(RETRY_SECONDS)
