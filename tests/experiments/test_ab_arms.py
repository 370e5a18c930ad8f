"""`sagevideo ab --arm`: recipe arms on the tiny CogVideoX, each against full precision and its repeat."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app
from sagevideo.errors import InputError
from sagevideo.experiments.ab_arms import parse_arm, parse_arms

pytestmark = pytest.mark.usefixtures("one_thread")

ARMS = ["sage=attention=sage", "sage-cache=attention=sage,cache=first-block,cache_threshold=5"]


def test_parse_arm_reads_attention_pv_and_the_recipe():
    arm = parse_arm("sage-fp8=attention=sage,pv=fp16,linear=fp8,cache=first-block,cache-threshold=0.1")
    assert (arm.name, arm.attention, arm.pv) == ("sage-fp8", "sage", "fp16")
    assert arm.recipe.linear == "fp8" and arm.recipe.threshold == 0.1
    assert arm.generate_settings()["cache"] == "first-block" and arm.generate_settings()["pv"] == "fp16"
    assert arm.label() == "sage/fp16 + fp8+first-block@0.1"
    assert parse_arm("full-fp8=attention=full,linear=fp8").label() == "full + fp8"
    edges = parse_arm("fp8-edges=attention=sage,linear=fp8,linear_bf16_steps=0;-1")
    assert edges.recipe.linear_bf16_steps == [0, -1] and edges.generate_settings()["linear_bf16_steps"] == [0, -1]


@pytest.mark.parametrize(
    "texts, message",
    [
        (["noname"], "give NAME=SETTINGS"),
        (["a=attention=fast"], "attention=fast: use one of sage, full"),
        (["a=linear=int4"], "linear"),
        (["a=speed=2"], "'speed=2': give NAME=VALUE"),
        (["a=attention=full,pv=fp8"], "pv=fp8 applies to attention=sage only"),
        (["a=cache_threshold=0.1"], "only --cache first-block takes a threshold"),
        (["a=linear_bf16_steps=0"], "runs steps in bf16 only with --linear fp8"),
        (["a=attention=sage", "a=cache=first-block"], "--arm a: the name is given twice"),
    ],
)
def test_bad_arms_are_refused_with_the_reason(texts, message):
    with pytest.raises(InputError, match=None) as err:
        parse_arms(texts)
    assert message in str(err.value)


def test_a_bad_arm_is_refused_before_anything_runs(tmp_path):
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a red fox running through snow\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "ab", str(jobs), "--out", str(out), "--no-progress", "--device", "cpu",
        "--arm", "sage=attention=sage", "--arm", "sage-fp8=attention=sage,linear=fp8",
    ])
    assert result.exit_code == 2, result.output
    assert "arm sage-fp8" in result.output and "float8 linears need a CUDA GPU" in result.output
    assert not out.exists()  # nothing ran, no folder made
    result = CliRunner().invoke(app, ["ab", str(jobs), "--out", str(out), "--arm", "a=attention=sage",
                                      "--linear", "fp8"])
    assert result.exit_code == 2 and "--linear: with --arm each arm gives its own settings" in result.output
    with_recipe = tmp_path / "jobs.yaml"
    with_recipe.write_text("recipe:\n  cache: first-block\njobs:\n  - a red fox\n")
    result = CliRunner().invoke(app, ["ab", str(with_recipe), "--out", str(out), "--arm", "a=attention=sage"])
    assert result.exit_code == 2 and not out.exists()
    assert f"{with_recipe} line 1 (recipe): with --arm each arm gives its own recipe; remove the job file's recipe: " \
           "section, or run without --arm" in result.output


@pytest.mark.slow  # renders four arms (two recipe arms, full precision twice), then evaluates two
def test_ab_arms_are_each_evaluated_and_summarized(tmp_path):
    from sagevideo.outputs.manifest import Manifest
    from tests.helpers.evalkit import single_thread

    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a red fox running through snow\n")
    out = tmp_path / "out"
    with single_thread():
        result = CliRunner().invoke(app, [
            "ab", str(jobs), "--out", str(out), "--no-progress", "--metrics", "psnr", "--resamples", "100",
            "--weights", str(tmp_path / "no-weights"), *[a for text in ARMS for a in ("--arm", text)],
        ])
    assert result.exit_code == 0, result.output
    (cached,) = Manifest(out / "arms" / "sage-cache" / "manifest.jsonl").records()
    assert cached.attention == "sage" and cached.recipe["cache_skipped"] == 1  # 2 steps, threshold 5
    data = json.loads((out / "metrics.json").read_text())
    assert data["schema"] == "sagevideo.ab.arms" and data["reference"]["denoise_s"] > 0
    assert [a["name"] for a in data["arms"]] == ["sage", "sage-cache"]
    sage, cache = data["arms"]
    for arm in data["arms"]:
        psnr = arm["metrics"]["psnr"]
        assert psnr["noise_floor"] == "inf" and psnr["within_noise_floor"] is False and psnr["direction"] == "worse"
        assert arm["timings"]["denoise_s"] > 0 and arm["timings"]["speedup_vs_reference"] > 0
        assert (out / arm["evaluation"]["report"]).is_file() and (out / arm["evaluation"]["metrics_json"]).is_file()
    assert sage["recipe_applied"] is None and sage["cache_skipped"] is None
    assert cache["recipe"]["cache"] == "first-block" and cache["cache_skipped"] == 1
    assert cache["label"] == "sage + first-block@5"
    assert "sage-cache: PSNR: beyond the noise floor (worse)" in result.output
    report = (out / "report.html").read_text()
    assert "sage-cache" in report and ">sage</a>" in report and "first-block@5" in report
    arm_metrics = json.loads((out / "evals" / "sage-cache" / "metrics.json").read_text())
    assert arm_metrics["arms"]["test"]["label"] == "sage-cache (sage + first-block@5)"
