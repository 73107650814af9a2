"""Input backends end to end on small data sets, their checks, and the loader and training meters.

GPU tests (marker ``gpu``): nvJPEG decoding against PIL's libjpeg decoding of the same files,
and every backend feeding real training steps. Tolerance of the decode comparison, on uint8
pixels: for 4:4:4 files (no chroma subsampling, so only the inverse DCT and the colour
conversion can differ) at most 4 anywhere and at most 0.5 on average; for the data set's own
4:2:0 files, where the chroma upsampling may differ too (libjpeg interpolates, a decoder may
repeat), at most 2 on average, the bound torchvision's own tests use for nvJPEG against
libjpeg-turbo. A swapped channel, a shifted row or a wrong crop is off by tens. The measured
differences are written to $OUT when it is set.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fp16lab.augment import IMAGENET_MEAN, IMAGENET_STD, crop_params, flip_draw
from fp16lab.data import CorruptImageError, load_rgb, make_image_folder, synthetic_photo
from fp16lab.feeding import (ProcessCpu, make_input_train_step, make_train_step, measure_loader,
                             measure_training)
from fp16lab.inputs import (BACKENDS, InputSettings, JpegFolder, _gpu_decode, default_workers,
                            make_input, unavailable_reason)

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
            out[where] = next(p)
    assert torch.equal(out["cpu"][1], out["gpu"][1])
    torch.testing.assert_close(out["cpu"][0], out["gpu"][0], rtol=0, atol=1e-5)


def _pil_decode(blobs, paths, device):
    import io
    return [torch.from_numpy(np.array(load_rgb(io.BytesIO(b.numpy().tobytes())))).permute(2, 0, 1)
            for b in blobs]


def test_gpu_decode_plumbing_with_a_cpu_decoder(folder):
    """The gpu-decode backend's reader threads, ordering and labels, with PIL standing in for nvJPEG."""
    s = InputSettings("gpu-decode", batch=8, image_size=24, num_workers=2, seed=4)
    with _gpu_decode(s, folder, "cpu", decode=_pil_decode) as p:
        batches = [next(p) for _ in range(4)]
    for x, y in batches:
        assert x.shape == (8, 3, 24, 24) and _in_range(x)
    for epoch in (batches[:2], batches[2:]):
        assert sorted(torch.cat([y for _, y in epoch]).tolist()) == sorted(list(range(4)) * 4)


@pytest.mark.parametrize("change, error, match", [
    (dict(backend="dvd"), ValueError, "backend must be one of synthetic, dataloader"),
    (dict(batch=0), ValueError, "batch must be an integer >= 1"),
    (dict(num_workers=-1), ValueError, "num_workers must be None"),
    (dict(normalize_on="tpu"), ValueError, "normalize_on must be 'cpu' or 'gpu'"),
    (dict(pin_memory="yes"), ValueError, "pin_memory must be True or False"),
    (dict(batch=17), ValueError, "has 16 images, fewer than one batch of 17"),
    (dict(backend="gpu-decode"), RuntimeError, "gpu-decode decodes with nvJPEG on a CUDA GPU"),
    (dict(backend="dali", num_workers=0), ValueError, "dali needs num_workers >= 1"),
])
def test_bad_settings_fail_before_any_work(folder, change, error, match):
    s = InputSettings(**{**dict(backend="dataloader", batch=4), **change})
    with pytest.raises(error, match=match):
        make_input(s, folder, device="cpu")


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


def test_corrupt_jpeg_in_gpu_decode_reader_is_named(corrupt):
    root, victim = corrupt
    s = InputSettings("gpu-decode", batch=8, image_size=16, num_workers=2)
    with _gpu_decode(s, root, "cpu", decode=_pil_decode) as p, \
            pytest.raises(CorruptImageError, match=f"{victim} is cut short"):
        next(p)


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
    for b in ("gpu-decode", "dali"):
        assert "CUDA GPU" in unavailable_reason(b, "cpu")
    with pytest.raises(ValueError, match="unknown input backend"):
        unavailable_reason("tape", "cpu")
    assert set(BACKENDS) == {"synthetic", "dataloader", "gpu-decode", "dali"}


def test_train_step_fp32_is_one_sgd_step_with_momentum():
    """One step against torch's own autograd and the SGD update written out: p - lr * grad."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))
    ref = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    x, y = torch.randn(5, 3, 8, 8), torch.randint(0, 10, (5,))
    make_train_step(model, "fp32", "cpu")(x, y)
    h = torch.nn.functional.conv2d(x, ref[0], ref[1]).flatten(1)
    loss = torch.nn.functional.cross_entropy(h @ ref[2].T + ref[3], y)
    grads = torch.autograd.grad(loss, ref)
    for p, r, g in zip(model.parameters(), ref, grads):
        torch.testing.assert_close(p.detach(), r.detach() - 0.01 * g, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        make_train_step(model, "fp8", "cpu")


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
        d = (g.cpu().int() - ref.int()).abs().float()
        out.append((float(d.max()), float(d.mean())))
    return out


def _record(name: str, payload) -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out, f"{name}.json").write_text(json.dumps(payload, indent=1))
    print(name, payload)


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
    assert max(m for m, _ in unsubsampled) <= 4 and max(a for _, a in unsubsampled) <= 0.5
    assert max(a for _, a in subsampled) <= 2.0


@pytest.mark.gpu
def test_gpu_decode_backend_matches_the_cpu_augmentation(folder):
    """The same crops and flips applied to CPU-decoded pictures give the GPU batch within the
    decode tolerance (mean <= 2 on the 0-255 scale)."""
    pytest.importorskip("torchvision", reason="gpu-decode needs torchvision")
    from fp16lab.augment import normalize
    from fp16lab.inputs import augment_batch, decode_batch

    s = InputSettings("gpu-decode", batch=16, image_size=32, num_workers=2, seed=2)
    seen = []

    def decode(blobs, paths, device):  # nvJPEG, noting which files the batch holds
        seen.append(paths)
        return decode_batch(blobs, paths, device)

    with _gpu_decode(s, folder, "cuda", decode=decode) as pipe:
        x, y = next(pipe)
    assert x.is_cuda and x.shape == (16, 3, 32, 32) and x.is_contiguous(memory_format=torch.channels_last)
    pics = [torch.from_numpy(np.asarray(Image.open(p).convert("RGB")).copy()).permute(2, 0, 1) for p in seen[0]]
    ref = normalize(augment_batch(pics, 32, torch.Generator().manual_seed(s.seed + 1)))
    std255 = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    diff = ((x.cpu() - ref).abs() * std255)
    _record("gpu_decode_vs_cpu_augmentation", {"max": float(diff.max()), "mean": float(diff.mean())})
    assert float(diff.mean()) <= 2.0


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
    out = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        s = InputSettings("dataloader", batch=4, image_size=32, num_workers=0, normalize_on="gpu")
        with make_input(s, folder, device=device) as p:
            out[device] = next(p)
    assert out["cuda"][0].is_cuda and out["cuda"][0].is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out["cuda"][0].cpu(), out["cpu"][0], rtol=0, atol=1e-5)
    assert torch.equal(out["cuda"][1].cpu(), out["cpu"][1])


@pytest.mark.gpu
def test_dali_runs_or_says_why_not(folder):
    reason = unavailable_reason("dali", "cuda")
    row = measure_loader(InputSettings("dali", batch=8, image_size=32, num_workers=2), folder,
                         device="cuda", warmup=1, steps=2)
    if reason:
        assert row["status"] == "skipped" and row["error"] == reason and "DALI" in reason
    else:
        assert row["status"] == "ok", row["error"]
