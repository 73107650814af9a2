"""Claims about which dtype runs where: allow_tf32 (claim 7), autocast(enabled=False) (8), an "AMP ratio" (10)."""

from __future__ import annotations

import inspect
import math
from typing import Any

from .. import validate
from ..models import build_model, input_shape
from ..recipes import tf32 as _tf32, tf32_state
from . import core
from .core import (FAILS, HOLDS, NONEXISTENT, PARTLY, Claim, Figures, Judgement,
                   saved_activation_bytes, _autocast_dtype, _device, _outcome, _sizes,
                   _torch)


# --------------------------------------------------------------------------------------------
# Claim 7: allow_tf32 turns on bf16 gradient accumulation
# --------------------------------------------------------------------------------------------

#: torch.backends.cuda.matmul settings documented in torch's "CUDA semantics" notes.
MATMUL_SETTINGS = ("allow_tf32", "fp32_precision", "allow_fp16_reduced_precision_reduction",
                   "allow_bf16_reduced_precision_reduction", "allow_fp16_accumulation")


def _round_to_tf32(x):
    """Returns fp32 ``x`` rounded to TF32 (10 stored mantissa bits), round to nearest even."""
    import numpy as np

    bits = x.detach().cpu().numpy().astype(np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 13) & 1
    bits = ((bits + 0x0FFF + lsb) & ~np.uint64(0x1FFF)).astype(np.uint32)
    return _torch().from_numpy(bits.view(np.float32)).to(x.device)


def experiment_allow_tf32(quick: bool = True) -> Figures:
    """Returns what ``allow_tf32`` changes: fp32 matmul precision, gradient dtype, matmul error."""
    validate.boolean("quick", quick)
    torch = _torch()
    dev = _device()
    m = torch.backends.cuda.matmul
    # allow_tf32 is in every torch since 1.7; probing it would make torch >= 2.9 warn
    out: Figures = {"device": dev, "settings_present": ["allow_tf32"] + [
        s for s in MATMUL_SETTINGS if s != "allow_tf32" and _has(m, s)]}
    conv = tf32_state()["conv"]
    with _tf32(False, conv):
        out["precision_flag_off"] = _matmul_precision()
    with _tf32(True, conv):
        out["precision_flag_on"] = _matmul_precision()
    for flag in (False, True):
        with _tf32(flag, conv):
            torch.manual_seed(0)
            lin = torch.nn.Linear(8, 8).to(dev)
            with torch.autocast(dev, dtype=torch.bfloat16):
                lin(torch.randn(4, 8, device=dev)).float().sum().backward()
            out[f"grad_dtype_flag_{'on' if flag else 'off'}"] = str(lin.weight.grad.dtype)
    if dev == "cuda" or core.EXERCISE_ON_CPU:
        n = _sizes(quick, 2048, 512, 64)
        torch.manual_seed(0)
        a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
        ref = a.double() @ b.double()

        def err(c) -> float:
            return float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref))

        for flag in (False, True):
            with _tf32(flag, True):
                out[f"fp32_matmul_err_flag_{'on' if flag else 'off'}"] = err(a @ b)
                out[f"bf16_matmul_flag_{'on' if flag else 'off'}"] = a.bfloat16() @ b.bfloat16()
        out["bf16_matmul_unchanged_by_flag"] = bool(torch.equal(out.pop("bf16_matmul_flag_on"),
                                                                out.pop("bf16_matmul_flag_off")))
        out["tf32_emulated_err"] = err(_round_to_tf32(a).double() @ _round_to_tf32(b).double())
        out["bf16_emulated_err"] = err(a.bfloat16().double() @ b.bfloat16().double())
    return out


def _matmul_precision() -> str:
    """Returns the fp32 matmul precision the TF32 switch sets: 'tf32' or 'ieee' (torch >= 2.9's
    per-backend setting), 'high' or 'highest' in older torch."""
    torch = _torch()
    m = torch.backends.cuda.matmul
    return m.fp32_precision if _has(m, "fp32_precision") else torch.get_float32_matmul_precision()


def precision_spelling(figures: Figures) -> str:
    """Returns which torch API a claim-7 run read its fp32 matmul precision from, judged by the
    values it recorded: 'ieee'/'tf32' come from ``torch.backends.cuda.matmul.fp32_precision``,
    'highest'/'high'/'medium' from ``torch.get_float32_matmul_precision()``."""
    values = {figures.get("precision_flag_off"), figures.get("precision_flag_on")}
    if values <= {"ieee", "tf32"}:
        return "torch.backends.cuda.matmul.fp32_precision"
    if values <= {"highest", "high", "medium"}:
        return "torch.get_float32_matmul_precision()"
    return "an API this notebook does not know"


def _has(obj: Any, name: str) -> bool:
    try:
        getattr(obj, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def judge_allow_tf32(f: Figures) -> Judgement:
    """Rules on claim 7 from the gradient dtype and the fp32 matmul precision the flag sets."""
    governs = (f"allow_tf32 sets fp32 matmul precision '{f['precision_flag_off']}' -> "
               f"'{f['precision_flag_on']}' (TF32); gradients stay {f['grad_dtype_flag_on']} "
               f"with it on")
    if "fp32_matmul_err_flag_on" in f:
        e, t, b = (max(f[k], 1e-300) for k in ("fp32_matmul_err_flag_on", "tf32_emulated_err",
                                                "bf16_emulated_err"))
        like = "TF32" if abs(math.log(e / t)) < abs(math.log(e / b)) else "bf16"
        governs += (f"; fp32 matmul error with it on {e:.1e} matches {like} rounding (TF32 "
                    f"{t:.1e}, bf16 {b:.1e}; off {f['fp32_matmul_err_flag_off']:.1e}); bf16 "
                    f"matmuls {'unchanged' if f['bf16_matmul_unchanged_by_flag'] else 'changed'}")
    real = [s for s in f["settings_present"] if "reduced_precision" in s or "accumulation" in s]
    if "bfloat16" in f["grad_dtype_flag_on"]:
        return HOLDS, governs
    return NONEXISTENT, (f"there is no bf16 gradient-accumulation switch: {governs}. Reduced-"
                         f"precision GEMM reductions are set by {', '.join(real) or 'nothing'}")


# --------------------------------------------------------------------------------------------
# Claim 8: autocast(enabled=False) inside fp16 autocast keeps a layer in fp32
# --------------------------------------------------------------------------------------------

def experiment_autocast_disable(quick: bool = True) -> Figures:
    """Returns the dtypes (or errors) of a Linear and a softmax run inside autocast(enabled=False),
    with fp16 inputs and with inputs cast to float32."""
    validate.boolean("quick", quick)
    torch = _torch()
    dev = _device()
    dtype = _autocast_dtype(dev)
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(16, 16).to(dev), torch.nn.Linear(16, 16).to(dev)
    x = torch.randn(4, 16, device=dev)
    with torch.autocast(dev, dtype=dtype):
        h = lin1(x)
        with torch.autocast(dev, enabled=False):
            out = {"linear_uncast": _outcome(lambda: lin2(h)),
                   "linear_cast": _outcome(lambda: lin2(h.float())),
                   "softmax_uncast": _outcome(lambda: torch.softmax(h, -1)),
                   "softmax_cast": _outcome(lambda: torch.softmax(h.float(), -1))}
    return {"device": dev, "autocast_dtype": str(dtype), "outer_linear": str(h.dtype), **out}


def judge_autocast_disable(f: Figures) -> Judgement:
    """Rules on claim 8 from the dtypes inside the disabled region, with and without a cast."""
    fp32 = "torch.float32"
    facts = (f"inside autocast(enabled=False) with {f['outer_linear']} inputs: Linear -> "
             f"{f['linear_uncast']}, softmax -> {f['softmax_uncast']}; with .float() inputs: "
             f"Linear -> {f['linear_cast']}, softmax -> {f['softmax_cast']}")
    if f["linear_uncast"] == fp32 and f["softmax_uncast"] == fp32:
        return HOLDS, facts
    if f["linear_cast"] == fp32 and f["softmax_cast"] == fp32:
        return PARTLY, f"only when the inputs are cast to float32. {facts}"
    return FAILS, facts


# --------------------------------------------------------------------------------------------
# Claim 10: lower the "AMP ratio" to save memory
# --------------------------------------------------------------------------------------------

def _fp32_region(module):
    """Returns ``module`` wrapped so that it runs outside autocast, on float32 inputs."""
    torch = _torch()

    class Fp32Region(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        @property
        def weight(self):
            return self.inner.weight

        @property
        def bias(self):
            return self.inner.bias

        def forward(self, x):
            with torch.autocast(x.device.type, enabled=False):
                return self.inner(x.float())

    return Fp32Region(module)


def experiment_amp_ratio(quick: bool = True) -> Figures:
    """Returns autocast's and GradScaler's parameters, the dtype each layer runs in under
    autocast, and saved-activation bytes with autocast everywhere, with the FFN kept in fp32,
    and in fp32."""
    validate.boolean("quick", quick)
    torch = _torch()
    dev = _device()
    dtype = _autocast_dtype(dev)
    knobs = {"torch.autocast": list(inspect.signature(torch.autocast).parameters),
             "torch.amp.GradScaler": list(inspect.signature(torch.amp.GradScaler).parameters)}
    torch.manual_seed(0)
    model = build_model("transformer_block").to(dev)
    batch = _sizes(quick, 64, 16, 2)
    x = torch.randn(input_shape("transformer_block", batch), device=dev)
    layer_dtypes: dict[str, str] = {}

    def record(mod, _inputs, out) -> None:  # returns None so the output is left alone
        t = out[0] if isinstance(out, tuple) else out
        layer_dtypes.setdefault(type(mod).__name__, str(t.dtype))

    hooks = [m.register_forward_hook(record)
             for name, m in model.named_modules() if name and not list(m.children())]
    with torch.autocast(dev, dtype=dtype):
        model(x)
    for h in hooks:
        h.remove()
    full = saved_activation_bytes(model, x, autocast_dtype=dtype)
    fp32 = saved_activation_bytes(model, x)
    block = model.block
    block.linear1, block.linear2 = _fp32_region(block.linear1), _fp32_region(block.linear2)
    partial = saved_activation_bytes(model, x, autocast_dtype=dtype)
    return {"device": dev, "batch": batch, "autocast_dtype": str(dtype), "knobs": knobs,
            "ratio_knobs": [f"{k}({p})" for k, ps in knobs.items() for p in ps if "ratio" in p],
            "layer_dtypes": layer_dtypes, "saved_bytes_autocast": full,
            "saved_bytes_ffn_fp32": partial, "saved_bytes_fp32": fp32}


def judge_amp_ratio(f: Figures) -> Judgement:
    """Rules on claim 10 from the autocast/GradScaler parameters and saved-activation bytes."""
    mib = 2**20
    # files recorded before the batch was a figure lack it (the GPU run's batch was 64)
    at = f" (a transformer block at batch {f['batch']})" if "batch" in f else ""
    low = sorted(k for k, v in f["layer_dtypes"].items() if "float32" not in v)
    high = sorted(k for k, v in f["layer_dtypes"].items() if "float32" in v)
    facts = (f"autocast casts per op (each layer's output: {', '.join(low)} -> "
             f"{f['autocast_dtype']}; {', '.join(high)} -> float32; an op on none of its lists "
             f"keeps its input's dtype); what you choose is the region. Saved "
             f"activations{at}: autocast everywhere {f['saved_bytes_autocast'] / mib:.2f} MiB, "
             f"the feed-forward layers kept in fp32 {f['saved_bytes_ffn_fp32'] / mib:.2f} MiB, "
             f"fp32 {f['saved_bytes_fp32'] / mib:.2f} MiB: less fp16 work uses "
             f"{'more' if f['saved_bytes_ffn_fp32'] > f['saved_bytes_autocast'] else 'less'} "
             f"activation memory")
    if not f["ratio_knobs"]:
        params = "; ".join(f"{k}({', '.join(v)})" for k, v in f["knobs"].items())
        return NONEXISTENT, f"no 'AMP ratio' in {params}. {facts}"
    saves = f["saved_bytes_ffn_fp32"] < f["saved_bytes_autocast"]
    return (HOLDS if saves else FAILS), facts


CLAIM_7 = Claim(
    7, "allow_tf32 = bf16 grad accum",
    "torch.backends.cuda.matmul.allow_tf32 = True turns on bf16 gradient accumulation.",
    "Gradients under bf16 autocast with the flag on: bf16 holds; otherwise the switch does "
    "not exist (shown: what the flag sets, and on a GPU whether its error matches TF32 or "
    "bf16 rounding).",
    experiment_allow_tf32, judge_allow_tf32,
    origin=("an RTX 3090 FP16 tuning recipe that lists the TF32 switch among its FP16 "
            "settings"))


CLAIM_8 = Claim(
    8, "autocast(enabled=False) = fp32",
    "Nesting autocast(enabled=False) inside an FP16 autocast region keeps a sensitive "
    "layer in FP32.",
    "Linear and softmax on autocast outputs inside the disabled region: float32 without a "
    "cast: holds; only with .float() inputs: holds in part; never: does not hold.",
    experiment_autocast_disable, judge_autocast_disable,
    origin=("a practical FP16 guide whose NaN-debugging advice keeps sensitive layers in an "
            "fp32 whitelist with nested autocast"))


CLAIM_10 = Claim(
    10, "lower the 'AMP ratio'",
    "Under memory pressure, lower the share of FP16 work (an \"AMP ratio\") to save memory.",
    "No ratio parameter on autocast or GradScaler: names something that does not exist "
    "(shown: per-op dtypes and saved activations for narrower regions); else holds if a "
    "narrower fp16 region saves memory.",
    experiment_amp_ratio, judge_amp_ratio,
    origin=("a write-up of AMP on two large GPUs, which adjusts a dynamic 'FP16 ratio' under "
            "memory pressure"))
