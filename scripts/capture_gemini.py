#!/usr/bin/env python3
"""Capture the real ``gemini`` CLI's stdout and stderr against the fake Gemini API.

Runs every scenario offline — the CLI's model calls go to a :class:`FakeGeminiServer`
on 127.0.0.1, in a private HOME and TMPDIR under a temporary folder, stdin ``/dev/null``,
its own session — and writes ``tests/data/captures/gemini/``:

* ``NAME.jsonl`` — stdout exactly as printed (one JSON object per line);
* ``NAME.stderr.txt`` — stderr;
* ``manifest.json`` — per scenario: argv (binary shown as ``gemini``, temp paths as
  ``$HOME``/``$TMP``), exit code, whether corral would call it interrupted, the resumed
  session, whether a tool process outlived the CLI;
* ``README.md`` — the same, for people.

The launch is built by ``adapters.gemini.build_launch``, so the captures show what corral
itself runs. Every process of a scenario carries an environment marker; any of them still
alive afterwards is reported, then killed by pid.

Usage, from the repository root: ``.venv/bin/python -m scripts.capture_gemini [--out DIR] [--only NAME ...]``
(needs the CLI from ``scripts/install-clis.sh``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters._base import TurnRequest
from adapters.gemini import SETTINGS_PATH, build_launch
from scripts._capture import (
    Interrupt,
    Place,
    Running,
    after,
    new_mark,
    on_line,
    process_running,
    run_turn,
    turn_env,
    write_files,
    write_output,
)
from scripts.fakemodel.clis import PACKAGES, cli_path
from scripts.fakemodel.gemini_api import FakeGeminiServer, agent_env

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "captures" / "gemini"
#: A session id no CLI has ever seen.
UNKNOWN_SESSION = "00000000-0000-4000-8000-000000000000"
#: Longest a scenario may run before it is killed (the CLI retries a failing API for minutes).
TURN_TIMEOUT = 120.0

#: When to interrupt a turn, given the turn's fake server.
InterruptFor = Callable[[FakeGeminiServer], Interrupt]


@dataclass
class Outcome:
    """What one scenario run produced."""

    name: str
    argv: list[str]
    returncode: int | None
    stdout: list[str]
    stderr: str
    interrupted: bool = False
    resumed: str | None = None
    survivors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def session_id(self) -> str | None:
        """The id from the ``init`` line, if any."""
        for line in self.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "init":
                sid = obj.get("session_id")
                return sid if isinstance(sid, str) else None
        return None


def run_gemini(
    name: str,
    place: Place,
    prompt: str,
    *,
    session_id: str | None = None,
    model: str | None = None,
    fail_status: int | None = None,
    settings_extra: dict[str, Any] | None = None,
    interrupt: InterruptFor | None = None,
    cwd: Path | None = None,
) -> tuple[Outcome, FakeGeminiServer]:
    """Run one turn of the real CLI against a fresh fake server; SIGINT its process group
    once ``interrupt`` holds."""
    request = TurnRequest(
        prompt=prompt,
        channel="capture",
        turn_id=name,
        agent="gemini",
        command=(str(cli_path("gemini")),),
        session_id=session_id,
        model=model,
        cwd=str(cwd or place.cwd),
        home=str(place.home),
    )
    launch = build_launch(request)
    server = FakeGeminiServer()
    server.fail_status = fail_status
    server.start()
    try:
        files = dict(launch.files)
        if settings_extra:
            merged = json.loads(files[SETTINGS_PATH])
            merged.update(settings_extra)
            files[SETTINGS_PATH] = json.dumps(merged, indent=2) + "\n"
        write_files(place.home, files)
        env = turn_env(place.home, place.tmp, launch, new_mark(), agent_env(server.url))
        # The shell tool's bash -c wrapper is long; its start and its end say enough.
        when = interrupt(server) if interrupt else None
        c = run_turn(launch, env, interrupt=when, timeout=TURN_TIMEOUT, width=90)
        outcome = Outcome(
            name=name,
            argv=list(c.argv),
            returncode=c.returncode,
            stdout=c.stdout,
            stderr=c.stderr,
            interrupted=c.interrupted,
            resumed=session_id,
            survivors=c.survivors,
            notes=c.notes,
        )
        return outcome, server
    finally:
        server.stop()


def _is(kind: str, **fields: Any) -> Callable[[dict[str, object]], bool]:
    """A predicate on a stdout object: of ``type`` kind, with these fields."""
    return lambda obj: obj.get("type") == kind and all(obj.get(k) == v for k, v in fields.items())


def _tool_running(server: FakeGeminiServer) -> Interrupt:
    """Once the tool call is reported and its ``sleep 30`` runs."""
    return after(on_line(_is("tool_use")), process_running("sleep 30", name="sleep"))


def _nth_delta(n: int) -> InterruptFor:
    """Once the ``n``-th piece of the answer is out."""

    def condition(server: FakeGeminiServer) -> Interrupt:
        count = 0
        is_delta = _is("message", role="assistant")

        def nth(obj: dict[str, object]) -> bool:
            nonlocal count
            count += is_delta(obj)
            return count >= n

        return on_line(nth)

    return condition


def _after_user_echo_and_model_call(server: FakeGeminiServer) -> Interrupt:
    """The prompt is echoed, and the turn's model call is in flight."""

    def in_flight(running: Running) -> bool:
        return any(":streamGenerateContent" in r.path for r in server.requests)

    return after(on_line(_is("message", role="user")), in_flight)


def _history_carried(server: FakeGeminiServer, earlier: str) -> bool:
    """Whether a turn request sent the earlier prompt back to the model."""
    return any(":streamGenerateContent" in req.path and earlier in json.dumps(req.body) for req in server.requests)


# ---------------------------------------------------------------- scenarios

PROMPTS = {
    "text": "[[say:Hello from the fake Gemini.]] Say hello.",
    "resume-first": "[[say:I will remember 42.]] Remember the number 42.",
    "resume-second": "[[say:You said 42.]] What number did I say?",
    "tool": "[[shell:echo hi-from-tool]] [[say:The command printed hi-from-tool.]] Run echo.",
    "todos": "[[todos]] [[shell:echo planned]] [[say:All three steps done.]] Plan, then run.",
    "slow": "[[say:This answer arrives in several small pieces over a second.]] [[slow:1]] Stream it.",
    "interrupted-tool": "[[shell:sleep 30]] [[say:never said]] Sleep for a while.",
    "interrupted-resume": "[[say:Back after the stop.]] Are you still there?",
    "interrupted-text": "[[say:one two three four five six seven eight nine ten]] [[slow:4]] Count slowly.",
    "interrupted-silent": "[[silent]] Think forever.",
    "stale-session": "[[say:unreachable]] Resume a session that does not exist.",
    "stale-no-sessions": "[[say:unreachable]] Resume in a folder with no sessions.",
    "error-400": "[[say:unreachable]] The API rejects this.",
    "error-500": "[[say:unreachable]] The API fails.",
    "empty-response": "[[say:]] Answer with nothing.",
    "background": "[[shell:nohup sleep 300 >/dev/null 2>&1 &]] [[say:Started it in the background.]] Start a job.",
}


def scenarios(work: Path) -> list[Outcome]:
    """Run every scenario; each gets a fresh place unless it continues a conversation."""
    outcomes: list[Outcome] = []

    def place() -> Place:
        return Place(Path(tempfile.mkdtemp(dir=work))).make()

    def add(outcome: Outcome) -> Outcome:
        outcomes.append(outcome)
        print(f"{outcome.name}: exit {outcome.returncode}, {len(outcome.stdout)} lines", file=sys.stderr)
        return outcome

    out, _ = run_gemini("text", place(), PROMPTS["text"])
    add(out)

    convo = place()
    first, _ = run_gemini("resume-first", convo, PROMPTS["resume-first"])
    add(first)
    second, server = run_gemini("resume-second", convo, PROMPTS["resume-second"], session_id=first.session_id())
    second.notes.append(f"model saw the first turn again: {_history_carried(server, PROMPTS['resume-first'])}")
    add(second)

    add(run_gemini("tool", place(), PROMPTS["tool"])[0])
    out, _ = run_gemini("todos", place(), PROMPTS["todos"], model="gemini-2.5-pro")
    out.notes.append("write_todos is offered only with a Gemini 2 model, hence --model")
    add(out)
    add(run_gemini("slow", place(), PROMPTS["slow"])[0])

    killed_place = place()
    killed, _ = run_gemini(
        "interrupted-tool",
        killed_place,
        PROMPTS["interrupted-tool"],
        interrupt=_tool_running,
    )
    add(killed)
    again, server = run_gemini(
        "interrupted-resume", killed_place, PROMPTS["interrupted-resume"], session_id=killed.session_id()
    )
    carried = _history_carried(server, PROMPTS["interrupted-tool"])
    again.notes.append(f"model saw the killed turn's prompt again: {carried}")
    tool_rerun = any(
        ":streamGenerateContent" in r.path and "functionCall" in json.dumps(r.body) for r in server.requests
    )
    again.notes.append(f"a function call in the resumed history: {tool_rerun}")
    add(again)

    add(run_gemini("interrupted-text", place(), PROMPTS["interrupted-text"], interrupt=_nth_delta(2))[0])
    add(run_gemini(
        "interrupted-silent", place(), PROMPTS["interrupted-silent"], interrupt=_after_user_echo_and_model_call
    )[0])

    # A conversation exists in this folder, but not the one asked for.
    add(run_gemini("stale-session", convo, PROMPTS["stale-session"], session_id=UNKNOWN_SESSION)[0])
    # The session exists, but under another working directory: gemini sees none.
    elsewhere = convo.root / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    out, _ = run_gemini(
        "stale-no-sessions", convo, PROMPTS["stale-no-sessions"], session_id=first.session_id(), cwd=elsewhere
    )
    out.notes.append("resumes a real session id from another working directory")
    add(out)

    add(run_gemini("error-400", place(), PROMPTS["error-400"], fail_status=400)[0])
    out, _ = run_gemini(
        "error-500", place(), PROMPTS["error-500"], fail_status=500, settings_extra={"general": {"maxAttempts": 1}}
    )
    out.notes.append(
        'settings.json adds {"general": {"maxAttempts": 1}}: by default gemini retries a 500 ten times, 5-30 s apart'
    )
    add(out)
    add(run_gemini("empty-response", place(), PROMPTS["empty-response"])[0])
    add(run_gemini("background", place(), PROMPTS["background"])[0])
    return outcomes


# ---------------------------------------------------------------- output


def public_argv(argv: list[str]) -> list[str]:
    """The argv with the installed binary shown as ``gemini``."""
    binary = str(cli_path("gemini"))
    return ["gemini" if arg == binary else arg for arg in argv]


def write(outcomes: list[Outcome], out_dir: Path, only: set[str] | None) -> None:
    """Write the capture files, the manifest and the README."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "manifest.json"
    manifest: dict[str, Any] = json.loads(manifest_path.read_text()) if manifest_path.exists() and only else {}
    for o in outcomes:
        if only and o.name not in only:
            continue
        stdout = "".join(line + "\n" for line in o.stdout).encode()
        write_output(out_dir, o.name, stdout, o.stderr, stderr_suffix=".stderr.txt", keep_empty=True)
        manifest[o.name] = {
            "argv": public_argv(o.argv),
            "prompt": PROMPTS[o.name],
            "returncode": o.returncode,
            "interrupted": o.interrupted,
            "resumed": o.resumed,
            "survivors": o.survivors,
            "notes": o.notes,
        }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    (out_dir / "README.md").write_text(readme(manifest))


def readme(manifest: dict[str, Any]) -> str:
    """The README of the capture folder."""
    version = PACKAGES["gemini"].rsplit("@", 1)[1]
    rows = []
    for name, m in manifest.items():
        extra = "; ".join(
            [
                *(["SIGINT to the process group"] if m["interrupted"] else []),
                *m["notes"],
                *(f"survived: {s}" for s in m["survivors"]),
            ]
        )
        argv = " ".join(shlex.quote(arg) for arg in m["argv"])
        rows.append(f"| `{name}` | `{argv}` | {m['returncode']} | {extra} |")
    return f"""# Gemini CLI captures

Real stdout (`NAME.jsonl`) and stderr (`NAME.stderr.txt`) of `gemini` {version}
(`{PACKAGES['gemini']}`, installed by `scripts/install-clis.sh`), run offline against
`scripts/fakemodel/gemini_api.py` by `python -m scripts.capture_gemini` — rerun it to
regenerate everything here. `manifest.json` has each run's exact argv, exit code and notes.

Each run: its own session (`start_new_session`), stdin `/dev/null`, a private `HOME` and
`TMPDIR`, cwd `$TMP/work`; env = `PATH`, `LANG`, `HOME`, `TMPDIR` + `Launch.env` of
`adapters/gemini.py` (`GEMINI_CLI_NO_RELAUNCH=true`, `GEMINI_CLI_TRUST_WORKSPACE=true`,
`GEMINI_TELEMETRY_ENABLED=false`, `NO_COLOR=1`) + `agent_env()` (`GEMINI_API_KEY`,
`GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:PORT`); `~/.gemini/settings.json` from
`Launch.files`. The argv is `adapters.gemini.build_launch`'s:

    gemini --output-format=stream-json --approval-mode=yolo [--model=M] [--resume=ID] --prompt=PROMPT

The prompt markers (`scripts/fakemodel/script.py`) script the fake model.

| capture | exact argv | exit | notes |
| --- | --- | --- | --- |
{chr(10).join(rows)}

What they show: a stopped gemini (SIGINT to its group) exits **0** and prints nothing more —
no `result` line — while its shell tool, in a session of its own, keeps running. A stale
`--resume` prints nothing on stdout; stderr says `Error resuming session: …`, exit 42.
A failed turn ends with `{{"type":"result","status":"error",…}}`; the empty-response failure
even exits 0. A `nohup … &` started by a tool outlives a normal turn.
"""


def main() -> int:
    """Run the scenarios and write the captures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="*", help="write only these captures (all scenarios still run)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="capture-gemini-"))
    try:
        outcomes = scenarios(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write(outcomes, args.out, set(args.only) if args.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
