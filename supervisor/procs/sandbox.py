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
nothing of the agent runs outside either. What it builds, per turn:

* **A user namespace with no capabilities** (``--unshare-user --cap-drop ALL``): the agent
  keeps its uid for files, but holds no privilege, so it cannot undo a mount below.
* **The machine read-only** (``--ro-bind / /``), as its user would see it: the system, its
  command's installation wherever it lives (a venv, ``~/.cache``, ``/opt``, ``node_modules``).
  ``/tmp`` is a tmpfs of the turn's own, writable (systemd's ``PrivateTmp``): what the host
  keeps there is out of sight unless granted.
* **corral's private state hidden**: the state folder (every channel's working folder and
  HOME, the turns' TMPDIRs) under an empty, read-only tmpfs; the store and its ``-wal``/``-shm``/lock,
  the config file, the token file and the control socket each under an unreadable node;
  the store's cgroup subtree, other agents' configured folders, a PostgreSQL store's socket
  folder and password file, and the agent's ``sandbox_hide`` likewise.
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

bwrap's own process stays outside as the turn's leader: it waits for the program and exits
with its status, while bwrap's init inside the namespace reaps everything else — a kept
background process included — until the last is gone. That leader dies of SIGINT at once,
which would cut the CLI's grace short; so :class:`~.tree.ProcessTree` sends a sandboxed
tree's interrupt to the processes inside it, not to the leader (see ``interrupt`` there).

The control socket is not in the sandbox's view, and as a second wall it refuses any peer
that is a process of a turn (:func:`turn_of_peer`: its cgroup, its pid namespace, its marker).

Where the kernel or the machine lacks what this needs, :func:`probe` says exactly what is
missing and how to fix it; ``[server] sandbox = "auto"`` then runs turns without it and says
so (log, ``status``, ``check``), ``"required"`` refuses to start a turn, ``"off"`` never
sandboxes. Never a silent half-sandbox: it is all of the above or nothing.

Decisions are pure: :class:`Reach` is one turn's plan and :func:`bwrap_args` turns it into
arguments; :class:`Sandbox` gathers the facts (which paths exist, and as what) and the probe.
"""

from __future__ import annotations

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

log = logging.getLogger("corral.sandbox")

SandboxMode = Literal["auto", "required", "off"]
"""``[server] sandbox``: on where possible, on or refuse, or never."""
Network = Literal["host", "none", "proxied"]
"""A sandbox's network: the host's, none at all (a namespace of its own, loopback only), or
``proxied``: the namespace the turn is entered into before bwrap (:mod:`.netns`), whose only
way out is the daemon's proxy — bwrap then makes no network namespace of its own."""

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
#: An unreadable node bound over a private file: bwrap's device nodes are mounted ``nodev``,
#: so opening it fails with EACCES (not an empty read a program might mistake for the file).
HIDDEN_FILE_SOURCE = "/dev/null"
#: Folders every turn gets a tmpfs of its own in (``/tmp`` as systemd's ``PrivateTmp``): the
#: tools that write there whatever TMPDIR says (Claude Code's shell does) work, and no turn
#: meets another's — or the host's — files there.
PRIVATE_DIRS = ("/tmp",)
#: Suffixes of the SQLite store's companions, next to the store itself.
STORE_COMPANIONS = ("", "-wal", "-shm", "-journal", ".lock")


class SandboxRefused(Exception):
    """``sandbox = "required"`` and this machine cannot sandbox: what is missing, the fix."""


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
    """Folders put back read-only inside a private folder (an agent installed under ``/tmp``)."""
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


def bwrap_args(reach: Reach) -> list[str]:
    """The bwrap arguments that build ``reach`` (without the program and ``--``).

    Mounts are ordered by depth, shallow first, so the deeper of two nested rules wins; at
    one path, hiding wins over writing, and writing over reading.
    """
    args = list(BASE_ARGS)
    if reach.network == "none":
        args.append("--unshare-net")
    ops: list[tuple[int, int, str, list[str]]] = []
    for path in reach.private_dirs:
        ops.append((_depth(path), 0, path, ["--perms", "1777", "--tmpfs", path]))
    for path in reach.readable:
        if not any(_within(Path(path), Path(w)) for w in reach.writable):  # (a grant covers it)
            ops.append((_depth(path), -1, path, ["--ro-bind", path, path]))
    for path in reach.writable:
        ops.append((_depth(path), 0, path, ["--bind", path, path]))
    for path in reach.pinned:  # (deeper than the HOME it is in: it wins over that bind)
        ops.append((_depth(path), 0, path, ["--ro-bind", path, path]))
    for path in reach.hidden_dirs:
        ops.append((_depth(path), 1, path, ["--tmpfs", path]))
    for path in reach.hidden_files:
        ops.append((_depth(path), 1, path, ["--ro-bind", HIDDEN_FILE_SOURCE, path]))
    seen: set[tuple[int, str]] = set()
    for _, kind, path, words in sorted(ops, key=lambda op: (op[0], op[1], op[2])):
        if (kind, path) not in seen:
            seen.add((kind, path))
            args += words
    # Last, so the mount points of own folders inside them could still be made: a hidden
    # folder is empty *and* read-only (a write there would only land in the sandbox's tmpfs).
    for path in sorted(set(reach.hidden_dirs)):
        args += ["--remount-ro", path]
    args += ["--chdir", reach.cwd]
    return args


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def probe(bwrap: str | None = None) -> Support:
    """Find bwrap and try the sandbox once (``/bin/true`` inside the namespaces every turn
    gets), so a kernel without unprivileged user namespaces is found at start, not by a turn."""
    found = bwrap or shutil.which("bwrap")
    if found is None:
        return Support(None, missing=("bubblewrap (bwrap) is not installed",),
                       fix="install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)")
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        trial = subprocess.run(
            [found, *BASE_ARGS, "--chdir", "/", "--", "/bin/true"],
            capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Support(None, missing=(f"bubblewrap ({found}) cannot run: {exc}",), fix="reinstall bubblewrap")
    if trial.returncode != 0:
        why = (trial.stderr.strip().splitlines() or [f"exit status {trial.returncode}"])[-1]
        return Support(
            None, version=version,
            missing=(f"user and PID namespaces are not available to this user ({why})",),
            fix="allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces > 0; Ubuntu 24.04+: an AppArmor profile for bwrap)",
        )
    return Support(found, version=version or None)


@dataclass(frozen=True, slots=True)
class Private:
    """What no turn may see: corral's own files and folders, gathered once from the config."""

    dirs: tuple[Path, ...] = ()
    files: tuple[Path, ...] = ()
    agent_dirs: Mapping[str, Path] = field(default_factory=dict)
    """Each agent's configured working folder (hidden from every other agent)."""


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
) -> Private:
    """corral's private paths for this configuration (pure: nothing is looked at).

    ``secrets``: more files a turn must not read (a chat bridge's access tokens)."""
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
    if cgroup_subtree is not None:
        dirs.append(cgroup_subtree)
    return Private(dirs=tuple(dirs), files=tuple(files), agent_dirs=dict(agent_dirs))


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


class Sandbox:
    """The sandbox of one supervisor: its mode, this machine's :class:`Support`, and what
    is private. :meth:`prefix` is the argv a turn's program is started behind."""

    def __init__(self, mode: SandboxMode, support: Support, private: Private) -> None:
        self.mode = mode
        self.support = support
        self.private = private

    @property
    def active(self) -> bool:
        """Are turns sandboxed?"""
        return self.mode != "off" and self.support.available

    def describe(self) -> dict[str, object]:
        """For ``status`` and ``check``: the mode, whether turns are sandboxed, and if not why."""
        return {
            "mode": self.mode,
            "active": self.active,
            "mechanism": (self.support.version or "bubblewrap") if self.active else None,
            "missing": list(self.support.missing) if self.mode != "off" else [],
            "fix": self.support.fix if self.mode != "off" and not self.active else None,
        }

    def refusal(self) -> str | None:
        """Why a turn may not start (``required`` without a sandbox), else None."""
        if self.mode == "required" and not self.support.available:
            return (f'[server] sandbox = "required", and this machine cannot sandbox: '
                    f"{'; '.join(self.support.missing)}. Fix: {self.support.fix}")
        return None

    def prefix(
        self,
        agent: str,
        *,
        cwd: str,
        home: str,
        writable: Iterable[Path] = (),
        hidden: Iterable[Path] = (),
        network: Network = "host",
        installation: Iterable[str] = (),
        read_only: Iterable[Path] = (),
        entering: Sequence[str] = (),
    ) -> tuple[str, ...]:
        """The argv to start one turn's program behind (``bwrap ... --``); () when inactive.

        ``installation`` is the agent's configured ``command`` and ``args`` (never the prompt:
        a stranger writes that): the folder of every file they name under a private folder
        (``/tmp``) stays in sight, read-only — the agent's own installation, wherever it lives —
        unless it lies in corral's private state. ``read_only``: files in its own folders it may
        read and never change (its login files, see ``credentials``). ``entering``: the words
        that put it into its network namespace first (``network = "proxied"``, :mod:`.netns`).

        Raises :class:`SandboxRefused` when the mode is ``required`` and there is no sandbox.
        """
        refused = self.refusal()
        if refused is not None:
            raise SandboxRefused(refused)
        if not self.active:
            return ()
        assert self.support.bwrap is not None
        own = [Path(cwd), Path(home), *writable]
        dirs = list(self.private.dirs)
        files = list(self.private.files)
        for name, folder in self.private.agent_dirs.items():
            if name != agent and not any(_within(mine, folder) for mine in own):
                dirs.append(folder)
        for path in hidden:
            (dirs if path.is_dir() else files).append(path)
        # Its working folder and HOME exist by the spawn (an ACP agent's HOME is made after
        # this plan); a granted folder that has gone since the config was read is skipped.
        reach = Reach(
            cwd=cwd,
            writable=(cwd, home, *(str(p) for p in writable if p.exists())),
            readable=tuple(self._installed(installation)),
            hidden_dirs=tuple(str(p) for p in dirs if _is_dir(p)),
            hidden_files=tuple(str(p) for p in files if _is_other(p)),
            network=network,
            pinned=tuple(str(p) for p in read_only),
        )
        if network == "proxied" and not entering:
            raise SandboxRefused("a proxied network needs the namespace to enter (supervisor.procs.netns)")
        return (*entering, self.support.bwrap, *bwrap_args(reach), "--")


    def _installed(self, words: Iterable[str]) -> list[str]:
        """The folders under a private folder that the agent's command names (see ``prefix``)."""
        found: list[str] = []
        for word in words:
            path = Path(word)
            if not path.is_absolute() or not any(_within(path, Path(d)) for d in PRIVATE_DIRS):
                continue
            folder = path if _is_dir(path) else path.parent
            if folder.name in ("bin", ".bin"):  # a prefix's: a venv (pyvenv.cfg, lib/), node_modules
                folder = folder.parent
            # Inside corral's private state: never (a private folder *inside* it stays hidden
            # anyway: the deeper rule wins).
            if not folder.is_dir() or any(_within(folder, Path(d)) for d in self.private.dirs):
                continue
            found.append(str(folder))
        return found


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


def open_sandbox(mode: SandboxMode, private: Private, support: Support | None = None) -> Sandbox:
    """The supervisor's sandbox: probe this machine (unless ``off``) and log once what is missing."""
    if mode == "off":
        return Sandbox(mode, support or Support(None), private)
    support = support or probe()
    sandbox = Sandbox(mode, support, private)
    if sandbox.active:
        log.info("turns run in a sandbox (%s)", support.version or "bubblewrap")
    else:
        log.warning(
            "turns run WITHOUT a sandbox (sandbox = %r): missing %s. Fix: %s. An agent can then read "
            "corral's store and config, other channels' folders, and signal the daemon",
            mode, "; ".join(support.missing), support.fix,
        )
    return sandbox


# ------------------------------------------------------------------ whose peer is this


@dataclass(frozen=True, slots=True)
class PeerFacts:
    """What ``/proc`` says of a peer process (gathered by :func:`peer_facts`)."""

    cgroup: str | None
    pid_ns: int | None
    environ: Mapping[str, str]


def peer_facts(pid: int) -> PeerFacts:
    """Read a peer's cgroup, pid namespace and environment (each None/empty if unreadable)."""
    cgroup = None
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as fh:
            for line in fh.read().decode(errors="replace").splitlines():
                if line.startswith("0::"):
                    cgroup = line[3:]
    except OSError:
        pass
    try:
        pid_ns: int | None = os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        pid_ns = None
    env: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                key, sep, value = item.partition(b"=")
                if sep and key.startswith(b"CORRAL_"):
                    env[key.decode(errors="replace")] = value.decode(errors="replace")
    except OSError:
        pass
    return PeerFacts(cgroup, pid_ns, env)


def turn_of_peer(
    facts: PeerFacts, *, subtree: str | None, store_id: str, own_pid_ns: int | None
) -> str | None:
    """Is the peer a process of one of this store's turns? Its turn (or ``"a turn"``), else None.

    Three signs, any one enough: its cgroup is below the store's subtree (a process cannot
    leave it: the cgroup file system is read-only in the sandbox); it lives in a pid
    namespace other than the daemon's (every sandboxed process does; a client in a container
    is not a turn, but it has no business on a 0600 socket either); or it carries the
    store's marker (what an unsandboxed, uncontained turn still shows, unless it cleared it).
    """
    if subtree is not None and facts.cgroup is not None:
        prefix = subtree.rstrip("/") + "/"
        if facts.cgroup.startswith(prefix):
            return facts.cgroup[len(prefix):].split("/", 1)[0] or "a turn"
    if facts.environ.get("CORRAL_STORE") == store_id:
        return facts.environ.get("CORRAL_TURN") or "a turn"
    if own_pid_ns is not None and facts.pid_ns is not None and facts.pid_ns != own_pid_ns:
        return facts.environ.get("CORRAL_TURN") or "a sandboxed process"
    return None


def own_pid_namespace() -> int | None:
    """This process's pid namespace (its inode), if the kernel says."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
