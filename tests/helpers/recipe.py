"""The tiny pipelines and forwards the recipe's tests (tests/pipelines/recipe/) share."""

from __future__ import annotations

import torch

from sagevideo.jobs.recipe import Recipe
from sagevideo.pipelines.loading import resolve_model
from sagevideo.pipelines.recipe import apply_recipe


def fresh_pipe():
    """A tiny CogVideoX pipeline of its own (the recipe changes the model for good)."""
    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    torch.manual_seed(0)
    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def is_compiled(block) -> bool:
    """Its own forward compiled, bare or under diffusers' cache hooks (the forward the first hook
    wraps)."""
    if hasattr(block.forward, "_torchdynamo_orig_callable"):
        return True
    registry = getattr(block, "_diffusers_hook", None)
    wrapped = [ref.original_forward for ref in (registry._fn_refs if registry is not None else [])]
    return any(hasattr(fn, "_torchdynamo_orig_callable") for fn in wrapped)


def forward(transformer):
    """One transformer forward on fixed random inputs (tiny config: (1, 3, 4, 8, 8) latents)."""
    config = transformer.config
    g = torch.Generator().manual_seed(1)
    dtype = transformer.dtype
    latents = torch.randn(1, 3, config.in_channels, 8, 8, generator=g).to(dtype)
    text = torch.randn(1, config.max_text_seq_length, config.text_embed_dim, generator=g).to(dtype)
    with torch.no_grad():
        return transformer(hidden_states=latents, encoder_hidden_states=text, timestep=torch.tensor([500]),
                           return_dict=False)[0]


def cached_latents(recipe: Recipe) -> tuple[torch.Tensor, dict, dict]:
    """8 steps of the tiny pipeline under `recipe`, from a fresh Dynamo: (latents, the recipe's
    record, Dynamo's counters: graphs compiled and graph breaks)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    pipe = fresh_pipe()
    applied = apply_recipe(pipe, recipe)
    applied.start_job(pipe.transformer)
    latents = pipe("a fox", num_frames=9, height=64, width=64, num_inference_steps=8, output_type="latent",
                   generator=torch.Generator().manual_seed(0)).frames
    found = {"unique_graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}
    return latents, applied.record(), found


def weight_kinds_per_forward(transformer) -> list[str]:
    """'bf16' or 'fp8' for each later forward of the transformer (a hook outside the compiled
    blocks), read off its first float8 linear."""
    linear = next(m for m in transformer.modules() if isinstance(m, torch.nn.Linear) and is_fp8(m.weight))
    kinds: list[str] = []
    transformer.register_forward_pre_hook(lambda m, args: kinds.append("fp8" if is_fp8(linear.weight) else "bf16"))
    return kinds


def is_fp8(weight) -> bool:
    return "Float8" in type(weight).__name__


def run_steps(pipe, applied, steps: int):
    from sagevideo.jobs.specs import JobSpec
    from sagevideo.pipelines.runner import run_job

    source = resolve_model("tiny")
    applied.start_job(steps=steps)
    job = source.resolve(JobSpec(prompt="a cat", steps=steps))
    return run_job(pipe, job, text_tokens=source.text_tokens, decode=False, on_step=applied.on_step)

