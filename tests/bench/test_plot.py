"""bench/plot.py: speed-ups of one run's rows over a baseline, and the figure."""

from __future__ import annotations

import pytest

from bench import plot
from bench.results import Result


def _row(shape, variant, ms):
    return Result(bench="b", shape=shape, variant=variant, metric="ms", value=ms, gpu="H200", date="2026-12-01",
                  source="run")


def test_speedups_are_the_baseline_time_over_each_variant():
    rows = [_row("2b", "cudnn", 12.0), _row("2b", "sage", 8.0), _row("5b", "cudnn", 18.0), _row("5b", "sage", 12.0)]
    assert plot.speedups(rows, "cudnn") == {"2b": {"sage": 1.5}, "5b": {"sage": 1.5}}
    with pytest.raises(ValueError, match="no shape has the baseline 'flash'"):
        plot.speedups(rows, "flash")


def test_the_command_plots_a_source_of_the_results_file(tmp_path):
    out = tmp_path / "ab.png"
    assert plot.main(["--source", "2026-12-01-h200-ab-final.json", "--baseline", "cudnn[pv=fp8]",
                      "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert plot.main(["--source", "no-such-run", "--out", str(out)]) == 2
