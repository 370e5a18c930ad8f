"""bench/bench_transformer.py: the rows it adds to the results file, from a recorded forward and from a
tiny run on CPU."""

import pytest

from bench import bench_transformer
from bench.results import load, one, select, start_run

FORWARD = {"config": "CogVideoX-5B (random weights), 2x49 frames 480x720, bf16", "sdpa_cudnn_s": 1.796,
           "sagevideo_s": 1.565, "speedup": 1.796 / 1.565, "plan": "int8-fp8/block",
           "backends": {"triton/fp8": 210}, "per_layer_worst_cos": {"blocks.0": 0.99999, "blocks.1": 0.99997},
           "output_cos_vs_sdpa": 0.99999, "gpu": "NVIDIA H200"}


def test_a_forward_becomes_the_rows_the_older_forwards_have():
    run = bench_transformer.result_rows(start_run("bench_transformer", "NVIDIA H200", []), "cogvideox-5b", FORWARD)
    rows = run.rows
    assert round(one(rows, variant="sdpa-cudnn", metric="ms").value) == 1796
    sage = one(rows, variant="sagevideo-fp8", metric="ms")
    assert round(sage.value) == 1565 and sage.extra == {"plan": "int8-fp8/block", "backends": {"triton/fp8": 210}}
    worst = one(rows, metric="layer_cos_worst_min")
    assert worst.value == 0.99997 and worst.extra["layer"] == "blocks.1"
    assert one(rows, metric="layer_cos_worst_mean").value == pytest.approx(0.99998)
    no_layers = bench_transformer.result_rows(start_run("bench_transformer", "NVIDIA H200", []), "opensora-768px",
                                              {**FORWARD, "per_layer_worst_cos": {}})
    assert select(no_layers.rows, metric="layer_cos_worst_min") == []  # --no-layer-cosine


@pytest.mark.slow
def test_tiny_run_on_cpu_appends_its_rows(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    assert bench_transformer.main(["--tiny", "--repeats", "1", "--append-results", str(path)]) == 0
    assert "6 rows appended" in capsys.readouterr().out
    rows = load(path)
    assert {(r.bench, r.shape, r.gpu) for r in rows} == {("bench_transformer", "cogvideox-5b-tiny", "cpu")}
    assert one(rows, variant="sagevideo-fp16", metric="ms").extra["backends"] == {"reference/fp16": 6}


@pytest.mark.slow  # every recipe of the tiny transformer, compiled ones included (3 s)
def test_recipes_run_side_by_side_on_cpu_and_become_rows(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    argv = ["--tiny", "--recipes", "eager-cudnn,eager-sage,fp8-compile-sage,compile-sage", "--repeats", "1",
            "--append-results", str(path)]
    assert bench_transformer.main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[-1].startswith("compile-sage") and "reference/fp16" in table[-1]  # the table last
    assert table[-2].startswith("fp8-compile-sage") and "not run: float8 linears need a CUDA GPU" in table[-2]
    rows = load(path)
    assert one(rows, variant="recipe-eager-cudnn", metric="x_eager_cudnn").value == 1.0
    compiled = one(rows, variant="recipe-compile-sage", metric="ms")
    assert compiled.extra["backends"] == {"reference/fp16": 6} and compiled.extra["recipe"] == "regional/eager"
    assert one(rows, variant="recipe-compile-sage", metric="output_cos_vs_eager_cudnn").value > 0.999
    assert select(rows, metric="x_compile_cudnn") == []  # no compile-cudnn recipe in this run
    with pytest.raises(SystemExit, match="not \\[fp8-\\]"):
        bench_transformer.parse_recipe_name("fast-sage")


def test_the_output_cosine_of_equal_outputs_is_one_at_real_size():
    import torch

    out = torch.randn(2 * 13 * 16 * 60 * 90, generator=torch.Generator().manual_seed(0))  # CogVideoX-5B's output
    assert abs(bench_transformer.output_cosine(out, out.clone()) - 1.0) < 1e-12  # fp32 accumulation: 1.00007
    assert bench_transformer.output_cosine(out, -out) == pytest.approx(-1.0, abs=1e-12)
