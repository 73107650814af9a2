"""The exercise framework and notebook 01's exercises, with right and wrong answers."""

import functools

import numpy as np
import pytest

from fp16lab.exercises import Exercise, Feedback, Wrong, expect_close, expect_equal
from fp16lab.exercises import ch01


def _square_checker(answer):
    if answer != 9:
        raise Wrong(f"{answer} is not 3 squared")
    return "3 * 3 = 9"


def test_check_right_wrong_missing_and_errors():
    q = Exercise("q9", "What is 3 squared?", _square_checker, hint="multiply", solution="9",
                 solution_code="3 * 3")
    missing = q.check()
    assert missing.kind == "missing" and not missing and "q9.check(" in missing.message
    assert q.check(...).kind == "missing" and q.attempts == 0
    wrong = q.check(8)
    assert not wrong and wrong.kind == "incorrect" and "8 is not 3 squared" in str(wrong)
    assert not q.solved and q.attempts == 1
    right = q.check(9)
    assert right and right.correct and right.message == "3 * 3 = 9"
    assert q.solved and q.attempts == 2
    assert q.hint().kind == "hint" and q.hint().message == "multiply"
    sol = q.solution()
    assert sol.kind == "solution" and sol.code == "3 * 3" and "3 * 3" in sol._repr_html_()


def test_a_checker_that_raises_becomes_a_message_not_a_traceback():
    q = Exercise("q1", "?", lambda a: str(1 / a), hint="", solution="")
    fb = q.check(0)
    assert fb.kind == "incorrect" and "ZeroDivisionError" in fb.message


def test_feedback_html_escapes_and_labels():
    fb = Feedback("incorrect", "q1", "<b>x</b>")
    page = fb._repr_html_()
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "Not yet" in page and "fp16lab-incorrect" in page
    assert str(Feedback("correct", "q2", "ok")) == "Correct (q2): ok"


def test_exercise_needs_a_callable_checker():
    with pytest.raises(TypeError, match="must be callable"):
        Exercise("q1", "?", "not a function", hint="", solution="")


def test_expect_helpers():
    expect_equal(3, 3, "x")
    with pytest.raises(Wrong, match="you gave 4"):
        expect_equal(4, 3, "x")
    expect_close("0.1005", 0.1, "x")
    for bad in ("abc", None, float("nan"), 0.2):
        with pytest.raises(Wrong):
            expect_close(bad, 0.1, "x")


def test_ch01_q1_fp16_code_of_a_tenth():
    right = f"0x{int(np.float16(0.1).view(np.uint16)):04x}"
    assert ch01.q1.check(right) and ch01.q1.check(right.upper().replace("0X", "0x"))
    low = f"0x{int(right, 16) - 1:04x}"
    assert "toward zero" in ch01.q1.check(low).message
    assert "bf16" in ch01.q1.check("0x3dcd").message
    for bad in ("0.1", 0x2E66, "2e66", "0xzz"):
        fb = ch01.q1.check(bad)
        assert not fb and "hex string" in fb.message
    assert not ch01.q1.check("0x3c00")


def test_ch01_q2_spacing_ratio():
    import ml_dtypes
    ratio = float(np.spacing(np.array(0.1, ml_dtypes.bfloat16))) / float(np.spacing(np.float16(0.1)))
    assert ratio == 8.0
    assert ch01.q2.check(8) and ch01.q2.check("8")
    assert "extra fraction bits" in ch01.q2.check(3).message
    assert not ch01.q2.check(16) and not ch01.q2.check("eight")


def test_expect_power_of_two():
    from fp16lab.exercises import expect_power_of_two
    assert expect_power_of_two(2**-10, "x") == 2.0**-10 and expect_power_of_two("8", "x") == 8.0
    for bad in (0, -4, 3, 0.3, float("inf"), "big", None):
        with pytest.raises(Wrong):
            expect_power_of_two(bad, "x")


# ------------------------------------------------ answers that are functions run under a time limit

import importlib  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

#: The exercises whose answer is a function that the checker calls, with the function's arity.
FUNCTION_EXERCISES = [("ch01", "q5", 3), ("ch02", "q3", 6), ("ch03", "q1", 2),
                      ("ch06", "q4", 2), ("ch07", "q1", 2), ("ch09", "q4", 1)]


def _looping(arity):
    """A function of ``arity`` arguments that never returns, holding the GIL in pure Python."""
    names = ", ".join(f"a{i}" for i in range(arity))
    scope = {}
    exec(f"def endless({names}):\n    n = 0\n    while True:\n        n += 1\n", scope)
    return scope["endless"]


def _solution(exercise):
    import numpy, torch, torch.nn.functional as F  # noqa: E401 the solutions' own imports
    scope = {"np": numpy, "torch": torch, "F": F}
    exec(exercise.solution().code, scope)
    return next(v for k, v in scope.items() if callable(v) and k not in ("np", "torch", "F"))


@pytest.mark.parametrize("chapter, name, arity", FUNCTION_EXERCISES)
def test_an_answer_that_loops_forever_is_stopped_and_named(monkeypatch, chapter, name, arity):
    exercise = getattr(importlib.import_module(f"fp16lab.exercises.{chapter}"), name)
    monkeypatch.setattr(exercise, "time_limit_s", 0.3)
    exercise.check(lambda *args: None)  # the checker's own first-time set-up is not timed
    start = time.monotonic()
    feedback = exercise.check(_looping(arity))
    assert time.monotonic() - start < 3
    assert not feedback and "did not return within 0.3 s" in feedback.message
    assert "endless(" in feedback.message


@pytest.mark.parametrize("chapter, name, arity", FUNCTION_EXERCISES)
def test_a_right_function_still_passes_and_a_slow_one_within_the_limit_too(monkeypatch, chapter,
                                                                            name, arity):
    exercise = getattr(importlib.import_module(f"fp16lab.exercises.{chapter}"), name)
    right = _solution(exercise)
    assert exercise.check(right), exercise.check(right)
    calls = []

    @functools.wraps(right)
    def slow(*args):  # slow on its first call only, well inside the limit
        if not calls:
            time.sleep(0.2)
        calls.append(1)
        return right(*args)

    monkeypatch.setattr(exercise, "time_limit_s", 2.0)
    feedback = exercise.check(slow)
    assert feedback, feedback


def test_the_limit_holds_outside_the_main_thread_and_a_loop_that_swallows_exceptions():
    from fp16lab.exercises import ch06

    def stubborn(batch, kernel_ms):
        while True:
            try:
                while True:
                    pass
            except Exception:  # the stop is a BaseException: this does not catch it
                pass

    q = Exercise("q4", "?", ch06.q4._checker, hint="", solution="", time_limit_s=0.3)
    got = []
    worker = threading.Thread(target=lambda: got.append(q.check(stubborn)), daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive() and "did not return within 0.3 s" in got[0].message
    assert "did not return" in q.check(stubborn).message  # and in the main thread


def test_a_timer_set_by_someone_else_survives_a_check():
    import signal
    from fp16lab.exercises import ch07
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        assert ch07.q1.check(lambda a, b: min(a, b))
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90 < left <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_a_class_given_as_an_answer_is_not_wrapped():
    q = Exercise("q1", "?", lambda a: "right" if a is np.float16 else "", hint="", solution="")
    assert q.check(np.float16).message == "right"


def test_the_time_limit_is_a_positive_number():
    for bad in (0, -1, float("nan"), "10", True):
        with pytest.raises((TypeError, ValueError), match="time_limit_s"):
            Exercise("q1", "?", str, hint="", solution="", time_limit_s=bad)


def test_a_stop_landing_in_a_finalizer_is_not_reported_and_the_next_one_stops_the_call():
    """The alarm fires while an object's __del__ runs: Python cannot raise it from there and
    reports it as unraisable. That report is dropped, and the next alarm stops the loop."""
    import sys
    import time as clock
    from fp16lab.exercises.core import alarm

    class Stop(BaseException):
        pass

    class SlowToDie:
        def __del__(self):
            end = clock.monotonic() + 1.5
            while clock.monotonic() < end:
                pass

    reported, finished = [], []
    previous = sys.unraisablehook
    sys.unraisablehook = reported.append
    try:
        start = clock.monotonic()
        with pytest.raises(Stop):
            with alarm(0.2, Stop):
                SlowToDie()  # dies at once; its __del__ is busy when the alarm fires
                finished.append(clock.monotonic() - start)
                while True:
                    pass
        took = clock.monotonic() - start
        assert sys.unraisablehook == reported.append  # put back
    finally:
        sys.unraisablehook = previous
    assert reported == []
    assert finished and finished[0] < 1.0  # the alarm cut the __del__ short, not the caller
    assert took < 1.4  # and the next one, 0.1 s on, stopped the loop


def test_an_unraisable_of_another_kind_still_reaches_the_hook():
    import sys
    from fp16lab.exercises.core import alarm

    class Stop(BaseException):
        pass

    class Broken:
        def __del__(self):
            raise KeyError("in __del__")

    reported = []
    previous = sys.unraisablehook
    sys.unraisablehook = reported.append
    try:
        with alarm(5.0, Stop):
            Broken()
    finally:
        sys.unraisablehook = previous
    assert [type(u.exc_value) for u in reported] == [KeyError]


def test_someone_elses_short_timer_keeps_its_deadline_through_an_alarm():
    """A timer with half a second left, an alarm block of 0.1 s: about 0.4 s are left after."""
    import signal
    import time as clock
    from fp16lab.exercises.core import alarm

    class Stop(BaseException):
        pass

    fired = []
    old = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with alarm(5.0, Stop):
            clock.sleep(0.1)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert signal.getsignal(signal.SIGALRM) is not None and fired == []
        assert 0 < left < 0.41  # 0.5 less the block's 0.1 s (and whatever else ran), not more
        clock.sleep(left + 0.05)
        assert fired == [1]  # the old handler is back, and its timer went off
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_stop_set_while_the_function_waits_in_c_does_not_land_after_the_check():
    """Outside the main thread the stop is an asynchronous exception, which lands only when
    Python code runs: set while the function sleeps, it must be withdrawn (or caught) before
    the check returns, not land in whatever the thread runs next."""
    import threading
    import time as clock
    q = Exercise("q1", "?", lambda fn: (fn(), "right")[1], hint="", solution="",
                 time_limit_s=0.1)
    out = []

    def worker():
        try:
            message = q.check(lambda: clock.sleep(0.3)).message
            total = 0
            for i in range(300_000):  # Python code after the check, where a stray stop lands
                total += i
            out.append(message)
        except BaseException as exc:  # noqa: BLE001 what escaped is the finding
            out.append(f"escaped: {type(exc).__name__}")

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    thread.join(5)
    assert len(out) == 1 and not out[0].startswith("escaped"), out
