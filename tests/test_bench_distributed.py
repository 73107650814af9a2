"""fp16lab.bench.distributed, its report and its bare loop: the arithmetic on rows made by hand, one CPU launch.

The summaries are checked against rates and efficiencies computed here from the step times; the
launch runs the bare loop's worker on two gloo ranks (seconds) and checks what each rank did.
"""

from __future__ import annotations

import statistics

import pytest

from fp16lab.bench import distributed as bd
from fp16lab.bench import distributed_bare as bare
from fp16lab.bench import distributed_report as bdr

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _item(variant, mode, rnd, ms_by_rank, ok=True, profile=None):
    """A loop item's row as rank 0 writes it: ``ms_by_rank`` maps each training rank to its mean step."""
    per_rank = [{"rank": r, "trained": r in ms_by_rank, "cpus": 16} for r in (0, 1)]
    for p in per_rank:
        if p["trained"]:
            p.update(step_ms_mean=ms_by_rank[p["rank"]], step_ms=[ms_by_rank[p["rank"]]] * 3,
                     params_finite=True, optimizer_fused=variant == "sgd-fused", **(profile or {}))
    return {"task": "loop", "variant": variant, "mode": mode, "round": rnd, "model": "resnet50",
            "batch": 256, "device": "cuda", "warmup": 10, "steps": 30, "profile_steps": 3 if rnd == 0 else 0,
            "status": "ok" if ok else "error", "error": None if ok else "rank 1 raised OutOfMemoryError: x",
            "per_rank": per_rank if ok else None}


def test_loop_items_interleave_rounds_and_profile_only_the_first():
    items = bare.loop_items(["sgd", "bf16"], ["gpu0", "ddp"], 2, model="resnet50", batch=256,
                            device="cuda", warmup=10, steps=30, profile_steps=3)
    assert [(i["round"], i["variant"], i["mode"]) for i in items] == [
        (0, "sgd", "gpu0"), (0, "sgd", "ddp"), (0, "bf16", "gpu0"), (0, "bf16", "ddp"),
        (1, "sgd", "gpu0"), (1, "sgd", "ddp"), (1, "bf16", "gpu0"), (1, "bf16", "ddp")]
    assert [i["profile_steps"] for i in items] == [3] * 4 + [0] * 4
    for kwargs, words in [(dict(variants=["adam"]), "variants must be a non-empty list from sgd, sgd-fused, bf16"),
                          (dict(modes=[]), "modes must be a non-empty list from gpu0, gpu1, no-ddp"),
                          (dict(rounds=0), "rounds must be a positive integer")]:
        args = {"variants": ["sgd"], "modes": ["ddp"], "rounds": 1, **kwargs}
        with pytest.raises(ValueError, match=words):
            bare.loop_items(args["variants"], args["modes"], args["rounds"], model="resnet50", batch=8,
                            device="cpu", warmup=1, steps=1, profile_steps=0)


def test_which_ranks_train_in_each_mode():
    assert [[bare.trains(m, r) for r in (0, 1)] for m in bare.MODES] == [
        [True, False], [False, True], [True, True], [True, True], [True, True]]
    with pytest.raises(ValueError, match="mode must be one of gpu0"):
        bare.trains("gpu2", 0)


def test_pool_rounds_takes_the_slowest_rank_and_the_median_round():
    split = {"span_us": 50e3, "idle_us": 6e3, "compute_us": 42e3, "comm_us": 600.0,
             "exposed_comm_us": 500.0, "overlapped_comm_us": 100.0, "comm_share": 0.012,
             "exposed_comm_share": 0.01, "idle_share": 0.12}
    items = [_item("sgd", "gpu1", 0, {1: 40.0}), _item("sgd", "ddp", 0, {0: 48.0, 1: 50.0}, profile=split),
             _item("sgd", "gpu1", 1, {1: 44.0}), _item("sgd", "ddp", 1, {0: 46.0, 1: 45.0}),
             _item("sgd", "gpu1", 2, {}, ok=False), _item("sgd", "ddp", 2, {0: 49.0, 1: 47.0})]
    gpu1, ddp = bd.pool_rounds(items)
    assert gpu1["label"] == "bare resnet50 b256 amp-fp16 x1 gpu1" and gpu1["gpus"] == 1
    assert gpu1["samples_per_s_repeats"] == pytest.approx([256 / 0.040, 256 / 0.044])
    assert gpu1["status"] == "ok" and gpu1["round_errors"][0]["round"] == 2
    assert [p["rank"] for p in gpu1["per_rank"]] == [1]
    assert ddp["label"] == "bare resnet50 b256 amp-fp16 x2" and ddp["gpus"] == 2
    assert ddp["step_ms_repeats"] == [50.0, 46.0, 49.0]  # the slowest rank of each round
    assert ddp["samples_per_s"] == pytest.approx(512 / 0.049)  # median of 512/0.050, 512/0.046, 512/0.049
    assert ddp["per_rank"][1]["step_ms_mean_repeats"] == [50.0, 45.0, 47.0]
    assert ddp["idle_us"] == 6e3 and ddp["per_rank"][0]["idle_us"] == 6e3  # from the profiled round


def _rows():
    """Bare rows (two variants) and fp16lab rows, as pool_rounds and lab_rows leave them."""
    def b(variant, mode, gpus, rate, optimizer="sgd", precision="amp-fp16", idle=None):
        per_rank = [{"rank": r, "step_ms_mean_repeats": [gpus * 256 / rate * 1e3], "idle_us": idle}
                    for r in range(gpus)]
        return {"kind": "bare", "variant": variant, "mode": mode, "gpus": gpus, "model": "resnet50",
                "batch": 256, "precision": precision, "optimizer": optimizer, "status": "ok",
                "samples_per_s": rate, "per_rank": per_rank, "label": f"bare {variant} {mode}"}

    def lab(gpus, rate, optimizer="sgd"):
        return {"kind": "fp16lab", "gpus": gpus, "model": "resnet50", "batch": 256, "precision": "amp-fp16",
                "optimizer": optimizer, "comm_hook": "none", "status": "ok", "samples_per_s": rate,
                "label": f"resnet50 b256 amp-fp16 x{gpus} ddp hook=none bucket=25MB"}

    return [b("sgd", "gpu0", 1, 5800.0), b("sgd", "gpu1", 1, 5600.0), b("sgd", "no-ddp", 2, 11300.0),
            b("sgd", "ddp", 2, 10600.0, idle=5000.0), b("sgd", "ddp-no-broadcast", 2, 10900.0),
            b("sgd-fused", "gpu0", 1, 6000.0, "sgd-fused"), b("sgd-fused", "ddp", 2, 11700.0, "sgd-fused"),
            lab(1, 5850.0), lab(2, 10500.0), lab(1, 5990.0, "sgd-fused"), lab(2, 11600.0, "sgd-fused")]


def test_summarize_matches_each_row_with_its_own_one_gpu_rate():
    rows = _rows()
    out = bdr.summarize(rows, 2, "resnet50", 256)
    eff = {r["label"]: r.get("efficiency") for r in rows}
    assert eff["bare sgd ddp"] == pytest.approx(10600 / (2 * 5800))  # against GPU 0, not GPU 1
    assert eff["bare sgd no-ddp"] == pytest.approx(11300 / (2 * 5800))
    assert eff["bare sgd-fused ddp"] == pytest.approx(11700 / (2 * 6000))  # its own optimizer's x1
    assert out["bare_efficiency"] == pytest.approx(10600 / 11600)
    assert out["bare_efficiency_fused"] == pytest.approx(11700 / 12000)
    assert out["engine_vs_bare"] == pytest.approx(10500 / 10600)
    assert out["engine_vs_bare_fused"] == pytest.approx(11600 / 11700)
    assert out["engine_efficiency_fused"] == pytest.approx(11600 / (2 * 5990))


def test_summarize_keeps_the_engines_no_broadcast_points_apart():
    rows = _rows()  # their fp16lab rows predate broadcast_buffers: they broadcast
    default, fused = (next(r for r in rows if r["kind"] == "fp16lab" and r["gpus"] == 2 and r["optimizer"] == o)
                      for o in ("sgd", "sgd-fused"))
    rows += [{**default, "broadcast_buffers": False, "samples_per_s": 11300.0, "label": "no_broadcast"},
             {**fused, "broadcast_buffers": False, "samples_per_s": 11900.0, "label": "no_broadcast fused"}]
    out = bdr.summarize(rows, 2, "resnet50", 256)
    assert out["engine_efficiency"] == pytest.approx(10500 / (2 * 5850))  # not pooled with 11300
    assert out["engine_vs_bare"] == pytest.approx(10500 / 10600)
    assert out["engine_efficiency_fused"] == pytest.approx(11600 / (2 * 5990))
    assert out["engine_efficiency_no_broadcast"] == pytest.approx(11300 / (2 * 5850))
    assert out["engine_efficiency_no_broadcast_fused"] == pytest.approx(11900 / (2 * 5990))
    assert rows[-2]["efficiency"] == pytest.approx(11300 / (2 * 5850))  # against the one-GPU point
    lines = bdr.summary_lines(out)
    assert "fp16lab's point with broadcast_buffers=False: 0.966" in lines
    assert "fp16lab's point with broadcast_buffers=False: 0.993" in lines
    assert out["engine_best"] == {"setting": "-", "efficiency": pytest.approx(11900 / (2 * 5990))}


def test_summarize_keeps_other_bucket_sizes_and_static_graph_out_of_the_defaults():
    rows = _rows()
    fused = next(r for r in rows if r["kind"] == "fp16lab" and r["gpus"] == 2 and r["optimizer"] == "sgd-fused")
    label = "resnet50 b256 amp-fp16 x2 ddp hook=none bucket={} no_broadcast opt=sgd-fused"
    rows += [{**fused, "broadcast_buffers": False, "samples_per_s": 11700.0, "bucket_cap_mb": 25,
              "static_graph": False, "label": label.format("25MB")},
             {**fused, "broadcast_buffers": False, "samples_per_s": 11950.0, "bucket_cap_mb": 100,
              "label": label.format("100MB")},
             {**fused, "broadcast_buffers": False, "samples_per_s": 11900.0, "static_graph": True,
              "label": label.format("25MB static_graph")}]
    out = bdr.summarize(rows, 2, "resnet50", 256)
    assert out["engine_efficiency_no_broadcast_fused"] == pytest.approx(11700 / (2 * 5990))
    assert out["engine_efficiency_fused"] == pytest.approx(11600 / (2 * 5990))
    assert out["engine_best"] == {"setting": "ddp hook=none bucket=100MB no_broadcast opt=sgd-fused",
                                  "efficiency": pytest.approx(11950 / (2 * 5990))}
    assert ("fp16lab's best amp-fp16 setting at this batch: ddp hook=none bucket=100MB no_broadcast "
            "opt=sgd-fused, 0.997") in bdr.summary_lines(out)


def test_plan_measures_the_no_broadcast_points_right_after_the_batch_256_ddp_points():
    launches = bd.plan(2, "cuda")
    first_two_gpu = next(points for points, _ in launches if points[0].gpus == 2)
    assert [p.label() for p in first_two_gpu[:5]] == [
        "resnet50 b256 amp-fp16 x2 ddp hook=none bucket=25MB",
        "resnet50 b256 amp-fp16 x2 ddp hook=none bucket=25MB opt=sgd-fused",
        "resnet50 b256 amp-fp16 x2 ddp hook=fp16 bucket=25MB",
        "resnet50 b256 amp-fp16 x2 ddp hook=none bucket=25MB no_broadcast",
        "resnet50 b256 amp-fp16 x2 ddp hook=none bucket=25MB no_broadcast opt=sgd-fused"]
    assert [p.label() for p in first_two_gpu[5:7]] == [
        "resnet50 b256 amp-fp16 x2 ddp hook=none bucket=100MB no_broadcast opt=sgd-fused",
        "resnet50 b256 amp-fp16 x2 ddp hook=none bucket=25MB static_graph no_broadcast opt=sgd-fused"]
    assert sum(not p.broadcast_buffers for points, _ in launches for p in points) == 4


def test_diagnosis_sets_the_suspects_side_by_side():
    rows = _rows()
    bdr.summarize(rows, 2, "resnet50", 256)
    got = bdr.diagnosis(rows)
    sgd = got["sgd"]
    assert sgd["gpu1_over_gpu0"] == pytest.approx(5600 / 5800)
    assert sgd["vs_each_alone"] == pytest.approx(10600 / (5800 + 5600))
    assert sgd["efficiency"] == pytest.approx({"no-ddp": 11300 / 11600, "ddp": 10600 / 11600,
                                               "ddp-no-broadcast": 10900 / 11600})
    ddp = sgd["per_rank"]["ddp"]
    assert [r["rank"] for r in ddp] == [0, 1] and ddp[0]["idle"] == 5.0  # ms per step
    assert ddp[0]["step_ms"] == pytest.approx(512 / 10600 * 1e3)
    assert "gpu1_over_gpu0" not in got["sgd-fused"]  # no GPU 1 row: nothing to compare
    assert set(got) == {"sgd", "sgd-fused"}  # fp16lab rows are not the bare loop's


def test_the_notebook_reads_the_diagnosis_as_a_table_and_sentences():
    diag = {"sgd": {"rate": {"gpu0": 5800.0, "ddp": 9280.0}, "efficiency": {"ddp": 0.8},
                    "per_rank": {"gpu0": [{"rank": 0, "step_ms": 44.1, "idle": 7.0, "compute": 41.0,
                                           "nccl": 0.0, "exposed_nccl": 0.0}],
                                 "ddp": [{"rank": 0, "step_ms": 55.2, "idle": 17.0, "compute": 41.5,
                                          "nccl": 0.5, "exposed_nccl": 0.4},
                                         {"rank": 1, "step_ms": 55.3, "idle": 5.8, "compute": 41.6,
                                          "nccl": 12.9, "exposed_nccl": 12.7}]}}}
    t = bdr.diagnosis_table(diag)
    assert list(t.index) == [("fp16 + GradScaler, SGD", "GPU 0 alone", 0), ("fp16 + GradScaler, SGD", "DDP", 0),
                             ("fp16 + GradScaler, SGD", "DDP", 1)]
    assert t.loc[("fp16 + GradScaler, SGD", "DDP", 1), "exposed NCCL ms"] == 12.7
    assert t.loc[("fp16 + GradScaler, SGD", "DDP", 0), "idle ms"] == 17.0
    assert t.loc[("fp16 + GradScaler, SGD", "DDP", 1), "efficiency"] == 0.8
    assert t.loc[("fp16 + GradScaler, SGD", "DDP", 1), "samples/s"] == 9280.0
    assert pd_isna(t.loc[("fp16 + GradScaler, SGD", "GPU 0 alone", 0), "efficiency"])
    summary = {"bare_efficiency": 0.8, "engine_efficiency": 0.9, "engine_vs_bare": 1.125,
               "transformer_default_efficiency": 0.5, "transformer_gap_recovered": 0.6,
               "transformer_best": {"setting": "ddp hook=none bucket=5MB", "efficiency": 0.8},
               "diagnosis": diag}
    assert bdr.summary_lines(summary) == [
        "hand-written DDP loop, ResNet-50 amp-fp16 with SGD: scaling efficiency 0.800",
        "fp16lab's point, same setting: 0.900 (1.12x the hand-written loop's samples/s)",
        "transformer stack, amp-bf16, the baseline (DDP's defaults but gradient_as_bucket_view=True): 0.500; best setting ddp hook=none bucket=5MB: "
        "0.800, 60% of the gap to 1.0 recovered",
        "fp16 + GradScaler, SGD: DDP 0.800",
        "  under DDP, in a profiled step, rank 1 waits 12.7 ms in NCCL with no compute beside it, while "
        "rank 0's GPU sits idle 17.0 ms waiting for its host (a step without the profiler: 55.3 ms)"]
    assert bdr.summary_lines({}) == [] and len(bdr.diagnosis_table({})) == 0
    defaults_best = {"transformer_default_efficiency": 0.82, "transformer_gap_recovered": 0.0,
                     "transformer_best": {"setting": bdr.DEFAULT_SETTING, "efficiency": 0.82}}
    assert bdr.summary_lines(defaults_best) == [
        "transformer stack, amp-bf16, the baseline (DDP's defaults but gradient_as_bucket_view=True): 0.820; no other setting did better in this run"]


def test_wait_shares_take_each_from_the_rank_where_it_shows():
    ranks = [{"rank": 0, "span_us": 100.0, "compute_us": 70.0, "exposed_comm_share": 0.01, "idle_share": 0.29},
             {"rank": 1, "span_us": 100.0, "compute_us": 60.0, "exposed_comm_share": 0.25, "idle_share": 0.15}]
    row = {"per_rank": ranks, "exposed_comm_share": 0.01, "idle_share": 0.29, "span_us": 100.0, "compute_us": 70.0}
    assert bdr.wait_shares(row) == pytest.approx({"compute_share": 0.6, "exposed_comm_share": 0.25, "idle_share": 0.29})
    alone = {k: v for k, v in row.items() if k != "per_rank"}  # no per-rank profile: the row's own
    assert bdr.wait_shares(alone) == pytest.approx({"compute_share": 0.7, "exposed_comm_share": 0.01, "idle_share": 0.29})
    assert bdr.wait_shares({"per_rank": None}) == {"compute_share": None, "exposed_comm_share": None, "idle_share": None}
    assert bdr.wait_shares({**alone, "per_rank": float("nan")}) == bdr.wait_shares(alone)  # a table's missing cell


def test_setting_effects_compare_with_the_defaults_of_the_same_kind():
    def row(label, eff, precision="amp-bf16", model="transformer_stack", batch=32, optimizer="sgd", **kw):
        return {"label": label, "efficiency": eff, "status": "ok", "gpus": 2, "kind": "fp16lab", "model": model,
                "batch": batch, "precision": precision, "optimizer": optimizer, **kw}
    rows = [row("transformer_stack b32 amp-bf16 x2 ddp hook=none bucket=25MB", 0.50),
            row("transformer_stack b32 amp-bf16 x2 ddp hook=none bucket=25MB", 0.60),  # measured twice
            row("transformer_stack b32 amp-bf16 x2 ddp hook=none bucket=5MB", 0.80),
            row("transformer_stack b32 amp-bf16 x2 ddp hook=bf16 bucket=25MB", 0.45),
            row("transformer_stack b32 amp-fp16 x2 ddp hook=fp16 bucket=25MB", 0.40, precision="amp-fp16"),
            row("resnet50 b256 amp-bf16 x2 ddp hook=bf16 bucket=25MB", 0.9, status="error", model="resnet50"),
            {**row("bare resnet50 b256 amp-fp16 x2", 0.8), "kind": "bare"}]
    t = bdr.setting_effects(rows)
    assert t["setting"].tolist() == ["ddp hook=none bucket=5MB", "ddp hook=bf16 bucket=25MB"]
    assert t["baseline"].tolist() == [0.55, 0.55]  # the median of the two default runs
    assert t["change"].tolist() == pytest.approx([0.25, -0.10])
    older = [{**r, "optimizer": float("nan")} for r in rows]  # read back from a table without the field
    assert bdr.setting_effects(older)["change"].tolist() == pytest.approx([0.25, -0.10])


def pd_isna(x):
    import pandas as pd
    return pd.isna(x)


def test_cpu_launch_of_the_bare_loop_and_the_allreduce_probe():
    rows, probe = bd.diagnose(2, "cpu", "small_cnn", 8, rounds=1, timeout_s=120,
                              variants=["sgd-fused", "bf16"], modes=["gpu1", "ddp-no-broadcast"])
    assert probe["status"] == "ok" and probe["world_size"] == 2
    for size, mb in zip(probe["sizes"], (1, 2)):
        assert size["bytes"] == mb * 2**20
        want = size["bytes"] / (size["ms"] / 1e3) / 1e9
        assert size["algbw_gbs"] == pytest.approx(want) and size["busbw_gbs"] == pytest.approx(want)  # n = 2
    by = {(r["variant"], r["mode"]): r for r in rows}
    assert set(by) == {("sgd-fused", "gpu1"), ("sgd-fused", "ddp-no-broadcast"), ("bf16", "gpu1"),
                       ("bf16", "ddp-no-broadcast")}
    for (variant, mode), r in by.items():
        assert r["status"] == "ok", r["error"]
        ranks = [p["rank"] for p in r["per_rank"]]
        assert ranks == ([1] if mode == "gpu1" else [0, 1]) and r["gpus"] == len(ranks)
        assert r["samples_per_s"] == pytest.approx(len(ranks) * 8 / (max(r["step_ms_repeats"]) / 1e3))
        for p in r["per_rank"]:
            assert p["optimizer_fused"] is (variant == "sgd-fused")
            assert (p["scale_after"] is None) is (variant == "bf16")  # bf16: no scaler at all
            assert p["params_finite"] is True
    assert by[("bf16", "gpu1")]["precision"] == "amp-bf16"


def test_bad_arguments_stop_the_benchmark_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # the output folder is checked as the arguments are parsed, as for every benchmark
    # (tests/test_bench.py): usage and one line, exit 2
    for argv, words in [(["--quick", "--rounds", "0"], "argument --rounds: must be >= 1"),
                        (["--quick", "--gpus", "1"], "argument --gpus: must be >= 2"),
                        (["--quick", "--budget-s", "0"], "argument --budget-s: must be > 0"),
                        (["--quick", "--out", str(blocker / "sub")], "a-file is a file")]:
        with pytest.raises(SystemExit, match="2"):
            bd.main(argv)
        assert words in capsys.readouterr().err


def test_topology_says_why_when_nvidia_smi_is_missing(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert bd.nvidia_smi_topology().startswith("not read: FileNotFoundError")
