"""Claims about training steps: channels_last, bf16 memory, AMP speed and utilisation, TorchScript (2-5, 12)."""

from __future__ import annotations

import functools
import importlib.util
import math
import warnings
from typing import Any

from .. import sweep  # the module, not its names: tests replace its functions
from .. import validate
from ..models import build_model, input_shape
from . import core
from .core import (FAILS, HOLDS, MATERIAL_GAIN, NONEXISTENT, PARTLY, TOO_NOISY, UNTESTABLE, Claim,
                   Figures, Judgement, _autocast_dtype, _device, _sizes, _timer, _torch,
                   saved_activation_bytes, verdict_of_parts)


# --------------------------------------------------------------------------------------------
# training-step measurements shared by claims 2, 3, 4 and 5 (GPU)
# --------------------------------------------------------------------------------------------

def _cnn_name() -> str:
    """Returns the CNN the GPU claims train: ResNet-50 with torchvision, else the small CNN; the
    small CNN always when the GPU code paths are exercised on a CPU (ResNet-50 takes tens of
    seconds a step there)."""
    if core.EXERCISE_ON_CPU:
        return "small_cnn"
    return "resnet50" if importlib.util.find_spec("torchvision") else "small_cnn"


@functools.lru_cache(maxsize=None)
def train_step_figures(model_name: str, precision: str, layout: str, batch: int, steps: int,
                       telemetry: bool = False) -> dict[str, Any]:
    """Returns samples/s, peak memory and NVML busy % of training steps, from the sweep engine.

    One point of :func:`fp16lab.sweep.measure_point`, measured by the sweep's
    :data:`fp16lab.sweep.GPU_PROTOCOL` (cuDNN autotuning and warm-up; ``steps`` timed steps),
    cached for the session so that claims sharing a configuration run it once. A point that
    fails (out of memory, or any error) raises, naming the point.

    Args:
        model_name: a name from :data:`fp16lab.models.MODELS`.
        precision: a name from :data:`fp16lab.sweep.PRECISIONS` (``fp32`` has TF32 off).
        layout: ``nchw`` or ``channels_last``.
        batch: samples per step.
        steps: timed steps.
        telemetry: sample NVML during the timed steps.
    """
    dev = _device()
    if dev != "cuda" and not core.EXERCISE_ON_CPU:
        raise RuntimeError("train_step_figures needs a CUDA GPU; torch sees none")
    point = sweep.Point(model=model_name, batch=batch, layout=layout, precision=precision,
                        cudnn_benchmark=sweep.GPU_PROTOCOL.cudnn_benchmark, device=dev)
    row = sweep.measure_point(point, warmup=sweep.GPU_PROTOCOL.warmup, steps=steps,
                              telemetry=telemetry)
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
            "gpu_busy_pct": row.get("gpu_busy_mean"), "mem_busy_pct": row.get("mem_busy_mean"),
            "sm_util_pct": row.get("sm_util_mean"), "dram_bw_util_pct": row.get("dram_bw_util_mean"),
            "gpm_note": row.get("gpm_note") or ""}


def _at_batch(f: Figures, layout: str = "") -> str:
    """' at batch 128' (and ``layout`` after it) where the figures name their batch; files
    recorded before the batch was a figure say nothing."""
    return f" at batch {f['batch']}{layout}" if "batch" in f else ""


def _train_sizes(quick: bool) -> tuple[int, int]:
    """Returns (batch, timed steps) for the GPU training claims (full: the sweep's protocol)."""
    return _sizes(quick, (128, sweep.GPU_PROTOCOL.steps), (16, 5), (2, 2))


# --------------------------------------------------------------------------------------------
# Claim 2: channels_last speeds convolution up by 20-30%
# --------------------------------------------------------------------------------------------

#: The smallest speedup that counts as "20-30%" (some slack for noise), and the smallest that
#: counts as a gain at all.
CL_CLAIMED, CL_ANY = 1.15, 1.05


def experiment_channels_last(quick: bool = False) -> Figures:
    """Returns training throughput of the CNN in NCHW and channels_last, AMP fp16 and fp32 (CUDA)."""
    validate.boolean("quick", quick)
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
    facts = (f"{f['model']} training{_at_batch(f)}, channels_last/NCHW: AMP fp16 {amp:.2f}x, "
             f"fp32 {fp32:.2f}x")
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
    validate.boolean("quick", quick)
    torch = _torch()
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
    if dev == "cuda" or core.EXERCISE_ON_CPU:
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
    validate.boolean("quick", quick)
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
    facts = (f"{f['model']}{_at_batch(f, ', NCHW')}: AMP fp16 is {s:.2f}x fp32 (TF32 off), "
             f"{f['speedup_vs_tf32']:.2f}x "
             f"TF32; peak memory {100 * m:.0f}% lower")
    fast, lean = s >= AMP_SPEEDUP, m >= AMP_SAVING
    if s >= 2 * 1.6:
        facts += " (over twice the claimed 1.6x: fp32 with TF32 off runs on CUDA cores)"
    return verdict_of_parts({"throughput": fast, "memory": lean}, facts)


# --------------------------------------------------------------------------------------------
# Claim 5: AMP raises SM utilisation (51% -> 68%) with memory bandwidth at ~90%
# --------------------------------------------------------------------------------------------

#: Rise in utilisation (points) that counts as "raises", and memory figure that counts as "about 90%".
BUSY_RISE, MEM_BUSY_HIGH = 10.0, 80.0

#: The counters claim 5 can read, best first: (what, SM key, memory key). GPM (Hopper and newer)
#: measures SM and DRAM-bandwidth use; NVML's busy % only whether a kernel or a memory access ran.
UTILISATION_COUNTERS = (
    ("GPM SM utilisation and DRAM bandwidth utilisation", "sm_util_pct", "dram_bw_util_pct"),
    ("NVML busy % (utilization.gpu and utilization.memory: time shares, not SM or bandwidth use)",
     "gpu_busy_pct", "mem_busy_pct"),
)


def experiment_utilisation(quick: bool = False) -> Figures:
    """Returns GPM utilisation (where the GPU has it) and NVML busy % while the CNN trains in fp32
    and in AMP fp16 (CUDA)."""
    validate.boolean("quick", quick)
    batch, steps = _train_sizes(quick)
    name = _cnn_name()
    seconds = _sizes(quick, 3.0, 1.0, 0.05)
    out: Figures = {"model": name, "batch": batch, "seconds": seconds}
    for p in ("fp32", "amp-fp16"):
        # enough timed steps to cover `seconds`, since NVML averages over its own period
        step_ms = train_step_figures(name, p, "nchw", batch, steps)["step_ms"]
        r = train_step_figures(name, p, "nchw", batch,
                               max(steps, math.ceil(seconds * 1e3 / step_ms)), telemetry=True)
        out[f"{p}_telemetry"] = r["telemetry"]
        out[f"{p}_gpm_note"] = r["gpm_note"]
        for _, sm_key, mem_key in UTILISATION_COUNTERS:
            out[f"{p}_{sm_key}"] = r[sm_key]
            out[f"{p}_{mem_key}"] = r[mem_key]
    return out


def judge_utilisation(f: Figures) -> Judgement:
    """Rules on claim 5 from GPM's SM and DRAM-bandwidth utilisation where both runs have them,
    else from NVML's time-busy counters, naming the counters it read."""
    for what, sm_key, mem_key in UTILISATION_COUNTERS:
        sm = [f.get(f"fp32_{sm_key}"), f.get(f"amp-fp16_{sm_key}")]
        mem = [f.get(f"fp32_{mem_key}"), f.get(f"amp-fp16_{mem_key}")]
        if None not in sm and None not in mem:
            break
    else:
        return UNTESTABLE, (f"neither GPM nor NVML gave readings ({f.get('fp32_telemetry')}; "
                            f"{f.get('fp32_gpm_note') or 'no GPM note'})")
    nvml = sm_key == "gpu_busy_pct"
    trained = f" while {f['model']} trained{_at_batch(f, ', NCHW')}" if "model" in f else ""
    facts = (f"read {what}{trained}: {'GPU busy' if nvml else 'SM'} fp32 {sm[0]:.0f}% -> AMP "
             f"{sm[1]:.0f}%; {'memory busy' if nvml else 'DRAM bandwidth'} {mem[0]:.0f}% -> "
             f"{mem[1]:.0f}%")
    if nvml:
        gpm = f.get("fp32_gpm_note") or "this GPU or driver has none, or the run predates them"
        facts += f". GPM metrics were not read ({gpm})"
    up, high = sm[1] - sm[0] >= BUSY_RISE, min(mem) >= MEM_BUSY_HIGH
    return verdict_of_parts({"SM rise": up, "memory near 90%": high}, facts)


# --------------------------------------------------------------------------------------------
# Claim 12: disabling the TorchScript profiling executor speeds up training
# --------------------------------------------------------------------------------------------

def experiment_profiling_executor(quick: bool = True) -> Figures:
    """Returns eager and TorchScript training-step times with the profiling executor on and off."""
    validate.boolean("quick", quick)
    torch = _torch()
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
    batch = f" at batch {f['batch']}" if "batch" in f else ""
    facts = (f"{f['model']}{batch} step time with the profiling executor on / off: TorchScript "
             f"{s:.2f}x, eager {e:.2f}x (above 1: off is faster; the flag only configures "
             f"TorchScript's graph executor, so eager's {100 * noise:.0f}% is the noise).{dep}")
    script_fast = s - 1 >= max(MATERIAL_GAIN - 1, 2 * noise)
    if script_fast:  # never "holds": the flag cannot speed up eager training, most training
        return PARTLY, f"only for TorchScript models. {facts}"
    if 2 * noise > MATERIAL_GAIN - 1:  # the bar above 1.10x: a 10% gain would go unseen
        return UNTESTABLE, (f"{TOO_NOISY}: eager moved {100 * noise:.0f}%, so TorchScript had "
                            f"to gain {200 * noise:.0f}% to count, and a {MATERIAL_GAIN - 1:.0%} "
                            f"gain could not be told from noise; run it on a quieter machine. "
                            f"{facts}")
    return FAILS, facts


CLAIM_2 = Claim(
    2, "channels_last +20-30%",
    "Converting a CNN to channels_last (NHWC) speeds convolution up by 20-30%.",
    "channels_last/NCHW training throughput (ResNet-50): >=1.15x under both AMP fp16 and "
    "fp32: holds; under one, or 1.05-1.15x: holds in part; <1.05x: does not hold.",
    experiment_channels_last, judge_channels_last, needs_gpu=True,
    origin=("a practical FP16 guide (WMMA kernel, loss scaling, NaN debugging, a BERT recipe) "
            "that recommends converting CNNs to NHWC"))


CLAIM_3 = Claim(
    3, "bf16 15% less memory",
    "bf16 uses about 15% less memory than fp16.",
    "bf16/fp16 memory (GPU peak training memory, else saved activations): <=0.90 holds, "
    "0.90-0.97 holds in part, >0.97 does not hold.",
    experiment_bf16_memory, judge_bf16_memory,
    origin=("an RTX 3090 FP16 tuning recipe that recommends bf16 partly for its lower memory "
            "use"))


CLAIM_4 = Claim(
    4, "AMP +60% speed, -30% memory",
    "AMP FP16 gives about 60% more training throughput than FP32 and about 30% less memory.",
    "AMP fp16 vs fp32 (TF32 off) training: speedup >=1.45x and peak memory >=20% lower: "
    "holds; one of the two: holds in part; neither: does not hold.",
    experiment_amp_vs_fp32, judge_amp_vs_fp32, needs_gpu=True,
    origin=("a write-up of AMP plus a hand-written fp16 kernel on two large GPUs, whose "
            "before/after table reports these gains"))


CLAIM_5 = Claim(
    5, "AMP raises SM util",
    "AMP raises SM utilisation (e.g. from about 51% to 68%) while memory-bandwidth "
    "utilisation stays around 90%.",
    "During training, from NVML's GPM SM utilisation and DRAM bandwidth utilisation where the "
    "GPU reports them (Hopper and newer), else from NVML's busy % (time shares, named as such): "
    "AMP raises SM utilisation by >=10 points and memory stays >=80% in both: holds; one of "
    "the two: holds in part; neither: does not hold.",
    experiment_utilisation, judge_utilisation, needs_gpu=True,
    origin=("a write-up of AMP plus a hand-written fp16 kernel on two large GPUs, which reads "
            "SM utilisation and bandwidth use from profiler tables before and after AMP"))


CLAIM_12 = Claim(
    12, "no profiling executor = faster",
    "Disabling the TorchScript profiling executor "
    "(torch._C._jit_set_profiling_executor(False)) speeds up training.",
    "Training-step time, executor on/off: TorchScript counts as faster with it off when "
    ">=1.10x and by more than twice what eager moves (eager, which the flag cannot touch, "
    "gauges the noise): holds in part (TorchScript models only; it cannot hold for eager "
    "training); otherwise does not hold, unless twice the noise exceeds 10%: cannot be "
    "tested here.",
    experiment_profiling_executor, judge_profiling_executor,
    origin=("an RTX 3090 FP16 tuning recipe that lists this flag among its speed settings"))
