"""An agent that tries the network: directly, and through the proxy its environment names.

Run as a ``generic`` agent, or as an ACP agent's tool (``net_probe.py @FILE``, the outcomes also
written to ``NET_PROBE_OUT``): the prompt (the last argument) is a JSON list of attempts
``[name, kind, host, port]``; the answer is one ``result`` line, a JSON object of outcomes:

* ``direct``: a plain TCP connect, ignoring the proxy — ``"ok:<greeting>"`` or the errno name;
* ``connect``: HTTP ``CONNECT host:port`` through ``HTTPS_PROXY`` — ``"ok:<greeting>"`` or
  ``"<status>:<the X-Corral-Proxy reason>"``;
* ``socks``: SOCKS5 CONNECT through ``ALL_PROXY`` — ``"ok:<greeting>"`` or ``"socks:<code>"``;
* ``get``: ``urllib`` (which honours ``HTTP_PROXY``) fetching ``http://host:port/`` —
  ``"ok:<body>"`` or ``"<status>:<reason>"``;
* ``download``: like ``connect``, then reads until the server closes: writes each byte count
  to the file named by ``NET_PROBE_PROGRESS`` (a stop's test waits for it), and says how it ended.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from urllib.parse import urlsplit


def _proxy(var: str) -> tuple[str, int]:
    parts = urlsplit(os.environ[var])
    return parts.hostname or "", parts.port or 0


def _greeting(sock: socket.socket) -> str:
    sock.settimeout(20)
    return "ok:" + sock.recv(100).decode(errors="replace")


def _tunnel(host: str, port: int) -> tuple[socket.socket, str]:
    """CONNECT through the proxy: the socket and ``status:reason`` (``200:`` and what came with it)."""
    sock = socket.create_connection(_proxy("HTTPS_PROXY"), timeout=20)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        more = sock.recv(4096)
        if not more:
            break
        head += more
    status = head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else "none"
    if status == "200":
        return sock, "200:" + head.partition(b"\r\n\r\n")[2].decode(errors="replace")
    reason = ""
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"x-corral-proxy:"):
            reason = line.split(b":", 1)[1].strip().decode()
    return sock, f"{status}:{reason}"


def attempt(kind: str, host: str, port: int) -> str:
    try:
        if kind == "direct":
            with socket.create_connection((host, port), timeout=10) as sock:
                return _greeting(sock)
        if kind == "connect":
            sock, status = _tunnel(host, port)
            with sock:
                if not status.startswith("200:"):
                    return status
                early = status.removeprefix("200:")
                return "ok:" + early if early else _greeting(sock)
        if kind == "socks":
            with socket.create_connection(_proxy("ALL_PROXY"), timeout=20) as sock:
                sock.sendall(b"\x05\x01\x00")
                if sock.recv(2) != b"\x05\x00":
                    return "socks:no-method"
                name = host.encode()
                sock.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + port.to_bytes(2, "big"))
                reply = sock.recv(10)
                return _greeting(sock) if reply[1:2] == b"\x00" else f"socks:{reply[1]}"
        if kind == "get":
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/", timeout=20) as answer:
                    return "ok:" + answer.read(100).decode(errors="replace")
            except urllib.error.HTTPError as exc:
                return f"{exc.code}:{exc.headers.get('X-Corral-Proxy', '')}"
            except http.client.HTTPException as exc:  # a server that is no HTTP server, reached
                return f"reached:{type(exc).__name__}"
        if kind == "download":
            sock, status = _tunnel(host, port)
            if not status.startswith("200:"):
                return status
            total = 0
            with sock:
                sock.settimeout(None)
                while data := sock.recv(65536):
                    total += len(data)
                    with open(os.environ["NET_PROBE_PROGRESS"], "w") as fh:
                        fh.write(str(total))
            return f"ended:{total}"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return f"unknown kind {kind}"


def main() -> None:
    """Run the attempts (``@FILE``: read from a file, as an ACP agent's tool is given them)."""
    arg = sys.argv[-1]
    if arg.startswith("@"):
        with open(arg[1:]) as fh:
            arg = fh.read()
    results = {name: attempt(kind, host, int(port)) for name, kind, host, port in json.loads(arg)}
    if "NET_PROBE_OUT" in os.environ:
        with open(os.environ["NET_PROBE_OUT"], "w") as fh:
            json.dump(results, fh)
    print(json.dumps({"type": "result", "text": json.dumps(results)}), flush=True)


if __name__ == "__main__":
    main()
