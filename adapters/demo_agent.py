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
``silent`` (print the session id, then nothing for a long time), ``stream N`` (print a line of
text every 0.1 s for N seconds before the reply: one long run of text, which corral shows as a
draft while it is written).

It hands work to other agents of its channel, by ``@mentions`` corral routes (its own name
comes in ``$DEMO_AGENT_NAME``; every hand-off it writes is signed ``— NAME``, so the agent
that receives it knows whom to answer):

* ``ask OTHER to TASK`` (``@OTHER`` too) — it does its own part of the request (the words
  before ``ask``), then writes ``@OTHER please TASK — NAME`` as a message of its own, which
  corral hands to OTHER; with a ``long`` task of its own the hand-off comes first, so both
  agents work at once;
* ``ping-pong with OTHER`` — it writes ``@OTHER ping — NAME``; an agent that receives
  ``@NAME ping — OTHER`` answers ``@OTHER pong — NAME`` and the reverse, for ever: corral's
  ``max_hops`` ends the chain;
* ``please review`` (from another agent) — a short review, signed, that mentions no one: the
  chain ends there.

Only the message it answers steers it: a catch-up corral puts before it (what the channel
said since its last turn) is counted, not obeyed. When it quotes a message it drops the
``@`` of each mention, so a quote never hands anything off.

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
from dataclasses import dataclass
from pathlib import Path

# The tool: a shell-like child that starts a setsid grandchild sharing its stdout.
# It says so on the shared stdout once the whole tree exists.
TOOL = r"""
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, lambda *_: os._exit(130))  # dies of ^C at once, as `sleep` does
seconds = float(sys.argv[1])
helper = subprocess.Popen([sys.executable, "-c", "import time,sys; time.sleep(float(sys.argv[1]))", str(seconds)],
                          start_new_session=True)
# In a sandbox the pids are its pid namespace's own: it names the namespace too.
ns = os.stat("/proc/self/ns/pid").st_ino
print(json.dumps({"type": "status",
                  "text": f"tool running (pid {os.getpid()}, setsid helper pid {helper.pid}, pid namespace {ns})"}),
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


#: corral's catch-up block (supervisor/core/catchup.py): its first line, and the line before the answered message.
CATCH_UP_HEADER = "[Catch-up: messages in this channel since your last turn"
CATCH_UP_END = re.compile(r"^\[End of catch-up\. The message you are answering, from (?P<author>[^\]]*):\]$", re.M)
#: A hand-off's signature: the agent that wrote it.
SIGNED = re.compile(r"\s—\s(?P<name>[\w-]+)\s*$")
ASK = re.compile(r"\bask\s+@?(?P<name>[\w-]+)\s+to\s+(?P<task>[^.!?\n]+)", re.I)
PING_PONG = re.compile(r"\bping-pong with\s+@?(?P<name>[\w-]+)", re.I)


@dataclass(frozen=True)
class Request:
    """The message a turn answers, apart from the catch-up corral may put before it."""

    text: str
    caught_up: int = 0
    """Messages of the catch-up (what the channel said since this agent's last turn)."""
    sender: str | None = None
    """The agent that wrote it (its signature, or the catch-up's footer), None for a human."""


def read_request(prompt: str) -> Request:
    """Split corral's catch-up from the answered message (the prompt's last part, unchanged)."""
    caught_up, footer_author = 0, None
    if prompt.startswith(CATCH_UP_HEADER):
        end = CATCH_UP_END.search(prompt)
        if end is not None:
            lines = prompt[: end.start()].splitlines()[1:]
            caught_up = sum(1 for line in lines if not line.startswith("["))
            footer_author = end["author"]
            prompt = prompt[end.end() + 1:]
    signed = SIGNED.search(prompt)
    sender = signed["name"] if signed else None
    if sender is None and footer_author is not None and footer_author.startswith("agent:"):
        sender = footer_author.removeprefix("agent:")
    return Request(prompt, caught_up, sender)


def quote(text: str) -> str:
    """``text`` with the ``@`` of every mention dropped: quoted, it hands nothing off."""
    return re.sub(r"(?<![\w@.])@(?=[\w-])", "", text)  # a mention as corral reads one: not me@host


def hand_off(request: Request, me: str) -> str | None:
    """The hand-off line a request calls for (one that mentions another agent), or None."""
    words = request.text
    ping = re.match(rf"\s*@{re.escape(me)}\s+(ping|pong)\b", words, re.I)
    if ping and request.sender and request.sender != me:
        answer = "pong" if ping.group(1).lower() == "ping" else "ping"
        return f"@{request.sender} {answer} — {me}"
    started = PING_PONG.search(words)
    if started and started["name"] != me:
        return f"@{started['name']} ping — {me}"
    ask = ASK.search(words)
    if ask and ask["name"] != me:
        return f"@{ask['name']} please {ask['task'].strip()} — {me}"
    return None


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

    me = os.environ.get("DEMO_AGENT_NAME", "demo")
    request = read_request(prompt)
    handed = hand_off(request, me)
    ask = ASK.search(request.text)
    # Only the answered message steers the agent, and only its own part of it.
    words = (request.text[: ask.start()] if ask else request.text).lower()
    if "silent" in words:
        time.sleep(3600)
        return 0
    emit("status", text="thinking")
    time.sleep(delay)
    if request.sender is not None and (handed is not None or re.search(r"\breview\b", words)):
        # Another agent's hand-off: one line answers it (the next hand-off, or the review).
        answer = handed or f"Reviewed {request.sender}'s change: two small nits, nothing blocking. — {me}"
        emit("text", text=answer)
        history.append({"role": "agent", "text": answer})
        save_json(file, history)
        emit("result", text="")  # ends the text's run: corral stores it, and hands it on
        return 0
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
    streaming = re.search(r"\bstream\s+(\d+(?:\.\d+)?)", words)
    if streaming:
        end = time.monotonic() + float(streaming.group(1))
        count = 0
        while time.monotonic() < end:
            emit("text", text=f"Streaming line {count}, printed at {time.time():.3f}.")
            count += 1
            time.sleep(0.1)
    planned = "plan" in words or "long" in words
    if planned:
        report_plan(
            [{"content": s, "status": "in_progress" if i == 0 else "pending"} for i, s in enumerate(STEPS)], plan_file
        )
    if handed is not None and "long" in words:
        emit("text", text=handed)  # first (the tool's event ends its run): the other agent works meanwhile
    if "long" in words:
        match = re.search(r"long\s+(\d+(?:\.\d+)?)", words)
        seconds = float(match.group(1)) if match else 600.0
        emit("tool", name="shell", input={"command": f"sleep {seconds:g}  # with a setsid helper"})
        subprocess.run([sys.executable, "-c", TOOL, str(seconds)], check=False)
        emit("text", text=f"The long task ran for {seconds:g} s.")
    reply = [
        f"You said: {quote(request.text)}",
        *([f"(I caught up on {request.caught_up} message(s) first.)"] if request.caught_up else []),
        (
            f"This conversation ({session}) had {len(earlier)} earlier message(s); "
            f"the last was: {quote(read_request(earlier[-1]).text)!r}."
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
    if handed is not None and "long" not in words:
        # Last, as a message of its own (the status ends the reply's run): the other agent
        # starts once this one has said everything.
        emit("status", text=f"handing off: {quote(handed)}")
        emit("text", text=handed)
    history.append({"role": "agent", "text": " ".join(reply)})
    save_json(file, history)
    emit("result", text="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
