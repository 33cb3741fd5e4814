"""A hostile agent: it tries every way out of its turn it is told to, and says how each went.

Run as a ``generic`` agent (the prompt, a JSON list of attempts, is the last argument; the
answer is one ``result`` line) or as an ACP agent's tool (``escape_probe.py JSON``: the JSON
results on stdout). Each attempt is ``[name, kind, arg]``; its outcome is ``"ok"`` (with a
detail after a colon where useful) or the ``errno`` name of the refusal (``"ENOENT"``), so a
test can say which wall stopped it, not merely that something failed.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import subprocess
import sys
from typing import Any


def _err(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc))


def attempt(kind: str, arg: Any) -> str:
    try:
        if kind == "read":
            with open(arg, "rb") as fh:
                return "ok:" + fh.read(200).decode(errors="replace")
        if kind == "list":
            return "ok:" + ",".join(sorted(os.listdir(arg)))
        if kind == "write":
            with open(arg, "w") as fh:
                fh.write("pwned")
            return "ok"
        if kind == "unlink":
            os.unlink(arg)
            return "ok"
        if kind == "replace":  # write a file of its own, then rename it over the target
            src, dst = arg
            with open(src, "w") as fh:
                fh.write("[server]\n")
            os.rename(src, dst)
            return "ok"
        if kind == "mkdir":
            os.mkdir(arg)
            return "ok"
        if kind == "symlink-read":  # plant a link in a folder it may write, then read through it
            link, target = arg
            os.symlink(target, link)
            with open(link, "rb") as fh:
                return "ok:" + fh.read(200).decode(errors="replace")
        if kind == "statvfs":  # the size of the file system at a path
            st = os.statvfs(arg)
            return f"ok:{st.f_blocks * st.f_frsize}"
        if kind == "kill0":
            os.kill(int(arg), 0)
            return "ok"
        if kind == "kill-everyone0":  # signal 0 to every process it may signal (never a real signal)
            os.kill(-1, 0)
            return "ok"
        if kind == "ptrace":
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.ptrace(16, int(arg), None, None) != 0:  # PTRACE_ATTACH
                return errno.errorcode.get(ctypes.get_errno(), "?")
            libc.ptrace(17, int(arg), None, None)  # PTRACE_DETACH
            return "ok"
        if kind == "http-unix":  # the control API over a Unix socket
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(arg)
                sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: corral\r\nConnection: close\r\n\r\n")
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            return "http:" + head.split(b" ")[1].decode() + ":" + body.decode(errors="replace")[:300]
        if kind == "http-unix-orphan":  # connect, fork, exit: the child posts once its parent is reaped
            return _orphan_post(*arg)
        if kind == "http-unix-bare":  # the same from a child with an empty environment (no marker)
            out = subprocess.run(
                [sys.executable, __file__, json.dumps([["x", "http-unix", arg]])],
                env={}, capture_output=True, text=True, timeout=30,
            )
            return str(json.loads(out.stdout)["x"])
        if kind == "tcp":
            host, port = arg.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                return "ok:" + sock.recv(100).decode(errors="replace")
        if kind == "own-child":  # its own tree it may signal
            child = subprocess.Popen(["sleep", "30"])
            child.send_signal(signal.SIGTERM)
            return f"ok:{child.wait()}"
        if kind == "env":
            return "ok:" + os.environ.get(arg, "")
    except OSError as exc:
        return _err(exc)
    return f"unknown attempt {kind}"


def _orphan_post(path: str, channel: str) -> str:
    """The race on the control socket's peer check: a process connects and exits at once; once it
    is reaped (its /proc gone) its child posts into ``channel`` as the human, on that connection.

    The child is forked first and shares the socket, so the connecting process has nothing left
    to do but exit; a burst of idle connections ahead of it keeps the daemon's peer checks busy,
    so that the reaping is done before the daemon reads the peer's /proc (as a loaded daemon)."""
    burst = []
    for _ in range(200):
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.connect(path)
        burst.append(extra)
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    child = os.fork()
    if child == 0:  # the sender: it holds the socket its parent connects
        try:
            os.read(go_r, 1)
            body = json.dumps({"text": "forged by an orphan", "author": "human:user"}).encode()
            sock.sendall(b"POST /v1/channels/" + channel.encode() + b"/messages HTTP/1.1\r\nHost: corral\r\n"
                         b"Content-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            data = b""
            sock.settimeout(20)
            while chunk := sock.recv(65536):
                data += chunk
            os.write(out_w, data[:4000])
        finally:
            os._exit(0)
    parent = os.fork()
    if parent == 0:  # the peer the kernel records: it connects and is gone
        try:
            sock.connect(path)
        finally:
            os._exit(0)
    sock.close()
    os.close(out_w)
    os.waitpid(parent, 0)  # reaped: /proc/PARENT is gone before the child says a word
    os.write(go_w, b"x")
    data = b""
    while chunk := os.read(out_r, 65536):
        data += chunk
    os.waitpid(child, 0)
    for extra in burst:
        extra.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b" ")[1].decode() if b" " in head else "none"
    return "http:" + status + ":" + body.decode(errors="replace")[:300]


def main() -> None:
    spec = sys.argv[-1]
    if spec.startswith("@"):  # a file of attempts (an ACP tool command cannot carry "]]")
        with open(spec[1:]) as fh:
            spec = fh.read()
    attempts = json.loads(spec)
    results = {name: attempt(kind, arg) for name, kind, arg in attempts}
    if sys.argv[-1].startswith("@"):  # a tool's output is shown shortened: the whole, in its folder
        with open("escape-results.json", "w") as fh:
            json.dump(results, fh)
    if os.environ.get("ESCAPE_PROBE_AS") == "generic":
        print(json.dumps({"type": "result", "text": json.dumps(results)}), flush=True)
    else:
        print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
