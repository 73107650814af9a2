"""fp16lab.alignment, beyond tests/test_claims.py: the tables read against a hand-made payload
(every column worked out by hand) and the kernel-name rule against names recorded on the H200."""

from __future__ import annotations

import json
import pathlib

import pytest

from fp16lab import alignment

ROOT = pathlib.Path(__file__).resolve().parent.parent
NVJET = "nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"
CUT8 = ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_128x256_64x3_nn_align8>"
        "(cutlass_80_tensorop_f16_s16816gemm_f16_128x256_64x3_nn_align8::Params)")
CUT2 = ("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_128x256_64x3_nn_align2>"
        "(cutlass_80_tensorop_f16_s16816gemm_f16_128x256_64x3_nn_align2::Params)")
SIMT = "ampere_fp16_s1688gemm_fp16_simt_128x128"


def _row(d, tflops, kernels, mode="square"):
    n = 4096 + d
    return {"mode": mode, "d": d, "n": n, "tflops": tflops, "kernels": kernels,
            "mult8": n % 8 == 0, "mult16": n % 16 == 0}


PAYLOAD = {"rows": [
    _row(0, 800.0, ["Memset (Device)", NVJET]), _row(1, 200.0, [SIMT]), _row(2, 300.0, [CUT2]),
    _row(8, 600.0, [CUT8]), _row(16, 700.0, [NVJET]), _row(0, 999.0, [NVJET], mode="n_only")]}


def test_the_table_takes_the_first_kernel_and_divides_by_d_zero():
    t = alignment.alignment_table(PAYLOAD)
    assert list(t.columns) == ["d", "n", "mult8", "mult16", "tflops", "vs_d0",
                               "tensor_core_by_name", "kernel"]
    assert list(t["d"]) == [0, 1, 2, 8, 16]  # only the square rows
    assert list(t["kernel"]) == [NVJET, SIMT, CUT2, CUT8, NVJET]  # Memset dropped
    assert list(t["vs_d0"]) == pytest.approx([1.0, 0.25, 0.375, 0.75, 0.875])
    assert list(t["tensor_core_by_name"]) == [True, False, True, True, True]
    assert alignment.alignment_table(PAYLOAD, "n_only")["vs_d0"].tolist() == [1.0]


def test_the_classes_by_hand():
    c = alignment.alignment_classes(PAYLOAD)
    assert list(c.index) == ["multiple of 16", "multiple of 8, not 16", "even, not a multiple of 8", "odd"]
    assert c.loc["multiple of 16", "sizes"] == "4096, 4112"
    assert c.loc["multiple of 16", "mean TFLOP/s"] == pytest.approx(750.0)
    assert c.loc["multiple of 8, not 16", "vs multiples of 16"] == pytest.approx(600 / 750)
    assert c.loc["even, not a multiple of 8", "vs multiples of 16"] == pytest.approx(300 / 750)
    assert c.loc["odd", "vs multiples of 16"] == pytest.approx(200 / 750)
    assert c["Tensor Core kernel"].tolist() == [True, True, True, False]
    assert c.loc["multiple of 16", "kernels"] == "nvjet (cuBLAS Hopper kernels, wgmma)"
    assert c.loc["multiple of 8, not 16", "kernels"] == "cutlass sm80 tensorop s16816gemm align8"
    assert c.loc["even, not a multiple of 8", "kernels"] == "cutlass sm80 tensorop s16816gemm align2"
    assert c.loc["odd", "kernels"] == SIMT[:60]


def test_the_finding_by_hand():
    text = alignment.alignment_finding(PAYLOAD)
    assert text.startswith("square: multiples of 8 run at 80% of the multiples-of-16 rate on the "
                           "same kernel family (nvjet (cuBLAS Hopper kernels, wgmma)); sizes that "
                           "are not multiples of 8 drop to 27-40% (")
    assert text.endswith("Some sizes ran on kernels whose names show no Tensor Core path.")
    tc = {"rows": [r for r in PAYLOAD["rows"] if r["d"] != 1]}
    assert "drop to 40-40%" in alignment.alignment_finding(tc)
    assert alignment.alignment_finding(tc).endswith("not the use of Tensor Cores at all.")


def test_the_rule_on_kernel_names_recorded_on_the_h200():
    rows = json.loads((ROOT / "data" / "alignment.json").read_text())["rows"]
    names = {k for r in rows for k in alignment.gemm_kernel_names(r["kernels"])}
    assert names and all(alignment.uses_tensor_cores(n) for n in names)  # every one ran on tensor cores
    for name in ("volta_sgemm_128x64_nn", "ampere_fp16_s16816gemm_fp16_simt", "gemv2T_kernel",
                 "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32_hfma"):
        assert not alignment.uses_tensor_cores(name), name
    # only names that start with Memset or Memcpy (any case) are the profiler's copies
    assert alignment.gemm_kernel_names(["Memcpy HtoD", "memset x", "my_memset_kernel", NVJET]) == \
        ["my_memset_kernel", NVJET]


# ------------------------------------------------------------------ the figures, read back


def test_plot_alignment_draws_each_modes_rates_against_d():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = alignment.plot_alignment(PAYLOAD)
    lines = [ln for ln in ax.get_lines() if ln.get_label() and not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in lines] == ["M = N = K = 4096 + d", "M = K = 4096, N = 4096 + d"]
    assert list(lines[0].get_xdata()) == [0, 1, 2, 8, 16]
    assert list(lines[0].get_ydata()) == [800.0, 200.0, 300.0, 600.0, 700.0]
    assert list(lines[1].get_xdata()) == [0] and list(lines[1].get_ydata()) == [999.0]
    assert (lines[0].get_marker(), lines[0].get_linestyle()) == ("o", "-")
    assert (lines[1].get_marker(), lines[1].get_linestyle()) == ("s", "--")
    verticals = [ln for ln in ax.get_lines() if ln not in lines]
    assert sorted(float(ln.get_xdata()[0]) for ln in verticals) == [0.0, 8.0, 16.0]
    assert [t for t in ax.get_xticks()] == list(range(17))
    assert ax.get_xlabel() == "d (green lines: N a multiple of 8)"
    assert ax.get_ylabel() == "TFLOP/s (torch.matmul, fp16)"
    assert ax.get_title() == "cuBLAS fp16 GEMM at N = 4096 + d"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [ln.get_label() for ln in lines]
    only_square = {"rows": [r for r in PAYLOAD["rows"] if r["mode"] == "square"]}
    _, given = plt.subplots()
    assert alignment.plot_alignment(only_square, ax=given) is given
    assert len([ln for ln in given.get_lines() if not ln.get_label().startswith("_")]) == 1
    plt.close("all")


class _Claim:
    id, verdict, reason, source = 1, "supported", "", "data/claims_h200.json"
    figures = {
        "gemm": [{"n": 4096, "tflops": 700.0, "kernel": NVJET},
                 {"n": 4097, "tflops": 90.0, "kernel": SIMT},
                 {"n": 4100, "tflops": 200.0, "kernel": "mystery_kernel"}],
        "cuda_core_fp16_ceiling_tflops": 120.0,
        "linear": [{"batch": 256, "tflops": 500.0}, {"batch": 300, "tflops": 300.0}],
        "linear_features": 4096,
    }


def test_plot_claim_colours_tensor_core_bars_and_multiples_of_256():
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.colors import to_rgba
    import matplotlib.pyplot as plt

    ax1, ax2 = alignment.plot_claim(_Claim())
    bars = ax1.patches
    assert [b.get_height() for b in bars] == [700.0, 90.0, 200.0]
    # green: a tensor-core name, or a rate above the CUDA-core ceiling (200 > 120); else blue
    assert [b.get_facecolor() for b in bars] == [to_rgba("tab:green"), to_rgba("tab:blue"),
                                                 to_rgba("tab:green")]
    assert [t.get_text() for t in ax1.get_xticklabels()] == ["4096", "4097", "4100"]
    ceiling = [ln for ln in ax1.get_lines()][0]
    assert list(ceiling.get_ydata()) == [120.0, 120.0] and ceiling.get_linestyle() == "--"
    assert ceiling.get_color() == "grey"
    assert [t.get_text() for t in ax1.get_legend().get_texts()] == [
        "CUDA-core fp16 ceiling (2x fp32 GEMM)"]
    assert (ax1.get_xlabel(), ax1.get_ylabel()) == ("N (fp16 GEMM N x N x N)", "TFLOP/s")
    assert ax1.get_title() == "green: tensor cores (kernel name, or a rate above the ceiling)"
    assert [b.get_height() for b in ax2.patches] == [500.0, 300.0]
    assert [b.get_facecolor() for b in ax2.patches] == [to_rgba("tab:orange"), to_rgba("tab:grey")]
    assert [t.get_text() for t in ax2.get_xticklabels()] == ["256", "300"]
    assert ax2.get_xlabel() == "batch (Linear 4096 -> 4096, fp16)"
    assert (ax2.get_ylabel(), ax2.get_title()) == ("TFLOP/s", "orange: a multiple of 256")
    assert ax1.figure._suptitle.get_text() == "data/claims_h200.json"
    assert ax1.figure._suptitle.get_fontsize() == 8
    plt.close("all")


def test_plot_claim_without_figures_says_why(capsys):
    claim = _Claim()
    claim.figures = {}
    claim.verdict, claim.reason = "not measured", "no GPU"
    assert alignment.plot_claim(claim) is None
    assert capsys.readouterr().out == "claim 1 has no figures to plot (not measured: no GPU)\n"


# n_only rows where the divisibility classes need the right modulus: 4120 is a multiple of 8
# (not of 9, not of 16), 4100 is even (not a multiple of 3 or 8), 4097 odd; two kernel families
# share the class of the multiples of 16
N_ONLY = {"rows": [
    _row(0, 1000.0, [NVJET], mode="n_only"), _row(16, 1000.0, [CUT8], mode="n_only"),
    _row(24, 950.0, [CUT8], mode="n_only"), _row(4, 900.0, [CUT2], mode="n_only"),
    _row(1, 920.0, [CUT2], mode="n_only"), _row(2, 1.0, ["Memset (Device)"], mode="n_only"),
    _row(0, 5.0, [NVJET])]}


def test_the_classes_of_the_other_mode_by_hand():
    c = alignment.alignment_classes(N_ONLY, "n_only")
    assert c.loc["multiple of 16", "sizes"] == "4096, 4112"
    assert c.loc["multiple of 8, not 16", "sizes"] == "4120"
    assert c.loc["even, not a multiple of 8", "sizes"] == "4100, 4098"
    assert c.loc["odd", "sizes"] == "4097"
    assert c.loc["multiple of 16", "kernels"] == ("cutlass sm80 tensorop s16816gemm align8; "
                                                  "nvjet (cuBLAS Hopper kernels, wgmma)")
    t = alignment.alignment_table(N_ONLY, "n_only")
    assert t.loc[t["d"] == 2, "kernel"].tolist() == [""]  # only a Memset: no kernel name
    assert not bool(t.loc[t["d"] == 2, "tensor_core_by_name"].iloc[0])


def test_the_finding_of_the_other_mode_word_for_word():
    rows = {"rows": [r for r in N_ONLY["rows"] if r["d"] != 2]}
    assert alignment.alignment_finding(rows, "n_only") == (
        "n_only: multiples of 8 run at 95% of the multiples-of-16 rate on the same kernel family "
        "(cutlass sm80 tensorop s16816gemm align8; nvjet (cuBLAS Hopper kernels, wgmma)); sizes "
        "that are not multiples of 8 drop to 90-92% (cutlass sm80 tensorop s16816gemm align2; "
        "cutlass sm80 tensorop s16816gemm align2). Every size ran on Tensor Core kernels: what a "
        "multiple of 8 buys is the fast Hopper path with 16-byte aligned loads, not the use of "
        "Tensor Cores at all.")
    no8 = {"rows": [r for r in rows["rows"] if r["d"] != 24]}
    assert alignment.alignment_finding(no8, "n_only").startswith(
        "n_only: multiples of 8 run at nan% of the multiples-of-16 rate")


def test_plot_alignment_of_one_mode_and_its_size():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = alignment.plot_alignment({"rows": [r for r in N_ONLY["rows"] if r["mode"] == "n_only"]})
    labelled = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in labelled] == ["M = K = 4096, N = 4096 + d"]
    assert list(ax.figure.get_size_inches()) == pytest.approx([8, 3.8])
    plt.close("all")


def test_the_figures_sizes_lines_and_the_ceiling_boundary():
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.colors import to_rgba
    import matplotlib.pyplot as plt

    ax = alignment.plot_alignment(PAYLOAD)
    verticals = [ln for ln in ax.get_lines() if ln.get_label().startswith("_")]
    assert all((ln.get_color(), ln.get_linewidth(), ln.get_alpha()) == ("green", 0.8, 0.5)
               for ln in verticals) and len(verticals) == 3
    assert ax.get_legend().get_texts()[0].get_fontsize() == 8
    assert ax.xaxis.get_gridlines()[0].get_alpha() == 0.3
    claim = _Claim()
    claim.figures = dict(_Claim.figures, gemm=[{"n": 4100, "tflops": 120.0, "kernel": "mystery"}])
    ax1, ax2 = alignment.plot_claim(claim)
    assert ax1.patches[0].get_facecolor() == to_rgba("tab:blue")  # at the ceiling, not above it
    assert list(ax1.figure.get_size_inches()) == pytest.approx([11, 3.6])
    assert ax1.get_position().x1 <= ax2.get_position().x0  # side by side
    assert ax1.get_legend().get_texts()[0].get_fontsize() == 8
    plt.close("all")


def test_an_unknown_kernel_family_is_its_first_60_characters():
    name = "k" * 59 + "XYZ"
    t = alignment.alignment_classes({"rows": [_row(0, 1.0, [name])]})
    assert t.loc["multiple of 16", "kernels"] == "k" * 59 + "X"
