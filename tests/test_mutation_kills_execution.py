"""fp16lab.execution, beyond tests/test_execution.py: each mode's defaults, asserted, and what
the step runs under (TF32, autocast's cache, the compiled forward, the scaler's settings); the
cuda-graph capture's order of streams, warm-up and capture checked on fakes of torch.cuda.

The oracle is what the module's documentation promises: the plain modes train with PyTorch's
foreach SGD (``fused`` left unset, LR 0.01, momentum 0.9), only ``cuda-graph`` defaults to the
fused one, and ``compile`` records its mode.
"""

from __future__ import annotations

import contextlib
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


# ------------------------------------------------------------------ what the step runs under


class _Probe(torch.nn.Module):
    """An MLP-sized linear layer that records, at each forward, the flags it ran under."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, execution.NUM_CLASSES)
        self.seen: list[dict] = []

    def forward(self, x):
        self.seen.append({"tf32": recipes.tf32_state()["matmul"],
                          "autocast": torch.is_autocast_enabled("cpu"),
                          "cache": torch.is_autocast_cache_enabled()})
        return self.lin(x)


def _probe_batch(n=4):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, 64, generator=g),
            torch.randint(0, execution.NUM_CLASSES, (n,), generator=g))


@pytest.mark.parametrize("precision, tf32_on", [("fp32", False), ("tf32", True)])
def test_the_step_runs_its_forward_with_tf32_as_its_precision_says(precision, tf32_on):
    model = _Probe()
    before = recipes.tf32_state()
    step = execution.make_step(model, *_probe_batch(), precision=precision)
    step()
    assert model.seen == [{"tf32": tf32_on, "autocast": False, "cache": True}]
    assert recipes.tf32_state() == before  # set for the step only


def test_an_eager_amp_step_keeps_autocasts_cast_cache_on():
    model = _Probe()
    execution.make_step(model, *_probe_batch(), precision="amp-bf16")()
    assert model.seen == [{"tf32": False, "autocast": True, "cache": True}]


def test_eager_takes_zero_warmup_steps_and_none_are_run():
    model = _Probe()
    step = execution.make_step(model, *_probe_batch(), precision="fp32", warmup=0)
    assert model.seen == []  # making an eager step runs nothing
    step()
    assert len(model.seen) == 1


def test_the_scaler_settings_reach_the_grad_scaler():
    from fp16lab.scaling import ScalerSettings

    step = execution.make_step(_Probe(), *_probe_batch(), precision="amp-fp16",
                               scaler=ScalerSettings(init_scale=2.0**10, growth_interval=7))
    assert step.scaler.get_scale() == 1024.0 and step.scaler.get_growth_interval() == 7
    default = execution.make_step(_Probe(), *_probe_batch(), precision="amp-fp16")
    assert default.scaler.get_scale() == 2.0**16


def test_load_refuses_a_batch_where_only_one_tensor_changes_shape():
    step = execution.make_step(_Probe(), *_probe_batch(4), precision="fp32")
    x, y = _probe_batch(4)
    with pytest.raises(ValueError, match="keep its shapes"):
        step.load(x, y[:2])
    with pytest.raises(ValueError, match="keep its shapes"):
        step.load(x[:2], y)


# ------------------------------------------------------------------ compile, with a fake compiler


@pytest.fixture
def fake_compile(monkeypatch):
    """torch.compile returns the model wrapped in a counter; the mode it was given is kept."""
    seen = {"modes": [], "calls": 0, "mark_step": 0}

    def compile_(model, mode="unset"):
        seen["modes"].append(mode)

        def forward(x):
            seen["calls"] += 1
            return model(x)
        return forward

    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin",
                        lambda: seen.__setitem__("mark_step", seen["mark_step"] + 1))
    return seen


@pytest.mark.parametrize("mode, torch_mode", [("default", None),
                                              ("max-autotune-no-cudagraphs",
                                               "max-autotune-no-cudagraphs")])
def test_compile_hands_torch_its_mode_and_the_step_runs_the_compiled_forward(fake_compile, mode,
                                                                              torch_mode):
    model = _Probe()
    step = execution.make_step(model, *_probe_batch(), precision="fp32", execution="compile",
                               compile_mode=mode)
    assert fake_compile["modes"] == [torch_mode]  # torch's default mode is None
    step()
    step()
    assert fake_compile["calls"] == 2 and len(model.seen) == 2
    assert fake_compile["mark_step"] == 0  # only reduce-overhead's CUDA graphs need the mark
    assert step.notes == [f"torch.compile(model, mode={mode!r}); loss, scaler, optimizer eager"]


def test_eager_neither_compiles_nor_marks_steps(fake_compile):
    step = execution.make_step(_Probe(), *_probe_batch(), precision="fp32")
    step()
    assert fake_compile == {"modes": [], "calls": 0, "mark_step": 0}


# ------------------------------------------------------------------ build_step's defaults


def test_build_step_defaults_to_the_cpu_where_torch_sees_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    step = execution.build_step("mlp", 2, precision="fp32")
    assert step.x.device.type == "cpu" and next(step.model.parameters()).device.type == "cpu"


def test_build_step_defaults_to_cuda_where_torch_sees_a_gpu(monkeypatch):
    made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: made.append(a) or self)
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: made.append(a) or self)
    monkeypatch.setattr(execution, "make_step", lambda *a, **k: ("made", a, k))
    out = execution.build_step("mlp", 2, precision="fp32")
    assert out[0] == "made"
    assert made == [("cuda",), ("cuda",), ("cuda",)]  # the model, x and y


def test_build_step_seeds_with_zero_by_default():
    a = execution.build_step("mlp", 3, precision="fp32", device="cpu")
    b = execution.build_step("mlp", 3, precision="fp32", device="cpu", seed=0)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_build_step_draws_the_labels_after_the_batch_from_the_same_generator():
    from fp16lab.models import NUM_CLASSES

    step = execution.build_step("mlp", 64, precision="fp32", device="cpu", seed=2)
    gen = torch.Generator(device="cpu").manual_seed(3)
    torch.randn((64, 64), generator=gen)
    assert torch.equal(step.y, torch.randint(0, NUM_CLASSES, (64,), generator=gen))
    assert int(step.y.min()) == 0  # 64 draws of 10 classes: class 0 is among them


def test_build_step_lays_an_image_model_out_channels_last():
    step = execution.build_step("small_cnn", 2, precision="fp32", device="cpu",
                                layout="channels_last")
    assert step.x.is_contiguous(memory_format=torch.channels_last)
    assert not step.x.is_contiguous()
    convs = [m for m in step.model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last)
                         and not c.weight.is_contiguous() for c in convs)
    plain = execution.build_step("small_cnn", 2, precision="fp32", device="cpu")
    assert plain.x.is_contiguous()


def test_build_step_passes_its_arguments_on_to_make_step(monkeypatch):
    seen = {}
    monkeypatch.setattr(execution, "make_step", lambda *a, **k: seen.update(k) or "made")
    execution.build_step("mlp", 2, precision="tf32", device="cpu", execution="compile",
                         compile_mode="max-autotune-no-cudagraphs", fused_optimizer=True,
                         traceable=False)
    assert seen == {"precision": "tf32", "execution": "compile",
                    "compile_mode": "max-autotune-no-cudagraphs", "fused_optimizer": True,
                    "traceable": False}
    execution.build_step("mlp", 2, precision="fp32", device="cpu")
    assert seen["traceable"] is True and seen["fused_optimizer"] is None


def test_an_fp16_model_precision_is_refused_naming_these_steps():
    with pytest.raises(ValueError) as e:
        execution.check_execution("eager", device="cpu", precision="fp16-o2")
    listed = ", ".join(recipes.precisions(converts_model=False))
    assert str(e.value) == ("precision 'fp16-o2' is not offered by fp16lab.execution's steps "
                            f"(they take the model as built); allowed: {listed}")


# ------------------------------------------------------------------ cuda-graph, with fakes


class _FakeCuda:
    """torch.cuda's streams, graphs and synchronize, logging what happens and on which stream."""

    def __init__(self):
        self.log: list = []
        self.current = "default"
        self.in_graph = False
        self.profiling = False

    def install(self, monkeypatch):
        fake = self

        class Stream:
            def __init__(self, name="side"):
                self.name = name

            def wait_stream(self, other):
                fake.log.append(("wait", self.name, other.name))

        class Graph:
            def replay(self):
                fake.log.append("replay")

        @contextlib.contextmanager
        def stream(s):
            before, fake.current = fake.current, s.name
            yield
            fake.current = before

        @contextlib.contextmanager
        def graph(g):
            assert isinstance(g, Graph)
            fake.in_graph = True
            fake.log.append("capture begins")
            yield
            fake.in_graph = False
            fake.log.append("capture ends")

        @contextlib.contextmanager
        def profiler(activities):
            fake.log.append(("profiler", list(activities)))
            fake.profiling = True
            yield
            fake.profiling = False
            fake.log.append("profiler ends")

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream(fake.current))
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: fake.log.append("sync"))
        monkeypatch.setattr(execution, "torch_profiler", profiler)
        return Graph

    def step(self):
        self.log.append(("step", self.current, self.in_graph, self.profiling))
        return f"loss {len(self.log)}"


@pytest.mark.parametrize("traceable", [True, False])
def test_capture_warms_up_on_a_side_stream_then_records_one_step(monkeypatch, traceable):
    from torch.profiler import ProfilerActivity

    fake = _FakeCuda()
    Graph = fake.install(monkeypatch)
    replay = execution.capture(fake.step, 2, traceable)
    session = [("profiler", [ProfilerActivity.CUDA])] if traceable else []
    assert fake.log == [("wait", "side", "default"),
                        ("step", "side", False, False), ("step", "side", False, False),
                        ("wait", "default", "side"), "sync", *session,
                        "capture begins", ("step", "default", True, traceable), "capture ends",
                        "sync", *(["profiler ends"] if traceable else [])]
    captured = len(fake.log) - (3 if traceable else 2)  # the step's log length at capture
    assert isinstance(replay.graph, Graph)
    fake.log.clear()
    assert replay() == replay() == f"loss {captured}"  # the captured step's output, each time
    assert fake.log == ["replay", "replay"]  # a replay runs no Python step


@pytest.mark.parametrize("warmup, traceable, error, words", [
    (0, False, ValueError, "warmup >= 1"), (-1, False, ValueError, "warmup"),
    (1, 1, TypeError, "traceable")])
def test_capture_refuses_bad_settings_before_any_step(warmup, traceable, error, words):
    ran = []
    with pytest.raises(error, match=words):
        execution.capture(lambda: ran.append(1), warmup, traceable)
    assert ran == []


def test_capture_needs_a_function_and_cuda(monkeypatch):
    with pytest.raises(TypeError, match="step must be a function"):
        execution.capture("step", 1, False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        execution.capture(lambda: None, 1, False)


def test_make_step_wires_a_cuda_graph_step(monkeypatch):
    # the device checks are the GPU's: here only the wiring around capture is under test
    monkeypatch.setattr(execution, "check_execution", lambda *a, **k: None)
    captured = {}

    def capture(step, warmup, traceable):
        captured.update(warmup=warmup, traceable=traceable, loss=step())
        return lambda: "replayed"

    monkeypatch.setattr(execution, "capture", capture)
    model = _Probe()
    step = execution.make_step(model, *_probe_batch(), precision="amp-bf16", execution="cuda-graph")
    assert (captured["warmup"], captured["traceable"]) == (3, True)
    assert isinstance(captured["loss"], torch.Tensor)  # capture got the eager step itself
    assert model.seen == [{"tf32": False, "autocast": True, "cache": False}]  # cache off
    assert step() == "replayed"
    assert step.fused_optimizer is True and step.optimizer.param_groups[0]["fused"] is True
    assert step.notes == ["fused SGD (GradScaler's found_inf stays on the device)",
                          "autocast cache off during capture; static batch"]
    execution.make_step(_Probe(), *_probe_batch(), precision="fp32", execution="cuda-graph",
                        warmup=1, traceable=False)
    assert (captured["warmup"], captured["traceable"]) == (1, False)
    with pytest.raises(ValueError) as e:
        execution.make_step(_Probe(), *_probe_batch(), precision="fp32", execution="cuda-graph",
                            warmup=0)
    assert str(e.value) == "a CUDA graph needs warmup >= 1 steps before capture, got 0"


# ------------------------------------------------------------------ refusals name the argument


def test_a_negative_seed_or_warmup_and_a_non_bool_flag_are_refused_by_name():
    with pytest.raises(ValueError) as e:
        execution.build_step("mlp", 2, precision="fp32", device="cpu", seed=-1)
    assert str(e.value) == "seed must be >= 0, got -1"
    with pytest.raises(TypeError) as e:
        execution.build_step("mlp", 2, precision="fp32", device="cpu", traceable=1)
    assert str(e.value) == "traceable must be True or False, got 1 (int)"
    with pytest.raises(TypeError) as e:
        execution.build_step("mlp", 2, precision="fp32", device="cpu", fused_optimizer="yes")
    assert str(e.value) == "fused_optimizer must be True or False, got 'yes' (str)"
    with pytest.raises(ValueError) as e:
        execution.make_step(_Probe(), *_probe_batch(), precision="fp32", warmup=-1)
    assert str(e.value) == "warmup must be >= 0, got -1"
    with pytest.raises(TypeError) as e:
        execution.make_step(_Probe(), *_probe_batch(), precision="fp32", traceable="no")
    assert str(e.value) == "traceable must be True or False, got 'no' (str)"


def test_build_step_checks_precision_and_compile_mode_before_building(monkeypatch):
    monkeypatch.setattr(execution, "make_step", lambda *a, **k: "made")  # only build_step's checks
    with pytest.raises(ValueError, match="precision 'fp16-o2' is not offered"):
        execution.build_step("mlp", 2, precision="fp16-o2", device="cpu")
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        execution.build_step("mlp", 2, precision="fp32", device="cpu", execution="compile",
                             compile_mode="fast")


def test_make_step_checks_precision_compile_mode_and_the_fused_flag(fake_compile):
    with pytest.raises(ValueError, match="precision 'fp16-o2' is not offered"):
        execution.make_step(_Probe(), *_probe_batch(), precision="fp16-o2")
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        execution.make_step(_Probe(), *_probe_batch(), precision="fp32", execution="compile",
                            compile_mode="fast")
    # the fused flag is checked before the device: the message names the flag, not the CPU
    with pytest.raises(ValueError, match="needs fused_optimizer=True"):
        execution.make_step(_Probe(), *_probe_batch(), precision="fp32", execution="cuda-graph",
                            fused_optimizer=False)
    assert fake_compile["modes"] == []


def test_a_cuda_device_passes_the_cuda_only_checks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert execution.check_execution("cuda-graph", device="cuda") is None
    assert execution.check_execution("compile", device="cuda", compile_mode="reduce-overhead") is None


def test_reduce_overhead_marks_each_step_for_compiles_cuda_graphs(monkeypatch, fake_compile):
    # the device checks are the GPU's: here only what make_step does for the mode is under test
    monkeypatch.setattr(execution, "check_execution", lambda *a, **k: None)
    step = execution.make_step(_Probe(), *_probe_batch(), precision="fp32", execution="compile",
                               compile_mode="reduce-overhead")
    assert fake_compile["modes"] == ["reduce-overhead"] and step.compile_mode == "reduce-overhead"
    step()
    step()
    assert fake_compile["mark_step"] == 2 and fake_compile["calls"] == 2
