"""A numpy emulation of one WMMA fragment multiply: 16x16x16, fp16 inputs, fp32 accumulation.

``wmma::mma_sync`` computes ``D = A @ B + C`` for a 16x16 fp16 ``A``, a 16x16 fp16 ``B`` and a
16x16 fp32 ``C``. A product of two fp16 numbers (11 significant bits each) has at most 22
significant bits, so it is exact in fp32 (24 bits); the error comes only from adding the 16
products into fp32 accumulators. The emulation does exactly that: exact products, then 16 fp32
additions in order. (The hardware adds in its own order and may keep fewer guard bits, so its
last bit can differ; the size of the error is the same.)
"""

from __future__ import annotations

import numpy as np

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


def fragment_error(seed: int = 0, scale: float = 1.0) -> dict[str, float]:
    """Returns the emulated fragment's error against float64: max abs and relative (Frobenius)."""
    rng = np.random.default_rng(seed)
    a = (scale * rng.standard_normal((16, 16))).astype(np.float16)
    b = (scale * rng.standard_normal((16, 16))).astype(np.float16)
    d = fragment_mma(a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    d16 = (a.astype(np.float16) @ b.astype(np.float16)).astype(np.float64)  # fp16 accumulation
    return {
        "max_abs_error_fp32_acc": float(np.abs(d - ref).max()),
        "rel_error_fp32_acc": float(np.linalg.norm(d - ref) / np.linalg.norm(ref)),
        "rel_error_fp16_acc": float(np.linalg.norm(d16 - ref) / np.linalg.norm(ref)),
        "fp16_input_rounding": float(2.0**-11),
    }
