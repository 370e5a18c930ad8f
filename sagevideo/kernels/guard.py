"""The run-time guard of the INT8 contract: query tiles whose scores are too coarse for INT8.

INT8's score error grows with the score range: the integer score times the row scale
c = q_scale·k_scale (log2 units) is resolved in steps of about c·127·√D, so c measures how far a
tile is from what the accuracy table covers. From the scales the preparation pass already wrote
(no pass over Q or K), each query tile's largest c against its head's largest K scale gives an
estimated score std, c·127²·√D / (AMAX_OVER_STD²·log2 e): for Gaussian tiles this is the score
std of q·kᵀ/√D (about 1.26× it, a tile's max|x| being ~4.5σ), for heavy-tailed tiles more, as
their error is. A tile past the limit of its mode is counted; the count stays on the device
(no host sync) for the caller to read when it chooses. This module is the definition, in PyTorch
(the reference op uses it); the kernels' ops count with one launch (`guard_count.py`).

The limits are where the worst cosine against fp64 crosses the contract's floor in the accuracy
table (`python -m bench.accuracy_table`; docs/benchmarks.md "the run-time guard"): per-tile scales
with 16-bit P·V hold 0.999 to an estimate of about 13, with FP8 P·V 0.998 to about 21; per-token
scales 0.999 to about 27 and 0.998 to about 43.
"""

from __future__ import annotations

import math

import torch

from sagevideo.kernels.constants import INT8_MAX, LOG2E

AMAX_OVER_STD = 4.0  # nominal max|x| / std of a tile: the estimate's unit is a Gaussian tile's score std

# (granularity, pv) -> largest estimated score std a query tile may have before it is counted
SCORE_STD_LIMITS = {
    ("block", "fp16"): 12.0,
    ("block", "fp8"): 20.0,
    ("token", "fp16"): 25.0,
    ("token", "fp8"): 40.0,
}
# Quantization groups that hold only zeros (masked or padded keys, all-zero rows) get the scale 1
# (`quantize._quantize_int8`); their codes are 0, so their scores are exact whatever c is.
ZERO_GROUP_SCALE = 1.0


def score_std_limit(granularity: str, pv: str) -> float:
    """The estimated score std past which a query tile of this mode is counted ("fp32": as "fp16")."""
    return SCORE_STD_LIMITS[(granularity, "fp8" if pv == "fp8" else "fp16")]


def score_std_per_scale(head_dim: int) -> float:
    """Score std (of q·kᵀ/√D) per unit of row scale c = q_scale·k_scale in log2 units."""
    return INT8_MAX**2 * math.sqrt(head_dim) / (AMAX_OVER_STD**2 * LOG2E)


def estimated_score_std(row_scale: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Score std (of q·kᵀ/√D) that a row scale c = q_scale·k_scale in log2 units stands for."""
    return row_scale * score_std_per_scale(head_dim)


def flagged_tiles(
    q_scale: torch.Tensor, k_scale: torch.Tensor, *, block_m: int, head_dim: int, granularity: str, pv: str,
) -> torch.Tensor:
    """How many query tiles of a call are past `score_std_limit`: int32 0-dim, on the scales' device.

    q_scale (B·H, M) fp32: each query row's scale (sm_scale·log2 e folded in; rows of a tile share
    one under "block"), M a multiple of block_m or not; k_scale (B·H_kv, N) fp32: each key row's.
    Query head h is set against K/V head h // (H // H_kv) (grouped-query attention). NaN scales
    (NaN inputs, which give NaN rows as in SDPA) count as nothing.
    """
    bh, m = q_scale.shape
    k_kept = torch.where(k_scale == ZERO_GROUP_SCALE, 0.0, k_scale)
    k_max = torch.nan_to_num(k_kept, nan=0.0).amax(dim=1)  # (B·H_kv,)
    group = bh // k_scale.shape[0]  # query heads per K/V head
    k_max = k_max.repeat_interleave(group) if group > 1 else k_max
    tiles = -(-m // block_m)
    q_rows = torch.nn.functional.pad(q_scale, (0, tiles * block_m - m)).view(bh, tiles, block_m)
    q_kept = torch.nan_to_num(torch.where(q_rows == ZERO_GROUP_SCALE, 0.0, q_rows), nan=0.0)
    q_tile = q_kept.amax(dim=2)  # "block": the tile's one scale (a NaN row's apart)
    std = estimated_score_std(q_tile * k_max[:, None], head_dim)
    return (std > score_std_limit(granularity, pv)).sum(dtype=torch.int32)
