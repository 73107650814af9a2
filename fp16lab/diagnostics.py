"""Gradient health in FP16: where gradients fall, cheap per-layer hooks, and the first inf/NaN.

What FP16 does to a gradient value ``g`` when it is stored (round to nearest even):

* ``|g| <= 2**-25`` (and ``g != 0``): rounds to zero - *underflow*, the update is lost;
* ``2**-25 < |g| < 2**-14``: a *subnormal*, kept with fewer significant bits;
* ``2**-14 <= |g| < 65520``: a *normal* number, 11 significant bits;
* ``|g| >= 65520``: rounds to inf - *overflow*, and a loss scaler skips the step.

This module has four parts:

* :func:`fp16_fate` / :func:`gradient_fate_table`: the exact fractions above for a tensor, and for
  every parameter's gradient at several loss scales (lost at scale 1, kept at scale S);
* :class:`GradientMonitor`: per-parameter statistics collected by hooks during backward, computed
  on the device for all parameters at once in a handful of passes and never read back until
  asked - cheap enough to leave on (``fp16lab.bench.diagnostics_overhead`` measures it);
* :func:`locate_first_nonfinite`: runs one step and names the first module whose forward output
  or backward gradient became inf/NaN;
* measured demonstrations: :func:`fp32_island_demo`, :func:`clipping_demo`,
  :func:`scheduler_warning_demo`.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch
from torch import nn

from .scaling import (GradScalerRecorder, ScaleCollapseWarning, classify_skips)

#: FP16 facts used below (IEEE binary16).
FP16_MIN_SUBNORMAL = 2.0**-24
FP16_MIN_NORMAL = 2.0**-14
FP16_MAX = 65504.0
FP16_OVERFLOW_AT = 65520.0  # the rounding midpoint between 65504 and 2**16

FATES = ("zero", "underflow", "subnormal", "normal", "overflow", "nonfinite")


# --------------------------------------------------------------------------------------------
# Exact fates of values stored in FP16
# --------------------------------------------------------------------------------------------
def fp16_fate(values: torch.Tensor, scale: float = 1.0) -> dict[str, float]:
    """Returns the fractions of ``values * scale`` that FP16 stores as zero, underflow, etc.

    The fates (``FATES``) partition the elements: ``zero`` (already exactly zero), ``underflow``
    (non-zero, becomes 0), ``subnormal``, ``normal``, ``overflow`` (finite, becomes inf) and
    ``nonfinite`` (already inf/NaN). The product is taken in float64 and cast to FP16 once, so
    the answer is exact for any float32 input and any scale.
    """
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a torch.Tensor, got {type(values).__name__}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite positive number, got {scale!r}")
    x = values.detach().to("cpu", torch.float64).reshape(-1) * float(scale)
    n = x.numel()
    if n == 0:
        return {f: 0.0 for f in FATES}
    finite = torch.isfinite(x)
    # float64 -> float16 via float32 could round twice; x is a float32 times a scale, so use
    # the exact thresholds instead of a cast.
    a = x.abs()
    zero = (x == 0)
    under = finite & ~zero & (a <= 2.0**-25)
    over = finite & (a >= FP16_OVERFLOW_AT)
    # rounds to a subnormal: (2**-25, 2**-14 - 2**-25); the midpoint ties to 2**-14 (even)
    sub = finite & (a > 2.0**-25) & (a < FP16_MIN_NORMAL - 2.0**-25)
    normal = finite & ~zero & ~under & ~over & ~sub
    counts = {"zero": zero, "underflow": under, "subnormal": sub, "normal": normal,
              "overflow": over, "nonfinite": ~finite}
    return {k: float(v.sum()) / n for k, v in counts.items()}


def gradient_fate_table(named_grads: Iterable[tuple[str, torch.Tensor]],
                        scales: Iterable[float] = (1.0, 2.0**16)):
    """Returns a DataFrame: per parameter and scale, the FP16 fate fractions of its gradient.

    ``lost`` is the underflow fraction (non-zero values FP16 turns to 0) and ``kept`` the
    fraction that stays non-zero and finite (subnormal + normal); feed it FP32 gradients.
    """
    import pandas as pd

    rows = []
    for name, g in named_grads:
        if g is None:
            continue
        for s in scales:
            f = fp16_fate(g, s)
            rows.append({"param": name, "scale": float(s), "numel": g.numel(), **f,
                         "lost": f["underflow"], "kept": f["subnormal"] + f["normal"]})
    return pd.DataFrame(rows)


def census_lost_kept(named_grads: Iterable[tuple[str, torch.Tensor]], scale: float = 2.0**16):
    """Returns a DataFrame from :func:`fp16lab.census.census`: per parameter, the fraction of its
    gradient lost to FP16 underflow at scale 1 and the fraction kept (finite, non-zero) at
    ``scale``, with the overflow fraction at ``scale``. Feed it FP32 gradients."""
    import pandas as pd

    from .census import census

    rows = []
    for name, g in named_grads:
        g = g.detach().float().cpu()
        one = census(g, "fp16").fractions
        big = census(g.double() * float(scale), "fp16").fractions  # exact: a float64 product
        rows.append({"param": name, "numel": g.numel(), "zero": one["zero"],
                     "lost_at_1": one["underflow"],
                     "kept_at_1": one["subnormal"] + one["normal"],
                     "lost_at_S": big["underflow"], "kept_at_S": big["subnormal"] + big["normal"],
                     "overflow_at_S": big["overflow"], "S": float(scale)})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Cheap per-layer statistics with hooks
# --------------------------------------------------------------------------------------------
#: Bins of the monitor's histogram, read straight from the float32 bit pattern of |g|:
#: 0 zero, 1 float32 subnormal (|g| < 2**-126), then one bin per binary exponent
#: floor(log2|g|) = -126 .. 127, then inf, then NaN.
EXP_MIN, EXP_MAX = -126, 127
_ZERO_BIN = 0
_F32_SUBNORMAL_BIN = 1
_INF_BIN = EXP_MAX - EXP_MIN + 3
_NAN_BIN = _INF_BIN + 1
N_BINS = _NAN_BIN + 1
#: Parameters per torch.histc call on the CUDA path: 23 * N_BINS counts fit in 48 KiB of shared
#: memory even as float64, and CUDA histc sizes its grid from (elements / bins), so calls over
#: fewer, similar-sized parameters run on more blocks.
_HISTC_PARAMS_PER_CALL = 23
#: Upper edges (exclusive) of bins 0 .. N_BINS-2 on the bit pattern of |g| read as an int32:
#: 0 -> zero, [1, 2**23) -> float32 subnormal, [E * 2**23, (E+1) * 2**23) -> exponent E - 127,
#: 0x7F800000 -> inf, above -> NaN.
_BIN_UPPER_EDGES = [1] + [e << 23 for e in range(1, 256)] + [0x7F800001]


def _bin_of_exponent(e: int) -> int:
    return e - EXP_MIN + 2


def _flat_view(g: torch.Tensor) -> torch.Tensor:
    """Returns g's elements as a 1-D tensor, in memory order (without a copy for contiguous and
    channels_last tensors: a histogram does not care about element order)."""
    if g.dim() == 4 and not g.is_contiguous() and g.is_contiguous(
            memory_format=torch.channels_last):
        return g.permute(0, 2, 3, 1).reshape(-1)
    return g.reshape(-1)


def _widened_cat(flats: list[torch.Tensor]) -> torch.Tensor:
    """Returns the 1-D tensors concatenated as a new float32 tensor (float16 / bfloat16 widen
    exactly), which the caller may overwrite."""
    flat = torch.cat(flats)
    return flat if flat.dtype == torch.float32 else flat.float()


def _bin_codes(flat: torch.Tensor, method: str = "ops",
               boundaries: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the monitor's histogram bin (int32) of every element of a float32 tensor, which
    it overwrites with |bits|.

    ``"ops"``: bin = E + 1 - [g == 0] + [g is NaN] from the biased exponent field E, a few
    integer passes (fastest on the CPU); ``"search"``: one ``torch.bucketize`` of the bits over
    ``boundaries`` (``_BIN_UPPER_EDGES`` as int32 on flat's device), fewer bytes moved on a GPU.
    """
    if flat.dtype != torch.float32 or flat.dim() != 1:
        raise ValueError(f"flat must be a 1-D float32 tensor, got {flat.dtype} {list(flat.shape)}")
    bits = flat.view(torch.int32).bitwise_and_(0x7FFFFFFF)  # |g|, also for -NaN
    if method == "ops":
        return (bits >> 23).add_(1).add_((bits > 0x7F800000).int()).sub_((bits == 0).int())
    if method == "search":
        if boundaries is None:
            boundaries = torch.tensor(_BIN_UPPER_EDGES, dtype=torch.int32, device=flat.device)
        return torch.bucketize(bits, boundaries, right=True, out_int32=True)
    raise ValueError(f"method must be 'ops' or 'search', got {method!r}")


def _segment_plan(sizes: list[int], device: torch.device, backend: str) -> dict[str, Any]:
    """Returns the per-element key offsets (and for ``"histc"`` the parameter order, histc calls
    and bin boundaries) for gradients of these sizes; built once per model and device.

    ``"bincount"``: int32 offsets (parameter index) * N_BINS, in parameter order.
    ``"histc"``: parameters sorted by size, largest first, in calls of
    ``_HISTC_PARAMS_PER_CALL``; float offsets (position * N_BINS + 0.5: the half keeps histc's
    float binning arithmetic away from the bin edges), float64 where one parameter has more than
    2**24 elements (histc counts in the keys' dtype); ``inverse`` maps the rows back.
    """
    n = len(sizes)
    if backend == "bincount":
        base = torch.repeat_interleave(
            torch.arange(n, device=device, dtype=torch.int32) * N_BINS,
            torch.tensor(sizes, device=device))
        return {"base": base}
    order = sorted(range(n), key=lambda i: -sizes[i])
    inverse = [0] * n
    for pos, i in enumerate(order):
        inverse[i] = pos
    sorted_sizes = [sizes[i] for i in order]
    dtype = torch.float64 if max(sizes) > 2**24 else torch.float32
    base = torch.repeat_interleave(
        torch.arange(n, device=device, dtype=dtype) * N_BINS + 0.5,
        torch.tensor(sorted_sizes, device=device))
    offsets = [0]
    for k in sorted_sizes:
        offsets.append(offsets[-1] + k)
    chunks = []
    for lo in range(0, n, _HISTC_PARAMS_PER_CALL):
        hi = min(lo + _HISTC_PARAMS_PER_CALL, n)
        chunks.append((lo, hi, offsets[lo], offsets[hi]))
    return {"base": base, "order": order, "chunks": chunks,
            "inverse": torch.tensor(inverse, device=device, dtype=torch.long),
            "boundaries": torch.tensor(_BIN_UPPER_EDGES, dtype=torch.int32, device=device)}


#: The CUDA path (with CuPy): one kernel counts every gradient's histogram and max|g| in one
#: pass over the gradients where they are. Each block takes one chunk of one gradient, bins its
#: elements into a shared-memory histogram (one atomic per distinct bin per warp:
#: ``__match_any_sync`` groups the lanes), and adds the non-zero bins to the gradient's row of
#: the output with one global atomic each; max|g| is the largest |g| bit pattern (NaN above inf,
#: as torch's norm(inf) has it), one atomicMax per block.
_BACKENDS = ("auto", "bincount", "histc", "cupy")
_STATS_CHUNK = 16384  # elements per block
_STATS_THREADS = 256
_STATS_KINDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: The monitor kernel's source, in fp16lab/kernels/ with the package's other CUDA code.
_STATS_FILE = "grad_stats.cu"


def auto_backend(device_type: str) -> str:
    """Returns the statistics backend ``"auto"`` picks for gradients on this kind of device:
    ``"bincount"`` off CUDA, ``"cupy"`` on CUDA where CuPy is installed, else ``"histc"``."""
    if device_type != "cuda":
        return "bincount"
    from .kernels.launch import cupy_or_none

    return "cupy" if cupy_or_none() is not None else "histc"


def _stats_function(device_index: int):
    """Returns the compiled ``grad_stats`` kernel for a device (compiled once per device)."""
    from .kernels.compiler import get_function
    from .kernels.launch import cupy_or_none

    with cupy_or_none().cuda.Device(device_index):
        return get_function(_STATS_FILE, "grad_stats", cuda_headers=False,
                            defines={"N_BINS": N_BINS, "THREADS": _STATS_THREADS})


def _stats_plan(sizes: list[int], kinds: list[int], device: torch.device) -> dict[str, Any]:
    """Returns the chunk table of the ``grad_stats`` kernel for gradients of these sizes: one
    block per chunk of at most ``_STATS_CHUNK`` elements of one gradient."""
    grad, start, end = [], [], []
    for i, n in enumerate(sizes):
        for s0 in range(0, n, _STATS_CHUNK):
            grad.append(i)
            start.append(s0)
            end.append(min(n, s0 + _STATS_CHUNK))
    return {"kinds": torch.tensor(kinds, dtype=torch.int32, device=device),
            "chunk_grad": torch.tensor(grad, dtype=torch.int32, device=device),
            "chunk_start": torch.tensor(start, dtype=torch.int64, device=device),
            "chunk_end": torch.tensor(end, dtype=torch.int64, device=device),
            "blocks": len(grad), "ptrs": None, "ptrs_dev": None}


def _cupy_statistics(grads: list[torch.Tensor], plan: dict[str, Any]):
    """Returns (int64 histogram [n, N_BINS], float32 max|g| [n]) from one ``grad_stats`` launch
    on torch's current stream (no host sync)."""
    import numpy as np

    from .kernels.launch import current_stream_ptr, enqueue

    device = grads[0].device
    index = device.index if device.index is not None else torch.cuda.current_device()
    flats = [_flat_view(g) for g in grads]  # views (a copy only for odd layouts)
    ptrs = tuple(f.data_ptr() for f in flats)
    if ptrs != plan["ptrs"]:  # the gradients moved: upload their addresses (asynchronously)
        host = torch.tensor(ptrs, dtype=torch.int64).pin_memory()
        plan["ptrs_dev"] = host.to(device, non_blocking=True)
        plan["ptrs"] = ptrs
    n = len(grads)
    # one zeroed buffer holds the histograms and, after them, the max|g| bit patterns
    out = torch.zeros(n * N_BINS + (n + 1) // 2, dtype=torch.int64, device=device)
    hist = out[:n * N_BINS].view(n, N_BINS)
    maxbits = out[n * N_BINS:].view(torch.int32)[:n]
    args = tuple(np.uint64(t.data_ptr()) for t in (
        plan["ptrs_dev"], plan["kinds"], plan["chunk_grad"], plan["chunk_start"],
        plan["chunk_end"], hist, maxbits))
    # (a copy made by _flat_view may be freed on return: torch's allocator reuses memory in
    # stream order, after the kernel that reads it)
    enqueue(_stats_function(index), plan["blocks"], _STATS_THREADS, args,
            current_stream_ptr(index), index)
    return hist, maxbits.view(torch.float32)


class GradientMonitor:
    """Per-parameter gradient statistics, collected with hooks, computed on the device.

    Every parameter gets a post-accumulate-grad hook; the first one to fire in a backward pass
    queues a callback for the end of that pass, which computes for all gradients at once:

    * an exponent histogram of ``|g|`` per parameter: ``floor(log2|g|)`` read from the float32
      exponent field (exact), plus bins for zero, float32 subnormals, inf and NaN;
    * ``max|g|`` per parameter.

    On CUDA with CuPy both come from one fused kernel that reads every gradient once where it
    lies (ResNet-50: 25.6M values, about 100 MB read, 3 launches per step with the zeroing of
    the output and, when the gradients moved, the upload of their addresses) and no host sync:
    the results stay on the device until :meth:`frame` reads them all at once. Without CuPy the
    gradients are concatenated once, ``torch.bucketize`` of the bits gives the bins, one
    ``torch.histc`` per 23 parameters counts them and ``torch._foreach_norm(ord=inf)`` gives
    max|g| (about 20 launches and 1 GB of traffic for ResNet-50; with
    ``torch.use_deterministic_algorithms(True)`` CUDA histc refuses to run). On the CPU a few
    integer passes give each element its bin and one ``bincount`` counts them.

    The gradients seen are the ones in ``.grad`` at the end of backward: *scaled* when a loss
    scaler is used (which is what FP16 has to hold), FP32 under autocast (values that FP16
    already flushed show up as exact zeros). From the exponent bins the FP16 fates are:
    underflow ``|g| < 2**-25``, subnormal ``2**-25 <= |g| < 2**-14``, overflow ``|g| >= 2**16``
    or inf - binary-exponent edges, so the rare values of exactly ``2**-25`` or in
    ``[65520, 65536)`` are counted one bin over (:func:`fp16_fate` is exact).

    Args:
        model: the module whose parameters to watch (those with ``requires_grad``).
        keep_history: keep every step's statistics (default); otherwise only the last step's.
        every: compute the statistics on every ``every``-th backward pass only (default 1: all);
            the others cost one Python call.
        backend: how the statistics are computed (see :meth:`statistics`); ``"auto"`` picks
            the fastest one available on the gradients' device.
    """

    def __init__(self, model: nn.Module, keep_history: bool = True, every: int = 1,
                 backend: str = "auto"):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
        self.backend = backend
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no parameters that require grad; nothing to monitor")
        self.keep_history = keep_history
        self.every = every
        self.backward_passes = 0
        self._handles = []
        self._queued = False
        self._cache: dict[Any, tuple] = {}
        # (backward-pass index, histograms, max|g|, indices of the parameters with a gradient)
        self._steps: list[tuple[int, torch.Tensor, torch.Tensor, list[int]]] = []
        self.enabled = True
        self.attach()

    def attach(self) -> None:
        """Registers the hooks (done by the constructor; again after :meth:`remove`)."""
        if not self._handles:
            self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                             for p in self.params]

    # -- hooks ---------------------------------------------------------------------------------
    def _on_grad(self, _param: torch.Tensor) -> None:
        if self.enabled and not self._queued:
            self._queued = True
            wanted = self.backward_passes % self.every == 0
            self.backward_passes += 1
            torch.autograd.Variable._execution_engine.queue_callback(
                self._collect if wanted else self._skip)

    def _skip(self) -> None:
        self._queued = False

    def _collect(self) -> None:
        self._queued = False
        idx = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not idx:
            return
        grads = [self.params[i].grad.detach() for i in idx]
        hist, maxabs = self.statistics(grads, idx, backend=self.backend)
        if not self.keep_history:
            self._steps.clear()
        self._steps.append((self.backward_passes - 1, hist, maxabs, idx))

    def statistics(self, grads: list[torch.Tensor], key: Any = None, *,
                   backend: str = "auto"):
        """Returns (int64 histogram [n_grads, N_BINS], float32 max|g| [n_grads]) on the grads'
        device, without a host sync on CUDA.

        ``backend``: ``"bincount"`` (the CPU default), ``"cupy"`` (the CUDA default where CuPy
        is installed: one fused kernel), ``"histc"`` (CUDA without CuPy: torch operations,
        unlike CUDA bincount with no host sync) or ``"auto"``. All give the same counts.
        """
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(_BACKENDS)}, got {backend!r}")
        device = grads[0].device
        if backend == "auto":
            backend = auto_backend(device.type)
        if backend == "cupy" and device.type != "cuda":
            raise ValueError(f"backend {backend!r} needs CUDA tensors, got {device.type}")
        sizes = [g.numel() for g in grads]
        ck = (tuple(key) if key is not None else tuple(sizes), device, backend)
        n = len(grads)
        if backend == "cupy":
            kinds = [_STATS_KINDS.get(g.dtype, -1) for g in grads]
            if -1 in kinds:
                raise ValueError("the cupy backend counts float32, float16 and bfloat16 "
                                 f"gradients; got {sorted({str(g.dtype) for g in grads})}")
            ck = ck + (tuple(kinds),)
            if ck not in self._cache:
                self._cache[ck] = _stats_plan(sizes, kinds, device)
            return _cupy_statistics(grads, self._cache[ck])
        if ck not in self._cache:
            self._cache[ck] = _segment_plan(sizes, device, backend)
        plan = self._cache[ck]
        if backend == "bincount":
            flat = _widened_cat([_flat_view(g) for g in grads])
            code = _bin_codes(flat, method="ops")
            hist = torch.bincount(code.add_(plan["base"]), minlength=n * N_BINS)
        else:
            # largest gradients first (see _segment_plan): each histc call then sees parameters
            # of similar size, which keeps its grid wide
            flat = _widened_cat([_flat_view(grads[i]) for i in plan["order"]])
            code = _bin_codes(flat, method="search", boundaries=plan["boundaries"])
            keys = torch.add(plan["base"], code)  # float keys (+0.5: away from histc's edges)
            hist = torch.cat([torch.histc(keys[e0:e1], bins=(hi - lo) * N_BINS,
                                          min=lo * N_BINS, max=hi * N_BINS)
                              for lo, hi, e0, e1 in plan["chunks"]])
            hist = hist.view(n, N_BINS).index_select(0, plan["inverse"]).long()
        hist = hist.view(n, N_BINS)
        if device.type == "cpu":  # torch's CPU _foreach_norm is a slow loop; amax is not
            maxabs = torch.stack([g.detach().abs().amax().float() for g in grads])
        else:  # one fused multi-tensor launch
            maxabs = torch.stack([m.float() for m in torch._foreach_norm(grads, ord=math.inf)])
        return hist, maxabs

    # -- results -------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Returns the number of backward passes whose statistics are held."""
        return len(self._steps)

    def reset(self) -> None:
        """Forgets the recorded statistics and restarts the step count."""
        self._steps.clear()
        self.backward_passes = 0

    def remove(self) -> None:
        """Removes the hooks (the recorded statistics stay; :meth:`attach` re-registers)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "GradientMonitor":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def histograms(self) -> torch.Tensor:
        """Returns the held histograms as an int64 CPU tensor [steps held, n_params, N_BINS]
        (zero rows where a parameter had no gradient)."""
        out = torch.zeros(len(self._steps), len(self.params), N_BINS, dtype=torch.int64)
        if not self._steps:
            return out
        # one transfer per step at most, done here and not during training
        for s, (_, hist, _, idx) in enumerate(self._steps):
            out[s, idx] = hist.cpu()
        return out

    def frame(self):
        """Returns a DataFrame: one row per held step and parameter with max|g|, FP16 fate
        fractions (zero, underflow, subnormal, overflow) and inf/NaN counts. ``step`` counts the
        backward passes since the monitor was created."""
        import pandas as pd

        rows = []
        under_hi = _bin_of_exponent(-26) + 1    # bins for |g| < 2**-25
        sub_hi = _bin_of_exponent(-15) + 1      # bins for |g| < 2**-14
        over_lo = _bin_of_exponent(16)          # |g| >= 2**16
        for s, hist, maxabs, idx in self._steps:
            h = hist.cpu().double()
            m = maxabs.cpu()
            n = h.sum(dim=1)
            for j, i in enumerate(idx):
                hj = h[j]
                nj = float(n[j])
                rows.append({
                    "step": s, "param": self.names[i], "numel": int(nj),
                    "max_abs": float(m[j]),
                    "zero_frac": float(hj[_ZERO_BIN]) / nj,
                    "fp16_underflow_frac": float(hj[1:under_hi].sum()) / nj,
                    "fp16_subnormal_frac": float(hj[under_hi:sub_hi].sum()) / nj,
                    "fp16_overflow_frac": float(hj[over_lo:_INF_BIN + 1].sum()) / nj,
                    "n_inf": int(hj[_INF_BIN]), "n_nan": int(hj[_NAN_BIN]),
                })
        return pd.DataFrame(rows)


def exponent_of_bin(b: int) -> int:
    """Returns floor(log2|g|) for a GradientMonitor histogram bin (2 .. N_BINS-3)."""
    if not 2 <= b <= _INF_BIN - 1:
        raise ValueError(f"bin {b} is not an exponent bin; those are 2..{_INF_BIN - 1} "
                         f"(0 zero, 1 float32 subnormals, {_INF_BIN} inf, {_NAN_BIN} NaN)")
    return b + EXP_MIN - 2


# --------------------------------------------------------------------------------------------
# The first non-finite value
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NonFiniteReport:
    """Where an inf/NaN first appeared during one training step."""

    module: str            # dotted module name ("" is the whole model)
    phase: str             # "forward", "backward" (gradient w.r.t. the module's input) or
                           # "parameter gradient"
    tensor: str            # which tensor: "output 0", "input 0", or the parameter's name
    dtype: str
    shape: tuple[int, ...]
    n_inf: int
    n_nan: int
    finite_min: float      # of the finite values (nan if none)
    finite_max: float

    def as_dict(self) -> dict[str, Any]:
        """Returns the fields as a dict."""
        return asdict(self)

    def __str__(self) -> str:
        where = self.module or "<model>"
        return (f"first non-finite value in {self.phase} of {where!r} ({self.tensor}, "
                f"{self.dtype} {list(self.shape)}): {self.n_inf} inf, {self.n_nan} NaN; finite "
                f"values range over [{self.finite_min:.3g}, {self.finite_max:.3g}]")


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


def _describe(t: torch.Tensor) -> tuple[int, int, float, float]:
    t = t.detach()
    n_inf = int(torch.isinf(t).sum())
    n_nan = int(torch.isnan(t).sum())
    fin = t[torch.isfinite(t)].double()
    lo = float(fin.min()) if fin.numel() else math.nan
    hi = float(fin.max()) if fin.numel() else math.nan
    return n_inf, n_nan, lo, hi


def _nonfinite(t: torch.Tensor) -> bool:
    return t.is_floating_point() and not bool(torch.isfinite(t.detach()).all())


def locate_first_nonfinite(model: nn.Module, step: Callable[[], torch.Tensor], *,
                           backward: bool = True, loss_scale: float = 1.0
                           ) -> NonFiniteReport | None:
    """Returns where the first inf/NaN of one training step appeared, or None if none did.

    Runs ``loss = step()`` (the forward pass and loss, e.g. under autocast) and, if ``backward``,
    ``(loss * loss_scale).backward()``, with temporary hooks:

    * forward: a module *produced* a non-finite value if its output has one and its inputs do
      not; the innermost such module reports first;
    * backward: a tensor hook on every leaf module's inputs sees the gradient that module's
      backward produced; the first non-finite one in backward order is reported (a functional
      op between two modules is attributed to the module whose input it feeds);
    * parameter gradients are checked as they are accumulated.

    This syncs with the device at every module: a debugging tool, not something to leave on.
    """
    names = {m: n for n, m in model.named_modules()}
    leaves = {m for m in names if not list(m.children())}
    found: list[NonFiniteReport] = []
    handles = []

    def report(module_name, phase, what, t):
        if found:
            return
        n_inf, n_nan, lo, hi = _describe(t)
        found.append(NonFiniteReport(module_name, phase, what, str(t.dtype).replace("torch.", ""),
                                     tuple(t.shape), n_inf, n_nan, lo, hi))

    def pre_hook(module, args):
        if not backward or module not in leaves:
            return
        for k, t in enumerate(_tensors(args)):
            if t.requires_grad:
                def on_grad(g, _k=k, _name=names[module]):
                    if _nonfinite(g):
                        report(_name, "backward", f"input {_k}", g)
                t.register_hook(on_grad)

    def fwd_hook(module, args, output):
        if found:
            return
        outs = _tensors(output)
        bad = [i for i, t in enumerate(outs) if _nonfinite(t)]
        if bad and not any(_nonfinite(t) for t in _tensors(args)):
            report(names[module], "forward", f"output {bad[0]}", outs[bad[0]])

    for m in names:
        handles.append(m.register_forward_pre_hook(pre_hook))
        handles.append(m.register_forward_hook(fwd_hook))
    for mod_name, m in model.named_modules():
        for p_name, p in m.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            full = f"{mod_name}.{p_name}" if mod_name else p_name

            def on_param(q, _m=mod_name, _f=full):
                if _nonfinite(q.grad):
                    report(_m, "parameter gradient", _f, q.grad)
            handles.append(p.register_post_accumulate_grad_hook(on_param))
    try:
        loss = step()
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"step() must return the loss tensor, got {type(loss).__name__}")
        if not found and _nonfinite(loss):
            report("", "forward", "loss", loss)
        if backward:
            (loss * loss_scale).backward()
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


# --------------------------------------------------------------------------------------------
# Measured demonstrations
# --------------------------------------------------------------------------------------------
class FP32Island(nn.Module):
    """Runs a wrapped module in FP32 inside an autocast region, done correctly.

    Disabling autocast is not enough: tensors arriving from autocast regions are already FP16,
    and with autocast off an op simply runs in its inputs' dtype. So the island disables
    autocast *and* casts floating inputs to float32.
    """

    def __init__(self, inner: nn.Module, cast_inputs: bool = True):
        super().__init__()
        self.inner = inner
        self.cast_inputs = cast_inputs

    def forward(self, *args):
        dev = next((t.device.type for t in _tensors(args)), "cpu")
        with torch.autocast(device_type=dev, enabled=False):
            if self.cast_inputs:
                args = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point()
                             else a for a in args)
            return self.inner(*args)


class Gram(nn.Module):
    """Returns x @ x^T: unnormalised attention-like scores, a classic FP16 overflow."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ x.transpose(-1, -2)


def overflow_demo_model(device: str = "cpu", width: int = 64, level: float = 20.0
                        ) -> tuple[nn.Module, torch.Tensor]:
    """Returns (model, inputs) whose ``scores`` layer (a :class:`Gram`) overflows FP16 under
    autocast: a stand-in for an unnormalised attention or a sum of squares."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("embed", nn.Linear(width, width))
    model.add_module("act", nn.Tanh())
    model.add_module("proj", nn.Linear(width, width))
    model.add_module("scores", Gram())
    model.add_module("head", nn.Flatten())
    with torch.no_grad():
        model.proj.weight.mul_(level * width**0.5)  # large activations, as after a bad init
    return model.to(device), torch.randn(8, width, device=device)


def overflow_demo(device: str = "cpu") -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    """Returns (model, step): :func:`overflow_demo_model` and a function running its forward
    pass under FP16 autocast and returning a loss, ready for :func:`locate_first_nonfinite`."""
    model, x = overflow_demo_model(device)

    def step() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.float16):
            out = model(x)
        return out.float().mean()

    return model, step


def overhead_summary(result: dict[str, Any]):
    """Returns a DataFrame from a ``diagnostics_overhead`` result: per device, model and
    statistics backend, the median step time without and with the hooks, the overhead in %,
    and where it was measured."""
    import pandas as pd

    rows = pd.DataFrame(result["rows"])
    out = []
    for (device, model), g in rows.groupby(["device", "model"], sort=False):
        off = g[g.variant == "hooks off"].iloc[0]
        for _, on in g[g.variant.str.startswith("hooks on")].iterrows():
            backend = on.get("monitor_backend")
            out.append({"device": device, "device_name": off.device_name, "model": model,
                        "batch": int(off.batch), "amp": bool(off.amp),
                        "backend": backend if isinstance(backend, str) else "",
                        "off_ms": off.median_ms, "on_ms": on.median_ms,
                        "overhead_pct": on.overhead_pct,
                        "overhead_p10_pct": on.get("overhead_p10_pct", float("nan")),
                        "torch": off.torch})
    return pd.DataFrame(out)


def fp32_island_demo(device: str = "cpu", width: int = 256, level: float = 20.0
                     ) -> "Any":
    """Returns a DataFrame comparing a precision-sensitive layer under FP16 autocast three ways.

    A linear layer (autocast: FP16) feeds :class:`Gram`, whose entries (``~ level**2 * width``)
    exceed FP16's 65504. Rows: no island; autocast disabled but inputs left in FP16 (the common
    mistake); :class:`FP32Island` (disabled and cast). Columns: the output dtype, how many outputs
    are inf, and the relative error against a float64 reference.
    """
    import pandas as pd

    torch.manual_seed(0)
    lin = nn.Linear(width, width, device=device)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(width, device=device))
        lin.bias.zero_()
    x = level + torch.randn(8, width, device=device)
    with torch.no_grad():
        ref = Gram()(lin.double()(x.double())).float()
    lin.float()
    variants = {"no island (FP16 matmul)": Gram(),
                "autocast off, inputs still FP16": FP32Island(Gram(), cast_inputs=False),
                "FP32 island (off + cast to FP32)": FP32Island(Gram(), cast_inputs=True)}
    rows = []
    for name, layer in variants.items():
        with torch.no_grad(), torch.autocast(device, dtype=torch.float16):
            h = lin(x)
            out = layer(h)
        o = out.float()
        fin = torch.isfinite(o)
        err = float(((o - ref).norm() / ref.norm())) if bool(fin.all()) else math.inf
        rows.append({"variant": name, "input_dtype": str(h.dtype).replace("torch.", ""),
                     "output_dtype": str(out.dtype).replace("torch.", ""),
                     "n_inf": int((~fin).sum()), "numel": o.numel(), "rel_error": err})
    return pd.DataFrame(rows)


def clipping_demo(device: str = "cpu", max_norm: float = 1.0, init_scale: float = 2.0**16,
                  seed: int = 0) -> "Any":
    """Returns a DataFrame: gradient clipping with and without ``scaler.unscale_`` first.

    One step of a small model with a real ``torch.amp.GradScaler``. ``true_grad_norm`` is the
    unscaled gradient norm (from an unscaled backward), ``norm_seen_by_clip`` what
    ``clip_grad_norm_`` returned, ``applied_grad_norm`` the norm of the gradients the optimizer
    actually used (read after ``scaler.step``), and ``update_norm / lr`` the same, measured from
    the parameters. Without ``unscale_`` the clip acts on scaled gradients: the applied norm is
    ``max_norm / scale`` instead of ``max_norm``.
    """
    import pandas as pd

    torch.manual_seed(seed)
    base = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    x = torch.randn(64, 32, device=device)
    y = torch.randn(64, 4, device=device) * 10

    def loss_of(model):
        with torch.autocast(device, dtype=torch.float16):
            out = model(x)
        return (out.float() - y).pow(2).mean()

    ref = copy.deepcopy(base)
    loss_of(ref).backward()
    true_norm = float(torch.norm(torch.stack([p.grad.norm() for p in ref.parameters()])))
    rows = []
    lr = 0.1
    for unscale_first in (True, False):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device, init_scale=init_scale)
        before = [p.detach().clone() for p in model.parameters()]
        scaler.scale(loss_of(model)).backward()
        if unscale_first:
            scaler.unscale_(opt)
        seen = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
        scaler.step(opt)
        scaler.update()
        applied = float(torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])))
        upd = float(torch.norm(torch.stack([(p.detach() - b).norm()
                                            for p, b in zip(model.parameters(), before)])))
        rows.append({"recipe": "unscale_ then clip" if unscale_first else "clip scaled grads",
                     "scale": init_scale, "max_norm": max_norm, "true_grad_norm": true_norm,
                     "norm_seen_by_clip": seen, "applied_grad_norm": applied,
                     "update_norm_over_lr": upd / lr})
    return pd.DataFrame(rows)


def scheduler_warning_demo(device: str = "cpu", steps: int = 40, seed: int = 0) -> dict[str, Any]:
    """Returns what happens to the LR-scheduler warning and the skips in two short runs.

    ``warm-up``: a healthy model with ``init_scale=2**24``: the first steps overflow and are
    skipped while the scale calibrates, so the first ``scheduler.step()`` comes before any
    ``optimizer.step()`` and PyTorch warns about the call order (harmless here).
    ``broken``: the inputs overflow FP16 in the forward pass (values ~1e5), so every step is
    skipped and the scale collapses: the same warning, but a real problem.

    Returns:
        dict run -> {"scheduler_warning": text or None, "collapse_warning": text or None,
        "skipped": list of skipped step indices, "history": DataFrame, **classify_skips(...)}.
    """
    out = {}
    for run, x_level, init_scale in (("warm-up", 1.0, 2.0**24), ("broken", 1e5, 2.0**16)):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        rec = GradScalerRecorder(torch.amp.GradScaler(device, init_scale=init_scale,
                                                      growth_interval=1000))
        x = torch.randn(32, 16, device=device) * x_level
        y = torch.randn(32, 1, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                opt.zero_grad()
                with torch.autocast(device, dtype=torch.float16):
                    pred = model(x)
                loss = (pred.float() - y).pow(2).mean()
                rec.scale(loss).backward()
                rec.step(opt)
                rec.update()
                sched.step()
        sched_w = next((str(w.message) for w in caught
                        if "lr_scheduler.step()" in str(w.message)), None)
        coll_w = next((str(w.message) for w in caught
                       if issubclass(w.category, ScaleCollapseWarning)), None)
        hist = rec.history
        out[run] = {"scheduler_warning": sched_w, "collapse_warning": coll_w,
                    "skipped": [e.step for e in hist if e.skipped],
                    "history": rec.history_frame(), **classify_skips(hist)}
    return out
