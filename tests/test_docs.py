"""The guides hold together: every relative link of the README, the changelog and ``docs/``
reaches a file (and a heading, when it names one), the performance page is one table whose
every row names a command that exists, the reference's stop result has the shape a stop
returns, its CLI and embedding tables match the code, the README stays a guide (at most
350 lines) whose layout names the packages ``supervisor/`` has and their modules, and whose
wings' order is the one the code is checked against.

The examples themselves (code blocks shown from ``examples/``, TOML blocks, the paths a page
names) are checked by ``tests/test_examples.py`` and by the tests of each page's subject."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The tables and the stop result the README leaves out (issue 35: the README guides, this page lists).
REFERENCE = ROOT / "docs" / "reference.md"
PAGES = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
#: ``[text](target)`` and ``![alt](target)``, outside code: the target up to a space or ``)``.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """The text without its fenced code blocks and inline code (links there are not links)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page (a repeated heading gets -1, -2, … as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_its_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto: — not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{page.name} has broken links:\n" + "\n".join(broken)


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# One\n\n[ok](#one) [gone](missing.md) [`code`](#two)\n```\n[not a link](nowhere.md)\n```\n")
    found = LINK.findall(prose(page.read_text()))
    assert found == ["#one", "missing.md", "#two"]
    assert anchors(page) == {"one"}
    assert slug('Any agent that speaks ACP: `adapter = "acp"`') == "any-agent-that-speaks-acp-adapter--acp"


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(prose(README.read_text()))}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} | {"CHANGELOG.md"}
    assert pages <= linked, f"the README links no page for {sorted(pages - linked)}"


def performance_rows() -> list[list[str]]:
    """The cells of docs/performance.md's table, one list per row (the header and rule left out)."""
    lines = [line for line in (ROOT / "docs" / "performance.md").read_text().splitlines() if line.startswith("|")]
    assert lines[0] == "| scenario | figure | target | met | command |", lines[0]
    assert set(lines[1].replace(" ", "")) <= {"|", "-"}
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def test_the_performance_page_is_one_table_of_five_columns() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()
    tables = re.findall(r"(?:^\|.*\n)+", text, re.M)
    assert len(tables) == 1, "docs/performance.md is one table (history goes to CHANGELOG.md)"
    rows = performance_rows()
    assert len(rows) > 20
    for row in rows:
        assert len(row) == 5, row
        scenario, figure, target, met, command = row
        assert scenario and figure and target and met, row
        assert target == "—" or met != "—", f"a row with a target says whether it is met: {row}"
        assert met == "—" or met.startswith(("met", "missed", "not quite")), row


def test_every_performance_row_names_a_script_that_exists() -> None:
    for row in performance_rows():
        modules = re.findall(r"python -m scripts\.(\w+)", row[4])
        assert modules, f"the row names no command (python -m scripts.NAME): {row}"
        for module in modules:
            assert (ROOT / "scripts" / f"{module}.py").is_file(), f"scripts/{module}.py does not exist: {row}"


def test_the_references_stop_result_has_the_shape_a_stop_returns() -> None:
    from supervisor import StopResult

    section = REFERENCE.read_text().split("\n## The stop result\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```json\n(.*?)```", section, re.S)
    shown = json.loads(block)
    assert set(shown) == set(StopResult(channel="x", generation=1).to_json())
    assert set(shown["turns"][0]) == {"agent", "turn", "killed", "swept"}


def layout_rows() -> dict[str, str]:
    """The README layout's rows for supervisor/'s packages: ``{"core": "pure, no Trio: ledger …"}``."""
    block = README.read_text().split("<!-- layout -->\n```\n", 1)[1].split("```", 1)[0]
    rows: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if m := re.match(r"  (\w+)/ +(.*)", line):
            current = m.group(1)
            rows[current] = m.group(2)
        elif current and line.startswith("      "):
            rows[current] += " " + line.strip()
        else:
            current = None
    return rows


def test_the_readmes_layout_names_the_packages_of_supervisor_and_their_modules() -> None:
    rows = layout_rows()
    assert {"core", "procs", "turns", "store", "fleet", "serve", "config", "host"} <= set(rows)
    present = {p.name for p in (ROOT / "supervisor").iterdir() if (p / "__init__.py").is_file()}
    assert set(rows) == present, f"the README's layout names {sorted(rows)}; supervisor/ has {sorted(present)}"
    for package, row in rows.items():
        words = set(re.findall(r"\w+", row))
        files = (ROOT / "supervisor" / package).glob("*.py")
        modules = {m.stem.lstrip("_") for m in files if not m.name.startswith("__")}
        assert modules <= words, f"supervisor/{package}/ has modules the layout does not name: {modules - words}"

#: Issue 35: the README guides (what corral is, how to run it, how it works, how to work on it)
#: and sends the reader on; the reference tables and the long stories live in docs/.
README_MAX_LINES = 350


def test_the_readme_stays_a_guide_of_at_most_350_lines() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"the README is {lines} lines: move a topic to docs/ and link it"


def test_the_readme_tells_how_it_works_in_the_wings_order_the_code_is_checked_against() -> None:
    from tests.test_wings import wings_order

    text = README.read_text()
    block = re.search(r"<!-- wings -->\n```\n(.*?)\n```", text, re.S)
    assert block, "the README's How it works shows the wings' order after <!-- wings -->"
    assert block.group(1).split(" < ") == wings_order()
    how = text.split("\n## How it works\n", 1)[1].split("\n## ", 1)[0]
    for path in ("**A message**", "**A stop**"):
        assert path in how, f"How it works tells {path}'s way through the wings"
    named = re.findall(r"^\d\. \*\*(\w+)\*\*", how, re.M)
    assert set(named) <= set(wings_order()), named
    layout = list(layout_rows())
    assert layout == wings_order(), f"the layout lists the wings in their order: {layout}"


def test_the_readme_says_corral_is_linux_only_and_so_does_the_package() -> None:
    import tomllib

    assert "**Linux only.**" in README.read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "Operating System :: POSIX :: Linux" in project["classifiers"]
    assert "Linux" in project["description"]


def reference_table(after: str) -> list[str]:
    """The first cells of the first table after the heading ``after`` in docs/reference.md."""
    section = REFERENCE.read_text().split(f"\n## {after}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [row.split(" | ")[0].strip("| ") for row in rows]


def test_the_references_cli_table_names_every_command_with_its_options() -> None:
    import click

    from supervisor.cli import main

    shown: dict[str, str] = {}
    for cell in reference_table("The CLI"):
        words = cell.strip("`").split()
        assert words[0] == "corral", cell
        shown[words[1]] = cell
    assert set(shown) == set(main.commands), "the table lists every command of `corral`, once"
    for name, cell in shown.items():
        command = main.commands[name]
        flags = {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts}
        for flag in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", cell):
            assert flag in flags, f"`corral {name}` has no option {flag}"


def test_the_references_embedding_table_names_calls_both_hosts_have() -> None:
    import inspect

    from supervisor import AsyncioSupervisor, Supervisor

    calls = [c for cell in reference_table("Embedding") for c in re.findall(r"sup\.(\w+)\(([^)]*)\)", cell)]
    assert {name for name, _ in calls} >= {"send", "stop", "wait_idle", "entries", "follow", "status"}
    for name, shown in calls:
        names = [arg.split("=")[0].strip() for arg in shown.split(",")]
        names = [n for n in names if n.isidentifier() and n != "None"]  # not `*`, nor a literal
        for host in (Supervisor, AsyncioSupervisor):
            assert hasattr(host, name), f"{host.__name__} has no {name}"
            params = inspect.signature(getattr(host, name)).parameters
            missing = [n for n in names if n not in params]
            assert not missing, f"{host.__name__}.{name} takes no {missing}"


def test_the_quick_start_is_two_commands_and_ci_runs_its_test_command() -> None:
    quick = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", quick, re.S)
    assert block, "the quick start shows its commands"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make demo", "make test"], commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "make test" in ci, ".ci/run runs the README's test command"


def test_every_quoted_interrupted_notice_is_the_text_corral_stores() -> None:
    """Issue 25: the guides quoted "Task interrupted — daemon restarting…", which corral never stores."""
    from supervisor.core.results import RESTART_NOTICE
    from supervisor.host.supervisor import HOST_LOST_NOTICE, SHUTDOWN_NOTICE

    real = (SHUTDOWN_NOTICE, RESTART_NOTICE, HOST_LOST_NOTICE)
    for page in PAGES:
        text = " ".join(page.read_text().split())  # quotes wrap across lines
        for quoted in re.findall(r'"(Task interrupted[^"]*)"', text):
            stem = quoted.rstrip(".…").removesuffix("…").strip()
            assert any(notice.startswith(stem) for notice in real), f"{page.name} quotes {quoted!r}; corral stores {real}"


def test_the_guides_say_how_many_clis_make_test_installs() -> None:
    """The count of the agent CLIs `make test` installs (docs/operations.md) is install-clis.sh's."""
    script = (ROOT / "scripts" / "install-clis.sh").read_text()
    table = script.split("declare -A pkg=(", 1)[1].split("\n)", 1)[0]
    count = len(re.findall(r"^\s*\[[\w-]+\]=", table, re.M))
    words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("\n## The agent CLIs the tests install\n", 1)[1].split("\n## ", 1)[0]
    assert f"{words.get(count, count)} npm packages" in " ".join(section.split()), f"install-clis.sh installs {count}"


def test_the_example_configs_pointers_reach_their_sections_and_its_installs_are_from_the_checkout() -> None:
    """Issue 32: config.example.toml sent readers to README sections that moved to docs/, and
    said `pip install 'corral[…]'` while corral is installed from a checkout."""
    text = (ROOT / "config.example.toml").read_text()
    pointers = re.findall(r'(README|docs/[\w-]+\.md), "([^"]+)"', text.replace("\n# ", " "))
    assert len(pointers) >= 6, pointers
    for page, heading in pointers:
        lines = (ROOT / (page + ".md" if page == "README" else page)).read_text().splitlines()
        # A heading (its start: "Any agent that speaks ACP: `adapter = …`"), or a bold paragraph head.
        assert any(line.lstrip("#").strip().startswith(heading) for line in lines if line.startswith("#")) or any(
            line.startswith(f"**{heading}.**") for line in lines), f"{page} has no section {heading!r}"
    assert "see README" not in text and "(README:" not in text, "a pointer names its section"
    assert "'corral[" not in text, "corral is installed from its checkout, not by name"
    assert "pip install -c constraints.txt '.[postgres]'" in text


def test_the_agents_guide_says_how_the_services_user_renews_a_read_only_login() -> None:
    """Issue 32: a subscription login handed in read-only by ``credentials`` cannot refresh its
    token; the guide says how the user the service runs as renews it (the unit's ``User=``)."""
    unit = (ROOT / "scripts" / "corral.service").read_text()
    (user,) = re.findall(r"^User=(\S+)$", unit, re.M)
    guide = (ROOT / "docs" / "agents.md").read_text()
    assert "**Renewing it for a service user.**" in guide
    assert f"sudo -u {user} -H claude /login" in guide
