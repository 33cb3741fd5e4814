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

Usage, from the repository root: ``.venv/bin/python -m scripts.capture_claude [--out DIR] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from adapters._base import TurnRequest
from adapters.claude import build_launch
from scripts._capture import (
    Captured,
    CliSession,
    Interrupt,
    Place,
    child_named,
    cli_version,
    display_argv,
    write_output,
)
from scripts.fakemodel.anthropic import FakeAnthropicServer, agent_env
from scripts.fakemodel.clis import PACKAGES, cli_path

REPO = Path(__file__).resolve().parent.parent


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
    check: Callable[[FakeAnthropicServer, list[Outcome]], list[str]] | None = None


@dataclass
class Outcome:
    """What one turn did."""

    turn: Turn
    captured: Captured
    session_id: str | None


def session_of(lines: list[str]) -> str | None:
    """The session id of the first line that names one."""
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("session_id"), str):
            return str(obj["session_id"])
    return None


def interrupt_for(server: FakeAnthropicServer, turn: Turn) -> Interrupt | None:
    """The moment to send SIGINT in ``turn``, if it is interrupted."""
    if turn.interrupt_on is None:
        return None
    pieces, streams = server.text_pieces_sent, server.streams_started
    if turn.interrupt_on == "text":
        # Mid-answer: the first piece of a [[slow]] answer has gone out.
        return lambda running: server.text_pieces_sent > pieces
    if turn.interrupt_on == "stream":
        # The model call is open (for [[silent]]: headers sent, then nothing).
        return lambda running: server.streams_started > streams
    return child_named(turn.interrupt_on)


def run_claude(server: FakeAnthropicServer, root: Path, turn: Turn, session: str | None) -> Outcome:
    """Run the CLI once and return what it printed and left behind."""
    place, cwd = Place(root), root / turn.cwd
    for d in (place.home, place.tmp, cwd):
        d.mkdir(parents=True, exist_ok=True)
    # The launch is the adapter's own, so the captures show what corral will run.
    claude = CliSession(place, "claude", build_launch, (str(cli_path("claude")),), env=agent_env(server.url))
    request = claude.request(turn.prompt, session, turn_id=turn.name, model=turn.model, args=turn.args,
                             unattended=turn.unattended, cwd=cwd)
    captured = claude.run(request, interrupt=interrupt_for(server, turn), env=turn.env)
    return Outcome(turn, captured, session_of(captured.stdout))


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
    return [f"session ids per turn: {ids}", *_carried(server, outcomes, "sleep 300")]


SCENARIOS: list[Scenario] = [
    Scenario("text", "a plain text turn", [Turn("text", "Say hello. [[say:Hello from the fake model.]]")]),
    Scenario("model", "a text turn with --model", [
        Turn("model", "Which model? [[say:A small one.]]", model="claude-haiku-4-5")], check=_model_check),
    Scenario("args-dash", "variadic args (--allowedTools Bash Read) and a prompt that starts with '-'", [
        Turn("args-dash", "- starts with a dash [[say:Dash prompt understood.]]",
             args=("--allowedTools", "Bash", "Read"))]),
    Scenario("resume", "two turns: the second resumes the first's session id", [
        Turn("resume-1", "Remember the word pineapple. [[say:I will remember pineapple.]]"),
        Turn("resume-2", "Which word? [[say:The word was pineapple.]]", resume="previous"),
    ], check=lambda s, o: [f"session ids per turn: {[x.session_id for x in o]}", *_carried(s, o, "pineapple")]),
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
        Turn("interrupted-tree",
             "Wait a while. [[shell:sleep 301 & (setsid sleep 302 &); sleep 300]] [[say:Finished waiting.]]",
             interrupt_on="sleep"),
    ]),
    Scenario("interrupted-text", "SIGINT to the CLI's group while the answer streams slowly", [
        Turn("interrupted-text", "Talk slowly. [[slow:30]] [[say:one two three four five six seven eight nine ten]]",
             interrupt_on="text")]),
    Scenario("interrupted-silent", "SIGINT to the CLI's group while the model sends nothing", [
        Turn("interrupted-silent", "Hang. [[silent]]", interrupt_on="stream")]),
    Scenario("background", "a tool that starts `nohup sleep 300 &` in a normal, successful turn", [
        Turn("background",
             "Start it. [[shell:nohup sleep 300 >/dev/null 2>&1 &]] [[say:Started in the background.]]")]),
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
    Scenario("attended-tool",
             "permissions left to the CLI (no --dangerously-skip-permissions): a Bash call that writes a file", [
        Turn("attended-tool", "Write it. [[shell:touch made-by-tool.txt]] [[say:Done.]]", unattended=False)]),
]


# ---------------------------------------------------------------- main


def main() -> int:
    """Run the scenarios and write the captures and README."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "captures" / "claude")
    parser.add_argument("--only", nargs="*", default=None, help="scenario names")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    version = cli_version(cli_path("claude"))
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
                    outcome = run_claude(server, root, turn, session)
                    outcomes.append(outcome)
                    c = outcome.captured
                    write_output(
                        args.out, turn.name, c.stdout_bytes, c.stderr, stderr_suffix=".stderr", keep_empty=False
                    )
                checks = scenario.check(server, outcomes) if scenario.check else []
        finally:
            shutil.rmtree(root, ignore_errors=True)
        first = len(report)
        report.append(f"### {scenario.name}\n\n{scenario.about}.\n")
        for o in outcomes:
            c = o.captured
            report.append(f"- `{o.turn.name}.jsonl`{' + `' + o.turn.name + '.stderr`' if c.stderr.strip() else ''}: "
                          f"exit code **{c.returncode}** after {c.seconds:.1f} s"
                          + (f" (env {' '.join(f'{k}={v}' for k, v in o.turn.env.items())})" if o.turn.env else ""))
            report.append(f"  `{display_argv(c.argv, 'claude', root, '$ROOT')}`")
            notes = list(c.notes)
            if c.interrupted:
                notes.append("SIGINT sent to the CLI's process group (CLI pid = pgid = sid)")
                notes.append(f"exited {c.exited_after:.2f} s after SIGINT")
            for note in notes:
                report.append(f"  - {note}".replace(str(root), "$ROOT"))
            alive = ", ".join(f"`{s}`" for s in c.survivors).replace(str(root), "$ROOT")
            report.append("  - processes of the turn alive after it ended: "
                          + (f"{alive} (killed by the capture script)" if c.survivors else "none"))
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
(`{package}`), run offline against `scripts/fakemodel/anthropic.py` by
`python -m scripts.capture_claude` — rerun it to regenerate every file here (and this README).

Every turn is launched by `adapters/claude.py`'s `build_launch`:
`claude -p --output-format stream-json --verbose --dangerously-skip-permissions [--model M] [--resume ID] [args] -- PROMPT`
(no `--dangerously-skip-permissions` and no `IS_SANDBOX` in `attended-tool`),
stdin `/dev/null`, own session, private `HOME`/`TMPDIR`/cwd under a temp dir `$ROOT`
(`$ROOT/home`, `$ROOT/tmp`, `$ROOT/work`), and env `{env}`
(plus `PATH`, `LANG=C.UTF-8`, `HOME`, `TMPDIR`). Each argv below is exact.
The prompt markers (`[[say:…]]`, `[[shell:…]]`, …) script the fake model (`scripts/fakemodel/script.py`).
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

"""  # noqa: E501 (the README quotes the exact command line)


if __name__ == "__main__":
    raise SystemExit(main())
