"""Exercises of notebook 07 (feeding the GPU): which side caps a training step, and by how much."""

from __future__ import annotations

import inspect
import math

import torch

from .core import Exercise, Wrong, expect_close

__all__ = ["q1", "q2", "q3", "q4"]

#: The figures the questions give (inputs to reason with, not measurements).
Q2_MODEL_FP32, Q2_MODEL_AMP, Q2_LOADER = 600.0, 3000.0, 800.0
Q3_PER_WORKER, Q3_MODEL = 210.0, 3000.0
Q4_BATCH, Q4_SIZE = 256, 224

_PAIRS = ((800.0, 3000.0), (3000.0, 600.0), (1500.0, 1500.0), (12.5, 40.0), (5e4, 2e3))


def _check_q1(answer: object) -> str:
    if not callable(answer):
        raise Wrong("give the function itself: q1.check(training_rate), without calling it.")
    try:
        inspect.signature(answer).bind(1.0, 2.0)
    except (TypeError, ValueError):
        raise Wrong("training_rate must take two arguments: (loader_images_per_s, "
                    "model_images_per_s).") from None
    for loader, model in _PAIRS:
        got = answer(loader, model)
        if got is Ellipsis:
            raise Wrong("training_rate still returns ...: replace the ... with your formula.")
        right = min(loader, model)
        try:
            ok = math.isclose(float(got), right, rel_tol=1e-9)
        except (TypeError, ValueError):
            raise Wrong(f"training_rate({loader:g}, {model:g}) returned {got!r}; return a number "
                        "of images per second.") from None
        if ok:
            continue
        if math.isclose(float(got), 1 / (1 / loader + 1 / model), rel_tol=1e-6):
            raise Wrong("you added the time per image of both sides, as if the GPU waited while "
                        "the workers prepare each batch. The workers run ahead and prepare the "
                        "next batches while the GPU trains: the two overlap.")
        if math.isclose(float(got), max(loader, model), rel_tol=1e-9):
            raise Wrong(f"training_rate({loader:g}, {model:g}) returned the faster side; the "
                        "slower one sets the pace.")
        if math.isclose(float(got), loader + model, rel_tol=1e-9):
            raise Wrong("you added the two rates: the loop trains each image once, so it cannot "
                        "go faster than either side alone.")
        raise Wrong(f"training_rate({loader:g}, {model:g}) returned {got!r}: the pipeline delivers "
                    f"{loader:g} images/s and the model takes {model:g}. Which side waits for "
                    "the other, and at whose pace does the loop then run?")
    return ("min(loader, model): the slower side sets the ceiling, and the other side waits, which "
            "is why a faster model on a slow pipeline gains nothing. It is a ceiling: where the two "
            "sides compete (for CPU cores, or for the GPU when it decodes the JPEGs), each runs "
            "slower than alone and the loop lands below it; section 4 measures how far.")


q1 = Exercise(
    "q1", "Write training_rate(loader_images_per_s, model_images_per_s): the images/s a "
          "training loop reaches at best when the input workers run ahead of the GPU and the two "
          "sides take nothing from each other.", _check_q1,
    hint="Both sides work at the same time, on different batches. Which one does the other wait for?",
    solution="The slower side: the loop cannot go faster than either one.",
    solution_code="def training_rate(loader_images_per_s, model_images_per_s):\n"
                  "    return min(loader_images_per_s, model_images_per_s)")


def _rate(loader: float, model: float) -> float:
    return min(loader, model)


def _check_q2(answer: object) -> str:
    right = _rate(Q2_LOADER, Q2_MODEL_AMP) / _rate(Q2_LOADER, Q2_MODEL_FP32)
    model_only = Q2_MODEL_AMP / Q2_MODEL_FP32
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise Wrong(f"give a number (the speed-up, e.g. 2.5), not {answer!r}.") from None
    if math.isclose(value, model_only, rel_tol=0.01):
        raise Wrong(f"{value:g}x is the model's own speed-up, with the batch already on the GPU. "
                    f"Fed by a pipeline of {Q2_LOADER:g} images/s, what does each precision reach?")
    fp32_fed, amp_fed = _rate(Q2_LOADER, Q2_MODEL_FP32), _rate(Q2_LOADER, Q2_MODEL_AMP)
    if math.isclose(value, 1.0, rel_tol=0.01):
        raise Wrong(f"1x would mean both precisions run at the pipeline's {Q2_LOADER:g} images/s. In "
                    f"fp32 the model, at {Q2_MODEL_FP32:g}, is the slower side: which pace does each "
                    "precision run at?")
    if math.isclose(value, fp32_fed / amp_fed, rel_tol=0.01):
        raise Wrong(f"{value:g} is fp32's rate over AMP's; a speed-up is AMP's fed rate over fp32's.")
    if math.isclose(value, Q2_MODEL_AMP / Q2_LOADER, rel_tol=0.01):
        raise Wrong(f"{value:g} compares AMP's model with the pipeline. Compare the two training loops: "
                    "AMP's fed rate over fp32's fed rate.")
    if not math.isclose(value, right, rel_tol=0.01):
        raise Wrong(f"{value:g} is not AMP's fed rate over fp32's fed rate. Find each with "
                    "training_rate (q1): the pipeline and the model, per precision, then divide.")
    return (f"{right:.2f}x: fp32 trains at {_rate(Q2_LOADER, Q2_MODEL_FP32):g} images/s (the model "
            f"is the slower side), AMP at {_rate(Q2_LOADER, Q2_MODEL_AMP):g} (now the pipeline is). "
            f"The other {model_only / right:.2f}x of AMP's speed-up waits for images.")


q2 = Exercise(
    "q2", f"ResNet-50 trains at {Q2_MODEL_FP32:g} images/s in fp32 and {Q2_MODEL_AMP:g} under AMP "
          f"on a batch already on the GPU; the input pipeline delivers {Q2_LOADER:g} images/s. "
          "What speed-up does AMP give on real input? Answer with a number.", _check_q2,
    hint="Use training_rate from q1 for each precision, then divide.",
    solution=f"min({Q2_LOADER:g}, {Q2_MODEL_AMP:g}) / min({Q2_LOADER:g}, {Q2_MODEL_FP32:g}) = "
             f"{_rate(Q2_LOADER, Q2_MODEL_AMP) / _rate(Q2_LOADER, Q2_MODEL_FP32):.3g}")


def _check_q3(answer: object) -> str:
    right = math.ceil(Q3_MODEL / Q3_PER_WORKER)
    if isinstance(answer, bool) or not isinstance(answer, int):
        raise Wrong(f"give a whole number of workers, not {answer!r}.")
    if answer == right:
        return (f"{right} workers: {right} x {Q3_PER_WORKER:g} = {right * Q3_PER_WORKER:g} images/s "
                f">= {Q3_MODEL:g}; {right - 1} would give {(right - 1) * Q3_PER_WORKER:g}. Each "
                "needs a core of its own, and the main process needs one too.")
    if answer * Q3_PER_WORKER < Q3_MODEL:
        raise Wrong(f"{answer} workers give {answer * Q3_PER_WORKER:g} images/s, short of "
                    f"{Q3_MODEL:g}: the GPU would wait.")
    raise Wrong(f"{answer} workers keep up, but so do fewer; find the smallest number that does.")


q3 = Exercise(
    "q3", f"One DataLoader worker decodes and augments {Q3_PER_WORKER:g} images/s; the model "
          f"trains at {Q3_MODEL:g} images/s. What is the smallest number of workers that keeps "
          "up? Answer with an integer.", _check_q3,
    hint="Workers add up: n workers make n times as many images per second. Round the right way.",
    solution=f"ceil({Q3_MODEL:g} / {Q3_PER_WORKER:g}) = {math.ceil(Q3_MODEL / Q3_PER_WORKER)}")


def _batch_mb(dtype: torch.dtype) -> float:
    return Q4_BATCH * 3 * Q4_SIZE * Q4_SIZE * torch.empty((), dtype=dtype).element_size() / 1e6


def _check_q4(answer: object) -> str:
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise Wrong("give two numbers in megabytes, (float32, uint8), e.g. (100.0, 25.0).")
    f32, u8 = _batch_mb(torch.float32), _batch_mb(torch.uint8)
    try:
        given = (float(answer[0]), float(answer[1]))
    except (TypeError, ValueError):
        raise Wrong(f"both must be numbers, got {answer!r}.") from None
    if math.isclose(given[0], f32 / 2**20 * 1e6, rel_tol=0.01):
        raise Wrong("that is in MiB (2^20 bytes); count megabytes of 10^6 bytes.")
    expect_close(given[0], f32, "the float32 batch in MB", rel=0.01)
    expect_close(given[1], u8, "the uint8 batch in MB", rel=0.01)
    return (f"{f32:.1f} MB as float32, {u8:.1f} MB as uint8: normalising on the GPU moves 4x fewer "
            "bytes from the workers to the GPU and through the copy.")


q4 = Exercise(
    "q4", f"How many megabytes (10^6 bytes) is one batch of {Q4_BATCH} images of 3x{Q4_SIZE}x{Q4_SIZE} "
          "as normalised float32, and as uint8? Answer (float32_mb, uint8_mb).", _check_q4,
    hint="Elements per batch times bytes per element: torch.empty((), dtype=...).element_size().",
    solution=f"{Q4_BATCH} x 3 x {Q4_SIZE} x {Q4_SIZE} = {Q4_BATCH * 3 * Q4_SIZE ** 2} elements: "
             f"{_batch_mb(torch.float32):.1f} MB at 4 bytes, {_batch_mb(torch.uint8):.1f} MB at 1 byte.")
