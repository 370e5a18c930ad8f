"""sagevideo's attention processor for CogVideoX transformers.

diffusers' `CogVideoXAttnProcessor2_0` calls `F.scaled_dot_product_attention` directly, so
diffusers' attention-backend switch cannot reach it. This processor is the same computation
(text/video concatenation, QK norms, rotary embedding on the video tokens only, mask handling,
output projection, text/video split) with the attention call replaced by `sagevideo.sageattn`.
`tests/pipelines/cogvideox/test_processor.py` checks it against the upstream processor, so an
upstream change that this copy no longer matches fails loudly.
"""

from __future__ import annotations

import torch

from sagevideo.pipelines.rotary import rotary_into
from sagevideo.pipelines.routing import RoutedProcessor


class SageCogVideoXAttnProcessor(RoutedProcessor):
    """Drop-in for `diffusers.models.attention_processor.CogVideoXAttnProcessor2_0`
    (constructor: see `RoutedProcessor`).

    Call: hidden_states (B, N_video, C), encoder_hidden_states (B, N_text, C) ->
    (hidden_states (B, N_video, C), encoder_hidden_states (B, N_text, C)), same dtype.
    """

    def attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(B, H, N, D) q/k/v -> (B, H, N, D): the installed plan's attention for this layer."""
        return self.call_router(query, key, value, attn_mask=mask)

    def attend_projected(
        self,
        attn,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        text_len: int,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """Rotary embedding and attention: q/k/v (B, H, T + n, D) of [text; video] tokens after the
        QK norms, rotary tables (n, D) for the video tokens -> (B, H, T + n, D).

        Rotates q/k in place (they are this call's own tensors). Overridden where q/k/v should be
        written somewhere else first (sequence parallelism: the all-to-all's send buffer).
        """
        if image_rotary_emb is not None:
            rotary_into(query[:, :, text_len:], query[:, :, text_len:], image_rotary_emb)
            if not attn.is_cross_attention:
                rotary_into(key[:, :, text_len:], key[:, :, text_len:], image_rotary_emb)
        return self.attend(query, key, value, mask)

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        text_seq_length = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        batch_size, sequence_length, _ = hidden_states.shape

        if attention_mask is not None:
            per_head = attention_mask.shape[0] >= batch_size * attn.heads
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
            if not per_head and attention_mask.shape[2] == 1:
                # prepare_attention_mask repeated one key mask per head; hand sageattn a single
                # (B, 1, 1, Nk) copy, the key-padding shape its kernels run (same values).
                attention_mask = attention_mask[:, :1]

        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)

        head_dim = key.shape[-1] // attn.heads
        query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)

        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        hidden_states = self.attend_projected(
            attn, query, key, value, attention_mask, text_seq_length, image_rotary_emb
        )

        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[0](hidden_states)  # linear projection
        hidden_states = attn.to_out[1](hidden_states)  # dropout

        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1
        )
        return hidden_states, encoder_hidden_states
