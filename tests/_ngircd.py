"""A real IRC server for the bridge tests: Debian's ``ngircd`` (``apt-get install ngircd``,
done by ``.ci/run``), on loopback, a config and a folder of its own, no PAM, no DNS, no ident."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from scripts._synapse import free_port

_CONFIG = """\
[Global]
Name = irc.corral.test
Info = corral test server
Listen = 127.0.0.1
Ports = {port}
PidFile = {dir}/ngircd.pid
MotdPhrase = corral test
[Limits]
MaxConnectionsIP = 0
MaxJoins = 0
PingTimeout = 120
PongTimeout = 60
[Options]
PAM = no
Ident = no
DNS = no
"""


def missing() -> str | None:
    if shutil.which("ngircd") is None and not Path("/usr/sbin/ngircd").exists():
        return "ngircd is not installed: apt-get install ngircd"
    return None


class Ngircd:
    def __init__(self) -> None:
        self.binary = shutil.which("ngircd") or "/usr/sbin/ngircd"
        self.folder = Path(tempfile.mkdtemp(prefix="corral-irc-", dir="/tmp"))
        self.port = free_port()
        self.config = self.folder / "ngircd.conf"
        self.config.write_text(_CONFIG.format(port=self.port, dir=self.folder))
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        out = (self.folder / "ngircd.log").open("ab")
        self.process = subprocess.Popen([self.binary, "-n", "-f", str(self.config)], stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ngircd exited: {(self.folder / 'ngircd.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.02)  # (a server starting: nothing to wait on instead)
        raise RuntimeError("ngircd did not listen within 30 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
