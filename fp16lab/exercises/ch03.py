"""Exercises of notebook 03 (tensor-core GEMMs): padding, cuBLAS's alignment, tiles and waves."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..measure import describe_source, read_result
from ..ncu import STALLS
from .core import Exercise, Wrong

__all__ = ["q1", "q2", "q3", "q4", "Q2_SIZES", "Q3_BATCH", "Q3_FEATURES", "Q3_SMS", "Q3_TILE",
           "reference_pad"]


# ------------------------------------------------------------------------------------ q1: padding

def _as_numpy(x: object) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, on any device
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _check_q1(answer: object) -> str:
    if not callable(answer):
        raise Wrong("pass your function itself, e.g. q1.check(pad_to_8), not its result.")
    rng = np.random.default_rng(0)  # the same cases at every check: the same feedback
    for m, k, n in [(1000, 1001, 1003), (16, 8, 24), (7, 1, 9),
                    *rng.integers(1, 300, (3, 3)).tolist()]:
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal((k, n)).astype(np.float16)
        try:
            out = answer(a.copy(), b.copy())
            ap, bp = (_as_numpy(t) for t in out)
        except (TypeError, ValueError) as e:
            raise Wrong(f"pad_to_8(a, b) must return two arrays (a_padded, b_padded); with a of "
                        f"shape {a.shape} it gave {type(e).__name__}: {e}") from None
        want_a = (m, math.ceil(k / 8) * 8)
        want_b = (want_a[1], math.ceil(n / 8) * 8)
        if ap.shape[1] != bp.shape[0]:
            raise Wrong(f"for a {a.shape} and b {b.shape} your padded shapes {ap.shape} and "
                        f"{bp.shape} cannot be multiplied: pad K the same in both.")
        if ap.shape[1] % 8 or bp.shape[1] % 8:
            raise Wrong(f"for a {a.shape} and b {b.shape} you returned {ap.shape} and {bp.shape}: "
                        "K and N must be multiples of 8.")
        if ap.shape[0] != m:
            raise Wrong(f"a's rows changed from {m} to {ap.shape[0]}: M needs no padding (A's "
                        "rows are not its leading dimension), and C would grow with it.")
        if ap.shape != want_a or bp.shape != want_b:
            raise Wrong(f"for a {a.shape} and b {b.shape} the smallest padded shapes are {want_a} "
                        f"and {want_b}; you returned {ap.shape} and {bp.shape}.")
        if ap.dtype != np.float16 or bp.dtype != np.float16:
            raise Wrong(f"the padded matrices are {ap.dtype} and {bp.dtype}; keep them fp16, or "
                        "the GEMM no longer runs on the fp16 tensor cores.")
        if not (np.array_equal(ap[:, :k], a) and np.array_equal(bp[:k, :n], b)):
            raise Wrong("the original values must sit unchanged in the top-left corner.")
        if np.any(ap[:, k:] != 0) or np.any(bp[k:, :] != 0) or np.any(bp[:, n:] != 0):
            raise Wrong("the padding must be zeros: anything else adds to the product's sums.")
    return ("Right: zero columns of A meet zero rows of B and add nothing, so C[:, :N] of the "
            "padded product is exactly A @ B, and every row is now a multiple of 16 bytes.")


q1 = Exercise(
    "q1", "Write pad_to_8(a, b) returning (a_padded, b_padded): a is M x K, b is K x N, fp16; pad "
          "K and N with zeros up to multiples of 8 so that (a_padded @ b_padded)[:, :N] == a @ b.",
    _check_q1,
    hint="K appears in both: as a's columns and b's rows. torch.nn.functional.pad(t, (0, cols, 0, "
         "rows)) or np.pad(t, ((0, rows), (0, cols))) adds zeros; -k % 8 is how many K needs.",
    solution="Pad a's columns and b's rows by -K % 8, and b's columns by -N % 8, with zeros.",
    solution_code="import torch.nn.functional as F\n"
                  "def pad_to_8(a, b):\n"
                  "    a, b = torch.as_tensor(a), torch.as_tensor(b)\n"
                  "    pk, pn = -a.shape[1] % 8, -b.shape[1] % 8\n"
                  "    return F.pad(a, (0, pk)), F.pad(b, (0, pn, 0, pk))")


def reference_pad(a, b):
    """Returns (a, b) zero-padded so that K and N are multiples of 8: q1's answer, kept here so
    that the notebook can time padding before the learner has written it, without showing it."""
    import torch
    import torch.nn.functional as F

    a, b = torch.as_tensor(a), torch.as_tensor(b)
    pk, pn = -a.shape[1] % 8, -b.shape[1] % 8
    return F.pad(a, (0, pk)), F.pad(b, (0, pn, 0, pk))


# ---------------------------------------------------------------------- q2: alignment, from the file

#: The sizes q2 asks about (the square GEMMs of data/alignment.json).
Q2_SIZES = tuple(range(4096, 4113))


def _fast_sizes() -> tuple[set[int], str]:

    payload = read_result("alignment")
    fast = {r["n"] for r in payload["rows"] if r["mode"] == "square"
            and any(k.startswith("nvjet") for k in r["kernels"])}
    return fast, describe_source(payload["meta"], with_file=False)


def _as_int_set(answer: object) -> set[int]:
    if isinstance(answer, str):
        answer = answer.replace(",", " ").split()
    try:
        return {int(x) for x in answer}  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise Wrong(f"give the sizes as a set or list of integers, e.g. {{4096, 4097}}; got "
                    f"{answer!r}.") from None


def _check_q2(answer: object) -> str:
    given = _as_int_set(answer)
    fast, where = _fast_sizes()
    outside = given - set(Q2_SIZES)
    if outside:
        raise Wrong(f"{sorted(outside)} are not among the sizes asked about (4096 to 4112).")
    if given == fast:
        return (f"{sorted(fast)}: exactly the multiples of 8 ran cuBLAS's Hopper kernels (nvjet) "
                f"({where}). The others ran older CUTLASS kernels with 2- or 4-byte loads.")
    mult16 = {n for n in Q2_SIZES if n % 16 == 0}
    if given == mult16 & fast and fast - given:
        raise Wrong(f"you left out {sorted(fast - given)}: a multiple of 8 that is not a multiple "
                    "of 16 also got the fast kernel; 8 fp16 values are the 16 bytes a vector "
                    "load needs.")
    slow = given - fast
    if slow:
        raise Wrong(f"{sorted(slow)} did not run the nvjet kernel in the recorded run; look at "
                    "what those sizes have in common modulo 8.")
    raise Wrong(f"you missed {sorted(fast - given)}, which also ran the nvjet kernel.")


q2 = Exercise(
    "q2", "Predict, then check in the table: which N in Q2_SIZES (4096..4112, square N^3 fp16 "
          "GEMMs) ran cuBLAS's fast Hopper kernel (nvjet) in data/alignment.json? A set of ints.",
    _check_q2,
    hint="A row of fp16 values starts on a 16-byte boundary only when N is a multiple of ... ?",
    solution="{4096, 4104, 4112}: the multiples of 8.",
    solution_code="t = report.alignment_table(a, 'square')\n"
                  "set(t[t['kernel'].str.startswith('nvjet')]['n'])")


# --------------------------------------------------------------------------- q3: tiles and waves

#: q3's problem: Linear(Q3_FEATURES, Q3_FEATURES) at batch Q3_BATCH, tiles Q3_TILE, on Q3_SMS SMs.
Q3_FEATURES, Q3_BATCH, Q3_TILE, Q3_SMS = 4096, 2100, (256, 128), 132


def _check_q3(answer: object) -> str:
    try:
        value = float(answer)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise Wrong(f"give the number of waves as a whole number, not {answer!r}.") from None
    tiles = -(-Q3_BATCH // Q3_TILE[0]) * -(-Q3_FEATURES // Q3_TILE[1])
    right = -(-tiles // Q3_SMS)
    if value == right:
        return (f"{right} waves: {tiles} tiles on {Q3_SMS} SMs; the last wave runs "
                f"{tiles - (right - 1) * Q3_SMS} tiles and leaves "
                f"{right * Q3_SMS - tiles} SMs idle, yet in this arithmetic takes as long as a full "
                "one (cuBLAS picks its tile per shape to avoid such waves where it can).")
    if value == tiles:
        raise Wrong(f"{value:g} is the number of tiles; how many rounds of {Q3_SMS} does that take?")
    unrounded = -(-(Q3_BATCH / Q3_TILE[0] * -(-Q3_FEATURES // Q3_TILE[1])) // Q3_SMS)
    if value == unrounded:
        raise Wrong(f"{value:g} counts {Q3_BATCH / Q3_TILE[0]:g} rows of tiles; a row of tiles that "
                    "sticks out past the batch still costs a whole row (tile quantization): "
                    "round the rows up before you count the waves.")
    if math.isclose(value, tiles / Q3_SMS, rel_tol=0.01):
        raise Wrong(f"{value:g} is tiles / SMs; a partly filled wave still takes a whole wave's "
                    "time: round up.")
    raise Wrong(f"{value:g} is not it: count the tiles (rows M / {Q3_TILE[0]}, columns N / "
                f"{Q3_TILE[1]}, each rounded up), then how many rounds of {Q3_SMS} they take.")


q3 = Exercise(
    "q3", "A Linear(4096, 4096) at batch Q3_BATCH (2100) runs a kernel with 256x128 output tiles on "
          "the H200's 132 SMs, one tile per SM at a time. How many waves does it take?", _check_q3,
    hint="The output is batch x 4096. Tiles = ceil(2100 / 256) x ceil(4096 / 128); a wave is one "
         "tile on every SM.",
    solution="3 waves: ceil(2100/256) = 9 rows of tiles x 32 columns = 288 tiles; "
             "288 / 132 = 2.2, rounded up.",
    solution_code="from fp16lab import waves\n"
                  "waves.wave_count(waves.tile_count(2100, 4096, 256, 128), 132)")


# ------------------------------------------------------------------ q4: what a step's counters cut

def _step2_cut() -> tuple[str, dict[str, Any], str]:
    payload = read_result("counters_h200")
    rows = {r["impl"]: r for r in payload["rows"] if r.get("part") == "ladder"}
    return rows["wmma_smem"]["moved"], rows, describe_source(payload["meta"], with_file=False,
                                                            rows=list(rows.values()))


def _check_q4(answer: object) -> str:
    if not isinstance(answer, str) or answer.strip() not in STALLS:
        raise Wrong(f"give one stall reason as a string, one of: {', '.join(STALLS)}; got "
                    f"{answer!r}.")
    answer = answer.strip()
    right, rows, where = _step2_cut()
    naive, smem = rows["wmma_naive"], rows["wmma_smem"]
    if answer == right:
        return (f"{right}: {STALLS[right]}. From step 1 to step 2 its stalled warp-cycles fell from "
                f"{smem['moved_before'] / 1e9:.0f} to {smem['moved_after'] / 1e9:.0f} billion "
                f"({where}): each warp of step 1 loads its fragments from global memory and "
                "waits for them; step 2 loads each tile into shared memory once for 8 warps.")
    if answer == "selected":
        raise Wrong("'selected' is a warp issuing, not waiting: it is the one cycle every "
                    "instruction takes. Which wait did shared memory remove?")
    if smem[f"stall_{answer}"] > naive[f"stall_{answer}"]:
        raise Wrong(f"{answer} ({STALLS[answer]}) grew from step 1 to step 2, per instruction "
                    f"issued: {naive[f'stall_{answer}']:.2f} -> {smem[f'stall_{answer}']:.2f}. "
                    "Step 2 added shared memory; what did it take away?")
    if smem[f"stall_{answer}"] == naive[f"stall_{answer}"]:
        raise Wrong(f"{answer} ({STALLS[answer]}) did not change from step 1 to step 2: "
                    f"{naive[f'stall_{answer}']:.2f} per instruction issued in both. Look for the "
                    "stall that fell.")
    raise Wrong(f"{answer} fell less than another stall did. Look at step 1's largest stall in "
                "the table: what does a warp of the naive kernel wait for before each multiply?")


q4 = Exercise(
    "q4", "Which stall reason (a key of fp16lab.ncu.STALLS, e.g. 'barrier') does step 2 "
          "(shared-memory tiles) cut most from step 1? Check in data/counters_h200.json.",
    _check_q4,
    hint="Step 1 reads A and B straight from global memory for every fragment; step 2 stages "
         "them in shared memory. Which stall is a wait for global memory?",
    solution="'long_scoreboard': waiting for global memory (an L1TEX load).",
    solution_code="report.counters_table(cn).loc['wmma_smem', 'stall cut most (G warp-cycles)']")
