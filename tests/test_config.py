"""Tests for ``supervisor.config.settings``: every problem is found, reported together, with a fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.config.settings import ConfigError, Limits, Problem, load_config, load_server_config, parse_config

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- helpers


def make_exe(path: Path, mode: int = 0o755) -> Path:
    """A small script at ``path`` with ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho hi\n")
    path.chmod(mode)
    return path


def write(tmp_path: Path, text: str, name: str = "corral.toml") -> Path:
    """Write a config file and return its path."""
    file = tmp_path / name
    file.write_text(text, encoding="utf-8")
    return file


def problems_of(tmp_path: Path, text: str) -> list[Problem]:
    """Load ``text`` as a config file; it must fail; return its problems."""
    file = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(file)
    problems = info.value.problems
    assert problems, "a ConfigError must carry at least one problem"
    for p in problems:
        assert p.file == str(file)
    return problems


def by_key(problems: list[Problem], key: str) -> Problem:
    """The single problem about ``key``."""
    found = [p for p in problems if p.key == key]
    assert len(found) == 1, f"expected one problem about {key!r}, got {[str(p) for p in problems]}"
    return found[0]


DEMO = '[agents.demo]\nadapter = "demo"\n'


# ---------------------------------------------------------------- a valid file


def test_minimal_valid_config_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, DEMO))
    assert config.default_agent == "demo"
    assert config.agent(None).adapter == "demo"
    assert config.agent("demo") is config.agents["demo"]
    assert config.path == (tmp_path / "corral.toml").resolve()
    assert config.limits == Limits()


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf_dir = tmp_path / "conf"
    make_exe(conf_dir / "bin" / "agent")
    (conf_dir / "work").mkdir()
    (conf_dir / "secret.token").write_text("x")
    (conf_dir / "secret.token").chmod(0o600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the process cwd must not matter
    file = write(
        conf_dir,
        """
        [server]
        socket = "run/corral.sock"
        tcp = "127.0.0.1:8765"
        token_file = "secret.token"
        [store]
        path = "data/corral.db"
        [agents.a]
        adapter = "generic"
        command = ["./bin/agent", "--flag"]
        cwd = "work"
        """,
    )
    config = load_config(Path(os.path.relpath(file, elsewhere)))
    base = conf_dir.resolve()
    assert config.server.socket == base / "run/corral.sock"
    assert config.server.token_file == base / "secret.token"
    assert config.server.tcp == "127.0.0.1:8765"
    assert config.store_path == base / "data/corral.db"
    assert config.state_dir == base / "data/corral.d"
    agent = config.agents["a"]
    assert Path(agent.command[0]) == base / "bin/agent"
    assert agent.command[1:] == ("--flag",)
    assert agent.cwd == base / "work"


def test_int_and_float_seconds_are_both_accepted(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, "[defaults]\nstop_grace = 3\nstall_timeout = 1.5\nturn_timeout = 0\n" + DEMO)
    )
    assert config.limits.stop_grace == 3.0
    assert isinstance(config.limits.stop_grace, float)
    assert config.limits.stall_timeout == 1.5
    assert config.limits.turn_timeout == 0.0


def test_agents_override_defaults_and_inherit_the_rest(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """
            [defaults]
            agent = "b"
            stop_grace = 5
            stall_timeout = 30
            keep_background = true
            max_nudges = 7
            [agents.a]
            adapter = "demo"
            stop_grace = 0.5
            max_nudges = 0
            keep_background = false
            [agents.b]
            adapter = "demo"
            """,
        )
    )
    assert config.default_agent == "b"
    assert config.limits == Limits(stop_grace=5.0, stall_timeout=30.0, keep_background=True, max_nudges=7)
    a = config.agents["a"].limits
    assert (a.stop_grace, a.stall_timeout, a.keep_background, a.max_nudges) == (0.5, 30.0, False, 0)
    assert config.agents["b"].limits == config.limits


def test_agent_fields_are_read(tmp_path: Path) -> None:
    exe = make_exe(tmp_path / "agent")
    config = load_config(
        write(
            tmp_path,
            f"""
            [agents.g]
            adapter = "generic"
            command = ["{exe}"]
            args = ["--json", "-v"]
            model = "m1"
            unattended = false
            resume_args = ["--session", "{{session}}"]
            prompt = "stdin"
            [agents.g.env]
            FOO = "bar"
            """,
        )
    )
    g = config.agents["g"]
    assert g.command == (str(exe),)
    assert g.args == ("--json", "-v")
    assert g.model == "m1"
    assert g.unattended is False
    assert dict(g.env) == {"FOO": "bar"}
    assert dict(g.options) == {"resume_args": ["--session", "{session}"], "prompt": "stdin"}


# ---------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("text", "key", "suggestion"),
    [
        ("agent = 1\n" + DEMO, "agent", "agents"),
        ("[server]\nsockett = 'x'\n" + DEMO, "server.sockett", "socket"),
        ("[defaults]\nstop_grase = 1\n" + DEMO, "defaults.stop_grase", "stop_grace"),
        (DEMO + "modle = 'x'\n", "agents.demo.modle", "model"),
        ("[store]\npth = 'x'\n" + DEMO, "store.pth", "path"),
    ],
)
def test_unknown_key_with_did_you_mean(tmp_path: Path, text: str, key: str, suggestion: str) -> None:
    problem = by_key(problems_of(tmp_path, text), key)
    assert "unknown" in problem.message
    assert f"did you mean {suggestion!r}" in problem.fix


def test_unknown_key_without_a_close_match_lists_known_keys(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, "[server]\nzzzzzz = 1\n" + DEMO), "server.zzzzzz")
    assert "socket" in problem.fix and "token_file" in problem.fix


def test_adapter_specific_keys_are_known_only_to_that_adapter(tmp_path: Path) -> None:
    exe = make_exe(tmp_path / "agent")
    # ``delay`` belongs to the demo adapter, not to generic.
    problems = problems_of(
        tmp_path, f'[defaults]\nagent = "g"\n[agents.g]\nadapter = "generic"\ncommand = ["{exe}"]\ndelay = 1\n' + DEMO
    )
    assert [p.key for p in problems] == ["agents.g.delay"]


# ---------------------------------------------------------------- wrong types


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[defaults]\nstop_grace = "2"\n' + DEMO, "defaults.stop_grace"),
        ("[defaults]\nturn_timeout = true\n" + DEMO, "defaults.turn_timeout"),
        ("[defaults]\nstall_timeout = -1\n" + DEMO, "defaults.stall_timeout"),
        ("[defaults]\nstop_grace = nan\n" + DEMO, "defaults.stop_grace"),
        (DEMO + "stop_grace = -0.5\n", "agents.demo.stop_grace"),
        (DEMO + 'turn_timeout = "1h"\n', "agents.demo.turn_timeout"),
    ],
)
def test_bad_seconds(tmp_path: Path, text: str, key: str) -> None:
    problem = by_key(problems_of(tmp_path, text), key)
    assert "seconds" in problem.message
    name = key.rsplit(".", 1)[1]
    assert problem.fix.startswith(f"write {name} = ")


@pytest.mark.parametrize(
    ("text", "key", "fix"),
    [
        ("[defaults]\nmax_nudges = 1.5\n" + DEMO, "defaults.max_nudges", "write max_nudges = 3"),
        ("[defaults]\nmax_nudges = true\n" + DEMO, "defaults.max_nudges", "write max_nudges = 3"),
        ("[defaults]\nmax_nudges = -1\n" + DEMO, "defaults.max_nudges", "write max_nudges = 3"),
        ('[defaults]\nkeep_background = "yes"\n' + DEMO, "defaults.keep_background", "write keep_background = false"),
        (DEMO + "unattended = 1\n", "agents.demo.unattended", "write unattended = true"),
        (DEMO + 'args = "--json"\n', "agents.demo.args", 'write args = ["...", "..."]'),
        (DEMO + 'args = ["a", 1]\n', "agents.demo.args", 'write args = ["...", "..."]'),
        (DEMO + 'env = "FOO=1"\n', "agents.demo.env", "[agents.demo.env]"),
        (DEMO + "[agents.demo.env]\nFOO = 1\n", "agents.demo.env", "[agents.demo.env]"),
        (DEMO + "model = 3\n", "agents.demo.model", 'write model = "..."'),
        ("[server]\nsocket = 5\n" + DEMO, "server.socket", 'write socket = "..."'),
        ('server = "x"\n' + DEMO, "server", "[server]"),
        ('agents = "x"\n', "agents", None),
    ],
)
def test_wrong_types(tmp_path: Path, text: str, key: str, fix: str | None) -> None:
    problems = problems_of(tmp_path, text)
    problem = [p for p in problems if p.key == key][0]
    assert "expected" in problem.message or "no agent" in problem.message
    if fix is not None:
        assert fix in problem.fix


def test_agent_that_is_not_a_table(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, "[agents]\nx = 1\n"), "agents.x")
    assert "table" in problem.message and "[agents.x]" in problem.fix


# ---------------------------------------------------------------- adapters


def test_unknown_adapter_with_suggestion(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, '[agents.x]\nadapter = "claud"\n'), "agents.x.adapter")
    assert "claud" in problem.message
    assert "did you mean 'claude'" in problem.fix


def test_unknown_adapter_without_close_match_lists_them(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, '[agents.x]\nadapter = "zzzz"\n'), "agents.x.adapter")
    assert "generic" in problem.fix and "demo" in problem.fix


def test_missing_adapter(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, "[agents.x]\nmodel = 'm'\n"), "agents.x.adapter")
    assert "missing" in problem.message and 'adapter = "generic"' in problem.fix


def test_generic_needs_a_command(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, '[agents.x]\nadapter = "generic"\n'), "agents.x.command")
    assert "needs a command" in problem.message


def test_empty_command(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, '[agents.x]\nadapter = "generic"\ncommand = []\n'), "agents.x.command")
    assert "empty" in problem.message


def test_bad_prompt_option(tmp_path: Path) -> None:
    exe = make_exe(tmp_path / "agent")
    text = f'[agents.x]\nadapter = "generic"\ncommand = ["{exe}"]\nprompt = "pipe"\n'
    problem = by_key(problems_of(tmp_path, text), "agents.x.prompt")
    assert 'prompt = "stdin"' in problem.fix


def test_resume_args_must_be_a_list(tmp_path: Path) -> None:
    exe = make_exe(tmp_path / "agent")
    text = f'[agents.x]\nadapter = "generic"\ncommand = ["{exe}"]\nresume_args = "--session"\n'
    by_key(problems_of(tmp_path, text), "agents.x.resume_args")


# ---------------------------------------------------------------- missing files


def test_command_path_that_does_not_exist(tmp_path: Path) -> None:
    text = '[agents.x]\nadapter = "generic"\ncommand = ["./nope/agent"]\n'
    problem = by_key(problems_of(tmp_path, text), "agents.x.command")
    assert "does not exist" in problem.message and str(tmp_path / "nope/agent") in problem.message
    assert "path" in problem.fix


def test_command_that_is_not_executable(tmp_path: Path) -> None:
    exe = make_exe(tmp_path / "agent", mode=0o644)
    assert not os.access(exe, os.X_OK)
    problem = by_key(problems_of(tmp_path, f'[agents.x]\nadapter = "generic"\ncommand = ["{exe}"]\n'), "agents.x.command")
    assert "not executable" in problem.message
    assert problem.fix == f"chmod +x {exe}"


def test_command_name_not_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = by_key(
        problems_of(tmp_path, '[agents.x]\nadapter = "generic"\ncommand = ["corral-no-such-program"]\n'),
        "agents.x.command",
    )
    assert "not on PATH" in problem.message


def test_a_missing_cli_is_named_with_the_command_that_installs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32: the hint said "install it" without the package. Each adapter's install
    command is the one docs/agents.md gives."""
    from adapters import get_adapter

    monkeypatch.setenv("PATH", str(tmp_path))
    problem = by_key(problems_of(tmp_path, '[agents.c]\nadapter = "claude"\n'), "agents.c.adapter")
    assert problem.fix.startswith("install it (npm install -g @anthropic-ai/claude-code), or set command")
    problem = by_key(problems_of(tmp_path, '[agents.c]\nadapter = "codex"\ncommand = ["codex", "-x"]\n'),
                     "agents.c.command")
    assert problem.fix.startswith("install it (npm install -g @openai/codex)")
    guide = (Path(__file__).parent.parent / "docs" / "agents.md").read_text()
    for name in ("claude", "codex", "gemini", "qwen", "aider", "pi"):
        install = get_adapter(name).install
        assert install and f"Install: `{install}`" in guide, name


def test_command_name_on_path_is_kept_as_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_exe(tmp_path / "bin" / "myagent")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    config = load_config(write(tmp_path, '[agents.x]\nadapter = "generic"\ncommand = ["myagent", "-q"]\n'))
    assert config.agents["x"].command == ("myagent", "-q")


def test_default_command_not_on_path_is_blamed_on_the_adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = by_key(problems_of(tmp_path, '[agents.x]\nadapter = "claude"\n'), "agents.x.adapter")
    assert "default command" in problem.message and "command = " in problem.fix


def test_cwd_that_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for cwd in ("missing", "afile"):
        problem = by_key(problems_of(tmp_path, DEMO + f'cwd = "{cwd}"\n'), "agents.demo.cwd")
        assert "not a directory" in problem.message and "mkdir -p" in problem.fix


def test_token_file_that_does_not_exist(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, '[server]\ntoken_file = "tok"\n' + DEMO), "server.token_file")
    assert str(tmp_path / "tok") in problem.message
    assert "openssl rand" in problem.fix


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "absent.toml")
    [problem] = info.value.problems
    assert problem.file == str(tmp_path / "absent.toml")
    assert "does not exist" in problem.message
    assert "config.example.toml" in problem.fix


def test_invalid_toml(tmp_path: Path) -> None:
    file = write(tmp_path, "[agents.x\nadapter = \n")
    with pytest.raises(ConfigError) as info:
        load_config(file)
    [problem] = info.value.problems
    assert problem.file == str(file)
    assert "not valid TOML" in problem.message and "line" in problem.message


# ---------------------------------------------------------------- server


@pytest.mark.parametrize("tcp", ["0.0.0.0:8765", "192.168.1.2:80", "127.0.0.1", "localhost:http"])
def test_tcp_must_be_loopback_with_a_port(tmp_path: Path, tcp: str) -> None:
    (tmp_path / "tok").write_text("s")
    problem = by_key(problems_of(tmp_path, f'[server]\ntcp = "{tcp}"\ntoken_file = "tok"\n' + DEMO), "server.tcp")
    assert "loopback" in problem.message and "127.0.0.1:" in problem.fix


@pytest.mark.parametrize("tcp", ["127.0.0.1:1", "localhost:8765", "[::1]:8765"])
def test_loopback_tcp_with_token_is_accepted(tmp_path: Path, tcp: str) -> None:
    (tmp_path / "tok").write_text("s")
    (tmp_path / "tok").chmod(0o600)
    config = load_config(write(tmp_path, f'[server]\ntcp = "{tcp}"\ntoken_file = "tok"\n' + DEMO))
    assert config.server.tcp == tcp


@pytest.mark.parametrize("port", ["99999", "0", "65536"])
def test_tcp_port_out_of_range(tmp_path: Path, port: str) -> None:
    (tmp_path / "tok").write_text("s")
    (tmp_path / "tok").chmod(0o600)
    problem = by_key(problems_of(tmp_path, f'[server]\ntcp = "127.0.0.1:{port}"\ntoken_file = "tok"\n' + DEMO), "server.tcp")
    assert "out of range" in problem.message and "127.0.0.1:8765" in problem.fix


def test_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("s")
    (tmp_path / "tok").chmod(0o640)
    problem = by_key(problems_of(tmp_path, '[server]\ntcp = "127.0.0.1:8765"\ntoken_file = "tok"\n' + DEMO), "server.token_file")
    assert "other users" in problem.message and problem.fix == f"chmod 600 {tmp_path / 'tok'}"


def test_server_table_alone_is_read_for_client_commands(tmp_path: Path) -> None:
    """Issue 9 item 1: a broken [agents] table does not stop a client from finding the socket."""
    file = write(tmp_path, '[server]\nsocket = "run/c.sock"\n[agents.x]\nadapter = "claud"\ncommand = ["no-such-agent-binary"]\n')
    with pytest.raises(ConfigError):
        load_config(file)
    assert load_server_config(file).socket == tmp_path / "run" / "c.sock"


def test_tcp_without_a_token(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, '[server]\ntcp = "127.0.0.1:8765"\n' + DEMO), "server.tcp")
    assert "token" in problem.message and "token_file" in problem.fix


# ---------------------------------------------------------------- agents


def test_no_agents(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, "[defaults]\nstop_grace = 1\n"), "agents")
    assert "no agent" in problem.message and "[agents." in problem.fix


def test_several_agents_and_no_default(tmp_path: Path) -> None:
    problem = by_key(problems_of(tmp_path, DEMO + '[agents.other]\nadapter = "demo"\n'), "defaults.agent")
    assert "no default" in problem.message and 'agent = "demo"' in problem.fix


def test_default_agent_that_does_not_exist(tmp_path: Path) -> None:
    text = '[defaults]\nagent = "dmo"\n' + DEMO + '[agents.other]\nadapter = "demo"\n'
    problem = by_key(problems_of(tmp_path, text), "defaults.agent")
    assert "did you mean 'demo'" in problem.fix


# ---------------------------------------------------------------- all at once


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    text = """
    colour = "blue"
    [server]
    tcp = "0.0.0.0:9000"
    [defaults]
    stop_grace = "soon"
    [agents.a]
    adapter = "generc"
    [agents.b]
    adapter = "generic"
    command = ["./missing-agent"]
    args = "--json"
    cwd = "afile"
    comand = ["x"]
    [agents.b.env]
    N = 1
    """
    problems = problems_of(tmp_path, text)
    expected = {
        "colour": "did you mean 'cluster'?",  # (the nearest known key since [cluster])
        "server.tcp": "127.0.0.1",  # not loopback, and no token: two problems
        "defaults.stop_grace": "write stop_grace = 2",
        "agents.a.adapter": "did you mean 'generic'?",
        "agents.b.command": "give the right path",
        "agents.b.args": "write args =",
        "agents.b.cwd": "mkdir -p",
        "agents.b.comand": "did you mean 'command'?",
        "agents.b.env": "[agents.b.env]",
        "defaults.agent": 'agent = "a"',
    }
    keys = [p.key for p in problems]
    for key, fix in expected.items():
        assert key in keys, f"{key} not reported; got {keys}"
        assert any(fix in p.fix for p in problems if p.key == key), (key, [str(p) for p in problems])
    assert keys.count("server.tcp") == 2
    file = str(tmp_path / "corral.toml")
    for p in problems:
        assert p.file == file and p.key and p.message and p.fix
    # The exception's text lists every problem, one per line, with file, key and fix.
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "corral.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == len(problems)
    for line, p in zip(lines, problems, strict=True):
        assert line.startswith(f"{file}: {p.key}: ") and "fix:" in line


def test_parse_config_without_a_file_resolves_against_the_given_base(tmp_path: Path) -> None:
    config = parse_config({"agents": {"d": {"adapter": "demo"}}, "store": {"path": "x.db"}}, base=tmp_path)
    assert config.store_path == tmp_path / "x.db"
    assert config.path is None
    with pytest.raises(ConfigError) as info:
        parse_config({"bogus": 1, "agents": {"d": {"adapter": "demo"}}}, file="inline")
    assert [(p.file, p.key) for p in info.value.problems] == [("inline", "bogus")]


# ---------------------------------------------------------------- the shipped example


def test_config_example_loads_without_problems() -> None:
    example = REPO_ROOT / "config.example.toml"
    assert example.is_file(), f"{example} is missing: the repository must ship an example config"
    try:
        config = load_config(example)
    except ConfigError as exc:  # pragma: no cover - the message is the point
        pytest.fail(f"config.example.toml has problems:\n{exc}")
    assert config.agents and config.default_agent in config.agents


def test_the_docs_name_the_state_folder_the_code_uses(tmp_path: Path) -> None:
    """Issue 9 item 11: the state folder of corral.db is corral.d/, and the docs say so."""
    config = load_config(write(tmp_path, '[store]\npath = "corral.db"\n' + DEMO))
    assert config.state_dir == tmp_path / "corral.d"
    repo = Path(__file__).resolve().parent.parent
    for doc in ("README.md", "config.example.toml", "docs/operations.md"):
        text = (repo / doc).read_text()
        assert "corral.db.d" not in text and "corral.d/" in text, doc


# ---------------------------------------------------------------- [channels.NAME]

TWO = '[defaults]\nagent = "claude"\n[agents.claude]\nadapter = "demo"\n[agents.codex]\nadapter = "demo"\n'


def test_channel_tables_set_members_default_agent_and_hops(tmp_path: Path) -> None:
    defaults = TWO.replace('agent = "claude"', 'agent = "claude"\nmax_hops = 4\ncatch_up_entries = 5\ncatch_up_bytes = 1000')
    config = load_config(write(tmp_path, defaults + '[channels.review]\nagents = ["codex", "claude"]\nmax_hops = 2\n'))
    assert config.members("review") == ("codex", "claude")  # the first is the default agent
    assert config.hop_limit("review") == 2
    assert config.members("elsewhere") == ("claude", "codex")  # no table: every agent, the default first
    assert config.hop_limit("elsewhere") == 4
    assert (config.catch_up_entries, config.catch_up_bytes) == (5, 1000)


def test_channel_tables_are_checked_with_a_did_you_mean(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, TWO + '[channels.review]\nagents = ["codx"]\nmax_hop = 3\n'
                                           '[channels.empty]\nagents = []\n'
                                           '[channels.twice]\nagents = ["claude", "claude"]\nmax_hops = -1\n'
                                           '[channels.flat]\n')
    assert "did you mean 'codex'" in by_key(problems, "channels.review.agents").fix
    assert "did you mean 'max_hops'" in by_key(problems, "channels.review.max_hop").fix
    assert "at least one agent" in by_key(problems, "channels.empty.agents").message
    assert "listed twice" in by_key(problems, "channels.twice.agents").message
    assert by_key(problems, "channels.twice.max_hops")
    assert by_key(problems, "channels.flat.agents")


def test_defaults_max_hops_and_catch_up_caps_are_checked(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, TWO.replace('agent = "claude"', 'agent = "claude"\nmax_hops = "six"'
                                                 '\ncatch_up_bytes = -1'))
    assert by_key(problems, "defaults.max_hops").fix == "write max_hops = 6"
    assert by_key(problems, "defaults.catch_up_bytes")


def test_a_toml_syntax_error_names_the_file_not_a_dash(tmp_path: Path) -> None:
    """A problem with the file as a whole reads 'FILE: not valid TOML …', never 'FILE: -: …'."""
    file = write(tmp_path, "[server\n")
    with pytest.raises(ConfigError) as info:
        load_config(file)
    line = str(info.value.problems[0])
    assert line.startswith(f"{file}: not valid TOML") and ": -:" not in line, line
    assert str(file) in info.value.problems[0].fix


def test_delivery_defaults_per_channel_then_agent_and_a_bad_one_is_named_with_a_fix(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[defaults]\nagent = "demo"\n' + DEMO + 'delivery = "steer"\n[agents.other]\nadapter = "demo"\n'
                               '[channels.swap]\nagents = ["demo", "other"]\ndelivery = "interrupt"\n'))
    assert config.delivery("swap", "demo") == "interrupt"  # the channel's wins
    assert config.delivery("elsewhere", "demo") == "steer"  # else the agent's
    assert config.delivery("elsewhere", "other") == "queue"  # else queue
    problems = problems_of(tmp_path, DEMO + 'delivery = "interupt"\n[channels.c]\nagents = ["demo"]\ndelivery = 1\n')
    assert by_key(problems, "agents.demo.delivery").fix == "did you mean 'interrupt'?"
    assert "expected a string" in by_key(problems, "channels.c.delivery").message
