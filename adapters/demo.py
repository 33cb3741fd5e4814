"""The ``demo`` adapter: the bundled demo agent, run with the Python running corral.

It is the generic adapter with the demo agent as its command and ``--session`` as its
resume form; see :mod:`adapters.demo_agent` for what the agent does. It takes messages
mid-turn: its prompt stays in argv (after ``--``) and stdin is a pipe kept open, on which
each message handed to the running turn is one JSON line (:func:`demo_agent.steer_line`).
"""

from __future__ import annotations

import signal
import sys
from dataclasses import replace
from pathlib import Path

from . import demo_agent, generic
from ._base import Adapter, Error, Event, Launch, StaleSession, TurnRequest

#: What the demo agent (like Claude Code) says when asked to resume a session it does not have.
STALE_SESSION = "No conversation found with session ID"

DEFAULT_COMMAND = (sys.executable, str(Path(demo_agent.__file__).resolve()))


def build_launch(request: TurnRequest) -> Launch:
    """The generic launch, with ``--session ID`` when resuming, and stdin open for steering."""
    options = {"resume_args": ["--session", "{session}"], **request.options}
    launch = generic.build_launch(_with_options(request, options))
    # Its name, so it can sign its hand-offs and know which mentions are its own.
    env = {"DEMO_AGENT_DELAY": str(request.options.get("delay", 0.05)), "DEMO_AGENT_NAME": request.agent}
    # stdin: nothing to write (the spawn is the point of no return), kept open for steering.
    return Launch(argv=launch.argv, env=env, cwd=launch.cwd, stdin=b"", keep_stdin=True)


def _with_options(request: TurnRequest, options: dict[str, object]) -> TurnRequest:
    return replace(request, options=options)


class DemoParser(generic.GenericParser):
    """The generic protocol, plus the demo agent's stale-session error."""

    def feed(self, line: str) -> list[Event]:
        """Parse one line; an unknown-session error becomes :class:`StaleSession`."""
        return [
            StaleSession(e.text) if isinstance(e, Error) and e.text.startswith(STALE_SESSION) else e
            for e in super().feed(line)
        ]


    def feed_stderr(self, line: str) -> list[Event]:
        """Nothing: the demo agent reports its errors on stdout, as protocol lines."""
        return []


def new_parser(request: TurnRequest) -> DemoParser:
    """A fresh parser for one turn."""
    return DemoParser()


ADAPTER = Adapter(
    name="demo",
    default_command=DEFAULT_COMMAND,
    build_launch=build_launch,
    new_parser=new_parser,
    interrupt_signal=signal.SIGINT,
    option_keys=frozenset({"delay"}),
    steer=demo_agent.steer_line,
    memory_estimate=32 << 20,
    # The bundled fake agent makes up its answers: it needs no network at all.
    network="none",
)
