"""bench/bench_attention.py on CPU: its round-robin timing (`bench_ms` replaced by a fake clock), its
options, and the rows `--append-results` writes (from a recorded GPU row)."""

import pytest

from bench import bench_attention
from bench.results import append, load, one, select, speedup, start_run


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
    from bench import bench_transformer

    for resolution, (frames, h, w) in bench_transformer.OPENSORA_LATENTS.items():
        assert bench_attention.SHAPES[f"opensora-{resolution}"] == (1, 24, frames * (h // 2) * (w // 2) + 512, 128)


def test_dtype_option_is_checked(capsys):
    with pytest.raises(SystemExit):
        bench_attention.main(["--dtype", "fp32"])
    assert "invalid choice: 'fp32'" in capsys.readouterr().err


def fake_row(shape: str = "cogvideox-2b", dtype: str = "float16") -> dict:
    """A `bench_shape` row as a GPU run returns it (values invented; sdpa-efficient failed)."""
    ms = {"sdpa-flash": 15.5, "sdpa-cudnn": 12.1, "sdpa-efficient": None, "sage-fp16-call": 10.5,
          "sage-fp16-quant": 0.19, "sage-fp16-kernel": 10.2, "sage-fp8-call": 8.4, "sage-fp8-quant": 0.26,
          "sage-fp8-kernel": 8.0}
    shape_dims = bench_attention.SHAPES[shape]
    return {
        "shape": shape, "B": shape_dims[0], "H": shape_dims[1], "N": shape_dims[2], "D": shape_dims[3],
        "dtype": dtype, "ms": ms, "ms_reps": {k: [t, t] for k, t in ms.items() if t},
        "errors": {"sdpa-efficient": "No available kernel"},
        "tops": {k: (bench_attention.tops(shape_dims, t) if t else None) for k, t in ms.items()},
        "vs_cudnn": {k: (12.1 / t if t else None) for k, t in ms.items()},
        "kernel": {"fp16": "triton", "fp8": "gluon"}, "cos_worst": {"fp16": 0.99991, "fp8": 0.99916},
        "prep_kernels_ms": {"fp16": {"_quantize_kv_kernel": 0.1, "_quantize_q_kernel": 0.07},
                            "fp8": {"_quantize_kv_kernel": 0.15, "_quantize_q_kernel": 0.1}},
        "sweep": {"fp8": [{"block_m": 64, "block_n": 128, "warps": 4, "stages": 2, "prep_ms": 0.2,
                           "scores_by_add": True, "max_registers": 128, "ms": 7.9, "tops": 612.0},
                          {"block_m": 128, "block_n": 128, "error": "out of resources: shared memory"}]},
    }


def test_append_results_writes_the_runs_rows_into_the_results_file(monkeypatch, tmp_path, capsys):
    """CPU: the GPU work (`bench_shape`) replaced by a recorded row; the option's plumbing is real."""
    monkeypatch.setattr(bench_attention.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_attention, "versions", lambda: {"gpu": "NVIDIA H200", "capability": [9, 0],
                                                                 "torch": "2.11", "triton": "3.6", "cudnn": 91900,
                                                                 "date": "2026-12-02T09:30:00+00:00"})
    monkeypatch.setattr(bench_attention, "bench_shape", lambda name, *args: fake_row(name))
    monkeypatch.setenv("BENCH_COMMIT", "f80f196f7a34cf11901f381a04d21c94554c646a")
    path = tmp_path / "results.jsonl"
    assert bench_attention.main(["--shapes", "cogvideox-2b", "--append-results", str(path)]) == 0
    assert f"rows appended to {path}" in capsys.readouterr().out
    rows = load(path)
    assert {(r.bench, r.shape, r.gpu, r.commit) for r in rows} == {
        ("bench_attention", "cogvideox-2b", "NVIDIA H200", "f80f196f7a34cf11901f381a04d21c94554c646a")}
    assert len({r.source for r in rows}) == 1 and rows[0].source.endswith(
        "python -m bench.bench_attention --shapes cogvideox-2b --append-results " + str(path))
    call = one(rows, variant="sage-fp8-call", metric="ms")
    assert call.value == 8.4 and call.extra == {"reps": [8.4, 8.4]}
    assert round(speedup(rows, call), 3) == round(12.1 / 8.4, 3)  # ratios are derived, not stored
    assert one(rows, variant="sage-fp8-kernel", metric="tops").extra == {"kernel": "gluon"}
    assert select(rows, variant="sage-fp8-quant", metric="tops") == []
    assert one(rows, variant="sage-fp8-call", metric="cos_worst").value == 0.99916
    prep = one(rows, variant="sage-fp16-prep", metric="ms")
    assert prep.value == 0.17 and prep.extra["kernels_ms"]["_quantize_q_kernel"] == 0.07
    assert one(rows, variant="sdpa-efficient", metric="error").extra == {"error": "No available kernel"}
    assert select(rows, variant="sdpa-efficient", metric="ms") == []
    swept = "sage-fp8-kernel[block_m=64,block_n=128,warps=4,stages=2,scores_by_add=on,max_registers=128]"
    assert one(rows, variant=swept, metric="ms").extra == {"prep_ms": 0.2}
    assert "shared memory" in one(rows, variant="sage-fp8-kernel[block_m=128,block_n=128]",
                                  metric="error").extra["error"]
    with pytest.raises(ValueError, match="already in"):  # a row already there: refused, nothing written
        append(rows[:1], path)
    assert len(load(path)) == len(rows)


def test_other_dtypes_are_a_parameter_of_the_variant():
    run = bench_attention.result_rows(start_run("bench_attention", "NVIDIA H200", []), [fake_row(dtype="bfloat16")])
    assert {r.variant for r in run.rows} >= {"sage-fp8-call[dtype=bf16]", "sdpa-cudnn[dtype=bf16]",
                                             "sage-fp8-kernel[block_m=64,block_n=128,warps=4,stages=2,"
                                             "scores_by_add=on,max_registers=128,dtype=bf16]"}
    assert not [r for r in run.rows if "dtype" not in r.variant]
