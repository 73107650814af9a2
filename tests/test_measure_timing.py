"""fp16lab.measure.timing: summaries match numpy's percentiles; CUDA-event and sustained timings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fp16lab import measure


@given(st.lists(st.floats(0.001, 1e4), min_size=1, max_size=200))
def test_summarize_matches_numpy(xs):
    t = measure.summarize(xs)
    assert t.median_ms == pytest.approx(np.median(xs))
    assert t.p10_ms == pytest.approx(np.percentile(xs, 10))
    assert t.p90_ms == pytest.approx(np.percentile(xs, 90))
    assert t.n == len(xs)


def test_summarize_rejects_empty():
    with pytest.raises(ValueError, match="at least one"):
        measure.summarize([])


def test_time_cpu_measures_sleep():
    import time
    t = measure.time_cpu(lambda: time.sleep(0.01), warmup=0, repeat=3)
    assert 9.0 <= t.median_ms < 200


def test_bad_counts_and_backend():
    with pytest.raises(ValueError, match="repeat"):
        measure.time_cpu(lambda: None, repeat=0)
    with pytest.raises(ValueError, match="backend"):
        measure.time_cuda(lambda: None, backend="opencl")


def test_interleaved_timing_balances_the_order_and_pools_the_rounds(monkeypatch):
    calls = []

    def fake_samples(fn, warmup, repeat, backend):
        name = fn()
        calls.append(name)
        base = {"a": 1.0, "b": 2.0, "c": 4.0}[name]
        return [base * (1 + 0.1 * len(calls)) for _ in range(repeat)]  # a clock drifting upwards

    monkeypatch.setattr(measure.timing, "_cuda_samples", fake_samples)
    out = measure.time_cuda_interleaved({n: (lambda n=n: n) for n in "abc"}, rounds=3, repeat=2,
                                      backend="cupy")
    assert calls == ["a", "b", "c", "c", "b", "a", "b", "c", "a"]
    assert {n: t.n for n, t in out.items()} == {"a": 6, "b": 6, "c": 6}
    # each function's samples are the ones it got in its three rounds
    assert out["a"].median_ms == pytest.approx(np.median([1.1, 1.6, 1.9]))
    assert out["c"].median_ms == pytest.approx(4 * np.median([1.3, 1.4, 1.8]))
    with pytest.raises(ValueError, match="rounds"):
        measure.time_cuda_interleaved({"a": lambda: "a"}, rounds=0)
    with pytest.raises(ValueError) as e:
        measure.time_cuda_interleaved({})
    assert str(e.value) == "time_cuda_interleaved needs at least one function, got none"


@pytest.mark.parametrize("n", range(1, 10))
def test_round_orders_put_every_name_everywhere_and_after_every_other_equally(n):
    """Counted over one cycle (n rounds, 2n when n is odd): every round is every name once,
    every name holds every place equally often, and within the rounds every ordered pair of
    different names is neighbours equally often, so no name always follows the same one."""
    from collections import Counter
    names = [f"f{i}" for i in range(n)]
    cycle = n if n % 2 == 0 else 2 * n
    orders = measure.round_orders(names, cycle)
    assert len(orders) == cycle and all(sorted(o) == names for o in orders)
    places = Counter((i, name) for o in orders for i, name in enumerate(o))
    assert set(places) == {(i, name) for i in range(n) for name in names}
    assert len(set(places.values())) == 1
    pairs = Counter(p for o in orders for p in zip(o, o[1:]))
    assert set(pairs) == {(a, b) for a in names for b in names if a != b}
    assert len(set(pairs.values())) <= 1
    # more rounds repeat the cycle; fewer take its start
    assert measure.round_orders(names, 2 * cycle + 1) == orders * 2 + orders[:1]


def test_round_orders_by_hand():
    assert measure.round_orders("ab", 4) == [["a", "b"], ["b", "a"]] * 2
    assert measure.round_orders("abcd", 4) == [list("abdc"), list("bcad"), list("cdba"),
                                               list("dacb")]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="rounds must be >= 1"):
            measure.round_orders("ab", bad)
    for bad in (True, 2.5, "3"):
        with pytest.raises((TypeError, ValueError), match="rounds must be a whole number"):
            measure.round_orders("ab", bad)
    with pytest.raises(ValueError) as e:
        measure.round_orders([], 2)
    assert str(e.value) == "round_orders needs at least one name, got none"


def test_nvidia_smi_id_follows_cuda_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert measure.nvidia_smi_id(1) == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert [measure.nvidia_smi_id(i) for i in (0, 1)] == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2a")
    assert measure.nvidia_smi_id(0) == "GPU-8f2a"


def test_sustained_timing_rejects_bad_lengths():
    with pytest.raises(ValueError, match="seconds > 0"):
        measure.time_cuda_sustained(lambda: None, seconds=0)


@pytest.mark.gpu
def test_sustained_timing_scales_with_the_work():
    # copies: memory-bound, so their rate does not follow the SM clock, which a second of
    # tensor-core work would pull down between the two measurements
    cupy = pytest.importorskip("cupy")
    src = cupy.ones(2**27, dtype=cupy.float32)
    dst = cupy.empty_like(src)

    def copy():
        dst[...] = src
    one = measure.time_cuda_sustained(copy, seconds=0.3)
    two = measure.time_cuda_sustained(lambda: (copy(), copy()), seconds=0.3)
    assert one["calls"] >= 3 and 0.2 < one["seconds"] < 3
    assert 1.6 < two["ms_per_call"] / one["ms_per_call"] < 2.4
    if one["sm_clock_mhz"] is not None:  # nvidia-smi was there
        assert 100 < one["sm_clock_mhz"] < 5000 and one["power_w"] > 0


def test_cuda_kernels_is_empty_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert measure.cuda_kernels(lambda: torch.ones(8) + 1, warmup=1) == []


@pytest.mark.gpu
def test_cuda_kernels_names_the_gemm():
    import torch
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    kernels = measure.cuda_kernels(lambda: x @ x, warmup=1)
    assert kernels and all(isinstance(n, str) and us >= 0 for n, us in kernels)
    longest = max(kernels, key=lambda k: k[1])[0]
    assert any(tag in longest.lower() for tag in ("gemm", "nvjet", "cutlass", "sm90", "sm80")), longest


@pytest.mark.gpu
def test_cuda_timing_and_copy_bandwidth():
    import torch
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    t = measure.time_cuda(lambda: x @ x, warmup=2, repeat=5)
    assert t.median_ms > 0
    assert measure.copy_bandwidth_gbs(2**28, repeat=5) > 100
    # twice the work takes about twice the time, whichever of the two runs first
    both = measure.time_cuda_interleaved({"one": lambda: x @ x, "two": lambda: (x @ x, x @ x)},
                                       rounds=3, repeat=5)
    assert 1.6 < both["two"].median_ms / both["one"].median_ms < 2.4


def test_step_times_time_each_call_on_the_host_clock():
    import time
    sleeps = iter([0.040, 0.002])
    ms = measure.step_times_ms(lambda: time.sleep(next(sleeps)), 2, "cpu")
    assert len(ms) == 2
    assert ms[0] >= 39 and ms[1] < 30  # each call's own time, not the running total
