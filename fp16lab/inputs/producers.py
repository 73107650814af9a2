"""Work items 0, 1, 2, ... made on several threads and handed over in index order.

:class:`OrderedProducer` runs ``make(k)`` for k = 0, 1, 2, ... on a few threads, so that one
item's waiting (a decode on the GPU, file reads) overlaps another's Python work, and returns
the results strictly in index order through a reorder buffer keyed by k. At most ``depth``
items exist at once (claimed by a thread and not yet taken by the consumer), which bounds the
memory held. An exception raised by ``make(k)`` is handed to the consumer in k's place, after
items 0 .. k-1, and no new items are started; :meth:`OrderedProducer.close` stops the threads
and joins them.

An item's content must depend on k alone (not on which thread made it, or when): the gpu-decode
input backend seeds each batch's random crops with (pipeline seed, k) for that reason.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

__all__ = ["OrderedProducer"]

T = TypeVar("T")

#: How long close() waits for a thread that is inside make() before it gives up and raises.
JOIN_TIMEOUT_S = 60.0


class OrderedProducer(Generic[T]):
    """An iterator over ``make(0), make(1), ...``, made by ``threads`` threads, in index order.

    Args:
        make: returns item k; called once per k, from the producer threads.
        threads: producer threads (at least 1).
        depth: most items claimed or finished but not yet taken (at least ``threads``, so that
            every thread can have one item in hand).
        name: the threads' name prefix (``name-0``, ``name-1``, ...).
    """

    def __init__(self, make: Callable[[int], T], *, threads: int = 2, depth: int = 3,
                 name: str = "fp16lab-producer") -> None:
        for label, value in (("threads", threads), ("depth", depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
        if depth < threads:
            raise ValueError(f"depth ({depth}) must be at least threads ({threads}): every "
                             "thread needs room for the item it makes")
        self._make, self._depth = make, depth
        self._cond = threading.Condition()
        self._done: dict[int, tuple[bool, object]] = {}  # k -> (ok, item or exception)
        self._claimed = 0      # the next k a thread will take
        self._taken = 0        # the next k the consumer will take
        self._failed = False   # an item raised: start nothing new
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def _claim(self) -> int | None:
        """Returns the next index to make, waiting for room; None when the thread should end."""
        with self._cond:
            while True:
                if self._closed or self._failed:
                    return None
                if self._claimed < self._taken + self._depth:
                    k, self._claimed = self._claimed, self._claimed + 1
                    return k
                self._cond.wait()

    def _work(self) -> None:
        while (k := self._claim()) is not None:
            try:
                result: tuple[bool, object] = (True, self._make(k))
            except BaseException as e:  # handed to the consumer in k's place
                result = (False, e)
            with self._cond:
                self._done[k] = result
                self._failed |= not result[0]
                self._cond.notify_all()

    def __iter__(self) -> "OrderedProducer[T]":
        return self

    def __next__(self) -> T:
        """Returns item k (the next in order), waiting for it; raises what ``make(k)`` raised
        (again on every later call), or RuntimeError once the producer is closed."""
        with self._cond:
            while self._taken not in self._done:
                if self._closed:
                    raise RuntimeError("the producer is closed")
                if not any(t.is_alive() for t in self._threads):
                    raise RuntimeError(f"every producer thread ended before item {self._taken}")
                self._cond.wait(timeout=1.0)
            ok, value = self._done[self._taken]
            if not ok:  # kept, so that a retry raises the same error instead of hanging
                raise value  # type: ignore[misc]
            del self._done[self._taken]
            self._taken += 1
            self._cond.notify_all()
        return value  # type: ignore[return-value]

    def close(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Stops the threads after the items they are making and joins them; raises
        RuntimeError naming any thread still running after ``timeout`` seconds. Idempotent."""
        with self._cond:
            self._closed = True
            self._done.clear()
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"producer threads still running after {timeout} s: {alive}")

    def alive_threads(self) -> int:
        """Returns how many producer threads are still running."""
        return sum(t.is_alive() for t in self._threads)
