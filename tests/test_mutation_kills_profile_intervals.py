"""fp16lab.profile.intervals, beyond tests/test_profile.py: what the refusals say, word for word
(a count only where there is more than one), and integer times read as float64."""

from __future__ import annotations

import numpy as np
import pytest

from fp16lab.profile.intervals import busy_us, intervals


def test_a_bad_sequence_is_named_with_its_type():
    with pytest.raises(TypeError) as e:
        intervals(("a", "b"), (1.0, 2.0))
    assert str(e.value).startswith("starts must be a sequence of numbers (µs), got tuple of <U1")


def test_one_time_that_is_not_finite_is_named_without_a_count():
    with pytest.raises(ValueError) as e:
        intervals([0.0, float("nan")], [1.0, 2.0])
    assert str(e.value) == "starts must be finite numbers (µs): starts[1] is nan"
    with pytest.raises(ValueError) as e:
        intervals([0.0, 1.0], [float("inf"), float("nan")])
    assert str(e.value) == "ends must be finite numbers (µs): ends[0] is inf (2 are not finite)"


def test_one_backward_interval_is_named_without_a_count():
    with pytest.raises(ValueError) as e:
        intervals([0.0, 5.0], [1.0, 4.0])
    assert str(e.value) == "interval 1 ends before it starts (5 to 4 µs)"
    with pytest.raises(ValueError) as e:
        intervals([3.0, 5.0], [1.0, 4.0])
    assert str(e.value) == "interval 0 ends before it starts (3 to 1 µs); 2 intervals do"


def test_integer_times_come_back_as_float64():
    s, e = intervals(np.array([1, 2], dtype=np.int32), [3, 4])
    assert s.dtype == np.float64 and e.dtype == np.float64
    assert busy_us(np.array([0, 10], dtype=np.int64), np.array([5, 12], dtype=np.int64)) == 7.0
