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


def _refuse_measuring(monkeypatch):
    from fp16lab import measure

    def called(*a, **k):
        raise AssertionError("measured (or wrote) before checking the output folder")

    for fn in ("step_times_ms", "time_cuda_interleaved", "write_result", "merge_with_previous",
               "summarize"):
        if hasattr(measure, fn):
            monkeypatch.setattr(measure, fn, called)


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_benchmark_refuses_a_bad_output_folder_before_measuring(name, tmp_path,
                                                                      monkeypatch):
    import importlib

    try:
        module = importlib.import_module(f"fp16lab.bench.{name}")
    except ImportError as e:
        pytest.skip(f"fp16lab.bench.{name} does not import here: {e}")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    _refuse_measuring(monkeypatch)
    monkeypatch.setenv("FP16LAB_DATA", str(a_file))  # the data folder is a file
    for argv in ([], ["--replace"]):
        with pytest.raises(NotADirectoryError, match="a_file"):
            module.main(argv)
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    tried = 0
    for flag in ("--out", "--data-dir"):
        try:
            module.main([flag, str(a_file)])
        except NotADirectoryError as e:
            assert "a_file" in str(e) and flag in str(e)
            tried += 1
        except SystemExit:  # the benchmark has no such flag
            pass
    if name in ("distributed", "fp8", "input_pipeline", "profile_step", "alignment", "gemm",
                "gemm_ceiling", "wgmma_cluster"):
        assert tried == 1
