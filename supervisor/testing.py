"""What tests of corral (and of a program embedding it) use to reach inside a supervisor.

:class:`Hooks` park a turn at exact points to drive a race deterministically (pass them to
``open_supervisor(config, hooks=...)``); the accessors return the supervisor's ledger,
store and process registry, which are not part of its public surface.

A sandboxed turn runs in a pid namespace of its own, so a pid an agent reports (a pid file
its tool writes, a line it prints) is the pid *inside* it. :func:`host_pid` turns one into
this process's pid for it, given the namespace (what ``stat -L -c %i /proc/self/ns/pid``
prints there); :func:`read_pid` reads a pid file in the ``PID [NAMESPACE]`` form.
"""

from __future__ import annotations

import os
from pathlib import Path

from .core.ledger import StopDecision, StopLedger
from .host.supervisor import Supervisor
from .procs.hooks import Hooks, Spawner, TurnHook
from .procs.registry import ProcessRegistry
from .store.store import Store

__all__ = [
    "Hooks", "Spawner", "StopDecision", "StopLedger", "TurnHook", "host_pid", "ledger", "pid_file_alive", "read_pid",
    "registry", "store",
]


def host_pid(pid: int, pid_ns: int | None = None) -> int:
    """This process's pid for the process that is ``pid`` in the pid namespace ``pid_ns``
    (its inode); ``pid`` itself when ``pid_ns`` is None or this process's own. Raises
    ``LookupError`` when no such process is alive."""
    if pid_ns is None or pid_ns == os.stat("/proc/self/ns/pid").st_ino:
        return pid
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/pid").st_ino != pid_ns:
                continue
            status = Path(f"/proc/{entry.name}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == pid:
                return int(entry.name)
    raise LookupError(f"no process is pid {pid} in pid namespace {pid_ns}")


def read_pid(path: str | Path) -> int:
    """The host pid in a pid file that holds ``PID`` or ``PID NAMESPACE`` (see the module)."""
    words = Path(path).read_text().split()
    return host_pid(int(words[0]), int(words[1]) if len(words) > 1 else None)


def ledger(sup: Supervisor) -> StopLedger:
    """The supervisor's stop ledger."""
    return sup._ledger


def store(sup: Supervisor) -> Store:
    """The supervisor's store."""
    return sup._store


def registry(sup: Supervisor) -> ProcessRegistry:
    """The supervisor's process registry."""
    return sup._registry



def pid_file_alive(path: str | Path) -> bool:
    """Is the process a pid file names alive (not a zombie)? A pid its namespace no longer
    has — or a namespace no process is in any more — is a process that is gone."""
    try:
        pid = read_pid(path)
    except LookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
