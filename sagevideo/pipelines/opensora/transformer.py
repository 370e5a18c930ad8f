"""Open-Sora 2.0's video transformer (the 11B MMDiT) as a diffusers model.

`OpenSoraTransformer3DModel()` with the default config is the released `Open_Sora_v2` model:
19 double-stream + 38 single-stream blocks, hidden 3072, 24 heads of dim 128, 3D rotate-half RoPE
with axes [16, 56, 56], QK-RMSNorm, a `cond_in` projection for the image/video condition. Weights
load from the official safetensors through `convert.load_official_checkpoint`, or from a folder
written by `save_pretrained` through `from_pretrained`.

Attention goes through swappable processors (`attn_processors` / `set_attn_processor`, 57 layers)
so sagevideo can install its kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.attention import AttentionMixin
from diffusers.models.cache_utils import CacheMixin
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from sagevideo.pipelines.opensora.blocks import (
    OpenSoraDoubleStreamBlock,
    OpenSoraFinalNorm,
    OpenSoraSingleStreamBlock,
)
from sagevideo.pipelines.opensora.embeddings import OpenSoraMLPEmbedder, timestep_embedding
from sagevideo.pipelines.opensora.rope import rope_tables

TIMESTEP_EMBED_DIM = 256


class OpenSoraTransformer3DModel(ModelMixin, ConfigMixin, AttentionMixin, CacheMixin):
    """The Open-Sora 2.0 MMDiT. Config fields carry the official names and released values.

    in_channels: packed latent features (16 latent channels x 2x2 patch = 64); also the output size.
    patch_size: spatial patch of the packing (the model itself sees packed tokens only).
    vec_in_dim: CLIP-L/14 pooled size; context_in_dim: T5-XXL hidden size.
    axes_dim: RoPE dims of (t, h, w), summing to the head dim; theta: RoPE base.
    cond_in_channels: packed condition features (mask + reference latent: (1 + 16) x 2x2 = 68).
    guidance_embed, fused_qkv, use_liger_rope: must keep the released values (False, False, True);
    the other variants (FLUX.1-dev's guidance embedding, fused qkv, Flux's interleaved RoPE) are not
    part of this port, and a config that asks for them is refused rather than silently misread.
    """

    _supports_gradient_checkpointing = False
    _no_split_modules = ["OpenSoraDoubleStreamBlock", "OpenSoraSingleStreamBlock"]

    @register_to_config
    def __init__(
        self,
        in_channels: int = 64,
        patch_size: int = 2,
        vec_in_dim: int = 768,
        context_in_dim: int = 4096,
        hidden_size: int = 3072,
        num_heads: int = 24,
        depth: int = 19,
        depth_single_blocks: int = 38,
        mlp_ratio: float = 4.0,
        axes_dim: Sequence[int] = (16, 56, 56),
        theta: int = 10000,
        qkv_bias: bool = True,
        guidance_embed: bool = False,
        cond_embed: bool = True,
        cond_in_channels: int = 68,
        fused_qkv: bool = False,
        use_liger_rope: bool = True,
    ):
        super().__init__()
        _check_config(hidden_size, num_heads, axes_dim, qkv_bias, guidance_embed, fused_qkv, use_liger_rope)
        self.x_embedder = nn.Linear(in_channels, hidden_size)
        self.time_embed = OpenSoraMLPEmbedder(TIMESTEP_EMBED_DIM, hidden_size)
        self.pooled_text_embed = OpenSoraMLPEmbedder(vec_in_dim, hidden_size)
        self.cond_embedder = nn.Linear(cond_in_channels, hidden_size) if cond_embed else None
        self.context_embedder = nn.Linear(context_in_dim, hidden_size)
        self.transformer_blocks = nn.ModuleList(
            OpenSoraDoubleStreamBlock(hidden_size, num_heads, mlp_ratio, qkv_bias) for _ in range(depth)
        )
        self.single_transformer_blocks = nn.ModuleList(
            OpenSoraSingleStreamBlock(hidden_size, num_heads, mlp_ratio, qkv_bias) for _ in range(depth_single_blocks)
        )
        self.norm_out = OpenSoraFinalNorm(hidden_size)
        self.proj_out = nn.Linear(hidden_size, in_channels)

    def enable_cache(self, config) -> None:
        """diffusers' `CacheMixin.enable_cache` (first-block cache), once diffusers knows where the
        blocks' image and text outputs are (`register_cache_blocks`)."""
        register_cache_blocks()
        super().enable_cache(config)

    def forward(
        self,
        img: torch.Tensor,
        img_ids: torch.Tensor,
        txt: torch.Tensor,
        txt_ids: torch.Tensor,
        timesteps: torch.Tensor,
        y_vec: torch.Tensor,
        cond: torch.Tensor | None = None,
        guidance: torch.Tensor | None = None,
        return_dict: bool = False,
    ) -> torch.Tensor | Transformer2DModelOutput:
        """The official `MMDiTModel.forward` contract.

        img: (B, L_img, in_channels) packed noisy latent; img_ids: (B, L_img, 3) float (t, h, w);
        txt: (B, L_txt, context_in_dim) T5 states; txt_ids: (B, L_txt, 3) zeros;
        timesteps: (B,) sigma in [0, 1] (1 = pure noise); y_vec: (B, vec_in_dim) CLIP pooled;
        cond: (B, L_img, cond_in_channels), required when cond_embed (all zeros for text-to-video:
        the cond_in bias is still added); guidance: ignored (guidance_embed=False).
        Returns the velocity (noise - x0) prediction (B, L_img, in_channels) in the model dtype.
        """
        del guidance  # guidance_embed=False: the official guidance_in is an Identity and unused
        if self.cond_embedder is not None and cond is None:
            raise ValueError(
                "cond is required (cond_embed=True): pass zeros of shape (B, L_img, "
                f"{self.config.cond_in_channels}) for text-to-video"
            )
        dtype = self.x_embedder.weight.dtype
        temb = timestep_embedding(timesteps, TIMESTEP_EMBED_DIM).to(dtype)
        vec = self.time_embed(temb) + self.pooled_text_embed(y_vec.to(dtype))

        img = self.x_embedder(img.to(dtype))
        if self.cond_embedder is not None:
            img = img + self.cond_embedder(cond.to(dtype))
        txt = self.context_embedder(txt.to(dtype))
        # Positions of the joint sequence, text first (text ids are 0: not rotated).
        rotary = rope_tables(torch.cat([txt_ids, img_ids], dim=1), self.config.axes_dim, self.config.theta)

        for block in (*self.transformer_blocks, *self.single_transformer_blocks):
            img, txt = block(img, txt, vec, rotary)
        out = self.proj_out(self.norm_out(img, vec))
        return Transformer2DModelOutput(sample=out) if return_dict else out


def _check_config(hidden_size, num_heads, axes_dim, qkv_bias, guidance_embed, fused_qkv, use_liger_rope) -> None:
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    head_dim = hidden_size // num_heads
    if sum(axes_dim) != head_dim or any(d % 2 for d in axes_dim):
        raise ValueError(f"axes_dim {list(axes_dim)} must be even and sum to the head dim {head_dim}")
    refused = {
        "guidance_embed=True (FLUX.1-dev's guidance embedding)": guidance_embed,
        "fused_qkv=True": fused_qkv,
        "use_liger_rope=False (Flux's interleaved RoPE)": not use_liger_rope,
        "qkv_bias=False (its single-block bias layout is not documented)": not qkv_bias,
    }
    for what, asked in refused.items():
        if asked:
            raise NotImplementedError(
                f"OpenSoraTransformer3DModel: {what} is not part of this port; "
                "it implements the released Open_Sora_v2 configuration"
            )


def register_cache_blocks() -> None:
    """Tell diffusers' step caches where each block's outputs are: both blocks take
    (hidden_states = image, encoder_hidden_states = text, ...) and return (image, text)."""
    from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry

    for block in (OpenSoraDoubleStreamBlock, OpenSoraSingleStreamBlock):
        if block not in TransformerBlockRegistry._registry:
            TransformerBlockRegistry.register(block, TransformerBlockMetadata(return_hidden_states_index=0,
                                                                              return_encoder_hidden_states_index=1))
