"""The input-pipeline benchmark's plan: the wanted rows first, each with a long enough window."""

from __future__ import annotations

import argparse

import pytest

from fp16lab.bench import input_pipeline as bench

INPUTS = ["synthetic", "dali", "gpu-decode", "hw-decode", "dataloader", "dataloader uint8"]
WANTED = ["loader synthetic", "loader dali", "loader gpu-decode", "loader hw-decode",
          "loader dataloader 12 workers", "loader dataloader uint8"] + [
    f"train amp-fp16 {b} sgd-fused" for b in INPUTS] + [
    f"train {p} {b}" for p in ("amp-fp16", "amp-bf16") for b in INPUTS]


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(bench, "cpu_cores", lambda: 16)
    monkeypatch.setattr(bench, "physical_cores", lambda: 8)
    monkeypatch.setattr(bench, "default_workers", lambda cores=None: 12)
    monkeypatch.setattr(bench, "measure_loader",
                        lambda s, root, **kw: seen.append(("loader", s, kw)) or {})
    monkeypatch.setattr(bench, "measure_training",
                        lambda model, p, s, root, **kw: seen.append((p, s, kw)) or {})
    return seen


def _args(quick=False):
    a = argparse.Namespace(quick=quick, image_size=224, images_dir=None, batch=256, model="resnet50",
                           loader_steps=12, train_steps=20, min_seconds=0.0 if quick else 5.0)
    return a


def test_the_wanted_rows_come_first_then_hybrids_fp32_and_the_worker_sweep(calls):
    labels = [label for label, _ in bench.plan(_args(), "cuda")]
    assert labels[:24] == WANTED
    assert labels[24:] == ["loader hw-decode + 25% CPU", "train amp-fp16 hw-decode + 25% CPU sgd-fused",
                           "loader gpu-decode + 25% CPU", "train amp-fp16 gpu-decode + 25% CPU sgd-fused",
                           "train fp32 synthetic", "train fp32 dali", "train fp32 gpu-decode",
                           "train fp32 dataloader", "loader dataloader 4 workers",
                           "loader dataloader 8 workers", "loader dataloader 16 workers",
                           # 25, 50, 75 and 100% of the 8 physical cores, less the 12 already run
                           "loader dali 2 threads", "loader dali 4 threads",
                           "loader dali 6 threads", "loader dali 8 threads"]


def test_without_a_readable_topology_the_dali_counts_follow_the_logical_cores(calls, monkeypatch):
    monkeypatch.setattr(bench, "physical_cores", lambda: None)
    labels = [label for label, _ in bench.plan(_args(), "cuda")]
    assert [x for x in labels if x.endswith("threads")] == [
        "loader dali 4 threads", "loader dali 8 threads", "loader dali 16 threads"]


def test_every_window_but_the_synthetic_loaders_lasts_five_seconds(calls):
    plan = bench.plan(_args(), "cuda")
    for label, measure in plan:
        measure()
    assert len(calls) == len(plan)
    for (label, _), (kind, s, kw) in zip(plan, calls):
        uint8 = "uint8" in label
        assert (s.normalize_on == "gpu") == uint8, label
        assert s.cpu_decode_share == (0.25 if "25% CPU" in label else 0.0), label
        want = next(b for b in ("synthetic", "gpu-decode", "hw-decode", "dataloader", "dali")
                    if b in label)
        assert s.backend == want, label
        assert s.batch == 256 and s.image_size == 224
        if label == "loader synthetic":
            assert kw.get("min_seconds", 0.0) == 0.0 and kw["steps"] == 12
            continue
        assert kw["min_seconds"] == 5.0, label
        assert kw["warmup"] == s.resolved_workers() + 2, label
        want_steps = 12 if kind == "loader" else 10 if kind == "fp32" else 20
        assert kw["steps"] == want_steps, label
        assert kw.get("optimizer", "sgd") == ("sgd-fused" if "sgd-fused" in label else "sgd"), label
        if kind != "loader" or not label.endswith(("workers", "threads")):
            assert s.resolved_workers() == 12, label
        elif label.endswith("threads"):
            assert s.resolved_workers() == int(label.split()[2]), label


def test_the_protocol_in_the_meta_states_the_window():
    text = bench.protocol(_args())
    assert "at least 12 batches (loader) or 20 steps (training; fp32 10)" in text
    assert "at least 5 s" in text and "torch.cuda.synchronize()" in text
