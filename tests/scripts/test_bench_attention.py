"""scripts/bench_attention.py's round-robin timing (CPU: `bench_ms` replaced by a fake clock)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_attention  # noqa: E402


def test_interleaved_timing_takes_the_median_of_round_robin_runs(monkeypatch):
    order = []
    clock = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 6.0])}

    def fake_bench(fn):
        name = fn()
        order.append(name)
        return next(clock[name])

    def broken():
        raise RuntimeError("backend unavailable for this shape\ndetails")

    monkeypatch.setattr(bench_attention, "bench_ms", fake_bench)
    medians, runs, errors = bench_attention.bench_interleaved(
        {"a": lambda: "a", "b": lambda: "b", "c": broken}, reps=3)
    assert order == ["a", "b"] * 3  # round-robin, the failing variant dropped after its first error
    assert medians == {"a": 2.0, "b": 5.0}
    assert runs == {"a": [3.0, 1.0, 2.0], "b": [5.0, 4.0, 6.0]}
    assert errors == {"c": "backend unavailable for this shape"}


def test_reps_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_attention.main(["--reps", "0"])
    assert exc.value.code == 2
    assert "--reps 0" in capsys.readouterr().err
