"""Each benchmark that needs a GPU, run on a CPU: it says so and exits, it does not crash.

A benchmark's GPU path runs only on a GPU host, but its start (arguments, the GPU check, the
names it calls on the way) runs here: this catches a name the benchmark no longer has (a
module shadowed by a function of the same name, a moved helper) before the GPU host does.
"""
from __future__ import annotations

import importlib

import pytest
import torch

#: Benchmarks that measure only on a CUDA GPU, and the argument list of their quickest run.
GPU_ONLY = {
    "alignment": ["--quick"],
    "wave_quantization": ["--quick"],
    "gemm": ["--quick"],
    "gemm_ceiling": ["--quick"],
    "wgmma_cluster": [],
    "wgmma_probe": [],
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the benchmarks would measure")
@pytest.mark.parametrize("name", sorted(GPU_ONLY))
def test_a_gpu_benchmark_on_a_cpu_says_it_needs_a_gpu(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FP16LAB_DATA", str(tmp_path))
    module = importlib.import_module(f"fp16lab.bench.{name}")
    try:
        rc = module.main(GPU_ONLY[name])
    except SystemExit as e:  # a benchmark may end through argparse or sys.exit
        rc = e.code
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc not in (0, None), f"{name} returned {rc!r} without a GPU: {text}"
    assert "GPU" in text or "CUDA" in text, text
    assert list(tmp_path.iterdir()) == [], "nothing is written without a measurement"
