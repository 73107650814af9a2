"""Exercises of notebook 08 (beyond one GPU): the DDP loop, checked against a reference run, and
questions whose answers are computed here with numpy and ml_dtypes."""

from __future__ import annotations

import gc
import inspect
import math
import os
import socket

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from .core import Exercise, Wrong
from .recording import RecordingScaler

__all__ = ["ddp_loop", "q1", "q2", "q3", "q4"]

# q3: a scenario, not a measurement
Q3_ONE, Q3_TWO = 5200.0, 9800.0


def _number(answer: object) -> float:
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give a number, not {type(answer).__name__} {answer!r}.") from None
    return value


def _check_q1(answer: object) -> str:
    value = _number(answer)
    right = Q3_TWO / (2 * Q3_ONE)
    if math.isclose(value, right, rel_tol=2e-3):
        return (f"{right:.3f}: two GPUs give {Q3_TWO:g} img/s where two perfectly independent ones "
                f"would give {2 * Q3_ONE:g}; the {1 - right:.1%} missing is what running as two costs: "
                "communication, waiting for the other rank, and two processes sharing a host.")
    if math.isclose(value, Q3_TWO / Q3_ONE, rel_tol=2e-3):
        raise Wrong(f"{value:.3f} is the speed-up. Efficiency divides it by the number of GPUs.")
    if math.isclose(value, right * 100, rel_tol=2e-3):
        raise Wrong("give it as a fraction (0.9), not a percentage (90).")
    if math.isclose(value, 1 - right, rel_tol=2e-3):
        raise Wrong(f"{value:.3f} is the share that goes missing; the efficiency is the share that "
                    "remains: the 2-GPU rate over twice the 1-GPU rate.")
    if math.isclose(value, 1 / right, rel_tol=2e-3):
        raise Wrong(f"{value:.3f} is the ideal rate over the measured one, upside down: divide the "
                    "2-GPU rate by twice the 1-GPU rate.")
    if math.isclose(value, (Q3_TWO - Q3_ONE) / Q3_ONE, rel_tol=2e-3):
        raise Wrong(f"{value:.3f} is what the second GPU added, over one GPU's rate. Efficiency "
                    "compares the whole 2-GPU rate with two perfectly independent GPUs.")
    raise Wrong(f"{value:g} is not the 2-GPU rate ({Q3_TWO:g}) over twice the 1-GPU rate "
                f"(2 x {Q3_ONE:g}).")


q3 = Exercise(
    "q3", f"One GPU trains {Q3_ONE:g} img/s, two train {Q3_TWO:g} img/s together. What is the "
          "scaling efficiency (a fraction)?", _check_q1,
    hint="Perfect scaling would double the rate. Compare the 2-GPU rate with that.",
    solution=f"{Q3_TWO:g} / (2 x {Q3_ONE:g}) = {Q3_TWO / (2 * Q3_ONE):.4f}",
    solution_code=f"{Q3_TWO} / (2 * {Q3_ONE})")

# q4: ring all-reduce of fp32 gradients
Q4_PARAMS, Q4_RANKS, Q4_BUS_GBS = 300e6, 8, 400.0


def _ring_ms(nbytes: float, ranks: int, bus_gbs: float) -> float:
    return 2 * (ranks - 1) / ranks * nbytes / (bus_gbs * 1e9) * 1e3


def _check_q2(answer: object) -> str:
    value = _number(answer)
    right = _ring_ms(Q4_PARAMS * 4, Q4_RANKS, Q4_BUS_GBS)
    if math.isclose(value, right, rel_tol=0.01):
        return (f"{right:.2f} ms: 1.2 GB of fp32 gradients, and each rank sends (and receives) "
                f"2 x 7/8 of it in a ring (reduce-scatter, then all-gather).")
    if math.isclose(value, Q4_PARAMS * 4 / (Q4_BUS_GBS * 1e9) * 1e3, rel_tol=0.01):
        raise Wrong("that is one pass over the buffer. A ring all-reduce is a reduce-scatter plus an "
                    "all-gather: each rank moves 2 (n-1)/n times the buffer.")
    if math.isclose(value, _ring_ms(Q4_PARAMS * 2, Q4_RANKS, Q4_BUS_GBS), rel_tol=0.01):
        raise Wrong("that is the time for 2-byte gradients (a fp16 or bf16 hook). The question is "
                    "about fp32 gradients, 4 bytes each.")
    if math.isclose(value, right / 1e3, rel_tol=0.01):
        raise Wrong("answer in milliseconds, not seconds.")
    raise Wrong(f"{value:g} ms is not it: bytes x 2 (n-1)/n / bandwidth.")


q4 = Exercise(
    "q4", f"{Q4_PARAMS / 1e6:g} million fp32 gradients are all-reduced across {Q4_RANKS} GPUs with a "
          f"ring at {Q4_BUS_GBS:g} GB/s bus bandwidth. How many milliseconds does it take?",
    _check_q2,
    hint="Bytes first (4 per fp32 value). A ring moves 2 (n-1)/n times the buffer per rank.",
    solution=f"300e6 x 4 bytes x 2 x 7/8 / 400e9 B/s = {_ring_ms(Q4_PARAMS * 4, Q4_RANKS, Q4_BUS_GBS):.2f} ms",
    solution_code="from fp16lab.distributed import allreduce_seconds\n"
                  "allreduce_seconds(300e6 * 4, 8, 400) * 1e3")

# q1: what fp16_compress_hook does to a scaled gradient
Q1_GRADS = (70000.0, 50000.0)


def _fp16_hook(values: tuple[float, ...]) -> float:
    with np.errstate(over="ignore"):
        parts = [np.float16(np.float32(v)) / np.float16(len(values)) for v in values]
        return float(np.float16(sum(parts, np.float16(0))))


def _check_q3(answer: object) -> str:
    value = float(answer) if isinstance(answer, str) and answer.strip().lower() in ("inf", "+inf") \
        else _number(answer)
    right = _fp16_hook(Q1_GRADS)
    if value == right or (math.isinf(right) and math.isinf(value) and value > 0):
        return ("inf: the hook casts each bucket to fp16 *before* dividing by the number of ranks, and "
                f"{Q1_GRADS[0]:g} is past fp16's largest value, 65504. GradScaler then sees inf, skips "
                "the step on every rank and halves the scale: the hook's range, not the model's, set it.")
    mean = sum(Q1_GRADS) / len(Q1_GRADS)
    if math.isclose(value, mean, rel_tol=1e-3):
        raise Wrong(f"{mean:g} is the fp32 average (or what dividing before the cast would give). "
                    "Follow the hook's order: cast to fp16, then divide, then sum.")
    raise Wrong(f"{value:g} is not what the averaged gradient becomes: follow the hook's order "
                "(cast each rank's gradient to fp16, divide by the number of ranks, sum) and ask "
                f"what fp16 makes of {Q1_GRADS[0]:g}.")


q1 = Exercise(
    "q1", f"GradScaler has scaled the loss; one weight's gradient is {Q1_GRADS[0]:g} on rank 0 and "
          f"{Q1_GRADS[1]:g} on rank 1. DDP averages it with fp16_compress_hook. What value does the "
          "weight's .grad hold afterwards? (a number, or 'inf')", _check_q3,
    hint="Read the hook: buffer.to(torch.float16).div_(world_size), then all_reduce(sum). "
         "What is the largest fp16 value?",
    solution="inf: fp16(70000) is already inf before the division.",
    solution_code="import numpy as np\nnp.float16(70000.0)")


# q2: found-inf agreement
def _ranks_that_skip(grads_finite: tuple[bool, ...]) -> set[int]:
    # the all-reduce sums the gradients: one inf makes every rank's averaged gradient inf
    summed = np.sum([0.0 if ok else np.inf for ok in grads_finite])
    return set(range(len(grads_finite))) if not np.isfinite(summed) else set()


def _check_q4(answer: object) -> str:
    try:
        given = {int(r) for r in answer}
    except (TypeError, ValueError):
        raise Wrong("give the ranks as a set of integers, e.g. {0} or {0, 1} or set().") from None
    right = _ranks_that_skip((True, False))
    if given == right:
        return ("{0, 1}: the all-reduce adds rank 1's inf into rank 0's gradient too, so both "
                "GradScalers find it, both skip and both halve the scale. The ranks stay identical.")
    if given == {1}:
        raise Wrong("rank 1 skips, but it does not decide alone: its gradient is all-reduced with "
                    "rank 0's before GradScaler looks. What is x + inf?")
    if not given:
        raise Wrong("an inf in any rank's gradient makes the step unusable; someone must skip.")
    raise Wrong(f"{sorted(given)} is not it: rank 0's own gradients are finite, but DDP sums the "
                "ranks' gradients before GradScaler looks at them. What does each rank hold then?")


q2 = Exercise(
    "q2", "Two ranks train with DDP and GradScaler. Rank 1's scaled gradients overflow to inf, rank "
          "0's are finite. Which ranks skip the optimizer step? (a set of ranks)", _check_q4,
    hint="GradScaler looks at the gradients after DDP has all-reduced them.",
    solution="{0, 1}: after the all-reduce every rank holds the inf.")


# -- ddp_loop: the DDP + AMP training loop one rank runs ------------------------------------------
_L_SAMPLES, _L_BATCH, _L_EPOCHS = 24, 4, 2

#: The imports the loop needs: the notebook writes them above the learner's function in the
#: script torchrun runs.
LOOP_IMPORTS = ("import torch, torch.distributed as dist, torch.nn.functional as F\n"
                "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                "from torch.utils.data import DataLoader, DistributedSampler")


def reference_ddp_amp_loop(model, dataset, epochs, batch_size, device):
    """Trains model on dataset with DDP and FP16 AMP, one process per device under torchrun.
    Returns the DDP-wrapped model and GradScaler's scale after every step."""
    device = torch.device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    model = DDP(model.to(device))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type)
    scales = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
    dist.destroy_process_group()
    return model, scales


class _Samples(torch.utils.data.Dataset):
    """A small classification set that notes the order its samples are read in."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(5)
        self.x, self.y = torch.randn(_L_SAMPLES, 8, generator=g), torch.randint(0, 4, (_L_SAMPLES,), generator=g)
        self.read: list[int] = []

    def __len__(self) -> int:
        return _L_SAMPLES

    def __getitem__(self, i):
        self.read.append(int(i))
        return self.x[i], self.y[i]


class _Scaler(RecordingScaler):
    """A recording GradScaler that also keeps every instance the loop made."""

    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Scaler.made.append(self)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_loop(loop):
    """Runs ``loop`` as rank 0 of a one-process gloo group on the CPU; returns what it left behind."""
    if dist.is_initialized():  # left open by an earlier attempt that raised
        dist.destroy_process_group()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    dtypes: list = []
    model.register_forward_hook(lambda mod, inp, out: dtypes.append(out.dtype))
    params = list(model.parameters())
    data = _Samples()
    _Scaler.made = []
    real, torch.amp.GradScaler = torch.amp.GradScaler, _Scaler
    try:
        out = loop(model, data, _L_EPOCHS, _L_BATCH, "cpu")
        left_open = dist.is_initialized()
    except Exception as exc:
        # a loop that raised mid-step leaves DDP's reducer half-way: drop it (the traceback's
        # frames hold it) before the group goes, or destroying the group can hang
        raised = exc.with_traceback(None)
    else:
        raised = None
    finally:
        torch.amp.GradScaler = real
        model = None
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if raised is not None:
        raise raised
    return {"out": out, "left_open": left_open, "dtypes": dtypes, "read": data.read,
            "scalers": list(_Scaler.made), "params": params}


def _orders(epochs: int) -> list[list[int]]:
    sampler = DistributedSampler(range(_L_SAMPLES), num_replicas=1, rank=0)
    out = []
    for e in range(epochs):
        sampler.set_epoch(e)
        out.append(list(sampler))
    return out


def _check_ddp_loop(answer: object) -> str:
    if not callable(answer):
        raise Wrong("give the function itself: ddp_loop.check(ddp_amp_loop), without calling it.")
    try:
        inspect.signature(answer).bind(None, None, 1, 1, "cpu")
    except (TypeError, ValueError):
        raise Wrong("ddp_amp_loop must take (model, dataset, epochs, batch_size, device).") from None
    try:
        got = _run_loop(answer)
    except Exception as exc:  # torch's own misuse errors say which call is missing
        text = str(exc)
        if "'ellipsis' object" in text:
            raise Wrong("the loop still has a ... where code belongs (it raised: " + text + "). "
                        "Fill in the numbered parts, 1 to 6.") from None
        if "process group has not been initialized" in text:
            raise Wrong("the process group was never started: call dist.init_process_group(...) "
                        "first (gloo for CPU processes, nccl for GPUs); DDP needs it to "
                        "exchange gradients.") from None
        if "since the last update()" in text:
            raise Wrong("GradScaler.update() is never called: after scaler.step(opt), call "
                        "scaler.update(), which lowers the scale after an overflow and raises it "
                        "after a run of good steps.") from None
        if "No inf checks were recorded" in text:
            raise Wrong("the optimizer stepped without GradScaler: call scaler.step(opt) instead "
                        "of opt.step(), so a step whose gradients hold inf/NaN is skipped on "
                        "every rank.") from None
        if "_scale is None" in text or "did not use scaler.scale" in text:
            raise Wrong("the loss went backward unscaled: call scaler.scale(loss).backward(), "
                        "then scaler.step(opt) and scaler.update().") from None
        if "'set_epoch'" in text:
            raise Wrong("your sampler has no set_epoch: it is not a DistributedSampler. Use "
                        "sampler = DistributedSampler(dataset), which shuffles, gives each rank "
                        "its own share and reshuffles when told the epoch.") from None
        raise Wrong(f"ddp_amp_loop raised {type(exc).__name__}: {text}") from None
    out = got["out"]
    if out is None or out is Ellipsis or not isinstance(out, (tuple, list)) or len(out) != 2:
        raise Wrong("ddp_amp_loop must return (model, scales): the DDP model and the scale after "
                    "every step.")
    ddp_model, scales = out
    if not isinstance(ddp_model, DDP):
        raise Wrong("the model is not wrapped in DistributedDataParallel: each rank would train "
                    "its own copy and no gradient would be averaged. Wrap it: "
                    "model = DDP(model.to(device)).")
    if not got["scalers"]:
        raise Wrong("no GradScaler was made: make one with torch.amp.GradScaler(device.type).")
    called = got["scalers"][0].called
    if "scale" not in called:
        raise Wrong("the loss went backward unscaled: call scaler.scale(loss).backward(), so "
                    "small fp16 gradients do not underflow.")
    if "step" not in called:
        raise Wrong("scaler.step(opt) is never called: the optimizer must step through the "
                    "scaler, which skips steps whose gradients hold inf/NaN.")
    if "update" not in called:
        raise Wrong("GradScaler.update() is never called: call it after scaler.step(opt) in "
                    "every step.")
    if not got["dtypes"] or any(d != torch.float16 for d in got["dtypes"]):
        raise Wrong("the forward pass ran in fp32: run the forward and the loss under "
                    "torch.autocast(device.type, dtype=torch.float16).")
    read, n = got["read"], _L_SAMPLES
    epochs = [read[i * n:(i + 1) * n] for i in range(_L_EPOCHS)]
    want = _orders(_L_EPOCHS)
    if len(read) != _L_EPOCHS * n:
        raise Wrong(f"the loop read {len(read)} samples in {_L_EPOCHS} epochs of {n}: run "
                    "every epoch over the whole loader.")
    if epochs[0] == list(range(n)):
        raise Wrong("the samples come in the fixed order 0, 1, 2, ...: give the DataLoader a "
                    "DistributedSampler(dataset), which shuffles and gives each rank its own share.")
    if epochs[0] != want[0]:
        raise Wrong("the samples are not drawn by a DistributedSampler: with another sampler every "
                    "rank draws from the whole data set, so the ranks train on overlapping "
                    "batches. Use sampler = DistributedSampler(dataset).")
    if all(e == epochs[0] for e in epochs[1:]):
        raise Wrong("the sampler's epoch is never set, so every epoch sees the same order: call "
                    "sampler.set_epoch(epoch) at the start of each epoch.")
    if got["left_open"]:
        raise Wrong("the process group is still open when the loop returns: end with "
                    "dist.destroy_process_group(), or the ranks can hang at exit.")
    ref = _run_loop(reference_ddp_amp_loop)
    mine = [p.detach() for p in got["params"]]
    theirs = [p.detach() for p in ref["params"]]
    if not all(torch.equal(a, b) for a, b in zip(mine, theirs)) or list(scales) != list(ref["out"][1]):
        raise Wrong("every part is there, but the weights after the last step differ from the "
                    "reference's. Per step: zero_grad, forward and loss under autocast, "
                    "scaler.scale(loss).backward(), scaler.step(opt), scaler.update().")
    return (f"your loop matches the reference bit for bit over {len(scales)} steps in one "
            "process (world size 1, gloo): process group, DDP wrap, a DistributedSampler "
            "reshuffled each epoch, autocast and GradScaler. The next cell runs it on two ranks.")


ddp_loop = Exercise(
    "ddp_loop", "Write ddp_amp_loop(model, dataset, epochs, batch_size, device): the loop one "
                "rank runs under torchrun, with DDP and FP16 AMP; return (model, scales).",
    _check_ddp_loop,
    hint="Six pieces, in order: dist.init_process_group (nccl for cuda, gloo for cpu); "
         "DDP(model.to(device)); DistributedSampler(dataset); torch.amp.GradScaler(device.type); "
         "sampler.set_epoch(epoch) each epoch; the AMP step of notebook 02 without clipping.",
    solution="One way to write it.",
    solution_code=LOOP_IMPORTS + "\n\n" + inspect.getsource(reference_ddp_amp_loop).replace(
        "reference_ddp_amp_loop", "ddp_amp_loop"))
