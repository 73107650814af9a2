"""A numpy emulation of one WMMA fragment multiply: 16x16x16, fp16 inputs, fp32 accumulation.

``wmma::mma_sync`` computes ``D = A @ B + C`` for a 16x16 fp16 ``A``, a 16x16 fp16 ``B`` and a
16x16 fp32 ``C``. A product of two fp16 numbers (11 significant bits each) has at most 22
significant bits, so it is exact in fp32 (24 bits); the error comes only from adding the 16
products into fp32 accumulators. The emulation assumes exact products, then 16 fp32 additions in
order, each rounded to nearest. Measured tensor cores (Fasi, Higham, Mikaitis and Pranesh,
PeerJ Computer Science 2021: V100, T4, A100) instead add a group of products and the accumulator
at once, aligned to the largest exponent, with the bits shifted out truncated; so the hardware's
last bit can differ and its errors lean toward zero, while their size is the same.
"""

from __future__ import annotations

import numpy as np

from fp16lab import validate

FRAGMENT = (16, 16, 16)  # M, N, K of one WMMA tile


def fragment_mma(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """Returns ``a @ b + c`` as one fp32 WMMA fragment multiply would compute it.

    Args:
        a: (16, 16) values, rounded to fp16 first.
        b: (16, 16) values, rounded to fp16 first.
        c: (16, 16) fp32 accumulator to add to (zeros when omitted).
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != (16, 16) or b.shape != (16, 16):
        raise ValueError(f"a fragment multiply takes 16x16 a and b, got {a.shape} and {b.shape}")
    acc = np.zeros((16, 16), np.float32) if c is None else np.array(c, dtype=np.float32)
    if acc.shape != (16, 16):
        raise ValueError(f"the accumulator c must be 16x16, got {acc.shape}")
    a32 = a.astype(np.float16).astype(np.float32)
    b32 = b.astype(np.float16).astype(np.float32)
    for kk in range(16):
        # outer product of column kk of A and row kk of B: exact in fp32, one rounding per add
        acc = (acc + np.outer(a32[:, kk], b32[kk, :]).astype(np.float32)).astype(np.float32)
    return acc


def fragment_mma_fp16_acc(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Returns ``a @ b`` with the 16 products summed in fp16 (every partial sum rounded to fp16).

    This is what a kernel that accumulates in half precision (``wmma::accumulator`` of
    ``__half``) does; shown only as the contrast to fp32 accumulation.
    """
    a32 = np.asarray(a).astype(np.float16).astype(np.float32)
    b32 = np.asarray(b).astype(np.float16).astype(np.float32)
    if a32.shape != (16, 16) or b32.shape != (16, 16):
        raise ValueError(f"a fragment multiply takes 16x16 a and b, got {a32.shape} and {b32.shape}")
    acc = np.zeros((16, 16), np.float16)
    for kk in range(16):
        prod = np.outer(a32[:, kk], b32[kk, :])  # exact in fp32
        acc = (acc.astype(np.float32) + prod).astype(np.float16)
    return acc


def fragment_error(seed: int = 0, scale: float = 1.0) -> dict[str, float]:
    """Returns the emulated fragment's relative (Frobenius) error against float64, with fp32
    and with fp16 accumulation, next to the unit roundoffs of fp32 and fp16."""
    seed = validate.count("seed", seed, low=0)
    scale = validate.number("scale", scale, low=0, low_open=True)
    rng = np.random.default_rng(seed)
    a = (scale * rng.standard_normal((16, 16))).astype(np.float16)
    b = (scale * rng.standard_normal((16, 16))).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)

    def rel(x: np.ndarray) -> float:
        return float(np.linalg.norm(x.astype(np.float64) - ref) / np.linalg.norm(ref))
    return {
        "rel_error_fp32_accumulate": rel(fragment_mma(a, b)),
        "rel_error_fp16_accumulate": rel(fragment_mma_fp16_acc(a, b)),
        "fp32_unit_roundoff": float(2.0**-24),
        "fp16_unit_roundoff": float(2.0**-11),
    }
