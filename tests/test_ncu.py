"""fp16lab.ncu: parsing recorded Nsight Compute output, the roofline and the verdicts read from
it, and the reasons given where counters cannot be read.

The fixture is ncu 2025.3.1's output on an H200 (2026-12-02) for the ladder at 4096^3 and
cupy.matmul, ``--csv --print-units base``, the program's own lines mixed in as ncu prints them.
"""

from __future__ import annotations

import math
import os
import stat
import sys
from pathlib import Path

import pytest

from fp16lab import ncu

FIXTURE = Path(__file__).parent / "fixtures" / "ncu_ladder_4096_h200.csv"
NAMES = ["wmma_naive_f16", "wmma_smem_f16", "wmma_padded_f16", "wmma_pipeline_f16",
         "mma_sync_f16", "wgmma_f16", "nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"]


@pytest.fixture(scope="module")
def ladder():
    return ncu.parse_csv(FIXTURE.read_text())


def test_parse_reads_every_kernel_in_order_with_values_as_printed(ladder):
    assert [k.name for k in ladder] == NAMES
    assert [k.id for k in ladder] == list(range(7))
    naive = ladder[0]
    assert (naive.block, naive.grid) == ("(128, 1, 1)", "(16384, 1, 1)")
    # values copied by hand from the file; thousands separators removed
    assert naive["duration_ns"] == 5_012_928
    assert naive["dram_read"] == 457_937_664 and naive["dram_write"] == 34_043_904
    assert naive["tensor"] == 4.27 and naive["sm"] == 18.30 and naive["dram"] == 2.04
    assert naive["occupancy"] == 55.58 and naive["issue"] == 18.20
    assert naive["stall_long_scoreboard"] == 44.79 and naive["stall_wait"] == 2.33
    assert ladder[6]["tensor"] == 95.14 and ladder[6]["stall_barrier"] == 6.00
    assert math.isnan(naive["issued"])  # not in this recording: absent, not zero


def test_parse_keeps_only_the_metrics_asked_for(ladder):
    few = ncu.parse_csv(FIXTURE.read_text(), ["duration_ns", "tensor"])
    assert all(set(k.values) == {"duration_ns", "tensor"} for k in few)
    assert [k["tensor"] for k in few] == [k["tensor"] for k in ladder]


def test_parse_refuses_text_without_a_table():
    with pytest.raises(ValueError, match="no ncu CSV table"):
        ncu.parse_csv("==PROF== Disconnected from process 1\nhello\n")
    with pytest.raises(ValueError, match="no ncu CSV table"):
        ncu.parse_csv('"a","b"\n"1","2"\n')


def test_parse_reads_na_as_missing():
    text = ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
            '"0","k","gpu__time_duration.sum","ns","1,024"\n'
            '"0","k","dram__bytes_read.sum","byte","n/a"\n')
    (k,) = ncu.parse_csv(text)
    assert k["duration_ns"] == 1024 and math.isnan(k["dram_read"]) and k.block == ""


def test_roofline_against_a_hand_count(ladder):
    naive = ladder[0]
    # 2 * 4096^3 = 137,438,953,472 FLOPs; 457,937,664 + 34,043,904 = 491,981,568 bytes; 5.012928 ms
    intensity, rate = ncu.roofline(2 * 4096**3, naive.dram_bytes, naive.seconds)
    assert naive.dram_bytes == 491_981_568
    assert intensity == pytest.approx(137_438_953_472 / 491_981_568)  # 279.36 FLOP/B
    assert intensity == pytest.approx(279.36, abs=0.01)
    assert rate == pytest.approx(27.417e12, rel=1e-4)  # 27.4 TFLOP/s
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            ncu.roofline(1.0, bad, 1.0)
    with pytest.raises(TypeError):
        ncu.roofline(1.0, 1.0, True)


def test_implied_peak_is_the_rate_over_the_fraction(ladder):
    pipe = ladder[3]  # wmma_pipeline: 217,003,008 bytes in 0.402 ms at 11.23% of peak
    gbs = ncu.implied_peak(pipe.dram_bytes / pipe.seconds, pipe["dram"]) / 1e9
    assert gbs == pytest.approx(pipe.dram_bytes / pipe.seconds / 0.1123 / 1e9)
    assert 4000 < gbs < 5500  # an H200's HBM3e: 4.8 TB/s on its data sheet
    with pytest.raises(ValueError):
        ncu.implied_peak(1.0, 0)


def test_bottleneck_names_what_the_counters_say(ladder):
    kinds = [ncu.bottleneck(k)[0] for k in ladder]
    assert kinds == ["latency", "latency", "latency", "latency", "tensor pipes", "tensor pipes",
                     "tensor pipes"]
    assert "global or local memory" in ncu.bottleneck(ladder[0])[1]  # long_scoreboard 44.8
    dram = ncu.KernelCounters(0, "copy", values={"tensor": 0.0, "dram": 91.0, "sm": 40.0})
    assert ncu.bottleneck(dram) == ("DRAM bandwidth", "DRAM at 91% of its peak")
    alu = ncu.KernelCounters(0, "alu", values={"tensor": 0.0, "dram": 10.0, "sm": 60.0})
    assert ncu.bottleneck(alu)[0] == "SM throughput"
    edge = ncu.KernelCounters(0, "edge", values={"tensor": 59.99, "dram": 10.0, "sm": 10.0})
    assert ncu.bottleneck(edge) == ("latency", "no unit busy (no stall counters read)")


def test_top_stalls_skip_issuing_and_sort(ladder):
    assert ladder[0].top_stalls(2) == [("long_scoreboard", 44.79), ("wait", 2.33)]
    assert ladder[6].top_stalls(3) == [("barrier", 6.0), ("gmma", 3.85),
                                       ("long_scoreboard", 3.81)]
    with pytest.raises(ValueError):
        ladder[0].top_stalls(0)


def test_moved_finds_the_stall_that_fell_most_in_warp_cycles(ladder):
    naive, smem = ladder[0], ladder[1]
    with pytest.raises(ValueError, match="no stall counters"):
        ncu.moved(naive, smem)  # the recording has no instruction count
    naive.values["issued"], smem.values["issued"] = 1000.0, 800.0
    reason, before, after = ncu.moved(naive, smem)
    assert reason == "long_scoreboard"
    assert (before, after) == (pytest.approx(44.79 * 1000), pytest.approx(4.73 * 800))
    # per issue the wait stall barely moves, but with 10x fewer instructions it falls most
    a = ncu.KernelCounters(0, "a", values={"issued": 1000.0, "stall_wait": 5.0,
                                           "stall_barrier": 9.0})
    b = ncu.KernelCounters(1, "b", values={"issued": 100.0, "stall_wait": 4.0,
                                           "stall_barrier": 8.0})
    assert ncu.moved(a, b)[0] == "barrier"
    b.values["stall_barrier"] = 89.0
    assert ncu.moved(a, b)[0] == "wait"
    with pytest.raises(ValueError):
        a.stalled_cycles("coffee")


def test_weighted_mean_weighs_by_duration():
    ks = [ncu.KernelCounters(0, "a", values={"duration_ns": 3.0, "sm": 10.0}),
          ncu.KernelCounters(1, "b", values={"duration_ns": 1.0, "sm": 90.0}),
          ncu.KernelCounters(2, "c", values={"duration_ns": 5.0})]
    assert ncu.weighted(ks, "sm") == pytest.approx((3 * 10 + 90) / 4)
    with pytest.raises(ValueError, match="no kernel"):
        ncu.weighted(ks[2:], "sm")


# ----------------------------------------------------------------------------- running ncu

def _fake_tools(tmp_path, monkeypatch, script: str) -> Path:
    """Puts a fake ncu (running ``script``) and a fake nvidia-smi first on PATH."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in (("ncu", script), ("nvidia-smi", "exit 0")):
        path = bin_ / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return bin_


def test_no_ncu_gives_the_reason_before_running_anything(monkeypatch):
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    monkeypatch.setattr(ncu, "_NCU_PATHS", ())
    assert ncu.find_ncu() is None
    assert "ncu is not on PATH" in ncu.unavailable()
    with pytest.raises(ncu.NcuUnavailable, match="comes with the CUDA toolkit"):
        ncu.profile(["true"])
    with pytest.raises(ncu.NcuUnavailable):
        ncu.command(["true"])


def test_no_gpu_gives_its_reason(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/x/ncu")
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    monkeypatch.setattr(ncu.os.path, "exists", lambda p: False)
    assert ncu.unavailable() == "no NVIDIA GPU here: ncu reads the counters of a GPU"


def test_command_reads_the_gpu_at_its_own_clocks(monkeypatch):
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/x/ncu")
    cmd = ncu.command(["python", "x.py"], ["duration_ns", "tensor"], kernel_regex="nvjet",
                      launch_count=5)
    assert cmd[0] == "/x/ncu" and cmd[-2:] == ["python", "x.py"]
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--print-units") + 1] == "base" and "--csv" in cmd
    assert cmd[cmd.index("--metrics") + 1] == (
        "gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active")
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:nvjet"
    assert cmd[cmd.index("--launch-count") + 1] == "5"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert "--profile-from-start" not in ncu.command(["a"], from_start=True)
    # ncu 2025.3 refuses the option in range replay: the range is start..stop already
    ranged = ncu.command(["a"], replay="range")
    assert "--profile-from-start" not in ranged
    assert ranged[ranged.index("--replay-mode") + 1] == "range"
    for bad in ({"metrics": ["tensr"]}, {"replay": "app"}, {"launch_count": 0}):
        with pytest.raises(ValueError):
            ncu.command(["a"], **bad)


def test_profile_runs_ncu_and_parses_what_it_prints(tmp_path, monkeypatch):
    args = tmp_path / "args"
    _fake_tools(tmp_path, monkeypatch, f'echo "$@" > {args}; cat {FIXTURE}')
    got = ncu.profile([sys.executable, "prog.py"], ["duration_ns"])
    assert [k.name for k in got] == NAMES and got[0]["duration_ns"] == 5_012_928
    assert args.read_text().split()[-2:] == [sys.executable, "prog.py"]


@pytest.mark.parametrize("stderr, rc, why", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", 1,
     "may not read the GPU's performance counters"),
    ("==ERROR== Failed to find metric sm__nope.sum", 1, "lacks a metric: ==ERROR== Failed to find"),
    ("==WARNING== No kernels were profiled.", 0, "no kernel was profiled"),
    ("Segmentation fault", 139, "ncu exited with status 139: Segmentation fault"),
])
def test_profile_says_why_ncu_read_nothing(tmp_path, monkeypatch, stderr, rc, why):
    _fake_tools(tmp_path, monkeypatch, f'echo "{stderr}" >&2; exit {rc}')
    with pytest.raises(ncu.NcuUnavailable, match=why):
        ncu.profile(["prog"])


def test_profile_refuses_a_table_with_a_failed_exit(tmp_path, monkeypatch):
    _fake_tools(tmp_path, monkeypatch, f'cat {FIXTURE}; echo "==ERROR== crashed" >&2; exit 3')
    with pytest.raises(ncu.NcuUnavailable, match="status 3: ==ERROR== crashed"):
        ncu.profile(["prog"])


def test_import_root_is_the_folder_above_the_top_package():
    import fp16lab

    repo = Path(fp16lab.__file__).resolve().parents[1]
    assert Path(ncu._import_root("fp16lab.ncu")) == repo
    assert Path(ncu._import_root("fp16lab")) == repo
    assert ncu._import_root("no.such.module") is None


def sample_workload():
    """A top-level function profile_callable can name."""


def test_profile_callable_names_the_function_for_a_fresh_process(tmp_path, monkeypatch):
    args = tmp_path / "args"
    _fake_tools(tmp_path, monkeypatch, f"printf '%s\\0' \"$@\" > {args}; "
                f"printf '%s' \"$PYTHONPATH\" > {tmp_path / 'pythonpath'}; cat {FIXTURE}")
    assert len(ncu.profile_callable(sample_workload, ["tensor"], warmup=2)) == 7
    sent = args.read_text().split("\0")[:-1]
    assert sent[-2:] == [f"{__name__}:sample_workload", "2"]
    assert "cudaProfilerStart" in sent[sent.index("-c") + 1]
    here = Path(__file__).resolve().parent
    expected = here if "." not in __name__ else here.parent  # where this module is imported from
    assert Path(args.with_name("pythonpath").read_text().split(os.pathsep)[0]) == expected

    def nested():
        pass

    for bad in (lambda: None, nested, 3):
        with pytest.raises(ValueError, match="top level of an importable module"):
            ncu.profile_callable(bad)
    with pytest.raises(ValueError):
        ncu.profile_callable(sample_workload, warmup=-1)


def cublas_fp16_gemm():
    """An fp16 4096^3 product through cuBLAS, on fresh inputs (the GPU test profiles it)."""
    import torch

    a, b = (torch.randn(4096, 4096, device="cuda", dtype=torch.float16) for _ in range(2))
    torch.matmul(a, b)


@pytest.mark.gpu
def test_counters_of_a_cublas_gemm_on_the_gpu():
    """ncu reads cuBLAS's fp16 GEMM: the tensor pipes carry it, and the DRAM bytes lie between
    the operands' and result's bytes (each read or written at least once) and ten times that."""
    why = ncu.unavailable()
    if why:
        pytest.skip(why)
    (k,) = ncu.profile_callable(cublas_fp16_gemm, kernel_regex="nvjet|gemm|xmma|cutlass",
                                timeout=300)
    floor = 3 * 4096 * 4096 * 2
    print(f"{k.name}: {k['duration_ns'] / 1e3:.0f} us, tensor {k['tensor']:.1f}%, "
          f"DRAM {k.dram_bytes / 1e6:.0f} MB, issue {k['issue']:.1f}%, {ncu.bottleneck(k)}")
    assert floor <= k.dram_bytes <= 10 * floor
    assert k["tensor"] > 50 and ncu.bottleneck(k)[0] == "tensor pipes"
    assert 0 < k.seconds < 0.01 and 0 < k["issued"]
    assert not any(math.isnan(k[f"stall_{r}"]) for r in ncu.STALLS)


_BUFFERS: list = []


def copy_512_mib_twice():
    """Copies a 512 MiB buffer into another and back (the buffers made on the first call, the
    warm-up: only the copies are in the profiled range)."""
    import torch

    if not _BUFFERS:
        _BUFFERS.extend(torch.ones(2**27, device="cuda") for _ in range(2))
    a, b = _BUFFERS
    b.copy_(a)
    a.copy_(b)


@pytest.mark.gpu
def test_an_app_range_read_counts_the_bytes_of_the_range():
    """A range read (the whole range as one result, the program run once per pass) reads and
    writes the bytes its kernels move: two 512 MiB copies read 1 GiB and write 1 GiB (the L2
    holds under 64 MiB, so every byte goes to DRAM), and no more: the range is not summed over
    the passes. This is what the whole training steps of bench.counters rest on."""
    why = ncu.unavailable()
    if why:
        pytest.skip(why)
    (r,) = ncu.profile_callable(copy_512_mib_twice, ncu.STEP_METRICS, replay="app-range",
                                timeout=300)
    print(f"range: {r['duration_ns'] / 1e3:.0f} us, read {r['dram_read'] / 2**30:.3f} GiB, "
          f"written {r['dram_write'] / 2**30:.3f} GiB, DRAM {r['dram']:.0f}%")
    assert 2**30 <= r["dram_read"] <= 1.05 * 2**30
    assert 0.95 * 2**30 <= r["dram_write"] <= 1.05 * 2**30
    # two copies of 1 GiB of traffic each at an HBM's few TB/s: 0.3 to 5 ms
    assert 0.3e6 < r["duration_ns"] < 5e6 and r["dram"] > 30
