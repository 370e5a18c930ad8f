"""bench/bench_sparse_share.py at a tiny size on CPU (the PyTorch selection and SDPA stand in for the
kernels): the bisection lands near the target density, and a run reports every arm and a share."""

import pytest

from bench import bench_sparse_select, bench_sparse_share


@pytest.mark.slow  # a dozen selections and four timed arms: ~4 s
def test_a_tiny_run_reports_every_arm_near_the_target_density(monkeypatch):
    monkeypatch.setitem(bench_sparse_select.SHAPES, "tiny", (1, 1, (4, 16, 32), 32, 0, 0))
    row = bench_sparse_share.run("tiny", 0.4, "fp16", rounds=1, device="cpu")
    assert set(row["ms"]) == {"dense", "lists", "select+attend", "select"}
    assert all(ms > 0 for ms in row["ms"].values())
    assert abs(row["density"] - 0.4) <= 0.1, row
    assert 0 < row["top_p"] < 1 and row["share"] < 1
