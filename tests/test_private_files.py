"""Nothing of corral's is readable by other users, nor the daemon's environment by its agents.

Folders corral creates are 0700 and files 0600 whatever the umask (embedded use leaves the
host's umask alone); ``corral run`` sets umask 077 and makes itself non-dumpable, so an
agent running as the same user cannot read ``/proc/<daemon>/environ``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CORRAL, PYTHON, SUPERVISOR_PIDS, make_config, script_agent

from supervisor import open_supervisor
from supervisor.procs.files import private_folder
from supervisor.procs.files import write_home_files as _write_files
from supervisor.turns.ports import channel_slug

SLOW = 30
NOBODY = 65534


def mode(path: Path) -> int:
    """The permission bits of ``path``."""
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """Run the test under umask 022 (the usual default), restored afterwards."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


async def test_embedded_state_homes_and_work_folders_are_0700_and_the_umask_is_left_alone(
    short_tmp: Path, loose_umask: None
) -> None:
    state = short_tmp / "corral.d"
    state.mkdir(mode=0o755)  # left loose by an older corral: tightened
    state.chmod(0o755)
    config = make_config(short_tmp, {"bot": script_agent("print('hi')")})
    async with open_supervisor(config) as sup:
        await sup.send("c", "hello")
        assert await sup.wait_idle("c", timeout=SLOW)
    assert os.umask(0o022) == 0o022, "an embedded supervisor must not change the host's umask"
    # A HOME per (agent, channel), under the agent's folder of homes.
    home = state / "home" / "bot" / channel_slug("c")
    assert [p.name for p in (state / "home" / "bot").iterdir()] == [home.name]
    work = next((state / "work" / "bot").iterdir())
    for folder in (state, state / "home", home.parent, home, home / "tmp", state / "work", state / "work" / "bot",
                   work):
        assert mode(folder) == 0o700, folder
    for file in short_tmp.glob("corral.db*"):
        assert mode(file) == 0o600, file


def test_files_written_for_agents_are_0600_in_0700_folders(short_tmp: Path, loose_umask: None) -> None:
    home = short_tmp / "state" / "home" / "agent"
    home.mkdir(parents=True)
    stale = home / ".codex"
    stale.mkdir(mode=0o755)
    stale.chmod(0o755)
    (stale / "config.toml").write_text("old")
    (stale / "config.toml").chmod(0o644)
    _write_files(home, {".codex/config.toml": "key = 1\n", ".gemini/deep/settings.json": "{}"})
    assert (stale / "config.toml").read_text() == "key = 1\n"
    for file in (stale / "config.toml", home / ".gemini" / "deep" / "settings.json"):
        assert mode(file) == 0o600, file
    for folder in (home, home / "tmp", stale, home / ".gemini", home / ".gemini" / "deep"):
        assert mode(folder) == 0o700, folder


def test_private_folder_leaves_existing_folders_outside_corral_alone(short_tmp: Path, loose_umask: None) -> None:
    users = short_tmp / "project"
    users.mkdir(mode=0o755)
    users.chmod(0o755)
    private_folder(users / "a" / "b")  # no `within`: only what it creates is its own
    assert mode(users) == 0o755
    assert mode(users / "a") == 0o700 and mode(users / "a" / "b") == 0o700


# ---------------------------------------------------------------- the daemon's /proc files

#: Tries to read its parent's environment: the daemon that spawned it.
PEEK = r"""
import json, os
try:
    with open(f"/proc/{os.getppid()}/environ", "rb") as fh:
        seen = "read" if b"CORRAL_TEST_SECRET=s3cret" in fh.read() else "read, no secret"
except OSError as exc:
    seen = f"denied: {exc.strerror}"
print(json.dumps({"type": "result", "text": seen}))
"""


#: Runs a command as the unprivileged user nobody, with no supplementary groups.
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
#: Runs a command as root without a single capability: an unprivileged process too (no
#: CAP_SYS_PTRACE, no CAP_DAC_OVERRIDE), for machines where nobody cannot reach this Python.
AS_ROOT_WITHOUT_CAPABILITIES = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]


@pytest.fixture
def unprivileged(short_tmp: Path) -> list[str]:
    """The prefix that runs a command unprivileged in ``short_tmp``; skip unless root."""
    if os.geteuid() != 0:
        pytest.skip("running a daemon as an unprivileged user needs root to set it up")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    probe = "import os, sys, trio, supervisor; os.stat(sys.executable); os.listdir(os.path.dirname(os.path.realpath(sys.executable)))"
    if subprocess.run([*AS_NOBODY, PYTHON, "-c", probe], capture_output=True, check=False).returncode == 0:
        os.chown(short_tmp, NOBODY, NOBODY)
        short_tmp.chmod(0o755)
        return AS_NOBODY
    # This Python lives where nobody may not go (e.g. under /root): drop the capabilities instead.
    return AS_ROOT_WITHOUT_CAPABILITIES


def test_without_corral_an_agent_of_the_same_user_can_read_its_parents_environment(
    short_tmp: Path, unprivileged: list[str]
) -> None:
    """The control: what the daemon's prctl prevents is otherwise possible."""
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {PEEK!r}])"
    env = {**os.environ, "CORRAL_TEST_SECRET": "s3cret"}
    out = subprocess.run([*unprivileged, PYTHON, "-c", parent], cwd=short_tmp, env=env, capture_output=True, text=True, timeout=SLOW, check=False)
    assert json.loads(out.stdout)["text"] == "read", out


CLIENT = """
import json, sys
import httpx
transport = httpx.HTTPTransport(uds=sys.argv[1])
slow = float(sys.argv[2])
with httpx.Client(transport=transport, base_url="http://corral", timeout=slow) as http:
    sent = http.post("/v1/channels/c/messages", json={"text": "peek"})
    idle = http.post("/v1/channels/c/wait", params={"timeout": slow}).json().get("idle")
    entries = http.get("/v1/channels/c/entries").json().get("entries", sent.text)
    http.post("/v1/shutdown")
print(json.dumps([sent.status_code, idle, entries]))
"""


def test_an_agent_cannot_read_the_daemons_environment(short_tmp: Path, unprivileged: list[str]) -> None:
    folder = short_tmp
    (folder / "corral.toml").write_text(
        '[server]\nsocket = "corral.sock"\n[store]\npath = "corral.db"\n'
        f"[agents.peek]\nadapter = \"generic\"\ncommand = {json.dumps([PYTHON, '-c', PEEK])}\n"
    )
    os.chown(folder / "corral.toml", folder.stat().st_uid, folder.stat().st_gid)
    env = {**os.environ, "CORRAL_TEST_SECRET": "s3cret"}
    proc = subprocess.Popen(
        [*unprivileged, *CORRAL, "run", "-c", "corral.toml"], cwd=folder, env=env, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    SUPERVISOR_PIDS.add(proc.pid)  # setpriv execs: the pid is the daemon's
    try:
        deadline = time.monotonic() + SLOW
        assert proc.stderr is not None
        log = []
        while "ready on" not in (line := proc.stderr.readline()):
            log.append(line)
            assert line and time.monotonic() < deadline, "".join(log)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert "\nUmask:\t0077\n" in status
        # The client runs with the daemon's own credentials, as an operator of its user does: a
        # client with capabilities the daemon lacks has a /proc the daemon cannot read, and the
        # control socket refuses a peer it cannot identify (it fails closed).
        client = subprocess.run([*unprivileged, PYTHON, "-c", CLIENT, str(folder / "corral.sock"), str(SLOW)],
                                capture_output=True, text=True, timeout=SLOW * 3, check=False)
        assert client.returncode == 0, client.stderr
        sent, idle, entries = json.loads(client.stdout)
        assert sent == 202 and idle, entries
        answers = [e["text"] for e in entries if e["author"] == "agent:peek"]
        assert answers == ["denied: Permission denied"], entries
        assert proc.wait(timeout=SLOW) == 0
        state = folder / "corral.d"
        for path in (state, *state.rglob("*")):
            if path.is_dir():
                assert mode(path) == 0o700, path
            else:
                assert mode(path) & 0o077 == 0, path
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


if sys.platform != "linux":  # pragma: no cover - /proc and prctl are Linux's
    pytestmark = pytest.mark.skip("Linux only")


def test_writing_an_agents_files_never_tightens_a_folder_that_is_not_corrals(short_tmp: Path) -> None:
    """A HOME's folders are tightened from corral's state folder down, never above it: the
    parent-counting this replaced made ``/`` itself 0700 for a HOME of ``/srv/home/claude``."""
    users = [short_tmp / "x", short_tmp / "x" / "y", short_tmp / "x" / "y" / "z"]
    home = users[-1] / "home"
    home.mkdir(parents=True)
    for folder in users:
        folder.chmod(0o755)
    _write_files(home, {".codex/config.toml": "key = 1\n"})
    assert [stat.S_IMODE(f.stat().st_mode) for f in users] == [0o755, 0o755, 0o755]
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and stat.S_IMODE((home / "tmp").stat().st_mode) == 0o700
    _write_files(home, {}, state_dir=users[1])  # corral's state folder: from there down
    assert [stat.S_IMODE(f.stat().st_mode) for f in users] == [0o755, 0o700, 0o700]


async def test_an_acp_agents_home_and_files_are_written_as_a_turns_are(short_tmp: Path, loose_umask: None) -> None:
    """An ACP agent's HOME, TMPDIR and launch files go through the same path as a per-turn CLI's:
    looser folders and files corral left are tightened, and a symlink planted where a file goes
    is not followed (an agent could plant one in its own HOME, aimed at corral's files)."""
    from adapters._base import Launch
    from supervisor.turns.agents import open_acp_agent

    fake = str(Path(__file__).parent / "fakes" / "fake_acp.py")
    state = short_tmp / "corral.d"
    home = state / "home" / "acp" / channel_slug("c")
    (home / "tmp").mkdir(parents=True)
    for folder in (home, home / "tmp"):
        folder.chmod(0o755)
    config = make_config(short_tmp, {"acp": {"adapter": "acp", "command": [sys.executable, fake],
                                             "env": {"FAKE_ACP_STATE": str(short_tmp)}}})
    assert config.state_dir == state
    async with open_supervisor(config) as sup:
        await sup.send("c", "[[say:hi]]")
        assert await sup.wait_idle("c", timeout=SLOW)
    for folder in (home, home / "tmp"):
        assert mode(folder) == 0o700, folder

    target = short_tmp / "not-the-agents"
    target.write_text("keep")
    other = short_tmp / "other-home"
    (other / ".conf").mkdir(parents=True)
    (other / ".conf").chmod(0o755)
    (other / ".conf" / "loose.json").write_text("old")
    (other / ".conf" / "loose.json").chmod(0o644)
    (other / ".conf" / "planted.json").symlink_to(target)
    launch = Launch(argv=(sys.executable, fake), cwd=str(short_tmp), env={"FAKE_ACP_STATE": str(short_tmp)},
                    files={".conf/loose.json": "{}", ".conf/planted.json": "{}"})
    with pytest.raises(OSError):
        async with open_acp_agent(launch, marker=f"acp-files-{os.getpid()}", home=str(other), start_timeout=SLOW):
            pass
    assert target.read_text() == "keep", "the planted symlink was followed"
    assert mode(other / ".conf") == 0o700 and mode(other / ".conf" / "loose.json") == 0o600
