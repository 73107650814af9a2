"""fp16lab.scaling.events, beyond tests/test_scaling.py: which line a collapse warning names.

mutmut's trampolines add frames to every call of a mutated function, so the line is worked out by
walking the real stack and leaving out mutmut's own frames, the way Python's warnings module
would count them without mutmut.
"""

from __future__ import annotations

import os
import sys
import warnings

from fp16lab.scaling import DynamicLossScaler, ScaleCollapseMonitor, ScaleEvent

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


def _collapse() -> ScaleEvent:
    return ScaleEvent(step=0, scale=2.0, found_inf=True, skipped=True, next_scale=1.0)


def _a_scaler_method(monitor: ScaleCollapseMonitor) -> None:
    monitor.observe(_collapse())  # the default stacklevel: observe is called by such a method


def test_by_default_the_warning_names_the_line_that_called_the_method_calling_observe(
        monkeypatch):
    seen = _attribution(monkeypatch)
    monitor = ScaleCollapseMonitor(halvings=1)
    line = sys._getframe().f_lineno + 1
    _a_scaler_method(monitor)
    assert seen == [(__file__, line)]
    assert len(monitor.warnings) == 1


def test_stacklevel_one_names_the_line_that_called_observe(monkeypatch):
    seen = _attribution(monkeypatch)
    monitor = ScaleCollapseMonitor(halvings=1)
    line = sys._getframe().f_lineno + 1
    monitor.observe(_collapse(), stacklevel=1)
    assert seen == [(__file__, line)]


def test_a_dynamic_scalers_warning_names_the_line_that_called_update(monkeypatch):
    seen = _attribution(monkeypatch)
    s = DynamicLossScaler(init_scale=2.0**20, collapse_halvings=2)
    s.update(found_inf=True)  # one backoff: no warning yet
    assert seen == []
    line = sys._getframe().f_lineno + 1
    s.update(found_inf=True)
    assert seen == [(__file__, line)]
