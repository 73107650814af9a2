"""Tile and wave arithmetic against a brute-force oracle that places every tile on an SM."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp16lab import waves


def _simulate(m, n, tile_m, tile_n, sms):
    """Places tiles one by one on SMs, a wave at a time; returns (tiles, waves, useful share)."""
    tiles = []
    for row in range(0, m, tile_m):
        for col in range(0, n, tile_n):
            tiles.append(min(tile_m, m - row) * min(tile_n, n - col))
    slots_used, waves_run = 0, 0
    while slots_used < len(tiles):
        waves_run += 1
        slots_used += sms
    return len(tiles), waves_run, sum(tiles) / (waves_run * sms * tile_m * tile_n)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3000), st.integers(1, 3000), st.sampled_from([64, 128, 192, 256]),
       st.sampled_from([64, 128, 176, 256]), st.integers(1, 140))
def test_tiles_waves_and_efficiency_match_a_placement(m, n, tile_m, tile_n, sms):
    tiles, waves_run, eff = _simulate(m, n, tile_m, tile_n, sms)
    assert waves.tile_count(m, n, tile_m, tile_n) == tiles
    assert waves.wave_count(tiles, sms) == waves_run
    assert waves.efficiency(m, n, tile_m, tile_n, sms) == pytest.approx(eff, rel=1e-12)


def test_batch_320_fills_more_of_one_wave_than_256_on_132_sms():
    # Linear(4096, 4096), 256x128 tiles: 32 and 64 tiles, both one wave
    assert [waves.tile_count(b, 4096, 256, 128) for b in (256, 320)] == [32, 64]
    assert waves.efficiency(320, 4096, 256, 128, 132) / waves.efficiency(256, 4096, 256, 128, 132) \
        == pytest.approx(320 / 256)


def test_two_tiles_per_sm_halve_the_waves():
    assert waves.wave_count(265, 132, tiles_per_sm=2) == 2
    assert waves.wave_count(264, 132, tiles_per_sm=2) == 1


@pytest.mark.parametrize("name, tile", [
    ("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNN", (256, 128)),
    ("nvjet_sm90_hsh_192x176_64x4_1x2_h_bz_coopB_NNN", (192, 176)),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_f16_128x256_32x3_nn_align2>(T1::Params)",
     (128, 256)),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::Half>>", None),
])
def test_tile_from_kernel_name(name, tile):
    assert waves.tile_from_kernel(name) == tile


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_bad_sizes_are_refused_with_what_is_allowed(bad):
    with pytest.raises(ValueError, match="positive integer"):
        waves.tile_count(bad, 4096, 128, 128)
    with pytest.raises(ValueError, match="positive integer"):
        waves.wave_count(10, bad)


def test_benchmark_says_it_needs_a_gpu(capsys):
    import torch

    from fp16lab.bench import wave_quantization
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the gpu test below runs the benchmark")
    assert wave_quantization.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_benchmark_rows_agree_with_the_arithmetic(tmp_path, monkeypatch):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from fp16lab.bench import wave_quantization
    rows = wave_quantization.measure((128, 256, 320), repeat=5)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for r in rows:
        assert r["sms"] == sms and r["tflops"] > 0
        if r["tile_m"]:
            tiles, waves_run, eff = _simulate(r["batch"], 4096, r["tile_m"], r["tile_n"], sms)
            assert (r["tiles"], r["waves"]) == (tiles, waves_run)
            assert r["efficiency"] == pytest.approx(eff)
