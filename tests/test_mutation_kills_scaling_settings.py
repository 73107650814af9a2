"""fp16lab.scaling.settings, beyond tests/test_scaling.py: a scale is checked the same way under
np.seterr(all="raise"), which people set to hunt NaNs."""

from __future__ import annotations

import numpy as np
import pytest

from fp16lab.scaling.settings import MIN_SCALE, check_scale


@pytest.mark.parametrize("tiny", [np.float64(1e-60), np.float64(1e-40)])
def test_a_scale_that_underflows_float32_is_refused_with_a_value_error_under_raise(tiny):
    # 1e-60 rounds to 0 in float32, 1e-40 to a subnormal: both below 2**-126, both casts raise
    # numpy's underflow flag when given as numpy float64
    with np.errstate(all="raise"):
        with pytest.raises(ValueError, match="must be a finite positive number"):
            check_scale("init_scale", tiny)


def test_a_numpy_scale_in_range_is_taken_under_raise():
    with np.errstate(all="raise"):
        assert check_scale("init_scale", np.float64(MIN_SCALE)) == 2.0**-126
        assert check_scale("init_scale", np.float64(0.1)) == float(np.float32(0.1))
