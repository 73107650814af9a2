"""Notebook 10's exercises: a near-miss wrong answer for every check, each told what is wrong,
and SmallCNN's shapes and counts worked out by hand."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from fp16lab.exercises import ch10
from fp16lab.recipes import LR, MOMENTUM
from fp16lab.workload import Workload
from fp16lab.workloads.batches import loader_batch, synthetic_batch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: SmallCNN's parameters, by hand: conv 3->16 (3x3), conv 16->32 (3x3), linear 32->10.
N = (3 * 16 * 9 + 16) + (16 * 32 * 9 + 32) + (32 * 10 + 10)


def workload(batch=None, build=ch10.SmallCNN, **kw) -> Workload:
    return Workload(name="small-cnn", build=build,
                    batch=batch or synthetic_batch((3, 32, 32), num_classes=10), **kw)


def test_small_cnn_keeps_the_image_size_through_each_convolution():
    shapes = []
    model = ch10.SmallCNN()
    for layer in model.features:
        layer.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    out = model(torch.randn(2, 3, 32, 32))
    # padding 1 keeps 32 x 32, the 2 x 2 max-pool halves it, the last pool averages it away
    assert shapes == [(2, 16, 32, 32), (2, 16, 32, 32), (2, 16, 16, 16), (2, 32, 16, 16),
                      (2, 32, 16, 16), (2, 32, 1, 1)]
    assert out.shape == (2, 10) and sum(p.numel() for p in model.parameters()) == N
    assert isinstance(model.features[1], nn.ReLU) and isinstance(model.features[4], nn.ReLU)
    assert isinstance(model.features[2], nn.MaxPool2d)
    x = torch.randn(1, 3, 32, 32)
    assert (model.features[:2](x) >= 0).all()  # the ReLU follows the convolution
    pooled = model.features[:3](x)
    assert torch.equal(pooled, nn.functional.max_pool2d(model.features[:2](x), 2))
    features = model.features(x).flatten(1)
    assert torch.allclose(model(x), model.head(features))


def test_q1_the_right_answer_reports_the_falling_loss():
    fb = ch10.q1.check(workload())
    assert fb.correct
    m = re.fullmatch(r"your workload trains: 8 amp-bf16 steps in channels_last on a CPU took the "
                     r"loss from (\d+\.\d{3}) to (\d+\.\d{3})\. Every engine of fp16lab takes it now\.",
                     fb.message)
    assert m and float(m.group(2)) < float(m.group(1))
    assert ch10.q1.check(lambda: workload()).correct


def test_q1_wrong_kinds_and_shapes():
    assert ch10.q1.check(3).message == "give a Workload (or a function returning one), not int."
    assert ch10.q1.check(lambda: "w").message == \
        "give a Workload (or a function returning one), not str."
    assert ch10.q1.check(workload(build=lambda: nn.Linear(4, 2))).message == \
        "build() should return a fresh SmallCNN, it returned Linear."

    def dict_batch(size, device):
        return {"x": torch.zeros(size, 3, 32, 32)}, torch.zeros(size, dtype=torch.long)

    assert ch10.q1.check(workload(batch=dict_batch)).message == \
        "batch(8, 'cpu') should give images of shape (8, 3, 32, 32), got dict."
    assert ch10.q1.check(workload(batch=synthetic_batch((3, 32, 31), 10))).message == \
        "batch(8, 'cpu') should give images of shape (8, 3, 32, 32), got (8, 3, 32, 31)."


@pytest.mark.parametrize("targets", [
    torch.zeros(8, dtype=torch.int32),                         # not torch.long
    torch.zeros(7, dtype=torch.long),                          # not 8 of them
    torch.zeros(8, 1, dtype=torch.long),                       # not one label each
    torch.tensor([0, 1, 2, 3, 4, 5, 6, -1]),                   # one below 0
    torch.tensor([0, 1, 2, 3, 4, 5, 6, 10]),                   # one above 9
    [0] * 8,                                                   # not a tensor
], ids=["int32", "seven", "column", "negative", "ten", "list"])
def test_q1_targets_must_be_8_long_labels_from_0_to_9(targets):
    w = workload(batch=lambda size, device: (torch.zeros(size, 3, 32, 32), targets))
    assert ch10.q1.check(w).message == "the targets should be 8 class labels (torch.long) between 0 and 9."


def test_q1_labels_0_and_9_are_fine():
    labels = torch.tensor([0, 9, 0, 9, 1, 2, 3, 4])
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert ch10.q1.check(workload(batch=lambda size, device: (x, labels))).correct


def test_q1_what_fp16lab_cannot_train_or_what_does_not_learn():
    fb = ch10.q1.check(workload(precisions=("fp32",)))
    assert fb.message == ("fp16lab could not train it: workload 'small-cnn' cannot run precision "
                          "'amp-bf16': it runs fp32")
    nan = ch10.q1.check(workload(loss=lambda out, y: out.float().sum() * float("nan")))
    assert nan.message == f"the loss went non-finite in 8 amp-bf16 steps: {[float('nan')] * 8}."
    flat = ch10.q1.check(workload(loss=lambda out, y: out.float().sum() * 0 + 1.0))
    assert flat.message == ("8 steps on one batch did not lower the loss (1.000 -> 1.000): is the "
                            "batch the same on every call?")


def test_q2_near_misses_each_say_what_they_count():
    right = 12 * N
    fb = ch10.q2.check(right)
    assert fb.correct and fb.message == (
        f"{right:,} bytes: {N:,} parameters x 4 bytes, three times (the weights, their gradients, "
        "SGD's momentum), all fp32. The activations come on top and grow with the batch.")
    assert ch10.q2.check(float(right)).correct and ch10.q2.check(f"{right}").correct
    assert ch10.q2.check(8 * N).message == ("that counts the weights and the gradients; SGD with "
                                            "momentum keeps one more tensor per parameter.")
    assert ch10.q2.check(N).message == ("that is the number of parameters; each fp32 value takes 4 "
                                        "bytes, and the step keeps more than one copy.")
    assert ch10.q2.check(4 * N).message == ("that is the weights alone; the step also keeps their "
                                            "gradients and SGD's momentum.")
    for near in (right - 1, right + 1, 8 * N + 1, N - 1, 4 * N + 4, 2 * N, 16 * N):
        fb = ch10.q2.check(near)
        assert not fb.correct
        assert fb.message == (f"{near:,.0f} is not it: count the parameters (sum of p.numel()), "
                              "then the bytes of each fp32 copy the step keeps.")
    assert ch10.q2.check("many").message == "give a number of bytes, not str 'many'."
    assert ch10.q2.check(None).message == "give a number of bytes, not NoneType None."


def test_q2_parts_are_the_fp32_sgd_account():
    assert ch10._q2_parts() == {"parameters": 4 * N, "gradients": 4 * N, "optimizer_state": 4 * N}


def test_the_questions_hints_and_solutions():
    assert ch10.q1.name == "q1" and ch10.q2.name == "q2"
    assert eval(ch10.q2.solution().code, {"SmallCNN": ch10.SmallCNN}) == 12 * N
    scope: dict = {}
    code = ch10.q1.solution().code
    *imports, last_a, last_b = code.splitlines()
    exec("\n".join(imports) + "\nw = " + last_a + "\n" + last_b, scope)
    assert ch10.q1.check(scope["w"]).correct
    assert ch10.q1.time_limit_s == 60.0
    assert "synthetic_batch" in ch10.q1.hint().message


def scripted(values) -> Workload:
    """SmallCNN whose loss returns these values, one per step (the gradients are zero)."""
    it = iter(values)
    return workload(loss=lambda out, y: out.float().sum() * 0 + next(it))


def test_q1_compares_the_last_loss_with_the_first():
    fb = ch10.q1.check(scripted([1.0, 0.5, 0.7, 0.7, 0.7, 0.7, 0.6, 1.2]))
    assert fb.message == ("8 steps on one batch did not lower the loss (1.000 -> 1.200): is the "
                          "batch the same on every call?")
    fb = ch10.q1.check(scripted([1.0, 0.2, 0.3, 0.3, 0.3, 0.3, 0.4, 0.5]))
    assert fb.correct and "took the loss from 1.000 to 0.500." in fb.message


def test_q1_reports_the_losses_of_a_bare_bf16_loop():
    torch.manual_seed(0)
    model = ch10.SmallCNN().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = synthetic_batch((3, 32, 32), num_classes=10)(8, "cpu")
    x = x.contiguous(memory_format=torch.channels_last)
    losses = []
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    fb = ch10.q1.check(workload())
    assert f"took the loss from {losses[0]:.3f} to {losses[-1]:.3f}." in fb.message


def test_q1_trains_in_channels_last_a_batch_of_8_on_the_cpu():
    fb = ch10.q1.check(workload(layouts=("nchw",)))
    assert fb.message == ("fp16lab could not train it: workload 'small-cnn' cannot run layout "
                          "'channels_last': it accepts nchw")
    data = torch.utils.data.TensorDataset(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    from_loader = workload(batch=loader_batch(torch.utils.data.DataLoader(data, batch_size=8)))
    assert ch10.q1.check(from_loader).correct  # a loader of batches of 8 is asked for 8

    def on_the_device(size, device):
        device = torch.device(device)  # a learner's batch may read the device it is given
        gen = torch.Generator().manual_seed(0)
        return (torch.randn(size, 3, 32, 32, generator=gen).to(device),
                torch.randint(0, 10, (size,), generator=gen).to(device))

    assert ch10.q1.check(workload(batch=on_the_device)).correct
