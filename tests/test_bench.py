"""fp16lab.bench: the registry, and every benchmark's usage line naming the command that runs it."""

from __future__ import annotations

import pytest

from fp16lab.bench import BENCHMARKS, argument_parser
from fp16lab.cli import main


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_bench_help_names_the_benchmark(name, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", name, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: fp16lab bench {name} ")


def test_argument_parser_refuses_an_unknown_benchmark():
    with pytest.raises(ValueError, match="no benchmark 'gemmm'"):
        argument_parser("gemmm", "")


def test_nothing_below_the_benchmarks_imports_them():
    # fp16lab.bench is the top floor but for the CLI that dispatches `fp16lab bench NAME`:
    # every import of it (module level or in a function) outside fp16lab/bench/ and cli.py fails
    import ast
    from pathlib import Path

    import fp16lab

    root = Path(fp16lab.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("bench", "measured") or rel == Path("cli.py"):
            continue
        package = ["fp16lab", *rel.parent.parts]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                names = [f"{module}.{a.name}" for a in node.names] + [module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n == "fp16lab.bench" or n.startswith("fp16lab.bench.") for n in names):
                found.append(f"{rel}:{node.lineno}")
    assert found == []
