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
