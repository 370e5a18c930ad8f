"""The random-sign Hadamard rotation applied to Q and K before INT8 quantization.

(QR)(KR)ᵀ = d·QKᵀ for the ±1 matrix R = diag(s)·H_d (H_d Sylvester's Hadamard matrix), so
rotating both and dividing the scores by d changes nothing mathematically, while a channel
outlier in Q or K is spread over all d channels instead of setting the whole tile's scale
(FlashAttention-3's incoherent processing). R has exact ±1 entries so the rotation of
16-bit inputs is exact up to fp32 accumulation; the 1/d is folded into Q's scale.
"""

from __future__ import annotations

import functools

import torch

_SIGN_SEED = 0x5A6E  # fixed: the kernels and the reference must use the same signs


@functools.lru_cache(maxsize=8)
def _hadamard_cpu(dim: int) -> torch.Tensor:
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"Hadamard rotation needs a power-of-two dimension, got {dim}")
    h = torch.ones(1, 1)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    gen = torch.Generator().manual_seed(_SIGN_SEED)
    signs = torch.randint(0, 2, (dim,), generator=gen).float() * 2 - 1
    return signs[:, None] * h


_DEVICE_CACHE: dict[tuple[int, str], torch.Tensor] = {}


def hadamard_pm1(dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(dim, dim) fp32 matrix of ±1 with R Rᵀ = dim·I; cached per device."""
    key = (dim, str(device))
    mat = _DEVICE_CACHE.get(key)
    if mat is None:
        mat = _DEVICE_CACHE[key] = _hadamard_cpu(dim).to(device)
    return mat
