"""The house's floors, read from the code's own imports: the store (ckptgw/store/) at the
bottom, then the filesystem (fsops/), the drain (drain/), the gateway (gateway/) and the
benches (bench/). Every import points down a floor or stays on its own, and no modules import
one another in a circle, on any floor. Imports anywhere in a module count: inside functions
and under ``TYPE_CHECKING`` too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (folder, its package name, its floor): a module may import only its own floor and below.
FLOORS = [
    (ROOT / "ckptgw" / "store", "ckptgw.store", 0),
    (ROOT / "fsops", "ckptgw.fsops", 1),
    (ROOT / "drain", "ckptgw.drain", 2),
    (ROOT / "gateway", "ckptgw.gateway", 3),
    (ROOT / "bench", "bench", 4),
]


def _imports(path: Path) -> set[str]:
    """Every module name an import in ``path`` names (``from a.b import c``: a.b and a.b.c)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            base = node.module or ""
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def _modules() -> dict[str, tuple[int, set[str]]]:
    """Module name -> (its floor, the names it imports), for every module of the floors."""
    out = {}
    for folder, package, floor in FLOORS:
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = (floor, _imports(path))
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {n for n in names if n in modules and n != m} for m, (_, names) in modules.items()}


def _floor_of(name: str) -> int | None:
    for _, package, floor in FLOORS:
        if name == package or name.startswith(package + "."):
            return floor
    return None


def test_every_import_points_down_or_stays_on_its_floor() -> None:
    up = sorted(
        (module, name)
        for module, (floor, names) in _modules().items()
        for name in names
        if (other := _floor_of(name)) is not None and other > floor
    )
    assert not up, up


def test_the_store_imports_nothing_of_the_project_above_it_nor_the_tests() -> None:
    above = sorted(
        (module, name)
        for module, (floor, names) in _modules().items()
        if floor == 0
        for name in names
        if name.split(".")[0] in ("ckptgw", "tests", "bench")
        and not name.startswith("ckptgw.store")
    )
    assert not above, above


def test_no_modules_import_one_another_in_a_circle() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError(" -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    assert len(graph) >= 80, sorted(graph)  # every floor was read
    for module in sorted(graph):
        visit(module, [])


def test_nothing_imports_the_bench_suite() -> None:
    """bench.suite runs the sections (bench/sections/), which share bench.common: none of
    them, nor anything else, imports the suite back."""
    importers = sorted(m for m, deps in _graph().items() if "bench.suite" in deps)
    assert not importers, importers


def test_the_checker_sees_a_circle_through_an_import_inside_a_function(tmp_path: Path) -> None:
    """The rules above can fail: two modules that import each other, one of them only
    inside a function, are named as a circle."""
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    names = {p.stem: _imports(p) for p in tmp_path.glob("*.py")}
    assert names == {"a": {"b"}, "b": {"a"}}
