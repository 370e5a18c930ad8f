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
