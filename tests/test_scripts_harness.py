"""The scripts' shared harness: the marker scan, the project's client as the scripts use it."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts._bench import marker_processes
from scripts._capture import MARK_VAR, marked_processes
from supervisor.serve.client import Client, DaemonUnavailable


@pytest.fixture
def marked(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    mark = uuid.uuid4().hex
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home"), MARK_VAR: mark}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    try:
        yield proc, mark
    finally:
        proc.kill()
        proc.wait()


def test_one_marker_scan_finds_a_process_by_its_marker_and_scopes_it_by_home(
    marked: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    proc, mark = marked
    assert [f[0] for f in marker_processes(str(tmp_path), {mark}, variable=MARK_VAR)] == [proc.pid]
    assert [f[0] for f in marker_processes(None, {mark}, variable=MARK_VAR)] == [proc.pid]
    assert marker_processes(str(tmp_path / "elsewhere"), {mark}, variable=MARK_VAR) == []
    assert [p.pid for p in marked_processes(mark)] == [proc.pid]
    assert marked_processes(uuid.uuid4().hex) == []


def _serve_once(path: Path, answer: bytes | None) -> threading.Thread:
    """A Unix socket that answers one request with ``answer`` (None: never answers)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            lengths = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
            length = lengths[0] if lengths else 0
            while len(body) < length:
                body += conn.recv(65536)
            if answer is None:
                conn.recv(65536)  # until the client gives up and closes
                return
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def _http(status: str, body: bytes, kind: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (_http("500 Internal Server Error", b'{"error": {"code": "x"}}'), (500, {"error": {"code": "x"}})),
        (_http("502 Bad Gateway", b"not json", "text/plain"), (502, "not json")),
        (_http("202 Accepted", b'{"seq": 7}'), (202, {"seq": 7})),
    ],
)
def test_the_clients_answer_is_the_status_and_body_whatever_the_status(
    tmp_path: Path, answer: bytes, expected: tuple[int, object]
) -> None:
    # faults judges every answer itself (a 500 without a stop result is a violation): the
    # client must hand it the status, which the ordinary calls turn into a result or an error.
    sock = tmp_path / "s"
    thread = _serve_once(sock, answer)
    with Client(str(sock)) as client:
        assert client.answer("send", path={"channel": "c"}, json_body={"text": "hi"}) == expected
    thread.join(5)


def test_a_client_with_a_timeout_gives_up_on_a_daemon_that_never_answers(tmp_path: Path) -> None:
    sock = tmp_path / "s"
    thread = _serve_once(sock, None)
    with Client(str(sock), timeout=0.2) as client, pytest.raises(DaemonUnavailable):
        client.status()
    thread.join(5)
    assert not thread.is_alive()


def test_the_scripts_never_import_tests() -> None:
    # The doubles they share with the tests live in scripts/; the tests import them from there.
    imported = []
    for path in sorted((Path(__file__).resolve().parent.parent / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported += [(path.name, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported.append((path.name, node.module or ""))
    assert len(imported) > 100, "the walk found the scripts' imports"
    assert [(p, m) for p, m in imported if m == "tests" or m.startswith("tests.")] == []
