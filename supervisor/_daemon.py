"""``corral run``: the supervisor behind a control API, until a signal or a shutdown request.

The Unix socket is bound by corral, chmodded to 0600 and only then listened on (nobody can
connect to a socket that is not listening, so there is no window with looser rights), and
served by :mod:`._http`, where no connection's error can end the daemon. An optional TCP
listener binds loopback only and requires a bearer token. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGXCPU or SIGPWR (or
``POST /v1/shutdown``) ends it in order: running turns end as "Task interrupted — corral was
shut down", their trees are killed and swept, stops in progress finish and answer their
callers, then the listeners close and the store is flushed. SIGUSR1 and SIGUSR2 log a
status line. Every other catchable signal whose default would end the process (SIGALRM,
SIGVTALRM, SIGPROF, SIGIO, SIGSTKFLT, the real-time signals) is logged and ignored; SIGPIPE
and SIGXFSZ stay ignored as Python sets them (a write fails with an error instead).
Handlers, not ``SIG_IGN``: a handler is reset at exec, so agents get default signals.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import stat
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ._api import ControlAPI
from ._config import Config
from ._http import serve_socket
from ._supervisor import Supervisor, open_supervisor

log = logging.getLogger("corral.daemon")

#: Seconds hypercorn gives open requests (followers) to finish at shutdown.
GRACEFUL_SECONDS = 1.0


#: prctl option: may this process be dumped, and its /proc files be read by others of its uid.
_PR_SET_DUMPABLE = 4


def harden_process() -> None:
    """The process-wide settings of ``corral run`` (never of an embedding program).

    umask 077: everything corral and its libraries create is its owner's alone, whatever
    the code path (the folders and files corral makes are 0700/0600 explicitly as well).
    Not dumpable: the agents run as the same user and would otherwise read the daemon's
    ``/proc/PID/environ`` (API keys) and memory; a child is dumpable again after its exec.
    """
    os.umask(0o077)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except (OSError, AttributeError) as exc:
        log.warning("cannot make the daemon non-dumpable (agents may read its environment): %s", exc)


class DaemonError(RuntimeError):
    """The daemon cannot start (socket in use, bad address); the message says how to fix it."""


def bind_unix_socket(path: Path) -> socket.socket:
    """Bind ``path`` with mode 0600. A stale socket file is replaced; a live daemon is not."""
    if len(os.fsencode(path)) >= 108:
        raise DaemonError(f"socket path {path} is too long for a Unix socket (max 107 bytes); choose a shorter [server] socket")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise DaemonError(f"{path} exists and is not a socket; remove it or choose another [server] socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # nobody answers: a stale socket from a daemon that died
        else:
            raise DaemonError(f"a corral daemon is already running on {path}; `corral shutdown` stops it")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600)
    except OSError:
        sock.close()
        raise
    return sock


def bind_loopback_tcp(address: str) -> socket.socket:
    """Bind a loopback TCP address; anything else is refused."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host == "localhost":
        host = "127.0.0.1"
    if host not in ("127.0.0.1", "::1"):
        raise DaemonError(f"the TCP listener must bind loopback (127.0.0.1 or ::1), not {host!r}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise DaemonError(f"cannot bind {address}: {exc.strerror}") from None
    return sock


def notify_systemd(message: str) -> bool:
    """Send ``message`` to systemd's notify socket if the daemon runs under ``Type=notify``."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)
            sock.sendall(message.encode())
        except OSError as exc:
            log.warning("cannot notify systemd: %s", exc)
            return False
    return True


async def run_daemon(
    config: Config,
    *,
    handle_signals: bool = True,
    subreaper: bool = True,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGINT/SIGTERM (if ``handle_signals``) or ``POST /v1/shutdown``.

    ``subreaper`` (process-wide) makes escaped descendants of turns re-parent to this
    process; ``corral run`` always sets it, a program hosting the daemon may not want to.
    """
    stopping = trio.Event()
    token = None
    if config.server.token_file is not None:
        token = config.server.token_file.read_text().strip()
        if not token:
            raise DaemonError(f"{config.server.token_file} is empty; put a secret in it")
    unix_sock = bind_unix_socket(config.server.socket)
    tcp_sock = bind_loopback_tcp(config.server.tcp) if config.server.tcp else None
    # The handlers stay installed from before the recovery until the very end: a signal that
    # arrives while the daemon recovers or shuts down (a second SIGTERM) is queued or
    # ignored, never the default action that would kill it mid-way.
    handlers = contextlib.ExitStack()
    signals = handlers.enter_context(trio.open_signal_receiver(*WATCHED_SIGNALS)) if handle_signals else None
    try:
        async with open_supervisor(config, subreaper=subreaper, owns_children=subreaper) as sup:
            restored = len([c for c in sup.ledger.channels() if sup.ledger.queued(c)])
            async with trio.open_nursery() as nursery:
                signal_scope = trio.CancelScope()
                if signals is not None:
                    nursery.start_soon(_watch_signals, stopping, signal_scope, sup, signals)
                # The listeners close once the supervisor is down: a stop in progress at
                # shutdown still answers its caller.
                closed = trio.Event()
                for sock, app in ((unix_sock, ControlAPI(sup, shutdown=stopping.set)),
                                  (tcp_sock, ControlAPI(sup, shutdown=stopping.set, token=token))):
                    if sock is not None:
                        await nursery.start(partial(serve_socket, app, sock, stopping=closed, graceful=GRACEFUL_SECONDS))
                log.info(
                    "corral %d ready on %s%s; %d agent(s); %d channel(s) with queued messages restored",
                    os.getpid(), config.server.socket, f" and {config.server.tcp}" if tcp_sock else "",
                    len(config.agents), restored,
                )
                notify_systemd("READY=1\nSTATUS=serving")
                task_status.started()
                await stopping.wait()
                log.info("shutting down")
                notify_systemd("STOPPING=1")
                with trio.CancelScope(shield=True):
                    await sup.shutdown()
                closed.set()
                signal_scope.cancel()
                # The servers are closing too (same event); open followers get the graceful time.
                nursery.cancel_scope.deadline = trio.current_time() + GRACEFUL_SECONDS + 1
    finally:
        handlers.close()
        for sock in (unix_sock, tcp_sock):
            if sock is not None and sock.fileno() >= 0:
                sock.close()
        try:
            config.server.socket.unlink()
        except FileNotFoundError:
            pass
        log.info("stopped")


#: Signals that end the daemon in order (SIGXCPU: the hard limit's SIGKILL follows; SIGPWR:
#: the power is failing).
ORDERLY_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGXCPU", "SIGPWR") if hasattr(signal, name)
)
#: Signals that log a status line.
STATUS_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
#: Signals whose default would end the daemon but that mean nothing to it: logged, ignored.
IGNORED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGALRM", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGSTKFLT") if hasattr(signal, name)
) + tuple(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


WATCHED_SIGNALS = ORDERLY_SIGNALS + STATUS_SIGNALS + IGNORED_SIGNALS


async def _watch_signals(stopping: trio.Event, scope: trio.CancelScope, sup: Supervisor, signals: Any) -> None:
    with scope:
        async for signum in signals:
            if signum in ORDERLY_SIGNALS:
                log.info("received %s: shutting down in order", _signal_name(signum))
                stopping.set()
            elif signum in STATUS_SIGNALS:
                status = sup.status()
                log.info(
                    "received %s: status: pid %d, %d channel(s), %d running turn(s), shutting down: %s",
                    _signal_name(signum), status["pid"], len(status["channels"]), status["running"],
                    status["shutting_down"],
                )
            else:
                log.warning("received %s: ignored", _signal_name(signum))
