#!/usr/bin/env python3
"""Capture the real ``qwen`` CLI's output for the adapter tests, offline.

Starts the fake OpenAI Chat Completions server on 127.0.0.1, then runs each scenario with
the launch that ``adapters.qwen`` builds (argv, env, the settings file it asks for), in a
private HOME and TMPDIR under a temp folder, stdin on /dev/null, each run in its own
session. Writes ``tests/data/captures/qwen/NAME.jsonl`` (stdout, byte for byte),
``NAME.stderr.txt`` when stderr said anything, and ``README.md`` describing every run.

Every process a run leaves behind is found by an environment marker and killed (and the
README says so): nothing outlives the script.

Usage: ``.venv/bin/python scripts/capture_qwen.py [--out DIR] [--only NAME ...]``
(requires ``scripts/install-clis.sh`` to have installed qwen).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from adapters._base import TurnRequest  # noqa: E402
from adapters.qwen import ADAPTER  # noqa: E402
from tests.fakemodel.clis import PACKAGES, cli_path  # noqa: E402
from tests.fakemodel.openai_chat import OpenAIChatServer, agent_env  # noqa: E402

OUT = ROOT / "tests" / "data" / "captures" / "qwen"
MARK_VAR = "CORRAL_CAPTURE_MARK"
#: A tool command qwen accepts (it refuses ``sleep N`` and ``sh -c 'sleep N'``) that leaves
#: a real ``sleep`` process to look for.
LONG_TOOL = "python3 -c 'import subprocess; subprocess.run([\"sleep\", \"300\"])'"


@dataclass
class Run:
    """What one scenario did, for the README."""

    name: str
    about: str
    prompt: str
    argv: list[str]
    returncode: int | None = None
    seconds: float = 0.0
    stdout_lines: int = 0
    stderr: str = ""
    notes: list[str] = field(default_factory=list)
    session_id: str | None = None


class Capturer:
    """Runs scenarios against one fake server in one private HOME."""

    def __init__(self, server: OpenAIChatServer, base: Path, out: Path) -> None:
        self.server = server
        self.base = base
        self.home = base / "home"
        self.tmp = base / "home" / "tmp"
        self.work = base / "work"
        self.other = base / "other"
        for d in (self.home, self.tmp, self.work, self.other):
            d.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.qwen = str(cli_path("qwen"))
        self.runs: list[Run] = []

    def shown(self, argv: list[str]) -> str:
        """``argv`` as a shell line, with the install path and temp folder made generic."""
        text = shlex.join(["qwen" if a == self.qwen else a for a in argv])
        return text.replace(str(self.base), "$TMP")

    def turn(
        self,
        name: str,
        about: str,
        prompt: str,
        *,
        session_id: str | None = None,
        unattended: bool = True,
        model: str | None = None,
        options: dict[str, Any] | None = None,
        cwd: Path | None = None,
        interrupt: str | None = None,
    ) -> Run:
        """Run one turn; ``interrupt`` is ``"tool"`` (SIGINT once the tool's ``sleep`` runs)
        or ``"text"`` (SIGINT once the first text delta is out)."""
        request = TurnRequest(
            prompt=prompt,
            channel="capture",
            turn_id=name,
            agent="qwen",
            command=(self.qwen,),
            session_id=session_id,
            model=model,
            cwd=str(cwd or self.work),
            home=str(self.home),
            options=options or {},
            unattended=unattended,
        )
        launch = ADAPTER.build_launch(request)
        for rel, content in launch.files.items():
            path = Path(rel) if os.path.isabs(rel) else self.home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        mark = uuid.uuid4().hex
        env = {
            "PATH": os.environ["PATH"],
            "LANG": "C.UTF-8",
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            **launch.env,
            **agent_env(self.server.url),
            MARK_VAR: mark,
        }
        run = Run(name=name, about=about, prompt=prompt, argv=list(launch.argv))
        started = time.monotonic()
        proc = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        stdout: list[bytes] = []
        stderr: list[bytes] = []
        first_delta = threading.Event()

        def read_out() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                stdout.append(raw)
                if b'"text_delta"' in raw:
                    first_delta.set()

        def read_err() -> None:
            assert proc.stderr is not None
            for raw in proc.stderr:
                stderr.append(raw)

        readers = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
        for t in readers:
            t.start()
        try:
            if interrupt:
                self._interrupt(proc, run, interrupt, first_delta)
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                run.notes.append("did not exit within 180 s: SIGKILL to its group")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            for t in readers:
                t.join()
        run.seconds = time.monotonic() - started
        run.returncode = proc.returncode
        self._sweep(mark, run)

        data = b"".join(stdout)
        (self.out / f"{name}.jsonl").write_bytes(data)
        run.stdout_lines = len(stdout)
        run.stderr = b"".join(stderr).decode("utf-8", "replace")
        err_path = self.out / f"{name}.stderr.txt"
        if run.stderr.strip():
            err_path.write_text(run.stderr)
        elif err_path.exists():
            err_path.unlink()
        for raw in stdout:
            try:
                sid = json.loads(raw).get("session_id")
            except (ValueError, AttributeError):
                continue
            if isinstance(sid, str):
                run.session_id = sid
                break
        self.runs.append(run)
        print(f"{name}: rc={run.returncode} lines={run.stdout_lines} {run.seconds:.1f}s {'; '.join(run.notes)}", flush=True)
        return run

    def _interrupt(self, proc: subprocess.Popen[bytes], run: Run, when: str, first_delta: threading.Event) -> None:
        """Wait for the moment, send SIGINT to the CLI's group, note what happened to the tool."""
        deadline = time.monotonic() + 60
        sleeper: psutil.Process | None = None
        tree: list[psutil.Process] = []
        while time.monotonic() < deadline and proc.poll() is None:
            if when == "text" and first_delta.is_set():
                break
            if when == "tool":
                try:
                    tree = psutil.Process(proc.pid).children(recursive=True)
                except psutil.Error:
                    tree = []
                sleeper = next((p for p in tree if _name(p) == "sleep"), None)
                for p in tree:
                    _NAMES[p.pid] = _name(p)
                    _PGIDS[p.pid] = _pgid(p)
                if sleeper is not None:
                    break
            time.sleep(0.05)
        else:
            run.notes.append("the moment to interrupt never came")
            return
        if sleeper is not None:
            run.notes.append(
                f"tool `sleep` pid {sleeper.pid} in its own session (sid {os.getsid(sleeper.pid)}; CLI pgid {proc.pid})"
            )
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=15)
            run.notes.append(f"exited {time.monotonic() - sent:.2f} s after SIGINT to its group")
        except subprocess.TimeoutExpired:
            run.notes.append("still running 15 s after SIGINT: SIGKILL to its group")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if when == "tool":
            # The CLI is a node wrapper plus an inner node (same group) that owns the tool;
            # the wrapper exits first, so watch the rest die on their own for a while.
            gone: dict[int, float] = {}
            watch_until = time.monotonic() + 5
            while time.monotonic() < watch_until and len(gone) < len(tree):
                for p in tree:
                    if p.pid not in gone and not _alive(p):
                        gone[p.pid] = time.monotonic() - sent
                time.sleep(0.01)
            for p in tree:
                when_gone = f"gone {gone[p.pid]:.2f} s after SIGINT" if p.pid in gone else "STILL ALIVE 5 s after SIGINT"
                run.notes.append(f"{_name(p)} pid {p.pid} (pgid {'CLI' if _pgid(p) == proc.pid else 'own'}): {when_gone}")

    def _sweep(self, mark: str, run: Run) -> None:
        """Kill every process of this run still around (found by its environment marker)."""
        leftovers = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(MARK_VAR) == mark:
                    leftovers.append(p)
            except psutil.Error:
                continue
        if not leftovers:
            run.notes.append("no process of the run left once it exited")
        for p in leftovers:
            run.notes.append(f"left behind after exit: {_name(p)} {' '.join(p.cmdline())!r} (killed)")
            try:
                p.kill()
            except psutil.Error:
                pass

    def requests_since(self, count: int) -> list[Any]:
        """The main-agent chat requests the server got after the first ``count``."""
        return [
            r
            for r in self.server.requests[count:]
            if isinstance(r.body, dict) and r.path.startswith("/v1/chat/completions")
        ]


_NAMES: dict[int, str] = {}
_PGIDS: dict[int, int | None] = {}


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return _NAMES.get(p.pid, "?")


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return _PGIDS.get(p.pid)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _roles(req: Any) -> list[str]:
    """A compact view of a request's conversation: role, plus the tool called or answered."""
    out = []
    for m in req.body.get("messages", []):
        role = m.get("role")
        if m.get("tool_calls"):
            role += "(" + ",".join(c["function"]["name"] for c in m["tool_calls"]) + ")"
        out.append(role)
    return out


def scenarios(c: Capturer, only: set[str] | None) -> None:
    """Every capture, in an order where resumes follow the turns they resume."""

    def want(name: str) -> bool:
        return not only or name in only

    text = None
    if want("text") or want("resume") or want("stale_cwd"):
        text = c.turn("text", "a plain text turn (partial messages on, the adapter's default)",
                      "Say hello. [[say:Hello from the fake model.]]")
    if want("text_no_partial"):
        c.turn("text_no_partial", "a plain text turn with option partial_messages=false",
               "Say hello. [[say:Hello without partial messages.]]", options={"partial_messages": False})
    if want("resume") and text and text.session_id:
        before = len(c.server.requests)
        run = c.turn("resume", "second turn resuming the `text` session",
                     "And again? [[say:Still here on the second turn.]]", session_id=text.session_id)
        reqs = c.requests_since(before)
        if reqs:
            users = [str(m.get("content")) for m in reqs[0].body["messages"] if m.get("role") == "user"]
            carried = any("Say hello." in u for u in users)
            run.notes.append(f"first request carried the earlier turn: {carried}; roles {_roles(reqs[0])}")
    if want("tool"):
        c.turn("tool", "a shell tool turn", "Run it. [[shell:echo hello-from-tool]] [[say:The command printed hello-from-tool.]]")
    if want("todos"):
        c.turn("todos", "the model calls todo_write first", "Plan it. [[todos]] [[say:Plan made.]]")
    interrupted = None
    if want("interrupt_tool") or want("resume_after_interrupt"):
        interrupted = c.turn("interrupt_tool", "SIGINT to the CLI's process group while the tool sleeps",
                             f"Wait a while. [[shell:{LONG_TOOL}]] [[say:Never said.]]", interrupt="tool")
    if want("resume_after_interrupt") and interrupted and interrupted.session_id:
        before = len(c.server.requests)
        run = c.turn("resume_after_interrupt", "resuming the interrupted session",
                     "Are you back? [[say:Back after the stop.]]", session_id=interrupted.session_id)
        reqs = c.requests_since(before)
        if reqs:
            run.notes.append(f"first request's conversation: {_roles(reqs[0])}")
    if want("interrupt_text"):
        c.turn("interrupt_text", "SIGINT to the group while the answer streams (partial messages on)",
               "Tell a long story. [[say:This long answer is streamed slowly so that it can be stopped half way through.]] [[slow:30]]",
               interrupt="text")
    if want("error_400"):
        c.server.fail_status = 400
        try:
            c.turn("error_400", "the model API answers every chat request with HTTP 400", "Fail please. [[say:unused]]")
        finally:
            c.server.fail_status = None
    if want("stale_session"):
        c.turn("stale_session", "--resume with a well-formed session id qwen does not have",
               "Resume nothing. [[say:unused]]", session_id="00000000-0000-4000-8000-000000000000")
    if want("stale_title"):
        c.turn("stale_title", "--resume with a value that is not a UUID (qwen then looks it up as a title)",
               "Resume nothing. [[say:unused]]", session_id="not-a-session")
    if want("stale_cwd") and text and text.session_id:
        c.turn("stale_cwd", "--resume of the `text` session from another working directory",
               "Resume from elsewhere. [[say:unused]]", session_id=text.session_id, cwd=c.other)
    if want("denied"):
        c.turn("denied", "unattended=false (no --yolo): headless qwen declines the shell tool",
               "Run it. [[shell:echo should-not-run]] [[say:Could not run it.]]", unattended=False)
    if want("model"):
        before = len(c.server.requests)
        run = c.turn("model", "request.model set: --model other-model", "Which model? [[say:A fake one.]]", model="other-model")
        run.notes.append(f"model the server saw: {sorted({r.body.get('model') for r in c.requests_since(before)})}")
    if want("dash_prompt"):
        c.turn("dash_prompt", "a prompt that starts with a dash (passed after --)", "--help me [[say:Dashes reach the model.]]")
    if want("bg_nohup"):
        c.turn("bg_nohup", "a normal turn whose tool starts `nohup sleep 300 &`",
               "Start it. [[shell:nohup sleep 300 > /dev/null 2>&1 & echo started]] [[say:Started it.]]")
    if want("bg_setsid"):
        c.turn("bg_setsid", "a normal turn whose tool starts `setsid nohup sleep 300 &`",
               "Start it. [[shell:setsid nohup sleep 300 > /dev/null 2>&1 & echo started]] [[say:Started it.]]")


def write_readme(c: Capturer, version: str) -> None:
    """Describe every capture in the output folder's README."""
    lines = [
        "# qwen captures",
        "",
        f"Real stdout of Qwen Code {version} (`{PACKAGES['qwen']}`), run offline against",
        "`tests/fakemodel/openai_chat.py` on 127.0.0.1 by `scripts/capture_qwen.py` (rerun it to",
        "regenerate: `.venv/bin/python scripts/capture_qwen.py`). Each run used the launch",
        "`adapters/qwen.py` builds (argv below, its env and `~/.qwen/settings.json`) plus",
        "`agent_env()` (OPENAI_API_KEY, OPENAI_BASE_URL, OPENAI_MODEL=fake-qwen), a private",
        "HOME and TMPDIR, stdin /dev/null, its own session. `NAME.jsonl` is stdout byte for",
        "byte; `NAME.stderr.txt` is stderr when there was any. The prompt markers are those of",
        "`tests/fakemodel/script.py`. `$TMP` is the run's temp folder.",
        "",
        "Measured by hand with the same server, not captured here: with HTTP 500 qwen retries",
        "for about 105 s (28 requests) and then prints the same `[API Error: 500 …]` text and a",
        "`success` result, exit status 0, like `error_400`. Background processes started by a",
        "tool (`bg_nohup`, `bg_setsid`) were usually killed by qwen (it SIGKILLs the tool's pty",
        "process group) but not always: some runs left `sleep 300` behind, so the supervisor's",
        "own sweep is still needed.",
        "",
    ]
    for run in c.runs:
        lines += [
            f"## {run.name}",
            "",
            run.about + ".",
            "",
            f"- argv: `{c.shown(run.argv)}`",
            f"- exit status: {run.returncode}" + (" (killed by a signal)" if (run.returncode or 0) < 0 else ""),
            f"- stdout lines: {run.stdout_lines}; took {run.seconds:.1f} s",
        ]
        if run.stderr.strip():
            first = run.stderr.strip().splitlines()[0]
            lines.append(f"- stderr (first line): `{first}`")
        for note in run.notes:
            lines.append(f"- {note}")
        lines.append("")
    (c.out / "README.md").write_text("\n".join(lines))


def main() -> int:
    """Run the scenarios and write the captures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="*", help="run only these scenarios (README lists just them)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(
        [str(cli_path("qwen")), "--version"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="corral-qwen-capture-") as tmp, OpenAIChatServer() as server:
        capturer = Capturer(server, Path(tmp), args.out)
        scenarios(capturer, set(args.only) if args.only else None)
        write_readme(capturer, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
