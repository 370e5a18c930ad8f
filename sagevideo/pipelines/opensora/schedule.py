"""Open-Sora 2.0's sampling schedule and its three-branch classifier-free guidance."""

from __future__ import annotations

import math

import torch


def shift_alpha(tokens_per_frame: int, latent_frames: int) -> float:
    """Resolution- and length-dependent shift: lin(tokens per frame; 256 -> 1, 4096 -> 3) * sqrt(T_lat)."""
    slope = (3.0 - 1.0) / (4096 - 256)
    return (1.0 + slope * (tokens_per_frame - 256)) * math.sqrt(latent_frames)


def time_shift(alpha: float, t: torch.Tensor) -> torch.Tensor:
    """alpha * t / (1 + (alpha - 1) * t): keeps 0 and 1, moves the steps toward the noisy end for alpha > 1."""
    return alpha * t / (1 + (alpha - 1) * t)


def opensora_sigmas(num_steps: int, tokens_per_frame: int, latent_frames: int) -> torch.Tensor:
    """num_steps + 1 sigmas, shifted linspace(1, 0, num_steps + 1), fp32, from 1 (noise) to 0.

    tokens_per_frame: packed tokens per latent frame, (H/16) * (W/16) at the VAE's 8x and patch 2.
    The sampler steps x += (sigma_next - sigma) * velocity between consecutive entries.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    # fp32 throughout, as the official schedule (a Python-float alpha on an fp32 linspace).
    t = torch.linspace(1, 0, num_steps + 1, dtype=torch.float32)
    return time_shift(shift_alpha(tokens_per_frame, latent_frames), t)


# Open-Sora's guidance oscillation (`text_osci`, `image_osci` in the official 256px/768px configs)
# leaves the first OSCILLATION_FROM_STEP steps alone.
OSCILLATION_FROM_STEP = 10


def oscillated_scale(scale: float, step: int, from_step: int = OSCILLATION_FROM_STEP) -> float:
    """`scale` at 0-based `step`, oscillated as the official sampler does: unchanged before `from_step`
    and on even steps, 1.0 (the conditional prediction alone) on odd steps from `from_step` on; at 50
    steps, 1.0 at steps 11, 13, ..., 49."""
    return scale if step < from_step or step % 2 == 0 else 1.0


def temporal_image_scale(scale: float, step: int, num_steps: int, latent_frames: int) -> torch.Tensor:
    """The official `scale_temporal_osci` of g_img for image-to-video: (latent_frames,) fp32 scales
    rising linearly from 1.0 at latent frame 0 to a bound that falls linearly over the steps,
    linspace(scale, 1, num_steps + 1)[step]. Only for scale > 1 (a scale <= 1, e.g. oscillated to
    1.0, stays the plain number)."""
    bound = torch.linspace(scale, 1.0, num_steps + 1, dtype=torch.float32)[step]
    return torch.linspace(1.0, float(bound), latent_frames, dtype=torch.float32)


def combine_guidance(
    cond: torch.Tensor, uncond: torch.Tensor, uncond_no_image: torch.Tensor, text_scale: float,
    image_scale: float | torch.Tensor,
) -> torch.Tensor:
    """u2 + g_img * (u - u2) + g_txt * (c - u).

    cond (c): prompt with the image condition; uncond (u): negative prompt with the condition;
    uncond_no_image (u2): negative prompt with a zero condition. For text-to-video the condition
    is zero in both, so u == u2 and this is plain CFG u + g_txt * (c - u). image_scale: a number, or
    per-token scales (B or 1, L, 1) (`temporal_image_scale` spread over each frame's tokens).
    """
    return uncond_no_image + image_scale * (uncond - uncond_no_image) + text_scale * (cond - uncond)
