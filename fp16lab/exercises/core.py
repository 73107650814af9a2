"""The exercise framework: a question, a checker that explains wrong answers, a hint and a solution.

An :class:`Exercise` is built from a *checker*: a function that takes the learner's answer and
either returns a sentence saying why it is right, or raises :class:`Wrong` with a sentence
saying what is wrong and, where it can tell, why. The checker computes the right answer itself
(with numpy, ml_dtypes or torch), so a check is never a comparison with a typed-in constant.

``check`` returns a :class:`Feedback`, which Jupyter shows as a coloured box; ``bool(feedback)``
is True only for a right answer, so tests and instructors can use it too. Solutions are shown
only on request, through ``solution()``.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Exercise", "Feedback", "Wrong", "expect_close", "expect_equal", "expect_power_of_two"]

_MISSING = object()

#: Feedback kinds, with the label a learner reads and the box colour.
KINDS = {
    "correct": ("Correct", "#e6f4ea", "#1e7e34"),
    "incorrect": ("Not yet", "#fdecea", "#b02a37"),
    "missing": ("No answer yet", "#fff8e1", "#8a6d00"),
    "hint": ("Hint", "#e8f0fe", "#1a4f9c"),
    "solution": ("Solution", "#f3e8fd", "#5b2a86"),
}


class Wrong(Exception):
    """Raised by a checker: the message tells the learner what is wrong with the answer."""


@dataclass(frozen=True)
class Feedback:
    """What ``check``, ``hint`` and ``solution`` return: a kind, the exercise's name and a message."""

    kind: str
    name: str
    message: str
    code: str = ""

    @property
    def correct(self) -> bool:
        """True for a right answer only."""
        return self.kind == "correct"

    def __bool__(self) -> bool:
        return self.correct

    def __str__(self) -> str:
        label = KINDS[self.kind][0]
        text = f"{label} ({self.name}): {self.message}"
        return f"{text}\n{self.code}" if self.code else text

    __repr__ = __str__

    def _repr_html_(self) -> str:
        label, background, colour = KINDS[self.kind]
        code = (f"<pre style='margin:.4em 0 0 0'>{html.escape(self.code)}</pre>"
                if self.code else "")
        return (f"<div class='fp16lab-feedback fp16lab-{self.kind}' style='background:{background};"
                f"border-left:4px solid {colour};padding:.5em .8em;margin:.3em 0'>"
                f"<b style='color:{colour}'>{label}</b> <span style='color:#555'>({html.escape(self.name)})"
                f"</span>: {html.escape(self.message)}{code}</div>")


class Exercise:
    """One question with a checker, a hint and a solution.

    Args:
        name: how the notebook refers to it, e.g. ``"q1"``.
        question: one line saying what to answer and in what form.
        checker: ``checker(answer) -> str``; returns why the answer is right, raises
            :class:`Wrong` with what is wrong.
        hint: a nudge that does not give the answer away.
        solution: the answer, as text; ``solution_code`` the code, where the task is code.
    """

    def __init__(self, name: str, question: str, checker: Callable[[Any], str], *, hint: str,
                 solution: str, solution_code: str = "") -> None:
        if not callable(checker):
            raise TypeError(f"checker of exercise {name!r} must be callable, got {type(checker).__name__}")
        self.name, self.question, self._checker = name, question, checker
        self._hint, self._solution, self._solution_code = hint, solution, solution_code
        self.attempts = 0
        self.solved = False

    def check(self, answer: Any = _MISSING) -> Feedback:
        """Returns the feedback on ``answer``: right (and why) or not yet (and what is wrong)."""
        if answer is _MISSING or answer is Ellipsis:
            return Feedback("missing", self.name,
                            f"replace the ... with your answer and run {self.name}.check(your_answer). "
                            f"The question: {self.question}")
        self.attempts += 1
        try:
            why = self._checker(answer)
        except Wrong as wrong:
            return Feedback("incorrect", self.name, str(wrong))
        except Exception as exc:  # an answer of the wrong kind: say what it raised, not a traceback
            return Feedback("incorrect", self.name,
                            f"checking your answer raised {type(exc).__name__}: {exc}")
        self.solved = True
        return Feedback("correct", self.name, why)

    def hint(self) -> Feedback:
        """Returns the hint."""
        return Feedback("hint", self.name, self._hint)

    def solution(self) -> Feedback:
        """Returns the solution (shown only when asked for)."""
        return Feedback("solution", self.name, self._solution, self._solution_code)

    def __repr__(self) -> str:
        return f"{self.name}: {self.question}"


def expect_equal(answer: Any, expected: Any, what: str) -> None:
    """Raises :class:`Wrong` unless ``answer == expected``, naming ``what`` was expected."""
    if answer != expected:
        raise Wrong(f"{what}: you gave {answer!r}, which is not it.")


def expect_close(answer: Any, expected: float, what: str, *, rel: float = 0.01) -> None:
    """Raises :class:`Wrong` unless ``answer`` is a number within ``rel`` of ``expected``."""
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"{what}: give a number, not {type(answer).__name__} {answer!r}.") from None
    if not math.isfinite(value) or not math.isclose(value, expected, rel_tol=rel):
        raise Wrong(f"{what}: {value:g} is not it.")


def expect_power_of_two(answer: Any, what: str) -> float:
    """Returns ``answer`` as a float; raises :class:`Wrong` unless it is a positive power of two."""
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give {what} as a number such as 2**-12, not {answer!r}.") from None
    if not (value > 0 and math.isfinite(value) and math.frexp(value)[0] == 0.5):
        raise Wrong(f"{value!r} is not a power of two; answer with 2**k.")
    return value
