"""V at the top of the 16-bit range, for the FP8-PV normalisation tests (reference, kernels, GPU).

FP8 PV is exact for a constant V channel (its e4m3 code is 448 on every key) and a convex
combination of V's codes otherwise, so the output must stay within max|V| per channel; at
|V| = 65504 any bias of the normaliser above one overflows fp16 to inf.
"""

from __future__ import annotations

import torch

MASKED_LENGTHS = (300, 200)  # valid keys of batch rows 0 and 1 (of 384); row 1 also has a hole


def key_mask(n: int, device="cpu") -> torch.Tensor:
    """(2, n) bool: row 0 padded after MASKED_LENGTHS[0], row 1 after MASKED_LENGTHS[1] with keys 70-79 masked."""
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, MASKED_LENGTHS[0]:] = False
    mask[1, MASKED_LENGTHS[1]:] = False
    mask[1, 70:80] = False
    return mask.to(device)


def qk(shape, dtype, seed: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Ordinary q and k (randn): attention spread over many keys, where P's rounding adds up."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=gen).to(device, dtype) for _ in range(2))


def constant_channels(shape, dtype, device="cpu") -> torch.Tensor:
    """V whose channel d holds one value on every key: 50,000, ±the dtype's max, and smaller ones."""
    top = torch.finfo(dtype).max
    values = torch.tensor([50000.0, top, -top, -50000.0, 1.0, -3.0e-3, 12345.0, 448.0])
    per_channel = values.repeat(shape[-1] // len(values) + 1)[: shape[-1]]
    return per_channel.expand(shape).to(device, dtype).contiguous()


def near_max(shape, dtype, seed: int, device="cpu") -> torch.Tensor:
    """V = ±the dtype's max·(1 − j·2^-9), j in 0..7 per element, with one random sign per (batch, head,
    channel): the outputs land near the max, where a normaliser biased above one overflows to inf."""
    gen = torch.Generator().manual_seed(seed)
    b, h, n, d = shape
    sign = torch.randint(0, 2, (b, h, 1, d), generator=gen) * 2.0 - 1.0
    shrink = 1.0 - torch.randint(0, 8, shape, generator=gen) / 512.0
    return (sign * torch.finfo(dtype).max * shrink).to(device, dtype)


def with_masked_keys(v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """V with its masked keys set to −V: any leak of a masked key into the output moves it off V."""
    return torch.where(mask[:, None, :, None], v, -v)


def channel_bound(v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """max|V| over the valid keys, (B, H, D) fp32."""
    vf = v.float().abs()
    if mask is not None:
        vf = torch.where(mask[:, None, :, None], vf, 0.0)
    return vf.amax(dim=2)


def excess_over_bound(out: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> float:
    """Worst max|out| / max|V| per (batch, head, channel) minus one (inf where out is not finite):
    <= 0 when every output lies within its channel's bound."""
    ratio = out.float().abs().amax(dim=2) / channel_bound(v, mask)
    return torch.nan_to_num(ratio, nan=float("inf")).max().item() - 1.0
