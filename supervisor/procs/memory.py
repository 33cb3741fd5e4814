"""Reading how much memory a new turn could use: the machine's, or this process's cgroup's.

The admission gate (:mod:`supervisor.core.admission`) decides; this module only reads.

* The machine: ``MemAvailable`` of ``/proc/meminfo`` (the kernel's estimate of what can be
  allocated without swapping, page cache it can drop included).
* The cgroup, where the memory controller is delegated (cgroup v2: the mount found in
  ``/proc/self/mountinfo``, this process's path from ``/proc/self/cgroup``; on a hybrid host
  that is ``/sys/fs/cgroup/unified``): for this cgroup and each ancestor with a limit,
  ``memory.max`` - ``memory.current``. The tightest of those and the machine's wins.
* Pressure stall information (``memory.pressure`` of the cgroup, else
  ``/proc/pressure/memory``): the ``full avg10`` figure, the share of the last ten seconds
  in which every task waited on memory.

Each reader is a pure parser plus a small function that reads the files; all of it is
synchronous and cheap (a few small reads), so the Trio driver calls it directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..core.admission import MemoryReading

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_bytes(text: str) -> int | None:
    """``"512M"``, ``"2G"``, ``"2GiB"``, ``"1048576"`` → bytes; None if it is not that."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(?:([KMGT])(?:i?B)?|B)?\s*", text, re.IGNORECASE)
    if match is None:
        return None
    return int(match.group(1)) * _UNITS[(match.group(2) or "").upper()]


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` → bytes by field (``MemTotal``, ``MemAvailable``, ...)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[name.strip()] = int(fields[0]) * (1024 if fields[1:2] == ["kB"] else 1)
    return out


def parse_pressure(text: str) -> float | None:
    """``full avg10`` of a PSI file (``/proc/pressure/memory``, ``memory.pressure``), or None."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "full":
            for item in rest.split():
                key, _, value = item.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def parse_limit(text: str) -> int | None:
    """``memory.max``: bytes, or None for ``max`` (no limit)."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def cgroup2_mount(mountinfo: str | None = None) -> Path | None:
    """The mount point of the cgroup2 file system (from ``/proc/self/mountinfo``), if any."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split()[:1] == ["cgroup2"]:
            fields = left.split()
            if len(fields) >= 5:
                return Path(fields[4].replace("\\040", " "))
    return None


def own_cgroup(proc_cgroup: str | None = None) -> str | None:
    """This process's cgroup v2 path (``0::/PATH`` of ``/proc/self/cgroup``), if any."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip()
    return None


@dataclass(frozen=True, slots=True)
class Machine:
    """The machine's memory at one moment (bytes)."""

    total: int
    available: int


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def machine(proc: Path = Path("/proc")) -> Machine | None:
    """``MemTotal`` and ``MemAvailable``, or None where ``/proc/meminfo`` cannot be read."""
    text = _read(proc / "meminfo")
    if text is None:
        return None
    info = parse_meminfo(text)
    total = info.get("MemTotal")
    if total is None:
        return None
    return Machine(total, info.get("MemAvailable", info.get("MemFree", total)))


def own_cgroup_dir(mountinfo: str | None = None, proc_cgroup: str | None = None) -> Path | None:
    """This process's cgroup v2 folder, or None (no cgroup2 mount, or not in one)."""
    mount = cgroup2_mount(mountinfo)
    path = own_cgroup(proc_cgroup)
    if mount is None or path is None:
        return None
    return mount / path.lstrip("/")


def cgroup_headroom(folder: Path, mount: Path) -> tuple[int | None, int | None]:
    """The tightest ``memory.max`` - ``memory.current`` from ``folder`` up to (not beyond)
    ``mount``, and the tightest ``memory.max`` itself: (None, None) where no cgroup on the
    way limits memory or the controller is not delegated (no ``memory.max`` file)."""
    headroom: int | None = None
    limit: int | None = None
    here = folder
    while True:
        text = _read(here / "memory.max")
        current = _read(here / "memory.current")
        if text is not None and current is not None:
            cap = parse_limit(text)
            used = parse_limit(current)
            if cap is not None and used is not None:
                room = max(0, cap - used)
                headroom = room if headroom is None else min(headroom, room)
                limit = cap if limit is None else min(limit, cap)
        if here == mount or here.parent == here or not here.is_relative_to(mount):
            break
        here = here.parent
    return headroom, limit


def read_memory(now: float, *, proc: Path = Path("/proc"), cgroup: Path | bool | None = True) -> MemoryReading | None:
    """What a new turn could use now, or None where nothing can be read (no gate).

    ``cgroup``: True finds this process's cgroup; a folder names one (tests); False or None
    reads the machine only.
    """
    found = machine(proc)
    available = found.available if found is not None else None
    source = "machine"
    pressure_text: str | None = None
    folder = own_cgroup_dir() if cgroup is True else (cgroup or None)
    if isinstance(folder, Path):
        mount = cgroup2_mount() if cgroup is True else folder
        headroom, _ = cgroup_headroom(folder, mount or folder)
        if headroom is not None and (available is None or headroom < available):
            available, source = headroom, "cgroup"
        pressure_text = _read(folder / "memory.pressure")
    if available is None:
        return None
    if pressure_text is None:
        pressure_text = _read(proc / "pressure" / "memory")
    pressure = parse_pressure(pressure_text) if pressure_text is not None else None
    return MemoryReading(available, now, pressure, source)


def memory_total(*, proc: Path = Path("/proc")) -> int | None:
    """What this process may hold at most: the machine's total, or a tighter cgroup limit."""
    found = machine(proc)
    total = found.total if found is not None else None
    folder = own_cgroup_dir()
    mount = cgroup2_mount()
    if folder is not None and mount is not None:
        _, limit = cgroup_headroom(folder, mount)
        if limit is not None and (total is None or limit < total):
            total = limit
    return total
