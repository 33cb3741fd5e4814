"""What a fake model should do, read from markers in the user's prompt.

Markers (any number, anywhere in the prompt):

``[[say:TEXT]]``      answer with TEXT (default: ``ok: <first 40 chars of the prompt>``)
``[[shell:CMD]]``     first call the CLI's shell tool with CMD; answer once the result is back
``[[slow:SECONDS]]``  stream the answer in small pieces spread over SECONDS
``[[silent]]``        send the response headers, then nothing until the client goes away
``[[todos]]``         (claude) call TodoWrite with a three-step plan first
``[[loop:N]]``        (claude, codex) with ``shell``: call the shell tool N times, then answer;
                      ``[[loop]]``: call it again after every result, never answering (a turn
                      only a budget or a stop ends)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER = re.compile(r"\[\[(say|shell|slow|silent|todos|loop)(?::(.*?))?\]\]", re.S)


@dataclass(frozen=True)
class Script:
    """The behaviour a prompt asks of the fake model."""

    say: str
    shell: str | None = None
    slow: float = 0.0
    silent: bool = False
    todos: bool = False
    loop: int | None = None
    """Shell calls to make before answering (0: without end); None: one."""

    def shell_again(self, calls: int) -> bool:
        """Whether to call the shell tool (again) after ``calls`` calls for this prompt."""
        if self.shell is None:
            return False
        if self.loop is None:
            return calls == 0
        return self.loop == 0 or calls < self.loop

    def chunks(self, n: int = 8) -> list[str]:
        """The answer split into about ``n`` pieces, for streaming."""
        text = self.say
        size = max(1, len(text) // n)
        return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def read_script(prompt: str) -> Script:
    """Parse the markers in ``prompt``."""
    say = None
    shell = None
    slow = 0.0
    silent = False
    todos = False
    loop = None
    for kind, arg in MARKER.findall(prompt):
        if kind == "say":
            say = arg
        elif kind == "shell":
            shell = arg
        elif kind == "slow":
            slow = float(arg or 2)
        elif kind == "silent":
            silent = True
        elif kind == "todos":
            todos = True
        elif kind == "loop":
            loop = int(arg or 0)
    if say is None:
        say = "ok: " + MARKER.sub("", prompt).strip()[:40]
    return Script(say=say, shell=shell, slow=slow, silent=silent, todos=todos, loop=loop)
