#!/usr/bin/env python3
"""Capture the real ``codex`` CLI's output against the fake Responses API server.

Usage: ``.venv/bin/python scripts/capture_codex.py [OUT_DIR]`` (default
``tests/data/captures/codex``). Every scenario runs codex offline: the fake server on
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

import json
import os
import posixpath
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters._base import TurnRequest  # noqa: E402
from adapters.codex import ADAPTER  # noqa: E402
from tests.fakemodel.clis import PACKAGES, cli_path  # noqa: E402
from tests.fakemodel.openai_responses import OpenAIResponsesServer, agent_env, agent_options  # noqa: E402

MARK_VAR = "CORRAL_CAPTURE_MARK"
TURN_TIMEOUT = 90.0


@dataclass
class Run:
    """One turn of the real CLI, as captured."""

    name: str
    prompt: str
    argv: tuple[str, ...]
    returncode: int | None = None
    stdout: list[str] = field(default_factory=list)
    stderr: str = ""
    seconds: float = 0.0
    note: str = ""
    survivors: list[str] = field(default_factory=list)
    signalled_at: float | None = None
    """When the hook sent SIGINT (monotonic), to time the exit."""


def marked_processes(mark: str) -> dict[int, str]:
    """Live (non-zombie) processes whose environment holds ``MARK_VAR=mark``: pid -> cmdline."""
    needle = f"{MARK_VAR}={mark}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
    return found


class Codex:
    """Runs turns of the real CLI in one private HOME against one fake server."""

    def __init__(self, root: Path, server: OpenAIResponsesServer) -> None:
        self.home = root / "home"
        self.cwd = root / "work"
        self.tmp = root / "tmp"
        for d in (self.home, self.cwd, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self.server = server
        self.command = (str(cli_path("codex")),)

    def request(self, prompt: str, session_id: str | None = None, **kw: object) -> TurnRequest:
        """A turn request as the supervisor would build it."""
        return TurnRequest(
            prompt=prompt, channel="capture", turn_id=uuid.uuid4().hex, agent="codex",
            command=self.command, session_id=session_id, cwd=str(self.cwd), home=str(self.home),
            options=agent_options(self.server.url), **kw,  # type: ignore[arg-type]
        )

    def run(
        self,
        name: str,
        request: TurnRequest,
        *,
        on_line: Callable[[str, subprocess.Popen[bytes], str], None] | None = None,
        signalled_at: list[float] | None = None,
    ) -> Run:
        """Spawn one turn like the supervisor does and capture everything it prints."""
        launch = ADAPTER.build_launch(request)
        for rel, content in launch.files.items():
            path = Path(rel) if posixpath.isabs(rel) else self.home / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        mark = uuid.uuid4().hex
        env = {
            "PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(self.home), "TMPDIR": str(self.tmp),
            **launch.env, **agent_env(self.server.url), MARK_VAR: mark,
        }
        run = Run(name=name, prompt=request.prompt, argv=launch.argv)
        start = time.monotonic()
        proc = subprocess.Popen(
            launch.argv, env=env, cwd=launch.cwd, start_new_session=True,
            stdin=subprocess.PIPE if launch.stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        if launch.stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(launch.stdin)
            proc.stdin.close()
        err_chunks: list[bytes] = []
        assert proc.stderr is not None and proc.stdout is not None
        err_thread = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        err_thread.start()
        timer = threading.Timer(TURN_TIMEOUT, self._kill_group, (proc,))
        timer.start()
        try:
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                run.stdout.append(line)
                if on_line is not None:
                    on_line(line, proc, mark)
            run.returncode = proc.wait()
        finally:
            timer.cancel()
        err_thread.join()
        end = time.monotonic()
        run.seconds = end - start
        if signalled_at:
            run.signalled_at = end - signalled_at[0]
        run.stderr = b"".join(err_chunks).decode(errors="replace")
        self._sweep(run, proc, mark)
        return run

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        """The turn timeout: SIGKILL the group (a hung turn must not hang the script)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _sweep(self, run: Run, proc: subprocess.Popen[bytes], mark: str) -> None:
        """Record what the turn left running, then kill exactly those processes."""
        left = marked_processes(mark)
        run.survivors = sorted(left.values())
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def interrupt_when(
    predicate: Callable[[dict[str, object]], bool], process_needle: str | None, sent_at: list[float]
) -> Callable[[str, subprocess.Popen[bytes], str], None]:
    """An ``on_line`` hook: once a line matches, wait for the tool process, then SIGINT the group.

    The time of the signal is appended to ``sent_at``.
    """
    sent = threading.Event()

    def hook(line: str, proc: subprocess.Popen[bytes], mark: str) -> None:
        if sent.is_set():
            return
        try:
            obj = json.loads(line)
        except ValueError:
            return
        if not isinstance(obj, dict) or not predicate(obj):
            return
        deadline = time.monotonic() + 20
        # Poll for the tool's process to exist (it starts just after the item.started line).
        while process_needle and time.monotonic() < deadline:
            if any(process_needle in cmd for cmd in marked_processes(mark).values()):
                break
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        sent_at.append(time.monotonic())
        sent.set()

    return hook


def is_command_started(obj: dict[str, object]) -> bool:
    """``item.started`` of a ``command_execution``."""
    item = obj.get("item")
    return obj.get("type") == "item.started" and isinstance(item, dict) and item.get("type") == "command_execution"


def is_turn_started(obj: dict[str, object]) -> bool:
    """``turn.started``."""
    return obj.get("type") == "turn.started"


def thread_id(run: Run) -> str:
    """The thread id of a captured turn."""
    for line in run.stdout:
        obj = json.loads(line)
        if obj.get("type") == "thread.started":
            return str(obj["thread_id"])
    raise RuntimeError(f"{run.name}: no thread.started line")


def wait_for_model_request(server: OpenAIResponsesServer, count: int) -> Callable[[dict[str, object]], bool]:
    """A predicate that holds once the server has seen ``count`` model requests."""

    def ready(obj: dict[str, object]) -> bool:
        if obj.get("type") != "turn.started":
            return False
        server.wait_for_request(lambda r: len(server.model_requests()) >= count, timeout=20)
        return True

    return ready


def main(out: Path) -> int:
    """Run every scenario and write the captures and README."""
    out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    checks: list[str] = []
    with tempfile.TemporaryDirectory(prefix="corral-codex-capture-") as tmp, OpenAIResponsesServer() as server:
        codex = Codex(Path(tmp), server)

        text = codex.run("text", codex.request("Say hello. [[say:Hello from the fake model.]]"))
        runs.append(text)

        before = len(server.model_requests())
        resumed = codex.run("resume", codex.request("And again? [[say:Second answer, same thread.]]", session_id=thread_id(text)))
        runs.append(resumed)
        body = json.dumps(server.model_requests()[before].body)
        checks.append(f"resume: the resumed request carried the first answer: {'Hello from the fake model.' in body}")

        runs.append(codex.run("model", codex.request("[[say:Answer from another model.]]", model="gpt-5.4")))

        tool = codex.run("tool", codex.request("Run it. [[shell:echo hello from the tool]][[say:The command printed hello.]]"))
        runs.append(tool)

        runs.append(codex.run("tool_error", codex.request("[[shell:ls /nonexistent-corral-dir]][[say:The listing failed.]]")))

        sent: list[float] = []
        interrupted = codex.run(
            "interrupt_tool",
            codex.request("Wait a bit. [[shell:sleep 30.123 & sleep 30.456]][[say:never said]]"),
            on_line=interrupt_when(is_command_started, "sleep 30.456", sent),
            signalled_at=sent,
        )
        interrupted.note = "SIGINT to the CLI's process group once `sleep 30.456` was running"
        runs.append(interrupted)

        before = len(server.model_requests())
        after_stop = codex.run(
            "resume_after_interrupt",
            codex.request("Go on. [[say:Resumed after the stop.]]", session_id=thread_id(interrupted)),
        )
        runs.append(after_stop)
        items = server.model_requests()[before].body["input"]
        outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        checks.append(f"resume_after_interrupt: the dangling call's output sent on resume: {json.dumps(outputs)[:400]}")

        sent = []
        silent = codex.run(
            "interrupt_stream",
            codex.request("[[silent]]"),
            on_line=interrupt_when(wait_for_model_request(server, len(server.model_requests()) + 1), None, sent),
            signalled_at=sent,
        )
        silent.note = "SIGINT to the group while the model stream was open and silent"
        runs.append(silent)

        bg = codex.run("background", codex.request("[[shell:nohup sleep 300.789 >/dev/null 2>&1 &]][[say:Started it.]]"))
        bg.note = "a normal turn whose tool starts `nohup sleep 300.789 &`"
        runs.append(bg)

        escaped = codex.run("background_setsid", codex.request("[[shell:setsid nohup sleep 300.987 >/dev/null 2>&1 &]][[say:Started it.]]"))
        escaped.note = "a normal turn whose tool starts `setsid nohup sleep 300.987 &`"
        runs.append(escaped)

        runs.append(codex.run("slow_text", codex.request("[[slow:1]][[say:A slowly streamed answer in several pieces.]]")))

        attended = codex.run("attended_tool", codex.request("[[shell:echo attended]][[say:Ran without the unattended settings.]]", unattended=False))
        attended.note = "unattended=False: codex's own approval and sandbox defaults"
        runs.append(attended)

        stale = codex.run("stale_session", codex.request("[[say:x]]", session_id="00000000-0000-4000-8000-000000000000"))
        stale.note = "resume of a thread id (a UUID) that does not exist"
        runs.append(stale)

        stale_name = codex.run("stale_name", codex.request("[[say:A new thread instead.]]", session_id="no-such-thread-name"))
        stale_name.note = "resume of a non-UUID id that matches no thread name: codex starts a new thread"
        runs.append(stale_name)

        server.fail = (400, {"error": {"message": "Invalid request: the fake server rejects this.", "type": "invalid_request_error", "code": "invalid_value"}})
        runs.append(codex.run("error_400", codex.request("[[say:x]]")))
        server.fail = (500, {"error": {"message": "The fake server broke.", "type": "server_error"}})
        runs.append(codex.run("error_500", codex.request("[[say:x]]")))
        server.fail = None

    version = PACKAGES["codex"].rsplit("@", 1)[1]
    for run in runs:
        (out / f"{run.name}.jsonl").write_text("".join(line + "\n" for line in run.stdout))
        (out / f"{run.name}.stderr.txt").write_text(run.stderr.replace(tmp, "$TMP"))
    write_readme(out, runs, checks, version, tmp)
    for run in runs:
        print(f"{run.name}: rc={run.returncode} {run.seconds:.2f}s lines={len(run.stdout)} survivors={run.survivors}")
    for check in checks:
        print(check)
    return 0


def write_readme(out: Path, runs: list[Run], checks: list[str], version: str, tmp: str) -> None:
    """Describe how every capture was made."""
    def show(argv: tuple[str, ...]) -> str:
        words = ["codex", *argv[1:]]
        return " ".join(json.dumps(w) if (" " in w or not w) else w for w in words).replace(tmp, "$TMP")

    lines = [
        "# codex captures",
        "",
        f"Real stdout of `@openai/codex@{version}` (`codex exec --json`), regenerated by",
        "`.venv/bin/python scripts/capture_codex.py`. Each turn ran offline against",
        "`tests/fakemodel/openai_responses.py` on 127.0.0.1, with a private HOME and TMPDIR, ",
        "`CODEX_HOME=$HOME/.codex` holding the adapter's `config.toml` (provider `corral`,",
        "`base_url=http://127.0.0.1:PORT/v1`, `env_key=OPENAI_API_KEY`, approval `never`,",
        "sandbox `danger-full-access`, analytics off), stdin `/dev/null`, its own session.",
        "`NAME.jsonl` is stdout verbatim; `NAME.stderr.txt` is stderr.",
        "",
        "| capture | argv (after the binary path) | exit | time | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        notes = run.note
        if run.signalled_at is not None:
            notes += f"; exited {run.signalled_at * 1000:.0f} ms after the signal"
        if run.survivors:
            notes += f"; still running afterwards: {', '.join(f'`{s}`' for s in run.survivors)}"
        elif run.note:
            notes += "; nothing of the turn was left running"
        lines.append(f"| `{run.name}` | `{show(run.argv)}` | {run.returncode} | {run.seconds:.2f} s | {notes} |")
    lines += ["", "Checks made while capturing:", ""] + [f"- {c}" for c in checks] + [""]
    (out / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "data" / "captures" / "codex"))
