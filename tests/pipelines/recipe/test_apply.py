"""pipelines/recipe/apply.py: recipe problems before loading (caches a family does not take, caches under sequence
parallelism, caches that do not compose with compile) and the recipe on every denoiser of a pipeline."""

from __future__ import annotations

import pytest
import torch

from sagevideo.errors import InputError
from sagevideo.generation.plan import plan_batch
from sagevideo.jobs.recipe import Recipe
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.recipe import apply_recipe, recipe_problems, transformer_blocks
from tests.helpers.recipe import is_compiled


def test_unknown_cache_and_family_without_cache_support_are_refused(tmp_path, no_model_load):
    with pytest.raises(InputError, match="--cache bogus"):
        plan_batch("a cat", out=tmp_path, device="cpu", cache="bogus")
    with pytest.raises(InputError, match=r"Open-Sora 2.0 transformer does not take this diffusers cache \(it takes: "
                       r"first-block, taylorseer\)"):
        plan_batch("a cat", out=tmp_path, device="cpu", model="tiny-opensora", cache="pyramid-broadcast")


def test_cache_with_sequence_parallel_ranks_is_refused():
    problems = recipe_problems(Recipe(cache="first-block"), resolve_model("tiny"), "cpu", "float32", gpus_per_job=2)
    assert problems and "each rank decide on its own shard" in problems[0][1]
    assert recipe_problems(Recipe(compile="regional", compile_backend="eager"), resolve_model("tiny"), "cpu",
                           "float32") == []


def test_pyramid_broadcast_with_compile_is_refused_before_loading(tmp_path, no_model_load):
    with pytest.raises(InputError, match=r"--cache pyramid-broadcast: does not compose with --compile regional"):
        plan_batch("a cat", out=tmp_path, device="cpu", cache="pyramid-broadcast", compile="regional",
                   compile_backend="eager")


def test_every_denoiser_gets_the_recipe_and_is_reset_per_job():
    """Wan 2.2's two denoisers: both compiled, both cached; before, only `transformer` was, and the
    record claimed the recipe for the whole pipeline."""
    from sagevideo.jobs.specs import JobSpec
    from sagevideo.pipelines.runner import run_job

    source = resolve_model("tiny-wan22")
    pipe = source.model_family.load(source, "cpu", torch.float32)
    pipe.set_progress_bar_config(disable=True)
    blocks = [len(transformer_blocks(t)) for t in (pipe.transformer, pipe.transformer_2)]
    applied = apply_recipe(pipe, Recipe(compile="regional", compile_backend="eager", cache="first-block",
                                        cache_threshold=5.0))
    assert pipe.transformer.is_cache_enabled and pipe.transformer_2.is_cache_enabled
    assert applied.compiled_blocks == sum(blocks) and all(b >= 2 for b in blocks)
    compiled = [block for t in (pipe.transformer, pipe.transformer_2) for _, block in transformer_blocks(t)]
    assert all(is_compiled(block) for block in compiled)
    job = source.resolve(JobSpec(prompt="a cat", steps=4))  # boundary 0.875: the steps split over both denoisers
    applied.start_job()
    run_job(pipe, job, text_tokens=source.text_tokens, family=source.model_family, decode=False)
    assert applied.record()["cache_forwards"] == 8  # two guidance branches a step, each its own forward

