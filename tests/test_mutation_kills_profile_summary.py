"""fp16lab.profile.summary, beyond tests/test_profile.py: hand-made event tables (zero-length
kernels, events outside the window, the CPU lane) against figures worked out by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from fp16lab.profile.summary import gpu_time_summary
from fp16lab.profile.trace import KINDS


def _events(rows):
    return pd.DataFrame([{"lane": lane, "kind": kind, "start_us": s, "end_us": e, "top_level": top,
                          "name": f"{kind}-{i}"} for i, (lane, kind, s, e, top) in enumerate(rows)])


def test_kernels_of_no_length_have_a_share_of_zero_not_nan():
    s = gpu_time_summary(_events([("gpu", "elementwise", 5.0, 5.0, False),
                                  ("gpu", "copy", 7.0, 7.0, False)]), window=(0.0, 10.0))
    assert s.kernel_us == 0.0 and s.busy_us == 0.0 and s.idle_fraction == 1.0
    assert s.by_kind["share"].tolist() == [0.0, 0.0]


def test_shares_of_a_sub_microsecond_total_are_fractions():
    s = gpu_time_summary(_events([("gpu", "gemm-conv", 0.0, 0.25, False),
                                  ("gpu", "elementwise", 0.5, 1.0, False)]))
    assert s.kernel_us == pytest.approx(0.75) and s.window_us == pytest.approx(1.0)
    assert s.by_kind["share"].to_dict() == pytest.approx({"gemm-conv": 1 / 3, "elementwise": 2 / 3})


def test_an_event_before_the_window_counts_nothing():
    ev = _events([("gpu", "gemm-conv", 0.0, 5.0, False), ("gpu", "reduction", 12.0, 18.0, False),
                  ("gpu", "copy", 25.0, 40.0, False)])
    s = gpu_time_summary(ev, window=(10.0, 30.0))
    assert s.kernel_us == pytest.approx(6 + 5) and s.busy_us == pytest.approx(11)
    assert s.by_kind["total_us"].to_dict() == pytest.approx({"gemm-conv": 0.0, "reduction": 6.0,
                                                             "copy": 5.0})
    assert s.as_dict() == pytest.approx({
        "window_us": 20.0, "busy_us": 11.0, "idle_fraction": 1 - 11 / 20, "kernel_us": 11.0,
        "lane": "gpu", "gemm-conv_us": 0.0, "reduction_us": 6.0, "copy_us": 5.0})


def test_kinds_come_in_the_trace_modules_order():
    kinds = list(KINDS)
    ev = _events([("gpu", k, float(i), float(i) + 1, False) for i, k in enumerate(reversed(kinds))])
    s = gpu_time_summary(ev)
    assert list(s.by_kind.index) == kinds
    assert s.by_kind["n"].tolist() == [1] * len(kinds)


def test_the_cpu_lane_takes_top_level_operators_only_and_the_messages_say_which_lane():
    ev = _events([("cpu", "op", 0.0, 10.0, True), ("cpu", "op", 2.0, 4.0, False),
                  ("cpu", "launch", 10.0, 12.0, True)])
    s = gpu_time_summary(ev, lane="cpu")
    assert s.lane == "cpu" and s.kernel_us == pytest.approx(12.0) and s.as_dict()["lane"] == "cpu"
    with pytest.raises(ValueError) as e:
        gpu_time_summary(ev)
    assert str(e.value) == ("the trace has no gpu events to summarise (was it profiled on a "
                            "machine without a GPU? use lane='cpu')")
    with pytest.raises(ValueError) as e:
        gpu_time_summary(_events([("gpu", "copy", 0.0, 1.0, False)]), lane="cpu")
    assert str(e.value) == "the trace has no cpu events to summarise"
    with pytest.raises(ValueError, match="lane must be 'gpu' or 'cpu', got 'tpu'"):
        gpu_time_summary(ev, lane="tpu")
