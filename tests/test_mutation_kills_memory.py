"""fp16lab.memory, where the mutation run found it unchecked: the account's rows and notes, the
saved-tensor counter, the optimizer-state arithmetic, checkpointing's row, and the CUDA peak
read through a fake torch.cuda (no GPU here) whose counters are set by the test."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fp16lab import memory
from fp16lab.workload import Workload
from fp16lab.workloads.batches import synthetic_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def tiny(**kw) -> Workload:
    kw.setdefault("name", "tiny")
    kw.setdefault("build", lambda: nn.Linear(4, 3))
    return Workload(batch=synthetic_batch((4,), 3), **kw)


def test_the_account_as_a_row():
    a = memory.MemoryAccount("w", "fp32", 2, 1, 2, 3, 4, 5, 6, 7, 8, notes=("x", "y"))
    assert a.total == 36
    row = a.as_dict()
    assert row["total"] == 36 and row["notes"] == "x; y" and row["batch"] == 8
    assert row["workload"] == "w" and row["batch_size"] == 2
    assert memory.MemoryAccount("w", "fp32", 2, *(0,) * 8).notes == ()
    assert memory.PARTS == ("parameters", "buffers", "gradients", "master_weights",
                            "master_gradients", "optimizer_state", "activations", "batch")


def test_saved_tensors_counts_each_storage_once_and_only_while_active():
    c = memory.SavedTensors()
    base = torch.zeros(10)  # 40 bytes
    assert c.add(base[:2]) is not None and c.bytes == 40  # a view counts its whole storage
    c.add(base[5:])
    assert c.bytes == 40
    c.add(torch.zeros(3, dtype=torch.float16))
    assert c.bytes == 46
    c.add("not a tensor")
    c.add(torch.empty(5, device="meta"))
    c.add(torch.empty(0))  # no storage (data_ptr 0)
    assert c.bytes == 46
    c.active = False
    c.add(torch.zeros(100))
    assert c.bytes == 46
    other = torch.ones(4)
    d = memory.SavedTensors(exclude={memory._storage_key(other)})
    d.add(other)
    d.add(other[1:])
    assert d.bytes == 0
    d.add(torch.ones(4))
    assert d.bytes == 16
    assert memory._storage_key(other) == ("cpu", other.untyped_storage().data_ptr())


def test_saved_tensors_hooks_see_what_autograd_keeps():
    x = torch.randn(3, 5, requires_grad=True)
    c = memory.SavedTensors()
    with c.hooks():
        y = x.exp()  # exp keeps its output
    assert c.bytes == 3 * 5 * 4
    y.sum().backward()
    assert torch.allclose(x.grad, x.exp())  # the unpack hook gives the tensor back as it was


def test_tensors_and_nbytes_reach_into_containers():
    a, b, c = torch.zeros(2), torch.zeros(3, dtype=torch.float16), torch.zeros(1, dtype=torch.int64)
    found = memory._tensors({"a": [a, (b, "x")], "c": c, "n": None})
    assert [t.dtype for t in found] == [torch.float32, torch.float16, torch.int64]
    assert memory._nbytes(found) == 8 + 6 + 8
    assert memory._tensors(3) == []


def test_optimizer_state_arithmetic():
    params = [torch.zeros(3, 2), torch.zeros(5)]  # 11 fp32 values, 44 bytes
    sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    assert memory.optimizer_state_bytes(sgd, params) == (44, "SGD: a momentum buffer per parameter")
    assert memory.optimizer_state_bytes(lambda p: torch.optim.SGD(p, lr=0.1), params)[0] == 0
    adam = memory.optimizer_state_bytes(lambda p: torch.optim.Adam(p), params)
    assert adam == (2 * 44 + 8, "Adam: 2 moments per parameter and a 4-byte step count")
    ams = memory.optimizer_state_bytes(lambda p: torch.optim.AdamW(p, amsgrad=True), params)
    assert ams == (3 * 44 + 8, "AdamW: 3 moments per parameter and a 4-byte step count")
    half = [torch.zeros(4, dtype=torch.float16)]
    assert memory.optimizer_state_bytes(sgd, half)[0] == 8
    rms = memory.optimizer_state_bytes(lambda p: torch.optim.RMSprop(p, momentum=0.9), params)
    # square_avg and momentum_buffer per parameter (44 bytes each), and a float32 step each
    assert rms == (2 * 44 + 2 * 4, "RMSprop: counted after one step on CPU copies")
    plain = memory.optimizer_state_bytes(lambda p: torch.optim.Adagrad(p), params)
    assert plain[0] == 44 + 2 * 4  # sum per parameter and a step count each


def test_predict_notes_buffers_and_frozen_parameters():
    def build():
        m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
        m[0].weight.requires_grad_(False)
        return m

    w = tiny(build=build)
    a = memory.predict(w, "fp32", 4)
    n_params = 4 * 8 + 8 + 8 + 8 + 8 * 3 + 3
    assert a.parameters == 4 * n_params and a.gradients == 4 * (n_params - 32)
    assert a.buffers == 4 * 8 + 4 * 8 + 8  # running mean, var (fp32) and the int64 batch count
    assert a.optimizer_state == 4 * (n_params - 32)
    assert a.notes == ("SGD: a momentum buffer per parameter",)
    assert a.workload == "tiny" and a.precision == "fp32" and a.batch_size == 4
    assert a.batch == 4 * 4 * 4 + 4 * 8
    o2 = memory.predict(w, "fp16-o2", 4)
    assert o2.master_weights == o2.master_gradients == 4 * (n_params - 32)
    assert o2.notes[1] == "fp16-o2: fp32 master weights and fp32 master gradients beside the fp16 model"
    bf = memory.predict(tiny(), "amp-bf16", 2)
    assert bf.notes == ("SGD: a momentum buffer per parameter",
                        "activations include autocast's low-precision copies of the weights")
    assert memory.predict(tiny(), "fp16-o2", 2).notes[-1].startswith("fp16-o2")
    with pytest.raises(ValueError, match="^batch_size must be >= 1"):
        memory.predict(tiny(), "fp32", 0)
    with pytest.raises(ValueError, match="unknown precision"):
        memory.predict(tiny(), "fp12", 2)


def test_predict_counts_the_forward_only_on_the_seeded_model():
    """Linear(4, 3) then square loss: pow keeps the Linear's output (2 x 3 fp32), nothing else
    in the forward; the backward's own tensors are not counted."""
    w = tiny(loss=lambda out, y: out.pow(2).mean())
    assert memory.predict(w, "fp32", 2).activations == 2 * 3 * 4
    assert memory.predict(w, "fp32", 5, seed=3).activations == 5 * 3 * 4
    conv = Workload(name="c", build=lambda: nn.Sequential(nn.Conv2d(2, 2, 1), nn.Flatten()),
                    batch=synthetic_batch((2, 2, 2), 8), loss=lambda out, y: out.pow(2).mean())
    assert memory.predict(conv, "fp32", 2, layout="channels_last").activations == 2 * 8 * 4
    with pytest.raises(ValueError, match="no convolution"):
        memory.predict(tiny(), "fp32", 2, layout="channels_last")


def test_the_forward_region_alone_counts():
    c = memory.SavedTensors()
    region = memory._forward_only(c)
    x = torch.randn(4, requires_grad=True)
    with region("backward"):
        x.exp()
    assert c.bytes == 0
    with region("forward"):
        x.exp()
    assert c.bytes == 16


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.ModuleList([nn.Linear(2, 2)])
        self.empty = nn.ModuleList()
        self.big = nn.ModuleList([nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)])
        self.head = nn.Linear(2, 1)


def test_repeated_blocks_are_the_largest_module_list_else_the_children():
    s = Stack()
    assert memory.repeated_blocks(s) == list(s.big)
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert memory.repeated_blocks(seq) == list(seq)
    holder = nn.Module()
    holder.empty = nn.ModuleList()
    holder.lin = nn.Linear(1, 1)
    assert memory.repeated_blocks(holder) == [holder.empty, holder.lin]


def test_checkpoint_modules_choices():
    s = Stack()
    assert memory.checkpoint_modules(s, "blocks") == list(s.big)
    assert memory.checkpoint_modules(Stack(), [s.head]) == [s.head]
    with pytest.raises(ValueError, match="^checkpoint needs 'blocks' or a non-empty list of the model's modules$"):
        memory.checkpoint_modules(Stack(), [nn.Linear(1, 1), "x"])
    with pytest.raises(ValueError, match="non-empty list"):
        memory.checkpoint_modules(Stack(), "layers")


def test_a_checkpointed_segment_counts_its_inputs_only_with_grad():
    lin = nn.Linear(3, 3)
    c = memory.SavedTensors()
    memory.checkpoint_modules(nn.Sequential(lin), [lin], c)
    x = torch.randn(2, 3)
    with torch.no_grad():
        lin(x)
    assert c.bytes == 0
    y = lin(x, )
    assert c.bytes == 2 * 3 * 4
    kw = torch.randn(5, 3)
    lin(input=kw)
    assert c.bytes == 2 * 3 * 4 + 5 * 3 * 4
    assert torch.allclose(y, x @ lin.weight.T + lin.bias)


def test_seconds_per_step_warms_up_then_takes_the_median(monkeypatch):
    calls = []

    class FakeStep:
        inputs_device = torch.device("cpu")

        def __call__(self):
            calls.append(1)

    clock = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # steps of 1, 3 and 2 s
    monkeypatch.setattr(memory.time, "perf_counter", lambda: next(clock))
    assert memory._seconds_per_step(FakeStep(), 3, 2) == 2.0
    assert len(calls) == 5


def test_checkpointing_row(monkeypatch):
    times = iter([0.5, 1.5])
    monkeypatch.setattr(memory, "_seconds_per_step", lambda step, steps, warmup: next(times))
    from test_memory import B, blocks_workload  # noqa: the same Blocks model, counted by hand there

    row = memory.checkpointing(blocks_workload(), "fp32", B)
    assert row["workload"] == "blocks" and row["precision"] == "fp32" and row["batch_size"] == B
    assert row["plain_step_s"] == 0.5 and row["checkpointed_step_s"] == 1.5
    assert row["slowdown"] == 3.0
    assert row["saved_bytes"] == row["plain_activations"] - row["checkpointed_activations"] > 0
    with pytest.raises(ValueError, match="^steps must be >= 1"):
        memory.checkpointing(blocks_workload(), "fp32", B, steps=0)
    with pytest.raises(ValueError, match="^warmup must be >= 0"):
        memory.checkpointing(blocks_workload(), "fp32", B, warmup=-1)


def test_checkpointing_times_the_steps_after_the_counted_one(monkeypatch):
    seen = []

    def timed(step, steps, warmup):
        seen.append((steps, warmup))
        before = step.workload  # the counter is off now: more steps change no count
        step()
        return 1.0 if before else 0.0

    monkeypatch.setattr(memory, "_seconds_per_step", timed)
    from test_memory import B, blocks_workload  # noqa

    row = memory.checkpointing(blocks_workload(), "fp32", B, steps=4, warmup=0)
    assert seen == [(4, 0), (4, 0)]
    plain = memory.predict(blocks_workload(), "fp32", B).activations
    assert row["plain_activations"] == plain
    ck = memory.predict(blocks_workload(), "fp32", B, checkpoint="blocks").activations
    assert row["checkpointed_activations"] == ck < plain


# ----------------------------------------------------------------------------- a fake CUDA

class FakeCuda:
    """torch.cuda's counters as the test sets them; records the calls made."""

    def __init__(self, allocated, peak, reserved=None):
        self.allocated = list(allocated)
        self.peak, self.reserved, self.calls = peak, reserved, []

    def install(self, monkeypatch):
        cuda = torch.cuda
        for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
            monkeypatch.setattr(cuda, name, lambda *a, _n=name: self.calls.append(_n))
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "memory_allocated", lambda *a: self.allocated.pop(0))
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda *a: self.peak)
        stats = {} if self.reserved is None else {"reserved_bytes.all.peak": self.reserved}
        monkeypatch.setattr(cuda, "memory_stats", lambda *a: stats)
        monkeypatch.setattr(cuda.memory, "_record_memory_history",
                            lambda *a, **k: self.calls.append(("history", a, k)))
        monkeypatch.setattr(cuda.memory, "_snapshot", lambda: {"segments": ["s"]})
        monkeypatch.setattr(memory, "_start_cublas", lambda: self.calls.append("cublas"))


def fake_train_step(log):
    def make(workload, precision, device, batch_size, *, layout, seed):
        log.append(("built", precision, device, batch_size, layout, seed))
        return lambda: log.append("step")
    return make


def test_measure_peak_reads_the_counters_around_the_steps(monkeypatch):
    cuda = FakeCuda(allocated=[1000, 1600], peak=5000, reserved=8000)
    cuda.install(monkeypatch)
    log = []
    monkeypatch.setattr(memory, "train_step", fake_train_step(log))
    row = memory.measure_peak(tiny(), "amp-fp16", 8, steps=2, layout="channels_last", seed=3)
    assert row == {"workload": "tiny", "precision": "amp-fp16", "batch_size": 8,
                   "peak_bytes": 4000, "allocated_bytes": 600, "reserved_peak_bytes": 8000}
    assert log == [("built", "amp-fp16", "cuda", 8, "channels_last", 3), "step", "step"]
    # cuBLAS's workspaces made first, outside the window measured
    assert cuda.calls == ["cublas", "synchronize", "empty_cache", "synchronize",
                          "reset_peak_memory_stats", "synchronize"]


def test_measure_peak_with_a_snapshot_stops_the_history(monkeypatch):
    cuda = FakeCuda(allocated=[0, 0], peak=10)
    cuda.install(monkeypatch)
    monkeypatch.setattr(memory, "train_step", fake_train_step([]))
    row = memory.measure_peak(tiny(), "fp32", 2, steps=1, snapshot=True)
    assert row["snapshot"] == {"segments": ["s"]} and row["reserved_peak_bytes"] == 0
    history = [c for c in cuda.calls if c[0] == "history"]
    assert history == [("history", (), {"max_entries": 200_000}), ("history", (), {"enabled": None})]
    cuda.allocated.extend([0, 0])
    cuda.calls.clear()
    assert "snapshot" not in memory.measure_peak(tiny(), "fp32", 2)
    assert not [c for c in cuda.calls if c[0] == "history"]
    with pytest.raises(ValueError, match="^steps must be >= 1"):
        memory.measure_peak(tiny(), "fp32", 2, steps=0)
    with pytest.raises(TypeError, match="^snapshot must be True or False"):
        memory.measure_peak(tiny(), "fp32", 2, snapshot=1)


def test_a_failing_step_still_stops_the_history(monkeypatch):
    cuda = FakeCuda(allocated=[0, 0], peak=10)
    cuda.install(monkeypatch)

    def boom():
        raise RuntimeError("oom")

    monkeypatch.setattr(memory, "train_step", lambda *a, **k: boom)
    with pytest.raises(RuntimeError, match="oom"):
        memory.measure_peak(tiny(), "fp32", 2, snapshot=True)
    assert cuda.calls[-1] == ("history", (), {"enabled": None})


def test_compare_divides_the_prediction_by_the_measured_peak(monkeypatch):
    seen = []

    def peak(workload, precision, batch_size, *, layout, seed, steps):
        seen.append((precision, batch_size, layout, seed, steps))
        return {"peak_bytes": 1000}

    monkeypatch.setattr(memory, "measure_peak", peak)
    cleared = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: cleared.append(1))
    predicted = memory.predict(tiny(), "amp-bf16", 4, seed=2).peak
    row = memory.compare(tiny(), "amp-bf16", 4, seed=2, steps=5)
    assert row["peak"] == predicted and row["measured_peak"] == 1000
    assert row["ratio"] == predicted / 1000 and row["notes"].startswith("SGD")
    assert seen == [("amp-bf16", 4, "nchw", 2, 5)] and cleared == []

    made = []
    real = memory.predict

    def on(workload, precision, batch_size, **kw):
        made.append(kw["device"])
        return real(workload, precision, batch_size, **{**kw, "device": "cpu"})

    monkeypatch.setattr(memory, "predict", on)
    memory.compare(tiny(), "fp32", 2, count_on="cuda")
    assert made == ["cuda"] and cleared == [1]


class KeywordBlocks(nn.Module):
    """Linear 4->8, then a Linear 8->8 called with its input as a keyword, then a Linear 8->3."""

    def __init__(self):
        super().__init__()
        self.first, self.block, self.head = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.block(input=self.first(x)))


def test_a_checkpointed_segments_keyword_input_is_counted():
    """Every child checkpointed: each keeps its input for the recomputation (the batch is not
    counted again), and pow keeps the output: 8 + 8 + 3 fp32 values per sample."""
    w = tiny(build=KeywordBlocks, loss=lambda out, y: out.pow(2).mean())
    B = 2
    assert memory.predict(w, "fp32", B, checkpoint="blocks").activations == 4 * B * (8 + 8 + 3)
    row = memory.checkpointing(w, "fp32", B, steps=1, warmup=0)
    assert row["checkpointed_activations"] == 4 * B * (8 + 8 + 3)


def test_the_targets_are_the_batch_not_activations():
    """(out * y).sum() keeps y, the targets, for out's gradient: the batch, counted as the batch."""
    w = Workload(name="t", build=lambda: nn.Linear(4, 3),
                 batch=lambda size, device: (torch.ones(size, 4), torch.full((size, 3), 2.0)),
                 loss=lambda out, y: (out * y).sum())
    a = memory.predict(w, "fp32", 5)
    assert a.activations == 0 and a.batch == 5 * 4 * 4 + 5 * 3 * 4


class Masked(nn.Module):
    """Keeps only the positive outputs: how much it saves depends on the weights (the seed)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 64)

    def forward(self, x):
        y = self.lin(x)
        return y[y > 0].exp()


def _masked_bytes(seed, batch=3):
    """exp keeps its output: 4 bytes per positive value of the seeded model on the batch."""
    torch.manual_seed(seed)
    model = Masked()
    x, _ = synthetic_batch((4,), 3)(batch, "cpu")
    return 4 * int((model.lin(x) > 0).sum())


MASK = 3 * 64  # the boolean mask of a batch of 3


def masked() -> Workload:
    return tiny(build=Masked, loss=lambda out, y: out.sum())


def test_the_seed_builds_the_model_that_is_counted():
    """exp keeps its output (4 bytes per positive value); the boolean indexing keeps its mask
    (1 byte per value of the 3 x 64 output)."""
    counts = {seed: _masked_bytes(seed) for seed in (0, 1, 2)}
    assert len(set(counts.values())) == 3  # three seeds, three different counts
    assert memory.predict(masked(), "fp32", 3).activations == counts[0] + MASK
    assert memory.predict(masked(), "fp32", 3, seed=1).activations == counts[1] + MASK


def test_checkpointing_and_compare_pass_the_seed(monkeypatch):
    monkeypatch.setattr(memory, "_seconds_per_step", lambda step, steps, warmup: 1.0)
    assert memory.checkpointing(masked(), "fp32", 3)["plain_activations"] == _masked_bytes(0) + MASK
    assert memory.checkpointing(masked(), "fp32", 3, seed=2)["plain_activations"] == \
        _masked_bytes(2) + MASK
    monkeypatch.setattr(memory, "measure_peak", lambda *a, **k: {"peak_bytes": 1})
    assert memory.compare(masked(), "fp32", 3)["activations"] == _masked_bytes(0) + MASK
    assert memory.compare(masked(), "fp32", 3, seed=1)["activations"] == _masked_bytes(1) + MASK


def test_a_half_model_keeps_half_optimizer_state():
    """A model built in fp16 and trained as it is (fp32 precision, no master copy): SGD's
    momentum is in the parameters' dtype, 2 bytes each."""
    w = Workload(name="half", build=lambda: nn.Linear(4, 3).half(),
                 batch=lambda size, device: (torch.ones(size, 4, dtype=torch.float16),
                                             torch.zeros(size, dtype=torch.long)))
    a = memory.predict(w, "fp32", 2)
    assert a.parameters == a.gradients == a.optimizer_state == 2 * (4 * 3 + 3)


def test_seconds_per_step_synchronizes_around_each_cuda_step(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(1))

    class FakeStep:
        inputs_device = torch.device("cuda")

        def __call__(self):
            synced.append("step")

    memory._seconds_per_step(FakeStep(), 2, 1)
    assert synced == ["step", 1, "step", 1, 1, "step", 1]
    synced.clear()
    FakeStep.inputs_device = torch.device("cpu")
    memory._seconds_per_step(FakeStep(), 2, 0)
    assert synced == ["step", "step"]


def test_checkpointing_defaults_and_its_counter_off_while_timing(monkeypatch):
    counters = []

    class Recording(memory.SavedTensors):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            counters.append(self)

    monkeypatch.setattr(memory, "SavedTensors", Recording)
    seen = []

    def timed(step, steps, warmup):
        seen.append((steps, warmup))
        before = counters[-1].bytes
        step()
        assert counters[-1].bytes == before  # the timed steps count nothing more
        return 1.0

    monkeypatch.setattr(memory, "_seconds_per_step", timed)
    from test_memory import B, blocks_workload  # noqa

    memory.checkpointing(blocks_workload(), "fp32", B)
    assert seen == [(5, 2), (5, 2)]
    assert len(counters) == 2 and all(c.active is False for c in counters)


def test_measure_peak_and_compare_defaults(monkeypatch):
    cuda = FakeCuda(allocated=[0, 0], peak=10)
    cuda.install(monkeypatch)
    log = []
    w = tiny()

    real = memory.train_step

    def make(workload, precision, device, batch_size, *, layout, seed, **kw):
        assert workload is w
        if device != "cuda":  # predict's counted step, on the CPU
            return real(workload, precision, device, batch_size, layout=layout, seed=seed, **kw)
        return fake_train_step(log)(workload, precision, device, batch_size, layout=layout, seed=seed)

    monkeypatch.setattr(memory, "train_step", make)
    memory.measure_peak(w, "fp32", 2)
    assert log == [("built", "fp32", "cuda", 2, "nchw", 0), "step", "step", "step"]

    seen = []

    def peak(workload, precision, batch_size, *, layout, seed, steps):
        assert workload is w
        seen.append((layout, seed, steps))
        return {"peak_bytes": 1000}

    monkeypatch.setattr(memory, "measure_peak", peak)
    memory.compare(w, "fp32", 2)
    assert seen == [("nchw", 0, 3)]
    with pytest.raises(ValueError, match="cannot run layout 'channels_last'"):
        memory.compare(w, "fp32", 2, layout="channels_last")  # the prediction takes the layout


def test_measure_peak_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="^measure_peak needs a CUDA device; torch sees none$"):
        memory.measure_peak(tiny(), "fp32", 2)
