"""The demo agent: a small program that behaves like a real agent CLI where it matters.

It speaks the generic line protocol (see :mod:`adapters.generic`) and needs no model API:

* prints its session id first, and remembers the conversation by it across turns
  (in ``$HOME/.demo-agent/``), so a follow-up after a stop resumes the same session;
* streams its reply a line at a time;
* reports a todo plan;
* for a prompt that asks for a *long* task, runs a tool: a child in its own process group
  and a grandchild in a new session (``setsid``) that holds stdout open — exactly the shape
  that outlives a naive ``killpg``;
* exits promptly on SIGINT (status 130), leaving its tool's setsid grandchild behind for
  the supervisor to find, as Gemini CLI does.

Words in the prompt steer it: ``long`` (run the tool for ``long N`` seconds, default 600),
``plan`` (report a three-step plan and finish step one), ``fail`` (report an error),
``silent`` (print the session id, then nothing for a long time).

The plan is kept with the conversation. When the supervisor nudges the agent ("You have N
remaining task(s) in your plan..."), it works through the steps left and reports the plan
complete, so one nudge does its job.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

# The tool: a shell-like child that starts a setsid grandchild sharing its stdout.
# It says so on the shared stdout once the whole tree exists.
TOOL = r"""
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, lambda *_: os._exit(130))  # dies of ^C at once, as `sleep` does
seconds = float(sys.argv[1])
helper = subprocess.Popen([sys.executable, "-c", "import time,sys; time.sleep(float(sys.argv[1]))", str(seconds)],
                          start_new_session=True)
print(json.dumps({"type": "status", "text": f"tool running (pid {os.getpid()}, setsid helper pid {helper.pid})"}),
      flush=True)
time.sleep(seconds)
"""


def emit(kind: str, **fields: object) -> None:
    """Print one protocol line and flush it at once, as a streaming CLI does."""
    print(json.dumps({"type": kind, **fields}), flush=True)


def state_dir() -> Path:
    """Where conversations are kept (the agent's private HOME)."""
    path = Path(os.environ.get("HOME", ".")) / ".demo-agent"
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_json(file: Path, data: object) -> None:
    """Write through a temporary file and a rename, so the file is never half written."""
    tmp = file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, file)


#: Words of the supervisor's nudge ("You have N remaining task(s) in your plan. ...").
NUDGE = re.compile(r"\bremaining task\(s\) in your plan\b")
STEPS = ["read the code", "make the change", "run the tests"]


def report_plan(plan: list[dict[str, str]], file: Path) -> None:
    """Print the plan and keep it with the conversation."""
    emit("todos", todos=plan)
    save_json(file, plan)


def finish_plan(plan_file: Path, delay: float) -> list[str]:
    """Work through the steps the plan still has; return what was done."""
    plan: list[dict[str, str]] = json.loads(plan_file.read_text()) if plan_file.exists() else []
    done: list[str] = []
    for item in plan:
        if item["status"] in ("pending", "in_progress"):
            item["status"] = "in_progress"
            report_plan(plan, plan_file)
            time.sleep(delay)
            item["status"] = "completed"
            done.append(item["content"])
    if plan:
        report_plan(plan, plan_file)
    return done


def main(argv: list[str]) -> int:
    """Run one turn."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    session = None
    delay = float(os.environ.get("DEMO_AGENT_DELAY", "0.05"))
    args = list(argv)
    if len(args) >= 2 and args[0] == "--session":
        session, args = args[1], args[2:]
    if args[:1] == ["--"]:  # the end of options the generic adapter puts before the prompt
        args = args[1:]
    prompt = " ".join(args).strip()
    if not prompt:
        print("usage: demo_agent [--session ID] PROMPT", file=sys.stderr)
        return 2
    store = state_dir()
    history: list[dict[str, str]] = []
    if session is not None:
        file = store / f"{session}.json"
        if not file.exists():
            emit("error", text=f"No conversation found with session ID: {session}")
            return 1
        history = json.loads(file.read_text())
    else:
        session = uuid.uuid4().hex[:12]
    file = store / f"{session}.json"
    earlier = [h["text"] for h in history if h["role"] == "user"]
    history.append({"role": "user", "text": prompt})
    # Saved (atomically) before the id is printed: a stop at any moment leaves an id that
    # names a whole conversation file.
    save_json(file, history)
    emit("session", id=session)

    words = prompt.lower()
    if "silent" in words:
        time.sleep(3600)
        return 0
    emit("status", text="thinking")
    time.sleep(delay)
    plan_file = store / f"{session}.plan.json"
    if NUDGE.search(prompt):
        done = finish_plan(plan_file, delay)
        reply = [f"Continuing the plan: {', '.join(done)} — done." if done else "The plan has nothing left to do."]
        for line in reply:
            emit("text", text=line)
        history.append({"role": "agent", "text": " ".join(reply)})
        save_json(file, history)
        emit("result", text="")
        return 0
    if "fail" in words:
        emit("error", text="the demo agent was asked to fail")
        return 1
    planned = "plan" in words or "long" in words
    if planned:
        report_plan(
            [{"content": s, "status": "in_progress" if i == 0 else "pending"} for i, s in enumerate(STEPS)], plan_file
        )
    if "long" in words:
        match = re.search(r"long\s+(\d+(?:\.\d+)?)", words)
        seconds = float(match.group(1)) if match else 600.0
        emit("tool", name="shell", input={"command": f"sleep {seconds:g}  # with a setsid helper"})
        subprocess.run([sys.executable, "-c", TOOL, str(seconds)], check=False)
        emit("text", text=f"The long task ran for {seconds:g} s.")
    reply = [
        f"You said: {prompt}",
        (
            f"This conversation ({session}) had {len(earlier)} earlier message(s); the last was: {earlier[-1]!r}."
            if earlier
            else f"This is the start of conversation {session}."
        ),
    ]
    for line in reply:
        time.sleep(delay)
        emit("text", text=line)
    if planned:
        report_plan(
            [{"content": s, "status": "completed" if i == 0 else "pending"} for i, s in enumerate(STEPS)], plan_file
        )
    history.append({"role": "agent", "text": " ".join(reply)})
    save_json(file, history)
    emit("result", text="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
