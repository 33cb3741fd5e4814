"""A real Synapse homeserver for the bridge tests: ``matrix-synapse`` from PyPI, pinned by
``synapse-constraints.txt`` beside this file, in a virtualenv of its own under
``~/.cache/corral`` (made on first use, about a minute; reused after), SQLite, listening on
loopback only. Users are registered with ``register_new_matrix_user`` and the shared secret.

One server serves a test session (a session fixture); :meth:`Synapse.restart` stops it and
starts it again on the same port and database, as a homeserver restarted under a bridge is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONSTRAINTS = HERE / "synapse-constraints.txt"
VERSION = "1.163.2"
SERVER_NAME = "corral.test"


def venv_dir() -> Path:
    """The virtualenv, named by the pins' hash: a change of pins makes a new one."""
    digest = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("CORRAL_CACHE", Path.home() / ".cache" / "corral"))
    return cache / f"synapse-{VERSION}-{digest}"


def ensure_installed() -> Path:
    """The virtualenv's bin folder, installing Synapse into it first if needed."""
    venv = venv_dir()
    stamp = venv / ".installed"
    if stamp.exists():
        return venv / "bin"
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Two test runs at once (two worktrees) must not build it over each other: one builds, the other waits.
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
            subprocess.run(
                [str(venv / "bin" / "pip"), "install", "--quiet", "-c", str(CONSTRAINTS),
                 f"matrix-synapse=={VERSION}"],
                check=True, timeout=1200,
            )
            stamp.write_text(VERSION)
    return venv / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_CONFIG = """\
server_name: "{name}"
pid_file: "{dir}/homeserver.pid"
public_baseurl: "http://127.0.0.1:{port}/"
listeners:
  - port: {port}
    bind_addresses: ["127.0.0.1"]
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: "{dir}/homeserver.db"
log_config: "{dir}/log.yaml"
media_store_path: "{dir}/media"
signing_key_path: "{dir}/signing.key"
registration_shared_secret: "{secret}"
macaroon_secret_key: "{macaroon}"
form_secret: "{form}"
report_stats: false
trusted_key_servers: []
suppress_key_server_warning: true
enable_metrics: false
federation_domain_whitelist: []
presence:
  enabled: false
url_preview_enabled: false
rc_message: {{per_second: 1000, burst_count: 1000}}
rc_login:
  address: {{per_second: 1000, burst_count: 1000}}
  account: {{per_second: 1000, burst_count: 1000}}
  failed_attempts: {{per_second: 1000, burst_count: 1000}}
rc_registration: {{per_second: 1000, burst_count: 1000}}
rc_joins:
  local: {{per_second: 1000, burst_count: 1000}}
  remote: {{per_second: 1000, burst_count: 1000}}
rc_joins_per_room: {{per_second: 1000, burst_count: 1000}}
rc_invites:
  per_room: {{per_second: 1000, burst_count: 1000}}
  per_user: {{per_second: 1000, burst_count: 1000}}
  per_issuer: {{per_second: 1000, burst_count: 1000}}
"""

_LOG = """\
version: 1
formatters:
  precise: {format: '%(asctime)s - %(name)s - %(levelname)s - %(message)s'}
handlers:
  file: {class: logging.FileHandler, formatter: precise, filename: "DIR/homeserver.log"}
root: {level: WARNING, handlers: [file]}
disable_existing_loggers: false
"""


class Synapse:
    """A running homeserver in its own temporary folder; :meth:`close` stops it and removes it."""

    def __init__(self) -> None:
        self.bin = ensure_installed()
        self.folder = Path(tempfile.mkdtemp(prefix="corral-synapse-", dir="/tmp"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secrets.token_hex(16)
        self.config = self.folder / "homeserver.yaml"
        self.config.write_text(_CONFIG.format(
            name=SERVER_NAME, dir=self.folder, port=self.port, secret=self.secret,
            macaroon=secrets.token_hex(16), form=secrets.token_hex(16),
        ))
        (self.folder / "log.yaml").write_text(_LOG.replace("DIR", str(self.folder)))
        subprocess.run(
            [str(self.bin / "python"), "-m", "synapse.app.homeserver", "-c", str(self.config), "--generate-keys"],
            check=True, capture_output=True, timeout=120, cwd=self.folder,
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        out = (self.folder / "stdout.log").open("ab")
        self.process = subprocess.Popen(
            [str(self.bin / "python"), "-m", "synapse.app.homeserver", "-c", str(self.config)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.folder,
        )
        out.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"synapse exited with {self.process.returncode}: {self.logs()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/_matrix/client/versions", timeout=2):
                    return
            except OSError:
                time.sleep(0.05)  # (polling a server that is starting: nothing to wait on instead)
        raise RuntimeError(f"synapse did not answer within 120 s: {self.logs()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        subprocess.run(["rm", "-rf", str(self.folder)], check=False)

    def logs(self) -> str:
        parts = []
        for name in ("stdout.log", "homeserver.log"):
            path = self.folder / name
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def register(self, localpart: str, *, admin: bool = False) -> tuple[str, str]:
        """Register ``@localpart:corral.test`` with the shared secret; returns (user id, access token)."""
        password = secrets.token_hex(8)
        subprocess.run(
            [str(self.bin / "register_new_matrix_user"), "-u", localpart, "-p", password,
             "--admin" if admin else "--no-admin", "-k", self.secret, self.url],
            check=True, capture_output=True, timeout=60,
        )
        reply = self.call("POST", "/_matrix/client/v3/login", {
            "type": "m.login.password", "identifier": {"type": "m.id.user", "user": localpart}, "password": password,
        })
        return str(reply["user_id"]), str(reply["access_token"])

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, token: str | None = None) -> Any:
        """One Client-Server API call from the test's side (blocking; for set-up)."""
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None
