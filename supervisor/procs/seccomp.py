"""The seccomp filter every sandboxed turn runs under: less kernel for a hostile agent to attack.

Theory of operation
-------------------

The sandbox (:mod:`.sandbox`) limits what a turn can *reach*; this filter limits which parts
of the *kernel* it can call into. Most Linux privilege escalations of recent years went
through a handful of interfaces no coding agent needs — io_uring, eBPF, userfaultfd,
perf events, the keyrings, new user namespaces and the mount machinery they unlock — so a
turn gets them refused, and everything else as before. bubblewrap loads the program
(``--seccomp FD``) into the sandbox's init and the turn's program right before they run;
a filter is inherited by every child and cannot be removed, ptrace included (a tracer
carries the same filter, and the kernel re-checks a call a tracer rewrote).

The program is classic BPF, built here in pure Python from a table per architecture: no C
toolchain and no library at run time, and the bytes are a pure function of the table, so a
test runs them through a small interpreter and checks every decision. It reads the
architecture first: a call made through another ABI (the 32-bit ``int 0x80`` entry on
x86_64, or x86_64's x32 ABI, whose numbers have bit 30 set) would bypass every rule keyed
on a number, so those get ``ENOSYS`` — what a kernel built without them answers. An
architecture corral has no table for gets no filter at all, never a wrong one:
:func:`program_for` raises and the sandbox's probe says so.

What is refused, and why (docs/security.md has the same list for operators):

* ``ENOSYS`` where a program falls back cleanly only on "not there": ``io_uring_*`` (libuv,
  so Node, tries io_uring and quietly uses its thread pool on ENOSYS) and ``clone3`` (its
  flags are in memory a filter cannot read; glibc, Rust's std and others fall back to
  ``clone``, whose flags are checked below — Docker and Flatpak do the same).
* ``EPERM`` for the rest, what the kernel's own policy refusals say: ``bpf``,
  ``userfaultfd``, ``perf_event_open``; the keyrings (``keyctl``, ``add_key``,
  ``request_key``: each turn also gets a fresh session keyring, see :mod:`.confine`);
  ``kexec_*``; module loading (``init_module``, ``finit_module``, ``delete_module``);
  the mount family (``mount``, ``umount2``, ``pivot_root``, ``move_mount``,
  ``open_tree``, ``open_tree_attr``, ``fsopen``, ``fsmount``, ``fsconfig``, ``fspick``,
  ``mount_setattr``); namespaces (``unshare`` and ``clone`` with any ``CLONE_NEW*`` flag,
  ``setns``); ``swapon``/``swapoff``, ``reboot``, ``syslog``, ``acct``, ``quotactl``/``quotactl_fd``,
  ``lookup_dcookie``, ``open_by_handle_at``, ``nfsservctl``, and on x86_64 ``iopl``,
  ``ioperm``, ``modify_ldt``, ``uselib``.
* ``personality`` only with the harmless values Docker allows (``0``, ``PER_LINUX32``,
  ``UNAME26``, both, and the ``0xffffffff`` query): ``ADDR_NO_RANDOMIZE``,
  ``READ_IMPLIES_EXEC`` and the like are refused (gdb then warns it cannot disable ASLR,
  and runs the program anyway).

Left allowed on purpose: ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp`` and
``pidfd_getfd`` (the pid namespace limits them to the turn's own processes, every one of which
carries this filter: ``strace``, ``gdb``, ``py-spy`` and Mesa's fd comparison work);
``name_to_handle_at`` (a handle is useless without ``open_by_handle_at``); ``seccomp`` and
``landlock_*`` (an agent's own sandbox, Codex's, stacks more rules on top, never fewer).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# BPF instruction classes and fields (linux/filter.h, linux/bpf_common.h).
BPF_LD, BPF_JMP, BPF_RET = 0x00, 0x05, 0x06
BPF_W, BPF_ABS, BPF_K = 0x00, 0x20, 0x00
BPF_JEQ, BPF_JGE, BPF_JSET = 0x10, 0x30, 0x40
LOAD = BPF_LD | BPF_W | BPF_ABS
JEQ, JGE, JSET = BPF_JMP | BPF_JEQ | BPF_K, BPF_JMP | BPF_JGE | BPF_K, BPF_JMP | BPF_JSET | BPF_K
RET = BPF_RET | BPF_K

# Actions (linux/seccomp.h).
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38

# Offsets in struct seccomp_data: nr, arch, instruction_pointer, args[6] (the low word of an
# argument first: both architectures here are little-endian).
OFFSET_NR, OFFSET_ARCH = 0, 4


def arg_low(index: int) -> int:
    """The offset of the low 32 bits of argument ``index`` (little-endian)."""
    return 16 + 8 * index


#: Every ``CLONE_NEW*`` flag ``clone`` takes (its low byte is the exit signal, so
#: ``CLONE_NEWTIME``, 0x80, cannot be passed there) and the one more ``unshare`` takes.
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x00000080
CLONE_NAMESPACES = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC
                    | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET)
UNSHARE_NAMESPACES = CLONE_NAMESPACES | CLONE_NEWTIME

#: ``personality`` values allowed: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

#: The calls refused outright, by name, and the errno each gets (see the module docstring).
REFUSED: Mapping[str, int] = {
    **{name: ENOSYS for name in ("io_uring_setup", "io_uring_enter", "io_uring_register", "clone3")},
    **{name: EPERM for name in (
        "bpf", "userfaultfd", "perf_event_open",
        "keyctl", "add_key", "request_key",
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
        "mount", "umount2", "pivot_root", "move_mount", "open_tree", "open_tree_attr",
        "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr",
        "setns", "swapon", "swapoff", "reboot", "syslog", "acct", "quotactl", "quotactl_fd",
        "lookup_dcookie", "open_by_handle_at", "nfsservctl",
        "iopl", "ioperm", "modify_ldt", "uselib",
    )},
}
#: The calls allowed only with some arguments: what their argument must (not) be.
CHECKED = ("personality", "clone", "unshare")


@dataclass(frozen=True, slots=True)
class Arch:
    """One architecture: its name, its ``AUDIT_ARCH_*`` value and its system call numbers."""

    name: str
    audit: int
    numbers: Mapping[str, int]
    foreign_bit: int | None = None
    """A bit that selects another ABI under the same audit value (x86_64's x32: bit 30)."""


# Numbers from the kernel's tables (arch/x86/entry/syscalls/syscall_64.tbl and the generic
# include/uapi/asm-generic/unistd.h aarch64 uses); 424 and up are the same on every arch.
_COMMON = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "clone3": 435, "mount_setattr": 442, "quotactl_fd": 443, "open_tree_attr": 467,
}
X86_64 = Arch("x86_64", 0xC000003E, {
    **_COMMON,
    "personality": 135, "clone": 56, "unshare": 272, "setns": 308,
    "mount": 165, "umount2": 166, "pivot_root": 155, "swapon": 167, "swapoff": 168, "reboot": 169,
    "syslog": 103, "acct": 163, "quotactl": 179, "lookup_dcookie": 212, "open_by_handle_at": 304,
    "iopl": 172, "ioperm": 173, "modify_ldt": 154, "uselib": 134, "nfsservctl": 180,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "bpf": 321, "userfaultfd": 323, "perf_event_open": 298,
}, foreign_bit=0x40000000)
AARCH64 = Arch("aarch64", 0xC00000B7, {
    **_COMMON,
    "personality": 92, "clone": 220, "unshare": 97, "setns": 268,
    "mount": 40, "umount2": 39, "pivot_root": 41, "swapon": 224, "swapoff": 225, "reboot": 142,
    "syslog": 116, "acct": 89, "quotactl": 60, "lookup_dcookie": 18, "open_by_handle_at": 265,
    "nfsservctl": 42,
    "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
    "keyctl": 219, "add_key": 217, "request_key": 218,
    "bpf": 280, "userfaultfd": 282, "perf_event_open": 241,
})
#: By ``uname -m``.
ARCHES: Mapping[str, Arch] = {arch.name: arch for arch in (X86_64, AARCH64)}


class UnknownArchitecture(Exception):
    """corral has no system call table for this machine: it builds no filter rather than a wrong one."""


def arch_for(machine: str) -> Arch:
    """The :class:`Arch` of ``machine`` (``os.uname().machine``); :class:`UnknownArchitecture` if none."""
    try:
        return ARCHES[machine]
    except KeyError:
        raise UnknownArchitecture(
            f"corral's seccomp filter knows {' and '.join(ARCHES)}, not {machine!r}"
        ) from None


def errno_action(code: int) -> int:
    """The return value that fails a call with ``code``."""
    return SECCOMP_RET_ERRNO | code


class _Assembler:
    """Instructions with symbolic jump targets, resolved to classic BPF's relative offsets."""

    def __init__(self) -> None:
        self.code: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def op(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.code.append((code, jt, jf, k))

    def assemble(self) -> bytes:
        out = []
        for index, (code, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                offset = target if isinstance(target, int) else self.labels[target] - index - 1
                if not 0 <= offset <= 255:
                    raise ValueError(f"jump of {offset} at instruction {index}")  # (the table outgrew 8-bit jumps)
                offsets.append(offset)
            out.append(struct.pack("=HBBI", code, offsets[0], offsets[1], k))
        return b"".join(out)


def program(arch: Arch) -> bytes:
    """The filter for ``arch``: the ``struct sock_filter`` array bubblewrap's ``--seccomp`` reads."""
    asm = _Assembler()
    asm.op(LOAD, OFFSET_ARCH)
    asm.op(JEQ, arch.audit, 0, "foreign")
    asm.op(LOAD, OFFSET_NR)
    if arch.foreign_bit is not None:
        asm.op(JGE, arch.foreign_bit, "foreign", 0)
    actions = sorted({code for code in REFUSED.values()})
    for name, code in sorted(REFUSED.items(), key=lambda item: (item[1], item[0])):
        if name in arch.numbers:
            asm.op(JEQ, arch.numbers[name], f"errno-{code}", 0)
    for name in CHECKED:
        asm.op(JEQ, arch.numbers[name], name, 0)
    asm.op(RET, SECCOMP_RET_ALLOW)
    # (Classic BPF jumps forward only: each checked call ends in an allow of its own.)
    asm.label("personality")
    asm.op(LOAD, arg_low(0))
    for value in PERSONALITIES:
        asm.op(JEQ, value, "personality-allowed", 0)
    asm.op(RET, errno_action(EPERM))
    asm.label("personality-allowed")
    asm.op(RET, SECCOMP_RET_ALLOW)
    asm.label("clone")
    asm.op(LOAD, arg_low(0))
    asm.op(JSET, CLONE_NAMESPACES, f"errno-{EPERM}", 0)
    asm.op(RET, SECCOMP_RET_ALLOW)
    asm.label("unshare")
    asm.op(LOAD, arg_low(0))
    asm.op(JSET, UNSHARE_NAMESPACES, f"errno-{EPERM}", 0)
    asm.op(RET, SECCOMP_RET_ALLOW)
    for code in actions:
        asm.label(f"errno-{code}")
        asm.op(RET, errno_action(code))
    asm.label("foreign")
    asm.op(RET, errno_action(ENOSYS))
    return asm.assemble()


def program_for(machine: str) -> bytes:
    """The filter for this machine (``os.uname().machine``); :class:`UnknownArchitecture` if none."""
    return program(arch_for(machine))


def decode(data: bytes) -> list[tuple[int, int, int, int]]:
    """The instructions of a program, as ``(code, jt, jf, k)`` (for tests and for reading)."""
    return [struct.unpack("=HBBI", data[i:i + 8]) for i in range(0, len(data), 8)]


def evaluate(data: bytes, *, nr: int, arch: int, args: Sequence[int] = ()) -> int:
    """Run a program on one call, as the kernel would: its action (a classic-BPF interpreter
    of the instructions :func:`program` emits, so a test checks every decision without a kernel)."""
    packed = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = decode(data)
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == LOAD:
            acc = struct.unpack_from("=I", packed, k)[0]
        elif code == RET:
            return k
        elif code in (JEQ, JGE, JSET):
            taken = acc == k if code == JEQ else acc >= k if code == JGE else bool(acc & k)
            pc += jt if taken else jf
        else:
            raise ValueError(f"instruction {code:#x} at {pc - 1}")
