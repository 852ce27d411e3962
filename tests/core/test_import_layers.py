"""The library's imports go one way and hold no circle.

Every `import` and `from ... import` in `lantern_core/` (function-level ones included: a circle broken by a late
import is still a circle) is walked with `ast`, giving a graph of modules. Checked here: no circle anywhere;
`models/` below `decoding/` below `loading/`, `training/`, `benchmarks/` and the command line; inside
`decoding/`, the shared ground and `acceptance/` import no decoder family, the two families (`trees/`,
`jacobi/`) never import each other, and only the modules over both (`modes`, `report`, `reservation`, the two
old-path modules) and the package itself reach into both. The public names stay importable from where callers
import them, and the decoding folders stay small enough to read.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DECODING = ROOT / "lantern_core" / "decoding"
FAMILIES = ("lantern_core.decoding.trees", "lantern_core.decoding.jacobi")
OVER_BOTH = {f"lantern_core.decoding.{name}" for name in ("modes", "report", "reservation", "speculative", "tree")}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports, for every .py file under root / package."""
    files = {module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here[:len(here) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:  # `from pkg import module` names a module; else the name's module
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, "lantern_core")


def test_no_import_circle_in_the_library(graph):
    assert find_circles(graph) == [], "modules that import each other, directly or round a loop"


def test_the_walk_finds_a_planted_circle_even_through_a_late_import(tmp_path):
    """The checker itself fails on a circle: `a` imports `b` at the top, `b` imports `a` inside a function."""
    package = tmp_path / "planted"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .inner import b\n")
    (package / "inner" / "b.py").write_text("def f():\n    from ..a import x\n    return x\n")
    (package / "c.py").write_text("from . import a\n")
    graph = import_graph(tmp_path, "planted")
    assert graph["planted.a"] == {"planted.inner.b"} and graph["planted.inner.b"] == {"planted.a"}
    assert find_circles(graph) == [["planted.a", "planted.inner.b"]]


def test_the_layers_go_one_way(graph):
    """models below decoding below loading / training / benchmarks / the command line."""
    above_decoding = ("lantern_core.loading", "lantern_core.training", "lantern_core.benchmarks", "lantern_core.cli")
    wrong = []
    for module, targets in graph.items():
        for target in targets:
            if module.startswith("lantern_core.models") and target.startswith(("lantern_core.decoding", *above_decoding)):
                wrong.append((module, target))
            if module.startswith("lantern_core.decoding") and target.startswith(above_decoding):
                wrong.append((module, target))
    assert wrong == []


def test_the_two_families_never_import_each_other(graph):
    trees, jacobi = FAMILIES
    wrong = [(m, t) for m, targets in graph.items() for t in targets
             if (m.startswith(trees) and t.startswith(jacobi)) or (m.startswith(jacobi) and t.startswith(trees))]
    assert wrong == []


def test_the_shared_ground_imports_no_family_and_nothing_over_them(graph):
    shared = [m for m in graph if m.startswith("lantern_core.decoding.") and not m.startswith(FAMILIES)
              and m not in OVER_BOTH]
    assert "lantern_core.decoding.sampling" in shared and "lantern_core.decoding.acceptance.siblings" in shared
    wrong = [(m, t) for m in shared for t in graph[m] if t.startswith(FAMILIES) or t in OVER_BOTH]
    assert wrong == []


def test_the_public_names_import_from_where_callers_import_them():
    """`lantern_core.decoding` re-exports the entry points; the older paths (`speculative`, `tree`, `jacobi`,
    `generate`, `lantern_core`) give the same objects."""
    decoding = importlib.import_module("lantern_core.decoding")
    core = importlib.import_module("lantern_core")
    old = {path: importlib.import_module(f"lantern_core.decoding.{path}") for path in ("speculative", "tree", "jacobi")}
    generate_module = importlib.import_module("lantern_core.decoding.generate")
    from lantern_core.config import SamplingConfig
    from lantern_core.decoding.jacobi.config import JacobiConfig
    from lantern_core.decoding.jacobi.driver import jacobi_generate
    from lantern_core.decoding.trees.config import SpeculativeConfig
    from lantern_core.decoding.trees.driver import speculative_generate
    from lantern_core.decoding.trees.specs import TreeSpec

    assert decoding.speculative_generate is old["speculative"].speculative_generate is speculative_generate
    assert decoding.SpeculativeConfig is old["speculative"].SpeculativeConfig is SpeculativeConfig
    assert decoding.jacobi_generate is old["jacobi"].jacobi_generate is jacobi_generate
    assert decoding.JacobiConfig is old["jacobi"].JacobiConfig is JacobiConfig
    assert decoding.TreeSpec is old["tree"].TreeSpec is TreeSpec
    assert decoding.SamplingConfig is core.SamplingConfig is SamplingConfig
    assert generate_module.generate is core.generate and callable(core.generate)
    assert type(decoding.generate).__name__ == "module"  # the module keeps its name: `import ... as` works


def test_every_decoding_folder_reads_at_a_glance():
    """No folder of `decoding/` holds more than 13 files (its `__init__.py` included), no file more than 500 lines."""
    for folder in [DECODING, *(p for p in DECODING.iterdir() if p.is_dir() and (p / "__init__.py").exists())]:
        files = sorted(folder.glob("*.py"))
        assert len(files) <= 13, (folder.name, [f.name for f in files])
        long = [(f.name, n) for f in files if (n := len(f.read_text().splitlines())) > 500]
        assert long == [], folder.name
