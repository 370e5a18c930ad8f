"""Loading a batch (`jobs/batch.py`): prompts and job files parsed over the options, every problem
placed where it was set, the job file's recipe layered under the options; no model, no torch."""

from __future__ import annotations

import textwrap

import pytest

from sagevideo.errors import InputError
from sagevideo.jobs.batch import load_batch, place_problem
from sagevideo.jobs.config import GenerateConfig


def config(prompts=None, **options):
    return GenerateConfig.build(prompts, out="out", **options)


def test_prompts_parse_over_the_options_with_the_resolved_pv():
    batch = load_batch(config(["a", {"prompt": "b", "seed": 7}], seed=3), pv="fp16")
    assert [(j.prompt, j.seed, j.pv) for j, _, _ in batch.jobs] == [("a", 3, "fp16"), ("b", 7, "fp16")]
    assert [label for _, label, _ in batch.jobs] == ["job 1", "job 2"] and batch.problems == []


def test_every_problem_is_placed_and_none_raises():
    given = config([{"prompt": "a", "output": "x"}, {"prompt": "b", "output": "X"}, "  "], seed=-1)
    batch = load_batch(given, pv="fp16")
    places = [place for place, _ in batch.problems]
    assert places[0] == "--seed -1" and "seed" in batch.bad
    assert "job 3" in places and "job 2" in places  # the empty prompt, the output job 1 names already
    assert any("is already the output of job 1" in text for _, text in batch.problems)


def test_a_job_files_recipe_is_layered_and_a_conflict_named_at_both_places(tmp_path):
    shots = tmp_path / "shots.yaml"
    shots.write_text(textwrap.dedent("""\
        recipe:
          compile: regional
        jobs:
          - prompt: a fox
    """))
    batch = load_batch(config(shots), pv="fp16")
    assert batch.config.recipe.compile == "regional" and batch.recipe.from_file == {"compile"}
    assert batch.job_file == shots and batch.problems == []
    plain = load_batch(config(shots), pv="fp16", use_file_recipe=False)
    assert plain.config.recipe.compile == "none"
    both = load_batch(config(shots, compile_backend="eager"), pv="fp16")
    assert both.problems == [] and both.config.recipe.compile_backend == "eager"  # another setting: both apply
    shots.write_text(shots.read_text().replace("compile: regional", "compile_backend: aot_eager"))
    twice = load_batch(config(shots, compile="regional", compile_backend="eager"), pv="fp16")
    (problem,) = twice.problems
    assert problem[0].endswith("shots.yaml line 2 (recipe)") and "--compile-backend eager is given too" in problem[1]


def test_nothing_to_generate_raises():
    with pytest.raises(InputError, match="no prompts to generate"):
        load_batch(config([]), pv="fp16")


def test_a_problem_is_placed_at_the_option_a_job_took_its_value_from():
    options = {"frames": 8}
    assert place_problem("job 1", "a cat", "frames", "frames: bad", options) == ("--frames 8", "bad")
    assert place_problem("job 1", {"prompt": "a", "frames": 8}, "frames", "frames: bad", options) == (
        "job 1", "frames: bad")
