"""census / census_model against casts by numpy and ml_dtypes and numpy's frexp."""

from __future__ import annotations

import importlib
import itertools
import time

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fp16lab.census import CLASSES, HIST_MIN, _census_torch, census, census_model
from fp16lab.formats import format_info
from fp16lab.kernels.census import cupy_kernel_launcher
from fp16lab.kernels.launch import direct_launches
from fp16lab.models import build_model, input_shape

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

CAST = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
        "fp8_e5m2": ml_dtypes.float8_e5m2, "fp32": np.float32}


def oracle_counts(x: np.ndarray, name: str) -> dict[str, int]:
    """Classes from the value the cast actually stores (casts from float32, or float64 for fp16
    and fp32, so that no double rounding enters the oracle)."""
    f = format_info(name)
    src = x.astype(np.float64 if name in ("fp16", "fp32") else np.float32)
    y = np.abs(src.astype(CAST[name]).astype(np.float64))
    isnan = np.isnan(x)
    return {
        "zero": int(np.sum(x == 0)),
        "underflow": int(np.sum((x != 0) & (y == 0))),
        "subnormal": int(np.sum((y > 0) & (y < f.smallest_normal))),
        "normal": int(np.sum((y >= f.smallest_normal) & (y <= f.max_finite))),
        "overflow": int(np.sum(~isnan & ((y > f.max_finite) | np.isnan(y)))),
        "nan": int(np.sum(isnan)),
    }


def oracle_hist(x: np.ndarray) -> np.ndarray:
    a = np.abs(x[np.isfinite(x) & (x != 0)].astype(np.float64))
    e = np.frexp(a)[1] - 1  # floor(log2|x|)
    return np.bincount(np.clip(e - HIST_MIN, 0, 290), minlength=291)  # census clamps too


def wide_sample(n: int, seed: int, lo: int = -45, hi: int = 45) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(lo, hi, n))).astype(np.float32)
    x[:8] = [0.0, -0.0, np.nan, np.inf, -np.inf, 2.0**-25, 65520.0, 464.0]
    return x


@pytest.mark.parametrize("name", sorted(CAST))
def test_classes_match_casts(name):
    x = wide_sample(300_000, 1)
    if name == "fp32":
        x = x.astype(np.float64) * np.exp2(np.random.default_rng(2).integers(-120, 120, x.size))
    c = census(x, name)
    assert c.counts == oracle_counts(x, name)
    assert sum(c.counts.values()) == x.size and abs(sum(c.fractions.values()) - 1) < 1e-12


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
def test_boundaries_exactly(name):
    """Values at and next to each class boundary, where rounding decides."""
    f = format_info(name)
    s, n, m = f.smallest_subnormal, f.smallest_normal, f.max_finite
    top = 2.0 ** (f.emax - f.mantissa_bits)
    b = np.array([s / 2, n - s / 2, m + top / 2, s, n, m], dtype=np.float32)
    x = np.concatenate([b, np.nextafter(b, np.float32(0)), np.nextafter(b, np.float32(np.inf))])
    x = np.concatenate([x, -x])
    assert census(x, name).counts == oracle_counts(x, name)


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, st.integers(0, 200), elements=st.floats(width=32)))
def test_hypothesis_fp16_and_e4m3(x):
    for name in ("fp16", "fp8_e4m3"):
        c = census(x, name)
        assert c.counts == oracle_counts(x, name)
        assert np.array_equal(c.hist, oracle_hist(x))


def test_histogram_matches_frexp_including_subnormals():
    x = wide_sample(200_000, 3, -160, 100)  # float32 subnormals included
    assert np.array_equal(census(x).hist, oracle_hist(x))
    x64 = x.astype(np.float64) * 2.0**-900  # float64 far below: clamped into the first bin
    h = census(x64).hist
    assert h.sum() == oracle_hist(x64).sum() and h[0] == h.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_torch_tensors_match_numpy(dtype):
    x = torch.from_numpy(wide_sample(100_000, 4, -20, 20)).to(dtype)
    ref = x.double().numpy()
    for name in ("fp16", "fp8_e5m2"):
        c = census(x, name)
        assert c.counts == oracle_counts(ref, name), (dtype, name)
        assert np.array_equal(c.hist, oracle_hist(ref))
        # the torch backend (the one used on GPUs without CuPy) gives the same counts
        counts, hist = _census_torch(x, format_info(name), backend="torch")
        assert counts[5] == c.counts["nan"] and np.array_equal(hist, c.hist)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int32])
@pytest.mark.parametrize("name", sorted(CAST))
def test_torch_backend_all_classes(dtype, name):
    """The torch backend (bucketize on bit patterns) against the cast oracle, every class."""
    x = wide_sample(50_000, 11, -150, 40).astype(np.float64)
    x *= np.exp2(np.random.default_rng(12).integers(-30, 30, x.size))
    t = torch.from_numpy(x).to(dtype)
    ref = t.double().numpy()
    counts, hist = _census_torch(t, format_info(name), backend="torch")
    want = oracle_counts(ref, name)
    cum = np.cumsum([want["zero"], want["underflow"], want["subnormal"], want["normal"]])
    assert list(counts) == [*cum, ref.size, want["nan"]], (dtype, name)
    assert np.array_equal(hist, oracle_hist(ref))


def test_ml_dtypes_and_int_input():
    x = wide_sample(10_000, 5, -10, 10).astype(ml_dtypes.bfloat16)
    assert census(x, "fp16").counts == oracle_counts(x.astype(np.float32), "fp16")
    ints = np.array([0, 1, 70000, -3])
    assert census(ints, "fp16").counts["overflow"] == 1
    assert census(ints, "fp16").counts["zero"] == 1


def test_result_text_and_row():
    c = census(np.array([0.0, 1.0, 1e-8, 1e6], dtype=np.float32), "fp16")
    assert c.fractions == {"zero": 0.25, "underflow": 0.25, "subnormal": 0.0, "normal": 0.25,
                           "overflow": 0.25, "nan": 0.0}
    assert "normal 25%" in str(c) and "<table" in c._repr_html_()
    assert set(CLASSES) <= set(c.row())
    assert c.log2_range() == (-27, 19)  # floor(log2 1e-8) = -27


def test_result_text_and_html_in_full():
    x = np.array([0.0, 1.0, 3.0, 1e-8, 1e6, 2.0**-20, np.nan], dtype=np.float32)
    c = census(x, "fp16")
    want = oracle_counts(x, "fp16")
    assert c.counts == want
    pct = {k: f"{100 * v / len(x):.3g}%" for k, v in want.items()}
    parts = ", ".join(f"{k} {pct[k]}" for k in CLASSES)
    assert str(c) == f"census of 7 float32 values in fp16: {parts}; log2|x| in [-27, 19]"
    assert c._repr_html_() == (
        "<p>census of 7 float32 values in <b>fp16</b></p><table><tr>"
        + "".join(f"<th>{k}</th>" for k in CLASSES) + "</tr><tr>"
        + "".join(f"<td>{pct[k]}</td>" for k in CLASSES) + "</tr></table>")
    big = census(np.zeros(12_345, np.float64), "bf16")
    assert str(big) == ("census of 12,345 float64 values in bf16: zero 100%, underflow 0%, "
                        "subnormal 0%, normal 0%, overflow 0%, nan 0%")  # no bins: no range
    assert "census of 12,345 float64 values" in big._repr_html_()


def test_torch_refuses_complex_and_bool_and_reads_ints():
    for bad in (torch.ones(3, dtype=torch.complex64), torch.ones(3, dtype=torch.bool)):
        with pytest.raises(ValueError, match=rf"^census expects a real numeric tensor, got dtype "
                                             rf"{bad.dtype}$"):
            census(bad, "fp16")
    ints = torch.tensor([0, 1, 70000, -3, 2**40], dtype=torch.int64)
    assert census(ints, "fp16").counts == oracle_counts(ints.numpy().astype(np.float64), "fp16")
    assert census(ints, "fp16").hist.tolist() == oracle_hist(ints.numpy().astype(np.float64)).tolist()


@pytest.mark.parametrize("bad,match", [("abc", "string"), (np.array(["a"]), "real numeric"),
                                       (np.ones(3) * 1j, "real numeric")])
def test_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        census(bad, "fp16")


def test_bad_format_and_backend():
    with pytest.raises(ValueError, match="unknown format"):
        census(np.ones(3), "fp7")
    with pytest.raises(ValueError, match="allowed: auto, cupy, torch"):
        census(np.ones(3), "fp16", backend="numba")


def test_census_model_small_cnn():
    torch.manual_seed(0)
    model = build_model("small_cnn")
    x = torch.randn(input_shape("small_cnn", 4))
    y = torch.randint(0, 10, (4,))
    df = census_model(model, x, y, fmt="fp16")
    assert set(df["kind"]) == {"weight", "activation", "gradient"}
    # one weight row and one gradient row per parameter, one activation row per leaf module
    params = dict(model.named_parameters())
    assert (df["kind"] == "weight").sum() == len(params) == (df["kind"] == "gradient").sum()
    leaves = [n for n, m in model.named_modules() if n and not list(m.children())]
    assert (df["kind"] == "activation").sum() == len(leaves)
    # the fc weight's row is the census of that very tensor
    row = df[(df.layer == "fc") & (df.kind == "weight") & (df.tensor == "weight")].iloc[0]
    ref = oracle_counts(params["fc.weight"].detach().numpy(), "fp16")
    assert row["normal"] == ref["normal"] / params["fc.weight"].numel()
    # gradients equal a fresh autograd pass with the same loss
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    g = params["features.0.weight"].grad.numpy()
    row = df[(df.layer == "features.0") & (df.kind == "gradient")].iloc[0]
    assert row["subnormal"] == oracle_counts(g, "fp16")["subnormal"] / g.size
    # ReLU outputs are about half zeros
    relu = df[(df.layer == "features.2") & (df.kind == "activation")].iloc[0]
    assert 0.3 < relu["zero"] < 0.7
    assert np.allclose(df[list(CLASSES)].sum(axis=1), 1.0)


def test_census_model_options():
    model = build_model("mlp")
    x = torch.randn(input_shape("mlp", 2))
    df = census_model(model, x, kinds=("weight",), fmt="bf16", keep_histograms=True)
    assert set(df["kind"]) == {"weight"} and set(df["format"]) == {"bf16"}
    assert df["census"].iloc[0].n == df["n"].iloc[0]
    df = census_model(model, x, loss_fn=lambda out: out.sum(), kinds=("gradient",))
    assert (df["kind"] == "gradient").all()
    with pytest.raises(ValueError, match="allowed: weight, activation, gradient"):
        census_model(model, x, kinds=("bias",))


def raw_layout(c) -> np.ndarray:
    """A CPU census as the kernel's output: zeros, cumulative counts, NaNs, then the bins."""
    k = c.counts
    return np.concatenate([np.cumsum([k["zero"], k["underflow"], k["subnormal"], k["normal"]]),
                           [k["nan"]], c.hist])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_cuda_matches_cpu(dtype, backend):
    if backend == "auto":
        pytest.importorskip("cupy")
    x = torch.from_numpy(wide_sample(3_000_001, 6, -40, 30)).to(dtype)  # odd size: tail path
    for name in ("fp16", "bf16", "fp8_e4m3"):
        cpu = census(x, name)
        gpu = census(x.cuda(), name, backend="cupy" if backend == "auto" else "torch")
        assert gpu.counts == cpu.counts, (dtype, name)
        assert np.array_equal(gpu.hist, cpu.hist)
    # a view that starts off the 16-byte grid still agrees
    xs = x.cuda()[1:]
    assert census(xs, "fp16").counts == census(x[1:], "fp16").counts


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_kernel_offsets_and_ragged_sizes(dtype):
    """Views starting at every offset within 16 bytes, sizes around the vector width: the
    scalar prologue, the 16-byte loads and the scalar epilogue together count each element once."""
    pytest.importorskip("cupy")
    x = torch.from_numpy(wide_sample(200_000, 8, -30, 30)).to(dtype)
    xg = x.cuda()
    for off in range(9):
        for n in (1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 1000, 65_537, 199_990):
            got = census(xg[off:off + n], "fp16", backend="cupy")
            want = census(x[off:off + n], "fp16")
            assert got.counts == want.counts, (dtype, off, n)
            assert np.array_equal(got.hist, want.hist), (dtype, off, n)
    # a strided (non-contiguous) tensor is copied first, then counted
    strided = xg.reshape(1000, 200)[:, ::3]
    assert census(strided, "bf16").counts == census(x.reshape(1000, 200)[:, ::3], "bf16").counts
    got, want = census(xg[1::3], "fp16"), census(x[1::3], "fp16")  # 1-D strided: still a copy
    assert got.counts == want.counts and np.array_equal(got.hist, want.hist)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_kernel_raw_output_and_reuse(dtype):
    """The raw output (cumulative class counts, NaNs, histogram), launch after launch: the
    kernel leaves its scratch buffer zeroed for the next one, on any stream."""
    pytest.importorskip("cupy")
    x = torch.from_numpy(wide_sample(1_000_003, 7, -30, 30)).to(dtype)
    x[100:5000] = 0  # a run of zeros
    want = raw_layout(census(x, "fp16"))
    launch, out = cupy_kernel_launcher(x.cuda(), "fp16")
    for _ in range(3):
        launch()
        assert np.array_equal(out.cpu().numpy(), want)
    other = torch.full((12345,), 3.0, dtype=dtype, device="cuda")  # another census in between
    assert census(other, "fp16").counts["normal"] == 12345
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # a side stream: census runs and syncs on it
        xg = x.cuda()
        got = census(xg, "fp16")
    assert np.array_equal(raw_layout(got), want)
    assert direct_launches(), "fell back to CuPy's launch path"
    states = importlib.import_module("fp16lab.kernels.census")._STATES
    assert states and all(st.host is not None for st in states.values()), "no mapped host result"


@pytest.mark.gpu
def test_cuda_result_paths_agree(monkeypatch):
    """The three ways census() gets its result to the host - polling the done flag in mapped
    memory, cudaStreamSynchronize on it, and a copy from the device - give the same counts,
    also when the flag's poll gives up early (a long kernel) and synchronize takes over."""
    pytest.importorskip("cupy")
    import importlib

    mod = importlib.import_module("fp16lab.kernels.census")
    x = torch.from_numpy(wide_sample(3_000_001, 11, -40, 20))
    want = census(x, "fp16")
    xg = x.cuda()
    st = mod._state(xg.device)
    results = [census(xg, "fp16")]
    monkeypatch.setattr(st, "poll", False)
    results.append(census(xg, "fp16"))
    monkeypatch.setattr(st, "poll", True)
    clock = itertools.count(0.0, 1.0)  # each reading a second later: the poll gives up
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    results.append(census(xg, "fp16"))
    monkeypatch.undo()
    host = st.host
    monkeypatch.setattr(st, "host", None)
    monkeypatch.setattr(st, "host_pinned", torch.empty(st.out_len, dtype=torch.int64,
                                                       pin_memory=True), raising=False)
    results.append(census(xg, "fp16"))
    monkeypatch.undo()
    assert st.host is host
    for got in results:
        assert got.counts == want.counts and np.array_equal(got.hist, want.hist)


@pytest.mark.gpu
def test_cuda_concentrated_and_special_values():
    """All elements in one binade (every thread's counter for one field takes every element),
    the data's own subnormals, infinities and NaNs."""
    pytest.importorskip("cupy")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.full((5_000_000,), 1.5, dtype=dtype)
        x[:7] = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"),
                              torch.finfo(dtype).tiny / 4, -torch.finfo(dtype).tiny / 2])
        got = census(x.cuda(), "fp16")
        want = census(x, "fp16")
        assert got.counts == want.counts and np.array_equal(got.hist, want.hist), dtype


# ------------------------------------------------------------ paths, dtypes and census_model rows

def _cum(want: dict[str, int]) -> list[int]:
    return list(np.cumsum([want["zero"], want["underflow"], want["subnormal"], want["normal"]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_path_counts_every_chunk_on_the_tensors_device_in_int64(monkeypatch, dtype):
    census_module = importlib.import_module("fp16lab.census")  # the name is also the function

    monkeypatch.setattr(census_module, "_TORCH_CHUNK", 1000)  # 4.5 chunks below
    x = wide_sample(4500, 21, -150, 40).astype(np.float64)
    # float64 subnormals; float32 subnormals, the largest one's log2 rounds up to -126 in float32
    x[8:13] = [5e-324, -1e-310, 2.0**-1022, 2.0**-140, 2.0**-126 - 2.0**-149]
    x[100:1001] = 1.0  # 901 values in one exponent field: not a bfloat16 integer
    t = torch.from_numpy(x).to(dtype)
    ref = t.double().numpy()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # a float default must not reach the counters
    try:
        with torch.device("meta"):  # nor a default device: the tensor's own device is used
            counts, hist = census_module._census_torch(t, format_info("fp16"), "torch")
    finally:
        torch.set_default_dtype(default)
    want = oracle_counts(ref, "fp16")
    assert counts.dtype == np.int64 and hist.dtype == np.int64
    assert list(counts) == [*_cum(want), ref.size, want["nan"]]
    assert np.array_equal(hist, oracle_hist(ref))


# A CPU tensor that says it is on a CUDA device, so that census() takes its GPU path on a CPU.
# census() knows torch tensors by their type's name and module (bits.arrays.is_torch): it carries torch's.
_SaysCuda = type("Tensor", (torch.Tensor,), {"is_cuda": property(lambda self: True),
                                             "__module__": "torch"})


def test_cuda_tensors_go_to_the_kernel_then_to_the_torch_fallback(monkeypatch):
    kernels_census = importlib.import_module("fp16lab.kernels.census")
    census_module = importlib.import_module("fp16lab.census")  # the name is also the function

    plain = torch.from_numpy(wide_sample(3000, 7))
    x = plain.as_subclass(_SaysCuda)
    ref = plain.double().numpy()
    calls = []
    answer = [None]

    def kernel(t, f):
        calls.append((t, f.name))
        return answer[0]

    monkeypatch.setattr(kernels_census, "cupy_census", kernel)
    # the kernel's answer is the result: cumulative counts (zero, <= under, <= normal,
    # <= over, total, nan) and the bins
    answer[0] = (np.array([1, 2, 3, 4, 10, 1]), np.arange(291))
    r = census(x, "bf16")
    seen, fmt_name = calls[0]  # the tensor itself, flat (a view, no copy), and the format
    assert (seen.data_ptr(), seen.shape, fmt_name) == (plain.data_ptr(), (3000,), "bf16")
    assert (r.n, r.dtype, r.fmt) == (10, "float32", "bf16")
    assert r.counts == {"zero": 1, "underflow": 1, "subnormal": 1, "normal": 1, "overflow": 5,
                        "nan": 1}
    assert np.array_equal(r.hist, np.arange(291))
    # where the kernel cannot run: 'auto' falls back to torch, 'cupy' says why
    answer[0] = None
    r = census(x, "fp16")
    assert r.counts == oracle_counts(ref, "fp16") and np.array_equal(r.hist, oracle_hist(ref))
    with pytest.raises(RuntimeError) as info:
        census(x, "fp16", backend="cupy")
    assert str(info.value) == ("census backend 'cupy' needs CuPy and a non-empty float32, "
                               "float16 or bfloat16 CUDA tensor; got torch.float32 with 3000 "
                               "elements")
    n_calls = len(calls)
    r = census(x, "fp16", backend="torch")  # torch asked for: the kernel is not tried
    assert len(calls) == n_calls and r.counts == oracle_counts(ref, "fp16")
    census_module._census_torch(plain, format_info("fp16"), "cupy")  # not CUDA: no kernel
    assert len(calls) == n_calls
    with pytest.raises(ValueError) as info:
        census(torch.ones(3, dtype=torch.complex64).as_subclass(_SaysCuda), "fp16")
    assert str(info.value) == "census expects a real numeric tensor, got dtype torch.complex64"
    with pytest.raises(ValueError, match="got dtype torch.bool"):
        census(torch.ones(3, dtype=torch.bool).as_subclass(_SaysCuda), "fp16")


def test_cpu_tensors_are_counted_by_numpy_and_name_their_dtype(monkeypatch):
    census_module = importlib.import_module("fp16lab.census")  # the name is also the function

    def no_torch_path(*args, **kwargs):
        raise AssertionError("a CPU tensor went down the torch path")

    monkeypatch.setattr(census_module, "_census_torch", no_torch_path)
    x = torch.from_numpy(wide_sample(2000, 9, -30, 20))
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16"),
                        (torch.float8_e4m3fn, "float8_e4m3fn"), (torch.float8_e5m2, "float8_e5m2")):
        t = x.to(dtype)
        ref = t.float().numpy()
        r = census(t, "fp16")
        assert r.dtype == name
        assert r.counts == oracle_counts(ref, "fp16"), name
        assert np.array_equal(r.hist, oracle_hist(ref)), name


def test_numpy_inputs_of_every_kind_and_shape():
    ints = np.array([0, 3, -7, 2**25 - 1, 2**31 - 1, 70000])  # 2**25 - 1 rounds up in float32
    r = census(ints, "fp16")
    assert r.counts == oracle_counts(ints.astype(np.float64), "fp16")
    assert np.array_equal(r.hist, oracle_hist(ints.astype(np.float64)))
    assert r.log2_range() == (1, 30)
    for fp8 in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        a = wide_sample(500, 3, -12, 12).astype(fp8)
        r = census(a, "fp16")
        assert r.dtype == np.dtype(fp8).name
        assert r.counts == oracle_counts(a.astype(np.float32), "fp16")
        assert np.array_equal(r.hist, oracle_hist(a.astype(np.float32)))
    one_sub = np.array([2.0**-24, 0.0, 1.0], dtype=np.float16)  # only the first subnormal pattern
    r = census(one_sub, "fp16")
    assert r.hist.dtype == np.int64 and r.counts["subnormal"] == 1
    assert np.array_equal(r.hist, oracle_hist(one_sub.astype(np.float64)))
    grid = wide_sample(600, 5).reshape(20, 30)  # any shape: counted as a flat array
    r = census(grid, "fp16")
    assert r.n == 600 and r.counts == oracle_counts(grid.ravel(), "fp16")


def test_an_empty_array_has_an_empty_census():
    r = census(np.zeros(0, np.float32), "fp16")
    assert (r.n, r.counts, r.log2_range()) == (0, dict.fromkeys(CLASSES, 0), None)
    assert r.hist.dtype == np.int64 and not r.hist.any() and r.fractions["zero"] == 0.0


def test_census_works_when_numpy_raises_on_every_floating_point_error():
    # fp32's overflow threshold is beyond float16: finding its float16 neighbour overflows
    x = np.array([1.0, 65504.0, np.inf, 2.0**-24], dtype=np.float16)
    with np.errstate(all="raise"):
        r = census(x, "fp32")
    assert r.counts == oracle_counts(x, "fp32")


@pytest.mark.parametrize("backend", ["auto", "cupy", "torch"])
def test_every_backend_name_is_accepted_for_cpu_data(backend):
    x = wide_sample(100, 2)
    assert census(x, "fp16", backend=backend).counts == oracle_counts(x, "fp16")


def test_census_model_rows_are_ordered_by_layer_then_weight_activation_gradient():
    from collections import OrderedDict

    torch.manual_seed(0)
    model = torch.nn.Sequential(OrderedDict(b=torch.nn.Linear(2, 2), a=torch.nn.ReLU(),
                                            c=torch.nn.Linear(2, 1)))
    df = census_model(model, torch.randn(3, 2))
    assert list(df.columns) == ["layer", "kind", "tensor", "format", "n", *CLASSES]
    assert list(df.index) == list(range(11))
    assert list(zip(df["layer"], df["kind"], df["tensor"])) == [
        ("b", "weight", "weight"), ("b", "weight", "bias"), ("b", "activation", "output"),
        ("b", "gradient", "weight"), ("b", "gradient", "bias"),
        ("a", "activation", "output"),
        ("c", "weight", "weight"), ("c", "weight", "bias"), ("c", "activation", "output"),
        ("c", "gradient", "weight"), ("c", "gradient", "bias")]


def test_census_model_keeps_layer_order_when_layers_are_named_like_kinds():
    from collections import OrderedDict

    model = torch.nn.Sequential(OrderedDict(gradient=torch.nn.Linear(2, 2),
                                            weight=torch.nn.Linear(2, 2)))
    df = census_model(model, torch.randn(3, 2), kinds="weight")
    assert list(zip(df["layer"], df["tensor"])) == [("gradient", "weight"), ("gradient", "bias"),
                                                    ("weight", "weight"), ("weight", "bias")]


class _Split(torch.nn.Module):
    def forward(self, x):
        return x * 2, x * 0


class _TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2, bias=False)
        self.split = _Split()
        self.unused = torch.nn.Linear(2, 2)  # never in the forward: no gradient rows

    def forward(self, a, b):
        return self.split(self.lin(a + b))


def test_census_model_reads_tuple_inputs_and_outputs_and_skips_parameters_without_gradients():
    model = _TwoInputs()
    with torch.no_grad():
        model.lin.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    for p in model.unused.parameters():
        p.grad = torch.ones_like(p)  # stale gradients from an earlier pass
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    targets = torch.tensor([[0.5, 3.0], [4.0, 4.25]])

    def loss_fn(out, t):
        return ((out - t) ** 2).sum() / 2

    df = census_model(model, (a, b), targets, loss_fn=loss_fn, keep_histograms=True)
    rows = {(r.layer, r.kind, r.tensor): r for r in df.itertuples()}
    assert ("unused", "gradient", "weight") not in rows and ("unused", "weight", "weight") in rows
    split = rows[("split", "activation", "output")]  # the first output of the tuple: 2(a + b)
    assert split.zero == 0.0 and split.census.log2_range() == (1, 3)
    # the loss on the first output: dL/dW = ((2(a+b) - t) * 2)^T (a + b), by hand
    s = (a + b).double().numpy()
    want = ((2 * s - targets.double().numpy()) * 2).T @ s
    g = rows[("lin", "gradient", "weight")].census
    assert np.array_equal(g.hist, oracle_hist(want)) and g.n == 4


def test_census_model_default_loss_is_half_the_mean_square():
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    x = torch.tensor([[2.0**-10]])
    # out = 2**-10; L = out**2 / 2; dL/dw = out * x = 2**-20 (an fp16 subnormal)
    df = census_model(model, x, kinds="gradient", keep_histograms=True)
    g = df.iloc[0]
    assert g["census"].log2_range() == (-20, -20) and g["subnormal"] == 1.0


def test_census_model_empty_kinds_message_in_full():
    with pytest.raises(ValueError) as info:
        census_model(torch.nn.Linear(2, 2), torch.randn(1, 2), kinds=[])
    assert str(info.value) == "kinds is empty; allowed: weight, activation, gradient"


def test_a_census_shows_its_sentence_in_a_notebook_not_its_fields():
    from IPython.lib.pretty import pretty

    from fp16lab.census import census

    result = census(np.array([0.0, 1e-9, 1.0, 7e4], dtype=np.float32), "fp16")
    assert pretty(result) == str(result)
    assert "CensusResult(" not in pretty(result)
