"""Ulysses sequence parallelism for Wan transformers: one video's tokens over P ranks.

Wan's attention runs on diffusers' dispatcher, so sagevideo reaches it by intercepting SDPA inside
each denoiser's forward (`install`); the Ulysses exchange lives in the router the interception
calls (`UlyssesWanRouter`), so every denoiser of the pipeline (Wan 2.2's `transformer_2` too) is
split the same way, with the same plan and step clock as one process:
- a forward hook on `rope` keeps the rank's rows of the rotary tables, a pre-hook on the first
  block keeps the rank's contiguous 1/P of the video tokens (Wan 2.2 TI2V's per-token timesteps
  are sliced the same way by a pre-hook on the transformer);
- self-attention (`attn1`): q/k/v of the shard go through the all-to-all to the whole video ×
  H/P heads, the installed plan's attention (sagevideo kernels) runs per head group, outputs go
  back: each head's attention (quantization groups included) sees the inputs of one process;
- cross-attention (`attn2`): the text (and Wan 2.1 I2V's image tokens) is replicated on every
  rank, so each rank attends its own queries to all its keys locally (per query token, one
  process's result), except where sagevideo scales Q per block of tokens: a block of the full
  query sequence is not a block of a shard, so those queries go through the all-to-all too
  (`UlyssesWanRouter`) and each head is quantized in one process's groups;
- a hook on `proj_out` gathers the video tokens, so every rank returns the full prediction.
Norms, FFNs and modulation are per token, so they run on the shards unchanged. Every rank must run
the same inputs (same seed). This is the split diffusers' own `_cp_plan` for Wan describes; see
docs/wan.md for why sagevideo runs its own Ulysses rather than `enable_parallelism`.
"""

from __future__ import annotations

import functools
from typing import Any

from sagevideo.parallel.launch import rank_and_world
from sagevideo.parallel.ulysses import (
    SequenceParallelHandle,
    check_degree,
    gather_seq,
    ulysses_attention,
    ulysses_query_attention,
)
from sagevideo.pipelines.plans import Granularity, Mode
from sagevideo.pipelines.routing import AttentionRouter


class UlyssesWanRouter(AttentionRouter):
    """An `AttentionRouter` for one rank's shard of the video tokens.

    Layers in `exchanged` (self-attention over the sharded video) run over the whole sequence per
    head group (`ulysses_attention`). The others (cross-attention to the text, and to Wan 2.1 I2V's
    image tokens, which every rank holds whole) attend locally when that is exact, i.e. in full
    precision or with per-token Q scales; with per-block Q scales, whose blocks span the whole query
    sequence on one process, their queries are exchanged too (`ulysses_query_attention`), so that
    every head is quantized in the same groups as on one process.
    """

    def __init__(self, plan: Any, backend: str = "auto", *, group: Any = None, exchanged: frozenset[str] = frozenset()):
        super().__init__(plan, backend)
        self.group = group
        self.exchanged = exchanged

    def __call__(self, layer, q, k, v, *, attn_mask=None, **kwargs):
        local = super().__call__
        if layer not in self.exchanged:
            if attn_mask is None and self.quantizes_query_blocks(layer):
                return ulysses_query_attention(functools.partial(local, layer, **kwargs), q, k, v, self.group)
            return local(layer, q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is not None:
            raise NotImplementedError("Ulysses sequence parallelism takes no self-attention mask (Wan uses none)")
        heads = self.head_order(layer, q.shape[1], rank_and_world(self.group)[1], q.device)
        return ulysses_attention(functools.partial(local, layer, **kwargs), q, k, v, 0, self.group, heads=heads)

    def quantizes_query_blocks(self, layer: str) -> bool:
        """Whether `layer`'s attention at the current step scales Q per block of tokens."""
        choice = self.choice(layer)
        return choice.mode is not Mode.full and choice.granularity is Granularity.block


def self_attention_layers(pipe_or_transformer: Any) -> frozenset[str]:
    """Layer names (as `install` gives them) of every denoiser's self-attention modules."""
    from diffusers.models.transformers.transformer_wan import WanAttention

    from sagevideo.pipelines.install import denoisers_of

    names = set()
    for component, transformer in denoisers_of(pipe_or_transformer).items():
        prefix = "" if component == "transformer" else f"{component}."
        names.update(prefix + name for name, module in transformer.named_modules()
                     if type(module) is WanAttention and not module.is_cross_attention)
    return frozenset(names)


def shard_targets(pipe_or_transformer: Any) -> list[Any]:
    """The denoisers `shard_wan` splits: WanTransformer3DModel exactly, with diffusers' WanAttnProcessor
    in every layer; anything else is refused (TypeError) before anything changes (`pipelines.sharding`)."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor, WanTransformer3DModel

    from sagevideo.pipelines import sharding

    return sharding.shard_targets(
        "shard_wan", pipe_or_transformer, (WanTransformer3DModel,), (WanAttnProcessor,), several=True,
        known=" (Wan 2.1 and 2.2: text-to-video, image-to-video, TI2V; not VACE, Animate, ChronoEdit or SkyReels-V2)",
    )


def shard_wan(pipe_or_transformer: Any, *, group=None, plan=None, pv: str | None = None,
              backend: str = "auto") -> SequenceParallelHandle:
    """Install Ulysses sequence parallelism (with sagevideo attention, `plan`/`pv` as `install`)
    on every denoiser of a WanPipeline (or on one WanTransformer3DModel). Other transformers,
    Wan-derived ones included, are refused (TypeError) before any rank communicates."""
    from sagevideo.pipelines.install import plan_router
    from sagevideo.pipelines.sharding import install_sharded, ulysses_rank

    denoisers = shard_targets(pipe_or_transformer)
    rank, world = ulysses_rank(denoisers, group)
    planned = plan_router(denoisers[0], plan, pv, backend)
    router = UlyssesWanRouter(planned.plan, backend, group=group, exchanged=self_attention_layers(pipe_or_transformer))
    return install_sharded(pipe_or_transformer, router, denoisers,
                           functools.partial(_shard_hooks, rank=rank, world=world, group=group), pv=pv, backend=backend)


def _shard_hooks(transformer: Any, rank: int, world: int, group: Any) -> list[Any]:
    state: dict[str, int] = {}

    def before_forward(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        p_t, p_h, p_w = module.config.patch_size
        _, _, frames, height, width = hidden.shape
        video = (frames // p_t) * (height // p_h) * (width // p_w)
        check_degree(module.config.num_attention_heads, video, world)
        n = video // world
        state.update(start=rank * n, stop=(rank + 1) * n)
        timestep = kwargs.get("timestep", args[1] if len(args) > 1 else None)
        if timestep is not None and timestep.ndim == 2:  # per-token timesteps (Wan 2.2 TI2V)
            if "timestep" in kwargs:
                kwargs["timestep"] = timestep[:, state["start"] : state["stop"]]
            else:
                args = (args[0], timestep[:, state["start"] : state["stop"]], *args[2:])
        return args, kwargs

    def keep_own_rotary(module, args, output):
        return tuple(t[:, state["start"] : state["stop"]] for t in output)

    def keep_own_tokens(module, args, kwargs):
        if args:
            args = (args[0][:, state["start"] : state["stop"]], *args[1:])
        else:
            kwargs["hidden_states"] = kwargs["hidden_states"][:, state["start"] : state["stop"]]
        return args, kwargs

    def gather_video(module, args, output):
        return gather_seq(output, group, dim=1)

    return [
        transformer.register_forward_pre_hook(before_forward, with_kwargs=True),
        transformer.rope.register_forward_hook(keep_own_rotary),
        transformer.blocks[0].register_forward_pre_hook(keep_own_tokens, with_kwargs=True),
        transformer.proj_out.register_forward_hook(gather_video),
    ]
