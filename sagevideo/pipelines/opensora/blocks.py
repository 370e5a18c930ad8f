"""The two transformer blocks of the Open-Sora 2.0 MMDiT (Flux-style double and single stream).

Shapes: image tokens (B, L_img, C), text tokens (B, L_txt, C), vec (B, C), rotary tables
(1, L_txt + L_img, D) fp32. Every LayerNorm is parameter-free with eps 1e-6, so one module per
block serves all its norm sites.
"""

from __future__ import annotations

import torch
from torch import nn

from sagevideo.pipelines.opensora.attention import OpenSoraAttention
from sagevideo.pipelines.opensora.layers import OpenSoraFeedForward, OpenSoraModulation, modulate


class OpenSoraDoubleStreamBlock(nn.Module):
    """Separate weights per stream, one joint attention over [txt; img]. Official: `double_blocks.{i}`.

    Per stream: x += gate1 * proj(attn(modulate(LN(x), shift1, scale1)));
    x += gate2 * mlp(modulate(LN(x), shift2, scale2)).
    """

    def __init__(self, dim: int, heads: int, mlp_ratio: float, qkv_bias: bool = True):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.img_mod = OpenSoraModulation(dim, 6)
        self.txt_mod = OpenSoraModulation(dim, 6)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = OpenSoraAttention(dim, heads, dim // heads, joint=True, bias=qkv_bias)
        self.ff = OpenSoraFeedForward(dim, hidden)
        self.ff_context = OpenSoraFeedForward(dim, hidden)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        vec: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(image (B, L_img, C), text (B, L_txt, C)) -> the updated pair."""
        img, txt = hidden_states, encoder_hidden_states
        i_shift1, i_scale1, i_gate1, i_shift2, i_scale2, i_gate2 = self.img_mod(vec)
        t_shift1, t_scale1, t_gate1, t_shift2, t_scale2, t_gate2 = self.txt_mod(vec)

        img_attn, txt_attn = self.attn(
            modulate(self.norm(img), i_shift1, i_scale1),
            encoder_hidden_states=modulate(self.norm(txt), t_shift1, t_scale1),
            image_rotary_emb=image_rotary_emb,
        )
        img = img + i_gate1 * img_attn
        img = img + i_gate2 * self.ff(modulate(self.norm(img), i_shift2, i_scale2))
        txt = txt + t_gate1 * txt_attn
        txt = txt + t_gate2 * self.ff_context(modulate(self.norm(txt), t_shift2, t_scale2))
        return img, txt


class OpenSoraSingleStreamBlock(nn.Module):
    """Parallel attention + MLP on the joint sequence x = [txt; img]. Official: `single_blocks.{j}`.

    x += gate * proj_out([attn(x_mod) ; gelu_tanh(proj_mlp(x_mod))]), x_mod = modulate(LN(x), shift, scale).
    The official `v_mlp` (rows 0:C = v, C: = MLP-in) is split into attn.to_v and proj_mlp here;
    row blocks of one Linear are independent, so the function is the same.

    It takes and returns the two streams apart, as the double block does (the official block takes
    x joined; joining and splitting are exact): diffusers' step caches (`TransformerBlockRegistry`)
    compare and reuse each block's image and text outputs by position, the same for every block.
    """

    def __init__(self, dim: int, heads: int, mlp_ratio: float, qkv_bias: bool = True):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.mod = OpenSoraModulation(dim, 3)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = OpenSoraAttention(dim, heads, dim // heads, joint=False, bias=qkv_bias)
        self.proj_mlp = nn.Linear(dim, hidden)
        self.act_mlp = nn.GELU(approximate="tanh")
        self.proj_out = nn.Linear(dim + hidden, dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        vec: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(image (B, L_img, C), text (B, L_txt, C)) -> the updated pair; attention over [txt; img]."""
        n_txt = encoder_hidden_states.shape[1]
        x = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        shift, scale, gate = self.mod(vec)
        x_mod = modulate(self.norm(x), shift, scale)
        attn = self.attn(x_mod, image_rotary_emb=image_rotary_emb)
        mlp = self.act_mlp(self.proj_mlp(x_mod))
        x = x + gate * self.proj_out(torch.cat([attn, mlp], dim=-1))
        return x[:, n_txt:], x[:, :n_txt]


class OpenSoraFinalNorm(nn.Module):
    """Final adaLN: modulate(LN(x), shift, scale) with (shift, scale) = linear(silu(vec)), SHIFT FIRST.

    Official: `final_layer.adaLN_modulation.1`. (diffusers' AdaLayerNormContinuous orders the rows
    scale-first; this one keeps the checkpoint's order so its rows load unchanged.)
    """

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
        shift, scale = self.linear(nn.functional.silu(vec))[:, None, :].chunk(2, dim=-1)
        return modulate(self.norm(x), shift, scale)
