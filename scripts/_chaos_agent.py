#!/usr/bin/env python
"""The agent chaos_stop.py and faults.py run: the generic line protocol, with a stop's hard cases.

The prompt is the last argument, or stdin when the agent is configured with
``prompt = "stdin"`` (then the prompt is read to EOF first); after a catch-up (what the agent
missed in a channel with several agents), the message it answers. Its first word is the job:

* ``short ID`` — one status, one message, a result (a quick turn).
* ``long ID`` — status, a plan (todos: one in progress, two pending), a ``bash`` tool that
  double-forks (a ``setsid`` grandchild ``sleep`` and, under it, a daemonized great-grandchild
  whose parent exits at once: it is nobody's descendant any more, only the turn's environment
  marker finds it), then text every 20 ms for 30 s. Nothing of it ends on its own in a trial.
* ``burst ID`` — 400 lines of text as fast as it can, then a result (a stop lands while the
  supervisor is still reading: the flushing phase).
* ``poison ID`` — output with a lone surrogate escape, a NUL and bytes that are not UTF-8.

With ``$CHAOS_RING`` (``ma,mb,mc``: the agents of a multi-agent channel, ``$CHAOS_AGENT``
being this one) it also hands work on, by ``@mentions`` corral routes:

* ``chain ID`` — one message ``@NEXT chain ID`` (NEXT: the next agent of the ring), a result;
  the chain goes on until corral's ``max_hops`` ends it;
* ``chainlong ID`` — the message ``@NEXT chainlong ID`` first, then the ``long`` job: every
  agent the chain reaches runs its tool at the same time;
* ``fan ID`` — one message ``@OTHER1 @OTHER2 chain ID``: two chains at once.

The prompt's job is read from the message the turn answers: corral's catch-up before it
is skipped, and so are the ``@mentions`` it starts with. On SIGINT a ring agent's flush
also mentions the next agent: stored, it would be handed on (it never may be).

Every job first appends ``{"turn", "pid", "t", "id", "job"}`` to ``$CHAOS_DIR/started.jsonl``
(``t`` is ``time.monotonic()``, the clock the instrumented daemon traces with): the proof a
turn's process ran its own code; and as it exits by itself, ``{"turn", "t"}`` to
``ended.jsonl``. On SIGINT it flushes ``FLUSHED-ON-SIGINT <ID>`` as text, a session id and a
plan update, then exits 130 — leftover output the supervisor must discard, except the session
id. Run it under ``sh -c "trap '' INT; exec ..."`` and SIGINT is ignored from
exec on (inherited ``SIG_IGN``): then only SIGKILL ends it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

FLUSH_TEXT = "FLUSHED-ON-SIGINT"
PLAN = [
    {"content": "read the code", "status": "in_progress"},
    {"content": "change it", "status": "pending"},
    {"content": "run the tests", "status": "pending"},
]


def emit(obj: object) -> None:
    """One protocol line, flushed at once."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def started(job: str, ident: str) -> None:
    """Append this process's start to the started log (one write: lines never interleave)."""
    line = json.dumps({"turn": os.environ.get("CORRAL_TURN", ""), "pid": os.getpid(), "t": time.monotonic(),
                       "id": ident, "job": job, "agent": os.environ.get("CHAOS_AGENT", "")}) + "\n"
    fd = os.open(os.path.join(os.environ["CHAOS_DIR"], "started.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


#: corral's catch-up block ends with this line; the answered message follows it.
CATCH_UP_END = "[End of catch-up. The message you are answering, from "


def answered(prompt: str) -> str:
    """The message a turn answers: the prompt after corral's catch-up, if it has one."""
    at = prompt.rfind(CATCH_UP_END)
    return prompt[prompt.index("\n", at) + 1:] if at >= 0 and prompt.startswith("[Catch-up:") else prompt


def ring() -> tuple[list[str], str]:
    """The multi-agent ring and this agent's name (``([], "")`` outside one)."""
    names = [n for n in os.environ.get("CHAOS_RING", "").split(",") if n]
    return names, os.environ.get("CHAOS_AGENT", "")


def next_agents(job: str) -> list[str]:
    """The agents a ring job hands on to: the next one (``fan``: both others)."""
    names, me = ring()
    if me not in names:
        return []
    at = names.index(me)
    others = names[at + 1:] + names[:at]
    return others if job == "fan" else others[:1]


def on_sigint(ident: str) -> None:
    """Flush what a real CLI flushes when interrupted, then exit."""
    mention = "".join(f" @{name}" for name in next_agents("chain"))

    def handler(signum: int, frame: object) -> None:
        emit({"type": "text", "text": f"{FLUSH_TEXT} {ident}{mention}"})
        emit({"type": "session", "id": f"chaos-{ident}"})
        emit({"type": "todos", "todos": [{**item, "status": "in_progress"} for item in PLAN]})
        os._exit(130)

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, handler)


def double_fork() -> None:
    """A setsid grandchild (sleep) and a daemonized great-grandchild that outlives its parent."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        inner = os.fork()
        if inner == 0:
            # The daemon: its own session again, its parent gone: reparented away from the turn.
            if os.fork() == 0:
                os.setsid()
                os.execvp("sleep", ["sleep", "300"])
            os._exit(0)
        os.waitpid(inner, 0)
        os.execvp("sleep", ["sleep", "300"])


def ended() -> None:
    """Append this turn's end by itself (``{"turn", "t"}``) to ``$CHAOS_DIR/ended.jsonl``, as it exits:
    a late-registered turn whose leader's status is its own must have ended before the kill."""
    line = json.dumps({"turn": os.environ.get("CORRAL_TURN", ""), "t": time.monotonic()}) + "\n"
    fd = os.open(os.path.join(os.environ["CHAOS_DIR"], "ended.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def main() -> int:
    code = run()
    ended()
    return code


def run() -> int:
    """The job the prompt names; its exit status."""
    prompt = sys.stdin.read() if os.environ.get("CHAOS_STDIN") == "1" else sys.argv[-1]
    words = answered(prompt).split()
    while words and words[0].startswith("@"):  # the mentions that addressed it
        words.pop(0)
    job, ident = [*words, "?", "?"][:2]
    started(job, ident)
    on_sigint(ident)
    emit({"type": "session", "id": f"chaos-{ident}"})
    emit({"type": "status", "text": "thinking"})
    if job in ("chain", "chainlong", "fan"):
        targets = next_agents(job)
        if targets:
            # A message of its own: the next event (the result, or the long job's plan) ends its run.
            handed = "chain" if job == "fan" else job
            emit({"type": "text", "text": " ".join(f"@{t}" for t in targets) + f" {handed} {ident}"})
        if job == "chainlong":
            job = "long"
        else:
            emit({"type": "result", "text": ""})
            return 0
    if job == "long":
        emit({"type": "todos", "todos": PLAN})
        double_fork()
        emit({"type": "tool", "name": "bash", "input": "sleep 300 &"})
        emit({"type": "status", "text": "tool running"})
        for i in range(1500):
            emit({"type": "text", "text": f"working {ident} {i}\n"})
            time.sleep(0.02)
    elif job == "burst":
        for i in range(400):
            emit({"type": "text", "text": f"line {ident} {i}\n"})
    elif job == "poison":
        sys.stdout.write('{"type": "text", "text": "half an emoji \\ud83d and a NUL \\u0000"}\n')
        sys.stdout.flush()
        sys.stdout.buffer.write(b"not utf-8: \xff\xfe\xed\n")
        sys.stdout.buffer.flush()
    emit({"type": "text", "text": f"done {ident}"})
    emit({"type": "result", "text": f"done {ident}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
