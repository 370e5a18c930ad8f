"""The random-sign Hadamard rotation applied to Q and K before INT8 quantization.

(QR)(KR)ᵀ = d·QKᵀ for the ±1 matrix R = diag(s)·H_d (H_d Sylvester's Hadamard matrix), so
rotating both and dividing the scores by d changes nothing mathematically, while a channel
outlier in Q or K is spread over all d channels instead of setting the whole tile's scale
(FlashAttention-3's incoherent processing). R has exact ±1 entries so the rotation of
16-bit inputs is exact up to fp32 accumulation; the 1/d is folded into Q's scale.
"""

from __future__ import annotations

import torch

# Fixed random sign bits (from a seeded draw, written out so the matrix is built with plain
# tensor ops that torch.compile can trace): the kernels and the reference use the same signs.
_SIGN_BITS = 0xC6A4A7935BD1E995_9E3779B97F4A7C15
_SIGN_PERIOD = 128

_CACHE: dict[tuple[int, str, torch.dtype], torch.Tensor] = {}


def hadamard_pm1(dim: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(dim, dim) matrix diag(s)·H_dim of ±1 entries with R Rᵀ = dim·I (exact in any float dtype);
    cached per device and dtype. The kernels take it in the inputs' 16-bit dtype (half the bytes).

    While torch.compile traces, it is built in the graph (a few ops on a constant, folded by Inductor)
    instead of read from the cache: a module-level dict read in a graph is a guard on its keys,
    and every new key (head dim, device, dtype) would recompile every graph that attends."""
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"Hadamard rotation needs a power-of-two dimension, got {dim}")
    if torch.compiler.is_compiling():
        return _build(dim, device, dtype)
    key = (dim, str(device), dtype)
    cached = _CACHE.get(key)
    if cached is None:
        cached = _CACHE[key] = _build(dim, device, dtype)
    return cached


def _build(dim: int, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    signs = torch.tensor(
        [1.0 - 2.0 * ((_SIGN_BITS >> (i % _SIGN_PERIOD)) & 1) for i in range(dim)], device=device
    )
    return (signs[:, None] * h).to(dtype)
