"""The doctor's checks of speed: memory layout, shapes, where the GPU's time goes, the input
pipeline, the batch size, several GPUs. Each takes a :class:`~fp16lab.doctor.visit.Visit` and
returns its findings, or raises :class:`~fp16lab.doctor.visit.Unchecked`."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn

from .. import waves
from ..measure import step_times_ms, time_cpu, time_cuda_interleaved
from ..recipes import autocast_dtype
from ..profile import profile_steps
from ..workload import _forward_of, build_model
from ..workloads.batches import ModelInputs
from . import visit as V
from .probe import fused_optimizer, is_scaled, optimizer_is_fused
from .report import Finding
from .visit import Unchecked, Visit

def check_layout(visit: Visit) -> list[Finding]:
    """channels_last for a model that convolves."""
    model = build_model(visit.probe.workload)
    if not any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()):
        raise Unchecked("no convolution: the memory layout does not apply")
    base = visit.best or visit.start
    if base.layout == "channels_last":
        return []
    before = visit.probe.measure(base)
    after = visit.probe.measure(base.but(layout="channels_last"))
    gain = visit.gain(after, before)
    if gain is None or gain < 1 + V.NOISE:
        return []
    return [Finding("layout", f"convolutions in channels_last: {gain:.2f}x", "keeps",
                    change={"layout": "channels_last"}, gain=gain, verified=True,
                    advice="model.to(memory_format=torch.channels_last) and the same for the "
                           "image batches: tensor-core convolutions read NHWC without "
                           "transposing it first.")]


def _odd_dims(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)
            and (m.in_features % 8 or m.out_features % 8)]


def _pad(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _linear_ms(rows: int, shapes: dict[str, tuple[int, int]], precision: str,
               device: torch.device) -> dict[str, float]:
    """Returns the ms of one forward and backward of ``F.linear`` at each (in, out) shape with
    ``rows`` input rows, in the precision's dtype; on a GPU the shapes are timed interleaved."""
    dtype = autocast_dtype(precision) or torch.float32
    calls = {}
    for key, (fin, fout) in shapes.items():
        x = torch.randn(rows, fin, device=device, dtype=dtype, requires_grad=True)
        w = torch.randn(fout, fin, device=device, dtype=dtype, requires_grad=True)

        def call(x=x, w=w) -> None:
            y = torch.nn.functional.linear(x, w)
            y.backward(torch.ones_like(y))
        calls[key] = call
    if device.type == "cuda":
        return {k: t.median_ms for k, t in time_cuda_interleaved(calls, rounds=3).items()}
    return {k: time_cpu(c, repeat=5).median_ms for k, c in calls.items()}


def check_shapes(visit: Visit) -> list[Finding]:
    """Linear layers with a dimension that is not a multiple of 8 (16 bytes of FP16)."""
    base = visit.best or visit.start
    model = build_model(visit.probe.workload)
    odd = _odd_dims(model)
    if not odd:
        return []
    rows_of = visit.notes.get("linear_rows") or _linear_rows(visit, model)
    table, saved = [], 0.0
    for name, lin in odd[:6]:
        rows = rows_of.get(name, visit.probe.batch_size)
        fin, fout = _pad(lin.in_features, 8), _pad(lin.out_features, 8)
        ms = _linear_ms(rows, {"real": (lin.in_features, lin.out_features),
                               "padded": (fin, fout)}, base.precision, visit.probe.device)
        t, tp = ms["real"], ms["padded"]
        table.append({"module": name, "shape": f"{rows}x{lin.in_features}x{lin.out_features}",
                      "padded": f"{rows}x{fin}x{fout}", "ms": t, "padded_ms": tp,
                      "layer_gain": t / tp})
        saved += max(t - tp, 0.0)
    start = visit.probe.measure(base)
    projected = start.step_ms / max(start.step_ms - saved, 1e-9) if start.ran else None
    finding = Finding("shapes", f"{len(odd)} linear layer(s) with a dimension that is not a "
                      f"multiple of 8, first '{odd[0][0]}' ({odd[0][1].in_features}x"
                      f"{odd[0][1].out_features})", "keeps",
                      evidence={"layers": len(odd), "step gain projected from the layers":
                                projected}, table=table, gain=projected,
                      advice="Tensor cores take FP16/BF16 matrices whose dimensions are "
                             "multiples of 8 (16 bytes); cuBLAS falls back to slower kernels "
                             "for the others. Pad the size (a vocabulary to a multiple of 64).")
    dims = {lin.in_features for _, lin in odd} | {lin.out_features for _, lin in odd}
    setting = next((k for k, v in visit.probe.workload.settings.items()
                    if isinstance(v, int) and not isinstance(v, bool) and v in dims and v % 8),
                   None)
    if setting is not None:
        value = visit.probe.workload.settings[setting]
        after = visit.probe.measure(base.but(settings=((setting, _pad(value, 8)),)))
        gain = visit.gain(after, start)
        if gain is not None:
            finding.change = {"settings": {setting: _pad(value, 8)}}
            finding.gain, finding.verified = gain, True
            finding.evidence["measured step gain"] = gain
    elif projected is not None:
        finding.change = {"pad to": "a multiple of 8"}
    if (finding.gain or 0) < 1 + V.NOISE:
        return []
    return [finding]


def _linear_rows(visit: Visit, model: nn.Module) -> dict[str, int]:
    """Returns, per linear layer, the rows of its input on one batch (tokens x batch)."""
    model = model.to(visit.probe.device)
    inputs, _ = visit.probe.workload.batch(visit.probe.batch_size, visit.probe.device)
    rows: dict[str, int] = {}

    def hook(name: str):
        def record(mod: nn.Linear, args: tuple, out: Any) -> None:
            rows.setdefault(name, args[0].numel() // mod.in_features)
        return record

    hooks = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
             if isinstance(m, nn.Linear)]
    try:
        with torch.no_grad():
            _forward_of(visit.probe.workload, None, model)(ModelInputs(inputs))
    finally:
        for h in hooks:
            h.remove()
    visit.notes["linear_rows"] = rows
    return rows


def check_time(visit: Visit) -> list[Finding]:
    """Where the GPU's time goes: idle while the host launches, GradScaler's host sync."""
    if not visit.cuda:
        raise Unchecked("needs a CUDA GPU: the GPU's idle time is what it measures")
    # GradScaler's host sync is the start's where it scales the loss: measure from there
    base = visit.start if is_scaled(visit.start.precision) else (visit.best or visit.start)
    try:
        step = visit.probe.build_step(base, visit.probe.batch_size)
        idle = profile_steps(step, steps=3, warmup=3).summary.idle_fraction
        del step
    except Exception as e:  # noqa: BLE001 - the profiler's failure leaves the check unrun
        raise Unchecked(f"the profiler failed: {type(e).__name__}: {e}") from e
    before = visit.probe.measure(base)
    tried = []
    syncs = is_scaled(base.precision) and not optimizer_is_fused(visit.probe.workload.optimizer)
    if syncs and fused_optimizer(visit.probe.workload.optimizer) is not None:
        tried.append(visit.probe.measure(base.but(fused=True)))
    if idle > V.IDLE_SHARE:
        tried.append(visit.probe.measure(base.but(compile_mode="reduce-overhead")))
        if syncs and tried[0].ran:
            tried.append(visit.probe.measure(base.but(fused=True, compile_mode="reduce-overhead")))
    tried = [m for m in tried if m.ran]
    evidence = {"GPU idle share": idle, "GradScaler host sync (non-fused optimizer)": syncs}
    found = visit.fastest_gain(tried, before, V.NOISE)
    if found is None:
        return []
    best, gain = found
    change = {k: v for k, v in (("fused", best.config.fused),
                                ("compile_mode", best.config.compile_mode)) if v}
    title = (f"the step is launch-bound (the GPU idles {idle:.0%} of it)" if idle > V.IDLE_SHARE
             else "GradScaler waits on the host every step (a non-fused optimizer)")
    return [Finding("time", f"{title}: {best.config.describe()} gives {gain:.2f}x", "keeps",
                    evidence=evidence, change=change, gain=gain, verified=True,
                    table=[m.row() for m in tried],
                    advice="A fused optimizer takes GradScaler's found-inf on the device, so no "
                           "step waits for the host; torch.compile(mode='reduce-overhead') "
                           "replays the step as CUDA graphs, one launch for many kernels.")]


def check_input(visit: Visit) -> list[Finding]:
    """An input pipeline slower than the model: the step with the next batch vs with one batch."""
    workload = visit.probe.workload
    if getattr(workload.batch, "synthetic", False):
        raise Unchecked("the batches are synthetic (made on the spot, not read): there is no "
                        "input pipeline to measure")
    base = visit.best or visit.start
    if not visit.probe.measure(base).ran:
        return []
    device = visit.probe.device
    step = visit.probe.build_step(base, visit.probe.batch_size)
    step()  # warm up
    batch_times, step_times = [], []
    for _ in range(4):  # in turns, so what else the machine does weighs on both alike
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        workload.batch(visit.probe.batch_size, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        batch_times.append((time.perf_counter() - t0) * 1e3)
        step_times += step_times_ms(step, 1, device)
    del step
    batch_ms, step_ms = statistics.median(batch_times[1:]), statistics.median(step_times[1:])
    visit.notes["batch_ms"], visit.notes["step_ms"] = batch_ms, step_ms
    if batch_ms <= step_ms:
        return []
    bound = (batch_ms + step_ms) / step_ms
    return [Finding("input", f"making a batch takes {batch_ms:.1f} ms, the step {step_ms:.1f}"
                    f" ms: the input pipeline is slower than the model", "keeps",
                    evidence={"batch ms": batch_ms, "step ms with the batch on hand": step_ms},
                    gain=bound, change={"input": "faster batches"},
                    advice="The gain is the bound with the batch already made: one after the "
                           "other, a batch and a step take (batch + step) / step times a step "
                           "alone (measured in turns). Use DataLoader workers, pinned memory "
                           "and prefetching, or decode on the GPU (notebook 07).")]


#: The output tile the wave count assumes: the one cuBLAS's Hopper fp16 GEMMs most often name
#: in notebook 03's runs (``nvjet_sm90_..._256x128_...``); a real kernel may pick another.
WAVE_TILE = (256, 128)


def largest_gemm_waves(visit: Visit, batches: list[int]) -> dict[str, Any] | None:
    """Returns the largest linear layer's GEMM (by weight size) and, per batch size, its output
    tiles, waves and wave efficiency (:mod:`fp16lab.waves`) with :data:`WAVE_TILE` tiles on
    this GPU's SMs (an H200's 132 where there is no GPU, said so); None without a linear layer."""
    model = build_model(visit.probe.workload)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        return None
    name, lin = max(linears, key=lambda nm: nm[1].in_features * nm[1].out_features)
    rows_of = visit.notes.get("linear_rows") or _linear_rows(visit, model)
    per_sample = rows_of.get(name, visit.probe.batch_size) / visit.probe.batch_size
    if visit.cuda:
        sms = torch.cuda.get_device_properties(visit.probe.device).multi_processor_count
        where = "this GPU"
    else:
        sms, where = waves.H200_SMS, "an H200 (no GPU here)"
    out = []
    for b in batches:
        rows = max(1, round(per_sample * b))
        tiles = waves.tile_count(rows, lin.out_features, *WAVE_TILE)
        out.append({"batch": b, "rows": rows, "tiles": tiles,
                    "waves": waves.wave_count(tiles, sms),
                    "wave_efficiency": waves.efficiency(rows, lin.out_features, *WAVE_TILE, sms)})
    return {"module": name, "shape": f"rows x {lin.in_features} x {lin.out_features}",
            "sms": sms, "where": where, "per_batch": out}


def check_batch(visit: Visit) -> list[Finding]:
    """A larger batch, where memory allows: samples/s at 2x and 4x, and the wave count of the
    largest GEMM at each batch (evidence, not a measurement)."""
    base = visit.best or visit.start
    before = visit.probe.measure(base)
    if not before.ran:
        return []
    rows, tried = [], []
    total = torch.cuda.get_device_properties(visit.probe.device).total_memory if visit.cuda \
        else None
    for factor in (2, 4):
        bs = visit.probe.batch_size * factor
        if total and before.peak_bytes and before.peak_bytes * factor > 0.9 * total:
            break
        m = visit.probe.measure(base.but(batch_size=bs))
        if not m.ran:
            break
        tried.append(m)
        rows.append({"batch": bs, "samples_per_s": m.samples_per_s,
                     "peak_GiB": m.peak_bytes / 2**30 if m.peak_bytes else None})
    found = visit.fastest_gain(tried, before, V.BATCH_GAIN)
    if found is None:
        return []
    best, gain = found
    evidence = {"samples/s at the batch given": before.samples_per_s}
    if total and before.peak_bytes:
        evidence["memory used at the batch given"] = before.peak_bytes / total
    gemm = largest_gemm_waves(visit, [visit.probe.batch_size] + [r["batch"] for r in rows])
    if gemm is not None:
        given = gemm["per_batch"][0]
        evidence[f"largest GEMM, '{gemm['module']}' ({gemm['shape']})"] = (
            f"{given['tiles']} tile(s) of {WAVE_TILE[0]}x{WAVE_TILE[1]} in {given['waves']} "
            f"wave(s) on {gemm['sms']} SMs of {gemm['where']}: "
            f"{100 * given['wave_efficiency']:.2g}% of the SM-tile slots hold output")
        for row, g in zip(rows, gemm["per_batch"][1:]):
            row.update(waves=g["waves"], wave_efficiency=g["wave_efficiency"])
    return [Finding("batch", f"batch {best.batch_size} instead of {visit.probe.batch_size}: "
                    f"{gain:.2f}x the samples/s", "changes", evidence=evidence,
                    change={"batch_size": best.batch_size}, gain=gain, verified=True,
                    table=rows, advice="A larger batch fills the GPU's SMs with more tiles of "
                                       "each GEMM; it changes the optimisation: scale the "
                                       "learning rate and check the loss.")]


def check_multi_gpu(visit: Visit) -> list[Finding]:
    if not visit.cuda or torch.cuda.device_count() < 2:
        raise Unchecked("needs two or more GPUs (DDP's bucket view, buffer broadcast and bucket "
                        "size); this machine has fewer")
    raise Unchecked("DDP settings are measured by fp16lab.bench.distributed, not by the doctor")


