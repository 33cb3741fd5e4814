"""A supervisor and "the LAN" inside a network namespace the test made for itself.

Run by ``tests/test_network.py`` as ``unshare --user --map-root-user --net sh -c 'ip link set lo
up; ip addr add 169.254.169.254/32 dev lo; ip addr add 10.0.0.1/32 dev lo; exec python
own_network.py FOLDER'``: in that namespace the metadata service's address and a private one
are the namespace's own loopback, so a listener there is real and no packet can leave. It
serves a greeting on 169.254.169.254:80 and 10.0.0.1:5432, runs the probe agent through a
supervisor under the default network and then with both granted, and prints one JSON line:
what the probe got each time and how many connections each listener took.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import trio

from supervisor.config.settings import parse_config
from supervisor.host.supervisor import open_supervisor

PROBE = str(Path(__file__).with_name("net_probe.py"))
LISTENERS = {"metadata": ("169.254.169.254", 80), "lan": ("10.0.0.1", 5432)}


def greet(server: socket.socket, counts: dict[str, int], name: str) -> None:
    while True:
        conn, _ = server.accept()
        counts[name] += 1
        with conn:
            conn.sendall(b"hello from " + name.encode())


async def probe(folder: Path, allow: list[str]) -> dict[str, str]:
    tries = [[f"{name} by proxy", "connect", host, port] for name, (host, port) in LISTENERS.items()]
    tries += [[f"{name} by SOCKS", "socks", host, port] for name, (host, port) in LISTENERS.items()]
    tries += [[f"{name} directly", "direct", host, port] for name, (host, port) in LISTENERS.items()]
    config = parse_config({
        "server": {"socket": "corral.sock", "cgroup": "off", "sandbox": "required"},
        "store": {"path": "corral.db"},
        "agents": {"probe": {"adapter": "generic", "command": [sys.executable, PROBE], "network": "internet",
                             "network_allow": allow}},
    }, file=str(folder / "corral.toml"), base=folder)
    async with open_supervisor(config) as sup:
        await sup.send("net", json.dumps(tries))
        assert await sup.wait_idle("net", timeout=120)
        entries = await sup.entries("net")
    answer = next(e.text for e in entries if e.kind == "message" and e.text.startswith("{"))
    return dict(json.loads(answer))


def main() -> None:
    root = Path(sys.argv[1])
    counts = {name: 0 for name in LISTENERS}
    for name, address in LISTENERS.items():
        server = socket.create_server(address)
        threading.Thread(target=greet, args=(server, counts, name), daemon=True).start()
    results: dict[str, object] = {}
    for run, allow in (("default", []), ("granted", ["169.254.169.254:80", "10.0.0.0/8"])):
        folder = root / run
        folder.mkdir()
        results[run] = trio.run(probe, folder, allow)
        results[f"{run} accepted"] = dict(counts)
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
