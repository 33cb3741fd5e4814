"""The seccomp program, decision by decision: run through the module's own classic-BPF
interpreter for each architecture, every refused call, the checked arguments, the other ABIs,
and the calls a coding agent lives on. (That the kernel agrees: tests/test_confine.py and the
escape suite, with real sandboxed turns.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.procs import seccomp
from supervisor.procs.seccomp import (
    AARCH64,
    CLONE_NAMESPACES,
    ENOSYS,
    EPERM,
    REFUSED,
    SECCOMP_RET_ALLOW,
    X86_64,
    Arch,
    UnknownArchitecture,
    errno_action,
    evaluate,
    program,
)

ALLOW = SECCOMP_RET_ALLOW
#: glibc's pthread_create flags, and fork()'s.
THREAD = 0x003D0F00
FORK = 0x01200011
#: Calls every program makes, and those left allowed on purpose (see the module docstring).
ALLOWED = {
    "x86_64": {"read": 0, "write": 1, "openat": 257, "execve": 59, "mmap": 9, "ptrace": 101,
               "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "seccomp": 317,
               "name_to_handle_at": 303, "landlock_create_ruleset": 444, "pidfd_open": 434, "fork": 57},
    "aarch64": {"read": 63, "write": 64, "openat": 56, "execve": 221, "mmap": 222, "ptrace": 117,
                "process_vm_readv": 270, "kcmp": 272, "seccomp": 277, "name_to_handle_at": 264,
                "landlock_create_ruleset": 444, "pidfd_open": 434},
}
ARCH_PARAMS = pytest.mark.parametrize("arch", [X86_64, AARCH64], ids=lambda a: a.name)


def decide(arch: Arch, name_or_nr: str | int, *args: int, audit: int | None = None) -> int:
    nr = arch.numbers[name_or_nr] if isinstance(name_or_nr, str) else name_or_nr
    return evaluate(program(arch), nr=nr, arch=arch.audit if audit is None else audit, args=args)


@ARCH_PARAMS
def test_every_refused_call_gets_its_errno(arch: Arch) -> None:
    for name, code in REFUSED.items():
        if name in arch.numbers:
            assert decide(arch, name) == errno_action(code), name
    assert decide(arch, "io_uring_setup") == errno_action(ENOSYS)  # libuv falls back on ENOSYS
    assert decide(arch, "clone3") == errno_action(ENOSYS)  # glibc falls back to clone
    assert decide(arch, "bpf") == decide(arch, "keyctl") == decide(arch, "mount") == errno_action(EPERM)


@ARCH_PARAMS
def test_what_an_agent_lives_on_is_allowed(arch: Arch) -> None:
    for name, nr in ALLOWED[arch.name].items():
        assert decide(arch, nr) == ALLOW, name
    assert decide(arch, "clone", THREAD) == ALLOW and decide(arch, "clone", FORK) == ALLOW
    assert decide(arch, "unshare", 0x400) == ALLOW  # CLONE_FILES: no namespace
    assert decide(arch, 999) == ALLOW  # a call newer than the table: the kernel answers as usual


@ARCH_PARAMS
def test_every_namespace_flag_is_refused_to_clone_and_unshare(arch: Arch) -> None:
    for bit in range(32):
        flag = 1 << bit
        want_clone = errno_action(EPERM) if flag & CLONE_NAMESPACES else ALLOW
        assert decide(arch, "clone", flag | 17) == want_clone, hex(flag)  # 17: SIGCHLD
        want_unshare = errno_action(EPERM) if flag & seccomp.UNSHARE_NAMESPACES else ALLOW
        assert decide(arch, "unshare", flag) == want_unshare, hex(flag)
    assert decide(arch, "unshare", seccomp.CLONE_NEWTIME) == errno_action(EPERM)
    assert decide(arch, "clone", THREAD | seccomp.CLONE_NEWUSER) == errno_action(EPERM)


@ARCH_PARAMS
def test_personality_allows_the_harmless_values_only(arch: Arch) -> None:
    for value in (0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF):
        assert decide(arch, "personality", value) == ALLOW, hex(value)
    for value in (0x0040000, 0x0400000, 0x0200000, 0x1000000, 0x6, 0x0040008):
        # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ADDR_LIMIT_3GB, PER_BSD, linux32 -R
        assert decide(arch, "personality", value) == errno_action(EPERM), hex(value)
    # The kernel reads an unsigned int: the high word is ignored by both.
    assert decide(arch, "personality", (1 << 32) | 0x8) == ALLOW


@ARCH_PARAMS
def test_another_abi_gets_enosys_for_everything(arch: Arch) -> None:
    i386, arm = 0x40000003, 0x40000028
    for audit in (i386, arm, AARCH64.audit if arch is X86_64 else X86_64.audit):
        for nr in (0, 1, 11, 39, 172):
            assert decide(arch, nr, audit=audit) == errno_action(ENOSYS)


def test_the_x32_abi_gets_enosys_on_x86_64() -> None:
    for nr in (39, 165, 321):  # getpid, mount, bpf: under the x32 bit, whatever it is
        assert decide(X86_64, 0x40000000 | nr) == errno_action(ENOSYS)
    assert decide(X86_64, 39) == ALLOW


def test_an_architecture_without_a_table_gets_no_filter() -> None:
    with pytest.raises(UnknownArchitecture) as refused:
        seccomp.program_for("riscv64")
    assert "riscv64" in str(refused.value) and "x86_64" in str(refused.value)
    assert seccomp.program_for("x86_64") == program(X86_64)


def test_the_program_is_small_and_well_formed() -> None:
    for arch in (X86_64, AARCH64):
        insns = seccomp.decode(program(arch))
        assert 10 < len(insns) < 200  # (BPF_MAXINSNS is 4096)
        assert insns[0] == (seccomp.LOAD, 0, 0, seccomp.OFFSET_ARCH)  # the architecture first
        assert insns[-1][0] == seccomp.RET


@pytest.mark.parametrize(("arch", "header"), [
    (X86_64, "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    (AARCH64, "/usr/include/asm-generic/unistd.h"),
], ids=["x86_64", "aarch64"])
def test_the_tables_agree_with_the_kernel_headers(arch: Arch, header: str) -> None:
    """The numbers are the kernel's (where this machine has its headers; a call newer than
    them, ``open_tree_attr``, is not checked)."""
    if not Path(header).exists():
        pytest.skip(f"no {header} here")
    text = Path(header).read_text()
    found = dict(re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text))
    checked = [name for name in arch.numbers if name in found]
    assert len(checked) >= len(arch.numbers) - 1
    for name in checked:
        assert arch.numbers[name] == int(found[name]), name
