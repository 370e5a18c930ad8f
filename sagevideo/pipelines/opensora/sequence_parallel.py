"""Ulysses sequence parallelism for the Open-Sora 2.0 transformer: one video's tokens over P ranks.

Every rank keeps all text tokens and a contiguous 1/P of the image tokens: a forward pre-hook
slices `img`, `img_ids` and `cond` (all per-token inputs, so the embedders and the RoPE tables
follow), every attention layer exchanges sequence shards for head groups around the installed
plan's attention (`UlyssesOpenSoraAttnProcessor`), and a forward hook gathers the output, so
every rank returns the full (B, L_img, C) prediction. Same inputs (seed) on every rank.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from sagevideo.parallel.launch import rank_and_world
from sagevideo.parallel.ulysses import SequenceParallelHandle, check_degree, gather_seq, ulysses_attention
from sagevideo.pipelines.opensora.processor import SageOpenSoraAttnProcessor

_SHARDED_INPUTS = ("img", "img_ids", "cond")


class UlyssesOpenSoraAttnProcessor(SageOpenSoraAttnProcessor):
    """`SageOpenSoraAttnProcessor` whose attention runs over [text; all image tokens] per head group.
    `state["text"]` (set by the sharding hook each forward) is the text length."""

    def __init__(self, *, group=None, state: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.group = group
        self.state = state if state is not None else {}

    def attend(self, q, k, v):
        heads = self.router.head_order(self.name, q.shape[1], rank_and_world(self.group)[1], q.device)
        return ulysses_attention(functools.partial(self.router, self.name), q, k, v, self.state["text"], self.group,
                                 heads=heads)


def shard_opensora(pipe_or_transformer: Any, *, group=None, plan=None, pv: str | None = None,
                   backend: str = "auto") -> SequenceParallelHandle:
    """Install Ulysses sequence parallelism (with sagevideo attention, `plan`/`pv` as `install`) on
    sagevideo's OpenSoraTransformer3DModel (or a pipeline's); other transformers are refused
    (TypeError) before any rank communicates (`pipelines.sharding`)."""
    from sagevideo.pipelines.install import plan_router
    from sagevideo.pipelines.opensora.processor import OpenSoraAttnProcessor
    from sagevideo.pipelines.opensora.transformer import OpenSoraTransformer3DModel
    from sagevideo.pipelines.sharding import install_sharded, shard_targets, ulysses_rank

    (transformer,) = shard_targets("shard_opensora", pipe_or_transformer, (OpenSoraTransformer3DModel,),
                                   (OpenSoraAttnProcessor,))
    rank, world = ulysses_rank([transformer], group, heads="num_heads")
    router = plan_router(transformer, plan, pv, backend)
    state: dict[str, int] = {}
    factory = functools.partial(UlyssesOpenSoraAttnProcessor, group=group, state=state)
    signature = inspect.signature(type(transformer).forward)

    def shard_inputs(module, args, kwargs):
        bound = signature.bind(module, *args, **kwargs)
        values = bound.arguments
        total = values["img"].shape[1]
        check_degree(module.config.num_heads, total, world, what="image tokens")
        n = total // world
        for name in _SHARDED_INPUTS:
            if values.get(name) is not None:
                values[name] = values[name][:, rank * n : (rank + 1) * n]
        state["text"] = values["txt"].shape[1]
        return bound.args[1:], bound.kwargs

    def gather_output(module, args, kwargs, output):
        if hasattr(output, "sample"):
            output.sample = gather_seq(output.sample, group, dim=1)
            return output
        return gather_seq(output, group, dim=1)

    def hooks_of(transformer):
        return [
            transformer.register_forward_pre_hook(shard_inputs, with_kwargs=True),
            transformer.register_forward_hook(gather_output, with_kwargs=True),
        ]

    return install_sharded(pipe_or_transformer, router, [transformer], hooks_of, pv=pv, backend=backend,
                           routes={OpenSoraAttnProcessor: factory})
