"""What the ``capture_*`` scripts share: run one turn of a real CLI and record what it did.

Each capture script runs a CLI installed by ``scripts/install-clis.sh`` offline, against a
fake model server from ``scripts/fakemodel``, with the launch the CLI's adapter builds, so the
captures show exactly what corral runs. This module holds everything that is not about one
CLI:

* :class:`Place`: a private HOME, TMPDIR and working directory under a temp root;
* :func:`turn_env`: the environment a turn gets (what the supervisor provides, the
  adapter's additions, the agent's configuration, and a marker every process inherits);
* :func:`run_turn`: spawn the launch in its own session, read stdout and stderr, send
  SIGINT to the process group once an ``interrupt`` condition holds, bound the run by a
  timeout, then find the turn's processes still alive by their marker, describe them and
  kill them by pid (:func:`sweep`), so nothing outlives the script;
* :func:`write_output` and :func:`display_argv`: the capture files and the argv as the
  READMEs show it.

Run the scripts from the repository root as modules (``python -m scripts.capture_claude``):
``scripts.fakemodel`` and this module then import normally.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from adapters._base import Launch, TurnRequest
from scripts._bench import marker_processes

#: Environment variable every process of a captured turn inherits, to find leftovers.
MARK_VAR = "CORRAL_CAPTURE_MARK"

#: How often an interrupt condition is checked while the turn runs.
POLL = 0.05


@dataclass(frozen=True)
class Place:
    """A private HOME, TMPDIR and working directory under ``root``, shared by the turns of
    one conversation (the CLIs resume a session only from the same HOME and cwd)."""

    root: Path

    @property
    def home(self) -> Path:
        """The CLI's HOME."""
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        """The CLI's TMPDIR."""
        return self.root / "tmp"

    @property
    def cwd(self) -> Path:
        """The fixed working directory."""
        return self.root / "work"

    def make(self) -> Place:
        """Create the folders; returns self."""
        for path in (self.home, self.tmp, self.cwd):
            path.mkdir(parents=True, exist_ok=True)
        return self


def write_files(home: Path, files: Mapping[str, str]) -> None:
    """Write a launch's private files (absolute, or relative to HOME), as the supervisor does."""
    for rel, content in files.items():
        path = Path(rel) if os.path.isabs(rel) else home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def new_mark() -> str:
    """A fresh value for :data:`MARK_VAR`, one per turn."""
    return uuid.uuid4().hex


def turn_env(
    home: Path, tmp: Path, launch: Launch, mark: str, *extra: Mapping[str, str]
) -> dict[str, str]:
    """What the supervisor provides (PATH, LANG, HOME, TMPDIR), the adapter's additions, the
    agent's configuration (``extra``, e.g. the fake server's ``agent_env``), and the marker."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        **launch.env,
    }
    for more in extra:
        env.update(more)
    env[MARK_VAR] = mark
    return env


# ---------------------------------------------------------------- processes


def marked_processes(mark: str) -> list[psutil.Process]:
    """Live (not zombie) processes whose environment carries ``MARK_VAR=mark`` (a fresh uuid:
    no other program's, whatever its HOME)."""
    found = []
    for pid, _, _ in marker_processes(None, {mark}, variable=MARK_VAR):
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def describe(proc: psutil.Process, *, width: int | None = None) -> str:
    """``pid cmdline (pgid P, sid S)`` of a process, for a report; a long command line is cut
    to its start and end when ``width`` is given."""
    try:
        command = " ".join(" ".join(proc.cmdline()).split())
        where = f" (pgid {os.getpgid(proc.pid)}, sid {os.getsid(proc.pid)})"
    except (psutil.Error, ProcessLookupError):
        return f"{proc.pid} (gone)"
    if width is not None and len(command) > width:
        half = (width - 3) // 2
        command = command[:half] + " … " + command[-half:]
    return f"{proc.pid} {command}{where}"


def sweep(mark: str, *, width: int | None = None) -> list[str]:
    """Describe, then SIGKILL by pid, every process of the turn still alive; returns the descriptions."""
    left = marked_processes(mark)
    described = [describe(p, width=width) for p in left]
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5)
    return described


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Signal a process group; False when it is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def descendants(pid: int) -> list[psutil.Process]:
    """The process's descendants now (empty once it is gone)."""
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def find_process(mark: str, needle: str, timeout: float = 0.0, *, name: str | None = None) -> psutil.Process | None:
    """The marked process whose command line contains ``needle`` (and called ``name``, if
    given: not the shell wrapping it), waiting up to ``timeout`` seconds (0: look once)."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in marked_processes(mark):
            try:
                if needle in " ".join(proc.cmdline()) and (name is None or proc.name() == name):
                    return proc
            except psutil.Error:
                continue
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL)


# ---------------------------------------------------------------- one turn


@dataclass
class Running:
    """A turn while it runs, as an interrupt condition sees it."""

    proc: subprocess.Popen[bytes]
    mark: str
    stdout: list[str] = field(default_factory=list)
    """The stdout lines so far (without newlines)."""
    notes: list[str] = field(default_factory=list)
    """What the condition wants the report to say (e.g. the tool it saw running)."""


#: Decides, from the turn so far, that now is the moment to send SIGINT.
Interrupt = Callable[[Running], bool]


@dataclass
class Captured:
    """What one turn printed, how it ended and what it left behind."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: list[str]
    stdout_bytes: bytes
    stderr: str
    seconds: float
    interrupted: bool = False
    exited_after: float | None = None
    """Seconds from the SIGINT to the CLI's exit, when it was interrupted."""
    survivors: list[str] = field(default_factory=list)
    """Processes of the turn alive after it ended (described, then killed)."""
    notes: list[str] = field(default_factory=list)


def run_turn(
    launch: Launch,
    env: Mapping[str, str],
    *,
    interrupt: Interrupt | None = None,
    interrupt_within: float = 60.0,
    grace: float | None = None,
    after_exit: Callable[[Running, float], None] | None = None,
    timeout: float = 120.0,
    width: int | None = None,
) -> Captured:
    """Run one turn of a CLI like the supervisor does, and capture it.

    The process gets its own session, stdin ``/dev/null`` (or a pipe with ``launch.stdin``,
    then closed). With ``interrupt``, SIGINT goes to its process group the first time the
    condition holds (checked on every stdout line and every :data:`POLL` seconds, for at most
    ``interrupt_within`` seconds); with ``grace``, the group is SIGKILLed that many seconds
    after the SIGINT if the CLI is still running, and ``after_exit(running, sent)`` may then
    watch what the CLI left (before the sweep). After ``timeout`` seconds the group is
    SIGKILLed: a hung CLI must not hang the script. Whatever of the turn is still alive
    afterwards is described in ``survivors`` and killed by pid.
    """
    mark = env[MARK_VAR]
    started = time.monotonic()
    proc = subprocess.Popen(
        launch.argv,
        cwd=launch.cwd,
        env=dict(env),
        stdin=subprocess.PIPE if launch.stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    if launch.stdin is not None:
        assert proc.stdin is not None
        proc.stdin.write(launch.stdin)
        proc.stdin.close()
    running = Running(proc, mark)
    raw_out: list[bytes] = []
    raw_err: list[bytes] = []
    line_seen = threading.Event()

    def read_out() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            raw_out.append(raw)
            running.stdout.append(raw.decode("utf-8", "replace").rstrip("\n"))
            line_seen.set()

    def read_err() -> None:
        assert proc.stderr is not None
        raw_err.append(proc.stderr.read())

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    timer = threading.Timer(timeout, signal_group, (proc.pid, signal.SIGKILL))
    timer.start()
    captured = Captured(launch.argv, None, [], b"", "", 0.0)
    try:
        if interrupt is not None:
            sent = _interrupt(running, interrupt, interrupt_within, line_seen)
            if sent is None:
                captured.notes.append("the moment to interrupt never came")
            else:
                captured.interrupted = True
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    captured.notes.append(f"still running {grace:g} s after SIGINT: SIGKILL to its group")
                    signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
                captured.exited_after = time.monotonic() - sent
                if after_exit is not None:
                    after_exit(running, sent)
        captured.returncode = proc.wait()
    finally:
        timer.cancel()
    for reader in readers:
        reader.join()
    captured.seconds = time.monotonic() - started
    if captured.returncode == -signal.SIGKILL and not captured.interrupted:
        captured.notes.append(f"killed after {timeout:.0f} s")
    captured.stdout = running.stdout
    captured.stdout_bytes = b"".join(raw_out)
    captured.stderr = b"".join(raw_err).decode("utf-8", "replace")
    captured.notes[:0] = running.notes
    captured.survivors = sweep(mark, width=width)
    return captured


@dataclass
class Run:
    """One turn of a real CLI, as captured, by the name its capture files take."""

    name: str
    captured: Captured
    note: str = ""


@dataclass
class CliSession:
    """Turns of one real CLI in one :class:`Place` against one fake server, each as the
    supervisor runs it: the request it would build, the adapter's launch, the launch's files
    written, the turn's environment with a fresh marker, then :func:`run_turn`.

    ``env``: the agent's configuration (the fake server's ``agent_env``); ``options`` and
    ``model`` go in every request unless a request names its own model."""

    place: Place
    agent: str
    build_launch: Callable[[TurnRequest], Launch]
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, object] = field(default_factory=dict)
    model: str | None = None
    timeout: float = 120.0

    def request(
        self, prompt: str, session_id: str | None = None, *, turn_id: str | None = None, model: str | None = None,
        args: tuple[str, ...] = (), unattended: bool = True, cwd: Path | None = None,
    ) -> TurnRequest:
        """A turn request as the supervisor would build it (in the place's cwd unless ``cwd``)."""
        return TurnRequest(
            prompt=prompt, channel="capture", turn_id=turn_id or uuid.uuid4().hex, agent=self.agent,
            command=self.command, args=args, session_id=session_id, cwd=str(cwd or self.place.cwd),
            home=str(self.place.home), options=dict(self.options), model=model or self.model, unattended=unattended,
        )

    def run(
        self, request: TurnRequest, *, interrupt: Interrupt | None = None, env: Mapping[str, str] | None = None,
        width: int | None = None,
    ) -> Captured:
        """Spawn one turn like the supervisor does and capture everything it prints (``env``:
        more of the agent's configuration, for this turn)."""
        launch = self.build_launch(request)
        write_files(self.place.home, launch.files)
        environment = turn_env(self.place.home, self.place.tmp, launch, new_mark(), self.env, env or {})
        return run_turn(launch, environment, interrupt=interrupt, timeout=self.timeout, width=width)

    def take(self, name: str, request: TurnRequest, *, interrupt: Interrupt | None = None, note: str = "") -> Run:
        """:meth:`run`, the capture named ``name`` (with a ``note`` for the README)."""
        return Run(name, self.run(request, interrupt=interrupt), note)


def _interrupt(running: Running, interrupt: Interrupt, within: float, line_seen: threading.Event) -> float | None:
    """Wait for the condition, then SIGINT the group; the time it was sent, or None."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and running.proc.poll() is None:
        if interrupt(running):
            sent = time.monotonic()
            signal_group(running.proc.pid, signal.SIGINT)
            return sent
        line_seen.wait(POLL)
        line_seen.clear()
    return None


# ---------------------------------------------------------------- conditions


def on_line(predicate: Callable[[dict[str, object]], bool]) -> Interrupt:
    """A condition that holds once a stdout line is a JSON object matching ``predicate``."""
    checked = 0

    def condition(running: Running) -> bool:
        nonlocal checked
        lines = running.stdout[checked:]
        checked += len(lines)
        for line in lines:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and predicate(obj):
                return True
        return False

    return condition


def after(first: Interrupt, then: Interrupt) -> Interrupt:
    """A condition that holds once ``then`` holds, checked only after ``first`` has held."""
    held = False

    def condition(running: Running) -> bool:
        nonlocal held
        held = held or first(running)
        return held and then(running)

    return condition


def process_running(needle: str, *, name: str | None = None) -> Interrupt:
    """A condition that holds once a process of the turn whose command line contains
    ``needle`` (called ``name``, if given) is alive: the tool, which starts just after the
    CLI reports the call."""

    def condition(running: Running) -> bool:
        proc = find_process(running.mark, needle, name=name)
        if proc is not None:
            running.notes.append(f"tool running at SIGINT: {describe(proc)}")
        return proc is not None

    return condition


def child_named(name: str) -> Interrupt:
    """A condition that holds once a descendant of the CLI called ``name`` runs (the tool)."""

    def condition(running: Running) -> bool:
        kids = [p for p in descendants(running.proc.pid) if _name(p) == name]
        if kids:
            running.notes.append("tool running when interrupted: " + ", ".join(f"`{describe(p)}`" for p in kids))
        return bool(kids)

    return condition


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return "?"


# ---------------------------------------------------------------- output


def cli_version(binary: Path) -> str:
    """What ``binary --version`` prints, in a throwaway HOME."""
    import tempfile

    done = subprocess.run(
        [str(binary), "--version"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={"PATH": os.environ.get("PATH", ""), "HOME": tempfile.gettempdir()},
        timeout=60,
    )
    return str(done.stdout).strip()


def write_output(out: Path, name: str, stdout: bytes, stderr: str, *, stderr_suffix: str, keep_empty: bool) -> None:
    """Write ``NAME.jsonl`` (stdout, byte for byte) and ``NAME<stderr_suffix>``; an empty stderr
    is written only with ``keep_empty`` (otherwise a stale file of an earlier run is removed)."""
    (out / f"{name}.jsonl").write_bytes(stdout)
    err = out / f"{name}{stderr_suffix}"
    if stderr.strip() or keep_empty:
        err.write_text(stderr)
    elif err.exists():
        err.unlink()


def display_argv(argv: tuple[str, ...] | list[str], name: str, root: Path | str, shown_as: str) -> str:
    """The argv as a shell line, with the installed binary shown as ``name`` and the temp
    ``root`` as ``shown_as`` (so a README does not depend on where the run happened)."""
    return shlex.join([name, *argv[1:]]).replace(str(root), shown_as)
