"""Patchify (pack / unpack) of video latents and the token positions Open-Sora's transformer uses.

pack: b c t (h ph) (w pw) -> b (t h w) (c ph pw). Tokens run t-major, then h, then w; features
run channel-major, then row in the patch, then column: feature = c * ph_n * pw_n + ph * pw_n + pw
(c * 4 + ph * 2 + pw for a 2x2 patch, diffusers Flux's `_pack_latents` order).
"""

from __future__ import annotations

import torch


def pack_latents(x: torch.Tensor, patch_size: int = 2) -> torch.Tensor:
    """(B, C, T, H, W) -> (B, T * H/p * W/p, C * p * p); H and W must be multiples of p."""
    b, c, t, h, w = x.shape
    p = patch_size
    if h % p or w % p:
        raise ValueError(f"latent height {h} and width {w} must be multiples of the patch size {p}")
    x = x.reshape(b, c, t, h // p, p, w // p, p)
    x = x.permute(0, 2, 3, 5, 1, 4, 6)  # b, t, h', w', c, ph, pw
    return x.reshape(b, t * (h // p) * (w // p), c * p * p)


def unpack_latents(x: torch.Tensor, frames: int, height: int, width: int, patch_size: int = 2) -> torch.Tensor:
    """Inverse of `pack_latents`: (B, T * H/p * W/p, C * p * p) -> (B, C, T, H, W); sizes in latent units."""
    b, length, features = x.shape
    p = patch_size
    hp, wp = height // p, width // p
    if length != frames * hp * wp or features % (p * p):
        raise ValueError(
            f"cannot unpack {tuple(x.shape)} into {frames} frames of {height}x{width} latents with patch {p}"
        )
    c = features // (p * p)
    x = x.reshape(b, frames, hp, wp, c, p, p)
    x = x.permute(0, 4, 1, 2, 5, 3, 6)  # b, c, t, h', ph, w', pw
    return x.reshape(b, c, frames, height, width)


def latent_ids(
    batch: int, frames: int, height: int, width: int, patch_size: int = 2,
    dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
) -> torch.Tensor:
    """(B, T * H/p * W/p, 3) float positions (t, h, w) of the packed tokens, in `pack_latents` order.

    t is the latent frame index, h and w the row and column in patch units. The official model
    receives them in the model dtype (exact in bf16 up to 256).
    """
    t, h, w = torch.meshgrid(
        torch.arange(frames, device=device),
        torch.arange(height // patch_size, device=device),
        torch.arange(width // patch_size, device=device),
        indexing="ij",
    )
    ids = torch.stack([t, h, w], dim=-1).reshape(1, -1, 3).to(dtype)
    return ids.expand(batch, -1, -1)


def text_ids(batch: int, length: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """(B, L_txt, 3) zeros: text tokens sit at position 0 on every axis (not rotated)."""
    return torch.zeros(batch, length, 3, dtype=dtype, device=device)


def pack_condition(mask: torch.Tensor, reference: torch.Tensor, patch_size: int = 2) -> torch.Tensor:
    """The transformer's `cond`: pack(cat(mask (B, 1, T, H, W), masked reference latent (B, C, T, H, W))).

    Channel 0 is the mask, so packed features 0 .. p*p-1 hold it. Text-to-video passes zeros for both.
    Returns (B, T * H/p * W/p, (1 + C) * p * p).
    """
    return pack_latents(torch.cat([mask, reference], dim=1), patch_size)
