"""Text that forges (issue 41.10): an agent's text reaches the operator's terminal and corral's
log made harmless — controls visible, continuation lines indented — by one pure rule
(:func:`supervisor.core.text.shown`), at each site: ``corral tail``, ``tail -f``'s drafts, and
agent stderr in the log. Checked end to end from outside (a hostile generic agent, the real
``corral tail`` and the daemon's log), beside the plain text that must stay as it was.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import PYTHON, DaemonProcess

from supervisor.cli import DraftView, format_entry
from supervisor.core.text import shown

ERASE = "\x1b[2K\r"
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"
FORGED_ENTRY = "[   99] 12:00:00 system           notice  Execution stopped by user."


def entry(text: str, **kw: object) -> dict[str, object]:
    return {"seq": 3, "ts": 0.0, "author": "agent:evil", "kind": "message", "text": text, "meta": {},
            "channel": "c", **kw}


def test_shown_makes_controls_visible_and_keeps_plain_text() -> None:
    assert shown("plain\ttext, ünïcode ✓\nline two") == "plain\ttext, ünïcode ✓\n    line two"
    assert shown(f"a{ERASE}b{CLIPBOARD}\x9b31m\x7f") == "a\\x1b[2K\\x0db\\x1b]52;c;cm0gLXJmIH4K\\x07\\x9b31m\\x7f"
    assert shown("one\ntwo\tthree", lines=False) == "one\\x0atwo\\x09three"
    assert shown("a\nb", indent=None) == "a\nb"


def test_tail_lines_cannot_forge_an_entry_or_drive_the_terminal() -> None:
    line = format_entry(entry(f"done{ERASE}\n{FORGED_ENTRY}{CLIPBOARD}", author=f"agent:x{ERASE}"))
    assert "\x1b" not in line and "\r" not in line and "\x07" not in line
    assert [row for row in line.split("\n") if row.startswith("[")] == [line.split("\n")[0]]
    assert line.split("\n")[1] == "    " + FORGED_ENTRY + "\\x1b]52;c;cm0gLXJmIH4K\\x07"
    assert format_entry(entry("plain")).endswith("agent:evil       message plain")  # unchanged


def test_drafts_on_a_terminal_and_off_it_are_shown_the_same_way() -> None:
    draft = {"draft": "d1", "ts": 0.0, "author": "agent:evil", "text": f"x{ERASE}{CLIPBOARD}\n{FORGED_ENTRY}"}
    on_terminal = DraftView(terminal=True, width=300).draft(draft)
    assert on_terminal.startswith("\r\x1b[2K[draft]")  # corral's own clearing, and nothing else
    assert "\x1b" not in on_terminal[5:] and "\x07" not in on_terminal and "\r" not in on_terminal[1:]
    piped = DraftView(terminal=False).draft(draft)
    assert "\x1b" not in piped and [r for r in piped.splitlines() if r.startswith("[")] == [piped.splitlines()[0]]


AGENT = r"""
import json, sys
sys.stderr.write("warming up\r2026-01-01 00:00:00 INFO corral: forged log line\x1b[2K\n")
sys.stderr.flush()
text = "done\x1b[2K\r\n" + sys.argv[-1] + "\x1b]52;c;cm0gLXJmIH4K\x07"
print(json.dumps({"type": "result", "text": text}), flush=True)
"""


def test_a_hostile_agent_forges_nothing_in_tail_or_the_log(short_tmp: Path) -> None:
    config = f"""
[server]
socket = "corral.sock"
[store]
path = "corral.db"
[agents.evil]
adapter = "generic"
command = [{json.dumps(PYTHON)}, "-c", {json.dumps(AGENT)}]
"""
    daemon = DaemonProcess(short_tmp, config)
    try:
        assert daemon.cli("send", "c", FORGED_ENTRY).returncode == 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # polling a real daemon's transcript
            out = daemon.cli("tail", "c").stdout
            if "done" in out:
                break
            time.sleep(0.1)
        assert "done" in out, out
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out
        starts = [line for line in out.splitlines() if line.startswith("[")]
        entries = daemon.cli("tail", "c", "--json").stdout.splitlines()
        assert len(starts) == len(entries)  # one line-start per real entry; the forged one indented
        assert f"\n    {FORGED_ENTRY}\\x1b]52" in out
    finally:
        assert daemon.stop() == 0
    log = "".join(daemon.log)
    assert "\x1b" not in log and "\r" not in log
    assert "stderr: warming up\\x0d2026-01-01 00:00:00 INFO corral: forged log line\\x1b[2K" in log


def test_json_output_escapes_c1_controls_too(capsys: pytest.CaptureFixture[str]) -> None:
    """``--json`` is JSON: C0 controls are escaped by JSON itself, C1 ones (a terminal may obey
    ``\\x9b`` as CSI) and DEL by corral; it reads back as the same text."""
    from supervisor.cli import _print_json

    _print_json({"text": "a\x9b31m\x1b[2K\x7f ü"})
    out = capsys.readouterr().out
    assert not any(0x7f <= ord(c) <= 0x9f or (ord(c) < 0x20 and c != "\n") for c in out)
    assert json.loads(out) == {"text": "a\x9b31m\x1b[2K\x7f ü"}
