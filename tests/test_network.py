"""A turn reaches the network its policy allows, and nothing else: real sandboxed turns.

The agent is ``tests/fakes/net_probe.py`` (a ``generic`` agent): it tries connections
directly and through the proxy its environment names, and says how each went. Every server
here listens on the host's loopback; no address outside this machine is ever connected to:
a private or link-local refusal is proved by the proxy's decision, made before any connect —
a guard on the proxy's sockets fails the test if it would connect anywhere but loopback.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import PYTHON, make_config

from supervisor.host.supervisor import open_supervisor
from supervisor.net import proxy as proxy_module
from supervisor.procs.sandbox import probe

PROBE = str(Path(__file__).parent / "fakes" / "net_probe.py")


@pytest.fixture(autouse=True)
def _needs_sandbox() -> None:
    support = probe()
    if not support.available:
        pytest.skip(f"no sandbox here: {'; '.join(support.missing)}")


class Greeter:
    """A TCP server on the host's loopback that greets each connection (or streams, for a download)."""

    def __init__(self, stream: bool = False) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = int(self.server.getsockname()[1])
        self.stream = stream
        self.done = threading.Event()
        self.accepted = 0
        self.closed_by_peer = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                if not self.stream:
                    conn.sendall(b"hello")
                    return
                conn.settimeout(0.2)
                while not self.done.is_set():  # a download that never ends, 4 KiB a tick
                    conn.sendall(b"x" * 4096)
                    try:
                        if conn.recv(1) == b"":
                            break
                    except TimeoutError:
                        continue
            except OSError:
                pass
            self.closed_by_peer.set()

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self.server.close()


@pytest.fixture
def greeter() -> Iterator[Greeter]:
    server = Greeter()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every address the proxy connects to; a connect beyond loopback fails the test first."""
    seen: list[tuple[str, int]] = []
    real = proxy_module.connect_to

    async def guarded(address: Any, port: int) -> trio.SocketStream:
        seen.append((str(address), port))
        assert str(address) in ("127.0.0.1", "::1"), f"the proxy would have connected to {address}"
        return await real(address, port)

    monkeypatch.setattr(proxy_module, "connect_to", guarded)
    return seen


def probe_agent(network: object = "internet", allow: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    agent: dict[str, Any] = {"adapter": "generic", "command": [PYTHON, PROBE], "network": network, **extra}
    if allow is not None:
        agent["network_allow"] = allow
    return agent


async def run_probe(folder: Path, agent: dict[str, Any], tries: list[list[Any]]) -> dict[str, str]:
    config = make_config(folder, {"probe": agent}, stop_grace=1)
    async with open_supervisor(config) as sup:
        await sup.send("net", json.dumps(tries))
        assert await sup.wait_idle("net", timeout=90)
        entries = await sup.entries("net")
        assert sup.network is None or not sup.network.turns, "a turn's network outlived it"
    answer = next((e.text for e in entries if e.kind == "message" and e.text.startswith("{")), None)
    assert answer is not None, [(e.kind, e.text) for e in entries]
    return dict(json.loads(answer))


async def test_the_default_refuses_loopback_and_a_name_for_it_and_a_grant_opens_one_port(
    short_tmp: Path, greeter: Greeter, guard: list[tuple[str, int]], caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="corral.proxy")
    other = Greeter()
    try:
        port = greeter.port
        got = await run_probe(short_tmp, probe_agent("internet", [f"127.0.0.1:{port}"]), [
            ["granted, CONNECT", "connect", "127.0.0.1", port],
            ["granted, SOCKS", "socks", "127.0.0.1", port],
            ["granted, plain HTTP", "get", "127.0.0.1", port],
            ["granted, ignoring the proxy", "direct", "127.0.0.1", port],
            ["another port, ignoring the proxy", "direct", "127.0.0.1", other.port],
            ["another loopback port", "connect", "127.0.0.1", other.port],
            ["another port by SOCKS", "socks", "127.0.0.1", other.port],
            ["a name for loopback", "connect", "localhost", other.port],
            ["the granted port, by a name for its address", "connect", "localhost", port],
        ])
    finally:
        other.close()
    assert got["granted, CONNECT"] == "ok:hello", got
    assert got["granted, SOCKS"] == "ok:hello", got
    # (the greeter is no HTTP server: the proxy forwarded the request and relayed its answer)
    assert got["granted, plain HTTP"] == "reached:BadStatusLine", got
    # A granted loopback port is forwarded onto the turn's own loopback, at the same address
    # (where NO_PROXY sends a tool); nothing else is there: a tool that ignores the proxy
    # reaches no other port.
    assert got["granted, ignoring the proxy"] == "ok:hello", got
    assert got["another port, ignoring the proxy"] in ("ECONNREFUSED", "ENETUNREACH"), got
    status, reason = got["another loopback port"].split(":", 1)
    assert status == "403" and "loopback" in reason and "network_allow" in reason, got
    assert got["another port by SOCKS"] == "socks:2", got  # "not allowed by ruleset"
    status, reason = got["a name for loopback"].split(":", 1)
    assert status == "403" and "localhost" in reason and "loopback" in reason, got
    assert got["the granted port, by a name for its address"] == "ok:hello", got  # a grant of the address
    assert other.accepted == 0, "a refused connection reached its server"
    assert {addr for addr in guard} <= {("127.0.0.1", greeter.port)}
    # 127.0.0.1:PORT refused twice (CONNECT, then SOCKS), logged once for the turn and host;
    # localhost:PORT, another host, once of its own.
    logged = [r.getMessage().split("network refused: ", 1)[1] for r in caplog.records
              if "network refused" in r.getMessage()]
    assert sum(m.startswith("127.0.0.1 is") and f":{other.port}" in m for m in logged) == 1, logged
    assert sum(m.startswith("localhost (127.0.0.1)") and f":{other.port}" in m for m in logged) == 1, logged


async def test_private_and_link_local_addresses_are_refused_before_any_connect(
    short_tmp: Path, guard: list[tuple[str, int]]
) -> None:
    got = await run_probe(short_tmp, probe_agent("internet"), [
        ["metadata", "connect", "169.254.169.254", 80],
        ["metadata by SOCKS", "socks", "169.254.169.254", 80],
        ["metadata v6", "connect", "[fd00:ec2::254]", 80],
        ["link-local v6", "connect", "[fe80::1]", 80],
        ["rfc1918", "connect", "10.1.2.3", 5432],
        ["rfc1918 b", "connect", "192.168.1.1", 80],
        ["cgnat", "connect", "100.64.0.1", 80],
        ["mapped loopback", "connect", "[::ffff:127.0.0.1]", 80],
        ["ignoring the proxy", "direct", "169.254.169.254", 80],
    ])
    for name in ("metadata", "metadata v6", "link-local v6", "rfc1918", "rfc1918 b", "cgnat", "mapped loopback"):
        assert got[name].startswith("403:") and "network_allow" in got[name], (name, got)
    assert "link-local" in got["metadata"] and "CGNAT" in got["cgnat"], got
    assert got["metadata by SOCKS"] == "socks:2", got
    # No route anywhere from the namespace: the kernel refuses before a packet leaves.
    assert got["ignoring the proxy"] == "ENETUNREACH", got
    assert guard == [], "the proxy connected somewhere"


async def test_a_domain_list_allows_exactly_its_names(
    short_tmp: Path, greeter: Greeter, guard: list[tuple[str, int]]
) -> None:
    # "localhost" is listed, and resolves to loopback: a listed name still may not reach a
    # non-public address unless granted. Granted by name and port, it works.
    got = await run_probe(short_tmp, probe_agent(["localhost", "*.example.com"], [f"localhost:{greeter.port}"]), [
        ["the granted name", "connect", "localhost", greeter.port],
        ["the listed name, another port", "connect", "localhost", greeter.port + 1 if greeter.port < 65535 else 1],
        ["an unlisted name", "connect", "example.org", 443],
        ["its address", "connect", "127.0.0.1", greeter.port],
    ])
    assert got["the granted name"] == "ok:hello", got
    assert got["the listed name, another port"].startswith("403:") and "resolves to" in got[
        "the listed name, another port"], got
    assert got["an unlisted name"].startswith("403:") and "not in this agent's network" in got["an unlisted name"], got
    assert got["its address"].startswith("403:"), got
    assert all(addr == ("127.0.0.1", greeter.port) or addr == ("::1", greeter.port) for addr in guard), guard


async def test_a_policy_turn_on_a_host_whose_mounts_propagate_enters_its_namespace_before_the_unshare_step(
    short_tmp: Path, greeter: Greeter, guard: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a systemd host (shared mounts) bwrap starts behind util-linux's ``unshare`` (its own
    user and mount namespace); ``nsenter`` must still come first, so that the ``unshare`` step
    and bwrap are made inside the turn's network namespace — and the turn still reaches a
    grant through the proxy and nothing directly."""
    import shutil

    from supervisor.procs import sandbox as sandbox_module

    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs util-linux's unshare and nsenter")
    monkeypatch.setattr(sandbox_module, "propagates", lambda mountinfo=None: True)
    argvs: list[tuple[str, ...]] = []
    real = sandbox_module.Sandbox.argv

    def recorded(self: sandbox_module.Sandbox, *args: Any, **kwargs: Any) -> tuple[str, ...]:
        argv = real(self, *args, **kwargs)
        argvs.append(argv)
        return argv

    monkeypatch.setattr(sandbox_module.Sandbox, "argv", recorded)
    got = await run_probe(short_tmp, probe_agent("internet", [f"127.0.0.1:{greeter.port}"]), [
        ["granted, CONNECT", "connect", "127.0.0.1", greeter.port],
        ["granted, ignoring the proxy", "direct", "127.0.0.1", greeter.port],
        ["another port", "connect", "127.0.0.1", greeter.port + 1 if greeter.port < 65535 else 1],
    ])
    assert got["granted, CONNECT"] == "ok:hello", got
    assert got["granted, ignoring the proxy"] == "ok:hello", got  # (forwarded onto its loopback)
    assert got["another port"].startswith("403:"), got
    assert len(argvs) == 1, argvs
    names = [Path(word).name for word in argvs[0]]
    assert names[0] == "nsenter" and names.index("unshare") < names.index("bwrap"), argvs[0]


async def test_none_has_no_network_at_all(short_tmp: Path, greeter: Greeter) -> None:
    agent = probe_agent("none", env={"HTTPS_PROXY": "http://127.0.0.1:3128", "ALL_PROXY": "socks5h://127.0.0.1:3128"})
    got = await run_probe(short_tmp, agent, [
        ["loopback", "direct", "127.0.0.1", greeter.port],
        ["a proxy", "connect", "127.0.0.1", greeter.port],
    ])
    assert got["loopback"] in ("ECONNREFUSED", "ENETUNREACH"), got
    assert got["a proxy"] in ("ECONNREFUSED", "ENETUNREACH"), got
    assert greeter.accepted == 0


async def test_a_stop_mid_download_ends_the_connection(short_tmp: Path) -> None:
    server = Greeter(stream=True)
    progress = short_tmp / "progress"
    try:
        agent = probe_agent("internet", [f"127.0.0.1:{server.port}"], env={"NET_PROBE_PROGRESS": str(progress)})
        config = make_config(short_tmp, {"probe": agent}, stop_grace=1)
        async with open_supervisor(config) as sup:
            await sup.send("dl", json.dumps([["download", "download", "127.0.0.1", server.port]]))
            with trio.fail_after(60):
                while not progress.exists() or int(progress.read_text() or 0) < 64 * 1024:
                    await trio.sleep(0.05)  # polling a file a real process writes
            assert sup.network is not None and len(sup.network.turns) == 1
            result = await sup.stop("dl")
            assert result.ok and result.stopped_turns
            assert not sup.network.turns and sup.network.open_connections == 0
            with trio.fail_after(10):
                await trio.to_thread.run_sync(server.closed_by_peer.wait)
    finally:
        server.close()


async def test_an_acp_agents_tools_reach_the_network_through_the_proxy_too(
    short_tmp: Path, greeter: Greeter, guard: list[tuple[str, int]]
) -> None:
    fake_acp = str(Path(__file__).parent / "fakes" / "fake_acp.py")
    other = Greeter()
    plan, out = short_tmp / "plan.json", short_tmp / "net-results.json"
    plan.write_text(json.dumps([
        ["granted", "connect", "127.0.0.1", greeter.port],
        ["refused", "connect", "127.0.0.1", other.port],
        ["granted, ignoring the proxy", "direct", "127.0.0.1", greeter.port],
        ["another port, ignoring the proxy", "direct", "127.0.0.1", other.port],
    ]))
    state = short_tmp / "fake-state"
    state.mkdir()
    agent = {"adapter": "acp", "command": [PYTHON, fake_acp], "network": "internet",
             "network_allow": [f"127.0.0.1:{greeter.port}"],
             "env": {"FAKE_ACP_STATE": str(state), "NET_PROBE_OUT": str(out)}}
    try:
        config = make_config(short_tmp, {"acp": agent}, stop_grace=1)
        async with open_supervisor(config) as sup:
            await sup.send("net", f"[[tool:{PYTHON} {PROBE} @{plan}]]")
            assert await sup.wait_idle("net", timeout=90)
            assert sup.network is not None and len(sup.network.turns) == 1  # the agent's, while it lives
        assert sup.network is not None and not sup.network.turns  # closed with the agent
    finally:
        other.close()
    got = json.loads(out.read_text())
    assert got["granted"] == "ok:hello", got
    assert got["refused"].startswith("403:") and "loopback" in got["refused"], got
    assert got["granted, ignoring the proxy"] == "ok:hello", got  # (forwarded onto its loopback)
    assert got["another port, ignoring the proxy"] in ("ECONNREFUSED", "ENETUNREACH"), got
    assert other.accepted == 0


# ---------------------------------------------------------------- the proxy under load


class _LoopbackNamespace(proxy_module.NetNamespace):
    """A stand-in namespace whose listener is on the host's loopback (the proxy cannot tell):
    so 200 turns' proxies are driven from this process without 200 sandboxes."""

    async def aclose(self) -> None:
        self.listener.close()

    def entering(self, nsenter: str) -> tuple[str, ...]:
        return ()


class _LoopbackPool:
    def __init__(self) -> None:
        self.handed: list[_LoopbackNamespace] = []

    async def take(self, forwards: tuple[tuple[str, int], ...] = ()) -> _LoopbackNamespace:
        # (A stand-in on the host's loopback forwards nothing: these turns use the proxy.)
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        ns = _LoopbackNamespace(holder=None, listener=listener)  # type: ignore[arg-type]
        self.handed.append(ns)
        return ns


def _open_fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


async def test_the_proxy_holds_200_concurrent_turns_bounded_and_leaves_nothing(guard: list[tuple[str, int]]) -> None:
    from supervisor.core.netpolicy import parse_policy

    upstream = Greeter(stream=True)
    turns, per_turn = 200, 2
    before = _open_fds()
    try:
        policy = parse_policy("internet", [f"127.0.0.1:{upstream.port}"])
        async with trio.open_nursery() as nursery:
            pool = _LoopbackPool()
            service = proxy_module.NetworkService(nursery, pool, max_connections=turns * per_turn,  # type: ignore[arg-type]
                                                  per_turn=per_turn)
            service.nsenter = "nsenter"
            nets = [await service.open(f"turn-{i}", policy) for i in range(turns)]
            clients: list[trio.SocketStream] = []

            async def tunnel(net: proxy_module.TurnNetwork) -> bytes:
                stream = await trio.open_tcp_stream(*net.netns.listener.getsockname()[:2])
                clients.append(stream)
                await stream.send_all(f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1\r\n\r\n".encode())
                got = b""
                while b"\r\n\r\n" not in got:
                    got += await stream.receive_some(4096)
                return got

            with trio.fail_after(120):
                async with trio.open_nursery() as clients_nursery:
                    for net in nets:
                        for _ in range(per_turn):
                            clients_nursery.start_soon(tunnel, net)
                # Every turn has its connections, streaming; one more for a turn is refused at once.
                assert service.open_connections == turns * per_turn
                assert all(net.connections == per_turn for net in nets)
                extra = await tunnel(nets[0])
                assert extra.startswith(b"HTTP/1.1 503"), extra
                # The turns end (their teardown): every connection of each ends with it.
                async with trio.open_nursery() as closing:
                    for net in nets:
                        closing.start_soon(net.aclose)
            assert service.open_connections == 0 and not service.turns
            for stream in clients:  # each client sees its end: EOF or a reset, never a hang
                with trio.fail_after(10):
                    try:
                        while await stream.receive_some(65536):
                            pass
                    except trio.BrokenResourceError:
                        pass
                await stream.aclose()
            nursery.cancel_scope.cancel()
    finally:
        upstream.close()
    assert _open_fds() <= before + 2, "the proxy leaked sockets"


async def test_the_relay_moves_every_byte_of_a_fast_stream_and_a_turns_end_stops_it_mid_stream(
    guard: list[tuple[str, int]]
) -> None:
    """The splice relay tries each move before waiting: what it moves is what was sent, both
    ways, and a turn's end still stops a stream whose sides never make it wait."""
    import contextlib
    import hashlib
    from functools import partial

    from supervisor.core.netpolicy import parse_policy

    blob = hashlib.shake_256(b"corral").digest(8 << 20)  # 8 MiB that no shortcut can fake
    endless = trio.Event()

    async def serve(stream: trio.SocketStream) -> None:
        first = await stream.receive_some(65536)
        if first == b"endless":
            endless.set()
            with trio.move_on_after(60), contextlib.suppress(trio.BrokenResourceError):
                while True:  # as fast as the relay takes it, until the relay ends it
                    await stream.send_all(blob[: 1 << 20])
            return
        await stream.send_all(blob)  # the echo's other half: the client sends blob too
        got = first
        while len(got) < len(blob) and (more := await stream.receive_some(1 << 20)):
            got += more
        await stream.send_all(hashlib.sha256(got).digest())

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        service = proxy_module.NetworkService(nursery, _LoopbackPool())  # type: ignore[arg-type]
        service.nsenter = "nsenter"
        net = await service.open("turn-1", parse_policy("internet", [f"127.0.0.1:{port}"]))

        async def tunnel() -> trio.SocketStream:
            stream = await trio.open_tcp_stream(*net.netns.listener.getsockname()[:2])
            await stream.send_all(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive_some(4096)
            assert head.startswith(b"HTTP/1.1 200"), head
            return stream

        with trio.fail_after(120):
            stream = await tunnel()
            received = b""
            async with trio.open_nursery() as both:
                both.start_soon(stream.send_all, blob)
                while len(received) < len(blob) + 32:
                    received += await stream.receive_some(1 << 20)
            assert received[: len(blob)] == blob, "the stream from the server changed on its way"
            assert received[len(blob):] == hashlib.sha256(blob).digest(), "the stream to the server changed"
            await stream.aclose()

            fast = await tunnel()
            await fast.send_all(b"endless")
            await endless.wait()
            for _ in range(8):  # it streams
                assert await fast.receive_some(1 << 20)
        with trio.fail_after(10):
            await net.aclose()  # the turn's end, mid-stream
            try:
                while await fast.receive_some(1 << 20):
                    pass
            except trio.BrokenResourceError:
                pass
        assert service.open_connections == 0
        await fast.aclose()
        nursery.cancel_scope.cancel()


async def test_namespaces_are_made_ahead_and_none_outlives_its_close() -> None:
    import psutil

    from supervisor.procs.netns import open_netns_pool

    async with open_netns_pool(spares=2) as pool:
        first = await pool.take()  # none ready yet: made now, and two spares start
        with trio.fail_after(60):
            while pool.spares() < 2:
                await trio.sleep(0.02)  # waiting for real helper processes
        made = pool.made
        taken = [first, await pool.take(), await pool.take()]
        assert pool.made == made, "the two spares were handed out, none made on the spot"
        holders = [ns.holder.pid for ns in taken]
        assert len(set(holders)) == 3 and all(psutil.pid_exists(pid) for pid in holders)
        namespaces = {os_readlink(f"/proc/{pid}/ns/net") for pid in holders}
        assert len(namespaces) == 3 and os_readlink("/proc/self/ns/net") not in namespaces
        for ns in taken:
            await ns.aclose()
        assert all(ns.holder.returncode is not None for ns in taken)
        with trio.fail_after(60):
            while pool.spares() < 2:
                await trio.sleep(0.02)
        spares = [ns.holder for ns in pool._ready[()]]
        # A turn whose grants forward loopback ports gets a namespace made for them, never a
        # plain spare; an address the namespace lacks (::1 without IPv6) is left out.
        forwarded = await pool.take((("127.0.0.1", 4444), ("::1", 4444)))
        assert [ns.holder for ns in pool._ready[()]] == spares
        assert ("127.0.0.1", 4444) in forwarded.forwards and set(forwarded.forwards) <= {
            ("127.0.0.1", 4444), ("::1", 4444)}
        assert all(sock.getsockname()[1] == 4444 for sock in forwarded.forwards.values())
        await forwarded.aclose()
    assert all(holder.returncode is not None for holder in spares), "a spare outlived the pool"


def os_readlink(path: str) -> str:
    import os

    return os.readlink(path)


# ---------------------------------------------------------------- the migration, and what is shown


MIGRATION = (
    '[agents.local]\nadapter = "claude"\ncommand = ["/bin/true"]\n'
    'env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:4000", OTHER_URL = "http://localhost:11434/v1" }\n'
    '[agents.granted]\nadapter = "claude"\ncommand = ["/bin/true"]\n'
    'env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:4000" }\nnetwork_allow = ["127.0.0.1:4000"]\n'
    '[agents.chosen]\nadapter = "claude"\ncommand = ["/bin/true"]\n'
    'env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:4000" }\nnetwork = "host"\n'
    '[agents.public]\nadapter = "claude"\ncommand = ["/bin/true"]\n'
    'env = { ANTHROPIC_BASE_URL = "https://api.anthropic.com" }\n'
    '[agents.listed]\nadapter = "claude"\ncommand = ["/bin/true"]\nnetwork = ["pypi.org"]\n'
    'network_allow = ["10.0.0.0/8"]\n'
    '[defaults]\nagent = "local"\n'
)


def test_check_shows_each_agents_network(short_tmp: Path) -> None:
    import subprocess

    from conftest import CORRAL

    (short_tmp / "corral.toml").write_text(MIGRATION)
    out = subprocess.run([*CORRAL, "check", "-c", "corral.toml"], cwd=short_tmp, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "network of local: internet" in out.stdout and "network of chosen: host" in out.stdout
    assert "network of granted: internet; allowed: 127.0.0.1:4000" in out.stdout, out.stdout
    assert "network of listed: 1 name (pypi.org); allowed: 10.0.0.0/8" in out.stdout, out.stdout
    as_json = json.loads(subprocess.run([*CORRAL, "check", "-c", "corral.toml", "--json"], cwd=short_tmp,
                                        capture_output=True, text=True).stdout)
    assert as_json["networks"]["listed"]["allow"] == ["10.0.0.0/8"]
    # The default ("internet") cuts one agent off from the local server its config names:
    # said once, with the line to add; the granted, the chosen and the public are not named.
    notes = [line for line in out.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith("note: agents.local:"), out.stdout
    assert 'network_allow = ["127.0.0.1:4000", "127.0.0.1:11434"]' in notes[0]
    assert as_json["notes"] == [notes[0].removeprefix("note: ")]


def test_under_the_internet_default_check_names_each_agent_it_cuts_off_with_the_line_to_add(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tomllib

    from supervisor.config import preflight, settings

    monkeypatch.setattr(settings, "DEFAULT_NETWORK", "internet")
    config = settings.parse_config(tomllib.loads(MIGRATION), file=str(short_tmp / "corral.toml"), base=short_tmp)
    notes = preflight.network_notes(config)
    assert len(notes) == 1, notes  # once, for the one agent concerned (granted, chosen and public are not)
    assert notes[0].startswith("agents.local:") and 'network_allow = ["127.0.0.1:4000", "127.0.0.1:11434"]' in notes[0]
    assert 'network = "host"' in notes[0]
    assert config.agents["granted"].network.label == "internet" and config.agents["chosen"].network.label == "host"


def test_an_adapter_that_talks_to_no_one_declares_no_network_and_a_config_still_overrides_it(short_tmp: Path) -> None:
    from supervisor.config import settings

    def agents(server: dict[str, str]) -> dict[str, str]:
        config = settings.parse_config(
            {"server": server, "defaults": {"agent": "demo"},
             "agents": {"demo": {"adapter": "demo"}, "said": {"adapter": "demo", "network": "internet"},
                                          "other": {"adapter": "generic", "command": ["true"]}}},
            file=str(short_tmp / "corral.toml"), base=short_tmp)
        return {name: agent.network.label for name, agent in config.agents.items()}

    # The bundled demo agent needs nothing: no namespace helper, no proxy. Any other adapter
    # gets corral's default; an agent's own word and [server]'s both win over the adapter's.
    assert agents({}) == {"demo": "none", "said": "internet", "other": settings.DEFAULT_NETWORK}
    assert agents({"network": "internet"}) == {"demo": "internet", "said": "internet", "other": "internet"}


async def test_status_and_the_dashboard_show_each_agents_network(short_tmp: Path) -> None:
    from supervisor.serve.dashboard import list_view

    config = make_config(short_tmp, {"a": {"adapter": "demo", "network": "internet"},
                                     "b": {"adapter": "demo", "network": "none"},
                                     "c": {"adapter": "demo", "network": ["pypi.org:443"],
                                           "network_allow": ["10.0.0.0/8"]}}, agent="a")
    async with open_supervisor(config) as sup:
        await sup.send("chat", "hi")
        assert await sup.wait_idle("chat", timeout=60)
        status = sup.status()
    networks = {name: agent["network"] for name, agent in status["agents"].items()}
    assert networks["a"]["policy"] == "internet" and networks["a"]["enforced"] is True
    assert networks["b"]["policy"] == "none"
    assert networks["c"] == {"policy": "1 name", "kind": "list", "names": ["pypi.org:443"], "allow": ["10.0.0.0/8"],
                             "enforced": True, "implicit": False}
    # A list row names an agent's network where it is not the default, enforced (which would
    # repeat on every row).
    row = list_view(status)["channels"][0]["agents"][0]
    assert row["agent"] == "a" and "network" not in row, row
    for network, shown in (({"policy": "host", "enforced": True}, "host"),
                           ({"policy": "1 name", "enforced": True}, "1 name"),
                           ({"policy": "internet", "enforced": False}, "internet, NOT enforced")):
        status["agents"]["a"]["network"] = network
        assert list_view(status)["channels"][0]["agents"][0]["network"] == shown
    # The demo adapter's own "none", unsaid by the config, is its default too: not on every row.
    status["agents"]["a"]["network"] = {"policy": "none", "enforced": True, "implicit": True}
    assert "network" not in list_view(status)["channels"][0]["agents"][0]
    status["agents"]["a"]["network"] = {"policy": "none", "enforced": True, "implicit": False}
    assert list_view(status)["channels"][0]["agents"][0]["network"] == "none"


def test_the_metadata_service_and_a_lan_address_in_a_namespace_of_the_tests_own(short_tmp: Path) -> None:
    """A real listener on 169.254.169.254 and on 10.0.0.1 — the addresses of a namespace this test
    makes for itself (``unshare``), where they are its own loopback: the default refuses both,
    through the proxy and directly, and a grant reaches them. No packet can leave that namespace."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs util-linux's unshare and iproute2's ip")
    script = Path(__file__).parent / "fakes" / "own_network.py"
    setup = ("ip link set lo up && ip addr add 169.254.169.254/32 dev lo && ip addr add 10.0.0.1/32 dev lo"
             f' && exec "$0" {script} {short_tmp}')
    repo = Path(__file__).parent.parent
    out = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "sh", "-c", setup, PYTHON],
                         cwd=repo, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(repo), "HOME": str(short_tmp)})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    default, granted = got["default"], got["granted"]
    for name in ("metadata", "lan"):
        assert default[f"{name} by proxy"].startswith("403:"), default
        assert default[f"{name} by SOCKS"] == "socks:2", default
        assert default[f"{name} directly"] == "ENETUNREACH", default
        assert granted[f"{name} by proxy"] == f"ok:hello from {name}", granted
        assert granted[f"{name} by SOCKS"] == f"ok:hello from {name}", granted
        assert granted[f"{name} directly"] == "ENETUNREACH", granted  # a grant is the proxy's, never a route
    assert "link-local" in default["metadata by proxy"] and "private" in default["lan by proxy"], default
    assert got["default accepted"] == {"metadata": 0, "lan": 0}, "a refused connection reached its listener"
    assert got["granted accepted"] == {"metadata": 2, "lan": 2}


async def test_a_turns_network_with_no_connection_open_closes_without_waiting_for_the_proxys_task() -> None:
    """The turn's teardown goes on at once (one wake-up fewer per stopped turn); the proxy's
    task ends the rest in its own step, and nothing of the turn is left served."""
    from supervisor.core.netpolicy import parse_policy

    policy = parse_policy("internet", [])
    async with trio.open_nursery() as nursery:
        pool = _LoopbackPool()
        service = proxy_module.NetworkService(nursery, pool)  # type: ignore[arg-type]
        service.nsenter = "nsenter"
        idle, busy = await service.open("idle", policy), await service.open("busy", policy)
        stream = await trio.open_tcp_stream(*busy.netns.listener.getsockname()[:2])
        await trio.testing.wait_all_tasks_blocked()  # (the proxy has taken it, and reads its head)
        assert busy.connections == 1
        await idle.aclose()
        assert not idle.closed.is_set() and "idle" in service.turns  # returned before the task ran
        await busy.aclose()  # (a connection open: waited for)
        assert busy.closed.is_set() and busy.connections == 0
        await trio.testing.wait_all_tasks_blocked()
        assert idle.closed.is_set() and not service.turns
        assert all(ns.listener.fileno() == -1 for ns in pool.handed)
        await stream.aclose()
        nursery.cancel_scope.cancel()
