"""Notebook 07's pipeline check on a pipeline wrong in one part each (the reference with one
thing changed), reaching every message of the dataset, loader and copy checks."""

import pytest
import torch

from fp16lab.exercises import ch07 as ex

Ref, loader, to_model = ex.ReferenceDataset, ex.reference_loader, ex.reference_to_model


class ImageDataset(Ref):  # the name the learner's class has
    def __init__(self, root, size):
        raise OSError("no such folder")


class LenRaises(Ref):
    def __len__(self):
        raise TypeError("len broke")


class GetRaises(Ref):
    def __getitem__(self, i):
        if i > 0:
            raise IndexError("past the end")
        return super().__getitem__(i)


class OneThing(Ref):
    def __getitem__(self, i):
        return super().__getitem__(i)[0]


class Triple(Ref):
    def __getitem__(self, i):
        return (*super().__getitem__(i), 0)


class NotTensor(Ref):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return image.numpy(), label


class WrongShape(Ref):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return image[:, 1:, :], label


class WrongPixels(Ref):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return image.flip(-1), label


class NotALoader(list):
    batch_size = 2


def _loader_raises(dataset, batch_size, num_workers, device):
    raise RuntimeError("no loader today")


def _loader_list(dataset, batch_size, num_workers, device):
    return [dataset[0]]


def _loader_batch_plus_one(dataset, batch_size, num_workers, device):
    return loader(dataset, batch_size + 1, num_workers, device)


def _loader_bad_collate(dataset, batch_size, num_workers, device):
    out = loader(dataset, batch_size, num_workers, device)
    if num_workers == 0:
        out.collate_fn = lambda items: (_ for _ in ()).throw(ValueError("cannot stack"))
    return out


def _loader_cropped(dataset, batch_size, num_workers, device):
    out = loader(dataset, batch_size, num_workers, device)
    if num_workers == 0:
        collate = out.collate_fn
        out.collate_fn = lambda items: tuple(t[..., 1:] if t.dim() == 4 else t for t in collate(items))
    return out


def _to_model_raises(images, labels, device):
    raise RuntimeError("no device")


def _to_model_half(images, labels, device):
    x, y = to_model(images, labels, device)
    return x.half(), y


def _to_model_off(images, labels, device):
    x, y = to_model(images, labels, device)
    return x + 0.5, y


def _to_model_labels_changed(images, labels, device):
    x, y = to_model(images, labels, device)
    return x, y + 1


CASES = [
    ((ImageDataset, loader, to_model), "ImageDataset(root, size) raised OSError: no such folder"),
    ((LenRaises, loader, to_model), "len(dataset) raised TypeError: len broke; __len__ returns the number of files."),
    ((GetRaises, loader, to_model), "dataset[5] raised IndexError: past the end"),
    ((OneThing, loader, to_model), "dataset[0] returned Tensor; return a pair (image, label)."),
    ((Triple, loader, to_model), "dataset[0] returned tuple; return a pair (image, label)."),
    ((NotTensor, loader, to_model), "dataset[0]'s image is a ndarray, not a tensor"),
    ((WrongShape, loader, to_model), "dataset[0]'s image has shape (3, 15, 16); the crop is (3, size, size) = (3, 16, 16)"),
    ((WrongPixels, loader, to_model), "dataset[0]'s pixels are not those of file 0 cropped by augment_pil"),
    ((Ref, _loader_raises, to_model), "make_loader(dataset, 4, 2, 'cuda') raised RuntimeError: no loader today"),
    ((Ref, _loader_list, to_model), "make_loader returned list; return a torch.utils.data.DataLoader."),
    ((Ref, _loader_batch_plus_one, to_model), "the loader's batch_size is 5, not the 4 make_loader was given."),
    ((Ref, _loader_bad_collate, to_model), "taking a batch from make_loader(dataset, 4, 0, 'cpu') raised ValueError: cannot stack"),
    ((Ref, _loader_cropped, to_model), "a batch has shape (4, 3, 16, 15), expected (4, 3, 16, 16)."),
    ((Ref, loader, _to_model_raises), "to_model(images, labels, 'cpu') raised RuntimeError: no device"),
    ((Ref, loader, _to_model_half), "the images leave to_model as torch.float16; give the model float32"),
    ((Ref, loader, _to_model_off), "the normalised values differ from (pixel/255 - mean) / std per channel."),
    ((Ref, loader, _to_model_labels_changed), "the labels changed on the way: copy them as they are."),
]


@pytest.mark.parametrize("parts, message", CASES, ids=[m[:40] for _, m in CASES])
def test_pipeline_wrong_in_one_part(parts, message):
    fb = ex.pipeline.check(parts)
    assert not fb and message in fb.message, fb.message


@pytest.mark.parametrize("answer, start", [
    (4.99, "4.99x is the model's own speed-up"),
    (1.005, "1x would mean both precisions"),
    (0.749, "0.749 is fp32's rate over AMP's"),
    (3.74, "3.74 compares AMP's model with the pipeline"),
])
def test_q2_slips_written_to_two_or_three_figures(answer, start):
    fb = ex.q2.check(answer)
    assert not fb and fb.message.startswith(start), fb.message


def test_q4_rounded_mib_and_swapped():
    assert "MiB" in ex.q4.check((147.0, 36.8)).message
    assert "swapped" in ex.q4.check((38.5, 154.1)).message
    assert ex.q4.check((154.0, 38.5))  # within 1%


def test_q1_a_harmonic_mean_a_hair_off_is_still_named():
    fb = ex.q1.check(lambda a, b: 1 / (1 / a + 1 / b) * (1 + 1e-7))
    assert not fb and fb.message.startswith("you added the time per image of both sides")


def _copy_with(move):
    """to_model with the copy written by ``move`` (images and labels), the rest the reference's."""
    def to_model_(images, labels, device):
        images, labels = move(images, device), move(labels, device)
        return ex.normalize(images).contiguous(memory_format=torch.channels_last), labels
    return to_model_


@pytest.mark.parametrize("move", [
    lambda t, d: t.to(d, t.dtype, True),             # non_blocking given by position
    lambda t, d: t.to(device=d, non_blocking=True),  # the device by keyword
])
def test_to_model_copies_written_other_ways_pass(move):
    fb = ex.pipeline.check((Ref, loader, _copy_with(move)))
    assert fb, fb.message


@pytest.mark.parametrize("move, message", [
    (lambda t, d: t.cpu(), "a copy to the device is blocking"),
    (lambda t, d: t.to(d, t.dtype, False), "a copy to the device is blocking"),
    (lambda t, d: t.to(dtype=torch.float32).to(d, non_blocking=True) if t.dim() == 4 else
     t.to(d, non_blocking=True), "the images reached the device as torch.float32"),
])
def test_to_model_copies_that_are_wrong(move, message):
    fb = ex.pipeline.check((Ref, loader, _copy_with(move)))
    assert not fb and fb.message.startswith(message), fb.message


def test_to_model_what_comes_out():
    def three(images, labels, device):
        return (*to_model(images, labels, device), None)

    def as_list(images, labels, device):
        x, y = to_model(images, labels, device)
        return x.tolist(), y

    def a_hair_off(images, labels, device):
        x, y = to_model(images, labels, device)
        return x + 5e-5, y

    def only_scaled(images, labels, device):
        images = images.to(device, non_blocking=True)
        return (images.float() / 255).contiguous(memory_format=torch.channels_last), \
            labels.to(device, non_blocking=True)
    assert ex.pipeline.check((Ref, loader, three)).message == \
        "to_model returned tuple; return (images, labels)."
    assert ex.pipeline.check((Ref, loader, as_list)).message.startswith(
        "the images leave to_model as list; give the model float32")
    assert ex.pipeline.check((Ref, loader, a_hair_off))  # within 1e-4 of the normalised values
    assert ex.pipeline.check((Ref, loader, only_scaled)).message.startswith(
        "the images are not normalised")


def test_non_blocking_read_where_each_signature_puts_it():
    t, other = torch.ones(2), torch.zeros(1)
    assert ex._non_blocking("to", (t, "cpu", torch.float32, True), {})
    assert not ex._non_blocking("to", (t, "cpu", torch.float32, False), {})
    assert not ex._non_blocking("to", (t, "cpu", torch.float32), {})
    assert ex._non_blocking("to", (t, other, True), {})
    assert ex._non_blocking("cuda", (t, 0, True), {}) and not ex._non_blocking("cuda", (t, 0), {})
    assert not ex._non_blocking("cpu", (t, None, True), {})
    assert ex._non_blocking("to", (t,), {"device": "cpu", "non_blocking": True})
    assert not ex._non_blocking("to", (t, "cpu"), {"non_blocking": False})
