"""corral under systemd: the units work as shipped (absolute paths under the folders the
unit makes, ``systemd-analyze verify``), socket activation (a request sent before corral
serves, or while it restarts, is answered), the notify protocol (READY, STATUS, watchdog
pings, STOPPING) through a datagram socket the test binds as ``NOTIFY_SOCKET``, journald
priority prefixes, and ``[server] socket_mode`` / ``socket_group``."""

from __future__ import annotations

import configparser
import grp
import itertools
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from conftest import CORRAL, SUPERVISOR_PIDS, make_config

from supervisor import Config, ConfigError, parse_config
from supervisor.config.preflight import preflight
from supervisor.serve import daemon as _daemon
from supervisor.serve import systemd as _systemd
from supervisor.serve.daemon import bind_unix_socket, run_daemon

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "scripts" / "corral.service"
ETC_CONFIG = ROOT / "scripts" / "etc-corral.toml"
STATE = Path("/var/lib/corral")
RUNTIME = Path("/run/corral")


def shipped_config() -> Config:
    """scripts/etc-corral.toml as ``corral run -c /etc/corral/corral.toml`` reads it."""
    return parse_config(tomllib.loads(ETC_CONFIG.read_text()), file="/etc/corral/corral.toml", base=Path("/etc/corral"))


NO_ANALYZE = shutil.which("systemd-analyze") is None
NO_ACTIVATE = shutil.which("systemd-socket-activate") is None
MISSING = "is not installed (Debian package systemd)"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_the_shipped_config_puts_everything_under_the_units_folders() -> None:
    # As `corral run -c /etc/corral/corral.toml` reads it: relative paths would resolve
    # against /etc/corral, which the service user cannot write.
    config = shipped_config()
    assert config.server.socket.is_absolute() and config.server.socket.parent == RUNTIME
    assert config.store_path.is_absolute() and config.store_path.parent == STATE
    assert config.state_dir == STATE / "corral.d"
    assert all(not str(p).startswith("/etc/") for p in (config.server.socket, config.store_path, config.state_dir))


def test_the_unit_makes_those_folders_for_its_user_and_reads_that_config() -> None:
    service = unit()["Service"]
    assert service["User"] == "corral"
    assert service["StateDirectory"] == STATE.name and service["RuntimeDirectory"] == RUNTIME.name
    assert service["StateDirectoryMode"] == "0700" and service["RuntimeDirectoryMode"] == "0750"
    assert service["ExecStart"].endswith(" run -c /etc/corral/corral.toml")
    assert service["Type"] == "notify"


# ---------------------------------------------------------------- the units as shipped

SOCKET_UNIT = ROOT / "scripts" / "corral.socket"


def socket_unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(SOCKET_UNIT.read_text())
    return parser


def test_the_socket_unit_passes_the_configs_socket_with_the_configs_rights() -> None:
    # The socket systemd makes is the one clients find in the config, with the same rights
    # corral would give it itself, and the name corral serves as its control socket.
    sock = socket_unit()["Socket"]
    config = shipped_config()
    assert Path(sock["ListenStream"]) == config.server.socket
    assert sock["FileDescriptorName"] == _systemd.CONTROL_NAME
    assert int(sock["SocketMode"], 8) == config.server.socket_mode == 0o660
    assert sock["SocketGroup"] == config.server.socket_group == unit()["Service"]["Group"]
    assert sock["SocketUser"] == unit()["Service"]["User"]
    assert sock.get("Accept", "no") == "no"


def test_the_service_is_notify_watched_delegated_and_hardened() -> None:
    service = unit()["Service"]
    assert service["NotifyAccess"] == "main" and int(service["WatchdogSec"]) > 0
    assert service["Delegate"] == "yes" and service["NoNewPrivileges"] == "yes" and service["PrivateTmp"] == "yes"
    assert service["ProtectSystem"] == "strict" and str(STATE) in service["ReadWritePaths"].split()
    assert service["ProtectHome"] in ("read-only", "yes", "tmpfs")
    assert service["KillMode"] == "mixed" and service["Restart"] == "on-failure"
    # The operators' group reaches the socket; the socket file corral.socket made survives.
    assert service["RuntimeDirectoryMode"] == "0750" and service["RuntimeDirectoryPreserve"] == "yes"
    assert "corral.socket" in unit()["Unit"]["Requires"] and "corral.socket" in unit()["Unit"]["After"]


@pytest.mark.skipif(NO_ANALYZE, reason=f"systemd-analyze {MISSING}")
def test_systemd_analyze_verify_passes_on_both_units(tmp_path: Path) -> None:
    corral = Path(sys.executable).parent / "corral"
    if not corral.exists():
        pytest.skip(f"no corral console script next to {sys.executable}")
    (tmp_path / "corral.service").write_text(
        UNIT.read_text().replace("ExecStart=/opt/corral/.venv/bin/corral ", f"ExecStart={corral} ")
    )
    shutil.copy(SOCKET_UNIT, tmp_path / "corral.socket")
    done = subprocess.run(
        ["systemd-analyze", "verify", "corral.socket", "corral.service"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


# ---------------------------------------------------------------- [server] socket_mode, socket_group


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (660, "expected an octal mode as a string"),
        ("rw-rw----", "expected an octal mode as a string"),
        ("0666", "lets every user on the machine"),
        ("4660", "lets every user on the machine"),
        ("0060", "does not let corral's own user"),
    ],
)
def test_a_bad_socket_mode_is_refused_with_the_key_and_the_fix(value: object, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({"server": {"socket_mode": value}, "agents": {"demo": {"adapter": "demo"}}}, file="c.toml")
    (problem,) = caught.value.problems
    assert (problem.file, problem.key) == ("c.toml", "server.socket_mode") and says in problem.message
    assert '"0600"' in problem.fix or '"0660"' in problem.fix


def test_a_socket_group_that_does_not_exist_is_a_preflight_problem(short_tmp: Path) -> None:
    missing = "corral-no-such-group"
    with pytest.raises(KeyError):
        grp.getgrnam(missing)
    config = parse_config(
        {"server": {"socket": "s.sock", "socket_group": missing}, "agents": {"demo": {"adapter": "demo"}}},
        file=str(short_tmp / "corral.toml"), base=short_tmp,
    )
    problems = [p for p in preflight(config) if p.key == "server.socket_group"]
    assert len(problems) == 1 and missing in problems[0].message and "groupadd" in problems[0].fix
    mine = grp.getgrgid(os.getegid()).gr_name
    mine_config = replace(config, server=replace(config.server, socket_group=mine))
    assert not [p for p in preflight(mine_config) if p.key == "server.socket_group"]


def test_corral_gives_its_socket_the_configured_mode_and_group(short_tmp: Path) -> None:
    group = grp.getgrgid(os.getegid())
    sock = bind_unix_socket(short_tmp / "a.sock", 0o660, group.gr_name)
    try:
        st = (short_tmp / "a.sock").stat()
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group.gr_gid
    finally:
        sock.close()
    default = bind_unix_socket(short_tmp / "b.sock")
    try:
        assert stat.S_IMODE((short_tmp / "b.sock").stat().st_mode) == 0o600
    finally:
        default.close()


# ---------------------------------------------------------------- notify protocol


class NotifyListener:
    """The datagram socket a test binds as ``NOTIFY_SOCKET``, as systemd would."""

    def __init__(self, address: str) -> None:
        self.env_value = address
        self.sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.bound = "\0" + address[1:] if address.startswith("@") else address

    async def __aenter__(self) -> NotifyListener:
        await self.sock.bind(self.bound)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.sock.close()

    async def receive(self) -> str:
        return (await self.sock.recv(4096)).decode()

    async def until(self, wanted: Callable[[str], bool]) -> str:
        """The next datagram ``wanted`` accepts (others are skipped)."""
        while True:
            message = await self.receive()
            if wanted(message):
                return message

    def pending(self) -> list[str]:
        """Datagrams already queued, without a checkpoint."""
        found = []
        while True:
            try:
                found.append(self.sock._sock.recv(4096, socket.MSG_DONTWAIT).decode())  # type: ignore[attr-defined]
            except BlockingIOError:
                return found


@pytest.mark.parametrize("form", ["path", "abstract"])
async def test_notify_reaches_a_path_or_an_abstract_socket(form: str, short_tmp: Path) -> None:
    address = str(short_tmp / "notify") if form == "path" else f"@corral-test-{os.getpid()}-{short_tmp.name}"
    async with NotifyListener(address) as listener:
        assert _systemd.notify("READY=1\nSTATUS=hello", {"NOTIFY_SOCKET": address})
        assert await listener.receive() == "READY=1\nSTATUS=hello"
    assert not _systemd.notify("READY=1", {})


def test_the_watchdog_interval_is_half_of_watchdog_usec_for_this_process_only() -> None:
    pid = os.getpid()
    assert _systemd.watchdog_interval({}, pid) is None
    assert _systemd.watchdog_interval({"WATCHDOG_USEC": "30000000"}, pid) == 15.0
    assert _systemd.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(pid)}, pid) == 15.0
    assert _systemd.watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(pid + 1)}, pid) is None
    with pytest.raises(_systemd.SystemdError, match="WatchdogSec="):
        _systemd.watchdog_interval({"WATCHDOG_USEC": "soon"}, pid)


def _task_names() -> set[str]:
    names: set[str] = set()
    pending = [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        names.add(task.name)
        pending.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return names


async def test_without_systemd_no_watchdog_or_status_task_runs(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(run_daemon, config, handle_signals=False, subreaper=False, environ={}))
        names = _task_names()
        assert _daemon.WATCHDOG_TASK not in names and _daemon.STATUS_TASK not in names
        nursery.cancel_scope.cancel()
    # The positive control: the same look finds them when systemd asks for them.
    async with NotifyListener(str(short_tmp / "notify")) as listener, trio.open_nursery() as nursery:
        environ = {"NOTIFY_SOCKET": listener.env_value, "WATCHDOG_USEC": "60000000"}
        await nursery.start(partial(run_daemon, config, handle_signals=False, subreaper=False, environ=environ))
        names = _task_names()
        assert _daemon.WATCHDOG_TASK in names and _daemon.STATUS_TASK in names
        nursery.cancel_scope.cancel()


async def test_ready_status_watchdog_and_stopping_reach_the_notify_socket(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    interval = 0.2
    async with NotifyListener(str(short_tmp / "notify")) as listener, trio.open_nursery() as nursery:
        environ = {
            "NOTIFY_SOCKET": listener.env_value,
            "WATCHDOG_USEC": str(int(interval * 2 * 1_000_000)),
            "WATCHDOG_PID": str(os.getpid()),
        }
        with trio.fail_after(60):
            await nursery.start(partial(run_daemon, config, handle_signals=False, subreaper=False, environ=environ))
            ready = await listener.until(lambda m: "READY=1" in m)
            assert "STATUS=0 turn(s) running, 0 queued, 0 channel(s)" in ready
            # Pings at half WATCHDOG_USEC (generous bounds: two cores shared by a whole team).
            stamps = []
            for _ in range(6):
                await listener.until(lambda m: m == "WATCHDOG=1")
                stamps.append(trio.current_time())
            gaps = [b - a for a, b in itertools.pairwise(stamps)]
            assert interval * 0.5 <= sum(gaps) / len(gaps) <= interval * 3, gaps
            # A stuck event loop sends nothing: systemd's watchdog would fire.
            listener.pending()
            time.sleep(interval * 3)  # the daemon's loop is this one: block it, as a hang would
            assert "WATCHDOG=1" not in listener.pending()
            await listener.until(lambda m: m == "WATCHDOG=1")  # and it pings again once free
            # STATUS= follows the turns: one running on "work", then none.
            async with _client(short_tmp) as http:
                sent = await http.post("/v1/channels/work/messages", json={"text": "Please do a long task"})
                assert sent.status_code == 202
                busy = await listener.until(lambda m: m.startswith("STATUS=1 turn(s) running"))
                assert busy.endswith(": work") and "1 channel(s)" in busy
                assert (await http.post("/v1/channels/work/stop")).status_code == 200
                await listener.until(lambda m: m.startswith("STATUS=0 turn(s) running"))
                await http.post("/v1/shutdown")
            stopping = await listener.until(lambda m: "STOPPING=1" in m)
            assert stopping.startswith("STOPPING=1")


def _client(folder: Path) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(folder / "corral.sock")), base_url="http://corral")


async def test_status_lines_are_rate_limited_and_idle_means_no_wake_up(autojump_clock: trio.testing.MockClock) -> None:
    state = {"line": "a", "busy": False, "describes": 0}
    sent: list[tuple[float, str]] = []

    def describe() -> str:
        state["describes"] = int(state["describes"]) + 1
        return str(state["line"])

    changes_send, changes = trio.open_memory_channel[object](1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(
            _systemd.report_status, describe, lambda: bool(state["busy"]), changes,
            lambda m: sent.append((trio.current_time(), m)), min_interval=1.0, busy_interval=5.0,
        ))
        await trio.testing.wait_all_tasks_blocked()
        assert [m for _, m in sent] == ["STATUS=a"]
        # A burst of changes: the first is shown after the pause, the rest coalesce into it.
        for line in ("b", "c", "d"):
            state["line"] = line
            changes_send.send_nowait(None) if line == "b" else None
        await trio.sleep(10)
        assert [m for _, m in sent] == ["STATUS=a", "STATUS=d"]
        assert all(b[0] - a[0] >= 1.0 for a, b in itertools.pairwise(sent))
        # Idle: an hour passes and nothing wakes the reporter.
        before = state["describes"]
        await trio.sleep(3600)
        assert state["describes"] == before
        # Busy: it looks every busy_interval (a turn's end need not commit an entry last).
        state["busy"] = True
        changes_send.send_nowait(None)
        await trio.sleep(60)
        assert int(state["describes"]) - int(before) >= 60 / 5
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- journald


def test_each_line_carries_its_priority_and_a_traceback_keeps_it() -> None:
    formatter = _systemd.JournalFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    levels = {
        logging.CRITICAL: "<2>", logging.ERROR: "<3>", logging.WARNING: "<4>",
        logging.INFO: "<6>", logging.DEBUG: "<7>",
    }
    for level, prefix in levels.items():
        record = logging.LogRecord("corral", level, __file__, 1, "line one\nline two", None, None)
        lines = formatter.format(record).split("\n")
        assert len(lines) == 2 and all(line.startswith(prefix) for line in lines), lines
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("corral", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    lines = formatter.format(record).split("\n")
    assert len(lines) > 3 and all(line.startswith("<3>") for line in lines) and lines[-1] == "<3>ValueError: boom"


def test_the_journal_is_detected_by_the_streams_device_and_inode(tmp_path: Path) -> None:
    with (tmp_path / "journal").open("w") as journal, (tmp_path / "other").open("w") as other:
        st = os.fstat(journal.fileno())
        environ = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert _systemd.stderr_is_journal(environ, journal)
        assert _systemd.stderr_is_journal(environ, journal.fileno())
        # Inherited by a child whose stderr goes elsewhere: not the journal.
        assert not _systemd.stderr_is_journal(environ, other)
        assert not _systemd.stderr_is_journal({}, journal)
        assert not _systemd.stderr_is_journal({"JOURNAL_STREAM": "garbage"}, journal)


# ---------------------------------------------------------------- socket activation


def test_listen_fds_are_read_for_this_process_only_and_then_forgotten() -> None:
    pid = os.getpid()
    environ = {"LISTEN_FDS": "2", "LISTEN_PID": str(pid), "LISTEN_FDNAMES": "control:tcp", "OTHER": "kept"}
    assert _systemd.parse_listen_fds(environ, pid) == [_systemd.Passed(3, "control"), _systemd.Passed(4, "tcp")]
    assert _systemd.parse_listen_fds({**environ, "LISTEN_PID": str(pid + 1)}, pid) == []
    unnamed = {"LISTEN_FDS": "1", "LISTEN_PID": str(pid)}
    assert _systemd.parse_listen_fds(unnamed, pid) == [_systemd.Passed(3, _systemd.UNNAMED)]
    with pytest.raises(_systemd.SystemdError, match="FileDescriptorName="):
        _systemd.parse_listen_fds({**environ, "LISTEN_FDNAMES": "control"}, pid)
    # Not this process's: nothing adopted, and still removed, so no child takes them either.
    foreign = {**environ, "LISTEN_PID": str(pid + 1)}
    assert _systemd.take_sockets(foreign, pid) == _systemd.Activation()
    assert foreign == {"OTHER": "kept"}


#: Passes the sockets given as descriptors from 3 on, the way systemd does, then becomes
#: ``python ARGS``: ``LISTEN_PID`` must be the pid that runs corral, known only after the fork.
SHIM = r"""
import fcntl, os, sys
fds = [int(fd) for fd in sys.argv[1].split(",")]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
for fd in fds:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)
    os.close(fd)
os.environ.update(LISTEN_FDS=str(len(fds)), LISTEN_PID=str(os.getpid()))
if sys.argv[2]:
    os.environ["LISTEN_FDNAMES"] = sys.argv[2]
os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
"""
ACTIVATED_CONFIG = """
[server]
socket = "corral.sock"
token_file = "corral.token"
[agents.demo]
adapter = "demo"
delay = 0.01
"""

WITHOUT_TOKEN = ACTIVATED_CONFIG.replace('token_file = "corral.token"\n', "")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _activated(folder: Path, sockets: list[socket.socket], names: str) -> subprocess.Popen[str]:
    """``corral run`` in ``folder`` on ``sockets``, as systemd starts it; returns once it serves."""
    fds = [s.fileno() for s in sockets]
    proc = subprocess.Popen(
        [sys.executable, "-c", SHIM, ",".join(map(str, fds)), names, *CORRAL[1:], "run", "-c", "corral.toml"],
        cwd=folder, env=_env(), pass_fds=fds, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    SUPERVISOR_PIDS.add(proc.pid)
    return proc


def _ready(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stderr is not None
    log = []
    for line in proc.stderr:
        log.append(line)
        if "ready on" in line:
            return log
    raise AssertionError("corral ended before it was ready:\n" + "".join(log))


def _raw_request(path: Path, request: bytes) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(60)
    client.connect(str(path))
    client.sendall(request)
    return client


def _response(client: socket.socket) -> tuple[int, dict[str, Any]]:
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < int(
        re.search(rb"content-length: (\d+)", data.partition(b"\r\n\r\n")[0], re.I)[1]  # type: ignore[index]
    ):
        chunk = client.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_stop_sent_while_corral_restarts_waits_in_the_backlog_and_is_answered(short_tmp: Path) -> None:
    (short_tmp / "corral.toml").write_text(ACTIVATED_CONFIG)
    (short_tmp / "corral.token").write_text("s3cret\n")
    (short_tmp / "corral.token").chmod(0o600)
    # What corral.socket does: systemd binds and listens, and keeps the sockets across restarts.
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(str(short_tmp / "corral.sock"))
    control.listen(64)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(64)
    port = tcp.getsockname()[1]
    first = _activated(short_tmp, [control, tcp], "control:tcp")
    second = None
    try:
        log = _ready(first)
        assert "(sockets from systemd)" in log[-1], log
        # The passed TCP socket serves, and still wants the token.
        http = HTTPConnection("127.0.0.1", port, timeout=60)
        http.request("GET", "/v1/status")
        assert http.getresponse().status == 401
        http.close()
        http.request("GET", "/v1/status", headers={"Authorization": "Bearer s3cret"})
        answer = http.getresponse()
        assert answer.status == 200 and json.loads(answer.read())["pid"] == first.pid
        http.close()
        # corral dies; nobody serves; a stop is sent and waits in the listening socket's backlog.
        first.kill()
        first.wait(60)
        stop_all = b"POST /v1/stop HTTP/1.1\r\nHost: corral\r\nContent-Length: 0\r\n\r\n"
        waiting = _raw_request(short_tmp / "corral.sock", stop_all)
        second = _activated(short_tmp, [control, tcp], "control:tcp")
        status, body = _response(waiting)
        waiting.close()
        assert status == 200 and body["ok"] is True, body
        _ready(second)
        done = subprocess.run([*CORRAL, "--socket", str(short_tmp / "corral.sock"), "status", "--json"],
                              env=_env(), capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and json.loads(done.stdout)["pid"] == second.pid, done.stderr
        os.kill(second.pid, signal.SIGTERM)
        assert second.wait(60) == 0
        # corral never removes a socket it did not make: the next start needs it.
        assert stat.S_ISSOCK((short_tmp / "corral.sock").lstat().st_mode)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        control.close()
        tcp.close()


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("wide-tcp", "not loopback; use ListenStream=127.0.0.1:PORT"),
        ("tcp-without-token", "a TCP listener needs a token"),
        ("other-path", "make ListenStream= and [server] socket the same path"),
        ("datagram", "is not a stream socket; use ListenStream="),
    ],
)
def test_a_passed_socket_corral_must_not_serve_is_refused_with_the_fix(kind: str, says: str, short_tmp: Path) -> None:
    (short_tmp / "corral.toml").write_text(ACTIVATED_CONFIG if kind == "wide-tcp" else WITHOUT_TOKEN)
    (short_tmp / "corral.token").write_text("s3cret\n")
    (short_tmp / "corral.token").chmod(0o600)
    if kind in ("wide-tcp", "tcp-without-token"):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0" if kind == "wide-tcp" else "127.0.0.1", 0))
        names = "tcp"
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM if kind == "datagram" else socket.SOCK_STREAM)
        sock.bind(str(short_tmp / ("other.sock" if kind == "other-path" else "corral.sock")))
        names = "control"
    if sock.type == socket.SOCK_STREAM:
        sock.listen(8)
    try:
        proc = _activated(short_tmp, [sock], names)
        _, err = proc.communicate(timeout=60)
    finally:
        sock.close()
    assert proc.returncode == 1 and says in err, err
    assert "ready on" not in err


@pytest.mark.skipif(NO_ACTIVATE, reason=f"systemd-socket-activate {MISSING}")
def test_systemd_socket_activate_a_request_before_corral_is_ready_is_answered(short_tmp: Path) -> None:
    (short_tmp / "corral.toml").write_text(WITHOUT_TOKEN)
    path = short_tmp / "corral.sock"
    # corral's stderr is "the journal": JOURNAL_STREAM names it, as systemd does.
    read_end, write_end = os.pipe()
    st = os.fstat(write_end)
    passed = [f"--setenv={name}" for name in ("PATH", "HOME", "LANG") if name in os.environ]
    proc = subprocess.Popen(
        ["systemd-socket-activate", "--listen", str(path), "--fdname=control", *passed,
         f"--setenv=PYTHONPATH={_env()['PYTHONPATH']}", f"--setenv=JOURNAL_STREAM={st.st_dev}:{st.st_ino}",
         sys.executable, "-m", "supervisor.cli", "run", "-c", "corral.toml"],
        cwd=short_tmp, stderr=write_end, stdout=subprocess.DEVNULL, start_new_session=True,
    )
    os.close(write_end)
    SUPERVISOR_PIDS.add(proc.pid)
    with os.fdopen(read_end) as stderr:
        try:
            assert "Listening on" in stderr.readline()
            # Nothing runs corral yet: this request starts it (systemd-socket-activate execs it
            # on the first connection) and waits until it serves.
            client = [*CORRAL, "--socket", str(path)]
            done = subprocess.run(
                [*client, "status", "--json"], env=_env(), capture_output=True, text=True, timeout=60, check=False
            )
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["pid"] == proc.pid
            subprocess.run([*client, "shutdown"], env=_env(), capture_output=True, timeout=60, check=True)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log = stderr.read().splitlines()
    assert stat.S_ISSOCK(path.lstat().st_mode), "corral removed the socket systemd made"
    ours = log[next(i for i, line in enumerate(log) if line.startswith("Execing ")) + 1:]  # after the exec: corral's
    assert any(line.startswith("<6>INFO corral.daemon: corral ") and "ready on" in line for line in ours), log
    assert ours and all(re.match(r"<[2-7]>[A-Z]+ corral\.", line) for line in ours), log
