"""fp16lab.autocast_ops: the dtypes each op ran in, against what autocast documents for a CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fp16lab.autocast_ops import LAYOUT_OPS, op_dtypes, ran_in_fp32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.lin(self.norm(x))  # an fp32 residual stream plus a linear layer


def _run(autocast: bool):
    torch.manual_seed(0)
    m, x = Block(), torch.randn(4, 8)

    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return F.cross_entropy(m(x).float(), torch.zeros(4, dtype=torch.long))
    return op_dtypes(call)


def test_under_bf16_autocast_the_linear_runs_in_bf16_and_the_rest_in_fp32():
    t = _run(True)
    row = lambda op: t[t.op == op].iloc[0]  # noqa: E731
    assert (row("addmm").inputs, row("addmm").output) == ("bfloat16", "bfloat16")
    assert row("native_layer_norm").output == "float32"  # the input is fp32; nothing casts it
    adds = t[t.op == "add"]
    assert list(adds.inputs) == ["bfloat16,float32"] and list(adds.output) == ["float32"]
    assert ran_in_fp32(t, "bfloat16") == ["_log_softmax", "add", "native_layer_norm",
                                          "nll_loss_forward"]
    assert not set(t.op) & LAYOUT_OPS  # casts and views are left out
    assert "_to_copy" in set(op_dtypes(lambda: torch.ones(2).to(torch.bfloat16) * 2, all_ops=True).op)


def test_without_autocast_every_op_is_fp32_and_nothing_is_reported_as_kept():
    t = _run(False)
    assert set(t.output) <= {"float32", "-"}
    assert ran_in_fp32(t, "bfloat16") == []  # no op ran low, so none was kept high
    assert list(t["count"]) == sorted(t["count"], reverse=True)  # most frequent first


def test_bad_arguments():
    with pytest.raises(TypeError, match="takes a function"):
        op_dtypes(3)
    with pytest.raises(ValueError, match="'float16' or 'bfloat16'"):
        ran_in_fp32(_run(True), "fp16")


def test_the_table_counts_each_op_and_orders_by_count_then_name():
    a = torch.ones(3)

    def call():
        for _ in range(3):
            torch.mul(a, 2.0)
            torch.add(a, 1.0)
        torch.sin(a)

    t = op_dtypes(call)
    assert list(t.columns) == ["op", "inputs", "output", "count"]
    assert list(t.index) == [0, 1, 2]  # a fresh index, no column left from the sort
    assert [tuple(r) for r in t.itertuples(index=False)] == [
        ("add", "float32", "float32", 3), ("mul", "float32", "float32", 3),  # a tie: by name
        ("sin", "float32", "float32", 1)]


def test_bad_call_names_its_type_and_fp16_tables_are_read():
    with pytest.raises(TypeError, match="got int"):
        op_dtypes(3)
    a = torch.ones(2, 2, dtype=torch.float16)
    t = op_dtypes(lambda: (a @ a, a.float().sum()))
    assert ran_in_fp32(t, "float16") == ["sum"]  # the matmul ran in fp16, the sum in fp32
