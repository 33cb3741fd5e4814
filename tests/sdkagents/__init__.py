"""ACP agents built on the two official SDKs — code no one here wrote — for corral's ACP tests.

* ``py_agent.py`` on the Python SDK, ``agent-client-protocol`` (:data:`PY_SDK`), in a
  virtualenv of its own;
* ``ts_agent.mjs`` on the TypeScript SDK, ``@agentclientprotocol/sdk`` (:data:`TS_SDK`), in an
  npm prefix of its own (needs Node.js >= 20 and npm, as the real-CLI tests do), and
  ``ts_agent_v2.mjs`` on the same SDK's draft ACP v2 entry point;
* the example agent the TypeScript SDK shipped until 1.9.0 (:data:`TS_EXAMPLES`:
  ``dist/examples/agent.js``), run as it is.

Both are installed pinned, on first use, under ``~/.cache/corral/acp-sdks`` (or
``$CORRAL_CACHE/acp-sdks``), in a folder named by the version and reused after; never
globally, never into corral's environment. ``python -m tests.sdkagents`` installs both and
prints where. A lock keeps two test runs at once from building one over the other.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from adapters._base import Launch

HERE = Path(__file__).resolve().parent
#: The Python SDK, pinned.
PY_SDK = ("agent-client-protocol", "0.12.1")
#: The TypeScript SDK, pinned.
TS_SDK = ("@agentclientprotocol/sdk", "2.4.0")
#: The last TypeScript SDK whose package carries its example agents (2.x leaves them out).
TS_EXAMPLES = ("@agentclientprotocol/sdk", "1.9.0")


def cache() -> Path:
    """Where the SDKs are installed."""
    return Path(os.environ.get("CORRAL_CACHE", Path.home() / ".cache" / "corral")) / "acp-sdks"


def _install(folder: Path, build: list[list[str]]) -> None:
    stamp = folder / ".installed"
    if stamp.exists():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists():
            return
        shutil.rmtree(folder, ignore_errors=True)
        with open(f"{folder}.log", "w") as log:
            for argv in build:
                subprocess.run(argv, check=True, timeout=900, stdout=log, stderr=subprocess.STDOUT)
        stamp.write_text("ok\n")


def python_sdk() -> Path:
    """The Python of a virtualenv holding the pinned Python SDK (installed if missing)."""
    name, version = PY_SDK
    folder = cache() / f"pypi_{name}_{version}"
    _install(folder, [
        [sys.executable, "-m", "venv", str(folder)],
        [str(folder / "bin" / "pip"), "install", "--quiet", "--no-cache-dir", "--disable-pip-version-check",
         f"{name}=={version}"],
    ])
    return folder / "bin" / "python"


def ts_sdk(version: str = TS_SDK[1]) -> Path:
    """The folder of the TypeScript SDK package at ``version`` (installed if missing)."""
    name = TS_SDK[0]
    folder = cache() / f"npm_{name.replace('@', '').replace('/', '_')}_{version}"
    npm = shutil.which("npm")
    if npm is None:
        raise FileNotFoundError("npm is not on PATH: the TypeScript SDK's agent needs Node.js >= 20 and npm")
    _install(folder, [
        ["mkdir", "-p", str(folder)],
        [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(folder), f"{name}@{version}"],
    ])
    return folder / "node_modules" / name


def launch(kind: str, cwd: str, env: Mapping[str, str] = {}) -> Launch:
    """The launch of an SDK agent in ``cwd`` with ``env`` added: ``"py"``, ``"ts"``,
    ``"ts-v2"`` (ACP v2 only) or ``"ts-example"`` (the SDK's own example agent)."""
    if kind == "py":
        return Launch(argv=(str(python_sdk()), str(HERE / "py_agent.py")), cwd=cwd, env=dict(env))
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError("node is not on PATH: the TypeScript SDK's agents need Node.js >= 20")
    if kind == "ts-example":
        return Launch(argv=(node, str(ts_sdk(TS_EXAMPLES[1]) / "dist" / "examples" / "agent.js")), cwd=cwd,
                      env=dict(env))
    script = {"ts": "ts_agent.mjs", "ts-v2": "ts_agent_v2.mjs"}[kind]
    return Launch(argv=(node, str(HERE / script)), cwd=cwd, env={"ACP_SDK_DIR": str(ts_sdk()), **env})

