"""Notebook 10's exercises: a workload for SmallCNN, and its fp32 SGD step's memory by hand."""

from __future__ import annotations

import torch
from torch import nn

from fp16lab.exercises import ch10
from fp16lab.workload import Workload
from fp16lab.workloads.batches import synthetic_batch


def right_workload() -> Workload:
    return Workload(name="small-cnn", build=ch10.SmallCNN,
                    batch=synthetic_batch((3, 32, 32), num_classes=10))


def test_q1_takes_a_workload_or_its_factory_and_trains_it():
    assert ch10.q1.check(right_workload())
    assert ch10.q1.check(right_workload)
    assert "trains" in ch10.q1.check(right_workload()).message


def test_q1_names_what_is_wrong():
    assert "not int" in ch10.q1.check(3).message
    other = Workload(name="mlp", build=lambda: nn.Linear(4, 2), batch=synthetic_batch((4,), 2))
    assert "fresh SmallCNN" in ch10.q1.check(other).message
    flat = Workload(name="flat", build=ch10.SmallCNN, batch=synthetic_batch((3072,), 10))
    assert "(8, 3, 32, 32)" in ch10.q1.check(flat).message
    many = Workload(name="many", build=ch10.SmallCNN, batch=synthetic_batch((3, 32, 32), 100))
    assert "between 0 and 9" in ch10.q1.check(many).message


def test_q2_is_three_fp32_copies_of_the_parameters_counted_independently():
    n = sum(p.numel() for p in ch10.SmallCNN().parameters())
    assert n == (3 * 16 * 9 + 16) + (16 * 32 * 9 + 32) + (32 * 10 + 10)  # by hand
    assert ch10.q2.check(12 * n) and ch10.q2.check(str(12 * n))
    assert "one more tensor" in ch10.q2.check(8 * n).message
    assert "number of parameters" in ch10.q2.check(n).message
    assert "weights alone" in ch10.q2.check(4 * n).message
    assert not ch10.q2.check(12 * n + 1) and not ch10.q2.check("many")
