"""No import cycle among pepsi_dispatch's modules (no database).

Every import counts: module-level, function-level and ``TYPE_CHECKING`` ones.
import-linter (``make lint``) checks the layers between packages; this test
also catches a cycle between two modules of one package.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())

#: Known cycles, each being broken elsewhere right now. An entry must still be a
#: cycle: once it is broken the test fails until the entry is removed here.
ALLOWLIST: set[frozenset[str]] = set()


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.glob("pepsi_dispatch/**/*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        if not is_package:
            base.pop()
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for imported in imported_names(name, path.name == "__init__.py", node):
                parts = imported.split(".")
                while parts and ".".join(parts) not in mods:
                    parts.pop()
                target = ".".join(parts)
                # A module importing its own package's __init__ is no edge of the graph.
                if target and target != name and not name.startswith(target + "."):
                    deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pepsi_dispatch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pepsi_dispatch import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (pkg / "c.py").write_text("from pepsi_dispatch.a import f\n")
    assert cycles(import_graph(tmp_path)) == [frozenset({"pepsi_dispatch.a", "pepsi_dispatch.b"})]


def test_no_import_cycles() -> None:
    found = set(cycles(import_graph(ROOT)))
    assert found - ALLOWLIST == set(), "break these cycles: pass collaborators, not owners"
    assert ALLOWLIST - found == set(), "broken now: remove them from ALLOWLIST"
