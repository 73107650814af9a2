"""fp16lab.bench.counters on the CPU: the ladder's rows from recorded counters, the claims'
verdicts from hand-made figures, and the refusal where ncu cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp16lab import ncu
from fp16lab.bench import counters as bench

#: ncu's output recorded on an H200 (see tests/test_ncu.py)
FIXTURE = Path(__file__).parent / "fixtures" / "ncu_ladder_4096_h200.csv"

LADDER = ["wmma_naive", "wmma_smem", "wmma_padded", "wmma_pipeline", "mma_sync", "wgmma",
          "cupy.matmul"]


def _recorded():
    kernels = ncu.parse_csv(FIXTURE.read_text())
    for i, k in enumerate(kernels):  # the recording lacks the instruction count: give one
        k.values["issued"] = 1e6 * (7 - i)
    return kernels


def test_ladder_rows_add_the_roofline_the_bottleneck_and_what_moved():
    rows = bench.ladder_rows(_recorded(), LADDER, 4096)
    assert [r["impl"] for r in rows] == LADDER
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 0]
    naive = rows[0]
    assert naive["flops"] == 2 * 4096**3
    assert naive["intensity_flop_per_byte"] == pytest.approx(2 * 4096**3 / 491_981_568)
    assert naive["tflops"] == pytest.approx(2 * 4096**3 / 5.012928e-3 / 1e12)
    assert naive["bottleneck"] == "latency" and "moved" not in naive
    assert rows[1]["moved"] == "long_scoreboard"  # shared-memory tiles: fewer global waits
    assert rows[1]["moved_before"] == pytest.approx(44.79 * 7e6)
    assert "moved" not in rows[-1]  # cuBLAS is not a step of the ladder
    assert [r["bottleneck"] for r in rows[4:]] == ["tensor pipes"] * 3
    assert rows[0]["top_stalls"][0] == ("long_scoreboard", 44.79)


def test_ladder_rows_refuse_a_count_that_does_not_match():
    with pytest.raises(RuntimeError, match="profiled 7 kernels, expected 6"):
        bench.ladder_rows(_recorded(), LADDER[:6], 4096)


def _range(dram, sm, issue):
    return {"dram": dram, "sm": sm, "issue": issue}


def test_claims_verdicts_follow_the_figures():
    cublas = [{"impl": "cupy.matmul", "issue": 12.0, "tensor": 95.0}]
    ranges = {("resnet", "fp32"): _range(82, 75, 40), ("resnet", "amp-fp16"): _range(95, 51, 30),
              ("gpt", "fp32"): _range(20, 80, 50), ("gpt", "amp-fp16"): _range(30, 50, 71)}
    issue, picture = bench.claims(ranges, cublas)
    assert issue["holds"] is False  # gpt's AMP step issues in 71% of cycles
    assert issue["measured"]["issue_slots_busy_pct"] == {"resnet": 30, "gpt": 71}
    assert "does not hold" in issue["verdict"] and "12%" in issue["verdict"]
    assert picture["holds_per_model"] == {"resnet": True, "gpt": False}
    assert picture["holds"] is True
    assert picture["measured"]["resnet"]["amp-fp16"] == {"dram": 95, "sm": 51}
    ranges[("gpt", "amp-fp16")] = _range(85, 60, 69.9)  # the edges count as the claim
    issue, picture = bench.claims(ranges, cublas)
    assert issue["holds"] is True and picture["holds_per_model"]["gpt"] is True
    ranges[("gpt", "amp-fp16")] = _range(84.9, 60, 10)
    ranges[("resnet", "amp-fp16")] = _range(95, 60.1, 10)
    assert bench.claims(ranges, cublas)[1]["holds"] is False


def test_claims_need_their_figures():
    assert bench.claims({}, []) == []
    only_amp = bench.claims({("m", "amp-fp16"): _range(1, 2, 3)}, [])
    assert len(only_amp) == 1 and "cuBLAS" not in only_amp[0]["verdict"]


def test_main_says_why_it_cannot_read_counters(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(ncu, "unavailable", lambda: "no ncu here")
    assert bench.main(["--out", str(tmp_path)]) == 2
    assert "needs Nsight Compute and a GPU: no ncu here" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _kernel_row(workload, precision, duration, **pct):
    return {"part": "step", "what": "kernel", "workload": workload, "precision": precision,
            "kernel": "k", "duration_ns": duration, **pct}


def test_step_figures_prefer_the_whole_step_and_else_weigh_the_kernels():
    pct = {"tensor": 10.0, "sm": 20.0, "dram": 30.0, "issue": 40.0}
    rows = [{"part": "step", "what": "range", "workload": "w", "precision": "fp32", **pct},
            _kernel_row("w", "fp32", 5, tensor=99, sm=99, dram=99, issue=99),
            _kernel_row("w", "amp-fp16", 3, tensor=80, sm=60, dram=20, issue=10),
            _kernel_row("w", "amp-fp16", 1, tensor=0, sm=20, dram=60, issue=30)]
    got = bench.step_figures(rows)
    assert got[("w", "fp32")] == {**pct, "scope": "whole step"}
    amp = got[("w", "amp-fp16")]
    assert (amp["tensor"], amp["sm"], amp["dram"], amp["issue"]) == (60, 50, 30, 15)
    assert amp["scope"] == "the step's first 2 matrix kernels, duration-weighted"
    issue, picture = bench.claims(got, [])
    assert issue["measured"]["scope"] == {"w": amp["scope"]}
    assert issue["verdict"].endswith(f"(figures over {amp['scope']})")
    assert picture["verdict"].endswith(f"(figures over {amp['scope']})")
    assert picture["measured"]["w"]["scope"] == amp["scope"]


def test_merge_keeps_what_was_not_measured_again(tmp_path):
    from fp16lab import measure

    old = [{"part": "ladder", "impl": "wgmma"},
           _kernel_row("w", "fp32", 1, sm=1.0), _kernel_row("w", "amp-fp16", 1, sm=2.0)]
    measure.write_result("c", old, meta={"seconds": {"w fp32": 5, "w amp-fp16": 6},
                                         "skipped": {"w fp32, whole step": "refused"}},
                         data_dir=tmp_path)
    new = [{"part": "step", "what": "range", "workload": "w", "precision": "fp32", "sm": 3.0},
           _kernel_row("w", "fp32", 2, sm=4.0)]
    rows, meta = bench._merged(tmp_path / "c.json", new, {"seconds": {"w fp32": 9},
                                                           "skipped": {}})
    assert [(r["part"], r.get("what"), r.get("precision"), r.get("sm")) for r in rows] == [
        ("ladder", None, None, None), ("step", "kernel", "amp-fp16", 2.0),
        ("step", "range", "fp32", 3.0), ("step", "kernel", "fp32", 4.0)]
    assert rows[0]["measured_at"] and "measured_at" not in rows[-1]
    assert meta["seconds"] == {"w fp32": 9, "w amp-fp16": 6}
    assert meta["skipped"] == {}  # w fp32 was read again: its old refusal is gone
    assert bench._merged(tmp_path / "none.json", new, {}) == (new, {})


def test_claims_only_recomputes_claims_from_the_rows_and_keeps_the_provenance(tmp_path):
    from fp16lab import measure

    rows = [{"part": "ladder", "impl": "cupy.matmul", "issue": 16.0, "tensor": 97.0},
            _kernel_row("w", "fp32", 1, tensor=0, sm=75, dram=82, issue=80),
            _kernel_row("w", "amp-fp16", 1, tensor=50, sm=51, dram=95, issue=20)]
    path = measure.write_result("c", rows, meta={"gpu_name": "NVIDIA H200", "claims": []},
                                data_dir=tmp_path)
    before = measure.read_result(path)["meta"]
    assert bench.main(["--claims-only", "--name", "c", "--out", str(tmp_path)]) == 0
    after = measure.read_result(path)
    assert after["rows"] == rows
    assert {k: v for k, v in after["meta"].items() if k != "claims"} == {
        k: v for k, v in before.items() if k != "claims"}
    issue, picture = after["meta"]["claims"]
    assert issue["holds"] and picture["holds"] and "12" not in issue["verdict"]
    assert "16%" in issue["verdict"]
    assert bench.main(["--claims-only", "--out", str(tmp_path)]) == 2  # which file?


def test_top_kernels_are_each_steps_longest_with_their_share():
    rows = [_kernel_row("w", "fp32", d, tensor=t, sm=1.0, dram=2.0, issue=3.0)
            for d, t in ((1000, 1.0), (3000, 3.0), (2000, 2.0), (4000, 4.0))]
    rows += [_kernel_row("v", "amp-fp16", 500, tensor=9.0, sm=1.0, dram=2.0, issue=3.0)]
    top = bench.top_kernels(rows, n=2)
    assert list(top.loc[("w", "fp32")]["tensor"]) == [4.0, 3.0]
    assert list(top.loc[("w", "fp32")]["share %"]) == [40.0, 30.0]  # of 10,000 ns
    assert list(top.loc[("w", "fp32")]["us"]) == [4.0, 3.0]
    assert list(top.loc[("v", "amp-fp16")]["share %"]) == [100.0]
    assert bench.top_kernels([]).empty
