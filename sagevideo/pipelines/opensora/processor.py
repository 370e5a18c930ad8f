"""sagevideo's attention processor for the Open-Sora 2.0 transformer.

`SageOpenSoraAttnProcessor` is `OpenSoraAttnProcessor` with the attention call replaced by
`sagevideo.sageattn` (INT8 QK, FP16/FP8 PV). Both run `opensora_attention`, so projections,
QK-norm, the rotate-half RoPE and the text/image split are the same code; only `attend` differs.
Its constructor and call mirror `SageCogVideoXAttnProcessor` (keyword-only pv, backend, name,
router). `OpenSoraAttnProcessor` is re-exported here so that the pair imports from one place.
"""

from __future__ import annotations

import torch

from sagevideo.pipelines.opensora.attention import (
    OpenSoraAttention,
    OpenSoraAttnProcessor,
    opensora_attention,
)
from sagevideo.pipelines.routing import RoutedProcessor

__all__ = ["OpenSoraAttnProcessor", "SageOpenSoraAttnProcessor"]


class SageOpenSoraAttnProcessor(RoutedProcessor):
    """Drop-in for `OpenSoraAttnProcessor` that attends through `sagevideo.sageattn`
    (constructor: see `RoutedProcessor`, shared with SageCogVideoXAttnProcessor).

    Call: as `OpenSoraAttnProcessor`; q, k, v reach sageattn as (B, H, L, 128) "HND" in the model
    dtype, no mask, default scale 1/sqrt(D).
    """

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.call_router(q, k, v)

    def __call__(
        self,
        attn: OpenSoraAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return opensora_attention(attn, hidden_states, encoder_hidden_states, image_rotary_emb, self.attend)
