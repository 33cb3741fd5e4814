"""What systemd tells corral through its environment, and what corral tells systemd back.

All of it is optional and read from the environment systemd sets; outside systemd each
piece is absent and costs nothing (no socket, no timer, no task):

- **Notify** (``NOTIFY_SOCKET``, ``Type=notify``): ``READY=1`` once the control socket
  serves, ``STATUS=`` lines, ``WATCHDOG=1`` pings and ``STOPPING=1``, each one datagram to
  the socket systemd names (a path, or ``@name`` for the abstract namespace). A datagram
  that cannot be sent is logged and dropped: systemd's view is advisory, corral's work is not.
- **Watchdog** (``WATCHDOG_USEC``, ``WATCHDOG_PID``): a ping at half the interval, sent by a
  task of the daemon's own event loop, so a loop that is stuck stops the pings and systemd
  restarts the service. No interval, no task.
- **Socket activation** (``LISTEN_FDS``, ``LISTEN_PID``, ``LISTEN_FDNAMES``): the listening
  sockets systemd passes from descriptor 3 on, by name (``control``: the Unix socket,
  ``tcp``: a loopback TCP one). The variables are removed once read, so no child inherits
  them, and the descriptors are close-on-exec.
- **journald** (``JOURNAL_STREAM``): when stderr is the journal's stream (same device and
  inode), each log line starts with its syslog priority ``<N>``, which journald strips and
  stores, so ``journalctl -p warning`` selects warnings and worse.

The parsers are pure: they take the environment and the pid and return values or raise
:class:`SystemdError` with what is wrong and the fix.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import trio

from ..core.errors import CorralError

log = logging.getLogger("corral.systemd")

#: ``sd_listen_fds``: the first passed descriptor.
LISTEN_FDS_START = 3
#: The names corral serves on (``FileDescriptorName=`` in a .socket unit).
CONTROL_NAME = "control"
TCP_NAME = "tcp"
#: What systemd names a descriptor whose unit sets no ``FileDescriptorName=``.
UNNAMED = "unknown"
#: The environment variables of socket activation, removed once read.
LISTEN_VARIABLES = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
#: Fewest seconds between two ``STATUS=`` lines (a busy daemon changes state constantly).
STATUS_MIN_INTERVAL = 1.0
#: While turns run, the status line is refreshed this often as well (turns end without a new
#: entry being the last thing that happens); when nothing runs, only a new entry wakes it.
STATUS_BUSY_INTERVAL = 5.0
#: Longest ``STATUS=`` text (systemd shows one line; a thousand channels should not make a
#: datagram of their names).
STATUS_MAX_CHARS = 200


class SystemdError(CorralError, RuntimeError):
    """What systemd passed cannot be used; the message says what and how to fix it."""


# ------------------------------------------------------------------ notify


def notify_address(environ: Mapping[str, str]) -> str | None:
    """The notify socket's address as ``connect`` takes it (abstract: leading NUL), or None."""
    address = environ.get("NOTIFY_SOCKET")
    if not address:
        return None
    return "\0" + address[1:] if address.startswith("@") else address


def notify(message: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Send ``message`` to systemd's notify socket; False if there is none or it failed.

    Never blocks: a full queue on systemd's side drops this datagram (logged), it does not
    stall the event loop the watchdog pings from.
    """
    address = notify_address(environ)
    if address is None:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), socket.MSG_DONTWAIT, address)
        except OSError as exc:
            log.warning("cannot notify systemd on %s: %s", environ.get("NOTIFY_SOCKET"), exc)
            return False
    return True


# ------------------------------------------------------------------ watchdog


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or None for none.

    None when the variable is unset, or ``WATCHDOG_PID`` names another process (the
    watchdog is for that one). A value that is not a positive number of microseconds is an
    error: systemd would restart a service that never pings.
    """
    usec = environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner and owner.strip() != str(pid):
        return None
    if not usec.isdigit() or int(usec) == 0:
        raise SystemdError(
            f"WATCHDOG_USEC={usec!r} is not a positive number of microseconds; fix WatchdogSec= in the unit"
        )
    return int(usec) / 2 / 1_000_000


async def ping_watchdog(interval: float, send: Callable[[str], object]) -> None:
    """Send ``WATCHDOG=1`` now and every ``interval`` seconds, from this event loop."""
    while True:
        send("WATCHDOG=1")
        await trio.sleep(interval)


# ------------------------------------------------------------------ STATUS=


def status_line(status: Mapping[str, Any]) -> str:
    """``Supervisor.summary()`` as the one line ``systemctl status`` shows."""
    running: list[str] = status["running_channels"]
    total = status["channel_counts"]["total"]
    text = f"{status['running']} turn(s) running, {status['queued']} queued, {total} channel(s)"
    if status.get("shutting_down"):
        text = "shutting down: " + text
    if running:
        names = ""
        for name in running:
            more = f", {name}" if names else f": {name}"
            if len(text) + len(names) + len(more) > STATUS_MAX_CHARS - 8:
                names += ", ..."
                break
            names += more
        text += names
    return text


async def report_status(
    describe: Callable[[], str],
    busy: Callable[[], bool],
    changes: trio.MemoryReceiveChannel[object],
    send: Callable[[str], object],
    *,
    min_interval: float = STATUS_MIN_INTERVAL,
    busy_interval: float = STATUS_BUSY_INTERVAL,
) -> None:
    """Send ``STATUS=describe()`` whenever it changed, at most once per ``min_interval``.

    ``changes`` yields something whenever the daemon's state may have changed (a committed
    entry). While ``busy()`` the line is also checked every ``busy_interval``; when idle,
    nothing wakes this task but a change.
    """
    last = None
    while True:
        line = describe()
        if line != last:
            send(f"STATUS={line}")
            last = line
            await trio.sleep(min_interval)  # the rate limit; what changed meanwhile is shown next
            _drain(changes)
            continue
        with trio.move_on_after(busy_interval if busy() else math.inf):
            try:
                await changes.receive()
            except trio.EndOfChannel:
                return


def _drain(changes: trio.MemoryReceiveChannel[object]) -> None:
    while True:
        try:
            changes.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return


# ------------------------------------------------------------------ socket activation


@dataclass(frozen=True, slots=True)
class Passed:
    """One listening socket systemd passed: its descriptor and its name."""

    fd: int
    name: str


def parse_listen_fds(environ: Mapping[str, str], pid: int) -> list[Passed]:
    """The descriptors systemd passed to ``pid`` (empty: not socket-activated).

    ``LISTEN_PID`` must name this process (otherwise the variables were inherited from a
    parent they were meant for, and the descriptors are not ours: ignored, as sd_listen_fds
    does). Names come from ``LISTEN_FDNAMES`` (colon-separated), ``unknown`` where unset.
    """
    count = environ.get("LISTEN_FDS")
    if not count:
        return []
    owner = environ.get("LISTEN_PID", "")
    if owner.strip() != str(pid):
        return []
    if not count.isdigit():
        raise SystemdError(f"LISTEN_FDS={count!r} is not a number of descriptors; check the .socket unit")
    names = environ.get("LISTEN_FDNAMES")
    name_list = names.split(":") if names else []
    if name_list and len(name_list) != int(count):
        raise SystemdError(
            f"LISTEN_FDNAMES={names!r} names {len(name_list)} descriptor(s) but LISTEN_FDS={count}; "
            "give each ListenStream= its FileDescriptorName="
        )
    return [Passed(LISTEN_FDS_START + i, name_list[i] if name_list else UNNAMED) for i in range(int(count))]


def forget_listen_fds(environ: MutableMapping[str, str]) -> None:
    """Remove the activation variables, so that no child process takes them for its own."""
    for name in LISTEN_VARIABLES:
        environ.pop(name, None)


@dataclass(frozen=True, slots=True)
class Activation:
    """The sockets systemd passed, by role; None where corral creates its own."""

    control: socket.socket | None = None
    tcp: socket.socket | None = None


def take_sockets(environ: MutableMapping[str, str], pid: int) -> Activation:
    """Adopt the listening sockets systemd passed and remove the variables (always).

    ``control`` is the Unix stream socket, ``tcp`` a loopback TCP one; an unnamed socket is
    placed by its family. Anything else (a datagram socket, a name corral does not serve, a
    second socket for one role, a TCP socket bound beyond loopback) is an error that says
    which unit setting to fix. Every passed descriptor is made close-on-exec.
    """
    try:
        passed = parse_listen_fds(environ, pid)
    finally:
        forget_listen_fds(environ)
    opened: list[socket.socket] = []
    adopted: dict[str, socket.socket] = {}
    try:
        for item in passed:
            os.set_inheritable(item.fd, False)
            sock = socket.socket(fileno=item.fd)
            opened.append(sock)  # closed on error, whatever its role
            role = _role(item, sock)
            if role in adopted:
                raise SystemdError(
                    f"systemd passed two {role!r} sockets (descriptor {item.fd}); give one ListenStream= that name"
                )
            adopted[role] = sock
    except BaseException:
        for sock in opened:
            sock.close()
        raise
    return Activation(control=adopted.get(CONTROL_NAME), tcp=adopted.get(TCP_NAME))


def _role(item: Passed, sock: socket.socket) -> str:
    where = f"descriptor {item.fd} ({item.name!r})"
    if sock.type != socket.SOCK_STREAM:
        raise SystemdError(f"{where} is not a stream socket; use ListenStream= in the .socket unit")
    family = sock.family
    role = item.name
    if role == UNNAMED:
        role = CONTROL_NAME if family == socket.AF_UNIX else TCP_NAME
    if role == CONTROL_NAME and family != socket.AF_UNIX:
        raise SystemdError(f"{where} is not a Unix socket; the control socket is ListenStream=/run/corral/corral.sock")
    if role == TCP_NAME:
        if family not in (socket.AF_INET, socket.AF_INET6):
            raise SystemdError(f"{where} is not a TCP socket; use ListenStream=127.0.0.1:PORT for it")
        host = sock.getsockname()[0]
        if host not in ("127.0.0.1", "::1"):
            raise SystemdError(
                f"{where} is bound to {host}, not loopback; "
                "use ListenStream=127.0.0.1:PORT (the TCP listener is loopback only)"
            )
    elif role != CONTROL_NAME:
        raise SystemdError(
            f"{where}: corral serves sockets named {CONTROL_NAME!r} and {TCP_NAME!r}; fix FileDescriptorName="
        )
    return role


# ------------------------------------------------------------------ journald


#: Syslog priorities of Python's levels (sd-daemon.h's SD_ERR, SD_WARNING, ...).
PRIORITIES: Sequence[tuple[int, int]] = (
    (logging.CRITICAL, 2),
    (logging.ERROR, 3),
    (logging.WARNING, 4),
    (logging.INFO, 6),
)
DEBUG_PRIORITY = 7


def priority(levelno: int) -> int:
    """The syslog priority of a record's level (anything below INFO is debug)."""
    for level, value in PRIORITIES:
        if levelno >= level:
            return value
    return DEBUG_PRIORITY


def stderr_is_journal(environ: Mapping[str, str], stream: IO[str] | int = 2) -> bool:
    """Whether ``stream`` (a file or a descriptor) is systemd's stream to the journal.

    ``JOURNAL_STREAM`` alone is not enough: a child of a service inherits it even when its
    stderr goes elsewhere. systemd documents comparing it with the descriptor's
    ``device:inode``.
    """
    value = environ.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(stream if isinstance(stream, int) else stream.fileno())
    except (OSError, ValueError):  # no descriptor behind it (a test's capture), or closed
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


class JournalFormatter(logging.Formatter):
    """Wraps a formatter: each line of its output starts with the record's ``<N>`` priority.

    Every line, so that a traceback's lines are each stored with the record's priority
    (journald reads a stream line by line).
    """

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in self.inner.format(record).split("\n"))
