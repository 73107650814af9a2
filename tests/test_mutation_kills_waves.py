"""fp16lab.waves, beyond tests/test_waves.py: the wave formula against a brute-force count, with
more than one tile per SM, and every argument checked."""

from __future__ import annotations

import pytest

from fp16lab import waves


def _counted(m, n, tile_m, tile_n, sms, tiles_per_sm):
    """Places every output tile, one slot at a time, on ``sms * tiles_per_sm`` slots: returns
    (tiles, waves, useful elements / provisioned slot elements)."""
    tiles = [(i, j) for i in range(0, m, tile_m) for j in range(0, n, tile_n)]
    slots = sms * tiles_per_sm
    n_waves = 0
    for start in range(0, len(tiles), slots):
        n_waves += 1
    useful = sum(min(tile_m, m - i) * min(tile_n, n - j) for i, j in tiles)
    return len(tiles), n_waves, useful / (n_waves * slots * tile_m * tile_n)


@pytest.mark.parametrize("m, n, tile_m, tile_n, sms, tiles_per_sm", [
    (256, 256, 128, 128, 3, 2), (300, 200, 128, 64, 4, 3), (1000, 1000, 128, 256, 132, 2),
    (4096, 4096, 128, 128, 132, 1), (64, 64, 128, 128, 2, 4)])
def test_tiles_waves_and_efficiency_against_a_count(m, n, tile_m, tile_n, sms, tiles_per_sm):
    tiles, n_waves, eff = _counted(m, n, tile_m, tile_n, sms, tiles_per_sm)
    assert waves.tile_count(m, n, tile_m, tile_n) == tiles
    assert waves.wave_count(tiles, sms, tiles_per_sm) == n_waves
    assert waves.efficiency(m, n, tile_m, tile_n, sms, tiles_per_sm) == pytest.approx(eff, rel=1e-12)


def test_two_tiles_per_sm_by_hand():
    # 4 tiles of 128x128 on 3 SMs x 2 slots: one wave of 6 slots, 4 of them useful
    assert waves.wave_count(4, 3, 2) == 1 and waves.wave_count(4, 3) == 2
    assert waves.efficiency(256, 256, 128, 128, 3, 2) == pytest.approx(4 / 6)
    assert waves.efficiency(256, 256, 128, 128, 3) == pytest.approx(4 / 6)  # 2 waves of 3 slots


@pytest.mark.parametrize("which", ["m", "n", "tile_m", "tile_n"])
@pytest.mark.parametrize("bad", [0, -128])
def test_tile_count_refuses_each_non_positive_argument(which, bad):
    args = dict(m=256, n=256, tile_m=128, tile_n=128)
    args[which] = bad
    with pytest.raises(ValueError, match=which):
        waves.tile_count(**args)


@pytest.mark.parametrize("which", ["tiles", "sms", "tiles_per_sm"])
def test_wave_count_refuses_each_non_positive_argument(which):
    args = dict(tiles=10, sms=4, tiles_per_sm=2)
    args[which] = 0
    with pytest.raises(ValueError, match=which):
        waves.wave_count(**args)
