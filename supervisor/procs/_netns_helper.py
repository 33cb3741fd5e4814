"""Make a network namespace for one turn, hand its loopback listener out, then hold it.

Run by :mod:`supervisor.procs.netns` as ``python -I -S _netns_helper.py FD PORT [ADDRESS PORT]...``,
outside any sandbox, before the turn it is for exists. Stdlib only, no site: it must start fast.

1. ``unshare(CLONE_NEWUSER | CLONE_NEWNET)``: a user namespace of its own (mapping only this
   process's uid and gid, so it needs no privilege) owning a network namespace with nothing
   in it but ``lo``, which it brings up;
2. binds ``127.0.0.1:PORT`` there and sends the listening socket over FD (``SCM_RIGHTS``) to
   the daemon, whose proxy then accepts the turn's connections on it directly — no relay
   process, no extra hop; likewise each ADDRESS PORT after it (a granted loopback port of the
   host, forwarded: an address the namespace lacks, ``::1`` without IPv6, is left out, and the
   message names the ones sent);
3. ``exec``\\ s ``cat``, reading the pipe the daemon holds: the namespaces stay alive, for
   ``nsenter`` to put the turn's sandbox in, until the daemon closes the pipe (or dies).
"""

import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def main() -> None:
    """Steps 1 to 3 of the module's docstring; a failure is written to FD, then exit 1."""
    chan = socket.socket(fileno=int(sys.argv[1]))
    port = int(sys.argv[2])
    try:
        uid, gid = os.getuid(), os.getgid()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(user, net): {os.strerror(err)}")
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            got = fcntl.ioctl(probe, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0))
            flags = struct.unpack("16sH22x", got)[1]
            fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", port))
        listener.listen(512)
        listeners, bound = [listener], []
        extra = sys.argv[3:]
        for address, extra_port in zip(extra[::2], extra[1::2], strict=True):
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                if exc.errno == errno.EAFNOSUPPORT:
                    continue
                raise
            try:
                sock.bind((address, int(extra_port)))
            except OSError as exc:
                sock.close()
                if exc.errno == errno.EADDRNOTAVAIL:
                    continue
                raise
            sock.listen(128)
            listeners.append(sock)
            bound.append(f"{address} {extra_port}")
    except OSError as exc:
        chan.sendall(f"error {exc}".encode())
        sys.exit(1)
    socket.send_fds(chan, [" ".join(["ok", *bound]).encode()], [s.fileno() for s in listeners])
    chan.close()
    for sock in listeners:
        sock.close()
    cat = next((p for p in ("/bin/cat", "/usr/bin/cat") if os.path.exists(p)), None)
    if cat is not None:
        os.execv(cat, ["cat"])
    sys.stdin.buffer.read()  # (no cat: hold it ourselves)


if __name__ == "__main__":
    main()
