"""Per-element error bounds for a matrix product of fp16 (or bf16) inputs summed in fp32.

A whole-matrix relative error hides a wrong tile: in a 1024 x 1024 product, one 16 x 16 tile
that is 0.5% off moves the Frobenius relative error by only 0.005 * 16 / 1024 = 8e-5. The bound
here holds for every output element on its own.

For inputs already in fp16 or bf16, each product ``a_ik * b_kj`` is exact in fp32 (at most 22
significant bits of the 24), so the only errors are the K - 1 additions (K with an accumulator
``c``) and, for an fp16 output, the final rounding. The classic bound for a sum of n terms
(Higham, *Accuracy and Stability of Numerical Algorithms*, sec. 3.1) is, per element::

    |D_ij - (A @ B)_ij| <= gamma_n(u) * (|A| @ |B|)_ij,   gamma_n(u) = n u / (1 - n u)

whatever the order of the additions. ``u`` is the accumulator's unit roundoff, 2^-24 for fp32
rounded to nearest. Tensor cores do not round every addition to nearest (they align the products
and truncate), so a kernel may lose up to one whole unit in the last place per addition:
``truncating=True`` (the default) uses 2u. The float64 reference has its own (much smaller)
error, added in. An fp16 output adds one rounding, ``u_fp16 * |D|``, plus half the smallest
subnormal where the result underflows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fp16lab.formats import format_info

#: input dtypes whose products are exact in an fp32 accumulator (2 x significand bits <= 24)
_INPUT_DTYPES = ("float16", "bfloat16")
#: float64's unit roundoff, for the reference's own error
_U_FP64 = 2.0**-53
_OUTPUT_FORMATS = {"float32": "fp32", "float16": "fp16"}


def _xp(x: Any):
    """Returns the array module of x: cupy for a cupy array, numpy otherwise."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def unit_roundoff(fmt: str) -> float:
    """Returns a format's unit roundoff u = 2^-(m+1): the largest relative error of rounding to nearest."""
    return format_info(fmt).eps / 2


def gamma(n: int, u: float) -> float:
    """Returns gamma_n(u) = n u / (1 - n u), the relative error bound of n roundings."""
    if n < 0:
        raise ValueError(f"n must be a count of roundings (>= 0), got {n}")
    if n * u >= 1:
        raise ValueError(f"n * u = {n * u:g} >= 1: no bound (n = {n}, u = {u:g})")
    return n * u / (1 - n * u)


def gemm_error_bound(a: Any, b: Any, *, out_dtype: str = "float32", accumulate: str = "fp32",
                     truncating: bool = True) -> tuple[Any, Any]:
    """Returns ``(reference, bound)``: the float64 product and, per element, the largest error
    a correct kernel may show.

    Args:
        a: (M, K) float16 or bfloat16 numpy or cupy array.
        b: (K, N) array of the same kind.
        out_dtype: ``"float32"`` (the fp32 sums as they are) or ``"float16"`` (rounded once).
        accumulate: the accumulator's format (``"fp32"``).
        truncating: allow one whole unit in the last place per addition (tensor cores).

    Raises:
        ValueError: shapes that do not multiply, inputs that are not fp16 or bf16, or an
            unknown output type.
    """
    xp = _xp(a)
    for name, x in (("a", a), ("b", b)):
        if str(x.dtype) not in _INPUT_DTYPES:
            raise ValueError(f"{name} has dtype {x.dtype}; the bound assumes exact products, so it "
                             f"takes {' or '.join(_INPUT_DTYPES)} inputs")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a (M, K) and b (K, N) must multiply, got shapes {a.shape} and {b.shape}")
    if str(out_dtype) not in _OUTPUT_FORMATS:
        raise ValueError(f"out_dtype must be one of {', '.join(_OUTPUT_FORMATS)}, got {out_dtype!r}")
    k = a.shape[1]
    a64, b64 = a.astype(xp.float64), b.astype(xp.float64)
    ref = a64 @ b64
    magnitude = xp.abs(a64) @ xp.abs(b64)
    u = unit_roundoff(accumulate) * (2 if truncating else 1)
    additions = max(k - 1, 0)
    bound = (gamma(additions, u) + gamma(k, _U_FP64)) * magnitude
    out = _OUTPUT_FORMATS[str(out_dtype)]
    if out != accumulate:
        f = format_info(out)
        bound = bound + unit_roundoff(out) * (xp.abs(ref) + bound) + f.smallest_subnormal / 2
    return ref, bound


def error_ratio(got: Any, a: Any, b: Any, **kwargs: Any) -> float:
    """Returns the worst |got - a @ b| / bound over the elements: at most 1 when every element is
    within its bound; infinity for a NaN, or for an error where the bound is 0 (the exact sum
    of zeros). Keyword arguments go to :func:`gemm_error_bound`; ``out_dtype`` defaults to got's."""
    xp = _xp(got)
    kwargs.setdefault("out_dtype", str(got.dtype))
    ref, bound = gemm_error_bound(a, b, **kwargs)
    err = xp.abs(got.astype(xp.float64) - ref)
    if got.size == 0:
        return 0.0
    if bool(xp.isnan(err).any()) or bool(((bound == 0) & (err > 0)).any()):
        return float("inf")
    return float((err / xp.where(bound == 0, 1.0, bound)).max())


def gemm_violations(got: Any, a: Any, b: Any, *, tile: int = 16, **kwargs: Any) -> str | None:
    """Returns None when every element of ``got`` is within its bound of ``a @ b``, else a
    message naming how many elements and 16 x 16 tiles are out, and the worst one.

    Keyword arguments go to :func:`gemm_error_bound`; ``out_dtype`` defaults to got's dtype.
    """
    xp = _xp(got)
    if tuple(got.shape) != (a.shape[0], b.shape[1]):
        raise ValueError(f"got has shape {got.shape}; a @ b has {(a.shape[0], b.shape[1])}")
    kwargs.setdefault("out_dtype", str(got.dtype))
    ref, bound = gemm_error_bound(a, b, **kwargs)
    err = xp.abs(got.astype(xp.float64) - ref)
    bad = ~(err <= bound)  # NaN counts as out of bounds
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    excess = xp.where(bad, xp.nan_to_num(err - bound, nan=np.inf), -np.inf)
    i, j = (int(v) for v in np.unravel_index(int(excess.argmax()), got.shape))
    rows, cols = xp.nonzero(bad)
    tiles = len({(int(r) // tile, int(c) // tile) for r, c in zip(rows.tolist(), cols.tolist())})
    return (f"{n_bad} of {got.size} elements ({tiles} {tile}x{tile} tiles) are outside their error "
            f"bound; the worst is [{i}, {j}] in tile ({i // tile}, {j // tile}): got "
            f"{float(got[i, j])!r}, exact {float(ref[i, j])!r}, error {float(err[i, j]):.3g} > "
            f"bound {float(bound[i, j]):.3g} (K = {a.shape[1]})")


def assert_gemm_close(got: Any, a: Any, b: Any, **kwargs: Any) -> None:
    """Raises AssertionError (with :func:`gemm_violations`' message) unless every element of
    ``got`` is within its bound of ``a @ b``."""
    message = gemm_violations(got, a, b, **kwargs)
    if message is not None:
        raise AssertionError(message)
