"""Notebook 03's checks on answers that are wrong in one part only, and on the recorded file's
rows that are not the square GEMMs q2 asks about."""

import numpy as np
import torch
import torch.nn.functional as F

from fp16lab.exercises import ch03 as ex


def _pad(a, b, *, k_to=8, n_to=8, m_to=1, a_fill=0.0, bk_fill=0.0, bn_fill=0.0):
    """pad_to_8 with each choice a parameter: the right answer with its defaults."""
    m, k = a.shape
    n = b.shape[1]
    pm, pk, pn = -m % m_to, -k % k_to, -n % n_to
    ap = np.pad(a, ((0, pm), (0, pk)), constant_values=0)
    ap[:, k:] = a_fill
    bp = np.pad(b, ((0, pk), (0, pn)), constant_values=0)
    bp[k:, :] = bk_fill
    bp[:k, n:] = bn_fill
    return ap, bp


def _message(answer) -> str:
    fb = ex.q1.check(answer)
    assert not fb
    return fb.message


def test_q1_the_parameterised_answer_is_right_as_it_stands():
    assert ex.q1.check(_pad)


def test_q1_tensors_that_require_grad_are_read():
    def pad(a, b):
        a = torch.tensor(a, requires_grad=True)
        b = torch.tensor(b, requires_grad=True)
        pk, pn = -a.shape[1] % 8, -b.shape[1] % 8
        return F.pad(a, (0, pk)), F.pad(b, (0, pn, 0, pk))
    assert ex.q1.check(pad)


def test_q1_each_padding_region_must_be_zero():
    for fill in ({"a_fill": 1.0}, {"bk_fill": 1.0}, {"bn_fill": 1.0}):
        assert _message(lambda a, b, fill=fill: _pad(a, b, **fill)) == (
            "the padding must be zeros: anything else adds to the product's sums.")


def test_q1_n_left_unpadded():
    assert _message(lambda a, b: _pad(a, b, n_to=1)) == (
        "for a (1000, 1001) and b (1001, 1003) you returned (1000, 1008) and (1008, 1003): K and N "
        "must be multiples of 8.")


def test_q1_only_b_too_large():
    """N padded to 16: right for 1003 (1008 is a multiple of 16), too large for 24."""
    assert _message(lambda a, b: _pad(a, b, n_to=16)) == (
        "for a (16, 8) and b (8, 24) the smallest padded shapes are (16, 8) and (8, 24); you "
        "returned (16, 8) and (8, 32).")


def test_q1_m_padded_says_the_rows():
    assert _message(lambda a, b: _pad(a, b, m_to=64)).startswith(
        "a's rows changed from 1000 to 1024: M needs no padding")


def test_q1_only_one_matrix_wrong():
    def b_float32(a, b):
        ap, bp = _pad(a, b)
        return ap, bp.astype(np.float32)
    assert _message(b_float32).startswith("the padded matrices are float16 and float32;")

    def b_scaled(a, b):
        ap, bp = _pad(a, b)
        return ap, bp * np.float16(2)
    assert _message(b_scaled) == "the original values must sit unchanged in the top-left corner."


def test_q3_a_rounded_tiles_per_sm_is_recognised():
    assert _message_q3(2.18).startswith("2.18 is tiles / SMs")


def _message_q3(answer) -> str:
    fb = ex.q3.check(answer)
    assert not fb
    return fb.message


def test_q2_reads_the_square_rows_only(monkeypatch):
    rows = [{"n": 4096, "mode": "square", "kernels": ["nvjet_x"]},
            {"n": 4097, "mode": "square", "kernels": ["cutlass_x"]},
            {"n": 4097, "mode": "n_only", "kernels": ["nvjet_y"]},
            {"n": 4104, "mode": "n_only", "kernels": ["cutlass_y"]},
            {"n": 4104, "mode": "square", "kernels": ["sm90_x", "nvjet_z"]}]
    monkeypatch.setattr(ex, "read_result", lambda name: {"meta": {"measured_at": "t",
                                                                   "gpu_name": "G", "torch": "v"},
                                                          "rows": rows})
    assert ex._fast_sizes()[0] == {4096, 4104}


def test_q4_a_stall_that_did_not_move_is_named_so():
    fb = ex.q4.check("gmma")  # no wgmma in either kernel: 0.00 in both rows of the recorded file
    assert not fb and fb.message.startswith("gmma (")
    assert "did not change from step 1 to step 2: 0.00 per instruction issued in both" in fb.message
