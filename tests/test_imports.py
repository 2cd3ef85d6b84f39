"""No import circles, and no arrow back up: the packages pyproject.toml ships import each other in one direction.

Each module's source is parsed (``ast``), so every import counts wherever it stands: at the top, inside a
function, under ``if TYPE_CHECKING:``, or as ``importlib.import_module`` with a literal name. A circle is any
set of modules that reach each other through imports (two modules importing each other, or a longer loop);
the packages are the ones ``[tool.setuptools.packages.find]`` includes, so a new package is held to the rule.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def shipped_packages(root: Path = ROOT) -> tuple[str, ...]:
    """The top-level packages pyproject.toml ships (its ``packages.find`` include patterns, ``pkg*`` → ``pkg``)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return tuple(sorted({pattern.rstrip("*").rstrip(".") for pattern in include}))


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


def import_graph(packages: tuple[str, ...] | None = None, root: Path = ROOT) -> dict[str, set[str]]:
    """Each module under ``packages`` (default: the shipped ones) and the modules among them it imports."""
    packages = shipped_packages(root) if packages is None else packages
    files = [p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))]
    known = {module_name(p, root) for p in files}
    return {module_name(p, root): imported(p, root, known) for p in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of two or more modules that reach each other through imports (Tarjan's components), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for dep in sorted(graph.get(module, ())):
            if dep not in index:
                visit(dep)
                low[module] = min(low[module], low[dep])
            elif dep in on_stack:
                low[module] = min(low[module], index[dep])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_every_shipped_package_is_checked():
    assert set(shipped_packages()) >= {"dispatcher", "telemetry", "service", "advise", "routescope", "dashboards",
                                       "workloads"}
    graph = import_graph()
    for package in shipped_packages():
        assert package in graph, f"{package} has no __init__.py under {ROOT}"


def test_no_import_circles():
    assert circles(import_graph()) == []


# Arrows that must never exist between the shipped packages: dispatcher and workloads sit at the bottom and
# import none of the others; telemetry observes the dispatcher and knows no consumer; advise is used by the
# service and never uses it (the demo's traffic both share lives in workloads); experiments sits above dispatcher,
# telemetry and advise, and below the service that exposes it.
FORBIDDEN = {
    "dispatcher": {"telemetry", "workloads", "advise", "service", "routescope", "dashboards", "experiments"},
    "workloads": {"dispatcher", "telemetry", "advise", "service", "routescope", "dashboards", "experiments"},
    "telemetry": {"advise", "service", "experiments"},
    "advise": {"service", "experiments"},
    "experiments": {"service", "routescope", "dashboards"},
}


def package_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str, str, str]]:
    """(package, imported package, module, imported module) for every import that crosses packages."""
    return {(m.split(".")[0], d.split(".")[0], m, d) for m, deps in graph.items() for d in deps
            if m.split(".")[0] != d.split(".")[0]}


def test_packages_import_downward_only():
    arrows = package_arrows(import_graph())
    wrong = sorted(f"{module} imports {dep}" for src, dst, module, dep in arrows if dst in FORBIDDEN.get(src, ()))
    assert wrong == [], wrong


def test_the_layering_check_sees_a_lazy_import_back_up(tmp_path):
    """The checker itself: advise reaching into service from inside a function is caught."""
    for pkg in ("advise", "service"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "service" / "app.py").write_text("from advise import report\n")
    (tmp_path / "advise" / "report.py").write_text("def f():\n    from service.demo import runner\n")
    (tmp_path / "service" / "demo.py").write_text("")
    arrows = package_arrows(import_graph(("advise", "service"), tmp_path))
    assert {(s, d) for s, d, _, _ in arrows} == {("service", "advise"), ("advise", "service")}
    wrong = [a for a in arrows if a[1] in FORBIDDEN.get(a[0], ())]
    assert wrong == [("advise", "service", "advise.report", "service.demo")]


def test_every_kind_of_import_is_seen(tmp_path):
    """The checker itself: a circle through a lazy import, a TYPE_CHECKING import, import_module, or three modules."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('.d', __package__)\n")
    (pkg / "d.py").write_text("from pkg.c import x\nfrom .e import y\n")
    (pkg / "e.py").write_text("import os\n")
    (pkg / "f.py").write_text("from . import g\n")
    (pkg / "g.py").write_text("from .h import z\n")
    (pkg / "h.py").write_text("import pkg.f\n")
    graph = import_graph(("pkg",), tmp_path)
    assert graph["pkg.d"] == {"pkg.c", "pkg.e"}
    assert circles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"], ["pkg.f", "pkg.g", "pkg.h"]]


def test_a_package_and_its_submodule_make_a_circle(tmp_path):
    """``pkg/__init__.py`` importing ``.app`` while ``app`` takes a name from ``pkg`` is a circle too."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def __getattr__(name):\n    from .app import create\n")
    (pkg / "app.py").write_text("from . import version\n")
    assert circles(import_graph(("pkg",), tmp_path)) == [["pkg", "pkg.app"]]


@pytest.mark.parametrize(("base", "level", "package", "want"), [
    ("common", 1, "dispatcher.kernels", "dispatcher.kernels.common"),
    ("types", 2, "dispatcher.kernels", "dispatcher.types"),
    ("", 1, "dispatcher.kernels", "dispatcher.kernels"),
    ("torch", 0, "dispatcher.kernels", "torch"),
])
def test_relative_imports_resolve_from_the_importing_package(base, level, package, want):
    assert resolve(base, level, package) == want
