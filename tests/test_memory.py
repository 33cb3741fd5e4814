"""The memory probe (supervisor/procs/memory.py): /proc/meminfo, a delegated cgroup, PSI."""

from __future__ import annotations

from pathlib import Path

from supervisor.procs.memory import (
    cgroup_headroom,
    machine,
    own_cgroup_dir,
    parse_bytes,
    parse_meminfo,
    parse_pressure,
    read_memory,
)

MEMINFO = (
    "MemTotal:       24684084 kB\nMemFree:        20153708 kB\nMemAvailable:   23521216 kB\n"
    "HugePages_Total:       0\n"
)
PSI = "some avg10=3.50 avg60=1.00 avg300=0.20 total=123\nfull avg10=1.25 avg60=0.50 avg300=0.10 total=45\n"
MOUNTINFO = (
    "25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)


def test_sizes_with_and_without_units() -> None:
    assert parse_bytes("512M") == 512 * 1024**2
    assert parse_bytes("2GiB") == parse_bytes("2gb") == parse_bytes("2G") == 2 * 1024**3
    assert parse_bytes("4096") == 4096
    for bad in ("", "x", "1.5G", "-1", "iB", "12Q"):
        assert parse_bytes(bad) is None, bad


def test_meminfo_and_pressure_are_parsed() -> None:
    info = parse_meminfo(MEMINFO)
    assert info["MemAvailable"] == 23521216 * 1024 and info["HugePages_Total"] == 0
    assert parse_pressure(PSI) == 1.25
    assert parse_pressure("some avg10=3.50 avg60=1.00 avg300=0.20 total=123\n") is None


def test_the_hybrid_hosts_cgroup2_mount_is_found() -> None:
    assert own_cgroup_dir(MOUNTINFO, "4:memory:/x\n0::/user.slice/corral\n") == Path(
        "/sys/fs/cgroup/unified/user.slice/corral"
    )
    assert own_cgroup_dir(MOUNTINFO, "4:memory:/x\n") is None


def _cgroup(folder: Path, max_: str, current: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.max").write_text(max_ + "\n")
    (folder / "memory.current").write_text(f"{current}\n")


def test_the_tightest_cgroup_on_the_way_up_gives_the_headroom(tmp_path: Path) -> None:
    mount = tmp_path / "cg"
    _cgroup(mount / "slice", str(4 * 1024**3), 3 * 1024**3)  # 1 GiB left
    _cgroup(mount / "slice" / "corral", "max", 100)
    assert cgroup_headroom(mount / "slice" / "corral", mount) == (1024**3, 4 * 1024**3)
    assert cgroup_headroom(mount / "elsewhere", mount) == (None, None)  # (no controller delegated)


def test_a_reading_takes_the_cgroups_headroom_when_tighter_and_its_pressure(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "pressure").mkdir(parents=True)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "pressure" / "memory").write_text(PSI)
    reading = read_memory(5.0, proc=proc, cgroup=False)
    assert reading is not None
    assert (reading.available, reading.source, reading.pressure, reading.at) == (23521216 * 1024, "machine", 1.25, 5.0)
    folder = tmp_path / "cg"
    _cgroup(folder, str(2 * 1024**3), 1024**3)
    (folder / "memory.pressure").write_text(PSI.replace("full avg10=1.25", "full avg10=30.00"))
    reading = read_memory(6.0, proc=proc, cgroup=folder)
    assert reading is not None
    assert (reading.available, reading.source, reading.pressure) == (1024**3, "cgroup", 30.0)


def test_no_meminfo_means_no_reading(tmp_path: Path) -> None:
    assert machine(tmp_path) is None
    assert read_memory(0.0, proc=tmp_path, cgroup=False) is None


def test_this_machine_reads() -> None:
    reading = read_memory(0.0)
    assert reading is not None and reading.available > 0
