"""fp8.linear's choice of backend, on the CPU: torch._scaled_mm faked, so each branch of fp8_mm
(refusals, fallbacks and their reasons, the compiled path) is checked where CI runs.

The fake _scaled_mm records what it was asked and returns a marker; the emulation's answer is
``dequantize(qa) @ dequantize(qb)``, computed here as the oracle.
"""

from __future__ import annotations

import pytest
import torch

from fp16lab import fp8
from fp16lab.fp8 import linear


def operands(m=32, k=512, n=48, ga="tensorwise", gb="tensorwise", fa="e4m3", fb="e4m3"):
    gen = torch.Generator().manual_seed(0)
    qa = fp8.quantize(torch.randn(m, k, generator=gen), fa, ga, contraction_dim=1)
    qb = fp8.quantize(torch.randn(k, n, generator=gen), fb, gb, contraction_dim=0)
    return qa, qb


def emulated(qa, qb, dtype=torch.float32):
    return (fp8.dequantize(qa) @ fp8.dequantize(qb)).to(dtype)


@pytest.fixture
def gpu(monkeypatch):
    """scaled_mm available, blockwise supported, _scaled_mm recording its calls."""
    calls = []

    def run(qa, qb, kind, out_dtype, fast_accum):
        calls.append((kind, out_dtype, fast_accum))
        return torch.full((qa.data.shape[0], qb.data.shape[1]), 7.0, dtype=out_dtype)

    monkeypatch.setattr(linear, "scaled_mm_available", lambda device: True)
    monkeypatch.setattr(linear, "blockwise_support", lambda device: (True, ""))
    monkeypatch.setattr(linear, "_run_scaled_mm", run)
    monkeypatch.setattr(linear, "FALLBACKS", {})
    return calls


def test_scaled_mm_refused_where_torch_cannot_run_it():
    qa, qb = operands()
    with pytest.raises(RuntimeError, match=r"^torch._scaled_mm needs a CUDA GPU of compute "
                                            r"capability 8.9\+, not cpu; use backend='emulate'$"):
        linear.fp8_mm(qa, qb, backend="scaled_mm")
    with pytest.raises(ValueError, match="unknown backend 'fast'; allowed: auto, scaled_mm, emulate"):
        linear.fp8_mm(qa, qb, backend="fast")


@pytest.mark.parametrize("ga, gb, kind", [("tensorwise", "tensorwise", "tensorwise"),
                                          ("rowwise", "rowwise", "rowwise"),
                                          ("1x128", "128x128", "blockwise")])
def test_scaled_mm_gets_the_kind_and_settings(gpu, ga, gb, kind):
    qa, qb = operands(m=128, k=512, n=256, ga=ga, gb=gb)
    out = linear.fp8_mm(qa, qb, backend="scaled_mm", out_dtype=torch.bfloat16, fast_accum=True)
    assert gpu == [(kind, torch.bfloat16, True)] and out.dtype == torch.bfloat16
    gpu.clear()
    linear.fp8_mm(qa, qb, backend="auto")  # the defaults: fp32 out, no fast accumulation
    assert gpu == [(kind, torch.float32, False)]


def test_scaled_mm_refusals_say_why(gpu, monkeypatch):
    qa, qb = operands(m=32, k=512, n=48, ga="1x128", gb="rowwise")  # no layout _scaled_mm takes
    with pytest.raises(ValueError, match=r"takes tensorwise, rowwise or blockwise .* not tiles of "
                                         r"\(1, 128\) and \(512, 1\) \(e4m3 x e4m3\)"):
        linear.fp8_mm(qa, qb, backend="scaled_mm")
    qa, qb = operands(m=128, k=256, n=128, ga="1x128", gb="128x128")  # K = 256 < BLOCKWISE_K
    with pytest.raises(ValueError, match="only where K is a multiple of 512 .* not K=256"):
        linear.fp8_mm(qa, qb, backend="scaled_mm")
    qa, qb = operands(m=40, k=512, n=48)  # M = 40: not a multiple of 16
    with pytest.raises(ValueError, match=r"multiples of 16; M=40 are not"):
        linear.fp8_mm(qa, qb, backend="scaled_mm")
    monkeypatch.setattr(linear, "blockwise_support", lambda device: (False, "no blockwise here"))
    qa, qb = operands(m=128, k=512, n=128, ga="1x128", gb="128x128")
    with pytest.raises(RuntimeError, match="^no blockwise here; use backend='emulate'$"):
        linear.fp8_mm(qa, qb, backend="scaled_mm")
    assert gpu == []  # nothing reached _scaled_mm


@pytest.mark.parametrize("shape, ga, gb, key, reason", [
    ((32, 512, 48), "1x128", "rowwise", "tiles (1, 128) x (512, 1) e4m3 x e4m3",
     "emulated: torch._scaled_mm takes no such scale layout"),
    ((128, 256, 128), "1x128", "128x128", "blockwise e4m3 x e4m3, K=256",
     "emulated: K=256 is not a multiple of 512 (see BLOCKWISE_K)"),
    ((40, 512, 48), "tensorwise", "tensorwise", "tensorwise e4m3 x e4m3",
     "emulated: shape (40, 512, 48) is not a multiple of 16"),
])
def test_auto_falls_back_to_the_emulation_and_says_why(gpu, shape, ga, gb, key, reason):
    qa, qb = operands(*shape, ga=ga, gb=gb)
    out = linear.fp8_mm(qa, qb, out_dtype=torch.float16)
    assert torch.equal(out, emulated(qa, qb, torch.float16)) and gpu == []
    assert linear.FALLBACKS == {key: reason}


def test_auto_without_blockwise_support_says_the_probe_reason(gpu, monkeypatch):
    monkeypatch.setattr(linear, "blockwise_support", lambda device: (False, "probe said no"))
    qa, qb = operands(128, 512, 128, ga="1x128", gb="128x128")
    assert torch.equal(linear.fp8_mm(qa, qb), emulated(qa, qb)) and gpu == []
    assert linear.FALLBACKS == {"blockwise e4m3 x e4m3": "emulated: probe said no"}


def test_auto_remembers_a_scaled_mm_that_raised(gpu, monkeypatch):
    tried = []

    def raises(*args):
        tried.append(1)
        raise RuntimeError("no e5m2 x e5m2 here\nsecond line")

    monkeypatch.setattr(linear, "_run_scaled_mm", raises)
    qa, qb = operands(fa="e5m2", fb="e5m2")
    for _ in range(2):
        assert torch.equal(linear.fp8_mm(qa, qb), emulated(qa, qb))
    assert tried == [1]  # the second call does not try again
    assert linear.FALLBACKS == {"tensorwise e5m2 x e5m2":
                                "emulated: torch._scaled_mm raised no e5m2 x e5m2 here"}


def test_auto_on_a_cpu_emulates_without_bookkeeping(monkeypatch):
    monkeypatch.setattr(linear, "FALLBACKS", {})
    qa, qb = operands()
    assert torch.equal(linear.fp8_mm(qa, qb), emulated(qa, qb))
    assert linear.FALLBACKS == {}


@pytest.mark.parametrize("shape, ga, gb, probed, runs", [
    ((32, 512, 48), "tensorwise", "tensorwise", {}, False),  # CPU tensors: emulated
    ((128, 512, 128), "1x128", "128x128", {"cpu": (True, "")}, False),
])
def test_compiled_auto_decides_from_the_operands(gpu, monkeypatch, shape, ga, gb, probed, runs):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(linear, "_BLOCKWISE", probed)
    qa, qb = operands(*shape, ga=ga, gb=gb)
    out = linear.fp8_mm(qa, qb)
    assert (gpu != []) == runs and torch.equal(out, emulated(qa, qb))
    assert linear.FALLBACKS == {}  # no bookkeeping inside a graph


def test_compiled_auto_runs_scaled_mm_on_cuda_operands(gpu, monkeypatch):
    """The device check is the operands': CPU tensors dressed as CUDA ones reach _scaled_mm."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    qa, qb = operands(32, 512, 48)
    cuda = torch.device("cuda")
    monkeypatch.setattr(type(qa.data), "device", property(lambda self: cuda), raising=False)
    linear.fp8_mm(qa, qb)
    assert gpu == [("tensorwise", torch.float32, False)]
    gpu.clear()
    qa, qb = operands(32, 512, 40)  # N = 40: emulated, even on CUDA
    out = linear.fp8_mm(qa, qb)
    assert gpu == [] and out.shape == (32, 40)


def test_step7_valid_calls_pass_every_check_before_the_gpu(monkeypatch):
    """A valid call of wgmma_blockwise_mm, with its defaults or any schedule, passes every input
    check and reaches the GPU check (here replaced by a sentinel), on any machine."""
    class Reached(Exception):
        pass

    def reached():
        raise Reached

    monkeypatch.setattr(linear._wgmma, "require", reached)
    qa = fp8.quantize(torch.randn(4, 256), "e4m3", "1x128")
    qb = fp8.quantize(torch.randn(256, 128), "e4m3", "128x128", contraction_dim=0)
    calls = [{}, {"overlap": False}, {"out_dtype": torch.float32},
             *({"schedule": s} for s in linear._wgmma.FP8_SCHEDULES)]
    for kw in calls:
        with pytest.raises(Reached):
            fp8.wgmma_blockwise_mm(qa, qb, **kw)
