"""bench/ imports without a circle: its sections share bench.common, and nothing imports
bench.suite, which runs them. Imports anywhere in a module count, inside functions and under
TYPE_CHECKING too."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _modules() -> dict[str, set[str]]:
    """bench's modules and, for each, the bench modules it imports."""
    paths = {
        ".".join(p.relative_to(BENCH.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in BENCH.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: a relative import"
                base = node.module or ""
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names)
        graph[module] = {n for n in names if n in paths and n not in (module, "bench")}
    return graph


def test_bench_imports_without_a_circle() -> None:
    graph = _modules()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(" -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    assert "bench.common" in graph and "bench.sections.save" in graph, sorted(graph)
    for module in sorted(graph):
        visit(module, [])


def test_nothing_imports_the_suite() -> None:
    importers = sorted(m for m, deps in _modules().items() if "bench.suite" in deps)
    assert not importers, importers
