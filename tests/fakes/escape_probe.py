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

#: The system calls the seccomp attempts name, by architecture: this probe's own table (never
#: corral's), so a wrong number in either shows.
SYSCALLS = {
    "x86_64": {
        "io_uring_setup": 425, "bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "keyctl": 250,
        "add_key": 248, "kexec_load": 246, "init_module": 175, "finit_module": 313, "mount": 165,
        "open_tree": 428, "fsopen": 430, "unshare": 272, "clone": 56, "clone3": 435, "setns": 308,
        "personality": 135, "syslog": 103, "modify_ldt": 154, "getpid": 39,
    },
    "aarch64": {
        "io_uring_setup": 425, "bpf": 280, "userfaultfd": 282, "perf_event_open": 241, "keyctl": 219,
        "add_key": 217, "kexec_load": 104, "init_module": 105, "finit_module": 273, "mount": 40,
        "open_tree": 428, "fsopen": 430, "unshare": 97, "clone": 220, "clone3": 435, "setns": 268,
        "personality": 92, "syslog": 116, "getpid": 172,
    },
}


def syscall(name: str, *args: int | bytes | None) -> str:
    """One raw system call: ``"ok"`` (with its result) or the errno name."""
    numbers = SYSCALLS[os.uname().machine]
    # (x86_64's x32 ABI: the number with bit 30 set)
    number = 0x40000000 | numbers["getpid"] if name == "x32:getpid" else numbers[name]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    words = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    if name == "clone":  # in a child of its own, which exits whatever the clone did (and so does its child)
        pid = os.fork()
        if pid == 0:
            done = libc.syscall(ctypes.c_long(number), *words)
            os._exit(0 if done >= 0 else min(ctypes.get_errno(), 200) + 1)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        return "ok:cloned" if status == 0 else errno.errorcode.get(status - 1, str(status))
    result = libc.syscall(ctypes.c_long(number), *words)
    if result < 0:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    return f"ok:{result}"


def cgroup2_nest() -> str:
    """The first steps of lifting its own limits (41.11): a user namespace (no uid map needed:
    its capabilities there are enough), a mount and a cgroup namespace, cgroup2 mounted in it
    (whose root is its own cgroup, limit files and all). ``"ok:mounted"`` (it stops there: it
    writes no limit), or the step that was refused."""
    pid = os.fork()
    if pid == 0:
        code = 9  # (whatever happens, the child ends here: it never runs the rest of the probe)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            steps = [
                lambda: libc.unshare(0x10000000),  # CLONE_NEWUSER
                lambda: libc.unshare(0x00020000 | 0x02000000),  # CLONE_NEWNS | CLONE_NEWCGROUP
                lambda: os.makedirs("/tmp/cg", exist_ok=True) or libc.mount(b"none", b"/tmp/cg", b"cgroup2", 0, None),
            ]
            code = next((index + 1 for index, step in enumerate(steps) if step() != 0), 0)
        finally:
            os._exit(code)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return "ok:mounted" if status == 0 else (["user", "namespaces", "mount"][status - 1] + ":refused"
                                             if status <= 3 else f"error:{status}")


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
        if kind == "syscall":  # [name, args...]: strings are passed as C strings
            name, *args = arg
            return syscall(name, *(a.encode() if isinstance(a, str) else a for a in args))
        if kind == "cgroup2-nest":
            return cgroup2_nest()
        if kind == "run":  # a command (a positive control: Node, git, a pipeline, strace)
            done = subprocess.run(arg, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                return f"exit:{done.returncode}:{(done.stdout + done.stderr).strip()[-300:]}"
            return "ok:" + done.stdout.strip()[-300:]
        if kind == "threads":  # a few threads that each do some work
            import threading
            found: list[int] = []
            workers = [threading.Thread(target=lambda n=n: found.append(sum(range(n * 1000)))) for n in range(int(arg))]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            return f"ok:{len(found)}"
        if kind == "cmdline":  # the whole of a process's command line, NULs as spaces
            with open(arg, "rb") as fh:
                return "ok:" + fh.read().replace(b"\0", b" ").decode(errors="replace")
        if kind == "fds":  # what its open descriptors are (a memfd left behind would show)
            return "ok:" + ",".join(sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                                           if os.path.exists(f"/proc/self/fd/{fd}")))
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
