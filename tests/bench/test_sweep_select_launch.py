"""bench/sweep_select_launch.py at a tiny size under the CPU interpreter: each variant is timed, and
a quarter of the scores per program (fewer query tiles a program) keeps every list."""

import json

import pytest

from bench import bench_sparse_select, sweep_select_launch


@pytest.mark.slow  # eight selections under the interpreter: ~2 s
def test_a_tiny_sweep_times_each_variant_and_a_selection_variant_keeps_every_list(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(bench_sparse_select.SHAPES, "tiny", (1, 1, (2, 8, 32), 32, 0, 0))
    path = tmp_path / "sweep.json"
    assert sweep_select_launch.main(["--shape", "tiny", "--device", "cpu", "--rounds", "1", "--density", "0.3",
                                     "--variant", "rows<=4 w4 1024", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())
    assert [row["variant"] for row in rows] == ["module", "rows<=4 w4 1024"]
    assert all(row["ms"] > 0 and row["rows_differing"] == 0 for row in rows)
    assert rows[0]["probe_columns"] == 1 and 0 < rows[0]["density"] < 1
    assert "rows<=4 w4 1024" in capsys.readouterr().out
