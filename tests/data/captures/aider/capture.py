"""Re-capture real aider output for ``tests/test_adapter_aider.py``.

Usage, from the repository root:
``.venv/bin/python -m tests.data.captures.aider.capture /path/to/bin/aider [--slow]``
(``pip install aider-chat==0.86.2`` into a throwaway venv first). Each case runs aider
with the argv of ``adapters.aider.build_launch``, a private HOME/TMPDIR, stdin /dev/null,
in its own session, against a tiny OpenAI Chat Completions fake on 127.0.0.1, and writes
``<case>.stdout`` and ``<case>.json`` (argv with the port masked, exit status) here.
``--slow`` adds ``api_down`` (aider retries for about 80 s before giving up).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from adapters._base import TurnRequest
from adapters.aider import build_launch
from scripts.fakemodel._http import FakeModelServer, Request, Responder
from scripts.fakemodel.script import read_script

HERE = Path(__file__).resolve().parent


class FakeChatCompletions(FakeModelServer):
    """Just enough of ``POST /v1/chat/completions`` (streamed or not) for aider."""

    def handle(self, req: Request, out: Responder) -> None:
        """Answer with the ``say`` text of the last user message; a shell marker becomes a bash block."""
        if not (req.method == "POST" and req.path.endswith("/chat/completions")):
            out.json(404, {"error": {"message": f"no route {req.path}"}})
            return
        users = [m for m in req.body.get("messages", []) if m.get("role") == "user"]
        last = users[-1]["content"] if users else ""
        if isinstance(last, list):
            last = " ".join(p.get("text", "") for p in last if isinstance(p, dict))
        script = read_script(last)
        text = f"I will run it:\n\n```bash\n{script.shell}\n```\n" if script.shell else script.say
        model = req.body.get("model")
        if not req.body.get("stream"):
            out.json(200, {"id": "c1", "object": "chat.completion", "created": 1, "model": model,
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})
            return
        out.start_sse()
        pieces = [text[i : i + 8] for i in range(0, len(text), 8)] or [""]
        for piece in pieces:
            out.event({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": piece},
                                    "finish_reason": None}]})
            if script.slow:
                out.pause(script.slow / len(pieces))
        out.event({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        out.event("[DONE]")


def run(aider: str, base: str, root: Path, case: str, prompt: str, *, session: str | None = None,
        extra: tuple[str, ...] = (), sigint_after: str | None = None) -> str:
    """Run one turn, save its stdout; return the session file the parser would report."""
    request = TurnRequest(prompt=prompt, channel="c", turn_id=f"turn-{case}", agent="aider",
                          command=(aider,), session_id=session, model="openai/fake-model",
                          args=("--openai-api-base", base, "--openai-api-key", "sk-fake", *extra),
                          cwd=str(root / "work"), home=str(root / "home"))
    launch = build_launch(request)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": request.home,
           "TMPDIR": str(root / "tmp"), **launch.env}
    proc = subprocess.Popen(launch.argv, cwd=launch.cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out = b""
    try:
        if sigint_after:
            assert proc.stdout is not None
            while sigint_after.encode() not in out:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                out += chunk
            os.killpg(proc.pid, signal.SIGINT)
        rest, err = proc.communicate(timeout=180)
        out += rest
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    (HERE / f"{case}.stdout").write_bytes(out)
    argv = [a.replace(base, "http://127.0.0.1:PORT/v1").replace(aider, "aider") for a in launch.argv]
    (HERE / f"{case}.json").write_text(json.dumps({"argv": argv, "returncode": proc.returncode,
                                                   "sigint_after": sigint_after,
                                                   "stderr_tail": err.decode(errors="replace")[-300:]},
                                                  indent=1) + "\n")
    return launch.argv[launch.argv.index("--chat-history-file") + 1]


def main() -> None:
    """Capture every case."""
    aider = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp, FakeChatCompletions() as server:
        root = Path(tmp)
        for sub in ("work", "home", "tmp"):
            (root / sub).mkdir()
        base = f"{server.url}/v1"
        session = run(aider, base, root, "fresh", "hello [[say:Hello from the fake model.\n\nSecond paragraph.]]")
        run(aider, base, root, "resume", "again [[say:I remember you.]]", session=session)
        (HERE / "resume.history.md").write_text((root / "work" / session).read_text())
        words = " ".join(f"word{i}" for i in range(60))
        run(aider, base, root, "sigint_stream", f"slow [[say:{words}]] [[slow:20]]", sigint_after="word3")
        run(aider, base, root, "shell_refused", "list it [[shell:echo hi]]", extra=("--edit-format", "diff"))
        if "--slow" in sys.argv:
            run(aider, "http://127.0.0.1:9/v1", root, "api_down", "hi")


if __name__ == "__main__":
    main()
