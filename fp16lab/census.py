"""Where a tensor's values would land in a format: a census of zeros, underflow, subnormals,
normals, overflow and NaNs, plus a histogram of log2|x| (per layer for a whole model).

Rounding to nearest-even decides each class by comparing ``|x|`` with three thresholds of the
format (``s`` = smallest subnormal, ``n`` = smallest normal, ``M`` = largest finite, ``u`` = the
spacing at ``M``):

* underflow to zero: ``0 < |x| <= s/2`` (the tie rounds to the even code, zero);
* subnormal: ``s/2 < |x| < n - s/2`` (from ``n - s/2`` up it rounds to ``n``);
* overflow: ``|x| >= M + u/2`` where the largest code is odd (inf, all IEEE-style formats), or
  ``|x| > M + u/2`` for e4m3fn, whose largest code (448, mantissa 110) is even; plus +-inf.

Each threshold is replaced by the nearest number of the data's own type on the correct side,
so the classes are exact for every input. Since positive floats are ordered like their bit
patterns, the comparisons are integer comparisons on the bits: numpy (threaded over chunks)
and the CUDA kernel both work on the data's own 16/32/64-bit patterns.

The histogram bins are the binary exponents ``e = floor(log2|x|)`` (bin ``e`` holds
``2^e <= |x| < 2^(e+1)``), read from the exponent field of the bit pattern (subnormals of the
data's own type from their leading one). CPU tensors are counted through numpy (a view, no
copy); CUDA tensors on the GPU by a one-pass CuPy kernel (:mod:`fp16lab.kernels.census`), or
by torch where CuPy is missing, so a CUDA tensor never leaves the GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from .bits.arrays import is_torch
from .bits.patterns import HIST_MAX, HIST_MIN, bit_layout, pattern_below, thresholds
from .formats import FormatInfo, format_info
from .kernels import census as census_kernel  # the CuPy launcher; it imports CuPy only when it runs

#: Classes, in order of magnitude.
CLASSES = ("zero", "underflow", "subnormal", "normal", "overflow", "nan")
_EXPONENTS = np.arange(HIST_MIN, HIST_MAX + 1)  # the bin labels, shared by every result
_EXPONENTS.flags.writeable = False
_CHUNK = 1 << 18  # elements per pass on the CPU: the temporaries stay in cache
_TORCH_CHUNK = 1 << 24  # elements per pass of the torch path: bounds its temporaries


@dataclass(frozen=True)
class CensusResult:
    """Counts of each class of a tensor's values in one format, and its log2|x| histogram.

    Attributes:
        fmt: the format's name.
        n: number of elements.
        counts: elements per class (see ``CLASSES``).
        exponents: bin labels ``e`` (bin ``e`` is ``2^e <= |x| < 2^(e+1)``).
        hist: nonzero finite elements per bin.
        dtype: the data's dtype, as text.
    """

    fmt: str
    n: int
    counts: dict[str, int]
    exponents: np.ndarray = field(repr=False)
    hist: np.ndarray = field(repr=False)
    dtype: str = ""

    @property
    def fractions(self) -> dict[str, float]:
        """Returns the fraction of elements in each class (they sum to 1)."""
        return {k: (v / self.n if self.n else 0.0) for k, v in self.counts.items()}

    def row(self) -> dict[str, Any]:
        """Returns a flat dict (format, n, fractions) for a DataFrame row."""
        return {"format": self.fmt, "n": self.n, **self.fractions}

    def log2_range(self) -> tuple[int, int] | None:
        """Returns the smallest and largest occupied exponent bins, or None if there are none."""
        nz = np.nonzero(self.hist)[0]
        if not len(nz):
            return None
        return int(self.exponents[nz[0]]), int(self.exponents[nz[-1]])

    def __str__(self) -> str:
        fr = self.fractions
        parts = ", ".join(f"{k} {100 * fr[k]:.3g}%" for k in CLASSES)
        rng = self.log2_range()
        span = f"; log2|x| in [{rng[0]}, {rng[1]}]" if rng else ""
        return f"census of {self.n:,} {self.dtype} values in {self.fmt}: {parts}{span}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython's plain-text display: the sentence of __str__, not the dataclass's field dump
        printer.text(str(self))

    def _repr_html_(self) -> str:
        fr = self.fractions
        head = "".join(f"<th>{k}</th>" for k in CLASSES)
        cells = "".join(f"<td>{100 * fr[k]:.3g}%</td>" for k in CLASSES)
        return (f"<p>census of {self.n:,} {self.dtype} values in <b>{self.fmt}</b></p>"
                f"<table><tr>{head}</tr><tr>{cells}</tr></table>")


def _hist_index(exps):
    """Clamps exponents to the histogram range and returns bin indices."""
    return exps.clip(HIST_MIN, HIST_MAX) - HIST_MIN


# ---------------------------------------------------------------------------------- numpy path
_NARROW_NUMPY = {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                 "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float32"}


def _as_numpy_float(x: Any) -> np.ndarray:
    arr = np.asarray(x)
    numeric = arr.dtype.kind in "biuf" or arr.dtype.name in _NARROW_NUMPY
    if not numeric:  # complex (kind 'c') included
        raise ValueError(f"census expects a real numeric array or tensor, got dtype {arr.dtype}")
    return arr.reshape(-1)


def _census_numpy(arr: np.ndarray, f: FormatInfo) -> tuple[np.ndarray, np.ndarray]:
    """Returns (counts, hist) by integer comparisons on the data's own bit patterns."""
    layout = bit_layout(arr.dtype)
    if layout is None:  # ints and fp8: widen (exactly) to a float type with a known layout
        arr = arr.astype(np.float64 if arr.dtype.kind in "iub" else np.float32)
        layout = bit_layout(arr.dtype)
    udt, mbits, ebits = layout
    th = thresholds(f)
    p1 = pattern_below(th["under"], arr.dtype, udt, strict=False)
    p2 = pattern_below(th["normal"], arr.dtype, udt, strict=True)
    p3 = pattern_below(th["over"], arr.dtype, udt, strict=th["over_inclusive"])
    fmask = (1 << ebits) - 1
    inf_pattern = fmask << mbits
    bias = (1 << (ebits - 1)) - 1
    sub_exp = 1 - bias - mbits  # a subnormal pattern p is p * 2^sub_exp
    magnitude = udt((1 << (8 * np.dtype(udt).itemsize - 1)) - 1)
    bits = arr.view(udt)
    # exponent of each subnormal pattern 1 .. 2^m - 1: floor(log2(p)) + (emin - m)
    sub_lut = (np.floor(np.log2(np.arange(1, 1 << mbits))).astype(np.int64) + sub_exp
               if mbits <= 12 else None)

    def count_chunk(start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = bits[start:start + _CHUNK] & magnitude
        zeros = np.count_nonzero(a == 0)
        c = np.array([zeros, np.count_nonzero(a <= p1), np.count_nonzero(a <= p2),
                      np.count_nonzero(a <= p3), 0, np.count_nonzero(a > inf_pattern)])
        by_field = np.bincount(a >> mbits, minlength=fmask + 1)
        sub_hist = np.zeros(HIST_MAX - HIST_MIN + 1, dtype=np.int64)
        if by_field[0] > zeros:  # the data's own subnormals: count them exactly
            sub = a[a < (1 << mbits)]
            if mbits <= 12:  # fp16 / bf16: count each subnormal pattern, then map to exponents
                per_pattern = np.bincount(sub, minlength=1 << mbits)[1:]
                np.add.at(sub_hist, _hist_index(sub_lut), per_pattern)
            else:
                sub = sub[sub != 0].astype(np.float64)
                e_sub = np.floor(np.log2(sub)).astype(np.int64) + sub_exp
                np.add.at(sub_hist, _hist_index(e_sub), 1)
        return c, by_field, sub_hist

    starts = range(0, arr.size, _CHUNK)
    workers = min(len(starts), os.cpu_count() or 1, 16)
    if workers > 1:  # numpy releases the GIL in these loops, so threads add up
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(count_chunk, starts))
    else:
        parts = [count_chunk(s) for s in starts]
    counts = (np.sum([p[0] for p in parts], axis=0, dtype=np.int64) if parts
              else np.zeros(6, np.int64))
    fields = np.sum([p[1] for p in parts], axis=0) if parts else np.zeros(fmask + 1, np.int64)
    hist = (np.sum([p[2] for p in parts], axis=0) if parts
            else np.zeros(HIST_MAX - HIST_MIN + 1, dtype=np.int64))
    # exponent fields 1 .. max-1 are the normal binades; 0 is zero / subnormal, max is inf / nan
    np.add.at(hist, _hist_index(np.arange(1, fmask) - bias), fields[1:fmask])
    counts[4] = arr.size
    return counts, hist


# ---------------------------------------------------------------------------------- torch path
def _census_torch(t, f: FormatInfo, backend: str) -> tuple[np.ndarray, np.ndarray]:
    import torch

    x = t.detach().reshape(-1)
    if x.dtype.is_complex or x.dtype == torch.bool:
        raise ValueError(f"census expects a real numeric tensor, got dtype {x.dtype}")
    if x.is_cuda and backend in ("auto", "cupy"):
        done = census_kernel.cupy_census(x, f)
        if done is not None:
            return done
        if backend == "cupy":
            raise RuntimeError(f"census backend 'cupy' needs CuPy and a non-empty float32, "
                               f"float16 or bfloat16 CUDA tensor; got {x.dtype} with "
                               f"{x.numel()} elements")
    wide = torch.float64 if x.dtype in (torch.float64, torch.int64, torch.int32) else torch.float32
    np_wide, udt = (np.float64, np.uint64) if wide == torch.float64 else (np.float32, np.uint32)
    ibits, shift, fmask, bias, sub_exp = ((torch.int32, 23, 0xFF, 127, -149)
                                          if wide == torch.float32
                                          else (torch.int64, 52, 0x7FF, 1023, -1074))
    dev = x.device
    # class edges as bit patterns of |x| in the wide type: bucketize puts each element in its
    # class in one pass (0: zero, 1: underflow, 2: subnormal, 3: normal, 4: overflow, 5: NaN)
    th = thresholds(f)
    edges = [0] + [pattern_below(th[k], np_wide, udt, strict=strict)
                   for k, strict in (("under", False), ("normal", True),
                                     ("over", th["over_inclusive"]))] + [fmask << shift]
    edges_t = torch.tensor(edges, dtype=ibits, device=dev)
    classes = torch.zeros(6, dtype=torch.int64, device=dev)
    by_field = torch.zeros(fmask + 1, dtype=torch.int64, device=dev)
    sub_hist = torch.zeros(HIST_MAX - HIST_MIN + 1, dtype=torch.int64, device=dev)
    for start in range(0, x.numel(), _TORCH_CHUNK):
        b = x[start:start + _TORCH_CHUNK].to(wide).abs().view(ibits)
        classes += torch.bincount(torch.bucketize(b, edges_t, out_int32=True), minlength=6)
        efield = (b >> shift) & fmask
        by_field += torch.bincount(efield, minlength=fmask + 1)
        subs = b[(efield == 0) & (b != 0)]
        if subs.numel():
            e_sub = torch.floor(torch.log2(subs.to(torch.float64))).to(torch.int64) + sub_exp
            sub_hist += torch.bincount(_hist_index(e_sub), minlength=sub_hist.numel())
    cum = torch.cumsum(classes, 0)
    counts = torch.stack([cum[0], cum[1], cum[2], cum[3], cum[3], classes[5]])
    counts[4] = x.numel()
    counts_np = counts.cpu().numpy()
    by_field_np = by_field.cpu().numpy()
    hist = sub_hist.cpu().numpy()
    fields = np.arange(1, fmask)
    np.add.at(hist, _hist_index(fields - bias), by_field_np[1:fmask])
    return counts_np, hist


def census(x: Any, fmt: str | FormatInfo = "fp16", *, backend: str = "auto") -> CensusResult:
    """Returns the census of a tensor's values in a format (rounding to nearest-even).

    Args:
        x: a numpy array (any real dtype, including ml_dtypes' bfloat16 / fp8), a torch tensor
            on any device, or anything ``numpy.asarray`` accepts.
        fmt: the format the values would be stored in.
        backend: for CUDA tensors, ``"auto"`` (the one-pass CuPy kernel when CuPy is there,
            else torch), ``"cupy"`` or ``"torch"`` (several passes of torch operations).

    Raises:
        ValueError: for an unknown format or non-numeric data.
    """
    f = format_info(fmt)
    if backend not in ("auto", "cupy", "torch"):
        raise ValueError(f"unknown census backend {backend!r}; allowed: auto, cupy, torch")
    if is_torch(x) and not x.is_cuda:
        # numpy is several times faster than torch on the CPU for these passes; it is a view
        import torch

        dtype = str(x.dtype).replace("torch.", "")
        t = x.detach()
        if t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"census expects a real numeric tensor, got dtype {t.dtype}")
        t = t.reshape(-1)
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16; ml_dtypes' has the same bits
            import ml_dtypes

            arr = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        elif t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            arr = t.float().numpy()
        else:
            arr = t.numpy()
        counts, hist = _census_numpy(arr, f)
    elif is_torch(x):
        counts, hist = _census_torch(x, f, backend)
        dtype = str(x.dtype).replace("torch.", "")
    else:
        if isinstance(x, (str, bytes)):
            raise ValueError(f"census expects numbers, got the string {x!r}")
        arr = _as_numpy_float(x)
        counts, hist = _census_numpy(arr, f)
        dtype = arr.dtype.name
    zero, le1, le2, le3, total, nan = (int(c) for c in counts)
    result = {"zero": zero, "underflow": le1 - zero, "subnormal": le2 - le1,
              "normal": le3 - le2, "overflow": total - le3 - nan, "nan": nan}
    return CensusResult(f.name, total, result, _EXPONENTS, hist, dtype)


def census_model(model, inputs, targets=None, *, loss_fn=None, fmt: str | FormatInfo = "fp16",
                 kinds: str | Iterable[str] = ("weight", "activation", "gradient"),
                 keep_histograms: bool = False):
    """Returns a pandas DataFrame: the census of each layer's weights, activations and gradients.

    Runs one forward pass (recording every leaf module's output with a forward hook; a model
    with no submodules, such as a bare ``nn.Linear``, is its own leaf) and one backward pass,
    then counts parameters and their gradients.

    Args:
        model: a ``torch.nn.Module``.
        inputs: one input batch (a tensor, a tuple passed as ``model(*inputs)`` or a dict
            passed as ``model(**inputs)``, as a transformers model takes ``input_ids``).
        targets: labels for the default loss (cross-entropy); ignored if ``loss_fn`` is given.
        loss_fn: ``loss_fn(output)`` or, with targets, ``loss_fn(output, targets)``; default
            cross-entropy with ``targets``, or ``mean(output^2) / 2`` without targets.
        fmt: the format to count in.
        kinds: which of "weight", "activation", "gradient" to include: one of them as a string,
            or a sequence of them.
        keep_histograms: add a ``census`` column holding each :class:`CensusResult`.

    Rows are ordered by layer; columns: layer (the name in ``model.named_modules()``, ``""``
    for the model itself), kind, tensor, n and the class fractions.

    Raises:
        TypeError: model is not a ``torch.nn.Module``.
        ValueError: kinds is empty or names something else.
    """
    import pandas as pd
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"census_model() takes a torch.nn.Module, got {type(model).__name__}; "
                        f"for one tensor use census()")
    kinds = _census_kinds(kinds)
    f = format_info(fmt)
    rows: list[dict[str, Any]] = []

    def add(layer: str, kind: str, name: str, tensor) -> None:
        c = census(tensor, f)
        row = {"layer": layer, "kind": kind, "tensor": name, **c.row()}
        if keep_histograms:
            row["census"] = c
        rows.append(row)

    handles = []
    if "activation" in kinds:
        for name, mod in model.named_modules():
            if not any(True for _ in mod.children()):  # a leaf (the model itself if childless)
                def hook(_mod, _inp, out, name=name):
                    t = out[0] if isinstance(out, (tuple, list)) else out
                    if isinstance(t, torch.Tensor):
                        add(name, "activation", "output", t)
                handles.append(mod.register_forward_hook(hook))
    try:
        model.zero_grad(set_to_none=True)
        out = model(*inputs) if isinstance(inputs, tuple) else \
            model(**inputs) if isinstance(inputs, Mapping) else model(inputs)
    finally:
        for h in handles:
            h.remove()
    if "gradient" in kinds:
        out_t = out[0] if isinstance(out, (tuple, list)) else out
        if loss_fn is not None:
            loss = loss_fn(out_t, targets) if targets is not None else loss_fn(out_t)
        elif targets is not None:
            loss = torch.nn.functional.cross_entropy(out_t.float(), targets)
        else:
            loss = out_t.float().pow(2).mean() / 2
        loss.backward()
    for pname, p in model.named_parameters():
        layer, _, leaf = pname.rpartition(".")
        if "weight" in kinds:
            add(layer, "weight", leaf, p)
        if "gradient" in kinds and p.grad is not None:
            add(layer, "gradient", leaf, p.grad)
    df = pd.DataFrame(rows)
    if len(df):
        # two rankings: a layer may be called "weight" or "gradient" too
        rank = {"layer": {k: i for i, k in enumerate(dict.fromkeys(df["layer"]))},
                "kind": {k: i for i, k in enumerate(CENSUS_KINDS)}}
        df = df.sort_values(["layer", "kind"], key=lambda s: s.map(rank[s.name]),
                            kind="stable").reset_index(drop=True)
    return df


CENSUS_KINDS = ("weight", "activation", "gradient")


def _census_kinds(kinds: Any) -> tuple[str, ...]:
    """Returns census_model's kinds as a tuple; a single string is one kind, not its letters."""
    if isinstance(kinds, str):
        kinds = (kinds,)
    try:
        kinds = tuple(kinds)
    except TypeError:
        raise ValueError(f"kinds must be one of {', '.join(CENSUS_KINDS)} or a sequence of "
                         f"them, got {kinds!r}") from None
    if not kinds:
        raise ValueError(f"kinds is empty; allowed: {', '.join(CENSUS_KINDS)}")
    bad = [k for k in kinds if k not in CENSUS_KINDS]
    if bad:
        raise ValueError(f"unknown kinds {bad!r}; allowed: {', '.join(CENSUS_KINDS)} (one as "
                         f"a string, or a sequence)")
    return kinds
