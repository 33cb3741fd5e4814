"""Who is on the other end of the control socket: a turn's process, or someone corral serves.

Theory of operation
-------------------

The control socket is 0600 and out of every sandbox's view; as a second wall it refuses any
peer that is a process of a turn. The kernel records the peer at ``connect`` (its pid and
uid, ``SO_PEERCRED``; and since Linux 6.5 a pidfd, ``SO_PEERPIDFD``, that names that very
process and no later holder of its pid). What makes a process a turn's is read from
``/proc``: its cgroup (below the store's subtree), its pid namespace (not the daemon's) and
its marker (``CORRAL_STORE`` in its environment).

Reading ``/proc`` races the peer: a turn can connect, fork, exit and be reaped, and have its
child send the request. Then ``/proc/PID`` is gone (or, once the pid is reused, another
process's), and facts that cannot be read used to count as "not a turn" — the check failed
open. So it **fails closed**:

* a peer of another uid is not a turn's (every turn runs as the daemon's user): root is
  served, another user only where ``socket_group`` or ``socket_mode`` opens the socket to
  others (else it is 0600 and such a peer holds a descriptor handed on: refused, ``peer_uid``). The
  rest applies to the daemon's own user, whose processes the daemon can read;
* every fact is read, and a fact that cannot be read refuses the peer (``peer_unknown``);
* after reading, the pidfd must still name a live process (``pidfd_send_signal(fd, 0)``) that
  was not a zombie while it was read: then the pid was not reused while ``/proc`` was read, and
  what was read is the peer's. A peer that has exited is refused: it has no business left.

Without ``SO_PEERPIDFD`` (kernels before 6.5) the pidfd is opened from the pid at once
(``pidfd_open``), which cannot tell a peer from a process that took its pid before corral
accepted the connection; docs/security.md says so.

:func:`judge_peer` is pure: facts in, a refusal (or None) out. :func:`read_peer` does the I/O.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, overload

#: ``SO_PEERPIDFD`` (Linux 6.5+), from asm-generic/socket.h: Python 3.11 does not name it.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)


@dataclass(frozen=True, slots=True)
class PeerFacts:
    """What the kernel and ``/proc`` say of a peer (gathered by :func:`read_peer`).

    A fact that could not be read is None: ``cgroup`` is ``""`` where the process has no
    cgroup v2 line (a machine without cgroup v2), which is not the same as unreadable.
    """

    pid: int
    uid: int
    cgroup: str | None
    pid_ns: int | None
    environ: Mapping[str, str] | None
    alive: bool
    """The peer was a live process (not a zombie) while ``/proc`` was read, and the same one."""
    pidfd: bool = True
    """The kernel handed a pidfd for the peer itself (``SO_PEERPIDFD``)."""


@dataclass(frozen=True, slots=True)
class PeerRefusal:
    """Why the control API refuses a peer: the error code and message it answers with."""

    code: str
    message: str
    turn: str | None = None
    """The turn the peer is a process of (logged once per turn), if it is one."""


def judge_peer(
    facts: PeerFacts, *, own_uid: int, subtree: str | None, store_id: str, own_pid_ns: int | None,
    group_socket: bool = False,
) -> PeerRefusal | None:
    """Refuse the peer (a turn's process, another user's, or one that cannot be identified), or None.

    Three signs make a turn's process, any one enough: its cgroup is below the store's subtree
    (a process cannot leave it: the cgroup file system is read-only in the sandbox); it lives
    in a pid namespace other than the daemon's (every sandboxed process does; a client in a
    container is not a turn, but it has no business on a 0600 socket either); or it carries
    the store's marker. A fact that could not be read, or a peer that exited, refuses too.
    """
    if facts.uid != own_uid:
        # Not a turn's: every turn runs as the daemon's user. Root is trusted; another user only
        # where the socket is given to a group (socket_group), whose members the file lets in.
        if facts.uid == 0 or group_socket:
            return None
        return PeerRefusal("peer_uid", f"the control API serves only its own user (uid {own_uid}), "
                           f"root and its socket_group; this peer is uid {facts.uid}")
    turn = _turn_of(facts, subtree=subtree, store_id=store_id, own_pid_ns=own_pid_ns)
    if turn is not None:
        return PeerRefusal("turn_process", f"the control API refuses the processes of turns "
                           f"(this one is of turn {turn})", turn)
    unread = [name for name, value in (("cgroup", facts.cgroup), ("pid namespace", facts.pid_ns),
                                       ("environment", facts.environ)) if value is None]
    if not facts.alive or unread:
        why = "it exited before corral could read who it is" if not facts.alive else (
            f"corral could not read its {', '.join(unread)} in /proc/{facts.pid}")
        return PeerRefusal("peer_unknown", f"the control API refuses a peer it cannot identify: {why}. "
                           "Connect from a process that stays alive until it is answered")
    return None


def _turn_of(facts: PeerFacts, *, subtree: str | None, store_id: str, own_pid_ns: int | None) -> str | None:
    environ = facts.environ or {}
    if subtree is not None and facts.cgroup:
        prefix = subtree.rstrip("/") + "/"
        if facts.cgroup.startswith(prefix):
            return facts.cgroup[len(prefix):].split("/", 1)[0] or "a turn"
    if environ.get("CORRAL_STORE") == store_id:
        return environ.get("CORRAL_TURN") or "a turn"
    if own_pid_ns is not None and facts.pid_ns is not None and facts.pid_ns != own_pid_ns:
        return environ.get("CORRAL_TURN") or "a sandboxed process"
    return None


# ------------------------------------------------------------------ the I/O


class _Socket(Protocol):
    """A stdlib or a Trio socket: what :func:`read_peer` asks of it."""

    @overload
    def getsockopt(self, level: int, optname: int) -> int: ...
    @overload
    def getsockopt(self, level: int, optname: int, buflen: int) -> bytes: ...


def read_peer(sock: _Socket) -> PeerFacts:
    """The facts of a connected Unix socket's peer: credentials, then ``/proc``, then liveness."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    pidfd, own = _peer_pidfd(sock, pid)
    try:
        cgroup = _read_cgroup(pid)
        pid_ns = _read_pid_ns(pid)
        environ = _read_marker(pid)
        running = _not_a_zombie(pid)
        alive = running and pidfd is not None and _pidfd_alive(pidfd)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return PeerFacts(pid, uid, cgroup, pid_ns, environ, alive, own)


def _peer_pidfd(sock: _Socket, pid: int) -> tuple[int | None, bool]:
    """A pidfd of the peer (the kernel's own, where it has ``SO_PEERPIDFD``), and whether it is that."""
    try:
        return int(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)), True
    except OSError as exc:
        if exc.errno != errno.ENOPROTOOPT:
            return None, True  # the kernel knows the option and has no live peer to name
    if pid <= 0:
        return None, False
    try:
        return os.pidfd_open(pid), False
    except OSError:
        return None, False


def _pidfd_alive(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists (a root peer of a non-root daemon): the uid check has spoken
    return True


def _read_cgroup(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as fh:
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    return next((line[3:] for line in lines if line.startswith("0::")), "")


def _read_pid_ns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _read_marker(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith(b"CORRAL_"):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _not_a_zombie(pid: int) -> bool:
    """Not exited: a zombie's ``environ`` reads empty, so its marker would be lost."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2: stat.rfind(b")") + 3]
    return state not in (b"Z", b"X", b"x")


def own_pid_namespace() -> int | None:
    """This process's pid namespace (its inode), if the kernel says."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
