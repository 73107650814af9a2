"""Notebook 07's exercises, each with right and wrong answers."""

import math

import numpy as np

from fp16lab.exercises import ch07


def test_q1_training_rate_function():
    assert ch07.q1.check(lambda loader, model: min(loader, model))
    assert ch07.q1.check(lambda a, b: float(np.minimum(a, b)))
    added = ch07.q1.check(lambda a, b: 1 / (1 / a + 1 / b))
    assert not added and "overlap" in added.message
    faster = ch07.q1.check(lambda a, b: max(a, b))
    assert not faster and "slower one sets the pace" in faster.message
    only_loader = ch07.q1.check(lambda a, b: a)  # right for some pairs only
    assert not only_loader and "faster side" in only_loader.message
    mean = ch07.q1.check(lambda a, b: (a + b) / 2)
    assert not mean and "Which side waits" in mean.message
    summed = ch07.q1.check(lambda a, b: a + b)
    assert not summed and "added the two rates" in summed.message
    assert "ceiling" in ch07.q1.check(lambda a, b: min(a, b)).message
    assert "without calling it" in ch07.q1.check(800.0).message
    assert "two arguments" in ch07.q1.check(lambda a: a).message
    assert "return a number" in ch07.q1.check(lambda a, b: "fast").message
    assert "replace the ..." in ch07.q1.check(lambda a, b: ...).message


def test_q2_speed_up_on_real_input():
    right = min(800, 3000) / min(800, 600)
    assert ch07.q2.check(right) and ch07.q2.check(f"{right:.3f}")
    model_only = ch07.q2.check(3000 / 600)
    assert not model_only and "model's own speed-up" in model_only.message
    both_at_pipeline = ch07.q2.check(1.0)
    assert not both_at_pipeline and "slower side" in both_at_pipeline.message
    inverse = ch07.q2.check(600 / 800)
    assert not inverse and "fp32's rate over AMP's" in inverse.message
    against_pipeline = ch07.q2.check(3000 / 800)
    assert not against_pipeline and "Compare the two training loops" in against_pipeline.message
    other = ch07.q2.check(800 / 600 * 1.1)
    assert not other and "training_rate (q1)" in other.message
    assert "give a number" in ch07.q2.check("fast").message


def test_q3_workers_needed():
    right = math.ceil(3000 / 210)
    assert ch07.q3.check(right)
    short = ch07.q3.check(right - 1)
    assert not short and "the GPU would wait" in short.message
    assert "fewer" in ch07.q3.check(right + 3).message
    # np.ceil gives a float, an array's element a numpy integer: whole numbers all the same
    assert ch07.q3.check(float(right)) and ch07.q3.check(np.float64(right))
    assert ch07.q3.check(np.int64(right))
    for not_whole in (right + 0.5, True, str(right), float("nan")):
        f = ch07.q3.check(not_whole)
        assert not f and "whole number" in f.message


def test_q4_batch_bytes():
    elements = 256 * 3 * 224 * 224
    assert ch07.q4.check((elements * 4 / 1e6, elements / 1e6))
    assert ch07.q4.check([154.1, 38.5])
    mib = ch07.q4.check((elements * 4 / 2**20, elements / 2**20))
    assert not mib and "MiB" in mib.message
    assert not ch07.q4.check((elements * 2 / 1e6, elements / 1e6))  # fp16 size, not float32
    assert not ch07.q4.check((elements * 4 / 1e6, elements * 4 / 1e6))
    assert "two numbers" in ch07.q4.check(154.1).message
    assert "must be numbers" in ch07.q4.check(("a", "b")).message
    swapped = ch07.q4.check((elements / 1e6, elements * 4 / 1e6))
    assert not swapped and "swapped" in swapped.message


def test_solutions_and_hints_are_given_on_request():
    for q in (ch07.q1, ch07.q2, ch07.q3, ch07.q4):
        assert q.hint().kind == "hint" and q.hint().message
        assert q.solution().kind == "solution" and q.solution().message
    assert "min(" in ch07.q1.solution().code


# -- the pipeline: a Dataset, a DataLoader and the copy to the device ------------------------------
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from fp16lab.inputs import augment_pil, load_rgb, normalize, scan_image_folder  # noqa: E402

RIGHT = (ch07.ReferenceDataset, ch07.reference_loader, ch07.reference_to_model)


class ShortDataset(ch07.ReferenceDataset):
    def __len__(self):
        return len(self.files) - 1


class FloatDataset(ch07.ReferenceDataset):
    def __getitem__(self, i):
        return augment_pil(load_rgb(self.files[i]), self.size).float() / 255, self.labels[i]


class WrongLabel(ch07.ReferenceDataset):
    def __getitem__(self, i):
        return augment_pil(load_rgb(self.files[i]), self.size), 0


def _loader(**changes):
    def make_loader(dataset, batch_size, num_workers, device):
        kw = dict(batch_size=batch_size, shuffle=True, drop_last=True, num_workers=num_workers,
                  pin_memory=torch.device(device).type == "cuda")
        kw.update(changes)
        return DataLoader(dataset, **kw)
    return make_loader


def test_pipeline_right_answer():
    result = ch07.pipeline.check(RIGHT)
    assert result, result.message
    assert "pinned memory" in result.message


def test_pipeline_wrong_datasets_say_what_is_wrong():
    for dataset, words in ((ShortDataset, "number of files"), (FloatDataset, "leave it uint8"),
                           (WrongLabel, "return self.labels[i]")):
        result = ch07.pipeline.check((dataset, ch07.reference_loader, ch07.reference_to_model))
        assert not result and words in result.message, result.message


def test_pipeline_wrong_loaders_say_what_is_wrong():
    for changes, words in (({"shuffle": False}, "does not shuffle"), ({"drop_last": False}, "drop_last=True"),
                           ({"num_workers": 0}, "main process decodes"), ({"pin_memory": False}, "pinned"),
                           ({"pin_memory": True}, "pin only when")):
        result = ch07.pipeline.check((ch07.ReferenceDataset, _loader(**changes), ch07.reference_to_model))
        assert not result and words in result.message, (changes, result.message)


def test_pipeline_wrong_copies_say_what_is_wrong():
    def blocking(images, labels, device):
        return normalize(images.to(device)).contiguous(memory_format=torch.channels_last), labels.to(device)

    def float_first(images, labels, device):
        x = normalize(images).to(device, non_blocking=True)
        return x.contiguous(memory_format=torch.channels_last), labels.to(device, non_blocking=True)

    def never_moved(images, labels, device):
        return normalize(images).contiguous(memory_format=torch.channels_last), labels

    def not_normalised(images, labels, device):
        x = images.to(device, non_blocking=True).float()
        return x.contiguous(memory_format=torch.channels_last), labels.to(device, non_blocking=True)

    def wrong_scale(images, labels, device):
        x = images.to(device, non_blocking=True).float()
        mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
        return ((x - mean) / std).contiguous(memory_format=torch.channels_last), labels.to(device, non_blocking=True)

    def contiguous(images, labels, device):
        return normalize(images.to(device, non_blocking=True)), labels.to(device, non_blocking=True)

    for fn, words in ((blocking, "blocking"), (float_first, "convert after the copy"),
                      (never_moved, "not on the device before the model sees it"),
                      (not_normalised, "not normalised"), (wrong_scale, "divide by 255 first"),
                      (contiguous, "channels_last")):
        result = ch07.pipeline.check((ch07.ReferenceDataset, ch07.reference_loader, fn))
        assert not result and words in result.message, (fn.__name__, result.message)


def test_pipeline_asks_for_the_three_parts():
    assert "three parts" in ch07.pipeline.check(ch07.ReferenceDataset).message
    assert "solution" not in ch07.pipeline.hint().message.lower()
    assert "def reference_to_model" in ch07.pipeline.solution().code


def test_pipeline_unwritten_parts_are_named():
    class Unwritten(ch07.ReferenceDataset):
        def __len__(self):
            ...
    assert "__len__ returns nothing yet" in ch07.pipeline.check((Unwritten, ch07.reference_loader, ch07.reference_to_model)).message
    assert "returns nothing yet" in ch07.pipeline.check((ch07.ReferenceDataset, lambda *a: ..., ch07.reference_to_model)).message
    assert "returns nothing yet" in ch07.pipeline.check((ch07.ReferenceDataset, ch07.reference_loader, lambda *a: ...)).message
