"""Which ops ran in which dtype under autocast, read from a real forward pass, not from a list.

``torch.autocast`` casts each op's inputs by the op's list (matmuls and convolutions to the low
precision; softmax, norms and losses to fp32, on CUDA). Below autocast, a
``TorchDispatchMode`` sees every ATen op as it runs, with its inputs already cast:
:func:`op_dtypes` records, for one call (a workload step's ``forward_loss``, say), each op's
floating-point input and output dtypes and how often it ran with them. What autocast kept in
fp32 for *this* model on *this* device is then in the table, measured.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

#: Ops that only move or view data: left out of :func:`op_dtypes` unless ``all_ops``.
LAYOUT_OPS = frozenset({"view", "_unsafe_view", "reshape", "expand", "permute", "transpose",
                        "t", "select", "slice", "unsqueeze", "squeeze", "clone", "contiguous",
                        "detach", "alias", "as_strided", "split", "split_with_sizes", "unbind",
                        "chunk", "empty_like", "zeros_like", "ones_like", "fill_", "zero_",
                        "copy_", "lift_fresh", "_to_copy", "to"})


def _dtypes(value: Any) -> str:
    found = sorted({str(t.dtype).removeprefix("torch.") for t in tree_leaves(value)
                    if isinstance(t, torch.Tensor) and t.is_floating_point()})
    return ",".join(found) or "-"


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, str, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        out = func(*args, **(kwargs or {}))
        self.rows.append((func.overloadpacket.__name__, _dtypes((args, kwargs)), _dtypes(out)))
        return out


def op_dtypes(call: Callable[[], Any], *, all_ops: bool = False):
    """Runs ``call()`` once and returns a pandas DataFrame: one row per (op, input dtypes,
    output dtypes) with ``count``, the times it ran so, most frequent first.

    ``op`` is the ATen op (``mm``, ``_softmax``, ``native_layer_norm``), ``inputs`` and
    ``output`` its floating-point tensors' dtypes (``-`` for none). Casts and ops that only
    move or view data (:data:`LAYOUT_OPS`) are left out unless ``all_ops``.
    """
    import pandas as pd

    if not callable(call):
        raise TypeError(f"op_dtypes() takes a function to run, got {type(call).__name__}")
    recorder = _Recorder()
    with recorder:
        call()
    rows = [r for r in recorder.rows if all_ops or r[0] not in LAYOUT_OPS]
    df = pd.DataFrame(rows, columns=["op", "inputs", "output"])
    return (df.value_counts().rename("count").reset_index()
            .sort_values(["count", "op"], ascending=[False, True], kind="stable")
            .reset_index(drop=True))


def ran_in_fp32(table, low: str) -> list[str]:
    """Returns the ops of an :func:`op_dtypes` table that ran in fp32 although autocast ran
    others in ``low`` (``"float16"`` or ``"bfloat16"``): kept there by autocast's lists, by
    type promotion (an fp32 residual plus a low-precision output) or never cast (an embedding)."""
    if low not in ("float16", "bfloat16"):
        raise ValueError(f"low must be 'float16' or 'bfloat16', got {low!r}")
    if not (table["output"] == low).any():
        return []
    fp32 = table[(table["output"] == "float32")]
    return sorted(set(fp32["op"]))


__all__ = ["LAYOUT_OPS", "op_dtypes", "ran_in_fp32"]
