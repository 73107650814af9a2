"""The exercise framework: a question, a checker that explains wrong answers, a hint and a solution.

An :class:`Exercise` is built from a *checker*: a function that takes the learner's answer and
either returns a sentence saying why it is right, or raises :class:`Wrong` with a sentence
saying what is wrong and, where it can tell, why. The checker computes the right answer itself
(with numpy, ml_dtypes or torch), so a check is never a comparison with a typed-in constant.

``check`` returns a :class:`Feedback`, which Jupyter shows as a coloured box; ``bool(feedback)``
is True only for a right answer, so tests and instructors can use it too. Solutions are shown
only on request, through ``solution()``.

Where the answer is a function, ``check`` hands the checker a stand-in that runs each call of it
under a time limit (:data:`TIME_LIMIT_S`), so an answer that loops forever gets "your function did
not return within 10 s" instead of a cell that never finishes. A notebook cell runs in the main
thread, where SIGALRM interrupts even a pure-Python loop that holds the GIL (and a blocking
``time.sleep``). In another thread the stop is an exception set on that thread
(``PyThreadState_SetAsyncExc``), which lands at its next Python instruction. Neither can stop code
stuck inside one C call (a single endless torch op): Python gets no say until that call returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import html
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from fp16lab import validate

__all__ = ["TIME_LIMIT_S", "Exercise", "Feedback", "Wrong", "expect_close", "expect_equal", "shown",
           "expect_power_of_two"]

_MISSING = object()

#: How long one call of a learner's function may run before ``check`` gives up on it, in seconds.
TIME_LIMIT_S = 10.0

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


class _Stop(BaseException):
    """Raised inside a learner's function whose time is up (a BaseException, so that the
    learner's own ``except Exception`` does not swallow it)."""


class _TimedOut(BaseException):
    """Raised out of a checker when the learner's function ran past its limit; the message is
    the learner's feedback. A BaseException, so that no checker's ``except`` turns it into a
    different complaint."""


def _described(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} {value.dtype} {tuple(value.shape)}>"
    text = repr(value)
    return text if len(text) <= 40 and "\n" not in text else f"<{type(value).__name__}>"


@contextlib.contextmanager
def alarm(limit_s: float, stop: type[BaseException]):
    """Raises ``stop`` in the main thread ``limit_s`` seconds on, and again every 0.1 s until the
    block ends (should the code inside swallow the first one).

    A ``stop`` that lands in a finalizer (a ``__del__``, a weakref callback) cannot leave it:
    Python reports it as "unraisable" instead. Those reports are dropped while the alarm is
    armed; the next alarm, 0.1 s on, stops the code that was running. Someone else's timer (a
    test runner's time-out, say) is set back with the time it had left."""
    running = True

    def on_alarm(signum, frame):
        if running:
            raise stop

    previous_hook = sys.unraisablehook

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, stop):
            previous_hook(unraisable)

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    sys.unraisablehook = hook
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, limit_s, 0.1)
    try:
        yield
    finally:
        running = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGALRM, old_handler if old_handler is not None else signal.SIG_DFL)
        if old_delay:  # someone else's timer keeps its deadline
            left = old_delay - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), old_interval)


def _call_in_main_thread(fn: Callable, args: tuple, kwargs: dict, limit_s: float) -> Any:
    """Calls ``fn`` under :func:`alarm`, which raises :class:`_Stop` inside it at the limit."""
    with alarm(limit_s, _Stop):
        return fn(*args, **kwargs)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               None if exc is None else ctypes.py_object(exc))


def _call_in_other_thread(fn: Callable, args: tuple, kwargs: dict, limit_s: float) -> Any:
    """Calls ``fn`` in this (not the main) thread; a watchdog sets :class:`_Stop` on it at the limit."""
    thread_id, lock, state = threading.get_ident(), threading.Lock(), {"done": False, "fired": False}

    def stop():
        with lock:
            if not state["done"]:
                state["fired"] = True
                _set_async_exc(thread_id, _Stop)

    watchdog = threading.Timer(limit_s, stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        return fn(*args, **kwargs)
    finally:
        watchdog.cancel()
        with lock:
            state["done"] = True
            if state["fired"]:  # a stop set but not landed yet must not land in the checker
                _set_async_exc(thread_id, None)


class _TimedFunction:
    """The learner's function as the checker sees it: the same name, signature and attributes,
    but each call runs under a time limit and raises :class:`_TimedOut` past it."""

    def __init__(self, fn: Callable, limit_s: float) -> None:
        functools.update_wrapper(self, fn)  # __wrapped__: inspect.signature sees fn's signature
        self._limit_s = limit_s

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.__wrapped__
        in_main = threading.current_thread() is threading.main_thread()
        call = _call_in_main_thread if in_main else _call_in_other_thread
        try:
            return call(fn, args, kwargs, self._limit_s)
        except _Stop:
            name = getattr(fn, "__name__", type(fn).__name__)
            shown = ", ".join([*map(_described, args),
                               *(f"{k}={_described(v)}" for k, v in kwargs.items())])
            raise _TimedOut(f"your function did not return within {self._limit_s:g} s: "
                            f"{name}({shown}) was still running. Look for a loop whose condition "
                            "never changes, fix it and run check again.") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


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
        time_limit_s: how long one call of an answer that is a function may run.
    """

    def __init__(self, name: str, question: str, checker: Callable[[Any], str], *, hint: str,
                 solution: str, solution_code: str = "", time_limit_s: float = TIME_LIMIT_S) -> None:
        if not callable(checker):
            raise TypeError(f"checker of exercise {name!r} must be callable, got {type(checker).__name__}")
        self.time_limit_s = validate.number("time_limit_s", time_limit_s, low=0, low_open=True)
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
        if callable(answer) and not isinstance(answer, type):  # a class (np.float16) is a name
            answer = _TimedFunction(answer, self.time_limit_s)
        try:
            why = self._checker(answer)
        except _TimedOut as timed_out:
            return Feedback("incorrect", self.name, str(timed_out))
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


def shown(values: Any) -> str:
    """A list of numbers as a learner reads it: each to six significant digits."""
    return "[" + ", ".join(f"{float(v):.6g}" for v in values) + "]"


def expect_power_of_two(answer: Any, what: str) -> float:
    """Returns ``answer`` as a float; raises :class:`Wrong` unless it is a positive power of two."""
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give {what} as a number such as 2**-12, not {answer!r}.") from None
    if not (value > 0 and math.isfinite(value) and math.frexp(value)[0] == 0.5):
        raise Wrong(f"{value!r} is not a power of two; answer with 2**k.")
    return value
