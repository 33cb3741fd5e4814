"""The control socket's peer check (issue 41.6): fail closed, by the kernel's pidfd and the uid.

The pure judgement from facts, then real processes on a real socket: a peer that connected,
forked, exited and was reaped before corral read its ``/proc`` is refused — the race a turn
used to win, made deterministic by accepting only after the reap — beside a live client that
is served. And a peer of another uid is refused even where it could connect.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from supervisor.procs.peers import PeerFacts, judge_peer, own_pid_namespace, read_peer

OWN = os.geteuid()
NS = own_pid_namespace()


def facts(**kw: object) -> PeerFacts:
    base: dict[str, object] = {"pid": 123, "uid": OWN, "cgroup": "/user.slice/x", "pid_ns": NS,
                               "environ": {}, "alive": True}
    base.update(kw)
    return PeerFacts(**base)  # type: ignore[arg-type]


def judge(f: PeerFacts) -> str | None:
    refusal = judge_peer(f, own_uid=OWN, subtree="/corral/store1", store_id="S1", own_pid_ns=NS)
    return None if refusal is None else refusal.code


def test_the_judgement_fails_closed() -> None:
    assert judge(facts()) is None  # a live client of the daemon's user, every fact read
    assert judge(facts(cgroup="")) is None  # no cgroup v2 line is a fact, not a failure
    assert judge(facts(uid=0)) is None  # root is served
    # Root is served by a daemon of another user even though it cannot read root's /proc.
    assert judge_peer(facts(uid=0, environ=None, pid_ns=None), own_uid=1000, subtree=None, store_id="S1",
                      own_pid_ns=NS) is None
    other = OWN + 1 if OWN else 65534
    assert judge(facts(uid=other)) == "peer_uid"
    # An operator of the socket's group is served: not the daemon's user, so not a turn's.
    assert judge_peer(facts(uid=other, environ=None, pid_ns=None), own_uid=OWN, subtree=None, store_id="S1",
                      own_pid_ns=NS, group_socket=True) is None
    assert judge(facts(cgroup="/corral/store1/turn-7/sub")) == "turn_process"
    assert judge(facts(environ={"CORRAL_STORE": "S1", "CORRAL_TURN": "t9"})) == "turn_process"
    assert judge(facts(pid_ns=(NS or 0) + 1)) == "turn_process"
    # What could not be read refuses, each alone:
    assert judge(facts(cgroup=None)) == "peer_unknown"
    assert judge(facts(pid_ns=None)) == "peer_unknown"
    assert judge(facts(environ=None)) == "peer_unknown"
    assert judge(facts(alive=False)) == "peer_unknown"
    # A sign of a turn wins even where the rest is unreadable (it is named in the log).
    refusal = judge_peer(facts(cgroup="/corral/store1/turn-7", environ=None, alive=False), own_uid=OWN,
                         subtree="/corral/store1", store_id="S1", own_pid_ns=NS)
    assert refusal is not None and refusal.turn == "turn-7"


def _listener(folder: Path) -> tuple[socket.socket, str]:
    path = str(folder / "peer.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    return server, path


def test_a_peer_reaped_before_its_check_is_refused(short_tmp: Path) -> None:
    """Connect, fork, exit, be reaped; only then is the connection accepted and judged (what a
    loaded daemon's accept loop may do at any time). Its child holds the connection open."""
    server, path = _listener(short_tmp)
    go_r, go_w = os.pipe()
    with server:
        parent = os.fork()
        if parent == 0:
            try:
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                client.connect(path)
                if os.fork() == 0:
                    os.read(go_r, 1)  # the child stays until the check is done
            finally:
                os._exit(0)
        assert os.waitpid(parent, 0)[1] == 0
        conn, _ = server.accept()
        with conn:
            got = read_peer(conn)
            assert got.pid == parent and got.alive is False
            assert judge(got) == "peer_unknown"
        os.write(go_w, b"x")
    os.close(go_r)
    os.close(go_w)


def test_a_live_client_is_served(short_tmp: Path) -> None:
    """The positive control: a client alive while it is judged shows every fact, and is served."""
    server, path = _listener(short_tmp)
    with server, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(path)
        conn, _ = server.accept()
        with conn:
            got = read_peer(conn)
    assert got.pid == os.getpid() and got.uid == OWN and got.alive
    assert got.cgroup is not None and got.pid_ns == NS and got.environ is not None
    assert judge(got) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_a_peer_of_another_uid_is_refused(short_tmp: Path) -> None:
    """The socket is 0600 in production; here it is opened to all, so that another uid can
    connect at all: it is still refused, alive and fully readable."""
    short_tmp.chmod(0o711)
    folder = short_tmp / "open"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    server, path = _listener(folder)
    os.chmod(path, 0o777)
    go_r, go_w = os.pipe()
    with server:
        child = os.fork()
        if child == 0:
            try:
                os.setuid(65534)
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                client.connect(path)
                os.read(go_r, 1)
            finally:
                os._exit(0)
        conn, _ = server.accept()
        with conn:
            got = read_peer(conn)
        os.write(go_w, b"x")
        os.waitpid(child, 0)
    assert got.uid == 65534 and got.alive
    refusal = judge_peer(got, own_uid=OWN, subtree=None, store_id="S1", own_pid_ns=NS)
    assert refusal is not None and refusal.code == "peer_uid" and "65534" in refusal.message
