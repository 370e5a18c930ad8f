"""bench/bench_sparse_rows.py at a small size on CPU: the installed probe keeps the planted global
keys' tiles, the oracle keeps its exact count per sampled row, and every selection reports metrics in
range."""

import torch

from bench import bench_sparse_rows
from bench.bench_sparse_select import cell_for
from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs
from sagevideo.kernels.tile_select import grid_tile_order, probe_mass, top_columns


def test_the_probe_forces_the_tiles_of_the_planted_global_keys():
    """What the rows+probe arm runs (`DynamicSelection.probe_columns`): the top 4 tiles of the probe
    include the 3 holding planted global keys in every head, local and temporal-stripe alike."""
    spec = PlantedSpec(1, 4, 8, 16, 32, 64, global_tokens=3)  # 4 frames: local windows outrank one global key
    x = planted_inputs(spec, order=grid_tile_order(8, 16, 32, *cell_for(64)))
    global_tiles = set(((x.k[0, 0, :, -1] > 3).nonzero().flatten() // 64).tolist())  # the global channel's keys
    assert len(global_tiles) == 3
    columns = top_columns(probe_mass(x.q, x.k, block_n=64, sm_scale=x.sm_scale), 4)
    assert columns.shape == (1, 4, 64) and columns.sum(-1).flatten().tolist() == [4] * 4
    for head in range(4):
        assert global_tiles <= set(columns[0, head].nonzero().flatten().tolist()), head


def test_small_run_reports_every_selection(monkeypatch):
    monkeypatch.setitem(bench_sparse_rows.SHAPES, "tiny", (1, 2, (4, 16, 32), 64, 0, 0))
    rows = bench_sparse_rows.run("tiny", 0.25, heads=None, samples=4, probe_cols=2)
    assert [row["selection"] for row in rows] == ["oracle", "dynamic", "dynamic-rows", "rows+probe", "pairs+probe"]
    rows_probe, pairs = rows[3], rows[4]  # a pair shares one list: no more than the per-tile density's slack apart
    assert abs(pairs["density"] - rows_probe["density"]) < 0.05 and pairs["probe_columns"] == 2
    for row in rows:
        assert 0 < row["density"] <= 1 and 0 <= row["mass_worst_row"] <= row["mass_mean"] <= 1 + 1e-9
        assert len(row["cos_per_head"]) == 2 and -1 <= row["cos_worst_head"] <= 1 + 1e-9
    oracle = rows[0]
    assert oracle["mass_mean"] >= max(row["mass_mean"] for row in rows[1:3]) - 0.02  # an upper bound, near enough


def test_the_oracle_keeps_the_most_massive_tiles_of_each_sampled_row():
    class Inputs:  # two query tiles of 4 rows, 16 keys in 4 tiles; key tile 2 holds the mass
        q = torch.zeros(1, 1, 8, 2)
        k = torch.zeros(1, 1, 16, 2)
        v = torch.randn(1, 1, 16, 2)
        sm_scale = 1.0

    Inputs.q[..., 0] = 4.0
    Inputs.k[0, 0, 8:12, 0] = 1.0
    sampled = bench_sparse_rows.SampledRows(Inputs, torch.tensor([1]), 4, 4)
    keep = sampled.oracle(0.25, 1, 2)
    assert keep[0, 0, 1].tolist() == [False, False, True, False] and not keep[0, 0, 0].any()
    quality = sampled.quality(keep)
    assert quality["mass_mean"] > 0.9 and quality["cos_worst_head"] > 0.99
