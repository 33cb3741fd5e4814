"""The examples of the README and of ``docs/`` run as written: each is a file in ``examples/``,
the page that holds it shows it byte for byte, and every one runs here to the end, as a real
program against the config the README points at (``config.example.toml``, copied to
``corral.toml``). The pages' TOML blocks parse, and the paths they name exist."""

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
#: The guides: the README and every page of docs/ (each example lives in one of them).
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = ROOT / "examples"
#: A README code block shown from a file: ``<!-- example: PATH -->`` right before the fence.
TAGGED = re.compile(r"<!-- example: (?P<path>\S+) -->\n```(?P<lang>\w*)\n(?P<body>.*?)```\n", re.S)
SLOW = 120


def tagged_blocks() -> dict[str, str]:
    """The pages' example blocks, by the file they show (a file shown twice: its last showing)."""
    return {m["path"]: m["body"] for m in tagged()}


def tagged() -> list[re.Match[str]]:
    """Every example block of every page, in page order."""
    return [m for page in PAGES for m in TAGGED.finditer(page.read_text())]


def run_env() -> dict[str, str]:
    """This checkout first on the path, and the ``corral`` of this Python's environment."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }


def test_every_example_is_in_the_docs_byte_for_byte() -> None:
    shown = sorted(Path(m["path"]).name for m in tagged())
    files = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh"))
    assert shown == files, "each file in examples/ is shown once, in the README or a page of docs/"
    for path, body in tagged_blocks().items():
        assert body == (ROOT / path).read_text(), f"the block for {path} differs from the file: copy the file in"


def test_the_readme_shows_the_daemon_and_the_reference_the_embedding_examples() -> None:
    def shown(page: Path) -> set[str]:
        return {m["path"] for m in TAGGED.finditer(page.read_text())}

    assert "examples/daemon.sh" in shown(README)
    assert {"examples/embed_trio.py", "examples/host_asyncio.py"} <= shown(ROOT / "docs" / "reference.md")
    assert "examples/interrupt.sh" in shown(ROOT / "docs" / "channels.md")


@pytest.mark.parametrize(
    ("example", "expect"),
    [
        ("embed_trio.py", ["agent:demo message You said: Hello! Who are you?", "stopped in "]),
        ("host_asyncio.py", ["agent:demo message You said: Hello from asyncio!", "stopped in "]),
        ("daemon.sh", ["human:user", "general: stopped", "corral is shutting down"]),
        ("interrupt.sh", ["Interrupted by a new message. 1 queued message was not run.",
                          "You said: Never mind: just say hello", "corral is shutting down"]),
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
    if example.endswith(".py"):
        killed = re.search(r"killed \[([\d, ]+)\]", out)
        assert killed, "the stop killed the long task's tool mid-run"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    text = page.read_text()
    named = set(re.findall(r"(?<![\w/.~])((?:adapters|supervisor|tests|scripts|examples)/[\w.*/-]*\w)", text))
    # corral.toml is the user's own, config.toml is the one corral writes for Codex.
    named |= set(re.findall(r"`([\w-]+\.(?:toml|txt|py|sh))`", text)) - {"corral.toml", "config.toml"}
    missing = sorted(p for p in named if not exists(p.replace("NAME", "*")))
    assert not missing, f"{page.name} names paths that do not exist: {missing}"
    assert "corral.db.d" not in text, "the state folder next to corral.db is corral.d/"


def exists(pattern: str) -> bool:
    """A repository path, or a bare file name found at the root or in one of the source folders."""
    if "/" in pattern:
        return bool(list(ROOT.glob(pattern)))
    folders = [ROOT / d for d in ("adapters", "supervisor", "tests", "scripts", "examples")]
    return bool(list(ROOT.glob(pattern))) or any(list(folder.rglob(pattern)) for folder in folders)


def test_the_state_folder_the_readme_names_is_the_real_one(tmp_path: Path) -> None:
    from supervisor import parse_config

    config = parse_config({"store": {"path": "corral.db"}, "agents": {"demo": {"adapter": "demo"}}}, base=tmp_path)
    assert config.state_dir == tmp_path / "corral.d"
    assert "go in corral.d/" in README.read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_toml_block_of_a_page_is_valid(page: Path) -> None:
    import tomllib

    for block in re.findall(r"```toml\n(.*?)```\n", page.read_text(), re.S):
        tomllib.loads(block)  # each snippet is valid TOML (the tests of its section check what it means)


def test_the_readmes_configuration_is_a_whole_config(tmp_path: Path) -> None:
    import tomllib

    from supervisor import parse_config

    blocks = re.findall(r"```toml\n(.*?)```\n", README.read_text(), re.S)
    # The README's one config block is a whole config, as config.example.toml is.
    config = parse_config(tomllib.loads(blocks[0]), file="README.md", base=tmp_path)
    assert config.default_agent == "demo"


@pytest.mark.parametrize("example", ["embed_trio.py", "host_asyncio.py"])
def test_an_embedding_example_beside_a_running_daemon_says_one_line_not_a_traceback(
    example: str, short_tmp: Path
) -> None:
    """Issue 32: run beside a daemon on the same store, the example printed a 40-line
    traceback before its good StoreInUse message (and the asyncio host logged the error
    again as "Future exception was never retrieved")."""
    import subprocess

    from conftest import DaemonProcess

    daemon = DaemonProcess(short_tmp, (ROOT / "config.example.toml").read_text())
    try:
        done = subprocess.run([sys.executable, str(EXAMPLES / example)], cwd=short_tmp, env=run_env(),
                              capture_output=True, text=True, timeout=SLOW)
    finally:
        daemon.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"corral: store {short_tmp / 'corral.db'} is in use by pid {daemon.proc.pid}; stop that corral first "
        "(`corral shutdown`), or give this one another [store] path"
    ], done.stderr
