"""sagevideo's attention processor for the Open-Sora 2.0 transformer.

`SageOpenSoraAttnProcessor` is `OpenSoraAttnProcessor` with the attention call replaced by
`sagevideo.sageattn` (INT8 QK, FP16/FP8 PV). Both run `opensora_attention`, so projections,
QK-norm, the rotate-half RoPE and the text/image split are the same code; only `attend` differs.
Its constructor and call mirror `SageCogVideoXAttnProcessor` (keyword-only pv, backend, name,
router). `OpenSoraAttnProcessor` is re-exported here so that the pair imports from one place.
"""

from __future__ import annotations

import torch

from sagevideo.api.attention import BACKENDS
from sagevideo.kernels.plans import PV_MODES
from sagevideo.pipelines.opensora.attention_processor import (
    OpenSoraAttention,
    OpenSoraAttnProcessor,
    opensora_attention,
)
from sagevideo.pipelines.plans import AttentionPlan
from sagevideo.pipelines.routing import AttentionRouter

__all__ = ["OpenSoraAttnProcessor", "SageOpenSoraAttnProcessor"]


class SageOpenSoraAttnProcessor:
    """Drop-in for `OpenSoraAttnProcessor` that attends through `sagevideo.sageattn`.

    pv: "fp16" or "fp8"; backend: a `sageattn` backend ("auto", "triton", "reference", "sdpa").
    name: the layer name (processor key without ".processor"), kept for plans and reports.
    router: the `AttentionRouter` of an installed plan, called as router(name, q, k, v); without
    one, a uniform plan of `pv` on `backend` (as SageCogVideoXAttnProcessor).

    Call: as `OpenSoraAttnProcessor`; q, k, v reach sageattn as (B, H, L, 128) "HND" in the model
    dtype, no mask, default scale 1/sqrt(D).
    """

    def __init__(
        self,
        *,
        pv: str = "fp16",
        backend: str = "auto",
        name: str = "",
        router: AttentionRouter | None = None,
    ):
        if pv not in PV_MODES:
            raise ValueError(f"pv={pv!r} is not supported; use one of {PV_MODES}")
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not supported; use one of {BACKENDS}")
        self.pv = pv
        self.backend = backend
        self.name = name
        self.router = router or AttentionRouter(AttentionPlan.uniform(f"int8-{pv}"), backend)

    def __repr__(self) -> str:
        return f"SageOpenSoraAttnProcessor(name={self.name!r}, pv={self.pv!r}, backend={self.backend!r})"

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.router(self.name, q, k, v)

    def __call__(
        self,
        attn: OpenSoraAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return opensora_attention(attn, hidden_states, encoder_hidden_states, image_rotary_emb, self.attend)
