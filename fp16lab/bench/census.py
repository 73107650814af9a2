"""How fast is a tensor census? GB/s of input read, against the copy rate measured in the same run.

A census reads every element once, so its floor is the time to read the input: a read-only
pass at full bandwidth moves half the bytes of a copy of the same tensor, and the issue's goal,
"at least half the copy bandwidth", means a census of N bytes may take as long as copying them.
Reported per row: GB/s = input bytes / median time, and ratio = that / copy GB/s (copy GB/s
counts bytes read plus written, as measure.copy_bandwidth_gbs does).

Rows: CPU (numpy, chunked) for fp32 and fp16 input; on a GPU, the one-pass CuPy kernel alone
("kernel": one launch, no synchronisation), the full census() call including everything a caller
pays (Python, the launch, the wait for the counts in host memory, the result object), timed by
CUDA events around it ("census()") and by the host clock ("census() wall clock": the time the
caller waits, without the events' own latency), and the torch fallback (several torch passes), for fp32, fp16 and bf16 input. With --gpu-only
(or --cpu-only) the rows of the other device already in the result file are kept.

    python -m fp16lab.bench.census             # 1e8 elements, CPU and GPU if present
    python -m fp16lab.bench.census --gpu-only  # skip the (slow) CPU rows
    python -m fp16lab.bench.census --quick     # 1e6 elements on the CPU, a smoke test
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fp16lab import measure, validate
from fp16lab.bench import argument_parser
from fp16lab.census import census
from fp16lab.formats import format_info
from fp16lab.kernels.census import cupy_kernel_launcher
from fp16lab.kernels.launch import direct_launches


def cpu_copy_gbs(nbytes: int, repeat: int) -> float:
    """Returns the host memory copy rate in GB/s (bytes read plus written) for nbytes."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    t = measure.time_cpu(lambda: np.copyto(dst, src), warmup=1, repeat=repeat)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9


def sample(n: int, seed: int = 0) -> np.ndarray:
    """Returns n float32 values spread over many binades (like gradients: mostly small)."""
    rng = np.random.default_rng(seed)
    x = np.empty(n, dtype=np.float32)
    step = 1 << 24
    for i in range(0, n, step):
        m = min(step, n - i)
        x[i:i + m] = rng.standard_normal(m, dtype=np.float32) * np.float32(1e-3)
    return x


def kernel_layout(c) -> np.ndarray:
    """Returns a CensusResult as the kernel's raw output: cumulative class counts, then bins."""
    k = c.counts
    cum = np.cumsum([k["zero"], k["underflow"], k["subnormal"], k["normal"]])
    return np.concatenate([cum, [k["nan"]], c.hist]).astype(np.int64)


def agrees(ok: bool, what: str) -> bool:
    """Returns ok, and says loudly when a GPU path disagrees with the CPU census."""
    if not ok:
        print(f"!!! {what} DISAGREES with the CPU census on the first 2^24 values", flush=True)
    return bool(ok)


def row(device, backend, what, dtype, n, itemsize, t, copy_gbs, fmt, ok=True) -> dict:
    gbs = n * itemsize / (t.median_ms * 1e-3) / 1e9
    return {"device": device, "backend": backend, "what": what, "dtype": dtype, "format": fmt,
            "agrees_with_cpu": ok,
            "n": n, "bytes": n * itemsize, "gbs": gbs, "copy_gbs": copy_gbs,
            "ratio_to_copy": gbs / copy_gbs, "median_ms": t.median_ms, "p10_ms": t.p10_ms,
            "p90_ms": t.p90_ms, "spread": t.spread, "repeats": t.n}


def _with_launch_path(rows: list[dict]) -> list[dict]:
    """Returns rows stamped with whether the CUDA kernel went through the direct cuLaunchKernel path."""
    import importlib

    launched = bool(importlib.import_module("fp16lab.kernels.census")._STATES)
    direct = direct_launches() if launched else None
    print(f"kernel launched by one cuLaunchKernel call (not CuPy's argument path): {direct}",
          flush=True)
    for r in rows:
        r["direct_launch"] = direct
    return rows


def run_cpu(x32: np.ndarray, fmt: str, repeat: int) -> list[dict]:
    n = x32.size
    copy = cpu_copy_gbs(x32.nbytes, repeat)
    rows = []
    for name, x in (("float32", x32), ("float16", x32.astype(np.float16))):
        t = measure.time_cpu(lambda: census(x, fmt), warmup=1, repeat=repeat)
        rows.append(row("cpu", "numpy", "census()", name, n, x.itemsize, t, copy, fmt))
        print(f"cpu {name}: {rows[-1]['gbs']:.2f} GB/s (copy {copy:.2f})", flush=True)
        del x
    return _with_launch_path(rows)


def run_gpu(x32: np.ndarray, fmt: str, repeat: int) -> list[dict]:
    import torch

    n = x32.size
    copy = measure.copy_bandwidth_gbs(max(x32.nbytes, 2**28))
    print(f"device-to-device copy: {copy:.0f} GB/s", flush=True)
    rows = []
    xg32 = torch.from_numpy(x32).cuda()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = xg32.to(dtype)
        name = str(dtype).replace("torch.", "")
        ref = census(x[: 2**24].cpu(), fmt)  # the oracle for the GPU paths: numpy on the host
        got = cupy_kernel_launcher(x, fmt)
        if got is not None:
            small = cupy_kernel_launcher(x[: 2**24], fmt)[0]
            ok = agrees(np.array_equal(small().cpu().numpy(), kernel_layout(ref)),
                        f"{name} kernel")
            launch = got[0]
            t = measure.time_cuda(launch, warmup=3, repeat=repeat)
            rows.append(row("cuda", "cupy", "kernel", name, n, x.element_size(), t, copy, fmt,
                            ok))
            check = census(x[1: 2**24 + 1], fmt, backend="cupy")  # an unaligned start too
            ref1 = census(x[1: 2**24 + 1].cpu(), fmt)
            ok = agrees(check.counts == ref1.counts and np.array_equal(check.hist, ref1.hist),
                        f"{name} census(backend='cupy')")
            # everything a caller pays: launch, the copy of the counts to the host, the result
            t = measure.time_cuda(lambda: census(x, fmt, backend="cupy"), warmup=3, repeat=repeat)
            rows.append(row("cuda", "cupy", "census()", name, n, x.element_size(), t, copy, fmt,
                            ok))
            # census() returns only when its result is on the host: the time its caller waits,
            # by the host's clock (the events above also count their own records' latency)
            t = measure.time_cpu(lambda: census(x, fmt, backend="cupy"), warmup=3, repeat=repeat)
            rows.append(row("cuda", "cupy", "census() wall clock", name, n, x.element_size(), t,
                            copy, fmt, ok))
        else:
            print("CuPy kernel unavailable (no CuPy?): torch fallback only", flush=True)
        check = census(x[: 2**24], fmt, backend="torch")
        ok = agrees(check.counts == ref.counts and np.array_equal(check.hist, ref.hist),
                    f"{name} census(backend='torch')")
        t = measure.time_cuda(lambda: census(x, fmt, backend="torch"), warmup=2,
                            repeat=max(3, repeat // 4))
        rows.append(row("cuda", "torch", "census()", name, n, x.element_size(), t, copy, fmt, ok))
        for r in rows:
            if r["dtype"] == name:
                print(f"cuda {name} {r['backend']} {r['what']}: {r['gbs']:.0f} GB/s "
                      f"= {r['ratio_to_copy']:.2f} x copy", flush=True)
        del x
    return _with_launch_path(rows)


def _format_name(name: str, value: str) -> str:
    """Returns the canonical name of the format ``value`` names (an alias too: ``half``)."""
    return format_info(value).name


def main(argv: list[str] | None = None) -> int:
    p = argument_parser("census", __doc__.splitlines()[0])
    p.add_argument("--size", type=validate.argument(validate.count), default=int(1e8),
                   help="elements (default 1e8)")
    p.add_argument("--format", type=validate.argument(_format_name), default="fp16",
                   help="census format (default fp16)")
    p.add_argument("--repeat", type=validate.argument(validate.count), default=20)
    p.add_argument("--quick", action="store_true", help="1e6 elements, CPU only, few repeats")
    p.add_argument("--cpu-only", action="store_true")
    p.add_argument("--gpu-only", action="store_true")
    p.add_argument("--name", type=validate.argument(validate.text), default="census_bench",
                   help="result file stem under data/")
    p.add_argument("--replace", action="store_true",
                   help="write the committed file in data/ instead of data/local/")
    a = p.parse_args(argv)
    if a.quick:
        a.size, a.repeat, a.cpu_only = 10**6, 5, True
    n = int(a.size)
    x32 = sample(n)
    rows: list[dict] = []
    if not a.gpu_only:
        rows += run_cpu(x32, a.format, max(3, min(a.repeat, 5)))
    if not a.cpu_only:
        import torch

        if torch.cuda.is_available():
            rows += run_gpu(x32, a.format, a.repeat)
        else:
            print("no CUDA GPU: GPU rows skipped", flush=True)
    if not a.quick:  # keep the rows of the device not measured now (e.g. CPU with --gpu-only)
        rows = measure.merge_with_previous(a.name, rows, data_dir=measure.data_dir() if a.replace else None)
    import tempfile

    data_dir = Path(tempfile.mkdtemp()) if a.quick else None  # a smoke test leaves data/ alone
    path = measure.write_result(a.name, rows, data_dir=data_dir, replace=a.replace,
                              meta={"benchmark": "census", "n": n, "format": a.format,
                                    "quick": a.quick})
    print(f"\nwrote {path}")
    print("GB/s = input bytes (n * itemsize, read once) / median time; copy GB/s = bytes read + "
          "written by a device copy;\nratio = GB/s / copy GB/s (0.5 = a census of N bytes takes "
          "as long as copying N bytes)")
    print(f"{'device':6} {'backend':7} {'what':24} {'dtype':9} {'GB/s':>9} {'copy GB/s':>10} "
          f"{'ratio':>6} {'median ms':>10} {'correct':>7}")
    for r in rows:
        print(f"{r['device']:6} {r['backend']:7} {r['what']:24} {r['dtype']:9} {r['gbs']:9.1f} "
              f"{r['copy_gbs']:10.1f} {r['ratio_to_copy']:6.2f} {r['median_ms']:10.3f} "
              f"{str(r['agrees_with_cpu']):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
