"""fp16lab.distributed: torchrun launches of two gloo ranks on the CPU, and the arithmetic.

Two launches serve the CPU tests (torchrun with two ranks takes seconds to start): one runs a
training point, a workload named by module:function, then a point whose rank 1 raises; the other averages chosen gradients under each
comm hook, runs GradScaler with an inf on rank 1, trains a BatchNorm on a different batch per
rank with and without DDP's buffer broadcast, runs ShardedGradScaler under FSDP2 with an inf in
rank 1's shard, then a point whose rank 1 hangs.
"""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest

from fp16lab import distributed as d

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CPU = dict(device="cpu", gpus=2, model="mlp", batch=8, warmup=1, steps=3)
# per-rank gradients chosen so that each wire format leaves its own mark: 70000 overflows fp16,
# 1e-8 underflows fp16 (but not bf16), 1.001 rounds away in bf16 and ties-to-even in fp16.
VALUES = [[0.1, 70000.0, 1e-8, 1.001, -2.5e-3], [0.3, 70000.0, 3e-8, 1.0, 7.7e-3]]
# a different batch per rank (4 rows of 3 features) for the BatchNorm: their means and
# variances differ in every feature, so a rank's running statistics tell whose batch they saw.
BN_VALUES = [[[1.0, -2.0, 0.5], [3.0, 0.0, 0.25], [2.0, 4.0, -1.0], [6.0, 2.0, 0.25]],
             [[-4.0, 10.0, 3.0], [0.0, 30.0, 1.0], [-2.0, 20.0, 2.0], [-6.0, 0.0, 6.0]]]
BN_STEPS = 2
HANG_TIMEOUT_S = 8.0


@pytest.fixture(scope="module")
def train_and_raise():
    points = [d.DistPoint(**CPU, precision="amp-fp16", comm_hook="fp16", optimizer="sgd-fused",
                          broadcast_buffers=False),
              d.DistPoint(**{**CPU, "model": "fp16lab.workloads.builtin:mlp"}, precision="fp32"),
              d.DistPoint(**CPU, precision="amp-fp16", strategy="fsdp", reshard_after_forward=False),
              d.DistPoint(**CPU, precision="amp-bf16", fault="raise@1")]
    return points, d.measure_points(points, timeout_s=120)


@pytest.fixture(scope="module")
def checks_and_hang(tmp_path_factory):
    work = tmp_path_factory.mktemp("launch")
    hang = d.DistPoint(**CPU, precision="fp32", fault="hang@1")
    items = [{"task": "allreduce", "values": VALUES},
             {"task": "found_inf", "inf_rank": 1},
             {"task": "buffers", "values": BN_VALUES, "steps": BN_STEPS, "broadcast_buffers": True},
             {"task": "buffers", "values": BN_VALUES, "steps": BN_STEPS, "broadcast_buffers": False},
             {"task": "sharded_found_inf", "inf_rank": 1},
             {"task": "train", **hang.settings()}]
    launch = d.run_ranks(2, ["-m", "fp16lab.distributed_worker"], items,
                         timeout_s=HANG_TIMEOUT_S, workdir=work)
    return launch, work


# ----------------------------------------------------------------------------- launches

def test_row_from_rank0_gathers_both_ranks(train_and_raise):
    (point, *_), (row, *_) = train_and_raise
    assert row["status"] == "ok", row["error"]
    assert {k: row[k] for k in d.point_fields()} == point.settings()
    assert (row["world_size"], row["backend"], row["wrapper"]) == (2, "gloo", "ddp")
    assert [r["rank"] for r in row["per_rank"]] == [0, 1]
    slowest = max(r["step_ms_mean"] for r in row["per_rank"])
    assert row["step_ms_mean"] == slowest
    assert math.isclose(row["samples_per_s"], 2 * 8 / (slowest / 1e3), rel_tol=1e-12)
    for r in row["per_rank"]:
        assert 0 < r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"]
    # the mlp's parameter count, by hand: 64*128+128 + 128*128+128 + 128*10+10
    assert row["parameters"] == 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
    assert set(d.NCCL_ENV) <= set(row["env"])
    assert row["optimizer_fused"] is True  # the point's optimizer is the one the ranks stepped


def test_a_workload_named_module_colon_function_trains_on_both_ranks(train_and_raise):
    (_, point, *_), (_, row, *_) = train_and_raise
    assert row["status"] == "ok", row["error"]
    assert row["model"] == "fp16lab.workloads.builtin:mlp" and point.is_workload
    assert (row["world_size"], row["wrapper"]) == (2, "ddp")
    assert [r["rank"] for r in row["per_rank"]] == [0, 1]
    # each rank built the workload's model (fp16lab's mlp): its parameter count, by hand
    assert row["parameters"] == 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10


def test_fsdp_with_amp_fp16_trains_under_the_sharded_grad_scaler(train_and_raise):
    (*_, point, _), (*_, row, _) = train_and_raise
    assert (point.strategy, point.precision) == ("fsdp", "amp-fp16")
    assert row["status"] == "ok", row["error"]
    assert (row["world_size"], row["wrapper"]) == (2, "fsdp")
    assert row["reshard_after_forward"] is False  # the gathered weights kept to the backward
    assert point.label() == "mlp b8 amp-fp16 x2 fsdp reduce=fp32 no_reshard"


def test_reshard_after_forward_is_checked_and_fsdp_only():
    assert d.DistPoint(**CPU, strategy="fsdp").reshard_after_forward is True
    with pytest.raises(ValueError, match="reshard_after_forward applies to FSDP only"):
        d.DistPoint(**CPU, reshard_after_forward=False)
    with pytest.raises((TypeError, ValueError), match="reshard_after_forward"):
        d.DistPoint(**CPU, strategy="fsdp", reshard_after_forward=0)


@pytest.fixture(scope="module")
def reduce_runs():
    return d.run_checks([("sharded_reduce", {"steps": 3, "precision": "fp32"}),
                         ("sharded_reduce", {"steps": 3, "precision": "amp-bf16"})], timeout_s=120)


def test_an_fp32_reduce_is_the_exact_average_and_a_bf16_one_rounds_it(reduce_runs):
    """The oracle: each rank's gradient on an unsharded copy of the model, gathered and
    averaged in float64. An fp32 reduce of fp32 gradients is off by float32 rounding only; of
    bf16 gradients (amp-bf16's parameters) not at all, a sum of two bf16 values being exact in
    fp32. A bf16 reduce rounds the sum to 8 significant bits: off by about 2^-9 of the largest
    gradient, never more than 2^-7, and not 0."""
    fp32_params, bf16_params = ({r["reduce_dtype"]: r for r in row["runs"]} for row in reduce_runs)
    assert fp32_params["fp32"]["grad_error"] <= 2 ** -23
    assert bf16_params["fp32"]["grad_error"] == 0.0
    for runs in (fp32_params, bf16_params):
        assert 2 ** -12 < runs["bf16"]["grad_error"] <= 2 ** -7
    for row in reduce_runs:
        assert (row["world_size"], row["backend"], row["steps"]) == (2, "gloo", 3)
        losses = [r["losses"] for r in row["runs"]]
        assert [len(x) for x in losses] == [3, 3] and all(math.isfinite(v) for x in losses for v in x)
        assert losses[0][0] == losses[1][0]  # the same weights and batch before any reduce
        assert losses[0][2] < losses[0][0]  # it learns


def test_sharded_reduce_refuses_what_it_cannot_run():
    from fp16lab.distributed.sharded import sharded_reduce

    with pytest.raises(ValueError, match="reduce_dtypes from fp32, bf16, fp16"):
        sharded_reduce({"reduce_dtypes": ["fp8"]}, ctx=None)
    with pytest.raises(ValueError, match="steps >= 1"):
        sharded_reduce({"steps": 0}, ctx=None)
    with pytest.raises(ValueError, match="precision one of"):
        sharded_reduce({"precision": "fp64"}, ctx=None)


_SHARD_ON_A_GPU_MACHINE = """
import socket, sys, torch, torch.distributed as dist
from torch import nn
from fp16lab.distributed.sharded import shard

# what a machine with a GPU reports; fully_shard would make its mesh there by itself
torch._C._get_accelerator = lambda: torch.device("cuda")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
model = shard(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), "amp-bf16")
print(model[0].weight.device_mesh.device_type, model[0].weight.device.type)
dist.destroy_process_group()
"""


def test_shard_makes_its_mesh_on_the_models_device_not_the_machines_accelerator():
    # a CPU (gloo) run on a one-GPU machine sent rank 1 to cuda:1 ("invalid device ordinal",
    # notebook 08 on the H200): the mesh must follow the parameters
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _SHARD_ON_A_GPU_MACHINE], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["cpu", "cpu"]


def test_the_loss_scaler_is_sharded_only_for_fsdp_across_ranks_with_a_scaled_precision():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from fp16lab.distributed.sharded import loss_scaler

    assert isinstance(loss_scaler("amp-fp16", "cpu", "fsdp", 2), ShardedGradScaler)
    assert loss_scaler("amp-fp16", "cpu", "ddp", 2) == "recipe"  # DDP all-reduces the gradients
    assert loss_scaler("amp-fp16", "cpu", "fsdp", 1) == "recipe"  # one rank: nothing sharded
    assert loss_scaler("amp-bf16", "cpu", "fsdp", 2) == "recipe"  # no scaler at all


def test_a_workload_that_does_not_load_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="no_such_module_anywhere.*cannot be imported"):
        d.DistPoint(**{**CPU, "model": "no_such_module_anywhere:make"})
    with pytest.raises(ValueError, match="workload_settings apply to a workload model only"):
        d.DistPoint(**CPU, workload_settings={"tiny": True})
    with pytest.raises(TypeError, match="plain value"):
        d.DistPoint(**{**CPU, "model": "fp16lab.workloads.builtin:mlp"},
                    workload_settings={"f": object()})


def test_a_rank_that_raises_ends_its_point_as_error(train_and_raise):
    _, (*_, row) = train_and_raise
    assert row["status"] == "error"
    assert row["error"] == "rank 1 raised RuntimeError: a fault planted for the test: rank 1 raises"


def test_a_rank_that_hangs_times_out_and_its_processes_end(checks_and_hang):
    launch, work = checks_and_hang
    row = launch.rows[5]
    assert row["status"] == "error"
    assert row["error"].startswith(f"timed out: the point did not finish within {HANG_TIMEOUT_S:g} s")
    assert "rank 1 in 'timed steps' of point 5" in row["error"]
    assert [r["status"] for r in launch.rows[:5]] == ["ok"] * 5
    import json

    for p in work.glob("progress_rank*.json"):
        pid = json.loads(p.read_text())["pid"]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the rank's process is gone


def _oracle_mean(dtype) -> np.ndarray:
    """DDP's hook arithmetic by hand: cast each rank's gradient, divide by 2, sum, in ``dtype``."""
    with np.errstate(over="ignore"):  # 70000 becomes inf in fp16, as on the wire
        parts = [np.asarray(v, dtype=np.float32).astype(dtype) / dtype(2) for v in VALUES]
        return (parts[0] + parts[1]).astype(dtype).astype(np.float32)


@pytest.mark.parametrize("hook, dtype", [("none", np.float32), ("fp16", np.float16),
                                         ("bf16", ml_dtypes.bfloat16)])
def test_comm_hook_average_matches_hand_computed_rounding(checks_and_hang, hook, dtype):
    row = checks_and_hang[0].rows[0]
    assert row["status"] == "ok", row["error"]
    expected = _oracle_mean(dtype)
    for r in row["hooks"][hook]:
        assert r["dtype"] == "float32"  # the hook decompresses into the fp32 gradient
        np.testing.assert_array_equal(np.asarray(r["grad"], dtype=np.float32), expected)


def test_each_wire_format_leaves_a_different_mark(checks_and_hang):
    hooks = checks_and_hang[0].rows[0]["hooks"]
    fp32, fp16, bf16 = (np.asarray(hooks[h][0]["grad"]) for h in ("none", "fp16", "bf16"))
    assert fp32[1] == 70000 and np.isinf(fp16[1]) and np.isfinite(bf16[1])  # fp16 overflows
    assert fp16[2] == 0 and bf16[2] > 0  # fp16 flushes 2e-8, bf16 keeps it
    assert not np.array_equal(fp32, bf16)


def test_found_inf_on_one_rank_makes_every_rank_skip(checks_and_hang):
    row = checks_and_hang[0].rows[1]
    assert row["status"] == "ok", row["error"]
    ranks = row["ranks"]
    # rank 1's own gradients hold the inf, rank 0's do not: alone they would disagree
    assert [r["local_grads_finite"] for r in ranks] == [True, False]
    # after the all-reduce both see it, both skip, both back off like torch's GradScaler does
    import torch

    backoff = torch.amp.GradScaler("cpu").get_backoff_factor()
    for r in ranks:
        assert r["allreduced_grads_finite"] is False
        assert r["stepped"] is False
        assert r["scale_after"] == row["init_scale"] * backoff


def test_sharded_grad_scaler_makes_every_rank_skip_an_inf_in_one_shard(checks_and_hang):
    row = checks_and_hang[0].rows[4]
    assert row["status"] == "ok", row["error"]
    import torch

    backoff = torch.amp.GradScaler("cpu").get_backoff_factor()
    ranks = row["ranks"]
    # the inf sits in rank 1's shard only: rank 0's own shards are finite
    assert [r["local_grads_finite"] for r in ranks] == [True, False]
    # ShardedGradScaler all-reduces found-inf: no rank steps, every rank backs off alike
    assert [r["stepped"] for r in ranks] == [False, False]
    assert [r["scale_after"] for r in ranks] == [row["init_scale"] * backoff] * 2


def _batchnorm_oracle(broadcast: bool) -> tuple[list[list[tuple]], list[tuple]]:
    """BatchNorm's running statistics by hand, in float64: (what each rank holds at the start of
    each forward, what it holds after the last step).

    torch's BatchNorm starts at mean 0, variance 1 and moves each by momentum 0.1 towards the
    batch's mean and unbiased variance; DDP's broadcast, at the start of every forward, replaces
    every rank's statistics with rank 0's.
    """
    def update(state, batch):
        v = np.asarray(batch, dtype=np.float64)
        return (0.9 * state[0] + 0.1 * v.mean(axis=0), 0.9 * state[1] + 0.1 * v.var(axis=0, ddof=1))

    state = [(np.zeros(3), np.ones(3)) for _ in BN_VALUES]
    seen: list[list[tuple]] = [[] for _ in BN_VALUES]
    for _ in range(BN_STEPS):
        if broadcast:
            state = [state[0]] * len(state)
        for r, s in enumerate(state):
            seen[r].append(s)
        state = [update(s, batch) for s, batch in zip(state, BN_VALUES)]
    return seen, state


def _close(got: dict, want: tuple) -> None:
    np.testing.assert_allclose(got["running_mean"], want[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got["running_var"], want[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("index, broadcast", [(2, True), (3, False)])
def test_batchnorm_statistics_per_rank_match_the_hand_computed_ones(checks_and_hang, index, broadcast):
    row = checks_and_hang[0].rows[index]
    assert row["status"] == "ok", row["error"]
    assert row["broadcast_buffers"] is broadcast
    seen, after = _batchnorm_oracle(broadcast)
    for r, rank in enumerate(row["ranks"]):
        assert rank["rank"] == r and len(rank["at_forward"]) == BN_STEPS
        for got, want in zip(rank["at_forward"], seen[r]):
            _close(got, want)
        _close(rank["after"], after[r])


def test_buffer_broadcast_makes_rank1_start_each_forward_with_rank0s_statistics(checks_and_hang):
    on, off = (checks_and_hang[0].rows[i]["ranks"] for i in (2, 3))
    # after the first step each rank has moved towards its own batch; with the broadcast, rank 1
    # begins the second forward with rank 0's statistics, bit for bit; without it, with its own
    assert on[1]["at_forward"][1] == on[0]["at_forward"][1]
    assert off[1]["at_forward"][1] != off[0]["at_forward"][1]
    # the broadcast is at the start of a forward: after a step the ranks differ again either way
    assert on[1]["after"] != on[0]["after"] and off[1]["after"] != off[0]["after"]


# ----------------------------------------------------------------------------- no launch

def test_point_rejects_bad_settings_with_what_is_allowed():
    for kwargs, words in [
        (dict(precision="fp16"), "allowed: fp32, amp-fp16, amp-bf16"),
        (dict(model="vgg"), "model must be one of 'small_cnn'"),
        (dict(batch=0), r"batch \(per GPU\) must be >= 1"),
        (dict(strategy="fsdp", comm_hook="fp16", precision="amp-bf16"), "DDP only"),
        (dict(reduce_dtype="bf16"), "FSDP only"),
        (dict(model="mlp", layout="channels_last"), "image models only"),
        (dict(fault="raise@2", gpus=2), "R < gpus=2"),
        (dict(bucket_cap_mb=0), "bucket_cap_mb must be > 0"),
        (dict(device="tpu"), "device must be one of 'cuda', 'cpu'"),
        (dict(optimizer="adamw"), "one of 'sgd', 'sgd-fused'"),
        (dict(broadcast_buffers="no"), "broadcast_buffers must be True or False, got 'no'"),
        (dict(broadcast_buffers=0), "broadcast_buffers must be True or False, got 0"),
        (dict(broadcast_buffers=None), "broadcast_buffers must be True or False, got None"),
        (dict(fault="raise"), "fault must be a string like 'raise@R' or 'hang@R'"),
        (dict(fault=7), "fault must be a string like"),
        (dict(static_graph=1), "static_graph must be True or False, got 1"),
        (dict(bucket_cap_mb=float("inf")), "bucket_cap_mb must be finite"),
        (dict(steps=True), "steps must be a whole number"),
    ]:
        with pytest.raises((TypeError, ValueError), match=words):
            d.DistPoint(**kwargs)
    assert d.DistPoint(model="resnet50").layout == "channels_last"
    assert d.DistPoint(model="transformer_stack").layout == "nchw"
    assert d.DistPoint(gpus=2).label() == "resnet50 b256 amp-fp16 x2 ddp hook=none bucket=25MB"
    assert d.DistPoint(optimizer="sgd-fused").label() == "resnet50 b256 amp-fp16 x1 opt=sgd-fused"
    assert (d.DistPoint(gpus=2, broadcast_buffers=False, optimizer="sgd-fused").label()
            == "resnet50 b256 amp-fp16 x2 ddp hook=none bucket=25MB no_broadcast opt=sgd-fused")
    assert d.DistPoint(broadcast_buffers=False).label() == "resnet50 b256 amp-fp16 x1"  # one GPU: no DDP


def test_ddp_gets_broadcast_buffers_under_the_name_its_torch_knows():
    from fp16lab.distributed_worker import buffer_sync_argument

    def old(self, module, broadcast_buffers=True, static_graph=False):  # torch before 2.13
        pass

    def new(self, module, broadcast_buffers=None, forward_sync_buffers=None):  # torch >= 2.13
        pass

    assert buffer_sync_argument(False, old) == {"broadcast_buffers": False}
    assert buffer_sync_argument(False, new) == {"forward_sync_buffers": False}
    assert buffer_sync_argument(True, new) == {"forward_sync_buffers": True}


def test_launcher_refuses_bad_arguments_before_starting():
    with pytest.raises(ValueError, match="share gpus and device"):
        d.measure_points([d.DistPoint(**CPU), d.DistPoint(**{**CPU, "gpus": 1})])
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        d.run_ranks(2, ["x.py"], [{}], timeout_s=0)
    with pytest.raises(ValueError, match="at least one item"):
        d.run_ranks(2, ["x.py"], [])
    with pytest.raises(ValueError, match="task must be"):
        d.run_check("broadcast")
    with pytest.raises(ValueError, match="env_overrides must map"):
        d.measure_points([d.DistPoint(**CPU)], env_overrides={"NCCL_ALGO": 1})


def _grid_oracle(kernels, steps):
    """Busy and exposed communication time, and time with no kernel between the first start and
    the last end, on a 0.5 us grid (the kernels' ends are on it)."""
    t = np.arange(0, 200, 0.5) + 0.25
    comm = np.zeros_like(t, dtype=bool)
    comp = np.zeros_like(t, dtype=bool)
    for name, s, e in kernels:
        inside = (t > s) & (t < e)
        if "nccl" in name.lower():
            comm |= inside
        else:
            comp |= inside
    first, last = min(s for _, s, _ in kernels), max(e for _, _, e in kernels)
    idle = ~comm & ~comp & (t > first) & (t < last)
    return comm.sum() * 0.5 / steps, (comm & ~comp).sum() * 0.5 / steps, idle.sum() * 0.5 / steps


def test_comm_overlap_against_a_grid_count():
    rng = np.random.default_rng(7)
    for trial in range(20):
        kernels = []
        for i in range(12):
            s = float(rng.integers(0, 300)) / 2
            e = s + float(rng.integers(1, 80)) / 2
            kernels.append((("ncclDevKernel_AllReduce" if rng.random() < 0.4 else "sm90_gemm"), s, min(e, 199.5)))
        steps = int(rng.integers(1, 4))
        got = d.comm_overlap(kernels, steps=steps)
        busy, exposed, idle = _grid_oracle(kernels, steps)
        assert got["comm_us"] == pytest.approx(busy, abs=1e-9)
        assert got["idle_us"] == pytest.approx(idle, abs=1e-9)
        assert got["exposed_comm_us"] == pytest.approx(exposed, abs=1e-9)
        assert got["overlapped_comm_us"] == pytest.approx(busy - exposed, abs=1e-9)


def test_comm_overlap_small_case_by_hand():
    kernels = [("conv", 0, 10), ("ncclKernel_AllReduce", 8, 14), ("gemm", 12, 20)]
    got = d.comm_overlap(kernels)
    # nccl runs 8..14 (6 us); compute covers 8..10 and 12..14 of it: exposed 10..12 = 2 us
    assert (got["span_us"], got["comm_us"], got["exposed_comm_us"]) == (20, 6, 2)
    assert got["comm_share"] == pytest.approx(0.3) and got["exposed_comm_share"] == pytest.approx(0.1)
    # a gap: nothing runs from 20 to 25 and from 26 to 30 of a 0..30 span over two steps
    got = d.comm_overlap(kernels + [("nccl", 25, 26), ("gemm", 30, 30.5)], steps=2)
    assert (got["idle_us"], got["idle_share"]) == (4.5, pytest.approx(9 / 30.5))


def test_allreduce_seconds_and_efficiency_by_hand():
    # 100 MB over 2 ranks at 100 GB/s: each rank moves 2*(1/2)*100 MB = 100 MB -> 1 ms
    assert d.allreduce_seconds(100e6, 2, 100.0) == pytest.approx(1e-3)
    # 8 ranks move 2*7/8 of the buffer
    assert d.allreduce_seconds(8e9, 8, 50.0) == pytest.approx(2 * 7 / 8 * 8e9 / 50e9)
    assert d.allreduce_seconds(1e9, 1, 10.0) == 0
    assert d.scaling_efficiency(10583, 5397, 2) == pytest.approx(10583 / 10794)
    with pytest.raises(ValueError):
        d.allreduce_seconds(1e6, 0, 10.0)


@pytest.mark.parametrize("call", [
    lambda: d.allreduce_seconds(float("nan"), 2, 10.0),
    lambda: d.allreduce_seconds(1e6, True, 10.0),
    lambda: d.allreduce_seconds(1e6, 1.5, 10.0),
    lambda: d.allreduce_seconds(1e6, 2, float("nan")),
    lambda: d.allreduce_seconds(1e6, 2, float("inf")),
    lambda: d.bus_bandwidth_gbs(float("nan"), 2, 1.0),
    lambda: d.bus_bandwidth_gbs(1e6, 2.5, 1.0),
    lambda: d.bus_bandwidth_gbs(1e6, False, 1.0),
    lambda: d.bus_bandwidth_gbs(1e6, 2, float("nan")),
    lambda: d.scaling_efficiency(float("nan"), 100.0, 2),
    lambda: d.scaling_efficiency(100.0, float("nan"), 2),
    lambda: d.scaling_efficiency(100.0, True, 2),
    lambda: d.scaling_efficiency(100.0, 50.0, 1.5),
    lambda: d.scaling_efficiency(100.0, 50.0, True),
])
def test_the_arithmetic_refuses_nan_booleans_and_fractional_counts(call):
    with pytest.raises(ValueError, match="need .*(finite|whole number|a number)"):
        call()


def test_bus_bandwidth_by_nccl_tests_convention():
    # nccl-tests: algbw = bytes / time; busbw = algbw * 2 (n - 1) / n
    assert d.bus_bandwidth_gbs(256e6, 2, 2e-3) == pytest.approx(128.0)  # n = 2: busbw = algbw
    assert d.bus_bandwidth_gbs(1e9, 8, 10e-3) == pytest.approx(100.0 * 1.75)
    assert d.bus_bandwidth_gbs(1e9, 1, 1.0) == 0
    for bad in [(1e6, 2, 0.0), (1e6, 0, 1.0), (-1, 2, 1.0)]:
        with pytest.raises(ValueError, match="seconds > 0"):
            d.bus_bandwidth_gbs(*bad)


# ----------------------------------------------------------------------------- two GPUs

def _two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


needs_two = pytest.mark.skipif("not _two_gpus()", reason="needs two CUDA GPUs (NCCL)")


@pytest.fixture(scope="module")
def nccl_checks():
    return d.run_checks([("allreduce", {"values": VALUES}), ("found_inf", {"comm_hook": "fp16"})],
                        device="cuda", timeout_s=120)


@pytest.mark.gpu
@needs_two
def test_nccl_comm_hooks_round_like_the_hand_computed_mean(nccl_checks):
    row = nccl_checks[0]
    assert row["backend"] == "nccl"
    for hook, dtype in [("none", np.float32), ("fp16", np.float16), ("bf16", ml_dtypes.bfloat16)]:
        for r in row["hooks"][hook]:
            np.testing.assert_array_equal(np.asarray(r["grad"], dtype=np.float32), _oracle_mean(dtype))


@pytest.mark.gpu
@needs_two
def test_nccl_found_inf_agrees_across_ranks(nccl_checks):
    row = nccl_checks[1]
    assert [r["local_grads_finite"] for r in row["ranks"]] == [True, False]
    assert all(not r["stepped"] and r["scale_after"] == row["init_scale"] / 2 for r in row["ranks"])


@pytest.mark.gpu
@needs_two
def test_nccl_points_ddp_and_fsdp_give_rows():
    base = dict(device="cuda", gpus=2, warmup=2, steps=5)
    points = [d.DistPoint(model="small_cnn", batch=64, precision="amp-fp16", comm_hook="fp16",
                          profile_steps=2, **base),
              d.DistPoint(model="transformer_block", batch=32, precision="amp-bf16", strategy="fsdp",
                          reduce_dtype="bf16", **base)]
    rows = d.measure_points(points, timeout_s=120)
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert row["backend"] == "nccl" and len(row["per_rank"]) == 2
        assert row["peak_memory_gib"] > 0
    assert rows[0]["comm_us"] > 0 and 0 < rows[0]["comm_share"] <= 1
