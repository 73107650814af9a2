"""What does leaving GradientMonitor on cost? Training-step time with and without its hooks.

Goal (issue 3): at most 5% step-time overhead for ResNet-50 with AMP on the H200.

Rows: ResNet-50 (torchvision, channels_last, batch 128 of 3x224x224) with CUDA autocast FP16
and torch.amp.GradScaler on the GPU; small_cnn (batch 64, FP32) on the CPU. Each variant is
timed step by step - CUDA events on the GPU, perf_counter on the CPU - in interleaved blocks
(off, on, off, on, ...), so drift and other load hit both alike; the monitor is attached at the
start of each "on" block and removed at its end. Reported: the median step time of each variant
and overhead = median(on) / median(off) - 1, also from the 10th percentiles (the fast tail, which
load from other processes on a shared machine disturbs least); on the CPU also the process's CPU
time per step.

    python -m fp16lab.bench.diagnostics_overhead            # GPU (if any) and CPU
    python -m fp16lab.bench.diagnostics_overhead --gpu-only
    python -m fp16lab.bench.diagnostics_overhead --quick    # CPU smoke test
    python -m fp16lab.bench.diagnostics_overhead --profile  # where statistics() goes

Results go to data/diagnostics_overhead.json; rows for a device not measured in this run are
kept from the existing file, and every row names the device and torch version that produced it.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from fp16lab.measure import data_dir as committed_dir, merge_with_previous, summarize, write_result
from fp16lab import recipes, validate
from fp16lab.bench import argument_parser
from fp16lab.diagnostics import GradientMonitor, auto_backend
from fp16lab.models import build_model, input_shape
from fp16lab.profile import torch_profiler

NAME = "diagnostics_overhead"


def make_step(model_name: str, device: str, batch: int, amp: bool):
    """Returns (model, step function) for one training step of a model on synthetic data."""
    torch.manual_seed(0)
    model = build_model(model_name).to(device)
    x = torch.randn(input_shape(model_name, batch), device=device)
    if device == "cuda" and x.dim() == 4:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)
    step, _ = recipes.make_train_step("amp-fp16" if amp else "fp32", model, x, y, device=device,
                                      optimizer=lambda p: recipes.sgd(p, lr=1e-3, momentum=0.9))
    return model, step


def time_steps(step, device: str, n: int, cpu_ms: list[float] | None = None) -> list[float]:
    """Returns n per-step times in ms (on the CPU also appends each step's process CPU time,
    which other processes' load barely disturbs, to ``cpu_ms``)."""
    if device == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for a, b in events:
            a.record()
            step()
            b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in events]
    out = []
    for _ in range(n):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e3)
        if cpu_ms is not None:
            cpu_ms.append((time.process_time() - c0) * 1e3)
    return out


def measure(model_name: str, device: str, batch: int, amp: bool, rounds: int,
            steps_per_block: int, warmup: int, backends: tuple[str, ...] = ("auto",)) -> list[dict]:
    """Returns one row per variant: hooks off, and hooks on with each statistics backend."""
    model, step = make_step(model_name, device, batch, amp)
    for _ in range(warmup):
        step()
    # each monitor's one-time set-up (its chunk or segment tables) happens here, outside the
    # timed blocks
    monitors = {}
    for b in backends:
        mon = GradientMonitor(model, backend=b)
        step()
        mon.remove()
        name = b if b != "auto" else auto_backend(device)
        monitors[f"hooks on ({name})" if len(backends) > 1 else "hooks on"] = (mon, name)
    if device == "cuda":
        torch.cuda.synchronize()
    samples = {"hooks off": [], **{k: [] for k in monitors}}
    cpu = {k: [] for k in samples}
    for _ in range(rounds):
        samples["hooks off"] += time_steps(step, device, steps_per_block, cpu["hooks off"])
        for variant, (mon, _) in monitors.items():
            mon.reset()
            mon.attach()
            samples[variant] += time_steps(step, device, steps_per_block, cpu[variant])
            mon.remove()
            assert mon.steps == steps_per_block, "monitor missed steps"
    n_params = sum(1 for p in model.parameters() if p.requires_grad)
    frames = {}
    for variant, (mon, _) in monitors.items():
        # read the last block's statistics back once (what a user would do now and then)
        frames[variant] = mon.frame()
        assert len(frames[variant]) == steps_per_block * n_params
        assert (frames[variant].numel > 0).all()
    if device == "cuda":
        dev_name = torch.cuda.get_device_name()
    else:
        dev_name = platform.processor() or platform.machine()
    rows = []
    off = summarize(samples["hooks off"])
    for variant, xs in samples.items():
        t = summarize(xs)
        row = {"device": device, "device_name": dev_name, "torch": torch.__version__,
               "model": model_name, "batch": batch, "amp": amp, "variant": variant,
               "n_params": n_params, "threads": torch.get_num_threads(),
               "monitor_backend": monitors[variant][1] if variant in monitors else None,
               **t.as_dict(),
               "overhead_pct": 100 * (t.median_ms / off.median_ms - 1),
               # the fast tail is what load from other processes disturbs least
               "overhead_p10_pct": 100 * (t.p10_ms / off.p10_ms - 1)}
        if cpu[variant]:
            c, c_off = summarize(cpu[variant]), summarize(cpu["hooks off"])
            row.update(cpu_time_median_ms=c.median_ms,
                       cpu_time_overhead_pct=100 * (c.median_ms / c_off.median_ms - 1))
        rows.append(row)
    return rows


def profile_statistics(model_name: str, device: str, batch: int, amp: bool) -> None:
    """Prints where one GradientMonitor.statistics() call spends its time (torch.profiler: ops,
    kernel launches, device time) on the gradients of one real training step."""
    from torch.profiler import ProfilerActivity

    model, step = make_step(model_name, device, batch, amp)
    mon = GradientMonitor(model)
    step()
    mon.remove()
    grads = [p.grad for p in mon.params if p.grad is not None]
    for _ in range(3):  # plan built, allocator warm
        mon.statistics(grads)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch_profiler(acts) as prof:
        mon.statistics(grads)
        if device == "cuda":
            torch.cuda.synchronize()
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"statistics() on {model_name} ({device}): {len(grads)} gradients, "
          f"{sum(g.numel() for g in grads)} values, {len(kernels)} CUDA kernels / copies")
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=15))


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("diagnostics_overhead", __doc__.splitlines()[0])
    p.add_argument("--rounds", type=validate.argument(validate.count), default=60,
                   help="interleaved off/on block pairs")
    p.add_argument("--steps", type=validate.argument(validate.count), default=4,
                   help="steps per block")
    p.add_argument("--gpu-batch", type=validate.argument(validate.count), default=128)
    p.add_argument("--cpu-batch", type=validate.argument(validate.count), default=64)
    p.add_argument("--gpu-backends", nargs="+", default=["auto"],
                   choices=["auto", "cupy", "histc"],
                   help="GradientMonitor backends to time on the GPU, interleaved")
    p.add_argument("--gpu-only", action="store_true")
    p.add_argument("--cpu-only", action="store_true")
    p.add_argument("--quick", action="store_true", help="CPU only, few steps (smoke test)")
    p.add_argument("--name", type=validate.argument(validate.text), default=NAME,
                   help="result file stem under data/")
    p.add_argument("--profile", action="store_true",
                   help="only print a torch.profiler breakdown of one statistics() call "
                        "(ResNet-50 on the GPU if any, else small_cnn on the CPU)")
    p.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    a = p.parse_args(argv)
    if a.profile:
        if torch.cuda.is_available():
            profile_statistics("resnet50", "cuda", a.gpu_batch, True)
        else:
            profile_statistics("small_cnn", "cpu", a.cpu_batch, False)
        return 0
    if a.quick:
        a.rounds, a.steps, a.cpu_only = 3, 3, True
    rows: list[dict] = []
    if not a.cpu_only and torch.cuda.is_available():
        rows += measure("resnet50", "cuda", a.gpu_batch, True, a.rounds, a.steps, warmup=10,
                        backends=tuple(a.gpu_backends))
    elif not a.cpu_only:
        print("no CUDA GPU: skipping the ResNet-50 rows", flush=True)
    if not a.gpu_only:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        rows += measure("small_cnn", "cpu", a.cpu_batch, False, a.rounds, a.steps, warmup=3)
    if not a.quick:  # keep the rows of the device not measured now (e.g. CPU with --gpu-only)
        rows = merge_with_previous(a.name, rows, data_dir=committed_dir() if a.replace else None)
    import tempfile

    data_dir = Path(tempfile.mkdtemp()) if a.quick else None  # a smoke test leaves data/ alone
    path = write_result(a.name, rows, data_dir=data_dir, replace=a.replace,
                              meta={"benchmark": "fp16lab.bench.diagnostics_overhead",
                                    "rounds": a.rounds, "steps_per_block": a.steps})
    print(f"wrote {path}")
    print(f"{'device':<6} {'model':<10} {'batch':>5} {'amp':<5} {'variant':<10} "
          f"{'median ms':>10} {'p10':>8} {'p90':>8} {'overhead':>9}")
    for r in rows:
        cpu_note = (f"   (CPU time {r['cpu_time_median_ms']:.2f} ms, "
                    f"{r['cpu_time_overhead_pct']:+.1f}%)" if "cpu_time_median_ms" in r else "")
        print(f"{r['device']:<6} {r['model']:<10} {r['batch']:>5} {str(r['amp']):<5} "
              f"{r['variant']:<10} {r['median_ms']:>10.2f} {r['p10_ms']:>8.2f} "
              f"{r['p90_ms']:>8.2f} {r['overhead_pct']:>8.1f}% (p10: {r['overhead_p10_pct']:+.1f}%)"
              f"{cpu_note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
