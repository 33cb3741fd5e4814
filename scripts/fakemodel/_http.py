"""The HTTP plumbing shared by the fake model servers: a threaded server on loopback.

A protocol module subclasses :class:`FakeModelServer` and implements :meth:`handle`.
Every request is recorded (method, path, headers, parsed JSON body) so a test can check
what the CLI sent — for instance that a resumed turn carried the earlier conversation.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


@dataclass
class Request:
    """One request the CLI made."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""


@dataclass
class Responder:
    """Writes a response: plain JSON, or a Server-Sent Events stream."""

    handler: BaseHTTPRequestHandler
    stopping: threading.Event
    _sse: bool = field(default=False)

    def json(self, status: int, obj: Any) -> None:
        """Send ``obj`` as a whole JSON response."""
        data = json.dumps(obj).encode()
        h = self.handler
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    def start_sse(self, content_type: str = "text/event-stream") -> None:
        """Send the headers of a streamed response (closed when the handler returns)."""
        h = self.handler
        h.send_response(200)
        h.send_header("content-type", content_type)
        h.send_header("cache-control", "no-cache")
        h.send_header("connection", "close")
        h.end_headers()
        h.wfile.flush()
        h.close_connection = True
        self._sse = True

    def event(self, data: Any, event: str | None = None) -> None:
        """Send one SSE event; ``data`` that is not a string is JSON-encoded."""
        payload = data if isinstance(data, str) else json.dumps(data)
        text = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
        self.handler.wfile.write(text.encode())
        self.handler.wfile.flush()

    def raw_line(self, line: str) -> None:
        """Send one raw line of a streamed body (for non-SSE streams)."""
        self.handler.wfile.write(line.encode() + b"\n")
        self.handler.wfile.flush()

    def pause(self, seconds: float) -> None:
        """Wait, unless the server is stopping."""
        self.stopping.wait(seconds)

    def go_silent(self) -> None:
        """Keep the stream open and send nothing until the server stops or the client leaves."""
        sock = self.handler.connection
        sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                if sock.recv(1, 0x2) == b"":  # MSG_PEEK: an empty read means the client left
                    return
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return


class FakeModelServer:
    """A scripted model API on ``127.0.0.1`` with a random port, served from threads."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw)
                with server._lock:
                    server.requests.append(req)
                try:
                    server.handle(req, Responder(self, server._stopping))
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=type(self).__name__, daemon=True)

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release every silent stream."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def handle(self, req: Request, out: Responder) -> None:
        """Answer one request. Subclasses implement the protocol."""
        out.json(404, {"error": f"no route for {req.method} {req.path}"})

    def wait_for_request(self, predicate: Any, timeout: float = 30.0) -> Request:
        """Block until a recorded request satisfies ``predicate`` (for tests driving a CLI)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for req in self.requests:
                    if predicate(req):
                        return req
            time.sleep(0.02)
        raise TimeoutError("the CLI never sent the expected request")
