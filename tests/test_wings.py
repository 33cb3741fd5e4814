"""The wings import one way: every import of ``supervisor/`` read by ``ast`` (function-level and
TYPE_CHECKING ones too) against the order the package's docstring states, and every wing's
docstring naming the modules it has.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import supervisor

PACKAGE = Path(supervisor.__file__).parent


def wings_order() -> list[str]:
    """The order as ``supervisor``'s docstring states it: ``core < procs < … < serve``."""
    doc = supervisor.__doc__ or ""
    found = re.search(r"\b(\w+(?: < \w+)+)", doc)
    assert found, "supervisor/__init__.py's docstring states no wings' order (`core < procs < …`)"
    return found.group(1).split(" < ")


def _wing(parts: list[str], root: Path) -> str | None:
    """The wing of ``supervisor.<parts>`` (None: a top-level module, outside the order)."""
    return parts[0] if parts and (root / parts[0]).is_dir() else None


def imports(path: Path, root: Path = PACKAGE) -> list[tuple[int, list[str]]]:
    """Every import of ``path`` as (line, absolute dotted parts: ``["supervisor", "core", "text"]``)."""
    rel = list(path.relative_to(root.parent).with_suffix("").parts)
    package = rel[:-1]
    found: list[tuple[int, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
            else:
                target = (node.module or "").split(".")
            if node.module is None:  # ``from . import x``: each name is a module
                found += [(node.lineno, [*target, alias.name]) for alias in node.names]
            else:
                found.append((node.lineno, target))
    return found


def arrows_against_the_order(root: Path = PACKAGE) -> list[str]:
    """Each import of one wing from a later one, or of an adapter's private module."""
    order = wings_order()
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        here = _wing(list(rel.parts[1:-1]), root)
        for line, target in imports(path, root):
            if target[0] == "adapters" and any(part.startswith("_") for part in target[1:]):
                bad.append(f"{rel}:{line} imports {'.'.join(target)} (an adapter's private module; use `adapters`)")
            if target[0] != "supervisor" or here is None:
                continue
            there = _wing(target[1:], root)
            if there is not None and there != here and order.index(there) > order.index(here):
                bad.append(f"{rel}:{line} imports {'.'.join(target)}: {here} comes before {there}")
    return bad


def test_every_wing_is_in_the_order_once() -> None:
    order = wings_order()
    wings = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert len(order) == len(set(order)), order
    assert set(order) == wings, f"the order names {sorted(order)}; supervisor/ has {sorted(wings)}"


def test_no_wing_imports_a_later_one() -> None:
    bad = arrows_against_the_order()
    assert not bad, "imports against the wings' order:\n" + "\n".join(bad)


def test_the_check_sees_an_arrow_against_the_order(tmp_path: Path) -> None:
    # Positive control, on a copy of the layout: a core module importing the host inside a
    # function, and a host module importing a private adapter module, are caught; the host
    # importing the core is not.
    root = tmp_path / "supervisor"
    for wing in ("core", "host"):
        (root / wing).mkdir(parents=True)
        (root / wing / "__init__.py").write_text("")
    (root / "core" / "probe.py").write_text("def f() -> None:\n    from ..host import supervisor\n")
    (root / "host" / "probe.py").write_text("from ..core import probe\nfrom adapters._base import Text\n")
    assert arrows_against_the_order(root) == [
        "supervisor/core/probe.py:2 imports supervisor.host: core comes before host",
        "supervisor/host/probe.py:2 imports adapters._base (an adapter's private module; use `adapters`)",
    ]


def test_every_wing_docstring_names_its_modules() -> None:
    for package in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        named = set(re.findall(r":mod:`\.(\w+)`", doc))
        modules = {m.stem for m in package.glob("*.py") if m.stem != "__init__"}
        assert modules <= named, f"supervisor/{package.name}/__init__.py does not name {sorted(modules - named)}"
        assert named <= modules, f"supervisor/{package.name}/__init__.py names modules it lacks: {named - modules}"
