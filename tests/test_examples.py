"""The README's examples run as written: each is a file in ``examples/``, the README shows it
byte for byte, and every one runs here to the end, as a real program against the config
the README points at (``config.example.toml``, copied to ``corral.toml``)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import trio

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXAMPLES = ROOT / "examples"
#: A README code block shown from a file: ``<!-- example: PATH -->`` right before the fence.
TAGGED = re.compile(r"<!-- example: (?P<path>\S+) -->\n```(?P<lang>\w*)\n(?P<body>.*?)```\n", re.S)
SLOW = 120


def tagged_blocks() -> dict[str, str]:
    """The README's example blocks, by the file they show."""
    return {m["path"]: m["body"] for m in TAGGED.finditer(README.read_text())}


def run_env() -> dict[str, str]:
    """This checkout first on the path, and the ``corral`` of this Python's environment."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }


def test_every_example_is_in_the_readme_byte_for_byte() -> None:
    blocks = tagged_blocks()
    files = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh"))
    assert sorted(Path(p).name for p in blocks) == files, "each file in examples/ is shown in the README, once"
    for path, body in blocks.items():
        assert body == (ROOT / path).read_text(), f"README block for {path} differs from the file: copy the file in"


@pytest.mark.parametrize(
    ("example", "expect"),
    [
        ("embed_trio.py", ["agent:demo message You said: Hello! Who are you?", "stopped in "]),
        ("host_asyncio.py", ["agent:demo message You said: Hello from asyncio!", "stopped in "]),
        ("daemon.sh", ["human:user", "general: stopped", "corral is shutting down"]),
    ],
)
async def test_the_example_runs_to_the_end(example: str, expect: list[str], short_tmp: Path) -> None:
    shutil.copy(ROOT / "config.example.toml", short_tmp / "corral.toml")
    runner = ["sh"] if example.endswith(".sh") else [sys.executable]
    with trio.fail_after(SLOW):
        done = await trio.run_process(
            [*runner, str(EXAMPLES / example)], cwd=short_tmp, env=run_env(), check=False,
            capture_stdout=True, capture_stderr=True,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    for text in expect:
        assert text in out, out
    if example != "daemon.sh":
        killed = re.search(r"killed \[([\d, ]+)\]", out)
        assert killed, "the stop killed the long task's tool mid-run"


def test_every_repository_path_the_readme_names_exists() -> None:
    text = README.read_text()
    named = set(re.findall(r"(?<![\w/.~])((?:adapters|supervisor|tests|scripts|examples)/[\w.*/-]*\w)", text))
    # corral.toml is the user's own, config.toml is the one corral writes for Codex.
    named |= set(re.findall(r"`([\w-]+\.(?:toml|txt|py|sh))`", text)) - {"corral.toml", "config.toml"}
    assert named, "the pattern finds the README's paths"
    missing = sorted(p for p in named if not list(ROOT.glob(p.replace("NAME", "*"))))
    assert not missing, f"the README names paths that do not exist: {missing}"
    assert "corral.db.d" not in text, "the state folder next to corral.db is corral.d/"


def test_the_state_folder_the_readme_names_is_the_real_one(tmp_path: Path) -> None:
    from supervisor import parse_config

    config = parse_config({"store": {"path": "corral.db"}, "agents": {"demo": {"adapter": "demo"}}}, base=tmp_path)
    assert config.state_dir == tmp_path / "corral.d"
    assert "go in corral.d/" in README.read_text()


def test_the_readmes_config_blocks_are_valid(tmp_path: Path) -> None:
    import tomllib

    from supervisor import parse_config

    blocks = re.findall(r"```toml\n(.*?)```\n", README.read_text(), re.S)
    assert blocks
    for block in blocks:
        tomllib.loads(block)  # each agent's snippet is valid TOML
    # The main one is a whole config, as config.example.toml is.
    config = parse_config(tomllib.loads(blocks[0]), file="README.md", base=tmp_path)
    assert config.default_agent == "demo"
