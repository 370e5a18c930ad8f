"""bench/bench_sparse_share.py at a tiny size on CPU (the PyTorch selection and SDPA stand in for the
kernels): the bisection lands near the target density, and a run reports every arm and a share."""

import json

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


def test_a_run_appends_its_rows_to_the_results_file(tmp_path, monkeypatch):
    """--append-results writes the run's figures as validated results-file rows (the ones the
    benchmark page cites), one variant per P·V mode and rule."""
    monkeypatch.setitem(bench_sparse_select.SHAPES, "tiny", (1, 1, (4, 16, 32), 32, 0, 0))
    monkeypatch.setattr(bench_sparse_share, "run", lambda *a, **k: dict(ROW))
    monkeypatch.setenv("BENCH_COMMIT", "abc1234")
    path = tmp_path / "results.jsonl"
    assert bench_sparse_share.main(["--shape", "tiny", "--device", "cpu", "--append-results", str(path)]) == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_metric = {row["metric"]: row for row in rows}
    assert {row["variant"] for row in rows} == {"fp8[rule=per-row,target=0.15,probe_columns=9]"}
    assert by_metric["device_share"]["value"] == ROW["device_share"]
    assert by_metric["device_share"]["extra"]["kernels_ms"] == ROW["select_kernels_ms"]
    assert by_metric["device_select_and_attend_ms"]["value"] == 24.575 and by_metric["lists_ms"]["unit"] == "ms"
    assert by_metric["density"]["extra"] == {"tiles": "64x128"}  # a per-row run has no top_p
    assert {row["bench"] for row in rows} == {"bench_sparse_share"} and rows[0]["commit"] == "abc1234"
    assert rows[0]["source"].endswith("python -m bench.bench_sparse_share --shape tiny --device cpu --append-results "
                                      + str(path))


ROW = {"shape": "tiny", "pv": "fp8", "target": 0.15, "density": 0.1506, "rule": "per-row", "top_p": None,
       "tiles": "64x128", "probe_columns": 9,
       "ms": {"dense": 138.4, "lists": 25.4, "select+attend": 25.8, "select": 3.1},
       "share": 0.0168, "select_over_call": 0.1216, "x_dense": 5.363,
       "device_ms": {"lists": 22.384, "select+attend": 24.575},
       "attention_ms": {"lists": 20.566, "select+attend": 20.562}, "device_share": 0.0894,
       "select_kernels_ms": {"_select_tiles_kernel": 0.776, "_quantize_q_kernel": 0.452}}
