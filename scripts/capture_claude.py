#!/usr/bin/env python3
"""Capture the real ``claude`` CLI's stdout/stderr against the fake Anthropic server.

Each scenario runs the CLI installed by ``scripts/install-clis.sh`` offline: a fake model
server on 127.0.0.1, a private HOME, TMPDIR and working directory under a temp folder,
stdin = /dev/null, the CLI in its own session. The captures land in
``tests/data/captures/claude/`` (``NAME.jsonl`` = stdout, ``NAME.stderr`` = stderr when not
empty) together with a ``README.md`` that says how each was made and what was measured.

Every process the CLI starts inherits a marker variable; after each turn the script lists
the marked processes still alive (tools that outlived the turn), reports them and kills
them by pid.

Usage: ``.venv/bin/python scripts/capture_claude.py [--out DIR] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from adapters._base import TurnRequest  # noqa: E402
from adapters.claude import build_launch  # noqa: E402
from tests.fakemodel.anthropic import FakeAnthropicServer, agent_env  # noqa: E402
from tests.fakemodel.clis import PACKAGES, cli_path  # noqa: E402

#: Environment variable every process of a captured turn inherits, to find leftovers.
MARK = "CORRAL_CAPTURE_MARK"


@dataclass
class Turn:
    """One CLI run of a scenario."""

    name: str
    prompt: str
    resume: str | None = None
    """``"previous"``: the session id of the previous turn; any other string: used as is."""
    args: tuple[str, ...] = ()
    """The agent's extra ``args`` (TurnRequest.args)."""
    model: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    unattended: bool = True
    interrupt_on: str | None = None
    """Send SIGINT to the CLI's group once a descendant with this name runs; ``"text"``: once
    the first piece of the answer has been sent; ``"stream"``: once a model stream is open."""
    cwd: str = "work"
    """Working directory, relative to the scenario's root."""


@dataclass
class Scenario:
    """Turns sharing one HOME and one fake server."""

    name: str
    about: str
    turns: list[Turn]
    fail_status: int | None = None
    check: Callable[[FakeAnthropicServer, list["Outcome"]], list[str]] | None = None


@dataclass
class Outcome:
    """What one turn did."""

    turn: Turn
    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    session_id: str | None
    survivors: list[str]
    tool_seen: list[str]
    notes: list[str] = field(default_factory=list)


def session_of(stdout: str) -> str | None:
    """The session id of the first line that names one."""
    for line in stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("session_id"), str):
            return obj["session_id"]
    return None


def marked_processes(mark: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``MARK=mark``."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def describe(proc: psutil.Process) -> str:
    """``pid cmdline (pgid, sid)`` of a process, for the report."""
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())} (pgid {os.getpgid(proc.pid)}, sid {os.getsid(proc.pid)})"
    except (psutil.NoSuchProcess, ProcessLookupError):
        return f"{proc.pid} (gone)"


def kill_by_pid(procs: list[psutil.Process]) -> None:
    """SIGKILL each process by pid and reap what we can."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)


def run_turn(server: FakeAnthropicServer, root: Path, turn: Turn, session: str | None) -> Outcome:
    """Run the CLI once and return what it printed and left behind."""
    home, tmp, cwd = root / "home", root / "tmp", root / turn.cwd
    for d in (home, tmp, cwd):
        d.mkdir(parents=True, exist_ok=True)
    mark = uuid.uuid4().hex
    # The launch is the adapter's own, so the captures show what corral will run.
    launch = build_launch(TurnRequest(
        prompt=turn.prompt, channel="capture", turn_id=turn.name, agent="claude",
        command=(str(cli_path("claude")),), args=turn.args, session_id=session, model=turn.model,
        cwd=str(cwd), home=str(home), unattended=turn.unattended))
    # What the supervisor provides (a scrubbed env, HOME, TMPDIR), the adapter's additions,
    # then the agent's configuration: the server, and the scenario's extras.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        MARK: mark,
        **launch.env,
        **agent_env(server.url),
        **turn.env,
    }
    argv = list(launch.argv)
    started = time.monotonic()
    pieces_before, streams_before = server.text_pieces_sent, server.streams_started
    proc = subprocess.Popen(argv, env=env, cwd=launch.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    tool_seen: list[str] = []
    notes: list[str] = []
    try:
        if turn.interrupt_on:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                if turn.interrupt_on == "text":
                    # Mid-answer: the first piece of a [[slow]] answer has gone out.
                    if server.text_pieces_sent > pieces_before:
                        break
                elif turn.interrupt_on == "stream":
                    # The model call is open (for [[silent]]: headers sent, then nothing).
                    if server.streams_started > streams_before:
                        break
                else:
                    kids = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == turn.interrupt_on]
                    if kids:
                        tool_seen = [describe(p) for p in kids]
                        break
                time.sleep(0.05)
            else:
                notes.append("the interrupt condition never came")
            if proc.poll() is None:
                sent = time.monotonic()
                os.killpg(proc.pid, signal.SIGINT)
                notes.append(f"SIGINT sent to the CLI's process group (CLI pid = pgid = sid = {proc.pid})")
        stdout, stderr = proc.communicate(timeout=120)
        if turn.interrupt_on:
            notes.append(f"exited {time.monotonic() - sent:.2f} s after SIGINT")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        notes.append("timed out; SIGKILLed")
    seconds = time.monotonic() - started
    survivors = marked_processes(mark)
    described = [describe(p) for p in survivors]
    kill_by_pid(survivors)
    return Outcome(turn, argv, proc.returncode, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"),
                   seconds, session_of(stdout.decode("utf-8", "replace")), described, tool_seen, notes)


# ---------------------------------------------------------------- checks


def _carried(server: FakeAnthropicServer, outcomes: list[Outcome], word: str) -> list[str]:
    """Whether the last model call of the last turn carried ``word`` from an earlier turn."""
    last = [r for r in server.requests if isinstance(r.body, dict) and r.body.get("tools")][-1]
    carried = word in json.dumps(last.body.get("messages"))
    return [f"the resumed turn's request carried the earlier conversation ({word!r}): {carried}"]


def _model_check(server: FakeAnthropicServer, outcomes: list[Outcome]) -> list[str]:
    models = sorted({str(r.body.get("model")) for r in server.requests if isinstance(r.body, dict)})
    return [f"models requested: {', '.join(models)}"]


def _same_session(server: FakeAnthropicServer, outcomes: list[Outcome]) -> list[str]:
    ids = [o.session_id for o in outcomes]
    return [f"session ids per turn: {ids}"] + _carried(server, outcomes, "sleep 300")


SCENARIOS: list[Scenario] = [
    Scenario("text", "a plain text turn", [Turn("text", "Say hello. [[say:Hello from the fake model.]]")]),
    Scenario("model", "a text turn with --model", [
        Turn("model", "Which model? [[say:A small one.]]", model="claude-haiku-4-5")], check=_model_check),
    Scenario("args-dash", "variadic args (--allowedTools Bash Read) and a prompt that starts with '-'", [
        Turn("args-dash", "- starts with a dash [[say:Dash prompt understood.]]", args=("--allowedTools", "Bash", "Read"))]),
    Scenario("resume", "two turns: the second resumes the first's session id", [
        Turn("resume-1", "Remember the word pineapple. [[say:I will remember pineapple.]]"),
        Turn("resume-2", "Which word? [[say:The word was pineapple.]]", resume="previous"),
    ], check=lambda s, o: [f"session ids per turn: {[x.session_id for x in o]}"] + _carried(s, o, "pineapple")),
    Scenario("tool", "a turn that runs a shell command", [
        Turn("tool", "Run it. [[shell:echo hello-from-tool]] [[say:The command printed hello-from-tool.]]")]),
    Scenario("tool-error", "a shell command that fails (non-zero exit)", [
        Turn("tool-error", "Run it. [[shell:echo partial; ls /no/such/dir]] [[say:The command failed.]]")]),
    Scenario("todos", "a TodoWrite plan, then the answer", [
        Turn("todos", "Plan the work. [[todos]] [[say:Plan written.]]")]),
    Scenario("interrupted", "SIGINT to the CLI's group while the tool sleeps, then a resume", [
        Turn("interrupted", "Wait a while. [[shell:sleep 300]] [[say:Finished waiting.]]", interrupt_on="sleep"),
        Turn("interrupted-resume", "Carry on. [[say:Resumed after the stop.]]", resume="previous"),
    ], check=_same_session),
    Scenario("interrupted-tree", "SIGINT to the CLI's group while the tool has a background child and a detached one", [
        Turn("interrupted-tree", "Wait a while. [[shell:sleep 301 & (setsid sleep 302 &); sleep 300]] [[say:Finished waiting.]]",
             interrupt_on="sleep"),
    ]),
    Scenario("interrupted-text", "SIGINT to the CLI's group while the answer streams slowly", [
        Turn("interrupted-text", "Talk slowly. [[slow:30]] [[say:one two three four five six seven eight nine ten]]",
             interrupt_on="text")]),
    Scenario("interrupted-silent", "SIGINT to the CLI's group while the model sends nothing", [
        Turn("interrupted-silent", "Hang. [[silent]]", interrupt_on="stream")]),
    Scenario("background", "a tool that starts `nohup sleep 300 &` in a normal, successful turn", [
        Turn("background", "Start it. [[shell:nohup sleep 300 >/dev/null 2>&1 &]] [[say:Started in the background.]]")]),
    Scenario("stale-session", "--resume with a well-formed session id that does not exist", [
        Turn("stale-session", "Hello again. [[say:unused]]", resume="0b7c4a1e-5d2f-4c3b-9a8e-000000000000")]),
    Scenario("stale-cwd", "--resume of a real session from another working directory", [
        Turn("stale-cwd-1", "First. [[say:First answer.]]"),
        Turn("stale-cwd", "Second. [[say:unused]]", resume="previous", cwd="elsewhere"),
    ]),
    Scenario("bad-session", "--resume with a value that is not a UUID", [
        Turn("bad-session", "Hello again. [[say:unused]]", resume="not-a-session")]),
    Scenario("api-error-400", "the server answers every model call with HTTP 400", [
        Turn("api-error-400", "Hello. [[say:unused]]")], fail_status=400),
    Scenario("api-error-500", "HTTP 500 on every model call; CLAUDE_CODE_MAX_RETRIES=2", [
        Turn("api-error-500", "Hello. [[say:unused]]", env={"CLAUDE_CODE_MAX_RETRIES": "2"})], fail_status=500),
    Scenario("attended-tool", "permissions left to the CLI (no --dangerously-skip-permissions): a Bash call that writes a file", [
        Turn("attended-tool", "Write it. [[shell:touch made-by-tool.txt]] [[say:Done.]]", unattended=False)]),
]


# ---------------------------------------------------------------- main


def display_argv(outcome: Outcome, root: Path) -> str:
    """The argv with the binary as ``claude`` and the temp root as ``$ROOT``, shell-quoted."""
    import shlex

    argv = ["claude", *outcome.argv[1:]]
    return " ".join(shlex.quote(a) for a in argv).replace(str(root), "$ROOT")


def main() -> int:
    """Run the scenarios and write the captures and README."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "captures" / "claude")
    parser.add_argument("--only", nargs="*", default=None, help="scenario names")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    version = subprocess.run([str(cli_path("claude")), "--version"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, env={"PATH": os.environ.get("PATH", ""), "HOME": tempfile.gettempdir()},
                             timeout=60).stdout.strip()
    report: list[str] = []
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        root = Path(tempfile.mkdtemp(prefix=f"capture-claude-{scenario.name}-"))
        outcomes: list[Outcome] = []
        try:
            with FakeAnthropicServer(fail_status=scenario.fail_status, fail_message="fake says no") as server:
                for turn in scenario.turns:
                    session = turn.resume
                    if session == "previous":
                        session = outcomes[-1].session_id if outcomes else None
                    outcome = run_turn(server, root, turn, session)
                    outcomes.append(outcome)
                    (args.out / f"{turn.name}.jsonl").write_text(outcome.stdout)
                    err_file = args.out / f"{turn.name}.stderr"
                    if outcome.stderr:
                        err_file.write_text(outcome.stderr)
                    elif err_file.exists():
                        err_file.unlink()
                checks = scenario.check(server, outcomes) if scenario.check else []
        finally:
            shutil.rmtree(root, ignore_errors=True)
        first = len(report)
        report.append(f"### {scenario.name}\n\n{scenario.about}.\n")
        for o in outcomes:
            report.append(f"- `{o.turn.name}.jsonl`{' + `' + o.turn.name + '.stderr`' if o.stderr else ''}: "
                          f"exit code **{o.returncode}** after {o.seconds:.1f} s"
                          + (f" (env {' '.join(f'{k}={v}' for k, v in o.turn.env.items())})" if o.turn.env else ""))
            report.append(f"  `{display_argv(o, root)}`")
            for line in o.tool_seen:
                report.append(f"  - tool running when interrupted: `{line}`".replace(str(root), "$ROOT"))
            for note in o.notes:
                report.append(f"  - {note}")
            report.append("  - processes of the turn alive after it ended: "
                          + (", ".join(f"`{s}`" for s in o.survivors).replace(str(root), "$ROOT") if o.survivors else "none")
                          + (" (killed by the capture script)" if o.survivors else ""))
        for line in checks:
            report.append(f"- {line}")
        report.append("")
        print("\n".join(report[first:]), flush=True)
    if args.only:
        return 0
    sample = build_launch(TurnRequest(prompt="PROMPT", channel="c", turn_id="t", agent="claude", command=("claude",)))
    fill = {"version": version, "package": PACKAGES["claude"],
            "env": " ".join(f"{k}={v}" for k, v in {**sample.env, **agent_env("http://127.0.0.1:PORT")}.items())}
    readme = README_HEAD
    for key, value in fill.items():
        # Not str.format: the measured notes quote JSON, braces and all.
        readme = readme.replace("{" + key + "}", value)
    (args.out / "README.md").write_text(readme + "\n".join(report))
    return 0


README_HEAD = """# Captures of the real `claude` CLI

Real stdout (`NAME.jsonl`) and, when not empty, stderr (`NAME.stderr`) of **{version}**
(`{package}`), run offline against `tests/fakemodel/anthropic.py` by
`scripts/capture_claude.py` — rerun that script to regenerate every file here (and this README).

Every turn is launched by `adapters/claude.py`'s `build_launch`:
`claude -p --output-format stream-json --verbose --dangerously-skip-permissions [--model M] [--resume ID] [args] -- PROMPT`
(no `--dangerously-skip-permissions` and no `IS_SANDBOX` in `attended-tool`),
stdin `/dev/null`, own session, private `HOME`/`TMPDIR`/cwd under a temp dir `$ROOT`
(`$ROOT/home`, `$ROOT/tmp`, `$ROOT/work`), and env `{env}`
(plus `PATH`, `LANG=C.UTF-8`, `HOME`, `TMPDIR`). Each argv below is exact.
The prompt markers (`[[say:…]]`, `[[shell:…]]`, …) script the fake model (`tests/fakemodel/script.py`).
Interrupted turns get SIGINT on the CLI's process group once the tool (`sleep`) runs, or
once the model call is under way; "processes alive after" lists what the turn left behind
(found by an environment marker every child inherits).

## What the captures show (2.1.197, confirmed over repeated runs)

- **SIGINT to the CLI's group mid-tool**: the tool runs in a session of its own (its pgid is
  not the CLI's), yet the CLI kills the tool's whole process group itself and exits within
  ~0.15 s. It prints a `user` tool_result "The user doesn't want to proceed…", a `user` text
  `[Request interrupted by user for tool use]`, then a last line
  `{"type":"result","subtype":"error_during_execution","is_error":true,"terminal_reason":"aborted_tools",…}`
  with the session id. **The exit code varies from run to run: 0 or 1 (4 of each in 8
  runs), and -9 in 2 of about 12 runs** (the binary has a `process.kill(process.pid,
  "SIGKILL")` fallback when `process.exit` throws) — never trust it.
  A grandchild that left the tool's session (`setsid`) survives (`interrupted-tree`).
- **SIGINT mid-answer or on a silent stream**: the partial text is flushed as an `assistant`
  line, then `[Request interrupted by user]` and a result with `terminal_reason: aborted_streaming`.
- **Resume** keeps the same session id; after an interrupted turn it works, and the next
  request carries the earlier conversation (the aborted tool call is closed by the CLI's
  "doesn't want to proceed" tool_result).
- **Stale session**: an unknown UUID, or a real one resumed from another cwd, prints only a
  result line (`error_during_execution`, `errors: ["No conversation found with session ID: …"]`,
  `session_id` = the unknown id) and the same message on stderr; exit 1. A value that is not
  a UUID: "Error: --resume requires a valid session ID or session title when used with
  --print. …", with a throwaway session id in the result line.
- **API errors**: a synthetic `assistant` message (`"model":"<synthetic>"`, `"error":…`,
  text "API Error: 400 …"), then a result with `subtype: success` but `is_error: true`; exit 1.
  5xx are retried first, one `system/api_retry` line per attempt.
- **`nohup sleep 300 &`** started by a tool outlives a normal, successful turn (`background`).
- **Plans**: 2.1 offers `TaskCreate`/`TaskUpdate` instead of `TodoWrite`;
  `CLAUDE_CODE_ENABLE_TASKS=0` brings `TodoWrite` back (used for every capture).
- **Without `--dangerously-skip-permissions`** a read-only command runs, a writing one is
  refused in the tool result and listed in the result line's `permission_denials`.
- Only one kind of request: `POST /v1/messages?beta=true` with `stream: true`; no side calls
  in print mode with `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`.

## Scenarios

"""


if __name__ == "__main__":
    raise SystemExit(main())
