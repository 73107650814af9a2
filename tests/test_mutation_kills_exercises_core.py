"""The exercise framework's edges: the time limit's clean-up and its repeat, what a timed-out
call shows of its arguments, and the helpers' messages in full."""

import signal
import time

import numpy as np
import pytest

from fp16lab.exercises import Exercise, Wrong, expect_close, expect_power_of_two
from fp16lab.exercises import core


def _endless_check(arg_maker):
    def checker(fn):
        fn(*arg_maker())
        return "returned"
    return Exercise("q9", "?", checker, hint="", solution="", time_limit_s=0.2)


def _forever(*args, **kwargs):
    while True:
        pass


def test_a_timed_out_call_shows_its_arguments_readably():
    q = _endless_check(lambda: (np.zeros((3, 4), np.float16), 2.5, "x" * 50, [[1], [2]]))
    message = q.check(_forever).message
    assert message == ("your function did not return within 0.2 s: _forever(<ndarray float16 (3, 4)>, "
                       "2.5, <str>, [[1], [2]]) was still running. Look for a loop whose condition "
                       "never changes, fix it and run check again.")


def test_described_cuts_at_forty_characters_and_at_a_newline():
    assert core._described("a" * 38) == repr("a" * 38)  # 40 characters with its quotes
    assert core._described("a" * 39) == "<str>"
    assert core._described("a\nb") == repr("a\nb")  # repr has no newline in it

    class Shaped:  # shape and dtype both: described by them, not by repr
        shape, dtype = (2,), "int8"
    assert core._described(Shaped()) == "<Shaped int8 (2,)>"

    class OnlyShape:
        shape = (2,)

        def __repr__(self):
            return "only\nshape"
    assert core._described(OnlyShape()) == "<OnlyShape>"


def test_a_function_that_swallows_the_first_stop_is_stopped_again():
    def swallows_once(*args):
        try:
            while True:
                pass
        except BaseException:  # catches the first stop
            pass
        while True:  # and loops on: the repeat, 0.1 s later, must stop it
            pass
    q = _endless_check(lambda: ())
    start = time.monotonic()
    assert "did not return within 0.2 s" in q.check(swallows_once).message
    assert time.monotonic() - start < 1.0


def test_the_previous_alarm_handler_is_put_back():
    def mine(signum, frame):
        pass
    old = signal.signal(signal.SIGALRM, mine)
    try:
        q = _endless_check(lambda: ())
        q.check(lambda: None)
        assert signal.getsignal(signal.SIGALRM) is mine
    finally:
        signal.signal(signal.SIGALRM, old)


def test_someone_elses_timer_keeps_its_deadline_not_more():
    signal.setitimer(signal.ITIMER_REAL, 100.0, 7.0)
    try:
        q = _endless_check(lambda: ())
        q.check(lambda: time.sleep(0.05))
        left, interval = signal.getitimer(signal.ITIMER_REAL)
        assert 99.0 < left < 99.96 and interval == 7.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_keyword_arguments_reach_the_learners_function():
    q = Exercise("q9", "?", lambda fn: fn(1, b=2), hint="", solution="")
    assert q.check(lambda a, b: f"{a}+{b}").message == "1+2"


def test_the_helpers_messages_in_full():
    with pytest.raises(Wrong) as info:
        expect_close("abc", 1.0, "the rate")
    assert str(info.value) == "the rate: give a number, not str 'abc'."
    with pytest.raises(Wrong) as info:
        expect_close(2.0, 1.0, "the rate")
    assert str(info.value) == "the rate: 2 is not it."
    with pytest.raises(Wrong) as info:
        expect_power_of_two("big", "the scale")
    assert str(info.value) == "give the scale as a number such as 2**-12, not 'big'."
    with pytest.raises(Wrong) as info:
        expect_power_of_two(0.001, "the scale")
    assert str(info.value) == "0.001 is not a power of two; answer with 2**k."


def test_a_new_exercise_is_unsolved_and_a_bad_checker_named():
    q = Exercise("q9", "?", str, hint="", solution="")
    assert q.solved is False and q.attempts == 0
    with pytest.raises(TypeError) as info:
        Exercise("q9", "?", 3, hint="", solution="")
    assert str(info.value) == "checker of exercise 'q9' must be callable, got int"


def test_shown_writes_six_significant_digits_in_brackets():
    assert core.shown([1, 0.5, 1 / 3, 1e-7, 65504.0]) == "[1, 0.5, 0.333333, 1e-07, 65504]"
    assert core.shown([]) == "[]"


def test_feedback_text_and_html_with_and_without_code():
    plain = core.Feedback("hint", "q7", "look at <b>")
    assert str(plain) == f"{core.KINDS['hint'][0]} (q7): look at <b>" and "\n" not in str(plain)
    assert "<pre" not in plain._repr_html_() and "look at &lt;b&gt;" in plain._repr_html_()
    coded = core.Feedback("solution", "q7", "like so", "x = 1 < 2")
    assert str(coded) == f"{core.KINDS['solution'][0]} (q7): like so\nx = 1 < 2"
    assert coded._repr_html_().endswith(
        "like so<pre style='margin:.4em 0 0 0'>x = 1 &lt; 2</pre></div>")


def test_an_exercise_without_solution_code_and_its_hint_name():
    q = Exercise("q3", "?", lambda a: "", hint="think", solution="say so")
    assert q.solution().code == "" and "\n" not in str(q.solution())
    assert q.hint().name == "q3" and q.hint().message == "think"


def test_the_learners_function_keeps_its_attributes_and_repr_inside_the_check():
    def answer(x):
        return x
    answer.note = "mine"
    seen = {}

    def checker(fn):
        seen["note"], seen["repr"], seen["name"] = fn.note, repr(fn), fn.__name__
        return "right"
    q = Exercise("q4", "?", checker, hint="", solution="")
    assert q.check(answer)
    assert seen == {"note": "mine", "repr": repr(answer), "name": "answer"}
