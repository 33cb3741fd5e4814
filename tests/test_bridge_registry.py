"""Platforms are found by the ``corral.bridges`` entry points: corral's own, and a third party's
installed beside it (a distribution of its own on ``sys.path``, as ``pip install`` leaves one)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from supervisor import ConfigError, parse_config
from supervisor.bridges import registry
from supervisor.bridges.kinds import IRC, MATRIX, TELEGRAM

ROOT = Path(__file__).resolve().parent.parent


def test_corral_registers_its_own_platforms_through_its_entry_points() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."corral.bridges"]' in pyproject
    assert {"irc", "matrix", "telegram", "discord"} <= set(registry.known_types())
    assert registry.bridge_type("matrix") is MATRIX and registry.bridge_type("irc") is IRC
    assert registry.bridge_type("telegram") is TELEGRAM
    # Loading a type for the config check imports no platform (nor its HTTP client).
    code = ("import sys; from supervisor.bridges import registry; "
            "[registry.bridge_type(n) for n in ('matrix', 'irc', 'telegram', 'discord')]; "
            "print(sorted(m for m in ('httpx', 'trio', 'wsproto', 'supervisor.bridges.telegram', "
            "'supervisor.bridges.discord') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_an_unknown_type_is_refused_with_the_known_types(tmp_path: Path) -> None:
    data: dict[str, Any] = {"agents": {"demo": {"adapter": "demo"}},
                            "bridges": {"chat": {"type": "telegran", "admins": ["1"], "rooms": {"1": "x"}},
                                        "other": {"type": "smoke-signals", "admins": ["1"], "rooms": {"1": "y"}},
                                        "none": {"admins": ["1"], "rooms": {"1": "z"}}}}
    with pytest.raises(ConfigError) as caught:
        parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path)
    text = "\n".join(str(p) for p in caught.value.problems)
    assert ("bridges.chat.type: unknown bridge type 'telegran' (known: discord, irc, matrix, slack, telegram) — fix: "
            "did you mean 'telegram'?") in text
    assert "bridges.other.type: unknown bridge type 'smoke-signals' (known: discord, irc, matrix, slack, telegram) — fix: " \
           "write type = one of: discord, irc, matrix, slack, telegram" in text
    assert "bridges.none.type: missing — fix: write type = one of: discord, irc, matrix, slack, telegram" in text


THIRD_PARTY = '''
"""A third party's platform: nothing of corral's changed to add it."""
from supervisor.bridges.registry import BridgeType, ConfigProblem


def check(options, rooms):
    if options.get("colour") not in ("red", "blue"):
        return [ConfigProblem("colour", f"expected red or blue, got {options.get('colour')!r}", 'write colour = "red"')]
    return []


class EchoPlatform:
    kind = "echo"
    can_edit = False
    idempotent_posts = False

    def __init__(self, config):
        self.config = config


BRIDGE = BridgeType(name="echo", platform="corral_echo:EchoPlatform", keys=frozenset({"colour", "key_file"}),
                    secret_keys=frozenset({"key_file"}), check=check)
'''


def _install_third_party(folder: Path) -> None:
    (folder / "corral_echo.py").write_text(textwrap.dedent(THIRD_PARTY))
    info = folder / "corral_echo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: corral-echo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[corral.bridges]\necho = corral_echo:BRIDGE\n")


def test_a_third_partys_platform_is_found_checked_and_made_without_forking_corral(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_third_party(site)
    (tmp_path / "echo.key").write_text("k\n")
    code = textwrap.dedent('''
        import json, sys
        from pathlib import Path
        from supervisor import ConfigError, parse_config
        from supervisor.bridges.runner import make_platform
        from supervisor.config.preflight import private_of
        base = Path(sys.argv[1])
        def config(**table):
            table = {"type": "echo", "admins": ["me"], "rooms": {"here": "general"}, **table}
            return parse_config({"agents": {"demo": {"adapter": "demo"}}, "bridges": {"e": table}},
                                file=str(base / "corral.toml"), base=base)
        try:
            config(colour="green", key_file="missing.key", shape="round")
        except ConfigError as exc:
            problems = [str(p) for p in exc.problems]
        made = config(colour="red", key_file="echo.key")
        platform = make_platform(made.bridges["e"])
        print(json.dumps({"problems": problems, "kind": platform.kind, "options": {
            k: str(v) for k, v in platform.config.options.items()},
            "hidden": str(base / "echo.key") in {str(p) for p in private_of(made).files}}))
    ''')
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": f"{site}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["kind"] == "echo"
    assert found["options"] == {"colour": "red", "key_file": str(tmp_path / "echo.key")}
    assert found["hidden"], "its secret file is hidden from turns like corral's own tokens"
    text = "\n".join(found["problems"])
    assert "bridges.e.colour: expected red or blue, got 'green' — fix: write colour = \"red\"" in text
    assert f"bridges.e.key_file: {tmp_path / 'missing.key'} does not exist" in text
    assert "bridges.e.shape: unknown key" in text


def test_every_config_example_of_the_bridges_page_runs(tmp_path: Path) -> None:
    """docs/bridges.md: the entry points it shows are corral's own, and each config works as written
    (with the token files it names, which are the user's to make)."""
    import tomllib

    page = (ROOT / "docs" / "bridges.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```\n", page, re.S)
    # Five: the whole chat config (<!-- bridge-config -->: tests/test_bridge_core.py runs it),
    # a platform's entry points, the Telegram table and the Slack table (run here), and the
    # Discord table (tests/test_bridge_discord.py runs it).
    assert len(blocks) == 5
    [entry] = [b for b in blocks if "entry-points" in b]
    points = tomllib.loads(entry)["project"]["entry-points"]["corral.bridges"]
    assert points == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["corral.bridges"]
    data = tomllib.loads(page.split("<!-- telegram-config -->", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0])
    with pytest.raises(ConfigError) as caught:
        parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path)
    assert [str(p) for p in caught.value.problems] == [
        f"{tmp_path / 'corral.toml'}: bridges.tg.token_file: {tmp_path / 'telegram.token'} does not exist — fix: "
        f"put the secret in {tmp_path / 'telegram.token'} (chmod 600), or fix the path"]
    (tmp_path / "telegram.token").write_text("123:abc\n")
    bridge = parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path).bridges["tg"]
    assert bridge.type == "telegram" and bridge.rooms == {"-1001234567890": "dev", "123456789": "alice"}
    assert bridge.options["api_url"] == "https://api.telegram.org" and bridge.secrets == (tmp_path / "telegram.token",)
    data = tomllib.loads(page.split("<!-- slack-config -->", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0])
    with pytest.raises(ConfigError) as caught:
        parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path)
    assert sorted(p.key for p in caught.value.problems) == ["bridges.sl.app_token_file", "bridges.sl.bot_token_file"]
    (tmp_path / "slack-bot.token").write_text("xoxb-1\n")
    (tmp_path / "slack-app.token").write_text("xapp-1\n")
    bridge = parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path).bridges["sl"]
    assert bridge.type == "slack" and bridge.rooms == {"C0123456789": "dev"} and bridge.options["threads"] is False
    assert set(bridge.secrets) == {tmp_path / "slack-bot.token", tmp_path / "slack-app.token"}


def test_corral_check_names_what_is_wrong_in_a_slack_table(tmp_path: Path) -> None:
    table = {"type": "slack", "api_url": "http://slack.example.org/api", "threads": "yes", "admins": ["U1"],
             "rooms": {"#dev": "dev"}, "bot_token_file": "b.token"}
    with pytest.raises(ConfigError) as caught:
        parse_config({"agents": {"demo": {"adapter": "demo"}}, "bridges": {"sl": table}},
                     file=str(tmp_path / "corral.toml"), base=tmp_path)
    text = "\n".join(str(p) for p in caught.value.problems)
    assert "bridges.sl.app_token_file: missing" in text
    assert "is plain HTTP: the tokens are in every request" in text
    assert "bridges.sl.threads: expected true or false, got 'yes'" in text
    assert "bridges.sl.rooms.#dev: is not a Slack channel id" in text


def test_corral_check_names_what_is_wrong_in_a_telegram_table(tmp_path: Path) -> None:
    table = {"type": "telegram", "api_url": "ftp://x", "poll_timeout": 90, "admins": ["1"],
             "rooms": {"#dev": "dev"}, "token": "123:abc"}
    with pytest.raises(ConfigError) as caught:
        parse_config({"agents": {"demo": {"adapter": "demo"}}, "bridges": {"tg": table}},
                     file=str(tmp_path / "corral.toml"), base=tmp_path)
    text = "\n".join(str(p) for p in caught.value.problems)
    assert "bridges.tg.token: unknown key — fix: did you mean 'token_file'?" in text
    assert "bridges.tg.token_file: missing" in text
    assert "bridges.tg.api_url: expected the Bot API server's URL, got 'ftp://x'" in text
    assert "bridges.tg.poll_timeout: expected whole seconds from 1 to 50, got 90" in text
    assert "bridges.tg.rooms.#dev: is not a Telegram chat id (a number)" in text
    table = {**table, "api_url": "http://bot-api.example.org:8081", "poll_timeout": 30, "rooms": {"1": "x"}}
    del table["token"]
    with pytest.raises(ConfigError) as caught:
        parse_config({"agents": {"demo": {"adapter": "demo"}}, "bridges": {"tg": table}},
                     file=str(tmp_path / "corral.toml"), base=tmp_path)
    assert [p.key for p in caught.value.problems] == ["bridges.tg.token_file", "bridges.tg.api_url"]
    assert "is plain HTTP: the token is in every request's URL" in caught.value.problems[1].message


def test_the_example_configs_telegram_bridge_works_uncommented(tmp_path: Path) -> None:
    import tomllib

    lines = (ROOT / "config.example.toml").read_text().split("# [bridges.tg]\n", 1)[1].splitlines()
    block = "[bridges.tg]\n" + "\n".join(line.removeprefix("# ") for line in lines if line.startswith("# "))
    (tmp_path / "telegram.token").write_text("123:abc\n")
    data = {"agents": {"demo": {"adapter": "demo"}}, **tomllib.loads(block)}
    bridge = parse_config(data, file=str(tmp_path / "corral.toml"), base=tmp_path).bridges["tg"]
    assert bridge.type == "telegram" and bridge.rooms == {"-1001234567890": "dev"}
