"""Input backends end to end on small data sets, their checks, and the loader and training meters.

GPU tests (marker ``gpu``): nvJPEG decoding against PIL's libjpeg decoding of the same files,
the hardware JPEG engines (hw-decode) against nvJPEG, and every backend feeding real training
steps. The decode comparison is made in YCbCr (the
JFIF colour space a JPEG is coded in), because the JPEG standard (ITU-T T.81) and JFIF fix the
inverse DCT's accuracy and the colour conversion, but not how a decoder upsamples the 4:2:0
chroma planes (libjpeg interpolates, others repeat samples):

- luma is never subsampled, and Y = 0.299 R + 0.587 G + 0.114 B of a decoded RGB pixel is the
  decoder's Y exactly, whatever chroma it used (the Cb and Cr terms cancel), up to each
  decoder's rounding to uint8 (0.5 each) and the IDCT's allowed +-1: |dY| <= 2 on every pixel
  where neither decode clipped a channel at 0 or 255, and mean |dY| <= 0.5 over all;
- any upsampler interpolates between neighbouring chroma samples, so its Cb and Cr stay within
  the range the reference's chroma takes over the 5x5 pixels around (two chroma samples each
  way), plus the same 2 for rounding and IDCT: checked on every unclipped pixel.

The first H200 run measured RGB differences of mean 0.92-2.48 and max 12-25 on the 4:2:0 files
and exactly 0 on 4:4:4 files (so the IDCT and colour conversion agree); a CPU emulation of
the two upsamplings on the same pictures gives mean 1.4-2.7 and max 11-25, and passes these
checks, while a swapped channel or a picture shifted by one pixel fails them. The measured
differences are written to $OUT when it is set.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from fp16lab.inputs.augment import (IMAGENET_MEAN, IMAGENET_STD, augment_tensor,
                                    batch_generator, crop_params, draw_crops, flip_draw,
                                    normalize)
from fp16lab.inputs.dataset import CorruptImageError, load_rgb, make_image_folder, synthetic_photo
from fp16lab.inputs.feeding import (ProcessCpu, make_input_train_step, make_train_step,
                                    measure_loader, measure_training)
from fp16lab.inputs.gpu_decode import gpu_decode_pipeline
from fp16lab.inputs import (BACKENDS, REGISTRY, InputSettings, JpegFolder, default_workers,
                            make_input, unavailable_reason)
from fp16lab.inputs.settings import BACKEND_NAMES

LOW = (0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
HIGH = (1 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("in") / "set", images=16, classes=4,
                             size=(96, 72), seed=3, workers=1).root


@pytest.fixture
def corrupt(tmp_path):
    info = make_image_folder(tmp_path / "bad", images=8, classes=2, size=(64, 48), workers=1)
    victim = info.root / "class_01" / "img_000003.jpg"
    blob = victim.read_bytes()
    victim.write_bytes(blob[: len(blob) // 3])
    return info.root, victim


def _in_range(x: torch.Tensor) -> bool:
    lo = torch.tensor(LOW, dtype=torch.float32).view(1, 3, 1, 1) - 1e-4
    hi = torch.tensor(HIGH, dtype=torch.float32).view(1, 3, 1, 1) + 1e-4
    x = x.float().cpu()
    return bool(((x >= lo) & (x <= hi)).all())


def test_default_workers_is_three_quarters_of_the_cores():
    assert [default_workers(c) for c in (1, 2, 4, 6, 16, 64)] == [1, 1, 3, 4, 12, 48]


def test_synthetic_returns_one_batch_on_the_device():
    with make_input(InputSettings("synthetic", batch=4, image_size=16), device="cpu") as p:
        (x1, y1), (x2, y2) = next(p), next(p)
    assert x1.shape == (4, 3, 16, 16) and x1 is x2 and y1 is y2
    assert x1.is_contiguous(memory_format=torch.channels_last) and y1.dtype == torch.int64
    assert 0 <= int(y1.min()) and int(y1.max()) < 10


def test_dataset_item_equals_a_pil_numpy_reference(folder):
    """fp16lab's ImageFolder (used without torchvision): PIL decode, numpy crop and flip, PIL
    resize, numpy normalisation; the label is the index of the class folder in sorted order."""
    ds = JpegFolder(folder, 32, normalize_here=True)
    for i in (0, 5, 15):
        torch.manual_seed(100 + i)
        x, label = ds[i]
        torch.manual_seed(100 + i)
        pic = np.asarray(Image.open(ds.files[i]).convert("RGB"))
        top, left, h, w = crop_params(*pic.shape[:2])
        ref = np.asarray(Image.fromarray(pic[top:top + h, left:left + w]).resize((32, 32), Image.BILINEAR))
        if flip_draw():
            ref = ref[:, ::-1]
        ref = (ref / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
        np.testing.assert_allclose(x.permute(1, 2, 0).numpy(), ref, atol=1e-5)
        assert label == sorted(p.name for p in folder.iterdir() if p.is_dir()).index(ds.files[i].parent.name)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_end_to_end(folder, workers):
    s = InputSettings("dataloader", batch=4, image_size=32, num_workers=workers, seed=1)
    with make_input(s, folder, device="cpu") as p:
        assert "workers" in p.implementation and ("torchvision" in p.implementation
                                                  or "fp16lab JpegFolder" in p.implementation)
        batches = [next(p) for _ in range(8)]  # two epochs of 16 images
    for x, y in batches:
        assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.is_contiguous(memory_format=torch.channels_last) and _in_range(x)
    for epoch in (batches[:4], batches[4:]):  # every image once per epoch: 4 of each class
        assert sorted(torch.cat([y for _, y in epoch]).tolist()) == sorted(list(range(4)) * 4)


def test_normalising_on_the_gpu_side_gives_the_same_batch(folder):
    out = {}
    for where in ("cpu", "gpu"):
        torch.manual_seed(0)
        s = InputSettings("dataloader", batch=4, image_size=32, num_workers=0, normalize_on=where)
        with make_input(s, folder, device="cpu") as p:
            out[where] = [next(p) for _ in range(3)]
    for (xc, yc), (xg, yg) in zip(out["cpu"], out["gpu"]):
        assert torch.equal(yc, yg) and xg.dtype == torch.float32
        assert xg.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(xc, xg, rtol=0, atol=1e-5)


def test_dataloader_runs_epochs_back_to_back(folder):
    """One long pass of shuffled epochs: with 16 images and batches of 6, a batch may hold the
    end of one epoch and the start of the next, and every image comes once per 16."""
    s = InputSettings("dataloader", batch=6, image_size=16, num_workers=0, seed=2)
    with make_input(s, folder, device="cpu") as p:
        ys = torch.cat([next(p)[1] for _ in range(8)]).tolist()  # three epochs
    for e in range(3):
        assert sorted(ys[16 * e:16 * (e + 1)]) == sorted(list(range(4)) * 4)


def _per_picture_reference(files, seed, k):
    """Batch k of files, augmented one picture at a time with PIL pixels (the oracle)."""
    pics = [torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1) for f in files]
    crops, flips = draw_crops([q.shape[1] for q in pics], [q.shape[2] for q in pics],
                              batch_generator(seed, k))
    return normalize(torch.stack([augment_tensor(q, 24, tuple(c), bool(f))
                                  for q, c, f in zip(pics, crops, flips)]))


def _pil_decode(blobs, paths, device):
    import io
    return [torch.from_numpy(np.array(load_rgb(io.BytesIO(b.numpy().tobytes())))).permute(2, 0, 1)
            for b in blobs]


def test_gpu_decode_plumbing_with_a_cpu_decoder(folder):
    """The gpu-decode backend's reader threads, ordering and labels, with PIL standing in for nvJPEG."""
    s = InputSettings("gpu-decode", batch=8, image_size=24, num_workers=2, seed=4)
    with gpu_decode_pipeline(s, folder, "cpu", decode=_pil_decode) as p:
        batches = [next(p) for _ in range(4)]
    for x, y in batches:
        assert x.shape == (8, 3, 24, 24) and _in_range(x)
    for epoch in (batches[:2], batches[2:]):
        assert sorted(torch.cat([y for _, y in epoch]).tolist()) == sorted(list(range(4)) * 4)


def _pil_one(blob, path):
    return _pil_decode([blob], [path], "cpu")[0]


def test_gpu_decode_with_a_cpu_share_gives_the_same_batches(folder):
    """The CPU's share of each batch (its last files) goes to cpu_decode, the rest to decode;
    with the same decoder on both sides the batches are the ones of an all-GPU decode."""
    s = InputSettings("gpu-decode", batch=8, image_size=24, num_workers=3, seed=7)
    runs, counts = {}, {}
    for share in (0.0, 0.5, 0.75):
        seen = {"gpu": [], "cpu": 0}

        def decode(blobs, paths, device):
            seen["gpu"].append(len(blobs))
            return _pil_decode(blobs, paths, device)

        def one(blob, path):
            seen["cpu"] += 1
            return _pil_one(blob, path)

        with gpu_decode_pipeline(replace(s, cpu_decode_share=share), folder, "cpu", decode=decode,
                                 cpu_decode=one, producers=1, depth=1) as p:
            runs[share] = [next(p) for _ in range(3)]
            assert (share > 0) == ("decoded on the CPU" in p.implementation)
        counts[share] = (seen["gpu"][:3], seen["cpu"])
    assert counts[0.0][0] == [8, 8, 8] and counts[0.0][1] == 0
    assert counts[0.5][0] == [4, 4, 4] and counts[0.5][1] >= 12
    assert counts[0.75][0] == [2, 2, 2] and counts[0.75][1] >= 18
    for share in (0.5, 0.75):
        for (x0, y0), (x, y) in zip(runs[0.0], runs[share]):
            assert torch.equal(x0, x) and torch.equal(y0, y)


def test_decode_on_cpu_matches_pil_and_names_a_broken_file(folder, tmp_path):
    pytest.importorskip("torchvision", reason="decode_on_cpu decodes with torchvision")
    from fp16lab.inputs.gpu_decode import decode_on_cpu

    f = sorted(folder.rglob("*.jpg"))[0]
    blob = torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8)
    got = decode_on_cpu(blob, f)
    want = torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1)
    assert got.shape == want.shape and got.dtype == torch.uint8
    assert float((got.float() - want.float()).abs().mean()) < 1.0  # both libjpeg: rounding only
    empty = torch.tensor([0xFF, 0xD8, 0xFF, 0xD9], dtype=torch.uint8)  # start and end, no picture
    with pytest.raises(CorruptImageError, match=f"cannot decode image file {tmp_path / 'x.jpg'}"):
        decode_on_cpu(empty, tmp_path / "x.jpg")


def _gpu_decode_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fp16lab-gpu-decode")]


def test_gpu_decode_batches_do_not_depend_on_the_producer_threads(folder):
    """Batch k is the same whichever thread made it and however many there are (crops seeded
    by (seed, k)), across an epoch boundary (16 images, batches of 8)."""
    s = InputSettings("gpu-decode", batch=8, image_size=24, num_workers=2, seed=5)
    runs = []
    for producers, depth in ((1, 1), (3, 5)):
        with gpu_decode_pipeline(s, folder, "cpu", decode=_pil_decode, producers=producers,
                         depth=depth) as p:
            runs.append([next(p) for _ in range(5)])
    for (x1, y1), (x2, y2) in zip(*runs):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(runs[0][0][0], runs[0][2][0])  # epoch 2 is a new order and new crops


def test_gpu_decode_batch_is_the_per_picture_augmentation_of_its_files(folder):
    """Batch k against torch's per-picture resize (augment_tensor) of the files the decoder was
    given, with batch k's draws (batch_generator(seed, k)); labels from the class folders."""
    s = InputSettings("gpu-decode", batch=8, image_size=24, num_workers=3, seed=6)
    given = []

    def decode(blobs, paths, device):
        given.append(list(paths))
        return _pil_decode(blobs, paths, device)

    with gpu_decode_pipeline(s, folder, "cpu", decode=decode, producers=1, depth=1) as p:
        batches = [next(p) for _ in range(4)]
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    for k, (x, y) in enumerate(batches):
        assert x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x, _per_picture_reference(given[k], s.seed, k), rtol=0, atol=5e-4)
        assert y.tolist() == [classes.index(f.parent.name) for f in given[k]]
    epochs = [given[0] + given[1], given[2] + given[3]]
    assert all(len(set(e)) == 16 for e in epochs)  # every file once per epoch
    assert epochs[0] != epochs[1]  # in a new order each epoch


def test_gpu_decode_close_leaves_no_threads(folder, corrupt):
    s = InputSettings("gpu-decode", batch=8, image_size=16, num_workers=3)
    with gpu_decode_pipeline(s, folder, "cpu", decode=_pil_decode) as p:
        next(p)
        assert any(n.startswith("fp16lab-gpu-decode-read") for n in _gpu_decode_threads())
        assert sum(n.startswith("fp16lab-gpu-decode-") and "read" not in n
                   for n in _gpu_decode_threads()) == 2
        stages = p.stage_seconds()
    assert _gpu_decode_threads() == []
    assert stages["batches"] >= 1 and min(stages[k] for k in ("read_s", "decode_s", "augment_s")) > 0
    root, victim = corrupt  # also after a failed batch
    with gpu_decode_pipeline(s, root, "cpu", decode=_pil_decode) as p, pytest.raises(CorruptImageError):
        next(p)
    assert _gpu_decode_threads() == []


# ------------------------------------------- hw-decode, with a PIL stand-in for nvImageCodec


class _FakeNvImgCodec:
    """The part of ``nvidia.nvimgcodec`` that hw-decode uses, decoding with PIL on the CPU.

    ``Decoder.decode`` returns, like nvImageCodec's, one object per code stream (None where it
    cannot decode) exposing an (H, W, 3) uint8 buffer through DLPack, with rows padded (a
    strided view) as nvImageCodec's may be. It records each Decoder's backends and calls."""

    class BackendKind:
        HW_GPU_ONLY, GPU_ONLY = "HW_GPU_ONLY", "GPU_ONLY"

    class ColorSpec:
        SRGB = "SRGB"

    class SampleFormat:
        I_RGB, P_RGB = "I_RGB", "P_RGB"

    class Backend:
        def __init__(self, kind):
            self.backend_kind = kind

    class DecodeParams:
        def __init__(self, **kw):
            self.kw = kw

    class CodeStream:
        def __init__(self, array):
            self.data = np.asarray(array, dtype=np.uint8).tobytes()

    def __init__(self):
        self.decoders, self.calls = [], []
        fake = self

        class Decoder:
            def __init__(self, device_id, backends):
                self.device_id, self.backends = device_id, backends
                fake.decoders.append(self)

            def decode(self, streams, params=None, cuda_stream=0):
                fake.calls.append((threading.current_thread().name, len(streams), params.kw))
                return [fake.picture(cs.data) for cs in streams]

        self.Decoder = Decoder

    @staticmethod
    def picture(data):
        import io
        try:
            rgb = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
        except Exception:
            return None
        padded = np.zeros((rgb.shape[0], rgb.shape[1] + 5, 3), np.uint8)  # rows padded
        padded[:, :rgb.shape[1]] = rgb
        return padded[:, :rgb.shape[1]]


@pytest.fixture
def fake_nvimgcodec(monkeypatch):
    from fp16lab.inputs import hw_decode

    fake = _FakeNvImgCodec()
    monkeypatch.setattr(hw_decode, "nvimgcodec", lambda: fake)
    return fake


def test_hw_decode_plumbing_with_a_pil_decoder_equals_the_per_picture_augmentation(
        folder, fake_nvimgcodec):
    """hw-decode's batches with PIL standing in for the hardware decoder: equal to the
    gpu-decode pipeline fed the same pictures (the shared crop, flip and normalisation), and
    to torch's per-picture augmentation of the files; one HW_GPU_ONLY Decoder per producer
    thread, asked for interleaved RGB without EXIF rotation."""
    from fp16lab.inputs.hw_decode import HW_DECODER, hw_decode_pipeline

    s = InputSettings("hw-decode", batch=8, image_size=24, num_workers=2, seed=6)
    with hw_decode_pipeline(s, folder, "cpu", producers=2, depth=3) as p:
        batches = [next(p) for _ in range(4)]
        assert p.implementation.startswith(HW_DECODER) and "2 reader threads" in p.implementation
    given = []

    def decode(blobs, paths, device):
        given.append(list(paths))
        return _pil_decode(blobs, paths, device)

    with gpu_decode_pipeline(replace(s, backend="gpu-decode"), folder, "cpu", decode=decode,
                             producers=1, depth=1) as p:
        same = [next(p) for _ in range(4)]
    for (x, y), (x0, y0) in zip(batches, same):
        assert torch.equal(x, x0) and torch.equal(y, y0)
    for k, (x, y) in enumerate(batches):
        torch.testing.assert_close(x, _per_picture_reference(given[k], s.seed, k), rtol=0, atol=5e-4)
    fake = fake_nvimgcodec
    assert 1 <= len(fake.decoders) <= 2  # one per producer thread that decoded
    assert all([b.backend_kind for b in d.backends] == ["HW_GPU_ONLY"] for d in fake.decoders)
    assert all(n == 8 and kw == dict(apply_exif_orientation=False, color_spec="SRGB",
                                     sample_format="I_RGB") for _, n, kw in fake.calls)
    assert len({name for name, _, _ in fake.calls}) == len(fake.decoders)


def test_hw_decode_with_a_cpu_share_sends_only_the_rest_to_the_engines(folder, fake_nvimgcodec):
    """hw-decode with half of each batch decoded on the CPU: the engines get the first half of
    each batch's files, the CPU the rest, and the batches equal an all-engine decode's."""
    from fp16lab.inputs.hw_decode import hw_decode_pipeline

    s = InputSettings("hw-decode", batch=8, image_size=24, num_workers=2, seed=5)
    on_cpu = []

    def one(blob, path):
        on_cpu.append(path)
        return _pil_one(blob, path)

    with hw_decode_pipeline(s, folder, "cpu", producers=1, depth=1) as p:
        whole = [next(p) for _ in range(3)]
    calls_whole = len(fake_nvimgcodec.calls)
    with hw_decode_pipeline(replace(s, cpu_decode_share=0.5), folder, "cpu", cpu_decode=one,
                            producers=1, depth=1) as p:
        halves = [next(p) for _ in range(3)]
        assert "50% decoded on the CPU" in p.implementation
    sizes = [n for _, n, _ in fake_nvimgcodec.calls[calls_whole:]]
    assert sizes[:3] == [4, 4, 4] and len(on_cpu) >= 12
    for (x0, y0), (x, y) in zip(whole, halves):
        assert torch.equal(x0, x) and torch.equal(y0, y)


def test_hw_decode_names_a_file_it_cannot_decode(folder, corrupt, fake_nvimgcodec, tmp_path):
    """A file that passes the readers' marker check but does not decode is named: as corrupt
    where PIL cannot decode it either, as unsupported by the hardware (no fall-back) where it
    can."""
    from fp16lab.inputs.hw_decode import HwDecoder, hw_decode_pipeline

    root, victim = corrupt
    victim.write_bytes(b"\xff\xd8\xff\xd9")  # start and end markers, no picture
    s = InputSettings("hw-decode", batch=8, image_size=16, num_workers=2)
    with hw_decode_pipeline(s, root, "cpu") as p, \
            pytest.raises(CorruptImageError, match=f"cannot decode image file {victim}"):
        next(p)
    assert _gpu_decode_threads() == []
    good = sorted(folder.rglob("*.jpg"))[0]
    blob = torch.frombuffer(bytearray(good.read_bytes()), dtype=torch.uint8)
    fake_nvimgcodec.picture = lambda data: None  # the hardware refuses a file PIL decodes
    with pytest.raises(RuntimeError, match=f"hardware JPEG decoder cannot decode image file {good}"):
        HwDecoder()([blob], [good], "cpu")


def test_hw_decode_unavailable_reasons(monkeypatch):
    from fp16lab.inputs import hw_decode

    assert "CUDA GPU" in unavailable_reason("hw-decode", "cpu")

    def missing():
        raise ImportError("No module named 'nvidia.nvimgcodec'")

    monkeypatch.setattr(hw_decode, "nvimgcodec", missing)
    reason = hw_decode.hw_decode_unavailable("cuda")
    assert "nvidia-nvimgcodec-cu13" in reason and "nvidia-nvimgcodec-cu12" in reason


def test_hw_decode_probe_says_when_the_gpu_has_no_jpeg_engines(monkeypatch, fake_nvimgcodec):
    """The probe decodes one small JPEG on the hardware backend: a GPU without the engines
    (the backend decodes nothing) or a decoder that fails to start is named as the reason."""
    from fp16lab.inputs import hw_decode

    monkeypatch.setattr(hw_decode, "_hw_probe", hw_decode._hw_probe.__wrapped__)  # no cache
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "GeForce RTX 4090")
    assert hw_decode.hw_decode_unavailable("cuda:0") is None  # PIL decodes the probe
    fake_nvimgcodec.picture = lambda data: None
    reason = hw_decode.hw_decode_unavailable("cuda:0")
    assert "RTX 4090" in reason and "no hardware JPEG decoder" in reason

    def broken(device_index):
        raise RuntimeError("nvjpegCreateEx failed")

    monkeypatch.setattr(hw_decode, "new_decoder", broken)
    assert "failed to start on GPU 0: RuntimeError: nvjpegCreateEx failed" in \
        hw_decode.hw_decode_unavailable("cuda:0")


@pytest.mark.parametrize("change, error, match", [
    (dict(backend="dvd"), ValueError, "backend must be one of 'synthetic', 'dataloader'"),
    (dict(batch=0), ValueError, "batch must be >= 1"),
    (dict(num_workers=-1), ValueError, "num_workers must be >= 0"),
    (dict(normalize_on="tpu"), ValueError, "normalize_on must be one of 'cpu', 'gpu'"),
    (dict(pin_memory="yes"), TypeError, "pin_memory must be True or False"),
    (dict(batch=17), ValueError, "has 16 images, fewer than one batch of 17"),
    (dict(backend="gpu-decode"), RuntimeError, "gpu-decode decodes with nvJPEG on a CUDA GPU"),
    (dict(backend="dali", num_workers=0), ValueError, "dali needs num_workers >= 1"),
    (dict(backend="hw-decode", num_workers=0), ValueError, "hw-decode needs num_workers >= 1"),
    (dict(backend="hw-decode"), RuntimeError, "hw-decode decodes on the hardware JPEG engines"),
    (dict(backend="gpu-decode", cpu_decode_share=1.0), ValueError, "cpu_decode_share must be >= 0 and < 1"),
    (dict(backend="gpu-decode", cpu_decode_share="half"), TypeError, "cpu_decode_share must be a number"),
    (dict(cpu_decode_share=0.25), ValueError, "cpu_decode_share applies to the gpu-decode and hw-decode backends only"),
    (dict(backend="dali", cpu_decode_share=0.25), ValueError, "cpu_decode_share applies to the gpu-decode and hw-decode"),
    # a share is valid for hw-decode: the check goes on to the missing engines
    (dict(backend="hw-decode", cpu_decode_share=0.25), RuntimeError, "hw-decode decodes on the hardware JPEG engines"),
])
def test_bad_settings_fail_before_any_work(folder, change, error, match):
    with pytest.raises(error, match=match):  # the settings' own fields: as they are made
        s = InputSettings(**{**dict(backend="dataloader", batch=4), **change})
        make_input(s, folder, device="cpu")


def test_the_settings_know_every_backend_the_registry_builds():
    assert tuple(REGISTRY) == BACKEND_NAMES


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'gone'} does not exist"):
        make_input(InputSettings("dataloader", batch=2), tmp_path / "gone", device="cpu")
    with pytest.raises(ValueError, match="pass root= an image folder"):
        make_input(InputSettings("dataloader", batch=2), None, device="cpu")


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_jpeg_raises_from_the_step_naming_the_file(corrupt, workers):
    root, victim = corrupt
    s = InputSettings("dataloader", batch=8, image_size=32, num_workers=workers)
    step, pipeline = make_input_train_step("small_cnn", "fp32", s, root, device="cpu")
    with pipeline, pytest.raises(CorruptImageError, match=str(victim)):
        step()


def test_a_dataloader_worker_process_names_the_corrupt_file_as_the_main_process_does(corrupt):
    """With worker processes the DataLoader re-raises a worker's error as "Caught
    CorruptImageError in DataLoader worker process 0" and a traceback; the row's error is the
    worker's own message, the same as with no worker processes."""
    root, victim = corrupt
    rows = [measure_loader(InputSettings("dataloader", batch=8, image_size=32, num_workers=w),
                           root, device="cpu", warmup=0, steps=1) for w in (0, 2)]
    assert rows[0]["error"].startswith(f"CorruptImageError: cannot decode image file {victim}")
    assert rows[1]["status"] == "error" and rows[1]["error"] == rows[0]["error"]


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_corrupt_jpeg_in_gpu_decode_reader_is_named(corrupt, share):
    root, victim = corrupt
    s = InputSettings("gpu-decode", batch=8, image_size=16, num_workers=2, cpu_decode_share=share)
    with gpu_decode_pipeline(s, root, "cpu", decode=_pil_decode, cpu_decode=_pil_one) as p, \
            pytest.raises(CorruptImageError, match=f"{victim} is cut short"):
        next(p)
    assert _gpu_decode_threads() == []


def test_a_sweep_records_error_and_goes_on(corrupt, folder):
    root, victim = corrupt
    s = InputSettings("dataloader", batch=4, image_size=32, num_workers=0)
    rows = [measure_training("small_cnn", "fp32", InputSettings("dataloader", batch=8, image_size=32,
                                                                 num_workers=0), root, device="cpu",
                             warmup=0, steps=1),
            measure_training("small_cnn", "fp32", s, folder, device="cpu", warmup=1, steps=2),
            measure_loader(InputSettings("dali", batch=4), folder, device="cpu")]
    assert rows[0]["status"] == "error" and str(victim) in rows[0]["error"]
    assert "CorruptImageError" in rows[0]["error"]
    ok = rows[1]
    assert ok["status"] == "ok" and ok["images_per_s"] == pytest.approx(2 * 4 / ok["seconds"])
    assert rows[2]["status"] == "skipped" and "CUDA GPU" in rows[2]["error"]
    json.dumps(rows)  # rows go into a result file as they are


def test_unavailable_reasons():
    assert unavailable_reason("synthetic", "cpu") is None and unavailable_reason("dataloader", "cpu") is None
    for b in ("gpu-decode", "hw-decode", "dali"):
        assert "CUDA GPU" in unavailable_reason(b, "cpu")
    with pytest.raises(ValueError, match="backend must be one of"):
        unavailable_reason("tape", "cpu")
    assert set(BACKENDS) == {"synthetic", "dataloader", "gpu-decode", "hw-decode", "dali"}


def test_train_step_fp32_is_one_sgd_step_with_momentum():
    """One step against torch's own autograd and the SGD update written out: p - lr * grad."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))
    ref = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    x, y = torch.randn(5, 3, 8, 8), torch.randint(0, 10, (5,))
    make_train_step("fp32", model, device="cpu")(x, y)
    h = torch.nn.functional.conv2d(x, ref[0], ref[1]).flatten(1)
    loss = torch.nn.functional.cross_entropy(h @ ref[2].T + ref[3], y)
    grads = torch.autograd.grad(loss, ref)
    for p, r, g in zip(model.parameters(), ref, grads):
        torch.testing.assert_close(p.detach(), r.detach() - 0.01 * g, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        make_train_step("fp8", model, device="cpu")


def test_train_step_takes_the_fused_optimizer_and_refuses_unknown_ones(folder):
    """sgd-fused gives the same update as plain SGD (torch's fused kernel, no host sync)."""
    torch.manual_seed(0)
    a = torch.nn.Linear(6, 3)
    b = torch.nn.Linear(6, 3)
    b.load_state_dict(a.state_dict())
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 0])
    plain, fused = (make_train_step("fp32", a, device="cpu"),
                    make_train_step("fp32", b, device="cpu", optimizer="sgd-fused"))
    assert fused.optimizer.defaults["fused"] is True and not plain.optimizer.defaults["fused"]
    for _ in range(2):  # the second step uses the momentum buffers
        plain(x, y), fused(x, y)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="unknown optimizer 'adam'; known: sgd, sgd-fused"):
        make_train_step("fp32", a, device="cpu", optimizer="adam")
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):  # before any work starts
        measure_training("small_cnn", "fp32", InputSettings("dataloader", batch=4, image_size=32),
                         folder, device="cpu", optimizer="adam")
    row = measure_training("small_cnn", "amp-bf16", InputSettings("dataloader", batch=4, image_size=32,
                                                                   num_workers=0),
                           folder, device="cpu", warmup=0, steps=1, optimizer="sgd-fused")
    assert row["status"] == "ok" and row["optimizer"] == "sgd-fused", row["error"]


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_process_cpu_counts_children_like_psutil():
    psutil = pytest.importorskip("psutil", reason="psutil is the oracle here")
    me = psutil.Process()

    def tree() -> float:
        procs = [me] + me.children(recursive=True)
        return sum(sum(p.cpu_times()[:2]) for p in procs)

    child = multiprocessing.get_context("fork").Process(target=_spin, args=(2.0,))
    child.start()
    time.sleep(0.2)
    meter, t0, c0 = ProcessCpu().start(), time.perf_counter(), tree()
    time.sleep(0.6)
    got, c1, wall = meter.stop(), tree(), time.perf_counter() - t0
    child.join()
    assert got["cpu_cores_busy"] == pytest.approx((c1 - c0) / wall, abs=0.1)
    assert got["cpu_cores_busy"] > 0.2  # the spinning child is counted
    assert got["cpu_util_pct"] == pytest.approx(100 * got["cpu_cores_busy"] / len(os.sched_getaffinity(0)))


# --------------------------------------------------------------------------- GPU


def _decode_diffs(paths):
    from torchvision.io import ImageReadMode, decode_jpeg

    blobs = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p in paths]
    gpu = decode_jpeg(blobs, mode=ImageReadMode.RGB, device="cuda")
    out = []
    for p, g in zip(paths, gpu):
        ref = torch.from_numpy(np.asarray(Image.open(p).convert("RGB")).copy()).permute(2, 0, 1)
        assert g.shape == ref.shape and g.dtype == torch.uint8 and g.is_cuda
        out.append(_decode_agreement(ref, g.cpu()))
    return out


def _record(name: str, payload) -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(payload, indent=1))
    print(name, payload)


# ------------------------------------------------- the decode comparison, in the JPEG's YCbCr


def _ycbcr(rgb: torch.Tensor) -> torch.Tensor:
    """Returns JFIF's full-range Y, Cb, Cr (float64, shape (3, H, W)) of a uint8 RGB picture."""
    r, g, b = rgb.double()
    return torch.stack([0.299 * r + 0.587 * g + 0.114 * b,
                        128 - 0.168736 * r - 0.331264 * g + 0.5 * b,
                        128 + 0.5 * r - 0.418688 * g - 0.081312 * b])


def _rgb(ycc: torch.Tensor) -> torch.Tensor:
    """Returns the uint8 RGB picture of JFIF Y, Cb, Cr planes (rounded, clipped)."""
    y, cb, cr = ycc.double()
    rgb = torch.stack([y + 1.402 * (cr - 128), y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128),
                       y + 1.772 * (cb - 128)])
    return rgb.round().clamp(0, 255).to(torch.uint8)


#: Rounding to uint8 in each of two decodes (0.5 each) plus the IDCT's +-1 allowed by T.81.
DECODE_SLACK = 2.0


def _decode_agreement(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    """Returns how two uint8 RGB decodes (3, H, W) of one JPEG differ, luma and chroma apart."""
    a, b = _ycbcr(ref), _ycbcr(got)
    d = (a - b).abs()
    clipped = ((ref == 0) | (ref == 255) | (got == 0) | (got == 255)).any(0)
    # the reference chroma's range over the 5x5 pixels around each pixel
    c = a[1:][None]
    local = (F.max_pool2d(c, 5, 1, 2) + F.max_pool2d(-c, 5, 1, 2))[0]
    excess = (d[1:] - local - DECODE_SLACK).clamp(min=0)[:, ~clipped]
    return {"rgb_max": float((ref.int() - got.int()).abs().max()),
            "rgb_mean": float((ref.int() - got.int()).abs().float().mean()),
            "luma_mean": float(d[0].mean()),
            "luma_max_unclipped": float(d[0][~clipped].max()) if (~clipped).any() else 0.0,
            "chroma_mean": float(d[1:].mean()),
            "chroma_outside_envelope": float(excess.max()) if excess.numel() else 0.0,
            "clipped_share": float(clipped.double().mean())}


def _same_picture(stats: dict[str, float]) -> bool:
    """True when two decodes differ only as JPEG decoders may (see the module docstring)."""
    return (stats["luma_mean"] <= 0.5 and stats["luma_max_unclipped"] <= DECODE_SLACK
            and stats["chroma_outside_envelope"] == 0.0)


def _two_upsamplings(seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns one picture's 4:2:0 chroma upsampled two ways, as two uint8 RGB decodes.

    The JFIF coding path without the DCT: RGB to YCbCr, Cb and Cr averaged over 2x2 pixels,
    then upsampled by interpolation (libjpeg's way) and by repetition (another decoder's).
    """
    rgb = torch.from_numpy(synthetic_photo(seed, index, (200, 150))).permute(2, 0, 1)
    ycc = _ycbcr(rgb)
    sub = F.avg_pool2d(ycc[1:][None], 2)
    smooth = F.interpolate(sub, size=rgb.shape[1:], mode="bilinear", align_corners=False)[0]
    blocky = F.interpolate(sub, size=rgb.shape[1:], mode="nearest")[0]
    return _rgb(torch.cat([ycc[:1], smooth])), _rgb(torch.cat([ycc[:1], blocky]))


@pytest.mark.parametrize("index", range(4))
def test_decode_check_allows_chroma_upsampling_and_nothing_else(index):
    ref, got = _two_upsamplings(7, index)
    stats = _decode_agreement(ref, got)
    # the emulated pair differs in RGB as much as nvJPEG and libjpeg did on the H200
    assert stats["rgb_mean"] > 0.9 and stats["rgb_max"] >= 10, stats
    assert _same_picture(stats), stats
    # oracle for the luma claim: the picture's own Y, untouched by chroma, within rounding
    assert stats["luma_max_unclipped"] <= 1.0, stats
    swapped = got[[2, 1, 0]]
    assert not _same_picture(_decode_agreement(ref, swapped))
    for shifted in (torch.roll(got, 1, dims=1), torch.roll(got, 1, dims=2)):
        assert not _same_picture(_decode_agreement(ref, shifted))
    cropped = torch.nn.functional.interpolate(got[None, :, 2:-2, 2:-2].float(), size=got.shape[1:],
                                              mode="bilinear", align_corners=False)[0]
    assert not _same_picture(_decode_agreement(ref, cropped.round().to(torch.uint8)))


@pytest.mark.gpu
def test_nvjpeg_decode_matches_libjpeg(tmp_path):
    pytest.importorskip("torchvision", reason="gpu-decode needs torchvision")
    info = make_image_folder(tmp_path / "imgs", images=16, classes=2, workers=4)
    subsampled = _decode_diffs(sorted(info.root.rglob("*.jpg")))
    full = []
    for i in range(6):
        p = tmp_path / f"full_{i}.jpg"
        Image.fromarray(synthetic_photo(9, i)).save(p, format="JPEG", quality=90, subsampling=0)
        full.append(p)
    unsubsampled = _decode_diffs(full)
    _record("nvjpeg_vs_libjpeg", {"4:2:0": subsampled, "4:4:4": unsubsampled})
    # no subsampling: only the IDCT and rounding may differ, on every channel
    assert max(d["rgb_max"] for d in unsubsampled) <= 4, unsubsampled
    assert max(d["rgb_mean"] for d in unsubsampled) <= 0.5, unsubsampled
    bad = [(i, d) for i, d in enumerate(subsampled + unsubsampled) if not _same_picture(d)]
    assert not bad, f"decodes that differ beyond chroma upsampling: {bad}"


@pytest.mark.gpu
def test_gpu_decode_backend_matches_the_per_picture_augmentation(folder):
    """The pipeline's batch against torch's own resize (augment_tensor) of the same decoded
    pictures, crop by crop with the same draws: only the batched fp16 resample differs, by at
    most half a level on the 0-255 scale (the decoder is checked against libjpeg above)."""
    pytest.importorskip("torchvision", reason="gpu-decode needs torchvision")
    from fp16lab.inputs.gpu_decode import decode_batch

    s = InputSettings("gpu-decode", batch=16, image_size=32, num_workers=2, seed=2)
    seen = []

    def decode(blobs, paths, device):  # nvJPEG, keeping the first batch's pictures
        pics = decode_batch(blobs, paths, device)
        if not seen:
            seen.append([p.cpu() for p in pics])
        return pics

    with gpu_decode_pipeline(s, folder, "cuda", decode=decode, producers=1, depth=1) as pipe:
        x, y = next(pipe)  # one producer: the first decode is batch 0's
    assert x.is_cuda and x.shape == (16, 3, 32, 32) and x.is_contiguous(memory_format=torch.channels_last)
    pics = seen[0]  # batch 0's draws: the generator of (seed, 0)
    crops, flips = draw_crops([q.shape[1] for q in pics], [q.shape[2] for q in pics],
                              batch_generator(s.seed, 0))
    ref = normalize(torch.stack([augment_tensor(q, 32, tuple(c), bool(f))
                                 for q, c, f in zip(pics, crops, flips)]))
    std255 = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    diff = ((x.cpu() - ref).abs() * std255)
    _record("gpu_decode_vs_per_picture_augmentation", {"max": float(diff.max()), "mean": float(diff.mean())})
    assert float(diff.max()) <= 0.5, float(diff.max())


def _hw_decode_ready():
    pytest.importorskip("torchvision", reason="the comparison decodes with nvJPEG (torchvision)")
    pytest.importorskip("nvidia.nvimgcodec", reason="hw-decode needs nvImageCodec (pip install "
                        "nvidia-nvimgcodec-cu13, or -cu12 for CUDA 12)")
    reason = unavailable_reason("hw-decode", "cuda")
    assert reason is None, reason  # these tests are for GPUs with JPEG engines (A100, H100, H200)


@pytest.mark.gpu
def test_hw_decode_matches_nvjpeg_and_names_a_corrupt_file(tmp_path):
    """The hardware engines against nvJPEG's CUDA decoder on the same files, by the decode
    check of the module docstring (any two JPEG decoders: luma within rounding and the IDCT's
    +-1, chroma within its upsampling envelope), and within the IDCT's and rounding's 4 levels
    (mean 0.5) where there is no chroma subsampling; then a corrupt file is named."""
    _hw_decode_ready()
    from torchvision.io import ImageReadMode, decode_jpeg

    from fp16lab.inputs.hw_decode import HwDecoder

    info = make_image_folder(tmp_path / "imgs", images=16, classes=2, workers=4)
    full = []
    for i in range(6):
        p = tmp_path / f"full_{i}.jpg"
        Image.fromarray(synthetic_photo(9, i)).save(p, format="JPEG", quality=90, subsampling=0)
        full.append(p)
    stats = {}
    for name, paths in (("4:2:0", sorted(info.root.rglob("*.jpg"))), ("4:4:4", full)):
        blobs = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p in paths]
        hw = HwDecoder()(blobs, paths, "cuda")
        ref = decode_jpeg(blobs, mode=ImageReadMode.RGB, device="cuda")
        torch.cuda.synchronize()
        for h, r in zip(hw, ref):
            assert h.is_cuda and h.dtype == torch.uint8 and h.shape == r.shape
        stats[name] = [_decode_agreement(r.cpu(), h.cpu()) for h, r in zip(hw, ref)]
    _record("hw_decode_vs_nvjpeg", stats)
    assert max(d["rgb_max"] for d in stats["4:4:4"]) <= 4, stats["4:4:4"]
    assert max(d["rgb_mean"] for d in stats["4:4:4"]) <= 0.5, stats["4:4:4"]
    bad = [(i, d) for i, d in enumerate(stats["4:2:0"] + stats["4:4:4"]) if not _same_picture(d)]
    assert not bad, f"decodes that differ beyond chroma upsampling: {bad}"
    victim = tmp_path / "empty.jpg"
    victim.write_bytes(b"\xff\xd8\xff\xd9")
    blob = torch.frombuffer(bytearray(victim.read_bytes()), dtype=torch.uint8)
    with pytest.raises(CorruptImageError, match=f"cannot decode image file {victim}"):
        HwDecoder()([blobs[0], blob], [paths[0], victim], "cuda")


@pytest.mark.gpu
def test_hw_decode_batches_equal_gpu_decode_batches_within_the_decoders_difference(folder):
    """hw-decode and gpu-decode batches of the same files and seed: the same crops and flips of
    pictures that differ by at most D, the largest RGB difference of the two decoders over the
    folder's files; the antialiased bilinear resample is a convex combination of pixels
    (weights >= 0, summing to 1), so a batch pixel differs by at most D, plus 0.5 for each
    fp16 resample: at most D + 1 levels on the 0-255 scale; labels equal."""
    _hw_decode_ready()
    from torchvision.io import ImageReadMode, decode_jpeg

    from fp16lab.inputs.hw_decode import HwDecoder

    paths = sorted(folder.rglob("*.jpg"))
    blobs = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in paths]
    hw = HwDecoder()(blobs, paths, "cuda")
    ref = decode_jpeg(blobs, mode=ImageReadMode.RGB, device="cuda")
    d = max(float((h.int() - r.int()).abs().max()) for h, r in zip(hw, ref))
    out = {}
    for backend in ("hw-decode", "gpu-decode"):
        s = InputSettings(backend, batch=8, image_size=32, num_workers=2, seed=3)
        with make_input(s, folder, device="cuda") as p:
            out[backend] = [tuple(t.cpu() for t in next(p)) for _ in range(3)]
            if backend == "hw-decode":
                assert p.implementation.startswith("nvImageCodec hardware JPEG decoder")
    std255 = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    diffs = [float(((x - x0).abs() * std255).max())
             for (x, _), (x0, _) in zip(out["hw-decode"], out["gpu-decode"])]
    _record("hw_decode_vs_gpu_decode_batches", {"decode_max": d, "batch_max": diffs})
    assert max(diffs) <= d + 1.0, (diffs, d)
    for (_, y), (_, y0) in zip(out["hw-decode"], out["gpu-decode"]):
        assert torch.equal(y, y0)


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["sgd", "sgd-fused"])
def test_hw_decode_feeds_amp_training_on_the_gpu(folder, optimizer):
    _hw_decode_ready()
    s = InputSettings("hw-decode", batch=8, image_size=64, num_workers=2)
    row = measure_training("small_cnn", "amp-fp16", s, folder, device="cuda", warmup=1, steps=3,
                           optimizer=optimizer)
    assert row["status"] == "ok", row["error"]
    assert row["images_per_s"] > 0 and row["implementation"].startswith("nvImageCodec")


@pytest.mark.gpu
@pytest.mark.parametrize("backend, precision", [
    ("synthetic", "amp-bf16"), ("dataloader", "fp32"), ("dataloader", "amp-fp16"),
    ("gpu-decode", "amp-fp16"), ("gpu-decode", "fp32")])
def test_every_backend_feeds_training_on_the_gpu(folder, backend, precision):
    if backend == "gpu-decode":
        pytest.importorskip("torchvision", reason="gpu-decode needs torchvision")
    s = InputSettings(backend, batch=8, image_size=64, num_workers=2)
    row = measure_training("small_cnn", precision, s, folder, device="cuda", warmup=1, steps=3)
    assert row["status"] == "ok", row["error"]
    assert row["images_per_s"] > 0 and row["implementation"]


@pytest.mark.gpu
def test_dataloader_on_the_gpu_pins_and_equals_the_cpu_batch(folder):
    """The GPU side (a side stream one batch ahead when non-blocking, the training stream when
    not) hands over the same batches as the CPU, in the same order."""
    out = {}
    for device, non_blocking in (("cpu", True), ("cuda", True), ("cuda", False)):
        torch.manual_seed(0)
        s = InputSettings("dataloader", batch=4, image_size=32, num_workers=0, normalize_on="gpu",
                          non_blocking=non_blocking)
        with make_input(s, folder, device=device) as p:
            out[device, non_blocking] = [next(p) for _ in range(3)]
    for key in (("cuda", True), ("cuda", False)):
        for (x, y), (xc, yc) in zip(out[key], out["cpu", True]):
            assert x.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(x.cpu(), xc, rtol=0, atol=1e-5)
            assert torch.equal(y.cpu(), yc)


#: Flat pictures, one colour per class: any crop, resize and flip of one is the same colour, so
#: a DALI batch has a known value at every pixel, and its label says which colour it must be.
#: Saved at quality 100 without chroma subsampling, a flat picture decodes within 1 level of its
#: colour on libjpeg-turbo; the check allows 2.5 levels for the GPU's decoders.
FLAT_COLOURS = [(200, 30, 90), (10, 240, 120), (128, 128, 128), (250, 250, 5)]


@pytest.fixture(scope="module")
def flat_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("flat") / "set"
    for k, colour in enumerate(FLAT_COLOURS):
        (root / f"class_{k:02d}").mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (96, 72), colour).save(root / f"class_{k:02d}" / f"img_{i}.jpg",
                                                    quality=100, subsampling=0)
    return root


def _check_dali_batches(make, channels_last=True):
    """Three epochs of 16 flat pictures in batches of 8: every pixel of every picture is the
    normalised colour of its label's class (channel order, mean, std and layout), and each
    epoch holds every picture once (four of each label)."""
    from fp16lab.inputs.dali import dali_pipeline as _dali  # noqa: F401  (make builds through it)

    s = InputSettings("dali", batch=8, image_size=16, num_workers=2, seed=1,
                      channels_last=channels_last)
    mean, std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
    want = (torch.tensor(FLAT_COLOURS, dtype=torch.float32) / 255 - mean) / std  # (class, 3)
    tol = (2.5 / 255 / std).view(1, 3, 1, 1)
    with make(s) as pipe:
        for epoch in range(3):
            labels = []
            for _ in range(2):
                x, y = next(pipe)
                assert x.shape == (8, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
                assert x.is_contiguous(memory_format=torch.channels_last if channels_last
                                       else torch.contiguous_format)
                x, y = x.cpu(), y.cpu()
                diff = (x - want[y].view(8, 3, 1, 1)).abs()
                assert bool((diff <= tol).all()), float((diff / tol).max())
                labels += y.tolist()
            assert sorted(labels) == [k for k in range(4) for _ in range(4)], (epoch, labels)
    with pytest.raises(StopIteration):  # closed: the pipeline is released, no batch comes
        next(pipe)


@pytest.mark.parametrize("channels_last", [True, False])
def test_dali_plumbing_on_its_cpu_decoder(flat_folder, channels_last):
    """The dali backend's pipeline with DALI's CPU decoder (make_input refuses the CPU; this
    checks the reader, labels, normalisation and layout where DALI is installed)."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    from fp16lab.inputs.dali import dali_pipeline as _dali

    _check_dali_batches(lambda s: _dali(s, flat_folder, "cpu"), channels_last)


@pytest.mark.gpu
def test_dali_on_the_gpu_hands_over_the_known_colours(flat_folder):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    _check_dali_batches(lambda s: make_input(s, flat_folder, device="cuda"))


@pytest.mark.gpu
def test_dali_runs_or_says_why_not(folder):
    reason = unavailable_reason("dali", "cuda")
    row = measure_loader(InputSettings("dali", batch=8, image_size=32, num_workers=2), folder,
                         device="cuda", warmup=1, steps=2)
    if reason:
        assert row["status"] == "skipped" and row["error"] == reason and "DALI" in reason
    else:
        assert row["status"] == "ok", row["error"]


def test_physical_cores_count_each_core_once(tmp_path, monkeypatch):
    """Four logical CPUs: two hyperthreads of core 0 and two of core 1 on package 0 is two
    cores; the same core ids on two packages are four; a missing file is unknown."""
    from fp16lab.inputs import physical_cores

    def topology(pairs):
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        for cpu, (package, core) in enumerate(pairs):
            d = root / f"cpu{cpu}" / "topology"
            d.mkdir(parents=True)
            (d / "physical_package_id").write_text(f"{package}\n")
            (d / "core_id").write_text(f"{core}\n")
        return root
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert physical_cores(topology([(0, 0), (0, 0), (0, 1), (0, 1)])) == 2
    assert physical_cores(topology([(0, 0), (0, 1), (1, 0), (1, 1)])) == 4
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {1, 3})  # only some CPUs allowed
    assert physical_cores(topology([(0, 0), (0, 0), (0, 1), (0, 1)])) == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 4})
    assert physical_cores(topology([(0, 0), (0, 1)])) is None  # cpu4 has no topology here
    for bad, error in (("", ValueError), (7, TypeError), (tmp_path / "missing", OSError)):
        with pytest.raises(error, match="sysfs"):
            physical_cores(bad)
