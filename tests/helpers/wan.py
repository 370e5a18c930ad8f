"""Tiny Wan models built offline: a dispatcher-based transformer (its processors call SDPA through
diffusers' attention dispatcher) and a Wan 2.2-style pipeline with two of them (`boundary_ratio`)."""

from __future__ import annotations

import torch

WAN_CONFIG = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4,
    text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
)
WAN_ATTENTION_CALLS = 4  # per forward: 2 blocks x (self + cross attention)


def tiny_wan(seed: int = 0):
    """WanTransformer3DModel(WAN_CONFIG), fp32, eval mode, weights from `seed` (global RNG untouched)."""
    from diffusers import WanTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return WanTransformer3DModel(**WAN_CONFIG).eval()


def wan_inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden (1, 4, 3, 8, 8), timestep (1,), text (1, 10, 16)) for `tiny_wan`."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, 4, 3, 8, 8, generator=gen), torch.tensor([500]), torch.randn(1, 10, 16, generator=gen)


def run_wan(model, inputs=None) -> torch.Tensor:
    with torch.no_grad():
        return model(*(inputs or wan_inputs()), return_dict=False)[0]


def tiny_wan22_pipeline(boundary_ratio: float | None = 0.5):
    """A WanPipeline as Wan 2.2 ships it: `transformer` for timesteps >= boundary_ratio * 1000,
    `transformer_2` below; with boundary_ratio=None, Wan 2.1's (one transformer, no `transformer_2`).
    No VAE, tokenizer or text encoder: run it with `run_wan22`."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipe = WanPipeline(
        tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
        transformer=tiny_wan(0), transformer_2=tiny_wan(1) if boundary_ratio is not None else None,
        boundary_ratio=boundary_ratio,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_wan22(pipe, steps: int = 4) -> torch.Tensor:
    """Latents of 2 frames of 64x64 px (latent (1, 4, 2, 8, 8)) with classifier-free guidance: two
    transformer forwards per step. With 4 steps and boundary 0.5: 2 steps on each transformer."""
    gen = torch.Generator().manual_seed(2)
    text, negative = torch.randn(1, 10, 16, generator=gen), torch.randn(1, 10, 16, generator=gen)
    return pipe(
        prompt_embeds=text, negative_prompt_embeds=negative, height=64, width=64, num_frames=5,
        num_inference_steps=steps, guidance_scale=2.0, generator=torch.Generator().manual_seed(0),
        output_type="latent", return_dict=False,
    )[0]
