"""Open-Sora 2.0 under diffusers' first-block cache (`--cache first-block`): its blocks registered
with diffusers, the cache's decisions counted, and a cache that never skips changes nothing."""

import functools

import numpy as np
import pytest
import torch

from sagevideo.jobs.recipe import Recipe
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.recipe import apply_recipe, recipe_problems
from sagevideo.pipelines.runner import run_job


def _frames(recipe: Recipe | None, steps: int = 4) -> tuple[np.ndarray, dict | None]:
    """One tiny-opensora video under `recipe` (None: plain): its uint8 frames and the recipe's record."""
    source = resolve_model("tiny-opensora")
    torch.manual_seed(0)
    pipe = source.model_family.load(source, "cpu", torch.float32)
    pipe.set_progress_bar_config(disable=True)
    applied = apply_recipe(pipe, recipe) if recipe is not None else None
    if applied is not None:
        applied.start_job(pipe.transformer)
    job = source.resolve(JobSpec(prompt="a lighthouse in a storm", steps=steps))
    result = run_job(pipe, job, text_tokens=source.text_tokens, family=source.model_family)
    return result.frames, applied.record() if applied is not None else None


@functools.cache
def _plain_frames(steps: int = 4) -> np.ndarray:
    """The plain video of `_frames`, made once per step count (every cache test compares against it)."""
    return _frames(None, steps)[0]


@functools.cache
def _skipping_frames() -> tuple[np.ndarray, dict]:
    """The first-block cache at a threshold that skips every step after the first (no compile), made
    once: it does not depend on the compile parametrization of the test that reads it."""
    return _frames(Recipe(cache="first-block", cache_threshold=5.0))


def test_block_caches_are_taken_and_pyramid_broadcast_is_not():
    """Pyramid broadcast hooks only diffusers' own attention classes: on Open-Sora it would hook
    nothing and claim a cache."""
    source = resolve_model("tiny-opensora")
    assert recipe_problems(Recipe(cache="first-block"), source, "cpu", "float32") == []
    assert recipe_problems(Recipe(cache="taylorseer"), source, "cpu", "float32") == []
    (problem,) = recipe_problems(Recipe(cache="pyramid-broadcast"), source, "cpu", "float32")
    assert "does not take this diffusers cache (it takes: first-block, taylorseer)" in problem[1]


def test_taylorseer_predicts_the_attention_layers_between_full_steps():
    plain = _plain_frames(12)
    predicted, record = _frames(Recipe(cache="taylorseer"), steps=12)  # full steps 0-2, then every 5th
    assert record["cache"] == "taylorseer" and "cache_skipped_note" in record
    assert predicted.shape == plain.shape and (predicted != plain).any()


@pytest.mark.parametrize("compile_blocks", ["none", "regional"])
def test_a_cache_that_never_skips_changes_nothing_and_one_that_skips_is_counted(compile_blocks):
    plain = _plain_frames()
    never, record = _frames(Recipe(cache="first-block", cache_threshold=1e-9, compile=compile_blocks,
                                   compile_backend="eager"))
    assert (record["cache_forwards"], record["cache_skipped"]) == (4, 0)  # one forward a step (guidance batched)
    np.testing.assert_array_equal(never, plain)
    skipping, record = _skipping_frames()
    assert (record["cache_forwards"], record["cache_skipped"]) == (4, 3)  # every step after the first reuses it
    assert skipping.shape == plain.shape and (skipping != plain).any()
