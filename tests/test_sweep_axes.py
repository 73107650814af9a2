"""The sweep's later axes (execution, input, gpus, fp8-<recipe>): checks, grid, rows, old files."""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest
import torch

from fp16lab import distributed, fp8, recipes, sweep
from fp16lab.models import build_model
from fp16lab.sweep import Point, ScalerSettings, SweepSpec, axes


def tiny(**kw) -> SweepSpec:
    base = dict(models=("mlp",), batches=(8,), device="cpu", warmup=1, steps=3, repeats=1,
                telemetry=False)
    base.update(kw)
    return SweepSpec(**base)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from fp16lab.inputs.dataset import make_image_folder

    root = tmp_path_factory.mktemp("jpegs") / "set"
    make_image_folder(root, images=24, classes=3, size=(64, 48), workers=1)
    return root


# --------------------------------------------------------------------------- bad values, up front

@pytest.mark.parametrize("kw, words", [
    (dict(executions=("jit",)), ["unknown execution 'jit'", "eager, cuda-graph, compile"]),
    (dict(executions=("cuda-graph",)), ["cuda-graph", "needs a CUDA device"]),
    (dict(executions=("compile",), compile_modes=("fast",)), ["unknown compile mode 'fast'",
                                                              "reduce-overhead"]),
    (dict(executions=("compile",), compile_modes=("reduce-overhead",)), ["reduce-overhead",
                                                                         "CUDA"]),
    (dict(executions=("compile",), precisions=("fp16-o2",)), ["fp16-o2"]),
    (dict(inputs=("ffcv",)), ["unknown input 'ffcv'",
                                     "synthetic, dataloader, gpu-decode, hw-decode, dali"]),
    (dict(inputs=("dataloader",), images_dir="x"), ["'mlp' takes no images"]),
    (dict(models=("small_cnn",), inputs=("dataloader",)), ["give images_dir"]),
    (dict(models=("small_cnn",), inputs=("gpu-decode",), images_dir="x"), ["cannot run here",
                                                                           "CUDA"]),
    (dict(models=("small_cnn",), inputs=("hw-decode",), images_dir="x"), ["cannot run here",
                                                                          "hardware JPEG"]),
    (dict(models=("small_cnn",), inputs=("dataloader",), images_dir="x", num_workers=(-1,)),
     ["num_workers", ">= 0"]),
    (dict(gpus=(2,)), ["gpus=2", "allowed here: 1"]),
    (dict(gpus=(0,)), ["gpus must be a positive integer"]),
    (dict(models=("small_cnn",), precisions=("fp8-tensorwise",)), ["image model",
                                                                   "transformer_block"]),
    (dict(precisions=("fp8-tensorwise",), executions=("compile",)), ["'eager' only"]),
    (dict(precisions=("fp8-sideways",)), ["unknown precision", "fp8-tensorwise", "fp8-delayed"]),
    (dict(images=0), ["images must be a positive integer"]),
])
def test_bad_axis_values_are_refused_before_running(kw, words):
    with pytest.raises(ValueError) as e:
        tiny(**kw)
    for w in words:
        assert w in str(e.value)


def test_gpus_refuses_what_the_ranks_do_not_run(monkeypatch):
    monkeypatch.setattr(axes, "gpu_count", lambda: 2)
    Point("mlp", 4, precision="amp-bf16", device="cuda", gpus=2)  # allowed
    for kw, word in [(dict(precision="tf32"), "not offered across GPUs"),
                     (dict(precision="fp16-o2"), "not offered across GPUs"),
                     (dict(precision="amp-fp16", scaler=ScalerSettings(init_scale=8.0)),
                      "default settings"),
                     (dict(cudnn_benchmark=True), "cudnn_benchmark"),
                     (dict(gpus=3), "allowed here: 1 to 2")]:
        with pytest.raises(ValueError, match=word):
            Point("mlp", 4, device="cuda", **{"gpus": 2, **kw})


def test_fp8_applies_where_the_recipe_converts_a_linear_layer():
    # oracle: the layers convert_to_fp8's rule takes (exact nn.Linear, features multiples of
    # 16, or of 128 for blockwise), counted here by hand on the real models
    def convertible(model, multiple):
        return [n for n, m in build_model(model).named_modules() if type(m) is torch.nn.Linear
                and not m.in_features % multiple and not m.out_features % multiple
                and n.split(".")[-1] != "head"]

    for model in ("mlp", "transformer_block"):
        for recipe in fp8.RECIPES:
            want = bool(convertible(model, 128 if recipe == "blockwise" else 16))
            assert (axes.fp8_problem(model, f"fp8-{recipe}") is None) == want
    assert "image model" in axes.fp8_problem("small_cnn", "fp8-rowwise")


# --------------------------------------------------------------------------- the grid and keys

def test_each_value_is_crossed_only_with_the_points_it_applies_to(images):
    spec = tiny(models=("small_cnn", "mlp"), precisions=("amp-bf16", "fp8-tensorwise"),
                executions=("eager", "compile"), compile_modes=("default",),
                inputs=("synthetic", "dataloader"), num_workers=(0, 1), images_dir=images)
    got = {(p.model, p.precision, p.execution, p.compile_mode, p.input, p.num_workers)
           for p in spec.points()}
    want = set()
    for ex, mode in (("eager", None), ("compile", "default")):
        want |= {("mlp", "amp-bf16", ex, mode, "synthetic", None),
                 ("small_cnn", "amp-bf16", ex, mode, "synthetic", None),
                 ("small_cnn", "amp-bf16", ex, mode, "dataloader", 0),
                 ("small_cnn", "amp-bf16", ex, mode, "dataloader", 1)}
    want.add(("mlp", "fp8-tensorwise", "eager", None, "synthetic", None))
    assert got == want
    dl = [p for p in spec.points() if p.input == "dataloader"]
    assert all(p.pin_memory is True and p.non_blocking is True and p.normalize_on == "cpu"
               and p.images_dir == str(images) for p in dl)


def test_a_point_at_the_axis_defaults_keeps_the_key_it_had_before_the_axes():
    p = Point("small_cnn", 8, "nchw", "amp-fp16", device="cpu")
    old = {"model": "small_cnn", "batch": 8, "layout": "nchw", "precision": "amp-fp16",
           "init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
           "growth_interval": 2000, "cudnn_benchmark": False, "device": "cpu"}
    assert p.key == hashlib.sha1(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert Point("small_cnn", 8, execution="compile").key != Point("small_cnn", 8).key
    assert Point("small_cnn", 8, execution="compile").compile_mode == "default"


def test_an_older_results_file_loads_with_the_axis_defaults_and_resumes(tmp_path):
    out = tmp_path / "old.parquet"
    spec = tiny(precisions=("fp32",))
    sweep.run_sweep(spec, out)
    old = pd.read_parquet(out).drop(columns=[*sweep.AXIS_DEFAULTS, "images_dir", "fp8_layers"])
    old.to_parquet(out)
    rows = sweep.read_results(out)
    assert (rows["execution"] == "eager").all() and (rows["input"] == "synthetic").all()
    assert (rows["gpus"] == 1).all() and rows["fp8_layers"].isna().all()
    again = sweep.run_sweep(spec, out)  # the old row is found by its key: nothing re-measured
    assert len(again) == len(old) == 1
    assert sweep.summarize_results(rows)["samples_per_s"].notna().all()


# --------------------------------------------------------------------------- end to end on a CPU

def test_fp8_tensorwise_point_runs_the_fp8_step_with_the_sweeps_sgd(monkeypatch):
    from fp16lab.fp8 import training

    seen = {}
    real = training.make_fp8_step

    def spy(model, x, y, recipe, **kw):
        seen.update(recipe=recipe, **kw)
        return real(model, x, y, recipe, **kw)

    monkeypatch.setattr(training, "make_fp8_step", spy)
    df = sweep.run_sweep(tiny(precisions=("fp8-tensorwise",)))
    row = df.iloc[0]
    assert row["status"] == "ok", row["error"]
    assert seen["recipe"] == "tensorwise" and seen["autocast"] is True
    opt = seen["optimizer"]
    assert isinstance(opt, torch.optim.SGD)
    assert opt.defaults["lr"] == recipes.LR and opt.defaults["momentum"] == recipes.MOMENTUM
    assert row["fp8_layers"] == 2  # mlp: 64->128 and 128->128; the 128->10 output stays
    assert row["fp8_scaled_mm"] == fp8.scaled_mm_available("cpu") == False  # noqa: E712
    assert row["fp8_emulated"] and "compute capability" in row["fp8_fallbacks"]
    assert row["init_scale"] is None and row["final_scale"] is None  # no GradScaler
    assert "fp8-tensorwise: FP8 matmuls emulated" in sweep.format_report(df)


@pytest.mark.slow
def test_eager_and_compile_train_the_same_weights_on_a_cpu():
    df = sweep.run_sweep(tiny(precisions=("fp32",), executions=("eager", "compile"), steps=2))
    assert (df["status"] == "ok").all(), df["error"].tolist()
    eager, compiled = df.iloc[0], df.iloc[1]
    assert (eager["execution"], compiled["execution"]) == ("eager", "compile")
    assert "torch.compile" in compiled["execution_notes"]
    # same seed, same batch, same SGD steps: the last step's loss agrees to fp32 rounding
    assert compiled["final_loss"] == pytest.approx(eager["final_loss"], rel=1e-4)


def test_dataloader_input_feeds_every_step_a_new_batch(images, monkeypatch):
    import fp16lab.inputs as inputs_module

    drawn = []
    real = inputs_module.make_input

    def counting(*a, **kw):
        pipeline = real(*a, **kw)
        batches = pipeline._batches

        def each():
            for b in batches:
                drawn.append(b[0].shape)
                yield b
        pipeline._batches = each()
        return pipeline

    monkeypatch.setattr(inputs_module, "make_input", counting)
    spec = tiny(models=("small_cnn",), inputs=("dataloader",), num_workers=(0,),
                layouts=("channels_last",), images_dir=images, warmup=0, steps=3)
    row = sweep.run_sweep(spec).iloc[0]
    assert row["status"] == "ok", row["error"]
    assert row["warmup"] == 0 and row["input_warmup"] == 2  # at least num_workers + 2 run
    assert len(drawn) == 2 + 3 and drawn[0] == (8, 3, 32, 32)  # small_cnn's 32-pixel crops
    assert row["input"] == "dataloader" and row["num_workers"] == 0
    assert "workers" in row["input_implementation"]


def test_a_corrupt_jpeg_ends_its_point_as_error_and_the_sweep_goes_on(images, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(images, broken)
    victim = sorted(broken.glob("class_00/*.jpg"))[0]
    victim.write_bytes(b"not a jpeg at all")
    spec = tiny(models=("small_cnn",), inputs=("dataloader", "synthetic"), num_workers=(0,),
                images_dir=broken, steps=4)  # 6 batches of 8 from 24 files: every file is read
    df = sweep.run_sweep(spec)
    by_input = df.set_index("input")
    assert by_input.loc["dataloader", "status"] == "error"
    assert victim.name in by_input.loc["dataloader", "error"]
    assert by_input.loc["synthetic", "status"] == "ok"


def test_an_empty_images_dir_is_written_before_the_grid(tmp_path):
    root = tmp_path / "new"
    spec = tiny(models=("small_cnn",), inputs=("dataloader",), num_workers=(0,),
                images_dir=root, images=8, batches=(4,), steps=1)
    row = sweep.run_sweep(spec).iloc[0]
    assert len(list(root.glob("class_*/*.jpg"))) == 8
    assert row["status"] == "ok", row["error"]


def test_a_gpus_point_is_measured_by_the_distributed_launcher(monkeypatch):
    monkeypatch.setattr(axes, "gpu_count", lambda: 2)
    launched = []

    def fake_measure_point(dp, timeout_s):
        launched.append((dp, timeout_s))
        return {"status": "ok", "error": None, "step_ms_median": 50.0, "step_ms_mean": 52.0,
                "samples_per_s": 999.0, "peak_memory_gib": 1.5,
                "per_rank": [{"rank": 0}, {"rank": 1}]}

    monkeypatch.setattr(distributed, "measure_point", fake_measure_point)
    point = Point("resnet50", 64, "channels_last", "amp-fp16", device="cuda", gpus=2)
    row = sweep.measure_point(point, warmup=4, steps=9)
    (dp, timeout), = launched
    assert (dp.model, dp.batch, dp.precision, dp.gpus, dp.layout, dp.device) == \
        ("resnet50", 64, "amp-fp16", 2, "channels_last", "cuda")
    assert (dp.warmup, dp.steps, timeout) == (4, 9, distributed.DEFAULT_TIMEOUT_S)
    assert row["status"] == "ok" and row["gpus"] == 2
    assert row["samples_per_s"] == pytest.approx(2 * 64 / 0.050)  # both GPUs' samples
    assert row["peak_mem_allocated_mb"] == pytest.approx(1.5 * 1024)
    assert json.loads(row["per_rank"]) == [{"rank": 0}, {"rank": 1}]
    s = sweep.summarize_results(pd.DataFrame([row], columns=list(sweep.ROW_COLUMNS)))
    assert s["samples_per_s"].iloc[0] == pytest.approx(2 * 64 / 0.050)

    monkeypatch.setattr(distributed, "measure_point",
                        lambda dp, timeout_s: {"status": "error", "error": "rank 1 raised X"})
    row = sweep.measure_point(point, warmup=1, steps=2)
    assert (row["status"], row["error"]) == ("error", "rank 1 raised X")


@pytest.mark.slow
def test_a_two_rank_point_runs_under_torchrun_on_gloo():
    # Point refuses gpus > 1 on a CPU; the launcher itself is the same, so run it on gloo here.
    from fp16lab.sweep.multi_gpu import measure_on_gpus

    point = Point("mlp", 4, precision="fp32", device="cpu")
    object.__setattr__(point, "gpus", 2)
    got = measure_on_gpus(point, warmup=1, steps=2, timeout_s=120)
    assert got["status"] == "ok", got["error"]
    ranks = json.loads(got["per_rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    slowest = max(r["step_ms_median"] for r in ranks)
    assert got["step_ms_median"] == pytest.approx(slowest)
    assert got["samples_per_s"] == pytest.approx(2 * 4 / (slowest / 1e3))


# --------------------------------------------------------------------------- CLI, plots, panel

def test_cli_takes_the_new_axes(tmp_path, capsys):
    from fp16lab.cli import main

    out = tmp_path / "axes.parquet"
    rc = main(["sweep", "--model", "mlp", "--batch", "8", "--precisions", "amp-bf16,fp8-rowwise",
               "--execution", "eager", "--input", "synthetic", "--gpus", "1", "--device", "cpu",
               "--warmup", "0", "--steps", "2", "--repeats", "1", "--out", str(out)])
    assert rc == 0
    df = pd.read_parquet(out)
    assert set(df["precision"]) == {"amp-bf16", "fp8-rowwise"} and (df["status"] == "ok").all()
    capsys.readouterr()
    for args, words in [(["--execution", "cuda-graph"], ["needs a CUDA device"]),
                        (["--gpus", "1,4"], ["gpus=4", "allowed here: 1"]),
                        (["--num-workers", "many"], ["--num-workers", "auto"])]:
        assert main(["sweep", "--model", "mlp", "--device", "cpu", "--out",
                     str(tmp_path / "no.parquet"), *args]) == 2
        err = capsys.readouterr().err
        assert all(w in err for w in words), err
    assert not (tmp_path / "no.parquet").exists()


def test_fp8_and_variants_get_plot_styles_of_their_own():
    styles = {p: sweep.plot_style("nchw", p)["color"] for p in sweep.SWEEP_PRECISIONS}
    assert len(set(styles.values())) == len(styles)  # one colour per precision
    assert sweep.plot_style("nchw", "fp8-delayed")["marker"] == "D"
    assert sweep.plot_style("nchw", "fp32", "compile(default)")["ls"] == ":"
    assert sweep.plot_style("nchw", "fp32", "x2")["marker"] not in ("o", "s")


def test_panel_offers_the_axes_and_refuses_an_input_that_cannot_run_here():
    pytest.importorskip("ipywidgets")
    from fp16lab.widgets import SweepPanel

    panel = SweepPanel(device="cpu")
    assert list(panel.executions.options) == ["eager", "cuda-graph", "compile"]
    assert set(panel.precisions.options) == set(sweep.SWEEP_PRECISIONS)
    assert list(panel.gpus.options) == [1]
    labels = dict((value, label) for label, value in panel.inputs.options)
    assert labels["synthetic"] == "synthetic" and labels["dataloader"] == "dataloader"
    assert all("unavailable" in labels[b] for b in ("gpu-decode", "hw-decode", "dali"))
    panel.model.value = "small_cnn"
    panel.inputs.value = ("gpu-decode",)
    assert panel.run() is False and "cannot run here" in panel.error
    panel.model.value, panel.layouts.value = "mlp", ("nchw",)
    panel.inputs.value = ("synthetic",)
    panel.precisions.value = ("amp-bf16", "fp8-tensorwise")
    panel.executions.value = ("eager",)
    spec = panel.spec()
    assert {p.precision for p in spec.points()} == {"amp-bf16", "fp8-tensorwise"}
    for name in ("executions", "compile-mode", "inputs", "images-dir", "num-workers", "gpus"):
        attr = name.replace("-", "_")
        assert f"fp16lab-sweep-{name}" in getattr(panel, attr)._dom_classes


# ------------------------------------------------------------------------- GPU: a point per axis

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu_spec(**kw) -> SweepSpec:
    return tiny(**{"device": "cuda", "warmup": 2, "steps": 5, **kw})


@pytest.mark.gpu
@needs_cuda
def test_gpu_execution_modes_each_give_an_ok_row():
    df = sweep.run_sweep(gpu_spec(models=("small_cnn",), batches=(32,), precisions=("amp-fp16",),
                                  executions=("eager", "cuda-graph", "compile")))
    assert (df["status"] == "ok").all(), df["error"].tolist()
    graph = df[df["execution"] == "cuda-graph"].iloc[0]
    assert "fused SGD" in graph["execution_notes"]
    assert df["final_scale"].notna().all()  # the GradScaler's scale is read in every mode


@pytest.mark.gpu
@needs_cuda
def test_gpu_inputs_feed_training(images):
    from fp16lab.inputs import unavailable_reason

    inputs = tuple(b for b in ("dataloader", "gpu-decode", "hw-decode")
                   if unavailable_reason(b, "cuda") is None)
    df = sweep.run_sweep(gpu_spec(models=("small_cnn",), layouts=("channels_last",),
                                  inputs=("synthetic", *inputs), num_workers=(2,),
                                  images_dir=images))
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert set(df["input"]) == {"synthetic", *inputs}


@pytest.mark.gpu
@needs_cuda
def test_gpu_fp8_points_say_whether_scaled_mm_ran():
    met_before = dict(fp8.FALLBACKS)  # process-wide; earlier tests may have met fallbacks
    fp8.FALLBACKS.clear()
    try:
        df = sweep.run_sweep(gpu_spec(models=("transformer_block",), batches=(64,),
                                      precisions=("amp-bf16", "fp8-tensorwise", "fp8-blockwise")))
    finally:
        fp8.FALLBACKS.update(met_before)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    rows = df.set_index("precision")
    fast = fp8.scaled_mm_available("cuda")
    assert bool(rows.loc["fp8-tensorwise", "fp8_scaled_mm"]) == fast
    assert bool(rows.loc["fp8-tensorwise", "fp8_emulated"]) == (not fast)
    assert bool(rows.loc["fp8-blockwise", "fp8_emulated"])  # no fused blockwise kernel is used


@pytest.mark.gpu
@pytest.mark.skipif(axes.gpu_count() < 2, reason="needs two CUDA GPUs")
def test_gpus_two_ranks_give_a_row_with_both_gpus_samples():
    df = sweep.run_sweep(gpu_spec(models=("small_cnn",), batches=(64,), precisions=("amp-bf16",),
                                  gpus=(1, 2)))
    assert (df["status"] == "ok").all(), df["error"].tolist()
    two = df[df["gpus"] == 2].iloc[0]
    assert len(json.loads(two["per_rank"])) == 2
    assert two["samples_per_s"] == pytest.approx(2 * 64 / (two["step_ms_median"] / 1e3))


def test_hw_decode_is_an_input_like_gpu_decode_where_it_can_run(monkeypatch):
    """Where hw-decode can run (here pretended), the input axis keeps its reader threads and
    drops the dataloader-only settings, as for gpu-decode; 0 reader threads are refused."""
    from fp16lab import inputs
    from fp16lab.sweep.axes import check_input_axis

    monkeypatch.setattr(inputs, "unavailable_reason", lambda backend, device: None)
    kw = dict(model="small_cnn", device="cuda", images_dir="imgs", pin_memory=False,
              non_blocking=None, normalize_on="gpu")
    for backend in ("gpu-decode", "hw-decode"):
        kept = check_input_axis(backend, num_workers=3, **kw)
        assert kept == dict(num_workers=3, pin_memory=None, non_blocking=None,
                            normalize_on=None, images_dir="imgs"), backend
        with pytest.raises(ValueError, match=">= 1"):
            check_input_axis(backend, num_workers=0, **kw)
