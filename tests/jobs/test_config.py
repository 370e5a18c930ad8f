"""GenerateConfig: one declaration per option, built by the CLI, the Python API and plan_batch alike."""

from __future__ import annotations

import pytest
import typer

import sagevideo
from sagevideo.cli import generate as generate_cli
from sagevideo.cli.app import app
from sagevideo.errors import InputError
from sagevideo.jobs.config import JOB_DEFAULTS, GenerateConfig
from sagevideo.jobs.specs import JobSpec


def command_params(name):
    return {p.name: p for p in typer.main.get_command(app).commands[name].params}


def test_every_option_is_a_generate_flag_with_the_configs_default_and_help():
    params = command_params("generate")
    fields = {n: f for n, f in GenerateConfig.model_fields.items() if n not in generate_cli.API_ONLY}
    assert set(params) == set(fields)
    for name, field in fields.items():
        param = params[name]
        if name == "out":
            assert param.required
        elif name == "prompts_or_jobs":
            assert param.opts == ["--prompt", "-p"] and not param.default
        else:
            assert param.default == field.default, name
            assert param.help == field.description, name
            if name != "job_file":
                assert f"--{name.replace('_', '-')}" in param.opts, name


def test_job_defaults_are_the_options_that_are_job_fields():
    assert set(JOB_DEFAULTS) == {
        "seed", "frames", "height", "width", "steps", "guidance", "negative_prompt", "attention", "pv", "plan", "image",
        "frames_png", "sparse",
    }
    assert all(name in JobSpec.model_fields for name in JOB_DEFAULTS)


def test_build_keeps_bad_values_as_problems_and_overrides_replace_them(tmp_path):
    config = GenerateConfig.build(["a"], out=tmp_path, steps=0, job_timeout="10", workers=True)
    assert (config.steps, config.job_timeout, config.workers) == (None, None, None)  # left at their defaults
    assert [(field, place) for field, place, _ in config.problems] == [
        ("steps", "--steps 0"), ("workers", "--workers True"), ("job_timeout", "--job-timeout 10")
    ]
    fixed = GenerateConfig.build(config, steps=3)
    assert fixed.steps == 3 and [p[0] for p in fixed.problems] == ["workers", "job_timeout"]
    assert fixed.prompts_or_jobs == ["a"] and fixed.out == tmp_path
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'stepz' \(did you mean 'steps'\?\)"):
        GenerateConfig.build(out=tmp_path, stepz=3)
    with pytest.raises(TypeError, match="'out'"):
        GenerateConfig.build(["a"])
    assert GenerateConfig.build((p for p in ["a", "b"]), out=tmp_path).prompts_or_jobs == ["a", "b"]  # read once


def test_plan_batch_takes_a_config_or_keywords_alike(tmp_path):
    from sagevideo.generation.plan import plan_batch

    config = GenerateConfig(prompts_or_jobs=["a cat"], out=tmp_path, seed=3, steps=1)
    by_config = plan_batch(config)
    by_keywords = plan_batch(["a cat"], out=tmp_path, seed=3, steps=1)
    assert [j.job_id for j in by_config.jobs] == [j.job_id for j in by_keywords.jobs]
    assert by_config.settings.pv == "fp16" and config.pv == "auto"  # resolved on the plan, not on the input
    assert [j.job.seed for j in plan_batch(config, seed=4).jobs] == [4]  # keywords over a config


def test_every_bad_option_is_listed_once_beside_the_jobs_problems(tmp_path):
    from sagevideo.errors import InputError
    from sagevideo.generation.plan import plan_batch

    with pytest.raises(InputError) as err:
        plan_batch(["a", {"prompt": "b", "seed": -1}], out=tmp_path, workers=0, max_attempts=0, job_timeout=-1)
    assert str(err.value).splitlines() == [
        "--workers 0: give a whole number >= 1 (1 runs in this process)",
        "--max-attempts 0: give a whole number >= 1 (1: no retry)",
        "--job-timeout -1: give seconds > 0, e.g. 1800 (leave it out for no limit)",
        "job 2: seed: Input should be greater than or equal to 0 (got -1)",
    ]


@pytest.mark.parametrize("bad", [0, -5, float("inf"), "10", True])
def test_bad_job_timeout_is_refused(tmp_path, no_model_load, bad):
    with pytest.raises(InputError, match=r"--job-timeout .*: give seconds > 0"):
        sagevideo.generate("a cat", out=tmp_path, job_timeout=bad, progress=False)
