#!/usr/bin/env python3
"""Capture the real ``qwen`` CLI's output for the adapter tests, offline.

Starts the fake OpenAI Chat Completions server on 127.0.0.1, then runs each scenario with
the launch that ``adapters.qwen`` builds (argv, env, the settings file it asks for), in a
private HOME and TMPDIR under a temp folder, stdin on /dev/null, each run in its own
session. Writes ``tests/data/captures/qwen/NAME.jsonl`` (stdout, byte for byte),
``NAME.stderr.txt`` when stderr said anything, and ``README.md`` describing every run.

Every process a run leaves behind is found by an environment marker and killed (and the
README says so): nothing outlives the script.

Usage, from the repository root: ``.venv/bin/python -m scripts.capture_qwen [--out DIR] [--only NAME ...]``
(requires ``scripts/install-clis.sh`` to have installed qwen).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from adapters._base import TurnRequest
from adapters.qwen import ADAPTER
from scripts._capture import (
    Interrupt,
    Running,
    cli_version,
    descendants,
    new_mark,
    run_turn,
    turn_env,
    write_files,
    write_output,
)
from scripts.fakemodel.clis import PACKAGES, cli_path
from scripts.fakemodel.openai_chat import OpenAIChatServer, agent_env

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "captures" / "qwen"
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


class ToolWatch:
    """Interrupts once the tool's ``sleep`` runs, then watches the CLI's tree die.

    The CLI is a node wrapper plus an inner node (same group) that owns the tool; the
    wrapper exits first, so after its exit the rest is watched for a while, to tell what
    dies on its own from what the supervisor's sweep must kill.
    """

    def __init__(self) -> None:
        self.tree: list[psutil.Process] = []
        self.names: dict[int, str] = {}
        self.pgids: dict[int, int | None] = {}

    def __call__(self, running: Running) -> bool:
        """Whether the tool's ``sleep`` runs (remembering the tree as it is)."""
        self.tree = descendants(running.proc.pid)
        for p in self.tree:
            self.names[p.pid] = self.name(p)
            self.pgids[p.pid] = self.pgid(p)
        sleeper = next((p for p in self.tree if self.name(p) == "sleep"), None)
        if sleeper is None:
            return False
        running.notes.append(
            f"tool `sleep` pid {sleeper.pid} in its own session "
            f"(sid {os.getsid(sleeper.pid)}; CLI pgid {running.proc.pid})"
        )
        return True

    def after_exit(self, running: Running, sent: float) -> None:
        """Note when each process of the tree went, up to 5 s after the SIGINT's effect."""
        gone: dict[int, float] = {}
        watch_until = time.monotonic() + 5
        while time.monotonic() < watch_until and len(gone) < len(self.tree):
            for p in self.tree:
                if p.pid not in gone and not _alive(p):
                    gone[p.pid] = time.monotonic() - sent
            time.sleep(0.01)
        for p in self.tree:
            when_gone = f"gone {gone[p.pid]:.2f} s after SIGINT" if p.pid in gone else "STILL ALIVE 5 s after SIGINT"
            group = "CLI" if self.pgid(p) == running.proc.pid else "own"
            running.notes.append(f"{self.name(p)} pid {p.pid} (pgid {group}): {when_gone}")

    def name(self, p: psutil.Process) -> str:
        """The process's name, or the one remembered once it is gone."""
        try:
            return str(p.name())
        except psutil.Error:
            return self.names.get(p.pid, "?")

    def pgid(self, p: psutil.Process) -> int | None:
        """The process's group, or the one remembered once it is gone."""
        try:
            return os.getpgid(p.pid)
        except OSError:
            return self.pgids.get(p.pid)


def _first_delta(running: Running) -> bool:
    """Once the first text delta of the answer is out."""
    return any('"text_delta"' in line for line in running.stdout)


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
        write_files(self.home, launch.files)
        env = turn_env(self.home, self.tmp, launch, new_mark(), agent_env(self.server.url))
        watch = ToolWatch() if interrupt == "tool" else None
        when: Interrupt | None = watch if watch is not None else (_first_delta if interrupt == "text" else None)
        c = run_turn(
            launch, env, interrupt=when, grace=15, after_exit=watch.after_exit if watch else None, timeout=180
        )
        run = Run(name=name, about=about, prompt=prompt, argv=list(launch.argv), returncode=c.returncode)
        run.seconds = c.seconds
        run.notes = list(c.notes)
        if c.exited_after is not None:
            run.notes.append(f"exited {c.exited_after:.2f} s after SIGINT to its group")
        if c.survivors:
            run.notes += [f"left behind after exit: {s} (killed)" for s in c.survivors]
        else:
            run.notes.append("no process of the run left once it exited")
        write_output(self.out, name, c.stdout_bytes, c.stderr, stderr_suffix=".stderr.txt", keep_empty=False)
        run.stdout_lines = len(c.stdout)
        run.stderr = c.stderr
        for line in c.stdout:
            try:
                sid = json.loads(line).get("session_id")
            except (ValueError, AttributeError):
                continue
            if isinstance(sid, str):
                run.session_id = sid
                break
        self.runs.append(run)
        notes = "; ".join(run.notes)
        print(f"{name}: rc={run.returncode} lines={run.stdout_lines} {run.seconds:.1f}s {notes}", flush=True)
        return run

    def requests_since(self, count: int) -> list[Any]:
        """The main-agent chat requests the server got after the first ``count``."""
        return [
            r
            for r in self.server.requests[count:]
            if isinstance(r.body, dict) and r.path.startswith("/v1/chat/completions")
        ]


def _alive(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
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
        c.turn("tool", "a shell tool turn",
               "Run it. [[shell:echo hello-from-tool]] [[say:The command printed hello-from-tool.]]")
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
               "Tell a long story. [[say:This long answer is streamed slowly so that it can be stopped"
               " half way through.]] [[slow:30]]",
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
        run = c.turn("model", "request.model set: --model other-model", "Which model? [[say:A fake one.]]",
                     model="other-model")
        run.notes.append(f"model the server saw: {sorted({r.body.get('model') for r in c.requests_since(before)})}")
    if want("dash_prompt"):
        c.turn("dash_prompt", "a prompt that starts with a dash (passed after --)",
               "--help me [[say:Dashes reach the model.]]")
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
        "`scripts/fakemodel/openai_chat.py` on 127.0.0.1 by `scripts/capture_qwen.py` (rerun it to",
        "regenerate: `.venv/bin/python -m scripts.capture_qwen`). Each run used the launch",
        "`adapters/qwen.py` builds (argv below, its env and `~/.qwen/settings.json`) plus",
        "`agent_env()` (OPENAI_API_KEY, OPENAI_BASE_URL, OPENAI_MODEL=fake-qwen), a private",
        "HOME and TMPDIR, stdin /dev/null, its own session. `NAME.jsonl` is stdout byte for",
        "byte; `NAME.stderr.txt` is stderr when there was any. The prompt markers are those of",
        "`scripts/fakemodel/script.py`. `$TMP` is the run's temp folder.",
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="*", help="run only these scenarios (README lists just them)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    version = cli_version(cli_path("qwen"))
    with tempfile.TemporaryDirectory(prefix="corral-qwen-capture-") as tmp, OpenAIChatServer() as server:
        capturer = Capturer(server, Path(tmp), args.out)
        scenarios(capturer, set(args.only) if args.only else None)
        write_readme(capturer, version)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
