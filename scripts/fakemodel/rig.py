"""What the real-CLI tests and the stop benchmark both need to drive a CLI's shell tool.

``tests/test_realcli.py`` and ``scripts/bench_stop.py`` run the same tool: one copy of it lives
here (the TOML of their agent tables is :func:`scripts._config.toml_value`).
"""

from __future__ import annotations

from pathlib import Path

#: The tool's long process and its setsid grandchild (distinct, so a scan can tell them apart).
TOOL_SLEEP, SETSID_SLEEP = "sleep 3000", "sleep 3001"


#: What a shell tool writes for the pid of its last background job: the pid and its pid
#: namespace, which :func:`supervisor.testing.read_pid` turns into a pid of this process's
#: (a sandboxed turn has a pid namespace of its own).
PID_OF_LAST = '"$! $(stat -L -c %i /proc/self/ns/pid)"'


def write_tool_script(folder: Path) -> Path:
    """A shell tool ``tool.sh PIDFILE``: a setsid grandchild and a long same-session child.

    It writes ``PIDFILE.setsid`` and then ``PIDFILE`` as each exists, so ``PIDFILE`` existing
    means the whole tree runs — the shape a CLI's own kill never fully reaches.
    """
    script = folder / "tool.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"setsid {SETSID_SLEEP} </dev/null >/dev/null 2>&1 &\n"
        f'echo {PID_OF_LAST} > "$1.setsid"\n'
        f"{TOOL_SLEEP} &\n"
        f'echo {PID_OF_LAST} > "$1"\n'
        "wait\n"
    )
    return script
