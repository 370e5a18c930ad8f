"""Attention's output kept inside V's per-channel range: every row of softmax(S)·V is a convex
combination of V's rows, so each output channel lies in [min V, max V] over the keys it attends.

The quantized kernels round P for the P·V product (e4m3 keeps 3 mantissa bits, 16-bit P 8 or 11)
while the softmax row sum l adds the unrounded P, so acc / l can pass that range by up to a few
percent: a constant V came back 1-2 % off and V near the 16-bit maximum as inf. Clamping each
channel to the range over the valid keys only removes error (the exact output lies inside it):
a constant V comes back exactly, every finite input gives a finite output.

Rows that attend no key (a key mask with is_causal) are 0 in the kernels, as in SDPA's fused
kernels; with both, 0 joins the range so that they stay 0.

This module is the reference's clamp (PyTorch). The kernels do the same in their epilogues: the
preparation's statistics pass takes V's per-channel min and max over the valid keys
(`QuantizedInputs.v_range`) and each query tile clamps its rows that have keys before the store.
"""

from __future__ import annotations

import torch


def v_hull(
    v: torch.Tensor, key_mask: torch.Tensor | None, *, with_zero: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi), each (B, H_kv, 1, D) in V's dtype: min and max of v (B, H_kv, Nk, D) over the keys
    key_mask (B' in {1, B}, Nk; nonzero = valid) keeps; (-inf, inf) for a batch row with no valid key
    (its output is 0). with_zero: widened to take 0."""
    if key_mask is None:
        lo, hi = torch.aminmax(v, dim=2, keepdim=True)
    else:
        keep = (key_mask[:, : v.shape[2]] != 0)[:, None, :, None]
        inf = torch.tensor(float("inf"), dtype=v.dtype, device=v.device)
        lo = torch.where(keep, v, inf).amin(dim=2, keepdim=True)
        hi = torch.where(keep, v, -inf).amax(dim=2, keepdim=True)
        none = ~keep.any(dim=2, keepdim=True)
        lo, hi = torch.where(none, -inf, lo), torch.where(none, inf, hi)
    if with_zero:
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    return lo, hi


def clamp_to_v_hull(out: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None, *,
                    is_causal: bool) -> torch.Tensor:
    """out (B, H, Nq, D) clamped in place to V's per-channel range (`v_hull`); v (B, H_kv, Nk, D) with
    H_kv dividing H (query head h reads K/V head h // (H // H_kv)). NaN stays NaN. Returns out."""
    lo, hi = v_hull(v, key_mask, with_zero=is_causal and key_mask is not None)
    group = out.shape[1] // v.shape[1]
    if group > 1:
        lo, hi = lo.repeat_interleave(group, dim=1), hi.repeat_interleave(group, dim=1)
    return torch.clamp(out, lo.to(out.dtype), hi.to(out.dtype), out=out)
