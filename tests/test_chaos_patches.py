"""The chaos daemon's patches land: each replaces a name that exists, so a rename cannot turn a
seeded bug or a trace point into a new attribute nobody reads.

Applied in a fresh interpreter (the patches change corral's classes for the whole process).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: Install the trace and seed every bug, then say how many patches there were, and each one
#: whose name does not now hold what it was set to.
_APPLY = """
import sys
from scripts import _chaos_daemon as chaos
chaos.install_trace(sys.argv[1])
for name, (seed, _) in sorted(chaos.SEEDED_BUGS.items()):
    before = len(chaos.PATCHES)
    seed()
    assert len(chaos.PATCHES) > before, f"seeded bug {name} patched nothing"
# (a later patch of the same name replaces an earlier one: only the last must hold)
last = {(id(owner), name): (owner, name, new) for owner, name, new in chaos.PATCHES}
lost = [f"{name}" for owner, name, new in last.values() if getattr(owner, name) is not new]
print(len(chaos.PATCHES), lost)
"""


def test_every_patch_of_the_chaos_daemon_lands(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _APPLY, str(tmp_path / "trace")], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    count, lost = out.stdout.split(" ", 1)
    assert int(count) >= 18, out.stdout  # the trace's nine, and at least one per seeded bug
    assert lost.strip() == "[]", f"patches that did not land: {lost}"


def test_a_patch_of_a_name_that_does_not_exist_fails_loudly() -> None:
    from scripts._chaos_daemon import patch

    class Renamed:
        def spawn(self) -> None: ...

    with pytest.raises(AttributeError, match="has no 'spawn_tree' to patch"):
        patch(Renamed, "spawn_tree", lambda self: None)
    assert not hasattr(Renamed, "spawn_tree")
