"""A torch.profiler trace as a table of events in two lanes (cpu, gpu), each sorted into a kind."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from .intervals import intervals

#: Kinds of work an event is sorted into, with the colour the timeline draws them in.
KINDS = {
    "gemm-conv": "#d62728",
    "elementwise": "#1f77b4",
    "reduction": "#2ca02c",
    "copy": "#9467bd",
    "nccl": "#ff7f0e",
    "other": "#7f7f7f",
}

#: Name patterns of each kind, tried in this order (first match wins); case-insensitive.
#: Kernel names come from cuBLAS (nvjet, sm90_xmma, cutlass), cuDNN (implicit_convolve, fprop,
#: dgrad, wgrad), PyTorch's own kernels (elementwise_kernel, reduce_kernel) and Triton/inductor
#: (triton_poi = pointwise, triton_red / triton_per = reductions).
_PATTERNS = (
    ("nccl", r"nccl"),
    ("copy", r"memcpy|memset|^aten::(copy_|to|_to_copy|clone|contiguous|fill_|zero_|zeros|empty)$"
             r"|copy_kernel|fill_kernel|cat_?array"),
    ("reduction", r"bn_fw|bn_bw|batch_?norm|layer_?norm|group_?norm|softmax"),
    ("gemm-conv", r"gemm|nvjet|xmma|cutlass|wgmma|hmma|cudnn|conv|fprop|dgrad|wgrad|implicit_"
                  r"|^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_dot_product\w*)$|triton_tem"
                  r"|sm\d+_\w*(s|h)\d{4}|(addmm|bmm|mm|linear)backward"),
    ("reduction", r"reduce|norm|welford|softmax|nll_loss|cross_entropy|sum|mean|\bmax\b|argmax"
                  r"|triton_red|triton_per|_amp_foreach_non_finite|amp_update_scale"),
    ("elementwise", r"elementwise|vectori[sz]ed|unrolled|foreach|pointwise|triton_poi|relu|gelu"
                    r"|silu|sigmoid|tanh|^aten::(add|sub|mul|div|addcmul|addcdiv|lerp|threshold"
                    r"\w*|where|neg|exp|sqrt|rsqrt|_fused_sgd\w*|_fused_adam\w*)_?$|fused_sgd"
                    r"|fused_adam|dropout"),
)
_COMPILED = tuple((kind, re.compile(p, re.IGNORECASE)) for kind, p in _PATTERNS)

#: Trace categories of device work, and of host calls that launch it.
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


def classify(name: str, category: str = "") -> str:
    """Returns the kind (a key of ``KINDS``) of a kernel or operator, from its name and category."""
    if category in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    for kind, pattern in _COMPILED:
        if pattern.search(name):
            return kind
    return "other"


def read_trace(trace: str | Path | dict[str, Any]) -> pd.DataFrame:
    """Returns the trace's complete events as a table, one row per event, sorted by start.

    Columns: ``lane`` ('cpu' or 'gpu'), ``category`` (the trace's own: cpu_op, kernel,
    cuda_runtime, ...), ``name``, ``kind`` (see ``KINDS``; annotations get 'annotation'),
    ``start_us``, ``dur_us``, ``end_us`` (microseconds since the trace's first event),
    ``stream`` (the CUDA stream for GPU events), ``top_level`` (True for a CPU operator not
    nested inside another operator of the same thread).

    Args:
        trace: the path of a Chrome trace JSON (what torch.profiler's ``export_chrome_trace``
            writes), or the parsed JSON itself.
    """
    if isinstance(trace, (str, Path)):
        path = Path(trace)
        if not path.exists():
            raise FileNotFoundError(f"no trace file at {path}")
        trace = json.loads(path.read_text())
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("a Chrome trace is a JSON object with a 'traceEvents' list "
                         f"(or that list itself); got {type(trace).__name__}")
    rows = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat = str(e.get("cat", ""))
        name = str(e.get("name", ""))
        if cat in _GPU_CATS:
            lane, kind = "gpu", classify(name, cat)
        elif cat == "gpu_user_annotation":
            continue  # the profiler's copy of a CPU range onto the GPU lane, not device work
        elif cat == "user_annotation":
            lane, kind = "cpu", "annotation"
        elif cat in _LAUNCH_CATS:  # a host wait shows apart from the launches
            lane, kind = "cpu", "sync" if "Synchronize" in name else "launch"
        elif cat == "cpu_op":
            lane, kind = "cpu", classify(name, cat)
        else:
            continue
        args = e.get("args") or {}
        rows.append({"lane": lane, "category": cat, "name": name, "kind": kind,
                     "start_us": float(e["ts"]), "dur_us": float(e["dur"]),
                     "stream": args.get("stream", e.get("tid")) if lane == "gpu" else None,
                     "tid": e.get("tid")})
    columns = ["lane", "category", "name", "kind", "start_us", "dur_us", "end_us", "stream",
               "top_level"]
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows).sort_values(["start_us", "dur_us"], ascending=[True, False])
    df["start_us"] -= df["start_us"].min()
    df["end_us"] = df["start_us"] + df["dur_us"]
    df["top_level"] = _top_level(df)
    return df[columns].reset_index(drop=True)


def _top_level(df: pd.DataFrame) -> pd.Series:
    """Returns True for CPU operators that no other operator of the same thread encloses."""
    top = pd.Series(False, index=df.index)
    ops = df[(df["lane"] == "cpu") & (df["category"] == "cpu_op")]
    for _, group in ops.groupby("tid"):
        # sorted by start, longest first: an op that starts at or after the furthest end so far
        # is nested in nothing
        reach = float("-inf")
        for idx, start, end in zip(group.index, group["start_us"], group["end_us"]):
            if start >= reach:
                top[idx] = True
            reach = max(reach, end)
    return top


def events_from_table(columns: list[str], rows: list[list[Any]]) -> pd.DataFrame:
    """Returns an event table like :func:`read_trace`'s from stored rows (a measured file's).

    The rows need at least the columns lane, kind, start_us and dur_us; stored CPU rows are taken
    to be top-level operators or launches (what the benchmark keeps).
    """
    df = pd.DataFrame(rows, columns=list(columns))
    missing = {"lane", "kind", "start_us", "dur_us"} - set(df.columns)
    if missing:
        raise ValueError(f"stored events lack the columns {sorted(missing)}; they have {list(columns)}")
    bad = set(df["lane"]) - {"cpu", "gpu"}
    if bad:
        raise ValueError(f"lane must be 'cpu' or 'gpu', got {sorted(bad)}")
    df["start_us"] = df["start_us"].astype(float)
    df["dur_us"] = df["dur_us"].astype(float)
    df["end_us"] = df["start_us"] + df["dur_us"]
    try:
        intervals(df["start_us"], df["end_us"])
    except ValueError as e:
        raise ValueError(f"stored events: {e} (start_us and dur_us must be finite, "
                         f"dur_us >= 0)") from None
    df["top_level"] = (df["lane"] == "cpu") & ~df["kind"].isin(["launch", "sync"])
    if "name" not in df:
        df["name"] = ""
    return df.sort_values("start_us").reset_index(drop=True)
