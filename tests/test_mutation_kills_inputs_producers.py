"""fp16lab.inputs.producers, beyond tests/test_inputs_producers.py: what the consumer is told when
the producer cannot give it an item (closed; every thread gone)."""

from __future__ import annotations

import threading

import pytest

from fp16lab.inputs.producers import OrderedProducer


def test_a_closed_producer_says_so():
    p = OrderedProducer(lambda k: k, threads=2, depth=2)
    assert next(p) == 0
    p.close()
    with pytest.raises(RuntimeError, match="^the producer is closed$"):
        next(p)
    assert p.alive_threads() == 0


def test_a_consumer_waiting_on_threads_that_are_gone_is_told_within_seconds():
    release = threading.Event()
    p = OrderedProducer(lambda k: release.wait(10) and k, threads=1, depth=1)
    real = p._threads
    gone = threading.Thread(target=lambda: None)
    gone.start()
    gone.join()
    p._threads = [gone]  # as if every producer thread had died without handing over item 0
    got: list[BaseException] = []

    def consume():
        try:
            next(p)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            got.append(e)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(timeout=8)  # the consumer re-checks its threads every second
    assert not t.is_alive(), "the consumer kept waiting on threads that are gone"
    assert len(got) == 1 and isinstance(got[0], RuntimeError)
    assert str(got[0]) == "every producer thread ended before item 0"
    release.set()
    p._threads = real
    p.close()
