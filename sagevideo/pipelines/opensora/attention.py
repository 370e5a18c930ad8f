"""The attention layer of the Open-Sora 2.0 MMDiT and its default (full-precision) processor.

Each of the 57 attention call sites per forward (19 double-stream + 38 single-stream blocks) is an
`OpenSoraAttention` module, so diffusers' `attn_processors` / `set_attn_processor` reach every one
of them and sagevideo can swap in its quantized kernels. A processor does the whole layer:
projections, QK-RMSNorm, [txt; img] concatenation, rotary embedding, attention, split and output
projections. The computation is written once, in `opensora_attention`; processors differ only in
the `attend(q, k, v)` callable, so the RoPE (and everything else) is applied identically.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from diffusers.models.attention import AttentionModuleMixin
from torch import nn

from sagevideo.pipelines.opensora.layers import OpenSoraRMSNorm
from sagevideo.pipelines.opensora.rope import apply_rope

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def opensora_attention(
    attn: OpenSoraAttention,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor | None,
    image_rotary_emb: tuple[torch.Tensor, torch.Tensor],
    attend: Attend,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One Open-Sora attention layer, with `attend` doing softmax(q k^T / sqrt(D)) v.

    Double-stream (attn.joint): hidden_states = modulated image tokens (B, L_img, C),
    encoder_hidden_states = modulated text tokens (B, L_txt, C); returns (image, text) after their
    own output projections, (B, L_img, C) and (B, L_txt, C).
    Single-stream: hidden_states = modulated [txt; img] tokens (B, L, C), encoder_hidden_states None;
    returns the attention output (B, L, C) before any projection (the block's linear2 takes it).
    image_rotary_emb: (cos, sin), each (1 or B, L_txt + L_img, D) fp32, for the joint sequence.
    attend: (q, k, v) each (B, H, L, D) in the model dtype -> (B, H, L, D).
    """
    q, k, v = _project(attn, hidden_states, attn.to_q, attn.to_k, attn.to_v, attn.norm_q, attn.norm_k)
    txt_len = 0
    if attn.joint:
        if encoder_hidden_states is None:
            raise ValueError(f"{type(attn).__name__} of a double-stream block needs encoder_hidden_states")
        cq, ck, cv = _project(
            attn, encoder_hidden_states, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj,
            attn.norm_added_q, attn.norm_added_k,
        )
        txt_len = encoder_hidden_states.shape[1]
        # Text first, as the official model concatenates (and as the position ids are laid out).
        q, k, v = torch.cat([cq, q], dim=2), torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)
    elif encoder_hidden_states is not None:
        raise ValueError("a single-stream attention layer takes the joint sequence as hidden_states only")

    cos, sin = image_rotary_emb
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out = attend(q, k, v)
    batch, heads, length, head_dim = out.shape
    out = out.transpose(1, 2).reshape(batch, length, heads * head_dim)
    if not attn.joint:
        return out
    txt, img = out[:, :txt_len], out[:, txt_len:]
    return attn.to_out(img), attn.to_add_out(txt)


def _project(attn, x, to_q, to_k, to_v, norm_q, norm_k) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (B, L, C) -> q, k, v (B, H, L, D); q and k RMS-normed and cast to v's dtype (as official)."""
    batch, length, _ = x.shape
    q, k, v = (proj(x).view(batch, length, attn.heads, attn.head_dim).transpose(1, 2) for proj in (to_q, to_k, to_v))
    return norm_q(q).to(v.dtype), norm_k(k).to(v.dtype), v


class OpenSoraAttnProcessor:
    """Default processor: the official computation with full-precision SDPA (no mask, scale 1/sqrt(D)).

    Call: see `opensora_attention`; (attn, hidden_states, encoder_hidden_states=None,
    image_rotary_emb=(cos, sin)).
    """

    def __repr__(self) -> str:
        return "OpenSoraAttnProcessor()"

    @staticmethod
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # The same scale expression sageattn uses, so backend="sdpa" there is bit-identical.
        return F.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(q.shape[-1]))

    def __call__(
        self,
        attn: OpenSoraAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return opensora_attention(attn, hidden_states, encoder_hidden_states, image_rotary_emb, self.attend)


class OpenSoraAttention(nn.Module, AttentionModuleMixin):
    """Attention parameters of one block; the processor computes the layer.

    joint=True (double-stream block): image projections to_q/to_k/to_v, norm_q/norm_k, to_out
    (official `img_attn.*`) and text projections add_{q,k,v}_proj, norm_added_q/k, to_add_out
    (official `txt_attn.*`). joint=False (single-stream block): to_q/to_k/to_v and norm_q/norm_k
    only (official q_proj, k_proj, v rows of v_mlp, norm.*); its output projection is the
    block's linear2, shared with the MLP.
    """

    _default_processor_cls = OpenSoraAttnProcessor
    _available_processors = [OpenSoraAttnProcessor]
    _supports_qkv_fusion = False  # the processor reads to_q/to_k/to_v; released config: fused_qkv=False

    def __init__(self, dim: int, heads: int, head_dim: int, *, joint: bool, bias: bool = True, eps: float = 1e-6,
                 processor=None):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim
        self.joint = joint
        inner = heads * head_dim
        self.to_q = nn.Linear(dim, inner, bias=bias)
        self.to_k = nn.Linear(dim, inner, bias=bias)
        self.to_v = nn.Linear(dim, inner, bias=bias)
        self.norm_q = OpenSoraRMSNorm(head_dim, eps)
        self.norm_k = OpenSoraRMSNorm(head_dim, eps)
        if joint:
            self.to_out = nn.Linear(inner, dim)
            self.add_q_proj = nn.Linear(dim, inner, bias=bias)
            self.add_k_proj = nn.Linear(dim, inner, bias=bias)
            self.add_v_proj = nn.Linear(dim, inner, bias=bias)
            self.norm_added_q = OpenSoraRMSNorm(head_dim, eps)
            self.norm_added_k = OpenSoraRMSNorm(head_dim, eps)
            self.to_add_out = nn.Linear(inner, dim)
        self.set_processor(processor if processor is not None else self._default_processor_cls())

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if image_rotary_emb is None:
            raise ValueError("Open-Sora attention needs image_rotary_emb=(cos, sin) for the joint sequence")
        return self.processor(
            self, hidden_states, encoder_hidden_states=encoder_hidden_states, image_rotary_emb=image_rotary_emb
        )
