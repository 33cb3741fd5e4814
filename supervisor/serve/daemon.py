"""``corral run``: the supervisor behind a control API, until a signal or a shutdown request.

The Unix socket is bound by corral, given ``[server] socket_mode`` (0600 unless set) and
``socket_group``, and only then listened on (nobody can connect to a socket that is not
listening, so there is no window with looser rights), or passed by systemd (socket
activation, :mod:`.systemd`: then corral neither makes nor removes it), and served by
:mod:`.http`, where no connection's error can end the daemon. An optional TCP
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
import grp
import logging
import os
import signal
import socket
import stat
from collections.abc import AsyncIterator, Callable, MutableMapping
from functools import partial
from pathlib import Path

import trio

from ..config.settings import DEFAULT_SOCKET_MODE, Config
from ..core.errors import CorralError
from ..host.supervisor import Supervisor, open_supervisor
from . import systemd
from .api import ControlAPI
from .commits import open_commit_wakeups
from .http import serve_socket

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


class DaemonError(CorralError, RuntimeError):
    """The daemon cannot start (socket in use, bad address); the message says how to fix it."""


def bind_unix_socket(path: Path, mode: int = DEFAULT_SOCKET_MODE, group: str | None = None) -> socket.socket:
    """Bind ``path`` with ``mode`` (and ``group``). A stale socket file is replaced; a live daemon is not.

    The rights are set before the socket listens, so nobody connects while they are looser.
    """
    if len(os.fsencode(path)) >= 108:
        raise DaemonError(
            f"socket path {path} is too long for a Unix socket (max 107 bytes); choose a shorter [server] socket"
        )
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
    gid = -1
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise DaemonError(
                f"there is no group {group!r} for the socket; create it or remove [server] socket_group"
            ) from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        if gid >= 0:
            os.chown(path, -1, gid)
        os.chmod(path, mode)
    except OSError:
        sock.close()
        with contextlib.suppress(OSError):
            path.unlink()
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


async def run_daemon(
    config: Config,
    *,
    handle_signals: bool = True,
    subreaper: bool = True,
    environ: MutableMapping[str, str] = os.environ,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGINT/SIGTERM (if ``handle_signals``) or ``POST /v1/shutdown``.

    ``subreaper`` (process-wide) makes escaped descendants of turns re-parent to this
    process; ``corral run`` always sets it, a program hosting the daemon may not want to.
    ``environ`` is where systemd's variables are read (``NOTIFY_SOCKET``, ``WATCHDOG_*``)
    and the socket-activation ones taken from (``LISTEN_*``: removed once read).
    """
    stopping = trio.Event()
    token = _read_token(config)
    try:
        watchdog = systemd.watchdog_interval(environ, os.getpid())
    except systemd.SystemdError as exc:
        raise DaemonError(str(exc)) from None
    notifying = systemd.notify_address(environ) is not None
    send = partial(systemd.notify, environ=dict(environ))
    passed = _take_sockets(config, environ, token)
    unix_sock, tcp_sock, created = _listening_sockets(config, passed)
    # The handlers stay installed from before the recovery until the very end: a signal that
    # arrives while the daemon recovers or shuts down (a second SIGTERM) is queued or
    # ignored, never the default action that would kill it mid-way.
    handlers = contextlib.ExitStack()
    signals = handlers.enter_context(trio.open_signal_receiver(*WATCHED_SIGNALS)) if handle_signals else None
    try:
        async with open_supervisor(config, subreaper=subreaper, owns_children=subreaper) as sup:
            restored = len(sup.channels_with_queue())
            async with trio.open_nursery() as nursery:
                signal_scope = trio.CancelScope()
                if signals is not None:
                    nursery.start_soon(_watch_signals, stopping, signal_scope, sup, signals)
                if watchdog is not None and notifying:
                    # From this loop, so a stuck loop stops the pings; from before the
                    # listeners serve, so a long start-up is not mistaken for a hang.
                    nursery.start_soon(systemd.ping_watchdog, watchdog, send, name=WATCHDOG_TASK)
                # The listeners close once the supervisor is down: a stop in progress at
                # shutdown still answers its caller.
                closed = trio.Event()
                await _serve_listeners(nursery, sup, unix_sock, tcp_sock, token, stopping, closed)
                log.info(
                    "corral %d ready on %s%s%s; %d agent(s); %d channel(s) with queued messages restored",
                    os.getpid(), config.server.socket,
                    f" and {config.server.tcp or _address(tcp_sock)}" if tcp_sock else "",
                    " (sockets from systemd)" if passed.control or passed.tcp else "",
                    len(config.agents), restored,
                )
                bridges_scope = trio.CancelScope()
                if config.bridges:
                    nursery.start_soon(_run_bridges, sup, config, bridges_scope, name="corral-bridges")
                status_scope = trio.CancelScope()
                if notifying:
                    send(f"READY=1\nSTATUS={systemd.status_line(sup.summary())}")
                    nursery.start_soon(_report_status, sup, send, status_scope, name=STATUS_TASK)
                task_status.started()
                await stopping.wait()
                log.info("shutting down")
                status_scope.cancel()
                send("STOPPING=1\nSTATUS=shutting down: ending the running turns")
                with trio.CancelScope(shield=True):
                    await sup.shutdown()
                bridges_scope.cancel()
                closed.set()
                signal_scope.cancel()
                # The servers are closing too (same event); open followers get the graceful time.
                nursery.cancel_scope.deadline = trio.current_time() + GRACEFUL_SECONDS + 1
    finally:
        handlers.close()
        for sock in (unix_sock, tcp_sock):
            if sock is not None and sock.fileno() >= 0:
                sock.close()
        if created is not None:  # never a socket systemd made: it outlives this process
            with contextlib.suppress(FileNotFoundError):
                created.unlink()
        log.info("stopped")


def _read_token(config: Config) -> str | None:
    """The TCP listener's token, if the config names its file (an empty one is refused)."""
    if config.server.token_file is None:
        return None
    token = config.server.token_file.read_text().strip()
    if not token:
        raise DaemonError(f"{config.server.token_file} is empty; put a secret in it")
    return token


def _listening_sockets(
    config: Config, passed: systemd.Activation
) -> tuple[socket.socket | None, socket.socket | None, Path | None]:
    """The control socket and the TCP one (systemd's, else bound here), and the socket file
    corral made (so removes at the end: never one systemd made, which outlives this process)."""
    unix_sock, tcp_sock = passed.control, passed.tcp
    created: Path | None = None
    try:
        if unix_sock is None:
            unix_sock = bind_unix_socket(config.server.socket, config.server.socket_mode, config.server.socket_group)
            created = config.server.socket
        if tcp_sock is None and config.server.tcp:
            tcp_sock = bind_loopback_tcp(config.server.tcp)
    except BaseException:
        for sock in (unix_sock, tcp_sock):
            if sock is not None:
                sock.close()
        raise
    return unix_sock, tcp_sock, created


async def _serve_listeners(
    nursery: trio.Nursery, sup: Supervisor, unix_sock: socket.socket | None, tcp_sock: socket.socket | None,
    token: str | None, stopping: trio.Event, closed: trio.Event,
) -> None:
    """Serve the control API on each listener until ``closed``; only the Unix socket knows its
    peer (``judge_peer``): the TCP listener's wall is its token."""
    for sock, app, judge_peer in (
        (unix_sock, ControlAPI(sup, shutdown=stopping.set), sup.judge_peer),
        (tcp_sock, ControlAPI(sup, shutdown=stopping.set, token=token), None),
    ):
        if sock is not None:
            await nursery.start(
                partial(serve_socket, app, sock, stopping=closed, graceful=GRACEFUL_SECONDS, judge_peer=judge_peer)
            )


async def _run_bridges(sup: Supervisor, config: Config, scope: trio.CancelScope) -> None:
    """The chat bridges, each contained (it fails alone, and is started again); the daemon
    does not wait for a chat server to answer before it serves."""
    from ..bridges.runner import run_bridges

    with scope:
        await run_bridges(sup, list(config.bridges.values()))


#: Task names, so that a test can tell the watchdog and the status reporter exist (or not).
WATCHDOG_TASK = "corral.systemd.watchdog"
STATUS_TASK = "corral.systemd.status"


def _take_sockets(config: Config, environ: MutableMapping[str, str], token: str | None) -> systemd.Activation:
    """The listening sockets systemd passed, checked against the config (none: not activated)."""
    try:
        passed = systemd.take_sockets(environ, os.getpid())
    except systemd.SystemdError as exc:
        raise DaemonError(str(exc)) from None
    try:
        if passed.control is not None:
            path = passed.control.getsockname()
            if isinstance(path, bytes) or not path or Path(path) != config.server.socket:
                raise DaemonError(
                    f"systemd passed the control socket {path!r}, but [server] socket is {config.server.socket} "
                    "(clients find the daemon there); make ListenStream= and [server] socket the same path"
                )
        if passed.tcp is not None and token is None:
            raise DaemonError(
                f"systemd passed a TCP socket ({_address(passed.tcp)}) but the config has no [server] token_file; "
                "a TCP listener needs a token: add token_file, or remove the ListenStream="
            )
    except BaseException:
        for sock in (passed.control, passed.tcp):
            if sock is not None:
                sock.close()
        raise
    return passed


def _address(sock: socket.socket | None) -> str:
    if sock is None:
        return ""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _report_status(sup: Supervisor, send: Callable[[str], object], scope: trio.CancelScope) -> None:
    """``STATUS=`` on every change: a committed entry wakes it (an idle daemon: nothing does)."""
    with scope:
        async with open_commit_wakeups(sup) as changes:
            await systemd.report_status(
                lambda: systemd.status_line(sup.summary()), lambda: sup.summary()["running"] > 0, changes, send,
            )


#: Signals that end the daemon in order (SIGXCPU: the hard limit's SIGKILL follows; SIGPWR:
#: the power is failing).
ORDERLY_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGXCPU", "SIGPWR")
    if hasattr(signal, name)
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


async def _watch_signals(
    stopping: trio.Event, scope: trio.CancelScope, sup: Supervisor, signals: AsyncIterator[int]
) -> None:
    with scope:
        async for signum in signals:
            if signum in ORDERLY_SIGNALS:
                log.info("received %s: shutting down in order", _signal_name(signum))
                stopping.set()
            elif signum in STATUS_SIGNALS:
                status = sup.summary()
                log.info(
                    "received %s: status: pid %d, %d channel(s), %d running turn(s), shutting down: %s",
                    _signal_name(signum), os.getpid(), status["channel_counts"]["total"], status["running"],
                    status["shutting_down"],
                )
            else:
                log.warning("received %s: ignored", _signal_name(signum))
