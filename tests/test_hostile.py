"""The public API fed the bad input and the misuse a hostile (or hurried) user tries.

Each test names the wrong call, checks that it raises before doing any work, and that the
message says what was wrong and what is allowed. Where an independent tool faces the same
call (torch.amp.GradScaler, numpy, ml_dtypes), it is the oracle: it raises too, or gives the
value we must give.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fp16lab import bits
from fp16lab.census import census_model
from fp16lab.formats import FORMATS
from fp16lab.scaling import DynamicLossScaler, StaticLossScaler

# ------------------------------------------------------------------------ loss scalers (#18.7)

SCALERS = {
    "dynamic": lambda: DynamicLossScaler(init_scale=2.0**16),
    "static": lambda: StaticLossScaler(2.0**16),
    "torch": lambda: torch.amp.GradScaler("cpu", init_scale=2.0**16),
}
OURS = ("dynamic", "static")
# torch.amp.GradScaler signals misuse with RuntimeError, AssertionError or ValueError
TORCH_MISUSE = (RuntimeError, AssertionError, ValueError)


class _Setup:
    """A tiny model, its SGD optimizer, and a count of the real optimizer steps."""

    def __init__(self, dtype=torch.float32):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1).to(dtype)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.steps = 0
        real_step = self.opt.step

        def counting_step(*args, **kwargs):
            self.steps += 1
            return real_step(*args, **kwargs)

        self.opt.step = counting_step
        self.x = torch.ones(2, 4, dtype=dtype)

    def loss(self):
        return self.model(self.x).float().pow(2).mean()

    def weights(self):
        return [p.detach().clone() for p in self.model.parameters()]

    def good_iteration(self, scaler):
        self.opt.zero_grad()
        scaler.scale(self.loss()).backward()
        scaler.step(self.opt)
        scaler.update()


def _raises(kind, call):
    """Runs call(); returns the exception our scaler raises, or checks torch raises too."""
    expected = TORCH_MISUSE if kind == "torch" else (RuntimeError, ValueError, TypeError)
    with pytest.raises(expected) as info:
        call()
    return info.value


@pytest.mark.parametrize("kind", list(SCALERS))
def test_step_after_plain_backward_raises(kind):
    # torch raises when the first iteration's step() comes without scale(); so must we, and
    # without touching the weights (they would move by a gradient divided by 65536)
    s, scaler = _Setup(), SCALERS[kind]()
    before = s.weights()
    s.loss().backward()
    err = _raises(kind, lambda: scaler.step(s.opt))
    assert s.steps == 0 and all(torch.equal(a, b) for a, b in zip(before, s.weights()))
    if kind != "torch":
        assert "scale(loss).backward()" in str(err) and "before scale()" in str(err)


@pytest.mark.parametrize("kind", OURS)
def test_step_without_scale_raises_in_every_iteration(kind):
    # torch checks only the first iteration (before its scale tensor exists); ours check each
    s, scaler = _Setup(), SCALERS[kind]()
    s.good_iteration(scaler)
    s.opt.zero_grad()
    s.loss().backward()
    before, n = s.weights(), s.steps
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.step(s.opt)
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.unscale_(s.opt)
    assert s.steps == n and all(torch.equal(a, b) for a, b in zip(before, s.weights()))


@pytest.mark.parametrize("kind", list(SCALERS))
def test_two_steps_before_update_raise(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    scaler.step(s.opt)
    err = _raises(kind, lambda: scaler.step(s.opt))
    assert s.steps == 1  # the optimizer ran once, not twice
    if kind != "torch":
        assert "already been called" in str(err) and "update()" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_unscale_twice_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    scaler.unscale_(s.opt)
    once = [p.grad.clone() for p in s.model.parameters()]
    err = _raises(kind, lambda: scaler.unscale_(s.opt))
    # the gradients were not divided a second time
    assert all(torch.equal(a, p.grad) for a, p in zip(once, s.model.parameters()))
    if kind != "torch":
        assert "already been called" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_unscale_after_step_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    scaler.step(s.opt)
    err = _raises(kind, lambda: scaler.unscale_(s.opt))
    if kind != "torch":
        assert "after step()" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_step_with_no_gradients_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss())  # scaled, but no backward: no parameter has a gradient
    err = _raises(kind, lambda: scaler.step(s.opt))
    assert s.steps == 0
    if kind != "torch":
        assert "none of its parameters has a gradient" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_update_with_nothing_checked_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    err = _raises(kind, scaler.update)
    if kind != "torch":
        assert "found_inf" in str(err) and "step(optimizer)" in str(err)


@pytest.mark.parametrize("kind", list(SCALERS))
def test_step_with_closure_raises(kind):
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    _raises(kind, lambda: scaler.step(s.opt, closure=s.loss))
    assert s.steps == 0


@pytest.mark.parametrize("kind", list(SCALERS))
def test_fp16_gradients_raise(kind):
    s, scaler = _Setup(torch.float16), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    err = _raises(kind, lambda: scaler.step(s.opt))
    assert s.steps == 0
    if kind != "torch":
        assert isinstance(err, ValueError) and "FP16 gradients" in str(err)


@pytest.mark.parametrize("kind", OURS)
@pytest.mark.parametrize("flag", ["False", "True", 0, 1, 1.0, [True], np.array(False), object()])
def test_update_found_inf_must_be_bool_or_tensor(kind, flag):
    scaler = SCALERS[kind]()
    with pytest.raises(TypeError, match="True, False or a one-element tensor"):
        scaler.update(found_inf=flag)
    assert scaler.history == [] and scaler.get_scale() == 2.0**16  # nothing was applied


@pytest.mark.parametrize("flag, overflow", [(True, True), (False, False), (np.bool_(True), True),
                                            (torch.tensor(1.0), True), (torch.tensor(0.0), False),
                                            (torch.tensor([2.0]), True),
                                            (torch.tensor(False), False)])
def test_update_found_inf_accepts_bools_and_one_element_tensors(flag, overflow):
    scaler = DynamicLossScaler(init_scale=8.0)
    event = scaler.update(found_inf=flag)
    assert event.found_inf is overflow and event.skipped is overflow
    assert scaler.get_scale() == (4.0 if overflow else 8.0)


def test_update_found_inf_tensor_of_many_elements_raises():
    with pytest.raises(ValueError, match="one-element tensor"):
        DynamicLossScaler().update(found_inf=torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("kind", OURS)
def test_update_found_inf_after_step_raises(kind):
    # the step already ran with clean gradients; recording it as skipped would be a lie
    s, scaler = _Setup(), SCALERS[kind]()
    scaler.scale(s.loss()).backward()
    scaler.step(s.opt)
    with pytest.raises(RuntimeError, match="call update\\(\\) without found_inf"):
        scaler.update(found_inf=True)


@pytest.mark.parametrize("kind", OURS)
def test_loop_continues_normally_after_each_refused_call(kind):
    # a misuse that raised leaves the scaler usable: the next iterations match torch's weights
    ours_setup, theirs_setup = _Setup(), _Setup()
    ours, theirs = SCALERS[kind](), torch.amp.GradScaler("cpu", init_scale=2.0**16,
                                                          growth_interval=10**6)
    ours.scale(ours_setup.loss()).backward()
    ours.step(ours_setup.opt)
    with pytest.raises(RuntimeError):
        ours.step(ours_setup.opt)
    ours.update()
    theirs_setup.good_iteration(theirs)
    for _ in range(3):
        ours_setup.good_iteration(ours)
        theirs_setup.good_iteration(theirs)
    assert all(torch.equal(a, b) for a, b in zip(ours_setup.weights(), theirs_setup.weights()))
    assert ours_setup.steps == theirs_setup.steps == 4


@pytest.mark.gpu
@pytest.mark.parametrize("kind", OURS)
def test_misuse_on_cuda_raises_and_the_loop_matches_cuda_gradscaler(kind):
    def setup():
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 8).cuda()
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    x = torch.randn(32, 64, device="cuda")
    ours_model, ours_opt = setup()
    theirs_model, theirs_opt = setup()
    ours = SCALERS[kind]()
    theirs = torch.amp.GradScaler("cuda", init_scale=2.0**16, growth_interval=10**6)
    ours_model(x).pow(2).mean().backward()
    with pytest.raises(RuntimeError, match="before scale"):
        ours.step(ours_opt)  # a plain backward: refused, weights untouched
    for i in range(4):
        for model, opt, scaler in ((ours_model, ours_opt, ours),
                                   (theirs_model, theirs_opt, theirs)):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            if scaler is ours and i == 0:
                with pytest.raises(RuntimeError, match="already been called"):
                    scaler.step(opt)
            scaler.update()
    for a, b in zip(ours_model.parameters(), theirs_model.parameters()):
        assert torch.equal(a, b)
    # a found_inf flag on the GPU is a one-element tensor like any other
    assert ours.update(found_inf=torch.ones((), device="cuda")).found_inf is True


# ------------------------------------------------------------------------ bits.py (#18.9)

WITH_ML_DTYPES = [f for f in FORMATS.values() if f.ml_dtypes_name]
UNSIGNED = {8: np.uint8, 16: np.uint16, 32: np.uint32}


def _oracle_dtype(f) -> np.dtype:
    """Returns the format's numpy dtype, from ml_dtypes for bf16 and fp8 (the oracle)."""
    import ml_dtypes  # imported here: the GPU host runs this file's gpu tests without it

    return np.dtype(getattr(ml_dtypes, f.ml_dtypes_name, None) or f.ml_dtypes_name)


def _from_code(code: int, f) -> float:
    """Oracle: the value of a code as ml_dtypes (or numpy) reads the same bits."""
    return float(np.array([code], dtype=UNSIGNED[f.bits]).view(_oracle_dtype(f))[0])


VALUE_FUNCS = {
    "encode": bits.encode,
    "quantize": bits.quantize,
    "ulp": bits.ulp,
    "accumulate": bits.accumulate,
}

NOT_NUMBERS = {
    "None": (None, "got None"),
    "None in a list": ([1.0, None], "None at index \\(1,\\)"),
    "None in a nested list": ([[1.0], [None]], "None at index \\(1, 0\\)"),
    "datetime64 array": (np.array(["2020-01-01"], dtype="datetime64[D]"), "datetime64\\[D\\]"),
    "datetime64 scalar": (np.datetime64("2020-01-01"), "datetime64\\[D\\]"),
    "timedelta64 array": (np.array([1], dtype="timedelta64[s]"), "timedelta64\\[s\\]"),
    "strings in a list": (["1.5"], "<U3 array of strings"),
    "string array": (np.array(["1.5", "2"]), "<U3 array of strings"),
    "bytes array": (np.array([b"1"]), "\\|S1 array of bytes"),
    "string in an object array": (np.array([1.0, "2"], dtype=object), "str '2' at index"),
    "complex": ([1 + 2j], "complex128 array of complex"),
    "dict": ({}, "dict"),
    "ragged lists": ([[1.0], [1.0, 2.0]], "rectangular"),
    "int too large for float64": ([10**400], "too large for float64"),
}


@pytest.mark.parametrize("func", list(VALUE_FUNCS))
@pytest.mark.parametrize("case", list(NOT_NUMBERS))
def test_value_functions_refuse_what_is_not_a_real_number(func, case):
    # numpy would cast None to NaN and a date to its day count, silently; we must refuse
    values, words = NOT_NUMBERS[case]
    with pytest.raises(ValueError, match=words) as info:
        VALUE_FUNCS[func](values)
    assert func in str(info.value) or "encode" in str(info.value)  # quantize goes via encode


def test_encode_none_was_the_nan_code_numpy_would_give():
    # the silent path the check closes: numpy reads None as NaN, whose fp16 code is 0x7e00
    assert np.array([1.0, None], dtype=np.float64)[1] != np.array([1.0, None], dtype=np.float64)[1]
    with pytest.raises(ValueError, match="allowed: int, float, bool"):
        bits.encode([1.0, None])


@pytest.mark.parametrize("f", WITH_ML_DTYPES, ids=lambda f: f.name)
def test_object_arrays_of_real_numbers_still_encode_like_ml_dtypes(f):
    from decimal import Decimal
    from fractions import Fraction

    values = np.array([1, 0.1, Fraction(1, 3), Decimal("2.5"), np.float32(3.0), -7],
                      dtype=object)
    as_f64 = np.array([float(v) for v in values], dtype=np.float64)
    # float32 first, as ml_dtypes casts (all these values are exact or nearest in float32 too)
    dtype = _oracle_dtype(f)
    expected = as_f64.astype(np.float32).astype(dtype).astype(np.float64)
    assert np.array_equal(bits.quantize(as_f64.astype(np.float32).astype(np.float64), f),
                          expected)
    assert np.array_equal(bits.quantize(values, f), bits.quantize(as_f64, f))


SINGLE_CODE_FUNCS = {
    "to_hex": bits.to_hex,
    "to_bits": bits.to_bits,
    "next_up": bits.next_up,
    "next_down": bits.next_down,
    "decode": bits.decode,
}


@pytest.mark.parametrize("func", list(SINGLE_CODE_FUNCS))
@pytest.mark.parametrize("f", list(FORMATS.values()), ids=lambda f: f.name)
def test_out_of_range_codes_raise_naming_the_range(func, f):
    top = (1 << f.bits) - 1
    for bad in (-1, top + 1, -(1 << 40), 1 << 70):
        with pytest.raises(ValueError, match=f"out of range for {f.name}.*0\\.\\.{top} "
                                             f"\\(0x0+\\.\\.0x{top:x}\\)"):
            SINGLE_CODE_FUNCS[func](bad, f)
    for good in (0, top, np.int64(top), np.uint16(1)):  # the edges stay allowed
        SINGLE_CODE_FUNCS[func](good, f)


NOT_CODES = [(1.5, "float(64 values like \\[)? ?1.5"), (True, "bool (values like \\[)?True"),
             ("0x3c00", "parse_code"), (None, "NoneType None")]


@pytest.mark.parametrize("func", list(SINGLE_CODE_FUNCS))
@pytest.mark.parametrize("bad, words", NOT_CODES)
def test_codes_must_be_integers(func, bad, words):
    with pytest.raises(ValueError, match=words):
        SINGLE_CODE_FUNCS[func](bad, "fp16")


@pytest.mark.parametrize("func", ["to_hex", "to_bits", "next_up", "next_down"])
def test_single_code_functions_take_one_code(func):
    with pytest.raises(ValueError, match="takes one code, got an array of shape \\(2,\\)"):
        SINGLE_CODE_FUNCS[func](np.array([1, 2]), "fp16")


def test_decode_object_arrays_hold_integers_only():
    # np.asarray([1.5], dtype=object).astype(int64) would truncate 1.5 to the code 1
    with pytest.raises(ValueError, match="float 1.5 at index \\(0,\\)"):
        bits.decode(np.array([1.5], dtype=object))
    with pytest.raises(ValueError, match="NoneType None at index \\(1,\\)"):
        bits.decode([1, None])


@pytest.mark.parametrize("f", WITH_ML_DTYPES, ids=lambda f: f.name)
def test_to_hex_and_next_up_at_the_edges_agree_with_ml_dtypes(f):
    top = (1 << f.bits) - 1
    assert bits.to_hex(top, f) == "0x" + "f" * f.hex_digits
    assert int(bits.to_hex(0x1, f), 16) == 1
    # the top code is a NaN; next_up keeps it (ml_dtypes: nextafter(NaN, inf) is NaN)
    assert math.isnan(_from_code(bits.next_up(top, f), f))


@pytest.mark.parametrize("text", ["1000000000000000", "0011110000000000", "0111110000000000",
                                  "01", "0000000000000000"])
def test_explain_refuses_zeros_and_ones_that_read_as_a_number_or_as_bits(text):
    with pytest.raises(ValueError, match="ambiguous") as info:
        bits.explain(text, "fp16")
    msg = str(info.value)
    assert f"'0b{text}'" in msg and f"'{text}.0'" in msg  # both ways to say what was meant


@pytest.mark.parametrize("f", WITH_ML_DTYPES, ids=lambda f: f.name)
def test_explain_reads_prefixed_and_separated_bits_like_ml_dtypes(f):
    code = int(bits.encode(1.5, f))
    raw = f"{code:0{f.bits}b}"
    separated = bits.to_bits(code, f)
    for text in ("0b" + raw, "0B" + raw, "0b_" + separated.replace(" ", "_"), separated):
        e = bits.explain(text, f)
        assert e.code == code and e.value == _from_code(code, f) == 1.5


def test_explain_reads_plain_digits_as_numbers_like_numpy():
    # a 16-digit decimal is a number once written unambiguously; numpy's fp16 is the oracle
    with np.errstate(over="ignore"):  # 1e15 overflows fp16 to inf, in numpy as here
        as_fp16 = np.float16(1e15)
    assert bits.explain("1000000000000000.0", "fp16").value == float(as_fp16)
    assert bits.explain("1e15", "fp16").code == int(as_fp16.view(np.uint16))
    # zeros and ones that are not a code's width are numbers: 101 and 1000
    assert bits.explain("101", "fp16").value == float(np.float16(101.0))
    assert bits.explain("1000", "fp16").value == float(np.float16(1000.0))
    # fp32 is 32 bits wide, so a 16-digit string is a number there
    assert bits.explain("1000000000000000", "fp32").value == float(np.float32(1e15))


def test_explain_separated_digits_of_the_wrong_width_say_they_were_read_as_bits():
    with pytest.raises(ValueError, match="has 4 bits.*write a number without them"):
        bits.explain("1_000", "fp16")


@pytest.mark.parametrize("bad", [None, 15360, 1.0, b"0x3c00"])
def test_parse_code_takes_strings_only(bad):
    with pytest.raises(ValueError, match="parse_code\\(\\) reads a string"):
        bits.parse_code(bad)


@pytest.mark.parametrize("bad", ["0x", "0x_", "0b", "0b_"])
def test_parse_code_needs_a_digit_after_the_prefix(bad):
    with pytest.raises(ValueError, match="cannot read"):
        bits.parse_code(bad)


@pytest.mark.parametrize("bad, words", [(torch.tensor(True), "torch.bool"),
                                        (torch.tensor(1j), "complex"),
                                        (10**400, "too large for float64")])
def test_explain_refuses_tensors_that_are_not_real_numbers(bad, words):
    with pytest.raises(ValueError, match=words):
        bits.explain(bad)


def test_explain_table_takes_one_string_as_one_value_not_its_characters():
    table = bits.explain_table("1.5", "fp16")
    assert list(table.index) == ["1.5"] and table["value"].tolist() == [float(np.float16(1.5))]
    empty = bits.explain_table([], "fp16")
    assert len(empty) == 0 and "value" in empty.columns
    with pytest.raises(ValueError, match="list of values"):
        bits.explain_table(None)


# ------------------------------------------------------------------------ census_model (#18.10b)

def _fp16_classes(values: np.ndarray) -> dict[str, float]:
    """Oracle: each value's class in fp16, read off numpy's own float16 cast."""
    with np.errstate(over="ignore"):
        h = values.astype(np.float16)
    tiny = float(np.finfo(np.float16).tiny)  # smallest normal, 2**-14
    n = values.size
    return {"zero": np.sum(values == 0) / n,
            "underflow": np.sum((values != 0) & (h == 0)) / n,
            "subnormal": np.sum((h != 0) & (np.abs(h) < tiny)) / n,
            "normal": np.sum(np.isfinite(h) & (np.abs(h) >= tiny)) / n,
            "overflow": np.sum(np.isinf(h)) / n,
            "nan": np.sum(np.isnan(values)) / n}


def test_census_model_of_a_module_without_children_has_activation_rows():
    model = torch.nn.Linear(5, 5, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(5))  # the output is the input: values we choose
    x = torch.tensor([[0.0, 1e-9, 1e-6, 1.0, 1e6]] * 2)
    df = census_model(model, x, kinds=("activation",))
    assert len(df) == 1, df
    row = df.iloc[0]
    assert (row["layer"], row["kind"], row["tensor"], row["n"]) == ("", "activation", "output", 10)
    expected = _fp16_classes(x.numpy())
    assert {k: row[k] for k in expected} == pytest.approx(expected, abs=0)
    # the weight and gradient rows name the same layer, so the three kinds line up
    full = census_model(model, x)
    assert sorted(full["kind"]) == ["activation", "gradient", "weight"]
    assert set(full["layer"]) == {""}


def test_census_model_takes_one_kind_as_a_string():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    one = census_model(model, x, kinds="weight")
    assert one.equals(census_model(model, x, kinds=("weight",)))
    assert set(one["kind"]) == {"weight"} and len(one) == 2  # 0.weight, 0.bias


@pytest.mark.parametrize("kinds, words", [
    ("weights", "unknown kinds \\['weights'\\]"),  # the word, not its letters
    (("weight", "bias"), "unknown kinds \\['bias'\\]"),
    ((), "kinds is empty"),
    (3, "one of weight, activation, gradient or a sequence"),
    (None, "one of weight, activation, gradient or a sequence"),
])
def test_census_model_bad_kinds(kinds, words):
    model = torch.nn.Linear(4, 3)
    model.weight.grad = None
    with pytest.raises(ValueError, match=words):
        census_model(model, torch.randn(2, 4), kinds=kinds)
    assert model.weight.grad is None  # refused before the forward and backward passes


def test_census_model_needs_a_module():
    with pytest.raises(TypeError, match="takes a torch.nn.Module, got function.*census\\(\\)"):
        census_model(lambda x: x, torch.randn(2, 4))
