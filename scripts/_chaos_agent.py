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

Every job first appends ``{"turn", "pid", "t", "id", "job"}`` to ``$CHAOS_DIR/started.jsonl``
(``t`` is ``time.monotonic()``, the clock the instrumented daemon traces with): the proof a
turn's process ran its own code. On SIGINT it flushes ``FLUSHED-ON-SIGINT <ID>`` as text, a
session id and a plan update, then exits 130 — leftover output the supervisor must discard,
except the session id. Run it under ``sh -c "trap '' INT; exec ..."`` and SIGINT is ignored from
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
                       "id": ident, "job": job}) + "\n"
    fd = os.open(os.path.join(os.environ["CHAOS_DIR"], "started.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def on_sigint(ident: str) -> None:
    """Flush what a real CLI flushes when interrupted, then exit."""

    def handler(signum: int, frame: object) -> None:
        emit({"type": "text", "text": f"{FLUSH_TEXT} {ident}"})
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


def main() -> int:
    prompt = sys.stdin.read() if os.environ.get("CHAOS_STDIN") == "1" else sys.argv[-1]
    if prompt.startswith("[Catch-up:"):  # what it missed in the channel, then its message, last
        prompt = prompt.split("\n[End of catch-up.", 1)[-1].partition("\n")[2]
    job, _, ident = prompt.strip().partition(" ")
    ident = ident.split()[0] if ident else "?"
    started(job, ident)
    on_sigint(ident)
    emit({"type": "session", "id": f"chaos-{ident}"})
    emit({"type": "status", "text": "thinking"})
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
