"""The store is the bottom floor (ckptgw/store/): it imports nothing from the filesystem, the
drain, the gateway, the tests or the benches, and its modules import one another without a
circle. Imports anywhere in a module count, inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

STORE = Path(__file__).resolve().parent.parent / "ckptgw" / "store"


def _imports(path: Path) -> set[str]:
    """Every module name an import in ``path`` names (``from a.b import c``: a.b and a.b.c)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: a relative import"
            base = node.module or ""
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def _modules() -> dict[str, set[str]]:
    return {
        f"ckptgw.store.{p.stem}": _imports(p) for p in STORE.glob("*.py") if p.stem != "__init__"
    }


def test_the_store_imports_nothing_above_it() -> None:
    above = {
        (module, name)
        for module, names in _modules().items()
        for name in names
        if name.split(".")[0] in ("ckptgw", "tests", "bench")
        and not name.startswith("ckptgw.store")
    }
    assert not above, sorted(above)


def test_the_stores_modules_import_one_another_without_a_circle() -> None:
    modules = _modules()
    graph = {m: {n for n in names if n in modules and n != m} for m, names in modules.items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(" -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    assert len(graph) >= 10, sorted(graph)  # the floor is where it should be
    for module in sorted(graph):
        visit(module, [])
