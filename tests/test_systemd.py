"""The systemd unit works as shipped: its config has absolute paths under the folders the
unit makes for the service user, and the unit passes ``systemd-analyze verify``."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from supervisor import parse_config

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "scripts" / "corral.service"
ETC_CONFIG = ROOT / "scripts" / "etc-corral.toml"
STATE = Path("/var/lib/corral")
RUNTIME = Path("/run/corral")


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_the_shipped_config_puts_everything_under_the_units_folders() -> None:
    # As `corral run -c /etc/corral/corral.toml` reads it: relative paths would resolve
    # against /etc/corral, which the service user cannot write.
    config = parse_config(tomllib.loads(ETC_CONFIG.read_text()), file="/etc/corral/corral.toml", base=Path("/etc/corral"))
    assert config.server.socket.is_absolute() and config.server.socket.parent == RUNTIME
    assert config.store_path.is_absolute() and config.store_path.parent == STATE
    assert config.state_dir == STATE / "corral.d"
    assert all(not str(p).startswith("/etc/") for p in (config.server.socket, config.store_path, config.state_dir))


def test_the_unit_makes_those_folders_for_its_user_and_reads_that_config() -> None:
    service = unit()["Service"]
    assert service["User"] == "corral"
    assert service["StateDirectory"] == STATE.name and service["RuntimeDirectory"] == RUNTIME.name
    assert service["StateDirectoryMode"] == "0700" and service["RuntimeDirectoryMode"] == "0700"
    assert service["ExecStart"].endswith(" run -c /etc/corral/corral.toml")
    assert service["Type"] == "notify"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (Debian package systemd)")
def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    # verify also checks that ExecStart's program exists: point it at this environment's corral.
    corral = Path(sys.executable).parent / "corral"
    if not corral.exists():
        pytest.skip(f"no corral console script next to {sys.executable}")
    text = UNIT.read_text().replace("ExecStart=/opt/corral/.venv/bin/corral ", f"ExecStart={corral} ")
    assert text != UNIT.read_text()
    copy = tmp_path / "corral.service"
    copy.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
