"""Step caches (`--cache`): diffusers' cache hooks (first-block, TaylorSeer, pyramid broadcast) on a
transformer, and FirstBlockCache's decisions counted for the manifest."""

from __future__ import annotations

from typing import Any

from sagevideo.jobs.recipe import Recipe

# name -> (diffusers.hooks config class, what the manifest says of its skipped forwards)
CACHE_CONFIGS: dict[str, tuple[str, str]] = {
    "first-block": ("FirstBlockCacheConfig", "counted"),
    "taylorseer": ("TaylorSeerCacheConfig", "not exposed by diffusers"),
    "pyramid-broadcast": ("PyramidAttentionBroadcastConfig", "not exposed by diffusers"),
}


def diffusers_has(name: str) -> bool:
    import diffusers.hooks

    return hasattr(diffusers.hooks, name)


def _cache_config(pipe: Any, recipe: Recipe) -> Any:
    import diffusers.hooks as hooks

    if recipe.cache == "first-block":
        return hooks.FirstBlockCacheConfig(threshold=recipe.threshold)
    if recipe.cache == "taylorseer":
        return hooks.TaylorSeerCacheConfig()
    if recipe.cache == "pyramid-broadcast":
        if not hasattr(type(pipe), "current_timestep"):
            raise ValueError("--cache pyramid-broadcast needs the pipeline's current timestep; this pipeline has none")
        return hooks.PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2, current_timestep_callback=lambda: pipe.current_timestep
        )
    raise ValueError(f"--cache {recipe.cache}: unknown cache")


def enable_cache(pipe: Any, transformer: Any, blocks: list[tuple[str, Any]], recipe: Recipe,
                  applied: Any) -> None:
    if not hasattr(transformer, "enable_cache"):
        raise ValueError(f"--cache {recipe.cache}: {type(transformer).__name__} has no diffusers cache support")
    if recipe.cache == "first-block" and len(blocks) < 2:
        raise ValueError(f"--cache first-block needs at least 2 transformer blocks (a first and a last); "
                         f"this model has {len(blocks)}")
    transformer.enable_cache(_cache_config(pipe, recipe))
    if recipe.cache == "first-block":
        _count_first_block_decisions(blocks[0][1], applied)


def _count_first_block_decisions(head_block: Any, applied: Any) -> None:
    """Count FirstBlockCache's decisions where diffusers makes them: its head-block hook's
    `_should_compute_remaining_blocks` (run outside compiled graphs: it is compiler-disabled)."""
    import torch
    from diffusers.hooks import HookRegistry
    from diffusers.hooks.first_block_cache import _FBC_LEADER_BLOCK_HOOK

    hook = HookRegistry.check_if_exists_or_initialize(head_block).get_hook(_FBC_LEADER_BLOCK_HOOK)
    if hook is None:
        raise ValueError("--cache first-block: diffusers registered no first-block hook on the first block")
    decide = hook._should_compute_remaining_blocks
    applied.cache_forwards = applied.cache_skipped = 0

    @torch.compiler.disable
    def counted(residual: Any) -> bool:
        compute = decide(residual)
        applied.cache_forwards += 1
        applied.cache_skipped += 0 if compute else 1
        return compute

    hook._should_compute_remaining_blocks = counted
