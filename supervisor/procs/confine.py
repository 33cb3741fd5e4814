"""What a turn may ask of the kernel, beyond what the sandbox lets it see.

Theory of operation
-------------------

:mod:`.sandbox` plans a turn's *view* and hands bubblewrap the arguments that build it. This
module adds, at the spawn (:func:`supervisor.procs.tree.spawn`), what limits the turn's reach
into the kernel itself and keeps the plan out of its sight:

* **No new user namespaces** (``--disable-userns``, bubblewrap 0.8+): a user namespace is
  where an unprivileged process gets capabilities again, the door most Linux privilege
  escalations of recent years came through, and what a nested cgroup2 or tmpfs mount needs.
  The probe (:func:`probe_hardening`) tries it; a bwrap without it still gets the seccomp
  filter, which refuses ``unshare``/``clone`` with namespace flags on its own.
* **A seccomp filter** (``--seccomp FD``, built by :mod:`.seccomp`): bwrap loads it into its
  init in the sandbox and into the program, right before they run.
* **Its arguments out of sight** (``--args FD``): bwrap's command line is ``/proc/1/cmdline``
  inside the sandbox, and it would name every path the turn may not see. The options go to
  bwrap NUL-separated in a memfd instead; bwrap reads it and closes it before the program
  runs, so ``/proc/1/cmdline`` says ``bwrap --args N -- PROGRAM ...`` and no descriptor is
  left to read. (Mount points still show in ``/proc/self/mountinfo``: see docs/security.md.)
* **A session keyring of its own** (:func:`open_process`): every process starts with the
  keyring of whoever started it, so every turn shared the daemon's session keyring (systemd
  gives a service one, a login shell its own): one turn could read another's keys and plant
  keys a later turn would find. Each turn's process now starts in a new anonymous session
  keyring (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``), and the filter then refuses the
  keyring calls outright; ``/proc/keys``, which lists every key of the same uid by name, is
  covered in the sandbox.

Where the keyring is joined. A session keyring belongs to a *thread* (the kernel's
credentials are per task), and a child starts with the credentials of the thread that forked
it; Trio runs ``subprocess.Popen`` in a worker thread, so a join in the Trio thread would not
reach the child. ``preexec_fn`` would (it runs in the child), but it makes Python ``fork``
instead of ``vfork``, which copies the daemon's page tables: measured here 4 → 24 ms per
spawn for a 43 MiB process under load (1.3 → 4.3 ms at 15 MiB), against a 5 ms budget for the
whole sandbox; and it runs Python in a child of a threaded process. So :func:`open_process`
starts the child itself, in a worker thread that joins a new keyring right before
``Popen`` (the child inherits it) and another right after (so nothing the thread starts later
shares the turn's), then hands the ``Popen`` to Trio as ``trio.lowlevel.open_process`` would.
That last step is Trio's own constructor (``Process._create``, not public API; Trio is pinned
in constraints.txt, and every spawn's test fails at once if it changes).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import inspect
import logging
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence

import trio

from .seccomp import ARCHES, UnknownArchitecture, program_for

log = logging.getLogger("corral.sandbox")

#: bwrap's option that refuses new user namespaces inside the sandbox (0.8.0 and later).
DISABLE_USERNS = "--disable-userns"
#: Files of the sandbox's own ``/proc`` covered like corral's private files: ``/proc/keys``
#: names every key of the turn's uid (the daemon's, another turn's) whatever keyring it is in.
PROC_HIDDEN = ("/proc/keys", "/proc/key-users")
#: ``keyctl`` operation: join (here: make) a session keyring (linux/keyctl.h).
KEYCTL_JOIN_SESSION_KEYRING = 1


def machine() -> str:
    """This machine's architecture, as the kernel names it (``uname -m``)."""
    return os.uname().machine


def probe_hardening(bwrap: str, base: Sequence[str], hide: str) -> tuple[tuple[str, ...], str | None]:
    """What this bwrap adds to ``base`` for every turn, tried once: ``(options, None)``, or
    ``((), why)`` when the filter cannot be had here (an architecture corral has no table
    for, or a bwrap or kernel that refuses it) — then there is no sandbox, never a weaker one
    that looks the same. ``hide`` is the node bound over :data:`PROC_HIDDEN`."""
    try:
        program_for(machine())
    except UnknownArchitecture as exc:
        return (), str(exc)
    covers = tuple(word for path in PROC_HIDDEN if os.path.exists(path) for word in ("--ro-bind", hide, path))
    why = None
    for options in ((DISABLE_USERNS, *covers), covers):
        why = _trial(bwrap, [*base, *options])
        if why is None:
            return options, None
        if DISABLE_USERNS not in why:  # (an older bwrap: "Unknown option --disable-userns")
            break
    return (), f"bubblewrap ({bwrap}) cannot load corral's seccomp filter ({why})"


def describe_hardening(options: Sequence[str]) -> list[str]:
    """What a sandboxed turn gets of the above, in words (``status``/``check``'s ``kernel``),
    from :func:`probe_hardening`'s options."""
    said = [f"seccomp filter ({machine()})", "a session keyring of its own", "bwrap's arguments in a memfd"]
    if DISABLE_USERNS in options:
        said.insert(1, "no new user namespaces (--disable-userns, and the filter)")
    else:
        said.insert(1, "no new user namespaces (the filter; this bwrap has no --disable-userns)")
    if any(path in options for path in PROC_HIDDEN):
        said.append("/proc/keys covered")
    return said


def _trial(bwrap: str, options: Sequence[str]) -> str | None:
    """Run ``/bin/true`` behind ``options`` the way a turn starts (sealed): None, or why not."""
    try:
        with sealed((bwrap, *options, "--chdir", "/", "--")) as (words, fds):
            trial = subprocess.run(
                [*words, "/bin/true"], capture_output=True, text=True, timeout=10,
                stdin=subprocess.DEVNULL, pass_fds=fds,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if trial.returncode == 0:
        return None
    return (trial.stderr.strip().splitlines() or [f"exit status {trial.returncode}"])[-1]


@contextlib.contextmanager
def sealed(words: Sequence[str]) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]:
    """bwrap's argv for ``words`` (``(*front, bwrap, *options, "--")``, :meth:`.Sandbox.prefix`) with
    the options and the seccomp filter in memfds: ``(argv, fds to pass)``, the fds closed
    on exit (the child keeps its copies). Raises :class:`.UnknownArchitecture` where there
    is no filter to give (the probe has said so before any turn gets here)."""
    if not words or words[-1] != "--":
        raise ValueError(f"not a sandbox prefix: {list(words)!r}")
    # What runs before bwrap and execs it (util-linux's ``unshare`` or ``nsenter``, each ending
    # its own options with ``--``) stays on the command line; bwrap's options never hold a bare
    # ``--`` (they are option names, numbers and absolute paths).
    ends = [i for i, word in enumerate(words[:-1]) if word == "--"]
    start = ends[-1] + 1 if ends else 0
    front, bwrap, options = tuple(words[:start]), words[start], words[start + 1:-1]
    with contextlib.ExitStack() as stack:
        rules = stack.enter_context(_memfd("corral-seccomp", program_for(machine())))
        args = stack.enter_context(_memfd(
            "corral-bwrap-args", b"".join(word.encode() + b"\0" for word in (*options, "--seccomp", str(rules)))
        ))
        yield (*front, bwrap, "--args", str(args), "--"), (rules, args)


@contextlib.contextmanager
def _memfd(name: str, data: bytes) -> Iterator[int]:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)  # (close-on-exec here: only pass_fds hands it on)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _keyctl_function() -> tuple[Callable[[int, int, int], int], int] | None:
    arch = ARCHES.get(machine())
    if arch is None:
        return None
    function = ctypes.CDLL(None, use_errno=True).syscall
    function.restype = ctypes.c_long
    function.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_long)
    return function, arch.numbers["keyctl"]


_KEYCTL = _keyctl_function()


def join_fresh_session_keyring() -> None:
    """Give the calling *thread* a new anonymous session keyring (its children inherit it).

    Where the kernel refuses keyrings to this process too (``ENOSYS``: built without them;
    ``EPERM``: the daemon itself runs under a filter, Docker's default one) there is no
    keyring a turn could share, and nothing is done; any other failure raises ``OSError``
    (the spawn fails: fail closed)."""
    if _KEYCTL is None:  # (no table for this machine: no sandbox either, the probe said so)
        return
    function, number = _KEYCTL
    if function(number, KEYCTL_JOIN_SESSION_KEYRING, 0) < 0:
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EPERM):
            raise OSError(code, f"a session keyring of the turn's own: {os.strerror(code)}")


def _adopter() -> Callable[..., trio.Process] | None:
    """Trio's constructor of a :class:`trio.Process` around a started ``Popen``, if this Trio
    has the one :func:`open_process` was written against (``Process._create(popen, stdin,
    stdout, stderr)``, private: 0.25 to 0.35 at least); else None, and turns are started by
    ``trio.lowlevel.open_process`` with the keyring joined in ``preexec_fn`` — correct, only
    slower (Python forks instead of vforking: 5 to 20 ms a spawn for a large daemon)."""
    create = getattr(trio.Process, "_create", None)
    try:
        params = list(inspect.signature(trio.Process.__init__).parameters)
    except (TypeError, ValueError):
        return None
    if create is None or params != ["self", "popen", "stdin", "stdout", "stderr"]:
        log.warning("this Trio (%s) builds processes differently: turns get their session keyrings "
                    "through preexec_fn (slower spawns)", trio.__version__)
        return None
    return create  # type: ignore[no-any-return]


_ADOPT = _adopter()


async def open_process(
    command: Sequence[str], *, stdin_pipe: bool, cwd: str, env: Mapping[str, str], pass_fds: Sequence[int] = ()
) -> trio.Process:
    """``trio.lowlevel.open_process`` for a turn (stdout and stderr piped, stdin piped or
    ``/dev/null``, a new session), its child in a session keyring of its own (see above)."""
    if _ADOPT is None:
        return await trio.lowlevel.open_process(
            list(command), stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=cwd, env=dict(env), start_new_session=True, pass_fds=tuple(pass_fds),
            preexec_fn=join_fresh_session_keyring,
        )
    with contextlib.ExitStack() as child_ends, contextlib.ExitStack() as on_failure:
        ours: list[trio.lowlevel.FdStream | None] = []
        theirs: list[int] = []
        for wanted, to_child in ((stdin_pipe, True), (True, False), (True, False)):
            if not wanted:
                ours.append(None)
                theirs.append(subprocess.DEVNULL)
                continue
            read, write = os.pipe()  # (both close-on-exec: Popen puts the child's on 0, 1, 2)
            mine, child = (write, read) if to_child else (read, write)
            child_ends.callback(os.close, child)
            stream = trio.lowlevel.FdStream(mine)  # (non-blocking from here)
            on_failure.callback(stream.close)
            ours.append(stream)
            theirs.append(child)

        def start() -> subprocess.Popen[bytes]:
            join_fresh_session_keyring()  # the child's
            try:
                return subprocess.Popen(
                    list(command), stdin=theirs[0], stdout=theirs[1], stderr=theirs[2], cwd=cwd, env=dict(env),
                    start_new_session=True, pass_fds=tuple(pass_fds),
                )
            finally:
                try:
                    join_fresh_session_keyring()  # and this thread another: nothing it starts later shares the turn's
                except OSError as exc:  # (the child is started and must not be lost for this; its own is its own)
                    log.warning("the spawning thread keeps the turn's session keyring: %s", exc)

        popen = await trio.to_thread.run_sync(start)
        on_failure.pop_all()
    stdin, stdout, stderr = ours
    return _ADOPT(popen, stdin, stdout, stderr)
