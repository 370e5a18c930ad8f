"""The recipe's settings as a config: text form, contradictions, flat options of GenerateConfig."""

from __future__ import annotations

import pickle

import pytest

from sagevideo.jobs.config import GenerateConfig
from sagevideo.jobs.recipe import DEFAULT_CACHE_THRESHOLD, Recipe, expand_recipe, parse_recipe


def test_text_form_gives_every_field():
    recipe = parse_recipe("compile=regional, linear=fp8, linear-keep=transformer_blocks.0.*;transformer_blocks.29.*,"
                          "cache=first-block,cache_threshold=0.1")
    assert recipe == Recipe(compile="regional", linear="fp8", cache="first-block", cache_threshold=0.1,
                            linear_keep=["transformer_blocks.0.*", "transformer_blocks.29.*"])
    assert recipe.label() == "regional+fp8+first-block@0.1"
    assert parse_recipe("").is_plain and parse_recipe("").label() == "eager"
    assert pickle.loads(pickle.dumps(recipe)) == recipe  # it travels to Ray workers


@pytest.mark.parametrize("text, named", [("cache=bogus", "cache"), ("speed=max", "speed"), ("compile", "compile")])
def test_bad_text_names_the_part(text, named):
    with pytest.raises(ValueError, match=named):
        parse_recipe(text)


def test_threshold_resolves_only_for_first_block():
    assert Recipe(cache="first-block").threshold == DEFAULT_CACHE_THRESHOLD
    assert Recipe(cache="taylorseer").threshold is None
    assert Recipe(cache="first-block").settings()["cache_threshold"] == DEFAULT_CACHE_THRESHOLD


def test_contradicting_settings_are_config_problems_before_planning():
    config = GenerateConfig.build(out="x", cache="taylorseer", cache_threshold=0.2, linear_keep=["a.*"])
    places = [place for _, place, _ in config.problems]
    assert places == ["--cache-threshold 0.2", "--linear-keep a.*"]
    bad = GenerateConfig.build(out="x", cache="bogus", compile="always")
    assert {field for field, _, _ in bad.problems} == {"cache", "compile"}
    assert bad.recipe.is_plain  # the bad values left at their defaults


def test_recipe_keyword_expands_into_the_flat_options():
    config = GenerateConfig.build(out="x", recipe=Recipe(compile="regional", cache="first-block"), cache_threshold=0.3)
    assert config.recipe == Recipe(compile="regional", cache="first-block", cache_threshold=0.3)
    assert GenerateConfig.build(out="x", recipe="linear=fp8").linear == "fp8"
    assert GenerateConfig.build(out="x", recipe={"cache": "taylorseer"}).cache == "taylorseer"
    assert expand_recipe({"out": "x"}) == {"out": "x"}
    with pytest.raises(TypeError, match="recipe"):
        GenerateConfig.build(out="x", recipe=3)


def test_bf16_steps_take_every_spelling_and_are_checked_against_a_jobs_steps():
    recipe = parse_recipe("linear=fp8,linear_bf16_steps=0;-1")
    assert recipe.linear_bf16_steps == [0, -1] == Recipe(linear="fp8", linear_bf16_steps="0,-1").linear_bf16_steps
    assert Recipe(linear="fp8", linear_bf16_steps=-1).linear_bf16_steps == [-1]  # a job file's `linear_bf16_steps: -1`
    assert recipe.label() == "fp8[bf16 steps 0,-1]" and recipe.settings()["linear_bf16_steps"] == [0, -1]
    assert "linear_bf16_steps" not in Recipe(linear="fp8").settings()  # unset: the jobs' ids stay what they were
    assert recipe.bf16_steps_of(50) == [0, 49] and Recipe(linear_bf16_steps=[-1, 49]).bf16_steps_of(50) == [49]
    assert recipe.step_problem(1) is None  # 0 and -1 are the same step
    assert "step 7 is not one of the job's 4 steps" in Recipe(linear_bf16_steps=[7]).step_problem(4)
    assert Recipe(linear_bf16_steps=[-5]).step_problem(4) is not None
    assert [field for field, _, _ in Recipe(linear_bf16_steps=[0]).problems()] == ["linear_bf16_steps"]  # needs fp8


@pytest.mark.parametrize("recipe", [
    Recipe(),
    Recipe(compile="regional", compile_backend="eager"),
    Recipe(linear="fp8", linear_keep=["transformer_blocks.0.*", "proj_out"], linear_bf16_steps=[0, -1]),
    Recipe(cache="first-block", cache_threshold=0.1234567),
    Recipe(compile="regional", linear="fp8", cache="taylorseer"),
])
def test_the_text_form_reads_back_what_it_wrote(recipe):
    assert parse_recipe(recipe.text()) == recipe
    assert parse_recipe(recipe.text()).text() == recipe.text()


def test_the_text_form_names_only_what_differs_from_the_defaults():
    assert Recipe().text() == ""
    assert Recipe(linear="fp8", cache="first-block", cache_threshold=0.1).text() == \
        "linear=fp8,cache=first-block,cache_threshold=0.1"
    assert parse_recipe("cache-threshold=0.1, cache=first-block").text() == "cache=first-block,cache_threshold=0.1"
