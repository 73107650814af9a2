"""Nsight Compute's counters for the kernel ladder and for training steps (notebooks 03 and 06).

Part ``ladder``: every step of :data:`fp16lab.kernels.LADDER` that runs here and cuBLAS
(``cupy.matmul``) multiply fp16 N x N matrices (N = 8192 by default), each launched once after a
warm-up, under ``ncu`` with every counter of :data:`fp16lab.ncu.METRICS`. Each row adds the
roofline (FLOPs 2N^3 from the shape, DRAM bytes from the counters), the bottleneck the counters
name, and the stall reason that fell most from the step before (in stalled warp-cycles).

Part ``step``: for each model and precision, one training step (:func:`fp16lab.workload.train_step`,
after three warm-up steps) read twice: as one range (``--replay-mode range``: the counters of
the whole step, the gaps between kernels included) and kernel by kernel for its matrix kernels
(GEMMs, convolutions, attention: names matching :data:`MATRIX_KERNELS`, the first
``--launch-count`` of them). The source's two claims are checked on the range's figures (where
ncu could not read the step as a range, on the matrix kernels' duration-weighted figures, and
the claims say so): "warp scheduling efficiency under 70%" (the issue-slot counter) and "FP32:
DRAM 82%, SM 75%; FP16: DRAM 95%, SM 51%".

ncu 2025.3 refuses to replay a PyTorch step in the process (``--whole-step range``: an API
call in the step that range replay does not support); ``app-range`` re-runs the program once
per pass instead.

    python -m fp16lab.bench.counters                    # both parts -> data/local/counters_<gpu>.json
    python -m fp16lab.bench.counters --parts ladder --size 4096
    python -m fp16lab.bench.counters --claims-only --name counters_h200 --replace  # no GPU
"""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterable

from fp16lab import device, measure, ncu, validate
from fp16lab.bench import add_output_arguments, argument_parser, output_folder
from fp16lab.kernels import KERNELS, gemm
from fp16lab.kernels.measure import runnable
from fp16lab.workload import load_workload, train_step

PARTS = ("ladder", "step")
#: (workload, batch) the step part trains: a convolutional network and a transformer.
MODELS = (("torchvision-resnet50", 64), ("gpt2-small", 8))
PRECISIONS = ("fp32", "amp-fp16")
#: Kernel names of the matrix work in a step: cuBLAS (nvjet, gemm, cutlass), cuDNN (xmma,
#: implicit-GEMM convolutions), attention.
MATRIX_KERNELS = r"[Gg]emm|nvjet|cutlass|xmma|[Cc]onv|fprop|dgrad|wgrad|fmha|flash|[Aa]ttention"
WARMUP_STEPS = 3
#: Steps timed without ncu, per workload and precision, to set the range's counters against.
TIMED_STEPS = 10
#: The source's figures, as it states them.
SOURCE = {"issue_below": 70.0, "fp32": {"dram": 82.0, "sm": 75.0},
          "fp16": {"dram": 95.0, "sm": 51.0}}


# ----------------------------------------------------------------------------- children

def _child_ladder(size: int) -> None:
    """Launches every ladder step that runs here, then cupy.matmul, once each inside the
    profiler range (after one untimed launch each: compilation)."""
    import cupy


    rng = cupy.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((size, size), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.empty((size, size), dtype=cupy.float16)
    names = runnable()
    for _ in range(2):  # the first pass compiles; the second, inside the range, is profiled
        if _ == 1:
            cupy.cuda.runtime.deviceSynchronize()
            cupy.cuda.runtime.profilerStart()
        for name in names:
            gemm(a, b, kernel=name, out_dtype="float16", out=out)
        cupy.matmul(a, b, out=out)
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.runtime.profilerStop()
    print("profiled:", " ".join(names + ["cupy.matmul"]))


def _child_step(workload: str, precision: str, batch: int, times: str | None = None,
                timed: int = 0) -> None:
    """Builds the workload's step, trains WARMUP_STEPS steps, then one inside the profiler range.

    With ``times`` (a file path), ``timed`` more steps are first timed one by one with CUDA
    events and their milliseconds written to that file: the step as it runs without the
    profiler, which the range's counters are set against (:func:`range_check`)."""
    import torch

    step = train_step(load_workload(workload), precision, "cuda", batch)
    for _ in range(WARMUP_STEPS):
        step()
    if times:
        ms = []
        for _ in range(timed):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            ms.append(start.elapsed_time(end))
        with open(times, "w") as f:
            f.write("".join(f"{t}\n" for t in ms))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _child(argv: list[str]) -> int:
    if argv[0] == "ladder":
        _child_ladder(int(argv[1]))
    else:
        _child_step(argv[1], argv[2], int(argv[3]), *argv[4:5], *map(int, argv[5:6]))
    return 0


def _me(*args: str) -> list[str]:
    return [sys.executable, "-m", "fp16lab.bench.counters", "--child", *map(str, args)]


# ----------------------------------------------------------------------------- the rows

def _time_steps(child: list[str], n: int, timeout: float) -> list[float]:
    """Returns the milliseconds of ``n`` steps the child times in a run without ncu.

    Raises:
        ncu.NcuUnavailable: the run failed (its last lines say why).
    """
    with tempfile.TemporaryDirectory() as tmp:
        times = os.path.join(tmp, "step_ms")
        res = subprocess.run(child + [times, str(n)], capture_output=True, text=True,
                             timeout=timeout)
        if res.returncode != 0:
            tail = " | ".join(res.stderr.strip().splitlines()[-3:])
            raise ncu.NcuUnavailable(f"the step's timing run failed ({res.returncode}): {tail}")
        return _read_times(times)


def _timed_or_skipped(child: list[str], key: str, timeout: float,
                      skipped: dict[str, str]) -> list[float]:
    """Returns :func:`_time_steps` of ``child``, or, where the run fails, nothing, its reason
    recorded in ``skipped`` under ``"<key>, step timing"`` and printed."""
    try:
        return _time_steps(child, TIMED_STEPS, timeout)
    except (ncu.NcuUnavailable, subprocess.TimeoutExpired) as e:
        skipped[f"{key}, step timing"] = str(e)
        print(f"{key}: the step not timed without ncu: {e}", flush=True)
        return []


def _read_times(path: str) -> list[float]:
    """Returns the step times (ms) the child program wrote to ``path`` (none if it wrote
    nothing)."""
    try:
        with open(path) as f:
            return [float(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def range_check(whole: ncu.KernelCounters, step_ms: list[float]) -> dict[str, Any]:
    """Returns the range's figures set against the step as it runs without the profiler.

    Under ncu every CUDA call of the program is intercepted, so the range (from
    ``cudaProfilerStart`` to ``cudaProfilerStop``) lasts longer than the step does, and the
    counters that are shares of the range's elapsed time (SM and DRAM throughput) are diluted
    by the gaps it adds. The work they count is the same, so each is rescaled by the range's
    duration over the step's (``sm_step``, ``dram_step``: shares of the step's own time).
    The tensor and issue figures are shares of the SMs' active cycles, which the gaps do not
    change. ``step_ms``: the steps timed with CUDA events in a run without ncu (their median
    is ``step_ms``)."""
    if not step_ms:
        return {}
    step = statistics.median(step_ms)
    stretch = whole["duration_ns"] / 1e6 / step
    return {"step_ms": step, "timed_steps": len(step_ms), "range_over_step": stretch,
            **{f"{k}_step": whole[k] * stretch for k in ("sm", "dram")}}


def _counters(k: ncu.KernelCounters) -> dict[str, Any]:
    return {"kernel": k.name, "block": k.block, "grid": k.grid,
            **{m: v for m, v in k.values.items() if not math.isnan(v)}}


def ladder_rows(kernels: list[ncu.KernelCounters], names: list[str], size: int) -> list[dict]:
    """Returns one row per profiled ladder kernel and cuBLAS: counters, roofline, bottleneck,
    and (from the second step on) the stall reason that fell most from the step before."""

    if len(kernels) != len(names):
        raise RuntimeError(f"ncu profiled {len(kernels)} kernels, expected {len(names)} "
                           f"({', '.join(names)}): {[k.name for k in kernels]}")
    flops = 2.0 * size ** 3
    rows = []
    for i, (name, k) in enumerate(zip(names, kernels)):
        intensity, rate = ncu.roofline(flops, k.dram_bytes, k.seconds)
        kind, why = ncu.bottleneck(k)
        row = {"part": "ladder", "impl": name, "step": KERNELS[name].step if name in KERNELS else 0,
               "size": size, "flops": flops, "dram_bytes": k.dram_bytes,
               "intensity_flop_per_byte": intensity, "tflops": rate / 1e12,
               "dram_peak_gbs": ncu.implied_peak(k.dram_bytes / k.seconds, k["dram"]) / 1e9,
               "bottleneck": kind, "why": why, "top_stalls": k.top_stalls(3), **_counters(k)}
        if 0 < i and name in KERNELS:
            reason, before, after = ncu.moved(kernels[i - 1], k)
            row.update(moved=reason, moved_before=before, moved_after=after)
        rows.append(row)
    return rows


def step_figures(rows: list[dict]) -> dict[tuple[str, str], dict[str, Any]]:
    """Returns, per (workload, precision), the step's tensor, SM, DRAM and issue percentages and
    their scope: the whole step where it was read as one range, else the duration-weighted
    mean over the matrix kernels read one by one (the elementwise kernels and the gaps
    between kernels left out)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r.get("what") == "range":
            if "step_ms" in r:  # shares of the step's own time (range_check)
                out[(r["workload"], r["precision"])] = {
                    "tensor": r["tensor"], "sm": r["sm_step"], "dram": r["dram_step"],
                    "issue": r["issue"], "scope": "whole step"}
            else:
                out[(r["workload"], r["precision"])] = {
                    **{k: r[k] for k in ("tensor", "sm", "dram", "issue")},
                    "scope": "whole step as ncu's range (the profiler's gaps dilute SM and DRAM)"}
    kernels: dict[tuple[str, str], list[ncu.KernelCounters]] = {}
    for r in rows:
        if r.get("what") == "kernel" and (r["workload"], r["precision"]) not in out:
            kernels.setdefault((r["workload"], r["precision"]), []).append(
                ncu.KernelCounters(0, r["kernel"], values={
                    k: r[k] for k in ("duration_ns", "tensor", "sm", "dram", "issue") if k in r}))
    for key, ks in kernels.items():
        out[key] = {**{k: ncu.weighted(ks, k) for k in ("tensor", "sm", "dram", "issue")},
                    "scope": f"the step's first {len(ks)} matrix kernels, duration-weighted"}
    return out


def top_kernels(rows: list[dict], n: int = 5):
    """Returns a DataFrame of each step's ``n`` longest matrix kernels read one by one:
    microseconds, share of those kernels' time, tensor, SM, DRAM and issue %, and the
    bottleneck :func:`fp16lab.ncu.bottleneck` reads from them, indexed by (workload, precision,
    launch: the kernel's place among those read, kernel)."""
    import pandas as pd

    n = validate.count("n", n)
    df = pd.DataFrame([r for r in rows if r.get("what") == "kernel"])
    if df.empty:
        return df
    df["share %"] = 100 * df["duration_ns"] / df.groupby(["workload", "precision"])[
        "duration_ns"].transform("sum")
    df["us"] = (df["duration_ns"] / 1e3).round().astype(int)
    df["kernel"] = df["kernel"].str.slice(0, 48)
    df["launch"] = df.groupby(["workload", "precision"]).cumcount()
    df["reading"] = [ncu.bottleneck(ncu.KernelCounters(0, "", values={
        k: r[k] for k in ("tensor", "sm", "dram")}))[0] for _, r in df.iterrows()]
    top = (df.sort_values("duration_ns", ascending=False)
           .groupby(["workload", "precision"], sort=False).head(n)
           .sort_values(["workload", "precision", "duration_ns"], ascending=[True, True, False]))
    return top.set_index(["workload", "precision", "launch", "kernel"])[
        ["us", "share %", "tensor", "sm", "dram", "issue", "reading"]].round(1)


def _scopes(figures: Iterable[dict[str, Any]]) -> str:
    scopes = sorted({f.get("scope") or "unknown" for f in figures})
    return f" (figures over {' / '.join(scopes)})"


def claims(figures: dict[tuple[str, str], dict[str, Any]], ladder: list[dict]) -> list[dict]:
    """Returns the source's two claims, each with the figures measured (from
    :func:`step_figures`), their scope, and a verdict."""
    out = []
    amp = {m: r for (m, p), r in figures.items() if p == "amp-fp16"}
    fp32 = {m: r for (m, p), r in figures.items() if p == "fp32"}
    cublas = next((r for r in ladder if r["impl"] == "cupy.matmul"), None)
    if amp:
        issue = {m: r["issue"] for m, r in amp.items()}
        below = all(v < SOURCE["issue_below"] for v in issue.values())
        out.append({
            "claim": "warp scheduling efficiency under 70% in FP16 training",
            "measured": {"issue_slots_busy_pct": issue,
                         "scope": {m: r.get("scope") for m, r in amp.items()},
                         "cublas_gemm_issue_pct": cublas and cublas["issue"],
                         "cublas_gemm_tensor_pct": cublas and cublas["tensor"]},
            "holds": below,
            "verdict": ("the figure holds: issue slots are busy under 70% of the cycles in "
                        f"every AMP step read ({', '.join(f'{m} {v:.0f}%' for m, v in issue.items())})"
                        if below else "the figure does not hold: an AMP step keeps issue slots "
                        "busy 70% or more") + _scopes(amp.values()) + (
                f"; but cuBLAS's fastest GEMM (timed alone, among notebook 03's GEMM kernels) "
                f"issues in {cublas['issue']:.0f}% of cycles with its tensor pipes "
                f"{cublas['tensor']:.0f}% busy: a low issue rate is no sign of waste"
                if cublas else "")})
    if amp and fp32:
        pairs = {m: {"fp32": {"dram": fp32[m]["dram"], "sm": fp32[m]["sm"]},
                     "amp-fp16": {"dram": amp[m]["dram"], "sm": amp[m]["sm"]},
                     "scope": amp[m].get("scope")}
                 for m in amp if m in fp32}
        # the claim is about a whole step: figures over some of its kernels can show it (the
        # memory-bound kernels they leave out would only add to DRAM) but cannot refute it
        bound = {m: True if f["amp-fp16"]["dram"] >= 85 and f["amp-fp16"]["sm"] <= 60 else
                 False if f["scope"] == "whole step" else None for m, f in pairs.items()}
        known = [v for v in bound.values() if v is not None]
        out.append({
            "claim": "FP32: DRAM 82%, SM 75%; FP16: DRAM 95%, SM 51% (memory-bound, SM half idle)",
            "measured": pairs, "holds": any(known) if known else None, "holds_per_model": bound,
            "verdict": "; ".join(
                f"{m}: FP32 DRAM {f['fp32']['dram']:.0f}% SM {f['fp32']['sm']:.0f}%, AMP DRAM "
                f"{f['amp-fp16']['dram']:.0f}% SM {f['amp-fp16']['sm']:.0f}%: "
                + {True: "memory-bound as claimed",
                   False: "not the claimed picture (DRAM 85%+ with SM 60% or less)",
                   None: "these kernels are not memory-bound, but the step's other kernels were "
                         "not read: not settled"}[bound[m]]
                for m, f in pairs.items()) + _scopes(amp[m] for m in pairs)})
    return out


def _key(row: dict[str, Any]) -> tuple:
    if row["part"] == "ladder":
        return ("ladder",)
    return (row["part"], row["what"], row["workload"], row["precision"])


def _previous(path: Any) -> dict[str, Any] | None:
    """Returns the result file at ``path``, or None where there is none."""
    try:
        return measure.read_result(path, allow_empty=True)
    except FileNotFoundError:
        return None


def _merged(old: dict[str, Any] | None, rows: list[dict], meta: dict) -> tuple[list[dict], dict]:
    """Returns an earlier result (``old``, read before this run wrote anything) merged with
    this run's rows and meta: the earlier rows of every (part, what, workload, precision) not
    measured now kept, each row saying when it was measured."""
    if old is None:
        return rows, meta
    now = {_key(r) for r in rows}
    then = old["meta"].get("measured_at")
    kept = [{"measured_at": then, **r} for r in old["rows"] if _key(r) not in now]
    # the provenance is this run's (its rows carry none of their own; the kept ones say when)
    merged = {**old["meta"], **device.metadata(),
              **{k: v for k, v in meta.items() if k not in ("seconds", "skipped")}}
    for part in ("seconds", "skipped"):
        merged[part] = {**old["meta"].get(part, {}), **meta.get(part, {})}
    for k in meta.get("seconds", {}):  # measured again now: an earlier refusal no longer holds
        merged["skipped"] = {s: w for s, w in merged["skipped"].items() if not s.startswith(k)
                             or s in meta.get("skipped", {})}
    return kept + rows, merged


def _claims_only(args: Any) -> int:
    if not args.name:
        print("--claims-only needs --name: the result file whose claims to recompute",
              file=sys.stderr)
        return 2
    folder = output_folder(args)
    result = measure.read_result(folder / f"{args.name}.json")
    _rewrite_with_claims(args.name, result["rows"], result["meta"], folder)
    return 0


def _rewrite_with_claims(name: str, rows: list[dict], meta: dict[str, Any], folder: Any) -> None:
    """Recomputes the claims of a result file's rows, writes the file back and prints them.
    The file's own meta wins over this machine's: its provenance stays the measurement's."""
    meta["claims"] = claims(step_figures(rows), [r for r in rows if r["part"] == "ladder"])
    measure.write_result(name, rows, meta=meta, data_dir=folder)
    for c in meta["claims"]:
        print(f"claim: {c['claim']}\n  {c['verdict']}")


def _retime(args: Any) -> int:
    if not args.name:
        print("--retime needs --name: the result file whose steps to time", file=sys.stderr)
        return 2
    folder = output_folder(args)
    result = measure.read_result(folder / f"{args.name}.json")
    rows, meta = result["rows"], result["meta"]
    for r in rows:
        if r.get("what") != "range":
            continue
        child = _me("step", r["workload"], r["precision"], r["batch"])
        key = f"{r['workload']} {r['precision']}"
        timed = _timed_or_skipped(child, key, args.timeout, meta["skipped"])
        if not timed:
            continue
        counters = ncu.KernelCounters(0, r.get("kernel", ""), values={
            k: r[k] for k in ("duration_ns", "sm", "dram") if k in r})
        r.update(range_check(counters, timed), timed_at=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                      time.gmtime()))
        print(f"{key}: range {r['duration_ns'] / 1e6:.1f} ms, the step without ncu "
              f"{r['step_ms']:.1f} ms; over the step: SM {r['sm_step']:.0f}%  DRAM "
              f"{r['dram_step']:.0f}%", flush=True)
    _rewrite_with_claims(args.name, rows, meta, folder)
    return 0


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    ap = argument_parser("counters", __doc__.splitlines()[0])
    ap.add_argument("--parts", default=list(PARTS),
                    type=validate.argument(validate.choice, PARTS, many=True),
                    help="ladder, step or both (comma-separated)")
    ap.add_argument("--size", type=validate.argument(validate.count, low=128), default=8192,
                    help="the ladder's N (N x N x N products; default 8192)")
    ap.add_argument("--launch-count", type=validate.argument(validate.count, low=0), default=60,
                    help="matrix kernels of each step read one by one (default 60; 0: none)")
    ap.add_argument("--whole-step", default="app-range", choices=("app-range", "range", "none"),
                    help="how the whole step is read as one range: app-range (default; the "
                         "program re-run once per pass), range (replayed in the process: "
                         "refused by ncu 2025.3 for a PyTorch step) or none")
    ap.add_argument("--workloads", default=[w for w, _ in MODELS],
                    type=validate.argument(validate.choice, [w for w, _ in MODELS], many=True),
                    help="the step part's workloads (comma-separated; default both)")
    ap.add_argument("--precisions", default=list(PRECISIONS),
                    type=validate.argument(validate.choice, PRECISIONS, many=True),
                    help="the step part's precisions (comma-separated; default both)")
    ap.add_argument("--retime", action="store_true",
                    help="read no counters: time each step of the result file named by --name "
                         "that was read as a range, without ncu, and set its counters against "
                         "that time again")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of the existing result file that this run does not "
                         "measure again")
    ap.add_argument("--timeout", type=validate.argument(validate.number, low=0, low_open=True),
                    default=300, help="seconds each ncu run may take (default 300)")
    add_output_arguments(ap, "counters_<gpu>")
    ap.add_argument("--claims-only", action="store_true",
                    help="measure nothing: recompute the claims of the result file named by "
                         "--name from its rows")
    args = ap.parse_args(argv)
    if args.claims_only:
        return _claims_only(args)
    if args.retime:
        return _retime(args)
    why = ncu.unavailable()
    if why:
        print(f"fp16lab.bench.counters needs Nsight Compute and a GPU: {why}", file=sys.stderr)
        return 2
    import torch

    gpu = re.sub(r"[^a-z0-9]+", "", torch.cuda.get_device_name().lower().split()[-1]) or "gpu"
    name, out = args.name or f"counters_{gpu}", output_folder(args)
    previous = _previous(out / f"{name}.json") if args.merge else None
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"metrics": {k: v[0] for k, v in ncu.METRICS.items()},
                            "source": SOURCE, "seconds": {}, "skipped": {}}

    def save() -> Any:  # after each part: a run cut short keeps what it measured
        kept_rows, kept_meta = _merged(previous, rows, meta)
        kept_meta["claims"] = claims(step_figures(kept_rows),
                                     [r for r in kept_rows if r["part"] == "ladder"])
        return measure.write_result(name, kept_rows, meta=kept_meta, data_dir=out), kept_meta

    if "ladder" in args.parts:
        t0 = time.perf_counter()
        names = runnable() + ["cupy.matmul"]
        kernels = ncu.profile(_me("ladder", args.size), timeout=args.timeout)
        rows += ladder_rows(kernels, names, args.size)
        meta["seconds"]["ladder"] = time.perf_counter() - t0
        meta["ladder_size"] = args.size
        print(f"ladder at {args.size}^3 profiled in {meta['seconds']['ladder']:.0f} s")
        for r in rows:
            print(f"  {r['impl']:14s} {r['tflops']:6.0f} TFLOP/s  {r['intensity_flop_per_byte']:6.0f} "
                  f"FLOP/B  tensor {r['tensor']:3.0f}%  SM {r['sm']:3.0f}%  DRAM {r['dram']:3.0f}%  "
                  f"issue {r['issue']:3.0f}%  {r['bottleneck']}; moved: {r.get('moved', '-')}",
                  flush=True)
        saved = save()
    if "step" in args.parts:
        for workload, batch in [(w, b) for w, b in MODELS if w in args.workloads]:
            for precision in [p for p in PRECISIONS if p in args.precisions]:
                t0 = time.perf_counter()
                key = f"{workload} {precision}"
                child = _me("step", workload, precision, batch)
                whole, kernels, timed = None, [], []
                try:
                    if args.whole_step != "none":
                        (whole,) = ncu.profile(child, ncu.STEP_METRICS, replay=args.whole_step,
                                               timeout=args.timeout)
                except ncu.NcuUnavailable as e:
                    meta["skipped"][f"{key}, whole step"] = str(e)
                    print(f"{key}: whole step not read: {e}", flush=True)
                if whole is not None:
                    timed = _timed_or_skipped(child, key, args.timeout, meta["skipped"])
                try:
                    if args.launch_count:
                        kernels = ncu.profile(child, ncu.STEP_METRICS,
                                              kernel_regex=MATRIX_KERNELS,
                                              launch_count=args.launch_count,
                                              timeout=args.timeout)
                except ncu.NcuUnavailable as e:
                    meta["skipped"][f"{key}, matrix kernels"] = str(e)
                    print(f"{key}: matrix kernels not read: {e}", flush=True)
                common = {"part": "step", "workload": workload, "precision": precision,
                          "batch": batch}
                if whole is not None:
                    r = {**common, "what": "range", "replay": args.whole_step,
                         **_counters(whole), **range_check(whole, timed)}
                    rows.append(r)
                    print(f"{key}: range {r['duration_ns'] / 1e6:.1f} ms, the step without "
                          f"ncu {r.get('step_ms', math.nan):.1f} ms (median of {len(timed)}); "
                          f"over the step: SM {r.get('sm_step', math.nan):.0f}%  DRAM "
                          f"{r.get('dram_step', math.nan):.0f}%; tensor "
                          f"{r.get('tensor', math.nan):.0f}%  issue "
                          f"{r.get('issue', math.nan):.0f}%  DRAM read "
                          f"{r.get('dram_read', math.nan) / 1e9:.1f} GB, written "
                          f"{r.get('dram_write', math.nan) / 1e9:.1f} GB", flush=True)
                rows += [{**common, "what": "kernel", **_counters(k)} for k in kernels]
                meta["seconds"][key] = time.perf_counter() - t0
                print(f"{key}: {len(kernels)} matrix kernels; {meta['seconds'][key]:.0f} s",
                      flush=True)
                saved = save()
    path, written = saved
    for c in written["claims"]:
        print(f"claim: {c['claim']}\n  {c['verdict']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
