"""Dynamic tile selection on the device (block-sparse attention, docs/sparse.md stage 3): the kernel
twin of `tile_select.TileScores.keep`, from the per-tile statistics the quantization pass pools
(`quantize.PooledTiles`), writing the attention kernel's lists (`sparse_reference.TileLists`'
tensors) directly. Nothing is read on the host: the lists are as wide as the key tiles (known from
the shapes), the counts stay on the device.

Two launches:
1. `_tile_scores_kernel`, grid (query-tile blocks, key-tile blocks, B·H): the tile scores
   pooled q · pooled k · sm_scale + log(valid keys), a small GEMM (`SCORE_PRECISION` "tf32x3": three
   tensor-core products per pair, near fp32; plain TF32
   would move the probabilities by ~1e-3, enough to flip tiles near the threshold), into an fp32
   (B·H, M_TILES, N_TILES) buffer (as large as the lists);
2. `_select_tiles_kernel`, grid (query-tile groups, B·H): each program holds ROWS whole rows of
   scores in registers (T_PAD, the key tiles rounded up to a power of two; ROWS at most MAX_ROWS and
   ROWS·T_PAD at most SELECT_ELEMENTS, so registers do not grow with the sequence) and does the rest.
   With tf32x3 scores and one row a program on 4 warps the two launches take 1.16 ms at Wan 720p on
   an H100, 2.3x fp32 FMAs with up to 16 rows on 8 warps, the same lists; at CogVideoX-5B every
   variant is within 2 % (`python -m bench.sweep_select_launch`, docs/sparse.md). Per program:
   - the softmax over the key tiles;
   - forced tiles (`tile_select.forced_tiles`: diagonal ± local, sinks, text rows and columns; and
     the rows and columns of tiles that are not self-similar, the columns of key tiles where one
     key stands out, `max_spread`, and the probe's columns), never a tile without a valid key;
   - the top-p threshold per query tile without a sort: the reference keeps the non-forced tiles
     in descending probability while the mass before each (the forced tiles' and the higher ones')
     is below top_p. That mass, as a function of a probability value t, G(t) = forced mass + the
     mass of the non-forced tiles above t, only falls as t rises, also in fp32 (a fixed-order sum
     of non-negative terms with more of them zeroed cannot grow). A bisection on t's bit pattern
     (at most 31 steps: non-negative fp32 values order like their bits; it stops once one free
     probability is left between its ends) finds the smallest t with G(t) < top_p exactly; the tiles
     above it are kept, and among tiles of exactly that probability
     (ties) the reference's stable sort keeps the lower key tiles first, which a prefix sum over
     the tied tiles in key order reproduces;
   - or (BY_COUNT, `DynamicSelection.density`) a count per query tile, `TileScores.keep_per_row`:
     the forced tiles and the free tiles (with a valid key) of the highest probabilities up to k =
     max(1, ceil(density · valid key tiles)) in all. Only the order counts, so it ranks exp(score -
     peak), the probabilities without the sum and the division (whose rounding can only merge
     neighbours). The same bisection on t's bits, now on the count of free tiles above t (monotone
     too), finds the budget-th largest; the tied tiles at it are kept in key order while a prefix
     count leaves room. No mass is summed, so the count is exact and only ranks within rounding of
     each other may differ from the reference;
   - the kept tiles compacted in ascending order (a prefix count gives each its slot), -1 after them.
With `probe_columns`, a third launch before them, `_probe_lse_kernel`, grid (key tiles, B·H): the
probe rows (`tile_select.probe_rows`, computed in the kernel) of q against one key tile of k, each
row's logsumexp over the tile's valid keys (16-bit dot, fp32 accumulation) into (B·H, N_TILES, ROWS);
a softmax over the tiles, the median over rows and a stable sort then give each head's forced columns
(`tile_select.probe_mass`, `top_columns`): on the device, no host read.
One launch for both was the first design (ROWS = 16 rows of scores from one tl.dot): compiled for
sm_90 at Wan's 591-1,182 key tiles it spilled, and at 2,048 needed more shared memory than an SM has.

Numerics against `TileScores`: the same formulas in fp32, summed in other orders (pooling, the
score dot, the softmax sum, the threshold's masses), so a query tile whose threshold mass or a
tile's similarity lies within rounding (~1e-6) of top_p or min_similarity may decide differently;
the tests choose thresholds with a margin (`TileScores.nearest_boundary`) and then compare exactly.
At a per-row density, two free tiles whose probabilities lie within rounding of each other at the
count's edge may swap (`TileScores.per_row_margins`); so may two at a top_p's cut, at the same count
(`TileScores.cut_gaps`); exact ties do not.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from sagevideo.kernels.constants import INF_BITS, LOG2E
from sagevideo.kernels.plans import KernelPlan, prep_plan
from sagevideo.kernels.quantize import PooledTiles, quantize_inputs
from sagevideo.kernels.sparse_reference import TileLists
from sagevideo.kernels.tile_select import (
    DENSITY_SLACK,
    MASK_32,
    PROBE_HASH_MUL,
    PROBE_ROWS,
    DynamicSelection,
    mass_from_tile_lse,
    top_columns,
)

INF_BITS_CONST = tl.constexpr(INF_BITS)
LOG2E_CONST = tl.constexpr(LOG2E)
PROBE_HASH_MUL_CONST = tl.constexpr(PROBE_HASH_MUL)
MASK_32_CONST = tl.constexpr(MASK_32)
DENSITY_SLACK_CONST = tl.constexpr(DENSITY_SLACK)
SCORE_M, SCORE_N, SCORE_D = 64, 64, 32  # the scores GEMM's blocks (query tiles, key tiles, channels)
SCORE_WARPS = 4
# The scores GEMM's tl.dot precision: "ieee" (fp32 FMAs) or "tf32x3" (each operand a TF32 part plus
# a TF32 remainder, three tensor-core products summed in fp32: near fp32); plain "tf32" moves the
# probabilities by ~1e-3 (module docstring). The GPU also takes "bf16x3"/"bf16x6"; the interpreter not.
SCORE_PRECISION = "tf32x3"
SELECT_ELEMENTS = 4096  # scores a selection program holds at most (ROWS x T_PAD)
MAX_ROWS = 1
SELECT_WARPS = 4
# Triton's CPU interpreter runs the programs one after another, each row block as one numpy array:
# its cost is per program, so it takes up to 16 rows a program (9x faster there; the lists are the same)
INTERPRETER_MAX_ROWS = 16


@triton.jit
def _forced_tiles(
    rows, cols, q_sim, k_sim, k_spread, probe, useful, min_similarity, max_spread,
    N_Q, LOCAL, SINKS, PREFIX_Q, PREFIX_K, SUFFIX_Q, SUFFIX_K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr,
):
    """bool (ROWS, T_PAD): `tile_select.forced_tiles` of query tiles `rows` against key tiles `cols`,
    the rows (q_sim) and columns (k_sim) of tiles that are not self-similar, the columns of key tiles
    whose spread is above max_spread or that the probe chose (`probe`), and only tiles with a valid
    key (`useful`). PREFIX_*: text
    tiles at the start (0: none); SUFFIX_*: the first text tile at the end (the tile count: none)."""
    forced = (cols[None, :] < SINKS) | (cols[None, :] < PREFIX_K) | (cols[None, :] >= SUFFIX_K)
    forced = forced | ((rows < PREFIX_Q) | (rows >= SUFFIX_Q))[:, None]
    if DIAGONAL:
        first = rows * BLOCK_M
        last = tl.minimum(first + BLOCK_M, N_Q) - 1
        lo = first // BLOCK_N - LOCAL
        hi = last // BLOCK_N + LOCAL
        forced = forced | ((cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None]))
    forced = forced | (q_sim < min_similarity)[:, None]
    forced = forced | ((k_sim < min_similarity) | (k_spread > max_spread) | probe)[None, :]
    return forced & useful[None, :]


@triton.jit
def _narrow(open_rows, below, mid, count, lo, hi, at_or_above_lo, above_hi):
    """One step of the thresholds' bisection on t's bits, for the rows still open: [lo, mid] where
    `below` (the answer is at most mid), else [mid + 1, hi]; `count` (the free tiles above mid) becomes
    the count at the end that moved. A row closes once its interval holds at most one free probability
    (or none: lo = hi). Returns (lo, hi, at_or_above_lo, above_hi, open_rows)."""
    hi = tl.where(open_rows & below, mid, hi)
    above_hi = tl.where(open_rows & below, count, above_hi)
    lo = tl.where(open_rows & ~below, mid + 1, lo)
    at_or_above_lo = tl.where(open_rows & ~below, count, at_or_above_lo)
    open_rows = open_rows & (lo < hi) & (at_or_above_lo - above_hi > 1)
    return lo, hi, at_or_above_lo, above_hi, open_rows


@triton.jit
def _largest_between(probs, free, lo_value, hi):
    """Per row: the largest free probability in [lo_value, hi's value] (-1 where none)."""
    inside = free & (probs >= lo_value[:, None]) & (probs <= hi.to(tl.float32, bitcast=True)[:, None])
    return tl.max(tl.where(inside, probs, -1.0), axis=1)


@triton.jit
def _threshold(probs, free, forced_mass, top_p, ROWS: tl.constexpr):
    """Per row (ROWS,) fp32: the smallest probability value t with G(t) = forced_mass + Σ free probs > t
    below top_p (+inf where none: the forced tiles already reach top_p). A bisection on t's bits that
    stops, as `_count_threshold`, once the bits [lo, hi] still open hold at most one free probability p:
    G is then G(hi) (< top_p) from p on and G(lo) below it, so the answer is lo if G(lo) < top_p, else
    p; G(lo) is summed as every step sums it, so this is the same t as all 31 steps give."""
    lo = tl.zeros((ROWS,), dtype=tl.int32)
    hi = tl.full((ROWS,), INF_BITS_CONST, dtype=tl.int32)
    # while open: G(lo - 1) >= top_p (or lo = 0), G(hi) < top_p; at_or_above_lo = #free >= lo,
    # above_hi = #free > hi
    reachable = forced_mass < top_p
    at_or_above_lo = tl.sum((free & (probs >= 0.0)).to(tl.int32), axis=1)
    above_hi = tl.zeros((ROWS,), dtype=tl.int32)
    open_rows = reachable & (at_or_above_lo - above_hi > 1)
    while tl.max(open_rows.to(tl.int32), axis=0) > 0:
        mid = lo + (hi - lo) // 2
        over = free & (probs > mid.to(tl.float32, bitcast=True)[:, None])
        count = tl.sum(over.to(tl.int32), axis=1)
        below = forced_mass + tl.sum(tl.where(over, probs, 0.0), axis=1) < top_p
        lo, hi, at_or_above_lo, above_hi, open_rows = _narrow(open_rows, below, mid, count, lo, hi, at_or_above_lo,
                                                              above_hi)
    lo_value = lo.to(tl.float32, bitcast=True)
    over_lo = free & (probs > lo_value[:, None])
    mass_lo = forced_mass + tl.sum(tl.where(over_lo, probs, 0.0), axis=1)
    lone = _largest_between(probs, free, lo_value, hi)
    # lo when the interval closed or holds no free probability (G constant on it) or G(lo) < top_p
    settled = (lo < hi) & (at_or_above_lo - above_hi == 1) & (mass_lo >= top_p)
    return tl.where(reachable, tl.where(settled, lone, lo_value), float("inf"))


@triton.jit
def _count_threshold(probs, free, budget, ROWS: tl.constexpr):
    """Per row (ROWS,) fp32: the smallest probability value t with fewer than `budget` (int32 (ROWS,))
    free tiles above it, i.e. the budget-th largest free probability (0 where fewer tiles are free,
    +inf where budget is 0). A bisection on t's bits, as `_threshold`, that stops once the bits [lo, hi]
    still open hold at most one free probability: the answer is then that probability (or lo), the
    same t as all 31 steps give, since the counts at both ends decide it exactly."""
    lo = tl.zeros((ROWS,), dtype=tl.int32)
    hi = tl.full((ROWS,), INF_BITS_CONST, dtype=tl.int32)
    # while open: at_or_above_lo = #free >= lo (>= budget once lo has moved), above_hi = #free > hi
    # (< budget); so the answer lies in [lo, hi]
    at_or_above_lo = tl.sum((free & (probs >= 0.0)).to(tl.int32), axis=1)
    above_hi = tl.zeros((ROWS,), dtype=tl.int32)
    open_rows = (budget > 0) & (at_or_above_lo - above_hi > 1)
    while tl.max(open_rows.to(tl.int32), axis=0) > 0:
        mid = lo + (hi - lo) // 2
        count = tl.sum((free & (probs > mid.to(tl.float32, bitcast=True)[:, None])).to(tl.int32), axis=1)
        lo, hi, at_or_above_lo, above_hi, open_rows = _narrow(open_rows, count < budget, mid, count, lo, hi,
                                                              at_or_above_lo, above_hi)
    lo_value = lo.to(tl.float32, bitcast=True)
    lone = _largest_between(probs, free, lo_value, hi)
    # one free probability left in [lo, hi] with at least budget at or above lo: the count drops below
    # budget exactly at it; otherwise lo (closed, or 0 with fewer than budget free tiles)
    settled = (lo < hi) & (at_or_above_lo - above_hi == 1) & (at_or_above_lo >= budget)
    return tl.where(budget > 0, tl.where(settled, lone, lo_value), float("inf"))


@triton.jit
def _keep_by_count(probs, forced, useful, density, ROWS: tl.constexpr):
    """bool (ROWS, T_PAD): `TileScores.keep_per_row`: the forced tiles, then free tiles (with a valid
    key, not forced) in descending probability, ties to the lower key tile, up to k = max(1,
    ceil(density · valid key tiles · DENSITY_SLACK)) tiles in all (fp32, as `tiles_at_density`).
    probs: any non-negative values in the probabilities' order (the kernel passes them unnormalized)."""
    free = ~forced & useful[None, :]
    valid = tl.sum(useful.to(tl.int32), axis=0).to(tl.float32)
    k = tl.maximum(tl.ceil(density * valid * DENSITY_SLACK_CONST), 1.0).to(tl.int32)
    budget = tl.maximum(k - tl.sum(forced.to(tl.int32), axis=1), 0)
    t = _count_threshold(probs, free, budget, ROWS)
    above = free & (probs > t[:, None])
    is_tied = free & (probs == t[:, None])
    tied = is_tied.to(tl.int32)
    tied_before = tl.cumsum(tied, axis=1) - tied  # ties in key-tile order: the lower ones rank first
    room = budget - tl.sum(above.to(tl.int32), axis=1)
    return forced | above | (is_tied & (tied_before < room[:, None]))


@triton.jit
def _tile_scores_kernel(
    QMean, KMean, KCount, Scores,
    H, H_KV, M_TILES, N_TILES, sm_scale,
    BLOCK_D: tl.constexpr, SCORE_M: tl.constexpr, SCORE_N: tl.constexpr, SCORE_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Scores (bh, M_TILES, N_TILES) fp32 = pooled q · pooled k · sm_scale + log(valid keys) (-inf for
    a key tile without any) of SCORE_M query tiles against SCORE_N key tiles of head bh."""
    bh = tl.program_id(2).to(tl.int64)
    bh_kv = (bh // H) * H_KV + (bh % H) // (H // H_KV)
    rows = tl.program_id(0) * SCORE_M + tl.arange(0, SCORE_M)
    cols = tl.program_id(1) * SCORE_N + tl.arange(0, SCORE_N)
    row_ok = rows < M_TILES
    col_ok = cols < N_TILES
    q_rows = bh * M_TILES + rows
    k_cols = bh_kv * N_TILES + cols
    acc = tl.zeros((SCORE_M, SCORE_N), dtype=tl.float32)
    for d0 in range(0, BLOCK_D, SCORE_D):
        offs_d = d0 + tl.arange(0, SCORE_D)
        q = tl.load(QMean + q_rows[:, None] * BLOCK_D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        k = tl.load(KMean + k_cols[None, :] * BLOCK_D + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        acc += tl.dot(q, k, input_precision=PRECISION)
    count = tl.load(KCount + k_cols, mask=col_ok, other=0.0)
    # a tile with no valid key: log 0 = -inf, probability 0 (the maximum keeps log off 0: no warning)
    log_count = tl.where(count > 0, tl.log(tl.maximum(count, 1.0)), float("-inf"))
    tl.store(Scores + q_rows[:, None] * N_TILES + cols[None, :], acc * sm_scale + log_count[None, :],
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _probe_hash(x):
    """`tile_select.probe_hash` of int64 x."""
    x = ((x >> 16) ^ x) * PROBE_HASH_MUL_CONST & MASK_32_CONST
    x = ((x >> 16) ^ x) * PROBE_HASH_MUL_CONST & MASK_32_CONST
    return (x >> 16) ^ x


@triton.jit
def _probe_lse_kernel(
    Q, K, KeyMask, TileLse,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_mb,
    H, H_KV, N_Q, N_K, N_TILES, scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    """TileLse (bh, N_TILES, ROWS) fp32: for probe row i, hash(i + 1) mod N_Q (`tile_select.probe_rows`), of head bh,
    the natural logsumexp of q · k · sm_scale over key tile `tile`'s valid keys (-inf: none)."""
    tile = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    h_kv = h // (H // H_KV)
    i = tl.arange(0, ROWS).to(tl.int64)
    rows = _probe_hash(i + 1) % N_Q
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + d[None, :], mask=d_ok[None, :],
                other=0.0)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = cols < N_K
    if HAS_MASK:
        valid = valid & (tl.load(KeyMask + b * stride_mb + cols, mask=valid, other=0) != 0)
    k = tl.load(K + b * stride_kb + h_kv * stride_kh + cols[:, None] * stride_kn + d[None, :],
                mask=valid[:, None] & d_ok[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale_log2
    s = tl.where(valid[None, :], s, float("-inf"))
    peak = tl.max(s, axis=1)
    seen = peak > float("-inf")
    total = tl.sum(tl.exp2(s - tl.where(seen, peak, 0.0)[:, None]), axis=1)
    lse = tl.where(seen, (peak + tl.log2(tl.maximum(total, 1.0))) / LOG2E_CONST, float("-inf"))
    tl.store(TileLse + (bh * N_TILES + tile) * ROWS + i, lse)


@triton.jit
def _select_tiles_kernel(
    Scores, QSim, KSim, KSpread, KCount, ProbeColumns, Indices, Counts,
    H, H_KV, M_TILES, N_TILES, N_Q, top_p, min_similarity, max_spread, density,
    LOCAL, SINKS, PREFIX_Q, PREFIX_K, SUFFIX_Q, SUFFIX_K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, T_PAD: tl.constexpr,
    DIAGONAL: tl.constexpr, BY_COUNT: tl.constexpr, HAS_PROBE: tl.constexpr,
):
    """Lists of query tiles group·ROWS .. +ROWS of head bh from their scores (module docstring); the
    free tiles by top_p, or with BY_COUNT by a per-row density (`_keep_by_count`); with HAS_PROBE the
    key tiles ProbeColumns (uint8 (bh, N_TILES), 1 = forced) are forced too.
    Indices int32 (bh, M_TILES, N_TILES): kept key tiles ascending, then -1; Counts int32 (bh, M_TILES)."""
    group = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bh_kv = (bh // H) * H_KV + (bh % H) // (H // H_KV)
    rows = group * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M_TILES
    cols = tl.arange(0, T_PAD)
    col_ok = cols < N_TILES
    q_rows = bh * M_TILES + rows
    k_cols = bh_kv * N_TILES + cols
    scores = tl.load(Scores + q_rows[:, None] * N_TILES + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                     other=float("-inf"))
    count = tl.load(KCount + k_cols, mask=col_ok, other=0.0)
    peak = tl.max(scores, axis=1)
    e = tl.exp(scores - tl.where(peak > float("-inf"), peak, 0.0)[:, None])
    useful = col_ok & (count > 0)
    q_sim = tl.load(QSim + q_rows, mask=row_ok, other=1.0)
    k_sim = tl.load(KSim + k_cols, mask=col_ok, other=1.0)
    k_spread = tl.load(KSpread + k_cols, mask=col_ok, other=1.0)
    if HAS_PROBE:
        probe = tl.load(ProbeColumns + bh * N_TILES + cols, mask=col_ok, other=0) != 0
    else:
        probe = cols < 0
    forced = _forced_tiles(rows, cols, q_sim, k_sim, k_spread, probe, useful, min_similarity, max_spread, N_Q,
                           LOCAL, SINKS, PREFIX_Q, PREFIX_K, SUFFIX_Q, SUFFIX_K, BLOCK_M, BLOCK_N, DIAGONAL)
    if BY_COUNT:
        # a count ranks the tiles only: exp(score - peak) is the probabilities' order without the sum
        # and the division (whose rounding can only merge neighbours, never reorder them)
        kept = _keep_by_count(e, forced, useful, density, ROWS)
    else:
        # the sum is >= 1 where a key tile has a valid key (its peak gives exp(0)); a row without any
        # gets probabilities 0 instead of torch's NaN: neither keeps anything there
        probs = tl.math.div_rn(e, tl.maximum(tl.sum(e, axis=1), 1.0)[:, None])
        free = ~forced & col_ok
        forced_mass = tl.sum(tl.where(forced, probs, 0.0), axis=1)
        t = _threshold(probs, free, forced_mass, top_p, ROWS)
        above = free & (probs > t[:, None])
        mass_above = forced_mass + tl.sum(tl.where(above, probs, 0.0), axis=1)
        is_tied = free & (probs == t[:, None])
        tied = tl.where(is_tied, probs, 0.0)
        tied_before = tl.cumsum(tied, axis=1) - tied  # ties in key-tile order: the lower ones rank first
        kept = above | (is_tied & (mass_above[:, None] + tied_before < top_p)) | forced
        # the reference's first-ranked tile is always kept: without forced tiles, the lowest tile of the
        # highest probability (only top_p = 0 needs this; a probability of 0 is a tie above too)
        top = tl.max(tl.where(free, probs, -1.0), axis=1)
        first = tl.min(tl.where(free & (probs == top[:, None]), cols[None, :], T_PAD), axis=1)
        no_forced = tl.max(forced.to(tl.int32), axis=1) == 0
        kept = kept | ((cols[None, :] == first[:, None]) & no_forced[:, None])
        kept = tl.where(top_p >= 1.0, True, kept) & useful[None, :]

    slot = tl.cumsum(kept.to(tl.int32), axis=1) - 1
    n_kept = tl.sum(kept.to(tl.int32), axis=1)
    lists = Indices + q_rows[:, None] * N_TILES
    live = row_ok[:, None] & col_ok[None, :]
    padding = tl.full((ROWS, T_PAD), -1, dtype=tl.int32)
    tl.store(lists + cols[None, :], padding, mask=live & (cols[None, :] >= n_kept[:, None]))
    tl.store(lists + slot, cols[None, :] + tl.zeros((ROWS, T_PAD), dtype=tl.int32), mask=live & kept)
    tl.store(Counts + q_rows, n_kept, mask=row_ok)


def probe_columns(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None, *, columns: int, block_n: int,
                  sm_scale: float) -> torch.Tensor:
    """uint8 (B, H, ceil(Nk/block_n)), 1 = forced: per head the `columns` key tiles of most exact mass
    over the probe rows (`tile_select.probe_mass`, `top_columns`) of q (B, H, Nq, D) against k (B, H_kv,
    Nk, D) (16-bit, unit head-dim stride; key_mask (B', Nk) uint8). One launch and a few tensor ops."""
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    n_tiles = math.ceil(n_k / block_n)
    tile_lse = torch.empty(batch * heads, n_tiles, PROBE_ROWS, device=q.device, dtype=torch.float32)
    mask = key_mask if key_mask is not None else q  # any pointer: HAS_MASK is off
    wrap_triton(_probe_lse_kernel)[(n_tiles, batch * heads)](
        q, k, mask, tile_lse, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        0 if key_mask is None or key_mask.shape[0] == 1 else key_mask.stride(0),
        heads, k.shape[1], n_q, n_k, n_tiles, sm_scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(max(head_dim, 16)), BLOCK_N=block_n, ROWS=PROBE_ROWS,
        HAS_MASK=key_mask is not None, num_warps=4,
    )
    mass = mass_from_tile_lse(tile_lse.transpose(-1, -2))
    return top_columns(mass, columns).to(torch.uint8).view(batch, heads, n_tiles)


def selection_probe(q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None, selection: DynamicSelection,
                    *, block_n: int, sm_scale: float) -> torch.Tensor | None:
    """`probe_columns` where `selection` probes, else None (what `select_lists` takes as `probe`)."""
    if not selection.probe_columns:
        return None
    return probe_columns(q, k, key_mask, columns=selection.probe_columns, block_n=block_n, sm_scale=sm_scale)


def select_lists(
    pooled: PooledTiles,
    selection: DynamicSelection,
    *,
    batch: int,
    heads: int,
    kv_heads: int,
    n_q: int,
    n_k: int,
    block_m: int,
    block_n: int,
    sm_scale: float,
    probe: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selection's lists from pooled statistics in (block_m, block_n) tiles (`PooledTiles` of
    q (B, H, Nq, ·) and k (B, H_kv, Nk, ·)) and, where the selection probes, its forced columns
    (`probe_columns`): (key tiles int32 (B, H, M_TILES, N_TILES), ascending then -1; counts int32
    (B, H, M_TILES)), what `attention_fwd` takes. Two launches, no host read."""
    selection.check_tokens(n_q, n_k)
    if (probe is not None) != (selection.probe_columns > 0):
        raise ValueError(f"tile selection: probe_columns={selection.probe_columns} needs the probe's columns "
                         "(`probe_columns`), and only it takes them")
    m_tiles, n_tiles = math.ceil(n_q / block_m), math.ceil(n_k / block_n)
    block_d = pooled.q_mean.shape[-1]
    dev = pooled.q_mean.device
    scores = torch.empty(batch * heads, m_tiles, n_tiles, device=dev, dtype=torch.float32)
    wrap_triton(_tile_scores_kernel)[(triton.cdiv(m_tiles, SCORE_M), triton.cdiv(n_tiles, SCORE_N), batch * heads)](
        pooled.q_mean, pooled.k_mean, pooled.k_count, scores, heads, kv_heads, m_tiles, n_tiles, sm_scale,
        BLOCK_D=block_d, SCORE_M=SCORE_M, SCORE_N=SCORE_N, SCORE_D=min(SCORE_D, block_d), PRECISION=SCORE_PRECISION,
        num_warps=SCORE_WARPS,
    )
    indices = torch.empty(batch, heads, m_tiles, n_tiles, device=dev, dtype=torch.int32)
    counts = torch.empty(batch, heads, m_tiles, device=dev, dtype=torch.int32)
    t_pad = triton.next_power_of_2(n_tiles)
    max_rows = MAX_ROWS if dev.type == "cuda" else INTERPRETER_MAX_ROWS
    rows = max(1, min(max_rows, SELECT_ELEMENTS // t_pad))
    prefix, suffix = selection.dense_prefix, selection.dense_suffix
    wrap_triton(_select_tiles_kernel)[(triton.cdiv(m_tiles, rows), batch * heads)](
        scores, pooled.q_similarity, pooled.k_similarity, pooled.k_spread, pooled.k_count,
        pooled.k_count if probe is None else probe, indices, counts,
        heads, kv_heads, m_tiles, n_tiles, n_q, selection.top_p, selection.min_similarity, selection.max_spread,
        float(selection.density or 1.0), selection.local_tiles, selection.sink_tiles,
        math.ceil(prefix / block_m), math.ceil(prefix / block_n),
        (n_q - suffix) // block_m if suffix else m_tiles, (n_k - suffix) // block_n if suffix else n_tiles,
        BLOCK_M=block_m, BLOCK_N=block_n, ROWS=rows, T_PAD=t_pad, DIAGONAL=n_q == n_k, BY_COUNT=selection.per_row,
        HAS_PROBE=probe is not None, num_warps=SELECT_WARPS,
    )
    return indices, counts


def select_tiles(
    q: torch.Tensor,
    k: torch.Tensor,
    plan: KernelPlan,
    selection: DynamicSelection,
    *,
    sm_scale: float,
    key_mask: torch.Tensor | None = None,
) -> TileLists:
    """The dynamic selection of q (B, H, Nq, D) against k (B, H_kv, Nk, D) (unit head-dim stride;
    key_mask (B', Nk) uint8) in `plan`'s tiles, on the device, as `TileLists` of width ceil(Nk/block_n)
    (not read back). This runs the whole preparation for its pooled statistics and drops the codes;
    a call that also attends selects inside its own preparation instead (`op.sageattn_fwd_select`)."""
    pooled, probe = selection_inputs(q, k, plan, selection, sm_scale=sm_scale, key_mask=key_mask)
    batch, heads, n_q, _ = q.shape
    n_k = k.shape[2]
    indices, counts = select_lists(pooled, selection, batch=batch, heads=heads, kv_heads=k.shape[1],
                                   n_q=n_q, n_k=n_k, block_m=plan.block_m, block_n=plan.block_n, sm_scale=sm_scale,
                                   probe=probe)
    return TileLists.from_device(indices, counts, plan.block_m, plan.block_n, n_q, n_k)


def selection_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    plan: KernelPlan,
    selection: DynamicSelection,
    *,
    sm_scale: float,
    key_mask: torch.Tensor | None = None,
) -> tuple[PooledTiles, torch.Tensor | None]:
    """What `select_lists` takes for q and k (as `select_tiles`): the pooled statistics of the
    preparation in `plan`'s tiles, and the probe's forced columns where the selection probes."""
    # the 16-bit-PV preparation (no FP8 V pass; V's range is taken of k and dropped) with the plan's own
    # launch shape: its K/V-stats split sets mean(K)'s last bits, so the pooled K is the attending call's
    prep_for = dataclasses.replace(plan, pv="fp16", kernel="triton")
    prepared = quantize_inputs(q, k, k, key_mask, None, prep_for, sm_scale=sm_scale, per_token=False, smooth_k=True,
                               need_shift=False, pool=True, pool_spread=selection.uses_spread, prep=prep_plan(plan))
    probe = selection_probe(q, k, key_mask, selection, block_n=plan.block_n, sm_scale=sm_scale)
    return prepared.pooled, probe
