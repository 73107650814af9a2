"""Loss scalers: fp16lab's rule checked step by step against torch.amp.GradScaler itself."""

from __future__ import annotations

import math
import os
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp16lab.scaling import (COLLAPSE_CAUSES, DynamicLossScaler, GradScalerRecorder,
                             ScaleCollapseMonitor, ScaleCollapseWarning, ScaleEvent, ScalerSettings,
                             StaticLossScaler, classify_skips, events_frame,
                             replay_with_gradscaler, simulate_dynamic)

F32_MAX = float(np.finfo(np.float32).max)

# One gradient value per parameter per step: finite, +inf, -inf or NaN.
grad_value = st.sampled_from([0.5, -3.0, 1e-3, 0.0, math.inf, -math.inf, math.nan])


@st.composite
def scaler_case(draw):
    n_params = draw(st.integers(1, 4))
    n_steps = draw(st.integers(1, 40))
    p_bad = draw(st.sampled_from([0.0, 0.05, 0.3, 0.9]))
    steps = []
    for _ in range(n_steps):
        row = []
        for _ in range(n_params):
            bad = draw(st.floats(0, 1)) < p_bad
            row.append(draw(st.sampled_from([math.inf, -math.inf, math.nan])) if bad
                       else draw(st.sampled_from([0.5, -3.0, 1e-3, 0.0])))
        steps.append(row)
    params = dict(
        init_scale=draw(st.one_of(
            st.sampled_from([2.0**16, 1.0, 2.0**127, F32_MAX, 2.0**-126, 1.2e-38, 3.0]),
            st.floats(2.0**-126, F32_MAX, width=32))),
        growth_factor=draw(st.one_of(st.sampled_from([2.0, 1.5, 1.0001, 10.0]),
                                     st.floats(1.0, 100.0, exclude_min=True))),
        backoff_factor=draw(st.one_of(st.sampled_from([0.5, 0.25, 0.9999, 0.1]),
                                      st.floats(2.0**-126, 1.0, exclude_max=True))),
        growth_interval=draw(st.integers(1, 6)),
    )
    return params, steps


def _counting_sgd(n_params):
    """Returns (params, an SGD optimizer, a list that grows by one at every real optimizer step)."""
    ps = [torch.nn.Parameter(torch.zeros(3)) for _ in range(n_params)]
    opt = torch.optim.SGD(ps, lr=0.0)
    calls = []
    real_step = opt.step
    opt.step = lambda *a, **k: (calls.append(1), real_step(*a, **k))[1]
    return ps, opt, calls


def _drive_torch(params, steps):
    """Returns [(scale used, skipped, scale after)] for torch.amp.GradScaler('cpu')."""
    ps, opt, calls = _counting_sgd(len(steps[0]))
    scaler = torch.amp.GradScaler("cpu", **params)
    scaler.scale(torch.ones(()))  # GradScaler creates its scale tensor lazily here
    out = []
    for row in steps:
        for p, v in zip(ps, row):
            p.grad = torch.full((3,), v)
        used = scaler.get_scale()
        n = len(calls)
        scaler.step(opt)
        scaler.update()
        out.append((used, len(calls) == n, scaler.get_scale()))
    return out


def _drive_ours(params, steps):
    ps, opt, calls = _counting_sgd(len(steps[0]))
    scaler = DynamicLossScaler(**params)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScaleCollapseWarning)
        for row in steps:
            for p, v in zip(ps, row):
                p.grad = torch.full((3,), v)
            used = scaler.get_scale()
            n = len(calls)
            scaler.scale(torch.ones(()))  # an iteration scales its loss before it steps
            scaler.step(opt)
            ev = scaler.update()
            assert ev.skipped == (len(calls) == n)
            out.append((used, len(calls) == n, scaler.get_scale()))
    return out, scaler


def _steps_in_normal_range(theirs) -> int:
    """Returns how many leading steps leave torch's scale at or above float32's smallest normal
    (2**-126): up to there the scalers follow torch exactly; torch's next backoff goes below it
    (towards 0), where theirs stops at 2**-126."""
    return next((i for i, t in enumerate(theirs) if np.float32(t[2]) < 2.0**-126), len(theirs))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scaler_case())
def test_dynamic_scaler_matches_torch_gradscaler_every_step(case):
    params, steps = case
    theirs = _drive_torch(params, steps)
    ours, scaler = _drive_ours(params, steps)
    n = _steps_in_normal_range(theirs)
    if n < len(theirs):  # the step where torch's scale leaves float32's normal range
        assert (np.float32(ours[n][0]), ours[n][1], ours[n][2]) == (
            np.float32(theirs[n][0]), theirs[n][1], 2.0**-126), (n, params, ours[n], theirs[n])
        theirs, ours, scaler.history = theirs[:n], ours[:n], scaler.history[:n]
    for i, (t, o) in enumerate(zip(theirs, ours)):
        # exact equality: both hold the scale in float32
        assert np.float32(o[0]) == np.float32(t[0]) or (math.isnan(o[0]) and math.isnan(t[0])), \
            (i, params, o, t)
        assert o[1] == t[1], (i, params, o, t)
        assert np.float32(o[2]) == np.float32(t[2]), (i, params, o, t)
    # history mirrors what happened
    assert [e.skipped for e in scaler.history] == [t[1] for t in theirs]
    assert [e.scale for e in scaler.history] == [np.float32(t[0]) for t in theirs]


@settings(max_examples=100, deadline=None)
@given(scaler_case())
def test_pure_state_machine_matches_grad_driven(case):
    params, steps = case
    flags = [any(not math.isfinite(v) for v in row) for row in steps]
    hist = simulate_dynamic(flags, **params)
    theirs = _drive_torch(params, steps)
    n = _steps_in_normal_range(theirs)
    if n < len(theirs):
        assert hist[n].next_scale == 2.0**-126  # torch's goes below (towards 0); ours stops
        hist, theirs = hist[:n], theirs[:n]
    assert [e.next_scale for e in hist] == [float(np.float32(t[2])) for t in theirs]
    assert [e.skipped for e in hist] == [t[1] for t in theirs]


def test_never_grows_to_inf_like_torch():
    hist = simulate_dynamic([False] * 3, init_scale=F32_MAX, growth_interval=1)
    assert all(e.next_scale == F32_MAX for e in hist)


def test_growth_after_interval_then_counter_resets():
    hist = simulate_dynamic([False] * 7, init_scale=4.0, growth_interval=3)
    assert [e.next_scale for e in hist] == [4, 4, 8, 8, 8, 16, 16]


def test_backoff_resets_counter():
    hist = simulate_dynamic([False, False, True, False, False, False], init_scale=8.0,
                            growth_interval=3)
    assert [e.next_scale for e in hist] == [8, 8, 4, 4, 4, 8]


def test_apex_floor_and_ceiling():
    hist = simulate_dynamic([True] * 5, init_scale=8.0, min_scale=2.0)
    assert [e.next_scale for e in hist] == [4, 2, 2, 2, 2]
    hist = simulate_dynamic([False] * 4, init_scale=8.0, growth_interval=1, growth_factor=3.0,
                            max_scale=50.0)
    assert [e.next_scale for e in hist] == [24, 50, 50, 50]


@pytest.mark.parametrize("kwargs, words", [
    (dict(growth_factor=1.0), "growth_factor must be > 1"),
    (dict(growth_factor=0.5), "growth_factor"),
    (dict(backoff_factor=1.0), "backoff_factor must be > 0 and < 1"),
    (dict(backoff_factor=0.0), "backoff_factor must be > 0 and < 1"),
    (dict(backoff_factor=-0.5), "backoff_factor must be > 0 and < 1"),
    (dict(growth_interval=0), "integer from 1"),
    (dict(growth_interval=2.5), "integer from 1"),
    (dict(init_scale=math.inf), "must be finite"),
    (dict(init_scale=math.nan), "must be finite"),
    (dict(init_scale=1e39), "fits in float32"),
    (dict(init_scale=0.0), "finite positive"),
    (dict(min_scale=4.0, max_scale=2.0), "min_scale must be <= max_scale"),
    (dict(init_scale=1.0, min_scale=2.0), "within"),
])
def test_bad_parameters_raise_value_error(kwargs, words):
    with pytest.raises(ValueError, match=words):
        DynamicLossScaler(**kwargs)


def test_static_scaler_keeps_scale_and_skips_nonfinite_steps():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    s = StaticLossScaler(1024.0)
    loss = (p * 3.0).sum()
    s.scale(loss).backward()
    assert torch.equal(p.grad, torch.full((2,), 3072.0))  # torch's own chain rule is the oracle
    s.step(opt)
    s.update()
    assert torch.equal(p.detach(), torch.full((2,), -2.0))  # 1 - 3, i.e. unscaled
    opt.zero_grad()
    s.scale((p * torch.tensor([1.0, math.inf])).sum()).backward()  # gradient [1024, inf]
    s.step(opt)
    ev = s.update()
    assert ev.skipped and s.get_scale() == 1024.0
    assert torch.equal(p.detach(), torch.full((2,), -2.0))
    with pytest.raises(ValueError, match="must be finite"):
        StaticLossScaler(math.inf)


def test_collapse_warning_after_many_halvings():
    s = DynamicLossScaler(init_scale=2.0**20, collapse_halvings=5)
    with pytest.warns(ScaleCollapseWarning, match="5 steps in a row.*Likely causes"):
        for _ in range(5):
            s.update(found_inf=True)


def test_collapse_warning_below_one():
    s = DynamicLossScaler(init_scale=2.0, collapse_halvings=100)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s.update(found_inf=True)  # scale 1: no warning yet
        assert not [x for x in w if issubclass(x.category, ScaleCollapseWarning)]
        s.update(found_inf=True)  # 0.5
    assert any(issubclass(x.category, ScaleCollapseWarning) and "below 1" in str(x.message)
               for x in w)


def test_no_warning_for_normal_warmup():
    s = DynamicLossScaler(init_scale=2.0**16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScaleCollapseWarning)
        for f in [True] * 4 + [False] * 50:
            s.update(found_inf=f)


def _recorded_run(device: str, steps: int = 30):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = GradScalerRecorder(torch.amp.GradScaler(device, init_scale=2.0**30, growth_interval=5))
    x = torch.randn(16, 8).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScaleCollapseWarning)  # 2**30 -> ~2**16: 14 halvings
        for _ in range(steps):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            rec.scale(loss).backward()
            rec.step(opt)
            rec.update()
    return rec


def _check_recorder(rec):
    hist = rec.history
    assert len(hist) == 30
    # our state machine fed the recorded flags reproduces the real scaler's trajectory
    ours = simulate_dynamic([e.found_inf for e in hist], init_scale=2.0**30, growth_interval=5)
    assert [e.next_scale for e in ours] == [e.next_scale for e in hist]
    assert hist[0].skipped  # 2**30 overflows FP16 at first
    assert sum(e.skipped for e in hist[-10:]) <= 2  # then only a growth step now and then
    assert classify_skips(hist)["warmup_skips"] >= 1


def test_recorder_with_cpu_gradscaler():
    _check_recorder(_recorded_run("cpu"))


@pytest.mark.gpu
def test_recorder_with_cuda_gradscaler():
    _check_recorder(_recorded_run("cuda"))


def test_classify_skips():
    ok = simulate_dynamic([True] * 3 + [False] * 200, growth_interval=50)
    assert classify_skips(ok)["verdict"] == "warm-up only"
    bad = simulate_dynamic([True] * 3 + [False, True] * 50)
    assert classify_skips(bad)["verdict"] == "problem"
    assert classify_skips(simulate_dynamic([False] * 5))["verdict"] == "no skips"


def _history(skips, scale=1024.0):
    """Events with the given skipped flags at a steady scale (the classifier reads only these)."""
    return [ScaleEvent(step=i, scale=scale, found_inf=s, skipped=s, next_scale=scale)
            for i, s in enumerate(skips)]


def _every(n_steps, period, offset=0):
    return [i % period == offset for i in range(n_steps)]


@pytest.mark.parametrize("later,verdict", [
    (_every(1000, 1000, 500), "occasional"),         # one skip per growth interval: calibration
    (_every(1000, 100, 50), "occasional"),           # 1%, the documented limit
    ([False, True] + [False] * 998, "occasional"),   # one skip
    ([False, True, True] + [False] * 997, "occasional"),         # a run of two
    ([False, True, True, True] + [False] * 996, "problem"),      # a run of three
    (_every(1000, 90, 45), "problem"),               # 1.1%
    (_every(1000, 20, 10), "problem"),               # 5%
    (_every(1000, 10, 5), "problem"),                # 10%
    (_every(1000, 2, 1), "problem"),                 # every other step
])
def test_classify_skips_rates_and_runs(later, verdict):
    """After a 3-step warm-up: at most 1% of later steps skipped, in runs of at most 2, is
    "occasional"; more is a problem (the rule in classify_skips' docstring)."""
    got = classify_skips(_history([True] * 3 + later))
    n_later = sum(later)
    assert (got["warmup_skips"], got["later_skips"]) == (3, n_later)
    assert got["later_skip_rate"] == n_later / len(later)
    assert got["verdict"] == verdict, (n_later / len(later), got)


def test_classify_skips_scale_below_one_and_warmup_limit():
    few = [True] * 3 + _every(1000, 500, 250)
    assert classify_skips(_history(few, scale=1.0))["verdict"] == "occasional"
    assert classify_skips(_history(few, scale=0.5))["verdict"] == "problem"
    assert classify_skips(_history([True] * 10))["verdict"] == "problem"  # never a clean step
    # a warm-up capped at 2 steps leaves the third leading skip as a later one
    capped = classify_skips(_history(few), warmup_steps=2)
    assert (capped["warmup_skips"], capped["later_skips"]) == (2, 3)
    assert capped["longest_later_run"] == 1 and capped["min_scale"] == 1024.0


def test_replay_with_gradscaler_matches_simulation():
    flags = [True, False, False, True, False, False, False, False]
    ours = simulate_dynamic(flags, init_scale=8.0, growth_interval=2)
    theirs = replay_with_gradscaler(flags, init_scale=8.0, growth_interval=2)
    assert [e.scale for e in theirs] == [e.scale for e in ours] == [8, 4, 4, 8, 4, 4, 8, 8]
    assert list(events_frame(theirs).skipped) == flags


# ----------------------------------------------------------------- messages, reprs, tables
def _message(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


def test_parameter_messages_name_the_value_and_what_is_allowed():
    with pytest.raises(TypeError) as info:
        DynamicLossScaler(init_scale="big")
    assert str(info.value) == "init_scale must be a number, got 'big' (str)"
    assert _message(lambda: DynamicLossScaler(init_scale=-1.0)) == (
        "init_scale must be a finite positive number that fits in float32 "
        "(1.2e-38 <= init_scale <= 3.4e38; a smaller scale's reciprocal, which unscales the "
        "gradients, is inf), got -1.0")
    assert _message(lambda: DynamicLossScaler(growth_factor=1.0)) == \
        "growth_factor must be > 1, got 1"
    assert _message(lambda: DynamicLossScaler(growth_factor=math.inf)) == \
        "growth_factor must be finite, got inf"
    assert _message(lambda: DynamicLossScaler(backoff_factor=1.5)) == \
        "backoff_factor must be > 0 and < 1, got 1.5"
    assert _message(lambda: DynamicLossScaler(growth_interval=True)) == \
        "growth_interval must be an integer from 1 to 2147483647, got True"
    assert _message(lambda: DynamicLossScaler(growth_interval=2**31)) == \
        "growth_interval must be an integer from 1 to 2147483647, got 2147483648"
    assert DynamicLossScaler(growth_interval=2**31 - 1).growth_interval == 2**31 - 1
    assert DynamicLossScaler(growth_interval=np.int64(3)).growth_interval == 3
    assert _message(lambda: DynamicLossScaler(min_scale=4.0, max_scale=2.0)) == \
        "min_scale must be <= max_scale, got 4.0 > 2.0"
    assert _message(lambda: DynamicLossScaler(init_scale=1.0, min_scale=2.0)) == \
        "init_scale must lie within [min_scale, max_scale] = [2.0, None], got 1.0"
    assert _message(lambda: DynamicLossScaler(init_scale=8.0, max_scale=4.0)) == \
        "init_scale must lie within [min_scale, max_scale] = [None, 4.0], got 8.0"
    for bad in (0, True, 2.0):
        assert _message(lambda: DynamicLossScaler(collapse_halvings=bad)) == \
            f"collapse_halvings must be an integer >= 1, got {bad!r}"
    assert _message(lambda: StaticLossScaler(0.0)) == (
        "scale must be a finite positive number that fits in float32 (1.2e-38 <= scale <= 3.4e38; "
        "a smaller scale's reciprocal, which unscales the gradients, is inf), got 0.0")


def test_bounds_equal_to_the_scale_are_allowed_and_kept():
    s = DynamicLossScaler(init_scale=4.0, min_scale=4.0, max_scale=4.0, growth_interval=1)
    assert [s.update(found_inf=f).next_scale for f in (True, False, False)] == [4.0, 4.0, 4.0]


def test_reprs_show_the_settings():
    assert repr(StaticLossScaler(3.0)) == "StaticLossScaler(scale=3.0)"
    assert repr(DynamicLossScaler(init_scale=8.0, growth_interval=7, min_scale=1.0)) == (
        "DynamicLossScaler(init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, "
        "growth_interval=7, min_scale=1.0, max_scale=None)")


def test_history_tables_have_one_row_per_step():
    s = DynamicLossScaler(init_scale=8.0, growth_interval=2)
    for f in (True, False, False):
        s.update(found_inf=f)
    t = s.history_frame()
    assert list(t.columns) == ["step", "scale", "found_inf", "skipped", "next_scale"]
    assert t.to_dict("list") == {"step": [0, 1, 2], "scale": [8.0, 4.0, 4.0],
                                 "found_inf": [True, False, False],
                                 "skipped": [True, False, False], "next_scale": [4.0, 4.0, 8.0]}
    assert s.history[0].as_dict() == {"step": 0, "scale": 8.0, "found_inf": True,
                                      "skipped": True, "next_scale": 4.0}


def test_collapse_messages_in_full():
    s = DynamicLossScaler(init_scale=4.0, collapse_halvings=3)
    with pytest.warns(ScaleCollapseWarning) as record:
        for _ in range(5):  # next scales 2, 1, 0.5, 0.25, 0.125
            s.update(found_inf=True)
    messages = [str(w.message) for w in record]
    assert messages == [
        f"loss scale backed off 3 steps in a row (now 0.5 at step 2); every one of those steps "
        f"was skipped. Likely causes: {COLLAPSE_CAUSES}.",
        f"loss scale fell below 1 (0.25 at step 3): the gradients overflow FP16 even unscaled. "
        f"Likely causes: {COLLAPSE_CAUSES}.",
    ]  # once each: not again at step 4
    assert s._monitor.warnings == messages
    for bad in (0, True, 1.5):
        assert _message(lambda: ScaleCollapseMonitor(bad)) == \
            f"halvings must be an integer >= 1, got {bad!r}"


def test_recorder_passes_calls_through_to_the_gradscaler():
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    rec = GradScalerRecorder(scaler)
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.5)
    assert rec.get_scale() == scaler.get_scale() == 4.0
    rec.scale((p * 2.0).sum()).backward()
    assert torch.equal(p.grad, torch.full((2,), 8.0))
    rec.unscale_(opt)
    assert torch.equal(p.grad, torch.full((2,), 2.0))  # unscaled in place
    assert rec.step(opt) is None  # SGD.step returns None
    ev = rec.update()
    assert torch.equal(p.detach(), torch.zeros(2)) and not ev.skipped
    assert rec.history_frame().to_dict("list")["next_scale"] == [4.0]


def test_scaler_settings_defaults_are_gradscalers_and_bad_ones_are_all_named():
    gs = torch.amp.GradScaler("cpu")
    s = ScalerSettings()
    assert (s.init_scale, s.growth_factor, s.backoff_factor, s.growth_interval) == (
        gs.get_scale(), gs.get_growth_factor(), gs.get_backoff_factor(), gs.get_growth_interval())
    assert ScalerSettings(init_scale=1.0, growth_factor=1.5, backoff_factor=0.25,
                          growth_interval=1).growth_interval == 1
    assert _message(lambda: ScalerSettings(init_scale=0.0, backoff_factor=2.0)) == (
        "bad scaler settings: init_scale must be a finite positive number that fits in float32 "
        "(1.2e-38 <= init_scale <= 3.4e38; a smaller scale's reciprocal, which unscales the "
        "gradients, is inf), got 0.0; backoff_factor must be > 0 and < 1, got 2")
    assert _message(lambda: ScalerSettings(growth_interval=0)) == (
        "bad scaler settings: growth_interval must be an integer from 1 to 2147483647, got 0")


def test_unscale_misuse_messages_in_full():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    s = StaticLossScaler(4.0)
    (p.sum()).backward()
    with pytest.raises(RuntimeError) as info:
        s.unscale_(opt)
    assert str(info.value) == (
        "unscale_(optimizer) before scale() in this iteration: the gradients were not multiplied "
        "by the scale (4), so unscaling them would divide the update by it. Write "
        "scaler.scale(loss).backward(), not loss.backward(), then scaler.step(optimizer) and "
        "scaler.update()")
    opt.zero_grad()
    s.scale(p.sum()).backward()
    s.unscale_(opt)
    with pytest.raises(RuntimeError) as info:
        s.unscale_(opt)
    assert str(info.value) == ("unscale_() has already been called on this optimizer since the "
                               "last update()")
    s.step(opt)
    with pytest.raises(RuntimeError) as info:
        s.unscale_(opt)
    assert str(info.value) == ("unscale_() is being called after step(): unscale before "
                               "stepping, then call update()")
    s.update()
    half = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    opt16 = torch.optim.SGD([half], lr=0.1)
    s.scale(half.float().sum()).backward()
    assert _message(lambda: s.unscale_(opt16)) == (
        "cannot unscale FP16 gradients (their small values would flush to zero): give the "
        "optimizer FP32 parameters (autocast keeps them) or FP32 master weights")
    with pytest.raises(TypeError) as info:
        DynamicLossScaler().update(found_inf="yes")
    assert str(info.value).endswith("got str 'yes'")


def test_skip_classifier_edges():
    assert classify_skips(_history([False, True] + [False] * 998))["warmup_skips"] == 0
    never = classify_skips(_history([True] * 5))
    assert (never["verdict"], never["later_skip_rate"], never["later_skips"]) == ("problem", 0.0, 0)
    empty = classify_skips([])
    assert empty["verdict"] == "no skips" and math.isnan(empty["min_scale"])
    assert empty["longest_later_run"] == 0 and empty["later_skip_rate"] == 0.0
    assert list(events_frame([]).columns) == ["step", "scale", "found_inf", "skipped", "next_scale"]


def test_recorder_counts_steps_takes_new_scales_and_warns_at_the_callers_line():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    rec = GradScalerRecorder(scaler)  # default: warn after 12 backoffs in a row
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    rec.scale(torch.ones(()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(12):
            p.grad = torch.full((1,), math.inf)
            rec.step(opt)
            rec.update()
            collapse = [w for w in caught if issubclass(w.category, ScaleCollapseWarning)]
            assert len(collapse) == (1 if i == 11 else 0), i
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampolines add frames to every call
        assert collapse[0].filename == __file__  # attributed to the caller of update()
    assert [e.step for e in rec.history] == list(range(12))
    p.grad = torch.ones(1)
    rec.step(opt)
    assert rec.update(new_scale=8.0).next_scale == 8.0 == rec.get_scale()
    # arguments reach GradScaler.step: it refuses a closure keyword, passes positionals on
    with pytest.raises(RuntimeError, match="[Cc]losure"):
        rec.step(opt, closure=lambda: torch.zeros(()))
    calls = []
    rec.step(opt, lambda: calls.append(1) or torch.zeros(()))
    assert calls == [1]


def test_step_misuse_messages_in_full_and_arguments_passed_on():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    s = DynamicLossScaler(init_scale=4.0)

    def runtime_message(call) -> str:
        with pytest.raises(RuntimeError) as info:
            call()
        return str(info.value)

    assert runtime_message(lambda: s.step(opt, closure=lambda: 0)) == (
        "step(optimizer, closure=...) is not supported: a closure would recompute an unscaled "
        "loss; call scaler.scale(loss).backward() yourself before step()")
    assert runtime_message(lambda: s.step(opt)).startswith(
        "step(optimizer) before scale() in this iteration: the gradients were not multiplied by "
        "the scale (4)")
    s.scale(p.sum()).backward()
    calls = []
    assert s.step(opt, lambda: calls.append("closure") or 1.5) == 1.5  # SGD runs the closure
    assert calls == ["closure"]
    assert runtime_message(lambda: s.step(opt)) == (
        "step() has already been called on this optimizer since the last update(): call "
        "scaler.update() once after each step")
    s.update()
    unused = torch.nn.Parameter(torch.ones(1))
    s.scale(p.sum())  # a loss that does not depend on `unused`
    assert runtime_message(lambda: s.step(torch.optim.SGD([unused], lr=0.1))) == (
        "no inf/NaN check was recorded for this optimizer: none of its parameters has a "
        "gradient. Call scaler.scale(loss).backward() on a loss that depends on them before "
        "step()")


def test_scalers_work_when_numpy_raises_on_every_floating_point_error():
    # A learner may run np.seterr(all="raise"); the scale arithmetic overflows float32 on
    # purpose (growth refused at inf, a tiny scale's reciprocal), and must not raise then.
    with np.errstate(all="raise"):
        with pytest.raises(ValueError, match="fits in float32"):
            DynamicLossScaler(init_scale=1e39)  # 1e39 overflows float32: a ValueError, no FPE
        s = DynamicLossScaler(init_scale=F32_MAX, growth_interval=1)
        assert s.update(found_inf=False).next_scale == F32_MAX  # the growth would be inf
        # a float32 subnormal scale is refused (its reciprocal is inf), without an FPE too
        with pytest.raises(ValueError, match="fits in float32"):
            DynamicLossScaler(init_scale=float(np.float32(1.4e-45)))
        # the smallest scale allowed, float32's smallest normal: its reciprocal is finite
        tiny = DynamicLossScaler(init_scale=2.0**-126, collapse_halvings=100)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScaleCollapseWarning)
            p = torch.nn.Parameter(torch.ones(1))
            opt = torch.optim.SGD([p], lr=0.1)
            tiny.scale(p.sum()).backward()
            assert tiny.unscale_(opt) is False
            assert torch.equal(p.grad, torch.ones(1))  # 2**-126 times 2**126
            tiny.step(opt)
            tiny.update()
            assert tiny.update(found_inf=True).next_scale == 2.0**-126  # 2**-127: the floor holds
            p.grad = None
            tiny.scale(p.sum()).backward()
            assert tiny.unscale_(opt) is False
            assert torch.equal(p.grad, torch.ones(1))


def test_unscale_builds_its_flags_on_the_gradients_device_and_in_float32():
    # explicit device and dtype: a changed default device or dtype must not reach torch's kernel
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.5)
    s = StaticLossScaler(4.0)
    s.scale(p.sum()).backward()
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.device("meta"):
            assert s.unscale_(opt) is False
    finally:
        torch.set_default_dtype(before)
    assert torch.equal(p.grad, torch.ones(2))  # 4 / 4
    p.grad = torch.tensor([1.0, math.nan])
    s.update()
    s.scale(p.sum())
    assert s.unscale_(opt) is True  # what unscale_ returns is the inf/NaN check


def test_replay_with_gradscaler_puts_every_tensor_on_the_device_it_is_given():
    with torch.device("meta"):  # a default device that cannot be read back: nothing may use it
        history = replay_with_gradscaler([False, True, False], init_scale=8.0, growth_interval=2)
    assert [(e.scale, e.skipped, e.next_scale) for e in history] == [
        (8.0, False, 8.0), (8.0, True, 4.0), (4.0, False, 4.0)]


def test_update_misuse_messages_in_full():
    s = DynamicLossScaler(init_scale=4.0)
    with pytest.raises(RuntimeError) as info:
        s.update()
    assert str(info.value) == (
        "update() found no inf/NaN check since the last update(): call scaler.step(optimizer) "
        "first, or pass update(found_inf=True/False) to drive the rule by hand")
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.1)
    s.scale(p.sum()).backward()
    s.unscale_(opt)
    with pytest.raises(RuntimeError) as info:
        s.update(found_inf=False)
    assert str(info.value) == (
        "update(found_inf=...) after unscale_()/step(optimizer): the optimizer's gradients "
        "already decided whether this step overflowed; call update() without found_inf")


def test_found_inf_must_be_a_torch_tensor_not_anything_with_numel():
    class Sized:  # has numel() like a tensor, but is no tensor
        def numel(self):
            return 1

    with pytest.raises(TypeError, match=r"takes True, False or a one-element tensor .*got Sized"):
        DynamicLossScaler().update(found_inf=Sized())


def test_min_and_max_scale_messages_name_the_bound():
    assert _message(lambda: DynamicLossScaler(min_scale=-1.0)) == (
        "min_scale must be a finite positive number that fits in float32 (1.2e-38 <= min_scale "
        "<= 3.4e38; a smaller scale's reciprocal, which unscales the gradients, is inf), got -1.0")
    assert _message(lambda: DynamicLossScaler(max_scale=math.inf)) == (
        "max_scale must be finite, got inf")


def test_collapse_warning_comes_after_twelve_backoffs_by_default_and_one_is_allowed():
    for make in (lambda: DynamicLossScaler(init_scale=2.0**100),
                 lambda: GradScalerRecorder(torch.amp.GradScaler("cpu"))):
        assert make()._monitor.halvings == 12
    assert ScaleCollapseMonitor().halvings == 12
    s = DynamicLossScaler(init_scale=2.0**100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(12):
            s.update(found_inf=True)
            assert len(caught) == (1 if i == 11 else 0), i
    one = DynamicLossScaler(init_scale=2.0**100, collapse_halvings=1)
    assert one.collapse_halvings == 1
    with pytest.warns(ScaleCollapseWarning, match="backed off 1 steps in a row"):
        one.update(found_inf=True)
    assert ScaleCollapseMonitor(1).halvings == 1
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="halvings must be an integer >= 1"):
            ScaleCollapseMonitor(bad)


def test_a_clean_step_resets_the_backoff_run():
    m = ScaleCollapseMonitor(3)
    assert (m.consecutive_backoffs, m.warned_below_one, m.warnings) == (0, False, [])
    bad, good = ScaleEvent(0, 8.0, True, True, 4.0), ScaleEvent(1, 4.0, False, False, 4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScaleCollapseWarning)
        m.observe(bad)
        m.observe(good)
        assert m.consecutive_backoffs == 0
        m.observe(bad)
        m.observe(bad)  # two in a row since the clean step: no warning for a run of 3
    with pytest.warns(ScaleCollapseWarning, match="3 steps in a row"):
        m.observe(bad)


def test_step_passes_keyword_arguments_to_the_optimizer():
    class Tagged(torch.optim.SGD):
        def step(self, closure=None, *, tag=None):
            self.tags = [*getattr(self, "tags", []), tag]
            return super().step(closure)

    p = torch.nn.Parameter(torch.ones(1))
    opt = Tagged([p], lr=0.5)
    s = StaticLossScaler(2.0)
    s.scale(p.sum()).backward()
    s.step(opt, tag="first")
    assert opt.tags == ["first"] and torch.equal(p.detach(), torch.tensor([0.5]))


def test_dynamic_scaler_warns_at_the_line_that_called_update():
    s = DynamicLossScaler(init_scale=2.0**20, collapse_halvings=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        s.update(found_inf=True)
    assert len(caught) == 1
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampolines add frames to every call
        assert (caught[0].filename, caught[0].lineno) == (__file__, line)


# ------------------------------------------------------------------ bad input (#28)
SCALE_ARGUMENTS = [
    ("init_scale", lambda v: DynamicLossScaler(init_scale=v)),
    ("min_scale", lambda v: DynamicLossScaler(init_scale=2.0**16, min_scale=v)),
    ("max_scale", lambda v: DynamicLossScaler(init_scale=1.0, max_scale=v)),
    ("scale", lambda v: StaticLossScaler(v)),
    ("init_scale", lambda v: ScalerSettings(init_scale=v)),
]


@pytest.mark.parametrize("name, make", SCALE_ARGUMENTS)
@pytest.mark.parametrize("bad", ["1024", True, False, b"1", [1024.0]])
def test_a_scale_must_be_a_number_not_a_string_or_a_bool(name, make, bad):
    with pytest.raises(TypeError, match=f"{name} must be a number, got"):
        make(bad)


@pytest.mark.parametrize("kwargs", [dict(growth_factor="2"), dict(growth_factor=True),
                                    dict(backoff_factor="0.5"), dict(backoff_factor=True),
                                    dict(growth_interval="2000"), dict(growth_interval=None)])
def test_factors_and_interval_must_be_numbers(kwargs):
    (name, _), = kwargs.items()
    for make in (DynamicLossScaler, ScalerSettings):
        with pytest.raises((TypeError, ValueError), match=name):
            make(**kwargs)
    with pytest.raises(TypeError if "factor" in name else ValueError, match=name):
        DynamicLossScaler(**kwargs)


@pytest.mark.parametrize("bad", [1e-300, 1e-45, 2.0**-127, 5e-324])
def test_a_backoff_factor_that_can_underflow_the_scale_is_refused(bad):
    for make in (DynamicLossScaler, ScalerSettings):
        with pytest.raises(ValueError, match=r"backoff_factor must be at least 1\.2e-38"):
            make(backoff_factor=bad)
    assert DynamicLossScaler(backoff_factor=2.0**-126).backoff_factor == 2.0**-126


@pytest.mark.parametrize("bad", [1e-45, 1e-39, 2.0**-127])
def test_a_scale_whose_reciprocal_is_inf_in_float32_is_refused(bad):
    # numpy is the oracle: the float32 reciprocal of 1e-39 (a subnormal) is inf; 2**-127's is
    # finite, but one backoff of 0.5 later torch's scale is on its way to 0
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(1.0) / np.float32(1e-39))
    for name, make in SCALE_ARGUMENTS:
        with pytest.raises(ValueError, match=f"{name} must be a finite positive number"):
            make(bad)


def test_the_scale_never_becomes_zero_and_nan_gradients_never_reach_the_weights():
    # torch's own GradScaler, fed the same overflows, reaches 0 (the bug these scalers avoid)
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**-120, backoff_factor=0.5)
    torch_scaler.scale(torch.ones(()))
    tp = torch.nn.Parameter(torch.zeros(1))
    topt = torch.optim.SGD([tp], lr=0.0)
    for _ in range(40):
        tp.grad = torch.full((1,), math.inf)
        torch_scaler.step(topt)
        torch_scaler.update()
    assert torch_scaler.get_scale() == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScaleCollapseWarning)
        s = DynamicLossScaler(init_scale=2.0**-120, backoff_factor=0.5)
        history = [s.update(found_inf=True) for _ in range(40)]
        assert all(e.next_scale >= 2.0**-126 for e in history)
        assert s.get_scale() == 2.0**-126
        s16 = DynamicLossScaler(backoff_factor=2.0**-126)  # the smallest factor allowed
        assert s16.update(found_inf=True).next_scale == 2.0**-110  # 2**16 * 2**-126
        assert s16.update(found_inf=True).next_scale == 2.0**-126  # 2**-236: the floor
        # a training step at the floor: the gradients come back exactly, the weights stay finite
        p = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p], lr=0.5)
        s.scale((p * 3.0).sum()).backward()
        assert s.unscale_(opt) is False
        assert torch.equal(p.grad, torch.full((2,), 3.0))
        s.step(opt)
        s.update()
        assert torch.equal(p.detach(), torch.full((2,), -0.5))
        # a backoff below a given floor stops at that floor, as before
        assert DynamicLossScaler(init_scale=8.0, min_scale=4.0).update(True).next_scale == 4.0
