#!/usr/bin/env python3
"""Capture the real ``codex`` CLI's output against the fake Responses API server.

Usage, from the repository root: ``.venv/bin/python -m scripts.capture_codex [OUT_DIR]``
(default ``tests/data/captures/codex``). Every scenario runs codex offline: the fake server on
127.0.0.1, a private HOME, CODEX_HOME and TMPDIR under one temp dir, stdin ``/dev/null``, its
own session; the launch comes from ``adapters.codex.build_launch`` so the captures also prove
the adapter's argv and config file work. Each scenario writes ``NAME.jsonl`` (stdout, verbatim)
and ``NAME.stderr.txt``; ``README.md`` records the argv, the markers, the exit codes and what
was left running after each turn.

Every process a turn starts carries ``CORRAL_CAPTURE_MARK`` in its environment; after each
turn the script lists the marked processes still alive (the survivors it reports), then kills
them by pid.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from adapters.codex import ADAPTER
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
from scripts.fakemodel.openai_responses import OpenAIResponsesServer, agent_env, agent_options

ROOT = Path(__file__).resolve().parent.parent
TURN_TIMEOUT = 90.0


def is_command_started(obj: dict[str, object]) -> bool:
    """``item.started`` of a ``command_execution``."""
    item = obj.get("item")
    return obj.get("type") == "item.started" and isinstance(item, dict) and item.get("type") == "command_execution"


def is_turn_started(obj: dict[str, object]) -> bool:
    """``turn.started``."""
    return obj.get("type") == "turn.started"


def thread_id(run: Run) -> str:
    """The thread id of a captured turn."""
    for line in run.captured.stdout:
        obj = json.loads(line)
        if obj.get("type") == "thread.started":
            return str(obj["thread_id"])
    raise RuntimeError(f"{run.name}: no thread.started line")


def model_requests_reach(server: OpenAIResponsesServer, count: int) -> Interrupt:
    """A condition that holds once the server has seen ``count`` model requests."""
    return lambda running: len(server.model_requests()) >= count


def main() -> int:
    """Run every scenario and write the captures and README."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("out", type=Path, nargs="?", default=ROOT / "tests" / "data" / "captures" / "codex")
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    checks: list[str] = []
    with tempfile.TemporaryDirectory(prefix="corral-codex-capture-") as tmp, OpenAIResponsesServer() as server:
        codex = CliSession(
            Place(Path(tmp)).make(), "codex", ADAPTER.build_launch, (str(cli_path("codex")),),
            env=agent_env(server.url), options=agent_options(server.url), timeout=TURN_TIMEOUT,
        )

        text = codex.take("text", codex.request("Say hello. [[say:Hello from the fake model.]]"))
        runs.append(text)

        before = len(server.model_requests())
        resumed = codex.take(
            "resume", codex.request("And again? [[say:Second answer, same thread.]]", session_id=thread_id(text))
        )
        runs.append(resumed)
        body = json.dumps(server.model_requests()[before].body)
        checks.append(f"resume: the resumed request carried the first answer: {'Hello from the fake model.' in body}")

        runs.append(codex.take("model", codex.request("[[say:Answer from another model.]]", model="gpt-5.4")))

        runs.append(codex.take(
            "tool", codex.request("Run it. [[shell:echo hello from the tool]][[say:The command printed hello.]]")
        ))
        runs.append(codex.take(
            "tool_error", codex.request("[[shell:ls /nonexistent-corral-dir]][[say:The listing failed.]]")
        ))

        interrupted = codex.take(
            "interrupt_tool",
            codex.request("Wait a bit. [[shell:sleep 30.123 & sleep 30.456]][[say:never said]]"),
            interrupt=after(on_line(is_command_started), process_running("sleep 30.456")),
            note="SIGINT to the CLI's process group once `sleep 30.456` was running",
        )
        runs.append(interrupted)

        before = len(server.model_requests())
        after_stop = codex.take(
            "resume_after_interrupt",
            codex.request("Go on. [[say:Resumed after the stop.]]", session_id=thread_id(interrupted)),
        )
        runs.append(after_stop)
        items = server.model_requests()[before].body["input"]
        outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        checks.append(f"resume_after_interrupt: the dangling call's output sent on resume: {json.dumps(outputs)[:400]}")

        silent = codex.take(
            "interrupt_stream",
            codex.request("[[silent]]"),
            interrupt=after(on_line(is_turn_started), model_requests_reach(server, len(server.model_requests()) + 1)),
            note="SIGINT to the group while the model stream was open and silent",
        )
        runs.append(silent)

        runs.append(codex.take(
            "background", codex.request("[[shell:nohup sleep 300.789 >/dev/null 2>&1 &]][[say:Started it.]]"),
            note="a normal turn whose tool starts `nohup sleep 300.789 &`",
        ))
        runs.append(codex.take(
            "background_setsid",
            codex.request("[[shell:setsid nohup sleep 300.987 >/dev/null 2>&1 &]][[say:Started it.]]"),
            note="a normal turn whose tool starts `setsid nohup sleep 300.987 &`",
        ))

        runs.append(codex.take(
            "slow_text", codex.request("[[slow:1]][[say:A slowly streamed answer in several pieces.]]")
        ))

        runs.append(codex.take(
            "attended_tool",
            codex.request("[[shell:echo attended]][[say:Ran without the unattended settings.]]", unattended=False),
            note="unattended=False: codex's own approval and sandbox defaults",
        ))
        runs.append(codex.take(
            "stale_session", codex.request("[[say:x]]", session_id="00000000-0000-4000-8000-000000000000"),
            note="resume of a thread id (a UUID) that does not exist",
        ))
        runs.append(codex.take(
            "stale_name", codex.request("[[say:A new thread instead.]]", session_id="no-such-thread-name"),
            note="resume of a non-UUID id that matches no thread name: codex starts a new thread",
        ))

        rejected: dict[str, Any] = {
            "message": "Invalid request: the fake server rejects this.",
            "type": "invalid_request_error",
            "code": "invalid_value",
        }
        server.fail = (400, {"error": rejected})
        runs.append(codex.take("error_400", codex.request("[[say:x]]")))
        server.fail = (500, {"error": {"message": "The fake server broke.", "type": "server_error"}})
        runs.append(codex.take("error_500", codex.request("[[say:x]]")))
        server.fail = None

    version = PACKAGES["codex"].rsplit("@", 1)[1]
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
        "# codex captures",
        "",
        f"Real stdout of `@openai/codex@{version}` (`codex exec --json`), regenerated by",
        "`.venv/bin/python -m scripts.capture_codex`. Each turn ran offline against",
        "`scripts/fakemodel/openai_responses.py` on 127.0.0.1, with a private HOME and TMPDIR, ",
        "`CODEX_HOME=$HOME/.codex` holding the adapter's `config.toml` (provider `corral`,",
        "`base_url=http://127.0.0.1:PORT/v1`, `env_key=OPENAI_API_KEY`, approval `never`,",
        "sandbox `danger-full-access`, analytics off), stdin `/dev/null`, its own session.",
        "`NAME.jsonl` is stdout verbatim; `NAME.stderr.txt` is stderr.",
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
        argv = display_argv(c.argv, "codex", tmp, "$TMP")
        lines.append(f"| `{run.name}` | `{argv}` | {c.returncode} | {c.seconds:.2f} s | {notes} |")
    lines += ["", "Checks made while capturing:", ""] + [f"- {c}" for c in checks] + [""]
    (out / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
