"""Tests for step 6's plumbing: the nvcc cubin cache (fp16lab.kernels.cubin) and the wgmma launcher's
checks and arithmetic (fp16lab.kernels.wgmma) on the CPU; its products against float64 on a Hopper GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from fp16lab.kernels import KERNELS, LADDER, KernelUnavailable, gemm
from fp16lab.kernels import cubin
from fp16lab.kernels import wgmma as launcher

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None,
                                reason="nvcc is not on PATH: the cubin cache needs it to build")
WGMMA = dict(LADDER["wgmma"].defines)


# ---------------------------------------------------------------------------------------------
# CPU: where the cache lives, what its key covers, when nvcc runs
# ---------------------------------------------------------------------------------------------
def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("FP16LAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cubin.cache_dir() == tmp_path / "xdg" / "fp16lab" / "cubin"
    monkeypatch.setenv("FP16LAB_CACHE_DIR", str(tmp_path / "mine"))
    assert cubin.cache_dir() == tmp_path / "mine"


def test_flags_target_sm_90a_and_carry_the_defines():
    flags = cubin.nvcc_flags("sm_90a", {"BN": 128, "BM": 128})
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags and "-cubin" in flags
    assert flags[-2:] == ["-DBM=128", "-DBN=128"]  # sorted: the same set gives the same key


@needs_nvcc
def test_cache_key_changes_with_defines_and_source(monkeypatch, tmp_path):
    base = cubin.cubin_path("wgmma.cu", WGMMA)
    assert base == cubin.cubin_path("wgmma.cu", dict(reversed(list(WGMMA.items()))))
    assert base != cubin.cubin_path("wgmma.cu", {**WGMMA, "STAGES": 3})
    edited = tmp_path / "wgmma.cu"
    header = tmp_path / "hopper.cuh"
    header.write_text(cubin.source_path("hopper.cuh").read_text())
    edited.write_text(cubin.source_path("wgmma.cu").read_text())
    monkeypatch.setattr(cubin, "source_path", lambda name: tmp_path / name)
    assert cubin.cubin_path("wgmma.cu", WGMMA) == base  # the same texts, the same key
    edited.write_text(edited.read_text() + "\n// edited\n")
    assert cubin.cubin_path("wgmma.cu", WGMMA) != base
    edited.write_text(cubin.source_path("wgmma.cu").read_text().replace("\n// edited\n", ""))
    assert cubin.cubin_path("wgmma.cu", WGMMA) == base
    header.write_text(header.read_text() + "\n// edited\n")  # the header it includes
    assert cubin.cubin_path("wgmma.cu", WGMMA) != base
    assert cubin.local_includes(edited) == [header]


@needs_nvcc
def test_build_compiles_once_then_reuses_the_file(monkeypatch, tmp_path):
    monkeypatch.setenv("FP16LAB_CACHE_DIR", str(tmp_path))
    calls = []
    real_run = subprocess.run

    def counting_run(cmd, *args, **kwargs):
        calls.append(cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(cubin.subprocess, "run", counting_run)
    path = cubin.build("wgmma.cu", WGMMA)
    compiles = [c for c in calls if "-cubin" in c]
    assert len(compiles) == 1 and path.parent == tmp_path
    assert path.read_bytes()[:4] == b"\x7fELF"  # a cubin is an ELF file
    stamp = path.stat().st_mtime_ns
    assert cubin.build("wgmma.cu", WGMMA) == path
    assert len([c for c in calls if "-cubin" in c]) == 1 and path.stat().st_mtime_ns == stamp
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


@needs_nvcc
def test_build_failure_shows_the_compiler_error(monkeypatch, tmp_path):
    monkeypatch.setenv("FP16LAB_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"(?s)nvcc failed.*wgmma N of 128 or 256"):
        cubin.build("wgmma.cu", {**WGMMA, "BN": 96})
    assert list(tmp_path.iterdir()) == []


def test_no_nvcc_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(cubin, "find_nvcc", lambda: None)
    with pytest.raises(KernelUnavailable, match=r"(?s)no nvcc was found.*CUDA_PATH"):
        cubin.build("wgmma.cu", WGMMA)


# ---------------------------------------------------------------------------------------------
# CPU: what gemm(kernel="wgmma") says where it cannot run
# ---------------------------------------------------------------------------------------------
def _fake_cupy(compute_capability: str, name: str):
    device = types.SimpleNamespace(compute_capability=compute_capability, id=0)
    runtime = types.SimpleNamespace(getDeviceProperties=lambda i: {"name": name.encode()})
    return types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: device, runtime=runtime))


def test_wgmma_names_every_missing_piece(monkeypatch):
    def no_cupy():
        raise KernelUnavailable("CuPy, which is not installed here")

    monkeypatch.setattr(launcher, "require_cupy", no_cupy)
    monkeypatch.setattr(launcher, "find_nvcc", lambda: None)
    # import cuda.bindings fails, even where it is already imported (torch's CUDA build
    # imports cuda.bindings.driver): the import looks up the full name first, so hide them all
    for name in ["cuda", *[m for m in sys.modules if m.startswith("cuda.")]]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in [k for k, s in KERNELS.items() if s.builder == "nvcc"]:
        with pytest.raises(KernelUnavailable) as e:
            gemm(np.zeros((8, 8), np.float16), np.zeros((8, 8), np.float16), kernel=name)
        msg = str(e.value)
        assert "steps 6 and 7" in msg and "CuPy" in msg and "nvcc" in msg and "cuda-bindings" in msg


def test_wgmma_needs_a_hopper_gpu(monkeypatch):
    monkeypatch.setattr(launcher, "require_cupy", lambda: _fake_cupy("80", "NVIDIA A100-SXM4-80GB"))
    problems = launcher.missing()
    hopper = [p for p in problems if "Hopper" in p]
    assert len(hopper) == 1 and "A100" in hopper[0] and "compute capability 8.0" in hopper[0]
    monkeypatch.setattr(launcher, "require_cupy", lambda: _fake_cupy("90", "NVIDIA H200"))
    assert not [p for p in launcher.missing() if "Hopper" in p]


def test_steps_1_to_5_do_not_need_nvcc(monkeypatch):
    # the older kernels compile with NVRTC: a missing nvcc must not stop them
    monkeypatch.setattr(launcher, "find_nvcc", lambda: None)
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: this checks the message on machines without it")
    except ImportError:
        pass
    with pytest.raises(KernelUnavailable) as e:
        gemm(np.zeros((8, 8), np.float16), np.zeros((8, 8), np.float16), kernel="mma_sync")
    assert "nvcc" not in str(e.value)


@pytest.mark.parametrize("m, n, cluster, persistent", [
    (1, 1, 1, 0), (128, 256, 1, 0), (129, 257, 1, 0), (8192, 8192, 1, 0),
    (129, 256, 2, 0), (128, 256, 2, 0), (8192, 8192, 1, 132), (100, 100, 1, 132)])
def test_grid_counts_the_tiles(m, n, cluster, persistent):
    rows = -(-m // 128)
    rows += rows % cluster  # whole clusters
    tiles = rows * -(-n // 256)
    want = min(tiles, persistent) if persistent else tiles
    assert launcher.grid(m, n, 128, 256, cluster, persistent) == want


def test_step7_schedules_grids():
    """One block per 128 x 128 tile; clusters of two round the block-rows up to an even count
    (the second block of the last cluster may lie wholly outside A); the persistent schedule
    launches at most one block per SM."""
    assert list(launcher.FP8_SCHEDULES)[0] == "tile per block"
    assert launcher.FP8_SCHEDULES["tile per block"] == {}
    for schedule in ("cluster of 2, B multicast", "cluster of 2, B multicast, cluster-scope release"):
        assert launcher.FP8_SCHEDULES[schedule]["CLUSTER_M"] == 2
        assert launcher.fp8_grid(300, 640, schedule) == 4 * 5   # 3 block-rows -> 2 clusters
        assert launcher.fp8_grid(256, 128, schedule) == 2
        assert launcher.fp8_grid(1, 8, schedule) == 2
    assert launcher.FP8_SCHEDULES["cluster of 2, B multicast, cluster-scope release"][
        "ARRIVE_CLUSTER"] == 1
    assert "ARRIVE_CLUSTER" not in launcher.FP8_SCHEDULES["cluster of 2, B multicast"]
    assert launcher.fp8_grid(300, 640) == 3 * 5
    assert launcher.fp8_grid(2048, 2048, "persistent", sms=132) == 132
    assert launcher.fp8_grid(300, 640, "persistent", sms=132) == 15
    assert launcher.FP8_SCHEDULES["persistent"] == {"PERSISTENT": 1}
    with pytest.raises(ValueError, match="persistent schedule launches one block per SM: give sms"):
        launcher.fp8_grid(300, 640, "persistent")
    with pytest.raises(ValueError, match="^sms must be >= 1, got 0$"):
        launcher.fp8_grid(300, 640, "persistent", sms=0)
    with pytest.raises(ValueError, match="^sms must be >= 1, got 0$"):  # refused under any schedule
        launcher.fp8_grid(300, 640, sms=0)
    assert launcher.fp8_grid(300, 640, sms=132) == 15  # tiles, whatever the SMs
    assert launcher.fp8_grid(2048, 2048, sms=132) == 256  # more tiles than SMs: still one each
    with pytest.raises(ValueError, match="schedule must be one of"):
        launcher.fp8_grid(300, 640, "tiles")


def test_step7_refusals_name_the_argument_and_join_every_problem():
    """Each refusal names the argument it refuses, as the caller wrote it, and the operand check
    lists every problem it found, in one message."""
    with pytest.raises(ValueError, match="^m must be >= 1, got 0$"):
        launcher.fp8_grid(0, 8)
    with pytest.raises(ValueError, match="^n must be >= 1, got 0$"):
        launcher.fp8_grid(8, 0)
    with pytest.raises(ValueError, match="^stages must be >= 1, got 0$"):
        launcher.fp8_dynamic_smem(0)
    with pytest.raises(ValueError, match="^N must be >= 1, got 0$"):
        launcher.check_fp8_operands(8, 0, 16, (1, 8), (0, 1))
    with pytest.raises(ValueError) as e:
        launcher.check_fp8_operands(200, 260, 650, (5, 200), (3, 6))
    assert str(e.value) == ("step 7 cannot multiply these operands: K=650 is not a multiple of 16 "
                            "(TMA reads rows of 16-byte multiples); N=260 is not a multiple of 8 "
                            "(the results are stored in pairs); sa must be (ceil(K/128), M) = "
                            "(6, 200), got (5, 200)")


class _Codes:
    """What the launchers read of a cupy array, without a GPU."""

    def __init__(self, shape, dtype, ptr=256, contiguous=True):
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.flags = types.SimpleNamespace(c_contiguous=contiguous)
        self.data = types.SimpleNamespace(ptr=ptr)


def _gpu_side(monkeypatch, device: int) -> None:
    """Replaces what the launchers ask of a GPU: the check for one, CuPy's current device (id
    ``device``) and its SM count (132)."""
    monkeypatch.setattr(launcher, "require", lambda: None)
    monkeypatch.setattr(launcher, "require_cupy", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=device))))
    monkeypatch.setattr(launcher, "_sm_count", lambda d: 132 if d == device else 0)


def test_step7_launcher_refuses_bad_arrays_before_looking_for_a_gpu(monkeypatch):
    monkeypatch.setattr(launcher, "require", lambda: pytest.fail("checked the GPU before the input"))
    good = dict(a=_Codes((200, 256), "uint8"), b=_Codes((128, 256), "uint8"),
                sa=_Codes((2, 200), "float32"), sb=_Codes((1, 2), "float32"),
                c=_Codes((200, 128), "float32"))
    cases = [({"c": _Codes((200, 129), "float32")}, r"into \(M, N\)"),
             ({"sa": _Codes((2, 200), "float64")}, "float32 factors"),
             ({"c": _Codes((200, 128), "float16")}, "float32 or bfloat16 bits"),
             ({"b": _Codes((128, 256), "uint8", contiguous=False)}, "b is not"),
             ({"a": _Codes((200, 256), "uint8", ptr=264)}, "16-byte aligned base; a starts at 0x108"),
             ({"sb": _Codes((2, 2), "float32")}, "sb must be")]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            launcher.launch_fp8(**{**good, **change})
    with pytest.raises(ValueError, match="schedule must be one of 'tile per block', 'persistent'"):
        launcher.launch_fp8(**good, schedule="clusters")
    with pytest.raises(TypeError, match="overlap must be True or False, got 1"):
        launcher.launch_fp8(**good, overlap=1)
    with pytest.raises(ValueError, match="diagnostic must be one of 'no promotion', 'promotion, "
                                         "factors not loaded'"):
        launcher.launch_fp8(**good, diagnostic="no factors")
    assert launcher.FP8_DIAGNOSTICS == {"no promotion": {"PROMOTE": 0},
                                        "promotion, factors not loaded": {"PROMOTE": 2}}


@pytest.mark.parametrize("schedule", list(launcher.FP8_SCHEDULES))
@pytest.mark.parametrize("diagnostic", [None, *launcher.FP8_DIAGNOSTICS])
def test_step7_launcher_builds_and_launches_each_schedule(monkeypatch, schedule, diagnostic):
    """The launcher's plumbing, with the GPU side replaced: the build it asks for (stages,
    overlap, the schedule's and the diagnostic's switches), the kernel for the output dtype, the
    tensor maps (B's box is the share of its tile one block of a cluster fetches), the grid, the
    block and the shared memory."""
    maps, launched = [], []

    def encode(ptr, rows, cols, box_rows, box_cols, element_bytes=2):
        maps.append((ptr, rows, cols, box_rows, box_cols, element_bytes))
        return f"map {len(maps)}"

    def function(defines, name, device, smem):
        return lambda grid, block, args, shared_mem: launched.append(
            (dict(defines), name, device, smem, grid, block, args, shared_mem))

    _gpu_side(monkeypatch, 3)
    monkeypatch.setattr(launcher, "encode_tensor_map", encode)
    monkeypatch.setattr(launcher, "_function_fp8", function)
    m, n, k = 3900, 640, 384  # 31 block-rows (a cluster's last block outside), 155 tiles
    a, b = _Codes((m, k), "uint8", 4096), _Codes((n, k), "uint8", 8192)
    sa, sb = _Codes((3, m), "float32", 16), _Codes((5, 3), "float32", 32)
    for c, kernel in ((_Codes((m, n), "float32", 64), "wgmma_fp8_f32"),
                      (_Codes((m, n), "int16", 64), "wgmma_fp8_bf16"),
                      (_Codes((m, n), "uint16", 64), "wgmma_fp8_bf16")):
        maps.clear()
        launcher.launch_fp8(a, b, sa, sb, c, stages=5, overlap=False, schedule=schedule,
                            diagnostic=diagnostic)
        defines, name, device, smem, grid, block, args, shared_mem = launched[-1]
        want = {"STAGES": 5, "OVERLAP": 0, **launcher.FP8_SCHEDULES[schedule],
                **(launcher.FP8_DIAGNOSTICS[diagnostic] if diagnostic else {})}
        assert defines == want and name == kernel and device == 3
        assert smem == shared_mem == launcher.fp8_dynamic_smem(5) == 5 * 2 * 128 * 128 + 1024
        cluster = want.get("CLUSTER_M", 1)
        assert maps == [(4096, m, k, 128, 128, 1), (8192, n, k, 128 // cluster, 128, 1)]
        assert all(type(x) is int for x in maps[0] + maps[1])  # cuTensorMapEncodeTiled's uint32s
        persistent = "PERSISTENT" in want
        assert grid == (launcher.fp8_grid(m, n, schedule, 132 if persistent else None),)
        assert grid == ((132,) if persistent else (155,) if cluster == 1 else (32 * 5,))
        assert block == (384,)
        assert args[:5] == ("map 1", "map 2", sa, sb, c)
        assert [int(x) for x in args[5:]] == [m, n, k]
        assert all(x.dtype == np.int32 for x in args[5:])


def test_step7_launcher_defaults_and_the_argument_it_refuses(monkeypatch):
    """By default the launcher builds step 7 itself (6 stages, the promotion overlapped, one tile
    per block); each refusal names the array it refuses."""
    built = []
    _gpu_side(monkeypatch, 0)
    monkeypatch.setattr(launcher, "encode_tensor_map", lambda *a, **k: "map")
    monkeypatch.setattr(launcher, "_function_fp8", lambda defines, *rest: built.append(
        dict(defines)) or (lambda *a, **k: None))
    good = dict(a=_Codes((200, 256), "uint8", 256), b=_Codes((128, 256), "uint8", 512),
                sa=_Codes((2, 200), "float32", 16), sb=_Codes((1, 2), "float32", 32),
                c=_Codes((200, 128), "float32", 64))
    launcher.launch_fp8(**good)
    assert built == [{"STAGES": 6, "OVERLAP": 1}]
    for name in good:
        bad = _Codes(good[name].shape, good[name].dtype, good[name].data.ptr)
        bad.flags.c_contiguous = False
        with pytest.raises(ValueError, match=f"^step 7 needs C-contiguous arrays; {name} is not$"):
            launcher.launch_fp8(**{**good, name: bad})
    for name in ("a", "b"):
        with pytest.raises(ValueError, match=f"16-byte aligned base; {name} starts at 0x108$"):
            launcher.launch_fp8(**{**good, name: _Codes(good[name].shape, "uint8", 264)})
    with pytest.raises(ValueError, match="one-byte codes and float32 factors"):
        launcher.launch_fp8(**{**good, "b": _Codes((128, 256), "int16", 512)})
    with pytest.raises(ValueError, match="^the persistent schedule launches one block per SM: give "
                                         "sms, the GPU's number of SMs$"):
        launcher.fp8_grid(300, 640, "persistent")


def test_step6_shared_memory_and_grid_defaults():
    # four stages of a 128 x 64 tile of A and a 64 x 256 tile of B in fp16, plus 1 KB to align
    assert launcher.dynamic_smem(128, 256, 64, 4) == 4 * (128 * 64 + 64 * 256) * 2 + 1024 == 197_632
    assert launcher.dynamic_smem(128, 128, 64, 6) == 6 * (128 * 64 + 64 * 128) * 2 + 1024
    assert launcher.grid(300, 640, 128, 128) == 3 * 5  # no cluster, one block per tile


@pytest.mark.parametrize("name", [s.name for s in KERNELS.values() if s.source == "wgmma.cu"])
def test_step6_launcher_builds_and_launches_each_variant(monkeypatch, name):
    """Step 6's launcher with the GPU side replaced: the build it asks for (the variant's own
    switches), the tensor maps (A's box as tall as the tile, B's as deep as a K slice), the grid
    (whole clusters; one block per SM when persistent), block, shared memory and arguments."""
    spec, maps, launched = KERNELS[name], [], []
    defines = dict(spec.defines)
    _gpu_side(monkeypatch, 2)
    monkeypatch.setattr(launcher, "tensor_map", lambda x, box_rows: maps.append(
        (x, box_rows)) or f"map {len(maps)}")
    monkeypatch.setattr(launcher, "_function", lambda d, fn, device, smem: lambda grid, block, args,
                        shared_mem: launched.append((dict(d), fn, device, smem, grid, block, args,
                                                     shared_mem)))
    m, n, k = 3900, 2048, 512
    a, b, c = _Codes((m, k), "float16", 256), _Codes((k, n), "float16", 512), object()
    launcher.launch(a, b, c, defines=defines, function="wgmma_f16")
    (built, fn, device, smem, grid, block, args, shared_mem), = launched
    assert built == defines and fn == "wgmma_f16" and device == 2
    bm, bn, bk, stages = (defines[x] for x in ("BM", "BN", "BK", "STAGES"))
    assert smem == shared_mem == launcher.dynamic_smem(bm, bn, bk, stages)
    assert maps == [(a, bm), (b, bk)]
    cluster, persistent = defines.get("CLUSTER_M", 1), defines.get("PERSISTENT", 0)
    tiles = -(-m // (bm * cluster)) * cluster * -(-n // bn)
    assert grid == (min(tiles, 132) if persistent else tiles,) and block == (384,)
    assert args[:3] == ("map 1", "map 2", c)
    assert [int(x) for x in args[3:]] == [m, n, k] and all(x.dtype == np.int32 for x in args[3:])


def test_shared_memory_fits_one_block_per_sm():
    # 227 KB is the most one block may have on Hopper
    for spec in (s for s in KERNELS.values() if s.builder == "nvcc"):
        d = dict(spec.defines)
        stages = d["STAGES"] * (d["BM"] * d["BK"] + d["BK"] * d["BN"]) * 2
        assert spec.dynamic_smem == stages + 1024 <= 227 * 1024, spec.name


# ---------------------------------------------------------------------------------------------
# GPU (Hopper): every element against float64, within a bound from K and the unit roundoffs
# ---------------------------------------------------------------------------------------------
def _hopper():
    cupy = pytest.importorskip("cupy")
    problems = launcher.missing()
    if problems:
        pytest.skip("the wgmma kernels cannot run here: " + "; ".join(problems))
    return cupy


def elementwise_ratio(cupy, out, a, b, out_dtype: str) -> float:
    """Returns max |out - ref| / bound, each element's bound from K and the unit roundoffs of the
    accumulator and the output (fp16lab.testing.bounds)."""
    from fp16lab.testing.bounds import error_ratio

    return error_ratio(out, a, b, out_dtype=out_dtype)


STEP6 = [k for k, s in KERNELS.items() if s.step == 6]
SHAPES = [(1, 1, 1), (64, 8, 8), (128, 256, 64), (129, 257, 65), (255, 130, 1000), (1000, 1001, 1003),
          (2048, 768, 4096), (3000, 2900, 136)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", STEP6)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_wgmma_matches_float64_per_element(kernel, shape, out_dtype):
    cupy = _hopper()
    m, n, k = shape
    rng = cupy.random.default_rng()
    a = rng.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((k, n), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.full((m, n), cupy.nan, dtype=out_dtype)
    gemm(a, b, kernel=kernel, out_dtype=out_dtype, out=out)
    r = elementwise_ratio(cupy, out, a, b, out_dtype)
    assert r <= 1.0, f"{kernel} {shape} {out_dtype}: worst error is {r:.2f} times its bound"


@pytest.mark.gpu
def test_notebook_check_catches_a_wrong_product():
    cupy = _hopper()
    from fp16lab.kernels import measure
    assert measure.check_elementwise("wgmma", (300, 200, 100), "float16") <= 1.0
    rng = cupy.random.default_rng()
    a = rng.standard_normal((64, 128), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((128, 64), dtype=cupy.float32).astype(cupy.float16)
    out = gemm(a, b, kernel="wgmma")
    assert measure.worst_error_ratio(out, a, b) <= 1.0
    out[5, 7] += 0.1  # one element off by ~100 times its bound (K = 128: bound ~ 1e-3)
    assert measure.worst_error_ratio(out, a, b) > 1.0
    out[5, 7] = cupy.nan
    assert measure.worst_error_ratio(out, a, b) == float("inf")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", STEP6)
def test_wgmma_large_and_repeatable(kernel):
    cupy = _hopper()
    rng = cupy.random.default_rng()
    a = rng.standard_normal((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    first = gemm(a, b, kernel=kernel)
    assert elementwise_ratio(cupy, first, a, b, "float32") <= 1.0
    for _ in range(3):  # a race shows as results that move between identical runs
        assert bool((gemm(a, b, kernel=kernel) == first).all())


@pytest.mark.gpu
@pytest.mark.parametrize("switches", [{"CLUSTER_MULTICAST": 0, "CLUSTER_LOCKSTEP": 0},
                                      {"CLUSTER_MULTICAST": 0}, {"CLUSTER_ARRIVE_SCOPE": 0},
                                      {"CLUSTER_MULTICAST": 0, "CLUSTER_ARRIVE_SCOPE": 0}],
                         ids=["clusters-only", "lock-step", "cta-scope", "lock-step-cta-scope"])
def test_cluster_diagnostic_builds_are_right(switches):
    # fp16lab.bench.wgmma_cluster times these builds: their products must be right too
    cupy = _hopper()
    rng = cupy.random.default_rng()
    a = rng.standard_normal((300, 200), dtype=cupy.float32).astype(cupy.float16)
    b = rng.standard_normal((200, 520), dtype=cupy.float32).astype(cupy.float16)
    out = cupy.full((300, 520), cupy.nan, dtype=cupy.float32)
    launcher.launch(a, b, out, defines={**dict(KERNELS["wgmma_cluster2"].defines), **switches},
                    function="wgmma_f32")
    assert elementwise_ratio(cupy, out, a, b, "float32") <= 1.0
