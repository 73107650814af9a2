"""fp16lab.execution, beyond tests/test_execution.py: each mode's defaults, asserted.

The oracle is what the module's documentation promises: the plain modes train with PyTorch's
foreach SGD (``fused`` left unset, LR 0.01, momentum 0.9), only ``cuda-graph`` defaults to the
fused one, and ``compile`` records its mode.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from fp16lab import execution, recipes

def _default(func, name):
    """A keyword's default, read from the signature (mutation testing wraps the function, which
    leaves __kwdefaults__ empty but keeps the signature)."""
    return inspect.signature(func).parameters[name].default




def _sgd_settings(opt):
    g = opt.param_groups[0]
    return type(opt), g["lr"], g["momentum"], g["fused"]


def test_the_documented_optimizer_numbers():
    assert (recipes.LR, recipes.MOMENTUM) == (0.01, 0.9)
    assert execution.WARMUP_STEPS == 3
    assert _default(execution.make_step, "warmup") == 3
    assert _default(execution.make_step, "execution") == "eager"
    assert _default(execution.make_step, "compile_mode") == "default"
    assert _default(execution.make_step, "fused_optimizer") is None
    assert _default(execution.build_step, "layout") == "nchw"


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_eager_defaults_to_foreach_sgd_and_no_compile_mode(precision):
    step = execution.build_step("mlp", 4, precision=precision, device="cpu")
    assert (step.execution, step.compile_mode, step.fused_optimizer) == ("eager", None, False)
    assert _sgd_settings(step.optimizer) == (torch.optim.SGD, 0.01, 0.9, None)
    assert step.notes == [] and step.precision == precision
    assert step.x.shape == (4, 64) and step.y.shape == (4,)


def test_compile_defaults_to_its_default_mode_and_the_same_optimizer():
    step = execution.build_step("mlp", 4, precision="fp32", device="cpu", execution="compile")
    assert (step.execution, step.compile_mode, step.fused_optimizer) == ("compile", "default", False)
    assert _sgd_settings(step.optimizer) == (torch.optim.SGD, 0.01, 0.9, None)
    assert step.notes == ["torch.compile(model, mode='default'); loss, scaler, optimizer eager"]
    other = execution.build_step("mlp", 4, precision="fp32", device="cpu", execution="compile",
                                 compile_mode="max-autotune-no-cudagraphs")
    assert other.compile_mode == "max-autotune-no-cudagraphs"


def test_a_compile_mode_is_not_recorded_for_eager():
    step = execution.build_step("mlp", 2, precision="fp32", device="cpu",
                                compile_mode="max-autotune-no-cudagraphs")
    assert step.compile_mode is None


def test_an_asked_for_fused_optimizer_is_fused_and_said():
    step = execution.build_step("mlp", 2, precision="fp32", device="cpu", fused_optimizer=True)
    assert step.fused_optimizer is True and step.optimizer.param_groups[0]["fused"] is True
    assert step.notes == ["fused SGD (GradScaler's found_inf stays on the device)"]


def test_build_step_seeds_the_model_and_the_batch():
    a = execution.build_step("mlp", 3, precision="fp32", device="cpu", seed=5)
    b = execution.build_step("mlp", 3, precision="fp32", device="cpu", seed=5)
    c = execution.build_step("mlp", 3, precision="fp32", device="cpu", seed=6)
    torch.manual_seed(5)
    ref = execution.build_model("mlp")
    for p, q in zip(a.model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    gen = torch.Generator(device="cpu").manual_seed(6 + 1)  # the batch draws from seed + 1
    assert torch.equal(c.x, torch.randn((3, 64), generator=gen))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and not torch.equal(a.x, c.x)


def test_cuda_graph_needs_cuda_and_reduce_overhead_too():
    with pytest.raises(ValueError):
        execution.build_step("mlp", 2, precision="fp32", device="cpu", execution="cuda-graph")
    with pytest.raises(ValueError, match="reduce-overhead"):
        execution.build_step("mlp", 2, precision="fp32", device="cpu", execution="compile",
                             compile_mode="reduce-overhead")


def test_check_execution_refuses_with_what_is_allowed_word_for_word():
    import re

    check = execution.check_execution
    cases = [
        (dict(execution="jit", device="cpu"),
         "execution must be one of 'eager', 'cuda-graph', 'compile'; got 'jit'"),
        (dict(execution="cuda-graph", device="cuda", fused_optimizer=False),
         "execution 'cuda-graph' needs fused_optimizer=True (or None): a foreach SGD under "
         "GradScaler reads found_inf on the host, which capture forbids"),
        (dict(execution="eager", device="tpu"), "device must be one of 'cpu', 'cuda'; got 'tpu'"),
        (dict(execution="compile", device="cpu", compile_mode="fast"),
         "compile_mode must be one of 'default', 'reduce-overhead', 'max-autotune-no-cudagraphs'; got 'fast'"),
        (dict(execution="compile", device="cpu", compile_mode="reduce-overhead"),
         "compile mode 'reduce-overhead' replays CUDA graphs and needs a CUDA device; on a CPU use "
         "'default'"),
    ]
    if not torch.cuda.is_available():
        cases += [(dict(execution="eager", device="cuda"),
                   "device 'cuda' asked for, but torch sees no CUDA device")]
    cases += [(dict(execution="cuda-graph", device="cpu"),
               "execution 'cuda-graph' needs a CUDA device; on a CPU use 'eager' or 'compile'")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            check(**kwargs)
    for precision in ("fp16-o2", "fp8-tensorwise"):
        if precision in recipes.PRECISIONS:
            with pytest.raises(ValueError, match="fp16lab.execution's steps"):
                check("eager", device="cpu", precision=precision)
    check("eager", device="cpu")  # the defaults: fp32, compile mode 'default'
    check("compile", device="cpu")
    for precision in ("fp32", "tf32", "amp-fp16", "amp-bf16"):
        check("eager", device="cpu", precision=precision)
