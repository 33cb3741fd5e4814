"""A turn's output is capped (issue 41.7): one turn cannot grow the store, or the log, without end.

A hostile generic agent prints without end, on stdout and (the other test) on stderr alone;
past ``max_output`` the turn is ended with a notice that names the limit, its tree is gone, and
what was stored of it stays under the cap — checked from outside (``corral tail``, the store's
size, the daemon's log). The positive control: a turn under the cap is stored whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PYTHON, DaemonProcess, turn_processes

FLOOD = r"""
import json, sys
if sys.argv[-1] == "small":
    print(json.dumps({"type": "result", "text": "small answer"}), flush=True)
    sys.exit(0)
out = sys.stderr if sys.argv[-1] == "stderr" else sys.stdout
line = "x" * 2000
while True:
    out.write((line if out is sys.stderr else json.dumps({"type": "text", "text": line})) + "\n")
    out.flush()
"""


def _daemon(folder: Path, cap: str) -> DaemonProcess:
    return DaemonProcess(folder, f"""
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[agents.flood]
adapter = "generic"
command = [{json.dumps(PYTHON)}, "-c", {json.dumps(FLOOD)}]
max_output = "{cap}"
""")


#: The caps (and what the notice says of them). Small on stderr: the daemon's log is a pipe
#: this test reads only at the end, and stderr under the cap is logged.
CAPS = {"stdout": ("1M", 1 << 20), "stderr": ("16K", 16 << 10)}


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_turn_that_prints_without_end_is_ended_at_max_output(short_tmp: Path, stream: str) -> None:
    cap, cap_bytes = CAPS[stream]
    daemon = _daemon(short_tmp, cap)
    try:
        assert daemon.cli("send", "c", "small").returncode == 0
        assert daemon.cli("wait", "c", "--timeout", "60").returncode == 0
        assert daemon.cli("send", "c", stream).returncode == 0
        assert daemon.cli("wait", "c", "--timeout", "120").returncode == 0
        entries = [json.loads(line) for line in daemon.cli("tail", "c", "--json").stdout.splitlines()]
        assert any(e["text"] == "small answer" for e in entries)  # the positive control
        ended = [e for e in entries if "max_output" in e["text"]]
        assert ended and f"{cap_bytes} bytes" in ended[0]["text"], [e["text"][:80] for e in entries]
        stored = sum(len(e["text"]) for e in entries)
        assert stored < 1.2 * cap_bytes
        assert not turn_processes()
    finally:
        assert daemon.stop() == 0
    log = "".join(daemon.log)
    assert len(log) < 1.2 * cap_bytes + 200_000  # stderr past the cap is not logged either
    assert (short_tmp / "corral.db").stat().st_size + _wal(short_tmp) < 8 << 20


def _wal(folder: Path) -> int:
    wal = folder / "corral.db-wal"
    return wal.stat().st_size if wal.exists() else 0


def test_the_cap_is_configurable_and_max_lifts_it(tmp_path: Path) -> None:
    from supervisor.config.settings import parse_config

    config = parse_config({"defaults": {"agent": "a", "max_output": "2M"},
                           "agents": {"a": {"adapter": "demo"}, "b": {"adapter": "demo", "max_output": "max"},
                                      "c": {"adapter": "demo", "max_output": 4096}}}, base=tmp_path)
    assert config.agents["a"].limits.max_output == 2 << 20
    assert config.agents["b"].limits.max_output is None and config.agents["c"].limits.max_output == 4096
    assert parse_config({"agents": {"a": {"adapter": "demo"}}}, base=tmp_path).agents["a"].limits.max_output == 64 << 20
