"""The ``generic`` adapter: any command, plus a small line protocol anyone can speak.

Every stdout line is the agent's text, unless it is a JSON object with a ``type``:

=========  =====================================================================
type       fields
=========  =====================================================================
text       ``text`` — a piece of the answer
status     ``text`` — progress that is not the answer
tool       ``name``, ``input`` — the agent ran a tool
todos      ``todos`` — ``[{"content": str, "status": "pending|in_progress|completed"}]``
session    ``id`` — resume the conversation with this id next turn
result     ``text`` — the final answer; the turn is a success
error      ``text`` — the turn failed
usage      ``input_tokens``, ``output_tokens`` (whole numbers), ``model`` — what the model used since
           the last ``usage`` line (the turn's token budgets and the daily ones count it)
=========  =====================================================================

Consecutive ``text`` pieces and plain lines — a run not broken by any other event — make
one message, one line each (as the streamed deltas of Qwen Code and Gemini CLI make one):
each is parsed as a :class:`Text` delta, the first of a run as is, the next ones after a
newline, and the turn joins them until the next event — or until the agent has been quiet
for a moment, so that text printed before a long silence is shown at once.

The prompt is the last argument, or written to stdin and closed when the agent sets
``prompt = "stdin"``. Once a session id is known, ``resume_args`` (for example
``["--session", "{session}"]``) is inserted before the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._base import (
    Adapter,
    CheckedOptions,
    Error,
    Event,
    Launch,
    OptionProblem,
    Result,
    SessionId,
    Status,
    Text,
    ToolUse,
    TurnRequest,
    Unparsed,
    Usage,
    parse_todos,
    preview,
)

OPTION_KEYS = frozenset({"resume_args", "prompt"})


def resume_arguments(request: TurnRequest) -> tuple[str, ...]:
    """The configured ``resume_args`` with ``{session}`` filled in; empty without a session."""
    if not request.session_id:
        return ()
    template = request.options.get("resume_args") or ()
    if not isinstance(template, list | tuple):
        return ()
    return tuple(str(arg).replace("{session}", request.session_id) for arg in template)


def build_launch(request: TurnRequest) -> Launch:
    """Command, configured args, resume args, then ``--`` and the prompt (or the prompt on stdin).

    The ``--`` ends the command's options, so a prompt such as ``-S touch x`` is never read
    as options. With ``prompt = "stdin"`` the prompt is not in argv at all, where every user
    of the machine can read it (``/proc/PID/cmdline``).
    """
    argv = (*request.command, *request.args, *resume_arguments(request))
    if request.options.get("prompt") == "stdin":
        return Launch(argv=argv, cwd=request.cwd, stdin=request.prompt.encode())
    return Launch(argv=(*argv, "--", request.prompt), cwd=request.cwd)


@dataclass(slots=True)
class GenericParser:
    """Parser for the generic line protocol."""

    saw_result: bool = False
    saw_error: bool = False
    in_text: bool = False
    """A run of text is open: the next piece continues the same message on a new line."""

    def feed(self, line: str) -> list[Event]:
        """Parse one stdout line."""
        return [self._joined(event) for event in self._parse(line)]

    def feed_stderr(self, line: str) -> list[Event]:
        """Nothing: the generic protocol reports failures on stdout; stderr is only logged."""
        return []

    def end_text_run(self) -> None:
        """The turn has stored the open run (the agent went quiet): the next piece starts a new one."""
        self.in_text = False

    def _joined(self, event: Event) -> Event:
        # A session id is not shown, so it does not split the message around it (the turn
        # does not flush text for it either); every other event ends the run.
        if isinstance(event, Text):
            text = "\n" + event.text if self.in_text else event.text
            self.in_text = True
            return Text(text, delta=True)
        if not isinstance(event, SessionId):
            self.in_text = False
        return event

    def _parse(self, line: str) -> list[Event]:
        stripped = line.strip()
        if not stripped.startswith("{"):
            return [Text(line)] if stripped else []
        try:
            obj = json.loads(stripped)
            if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
                return [Text(line)]
            return self._event(obj)
        except (ValueError, RecursionError):
            # Not JSON, or nested deeper than Python recurses (in the decoder, or in what reads
            # or re-encodes the object): an agent's text, never an error of corral's.
            return [Text(line)]

    def _event(self, obj: dict[str, object]) -> list[Event]:
        kind = obj["type"]
        raw = obj.get("text")
        if kind == "result" and raw is None:
            raw = ""
        if kind in ("text", "status", "result", "error") and not isinstance(raw, str):
            return [Unparsed(json.dumps(obj), f"{kind!r} needs a string 'text'")]
        text = raw if isinstance(raw, str) else ""
        if kind == "text":
            return [Text(text)]
        if kind == "status":
            return [Status(text)]
        if kind == "tool":
            name = obj.get("name")
            if not isinstance(name, str):
                return [Unparsed(json.dumps(obj), "'tool' needs a string 'name'")]
            return [ToolUse(name, preview(obj.get("input", "")))]
        if kind == "todos":
            todos = parse_todos(obj.get("todos"))
            if todos is None:
                return [Unparsed(json.dumps(obj), "'todos' needs a list of {content, status}")]
            return [todos]
        if kind == "session":
            sid = obj.get("id")
            if not isinstance(sid, str) or not sid:
                return [Unparsed(json.dumps(obj), "'session' needs a string 'id'")]
            return [SessionId(sid)]
        if kind == "usage":
            inp, out, model = obj.get("input_tokens", 0), obj.get("output_tokens", 0), obj.get("model")
            if not (isinstance(inp, int) and isinstance(out, int)) or isinstance(inp, bool) or isinstance(out, bool) \
                    or min(inp, out) < 0 or not (model is None or isinstance(model, str)):
                return [Unparsed(json.dumps(obj), "'usage' needs whole numbers 'input_tokens', 'output_tokens'")]
            return [Usage(input_tokens=inp, output_tokens=out, model=model)]
        if kind == "result":
            self.saw_result = True
            return [Result(text, ok=True)]
        if kind == "error":
            self.saw_error = True
            return [Error(text)]
        return [Unparsed(json.dumps(obj), f"unknown type {kind!r}")]

    def finish(self, returncode: int | None, *, interrupted: bool) -> list[Event]:
        """A non-zero exit is an error unless the agent already reported one."""
        if interrupted or self.saw_result or self.saw_error:
            return []
        if returncode == 0:
            return [Result("", ok=True)]
        return [Error(f"agent exited with status {returncode}")]


def new_parser(request: TurnRequest) -> GenericParser:
    """A fresh parser for one turn."""
    return GenericParser()


def check_options(raw: Mapping[str, Any]) -> CheckedOptions:
    """A generic agent's own keys (pure): ``resume_args`` a list of strings, ``prompt``
    ``"argument"`` or ``"stdin"``."""
    problems: list[OptionProblem] = []
    options = dict(raw)
    resume = options.get("resume_args")
    if resume is not None and (not isinstance(resume, list) or not all(isinstance(v, str) for v in resume)):
        problems.append(OptionProblem("resume_args", f"expected a list of strings, got {resume!r}",
                                      'write resume_args = ["...", "..."]'))
        options.pop("resume_args")
    if "prompt" in options and options["prompt"] not in ("argument", "stdin"):
        problems.append(OptionProblem("prompt", f"expected \"argument\" or \"stdin\", got {options['prompt']!r}",
                                      'write prompt = "stdin"'))
    return CheckedOptions(options, tuple(problems))


ADAPTER = Adapter(
    name="generic",
    default_command=(),
    build_launch=build_launch,
    new_parser=new_parser,
    option_keys=OPTION_KEYS,
    check_options=check_options,
    memory_estimate=64 << 20,
)
