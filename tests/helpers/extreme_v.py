"""V at the top of the 16-bit range, for the tests of the output's range (reference, kernels, GPU).

Attention is a convex combination of V's rows: the output must come back exactly for a constant V
channel and lie within [min V, max V] per channel over the valid keys otherwise; at |V| = 65504 any
bias of the normaliser above one would overflow fp16 to inf (`sagevideo.kernels.bounds`).
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
    """V = ±the dtype's max·(1 − j·2^-9) with one random sign per (batch, head, channel); j = 0 (the max
    itself) on 3 keys in 4, else 1..7: the outputs land within ~0.2% of the max, where a normaliser
    biased above one overflows to inf (or, bf16 truncated by the interpreter's store, passes the bound)."""
    gen = torch.Generator().manual_seed(seed)
    b, h, n, d = shape
    sign = torch.randint(0, 2, (b, h, 1, d), generator=gen) * 2.0 - 1.0
    j = torch.where(torch.rand(shape, generator=gen) < 0.75, 0, torch.randint(1, 8, shape, generator=gen))
    shrink = 1.0 - j / 512.0
    return (sign * torch.finfo(dtype).max * shrink).to(device, dtype)


def outside_hull(out: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> int:
    """How many outputs lie outside [min V, max V] of their channel over the valid keys (non-finite count)."""
    vf = v.float()
    keep = torch.ones_like(vf, dtype=torch.bool) if mask is None else mask[:, None, :, None].expand_as(vf)
    lo = torch.where(keep, vf, float("inf")).amin(dim=2, keepdim=True)
    hi = torch.where(keep, vf, float("-inf")).amax(dim=2, keepdim=True)
    o = out.float()
    return int((~torch.isfinite(o) | (o < lo) | (o > hi)).sum())


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
