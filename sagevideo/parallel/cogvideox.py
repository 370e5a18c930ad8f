"""Ulysses sequence parallelism for CogVideoX transformers: one video's tokens over P ranks.

Each rank keeps all text tokens and 1/P of the video tokens (a contiguous slice in token order):
- a forward pre-hook slices the rotary tables to the rank's video tokens;
- a hook on `patch_embed` keeps [text; own video slice];
- every attention layer runs `UlyssesCogVideoXAttnProcessor`: video q/k/v go through the
  all-to-all to full sequence × H/P heads, text q/k/v are sliced to the same heads, attention (the
  installed plan, sagevideo kernels) runs per head group, outputs go back;
- a hook on `norm_final` gathers the video tokens, so every rank ends with the full output.
Norms, MLPs and modulation are per token, so they run on the shards unchanged. Every rank must
run the same inputs (same seed). Works under torchrun or Ray actors that set its variables.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

from sagevideo.parallel.ulysses import SequenceParallelHandle, check_degree, gather_seq, ulysses_attention
from sagevideo.pipelines.cogvideox import SageCogVideoXAttnProcessor


def video_tokens(config: Any, frames: int, height: int, width: int) -> int:
    """Video tokens of a latent (frames, height, width) for a CogVideoX transformer config."""
    p, p_t = config.patch_size, config.patch_size_t
    latent_frames = frames if p_t is None else -(-frames // p_t)
    return latent_frames * (height // p) * (width // p)


def check_cogvideox_degree(config: Any, latent_frames: int, latent_height: int, latent_width: int, degree: int) -> None:
    """Up-front check (before any GPU work) that `degree` ranks can split this job."""
    check_degree(config.num_attention_heads, video_tokens(config, latent_frames, latent_height, latent_width), degree)


class UlyssesCogVideoXAttnProcessor(SageCogVideoXAttnProcessor):
    """`SageCogVideoXAttnProcessor` whose attention exchanges sequence shards for head groups."""

    def __init__(self, *, group=None, **kwargs):
        super().__init__(**kwargs)
        self.group = group

    def attend(self, query, key, value, mask, text_len):
        if mask is not None:
            raise NotImplementedError("Ulysses sequence parallelism takes no attention mask (CogVideoX uses none)")
        return ulysses_attention(functools.partial(self.router, self.name), query, key, value, text_len, self.group)


def shard_cogvideox(pipe_or_transformer: Any, *, group=None, plan=None, pv: str | None = None,
                    backend: str = "auto") -> SequenceParallelHandle:
    """Install Ulysses sequence parallelism (with sagevideo attention, `plan`/`pv` as `install`)."""
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    from sagevideo.pipelines.install import install_router, plan_router

    transformer = getattr(pipe_or_transformer, "transformer", pipe_or_transformer)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    check_degree(transformer.config.num_attention_heads, world, world)  # heads now; tokens at each forward
    router = plan_router(transformer, plan, pv, backend)
    factory = functools.partial(UlyssesCogVideoXAttnProcessor, group=group)
    attention = install_router(pipe_or_transformer, router, pv=pv or "fp16", backend=backend,
                               routes={CogVideoXAttnProcessor2_0: factory})
    state: dict[str, int] = {}

    def before_forward(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        _, frames, _, height, width = hidden.shape
        total = video_tokens(module.config, frames, height, width)
        check_degree(module.config.num_attention_heads, total, world)
        n = total // world
        state.update(text=text.shape[1], start=rank * n, stop=(rank + 1) * n)
        rotary = kwargs.get("image_rotary_emb")
        if rotary is not None:
            kwargs["image_rotary_emb"] = tuple(t[state["start"] : state["stop"]] for t in rotary)
        return args, kwargs

    def keep_own_tokens(module, args, output):
        t = state["text"]
        return torch.cat([output[:, :t], output[:, t + state["start"] : t + state["stop"]]], dim=1)

    def gather_video(module, args, output):
        return gather_seq(output, group, dim=1)

    hooks = [
        transformer.register_forward_pre_hook(before_forward, with_kwargs=True),
        transformer.patch_embed.register_forward_hook(keep_own_tokens),
        transformer.norm_final.register_forward_hook(gather_video),
    ]
    return SequenceParallelHandle(attention, hooks)
