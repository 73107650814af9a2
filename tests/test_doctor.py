"""The doctor: each check against a planted case (and a clean one), the numbers under it
against hand computations, the report's files, the command line's bad input.

Oracles: a planted workload whose problem is known by construction (fp16lab.doctor.planted),
a clean one of the same shape that must not raise the finding, and for the numbers, FP16's
thresholds written out and torch's own float16 cast.
"""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch
from torch import nn

from fp16lab import cli
from fp16lab.doctor import Config, doctor
from fp16lab.doctor import visit as V
from fp16lab.doctor.numerics import (fitting_scale, module_numerics, reached_scale,
                                     underflow_share, _exp_hist)
from fp16lab.doctor.planted import PLANTED
from fp16lab.doctor.probe import LOSS_TOLERANCE, Probe, fused_optimizer, optimizer_is_fused
from fp16lab.doctor.report import Finding, rank
from fp16lab.workload import Workload, load_workload
from fp16lab.workloads.batches import synthetic_batch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def planted(name: str, **kw):
    return load_workload(PLANTED[name].reference, tiny=True, **kw)


def run(name: str, checks=None, device="cpu", **kw):
    p = PLANTED[name]
    return doctor(planted(name), device, batch_size=p.tiny_batch_size,
                  precision=p.precision_on(device),
                  layout=p.layout, checks=checks, progress=False, loss_steps=10, timed_steps=3,
                  **kw)


def clean(width: int = 32) -> Workload:
    return Workload(name="clean-mlp", build=lambda: nn.Sequential(
        nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 16)),
        batch=synthetic_batch((64,), 16))


# ----------------------------------------------------------------------------- the numbers

def test_underflow_share_matches_torch_float16_cast():
    g = torch.Generator().manual_seed(0)
    x = torch.exp2(torch.empty(20000).uniform_(-60, -5, generator=g)) * \
        torch.where(torch.rand(20000, generator=g) < .5, -1.0, 1.0)
    for k in (0, 8, 16, 24):
        scale = 2.0**k
        flushed = float(((x * scale).to(torch.float16) == 0).float().mean())
        # values in (2^-25, 2^-24) round up to the smallest subnormal; only <= 2^-25 flush
        assert underflow_share(_exp_hist(x), scale) == pytest.approx(flushed, abs=2e-4)


def test_reached_and_fitting_scale_by_hand():
    assert reached_scale(1.0) == 2.0**15  # 65536 * 1 > 65504: one halving
    assert reached_scale(0.5) == 2.0**16
    assert reached_scale(3.0) == 2.0**14
    assert reached_scale(0.0) == 2.0**16
    assert fitting_scale(1.0) == 2.0**14  # 2^14 <= 32752 < 2^15
    assert fitting_scale(2.0**-40) == 2.0**54
    assert fitting_scale(math.inf) == 2.0**16


def test_module_numerics_sees_overflow_underflow_and_a_sensitive_module():
    n = {m.name: m for m in module_numerics(planted("overflow"), "cpu", 16)}
    assert n["0"].act_max > 65520 and n["0"].act_overflow > 0.3
    assert n["3"].act_overflow == 0
    s = {m.name: m for m in module_numerics(planted("fp32-layer"), "cpu", 16)}
    assert s["1"].act_overflow == 0
    assert s["1"].local_error > 0.5  # (x*x) overflows FP16: the output is zero, not x/rms
    assert s["0"].local_error < 1e-2 and s["3"].local_error < 1e-2
    u = module_numerics(planted("underflow"), "cpu", 16)
    gmax = max(m.grad_max for m in u)
    assert 0 < gmax < 2.0**-30


def _residual_bn() -> Workload:
    """Conv -> BatchNorm -> ReLU(inplace) with a residual +=, as torchvision's ResNets do: the
    ops after each BatchNorm change its output tensor in place."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
            self.relu, self.head = nn.ReLU(inplace=True), nn.Linear(4 * 8 * 8, 10)

        def forward(self, x):
            out = self.bn(self.conv(x))
            out += x
            return self.head(self.relu(out).flatten(1))
    return Workload(name="residual-bn", build=Block, batch=synthetic_batch((4, 8, 8), 10))


def test_local_error_is_taken_before_in_place_ops_change_the_output():
    """A BatchNorm whose output a residual += and an in-place ReLU then change: its own error
    under autocast is bf16's rounding (2^-9 relative per element), not the 100% the changed
    tensor gives; and the sensitive check flags nothing."""
    n = {m.name: m for m in module_numerics(_residual_bn(), "cpu", 8, low="amp-bf16")}
    assert 0 < n["bn"].local_error < 2.0**-6, n["bn"]
    assert doctor(_residual_bn(), "cpu", batch_size=8, precision="amp-bf16",
                  checks=["sensitive"], progress=False, loss_steps=4,
                  timed_steps=2).findings == []


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_dropouts_error_is_its_rounding_not_its_mask(device):
    """Dropout(0.5) is compared in eval mode, where it draws no mask: its local error is the
    cast's rounding, not half its elements (on a GPU the same random state draws a different
    mask for a bf16 input than for an fp32 one)."""
    w = Workload(name="dropout", build=lambda: nn.Sequential(
        nn.Linear(64, 64), nn.Dropout(0.5), nn.Linear(64, 64), nn.Dropout(0.5),
        nn.Linear(64, 16)), batch=synthetic_batch((64,), 16))
    n = {m.name: m for m in module_numerics(w, device, 16, low="amp-bf16")}
    assert n["1"].local_error < 2.0**-6 and n["3"].local_error < 2.0**-6, (n["1"], n["3"])


def test_the_numeric_checks_take_an_autocast_precision_from_an_fp32_start():
    """Started in fp32 (or tf32, fp16-o2), the range and sensitive checks compare fp32 with
    amp-fp16, never fp32 with itself; started under autocast, with the start's."""
    def low(precision):
        return V.Visit.low_precision(type("S", (), {"start": Config(precision)})())
    assert [low(p) for p in ("fp32", "tf32", "fp16-o2", "amp-bf16", "amp-fp16")] == \
        ["amp-fp16", "amp-fp16", "amp-fp16", "amp-bf16", "amp-fp16"]


# ----------------------------------------------------------------------------- each check

@pytest.mark.parametrize("name", [n for n, p in PLANTED.items() if p.shows_on_cpu])
def test_first_finding_is_the_planted_problem_on_the_cpu(name):
    report = run(name)
    assert report.first is not None, report.to_markdown()
    assert report.first.kind == PLANTED[name].expected, report.to_markdown()


def test_range_check_overflow_recommends_bf16_and_clean_model_has_none():
    r = run("overflow", checks=["range"])
    (f,) = r.findings
    assert f.kind == "range" and f.group == "breaks" and f.change == {"precision": "amp-bf16"}
    assert "'0' (Linear)" in f.title
    assert doctor(clean(), "cpu", batch_size=16, precision="amp-fp16", checks=["range"],
                  progress=False, loss_steps=5, timed_steps=2).findings == []


def test_range_check_underflow_fits_a_scale_that_trains_like_fp32():
    r = run("underflow", checks=["range"])
    (f,) = r.findings
    assert f.group == "breaks" and f.verified
    scale = f.change["init_scale"]
    assert scale >= 2.0**50 and f.evidence["share flushed at the fitting scale"] < 0.01
    assert f.evidence["share flushed to zero there"] > 0.9


def test_sensitive_check_islands_the_module_and_fixes_the_loss():
    r = run("fp32-layer", checks=["sensitive"])
    (f,) = r.findings
    assert f.change == {"fp32_modules": ["1"]} and f.verified
    assert f.evidence["with the FP32 island"] is True


def test_a_planted_workload_says_which_precision_it_starts_from_on_each_device():
    slow = PLANTED["slow-input"]
    assert (slow.precision_on("cpu"), slow.precision_on("cuda")) == ("fp32", "amp-bf16")
    assert PLANTED["overflow"].precision_on("cpu") == "amp-fp16"
    with pytest.raises(ValueError, match="device"):
        slow.precision_on("tpu")


def test_input_check_finds_the_slow_pipeline_only_where_it_is_slow():
    r = run("slow-input", checks=["input"])
    assert [f.kind for f in r.findings] == ["input"]
    fast = doctor(planted("slow-input", passes=0), "cpu", batch_size=16, precision="fp32",
                  checks=["input"], progress=False, loss_steps=5, timed_steps=2)
    assert fast.findings == []


def test_shapes_check_lists_odd_linear_layers_and_remeasures_the_setting(monkeypatch):
    monkeypatch.setattr(V, "NOISE", -1.0)  # report any measured gain: the detector is tested
    r = run("odd-dimension", checks=["shapes"])
    (f,) = r.findings
    assert f.table[0]["module"] == "0" and f.table[0]["padded"].endswith("x40")
    assert f.change == {"settings": {"hidden": 40}} and f.verified
    assert doctor(clean(), "cpu", batch_size=16, checks=["shapes"], progress=False,
                  loss_steps=5, timed_steps=2).findings == []


def test_layout_check_needs_a_convolution():
    r = doctor(clean(), "cpu", batch_size=8, checks=["layout"], progress=False, loss_steps=5,
               timed_steps=2)
    assert "no convolution" in r.unchecked["layout"]


def test_batch_check_measures_larger_batches(monkeypatch):
    monkeypatch.setattr(V, "BATCH_GAIN", -1.0)
    r = run("small-batch", checks=["batch"])
    (f,) = r.findings
    assert f.group == "changes" and f.change["batch_size"] in (4, 8)
    assert [row["batch"] for row in f.table] == [4, 8]
    # the largest GEMM's waves, by hand: the tiny planted MLP's 128x128 layers, one row per
    # sample, 256x128 tiles on an H200's 132 SMs (no GPU here): one tile, one wave, at every batch
    assert [(row["waves"], row["wave_efficiency"]) for row in f.table] == [
        (1, pytest.approx(b * 128 / (132 * 256 * 128))) for b in (4, 8)]
    (key,) = [k for k in f.evidence if k.startswith("largest GEMM")]
    assert key == "largest GEMM, '0' (rows x 128 x 128)"
    assert f.evidence[key] == ("1 tile(s) of 256x128 in 1 wave(s) on 132 SMs of an H200 (no GPU "
                               "here): 0.0059% of the SM-tile slots hold output")


def test_largest_gemm_waves_count_tiles_and_waves_by_hand():
    from types import SimpleNamespace

    from fp16lab.doctor.speed import largest_gemm_waves

    probe = SimpleNamespace(workload=planted("small-batch"), batch_size=8, device="cpu")
    # 5,000 rows a sample (as a sequence of tokens would give) on the 128-wide layers
    visit = SimpleNamespace(probe=probe, cuda=False, notes={"linear_rows": {"0": 40_000}})
    got = largest_gemm_waves(visit, [8, 16])
    assert (got["module"], got["sms"]) == ("0", 132)
    # 40,000 rows: ceil(40000/256) = 157 tiles of 256x128 > 132 SMs: 2 waves, 40000*128 useful
    # elements of 2*132*256*128 slots; 80,000 rows: 313 tiles, 3 waves
    assert [(r["rows"], r["tiles"], r["waves"]) for r in got["per_batch"]] == [
        (40_000, 157, 2), (80_000, 313, 3)]
    assert [r["wave_efficiency"] for r in got["per_batch"]] == [
        pytest.approx(40_000 / (2 * 132 * 256)), pytest.approx(80_000 / (3 * 132 * 256))]


def test_time_check_says_why_it_does_not_run_on_a_cpu():
    r = run("host-sync", checks=["time", "multi-gpu"])
    assert "CUDA GPU" in r.unchecked["time"] and "GPUs" in r.unchecked["multi-gpu"]


# ----------------------------------------------------------------------------- ranking, probe

def test_rank_puts_breaks_first_then_every_gain_largest_first_then_notes():
    fs = [Finding("batch", "b", "changes", gain=5.0), Finding("layout", "l", "keeps", gain=1.2),
          Finding("precision", "p", "breaks", gain=2.0), Finding("shapes", "s", "keeps", gain=1.5),
          Finding("range", "r", "breaks", gain=0.9), Finding("input", "i", "note", gain=9.0)]
    assert [f.kind for f in rank(fs)] == ["range", "precision", "batch", "shapes", "layout",
                                          "input"]


def test_probe_loss_tolerance_against_fp32():
    probe = Probe(clean(), "cpu", 16, loss_steps=5, timed_steps=2)
    ok, d = probe.loss_within_tolerance(probe.measure(Config("amp-bf16")))
    assert ok and d < LOSS_TOLERANCE
    m = probe.measure(Config("fp32"))
    assert m.losses[-1] < m.losses[0] and m.samples_per_s > 0
    assert probe.measure(Config("fp32")) is m  # measured once


def test_fused_optimizer_keeps_the_hyperparameters():
    f = fused_optimizer(lambda p: torch.optim.AdamW(p, lr=3e-4, weight_decay=0.1))
    opt = f([nn.Parameter(torch.zeros(2))])
    assert opt.defaults["fused"] and opt.defaults["lr"] == 3e-4
    assert opt.defaults["weight_decay"] == 0.1
    assert fused_optimizer(lambda p: torch.optim.RMSprop(p)) is None
    assert not optimizer_is_fused(None) and optimizer_is_fused(f)


# ----------------------------------------------------------------------------- report, CLI

def test_report_writes_markdown_json_and_a_plot(tmp_path):
    r = run("overflow")
    paths = r.write(tmp_path)
    assert sorted(p.suffix for p in paths) == [".json", ".md", ".png"]
    data = json.loads(paths[1].read_text())
    assert data["findings"][0]["kind"] == "range" and data["workload"] == "planted-overflow"
    md = paths[0].read_text()
    assert md.index("## 1.") < md.index("## Every measurement")


@pytest.mark.parametrize("argv, words", [
    (["doctor", "no_such_module:fn"], "no_such_module"),
    (["doctor", "small_cnn", "--budget-min", "0"], "budget"),
    (["doctor", "small_cnn", "--batch-size", "0"], "batch"),
    (["doctor", "small_cnn", "--checks", "nope"], "nope"),
])
def test_cli_refuses_bad_input_before_any_work(argv, words, capsys, tmp_path):
    assert cli.main(argv + ["--out", str(tmp_path / "r")]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_doctor_refuses_a_workload_that_raises():
    def boom():
        raise RuntimeError("no such layer")
    w = Workload(name="raises", build=boom, batch=synthetic_batch((4,), 2))
    with pytest.raises(ValueError, match="no such layer"):
        doctor(w, "cpu", batch_size=4, progress=False)


def test_doctor_refuses_bad_arguments():
    with pytest.raises(ValueError, match="budget_s"):
        doctor(clean(), "cpu", budget_s=0)
    with pytest.raises(ValueError, match="check"):
        doctor(clean(), "cpu", checks=["nope"])
    with pytest.raises(TypeError, match="progress"):
        doctor(clean(), "cpu", progress=1)


def test_cli_writes_the_report(tmp_path, capsys):
    assert cli.main(["doctor", "fp16lab.doctor.planted:overflow", "--device", "cpu",
                     "--batch-size", "8", "--precision", "amp-fp16", "--checks", "range",
                     "--no-progress", "--out", str(tmp_path)]) == 0
    assert "activations overflow" in capsys.readouterr().out
    assert (tmp_path / "doctor_planted-overflow.md").exists()


# ----------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["overflow", "underflow", "fp32-layer"])
def test_gpu_first_finding_of_numeric_plants(name):
    report = run(name, device="cuda")
    assert report.first.kind == PLANTED[name].expected, report.to_markdown()


@pytest.mark.gpu
def test_gpu_probe_records_peak_memory_and_the_time_check_runs():
    report = run("host-sync", device="cuda", checks=["precision", "time"])
    assert "time" not in report.unchecked
    assert all(m.peak_bytes and m.peak_bytes > 0 for m in report.measurements if m.ran)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert report.baseline.samples_per_s > 0


def test_report_round_trips_through_its_json(tmp_path):
    from fp16lab.doctor.report import DoctorReport
    r = run("overflow", checks=["precision", "range"])
    again = DoctorReport.from_dict(json.loads(r.write(tmp_path)[1].read_text()))
    assert [f.title for f in again.findings] == [f.title for f in r.findings]
    assert again.start == r.start and again.combined.config == r.combined.config
    assert again.combined_gain == pytest.approx(r.combined_gain)
    assert [m.row()["config"] for m in again.measurements] == \
        [m.row()["config"] for m in r.measurements]


def test_best_combination_keeps_the_fastest_variant_whose_loss_holds():
    from fp16lab.doctor import best_combination
    probe = Probe(clean(), "cpu", 16, loss_steps=5, timed_steps=2)
    start, config = Config("amp-bf16"), Config("amp-bf16", batch_size=32)
    got = best_combination(probe, start, config, ["fp32", "amp-bf16"])
    variants = [probe.measure(c) for c in (config, config.but(precision="fp32"))]
    assert all(m.raced for m in variants)
    assert got is max(variants, key=lambda m: m.samples_per_s)
    assert got.config.batch_size == 32


def test_race_times_the_configurations_in_balanced_orders(monkeypatch):
    """Three configurations, three rounds: a b c, c b a, b c a (no one always after the same
    one); a bad round count is refused before any step is built."""
    from fp16lab.doctor import probe as P
    probe = Probe(clean(), "cpu", 16, loss_steps=3, timed_steps=1)
    a, b, c = Config("fp32"), Config("amp-bf16"), Config("fp32", batch_size=32)
    for config in (a, b, c):
        probe.measure(config)
    built: dict[int, Config] = {}
    real_build = Probe.build_step

    def build(self, config, batch_size):
        step = real_build(self, config, batch_size)
        built[id(step)] = config
        return step

    timed: list[Config] = []

    def times(step, n, device):
        timed.append(built[id(step)])
        return [10.0 * (1 + len(timed))] * n

    monkeypatch.setattr(Probe, "build_step", build)
    monkeypatch.setattr(P, "step_times_ms", times)
    with pytest.raises(ValueError, match="rounds"):
        probe.race([a, b, c], rounds=0)
    assert built == {}
    speeds = probe.race([a, b, c], rounds=3)
    assert timed == [a, b, c, c, b, a, b, c, a]
    # each one's median over its own rounds: a got the 1st, 6th and 9th times
    assert probe.measure(a).step_ms == 10.0 * 7
    assert speeds[a] == pytest.approx(16 / 0.070)


def test_evidence_lines_round_numbers_for_reading():
    f = Finding("range", "t", "note", evidence={"share": 0.123456789, "peak": 123456.7,
                                                 "ok": True})
    assert f.evidence_lines() == ["share: 0.123", "peak: 123,457", "ok: True"]


def test_precision_check_says_the_start_breaks_and_which_recipe_holds():
    r = run("overflow", checks=["precision"])
    (f,) = r.findings
    assert f.kind == "precision" and f.group == "breaks"
    rows = {row["precision"]: row for row in f.table}
    assert rows["amp-fp16"]["within_tolerance"] is False
    assert rows[f.change["precision"]]["within_tolerance"] is True
    assert f.change["precision"] != "amp-fp16"


def test_layout_check_measures_channels_last_for_a_convolution(monkeypatch):
    monkeypatch.setattr(V, "NOISE", -1.0)  # report any measured ratio: the detector is tested
    r = run("nchw", checks=["layout"])
    (f,) = r.findings
    assert f.change == {"layout": "channels_last"} and f.verified
    layouts = {m.config.layout for m in r.measurements}
    assert layouts == {"nchw", "channels_last"}


def test_full_grid_seconds_by_hand():
    from fp16lab.bench.doctor import full_grid_seconds
    # 60 points: 30 uncompiled at 6 s, 30 compiled at the mean of 30 and 50 s
    assert full_grid_seconds(60, 6.0, [30.0, 50.0]) == 30 * 6 + 30 * 40
    # nothing compiled in the doctor's run: every point at the sweep's mean
    assert full_grid_seconds(60, 6.0, []) == 360


def test_bench_real_races_the_doctor_against_the_sweeps_best(monkeypatch):
    """bench.doctor's real part on a tiny BERT on the CPU: the sweep is the grid its docstring
    names, and the two configurations it compares are raced in one probe."""
    pytest.importorskip("transformers")
    from fp16lab.bench import doctor as bench

    raced: list[list[Config]] = []
    real_race = Probe.race

    def spy(self, configs, rounds=3):
        raced.append(list(configs))
        return real_race(self, configs, rounds)

    monkeypatch.setattr(Probe, "race", spy)
    reports: dict = {}
    row = bench.run_real("bert-base", 4, "cpu", True, 60, reports, loss_steps=3)
    assert [p["config"] for p in row["points"]] == [
        f"{p}{b}" for p in ("fp32", "amp-fp16", "amp-bf16") for b in ("", ", batch 8", ", batch 16")]
    assert row["full_grid_points"] == 3 * 1 * 3 * 2 * 2
    judged = raced[-1]
    assert {c.describe() for c in judged} == {row["doctor_config"], row["best_config"]}
    speeds = row["raced_samples_per_s"]
    assert row["doctor_over_best_raced"] == pytest.approx(speeds["doctor"] / speeds["best"])
    assert row["time_share_of_full_grid"] == pytest.approx(
        row["doctor_s"] / row["full_grid_s_extrapolated"])
    assert "bert-base" in reports


def test_bench_markdown_lists_the_runs_a_merged_file_names():
    """A file merged from several runs lists each under the source, with its note."""
    from fp16lab.bench.doctor import markdown
    runs = [{"part": "planted", "measured_at": "T1"},
            {"part": "real: vit-b16", "measured_at": "T2", "note": "a note"}]
    md = markdown([], {}, "measured on X", runs).splitlines()
    assert md[:7] == ["# The doctor checked", "", "measured on X", "",
                      "- planted, measured at T1", "- real: vit-b16, measured at T2: a note", ""]
    assert markdown([], {}, "measured on X").splitlines()[:5] == \
        ["# The doctor checked", "", "measured on X", "", "## Planted problems"]


def test_the_report_says_where_the_time_went(monkeypatch, tmp_path):
    """Each part of a run (the baseline, each check run, the combination) gets its wall-clock
    seconds and, of them, the seconds of the measurements made inside it: a check that only
    sleeps is all its own work; one that measures a new configuration is charged exactly that
    measurement's seconds; the baseline is its one measurement."""
    import time

    from fp16lab import doctor as D
    from fp16lab.doctor.report import DoctorReport

    def sleepy(visit):
        time.sleep(0.3)
        return []

    def measuring(visit):
        visit.probe.measure(Config("fp32", batch_size=32))
        return []

    monkeypatch.setitem(D.CHECKS, "range", sleepy)
    monkeypatch.setitem(D.CHECKS, "shapes", measuring)
    r = doctor(clean(), "cpu", batch_size=16, checks=["range", "shapes"], progress=False,
               loss_steps=4, timed_steps=2)
    parts = r.part_seconds
    assert list(parts) == ["baseline", "range", "shapes"]  # no finding: nothing to combine
    assert parts["range"]["s"] >= 0.3 and parts["range"]["measuring_s"] == 0
    new = next(m for m in r.measurements if m.config == Config("fp32", batch_size=32))
    assert parts["shapes"]["measuring_s"] == new.seconds <= parts["shapes"]["s"]
    assert parts["baseline"]["measuring_s"] == r.baseline.seconds <= parts["baseline"]["s"]
    assert sum(p["s"] for p in parts.values()) <= r.seconds
    md = r.to_markdown()
    assert "## Where the time went" in md and "| range | 0.3" in md
    again = DoctorReport.from_dict(json.loads(r.write(tmp_path)[1].read_text()))
    assert again.part_seconds == parts
    # a report recorded before the parts were timed reads back without them
    old = r.as_dict()
    del old["part_seconds"]
    assert DoctorReport.from_dict(old).part_seconds == {}
    assert "Where the time went" not in DoctorReport.from_dict(old).to_markdown()
