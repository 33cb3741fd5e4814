"""The kernel's keyrings through raw system calls (``keyctl`` may not be installed), for the tests.

As a script, it is the agent side: ``keyring_probe.py SERIAL DESCRIPTION PLANT`` tries to find
and read the key ``DESCRIPTION`` (serial ``SERIAL``) the daemon holds, plants a key named
``PLANT`` in its own session keyring, and prints what happened as JSON (each an errno name, or
``"ok:..."``).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys

KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_REVOKE = 0, 1, 3
KEYCTL_SEARCH, KEYCTL_READ = 10, 11
KEY_SPEC_SESSION_KEYRING = -3
NUMBERS = {"x86_64": {"keyctl": 250, "add_key": 248}, "aarch64": {"keyctl": 219, "add_key": 217}}


class KeyError_(OSError):
    """A keyring call failed (its errno)."""


def _call(name: str, *args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    words = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = int(libc.syscall(ctypes.c_long(NUMBERS[os.uname().machine][name]), *words))
    if result < 0:
        code = ctypes.get_errno()
        raise KeyError_(code, errno.errorcode.get(code, str(code)))
    return result


def join_session(name: str | None) -> int:
    """Join (make) a session keyring for the calling thread: its serial."""
    return _call("keyctl", KEYCTL_JOIN_SESSION_KEYRING, None if name is None else name.encode())


def session_id() -> int:
    """The serial of the calling thread's session keyring."""
    return _call("keyctl", KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0)


def add_user_key(description: str, payload: bytes) -> int:
    """A ``user`` key in the session keyring: its serial."""
    return _call("add_key", b"user", description.encode(), payload, len(payload), KEY_SPEC_SESSION_KEYRING)


def search(description: str) -> int:
    """The serial of the ``user`` key ``description`` reachable from the session keyring."""
    return _call("keyctl", KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", description.encode(), 0)


def read(serial: int) -> bytes:
    """A key's payload."""
    buf = ctypes.create_string_buffer(256)
    size = _call("keyctl", KEYCTL_READ, serial, buf, 256)
    return buf.raw[:size]


def revoke(serial: int) -> None:
    """Revoke a key (the test's own, at its end)."""
    _call("keyctl", KEYCTL_REVOKE, serial)


def _outcome(fn: object, *args: object) -> str:
    try:
        return f"ok:{fn(*args)!r}"  # type: ignore[operator]
    except KeyError_ as exc:
        return errno.errorcode.get(exc.errno or 0, "?")


def main() -> None:
    serial, description, plant = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    print(json.dumps({
        "session": _outcome(session_id),
        "search": _outcome(search, description),
        "read": _outcome(read, serial),
        "plant": _outcome(add_user_key, plant, b"planted"),
        "find planted": _outcome(search, sys.argv[4]) if len(sys.argv) > 4 else "not asked",
    }), flush=True)


if __name__ == "__main__":
    main()
