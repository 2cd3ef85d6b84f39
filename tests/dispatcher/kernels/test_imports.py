"""No two modules import each other: every import between modules has one direction.

Each module's source is parsed (``ast``), so every import counts wherever it stands: at the top, inside a
function, under ``if TYPE_CHECKING:``, or as ``importlib.import_module`` with a literal name. Add a package
to PACKAGES to hold it to the same rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("dispatcher",)


def module_name(path: Path, root: Path) -> str:
    """The dotted name of a source file under ``root`` (a package's ``__init__.py`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(base: str, level: int, package: str) -> str:
    """An import's module, with ``level`` leading dots counted from ``package``."""
    if level == 0:
        return base
    anchor = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join(anchor + ([base] if base else []))


def imported(path: Path, root: Path, known: set[str]) -> set[str]:
    """The modules in ``known`` that the file at ``path`` imports, anywhere in it."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node.module or "", node.level, package)
            for alias in node.names:  # ``from pkg import mod`` imports the module pkg.mod where there is one
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            target = node.args[0].value
            level = len(target) - len(target.lstrip("."))
            found.add(resolve(target.lstrip("."), level, package))
    return (found & known) - {name}


def import_graph(packages: tuple[str, ...] = PACKAGES, root: Path = ROOT) -> dict[str, set[str]]:
    """Each module under ``packages`` and the modules among them it imports."""
    files = [p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))]
    known = {module_name(p, root) for p in files}
    return {module_name(p, root): imported(p, root, known) for p in files}


def mutual_pairs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every pair of modules that import each other, each pair once."""
    return sorted((a, b) for a, deps in graph.items() for b in deps if a < b and a in graph.get(b, ()))


def test_no_two_modules_import_each_other():
    assert mutual_pairs(import_graph()) == []


def test_every_kind_of_import_is_seen(tmp_path):
    """The checker itself: a circle through a lazy import, a TYPE_CHECKING import or import_module is found."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('.d', __package__)\n")
    (pkg / "d.py").write_text("from pkg.c import x\nfrom .e import y\n")
    (pkg / "e.py").write_text("import os\n")
    graph = import_graph(("pkg",), tmp_path)
    assert graph["pkg.d"] == {"pkg.c", "pkg.e"}
    assert mutual_pairs(graph) == [("pkg.a", "pkg.b"), ("pkg.c", "pkg.d")]


@pytest.mark.parametrize(("base", "level", "package", "want"), [
    ("common", 1, "dispatcher.kernels", "dispatcher.kernels.common"),
    ("types", 2, "dispatcher.kernels", "dispatcher.types"),
    ("", 1, "dispatcher.kernels", "dispatcher.kernels"),
    ("torch", 0, "dispatcher.kernels", "torch"),
])
def test_relative_imports_resolve_from_the_importing_package(base, level, package, want):
    assert resolve(base, level, package) == want
