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


def test_opensora_shapes_are_the_models_joint_sequences():
    """The benchmark's Open-Sora shapes are what the transformer attends over (bench_transformer's
    latents: frames x (H/2) x (W/2) video tokens after 2x2 patching, plus 512 text tokens)."""
    import bench_transformer

    for resolution, (frames, h, w) in bench_transformer.OPENSORA_LATENTS.items():
        assert bench_attention.SHAPES[f"opensora-{resolution}"] == (1, 24, frames * (h // 2) * (w // 2) + 512, 128)


def test_dtype_option_is_checked(capsys):
    with pytest.raises(SystemExit):
        bench_attention.main(["--dtype", "fp32"])
    assert "invalid choice: 'fp32'" in capsys.readouterr().err
