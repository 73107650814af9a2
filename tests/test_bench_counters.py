"""fp16lab.bench.counters on the CPU: the ladder's rows from recorded counters, the claims'
verdicts from hand-made figures, and the refusal where ncu cannot run."""

from __future__ import annotations

import json
import os
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


def _range(dram, sm, issue, scope="whole step"):
    return {"dram": dram, "sm": sm, "issue": issue, "scope": scope}


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
    # over some kernels only, a step that is not memory-bound is not settled: the kernels left
    # out could only add to its DRAM share; one that is memory-bound already shows it
    ranges[("gpt", "amp-fp16")] = _range(30, 50, 10, scope="kernels")
    picture = bench.claims(ranges, cublas)[1]
    assert picture["holds_per_model"] == {"resnet": False, "gpt": None}
    assert picture["holds"] is False and "gpt: FP32 DRAM 20% SM 80%, AMP DRAM 30% SM 50%: these " \
        "kernels are not memory-bound, but the step's other kernels were not read: not settled" \
        in picture["verdict"]
    ranges[("resnet", "amp-fp16")] = _range(95, 50, 10, scope="kernels")
    assert bench.claims(ranges, cublas)[1]["holds_per_model"] == {"resnet": True, "gpt": None}
    del ranges[("resnet", "amp-fp16")]
    assert bench.claims(ranges, cublas)[1]["holds"] is None


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
    # a range not set against the step's own time: its figures, said to be diluted
    assert got[("w", "fp32")] == {**pct, "scope": "whole step as ncu's range (the profiler's "
                                                   "gaps dilute SM and DRAM)"}
    # set against it: SM and DRAM as shares of the step's time, tensor and issue as read
    rows[0].update(step_ms=5.0, sm_step=45.0, dram_step=55.0)
    got = bench.step_figures(rows)
    assert got[("w", "fp32")] == {"tensor": 10.0, "sm": 45.0, "dram": 55.0, "issue": 40.0,
                                  "scope": "whole step"}
    amp = got[("w", "amp-fp16")]
    assert (amp["tensor"], amp["sm"], amp["dram"], amp["issue"]) == (60, 50, 30, 15)
    assert amp["scope"] == "the step's first 2 matrix kernels, duration-weighted"
    issue, picture = bench.claims(got, [])
    assert issue["measured"]["scope"] == {"w": amp["scope"]}
    assert f"(figures over {amp['scope']})" in issue["verdict"]
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
    old = bench._previous(tmp_path / "c.json")
    rows, meta = bench._merged(old, new, {"seconds": {"w fp32": 9}, "skipped": {}})
    assert [(r["part"], r.get("what"), r.get("precision"), r.get("sm")) for r in rows] == [
        ("ladder", None, None, None), ("step", "kernel", "amp-fp16", 2.0),
        ("step", "range", "fp32", 3.0), ("step", "kernel", "fp32", 4.0)]
    assert rows[0]["measured_at"] and "measured_at" not in rows[-1]
    assert meta["seconds"] == {"w fp32": 9, "w amp-fp16": 6}
    assert meta["skipped"] == {}  # w fp32 was read again: its old refusal is gone
    assert bench._previous(tmp_path / "none.json") is None
    assert bench._merged(None, new, {}) == (new, {})
    # the file says when this run measured (its rows carry no time): not the old file's time
    measure_time = old["meta"]["measured_at"]
    old["meta"]["measured_at"] = "2000-01-01T00:00:00+00:00"
    rows, meta = bench._merged(old, new, {"seconds": {}, "skipped": {}})
    assert rows[0]["measured_at"] == "2000-01-01T00:00:00+00:00"
    assert meta["measured_at"] >= measure_time


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


def test_range_check_sets_the_range_against_the_step_timed_without_ncu(tmp_path):
    # a 30 ms range over steps whose median is 24.5 ms: SM and DRAM are shares of more time
    whole = ncu.KernelCounters(0, "range", values={"duration_ns": 30e6, "sm": 49.0,
                                                    "dram": 24.5, "tensor": 7.0})
    check = bench.range_check(whole, [20.0, 25.0, 50.0, 24.0])
    assert check == {"step_ms": 24.5, "timed_steps": 4,
                     "range_over_step": pytest.approx(30 / 24.5),
                     "sm_step": pytest.approx(60.0), "dram_step": pytest.approx(30.0)}
    assert bench.range_check(whole, []) == {}
    times = tmp_path / "t"
    assert bench._read_times(str(times)) == []  # the program wrote nothing
    times.write_text("12.5\n\n7\n")
    assert bench._read_times(str(times)) == [12.5, 7.0]


def _stub_gpu(monkeypatch, calls, refuse=()):
    """main() with ncu stubbed: the recorded ladder, a range and two kernels per step, each
    call recorded; ``refuse`` lists (workload, replay) pairs whose ncu run fails."""
    import torch

    monkeypatch.setattr(ncu, "unavailable", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(bench, "runnable", lambda: LADDER[:6])

    def profile(argv, metrics=tuple(ncu.METRICS), *, replay="kernel", **kw):
        calls.append({"argv": list(argv), "metrics": list(metrics), "replay": replay, **kw})
        if argv[4] == "ladder":  # python -m fp16lab.bench.counters --child ladder N
            return _recorded()
        workload, precision = argv[5], argv[6]
        if (workload, replay) in refuse:
            raise ncu.NcuUnavailable(f"refused {workload} {replay}")
        amp = precision == "amp-fp16"
        if replay != "kernel":
            return [ncu.KernelCounters(0, "range", values={
                "duration_ns": 2e6, "tensor": 50.0 if amp else 0.0, "sm": 51.0 if amp else 75.0,
                "dram": 95.0 if amp else 82.0, "issue": 20.0 if amp else 80.0})]
        return [ncu.KernelCounters(i, f"gemm{i}", "(1, 1, 1)", "(2, 1, 1)", values={
            "duration_ns": 1000.0 * (i + 1), "tensor": 90.0, "sm": 80.0, "dram": 10.0,
            "issue": 15.0}) for i in range(2)]

    monkeypatch.setattr(ncu, "profile", profile)

    def time_steps(child, n, timeout):
        calls.append({"argv": list(child), "timed": n, "timeout": timeout})
        if (child[5], "timing") in refuse:
            raise ncu.NcuUnavailable(f"the step's timing run failed (1): {child[5]}")
        return [2.0, 2.5, 1.8] if child[6] == "amp-fp16" else [4.0]

    monkeypatch.setattr(bench, "_time_steps", time_steps)


def test_main_writes_the_ladder_the_steps_and_the_claims(monkeypatch, tmp_path, capsys):
    calls = []
    _stub_gpu(monkeypatch, calls, refuse={("gpt2-small", "app-range")})
    assert bench.main(["--out", str(tmp_path), "--size", "4096", "--launch-count", "7",
                       "--timeout", "9"]) == 0
    result = json.loads((tmp_path / "counters_h200.json").read_text())
    rows, meta = result["rows"], result["meta"]
    ladder = [r for r in rows if r["part"] == "ladder"]
    assert [r["impl"] for r in ladder] == LADDER and ladder[0]["size"] == 4096
    assert calls[0]["argv"][-2:] == ["ladder", "4096"] and calls[0]["timeout"] == 9
    steps = [(r["workload"], r["precision"], r["what"]) for r in rows if r["part"] == "step"]
    assert steps == [("torchvision-resnet50", "fp32", "range"),
                     ("torchvision-resnet50", "fp32", "kernel"),
                     ("torchvision-resnet50", "fp32", "kernel"),
                     ("torchvision-resnet50", "amp-fp16", "range"),
                     ("torchvision-resnet50", "amp-fp16", "kernel"),
                     ("torchvision-resnet50", "amp-fp16", "kernel"),
                     ("gpt2-small", "fp32", "kernel"), ("gpt2-small", "fp32", "kernel"),
                     ("gpt2-small", "amp-fp16", "kernel"), ("gpt2-small", "amp-fp16", "kernel")]
    ranged = next(r for r in rows if r.get("what") == "range")
    assert ranged["replay"] == "app-range" and ranged["batch"] == 64 and ranged["sm"] == 75.0
    kernel = next(r for r in rows if r.get("what") == "kernel")
    assert (kernel["kernel"], kernel["block"], kernel["grid"]) == ("gemm0", "(1, 1, 1)",
                                                                  "(2, 1, 1)")
    step_calls = [c for c in calls if c["argv"][4] == "step" and "timed" not in c]
    assert step_calls[0]["argv"][-4:] == ["step", "torchvision-resnet50", "fp32", "64"]
    # each range read is set against its step timed without ncu, after the read
    timings = [c for c in calls if "timed" in c]
    assert [(c["argv"][5:8], c["timed"], c["timeout"]) for c in timings] == [
        (["torchvision-resnet50", "fp32", "64"], bench.TIMED_STEPS, 9),
        (["torchvision-resnet50", "amp-fp16", "64"], bench.TIMED_STEPS, 9)]
    assert calls.index(timings[0]) == calls.index(step_calls[0]) + 1
    # fp32: the 2 ms range over a 4 ms step: SM 75% and DRAM 82% of the range are half that
    assert (ranged["step_ms"], ranged["timed_steps"]) == (4.0, 1)
    assert ranged["range_over_step"] == 0.5
    assert (ranged["sm_step"], ranged["dram_step"]) == (37.5, 41.0)
    assert step_calls[0]["replay"] == "app-range" and step_calls[0]["timeout"] == 9
    assert step_calls[1]["kernel_regex"] == bench.MATRIX_KERNELS
    assert step_calls[1]["launch_count"] == 7
    assert all(c["metrics"] == list(ncu.STEP_METRICS) for c in step_calls)
    assert meta["skipped"] == {"gpt2-small fp32, whole step": "refused gpt2-small app-range",
                               "gpt2-small amp-fp16, whole step": "refused gpt2-small app-range"}
    assert set(meta["seconds"]) == {"ladder", "torchvision-resnet50 fp32",
                                    "torchvision-resnet50 amp-fp16", "gpt2-small fp32",
                                    "gpt2-small amp-fp16"}
    assert meta["ladder_size"] == 4096 and meta["source"] == bench.SOURCE
    assert meta["metrics"]["tensor"] == ncu.METRICS["tensor"][0]
    picture = meta["claims"][1]
    assert picture["holds_per_model"] == {"torchvision-resnet50": True, "gpt2-small": None}
    assert picture["measured"]["torchvision-resnet50"]["scope"] == "whole step"
    out = capsys.readouterr().out
    assert "ladder at 4096^3 profiled in" in out and "moved: long_scoreboard" in out
    assert ("torchvision-resnet50 amp-fp16: range 2.0 ms, the step without ncu 2.0 ms (median "
            "of 3); over the step: SM 51%  DRAM 95%; tensor 50%  issue 20%  DRAM read nan GB, "
            "written nan GB") in out
    assert "gpt2-small fp32: whole step not read: refused gpt2-small app-range" in out
    assert "gpt2-small amp-fp16: 2 matrix kernels;" in out
    assert f"wrote {tmp_path / 'counters_h200.json'}" in out


def test_main_reads_only_the_parts_asked_for(monkeypatch, tmp_path):
    calls = []
    _stub_gpu(monkeypatch, calls)
    assert bench.main(["--out", str(tmp_path), "--parts", "step", "--workloads", "gpt2-small",
                       "--whole-step", "none", "--launch-count", "0"]) == 0
    assert calls == []  # no ladder, no range, no kernels: nothing to read
    assert bench.main(["--out", str(tmp_path), "--parts", "step", "--workloads", "gpt2-small",
                       "--whole-step", "range", "--launch-count", "0", "--merge"]) == 0
    reads = [c for c in calls if "timed" not in c]
    assert [(c["argv"][5], c["replay"]) for c in reads] == [("gpt2-small", "range")] * 2
    assert len(calls) == 4  # each read, then its step timed
    rows = json.loads((tmp_path / "counters_h200.json").read_text())["rows"]
    assert [(r["precision"], r["what"], r["replay"]) for r in rows] == [
        ("fp32", "range", "range"), ("amp-fp16", "range", "range")]
    assert bench.main(["--out", str(tmp_path), "--parts", "ladder", "--merge",
                       "--name", "counters_h200"]) == 0
    rows = json.loads((tmp_path / "counters_h200.json").read_text())["rows"]
    assert [r["part"] for r in rows] == ["step", "step"] + ["ladder"] * 7  # the steps kept


def test_precisions_narrow_the_steps_and_retime_sets_old_ranges_against_new_times(
        monkeypatch, tmp_path, capsys):
    calls = []
    _stub_gpu(monkeypatch, calls, refuse={("gpt2-small", "timing")})
    assert bench.main(["--out", str(tmp_path), "--parts", "step", "--precisions", "amp-fp16",
                       "--launch-count", "0"]) == 0
    rows = json.loads((tmp_path / "counters_h200.json").read_text())["rows"]
    assert [(r["workload"], r["precision"]) for r in rows] == [
        ("torchvision-resnet50", "amp-fp16"), ("gpt2-small", "amp-fp16")]
    assert "step_ms" in rows[0] and "step_ms" not in rows[1]  # gpt2's timing run failed
    meta = json.loads((tmp_path / "counters_h200.json").read_text())["meta"]
    assert meta["skipped"] == {"gpt2-small amp-fp16, step timing":
                               "the step's timing run failed (1): gpt2-small"}
    assert "gpt2-small amp-fp16: the step not timed without ncu" in capsys.readouterr().out
    # --retime reads no counters: it times the file's range steps again, without ncu
    calls.clear()
    for r in rows:
        r.update(step_ms=99.0, sm_step=1.0, dram_step=1.0, sm=40.0, dram=30.0)
    from fp16lab import measure
    measure.write_result("c", rows, meta={**meta, "gpu_name": "NVIDIA H200"}, data_dir=tmp_path)
    monkeypatch.setattr(bench, "_time_steps", lambda child, n, timeout: (
        calls.append((child[5:8], n, timeout)) or [1.0, 4.0, 5.0]))
    assert bench.main(["--retime", "--name", "c", "--out", str(tmp_path), "--timeout", "7"]) == 0
    assert calls == [(["torchvision-resnet50", "amp-fp16", "64"], bench.TIMED_STEPS, 7),
                     (["gpt2-small", "amp-fp16", "8"], bench.TIMED_STEPS, 7)]
    result = measure.read_result(tmp_path / "c.json")
    # the 2 ms ranges over the 4 ms median: their SM 40% and DRAM 30% halve
    for r in result["rows"]:
        assert (r["step_ms"], r["timed_steps"], r["sm_step"], r["dram_step"]) == (4.0, 3, 20.0,
                                                                                  15.0)
    assert result["meta"]["gpu_name"] == "NVIDIA H200"
    assert "read_from" not in json.loads((tmp_path / "c.json").read_text())["meta"]
    (issue,) = result["meta"]["claims"]  # AMP steps only: the first claim alone
    assert issue["measured"]["scope"] == {"torchvision-resnet50": "whole step",
                                          "gpt2-small": "whole step"}
    assert "gpt2-small amp-fp16: range 2.0 ms, the step without ncu 4.0 ms" in \
        capsys.readouterr().out
    assert bench.main(["--retime", "--out", str(tmp_path)]) == 2  # which file?
