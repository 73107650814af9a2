"""fp16lab.bench: the registry, and every benchmark's usage line naming the command that runs it."""

from __future__ import annotations

import sys

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


# That nothing below the benchmarks imports them is tests/test_import_graph.py's check.


def _refuse_measuring(monkeypatch):
    from fp16lab import measure

    def called(*a, **k):
        raise AssertionError("measured (or wrote) before checking the output folder")

    # on the module, and wherever a benchmark imported the name itself
    modules = [measure] + [m for n, m in sorted(sys.modules.items())
                           if n.startswith("fp16lab.bench.") and m is not None]
    for module in modules:
        for fn in ("step_times_ms", "time_cuda_interleaved", "write_result", "merge_with_previous",
                   "summarize"):
            if callable(getattr(module, fn, None)):
                monkeypatch.setattr(module, fn, called)


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_benchmark_refuses_a_bad_output_folder_before_measuring(name, tmp_path,
                                                                      monkeypatch, capsys):
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
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:  # refused as it is parsed
            module.main([flag, str(a_file)])
        err = capsys.readouterr().err
        if f"argument {flag}:" not in err:  # --out taken as short for --out-dtype, say
            continue
        assert e.value.code == 2 and "a_file" in err
        tried += 1
    if name in ("distributed", "fp8", "input_pipeline", "profile_step", "alignment", "gemm",
                "gemm_ceiling", "wgmma_cluster"):
        assert tried == 1
