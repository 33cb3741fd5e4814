"""An agent's installation: the files the kernel needs to run its ``command``.

Theory of operation
-------------------

The sandbox hides every HOME (and ``/tmp``, ``/run/user``, ...) from a turn, yet the agent's
own program often lives there: ``~/.local/bin/claude`` (a symlink into
``~/.local/share/claude/versions/``), an npm global prefix under HOME, nvm's node under
``~/.nvm``, a pipx or ``uv tool`` venv under ``~/.local/share``, a checkout under ``/tmp``.
:func:`installation` finds those files the way the kernel would run the program, so the
sandbox can put them back, read-only, and nothing else of the HOME:

* **through PATH** (the agent's own PATH) when the program names no folder;
* **through every symlink**, hop by hop (each hop's folder, and the final file's);
* **through a script's interpreter**: ``#!/path/python`` or ``#!/usr/bin/env node`` (found
  on the same PATH, as ``env`` would), recursively (an interpreter may be a script too);
* a venv's ``pyvenv.cfg`` ``home``, where its base Python lives (a ``--copies`` venv).

Each file stands for a folder: the folder it is in, and where that is a ``bin/`` (or
``node_modules/.bin``, or a version manager's ``shims/``: pyenv's, rbenv's) of a prefix,
the whole prefix (a venv's ``lib``, an npm prefix's
``lib/node_modules``, nvm's ``versions/node/vX``) — except ``~/.local``, which holds the
user's data (keyrings, state) beside ``bin``: there only ``bin`` itself. A folder that is,
or holds, one of the folders hidden wholesale (a HOME, ``/home``) never stands in: then the
file alone is shown.

What it cannot start inside (the program or an interpreter missing, or not executable) is
a :class:`Problem` with the path and the fix, so corral says it before the spawn instead
of bwrap's ``execvp`` error. It only reads (``stat``, ``readlink``, a script's first line):
the sandbox decides what to do with the answer.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: How deep an interpreter chain may go (a script run by a script...): the kernel's own limit is 4.
MAX_INTERPRETERS = 4
#: Symlink hops followed before giving up (the kernel's ELOOP limit is 40).
MAX_LINKS = 40


@dataclass(frozen=True, slots=True)
class Problem:
    """Why the program cannot be started inside the sandbox: the path, what is wrong, the fix."""

    path: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why} — fix: {self.fix}"


@dataclass(frozen=True, slots=True)
class Installation:
    """What running a command needs: the program as the kernel finds it, the folders (or
    files) to show, and the problems that would stop it."""

    program: str | None
    """The program's path (found on PATH), or None if not found."""
    shown: tuple[str, ...] = ()
    """Folders (or single files) the program, its symlinks and interpreters are in."""
    needed: tuple[str, ...] = ()
    """Every file the kernel opens to start it (the program, each symlink hop, each
    interpreter): the sandbox checks none of them is hidden by a rule of the config."""
    problems: tuple[Problem, ...] = ()


def installation(
    program: str, words: Sequence[str] = (), *, path_env: str | None, cwd: str,
    opaque: Iterable[str] = (), agent: str = "AGENT",
) -> Installation:
    """The installation of ``program`` (the command's first word) run with ``path_env``, and
    the folders of the absolute paths among ``words`` (the configured ``command`` and ``args``,
    never a prompt). ``opaque``: folders hidden wholesale (HOMEs), which never stand for a
    file in them. ``agent`` names the config table in the fixes."""
    walk = _Walk(path_env, cwd, tuple(Path(p) for p in opaque), agent)
    found = walk.program(program)
    if found is not None:
        walk.run(found, depth=0)
    for word in words:
        if os.path.isabs(word) and os.path.exists(word) and word != found:
            if os.path.isfile(word) and os.access(word, os.X_OK):
                # A program a wrapper runs (``env --ignore-signal=INT /venv/bin/python``,
                # ``nice``, ``timeout``): walked as the kernel would run it, links and all.
                walk.run(word, depth=0)
            else:
                walk.show(word)
    return Installation(found, tuple(dict.fromkeys(walk.shown)), tuple(dict.fromkeys(walk.needed)),
                        tuple(walk.problems))


class _Walk:
    def __init__(self, path_env: str | None, cwd: str, opaque: tuple[Path, ...], agent: str) -> None:
        self.path_env = path_env if path_env is not None else os.defpath
        self.cwd = cwd
        self.opaque = opaque
        self.agent = agent
        self.shown: list[str] = []
        self.needed: list[str] = []
        self.problems: list[Problem] = []

    def program(self, program: str) -> str | None:
        if os.sep in program:
            return os.path.normpath(os.path.join(self.cwd, program))
        found = shutil.which(program, path=self.path_env)
        if found is None:
            self.problems.append(Problem(
                program, f"not found on the agent's PATH ({self.path_env})",
                f'set command = ["/path/to/{program}"] in [agents.{self.agent}], or add its folder to PATH'))
        return found

    def run(self, path: str, depth: int) -> None:
        """The kernel's execve of ``path``: every symlink hop, then the file, then its ``#!``."""
        final = self.links(path)
        try:
            info = os.stat(final)
        except OSError as exc:
            fix = f'install it there, or set command = ["/path/to/it"] in [agents.{self.agent}]'
            self.problems.append(Problem(path, f"cannot be run: {exc.strerror}", fix))
            return
        if stat.S_ISDIR(info.st_mode):
            self.problems.append(Problem(path, "is a folder",
                                         f"point command in [agents.{self.agent}] at the program in it"))
            return
        if not stat.S_ISREG(info.st_mode) or not os.access(final, os.X_OK):
            self.problems.append(Problem(path, f"is not executable (mode {stat.S_IMODE(info.st_mode):04o})",
                                         f"chmod +x {final}"))
            return
        self.venv_home(final)
        interpreter = _shebang(final)
        if interpreter is None:
            return
        if depth >= MAX_INTERPRETERS:
            self.problems.append(Problem(path, "has interpreters nested too deep", "run its interpreter directly"))
            return
        name, arg = interpreter
        if os.path.basename(name) == "env":
            self.run_file(name, path, depth)
            wanted = _env_program(arg)
            if wanted is None:
                return
            found = shutil.which(wanted, path=self.path_env) if os.sep not in wanted else wanted
            if found is None:
                self.problems.append(Problem(
                    path, f"starts with #!{name} {arg}, and {wanted} is not on the agent's PATH ({self.path_env})",
                    f"install {wanted}, add its folder to PATH in [agents.{self.agent}.env], or run it directly:"
                    f' command = ["/path/to/{wanted}", "{path}"]'))
                return
            self.run_file(found, path, depth)
        else:
            self.run_file(name, path, depth)

    def run_file(self, interpreter: str, script: str, depth: int) -> None:
        if not os.path.exists(interpreter):
            self.problems.append(Problem(
                interpreter, f"(the interpreter {script} names in its #! line) does not exist",
                f"install it, or fix the first line of {script}"))
            return
        self.run(interpreter, depth + 1)

    def links(self, path: str) -> str:
        """Show and record every hop of ``path``'s symlinks; the file they end at."""
        current = path
        for _ in range(MAX_LINKS):
            self.needed.append(current)
            self.show(current)
            if not os.path.islink(current):
                break
            current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
        real = os.path.realpath(current)  # (a folder on the way may be a symlink too: nvm's "current")
        if real != current:
            self.needed.append(real)
            self.show(real)
        return real

    def venv_home(self, program: str) -> None:
        """A venv's base Python (``home`` in ``pyvenv.cfg``): its standard library lives there."""
        prefix = Path(program).parent.parent
        try:
            text = (prefix / "pyvenv.cfg").read_text(errors="replace")
        except OSError:
            return
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == "home" and os.path.isabs(value.strip()):
                self.show(os.path.join(value.strip(), "python"))

    def show(self, path: str) -> None:
        self.shown.append(str(stand_in(Path(path), self.opaque)))


def stand_in(path: Path, opaque: Sequence[Path] = ()) -> Path:
    """The folder shown for ``path``: its prefix, else its folder, else the file alone (see
    the module's theory)."""
    folder = path.parent
    candidates = [folder]
    node_bin = folder.name == ".bin" and folder.parent.name == "node_modules"
    # A version manager's shims (pyenv, rbenv, nodenv, asdf) exec its root's own programs
    # (``libexec/``, ``versions/``): the root is the prefix.
    if node_bin or folder.name == "shims" or (folder.name == "bin" and folder.parent.name != ".local"):
        candidates.insert(0, folder.parent)
    candidates.append(path)
    for candidate in candidates:
        if not any(_within(hidden, candidate) for hidden in opaque):
            return candidate
    return path


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _shebang(path: str) -> tuple[str, str] | None:
    """A script's interpreter and its one argument (Linux passes the rest of the line as one)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode(errors="replace").strip()
    name, _, arg = line.partition(" ")
    return (name, arg.strip()) if name else None


def _env_program(arg: str) -> str | None:
    """The program ``#!/usr/bin/env [-S] [-i] [NAME=VALUE...] PROGRAM`` runs."""
    words = arg.split()
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word in ("-u", "--unset", "-C", "--chdir"):
            skip = True
            continue
        if word.startswith("-") or "=" in word:
            continue
        return word
    return None
