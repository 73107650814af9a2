"""fp16lab.sweep.point: what a point refuses (and which axis it blames), the columns it records,
its key (hashed here by hand from the columns an older results file holds) and its label."""

from __future__ import annotations

import hashlib
import json

import pytest
from torch import nn

from fp16lab.models import MODELS
from fp16lab.scaling import ScalerSettings
from fp16lab.sweep import point as pt
from fp16lab.sweep.point import Point, PointError, check_batches, check_names, resolve_model, unique
from fp16lab.workload import Workload
from fp16lab.workloads.batches import synthetic_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SCALER_NONE = {"init_scale": None, "growth_factor": None, "backoff_factor": None,
               "growth_interval": None}


def tiny(**kw) -> Workload:
    kw.setdefault("name", "w")
    return Workload(build=lambda: nn.Linear(4, 3), batch=synthetic_batch((4,), 3), **kw)


def blamed(axis, words, **kw):
    with pytest.raises(PointError, match=words) as e:
        Point(**kw)
    assert e.value.axis == axis and isinstance(e.value, ValueError)


def test_unique_keeps_the_first_of_each_in_order():
    assert unique([3, 1, 3, 2, 1]) == (3, 1, 2)
    assert unique([[1], [2], [1]]) == ([1], [2])  # unhashable values too
    assert unique([]) == ()


def test_check_names_lists_what_is_allowed():
    check_names("model", ["a"], iter(["a", "b"]))  # an iterator of allowed names is read once
    with pytest.raises(ValueError, match="^the sweep needs at least one model; allowed: a, b$"):
        check_names("model", [], ("a", "b"))
    with pytest.raises(ValueError, match="^unknown layout 'x', 'y'; allowed: a, b$"):
        check_names("layout", ["a", "x", "y"], ("a", "b"))


def test_check_batches():
    check_batches([1, 64])
    with pytest.raises(ValueError, match=r"^the sweep needs at least one batch size \(a positive "
                       r"integer\)$"):
        check_batches([])
    with pytest.raises(ValueError, match="^batch sizes must be positive integers, got True, 1.5, 0, -2$"):
        check_batches([2, True, 1.5, 0, -2])


def test_resolve_model(tmp_path, monkeypatch):
    w = tiny()
    assert resolve_model(w) == ("w", w)
    assert resolve_model("mlp") == ("mlp", None)
    with pytest.raises(TypeError, match="^a sweep model must be a model name, a workload name or "
                       "a Workload, got int$"):
        resolve_model(3)
    (tmp_path / "kills_point_mod.py").write_text(
        "from torch import nn\nfrom fp16lab.workload import Workload\n"
        "from fp16lab.workloads.batches import synthetic_batch\n"
        "def make():\n    return Workload(name='made', build=lambda: nn.Linear(2, 2), "
        "batch=synthetic_batch((2,), 2))\n"
        "def boom():\n    raise OSError('no disk')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    name, loaded = resolve_model("kills_point_mod:make")
    assert name == "kills_point_mod:make" and loaded.name == "made"
    with pytest.raises(ValueError, match="^model 'kills_point_mod:boom': workload .* raised OSError"):
        resolve_model("kills_point_mod:boom")
    with pytest.raises(ValueError, match="^model 'kills_point_mod:nothing': workload .* has no"):
        resolve_model("kills_point_mod:nothing")
    with pytest.raises(ValueError, match=rf"^unknown model 'nope': not one of {', '.join(MODELS)}, "
                       "and workload 'nope' is neither"):
        resolve_model("nope")


def test_blame_and_refuse():
    assert pt._blame("gpus", lambda a, b=0: a + b, 1, b=2) == 3
    with pytest.raises(PointError, match="^bad$") as e:
        pt._blame("inputs", pt.refuse, "bad")
    assert e.value.axis == "inputs"
    with pytest.raises(TypeError):  # only a ValueError is turned into a blame
        pt._blame("inputs", lambda: 1 + "a")


# ----------------------------------------------------------------------------- built-in models

def test_what_a_built_in_point_refuses_and_blames():
    blamed("layouts", r"^layout 'channels_last' applies to image models only; 'mlp' takes no NCHW "
           r"input \(use 'nchw'\)$", model="mlp", batch=2, layout="channels_last")
    Point(model="small_cnn", batch=2, layout="channels_last")
    with pytest.raises(ValueError, match="^a point's device must be 'cpu' or 'cuda', got 'tpu'$"):
        Point(model="mlp", batch=2, device="tpu")
    blamed("precisions", "'small_cnn' is an image model", model="small_cnn", batch=2,
           precision="fp8-tensorwise")
    assert Point(model="mlp", batch=2, precision="fp8-tensorwise").precision == "fp8-tensorwise"
    blamed("executions", "runs with execution 'eager' only", model="mlp", batch=2,
           precision="fp8-tensorwise", execution="compile")
    blamed("inputs", "reads image files; 'mlp' takes no images", model="mlp", batch=2,
           input="dataloader")
    blamed("gpus", "^gpus=2 needs 2 CUDA GPUs", model="mlp", batch=2, gpus=2)
    with pytest.raises(ValueError, match="unknown model 'x'"):
        Point(model="x", batch=2)
    with pytest.raises(ValueError, match="unknown layout 'nhwc'"):
        Point(model="mlp", batch=2, layout="nhwc")
    with pytest.raises(ValueError, match="unknown precision 'fp12'"):
        Point(model="mlp", batch=2, precision="fp12")
    with pytest.raises(ValueError, match="batch sizes must be positive integers, got 0"):
        Point(model="mlp", batch=0)


def test_a_scaler_only_where_the_precision_scales():
    s = ScalerSettings(init_scale=8.0)
    assert Point(model="mlp", batch=2, precision="amp-fp16").scaler == ScalerSettings()
    assert Point(model="mlp", batch=2, precision="fp16-o2", scaler=s).scaler == s
    assert Point(model="mlp", batch=2, precision="amp-bf16", scaler=s).scaler is None
    assert Point(model="mlp", batch=2, precision="fp32", scaler=s).scaler is None


def test_compile_gets_its_default_mode_and_eager_none():
    assert Point(model="mlp", batch=2, execution="compile").compile_mode == "default"
    assert Point(model="mlp", batch=2, execution="compile",
                 compile_mode="max-autotune-no-cudagraphs").compile_mode == "max-autotune-no-cudagraphs"
    assert Point(model="mlp", batch=2, compile_mode="max-autotune-no-cudagraphs").compile_mode is None


def test_file_inputs_keep_their_settings(tmp_path):
    p = Point(model="small_cnn", batch=2, input="dataloader", images_dir=tmp_path, num_workers=0)
    assert (p.num_workers, p.pin_memory, p.non_blocking, p.normalize_on, p.images_dir) == \
        (0, True, True, "cpu", str(tmp_path))
    r = Point(model="small_cnn", batch=2, input="dataloader", images_dir=tmp_path, num_workers=2,
              pin_memory=False, non_blocking=False, normalize_on="gpu")
    assert (r.num_workers, r.pin_memory, r.non_blocking, r.normalize_on) == (2, False, False, "gpu")
    q = Point(model="small_cnn", batch=2, num_workers=3, pin_memory=False)
    assert (q.num_workers, q.pin_memory, q.images_dir) == (None, None, None)  # synthetic: unused


# ----------------------------------------------------------------------------- workload points

def test_what_a_workload_point_refuses_and_blames():
    w = tiny(precisions=("fp32", "amp-bf16"))
    assert Point(model="w", batch=2, workload=w, layout="channels_last").layout == "channels_last"
    blamed("precisions", r"^workload 'w' runs fp32, amp-bf16, not 'amp-fp16'$", model="w",
           batch=2, workload=w, precision="amp-fp16")
    Point(model="w", batch=2, workload=w, precision="amp-bf16")
    # a workload takes cuda-graph as a built-in model does: on a GPU (the capture is tested there)
    blamed("executions", r"^execution 'cuda-graph' needs a CUDA device; on a CPU use 'eager' or "
           r"'compile'$", model="w", batch=2, workload=tiny(), execution="cuda-graph")
    blamed("executions", "runs with execution 'eager' only", model="w", batch=2, workload=tiny(),
           precision="fp8-rowwise", execution="compile")
    blamed("inputs", r"^workload 'w' makes its own batches; input 'dataloader' feeds the built-in "
           r"image models only$", model="w", batch=2, workload=tiny(), input="dataloader")
    blamed("gpus", r"^workload 'w': the sweep runs a workload on one GPU \(gpus 1\)$", model="w",
           batch=2, workload=tiny(), gpus=2)
    with pytest.raises(TypeError, match="^cudnn_benchmark must be True or False, got 'yes' \\(str\\)$"):
        Point(model="w", batch=2, workload=tiny(), cudnn_benchmark="yes")
    with pytest.raises(TypeError, match="got 1 \\(int\\)"):  # 1 == True, but it is no flag
        Point(model="w", batch=2, workload=tiny(), cudnn_benchmark=1)
    Point(model="w", batch=2, workload=tiny(), cudnn_benchmark=True)
    with pytest.raises(TypeError, match="^a point's workload must be a Workload, got str$"):
        Point(model="w", batch=2, workload="w")
    with pytest.raises(ValueError, match="^a point's device must be 'cpu' or 'cuda', got 'xpu'$"):
        Point(model="w", batch=2, workload=tiny(), device="xpu")
    for bad, words in [({"layout": "nhwc"}, "unknown layout"), ({"precision": "fp12"}, "unknown precision"),
                       ({"batch": 0}, "batch sizes must be positive")]:
        with pytest.raises(ValueError, match=words):
            Point(**{"model": "w", "batch": 2, "workload": tiny(), **bad})
    # a workload's name need not be a built-in model's
    assert Point(model="any-name", batch=2, workload=tiny()).model == "any-name"


def test_a_workload_points_scaler_and_compile_mode():
    s = ScalerSettings(init_scale=4.0)
    assert Point(model="w", batch=2, workload=tiny(), precision="amp-fp16").scaler == ScalerSettings()
    assert Point(model="w", batch=2, workload=tiny(), precision="amp-fp16", scaler=s).scaler == s
    assert Point(model="w", batch=2, workload=tiny(), precision="amp-bf16", scaler=s).scaler is None
    assert Point(model="w", batch=2, workload=tiny(), execution="compile").compile_mode == "default"
    assert Point(model="w", batch=2, workload=tiny(), compile_mode="x").compile_mode is None
    assert Point(model="w", batch=2, workload=tiny(), execution="compile",
                 compile_mode="max-autotune-no-cudagraphs").compile_mode == "max-autotune-no-cudagraphs"
    assert Point(model="w", batch=2, workload=tiny(), device="cuda").device == "cuda"


# ----------------------------------------------------------------------------- columns, key, label

def test_settings_are_the_flat_columns_as_typed():
    p = Point(model="mlp", batch=8, precision="amp-fp16",
              scaler=ScalerSettings(init_scale=1024, growth_interval=50))
    s = p.settings()
    assert s == {"model": "mlp", "batch": 8, "layout": "nchw", "precision": "amp-fp16",
                 "init_scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                 "growth_interval": 50, "cudnn_benchmark": False, "device": "cpu",
                 "execution": "eager", "compile_mode": None, "input": "synthetic",
                 "num_workers": None, "pin_memory": None, "non_blocking": None,
                 "normalize_on": None, "gpus": 1, "images_dir": None}
    assert type(s["init_scale"]) is float and type(s["growth_interval"]) is int
    assert list(s)[:4] == ["model", "batch", "layout", "precision"]
    fp32 = Point(model="mlp", batch=8, cudnn_benchmark=1).settings()
    assert {k: fp32[k] for k in SCALER_NONE} == SCALER_NONE and fp32["cudnn_benchmark"] is True


def _hand_key(columns: dict) -> str:
    return hashlib.sha1(json.dumps(columns, sort_keys=True).encode()).hexdigest()[:16]


def test_the_key_hashes_the_columns_an_older_file_had():
    base = {"model": "mlp", "batch": 8, "layout": "nchw", "precision": "fp32", **SCALER_NONE,
            "cudnn_benchmark": False, "device": "cpu"}
    assert Point(model="mlp", batch=8).key == _hand_key(base)
    assert len(Point(model="mlp", batch=8).key) == 16
    compiled = Point(model="mlp", batch=8, execution="compile")
    assert compiled.key == _hand_key({**base, "execution": "compile", "compile_mode": "default"})
    scaled = Point(model="mlp", batch=8, precision="amp-fp16")
    assert scaled.key == _hand_key({**base, "precision": "amp-fp16", "init_scale": 65536.0,
                                    "growth_factor": 2.0, "backoff_factor": 0.5,
                                    "growth_interval": 2000})
    w = tiny(settings={"width": 3})
    assert Point(model="w", batch=8, workload=w).key == \
        _hand_key({**base, "model": "w", "workload_settings": {"width": 3}})
    assert Point(model="w", batch=8, workload=tiny()).key == _hand_key({**base, "model": "w"})


def test_the_key_leaves_out_the_image_folder(tmp_path):
    a = Point(model="small_cnn", batch=2, input="dataloader", images_dir=tmp_path / "a", num_workers=1)
    b = Point(model="small_cnn", batch=2, input="dataloader", images_dir=tmp_path / "b", num_workers=1)
    assert a.key == b.key
    assert a.key == _hand_key({"model": "small_cnn", "batch": 2, "layout": "nchw", "precision": "fp32",
                               **SCALER_NONE, "cudnn_benchmark": False, "device": "cpu",
                               "input": "dataloader", "num_workers": 1, "pin_memory": True,
                               "non_blocking": True, "normalize_on": "cpu"})


def test_labels():
    assert Point(model="mlp", batch=8).label() == "mlp b8 nchw fp32"
    assert Point(model="mlp", batch=8).variant() == ""
    assert Point(model="small_cnn", batch=4, layout="channels_last", precision="amp-fp16",
                 scaler=ScalerSettings(init_scale=1024)).label() == \
        "small_cnn b4 channels_last amp-fp16 scale0=1024"
    p = Point(model="mlp", batch=8, execution="compile")
    assert p.variant() == "compile(default)" and p.label() == "mlp b8 nchw fp32 compile(default)"
