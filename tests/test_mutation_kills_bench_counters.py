"""Tests that kill the mutants of fp16lab.bench.counters that tests/test_bench_counters.py lets
live: the claims' words and edges, the merge of meta, the ladder rows' derived columns, and the
top-kernels table's order and rounding."""

from __future__ import annotations

import pytest

from fp16lab import ncu
from fp16lab.bench import counters as bench


def _fig(dram, sm, issue, scope="whole step"):
    return {"dram": dram, "sm": sm, "issue": issue, "tensor": 1.0, "scope": scope}


def test_claims_in_full_words():
    cublas = [{"impl": "cupy.matmul", "issue": 16.3, "tensor": 96.9}]
    figures = {("a", "fp32"): _fig(82, 75, 80), ("a", "amp-fp16"): _fig(95, 51, 20),
               ("b", "fp32"): _fig(8, 74, 79), ("b", "amp-fp16"): _fig(19, 65, 70)}
    issue, picture = bench.claims(figures, cublas)
    assert issue["claim"] == "warp scheduling efficiency under 70% in FP16 training"
    assert issue["holds"] is False  # 70 is not under 70
    assert issue["measured"]["cublas_gemm_issue_pct"] == 16.3
    assert issue["measured"]["cublas_gemm_tensor_pct"] == 96.9
    assert issue["verdict"] == (
        "the figure does not hold: an AMP step keeps issue slots busy 70% or more (figures over "
        "whole step); but cuBLAS's fastest GEMM (timed alone, among notebook 03's GEMM kernels) "
        "issues in 16% of cycles with its tensor pipes 97% busy: a low issue rate is no sign of "
        "waste")
    assert picture["claim"] == ("FP32: DRAM 82%, SM 75%; FP16: DRAM 95%, SM 51% (memory-bound, "
                                "SM half idle)")
    assert picture["verdict"] == (
        "a: FP32 DRAM 82% SM 75%, AMP DRAM 95% SM 51%: memory-bound as claimed; "
        "b: FP32 DRAM 8% SM 74%, AMP DRAM 19% SM 65%: not the claimed picture (DRAM 85%+ with "
        "SM 60% or less) (figures over whole step)")
    figures[("b", "amp-fp16")] = _fig(19, 65, 69.9, scope="kernels")
    issue, _ = bench.claims(figures, [])
    assert issue["verdict"] == ("the figure holds: issue slots are busy under 70% of the cycles "
                                "in every AMP step read (a 20%, b 70%) (figures over kernels / "
                                "whole step)")


def test_merged_meta_takes_the_new_values_and_joins_the_timings(monkeypatch):
    monkeypatch.setattr(bench.device, "metadata", lambda: {"measured_at": "now"})
    old = {"meta": {"measured_at": "then", "ladder_size": 4096, "seconds": {"x": 1, "y": 2},
                    "skipped": {"x, whole step": "old reason", "z, kernels": "kept"}},
           "rows": []}
    new_meta = {"ladder_size": 8192, "seconds": {"x": 5},
                "skipped": {"x, whole step": "new reason"}}
    _, meta = bench._merged(old, [], new_meta)
    assert meta["measured_at"] == "now" and meta["ladder_size"] == 8192
    assert meta["seconds"] == {"x": 5, "y": 2}
    assert meta["skipped"] == {"x, whole step": "new reason", "z, kernels": "kept"}
    _, meta = bench._merged({"meta": {}, "rows": []}, [], {"seconds": {"x": 1}})
    assert meta == {"measured_at": "now", "seconds": {"x": 1}, "skipped": {}}
    _, meta = bench._merged({"meta": {"seconds": {"x": 1}}, "rows": []}, [], {})
    assert meta == {"measured_at": "now", "seconds": {"x": 1}, "skipped": {}}


def test_ladder_rows_derived_columns_by_hand():
    values = {"duration_ns": 2e6, "dram_read": 3e9, "dram_write": 1e9, "dram": 50.0,
              "tensor": 90.0, "sm": 90.0, "issue": 10.0, "issued": 100.0,
              **{f"stall_{r}": 0.0 for r in ncu.STALLS}}
    a = ncu.KernelCounters(0, "a", values={**values, "stall_wait": 4.0, "stall_barrier": 3.0,
                                           "stall_gmma": 2.0, "stall_drain": 1.0})
    b = ncu.KernelCounters(1, "b", values={**values, "stall_wait": 0.5, "stall_barrier": 1.0})
    first, second = bench.ladder_rows([a, b], ["mma_sync", "wgmma"], 1000)
    assert first["dram_bytes"] == 4e9
    assert first["tflops"] == pytest.approx(2e9 / 2e-3 / 1e12)
    assert first["dram_peak_gbs"] == pytest.approx(4e9 / 2e-3 / 0.5 / 1e9)  # 4,000 GB/s
    assert first["why"] == "tensor pipes busy 90% of the time"
    assert first["top_stalls"] == [("wait", 4.0), ("barrier", 3.0), ("gmma", 2.0)]
    assert (second["moved"], second["moved_before"], second["moved_after"]) == ("wait", 400.0,
                                                                              50.0)
    with pytest.raises(RuntimeError, match=r"expected 1 \(a, b\): \['a', 'b'\]"):
        bench.ladder_rows([a, b], ["a, b"], 1000)


def _k(workload, precision, ns, name="k"):
    return {"part": "step", "what": "kernel", "workload": workload, "precision": precision,
            "kernel": name, "duration_ns": ns, "tensor": 1.0, "sm": 2.0, "dram": 3.0,
            "issue": 4.0}


def test_top_kernels_order_names_and_rounding():
    long_name = "n" * 47 + "XY"
    rows = [_k("b", "fp32", 1000.0 * (i + 1), f"k{i}") for i in range(6)]
    rows += [_k("a", "fp32", 2600.0, long_name), _k("a", "amp-fp16", 1000.0),
             _k("a", "amp-fp16", 2000.0)]
    top = bench.top_kernels(rows)
    assert len(top.loc[("b", "fp32")]) == 5  # five by default
    assert list(top.index.get_level_values(0)) == ["a"] * 3 + ["b"] * 5
    assert list(top.index.get_level_values(1)[:3]) == ["amp-fp16", "amp-fp16", "fp32"]
    assert top.index[2][3] == "n" * 47 + "X"  # names cut to 48 characters
    assert list(top.index.get_level_values(2)[:3]) == [1, 0, 0]  # the launch order
    assert set(top["reading"]) == {"latency"}
    assert list(top["us"]) == [2, 1, 3, 6, 5, 4, 3, 2]
    assert list(top["share %"][:2]) == [66.7, 33.3]
    with pytest.raises(ValueError, match="^n must be"):
        bench.top_kernels(rows, n=0)
