"""Notebook 01's exercises q3-q5, with right and wrong answers (oracle: numpy's float16)."""

import numpy as np

from fp16lab.exercises import ch01


def test_q3_values_that_become_zero():
    right = [v for v in ch01.Q3_VALUES if np.float16(v) == 0]
    assert right == [2.98e-8, 1e-8]
    assert ch01.q3.check(right) and ch01.q3.check(tuple(reversed(right)))
    fb = ch01.q3.check(right + [3e-8])
    assert not fb and "do not become zero" in fb.message and "5.96" in fb.message
    fb = ch01.q3.check([1e-8])
    assert not fb and "2.98e-08" in fb.message and "also become zero" in fb.message
    assert "not among" in ch01.q3.check([0.5]).message
    assert "list" in ch01.q3.check(1e-8).message
    assert "list" in ch01.q3.check("1e-8").message


def test_q4_smallest_update_that_changes_one():
    # oracle: the first power of two whose sum with 1.0 survives a float16 cast
    k = min(k for k in range(1, 30) if all(np.float16(1.0 + 2.0**-j) == 1.0 for j in range(k + 1, 30)))
    assert ch01.q4.check(2.0**-k) and k == 10
    assert "tie" in ch01.q4.check(2.0**-11).message
    assert "lost" in ch01.q4.check(2.0**-14).message
    assert "smaller power" in ch01.q4.check(2.0**-8).message
    assert "power of two" in ch01.q4.check(0.001).message
    assert not ch01.q4.check("a lot")


def _right_update(master, grad, lr):
    master = np.float32(master - np.float32(lr * grad))
    return master, np.float16(master)


def test_q5_master_weights():
    assert ch01.q5.check(_right_update)

    def fp16_only(master, grad, lr):  # the bug master weights prevent: updating the FP16 copy
        w = np.float16(np.float16(master) - np.float16(lr * grad))
        return np.float32(w), w
    fb = ch01.q5.check(fp16_only)
    assert not fb and "lost" in fb.message

    def wrong_sign(master, grad, lr):
        master = np.float32(master + np.float32(lr * grad))
        return master, np.float16(master)
    fb = ch01.q5.check(wrong_sign)
    assert not fb and "exact arithmetic gives 0.95" in fb.message

    def float64_master(master, grad, lr):
        master = float(master) - lr * grad
        return master, np.float16(master)
    assert "np.float32" in ch01.q5.check(float64_master).message
    assert "two values" in ch01.q5.check(lambda m, g, lr: ...).message

    def empty(master, grad, lr):
        ...
    assert "returned None" in ch01.q5.check(empty).message
    assert "function itself" in ch01.q5.check(_right_update(1.0, 0.1, 0.1)).message
