"""bench/bench_sparse_select.py at a small size on CPU: one row per (density, selection), each
with its density at most near the target and metrics in range; the per-row density keeps at least
its share of every query tile."""

from bench import bench_sparse_select


def test_small_run_reports_every_selection(monkeypatch):
    monkeypatch.setitem(bench_sparse_select.SHAPES, "tiny", (1, 1, (4, 16, 32), 32, 0, 0))
    rows = bench_sparse_select.run("tiny", [0.5], device="cpu", heads=None, pv="fp16", global_tokens=0, seed=0)
    assert [row["selection"] for row in rows] == ["dynamic", "dynamic-rows", "static"]
    for row in rows:
        assert 0 < row["density"] <= 1 and 0 < row["mass_worst_row"] <= row["mass_mean"] <= 1 + 1e-9
        assert -1 <= row["cos_worst"] <= row["cos_mean"] <= 1 + 1e-9
    assert rows[0]["density"] <= 0.5 <= rows[1]["density"]


def test_query_rows_set_the_query_tiles_the_selection_decides_for(monkeypatch):
    """--query-rows: every dynamic selection decides per that many query rows (its rows say so in their
    tiles); static windows stay in the plan's tiles, as installed static plans run them."""
    monkeypatch.setitem(bench_sparse_select.SHAPES, "tiny", (1, 1, (4, 16, 32), 32, 0, 0))
    rows = bench_sparse_select.run("tiny", [0.5], device="cpu", heads=None, pv="fp8", global_tokens=0, seed=0,
                                   query_rows=256)
    assert {row["selection"]: row["tiles"] for row in rows} == {"dynamic": "256x128", "dynamic-rows": "256x128",
                                                                "static": "64x128"}
    assert all(0 < row["density"] <= 1 for row in rows)
