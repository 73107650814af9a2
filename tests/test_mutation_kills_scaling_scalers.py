"""fp16lab.scaling.scalers, beyond tests/test_scaling.py: unscaling under np.seterr(all="raise"),
and which line a collapse warning names.

mutmut's trampolines add frames to every call of a mutated function, so the line is worked out by
walking the real stack and leaving out mutmut's own frames, the way Python's warnings module
would count them without mutmut.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import torch

from fp16lab.scaling import DynamicLossScaler, StaticLossScaler

F32_MAX = float(np.finfo(np.float32).max)
_MUTMUT = f"{os.sep}mutmut{os.sep}"


def _attribution(monkeypatch) -> list[tuple[str, int]]:
    """Replaces warnings.warn; returns the list the (file, line) each warning names goes into."""
    seen: list[tuple[str, int]] = []

    def warn(message, category=None, stacklevel=1, **kwargs):
        frames, f = [], sys._getframe(1)  # stacklevel=1 names warn's caller
        while f is not None:
            if _MUTMUT not in f.f_code.co_filename:
                frames.append(f)
            f = f.f_back
        named = frames[stacklevel - 1]
        seen.append((named.f_code.co_filename, named.f_lineno))

    monkeypatch.setattr(warnings, "warn", warn)
    return seen


def test_a_collapse_warning_names_the_line_that_called_update(monkeypatch):
    seen = _attribution(monkeypatch)
    s = DynamicLossScaler(init_scale=2.0**20, collapse_halvings=1)
    line = sys._getframe().f_lineno + 1
    s.update(found_inf=True)
    assert seen == [(__file__, line)]


def test_unscaling_at_the_largest_scale_works_under_numpy_raise():
    # 1 / float32 max is 2.9e-39, a float32 subnormal: the cast must not trip np.seterr(under=)
    s = StaticLossScaler(F32_MAX)
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([p], lr=0.0)
    s.scale(p.sum() * 0.5).backward()  # gradients 0.5 * F32_MAX, finite
    with np.errstate(all="raise"):
        assert s.unscale_(opt) is False
    inv = np.float32(np.float64(1.0) / np.float64(F32_MAX))  # the reciprocal torch uses
    expected = np.float32(np.float32(0.5 * F32_MAX) * inv)
    assert torch.equal(p.grad, torch.full((2,), float(expected)))
    assert abs(float(expected) - 0.5) < 1e-5
