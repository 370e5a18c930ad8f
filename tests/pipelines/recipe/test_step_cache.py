"""pipelines/recipe/step_cache.py: diffusers' cache hooks registered, their skipped forwards counted, and kept
outside regionally compiled blocks."""

from __future__ import annotations

import pytest
import torch

from sagevideo.jobs.recipe import Recipe
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.recipe import apply_recipe
from tests.helpers.recipe import cached_latents, fresh_pipe


def test_first_block_cache_registers_diffusers_hooks_and_counts_skipped_forwards():
    pipe = fresh_pipe()
    applied = apply_recipe(pipe, Recipe(cache="first-block", cache_threshold=5.0))  # a high threshold skips
    assert pipe.transformer.is_cache_enabled
    from sagevideo.pipelines.runner import run_job

    source = resolve_model("tiny")
    from sagevideo.jobs.specs import JobSpec

    job = source.resolve(JobSpec(prompt="a cat", steps=4))
    applied.start_job(pipe.transformer)
    run_job(pipe, job, text_tokens=source.text_tokens, family=source.model_family, decode=False)
    record = applied.record()
    assert record["cache_forwards"] == 4  # one decision per denoising step (CFG batched)
    assert record["cache_skipped"] == 3  # every step after the first reuses the cached residual
    applied.start_job(pipe.transformer)
    assert applied.record()["cache_skipped"] == 0


@pytest.mark.slow  # torch.compile (regional, eager backend) of the tiny model under the cache
def test_first_block_cache_under_regional_compile_keeps_its_hooks_out_of_the_compiled_blocks():
    # Compiled with the block, the cache's per-step decision was traced: graph breaks in the first
    # block and a recompile per change of the cache's state (on the GPU: blocks left eager, slower).
    compiled_cache = Recipe(compile="regional", compile_backend="eager", cache="first-block", cache_threshold=0.3)
    latents, record, dynamo = cached_latents(compiled_cache)
    eager_latents, eager_record, _ = cached_latents(Recipe(cache="first-block", cache_threshold=0.3))
    _, _, no_cache = cached_latents(Recipe(compile="regional", compile_backend="eager"))
    assert 0 < record["cache_skipped"] < record["cache_forwards"] == 8  # both of the hook's paths ran
    assert dynamo == no_cache and dynamo["graph_breaks"] == 0  # the graphs the blocks compile to without a cache
    assert record["compiled_blocks"] == 2 and record["cache_skipped"] == eager_record["cache_skipped"]
    torch.testing.assert_close(latents, eager_latents)

