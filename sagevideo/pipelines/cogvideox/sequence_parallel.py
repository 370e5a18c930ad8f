"""Ulysses sequence parallelism for CogVideoX transformers: one video's tokens over P ranks.

The joint sequence [text; video] (T + N tokens, the order attention sees) is cut into P equal
contiguous shards, so rank 0 holds the text and the first video tokens, the last ranks video only
(`shard_ranges`); no token is processed twice:
- a forward pre-hook slices the rotary tables to the rank's video tokens;
- a hook on `patch_embed` keeps [text; own video slice] (the model splits text from video by the
  input's text length right after), and a pre-hook on the first block keeps own text slice;
- every attention layer runs `UlyssesCogVideoXAttnProcessor`: q/k/v of the shard (written, rotary
  embedding included, straight into the send buffer) go through the all-to-all to the full
  sequence × H/P heads, attention (the installed plan, sagevideo kernels) runs per head group,
  outputs go back. The gathered order is the one-GPU order exactly, so each head's attention
  (quantization groups included) sees the same inputs as on one GPU;
- a hook on `norm_final` gathers the video tokens, so every rank ends with the full output.
Norms, MLPs and modulation are per token, so they run on the shards unchanged. Every rank must
run the same inputs (same seed). Works under torchrun or Ray actors that set its variables.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from sagevideo.parallel.ulysses import (
    SequenceParallelHandle,
    check_degree,
    gather_uneven,
    send_buffer,
    send_slot,
    ulysses_exchange,
)
from sagevideo.pipelines.cogvideox.processor import SageCogVideoXAttnProcessor
from sagevideo.pipelines.rotary import rotary_into


def video_tokens(config: Any, frames: int, height: int, width: int) -> int:
    """Video tokens of a latent (frames, height, width) for a CogVideoX transformer config."""
    p, p_t = config.patch_size, config.patch_size_t
    latent_frames = frames if p_t is None else -(-frames // p_t)
    return latent_frames * (height // p) * (width // p)


def check_cogvideox_degree(config: Any, latent_frames: int, latent_height: int, latent_width: int, degree: int,
                           text_tokens: int | None = None) -> None:
    """Up-front check (before any GPU work) that `degree` ranks can split this job.

    text_tokens: the prompt length the pipeline pads to (default: config.max_text_seq_length).
    """
    text = config.max_text_seq_length if text_tokens is None else text_tokens
    video = video_tokens(config, latent_frames, latent_height, latent_width)
    check_degree(config.num_attention_heads, text + video, degree, what=f"tokens ({text} text + {video} video)")


def shard_ranges(text: int, video: int, world: int, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(text start, stop), (video start, stop) of `rank`'s equal contiguous shard of [text; video].

    Requires (text + video) % world == 0 (`check_degree`). Ranges may be empty.
    """
    per = (text + video) // world
    start, stop = rank * per, (rank + 1) * per
    return (min(start, text), min(stop, text)), (max(start, text) - text, max(stop, text) - text)


class UlyssesCogVideoXAttnProcessor(SageCogVideoXAttnProcessor):
    """`SageCogVideoXAttnProcessor` whose attention exchanges sequence shards for head groups."""

    def __init__(self, *, group=None, **kwargs):
        super().__init__(**kwargs)
        self.group = group

    def attend_projected(self, attn, query, key, value, mask, text_len, image_rotary_emb):
        """As `SageCogVideoXAttnProcessor.attend_projected`, for this rank's shard: its own text
        tokens (text_len, maybe 0) then its video tokens (maybe none), which the rotary tables cover.

        q/k/v are written once, straight into the all-to-all's send buffer: the text part of q/k
        and v copied, the video part of q/k rotated into it (no rotated copy of q/k in between); in
        the router's head order for the layer where its plan balances the ranks (`head_order`).
        """
        if mask is not None:
            raise NotImplementedError("Ulysses sequence parallelism takes no attention mask (CogVideoX uses none)")
        # Every token is in exactly one shard (text included): nothing is replicated, the whole
        # shard is the exchanged sequence.
        send = send_buffer(query, query.shape[2], self.group)
        heads = self.router.head_order(self.name, query.shape[1], send.shape[1], query.device)
        rotated = 0 if image_rotary_emb is None else 1 if attn.is_cross_attention else 2  # q first, then k
        for i, t in enumerate((query, key, value)):
            slot = send_slot(send, i)
            t = (t if heads is None else t.index_select(1, heads)).unflatten(1, slot.shape[1:4])
            if i < rotated:
                slot[..., :text_len, :].copy_(t[..., :text_len, :])
                rotary_into(slot[..., text_len:, :], t[..., text_len:, :], image_rotary_emb)
            else:
                slot.copy_(t)
        return ulysses_exchange(functools.partial(self.router, self.name), send, group=self.group, heads=heads)


def shard_cogvideox(pipe_or_transformer: Any, *, group=None, plan=None, pv: str | None = None,
                    backend: str = "auto") -> SequenceParallelHandle:
    """Install Ulysses sequence parallelism (with sagevideo attention, `plan`/`pv` as `install`) on a
    CogVideoXTransformer3DModel (or a pipeline's); other transformers, derived ones included, are
    refused (TypeError) before any rank communicates (`pipelines.sharding`)."""
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    from sagevideo.pipelines.install import plan_router
    from sagevideo.pipelines.sharding import install_sharded, shard_targets, ulysses_rank

    (transformer,) = shard_targets(
        "shard_cogvideox", pipe_or_transformer, (CogVideoXTransformer3DModel,), (CogVideoXAttnProcessor2_0,),
        known=" (CogVideoX 2B/5B/1.5, text- and image-to-video)",
    )
    rank, world = ulysses_rank([transformer], group)
    router = plan_router(transformer, plan, pv, backend)
    factory = functools.partial(UlyssesCogVideoXAttnProcessor, group=group)
    state: dict[str, Any] = {}

    def before_forward(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        _, frames, _, height, width = hidden.shape
        video = video_tokens(module.config, frames, height, width)
        check_degree(module.config.num_attention_heads, text.shape[1] + video, world,
                     what=f"tokens ({text.shape[1]} text + {video} video)")
        (t0, t1), (v0, v1) = shard_ranges(text.shape[1], video, world, rank)
        sizes = [shard_ranges(text.shape[1], video, world, r)[1] for r in range(world)]
        state.update(text=text.shape[1], t0=t0, t1=t1, v0=v0, v1=v1, video_sizes=[b - a for a, b in sizes])
        rotary = kwargs.get("image_rotary_emb")
        if rotary is not None:
            kwargs["image_rotary_emb"] = tuple(t[v0:v1] for t in rotary)
        return args, kwargs

    def keep_own_tokens(module, args, output):
        # All text stays in front: the model splits text from video by the input's text length.
        t = state["text"]
        return torch.cat([output[:, :t], output[:, t + state["v0"] : t + state["v1"]]], dim=1)

    def keep_own_text(module, args, kwargs):
        if "encoder_hidden_states" in kwargs:
            kwargs["encoder_hidden_states"] = kwargs["encoder_hidden_states"][:, state["t0"] : state["t1"]]
        else:
            args = (args[0], args[1][:, state["t0"] : state["t1"]], *args[2:])
        return args, kwargs

    def gather_video(module, args, output):
        return gather_uneven(output, state["video_sizes"], group, dim=1)

    def hooks_of(transformer):
        return [
            transformer.register_forward_pre_hook(before_forward, with_kwargs=True),
            transformer.patch_embed.register_forward_hook(keep_own_tokens),
            transformer.transformer_blocks[0].register_forward_pre_hook(keep_own_text, with_kwargs=True),
            transformer.norm_final.register_forward_hook(gather_video),
        ]

    return install_sharded(pipe_or_transformer, router, [transformer], hooks_of, pv=pv, backend=backend,
                           routes={CogVideoXAttnProcessor2_0: factory})
