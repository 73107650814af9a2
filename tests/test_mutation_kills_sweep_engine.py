"""fp16lab.sweep.engine, beyond tests/test_sweep.py: what mutation testing found unchecked.

The timing must leave the warm-up out: a step function whose first call sleeps 0.5 s (a cold
start) stands in for the training step, and the host clock is the oracle.
"""

from __future__ import annotations

import inspect

import time
from types import SimpleNamespace

import pytest
import torch

from fp16lab.sweep import engine

SLOW_S = 0.5
FAST_S = 0.005

def _default(func, name):
    """A keyword's default, read from the signature (mutation testing wraps the function, which
    leaves __kwdefaults__ empty but keeps the signature)."""
    return inspect.signature(func).parameters[name].default




def _built(calls: list[int]):
    def step():
        time.sleep(SLOW_S if not calls else FAST_S)
        calls.append(1)
        return torch.tensor(2.5)
    return SimpleNamespace(step=step, scaler=None)


def _time(warmup: int, steps: int, calls: list[int]) -> dict:
    point = SimpleNamespace(device="cpu", batch=8, scaler=None)
    return engine._time_steps(point, _built(calls), warmup=warmup, steps=steps, telemetry=False,
                              interval_s=0.1, repeat=0, fault_injector=None)


def test_a_slow_first_step_in_the_warm_up_is_left_out_of_the_timing():
    calls: list[int] = []
    out = _time(1, 5, calls)
    assert len(calls) == 1 + 5
    # every timed step is a fast one: even the slowest of them is far below the cold start
    assert out["step_ms_p90"] < SLOW_S * 1e3 / 5
    assert out["step_ms_median"] < SLOW_S * 1e3 / 5
    assert out["samples_per_s"] == pytest.approx(8 / (out["step_ms_median"] / 1e3))
    assert out["samples_per_s"] > 8 / (SLOW_S / 5)
    assert out["final_loss"] == 2.5 and out["final_scale"] is None and out["skipped_steps"] is None


def test_without_a_warm_up_the_slow_step_is_timed():
    """The oracle of the test above: no warm-up, and the cold start shows in the upper tail."""
    calls: list[int] = []
    out = _time(0, 5, calls)
    assert len(calls) == 5
    assert out["step_ms_p90"] > SLOW_S * 1e3 / 5


def test_the_fault_injector_sees_every_call_counted_from_the_warm_up():
    seen = []
    point = SimpleNamespace(device="cpu", batch=8, scaler=None)
    calls: list[int] = []
    engine._time_steps(point, _built(calls), warmup=2, steps=3, telemetry=False, interval_s=0.1,
                       repeat=4, fault_injector=lambda p, r, i: seen.append((r, i)))
    assert seen == [(4, 0), (4, 1), (4, 2), (4, 3), (4, 4)]


def test_measure_point_defaults():
    assert _default(engine.measure_point, "warmup") == 3
    assert _default(engine.measure_point, "steps") == 10
