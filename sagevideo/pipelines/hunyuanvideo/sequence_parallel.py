"""Ulysses sequence parallelism for HunyuanVideo transformers: one video's tokens over P ranks.

HunyuanVideo attends over [video; text] (video first), with a key-padding mask over the text.
Every rank keeps all text tokens (the token refiner, the text stream of the dual-stream blocks,
the text part of the single-stream blocks: 256 tokens, replicated) and a contiguous 1/P of the
video tokens:
- a forward hook on `x_embedder` keeps the rank's video tokens, one on `rope` its rotary tables
  (the model then builds its mask over [own video; text] and applies rotary embedding to its
  own tokens only);
- diffusers' own attention processors run unchanged; sagevideo's SDPA interception hands every
  call of the dual- and single-stream blocks to `UlyssesRouter`, which exchanges the video
  q/k/v for head groups (`parallel.ulysses`, text after the video: `text_last`), so each head
  group attends over [all video; text] in the one-GPU order with the full mask (its video part,
  gathered once per forward, then the text mask), then returns the output to the shards. Each
  head's attention, quantization groups included, sees what it sees on one GPU;
- the token refiner's calls (text only, on every rank) go to the plan's router as they are;
- a hook on `proj_out` gathers the video tokens, so every rank returns the full prediction.
Norms, MLPs and modulation are per token. Every rank must run the same inputs (same seed).
Degree: divides the heads and the video tokens (the text, mask included, is replicated).

Why the text is replicated, not sharded with the video (as CogVideoX's is): it is 256 tokens
against ~119k video tokens at 720p x 129 frames (0.2%), so computing its per-token layers on every
rank costs little, while sharding it would (a) need an exchange of its own in the token refiner,
whose attention is over the text alone, (b) put the text, mostly padding that the mask removes
from every key set, on the last rank(s), whose shards would then carry less real work, and (c)
make the degree divide video + 256 tokens instead of the video tokens that real sizes give
(118,800 split in 2, 3, 4, 5, 6 or 8). Attention over the text is not duplicated: each rank
attends with its own heads only, text queries included.

diffusers 0.42.1 has no context-parallel plan (`_cp_plan`) for `HunyuanVideoTransformer3DModel`
(it has them for Wan, Flux, LTX, QwenImage and a few others): hence sagevideo's own Ulysses, the
exchange CogVideoX and Open-Sora use (`sagevideo.parallel.ulysses`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from sagevideo.parallel.launch import rank_and_world
from sagevideo.parallel.ulysses import SequenceParallelHandle, check_degree, gather_seq, ulysses_attention
from sagevideo.pipelines.routing import AttentionRouter

SHARDED_PREFIXES = ("transformer_blocks.", "single_transformer_blocks.")


def video_tokens(config: Any, latent_frames: int, latent_height: int, latent_width: int) -> int:
    """Video tokens of a latent (frames, height, width) for a HunyuanVideo transformer config."""
    p, p_t = config.patch_size, config.patch_size_t or 1
    return (latent_frames // p_t) * (latent_height // p) * (latent_width // p)


def check_hunyuanvideo_degree(config: Any, latent_frames: int, latent_height: int, latent_width: int,
                              degree: int) -> None:
    """Up-front check (before any GPU work) that `degree` ranks can split this job: heads and
    video tokens (the text tokens are replicated on every rank)."""
    video = video_tokens(config, latent_frames, latent_height, latent_width)
    check_degree(config.num_attention_heads, video, degree, what="video tokens (the text is not split)")


class UlyssesRouter(AttentionRouter):
    """The installed plan's router, with Ulysses around the calls of the sharded layers.

    inner: the plan's `AttentionRouter` (plan, backend and step clock are its own); state: the
    shard's video length `n` (set by the sharding hooks each forward).
    """

    def __init__(self, inner: AttentionRouter, *, group=None, state: dict | None = None):
        self.inner = inner
        self.plan, self.backend, self.clock = inner.plan, inner.backend, inner.clock
        self.group = group
        self.state = state if state is not None else {}
        self._mask_of: tuple[torch.Tensor, torch.Tensor | None] | None = None  # (shard's mask, full mask)

    def choice(self, layer: str):
        return self.inner.choice(layer)

    def route(self, layer: str):
        return self.inner.route(layer)

    def head_order(self, layer: str, heads: int, world: int, device: torch.device) -> torch.Tensor | None:
        return self.inner.head_order(layer, heads, world, device)

    def __call__(self, layer, q, k, v, *, attn_mask=None, **kwargs):
        if not layer.startswith(SHARDED_PREFIXES) or "n" not in self.state:
            return self.inner(layer, q, k, v, attn_mask=attn_mask, **kwargs)
        n = self.state["n"]
        text = q.shape[2] - n
        mask = self.full_mask(attn_mask, n)
        attend = functools.partial(self._attend, layer, mask, kwargs)
        heads = self.head_order(layer, q.shape[1], rank_and_world(self.group)[1], q.device)
        return ulysses_attention(attend, q, k, v, text, self.group, text_last=True, heads=heads)

    def _attend(self, layer, mask, kwargs, q, k, v):
        return self.inner(layer, q, k, v, attn_mask=mask, **kwargs)

    def full_mask(self, mask: torch.Tensor | None, n: int) -> torch.Tensor | None:
        """The shard's mask over [own n video; text] keys -> the mask over [all video; text], in the
        shape it came (the model passes one mask to every block: gathered once per forward)."""
        if mask is None:
            return None
        if self._mask_of is not None and self._mask_of[0] is mask:
            return self._mask_of[1]
        video, text = mask[..., :n], mask[..., n:]
        # gloo gathers no bool tensors: as uint8, back to the mask's dtype after.
        gathered = gather_seq(video.to(torch.uint8) if video.dtype == torch.bool else video, self.group, dim=-1)
        full = torch.cat([gathered.to(mask.dtype), text.expand(*gathered.shape[:-1], text.shape[-1])], dim=-1)
        self._mask_of = (mask, full)
        return full


def shard_hunyuanvideo(pipe_or_transformer: Any, *, group=None, plan=None, pv: str | None = None,
                       backend: str = "auto") -> SequenceParallelHandle:
    """Install Ulysses sequence parallelism (with sagevideo attention, `plan`/`pv` as `install`) on a
    text-to-video HunyuanVideoTransformer3DModel (or a pipeline's); other transformers (Framepack,
    HunyuanVideo 1.5, image-to-video) are refused (TypeError) before any rank communicates."""
    from diffusers import HunyuanVideoTransformer3DModel
    from diffusers.models.attention_processor import AttnProcessor2_0
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    from sagevideo.pipelines.install import plan_router
    from sagevideo.pipelines.sharding import install_sharded, shard_targets, ulysses_rank

    # The token refiner's layers run diffusers' AttnProcessor2_0 (text only, not split), the blocks' its own.
    (transformer,) = shard_targets(
        "shard_hunyuanvideo", pipe_or_transformer, (HunyuanVideoTransformer3DModel,),
        (HunyuanVideoAttnProcessor2_0, AttnProcessor2_0), known=" (text-to-video; not Framepack or HunyuanVideo 1.5)",
    )
    if transformer.config.image_condition_type is not None:
        raise TypeError(
            f"shard_hunyuanvideo: the transformer has image_condition_type "
            f"{transformer.config.image_condition_type!r} (image to video), whose first-frame tokens the hooks do "
            "not split; shard_hunyuanvideo splits the text-to-video model (image_condition_type None); run it "
            "unsplit on one process with sagevideo.install(...)"
        )
    rank, world = ulysses_rank([transformer], group)
    state: dict[str, int] = {}
    router = UlyssesRouter(plan_router(transformer, plan, pv, backend), group=group, state=state)

    def before_forward(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        _, _, frames, height, width = hidden.shape
        config = module.config
        video = video_tokens(config, frames, height, width)
        check_degree(config.num_attention_heads, video, world, what="video tokens (the text is not split)")
        state["n"] = video // world
        return None

    def own_tokens(module, args, output):  # x_embedder: (B, N, C) -> this rank's (B, n, C)
        n = state["n"]
        return output[:, rank * n : (rank + 1) * n]

    def own_rotary(module, args, output):  # rope: (cos, sin), each (N, D) -> this rank's (n, D)
        n = state["n"]
        return tuple(t[rank * n : (rank + 1) * n] for t in output)

    def gather_video(module, args, output):  # proj_out: (B, n, C) -> (B, N, C) on every rank
        return gather_seq(output, group, dim=1)

    def after_forward(module, args, output):
        state.pop("n", None)
        router._mask_of = None  # the mask of this forward: not kept alive past it
        return None

    def hooks_of(transformer):
        return [
            transformer.register_forward_pre_hook(before_forward, with_kwargs=True),
            transformer.x_embedder.register_forward_hook(own_tokens),
            transformer.rope.register_forward_hook(own_rotary),
            transformer.proj_out.register_forward_hook(gather_video),
            transformer.register_forward_hook(after_forward, always_call=True),
        ]

    return install_sharded(pipe_or_transformer, router, [transformer], hooks_of, pv=pv, backend=backend)
