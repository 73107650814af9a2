"""Popular mixed-precision rules of thumb, each turned into an experiment and a computed verdict.

Every :class:`Claim` carries the claim as it circulates, the experiment that tests it, and the
verdict rule in one sentence. :func:`check` runs the experiment on this machine (or, for a claim
that needs a GPU when there is none, loads the figures recorded on a GPU from ``data/``) and
applies the rule, a pure function of the measured figures, so the verdict is computed, never
typed in. The verdicts are:

- ``holds``: the measurement agrees with the claim;
- ``holds in part``: it agrees only under a condition the reason names;
- ``does not hold``: the measurement contradicts it;
- ``cannot be tested here``: no GPU and no recorded GPU result (or a tool was missing);
- ``names something that does not exist``: the setting or knob the claim relies on is not
  there; the reason says what really governs the effect.

``fp16lab claims`` runs all twelve headless and writes ``claims_<device>.md`` and
``claims_<device>.json`` (figures, verdicts and provenance).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import math
import re
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

HOLDS = "holds"
PARTLY = "holds in part"
FAILS = "does not hold"
UNTESTABLE = "cannot be tested here"
NONEXISTENT = "names something that does not exist"
#: The verdicts a claim can get.
VERDICTS = (HOLDS, PARTLY, FAILS, UNTESTABLE, NONEXISTENT)

#: The recorded GPU run that machines without a GPU show for the GPU-only claims.
RECORDED_GPU_RESULT = "claims_h200"

Figures = dict[str, Any]
Judgement = tuple[str, str]


@dataclass(frozen=True)
class Claim:
    """One claim: what it says, how it is tested, the rule, and (once checked) the outcome.

    Attributes:
        id: the claim's number (1-12, as in notebook 05).
        short: a few words for the table.
        text: the claim as it commonly circulates.
        rule: the verdict rule, in one sentence.
        experiment: ``experiment(quick) -> figures``, run on this machine.
        judge: ``judge(figures) -> (verdict, reason)``, a pure function of the figures.
        needs_gpu: True when the experiment means nothing without a CUDA GPU.
        figures: the measured figures (empty until checked).
        verdict: one of ``VERDICTS`` (None until checked).
        reason: the measured figures that decided the verdict, in words.
        source: where the figures were measured (here, or recorded on which GPU).
    """

    id: int
    short: str
    text: str
    rule: str
    experiment: Callable[[bool], Figures] = field(repr=False)
    judge: Callable[[Figures], Judgement] = field(repr=False)
    needs_gpu: bool = False
    figures: Figures = field(default_factory=dict)
    verdict: str | None = None
    reason: str = ""
    source: str = ""

    def report(self) -> str:
        """Returns the claim, its key figures, the rule and the verdict as a few lines of text."""
        lines = [f"Claim {self.id}: {self.text}", f"rule: {self.rule}"]
        if self.figures:
            lines.append("figures: " + _brief(self.figures))
        lines.append(f"verdict: {(self.verdict or 'not checked').upper()}: {self.reason}")
        if self.source:
            lines.append(f"source: {self.source}")
        return "\n".join(lines)

    def as_row(self) -> dict[str, Any]:
        """Returns the claim and its outcome as a JSON-friendly dict (a row of the result file)."""
        return {"id": self.id, "short": self.short, "text": self.text, "rule": self.rule,
                "needs_gpu": self.needs_gpu, "verdict": self.verdict, "reason": self.reason,
                "source": self.source, "figures": self.figures}


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------

def _torch():
    import torch
    return torch


#: When True, every experiment uses tiny sizes and runs its GPU code paths on the CPU too.
#: Only for exercising that code without a GPU (tests); the figures then mean nothing.
EXERCISE_ON_CPU = False


def _device() -> str:
    return "cuda" if _torch().cuda.is_available() else "cpu"


def _sizes(quick: bool, full: Any, small: Any, tiny: Any) -> Any:
    """Returns the size set for this run: full, quick, or tiny (when exercising on a CPU)."""
    return tiny if EXERCISE_ON_CPU else (small if quick else full)


def _timer(device: str) -> Callable[..., Any]:
    from .bench import time_cpu, time_cuda
    return time_cuda if device == "cuda" else time_cpu


def _brief(figures: Figures, limit: int = 600) -> str:
    """Returns the scalar figures as ``key=value`` pairs (lists and dicts are left to the file)."""
    parts = []
    for k, v in figures.items():
        if isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
        elif isinstance(v, (int, str, bool)) or v is None:
            parts.append(f"{k}={v}")
    s = ", ".join(parts)
    return s if len(s) <= limit else s[:limit] + " ..."


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.inf


def _outcome(fn: Callable[[], Any]) -> str:
    """Returns the dtype of ``fn()``'s result, or ``error: <type>: <message>`` if it raised."""
    try:
        return str(fn().dtype)
    except Exception as e:  # the point is to record what torch does, errors included
        msg = str(e).splitlines()[0] if str(e) else ""
        return f"error: {type(e).__name__}: {msg[:160]}"


@contextlib.contextmanager
def _tf32(matmul: bool, cudnn: bool) -> Iterator[None]:
    """Sets torch's TF32 switches for matmul and cuDNN inside the block, then restores them."""
    torch = _torch()
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _autocast_dtype(device: str):
    """Returns float16 where autocast supports it on ``device``, else bfloat16."""
    torch = _torch()
    try:
        with torch.autocast(device, dtype=torch.float16):
            y = torch.nn.functional.linear(torch.ones(1, 2, device=device),
                                           torch.ones(2, 2, device=device))
        return torch.float16 if y.dtype == torch.float16 else torch.bfloat16
    except Exception:
        return torch.bfloat16


def saved_activation_bytes(model, x, *, autocast_dtype=None) -> int:
    """Returns the bytes autograd saves for backward in one forward pass of ``model(x)``.

    Each storage is counted once, and the model's own parameters are left out (they exist
    whatever the precision); fp16/bf16 copies of weights made by autocast are counted, since
    they are extra memory. This is the activation memory a precision choice changes, measured
    the same way on a CPU and on a GPU.
    """
    torch = _torch()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    device = x.device.type
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(device, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            model(x)
    return sum(seen.values())


# --------------------------------------------------------------------------------------------
# training-step measurements shared by claims 2, 3, 4 and 5 (GPU)
# --------------------------------------------------------------------------------------------

def _cnn_name() -> str:
    """Returns the CNN the GPU claims train: ResNet-50 with torchvision, else the small CNN."""
    import importlib.util
    return "resnet50" if importlib.util.find_spec("torchvision") else "small_cnn"


@functools.lru_cache(maxsize=None)
def train_step_figures(model_name: str, precision: str, layout: str, batch: int, steps: int,
                       telemetry: bool = False) -> dict[str, Any]:
    """Returns samples/s, peak memory and NVML busy % of training steps, from the sweep engine.

    One point of :func:`fp16lab.sweep.measure_point` (cuDNN autotuning on), cached for the
    session so that claims sharing a configuration run it once. A point that fails (out of
    memory, or any error) raises, naming the point.

    Args:
        model_name: a name from :data:`fp16lab.models.MODELS`.
        precision: a name from :data:`fp16lab.sweep.PRECISIONS` (``fp32`` has TF32 off).
        layout: ``nchw`` or ``channels_last``.
        batch: samples per step.
        steps: timed steps.
        telemetry: sample NVML during the timed steps.
    """
    from .sweep import Point, measure_point

    dev = _device()
    if dev != "cuda" and not EXERCISE_ON_CPU:
        raise RuntimeError("train_step_figures needs a CUDA GPU; torch sees none")
    point = Point(model=model_name, batch=batch, layout=layout, precision=precision,
                  cudnn_benchmark=True, device=dev)
    row = measure_point(point, warmup=max(2, steps // 4), steps=steps, telemetry=telemetry)
    if row["status"] != "ok":
        raise RuntimeError(f"training point {point.label()} ended with {row['status']}: "
                           f"{row['error']}")
    peak = row.get("peak_mem_allocated_mb")
    return {"model": model_name, "precision": precision, "layout": layout, "batch": batch,
            "step_ms": row["step_ms_median"], "spread": row["spread"],
            "samples_per_s": row["samples_per_s"],
            "peak_mem_gib": peak / 1024 if peak is not None else math.nan,
            "telemetry": row.get("telemetry_note") or "nvml",
            "telemetry_samples": row.get("telemetry_samples"),
            "gpu_busy_pct": row.get("gpu_busy_mean"), "mem_busy_pct": row.get("mem_busy_mean")}


def _train_sizes(quick: bool) -> tuple[int, int]:
    """Returns (batch, timed steps) for the GPU training claims."""
    return _sizes(quick, (128, 20), (16, 5), (2, 2))


def _gemm_tflops(n: int, dtype, *, repeat: int) -> float:
    """Returns the TFLOP/s of torch.matmul on n x n CUDA matrices of ``dtype``."""
    torch = _torch()
    dev = _device()
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    t = _timer(dev)(lambda: torch.matmul(a, b, out=c), warmup=3, repeat=repeat)
    return 2 * n**3 / (t.median_ms * 1e-3) / 1e12


def _gpu_kernel_name(fn: Callable[[], Any]) -> str:
    """Returns the name of the CUDA kernel that runs longest in one call of ``fn`` (torch.profiler).

    The kernels come from ``bench.cuda_kernels``, as in benchmarks/alignment.py; "Memset" and
    other helpers are shorter than the GEMM itself.
    """
    torch = _torch()
    if not torch.cuda.is_available():
        return "n/a (no CUDA)"
    try:
        from .bench import cuda_kernels

        kernels = cuda_kernels(fn, warmup=1)
        if not kernels:
            return "no kernel recorded"
        return max(kernels, key=lambda k: k[1])[0]
    except Exception as e:  # profiling is supporting evidence; never fail the claim on it
        return f"unavailable ({type(e).__name__}: {e})"


# --------------------------------------------------------------------------------------------
# Claim 1: multiples of 16, tensor-core fallback, batch multiple of 256
# --------------------------------------------------------------------------------------------

#: A figure counts as "clearly better" when it beats the other by this factor.
MATERIAL_GAIN = 1.10


def tensor_core_kernel(name: str) -> bool:
    """Returns True when a kernel name marks a tensor-core GEMM.

    :func:`fp16lab.kernels.report.uses_tensor_cores`, minus names that also say SIMT (``simt``,
    ``ffma``, ``hfma``, ``sgemm``): some cuBLAS CUDA-core kernels carry ``xmma`` in their names.
    """
    from .kernels.report import uses_tensor_cores

    return uses_tensor_cores(name) and not re.search(r"simt|ffma|hfma|sgemm", name, re.I)


def experiment_alignment(quick: bool = False) -> Figures:
    """Returns fp16 GEMM TFLOP/s at N = base + d, the FP32 CUDA-core ceiling, and Linear TFLOP/s
    at batches around 256 (CUDA)."""
    torch = _torch()
    dev = _device()
    base, feats, rep = _sizes(quick, (4096, 4096, 30), (1024, 1024, 10), (32, 32, 2))
    gemm = []
    for d in (0, 1, 2, 4, 8, 16):
        n = base + d
        a = torch.randn(n, n, device=dev, dtype=torch.float16)
        b = torch.randn(n, n, device=dev, dtype=torch.float16)
        gemm.append({"n": n, "offset": d, "tflops": _gemm_tflops(n, torch.float16, repeat=rep),
                     "kernel": _gpu_kernel_name(lambda: a @ b)})
        del a, b
    with _tf32(False, False):
        fp32 = _gemm_tflops(base, torch.float32, repeat=rep)
    w = torch.randn(feats, feats, device=dev, dtype=torch.float16)
    linear = []
    for batch in (192, 248, 255, 256, 257, 264, 320):
        x = torch.randn(batch, feats, device=dev, dtype=torch.float16)
        inner = 10

        def calls() -> None:
            for _ in range(inner):
                torch.nn.functional.linear(x, w)

        t = _timer(dev)(calls, warmup=3, repeat=rep)
        linear.append({"batch": batch,
                       "tflops": 2 * batch * feats * feats * inner / (t.median_ms * 1e-3) / 1e12})
    return {"n_base": base, "gemm": gemm, "fp32_simt_tflops": fp32,
            "cuda_core_fp16_ceiling_tflops": 2 * fp32, "linear_features": feats, "linear": linear}


def judge_alignment(f: Figures) -> Judgement:
    """Rules on claim 1 from GEMM and Linear throughputs."""
    t = {r["offset"]: r["tflops"] for r in f["gemm"]}
    kernel = {r["offset"]: r["kernel"] for r in f["gemm"]}
    lin = {r["batch"]: r["tflops"] for r in f["linear"]}
    ceiling = f["cuda_core_fp16_ceiling_tflops"]
    odd, aligned = t[1], max(t[0], t[16])
    fallback = odd <= ceiling and not tensor_core_kernel(kernel[1])
    needs16 = _ratio(t[16], t[8]) >= MATERIAL_GAIN
    b256 = _ratio(lin[256], max(lin[192], lin[320])) >= MATERIAL_GAIN
    gain = _ratio(aligned, odd)
    name = re.sub(r"^void |\(.*$", "", kernel[1])[:90]
    cores = ("no sign of tensor cores" if fallback else
             "the kernel name says tensor cores" if tensor_core_kernel(kernel[1]) else
             "faster than CUDA cores can go: tensor cores")
    facts = (f"fp16 GEMM N={f['n_base'] + 1}: {odd:.0f} TFLOP/s (CUDA-core fp16 ceiling "
             f"{ceiling:.0f}) in {name} ({cores}); "
             f"aligned/odd = {gain:.2f}x; multiple of 16 vs 8: {_ratio(t[16], t[8]):.2f}x; "
             f"batch 256 vs best of 192/320: {_ratio(lin[256], max(lin[192], lin[320])):.2f}x")
    held = [name for name, ok in (("tensor cores are lost off alignment", fallback),
                                  ("multiples of 16 beat multiples of 8", needs16),
                                  ("batch 256 is special", b256)) if ok]
    if fallback and needs16 and b256:
        return HOLDS, facts
    if not held and gain < MATERIAL_GAIN:
        return FAILS, facts
    if not held:
        return PARTLY, (f"only in that aligned sizes are faster ({gain:.2f}x); unaligned ones "
                        f"still run on tensor cores, multiples of 8 suffice, batch 256 is not "
                        f"special. {facts}")
    return PARTLY, f"only these parts: {', '.join(held)}. {facts}"


def plot_alignment(claim: Claim, axes: Any = None) -> Any:
    """Returns matplotlib axes with claim 1's figures: GEMM TFLOP/s against N, Linear against batch.

    Bars are green where the profiled kernel's name marks a tensor-core kernel or the rate is
    above what CUDA cores can reach; the dashed line is the CUDA-core fp16 ceiling (twice the fp32 GEMM with TF32 off). Returns None
    (and says why) when the claim has no figures.
    """
    import matplotlib.pyplot as plt

    f = claim.figures
    if not f.get("gemm"):
        print(f"claim {claim.id} has no figures to plot ({claim.verdict}: {claim.reason})")
        return None
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax1, ax2 = axes
    gemm = f["gemm"]
    ceiling = f["cuda_core_fp16_ceiling_tflops"]
    colours = ["tab:green" if tensor_core_kernel(r["kernel"]) or r["tflops"] > ceiling
               else "tab:blue" for r in gemm]
    ax1.bar([str(r["n"]) for r in gemm], [r["tflops"] for r in gemm], color=colours)
    ax1.axhline(ceiling, ls="--", color="grey", label="CUDA-core fp16 ceiling (2x fp32 GEMM)")
    ax1.set(xlabel="N (fp16 GEMM N x N x N)", ylabel="TFLOP/s",
            title="green: tensor cores (kernel name, or a rate above the ceiling)")
    ax1.legend(fontsize=8)
    lin = f["linear"]
    ax2.bar([str(r["batch"]) for r in lin], [r["tflops"] for r in lin],
            color=["tab:orange" if r["batch"] % 256 == 0 else "tab:grey" for r in lin])
    ax2.set(xlabel=f"batch (Linear {f['linear_features']} -> {f['linear_features']}, fp16)",
            ylabel="TFLOP/s", title="orange: a multiple of 256")
    ax1.figure.suptitle(claim.source, fontsize=8)
    ax1.figure.tight_layout()
    return axes


# --------------------------------------------------------------------------------------------
# Claim 2: channels_last speeds convolution up by 20-30%
# --------------------------------------------------------------------------------------------

#: The smallest speedup that counts as "20-30%" (some slack for noise), and the smallest that
#: counts as a gain at all.
CL_CLAIMED, CL_ANY = 1.15, 1.05


def experiment_channels_last(quick: bool = False) -> Figures:
    """Returns training throughput of the CNN in NCHW and channels_last, AMP fp16 and fp32 (CUDA)."""
    batch, steps = _train_sizes(quick)
    model = _cnn_name()
    out: Figures = {"model": model, "batch": batch}
    for prec, key in (("amp-fp16", "amp"), ("fp32", "fp32")):
        a = train_step_figures(model, prec, "nchw", batch, steps)
        b = train_step_figures(model, prec, "channels_last", batch, steps)
        out[f"{key}_nchw_sps"], out[f"{key}_cl_sps"] = a["samples_per_s"], b["samples_per_s"]
        out[f"speedup_{key}"] = b["samples_per_s"] / a["samples_per_s"]
    return out


def judge_channels_last(f: Figures) -> Judgement:
    """Rules on claim 2 from the channels_last/NCHW throughput ratios."""
    amp, fp32 = f["speedup_amp"], f["speedup_fp32"]
    facts = f"{f['model']} training, channels_last/NCHW: AMP fp16 {amp:.2f}x, fp32 {fp32:.2f}x"
    if amp >= CL_CLAIMED and fp32 >= CL_CLAIMED:
        return HOLDS, facts
    if amp >= CL_CLAIMED or fp32 >= CL_CLAIMED:
        where = "AMP fp16" if amp >= CL_CLAIMED else "fp32"
        return PARTLY, f"only under {where}. {facts}"
    if max(amp, fp32) >= CL_ANY:
        return PARTLY, f"the gain is smaller than 20-30%. {facts}"
    return FAILS, facts


# --------------------------------------------------------------------------------------------
# Claim 3: bf16 uses about 15% less memory than fp16
# --------------------------------------------------------------------------------------------

#: bf16/fp16 memory ratio at or below which "15% less" holds, and above which it does not.
MEM_CLAIMED, MEM_SAME = 0.90, 0.97


def experiment_bf16_memory(quick: bool = True) -> Figures:
    """Returns element sizes, parameter bytes and saved-activation bytes in fp16 and bf16, plus
    peak training memory under AMP fp16 and bf16 on a GPU."""
    torch = _torch()
    from .models import build_model, input_shape

    dev = _device()
    torch.manual_seed(0)
    model = build_model("transformer_block").to(dev)
    x = torch.randn(input_shape("transformer_block", _sizes(quick, 32, 4, 2)), device=dev)
    out: Figures = {
        "fp16_element_bytes": torch.empty(0, dtype=torch.float16).element_size(),
        "bf16_element_bytes": torch.empty(0, dtype=torch.bfloat16).element_size(),
        "fp16_param_bytes": sum(p.numel() * p.element_size()
                                for p in build_model("transformer_block").half().parameters()),
        "bf16_param_bytes": sum(p.numel() * p.element_size()
                                for p in build_model("transformer_block").bfloat16().parameters()),
    }
    fp16_dtype = _autocast_dtype(dev)
    if fp16_dtype == torch.float16:
        out["fp16_saved_bytes"] = saved_activation_bytes(model, x, autocast_dtype=torch.float16)
        out["bf16_saved_bytes"] = saved_activation_bytes(model, x, autocast_dtype=torch.bfloat16)
    if dev == "cuda" or EXERCISE_ON_CPU:
        batch, steps = _train_sizes(quick)
        name = _cnn_name()
        a = train_step_figures(name, "amp-fp16", "nchw", batch, steps)
        b = train_step_figures(name, "amp-bf16", "nchw", batch, steps)
        out.update({"model": name, "batch": batch, "fp16_peak_gib": a["peak_mem_gib"],
                    "bf16_peak_gib": b["peak_mem_gib"]})
    return out


def judge_bf16_memory(f: Figures) -> Judgement:
    """Rules on claim 3 from the bf16/fp16 memory ratio (GPU peak if measured, else saved bytes)."""
    if "fp16_peak_gib" in f:
        ratio, what = f["bf16_peak_gib"] / f["fp16_peak_gib"], f"peak training memory ({f['model']})"
    elif "fp16_saved_bytes" in f:
        ratio, what = f["bf16_saved_bytes"] / f["fp16_saved_bytes"], "saved activations under autocast"
    else:
        ratio, what = f["bf16_param_bytes"] / f["fp16_param_bytes"], "parameter bytes"
    facts = (f"element size bf16 {f['bf16_element_bytes']} B = fp16 {f['fp16_element_bytes']} B; "
             f"{what} bf16/fp16 = {ratio:.3f}")
    if ratio <= MEM_CLAIMED:
        return HOLDS, facts
    if ratio <= MEM_SAME:
        return PARTLY, f"bf16 saves less than claimed. {facts}"
    return FAILS, facts


# --------------------------------------------------------------------------------------------
# Claim 4: AMP fp16 gives ~60% more throughput than fp32 and ~30% less memory
# --------------------------------------------------------------------------------------------

#: Smallest speedup that counts as "about 60% more", smallest saving that counts as "about 30%".
AMP_SPEEDUP, AMP_SAVING = 1.45, 0.20


def experiment_amp_vs_fp32(quick: bool = False) -> Figures:
    """Returns throughput and peak memory of CNN training in fp32, TF32 and AMP fp16 (CUDA)."""
    batch, steps = _train_sizes(quick)
    name = _cnn_name()
    r = {p: train_step_figures(name, p, "nchw", batch, steps) for p in ("fp32", "tf32", "amp-fp16")}
    return {"model": name, "batch": batch,
            **{f"{p}_sps": r[p]["samples_per_s"] for p in r},
            **{f"{p}_peak_gib": r[p]["peak_mem_gib"] for p in r},
            "speedup_vs_fp32": r["amp-fp16"]["samples_per_s"] / r["fp32"]["samples_per_s"],
            "speedup_vs_tf32": r["amp-fp16"]["samples_per_s"] / r["tf32"]["samples_per_s"],
            "memory_saving": 1 - r["amp-fp16"]["peak_mem_gib"] / r["fp32"]["peak_mem_gib"]}


def judge_amp_vs_fp32(f: Figures) -> Judgement:
    """Rules on claim 4 from the AMP/fp32 speedup and the peak-memory saving."""
    s, m = f["speedup_vs_fp32"], f["memory_saving"]
    facts = (f"{f['model']}: AMP fp16 is {s:.2f}x fp32 (TF32 off), {f['speedup_vs_tf32']:.2f}x "
             f"TF32; peak memory {100 * m:.0f}% lower")
    fast, lean = s >= AMP_SPEEDUP, m >= AMP_SAVING
    if s >= 2 * 1.6:
        facts += " (over twice the claimed 1.6x: fp32 with TF32 off runs on CUDA cores)"
    if fast and lean:
        return HOLDS, facts
    if fast or lean:
        return PARTLY, f"only the {'throughput' if fast else 'memory'} part. {facts}"
    return FAILS, facts


# --------------------------------------------------------------------------------------------
# Claim 5: AMP raises SM utilisation (51% -> 68%) with memory bandwidth at ~90%
# --------------------------------------------------------------------------------------------

#: Rise in NVML busy % that counts as "raises", and memory busy % that counts as "about 90%".
BUSY_RISE, MEM_BUSY_HIGH = 10.0, 80.0


def experiment_utilisation(quick: bool = False) -> Figures:
    """Returns NVML's busy counters while the CNN trains in fp32 and in AMP fp16 (CUDA)."""
    import pynvml

    batch, steps = _train_sizes(quick)
    name = _cnn_name()
    seconds = _sizes(quick, 3.0, 1.0, 0.05)
    out: Figures = {"model": name, "batch": batch, "seconds": seconds,
                    "nvml_utilization_fields": [n for n, _ in pynvml.c_nvmlUtilization_t._fields_]}
    for p in ("fp32", "amp-fp16"):
        # enough timed steps to cover `seconds`, since NVML averages over its own period
        step_ms = train_step_figures(name, p, "nchw", batch, steps)["step_ms"]
        r = train_step_figures(name, p, "nchw", batch,
                               max(steps, math.ceil(seconds * 1e3 / step_ms)), telemetry=True)
        out[f"{p}_telemetry"] = r["telemetry"]
        out[f"{p}_gpu_busy_pct"] = r["gpu_busy_pct"]
        out[f"{p}_mem_busy_pct"] = r["mem_busy_pct"]
    return out


def judge_utilisation(f: Figures) -> Judgement:
    """Rules on claim 5 from NVML's time-busy counters in fp32 and AMP fp16."""
    busy = [f.get("fp32_gpu_busy_pct"), f.get("amp-fp16_gpu_busy_pct")]
    mem = [f.get("fp32_mem_busy_pct"), f.get("amp-fp16_mem_busy_pct")]
    if None in busy or None in mem:
        return UNTESTABLE, f"NVML gave no readings ({f.get('fp32_telemetry')})"
    fields = ", ".join(f.get("nvml_utilization_fields", []))
    caveat = (f"NVML reports only [{fields}], time-busy shares, not SM occupancy: there is no "
              f"'SM utilisation' counter to raise")
    rise = busy[1] - busy[0]
    facts = (f"GPU busy fp32 {busy[0]:.0f}% -> AMP {busy[1]:.0f}%; memory busy "
             f"{mem[0]:.0f}% -> {mem[1]:.0f}%")
    up, high = rise >= BUSY_RISE, min(mem) >= MEM_BUSY_HIGH
    if up and high:
        return HOLDS, f"{facts}. {caveat}"
    if up or high:
        return PARTLY, f"only the {'busy rise' if up else 'memory-busy'} part. {facts}. {caveat}"
    return FAILS, f"{facts}. {caveat}"


# --------------------------------------------------------------------------------------------
# Claim 6: growth_interval is the NaN-check interval; halve after three NaNs in a row
# --------------------------------------------------------------------------------------------

def experiment_gradscaler(quick: bool = True) -> Figures:
    """Returns torch's GradScaler trace with a planted NaN and a run of three infs.

    The scaler runs on this machine's device with ``growth_interval=4``; step 2 has a NaN
    gradient (not a multiple of the interval), steps 10-12 have inf gradients.
    """
    torch = _torch()
    from .scaling import GradScalerRecorder

    dev = _device()
    interval, init, n_steps = 4, 2.0**10, 16
    planted = {2: math.nan, 10: math.inf, 11: math.inf, 12: math.inf}
    scaler = GradScalerRecorder(torch.amp.GradScaler(dev, init_scale=init,
                                                     growth_interval=interval))
    p = torch.nn.Parameter(torch.ones(4, device=dev))
    opt = torch.optim.SGD([p], lr=0.125)
    trace = []
    for i in range(n_steps):
        opt.zero_grad()
        w = p.detach().clone()
        loss = (p * planted.get(i, 1.0)).sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        event = scaler.update()
        trace.append({"step": i, "nonfinite": i in planted, "found_inf": event.found_inf,
                      "scale_before": event.scale, "scale_after": event.next_scale,
                      "skipped": bool(torch.equal(p.detach(), w))})
    first = min(planted)
    bad = [s for s in trace if s["nonfinite"]]
    halved_after = next((k + 1 for k, s in enumerate(bad)
                         if s["scale_after"] < s["scale_before"]), None)
    clean = 0
    grew_after = None
    for s in trace[first + 1:]:
        if s["nonfinite"]:
            break
        clean += 1
        if s["scale_after"] > s["scale_before"]:
            grew_after = clean
            break
    return {"device": dev, "init_scale": init, "growth_interval": interval,
            "backoff_factor": scaler.scaler.get_backoff_factor(),
            "planted_steps": sorted(planted), "trace": trace,
            "nonfinite_detected_at": [s["step"] for s in trace
                                      if s["skipped"] and s["scale_after"] < s["scale_before"]],
            "nonfinite_before_first_backoff": halved_after,
            "clean_steps_before_growth": grew_after,
            "gradscaler_parameters": [n for n in inspect.signature(torch.amp.GradScaler).parameters]}


def judge_gradscaler(f: Figures) -> Judgement:
    """Rules on claim 6 from when the scale fell and grew around planted non-finite steps."""
    every_step = f["nonfinite_detected_at"] == f["planted_steps"]
    first = f["nonfinite_before_first_backoff"] == 1
    growth = f["clean_steps_before_growth"] == f["growth_interval"]
    n = f["nonfinite_before_first_backoff"]
    params = f["gradscaler_parameters"]
    patience = [p for p in params
                if {"consecutive", "patience", "hysteresis", "row"} & set(p.split("_"))]
    facts = (f"with growth_interval {f['growth_interval']}, the scale first fell after "
             f"{n} non-finite step{'s' if n != 1 else ''} (a single NaN at step "
             f"{f['planted_steps'][0]}); non-finite steps planted at {f['planted_steps']}, caught "
             f"and skipped at {f['nonfinite_detected_at']}; the scale grew after "
             f"{f['clean_steps_before_growth']} clean steps; GradScaler's parameters are "
             f"{', '.join(params)} ("
             + (f"{', '.join(patience)} may set a patience" if patience
                else "none sets a number of NaNs in a row") + ")")
    if every_step and first and growth:
        return FAILS, ("growth_interval counts clean steps before the scale grows; every step is "
                       "checked. " + facts)
    if not every_step and not first:
        return HOLDS, facts
    return PARTLY, facts


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
    torch = _torch()
    dev = _device()
    m = torch.backends.cuda.matmul
    out: Figures = {"device": dev, "settings_present": [s for s in MATMUL_SETTINGS if _has(m, s)]}
    with _tf32(False, torch.backends.cudnn.allow_tf32):
        out["precision_flag_off"] = torch.get_float32_matmul_precision()
    with _tf32(True, torch.backends.cudnn.allow_tf32):
        out["precision_flag_on"] = torch.get_float32_matmul_precision()
    for flag in (False, True):
        with _tf32(flag, torch.backends.cudnn.allow_tf32):
            torch.manual_seed(0)
            lin = torch.nn.Linear(8, 8).to(dev)
            with torch.autocast(dev, dtype=torch.bfloat16):
                lin(torch.randn(4, 8, device=dev)).float().sum().backward()
            out[f"grad_dtype_flag_{'on' if flag else 'off'}"] = str(lin.weight.grad.dtype)
    if dev == "cuda" or EXERCISE_ON_CPU:
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
# Claim 9: clip at 1.0 to start; a per-epoch mean-|g| threshold is better
# --------------------------------------------------------------------------------------------

#: Final-loss factors: clipping at 1.0 "does no harm" within NO_HARM of no clipping, and the
#: mean-|g| rule "works better" when it beats clip-1.0 by BETTER.
NO_HARM, BETTER = 1.05, 0.95
LR = 0.1


def experiment_clipping(quick: bool = True) -> Figures:
    """Returns final losses of a short fp16 training with no clipping, clip 1.0 (after unscale_),
    clip 1.0 before unscale_, and the per-epoch mean-|g| threshold, plus gradient-norm figures."""
    torch = _torch()
    from .models import build_model

    dev = _device()
    dtype = _autocast_dtype(dev)
    epochs, batches, batch = _sizes(quick, (12, 16, 128), (4, 6, 32), (2, 2, 8))
    g = torch.Generator().manual_seed(0)
    teacher = torch.nn.Linear(64, 10)
    with torch.no_grad():
        teacher.weight.copy_(torch.randn(10, 64, generator=g))
        xs = torch.randn(batches, batch, 64, generator=g)
        ys = teacher(xs).argmax(-1)
    xs, ys = xs.to(dev), ys.to(dev)
    torch.manual_seed(0)
    init = build_model("mlp").state_dict()

    def train(mode: str) -> dict[str, Any]:
        model = build_model("mlp").to(dev)
        model.load_state_dict(init)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        scaler = torch.amp.GradScaler(dev, init_scale=2.0**12)
        norms, means, clipped, thresholds = [], [], 0, []
        threshold = 1.0
        for _ in range(epochs):
            epoch_means = []
            for i in range(batches):
                opt.zero_grad()
                with torch.autocast(dev, dtype=dtype):
                    loss = torch.nn.functional.cross_entropy(model(xs[i]), ys[i])
                scaler.scale(loss).backward()
                if mode == "clip1_before_unscale":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.unscale_(opt)
                grads = [p.grad for p in model.parameters()]
                norm = float(torch.linalg.vector_norm(torch.cat([q.flatten() for q in grads])))
                mean_abs = float(torch.cat([q.abs().flatten() for q in grads]).mean())
                if math.isfinite(norm):
                    norms.append(norm)
                    epoch_means.append(mean_abs)
                limit = {"clip1": 1.0, "mean_abs": threshold}.get(mode)
                if limit is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
                    clipped += norm > limit
                scaler.step(opt)
                scaler.update()
            if epoch_means:
                threshold = sum(epoch_means) / len(epoch_means)
                thresholds.append(threshold)
        with torch.no_grad():
            final = float(torch.nn.functional.cross_entropy(
                model(xs.flatten(0, 1)).float(), ys.flatten()))
        return {"final_loss": final, "median_grad_norm": sorted(norms)[len(norms) // 2],
                "clipped_share": clipped / (epochs * batches), "thresholds": thresholds,
                "scale": scaler.get_scale()}

    runs = {m: train(m) for m in ("none", "clip1", "clip1_before_unscale", "mean_abs")}
    return {"device": dev, "autocast_dtype": str(dtype), "epochs": epochs, "steps": epochs * batches,
            **{f"loss_{m}": r["final_loss"] for m, r in runs.items()},
            "median_grad_norm": runs["none"]["median_grad_norm"],
            "clip1_share": runs["clip1"]["clipped_share"],
            "mean_abs_threshold_last": (runs["mean_abs"]["thresholds"] or [math.nan])[-1],
            "mean_abs_share": runs["mean_abs"]["clipped_share"],
            "scale": runs["none"]["scale"]}


def judge_clipping(f: Figures) -> Judgement:
    """Rules on claim 9 from final losses with no clipping, clip 1.0 and the mean-|g| threshold."""
    none, one, mean_abs = f["loss_none"], f["loss_clip1"], f["loss_mean_abs"]
    no_harm = one <= none * NO_HARM
    better = mean_abs < one * BETTER
    facts = (f"final loss: no clip {none:.3f}, clip 1.0 {one:.3f} (clipped "
             f"{100 * f['clip1_share']:.0f}% of steps; median unscaled norm "
             f"{f['median_grad_norm']:.2f}), per-epoch mean-|g| rule {mean_abs:.3f} (last threshold "
             f"{f['mean_abs_threshold_last']:.2g}, clipped {100 * f['mean_abs_share']:.0f}%), "
             f"clip 1.0 before unscale_ {f['loss_clip1_before_unscale']:.3f} (threshold "
             f"effectively 1/scale); a heuristic: this model and data only")
    if no_harm and better:
        return HOLDS, facts
    if no_harm:
        return PARTLY, f"1.0 on unscaled gradients does no harm here; the mean-|g| rule is not better. {facts}"
    if better:
        return PARTLY, f"only the mean-|g| part. {facts}"
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
    torch = _torch()
    from .models import build_model, input_shape

    dev = _device()
    dtype = _autocast_dtype(dev)
    knobs = {"torch.autocast": list(inspect.signature(torch.autocast).parameters),
             "torch.amp.GradScaler": list(inspect.signature(torch.amp.GradScaler).parameters)}
    torch.manual_seed(0)
    model = build_model("transformer_block").to(dev)
    x = torch.randn(input_shape("transformer_block", _sizes(quick, 64, 16, 2)), device=dev)
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
    return {"device": dev, "autocast_dtype": str(dtype), "knobs": knobs,
            "ratio_knobs": [f"{k}({p})" for k, ps in knobs.items() for p in ps if "ratio" in p],
            "layer_dtypes": layer_dtypes, "saved_bytes_autocast": full,
            "saved_bytes_ffn_fp32": partial, "saved_bytes_fp32": fp32}


def judge_amp_ratio(f: Figures) -> Judgement:
    """Rules on claim 10 from the autocast/GradScaler parameters and saved-activation bytes."""
    mib = 2**20
    low = sorted(k for k, v in f["layer_dtypes"].items() if "float32" not in v)
    high = sorted(k for k, v in f["layer_dtypes"].items() if "float32" in v)
    facts = (f"autocast picks the dtype per op ({', '.join(low)} -> {f['autocast_dtype']}; "
             f"{', '.join(high)} -> float32); what you choose is the region. Saved activations: "
             f"autocast everywhere {f['saved_bytes_autocast'] / mib:.2f} MiB, FFN kept in fp32 "
             f"{f['saved_bytes_ffn_fp32'] / mib:.2f} MiB, fp32 {f['saved_bytes_fp32'] / mib:.2f} "
             f"MiB: less fp16 work uses "
             f"{'more' if f['saved_bytes_ffn_fp32'] > f['saved_bytes_autocast'] else 'less'} "
             f"activation memory")
    if not f["ratio_knobs"]:
        params = "; ".join(f"{k}({', '.join(v)})" for k, v in f["knobs"].items())
        return NONEXISTENT, f"no 'AMP ratio' in {params}. {facts}"
    saves = f["saved_bytes_ffn_fp32"] < f["saved_bytes_autocast"]
    return (HOLDS if saves else FAILS), facts


# --------------------------------------------------------------------------------------------
# Claim 11: fp16 tensor-core throughput is 8x fp32
# --------------------------------------------------------------------------------------------

#: The claimed ratio and the band (relative) within which it counts as holding.
CLAIMED_RATIO, RATIO_BAND = 8.0, 0.25


def experiment_fp16_vs_fp32(quick: bool = False) -> Figures:
    """Returns cuBLAS GEMM TFLOP/s in fp16, fp32 (TF32 off) and TF32, and their ratios (CUDA)."""
    torch = _torch()
    n, rep = _sizes(quick, (8192, 20), (2048, 10), (32, 2))
    fp16 = _gemm_tflops(n, torch.float16, repeat=rep)
    with _tf32(False, False):
        fp32 = _gemm_tflops(n, torch.float32, repeat=rep)
    with _tf32(True, True):
        tf32 = _gemm_tflops(n, torch.float32, repeat=rep)
    return {"n": n, "fp16_tflops": fp16, "fp32_tflops": fp32, "tf32_tflops": tf32,
            "ratio_fp16_fp32": fp16 / fp32, "ratio_fp16_tf32": fp16 / tf32}


def judge_fp16_vs_fp32(f: Figures) -> Judgement:
    """Rules on claim 11 from the measured fp16/fp32 GEMM throughput ratio."""
    r = f["ratio_fp16_fp32"]
    facts = (f"N={f['n']}: fp16 {f['fp16_tflops']:.0f}, fp32 {f['fp32_tflops']:.0f}, TF32 "
             f"{f['tf32_tflops']:.0f} TFLOP/s; fp16/fp32 = {r:.1f}x, fp16/TF32 = "
             f"{f['ratio_fp16_tf32']:.1f}x (8x is V100's datasheet 125/15.7)")
    if abs(r / CLAIMED_RATIO - 1) <= RATIO_BAND:
        return HOLDS, facts
    return FAILS, facts


# --------------------------------------------------------------------------------------------
# Claim 12: disabling the TorchScript profiling executor speeds up training
# --------------------------------------------------------------------------------------------

def experiment_profiling_executor(quick: bool = True) -> Figures:
    """Returns eager and TorchScript training-step times with the profiling executor on and off."""
    torch = _torch()
    from .models import build_model, input_shape

    dev = _device()
    if not hasattr(torch._C, "_jit_set_profiling_executor"):
        return {"device": dev, "available": False}
    name, batch = _sizes(quick, ("small_cnn", 256), ("mlp", 64), ("mlp", 8))
    rounds, reps = _sizes(quick, (5, 30), (3, 10), (1, 2))
    timer = _timer(dev)
    torch.manual_seed(0)
    state = build_model(name).state_dict()
    x = torch.randn(input_shape(name, batch), device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    ms: dict[str, list[float]] = {}
    deprecation = ""
    old = torch._C._jit_set_profiling_executor(True)
    try:
        for _ in range(rounds):
            for mode in ("eager", "script"):
                for flag in (True, False):
                    torch._C._jit_set_profiling_executor(flag)
                    model = build_model(name).to(dev)
                    model.load_state_dict(state)
                    if mode == "script":
                        with warnings.catch_warnings(record=True) as caught:
                            warnings.simplefilter("always")
                            model = torch.jit.script(model)
                        deprecation = deprecation or next(
                            (str(w.message) for w in caught if "deprecat" in str(w.message)), "")
                    opt = torch.optim.SGD(model.parameters(), lr=0.01)

                    def step() -> None:
                        opt.zero_grad()
                        torch.nn.functional.cross_entropy(model(x), y).backward()
                        opt.step()

                    t = timer(step, warmup=5, repeat=reps)
                    ms.setdefault(f"{mode}_{'on' if flag else 'off'}", []).append(t.median_ms)
    finally:
        torch._C._jit_set_profiling_executor(old)
    med = {k: min(v) for k, v in ms.items()}  # the least disturbed round (shared machines)
    return {"device": dev, "available": True, "model": name, "batch": batch,
            **{f"{k}_ms": v for k, v in med.items()},
            "speedup_script": med["script_on"] / med["script_off"],
            "speedup_eager": med["eager_on"] / med["eager_off"],
            "torchscript_deprecation": deprecation}


def judge_profiling_executor(f: Figures) -> Judgement:
    """Rules on claim 12 from step-time ratios (executor on / off) in eager and TorchScript."""
    if not f.get("available", False):
        return NONEXISTENT, "this torch has no torch._C._jit_set_profiling_executor (TorchScript is gone)"
    s, e = f["speedup_script"], f["speedup_eager"]
    dep = f" TorchScript says: {f['torchscript_deprecation']}" if f["torchscript_deprecation"] else ""
    noise = abs(e - 1)  # the flag cannot touch eager code: what eager moves is noise
    facts = (f"{f['model']} step time with the profiling executor on / off: TorchScript "
             f"{s:.2f}x, eager {e:.2f}x (above 1: off is faster; the flag only configures "
             f"TorchScript's graph executor, so eager's {100 * noise:.0f}% is the noise).{dep}")
    script_fast = s - 1 >= max(MATERIAL_GAIN - 1, 2 * noise)
    if script_fast and e >= MATERIAL_GAIN:
        return HOLDS, facts
    if script_fast:
        return PARTLY, f"only for TorchScript models. {facts}"
    return FAILS, facts


# --------------------------------------------------------------------------------------------
# the claims, checking them, the table
# --------------------------------------------------------------------------------------------

CLAIMS: tuple[Claim, ...] = (
    Claim(1, "dims x16, batch x256",
          "Matrix dimensions must be multiples of 16, or Tensor Cores fall back to CUDA cores; "
          "batch sizes that are multiples of 256 give peak Tensor Core use.",
          "fp16 GEMM at N=4096+d: 'fall back' holds if at odd N the profiled kernel is not a "
          "tensor-core kernel by name and runs no faster than 2x the fp32 CUDA-core GEMM; 'x16' if N%16 beats N%8 by >=10%; 'x256' if a Linear at batch 256 beats "
          "batches 192 and 320 by >=10%; all three: holds; none and aligned/odd < 1.1x: does not "
          "hold; else holds in part.",
          experiment_alignment, judge_alignment, needs_gpu=True),
    Claim(2, "channels_last +20-30%",
          "Converting a CNN to channels_last (NHWC) speeds convolution up by 20-30%.",
          "channels_last/NCHW training throughput (ResNet-50): >=1.15x under both AMP fp16 and "
          "fp32: holds; under one, or 1.05-1.15x: holds in part; <1.05x: does not hold.",
          experiment_channels_last, judge_channels_last, needs_gpu=True),
    Claim(3, "bf16 15% less memory",
          "bf16 uses about 15% less memory than fp16.",
          "bf16/fp16 memory (GPU peak training memory, else saved activations): <=0.90 holds, "
          "0.90-0.97 holds in part, >0.97 does not hold.",
          experiment_bf16_memory, judge_bf16_memory),
    Claim(4, "AMP +60% speed, -30% memory",
          "AMP FP16 gives about 60% more training throughput than FP32 and about 30% less memory.",
          "AMP fp16 vs fp32 (TF32 off) training: speedup >=1.45x and peak memory >=20% lower: "
          "holds; one of the two: holds in part; neither: does not hold.",
          experiment_amp_vs_fp32, judge_amp_vs_fp32, needs_gpu=True),
    Claim(5, "AMP raises SM util",
          "AMP raises SM utilisation (e.g. from about 51% to 68%) while memory-bandwidth "
          "utilisation stays around 90%.",
          "NVML busy % during training: AMP raises GPU busy by >=10 points and memory busy stays "
          ">=80% in both: holds; one of the two: holds in part; neither: does not hold.",
          experiment_utilisation, judge_utilisation, needs_gpu=True),
    Claim(6, "growth_interval = NaN check",
          "GradScaler's growth_interval is the interval at which NaNs are checked; the scale "
          "should be halved only after three NaNs in a row.",
          "torch GradScaler with planted NaN/inf steps: each caught at its step, one halves the "
          "scale, growth after growth_interval clean steps: does not hold; checks only every "
          "interval and needs three: holds; else holds in part.",
          experiment_gradscaler, judge_gradscaler),
    Claim(7, "allow_tf32 = bf16 grad accum",
          "torch.backends.cuda.matmul.allow_tf32 = True turns on bf16 gradient accumulation.",
          "Gradients under bf16 autocast with the flag on: bf16 holds; otherwise the switch does "
          "not exist (shown: what the flag sets, and on a GPU whether its error matches TF32 or "
          "bf16 rounding).",
          experiment_allow_tf32, judge_allow_tf32),
    Claim(8, "autocast(enabled=False) = fp32",
          "Nesting autocast(enabled=False) inside an FP16 autocast region keeps a sensitive "
          "layer in FP32.",
          "Linear and softmax on autocast outputs inside the disabled region: float32 without a "
          "cast: holds; only with .float() inputs: holds in part; never: does not hold.",
          experiment_autocast_disable, judge_autocast_disable),
    Claim(9, "clip 1.0; mean-|g| better",
          "In FP16 training a gradient-clipping threshold of 1.0 is a good start, and a "
          "threshold set each epoch to the mean absolute gradient works better.",
          "Short fp16+GradScaler training: clip 1.0 (after unscale_) ends within 5% of no "
          "clipping and mean-|g| beats it by >=5%: holds; one of the two: holds in part; neither: "
          "does not hold.",
          experiment_clipping, judge_clipping),
    Claim(10, "lower the 'AMP ratio'",
          "Under memory pressure, lower the share of FP16 work (an \"AMP ratio\") to save memory.",
          "No ratio parameter on autocast or GradScaler: names something that does not exist "
          "(shown: per-op dtypes and saved activations for narrower regions); else holds if a "
          "narrower fp16 region saves memory.",
          experiment_amp_ratio, judge_amp_ratio),
    Claim(11, "fp16 = 8x fp32",
          "FP16 Tensor Core throughput is 8 times FP32 throughput.",
          "cuBLAS GEMM fp16/fp32 (TF32 off) TFLOP/s ratio within 25% of 8: holds; otherwise "
          "does not hold.",
          experiment_fp16_vs_fp32, judge_fp16_vs_fp32, needs_gpu=True),
    Claim(12, "no profiling executor = faster",
          "Disabling the TorchScript profiling executor "
          "(torch._C._jit_set_profiling_executor(False)) speeds up training.",
          "Training-step time, executor on/off: TorchScript counts as faster with it off when "
          ">=1.10x and by more than twice what eager moves (eager, which the flag cannot touch, "
          "gauges the noise); eager >=1.10x too: holds; TorchScript only: holds in part; "
          "otherwise does not hold.",
          experiment_profiling_executor, judge_profiling_executor),
)


def get_claim(claim_id: int) -> Claim:
    """Returns the unchecked claim with this number."""
    for c in CLAIMS:
        if c.id == claim_id:
            return c
    raise ValueError(f"no claim {claim_id!r}; claims are numbered 1-{len(CLAIMS)}")


def device_slug(gpu_name: str | None) -> str:
    """Returns a short file-name slug for a device: ``NVIDIA H200`` -> ``h200``, None -> ``cpu``."""
    if not gpu_name:
        return "cpu"
    s = re.sub(r"^nvidia\s+", "", gpu_name.strip().lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "gpu"


def recorded_gpu_result(data_dir: Path | None = None) -> dict[str, Any] | None:
    """Returns the recorded GPU claims run (``claims_h200`` first, else any GPU one), or None."""
    from .bench import DATA_DIR, read_result

    folder = Path(data_dir or DATA_DIR)
    candidates = [folder / f"{RECORDED_GPU_RESULT}.json"]
    candidates += sorted(p for p in folder.glob("claims_*.json") if p not in candidates)
    for p in candidates:
        if p.exists():
            payload = read_result(p)
            if payload["meta"].get("gpu_name"):
                return payload
    return None


def _judge_recorded(c: Claim, figures: Figures) -> Judgement:
    """Returns the rule's verdict on recorded figures, or says they do not fit the rule."""
    try:
        return c.judge(figures)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        return UNTESTABLE, (f"the recorded figures do not fit this rule ({type(e).__name__}: {e}); "
                            f"re-run `python3 -m fp16lab.cli claims` on the GPU")


def check(claim: int | Claim, *, quick: bool | None = None, data_dir: Path | None = None,
          recorded: dict[str, Any] | None = None) -> Claim:
    """Returns the claim checked: its figures, verdict, reason and source filled in.

    The experiment runs here unless the claim needs a GPU and there is none; then the figures
    recorded on a GPU (``data/claims_h200.json``) are judged by the same rule. An experiment that
    raises gives ``cannot be tested here`` with the error, so one broken tool does not stop a run.

    Args:
        claim: the claim or its number.
        quick: small sizes (default: quick on a CPU, full on a GPU).
        data_dir: where to look for the recorded GPU run (default ``data/``).
        recorded: an already loaded recorded run (saves re-reading it for every claim).
    """
    from .bench import describe_source
    from .device import has_gpu, metadata

    c = get_claim(claim) if isinstance(claim, int) else claim
    gpu = has_gpu()
    quick = (not gpu) if quick is None else quick
    if c.needs_gpu and not gpu:
        rec = recorded if recorded is not None else recorded_gpu_result(data_dir)
        row = next((r for r in (rec or {}).get("rows", []) if r.get("id") == c.id), None)
        if row is None or not row.get("figures") or "error" in row["figures"]:
            return replace(c, verdict=UNTESTABLE, source="not measured",
                           reason="no GPU here and no recorded GPU result for it in data/ "
                                  "(run `python3 -m fp16lab.cli claims --out data/` on a GPU)")
        verdict, reason = _judge_recorded(c, row["figures"])
        return replace(c, figures=row["figures"], verdict=verdict, reason=reason,
                       source="recorded elsewhere: " + describe_source(rec["meta"]))
    t0 = time.perf_counter()
    try:
        figures = c.experiment(quick)
    except Exception as e:
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        return replace(c, figures={"error": detail}, verdict=UNTESTABLE,
                       reason=f"the experiment failed here: {detail}",
                       source="here: " + describe_source(metadata()))
    figures["elapsed_s"] = round(time.perf_counter() - t0, 3)
    verdict, reason = c.judge(figures)
    return replace(c, figures=figures, verdict=verdict, reason=reason,
                   source="here: " + describe_source(metadata()))


def check_all(ids: Iterable[int] | None = None, *, quick: bool | None = None,
              data_dir: Path | None = None, progress: bool = False) -> list[Claim]:
    """Returns every claim (or those in ``ids``) checked, in order."""
    chosen = [get_claim(i) for i in ids] if ids is not None else list(CLAIMS)
    rec = recorded_gpu_result(data_dir)
    out = []
    for c in chosen:
        if progress:
            print(f"claim {c.id}: {c.short} ...", file=sys.stderr, flush=True)
        out.append(check(c, quick=quick, data_dir=data_dir, recorded=rec or {}))
    return out


def verdict_table(claims: Iterable[Claim]):
    """Returns the verdict table as a pandas DataFrame (one row per claim)."""
    import pandas as pd

    return pd.DataFrame([{"#": c.id, "claim": c.short, "verdict": c.verdict,
                          "measured": c.reason, "rule": c.rule, "source": c.source}
                         for c in claims]).set_index("#")


def recorded_claims(data_dir: Path | None = None) -> list[Claim]:
    """Returns the claims of the recorded GPU run, verdicts recomputed from its figures by the
    rules (an empty list when there is no recorded run)."""
    from .bench import describe_source

    rec = recorded_gpu_result(data_dir)
    if rec is None:
        return []
    source = "recorded elsewhere: " + describe_source(rec["meta"])
    out = []
    for row in rec["rows"]:
        c = get_claim(row["id"])
        f = row.get("figures") or {}
        if not f or "error" in f:
            out.append(replace(c, figures=f, verdict=row.get("verdict"),
                               reason=row.get("reason", ""), source=source))
        else:
            verdict, reason = _judge_recorded(c, f)
            out.append(replace(c, figures=f, verdict=verdict, reason=reason, source=source))
    return out


def recorded_table(data_dir: Path | None = None):
    """Returns the verdict table of the recorded GPU run as a DataFrame, or None without one."""
    checked = recorded_claims(data_dir)
    return verdict_table(checked) if checked else None


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def markdown_table(claims: Iterable[Claim], *, rules: bool = True) -> str:
    """Returns the verdict table in markdown: claim, verdict, measured figures, rule, source."""
    head = ["#", "claim", "verdict", "measured"] + (["rule"] if rules else []) + ["source"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in claims:
        cells = [c.id, c.text, f"**{c.verdict}**", c.reason] + ([c.rule] if rules else [])
        lines.append("| " + " | ".join(_cell(v) for v in cells + [c.source]) + " |")
    return "\n".join(lines) + "\n"


def to_markdown(claims: Iterable[Claim], meta: dict[str, Any]) -> str:
    """Returns the verdict table as a markdown document headed by where it was measured."""
    from .bench import describe_source

    claims = list(claims)
    counts = {v: sum(c.verdict == v for c in claims) for v in VERDICTS}
    return "\n".join([
        "# fp16lab: mixed-precision claims checked", "",
        f"Run {describe_source(meta)}" + (" (quick sizes)" if meta.get("quick") else "") + ".", "",
        markdown_table(claims),
        "Verdicts: " + ", ".join(f"{v}: {n}" for v, n in counts.items() if n) + ".", ""])


def write_claims(claims: Iterable[Claim], out_dir: Path | None = None, *,
                 quick: bool = False, elapsed_s: float | None = None) -> tuple[Path, Path]:
    """Writes ``claims_<device>.md`` and ``claims_<device>.json`` and returns their paths."""
    from .bench import DATA_DIR, read_result, write_result
    from .device import device_info

    claims = list(claims)
    slug = device_slug(device_info().gpu_name)
    folder = Path(out_dir or DATA_DIR)
    json_path = write_result(f"claims_{slug}", [c.as_row() for c in claims],
                             meta={"quick": quick, "elapsed_s": elapsed_s,
                                   "verdicts": {c.id: c.verdict for c in claims}},
                             data_dir=folder)
    md_path = folder / f"claims_{slug}.md"
    md_path.write_text(to_markdown(claims, read_result(json_path)["meta"]))
    return md_path, json_path


def _run_cli(args: argparse.Namespace) -> int:
    from .device import has_gpu

    ids = None
    if args.only:
        try:
            ids = [int(s) for s in args.only.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--only takes claim numbers like 1,6,8; got {args.only!r}") from None
        for i in ids:
            get_claim(i)
    quick = args.quick or not has_gpu()
    t0 = time.perf_counter()
    checked = check_all(ids, quick=quick, data_dir=args.data, progress=True)
    elapsed = time.perf_counter() - t0
    md, js = write_claims(checked, args.out, quick=quick, elapsed_s=round(elapsed, 1))
    for c in checked:
        if "error" in c.figures:
            print(f"claim {c.id} failed: {c.figures['error']}", file=sys.stderr)
    width = max(len(c.short) for c in checked)
    print(f"\n{'#':>2}  {'claim':<{width}}  verdict")
    for c in checked:
        print(f"{c.id:>2}  {c.short:<{width}}  {c.verdict}")
    print(f"\n{len(checked)} claims in {elapsed:.0f} s; wrote {md} and {js}")
    return 0


def register_cli(subparsers: Any) -> None:
    """Adds ``fp16lab claims`` to the command line."""
    p = subparsers.add_parser(
        "claims", help="check popular mixed-precision claims on this device; write the table")
    p.add_argument("--quick", action="store_true",
                   help="small sizes (always on without a GPU)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for claims_<device>.md/.json (default: data/)")
    p.add_argument("--data", type=Path, default=None,
                   help="folder holding the recorded GPU run shown for GPU-only claims on a CPU "
                        "(default: data/)")
    p.add_argument("--only", default="", help="comma-separated claim numbers, e.g. 1,6,8")
    p.set_defaults(func=_run_cli)
