"""`sagevideo ab` end to end on the tiny CogVideoX: three arms, the attention probe, the plan check."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = ["transformer_blocks.0.attn1", "transformer_blocks.1.attn1"]


@pytest.fixture(scope="module")
def ab_run(tmp_path_factory):
    from tests.helpers.evalkit import single_thread

    root = tmp_path_factory.mktemp("ab")
    jobs = root / "jobs.txt"
    jobs.write_text("a red fox running through snow\na lighthouse at dusk\n")
    with single_thread():
        result = CliRunner().invoke(
            app,
            [
                "ab",
                str(jobs),
                "--model",
                "tiny",
                "--out",
                str(root / "out"),
                "--attention-probe",
                "--no-progress",
                "--metrics",
                "psnr,ssim",
                "--resamples",
                "200",
                "--weights",
                str(root / "no-weights"),
            ],
        )
    return root / "out", result


@pytest.mark.slow  # renders three arms, then evaluates them
def test_ab_runs_three_arms_and_evaluates(ab_run):
    out, result = ab_run
    assert result.exit_code == 0, result.output
    for arm in ("quantized", "full", "full-repeat"):
        records = [json.loads(line) for line in (out / arm / "manifest.jsonl").read_text().splitlines()]
        assert [r["status"] for r in records] == ["done", "done"]
        assert {r["attention"] for r in records} == {"sage" if arm == "quantized" else "full"}
    data = json.loads((out / "metrics.json").read_text())
    assert data["arms"]["test"]["label"] == "quantized" and data["arms"]["ref"]["label"] == "full precision"
    assert data["arms"]["test"]["settings"]["backends_ran"] == {"reference/fp16": 8}  # 2 videos x 2 steps x 2 layers
    assert data["run"]["model"] == "tiny" and data["run"]["attention_probe"] is True
    psnr = data["metrics"]["psnr"]
    # full precision is deterministic on CPU: the noise floor is exact, the quantized arm is not
    assert psnr["noise_floor"]["mean"] == "inf" and 20 < psnr["difference"]["mean"] < 80
    assert psnr["verdict"]["within_noise_floor"] is False and psnr["verdict"]["direction"] == "worse"
    assert "PSNR: beyond the noise floor (worse)" in result.output
    pairs = data["pairs"]
    assert [p["videos"]["test"].split("/")[0] for p in pairs] == ["quantized", "quantized"]
    assert all((out / p["videos"]["ref"]).is_file() and (out / p["diff_video"]).is_file() for p in pairs)


@pytest.mark.slow  # shares that run
def test_attention_probe_per_layer_and_step(ab_run):
    out, _ = ab_run
    probe = json.loads((out / "metrics.json").read_text())["attention_probe"]
    assert [layer["layer"] for layer in probe["layers"]] == LAYERS
    for layer in probe["layers"]:
        assert layer["steps"] == [0, 1] and layer["calls"] == 4  # 2 prompts x 2 steps
        assert 0.99 < layer["cos_worst"] < 1.0 and layer["cos_worst"] <= layer["cos_mean"]
        assert layer["rel_l1_worst"] > 0 and layer["rmse_worst"] >= layer["rmse_mean"] > 0
        assert layer["floor_cos_worst"] == pytest.approx(1.0, abs=1e-12)  # fp32 SDPA vs fp32 SDPA
        assert layer["modes"] == ["int8-fp16/block"]
    s = probe["summary"]
    assert s["calls"] == 8 and s["cos_worst"] == min(layer["cos_worst"] for layer in probe["layers"])
    assert s["worst_at"]["cos"]["layer"] in LAYERS and s["worst_at"]["cos"]["step"] in (0, 1)
    assert probe["reproduced"]["all_identical"] is True, probe["reproduced"]["videos"]
    assert probe["peaky_layers"] == [] and all(0 < layer["score_std"] < 10 for layer in probe["layers"])
    figures = [f["file"] for f in json.loads((out / "metrics.json").read_text())["figures"]]
    assert "figures/attention_cosine_per_layer.png" in figures and all((out / f).is_file() for f in figures)


@pytest.mark.slow  # renders and evaluates arms
def test_ab_with_a_plan_evaluates_an_arm_that_ran_the_plan(tmp_path):
    """`generate` installs the plan: the evaluated quantized arm is the one it wrote, and it ran the
    plan's attention per layer and step (the plan check passes, the probe reproduces it exactly)."""
    from tests.helpers.evalkit import single_thread

    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "layers": LAYERS,
                "default": {"mode": "int8-fp8"},
                "overrides": [{"layers": [LAYERS[0]], "steps": [0, 1], "mode": "full"}],
            }
        )
    )
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a red fox running through snow\na lighthouse at dusk\n")
    with single_thread():
        result = CliRunner().invoke(
            app,
            [
                "ab",
                str(jobs),
                "--out",
                str(tmp_path / "out"),
                "--plan",
                str(plan),
                "--attention-probe",
                "--no-noise-floor",
                "--no-progress",
                "--metrics",
                "psnr",
                "--weights",
                str(tmp_path / "w"),
            ],
        )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "metrics.json").read_text())
    test = data["arms"]["test"]
    assert test["settings"]["backends_ran"] == {"reference/fp8": 6, "sdpa": 2}  # 2 videos x (3 fp8 + 1 full)
    assert test["settings"]["plan"].endswith("plan.json")
    assert data["run"]["quantized_arm"] == "quantized"
    assert data["run"]["plan_check"].startswith("the quantized arm's recorded attention calls match the plan")
    assert not (tmp_path / "out" / "quantized-plan").exists()
    probe = {layer["layer"]: layer for layer in data["attention_probe"]["layers"]}
    assert probe[LAYERS[0]]["modes"] == ["full", "int8-fp8/block"] and probe[LAYERS[1]]["modes"] == ["int8-fp8/block"]
    assert probe[LAYERS[0]]["cos_worst_by_step"][0] == pytest.approx(1.0, abs=1e-12)  # full precision at step 0
    assert probe[LAYERS[0]]["cos_worst_by_step"][1] < 1.0
    reproduced = data["attention_probe"]["reproduced"]
    assert reproduced["all_identical"] is True, reproduced["videos"]  # max |diff| per video; None: frame counts differ
    assert "no noise-floor run" in " ".join(data["notes"])


@pytest.mark.slow  # renders three arms, then evaluates them
def test_ab_runs_the_quantized_arm_with_a_recipe_and_reports_it(tmp_path):
    """--cache/--compile reach the quantized arm only: its records carry the recipe (and the skipped
    steps), the full-precision arms run plain, metrics.json says which recipe was compared."""
    from sagevideo.outputs.manifest import Manifest
    from tests.helpers.evalkit import single_thread

    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a red fox running through snow\n")
    out = tmp_path / "out"
    with single_thread():
        result = CliRunner().invoke(app, [
            "ab", str(jobs), "--out", str(out), "--no-progress", "--metrics", "psnr", "--resamples", "100",
            "--weights", str(tmp_path / "no-weights"), "--cache", "first-block", "--cache-threshold", "5",
            "--compile", "regional", "--compile-backend", "eager",
        ])
    assert result.exit_code == 0, result.output
    (quantized,) = Manifest(out / "quantized" / "manifest.jsonl").records()
    assert quantized.recipe["cache"] == "first-block" and quantized.recipe["cache_skipped"] == 1  # 2 steps
    assert quantized.recipe["compiled_blocks"] == 2
    for arm in ("full", "full-repeat"):
        assert all(r.recipe is None for r in Manifest(out / arm / "manifest.jsonl").records())
    metrics = json.loads((out / "metrics.json").read_text())
    assert json.dumps(metrics).count("regional/eager+first-block@5") >= 1


def test_a_job_files_recipe_is_the_quantized_arms_and_the_full_precision_arms_run_plain(tmp_path, monkeypatch):
    """Planned, not run: every arm's batch is made before anything runs (the first run stops the test)."""
    import sagevideo.generation.generate as generate
    from sagevideo.errors import InputError
    from sagevideo.experiments.ab import ab

    planned = {}

    def plan(job_file, *, out, **options):
        planned[out.name] = batch = real_plan(job_file, out=out, **options)
        return batch

    def stop(batch, **kwargs):
        raise KeyboardInterrupt("planned")

    real_plan = generate.plan_batch
    monkeypatch.setattr(generate, "plan_batch", plan)
    monkeypatch.setattr(generate, "run_batch", stop)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("recipe:\n  cache: first-block\n  cache_threshold: 5\njobs:\n  - a red fox\n")
    with pytest.raises(KeyboardInterrupt, match="planned"):
        ab(jobs, out=tmp_path / "out", device="cpu", compile="regional", compile_backend="eager", progress=False)
    recipes = {name: batch.settings.recipe for name, batch in planned.items()}
    assert recipes["quantized"].label() == "regional/eager+first-block@5"  # the file's and the options' together
    assert recipes["full"].is_plain and recipes["full-repeat"].is_plain
    with pytest.raises(InputError, match=r"jobs.yaml line 2 \(recipe\): cache: the job file's recipe sets"):
        ab(jobs, out=tmp_path / "other", device="cpu", cache="taylorseer", progress=False)


def test_the_configs_option_checks_name_what_each_arm_gives_itself(tmp_path):
    from sagevideo.errors import InputError as Refused
    from sagevideo.experiments.ab import ABConfig

    job = tmp_path / "jobs.yaml"
    job.write_text("jobs:\n  - prompt: a cat\n    pv: fp8\n")
    config = ABConfig.build(job, out=tmp_path / "out", pv="fp16", linear="fp8", attention_probe=True,
                            image=tmp_path / "i.png", device="cpu")
    assert config.options_beside_arms() == ["--pv", "--linear", "--attention-probe"]
    assert ABConfig.build(job, out=tmp_path).options_beside_arms() == []
    assert ABConfig.build(job, out=tmp_path, sparse="static:0.2").options_beside_arms() == ["--sparse"]
    assert config.every_arms_settings() == {"model": "tiny", "backend": "auto", "device": "cpu",
                                            "image": tmp_path / "i.png"}
    with pytest.raises(Refused, match=r"sets job 1: pv: `sagevideo ab` sets attention, pv, plan and sparse per arm "
                                      r"\(x\);"):
        config.checked_job_file(" (x)")
    with pytest.raises(Refused, match="no such file"):
        ABConfig.build(tmp_path / "missing.yaml", out=tmp_path).checked_job_file()


@pytest.mark.parametrize("file_name", ["jobs.toml", "jobs.yaml"])
@pytest.mark.parametrize("arms", [[], ["fp8=attention=sage,pv=fp8"]])
def test_a_job_file_setting_attention_is_refused_before_any_arm_even_without_tomllib(tmp_path, monkeypatch,
                                                                                   file_name, arms):
    """ab sets attention, pv and plan per arm; Python 3.10 has no tomllib, and the check must not be
    skipped there (tomli reads the file)."""
    import importlib
    import sys

    from sagevideo.errors import InputError
    from sagevideo.experiments.ab import ab

    reader = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python 3.10
    monkeypatch.setitem(sys.modules, "tomli", reader)  # the backport: the same API
    jobs = tmp_path / file_name
    toml = "[defaults]\npv = \"fp8\"\n\n[[jobs]]\nprompt = \"a\"\nattention = \"full\"\n"
    yaml = "defaults:\n  pv: fp8\njobs:\n  - prompt: a\n    attention: full\n"
    jobs.write_text(toml if file_name.endswith(".toml") else yaml)
    with pytest.raises(InputError, match=r"sets defaults\.pv, job 1: attention: `sagevideo ab` sets attention, pv"):
        ab(jobs, out=tmp_path / "out", device="cpu", arms=arms, progress=False)
    assert not (tmp_path / "out").exists()


def test_sparse_is_the_quantized_arms_and_never_the_job_files(tmp_path, no_model_load):
    from sagevideo.errors import InputError
    from sagevideo.experiments.ab import ABConfig, _quantized_arm, ab

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - prompt: a\n    sparse: dynamic:0.15\n")
    with pytest.raises(InputError, match=r"sets job 1: sparse: `sagevideo ab` sets attention, pv, plan and sparse"):
        ab(jobs, out=tmp_path / "out", device="cpu", progress=False)
    jobs.write_text("jobs:\n  - prompt: a\n")
    _, settings = _quantized_arm(ABConfig.build(jobs, out=tmp_path / "out", sparse="static:0.25"))
    assert settings["sparse"] == "static:0.25" and settings["attention"] == "sage"


@pytest.mark.slow  # renders two arms at 192 px, re-runs the sparse one with the probe, evaluates
def test_a_sparse_arm_reports_per_layer_density_and_the_probes_error(tmp_path):
    """--sparse with --attention-probe: the probe re-runs the plan --sparse built (reproducing the arm
    exactly) and metrics.json / report.html give per layer the density reached and the error against
    fp32 dense attention (static selection: dynamic keeps every tile of random weights)."""
    from tests.helpers.evalkit import single_thread

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("defaults:\n  height: 192\n  width: 192\n  frames: 9\n  steps: 3\njobs:\n  - a red fox\n")
    out = tmp_path / "out"
    with single_thread():
        result = CliRunner().invoke(app, [
            "ab", str(jobs), "--out", str(out), "--sparse", "static:0.3", "--attention-probe", "--no-noise-floor",
            "--no-progress", "--metrics", "psnr", "--weights", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "metrics.json").read_text())
    reproduced = data["attention_probe"]["reproduced"]
    assert reproduced["all_identical"] is True, reproduced["videos"]  # max |diff| per video; None: frame counts differ
    rows = {row["layer"]: row for row in data["sparse"]["layers"]}
    assert set(rows) == set(LAYERS)
    first, later = rows[LAYERS[0]], rows[LAYERS[1]]
    assert (first["calls"], first["sparse_calls"], first["density"], first["sparse_density"]) == (3, 0, 1.0, None)
    assert later["calls"] == 3 and later["sparse_calls"] == 2 and 0 < later["sparse_density"] < 1  # steps 1, 2
    assert later["density"] == pytest.approx((1 + 2 * later["sparse_density"]) / 3, abs=1e-3) and later["dense"] == {}
    assert first["reused"] == later["reused"] == 0  # a static plan reuses nothing
    assert later["probe_cos_worst"] < 1.0 and later["probe_floor_cos_worst"] == pytest.approx(1.0, abs=1e-9)
    assert "judged on your own model" in data["sparse"]["note"]
    html = (out / "report.html").read_text()
    assert "Block-sparse attention per layer" in html and f"{later['sparse_density']:.4f}" in html
    assert "judged on your own model" in html
