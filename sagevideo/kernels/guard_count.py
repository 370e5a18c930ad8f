"""The run-time guard's count on the GPU: one small Triton launch over the scales the preparation wrote.

`guard.flagged_tiles` is the definition (and the reference, in PyTorch); this kernel computes the
same count in one pass over the Q and K scales, grid (B·H, query chunks), adding each program's
count to one int32 with an atomic add. No host sync: the count stays on the device for the caller.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from sagevideo.kernels.guard import ZERO_GROUP_SCALE, score_std_limit, score_std_per_scale

ZERO_GROUP_SCALE_CONST = tl.constexpr(ZERO_GROUP_SCALE)
CHUNK = 1024  # scales read per step; a multiple of every plan's block_m


@triton.jit
def _kept(s):
    """Scales that say something about the scores: not a zero group's 1, not NaN (as 0)."""
    return tl.where((s == ZERO_GROUP_SCALE_CONST) | (s != s), 0.0, s)


@triton.jit
def _count_flagged_kernel(
    QScale, KScale, Count, H, H_KV, M_PAD, N_PAD, std_per_scale, limit,
    BLOCK_M: tl.constexpr, K_STEP: tl.constexpr, CHUNK: tl.constexpr,
):
    """Grid (B·H, query chunks of CHUNK rows). K_STEP: 1 (per-token K scales) or BLOCK_N (per-tile
    scales, the same for every row of a tile: one read per tile)."""
    bh = tl.program_id(0)
    chunk = tl.program_id(1)
    bh_kv = (bh // H) * H_KV + (bh % H) // (H // H_KV)
    k_row = KScale + bh_kv.to(tl.int64) * N_PAD
    k_max = tl.zeros((CHUNK,), dtype=tl.float32)
    for start in range(0, N_PAD, CHUNK * K_STEP):
        offs = start + tl.arange(0, CHUNK) * K_STEP
        k_max = tl.maximum(k_max, _kept(tl.load(k_row + offs, mask=offs < N_PAD, other=0.0)))
    k_top = tl.max(k_max, axis=0)
    q_row = QScale + bh.to(tl.int64) * M_PAD
    offs = chunk * CHUNK + tl.arange(0, CHUNK // BLOCK_M)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    q_tile = tl.max(_kept(tl.load(q_row + offs, mask=offs < M_PAD, other=0.0)), axis=1)
    tiles = ((q_tile * k_top) * std_per_scale > limit).to(tl.int32)
    tl.atomic_add(Count, tl.sum(tiles, axis=0))


def count_flagged_tiles(q_scale: torch.Tensor, k_scale: torch.Tensor, *, block_m: int, head_dim: int,
                        granularity: str, pv: str, block_n: int = 1) -> torch.Tensor:
    """`guard.flagged_tiles` in one launch: q_scale (B·H, M_PAD) and k_scale (B·H_kv, N_PAD) fp32 as the
    preparation writes them (M_PAD a multiple of block_m, a power of two ≤ CHUNK). block_n: the K
    tile under "block" granularity, whose rows share one scale (1: read every row). int32 0-dim."""
    bh, m_pad = q_scale.shape
    bh_kv, n_pad = k_scale.shape
    chunk = max(CHUNK, block_m)
    count = torch.zeros((), device=q_scale.device, dtype=torch.int32)
    # H and H_KV only matter through their ratio and bh_kv = (bh // H)·H_KV + …: the batch is
    # implied, so one "batch" of all heads with the same ratio indexes the same K/V head.
    wrap_triton(_count_flagged_kernel)[(bh, triton.cdiv(m_pad, chunk))](
        q_scale, k_scale, count, bh, bh_kv, m_pad, n_pad,
        score_std_per_scale(head_dim), score_std_limit(granularity, pv),
        BLOCK_M=block_m, K_STEP=block_n if granularity == "block" else 1, CHUNK=chunk,
    )
    return count
