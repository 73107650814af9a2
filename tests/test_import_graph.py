"""The package's floor plan, read from its own imports with ``ast``.

Three rules: no import cycle between fp16lab's modules; nothing below ``fp16lab.bench`` imports
it (only the CLI, the top floor, dispatches to the benchmarks); a function-local import of
fp16lab's own modules says on its line why it is local. The checks are tested on planted
graphs, so a check that cannot fail would fail here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fp16lab

PACKAGE = Path(fp16lab.__file__).parent

#: Modules allowed to import the benchmarks: the command line dispatches ``fp16lab bench NAME``.
BENCH_CALLERS = ("fp16lab.cli",)

#: A line that keeps a function-local import of fp16lab's own code says why, with this marker.
LOCAL_MARK = "# local:"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_modules(root: Path) -> dict[str, Path]:
    """Returns every module of the package at ``root``, by dotted name."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # `from pkg import name` may import a module pkg.name or an attribute of pkg: both resolve below
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def import_graph(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """Returns ``(edges, local)``: who imports whom among ``modules``, and each function-local
    import of one of them as ``(module, line, source)``."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in modules}
    local: list[tuple[str, int, str]] = []
    for mod, path in modules.items():
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        is_package = path.name == "__init__.py"
        in_function = {id(n) for f in ast.walk(tree)
                       if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(f)}
        for node in ast.walk(tree):
            # importing a module runs its packages' __init__ too; a module's own ancestors are
            # already being imported when it runs, so they are no edge
            targets = {t for t in {resolve(n) for n in _imported(node, mod, is_package)} - {None, mod}
                       if not mod.startswith(t + ".")}
            if not targets:
                continue
            edges[mod] |= targets
            if id(node) in in_function:
                # the reason may stand on any line of a statement that spans several
                src = " ".join(l.strip() for l in lines[node.lineno - 1:node.end_lineno])
                local.append((mod, node.lineno, src))
    return edges, local


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """Returns one import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def bench_importers(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Returns ``(module, target)`` for each import into ``fp16lab.bench`` from outside it."""
    def in_bench(m: str) -> bool:
        return m == "fp16lab.bench" or m.startswith("fp16lab.bench.")
    return sorted((m, t) for m, ts in edges.items() for t in ts
                  if in_bench(t) and not in_bench(m) and m not in BENCH_CALLERS)


@pytest.fixture(scope="module")
def graph():
    return import_graph(read_modules(PACKAGE))


def test_no_import_cycle(graph):
    edges, _ = graph
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_nothing_below_bench_imports_it(graph):
    edges, _ = graph
    assert bench_importers(edges) == []


def test_every_local_import_says_why(graph):
    _, local = graph
    unexplained = [f"{m}:{line}: {src}" for m, line, src in local if LOCAL_MARK not in src]
    assert unexplained == [], "\n".join(unexplained)


# --- the checks, on planted packages: each must find what was planted --------------------------

def _plant(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    root = tmp_path / "fp16lab"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return read_modules(root)


def test_planted_cycle_is_found(tmp_path):
    mods = _plant(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import f\n",
        "b.py": "from . import c\n",
        "c.py": "import fp16lab.a\n",
        "d.py": "from .a import g\n",
    })
    edges, _ = import_graph(mods)
    assert edges["fp16lab.a"] == {"fp16lab.b"}
    cycle = find_cycle(edges)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert set(cycle) == {"fp16lab.a", "fp16lab.b", "fp16lab.c"}


def test_planted_cycle_through_a_subpackage_is_found(tmp_path):
    mods = _plant(tmp_path, {
        "__init__.py": "",
        "x/__init__.py": "from .y import f\n",
        "x/y.py": "from ..z import g\n",
        "z.py": "from .x.y import f\n",
    })
    edges, _ = import_graph(mods)
    assert find_cycle(edges) is not None


def test_a_package_and_its_submodules_are_no_cycle(tmp_path):
    mods = _plant(tmp_path, {
        "__init__.py": "from .p import q\n",
        "p/__init__.py": "from .q import f\n",
        "p/q.py": "from .r import g\n",
        "p/r.py": "import numpy\n",
    })
    edges, _ = import_graph(mods)
    assert find_cycle(edges) is None


def test_planted_upward_import_into_bench_is_found(tmp_path):
    mods = _plant(tmp_path, {
        "__init__.py": "",
        "cli.py": "from .bench import BENCHMARKS\n",
        "bench/__init__.py": "from . import gemm\n",
        "bench/gemm.py": "from ..sweep import run\n",
        "sweep.py": "def run():\n    from .bench.gemm import x  # local: planted\n",
    })
    edges, local = import_graph(mods)
    assert bench_importers(edges) == [("fp16lab.sweep", "fp16lab.bench.gemm")]
    assert local == [("fp16lab.sweep", 2, "from .bench.gemm import x  # local: planted")]


def test_planted_unexplained_local_import_is_found(tmp_path):
    mods = _plant(tmp_path, {
        "__init__.py": "",
        "a.py": "import numpy\n\ndef f():\n    from . import b\n    import json\n    return b\n",
        "b.py": "",
    })
    _, local = import_graph(mods)
    assert local == [("fp16lab.a", 4, "from . import b")]
