"""OrderedProducer: order, overlap, the depth bound, errors in place, and clean shutdown."""

from __future__ import annotations

import random
import threading
import time

import pytest

from fp16lab.inputs.producers import OrderedProducer


def _threads(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def test_items_come_in_index_order_whatever_finishes_first():
    delays = random.Random(0).choices([0.0, 0.001, 0.01, 0.03], k=60)

    def make(k):
        time.sleep(delays[k])  # later items often finish before earlier ones
        return k * k

    p = OrderedProducer(make, threads=4, depth=6, name="t-order")
    try:
        assert [next(p) for _ in range(60)] == [k * k for k in range(60)]
    finally:
        p.close()


def test_threads_make_items_at_the_same_time():
    meet = threading.Barrier(2, timeout=5)  # broken (an error) unless two makes overlap

    def make(k):
        if k < 2:
            meet.wait()
        return k

    p = OrderedProducer(make, threads=2, depth=2, name="t-overlap")
    try:
        assert [next(p) for _ in range(4)] == [0, 1, 2, 3]
    finally:
        p.close()


def test_at_most_depth_items_are_in_hand():
    started, lock = [], threading.Lock()

    def make(k):
        with lock:
            started.append(k)
        return k

    p = OrderedProducer(make, threads=3, depth=4, name="t-depth")
    try:
        time.sleep(0.3)  # the consumer takes nothing: exactly depth items are made, no more
        assert sorted(started) == [0, 1, 2, 3]
        assert next(p) == 0 and next(p) == 1
        time.sleep(0.3)
        assert sorted(started) == [0, 1, 2, 3, 4, 5]
    finally:
        p.close()


def test_an_error_arrives_in_its_place_and_stays():
    def make(k):
        if k == 3:
            raise OSError("cannot read /data/img_3.jpg")
        return k

    p = OrderedProducer(make, threads=2, depth=3, name="t-error")
    try:
        assert [next(p) for _ in range(3)] == [0, 1, 2]
        for _ in range(2):  # a retry raises the same error; it does not hang
            with pytest.raises(OSError, match="/data/img_3.jpg"):
                next(p)
        time.sleep(0.2)
        assert p.alive_threads() == 0  # nothing new is started after a failure
    finally:
        p.close()


def test_close_joins_every_thread_also_when_they_wait_for_room():
    p = OrderedProducer(lambda k: k, threads=3, depth=3, name="t-close")
    time.sleep(0.1)  # all three wait for the consumer
    assert len(_threads("t-close")) == 3
    p.close()
    assert _threads("t-close") == [] and p.alive_threads() == 0
    p.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        next(p)


def test_close_waits_for_the_item_in_hand_and_names_a_stuck_thread():
    release = threading.Event()

    def make(k):
        release.wait(10)
        return k

    p = OrderedProducer(make, threads=1, depth=1, name="t-stuck")
    with pytest.raises(RuntimeError, match=r"still running after 0.2 s: \['t-stuck-0'\]"):
        p.close(timeout=0.2)
    release.set()
    p.close()
    assert _threads("t-stuck") == []


@pytest.mark.parametrize("threads, depth, match", [
    (0, 3, "threads must be an integer >= 1"),
    (2, 0, "depth must be an integer >= 1"),
    (True, 3, "threads must be an integer"),
    (3, 2, r"depth \(2\) must be at least threads \(3\)"),
])
def test_bad_arguments_fail_before_any_thread_starts(threads, depth, match):
    before = threading.active_count()
    with pytest.raises(ValueError, match=match):
        OrderedProducer(lambda k: k, threads=threads, depth=depth)
    assert threading.active_count() == before
