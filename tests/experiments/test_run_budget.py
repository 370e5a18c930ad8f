"""`profile` and the benches estimate memory and time before they allocate anything
(sagevideo/experiments/run_budget.py): the README's real-size commands on a 24 GB CPU are refused in
one line naming the fixes (exit 2), small ones still run, and long CPU runs show a progress bar."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app

GB = 10**9


@pytest.fixture
def cpu_machine(monkeypatch):
    """The issue's machine: no GPU, 24 GB available; the probes at fixed rates (one head at 1,024
    tokens: 10 ms; matmuls 50 GFLOP/s) so the figures are the estimate's arithmetic, not this
    shared machine's load. Returns the devices models were built on (only "meta" before a refusal)
    and a setter for the available memory."""
    import torch

    from sagevideo.experiments.bench import attention as bench_attention
    from sagevideo.generation import budget, estimate
    from sagevideo.pipelines import forwards

    free = {"bytes": 24 * GB}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(budget, "available_bytes", lambda device="cpu": free["bytes"])
    monkeypatch.setattr(estimate, "_probe_call", lambda *args: 0.01)
    monkeypatch.setattr(estimate, "matmul_flops", lambda *args: 50e9)
    built: list[str] = []
    real_build, real_inputs = forwards.build_step, bench_attention.attention_inputs

    def build_step(name, device="cpu", *args, **kwargs):
        built.append(str(device))
        return real_build(name, device, *args, **kwargs)

    def attention_inputs(*args, **kwargs):
        built.append("attention inputs")
        return real_inputs(*args, **kwargs)

    monkeypatch.setattr(forwards, "build_step", build_step)
    monkeypatch.setattr(bench_attention, "attention_inputs", attention_inputs)
    return built, lambda n: free.update(bytes=n)


def refusal(argv) -> str:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    return line


def test_the_readme_attention_bench_is_refused_for_memory_with_a_shape_that_fits(cpu_machine):
    built, _ = cpu_machine
    line = refusal(["bench", "attention", "--shape", "2x48x17776x64"])
    assert line == (
        "sagevideo bench attention: error: --shape 2x48x17776x64 (float32): needs about 245 GB (q, k, v 1.3 GB, "
        "fp32 reference 437 MB, sdpa-math: scores 243 GB), but the cpu has 24.0 GB available; run it on a GPU "
        "(--device cuda), or give a smaller shape (e.g. --shape 2x48x4352x64)")
    assert built == []  # no tensor made
    from sagevideo.experiments.bench.attention import BenchAttentionConfig, resolve

    suggested = re.search(r"--shape (\S+)\)", line).group(1)
    plan = resolve(BenchAttentionConfig(shapes=[suggested]))  # the suggestion passes the same checks
    assert plan.estimate_s is not None and plan.estimate_s <= 600


@pytest.mark.slow  # the meta build of a 5B model takes seconds
def test_the_readme_profile_is_refused_for_memory_then_for_time_before_building(cpu_machine):
    built, set_free = cpu_machine
    fixes = ("run it on a GPU (--device cuda), at a smaller --frames/--resolution, or on the tiny model "
             "(--model tiny-cogvideox)")
    assert refusal(["profile", "--model", "cogvideox-5b"]) == (
        "sagevideo profile: error: --model cogvideox-5b (17,776 tokens per attention call, 5.6 B parameters, "
        "float32): needs about 29.6 GB (weights 22.3 GB, activations 7.0 GB), but the cpu has 24.0 GB available; "
        + fixes)
    set_free(1000 * GB)
    assert refusal(["profile", "--model", "cogvideox-5b"]) == (
        "sagevideo profile: error: --model cogvideox-5b (17,776 tokens per attention call, 5.6 B parameters, "
        "float32): would take about 11.2 h on this CPU (2 steps of 42 attention calls, each measured here at 1,024 "
        "tokens and scaled by N², and the linears at this machine's matmul rate), more than --max-hours 1; "
        + fixes + ", or raise --max-hours")
    assert set(built) <= {"meta"}  # sized on the meta device only (or from its cache): nothing allocated
    from sagevideo.experiments.run_budget import check_model_run

    estimate = check_model_run("cogvideox-5b", {}, "cpu", "float32", steps={"stock": 2}, max_hours=0)  # no limit
    assert estimate.parts["weights"] == 5_570_283_072 * 4 and 11 * 3600 < estimate.seconds < 11.5 * 3600


@pytest.mark.slow
def test_bench_forward_counts_the_sage_recipes_reference_tiles(cpu_machine):
    built, _ = cpu_machine
    assert refusal(["bench", "forward", "--model", "cogvideox-5b", "--recipes", "eager-sage"]) == (
        "sagevideo bench forward: error: --model cogvideox-5b (17,776 tokens per attention call, 5.6 B parameters, "
        "float32): needs about 38.3 GB (weights 22.3 GB, activations 7.0 GB, sagevideo attention 8.7 GB), but the "
        "cpu has 24.0 GB available; run it on a GPU (--device cuda), at a smaller --frames/--resolution, or on the "
        "tiny model (--model tiny-cogvideox)")
    assert set(built) <= {"meta"}


def test_small_runs_still_run_on_that_machine(cpu_machine):
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "attention", "--shape", "1x2x64x32", "--reps", "1", "--budget-ms", "1"])
    assert result.exit_code == 0, result.output
    assert "sagevideo bench attention: 1x2x64x32: sagevideo-fp16" in result.stdout
    result = runner.invoke(app, ["profile", "--model", "tiny-cogvideox"])
    assert result.exit_code == 0, result.output
    assert "of a step" in result.stdout


def test_long_cpu_runs_show_a_progress_bar(cpu_machine, monkeypatch):
    """A run estimated past LONG_S here gets a tqdm bar (with its ETA) on stderr; a quick one none."""
    from sagevideo.experiments import run_budget

    argv = ["bench", "attention", "--shape", "1x1x128x32", "--reps", "1", "--budget-ms", "1"]
    quick = CliRunner().invoke(app, argv)
    assert quick.exit_code == 0 and "bench attention: 100%" not in quick.stderr
    monkeypatch.setattr(run_budget, "_TIMED_FROM", 0)  # estimate even this small shape's time...
    monkeypatch.setattr(run_budget, "LONG_S", 0.0)  # ...and call it long
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "bench attention: 100%" in result.stderr and "5/5" in result.stderr  # reference, 2 arms x (call + round)
