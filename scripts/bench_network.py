#!/usr/bin/env python
"""What a network policy costs a turn: its start, and a model's stream through the proxy.

Run it from the repository root as ``.venv/bin/python -m scripts.bench_network`` (``--rounds N``,
default 100; ``--firsts N``, default 200; ``--mib N``, default 256). Every server is on this
machine's loopback; nothing leaves it.

* **spawn to first output**: ``/bin/echo`` started the way a turn is (:func:`supervisor.procs.tree.spawn`,
  behind the sandbox prefix), with the host's network against under ``"internet"`` — its
  namespace taken from the pool (a spare, as a turn finds one) and entered by ``nsenter``
  before bwrap; rounds alternate. Target: at most 5 ms added to the median.
* **first byte**: a client in a turn's namespace (entered by ``nsenter``) asks a streaming
  server on the host's loopback for its stream, through the proxy (``CONNECT``, then the
  request), against the same client outside asking directly; time from the request's send
  to the first byte of the answer, on an open connection (a model's stream starts on one).
  Target: at most 2 ms later, median.
* **throughput**: the same server streams ``--mib`` MiB in 64 KiB writes, read to its end,
  through the proxy and directly. Target: at least 90 % of direct.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from scripts._bench import short_tmp, spread
from supervisor.core.netpolicy import parse_policy
from supervisor.net.proxy import NetworkService
from supervisor.procs.netns import NetnsPool, nsenter_program
from supervisor.procs.sandbox import TurnGrants, open_sandbox, private_paths
from supervisor.procs.tree import spawn

#: The client each measurement runs (a separate process, inside the namespace or not).
CLIENT = r"""
import json, socket, sys, time
host = sys.argv[1]
port, target_port, firsts, mib = (int(word) for word in sys.argv[2:6])
def open_stream():
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if port != target_port:
        sock.sendall(f"CONNECT 127.0.0.1:{target_port} HTTP/1.1\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
    return sock
firsts_ms = []
sock = open_stream()
for _ in range(firsts):
    t0 = time.perf_counter()
    sock.sendall(b"1")
    sock.recv(1)
    firsts_ms.append((time.perf_counter() - t0) * 1000)
sock.sendall(b"B")
total, t0 = 0, time.perf_counter()
while total < mib * 1024 * 1024:
    data = sock.recv(1 << 20)
    if not data:
        break
    total += len(data)
took = time.perf_counter() - t0
print(json.dumps({"firsts": firsts_ms, "mib_s": total / took / 1024 / 1024}))
"""


#: The streaming server (a process of its own: in the proxy's, it would share its GIL). Each
#: connection: a byte back for each ``1`` (a stream's first byte), then MIB MiB on ``B``.
SERVER = r"""
import socket, sys
mib = int(sys.argv[1])
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
chunk = b"x" * 65536
while True:
    conn, _ = server.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (got := conn.recv(1)) == b"1":
            conn.sendall(b"d")
        if got == b"B":
            for _ in range(mib * 16):
                conn.sendall(chunk)
"""


Runs = dict[str, list[dict[str, Any]]]


async def bench(folder: Path, rounds: int, firsts: int, mib: int) -> tuple[list[float], list[float], Runs]:
    nsenter = nsenter_program()
    assert nsenter, "nsenter (util-linux) is needed"
    state = folder / "corral.d"
    home = state / "home" / "a" / "c"
    (home / "tmp").mkdir(parents=True)
    private = private_paths(state_dir=state, store_path=folder / "corral.db", store_url=None,
                            config_path=folder / "corral.toml", token_file=None, socket=folder / "corral.sock",
                            cgroup_subtree=None, agent_dirs={})
    sandbox = open_sandbox("required", private)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(mib)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    policy = parse_policy("internet", [f"127.0.0.1:{port}"])
    async with trio.open_nursery() as nursery:
        pool = NetnsPool(nursery)
        service = NetworkService(nursery, pool)
        # Spawn to first output: a turn's start with the host's network and under a policy.
        plain: list[float] = []
        proxied: list[float] = []
        for i in range(rounds + 5):
            for sample, kind in ((plain, "host"), (proxied, "internet")):
                t0 = time.perf_counter()
                net = await service.open(f"b{i}", policy) if kind == "internet" else None
                prefix = sandbox.prefix(TurnGrants("a", cwd=str(folder), home=str(home),
                                                   network="proxied" if net else "host"),
                                        entering=net.entering if net else ())
                proc = await spawn(("/bin/echo", "hi"), env={"PATH": os.defpath, **(net.env if net else {})},
                                   cwd=str(folder), stdin_pipe=False, sandbox=prefix)
                assert proc.stdout is not None
                await proc.stdout.receive_some(1)
                took = (time.perf_counter() - t0) * 1000
                await proc.wait()
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        await stream.aclose()
                if net is not None:
                    await net.aclose()
                if i >= 5:
                    sample.append(took)
                with trio.move_on_after(0.5):  # let the pool make the next spare, as between turns
                    while kind == "internet" and not pool.spares(policy.forwarded):
                        await trio.sleep(0.005)
        # The stream: directly, and from inside a namespace through the proxy.
        net = await service.open("stream", policy)
        holder = net.netns.holder.pid
        direct_cmd = [sys.executable, "-c", CLIENT, "127.0.0.1", str(port), str(port), str(firsts), str(mib)]
        proxy_cmd = [nsenter, f"--target={holder}", "--user", "--net", "--preserve-credentials", "--",
                     sys.executable, "-c", CLIENT, "127.0.0.1", "3128", str(port), str(firsts), str(mib)]
        runs: Runs = {"direct": [], "proxy": []}
        for _ in range(3):
            for name, cmd in (("direct", direct_cmd), ("proxy", proxy_cmd)):
                done = await trio.run_process(cmd, capture_stdout=True)
                runs[name].append(json.loads(done.stdout))
        await net.aclose()
        await pool.aclose()
        nursery.cancel_scope.cancel()
    server.kill()
    server.wait()
    return plain, proxied, runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100, help="spawns of each kind (default 100)")
    parser.add_argument("--firsts", type=int, default=200, help="first-byte round trips per run (default 200)")
    parser.add_argument("--mib", type=int, default=256, help="MiB streamed per run (default 256)")
    args = parser.parse_args()
    folder = short_tmp("corral-bnet-")
    try:
        plain, proxied, runs = trio.run(bench, folder, args.rounds, args.firsts, args.mib)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    added = statistics.median(proxied) - statistics.median(plain)
    print(f"spawn to first output, sandboxed, {args.rounds} rounds each, alternating, load {load}:")
    print(f"  network = \"host\"              {spread(plain)}")
    print(f"  network = \"internet\" (proxy)  {spread(proxied)}")
    print(f"  added: {added:+.2f} ms median (target: at most +5 ms)")
    firsts = {name: [x for run in runs[name] for x in run["firsts"]] for name in ("direct", "proxy")}
    speed = {name: statistics.median(run["mib_s"] for run in runs[name]) for name in ("direct", "proxy")}
    later = statistics.median(firsts["proxy"]) - statistics.median(firsts["direct"])
    print(f"first byte on an open stream, {len(firsts['direct'])} each:")
    print(f"  direct        {spread(firsts['direct'])}")
    print(f"  through proxy {spread(firsts['proxy'])}")
    print(f"  later by {later:+.3f} ms median (target: at most 2 ms)")
    ratio = speed["proxy"] / speed["direct"]
    print(f"throughput, {args.mib} MiB, median of 3: direct {speed['direct']:.0f} MiB/s, "
          f"through the proxy {speed['proxy']:.0f} MiB/s ({ratio:.0%}; target: at least 90 %)")
    return 0 if added <= 5 and later <= 2 and ratio >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
