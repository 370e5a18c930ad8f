"""Checking a loaded batch against its model (`pipelines/batch_check.py`), from configs alone:
the model's defaults filled in, its family's rules, plans and images, each problem placed."""

from __future__ import annotations

import pytest

from sagevideo.errors import InputError
from sagevideo.jobs.batch import load_batch
from sagevideo.jobs.config import GenerateConfig
from sagevideo.pipelines.batch_check import check_batch


def checked(prompts, found=(), **options):
    """check_batch as plan_batch calls it: the batch's problems (and `found`) known already."""
    config = GenerateConfig.build(prompts, out="out", device="cpu", **options)
    batch = load_batch(config, pv="fp16")
    settings = batch.config.model_copy(update={"pv": "fp16"})
    return check_batch(batch, settings, "cpu", "float32", [*batch.problems, *found])


def test_jobs_take_the_models_defaults(no_model_load):
    result = checked(["a cat"])
    (job, label), = result.jobs
    assert result.problems == [] and label == "job 1" and result.source.name == "tiny"
    assert (job.frames, job.steps, job.pv) == (result.source.default_frames, result.source.default_steps, "fp16")


def test_a_bad_option_is_said_once_at_the_option(no_model_load):
    result = checked(["a", "b"], frames=10)
    assert [place for place, _ in result.problems] == ["--frames 10"] * 3  # the defaults and each job
    assert all("not 1 + a multiple of 4" in text for _, text in result.problems)


def test_known_problems_come_first_and_the_checks_of_a_clean_batch_wait(no_model_load):
    result = checked(["a", "b"], found=[("", "no mp4 encoder")], frames=10)
    assert result.problems[0] == ("", "no mp4 encoder") and result.problems[1][0] == "--frames 10"
    clean = checked(["a"], found=[("", "no mp4 encoder")])
    assert clean.problems == [("", "no mp4 encoder")] and clean.jobs  # the jobs' notes and degree: not yet


def test_a_missing_plan_is_named_at_its_job(tmp_path, no_model_load):
    result = checked([{"prompt": "a", "plan": str(tmp_path / "no.json")}])
    (problem,) = result.problems
    assert problem[0] == "job 1" and "does not exist" in problem[1]


def test_a_batch_whose_jobs_all_fail_to_parse_lists_them_not_no_prompts(no_model_load):
    result = checked([" "])
    assert result.jobs == [] and [place for place, _ in result.problems] == ["job 1"]


def test_a_degree_the_model_cannot_split_is_refused(no_model_load):
    """A degree no family can split is refused for the whole batch (GenerateConfig refuses 0 itself:
    the check here is the one torchrun's WORLD_SIZE meets)."""
    batch = load_batch(GenerateConfig.build(["a"], out="out", device="cpu"), pv="fp16")
    settings = batch.config.model_copy(update={"pv": "fp16", "gpus_per_job": 0})
    with pytest.raises(InputError, match="--gpus-per-job 0: give a whole number"):
        check_batch(batch, settings, "cpu", "float32")
