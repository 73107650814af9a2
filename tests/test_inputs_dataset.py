"""The JPEG data set: deterministic, valid, ImageNet-like in size, cached; bad folders and files named."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fp16lab
from fp16lab.inputs import dataset
from fp16lab.inputs.dataset import (CorruptImageError, load_rgb, make_image_folder,
                                    read_jpeg_bytes, scan_image_folder, synthetic_photo)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs") / "set"
    return make_image_folder(root, images=12, classes=3, size=(120, 90), seed=7, workers=1)


def test_files_are_valid_jpegs_in_an_imagefolder_layout(small):
    files = sorted(small.root.rglob("*.jpg"))
    assert len(files) == 12 and small.images == 12 and not small.reused
    assert sorted(p.name for p in small.root.iterdir() if p.is_dir()) == ["class_00", "class_01", "class_02"]
    for cls in ("class_00", "class_01", "class_02"):
        assert len(list((small.root / cls).glob("*.jpg"))) == 4
    for f in files:
        with Image.open(f) as im:
            assert im.format == "JPEG" and im.size == (120, 90) and im.mode == "RGB"
            im.load()
        blob = f.read_bytes()
        assert blob[:2] == b"\xff\xd8" and blob[-2:] == b"\xff\xd9"
    assert small.total_bytes == sum(f.stat().st_size for f in files)
    manifest = json.loads((small.root / "manifest.json").read_text())
    for entry in manifest["files"]:
        path = small.root / entry["path"]
        assert entry["sha256"] == _sha(path) and entry["bytes"] == path.stat().st_size
        assert entry["label"] == int(path.parent.name.split("_")[1])


def test_same_seed_same_bytes_other_seed_other_bytes(small, tmp_path):
    again = make_image_folder(tmp_path / "a", images=12, classes=3, size=(120, 90), seed=7,
                              workers=2)  # in parallel this time: same bytes
    other = make_image_folder(tmp_path / "b", images=12, classes=3, size=(120, 90), seed=8, workers=1)
    for f in sorted(small.root.rglob("*.jpg")):
        rel = f.relative_to(small.root)
        assert _sha(again.root / rel) == _sha(f)
        assert _sha(other.root / rel) != _sha(f)


def test_second_call_reuses_and_a_missing_file_is_remade(small):
    first = sorted(small.root.rglob("*.jpg"))
    mtimes = [f.stat().st_mtime_ns for f in first]
    again = make_image_folder(small.root, images=12, classes=3, size=(120, 90), seed=7)
    assert again.reused and [f.stat().st_mtime_ns for f in first] == mtimes
    digest = _sha(first[5])
    first[5].unlink()
    remade = make_image_folder(small.root, images=12, classes=3, size=(120, 90), seed=7, workers=1)
    assert not remade.reused and _sha(first[5]) == digest


def test_realistic_size_and_content():
    """At 500x375, quality 90 the files weigh what ImageNet's do (about 110 kB on average)."""
    import io

    sizes, slopes = [], []
    for i in range(6):
        pic = synthetic_photo(0, i)
        assert pic.shape == (375, 500, 3) and pic.dtype == np.uint8
        buf = io.BytesIO()
        Image.fromarray(pic).save(buf, format="JPEG", quality=90)
        sizes.append(len(buf.getvalue()))
        # the power spectrum of a photograph falls about as 1/f^2: fit its log-log slope
        lum = pic.astype(np.float64).mean(axis=2)
        power = np.abs(np.fft.fft2(lum - lum.mean())) ** 2
        fy, fx = np.meshgrid(np.fft.fftfreq(375), np.fft.fftfreq(500), indexing="ij")
        f = np.hypot(fx, fy)
        band = (f > 0.01) & (f < 0.25)
        slopes.append(np.polyfit(np.log(f[band]), np.log(power[band]), 1)[0])
    assert 70e3 < np.mean(sizes) < 150e3, sizes
    assert all(-3.0 < s < -1.4 for s in slopes), slopes
    assert 20 < synthetic_photo(0, 0).std() < 80  # neither flat nor saturated


@pytest.mark.parametrize("kwargs, match", [
    (dict(images=0), "images must be"), (dict(images=4, classes=5), "classes must be"),
    (dict(quality=100), "quality must be"), (dict(size=(500,)), "size must be"),
    (dict(size=(500, 4)), "size must be"), (dict(seed=-1), "seed must be"),
    (dict(workers=0), "workers must be"), (dict(images=True), "images must be"),
])
def test_bad_settings_are_refused(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_image_folder(tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


def test_never_overwrites_other_files(small, tmp_path):
    with pytest.raises(ValueError, match="other settings"):
        make_image_folder(small.root, images=12, classes=3, size=(120, 90), seed=8)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not empty and has no manifest.json"):
        make_image_folder(tmp_path / "mine", images=2, classes=1)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_scan_lists_files_and_labels_like_imagefolder(small):
    files, labels, classes = scan_image_folder(small.root)
    assert classes == ["class_00", "class_01", "class_02"]
    assert [f.parent.name for f in files] == [classes[k] for k in labels]
    assert files == sorted(files) and labels == sorted(labels)


def test_scan_names_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nope'} does not exist"):
        scan_image_folder(tmp_path / "nope")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="no class sub-folders"):
        scan_image_folder(tmp_path / "flat")
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    (tmp_path / "empty" / "cat" / "readme.txt").write_text("no images")
    with pytest.raises(FileNotFoundError, match="no image files"):
        scan_image_folder(tmp_path / "empty")


def test_corrupt_files_are_named(small, tmp_path):
    good = sorted(small.root.rglob("*.jpg"))[0]
    blob = good.read_bytes()
    ref = np.asarray(Image.open(good).convert("RGB"))
    assert np.array_equal(np.asarray(load_rgb(good)), ref)
    assert read_jpeg_bytes(good) == blob
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(blob[: len(blob) // 2])
    text = tmp_path / "text.jpg"
    text.write_text("this is not a picture")
    for path in (cut, text):
        with pytest.raises(CorruptImageError, match=str(path)):
            load_rgb(path)
    with pytest.raises(CorruptImageError, match=f"{cut} is cut short"):
        read_jpeg_bytes(cut)
    with pytest.raises(CorruptImageError, match=f"{text} is not a JPEG"):
        read_jpeg_bytes(text)


SMALL = dict(images=12, classes=3, size=(120, 90), seed=7, workers=1)


def _digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): _sha(p) for p in sorted(root.rglob("*.jpg"))}


def test_an_interrupted_run_is_resumed_to_the_same_bytes(tmp_path, monkeypatch):
    """A run stopped after five pictures (and a sixth half written) leaves a folder that the
    next call takes up again; the data set is then byte for byte a run never interrupted."""
    root, real, done = tmp_path / "set", dataset._write_one, []

    def dies_after_five(task):
        if len(done) == 5:
            Path(task[0] + ".tmp").write_bytes(b"half a picture")
            raise KeyboardInterrupt
        done.append(task)
        return real(task)

    monkeypatch.setattr(dataset, "_write_one", dies_after_five)
    with pytest.raises(KeyboardInterrupt):
        make_image_folder(root, **SMALL)
    monkeypatch.undo()
    info = make_image_folder(root, **SMALL)
    assert not info.reused and info.images == 12 and not list(root.rglob("*.tmp"))
    assert _digests(root) == _digests(make_image_folder(tmp_path / "fresh", **SMALL).root)
    assert make_image_folder(root, **SMALL).reused


def test_an_interrupted_run_with_other_settings_is_remade_but_a_strangers_file_kept(
        tmp_path, monkeypatch):
    root = tmp_path / "set"
    monkeypatch.setattr(dataset, "_write_one", lambda task: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        make_image_folder(root, **SMALL)
    monkeypatch.undo()
    (root / "class_01").mkdir(exist_ok=True)
    (root / "class_01" / "img_000004.jpg").write_bytes(b"written by the run, say")
    info = make_image_folder(root, **{**SMALL, "images": 4, "classes": 2})
    files, labels, classes = scan_image_folder(root)
    assert info.images == 4 and len(files) == 4 and classes == ["class_00", "class_01"]
    # a folder with the marker but also a file no run of make_image_folder writes: refused
    other = tmp_path / "other"
    monkeypatch.setattr(dataset, "_write_one", lambda task: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        make_image_folder(other, **SMALL)
    monkeypatch.undo()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="files it did not write"):
        make_image_folder(other, **SMALL)
    assert (other / "notes.txt").read_text() == "keep me"


def test_a_file_or_a_read_only_folder_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    for root in (a_file, a_file / "inside"):
        with pytest.raises(NotADirectoryError, match=f"{a_file} is a file, not a folder"):
            make_image_folder(root, images=2, classes=1)
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    real = os.access  # the tests may run as root, who may write anywhere: pretend

    def access(path, mode, **kw):
        return False if Path(path) == read_only and mode & os.W_OK else real(path, mode, **kw)

    monkeypatch.setattr(os, "access", access)
    with pytest.raises(PermissionError, match=f"{read_only} is not writable"):
        make_image_folder(read_only, images=2, classes=1)
    assert list(read_only.iterdir()) == []


def _children(pid: int) -> list[int]:
    """Returns the pids of the live (not zombie) child processes of ``pid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError):  # the process ended while we looked
            continue
        if int(ppid) == pid and state != "Z":
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc")
def test_the_encoding_workers_end_when_the_caller_is_killed(tmp_path):
    """SIGKILL of a process inside make_image_folder(workers=2) takes its two pool workers
    with it (before, they stayed alive, blocked on a pipe, holding the caller's stdout)."""
    root = tmp_path / "set"
    code = ("import sys; from fp16lab.inputs.dataset import make_image_folder; "
            "make_image_folder(sys.argv[1], images=2000, size=(500, 375), workers=2)")
    checkout = str(Path(fp16lab.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (checkout, os.environ.get("PYTHONPATH")) if p)}
    caller = subprocess.Popen([sys.executable, "-c", code, str(root)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and caller.poll() is None:
            workers = _children(caller.pid)
            if len(workers) == 2 and any(root.rglob("*.jpg")):
                break
            time.sleep(0.05)
        assert len(workers) == 2 and caller.poll() is None, "the pool never started"
        caller.send_signal(signal.SIGKILL)
        caller.wait(30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers), "pool workers outlived their caller"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(30)
        for w in workers:  # the processes this test started, by their pid
            if _alive(w):
                os.kill(w, signal.SIGKILL)
