#!/usr/bin/env python3
"""A stand-in for ``aider --message``: same flags, same output shape, no network, no model.

It exists so corral's tests can run an "aider" turn anywhere. What it does, per aider
0.86.2's documented behaviour:

* parses aider's non-interactive flags with argparse; an unknown flag is an error, exit 2;
* prints aider's banner (``Aider v…``, ``Model: …``, ``Git repo: none``, ``Repo-map: …``),
  then ``Restored previous conversation history.`` when it restored one, a blank line,
  the reply, and ``Tokens: N sent, M received.``;
* appends to the chat history file in aider's markdown (``# aider chat started at``,
  ``> `` tool lines, ``#### `` user lines, the reply), and with ``--restore-chat-history``
  reads it back the way aider does — the reply says how many earlier user messages it
  found (``earlier user messages: N``), which proves resumption;
* reads the prompt markers of :mod:`scripts.fakemodel.script` from the message:
  ``[[say:TEXT]]`` the reply, ``[[slow:S]]`` stream it one word per line over S seconds,
  ``[[silent]]`` hang before replying, ``[[shell:CMD]]`` run CMD first with ``sh -c`` *in a
  new session* (as the other agent CLIs' shell tools do; real aider would not run it under
  ``--yes-always``) and wait for it, printing ``Running CMD``, its output and ``Added N lines
  of output to the chat.``; ``[[fail]]`` (fake only) print aider's API error and exit 0,
  as aider does after giving up on a failing API;
* on SIGINT exits 130 at once, killing nothing — a command it started keeps running, so
  only corral's sweep can clean it up.

Environment: ``FAKE_AIDER_PID_FILE`` — if set, the pid of each shell command is written
there as soon as it starts (so a test can check that the sweep killed it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

VERSION = "0.86.2"
MARKER = re.compile(r"\[\[(say|shell|slow|silent|fail)(?::(.*?))?\]\]", re.S)


def on_sigint(signum: int, frame: object) -> None:
    """Leave at once, like an agent that forgets its tools: exit 130, kill nothing."""
    try:
        sys.stdout.write("\n^C KeyboardInterrupt\n")
        sys.stdout.flush()
    finally:
        os._exit(130)


def build_parser() -> argparse.ArgumentParser:
    """aider's flags that matter without a terminal (``aider --help`` of 0.86.2)."""
    p = argparse.ArgumentParser(prog="aider", description="fake aider for corral's tests")
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument("--model")
    p.add_argument("--openai-api-key")
    p.add_argument("--openai-api-base")
    p.add_argument("--edit-format", "--chat-mode")
    p.add_argument("--timeout", type=float)
    p.add_argument("--message", "--msg", "-m")
    p.add_argument("--message-file", "-f")
    p.add_argument("--yes-always", action="store_true", default=None)
    p.add_argument("--chat-history-file", default=".aider.chat.history.md")
    p.add_argument("--input-history-file", default=".aider.input.history")
    p.add_argument("--analytics-disable", action="store_true")
    p.add_argument("--disable-playwright", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    for name, default in (
        ("restore-chat-history", False),
        ("git", True),
        ("auto-commits", True),
        ("stream", True),
        ("pretty", True),
        ("check-update", True),
        ("show-release-notes", None),
        ("analytics", None),
        ("show-model-warnings", True),
        ("suggest-shell-commands", True),
        ("fancy-input", True),
        ("detect-urls", True),
        ("gitignore", True),
    ):
        p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=default)
    return p


def split_chat_history(text: str) -> list[dict[str, str]]:
    """aider's ``utils.split_chat_history_markdown``: the user and assistant messages."""
    messages: list[dict[str, str]] = []
    user: list[str] = []
    assistant: list[str] = []

    def append(role: str, lines: list[str]) -> None:
        content = "".join(lines)
        if content.strip():
            messages.append({"role": role, "content": content})

    for line in text.splitlines(keepends=True):
        if line.startswith("# "):
            continue
        if line.startswith("> "):
            append("assistant", assistant)
            assistant = []
            append("user", user)
            user = []
            continue
        if line.startswith("#### "):
            append("assistant", assistant)
            assistant = []
            user.append(line[5:])
            continue
        append("user", user)
        user = []
        assistant.append(line)
    append("assistant", assistant)
    append("user", user)
    return messages


class History:
    """The chat history file, appended to the way aider's ``InputOutput`` does."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, text: str) -> None:
        """Append ``text`` (newline-terminated)."""
        if not text.endswith("\n"):
            text += "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)

    def tool(self, line: str) -> None:
        """A ``> `` line: what aider printed besides the reply."""
        self.append(f"> {line.strip()}  \n")

    def user(self, message: str) -> None:
        """The user's message, one ``#### `` line per line."""
        lines = message.splitlines() or ["<blank>"]
        self.append("\n#### " + "  \n#### ".join(lines) + "  \n")

    def reply(self, text: str) -> None:
        """The assistant's reply."""
        self.append("\n" + text.strip() + "\n\n")


def say(line: str = "") -> None:
    """Print one line now: corral reads stdout as it comes."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_shell(command: str, history: History) -> None:
    """Run ``command`` like an agent's shell tool: ``sh -c`` in a new session; wait for it."""
    proc = subprocess.Popen(
        ["sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pid_file = os.environ.get("FAKE_AIDER_PID_FILE")
    if pid_file:
        # With its pid namespace: inside a sandbox the pid is the namespace's (tests' read_pid).
        Path(pid_file).write_text(f"{proc.pid} {os.stat('/proc/self/ns/pid').st_ino}\n")
    # Printed once the command exists (aider prints it just before): a test that waits for
    # this line finds the pid file written.
    say(f"Running {command}")
    history.tool(f"Running {command}")
    assert proc.stdout is not None
    lines = 0
    for raw in proc.stdout:
        say(raw.decode(errors="replace").rstrip("\n"))
        lines += 1
    proc.wait()
    if lines:
        noun = "line" if lines == 1 else "lines"
        say(f"Added {lines} {noun} of output to the chat.")
        history.tool(f"Added {lines} {noun} of output to the chat.")


def main(argv: list[str]) -> int:
    """Run one ``--message`` turn."""
    signal.signal(signal.SIGINT, on_sigint)
    args = build_parser().parse_args(argv)  # exits 2 on an unknown flag, like aider
    if args.message_file is not None:  # aider reads the whole file as the message
        args.message = Path(args.message_file).read_text(encoding="utf-8")
    if args.message is None:
        print("aider: error: this fake only supports --message and --message-file", file=sys.stderr)
        return 2
    if not sys.stdin.isatty():
        print("Warning: Input is not a terminal (fd=0).", file=sys.stderr)

    history = History(Path(args.chat_history_file))
    earlier = split_chat_history(history.path.read_text(encoding="utf-8")) if history.path.exists() else []
    history.append(f"\n# aider chat started at {datetime.datetime.now():%Y-%m-%d %H:%M:%S}\n\n")
    history.tool("fake_aider " + " ".join(argv))
    model = args.model or "gpt-4o"
    banner = [f"Aider v{VERSION}", f"Model: {model} with whole edit format"]
    banner += ["Git repo: none", "Repo-map: disabled"]  # the fake never looks for a repository
    if args.analytics_disable:
        say("Analytics have been permanently disabled.")
    say()
    for line in banner:
        say(line)
        history.tool(line)
    restored = args.restore_chat_history and any(m["role"] == "user" for m in earlier)
    if restored:
        say("Restored previous conversation history.")
        history.tool("Restored previous conversation history.")
    say()
    if args.input_history_file != os.devnull:
        with open(args.input_history_file, "a", encoding="utf-8") as f:
            f.write(f"\n# {datetime.datetime.now()}\n+{args.message}\n")

    message = args.message
    history.user(message)
    markers = {kind: value for kind, value in MARKER.findall(message)}
    earlier_users = sum(1 for m in earlier if m["role"] == "user") if args.restore_chat_history else 0

    if "silent" in markers:
        while True:  # a model that never answers; only a signal ends this
            signal.pause()
    if "fail" in markers:
        for line in (
            "litellm.InternalServerError: InternalServerError: OpenAIException - Connection error.",
            "The API provider's servers are down or overloaded.",
        ):
            say(line)
            history.tool(line)
        return 0
    if "shell" in markers:
        run_shell(markers["shell"], history)
        say()

    text = markers.get("say") or "ok: " + MARKER.sub("", message).strip()[:40]
    reply = f"{text}\n\nearlier user messages: {earlier_users}"
    slow = float(markers["slow"] or 2) if "slow" in markers else 0.0
    if slow:
        # One word per line, spread over ``slow`` seconds: a stop mid-answer finds
        # some of the reply already read (real aider streams partial lines).
        words = text.split()
        for word in words:
            say(word)
            time.sleep(slow / max(1, len(words)))
        say()
        say(f"earlier user messages: {earlier_users}")
    else:
        for line in reply.splitlines():
            say(line)
    history.reply(reply)
    usage = f"Tokens: {len(message) // 4 + 600} sent, {len(reply) // 4} received."
    say(usage)
    history.tool(usage)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
