"""fp16lab.inputs.feeding, beyond tests/test_inputs_feeding.py: what mutation testing found unchecked.

Each test states a behaviour against an oracle of its own (a counted call, a slow step made
visible on the host clock, a ratio worked out by hand), not against the code's own output.
"""

from __future__ import annotations

import time

import pytest

from fp16lab.inputs import feeding
from fp16lab.inputs.settings import InputSettings

SLOW_S = 0.5
FAST_S = 0.005


def _slow_first(calls: list[float]):
    """A step whose first call sleeps SLOW_S (a cold start), the others FAST_S."""
    def one():
        time.sleep(SLOW_S if not calls else FAST_S)
        calls.append(time.perf_counter())
    return one


def test_a_slow_first_step_in_the_warm_up_is_left_out_of_the_rate():
    calls: list[float] = []
    row: dict = {}
    feeding._timed(row, "cpu", 1, 6, 8, _slow_first(calls))
    assert len(calls) == 1 + 6 and row["warmup"] == 1 and row["timed_steps"] == 6
    # 6 fast steps take about 30 ms; the 500 ms step must not be in the window
    assert row["seconds"] < SLOW_S / 2
    assert row["images_per_s"] > 6 * 8 / (SLOW_S / 2)


def test_without_a_warm_up_the_slow_step_is_in_the_window():
    """The oracle of the test above: the same step, no warm-up, and the slow step shows."""
    calls: list[float] = []
    row: dict = {}
    feeding._timed(row, "cpu", 0, 6, 8, _slow_first(calls))
    assert len(calls) == 6 and row["seconds"] >= SLOW_S
    assert row["images_per_s"] == pytest.approx(6 * 8 / row["seconds"])


class _Pipeline:
    """A stand-in for an input pipeline: counts its batches, the first one slow."""

    implementation = "fake"

    def __init__(self):
        self.calls: list[float] = []
        self.one = _slow_first(self.calls)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __next__(self):
        self.one()
        return None

    def stage_seconds(self):
        return {"batches": len(self.calls), "read_s": 0.001 * len(self.calls)}


def test_measure_loader_warms_up_before_it_times(monkeypatch):
    made = []

    def fake_make_input(settings, root, device):
        made.append(_Pipeline())
        return made[-1]

    monkeypatch.setattr(feeding, "make_input", fake_make_input)
    monkeypatch.setattr(feeding, "unavailable_reason", lambda backend, device: None)
    row = feeding.measure_loader(InputSettings("synthetic", batch=4), device="cpu", warmup=2, steps=5)
    assert row["status"] == "ok" and row["implementation"] == "fake"
    assert len(made[0].calls) == 2 + 5 and row["timed_steps"] == 5 and row["warmup"] == 2
    assert row["seconds"] < SLOW_S / 2 and row["images_per_s"] > 5 * 4 / (SLOW_S / 2)
    # 5 batches made in the window, each 1 ms of reading: 1 ms per batch
    assert row["stage_ms_per_batch"] == {"read": pytest.approx(1.0)}
    assert feeding.measure_loader.__kwdefaults__ == {"device": "cuda", "warmup": 3, "steps": 10,
                                                     "min_seconds": 0.0}
