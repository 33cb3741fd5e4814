"""A throwaway PostgreSQL server for the tests: ``initdb`` + ``pg_ctl`` into a temporary
folder, reachable only through a Unix socket in that folder (no TCP port).

The server refuses to run as root, so as root it runs as the ``postgres`` user (``runuser
-u postgres --``); as anyone else, as that user. One server serves a whole test session; a
test gets a database of its own (:meth:`PostgresServer.new_database`).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

#: Where Debian's packages put the server binaries (one folder per major version).
DEBIAN_BINARIES = "/usr/lib/postgresql/*/bin"


def find_binaries() -> Path | None:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    for found in sorted(glob.glob(DEBIAN_BINARIES), reverse=True):
        if all(os.access(os.path.join(found, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return Path(found)
    initdb = shutil.which("initdb")
    if initdb is not None:
        folder = Path(os.path.realpath(initdb)).parent
        if (folder / "pg_ctl").exists() and (folder / "postgres").exists():
            return folder
    return None


def missing() -> str | None:
    """Why no server can be started here (a reason naming what is missing), or None."""
    try:
        import psycopg  # noqa: F401 - only checking that the extra is installed
    except ImportError:
        return "psycopg is not installed: pip install -e '.[postgres]'"
    if find_binaries() is None:
        return (f"the PostgreSQL server binaries initdb, pg_ctl and postgres are not installed (looked in "
                f"{DEBIAN_BINARIES} and on PATH): apt-get install postgresql")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no 'postgres' user to run the PostgreSQL server as"
        if shutil.which("runuser") is None:
            return "running as root without runuser, which is needed to start PostgreSQL as 'postgres'"
    return None


class PostgresServer:
    """A running server in its own temporary folder; :meth:`close` stops it and removes it."""

    def __init__(self) -> None:
        binaries = find_binaries()
        assert binaries is not None, missing()
        self.binaries = binaries
        self.folder = Path(tempfile.mkdtemp(prefix="corral-pg-", dir="/tmp"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._names = itertools.count(1)
        self._run("initdb", "-D", str(self.data), "--auth=trust", "-U", "postgres", "-E", "UTF8",
                  "--locale=C.UTF-8", "--no-sync")
        self.start()

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run([*self._as, str(self.binaries / program), *args], capture_output=True, text=True,
                              timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip()}\n"
                               f"{self.log.read_text() if self.log.exists() else ''}")

    def start(self) -> None:
        """Start the server (a Unix socket in the folder, no TCP); returns once it accepts."""
        # fsync off: a test server's durability is the machine's page cache (not a crash test).
        options = f"-k {self.folder} -c listen_addresses='' -c fsync=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnects every session; ``immediate``: a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def url(self, database: str = "postgres") -> str:
        """The libpq URL of ``database`` on this server (through the socket folder)."""
        return f"postgresql://postgres@/{database}?host={self.folder}"

    def new_database(self) -> str:
        """A new, empty database; returns its URL."""
        import psycopg

        name = f"t{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def pid(self) -> int | None:
        """The postmaster's pid, if it runs."""
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Stop the server (killed by its pid if pg_ctl cannot) and remove its folder."""
        try:
            self.stop()
        except (RuntimeError, subprocess.TimeoutExpired):
            pid = self.pid()
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.folder, ignore_errors=True)
