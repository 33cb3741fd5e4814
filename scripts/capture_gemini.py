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

Usage: ``.venv/bin/python scripts/capture_gemini.py [--out DIR] [--only NAME ...]``
(needs the CLI from ``scripts/install-clis.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from adapters.gemini import SETTINGS_PATH, build_launch  # noqa: E402
from adapters._base import TurnRequest  # noqa: E402
from tests.fakemodel.clis import PACKAGES, cli_path  # noqa: E402
from tests.fakemodel.gemini_api import FakeGeminiServer, agent_env  # noqa: E402

OUT = ROOT / "tests" / "data" / "captures" / "gemini"
#: Environment variable every process of a scenario inherits, to find them afterwards.
MARKER = "CORRAL_CAPTURE_MARKER"
#: A session id no CLI has ever seen.
UNKNOWN_SESSION = "00000000-0000-4000-8000-000000000000"
#: Longest a scenario may run before it is killed (the CLI retries a failing API for minutes).
TURN_TIMEOUT = 120.0


@dataclass
class Place:
    """A private HOME, TMPDIR and working directory, shared by the turns of one conversation."""

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
        """The fixed working directory (gemini resumes only from the same one)."""
        return self.root / "work"

    def make(self) -> "Place":
        """Create the folders."""
        for path in (self.home, self.tmp, self.cwd):
            path.mkdir(parents=True, exist_ok=True)
        return self


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
                return obj.get("session_id")
        return None


def marked_processes(token: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``token`` (ours, so we may kill them)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARKER) == token:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def describe(proc: psutil.Process) -> str:
    """``pid cmdline`` for the manifest."""
    try:
        command = " ".join(" ".join(proc.cmdline()).split())
    except psutil.Error:
        return str(proc.pid)
    # The shell tool's bash -c wrapper is long; its start and its end say enough.
    if len(command) > 90:
        command = command[:40] + " … " + command[-40:]
    return f"{proc.pid} {command}"


def run_turn(
    name: str,
    place: Place,
    prompt: str,
    *,
    session_id: str | None = None,
    model: str | None = None,
    fail_status: int | None = None,
    settings_extra: dict[str, Any] | None = None,
    interrupt_when: Callable[[str, FakeGeminiServer], bool] | None = None,
    wait_for_tool: str | None = None,
    cwd: Path | None = None,
) -> tuple[Outcome, FakeGeminiServer]:
    """Run one turn of the real CLI; SIGINT its process group once ``interrupt_when`` holds.

    ``interrupt_when`` sees each stdout line; with ``wait_for_tool`` the interrupt also
    waits until a process whose command line contains that string is alive (the tool).
    """
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
    token = uuid.uuid4().hex
    server = FakeGeminiServer()
    server.fail_status = fail_status
    server.start()
    try:
        for rel, content in launch.files.items():
            path = place.home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if rel == SETTINGS_PATH and settings_extra:
                merged = json.loads(content)
                merged.update(settings_extra)
                content = json.dumps(merged, indent=2) + "\n"
            path.write_text(content)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(place.home),
            "TMPDIR": str(place.tmp),
            **launch.env,
            **agent_env(server.url),
            MARKER: token,
        }
        proc = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        stderr_chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        timer = threading.Timer(TURN_TIMEOUT, lambda: _kill_group(proc.pid, signal.SIGKILL))
        timer.start()
        lines: list[str] = []
        interrupted = False
        notes: list[str] = []
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            lines.append(line)
            if interrupt_when and not interrupted and interrupt_when(line, server):
                if wait_for_tool:
                    tool = _wait_for_process(token, wait_for_tool)
                    notes.append(f"tool running at SIGINT: {describe(tool) if tool else 'NOT FOUND'}")
                _kill_group(proc.pid, signal.SIGINT)
                interrupted = True
        returncode = proc.wait()
        timer.cancel()
        reader.join()
        if returncode == -signal.SIGKILL and not interrupted:
            notes.append(f"killed after {TURN_TIMEOUT:.0f} s")
        survivors = marked_processes(token)
        outcome = Outcome(
            name=name,
            argv=list(launch.argv),
            returncode=returncode,
            stdout=lines,
            stderr=b"".join(stderr_chunks).decode("utf-8", "replace"),
            interrupted=interrupted,
            resumed=session_id,
            survivors=[describe(p) for p in survivors],
            notes=notes,
        )
        for survivor in survivors:
            try:
                survivor.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(survivors, timeout=5)
        return outcome, server
    finally:
        server.stop()


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _wait_for_process(token: str, needle: str, timeout: float = 15.0) -> psutil.Process | None:
    """The marked process whose command line contains ``needle``, once it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in marked_processes(token):
            try:
                if needle in " ".join(proc.cmdline()) and proc.name() == needle.split()[0]:
                    return proc
            except psutil.Error:
                continue
        time.sleep(0.05)
    return None


def _is(kind: str, **fields: Any) -> Callable[[str, FakeGeminiServer], bool]:
    """A predicate on a stdout line: a JSON object of ``type`` kind with these fields."""

    def check(line: str, _server: FakeGeminiServer) -> bool:
        try:
            obj = json.loads(line)
        except ValueError:
            return False
        return isinstance(obj, dict) and obj.get("type") == kind and all(obj.get(k) == v for k, v in fields.items())

    return check


def _nth_delta(n: int) -> Callable[[str, FakeGeminiServer], bool]:
    count = 0
    is_delta = _is("message", role="assistant")

    def check(line: str, server: FakeGeminiServer) -> bool:
        nonlocal count
        if is_delta(line, server):
            count += 1
        return count >= n

    return check


def _after_user_echo_and_model_call(line: str, server: FakeGeminiServer) -> bool:
    """The prompt is echoed; wait for the turn's model call to be in flight."""
    if not _is("message", role="user")(line, server):
        return False
    server.wait_for_request(lambda r: ":streamGenerateContent" in r.path)
    return True


def _history_carried(server: FakeGeminiServer, earlier: str) -> bool:
    """Whether a turn request sent the earlier prompt back to the model."""
    for req in server.requests:
        if ":streamGenerateContent" in req.path and earlier in json.dumps(req.body):
            return True
    return False


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

    out, _ = run_turn("text", place(), PROMPTS["text"])
    add(out)

    convo = place()
    first, _ = run_turn("resume-first", convo, PROMPTS["resume-first"])
    add(first)
    second, server = run_turn("resume-second", convo, PROMPTS["resume-second"], session_id=first.session_id())
    second.notes.append(f"model saw the first turn again: {_history_carried(server, PROMPTS['resume-first'])}")
    add(second)

    add(run_turn("tool", place(), PROMPTS["tool"])[0])
    out, _ = run_turn("todos", place(), PROMPTS["todos"], model="gemini-2.5-pro")
    out.notes.append("write_todos is offered only with a Gemini 2 model, hence --model")
    add(out)
    add(run_turn("slow", place(), PROMPTS["slow"])[0])

    killed_place = place()
    killed, _ = run_turn(
        "interrupted-tool",
        killed_place,
        PROMPTS["interrupted-tool"],
        interrupt_when=_is("tool_use"),
        wait_for_tool="sleep 30",
    )
    add(killed)
    again, server = run_turn("interrupted-resume", killed_place, PROMPTS["interrupted-resume"], session_id=killed.session_id())
    again.notes.append(f"model saw the killed turn's prompt again: {_history_carried(server, PROMPTS['interrupted-tool'])}")
    tool_rerun = any(
        ":streamGenerateContent" in r.path and "functionCall" in json.dumps(r.body) for r in server.requests
    )
    again.notes.append(f"a function call in the resumed history: {tool_rerun}")
    add(again)

    add(run_turn("interrupted-text", place(), PROMPTS["interrupted-text"], interrupt_when=_nth_delta(2))[0])
    add(run_turn("interrupted-silent", place(), PROMPTS["interrupted-silent"], interrupt_when=_after_user_echo_and_model_call)[0])

    # A conversation exists in this folder, but not the one asked for.
    add(run_turn("stale-session", convo, PROMPTS["stale-session"], session_id=UNKNOWN_SESSION)[0])
    # The session exists, but under another working directory: gemini sees none.
    elsewhere = convo.root / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    out, _ = run_turn("stale-no-sessions", convo, PROMPTS["stale-no-sessions"], session_id=first.session_id(), cwd=elsewhere)
    out.notes.append("resumes a real session id from another working directory")
    add(out)

    add(run_turn("error-400", place(), PROMPTS["error-400"], fail_status=400)[0])
    out, _ = run_turn("error-500", place(), PROMPTS["error-500"], fail_status=500, settings_extra={"general": {"maxAttempts": 1}})
    out.notes.append('settings.json adds {"general": {"maxAttempts": 1}}: by default gemini retries a 500 ten times, 5-30 s apart')
    add(out)
    add(run_turn("empty-response", place(), PROMPTS["empty-response"])[0])
    add(run_turn("background", place(), PROMPTS["background"])[0])
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
        (out_dir / f"{o.name}.jsonl").write_text("".join(line + "\n" for line in o.stdout))
        (out_dir / f"{o.name}.stderr.txt").write_text(o.stderr)
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
            [*(["SIGINT to the process group"] if m["interrupted"] else []), *m["notes"], *(f"survived: {s}" for s in m["survivors"])]
        )
        argv = " ".join(shlex.quote(arg) for arg in m["argv"])
        rows.append(f"| `{name}` | `{argv}` | {m['returncode']} | {extra} |")
    return f"""# Gemini CLI captures

Real stdout (`NAME.jsonl`) and stderr (`NAME.stderr.txt`) of `gemini` {version}
(`{PACKAGES['gemini']}`, installed by `scripts/install-clis.sh`), run offline against
`tests/fakemodel/gemini_api.py` by `scripts/capture_gemini.py` — rerun that script to
regenerate everything here. `manifest.json` has each run's exact argv, exit code and notes.

Each run: its own session (`start_new_session`), stdin `/dev/null`, a private `HOME` and
`TMPDIR`, cwd `$TMP/work`; env = `PATH`, `LANG`, `HOME`, `TMPDIR` + `Launch.env` of
`adapters/gemini.py` (`GEMINI_CLI_NO_RELAUNCH=true`, `GEMINI_CLI_TRUST_WORKSPACE=true`,
`GEMINI_TELEMETRY_ENABLED=false`, `NO_COLOR=1`) + `agent_env()` (`GEMINI_API_KEY`,
`GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:PORT`); `~/.gemini/settings.json` from
`Launch.files`. The argv is `adapters.gemini.build_launch`'s:

    gemini --output-format=stream-json --approval-mode=yolo [--model=M] [--resume=ID] --prompt=PROMPT

The prompt markers (`tests/fakemodel/script.py`) script the fake model.

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
