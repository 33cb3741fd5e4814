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

It takes messages mid-turn ("steering"): corral keeps its stdin open and writes each
message handed to the running turn there as one JSON line, ``{"type": "user", "text": …}``
(:func:`steer_line`), which a thread reads so the agent never blocks on it. While its
``long N`` tool runs, while ``stream N`` streams, and before it replies, it takes each
message at once: a status ``steered: TEXT`` says so, and its reply adds ``You also said:
TEXT`` for each. A message that says ``enough`` ends the long tool early (its whole tree),
or the stream, so the reply follows at once. One that comes after the reply, before corral has closed
stdin (it does so on reading the ``result``), gets a second answer of its own in the same
turn, as Claude Code gives one; the agent then waits for that close, at most
:data:`AFTER_RESULT_SECONDS`. On a terminal, or with stdin at ``/dev/null``, it reads
nothing.

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
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

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
# Ended early (a steered "enough"): the helper goes too, as a shell's tool tree would.
signal.signal(signal.SIGTERM, lambda *_: (helper.kill(), os._exit(143)))
print(json.dumps({"type": "status",
                  "text": f"tool running (pid {os.getpid()}, setsid helper pid {helper.pid}, pid namespace {ns})"}),
      flush=True)
time.sleep(seconds)
"""


#: How long the agent waits, after its result, for corral to close its stdin (corral does it
#: on reading the result; a program that keeps it open must not hold the agent for ever).
AFTER_RESULT_SECONDS = 10.0


def steer_line(text: str) -> bytes:
    """One message handed to the running turn, as corral writes it on the agent's stdin."""
    return json.dumps({"type": "user", "text": text}).encode() + b"\n"


def read_steer_line(line: bytes) -> str | None:
    """The text of a :func:`steer_line`, or None for a line that is not one."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    text = obj.get("text") if isinstance(obj, dict) and obj.get("type") == "user" else None
    return text if isinstance(text, str) else None


@dataclass
class Inbox:
    """The messages corral hands the running turn, read from stdin by a thread of their own."""

    messages: list[str] = field(default_factory=list)
    eof: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)

    def listen(self, stream: BinaryIO | None) -> None:
        """Read ``stream`` in the background (nothing when it is a terminal, or missing)."""
        if stream is None or stream.isatty():
            self.eof = True
            return
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: BinaryIO) -> None:
        for line in stream:
            text = read_steer_line(line)
            if text is not None:
                with self.changed:
                    self.messages.append(text)
                    self.changed.notify_all()
        with self.changed:
            self.eof = True
            self.changed.notify_all()

    def wake(self) -> None:
        """Wake a :meth:`wait` to look at its ``until`` again."""
        with self.changed:
            self.changed.notify_all()

    def wait(self, timeout: float | None, until: Callable[[], bool] = lambda: False) -> list[str]:
        """The messages that came, once one has (or ``until()`` holds, or ``timeout`` passed)."""
        with self.changed:
            self.changed.wait_for(lambda: bool(self.messages) or until(), timeout)
            taken, self.messages = self.messages, []
        return taken


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


@dataclass
class Run:
    """One run of the agent: its conversation, where it is kept, and the messages handed to it."""

    history: list[dict[str, str]]
    file: Path
    inbox: Inbox
    steered: list[str] = field(default_factory=list)
    """Every message handed to this run so far, in order."""

    def take(self, messages: list[str]) -> None:
        """Say at once that each message came, and keep it with the conversation."""
        for text in messages:
            emit("status", text=f"steered: {quote(text)}")
            self.steered.append(text)
            self.history.append({"role": "user", "text": text})

    def also(self, messages: list[str] | None = None) -> list[str]:
        """The reply's lines for the messages handed to the run (quoted: they hand nothing off)."""
        return [f"You also said: {quote(text)}" for text in (self.steered if messages is None else messages)]

    def end(self, said: str) -> None:
        """Keep the answer, print the result; then answer what came before corral closed stdin."""
        self.history.append({"role": "agent", "text": said})
        save_json(self.file, self.history)
        emit("result", text="")  # ends the text's run: corral stores it (and hands it on)
        while not self.inbox.eof:
            later = self.inbox.wait(AFTER_RESULT_SECONDS, until=lambda: self.inbox.eof)
            if not later:
                return  # (closed, or never: the agent does not wait for ever)
            self.take(later)
            answer = self.also(later)
            for line in answer:
                emit("text", text=line)
            self.history.append({"role": "agent", "text": " ".join(answer)})
            save_json(self.file, self.history)
            emit("result", text="")


def enough(messages: list[str]) -> bool:
    """A message handed to the run says ``enough``: the long tool (or the stream) ends early."""
    return any(re.search(r"\benough\b", text, re.I) for text in messages)


def run_tool(seconds: float, run: Run) -> bool:
    """Run the long tool, taking the messages handed to the run meanwhile; True if one said
    ``enough`` and the tool was ended early."""
    tool = subprocess.Popen([sys.executable, "-c", TOOL, str(seconds)])
    finished = threading.Event()

    def reap() -> None:
        tool.wait()
        finished.set()
        run.inbox.wake()

    threading.Thread(target=reap, daemon=True).start()
    cut = False
    while not finished.is_set():
        taken = run.inbox.wait(None, until=finished.is_set)
        run.take(taken)
        if not cut and enough(taken):
            cut = True
            tool.terminate()  # (its SIGTERM handler ends its setsid helper too)
    return cut


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
    inbox = Inbox()
    inbox.listen(sys.stdin.buffer if sys.stdin is not None else None)
    run = Run(history, file, inbox)
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
        run.end(answer)
        return 0
    plan_file = store / f"{session}.plan.json"
    if NUDGE.search(prompt):
        done = finish_plan(plan_file, delay)
        reply = [f"Continuing the plan: {', '.join(done)} — done." if done else "The plan has nothing left to do."]
        for line in reply:
            emit("text", text=line)
        run.end(" ".join(reply))
        return 0
    if "fail" in words:
        emit("error", text="the demo agent was asked to fail")
        return 1
    streaming = re.search(r"\bstream\s+(\d+(?:\.\d+)?)", words)
    if streaming:
        end = time.monotonic() + float(streaming.group(1))
        count = 0
        while time.monotonic() < end and not enough(run.steered):
            emit("text", text=f"Streaming line {count}, printed at {time.time():.3f}.")
            count += 1
            tick = time.monotonic() + 0.1
            while (left := tick - time.monotonic()) > 0 and not enough(run.steered):
                run.take(inbox.wait(left))
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
        began = time.monotonic()
        if run_tool(seconds, run):
            emit("text", text=f"The long task was cut short after {time.monotonic() - began:.1f} s: you said enough.")
        else:
            emit("text", text=f"The long task ran for {seconds:g} s.")
    run.take(inbox.wait(0))
    reply = [
        f"You said: {quote(request.text)}",
        *run.also(),
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
    run.end(" ".join(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
