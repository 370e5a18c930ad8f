"""Rotary embedding written straight into its destination.

diffusers' `apply_rotary_emb(x, (cos, sin))` (use_real=True, use_real_unbind_dim=-1: CogVideoX,
Flux, HunyuanDiT) returns a new tensor in x's dtype, which callers then copy where it belongs.
`rotary_into` runs the same fp32 arithmetic and casts once, into the destination (a slice of q/k,
or a communication buffer), so that copy and its intermediate tensor disappear. Bit-equal to
diffusers (tests/pipelines/test_rotary.py).
"""

from __future__ import annotations

import torch


def rotary_into(dst: torch.Tensor, x: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """dst := diffusers' `apply_rotary_emb(x, freqs)`; returns dst.

    x: (..., S, D), any dtype and strides; freqs: (cos, sin), each (S, D), one dtype (fp32 in
    diffusers' pipelines); dst: any writable (..., S, D) tensor, usually x's dtype (the cast
    happens in the final copy). dst may be x itself: x is read in full before dst is written.
    Pairs (x[2i], x[2i+1]) rotate as complex numbers: out = x * cos + (-x[2i+1], x[2i]) * sin.
    """
    cos, sin = (f.to(x.device) for f in freqs)
    xf = x.float()
    real, imag = xf.unflatten(-1, (-1, 2)).unbind(-1)
    # Negating and widening commute exactly, so building the rotated pairs from the fp32 copy gives
    # diffusers' values without its bf16 intermediates.
    rotated = torch.stack((-imag, real), dim=-1).flatten(-2)
    out = xf * cos
    out += rotated * sin  # diffusers' fp32 sum of the two products (same dtype: same rounding in place)
    return dst.copy_(out)
