"""`sagevideo bench attention|forward` on the command line: small real runs on the CPU and the
bad input refused (exit 2) before any work."""

import json

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app


def test_bench_attention_prints_the_table_and_a_summary_and_writes_json(tmp_path):
    path = tmp_path / "a.json"
    result = CliRunner().invoke(app, ["bench", "attention", "--shape", "1x2x32x32", "--reps", "2",
                                      "--budget-ms", "1", "--json", str(path)])
    assert result.exit_code == 0, result.output
    assert "[1/1] 1x2x32x32" in result.stderr  # progress
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("sagevideo bench attention: 1x2x32x32: sagevideo-fp16 (reference/fp16)")
    assert last.endswith(f"x sdpa-math -> {path}")
    arms = {a["name"]: a for a in json.loads(path.read_text())["shapes"][0]["arms"]}
    assert set(arms) == {"sdpa-math", "sagevideo-fp16"} and len(arms["sdpa-math"]["reps_ms"]) == 2


def test_bench_forward_runs_the_recipes_side_by_side():
    result = CliRunner().invoke(app, ["bench", "forward", "--model", "tiny-opensora", "--recipes",
                                      "eager-cudnn,eager-sage", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert "eager-sage: " in result.stderr  # each recipe as it finishes
    lines = result.stdout.strip().splitlines()
    assert lines[-3].startswith("eager-cudnn") and lines[-2].startswith("eager-sage") and "reference/fp16" in lines[-2]
    assert lines[-1].startswith("sagevideo bench forward: tiny-opensora: fastest ")


def test_bench_at_the_users_size_times_that_many_tokens(tmp_path):
    """--frames/--resolution size the model's forwards and attention calls (tiny CogVideoX:
    49 frames 64x64 -> 13 latent frames of 4x4 patches = 208 video tokens, plus the 226 text tokens
    CogVideoX attends to jointly)."""
    path = tmp_path / "f.json"
    result = CliRunner().invoke(app, ["bench", "forward", "--model", "tiny-cogvideox", "--frames", "49",
                                      "--resolution", "64x64", "--recipes", "eager-cudnn", "--repeats", "1",
                                      "--json", str(path)])
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    assert report["size"] == {"frames": 49, "height": 64, "width": 64} and report["tokens"] == 208
    result = CliRunner().invoke(app, ["bench", "attention", "--model", "tiny-cogvideox", "--frames", "49",
                                      "--resolution", "64x64", "--reps", "1", "--budget-ms", "1",
                                      "--json", str(tmp_path / "a.json")])
    assert result.exit_code == 0, result.output
    shapes = json.loads((tmp_path / "a.json").read_text())["shapes"]
    assert {s["n_q"] for s in shapes} == {208 + 226}


@pytest.fixture
def no_work(monkeypatch):
    """Bad input must be refused before anything is timed or built."""
    from sagevideo.experiments.bench import attention as bench_attention
    from sagevideo.experiments.bench import forward as bench_forward

    def refuse(*args, **kwargs):
        raise AssertionError("work started on bad input")

    monkeypatch.setattr(bench_attention, "run_bench_attention", refuse)
    monkeypatch.setattr(bench_forward, "run_bench_forward", refuse)


@pytest.mark.parametrize(("args", "message"), [
    (["attention", "--shape", "2x48x17776"], "--shape '2x48x17776': not BxHxNxD or BxHxNqxNkxD"),
    (["attention"], "nothing to time: give --shape BxHxNxD (repeatable) or --model NAME"),
    (["attention", "--model", "cogvideox"], "--model cogvideox: unknown model config 'cogvideox'"),
    (["forward", "--model", "tiny"], "--model tiny: unknown model config 'tiny'"),
    (["forward", "--recipes", "eager-sage,quick-sage"], "--recipes quick-sage: 'quick-sage' is not"),
    (["forward", "--frames", "12"], "frames 12 must be 4k + 1"),
    (["forward", "--resolution", "480"], "--resolution 480: use HEIGHTxWIDTH in pixels, e.g. 480x720"),
    (["attention", "--shape", "1x2x32x32", "--frames", "9"], "--frames and --resolution size a --model; give one"),
])
def test_bad_input_exits_2_with_one_clear_line(no_work, args, message):
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"sagevideo bench {args[0]}: error: {message}")


def test_fp8_linears_on_the_cpu_exit_2(no_work):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the CPU's refusal")
    result = CliRunner().invoke(app, ["bench", "forward", "--recipes", "fp8-compile-sage"])
    assert result.exit_code == 2
    assert "sagevideo bench forward: error: --recipes fp8-compile-sage: float8 linears need a CUDA GPU" in result.stderr


def test_append_results_writes_schema_valid_rows_each_run(tmp_path, monkeypatch):
    """--append-results FILE: one validated row per figure, the run's settings in its source; a
    second run appends (the start time tells the runs apart)."""
    from sagevideo.experiments.bench.results import load

    monkeypatch.setenv("BENCH_COMMIT", "0123abc")
    path = tmp_path / "results.jsonl"
    args = ["bench", "attention", "--shape", "1x2x32x32", "--reps", "1", "--budget-ms", "1",
            "--append-results", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = load(path)
    assert {(r.shape, r.variant) for r in rows} == {("1x2x32x32", "sdpa-math"), ("1x2x32x32", "sagevideo-fp16")}
    assert {r.bench for r in rows} == {"sagevideo.bench.attention"} and {r.commit for r in rows} == {"0123abc"}
    ms = next(r for r in rows if r.variant == "sagevideo-fp16" and r.metric == "ms")
    assert ms.extra["ran"] == "reference/fp16" and ms.source.endswith("sagevideo bench attention shapes=1x2x32x32 "
                                                                       "reps=1 budget_ms=1.0")
    forward = CliRunner().invoke(app, ["bench", "forward", "--model", "tiny-opensora", "--recipes", "eager-cudnn",
                                       "--repeats", "1", "--append-results", str(path)])
    assert forward.exit_code == 0, forward.output
    recipe = [r for r in load(path) if r.bench == "sagevideo.bench.forward"]
    assert {(r.shape, r.variant) for r in recipe} == {("tiny-opensora", "recipe-eager-cudnn")}
    assert {"ms", "first_call_s"} <= {r.metric for r in recipe}


def test_append_results_into_a_missing_folder_is_refused_before_any_work(tmp_path, no_work):
    result = CliRunner().invoke(app, ["bench", "attention", "--shape", "1x2x32x32",
                                      "--append-results", str(tmp_path / "nowhere" / "r.jsonl")])
    assert result.exit_code == 2 and "--append-results" in result.output and "does not exist" in result.output
