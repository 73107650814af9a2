"""Exercises with instant feedback for the notebooks: ``q1.check(answer)``, ``q1.hint()``, ``q1.solution()``.

Each notebook imports its own set, e.g. ``from fp16lab.exercises import ch01 as ex``, then calls
``ex.q1.check(...)``. The framework lives in :mod:`fp16lab.exercises.core`.
"""

from .core import (TIME_LIMIT_S, Exercise, Feedback, Wrong, expect_close, expect_equal,
                   expect_power_of_two)

__all__ = ["TIME_LIMIT_S", "Exercise", "Feedback", "Wrong", "expect_close", "expect_equal",
           "expect_power_of_two"]
