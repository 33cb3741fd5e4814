"""Fixtures shared by the test suite."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from scripts._postgres import PostgresServer
from scripts._postgres import missing as postgres_missing
from scripts._slack import FakeSlack
from scripts._telegram import FakeBotApi

from supervisor import Config, parse_config
from supervisor.procs.tree import TURN_MARKER

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path: a Unix socket path must stay under 108 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="corral-t-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the test session (skipped, with the reason, where it cannot run)."""
    reason = postgres_missing()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def telegram_api() -> Iterator[FakeBotApi]:
    """One fake Telegram Bot API server for the session (each test makes a bot of its own on it)."""
    server = FakeBotApi()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def slack_api() -> Iterator[FakeSlack]:
    """One fake Slack (Web API and Socket Mode) for the session (each test makes an app of its own on it)."""
    server = FakeSlack()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a new, empty database of its own for this test."""
    return postgres_server.new_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a test's store lives, once per engine: a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "corral.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


def make_config(folder: Path, agents: dict[str, dict[str, Any]] | None = None, **defaults: Any) -> Config:
    """A valid config rooted in ``folder``; the demo agent unless ``agents`` says otherwise.

    Turns run sandboxed, as by default; every agent is granted ``folder`` for writing (the
    pid files and marks tests' agents leave there), as a user grants a shared folder. corral's
    own state inside it stays hidden: the deeper rule wins.
    """
    agents = {name: {"sandbox_write": [str(folder)], **table}
              for name, table in (agents or {"demo": {"adapter": "demo", "delay": 0.01}}).items()}
    data: dict[str, Any] = {
        "server": {"socket": "corral.sock", "cgroup": KILL["cgroup"]},
        "store": {"path": "corral.db"},
        "agents": agents,
    }
    if defaults:
        data["defaults"] = defaults
    return parse_config(data, file=str(folder / "corral.toml"), base=folder)


#: The ``[server] cgroup`` every config of :func:`make_config` asks for; the ``kill_mechanism``
#: fixture switches it per test.
KILL = {"cgroup": "auto"}


def cgroup_missing() -> str | None:
    """Why no turn cgroup can be made here (what is missing); None if one can."""
    from supervisor.procs.cgroup import CgroupUnavailable, find_base

    try:
        base = find_base("auto")
        probe = base / f"corral-probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except CgroupUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot create a cgroup in the cgroup2 mount: {exc}"
    return None


@pytest.fixture(params=["cgroup", "sweep"])
def kill_mechanism(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test with each kill mechanism: a cgroup per turn, and the sweep fallback.

    ``CORRAL_TEST_KILL=cgroup`` (or ``sweep``) runs only that one. The cgroup variant skips,
    saying what is missing, where no cgroup v2 is writable.
    """
    only = os.environ.get("CORRAL_TEST_KILL")
    if only and only != request.param:
        pytest.skip(f"CORRAL_TEST_KILL={only}")
    if request.param == "cgroup":
        missing = cgroup_missing()
        if missing:
            pytest.skip(f"no writable cgroup v2: {missing}")
    KILL["cgroup"] = "auto" if request.param == "cgroup" else "off"
    try:
        yield request.param
    finally:
        KILL["cgroup"] = "auto"


def script_agent(code: str, **extra: Any) -> dict[str, Any]:
    """A generic agent running ``code`` with this Python; the prompt is ``sys.argv[-1]`` (after ``--``)."""
    return {"adapter": "generic", "command": [PYTHON, "-c", code], **extra}


class Supervisors(set[int]):
    """The pids of the supervisors this test run started, each with its start time.

    A turn id names its supervisor by pid only (``t<pid hex>-…``). pids are reused (here
    ``pid_max`` is 32768, and a real-CLI run spends tens of thousands), and other engineers'
    suites run on the same machine: a daemon of theirs can get the pid one of ours had, and
    its turns' markers then name a pid of this run. A pid is this run's only while no other
    process holds it: alive with another start time, it is someone else's.
    """

    def __init__(self, *pids: int) -> None:
        super().__init__()
        self.born: dict[int, float] = {}
        for pid in pids:
            self.add(pid)

    def add(self, pid: int) -> None:
        """Record ``pid`` (a process just started, so still the one meant) and its start time."""
        super().add(pid)
        try:
            self.born[pid] = psutil.Process(pid).create_time()
        except psutil.Error:
            self.born.pop(pid, None)

    def owns(self, pid: int) -> bool:
        """Is ``pid`` one of this run's supervisors: recorded, and not since reused?"""
        if pid not in self:
            return False
        born = self.born.get(pid)
        try:
            now = psutil.Process(pid).create_time()
        except psutil.Error:
            return True  # gone: its turns' leftovers are this run's
        return born is None or abs(now - born) < 0.5


#: Supervisors started by this test run: this process, and every daemon it launched.
SUPERVISOR_PIDS = Supervisors(os.getpid())


def _ours(turn_id: str) -> bool:
    head = turn_id.split("-", 1)[0]
    if not head.startswith("t"):
        return False
    try:
        return SUPERVISOR_PIDS.owns(int(head[1:], 16))
    except ValueError:
        return False


def turn_processes(turn_ids: list[str] | None = None) -> list[psutil.Process]:
    """Living (non-zombie) processes of turns run by this test run (of the given turns, or any).

    Turn ids carry their supervisor's pid, so processes of other corral instances on the
    machine are never counted (nor killed) here. Each one's ``info`` holds its ``environ``
    (the marker only), ``status`` and ``name``, as ``psutil.process_iter`` would.

    Read straight from ``/proc`` (every test calls this twice): psutil's ``process_iter``
    parses every process's whole environment, several times slower on a busy machine.
    """
    found = []
    me = os.getpid()
    marker = b"\0" + TURN_MARKER.encode() + b"="
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as file:
                environ = b"\0" + file.read()
            at = environ.find(marker)
            if at < 0:
                continue
            start = at + len(marker)
            end = environ.find(b"\0", start)
            turn = environ[start: end if end >= 0 else len(environ)].decode(errors="replace")
            if not _ours(turn) or (turn_ids is not None and turn not in turn_ids):
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as file:
                stat = file.read()
            if stat[stat.rindex(b")") + 2: stat.rindex(b")") + 3] == b"Z":
                continue
            proc = psutil.Process(int(entry.name))
        except (OSError, ValueError, psutil.Error):
            continue  # gone meanwhile (or not ours to read): not a living turn process
        comm = stat[stat.index(b"(") + 1: stat.rindex(b")")].decode(errors="replace")
        proc.info = {"environ": {TURN_MARKER: turn}, "status": psutil.STATUS_RUNNING, "name": comm}
        found.append(proc)
    return found


@pytest.fixture(autouse=True)
def no_leftover_turn_processes() -> Iterator[None]:
    """Every test must leave no process of any turn alive (the contract's last word)."""
    before = {p.pid for p in turn_processes()}
    yield
    left = [p for p in turn_processes() if p.pid not in before]
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    assert not left, f"processes of turns left alive: {[(p.pid, p.info.get('name')) for p in left]}"


CORRAL = [PYTHON, "-m", "supervisor.cli"]


def _die_with_parent() -> None:
    """In a test daemon: SIGTERM it (an orderly shutdown) if the test run dies first."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


class DaemonProcess:
    """A real `corral run` subprocess in ``folder``, ready once it has logged that it serves."""

    def __init__(self, folder: Path, config_text: str, prefix: tuple[str, ...] = ()) -> None:
        import subprocess
        import time

        self.folder = folder
        self.socket = folder / "corral.sock"
        (folder / "corral.toml").write_text(config_text)
        self.proc = subprocess.Popen(
            [*prefix, *CORRAL, "run", "-c", "corral.toml"],
            cwd=folder,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        SUPERVISOR_PIDS.add(self.proc.pid)
        self.log: list[str] = []
        deadline = time.monotonic() + 30
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError("the daemon exited before it was ready:\n" + "".join(self.log))
            self.log.append(line)
            if "ready on" in line:
                return
        raise AssertionError("the daemon did not become ready")

    def cli(self, *args: str, timeout: float = 120, check: bool = False) -> Any:
        """Run ``corral ARGS`` against this daemon."""
        import subprocess

        env = {**os.environ, "CORRAL_SOCKET": str(self.socket)}
        return subprocess.run(
            [*CORRAL, *args], cwd=self.folder, env=env, capture_output=True, text=True, timeout=timeout, check=check
        )

    def stop(self) -> int:
        """SIGTERM, and wait for the orderly shutdown."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out = self.proc.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.log.append(out or "")
        return self.proc.returncode


#: A turn that calls a tool, reports its tokens under a hostile model name (markup, a mention's
#: brackets, @everyone, a newline, IRC control codes), then answers: the bridges' and the
#: dashboard's tests show its line of what it spent (``supervisor.core.usage.usage_line``).
METERED = r"""
import json, sys
print(json.dumps({"type": "tool", "name": "Read", "input": "notes.txt"}), flush=True)
print(json.dumps({"type": "usage", "input_tokens": 1200, "output_tokens": 34,
                  "model": "m<@U1>\n@everyone**\x03\x02"}), flush=True)
print(json.dumps({"type": "result", "text": "counted: " + sys.argv[-1]}), flush=True)
"""
#: The start of the line its turn ends with (then its wall time and the model's name, shown harmless).
METERED_LINE = "meter used 1,200 tokens in · 34 out · 1 tool · "
METERED_MODEL = "m?@U1?@everyone?"


def metered_agent(folder: Path) -> dict[str, Any]:
    """The agent ``meter`` of a bridge test's config: :data:`METERED`."""
    return script_agent(METERED, sandbox_write=[str(folder)])
