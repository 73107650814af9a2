"""Notebook 01's checks at their edges: answers of the wrong shape, and q5's tolerance of one
FP16 spacing (the FP32 master's last bits may differ by the order of a learner's operations)."""

import numpy as np

from fp16lab.exercises import ch01


def _sgd(master, grad, lr):
    master = np.float32(master - np.float32(lr * grad))
    return master, np.float16(master)


def test_q5_wants_a_tuple_of_two():
    for out in ([np.float32(1), np.float16(1)], np.float32(1.0), (np.float32(1),)):
        fb = ch01.q5.check(lambda m, g, lr, out=out: out)
        assert not fb
        assert fb.message == "sgd_update must return two values: (new_master, new_fp16_weight)."


def test_q5_allows_one_fp16_spacing_and_no_more():
    def nudged(spacings):
        def sgd_update(master, grad, lr):
            master, weight = _sgd(master, grad, lr)
            for _ in range(spacings):
                weight = np.nextafter(weight, np.float16(-1))
            return master, weight
        return sgd_update
    assert ch01.q5.check(nudged(1))
    fb = ch01.q5.check(nudged(2))
    assert not fb and "exact arithmetic gives 0.95" in fb.message


def test_q3_refuses_what_is_not_a_list_of_numbers():
    for answer in (None, object()):
        fb = ch01.q3.check(answer)
        assert not fb and fb.message.startswith("give a list of the values that become zero")
    fb = ch01.q3.check(["tiny"])
    assert not fb
    assert fb.message == "give a list of numbers taken from [1e-05, 1e-07, 3e-08, 2.98e-08, 1e-08]."
