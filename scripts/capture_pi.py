#!/usr/bin/env python3
"""Capture the real ``pi`` coding agent's output against the fake OpenAI chat server.

Usage, from the repository root: ``.venv/bin/python -m scripts.capture_pi [OUT_DIR]``
(default ``tests/data/captures/pi``). Every scenario runs pi offline: the fake server on
127.0.0.1 (a provider ``corral`` in ``~/.pi/agent/models.json``), a private HOME and TMPDIR
under one temp dir, the prompt on stdin, its own session; the launch comes from
``adapters.pi.build_launch`` so the captures also prove the adapter's argv and files work.
Each scenario writes ``NAME.jsonl`` (stdout, verbatim) and ``NAME.stderr.txt``; ``README.md``
records the argv, the exit codes and what was left running after each turn.

Every process a turn starts carries ``CORRAL_CAPTURE_MARK`` in its environment; after each
turn the script lists the marked processes still alive (the survivors it reports), then kills
them by pid.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from adapters.pi import ADAPTER
from scripts._capture import (
    CliSession,
    Interrupt,
    Place,
    Run,
    after,
    display_argv,
    on_line,
    process_running,
    write_output,
)
from scripts.fakemodel.clis import PACKAGES, cli_path
from scripts.fakemodel.openai_chat import MODEL, PI_ENV, PiChatServer, pi_options

ROOT = Path(__file__).resolve().parent.parent
TURN_TIMEOUT = 90.0


def is_tool_started(obj: dict[str, object]) -> bool:
    """``tool_execution_start``."""
    return obj.get("type") == "tool_execution_start"


def is_turn_started(obj: dict[str, object]) -> bool:
    """``turn_start``."""
    return obj.get("type") == "turn_start"


def session_of(run: Run) -> str:
    """The session id of a captured turn."""
    for line in run.captured.stdout:
        obj = json.loads(line)
        if obj.get("type") == "session":
            return str(obj["id"])
    raise RuntimeError(f"{run.name}: no session line")


def requests_reach(server: PiChatServer, count: int) -> Interrupt:
    """A condition that holds once the server has seen ``count`` requests."""
    return lambda running: len(server.requests) >= count


def main() -> int:
    """Run every scenario and write the captures and README."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("out", type=Path, nargs="?", default=ROOT / "tests" / "data" / "captures" / "pi")
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    checks: list[str] = []
    with tempfile.TemporaryDirectory(prefix="corral-pi-capture-") as tmp, PiChatServer() as server:
        pi = CliSession(
            Place(Path(tmp)).make(), "pi", ADAPTER.build_launch, (str(cli_path("pi")),),
            env=PI_ENV, options=pi_options(server.url), model=MODEL, timeout=TURN_TIMEOUT,
        )

        text = pi.take("text", pi.request("Say hello. [[say:Hello from the fake model.]]"))
        runs.append(text)
        before = len(server.requests)
        resumed = pi.take("resume", pi.request("And again? [[say:Second answer, same session.]]", session_of(text)))
        runs.append(resumed)
        body = json.dumps(server.requests[before].body)
        checks.append(f"resume: the resumed request carried the first answer: {'Hello from the fake model.' in body}")
        checks.append(f"resume: the same session id: {session_of(resumed) == session_of(text)}")

        runs.append(pi.take("tool", pi.request("Run it. [[shell:echo hello from the tool]][[say:It printed hello.]]")))
        runs.append(
            pi.take("tool_error", pi.request("[[shell:ls /nonexistent-corral-dir]][[say:The listing failed.]]"))
        )

        interrupted = pi.take(
            "interrupt_tool",
            pi.request("Wait a bit. [[shell:sleep 30.123 & setsid sleep 30.456 & sleep 30.789]][[say:never said]]"),
            interrupt=after(on_line(is_tool_started), process_running("sleep 30.789")),
            note="SIGINT to the CLI's group once `sleep 30.789` ran (a setsid `sleep 30.456` beside it)",
        )
        runs.append(interrupted)
        before = len(server.requests)
        after_stop = pi.take(
            "resume_after_interrupt",
            pi.request("Go on. [[say:Resumed after the stop.]]", session_of(interrupted)),
        )
        runs.append(after_stop)
        body = json.dumps(server.requests[before].body) if len(server.requests) > before else ""
        carried = "Wait a bit." in body
        checks.append(f"resume_after_interrupt: the resumed request carried the interrupted prompt: {carried}")

        runs.append(pi.take(
            "interrupt_stream",
            pi.request("[[silent]]"),
            interrupt=after(on_line(is_turn_started), requests_reach(server, len(server.requests) + 1)),
            note="SIGINT to the group while the model stream was open and silent",
        ))
        runs.append(pi.take(
            "background_setsid",
            pi.request("[[shell:setsid nohup sleep 300.987 >/dev/null 2>&1 &]][[say:Started it.]]"),
            note="a normal turn whose tool starts `setsid nohup sleep 300.987 &`",
        ))
        runs.append(pi.take("slow_text", pi.request("[[slow:1]][[say:A slowly streamed answer in several pieces.]]")))
        runs.append(pi.take(
            "attended_tool",
            pi.request("[[shell:touch attended.txt]][[say:Did it or not.]]", unattended=False),
            note="unattended=False: only pi's read-only tools (`--tools read,grep,find,ls`)",
        ))
        checks.append(f"attended_tool: attended.txt was not created: {not (pi.place.cwd / 'attended.txt').exists()}")
        runs.append(pi.take(
            "stale_session", pi.request("[[say:x]]", "00000000-0000-4000-8000-000000000000"),
            note="--session with an id pi does not know",
        ))
        server.fail_status = 500
        runs.append(pi.take("error_500", pi.request("[[say:x]]")))
        server.fail_status = None

    version = PACKAGES["pi"].rsplit("@", 1)[1]
    for run in runs:
        c = run.captured
        write_output(out, run.name, c.stdout_bytes, c.stderr.replace(tmp, "$TMP"), stderr_suffix=".stderr.txt",
                     keep_empty=True)
    write_readme(out, runs, checks, version, tmp)
    for run in runs:
        c = run.captured
        print(f"{run.name}: rc={c.returncode} {c.seconds:.2f}s lines={len(c.stdout)} survivors={c.survivors}")
    for check in checks:
        print(check)
    return 0


def write_readme(out: Path, runs: list[Run], checks: list[str], version: str, tmp: str) -> None:
    """Describe how every capture was made."""
    lines = [
        "# pi captures",
        "",
        f"Real stdout of `@mariozechner/pi-coding-agent@{version}` (`pi --mode json`), regenerated by",
        "`.venv/bin/python -m scripts.capture_pi`. Each turn ran offline against",
        "`scripts/fakemodel/openai_chat.py` (`PiChatServer`) on 127.0.0.1, with a private HOME and TMPDIR,",
        "`~/.pi/agent/models.json` holding the adapter's provider `corral` (`api: openai-completions`,",
        "`baseUrl=http://127.0.0.1:PORT/v1`, the key named by `FAKE_API_KEY`), `PI_OFFLINE=1`, the prompt",
        "on stdin, its own session. `NAME.jsonl` is stdout verbatim; `NAME.stderr.txt` is stderr.",
        "",
        "| capture | argv (after the binary path) | exit | time | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        c = run.captured
        notes = run.note
        if c.exited_after is not None:
            notes += f"; exited {c.exited_after * 1000:.0f} ms after the signal"
        if c.survivors:
            notes += f"; still running afterwards: {', '.join(f'`{s}`' for s in c.survivors)}"
        elif run.note:
            notes += "; nothing of the turn was left running"
        argv = display_argv(c.argv, "pi", tmp, "$TMP")
        lines.append(f"| `{run.name}` | `{argv}` | {c.returncode} | {c.seconds:.2f} s | {notes} |")
    lines += ["", "Checks made while capturing:", ""] + [f"- {c}" for c in checks] + [""]
    (out / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
