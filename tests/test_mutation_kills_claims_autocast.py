"""Claim 7's experiment (what allow_tf32 changes) run at its CPU size, each figure against a
value computed here another way: TF32 rounding by frexp and round-half-even, bf16 through
ml_dtypes, the matmul errors from the same seeded matrices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fp16lab.claims import autocast as A
from fp16lab.claims import core


def _tf32_by_frexp(x: np.ndarray) -> np.ndarray:
    """Rounds fp32 to 11 significant bits (TF32's 10 stored + the implicit one), ties to even."""
    m, e = np.frexp(x.astype(np.float64))  # x = m * 2^e, 0.5 <= |m| < 1
    return np.ldexp(np.round(m * 2.0**11) / 2.0**11, e).astype(np.float32)


def test_tf32_rounding_against_frexp():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(4096).astype(np.float32),
                        # exact ties: 1 + k/2^11 + 1/2^12, half-way between two TF32 values
                        (1 + np.arange(16) / 2.0**10 + 2.0**-11).astype(np.float32),
                        np.float32([0.0, -3.0, 65504.0, 1e-3])])
    got = A._round_to_tf32(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got, _tf32_by_frexp(x))
    assert got.dtype == np.float32 and not np.array_equal(got, x)


@pytest.fixture
def figures(monkeypatch):
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", True)
    return A.experiment_allow_tf32(quick=True)


def test_the_experiments_figures_on_a_cpu(figures):
    import ml_dtypes
    f = figures
    assert f["device"] == "cpu"
    m = torch.backends.cuda.matmul
    assert f["settings_present"] == ["allow_tf32"] + [
        s for s in A.MATMUL_SETTINGS if s != "allow_tf32" and hasattr(m, s)]
    assert f["grad_dtype_flag_off"] == f["grad_dtype_flag_on"] == "torch.float32"
    # the matrices: seed 0, 64 x 64 on a CPU
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ref = a.numpy().astype(np.float64) @ b.numpy().astype(np.float64)

    def err(c: np.ndarray) -> float:
        return float(np.linalg.norm(c - ref) / np.linalg.norm(ref))
    fp32 = err((a @ b).numpy().astype(np.float64))
    assert f["fp32_matmul_err_flag_off"] == pytest.approx(fp32, rel=1e-9)
    assert f["fp32_matmul_err_flag_on"] == pytest.approx(fp32, rel=1e-9)  # no TF32 on a CPU
    tf32 = err(_tf32_by_frexp(a.numpy()).astype(np.float64)
               @ _tf32_by_frexp(b.numpy()).astype(np.float64))
    bf16 = err(a.numpy().astype(ml_dtypes.bfloat16).astype(np.float64)
               @ b.numpy().astype(ml_dtypes.bfloat16).astype(np.float64))
    assert f["tf32_emulated_err"] == pytest.approx(tf32, rel=1e-9)
    assert f["bf16_emulated_err"] == pytest.approx(bf16, rel=1e-9)
    assert fp32 < 1e-6 < tf32 < bf16 < 1e-2  # each rounding coarser than the one before
    assert f["bf16_matmul_unchanged_by_flag"] is True
    assert "bf16_matmul_flag_on" not in f and "bf16_matmul_flag_off" not in f


def test_without_a_gpu_and_not_exercised_no_matmul_is_timed(monkeypatch):
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", False)
    f = A.experiment_allow_tf32(quick=True)
    assert not any(k.endswith("_err") for k in f) and "bf16_matmul_unchanged_by_flag" not in f


def test_autocast_disabled_region_dtypes_as_torch_gives_them():
    """Claim 8 on a CPU: inside autocast(enabled=False) a Linear fed the 16-bit activations of
    the autocast region around it fails against its fp32 weights, a softmax keeps their dtype,
    and .float() inputs give fp32 both ways. Each expected value is torch run here, op by op."""
    f = A.experiment_autocast_disable(quick=True)
    dtype = torch.float16 if _cpu_autocast_takes(torch.float16) else torch.bfloat16
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=dtype):
        h = lin1(x)
    with pytest.raises(RuntimeError) as e:
        lin2(h)
    want_error = f"error: RuntimeError: {str(e.value).splitlines()[0][:160]}"
    assert f == {"device": "cpu", "autocast_dtype": str(dtype), "outer_linear": str(dtype),
                 "linear_uncast": want_error, "linear_cast": "torch.float32",
                 "softmax_uncast": str(dtype), "softmax_cast": "torch.float32"}


def _cpu_autocast_takes(dtype) -> bool:
    """Whether autocast on the CPU runs a Linear in ``dtype`` (without a warning turning it off)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            with torch.autocast("cpu", dtype=dtype):
                return torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == dtype
        except (RuntimeError, UserWarning):
            return False


def test_amp_ratio_figures_on_a_cpu(monkeypatch):
    """Claim 10 at its CPU size: the knobs are torch's own signatures (none named a ratio); each
    layer's dtype is what a hook of ours sees under autocast; the three byte counts are
    saved_activation_bytes' for the three set-ups, each in its place."""
    import inspect

    from fp16lab.claims.core import saved_activation_bytes
    from fp16lab.models import build_model, input_shape
    monkeypatch.setattr(core, "EXERCISE_ON_CPU", True)
    f = A.experiment_amp_ratio(quick=True)
    knobs = {"torch.autocast": list(inspect.signature(torch.autocast).parameters),
             "torch.amp.GradScaler": list(inspect.signature(torch.amp.GradScaler).parameters)}
    assert f["knobs"] == knobs and f["ratio_knobs"] == []
    dtype = torch.float16 if _cpu_autocast_takes(torch.float16) else torch.bfloat16
    assert (f["device"], f["batch"], f["autocast_dtype"]) == ("cpu", 2, str(dtype))
    torch.manual_seed(0)
    model = build_model("transformer_block")
    x = torch.randn(input_shape("transformer_block", 2))
    seen = {}
    leaves = [m for n, m in model.named_modules() if n and not list(m.children())]
    def note(mod, _inputs, out):  # returns None: the output is left alone
        seen.setdefault(type(mod).__name__, str((out[0] if isinstance(out, tuple) else out).dtype))
    hooks = [m.register_forward_hook(note) for m in leaves]
    with torch.autocast("cpu", dtype=dtype):
        model(x)
    for h in hooks:
        h.remove()
    assert f["layer_dtypes"] == seen and seen["Linear"] == str(dtype)
    full = saved_activation_bytes(model, x, autocast_dtype=dtype)
    fp32 = saved_activation_bytes(model, x)
    assert (f["saved_bytes_autocast"], f["saved_bytes_fp32"]) == (full, fp32)
    block = model.block
    block.linear1, block.linear2 = A._fp32_region(block.linear1), A._fp32_region(block.linear2)
    partial = saved_activation_bytes(model, x, autocast_dtype=dtype)
    assert f["saved_bytes_ffn_fp32"] == partial
    # three different counts (at batch 2 autocast's 16-bit weight copies outweigh what its
    # smaller activations save, so no order is asserted here)
    assert len({full, fp32, partial}) == 3
