"""Exercises of notebook 07 (feeding the GPU): which side caps a training step, and by how much."""

from __future__ import annotations

import inspect
import math
import numbers
import os

import numpy as np
import torch

from ..inputs import IMAGENET_MEAN, IMAGENET_STD, augment_pil, load_rgb, normalize, scan_image_folder
from .core import Exercise, Wrong, expect_close

__all__ = ["pipeline", "q1", "q2", "q3", "q4"]

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
          "At most, what speed-up can AMP give on real input (each loop at the pace of its slower "
          "side)? Answer with a number.", _check_q2,
    hint="Use training_rate from q1 for each precision, then divide.",
    solution=f"min({Q2_LOADER:g}, {Q2_MODEL_AMP:g}) / min({Q2_LOADER:g}, {Q2_MODEL_FP32:g}) = "
             f"{_rate(Q2_LOADER, Q2_MODEL_AMP) / _rate(Q2_LOADER, Q2_MODEL_FP32):.3g}")


def _check_q3(answer: object) -> str:
    right = math.ceil(Q3_MODEL / Q3_PER_WORKER)
    # numpy's integers, and whole floats such as np.ceil's, are whole numbers of workers too
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real) \
            or not float(answer).is_integer():
        raise Wrong(f"give a whole number of workers, not {answer!r}.")
    answer = int(answer)
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
          f"trains at {Q3_MODEL:g} images/s. Assume each added worker adds as many (a core of "
          "its own for each, nothing else competing). What is the smallest number of workers that keeps "
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
    if math.isclose(given[0], u8, rel_tol=0.01) and math.isclose(given[1], f32, rel_tol=0.01):
        raise Wrong("the two are swapped: give (float32_mb, uint8_mb), the float32 batch first.")
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


# -- pipeline: the Dataset, the DataLoader and the copy to the device -----------------------------
_P_SIZE, _P_BATCH, _P_WORKERS = 16, 4, 2


def _tiny_folder():
    """Returns a folder of six small JPEGs in two classes, made once per process."""
    import tempfile  # local: only the pipeline check writes files
    from pathlib import Path

    from PIL import Image

    root = Path(tempfile.gettempdir()) / f"fp16lab_ch07_pipeline_{os.getpid()}"
    if not (root / "b" / "2.jpg").exists():
        rng = np.random.default_rng(0)
        for name in ("a", "b"):
            (root / name).mkdir(parents=True, exist_ok=True)
            for i in range(3):
                pixels = rng.integers(0, 256, (30 + 4 * i, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / name / f"{i}.jpg", quality=90)
    return root


class ReferenceDataset(torch.utils.data.Dataset):
    """The answer's Dataset: (uint8 crop of 3 x size x size, label) for each file of an image folder."""

    def __init__(self, root, size):
        self.files, self.labels, self.classes = scan_image_folder(root)
        self.size = size

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return augment_pil(load_rgb(self.files[i]), self.size), self.labels[i]


def reference_loader(dataset, batch_size, num_workers, device):
    """The answer's DataLoader."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=num_workers,
        pin_memory=torch.device(device).type == "cuda", persistent_workers=num_workers > 0)


def reference_to_model(images, labels, device):
    """The answer's copy: uint8 to the device without waiting, then normalised there, channels_last."""
    images = images.to(device, non_blocking=True)
    labels = labels.to(device, non_blocking=True)
    return normalize(images).contiguous(memory_format=torch.channels_last), labels


class _Recorded(torch.Tensor):
    """A tensor that notes every copy to a device made from it (and from what it becomes)."""

    moves: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor):
            targets = [a for a in args[1:] if isinstance(a, (str, torch.device))]
            if name != "to" or targets or "device" in kwargs:
                cls.moves.append({"dtype": args[0].dtype,
                                  "non_blocking": _non_blocking(name, args, kwargs)})
        return super().__torch_function__(func, types, args, kwargs)


def _non_blocking(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a copy to a device (``t.to(...)``, ``t.cuda(...)``, ``t.cpu()``; ``args[0]`` is
    ``t``) was asked not to block: by keyword, or by position where the signature has it,
    ``to(device, dtype, non_blocking)``, ``to(other, non_blocking)``, ``cuda(device,
    non_blocking)``. ``cpu()`` has no such argument: it always waits."""
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    position = {"cuda": 2, "to": 2 if len(args) > 1 and isinstance(args[1], torch.Tensor) else 3}
    at = position.get(name)
    return at is not None and len(args) > at and args[at] is True


def _check_dataset(make_dataset) -> object:
    root = _tiny_folder()
    files, labels, _ = scan_image_folder(root)
    try:
        ds = make_dataset(root, _P_SIZE)
    except Exception as exc:
        raise Wrong(f"{getattr(make_dataset, '__name__', 'the Dataset')}(root, size) raised "
                    f"{type(exc).__name__}: {exc}") from None
    for method, args in (("__len__", ()), ("__getitem__", (0,))):
        try:
            unwritten = getattr(ds, method)(*args) in (None, Ellipsis)
        except Exception:  # a body that raises is reported below, with its message
            unwritten = False
        if unwritten:
            raise Wrong(f"ImageDataset.{method} returns nothing yet: write its body in place of the ...")
    try:
        n = len(ds)
    except Exception as exc:
        raise Wrong(f"len(dataset) raised {type(exc).__name__}: {exc}; __len__ returns the number "
                    "of files.") from None
    if n != len(files):
        raise Wrong(f"len(dataset) is {n!r}, but the folder holds {len(files)} files: __len__ "
                    "returns the number of files, so the sampler draws each once an epoch.")
    ref = ReferenceDataset(root, _P_SIZE)
    for i in (0, len(files) - 1):
        torch.manual_seed(i)
        try:
            item = ds[i]
        except Exception as exc:
            raise Wrong(f"dataset[{i}] raised {type(exc).__name__}: {exc}") from None
        torch.manual_seed(i)
        want = ref[i]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise Wrong(f"dataset[{i}] returned {type(item).__name__}; return a pair (image, label).")
        image, label = item
        if not isinstance(image, torch.Tensor):
            raise Wrong(f"dataset[{i}]'s image is a {type(image).__name__}, not a tensor: the "
                        "DataLoader stacks tensors. augment_pil returns one.")
        if image.dtype != torch.uint8:
            raise Wrong(f"dataset[{i}]'s image is {image.dtype}: leave it uint8 (0-255). The "
                        "workers then hand over a quarter of the bytes, and the GPU normalises.")
        if tuple(image.shape) != (3, _P_SIZE, _P_SIZE):
            raise Wrong(f"dataset[{i}]'s image has shape {tuple(image.shape)}; the crop is "
                        f"(3, size, size) = (3, {_P_SIZE}, {_P_SIZE}): pass size to augment_pil.")
        if int(label) != labels[i]:
            raise Wrong(f"dataset[{i}]'s label is {label!r}, but file {i} is in class {labels[i]}: "
                        "return self.labels[i], the label of the same file.")
        if not torch.equal(image, want[0]):
            raise Wrong(f"dataset[{i}]'s pixels are not those of file {i} cropped by augment_pil: "
                        "read self.files[i] with load_rgb and augment it, once, in __getitem__.")
    return ref


def _check_loader(make_loader, ref) -> None:
    for device in ("cuda", "cpu"):
        try:
            loader = make_loader(ref, _P_BATCH, _P_WORKERS, device)
        except Exception as exc:
            raise Wrong(f"make_loader(dataset, {_P_BATCH}, {_P_WORKERS}, {device!r}) raised "
                        f"{type(exc).__name__}: {exc}") from None
        if loader is Ellipsis or loader is None:
            raise Wrong("make_loader returns nothing yet: build the DataLoader and return it.")
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise Wrong(f"make_loader returned {type(loader).__name__}; return a "
                        "torch.utils.data.DataLoader.")
        if loader.batch_size != _P_BATCH:
            raise Wrong(f"the loader's batch_size is {loader.batch_size}, not the {_P_BATCH} "
                        "make_loader was given.")
        if not isinstance(loader.sampler, torch.utils.data.RandomSampler):
            raise Wrong("the loader does not shuffle: every epoch would see the files in the same "
                        "order. Pass shuffle=True.")
        if not loader.drop_last:
            raise Wrong("the last batch of an epoch can be short: pass drop_last=True, so every "
                        "step has the same shape (a short batch makes cudnn.benchmark search again).")
        if loader.num_workers != _P_WORKERS:
            raise Wrong(f"the loader has num_workers={loader.num_workers}, not the {_P_WORKERS} it "
                        "was given: with 0 the main process decodes every image and the GPU waits.")
        if device == "cuda" and not loader.pin_memory:
            raise Wrong("for a GPU the batches are not in pinned (page-locked) memory: pass "
                        "pin_memory=True, or the non_blocking copy cannot run asynchronously.")
        if device == "cpu" and loader.pin_memory:
            raise Wrong("for the CPU the loader pins memory: pinning only helps a copy to a GPU; "
                        "pin only when the device is CUDA.")
    try:
        images, labels = next(iter(make_loader(ref, _P_BATCH, 0, "cpu")))
    except Exception as exc:
        raise Wrong(f"taking a batch from make_loader(dataset, {_P_BATCH}, 0, 'cpu') raised "
                    f"{type(exc).__name__}: {exc}") from None
    if tuple(images.shape) != (_P_BATCH, 3, _P_SIZE, _P_SIZE):
        raise Wrong(f"a batch has shape {tuple(images.shape)}, expected {(_P_BATCH, 3, _P_SIZE, _P_SIZE)}.")


def _check_to_model(to_model) -> str:
    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (_P_BATCH, 3, _P_SIZE, _P_SIZE), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 2, (_P_BATCH,), generator=g)
    _Recorded.moves = []
    try:
        out = to_model(images.as_subclass(_Recorded), labels.as_subclass(_Recorded), "cpu")
    except Exception as exc:
        raise Wrong(f"to_model(images, labels, 'cpu') raised {type(exc).__name__}: {exc}") from None
    moves = list(_Recorded.moves)
    if out is Ellipsis or out is None:
        raise Wrong("to_model returns nothing yet: return the (images, labels) on the device.")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise Wrong(f"to_model returned {type(out).__name__}; return (images, labels).")
    x, y = (t.as_subclass(torch.Tensor) if isinstance(t, torch.Tensor) else t for t in out)
    if len(moves) < 2:
        raise Wrong("the batch is not on the device before the model sees it: copy the images and "
                    "the labels with .to(device, non_blocking=True).")
    if moves[0]["dtype"] != torch.uint8:
        raise Wrong(f"the images reached the device as {moves[0]['dtype']}: convert after the copy, "
                    "not before, so the copy moves uint8, a quarter of the bytes.")
    if not all(m["non_blocking"] for m in moves):
        raise Wrong("a copy to the device is blocking: pass non_blocking=True, so the host queues "
                    "the copy and goes on (from pinned memory it then overlaps the GPU's work).")
    want = reference_to_model(images, labels, "cpu")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise Wrong(f"the images leave to_model as {getattr(x, 'dtype', type(x).__name__)}; give "
                    "the model float32 (autocast picks the lower precision per operation).")
    if not torch.allclose(x, want[0], atol=1e-4):
        raw = images.float()
        mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
        if torch.allclose(x, (raw - mean) / std, atol=1e-3):
            raise Wrong("you normalised 0-255 values with the 0-1 mean and std: divide by 255 first "
                        "(or use fp16lab.inputs.normalize, whose statistics are on the 0-255 scale).")
        if torch.allclose(x, raw, atol=1e-3) or torch.allclose(x, raw / 255, atol=1e-4):
            raise Wrong("the images are not normalised: subtract ImageNet's mean and divide by its "
                        "std per channel, on the device (fp16lab.inputs.normalize does it).")
        raise Wrong("the normalised values differ from (pixel/255 - mean) / std per channel.")
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise Wrong("the images are not channels_last: call .contiguous(memory_format="
                    "torch.channels_last), the layout tensor-core convolutions read fastest.")
    if not torch.equal(torch.as_tensor(y), labels):
        raise Wrong("the labels changed on the way: copy them as they are.")
    return "ok"


def _check_pipeline(answer: object) -> str:
    if not isinstance(answer, (tuple, list)) or len(answer) != 3:
        raise Wrong("give the three parts: pipeline.check((ImageDataset, make_loader, to_model)).")
    make_dataset, make_loader, to_model = answer
    if not all(callable(a) for a in answer):
        raise Wrong("each of the three must be a class or function, passed without calling it.")
    ref = _check_dataset(make_dataset)
    _check_loader(make_loader, ref)
    _check_to_model(to_model)
    return ("the dataset gives uint8 crops with their labels, the loader shuffles whole batches in "
            "worker processes into pinned memory, and the copy moves uint8 without waiting, then "
            "normalises on the device into channels_last: the pipeline of section 2.")


pipeline = Exercise(
    "pipeline", "Write ImageDataset (uint8 crops and labels of an image folder), make_loader "
                "(a DataLoader with workers and pinned memory) and to_model (the copy to the device "
                "and the normalisation there).", _check_pipeline,
    hint="The dataset: scan_image_folder in __init__, load_rgb then augment_pil in __getitem__. "
         "The loader: shuffle, drop_last, num_workers, pin_memory only for CUDA. The copy: "
         ".to(device, non_blocking=True) while still uint8, then normalize, then channels_last.",
    solution="One way to write the three parts.",
    solution_code=inspect.getsource(ReferenceDataset) + "\n\n" + inspect.getsource(reference_loader)
    + "\n\n" + inspect.getsource(reference_to_model))
