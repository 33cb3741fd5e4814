"""What a hostile agent asks of the kernel inside a turn, and what each must get: the attempts
(``tests/fakes/escape_probe.py`` kinds) shared by the escape suite and the per-bwrap tests.

One attempt per refused class of :mod:`supervisor.procs.seccomp`, with arguments chosen so that
*without* the filter the call would get another answer (``userfaultfd`` with
``UFFD_USER_MODE_ONLY`` and ``open_tree`` succeed for anyone, ``io_uring_setup`` with no
parameters is ``EFAULT``, ``setns(-1)`` is ``EBADF``...): the errno says the filter refused
it. Beside them, the positive controls a coding agent lives on.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

AT_FDCWD = -100
SIGCHLD = 17
CLONE_NEWUSER = 0x10000000
CLONE_FILES = 0x00000400
KEY_SPEC_SESSION_KEYRING = -3
NODE = shutil.which("node")
STRACE = shutil.which("strace")


def kernel_attempts(*, key_serial: int | None = None) -> list[tuple[str, str, Any, Any]]:
    """``(name, kind, arg, outcome wanted)`` for every class; ``key_serial``: a key of the
    daemon's session keyring the turn must not read."""
    tries: list[tuple[str, str, Any, Any]] = [
        ("io_uring_setup", "syscall", ["io_uring_setup", 1, 0], "ENOSYS"),
        ("clone3", "syscall", ["clone3", 0, 0], "ENOSYS"),
        ("bpf", "syscall", ["bpf", 0, 0, 0], "EPERM"),
        ("userfaultfd", "syscall", ["userfaultfd", 1], "EPERM"),
        ("perf_event_open", "syscall", ["perf_event_open", 0, 0, -1, -1, 0], "EPERM"),
        ("keyctl", "syscall", ["keyctl", 0, KEY_SPEC_SESSION_KEYRING, 0], "EPERM"),
        ("add_key", "syscall", ["add_key", "user", "planted-by-a-turn", "x", 1, KEY_SPEC_SESSION_KEYRING], "EPERM"),
        ("kexec_load", "syscall", ["kexec_load", 0, 0, 0, 0], "EPERM"),
        ("init_module", "syscall", ["init_module", 0, 0, ""], "EPERM"),
        ("finit_module", "syscall", ["finit_module", -1, "", 0], "EPERM"),
        ("mount", "syscall", ["mount", "none", "/tmp", "tmpfs", 0, 0], "EPERM"),
        ("open_tree", "syscall", ["open_tree", AT_FDCWD, "/tmp", 0], "EPERM"),
        ("fsopen", "syscall", ["fsopen", "tmpfs", 0], "EPERM"),
        # (before the unshare below: without the filter that one moves the probe into a new namespace)
        ("a nested cgroup2 to lift its limits", "cgroup2-nest", None, "user:refused"),
        ("unshare a user namespace", "syscall", ["unshare", CLONE_NEWUSER], "EPERM"),
        ("clone a user namespace", "syscall", ["clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0], "EPERM"),
        ("setns", "syscall", ["setns", -1, 0], "EPERM"),
        ("personality ADDR_NO_RANDOMIZE", "syscall", ["personality", 0x0040000], "EPERM"),
        ("syslog", "syscall", ["syslog", 10, 0, 0], "EPERM"),
        ("unshare -r", "run", ["unshare", "-r", "true"], ("exit:1:unshare: unshare failed: Operation not permitted",)),
        ("the kernel's key list", "read", "/proc/keys", "EACCES"),
        ("bwrap's command line", "cmdline", "/proc/1/cmdline", "ok:"),
        ("its descriptors", "fds", None, "ok:"),
        # positive controls
        ("personality query", "syscall", ["personality", 0xFFFFFFFF], "ok:"),
        ("unshare without namespaces", "syscall", ["unshare", CLONE_FILES], "ok:0"),
        ("a shell pipeline", "run", ["sh", "-c", "echo corral | tr a-z A-Z | cat"], "ok:CORRAL"),
        ("a setsid grandchild", "run", ["sh", "-c", "setsid sh -c 'echo grandchild' | cat"], "ok:grandchild"),
        ("threads", "threads", 8, "ok:8"),
        ("git", "run", ["sh", "-c", "cd \"$(mktemp -d)\" && git init -q && echo x > f && git add f && "
                        "git -c user.name=a -c user.email=a@b commit -qm x && git log --oneline | wc -l"], "ok:1"),
    ]
    if os.uname().machine == "x86_64":
        tries += [
            ("x32 ABI", "syscall", ["x32:getpid"], "ENOSYS"),
            ("modify_ldt", "syscall", ["modify_ldt", 0, 0, 0], "EPERM"),
        ]
    if key_serial is not None:  # KEYCTL_READ of the daemon's key
        tries.append(("read the daemon's key", "syscall", ["keyctl", 11, key_serial, 0, 0], "EPERM"))
    if NODE:  # (asynchronous file reads: libuv's io_uring path, falling back to its pool)
        tries.append(("node", "run", [NODE, "-e", "require('fs').promises.readFile('/etc/passwd')"
                                      ".then(b => console.log('node', b.length > 0))"], "ok:node true"))
    if STRACE:  # ptrace of its own processes: a debugger in a turn works
        tries.append(("strace its own child", "run", [STRACE, "-f", "-o", "/dev/null", "true"], "ok:"))
    return tries


def kernel_facts_hold(got: dict[str, str], hidden: list[Path]) -> None:
    """What the outcomes alone cannot say: bwrap's command line names none of the ``hidden``
    paths (its options came through ``--args``), and no memfd of the spawn is left open."""
    cmdline = got["bwrap's command line"]
    options = cmdline.split(" -- ", 1)[0]  # (after it: the program and its arguments, a prompt among them)
    assert options.split()[1:-1] == ["--args"], cmdline
    for path in hidden:
        assert str(path) not in options, (path, cmdline)
    assert "memfd:" not in got["its descriptors"], got["its descriptors"]


def check_outcomes(got: dict[str, str], want: dict[str, Any]) -> None:
    """Each outcome as expected: a tuple lists the exact outcomes allowed, ``"ok:TEXT"`` asks
    for a success whose detail starts with TEXT, anything else for exactly that."""
    wrong = {}
    for name, expected in want.items():
        outcome = got.get(name, "missing")
        if isinstance(expected, tuple):
            ok = outcome in expected
        elif expected.startswith("ok:"):
            ok = outcome.startswith(expected)
        else:
            ok = outcome == expected
        if not ok:
            wrong[name] = (outcome, expected)
    assert not wrong, f"escapes (outcome, expected): {json.dumps(wrong, indent=1)}"
