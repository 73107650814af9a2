"""Exercises of notebook 08: right answers pass, each typical wrong answer gets its own message."""

from __future__ import annotations

import torch

from fp16lab.exercises import ch08


def test_q1_scaling_efficiency():
    assert ch08.q3.check(ch08.Q3_TWO / (2 * ch08.Q3_ONE))
    assert ch08.q3.check(round(ch08.Q3_TWO / (2 * ch08.Q3_ONE), 3))
    assert "speed-up" in ch08.q3.check(ch08.Q3_TWO / ch08.Q3_ONE).message
    assert "percentage" in ch08.q3.check(100 * ch08.Q3_TWO / (2 * ch08.Q3_ONE)).message
    right = ch08.Q3_TWO / (2 * ch08.Q3_ONE)
    f = ch08.q3.check(1 - right)
    assert not f and "missing" in f.message
    f = ch08.q3.check(1 / right)
    assert not f and "upside down" in f.message
    f = ch08.q3.check((ch08.Q3_TWO - ch08.Q3_ONE) / ch08.Q3_ONE)
    assert not f and "second GPU added" in f.message
    f = ch08.q3.check(0.5)
    assert not f and "twice the 1-GPU rate" in f.message
    assert "give a number" in ch08.q3.check("fast").message
    assert ch08.q3.check().kind == "missing"


def test_q2_ring_allreduce_time():
    nbytes = 300e6 * 4
    right_ms = 2 * 7 / 8 * nbytes / 400e9 * 1e3  # 5.25 ms, by hand
    assert ch08.q4.check(right_ms)
    assert ch08.q4.check(5.25)
    assert "2 (n-1)/n" in ch08.q4.check(nbytes / 400e9 * 1e3).message
    assert "2-byte" in ch08.q4.check(right_ms / 2).message
    assert "milliseconds" in ch08.q4.check(right_ms / 1e3).message
    assert not ch08.q4.check(1.0)


def test_q3_fp16_hook_overflows_before_dividing():
    # torch's own casts as the oracle: fp16(70000) is inf, so the hook's average is inf
    wire = torch.tensor(ch08.Q1_GRADS, dtype=torch.float32).to(torch.float16).div_(2)
    expected = float(wire.sum())
    assert expected == float("inf")
    assert ch08.q1.check(expected)
    assert ch08.q1.check("inf")
    assert "fp32 average" in ch08.q1.check(60000.0).message
    assert not ch08.q1.check(65504.0)


def test_q4_every_rank_skips():
    assert ch08.q2.check({0, 1})
    assert ch08.q2.check([1, 0])
    assert "all-reduced" in ch08.q2.check({1}).message
    assert "someone must skip" in ch08.q2.check(set()).message
    assert not ch08.q2.check({0})
    assert "set of integers" in ch08.q2.check(1).message


def test_hints_and_solutions_are_there():
    for q in (ch08.q3, ch08.q4, ch08.q1, ch08.q2):
        assert q.hint().message and q.solution().message


# -- ddp_loop: the learner's DDP + AMP loop, run as one gloo rank ---------------------------------
import inspect  # noqa: E402

import pytest  # noqa: E402

def _reference_source() -> str:
    """The reference loop's source as ch08.py has it, read from the file: under mutation
    testing the function is a trampoline, and the original carries mutmut's name for it."""
    import ast
    import pathlib

    text = pathlib.Path(inspect.getsourcefile(ch08)).read_text()
    names = ("reference_ddp_amp_loop", "x_reference_ddp_amp_loop__mutmut_orig")
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in names)
    return ast.get_source_segment(text, node).replace(node.name, names[0], 1) + "\n"


_SOURCE = _reference_source()


def _variant(old: str, new: str):
    """The reference loop with one line changed: a wrong answer a learner could write. A
    sampler without set_epoch loses that line too (the learner's next mistake would be its error)."""
    assert old in _SOURCE, old
    source = _SOURCE.replace(old, new)
    if new.startswith("sampler = None"):
        source = source.replace("        sampler.set_epoch(epoch)\n", "")
    if "RandomSampler" in new and new.endswith("\n"):
        source = source.replace("        sampler.set_epoch(epoch)\n", "")
    scope = {}
    exec(ch08.LOOP_IMPORTS + "\n" + source, scope)
    return scope["reference_ddp_amp_loop"]


def test_ddp_loop_right_answer():
    result = ch08.ddp_loop.check(ch08.reference_ddp_amp_loop)
    assert result, result.message
    assert "bit for bit" in result.message
    assert "def ddp_amp_loop" in ch08.ddp_loop.solution().code


@pytest.mark.parametrize("old, new, words", [
    ("            scaler.update()\n", "", "GradScaler.update() is never called"),
    ("        sampler.set_epoch(epoch)\n", "", "every epoch sees the same order"),
    ("model = DDP(model.to(device))", "model = model.to(device)", "not wrapped in DistributedDataParallel"),
    ('    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")\n', "",
     "process group was never started"),
    ("with torch.autocast(device.type, dtype=torch.float16):", "if True:", "ran in fp32"),
    ("scaler.scale(loss).backward()", "loss.backward()", "unscaled"),
    ("scaler.step(opt)", "opt.step()", "stepped without GradScaler"),
    ("sampler = DistributedSampler(dataset)", "sampler = torch.utils.data.RandomSampler(dataset)",
     "not a DistributedSampler"),
    ("sampler = DistributedSampler(dataset)\n", "sampler = None\n", "fixed order 0, 1, 2"),
    ("sampler = DistributedSampler(dataset)\n", "sampler = torch.utils.data.RandomSampler(dataset)\n",
     "not drawn by a DistributedSampler"),
    ("    dist.destroy_process_group()\n", "", "still open"),
    ("lr=0.05", "lr=0.1", "differ from the reference"),
])
def test_ddp_loop_wrong_loops_say_what_is_wrong(old, new, words):
    result = ch08.ddp_loop.check(_variant(old, new))
    assert not result and words in result.message, result.message


def test_ddp_loop_wrong_kinds():
    assert "without calling it" in ch08.ddp_loop.check(3).message
    assert "(model, dataset, epochs, batch_size, device)" in ch08.ddp_loop.check(lambda m: m).message
    assert "must return (model, scales)" in ch08.ddp_loop.check(lambda m, d, e, b, dev: None).message


def _variant_of(*changes: tuple[str, str]):
    """The reference loop with several lines changed (each old text must be there)."""
    source = _SOURCE
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    scope = {}
    exec(ch08.LOOP_IMPORTS + "\n" + source, scope)
    return scope["reference_ddp_amp_loop"]


_NO_SCALER_CALLS = (("scaler.scale(loss).backward()", "loss.backward()"),
                    ("            scaler.step(opt)\n", "            opt.step()\n"),
                    ("            scaler.update()\n", ""))
_ONE_STEP_THEN_RETURN = ("            scales.append(scaler.get_scale())\n",
                         "            scales.append(scaler.get_scale())\n"
                         "            dist.destroy_process_group()\n"
                         "            return model, scales\n")


@pytest.mark.parametrize("changes, words", [
    # no GradScaler at all: plain backward and step
    ((("scaler = torch.amp.GradScaler(device.type)", "scaler = None"), *_NO_SCALER_CALLS,
      ("scales.append(scaler.get_scale())", "scales.append(1.0)")), "no GradScaler was made"),
    # a GradScaler made, and only its scale read
    (_NO_SCALER_CALLS, "so small fp16 gradients do not underflow"),
    # scaled backward, then a plain optimizer step and no update
    ((("            scaler.step(opt)\n", "            opt.step()\n"),
      ("            scaler.update()\n", "")), "scaler.step(opt) is never called"),
    # one step through the scaler and no update (it returns before a second step can complain)
    ((("            scaler.update()\n", ""), _ONE_STEP_THEN_RETURN),
     "call it after scaler.step(opt) in every step"),
    # one batch per epoch
    ((("            scales.append(scaler.get_scale())\n",
       "            scales.append(scaler.get_scale())\n            break\n"),),
     "the loop read 8 samples in 2 epochs of 24"),
    # the model alone returned
    ((("    return model, scales\n", "    return model\n"),), "must return (model, scales)"),
])
def test_ddp_loop_answers_that_run_but_miss_a_part_hear_which(changes, words):
    result = ch08.ddp_loop.check(_variant_of(*changes))
    assert not result and words in result.message, result.message


def test_ddp_loop_skeleton_is_named_unwritten():
    def skeleton(model, dataset, epochs, batch_size, device):
        model = ...
        model.parameters()
    assert "still has a ..." in ch08.ddp_loop.check(skeleton).message
