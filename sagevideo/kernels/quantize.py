"""Triton kernels that prepare attention inputs: K smoothing, INT8 K, FP8 V, INT8 Q; and their launcher.

Four launches before the attention kernel:
1. `_kv_stats_kernel`, grid (B·H, splits): partial sums of K and partial min and max of V per
   channel over valid keys, in short token splits so that the pass spreads over the whole GPU.
2. `_kv_stats_finalize_kernel`, grid (B·H,): reduces the partials into mean(K), mean(K)·R,
   V's per-channel range (the attention kernels clamp their output to it: `bounds.py`) and
   V's per-channel FP8 scale, once per head (not once per tile: at 75k tokens there are 37
   splits and 1,172 tiles per head).
3. `_quantize_kv_kernel`, grid (tile groups, B·H): subtracts mean(K), optionally rotates,
   quantizes each BLOCK_N tile of K to INT8 and (FP8 mode) writes V as e4m3 transposed to
   (D, N), the layout Hopper's FP8 tensor-core instruction wants for the PV product, with each
   32-key group in `mma_key_order`. Each program does TILES_PER_PROGRAM tiles (the rotation
   matrix and per-head vectors loaded once).
4. `_quantize_q_kernel`, grid (Nq tile groups, B·H), through `_quantize_q_tile`: optionally
   rotates, quantizes each BLOCK_M tile (or token) to INT8 with sm_scale·log2(e) folded into the
   scale, and (LSE mode)
   stores sm_scale·q·mean(K), the smoothing shift that turns the kernel's LSE into the true one.
   Quantizing Q inside the attention kernel instead (one pass less) was measured and rejected:
   the prologue's extra shared memory and registers cost the main loop 5-20% (docs/benchmarks-history.md,
   "the preparation pass").

Block-sparse tile selection (`POOL`, off for dense calls: their launches are unchanged): steps 3
and 4 also write each tile's pooled statistics (`PooledTiles`: K's by `_pool_tile`, Q's by
`_pool_tile_gram`) from the tile they already hold in registers, for `tile_select_kernel`
(docs/sparse.md, stage 3).

Launch shapes (warps, splits, tiles per program) come from a `plans.PrepPlan`, never from module state.

Numerics are documented in `reference.py`, which emulates them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from sagevideo.kernels.constants import (
    COSINE_EPS,
    FP8_MAX,
    INF_BITS,
    INT8_MAX,
    LOG2E,
    NAN_BITS,
    ROUNDING_MAGIC,
    TINY_AMAX,
)
from sagevideo.kernels.plans import KernelPlan, PrepPlan, prep_plan

ROUNDING_MAGIC_CONST = tl.constexpr(ROUNDING_MAGIC)
NAN_BITS_CONST = tl.constexpr(NAN_BITS)
INF_BITS_CONST = tl.constexpr(INF_BITS)
TINY_AMAX_CONST = tl.constexpr(TINY_AMAX)
INT8_MAX_CONST = tl.constexpr(INT8_MAX)
FP8_MAX_CONST = tl.constexpr(FP8_MAX)
COSINE_EPS_CONST = tl.constexpr(COSINE_EPS)


@triton.jit
def _abs_max_bits(x, axis: tl.constexpr):
    """max|x| along `axis` (None: the whole tile) as fp32, NaN when any element is NaN or ±inf.
    The max runs on the bit patterns of |x| (ordered like the values, NaN above inf): one integer
    reduction that keeps a NaN, where tl.max on floats skips it."""
    bits = tl.abs(x).to(tl.int32, bitcast=True)
    if axis is None:
        top = tl.max(tl.max(bits, axis=1), axis=0)
    else:
        top = tl.max(bits, axis=axis)
    return tl.where(top >= INF_BITS_CONST, NAN_BITS_CONST, top).to(tl.float32, bitcast=True)


@triton.jit
def _finite_rows_abs_max_bits(x):
    """(max|x| over the tile's rows that are all finite, as fp32; per row: True where the row holds a
    NaN or ±inf)."""
    bits = tl.abs(x).to(tl.int32, bitcast=True)
    row_bad = tl.max(bits, axis=1) >= INF_BITS_CONST
    top = tl.max(tl.max(tl.where(row_bad[:, None], 0, bits), axis=1), axis=0)
    return top.to(tl.float32, bitcast=True), row_bad


@triton.jit
def _quantize_int8(x, scale_factor, PER_TOKEN: tl.constexpr, ROW_LOCAL_NONFINITE: tl.constexpr = False):
    """Symmetric INT8 codes of a (ROWS, D) fp32 tile and per-row scales (ROWS,) fp32, one per row
    (PER_TOKEN) or the tile's repeated. codes = round-half-even(x · 127/max|x|), the product
    rounded once (fused into the rounding add); scale = max|x| · scale_factor / 127, or 1 for an
    all-zero group; NaN when the group holds a NaN or inf, so non-finite inputs give NaN outputs;
    max|x| floored at TINY_AMAX so that 127/max|x| stays finite.
    ROW_LOCAL_NONFINITE (Q tiles): a row holding a NaN or inf gets a NaN scale alone and the tile's
    scale comes from its other rows, so the NaN reaches only that row's output, as in SDPA."""
    if ROW_LOCAL_NONFINITE and not PER_TOKEN:
        amax, row_bad = _finite_rows_abs_max_bits(x)
    else:
        amax = _abs_max_bits(x, 1 if PER_TOKEN else None)
    zero = amax == 0
    # below TINY_AMAX, 127/max would overflow to inf (constants.TINY_AMAX); NaN stays NaN
    amax = tl.maximum(amax, TINY_AMAX_CONST, propagate_nan=tl.PropagateNan.ALL)
    inv = tl.where(zero, 1.0, tl.math.div_rn(INT8_MAX_CONST, amax))
    scale = tl.where(zero, 1.0, tl.math.div_rn(amax * scale_factor, INT8_MAX_CONST))
    if PER_TOKEN:
        inv = inv[:, None]
    else:
        scale = tl.zeros((x.shape[0],), dtype=tl.float32) + scale
        if ROW_LOCAL_NONFINITE:
            scale = tl.where(row_bad, float("nan"), scale)
    codes = (x * inv + ROUNDING_MAGIC_CONST).to(tl.int32, bitcast=True).to(tl.int8)
    return codes, scale


@triton.jit
def mma_key_order(x):
    """(R, N) -> (R, N), N a multiple of 32: within each 32-key group, column 16·a1 + 8·a0 + 2·c + b
    moves to 16·a1 + 4·c + 2·a0 + b (a1, a0, b in {0, 1}, c in 0..3).

    Why: in the tensor cores' accumulator layout a thread holds keys 8·a + 2·c + b of a score tile
    (c: its lane within a quad); as the 8-bit MMA's A operand it must hold keys 4·c .. 4·c+3 and
    16+4·c .. 19+4·c. With P's keys in this order the accumulator -> operand conversion is a
    renaming of each thread's own registers instead of lane shuffles and byte permutes. Vᵀ is
    stored with its keys in the same order (`QuantizedInputs.v_fp8_t`), so P·V is unchanged:
    the same products, summed in another order inside the MMA. (`attention_sm90._mma_key_order`
    is the Gluon twin.)"""
    R: tl.constexpr = x.shape[0]
    N: tl.constexpr = x.shape[1]
    x = tl.reshape(x, (R, N // 32, 2, 2, 4, 2))
    x = tl.permute(x, (0, 1, 2, 4, 3, 5))
    return tl.reshape(x, (R, N))


@triton.jit
def _pool_tile(x, ok, SPREAD: tl.constexpr):
    """`tile_select._pool_tiles` of one tile held in registers: x (ROWS, BLOCK_D) fp32, ok (ROWS,)
    its valid rows. Returns (mean over valid rows (BLOCK_D,), valid count, mean cosine of the valid
    rows to the mean, spread: the largest distance of a valid row from the mean over the mean
    distance (SPREAD, else 1); 1 and 1 for a tile with no valid row). torch's cosine divides each
    vector by its clamped norm before the dot; here the dot is divided once per row by the product
    of the clamped norms: the same formula, rounded differently (an ulp or so)."""
    x = tl.where(ok[:, None], x, 0.0)
    count = tl.sum(ok.to(tl.float32), axis=0)
    denom = tl.maximum(count, 1.0)
    mean = tl.math.div_rn(tl.sum(x, axis=0), denom)
    x_norm = tl.maximum(tl.sqrt_rn(tl.sum(x * x, axis=1)), COSINE_EPS_CONST)
    m_norm = tl.maximum(tl.sqrt_rn(tl.sum(mean * mean, axis=0)), COSINE_EPS_CONST)
    cos = tl.math.div_rn(tl.sum(x * mean[None, :], axis=1), x_norm * m_norm)
    similarity = tl.math.div_rn(tl.sum(tl.where(ok, cos, 0.0), axis=0), denom)
    spread = 1.0
    if SPREAD:
        # from the differences themselves, not |x|² - 2x·m + |m|², which cancels in tight tiles
        off = tl.where(ok[:, None], x - mean[None, :], 0.0)
        distance = tl.sqrt_rn(tl.sum(off * off, axis=1))
        mean_distance = tl.math.div_rn(tl.sum(distance, axis=0), denom)
        spread = tl.where((count > 0) & (mean_distance > 0),
                          tl.math.div_rn(tl.max(distance, axis=0), tl.maximum(mean_distance, COSINE_EPS_CONST)), 1.0)
    return mean, count, tl.where(count > 0, similarity, 1.0), spread


@triton.jit
def _pool_tile_gram(x16, ok):
    """`_pool_tile` (no spread) of a 16-bit tile x16 (ROWS, BLOCK_D) whose rows that are not `ok` are
    zero, with its sums on the tensor cores: the column sum as a product with a one-hot ones row, and
    every row's dot with the column sum and its squared norm from the Gram matrix x16·x16ᵀ (exact
    16-bit products, fp32 sums): the same formula as `_pool_tile`, summed in another order, in fewer
    instructions than elementwise sums across warps (docs/sparse.md). Returns (mean, count, similarity)."""
    ROWS: tl.constexpr = x16.shape[0]
    count = tl.sum(ok.to(tl.float32), axis=0)
    denom = tl.maximum(count, 1.0)
    pick = tl.arange(0, 16)
    # a product needs 16 rows: one of ones, the others zero, so summing the 16 is the column sum itself
    ones = tl.where(pick[:, None] == 0, 1.0, 0.0) + tl.zeros((16, ROWS), tl.float32)
    column_sum = tl.sum(tl.dot(ones.to(x16.dtype), x16, out_dtype=tl.float32), axis=0)
    mean = tl.math.div_rn(column_sum, denom)
    gram = tl.dot(x16, tl.trans(x16), out_dtype=tl.float32)
    rows = tl.arange(0, ROWS)
    dot_sum = tl.sum(gram, axis=1)  # x_i · Σ_j x_j
    norm2 = tl.sum(tl.where(rows[:, None] == rows[None, :], gram, 0.0), axis=1)
    x_norm = tl.maximum(tl.sqrt_rn(norm2), COSINE_EPS_CONST)
    # |Σ x|² summed from the rows' dots can round below 0 when the sum is near 0: no sqrt of a negative
    m_norm = tl.maximum(tl.math.div_rn(tl.sqrt_rn(tl.maximum(tl.sum(dot_sum, axis=0), 0.0)), denom),
                        COSINE_EPS_CONST)
    cos = tl.math.div_rn(dot_sum, x_norm * (m_norm * denom))
    similarity = tl.math.div_rn(tl.sum(tl.where(ok, cos, 0.0), axis=0), denom)
    return mean, count, tl.where(count > 0, similarity, 1.0)


@triton.jit
def _kv_stats_kernel(
    K, V, Mask, KSum, KCount, VLo, VHi,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_mb,
    H, N_K, TOKENS_PER_SPLIT, NUM_SPLITS,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
    HAS_MASK: tl.constexpr, SMOOTH_K: tl.constexpr,
):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh.to(tl.int64) // H  # int64 bases: B·H·N·D may pass 2^31
    h = bh.to(tl.int64) % H
    k_head = K + b * stride_kb + h * stride_kh
    v_head = V + b * stride_vb + h * stride_vh
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    # Accumulate element-wise and reduce over rows once at the end: a cross-warp reduction per
    # chunk stalled the loads. V's min and max are exact (16-bit values held in fp32); a NaN in V
    # drops out of them (its output channel is NaN whatever the range).
    k_acc = tl.zeros((CHUNK, BLOCK_D), dtype=tl.float32)
    v_lo = tl.full((CHUNK, BLOCK_D), float("inf"), dtype=tl.float32)
    v_hi = tl.full((CHUNK, BLOCK_D), float("-inf"), dtype=tl.float32)
    count = tl.zeros((CHUNK,), dtype=tl.float32)
    start = split * TOKENS_PER_SPLIT
    end = tl.minimum(start + TOKENS_PER_SPLIT, N_K)
    offs_c = tl.arange(0, CHUNK)
    for off in range(start, end, CHUNK):
        offs_n = off + offs_c
        ok = offs_n < end
        if HAS_MASK:
            ok = ok & (tl.load(Mask + b * stride_mb + offs_n, mask=ok, other=0) != 0)
        count += ok.to(tl.float32)
        tile_ok = ok[:, None] & d_ok[None, :]
        row = tl.cast(off, tl.int64)  # the chunk's first token in int64 (the token stride may be H·D)
        if SMOOTH_K:
            k = tl.load(k_head + row * stride_kn + offs_c[:, None] * stride_kn + offs_d[None, :],
                        mask=tile_ok, other=0.0)
            k_acc += k.to(tl.float32)
        v = tl.load(v_head + row * stride_vn + offs_c[:, None] * stride_vn + offs_d[None, :],
                    mask=tile_ok, other=0.0)
        v = v.to(tl.float32)
        v_lo = tl.minimum(v_lo, tl.where(tile_ok, v, float("inf")))
        v_hi = tl.maximum(v_hi, tl.where(tile_ok, v, float("-inf")))
    k_sum = tl.sum(k_acc, axis=0)
    row = bh.to(tl.int64) * NUM_SPLITS + split
    tl.store(KSum + row * BLOCK_D + offs_d, k_sum)
    tl.store(VLo + row * BLOCK_D + offs_d, tl.min(v_lo, axis=0))
    tl.store(VHi + row * BLOCK_D + offs_d, tl.max(v_hi, axis=0))
    tl.store(KCount + row, tl.sum(count, axis=0))


@triton.jit
def _kv_stats_finalize_kernel(
    KSum, KCount, VLo, VHi, Rot, KMean, KMeanRot, VRange, VScale,
    NUM_SPLITS,
    BLOCK_D: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
    SMOOTH_K: tl.constexpr, ROTATE: tl.constexpr, FP8_V: tl.constexpr,
):
    """Per head: mean(K) over valid keys (0 for no key), mean(K)·R, V's range per channel over
    valid keys (VRange (bh, 2, BLOCK_D): min then max; +inf, -inf for no key) and V's scale
    max|V|/448 per channel (1 for an all-zero channel). The partials are added in split order."""
    bh = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    k_sum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    v_lo = tl.full((BLOCK_D,), float("inf"), dtype=tl.float32)
    v_hi = tl.full((BLOCK_D,), float("-inf"), dtype=tl.float32)
    count = tl.zeros((SPLIT_CHUNK,), dtype=tl.float32)
    for s0 in range(0, NUM_SPLITS, SPLIT_CHUNK):
        offs_s = s0 + tl.arange(0, SPLIT_CHUNK)
        s_ok = offs_s < NUM_SPLITS
        rows = bh * NUM_SPLITS + offs_s
        count += tl.load(KCount + rows, mask=s_ok, other=0.0)
        if SMOOTH_K:
            part = tl.load(KSum + rows[:, None] * BLOCK_D + offs_d[None, :], mask=s_ok[:, None], other=0.0)
            k_sum += tl.sum(part, axis=0)
        part = tl.load(VLo + rows[:, None] * BLOCK_D + offs_d[None, :], mask=s_ok[:, None], other=float("inf"))
        v_lo = tl.minimum(v_lo, tl.min(part, axis=0))
        part = tl.load(VHi + rows[:, None] * BLOCK_D + offs_d[None, :], mask=s_ok[:, None], other=float("-inf"))
        v_hi = tl.maximum(v_hi, tl.max(part, axis=0))
    if SMOOTH_K:
        mean = tl.math.div_rn(k_sum, tl.maximum(tl.sum(count, axis=0), 1.0))
        tl.store(KMean + bh * BLOCK_D + offs_d, mean)
        if ROTATE:
            rot = tl.load(Rot + offs_d[:, None] * BLOCK_D + offs_d[None, :]).to(tl.float32)
            tl.store(KMeanRot + bh * BLOCK_D + offs_d, tl.sum(mean[:, None] * rot, axis=0))
    tl.store(VRange + bh * 2 * BLOCK_D + offs_d, v_lo)
    tl.store(VRange + bh * 2 * BLOCK_D + BLOCK_D + offs_d, v_hi)
    if FP8_V:
        v_max = tl.maximum(-v_lo, v_hi)  # max|V|; -inf for a head with no valid key
        v_max_floored = tl.maximum(v_max, TINY_AMAX_CONST)  # 1/scale stays finite (constants.TINY_AMAX)
        tl.store(VScale + bh * BLOCK_D + offs_d, tl.where(v_max > 0, tl.math.div_rn(v_max_floored, FP8_MAX_CONST), 1.0))


@triton.jit
def _quantize_kv_kernel(
    K, V, Mask, KMean, KMeanRot, VScale, Rot,
    KQ, KScale, VQ, KScaleMax,
    PoolShift, KPoolMean, KPoolSim, KPoolCount, KPoolSpread,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_mb,
    H, N_K, N_PAD,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, TILES_PER_PROGRAM: tl.constexpr,
    HAS_MASK: tl.constexpr, SMOOTH_K: tl.constexpr, ROTATE: tl.constexpr,
    PER_TOKEN: tl.constexpr, FP8_V: tl.constexpr, TRACK_MAX: tl.constexpr, POOL: tl.constexpr = False,
    POOL_SPREAD: tl.constexpr = False,
):
    """TRACK_MAX: also raise KScaleMax[head] (int32 bits of a non-negative fp32, zero-initialised) to
    the largest K scale of the head (NaN counts as 0), for the attention kernel's scores-by-add guard.
    POOL: also write each tile's `_pool_tile` statistics of K − PoolShift (mean(K) over valid keys,
    before any rotation) to KPoolMean (bh, N_PAD/BLOCK_N, BLOCK_D), KPoolSim, KPoolCount and
    KPoolSpread (bh, N_PAD/BLOCK_N), fp32; the spread only with POOL_SPREAD (it costs registers), else 1."""
    group = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64 bases: B·H·N·D may pass 2^31
    b = bh // H
    h = bh % H
    k_head = K + b * stride_kb + h * stride_kh
    v_head = V + b * stride_vb + h * stride_vh
    offs_d = tl.arange(0, BLOCK_D)
    offs_t = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    if ROTATE:
        rot = tl.load(Rot + offs_d[:, None] * BLOCK_D + offs_d[None, :])
    if SMOOTH_K:
        if ROTATE:
            shift = tl.load(KMeanRot + bh * BLOCK_D + offs_d)
        else:
            shift = tl.load(KMean + bh * BLOCK_D + offs_d)
    if FP8_V:
        # multiply by the reciprocal (one rounding, like the reference): a division per element
        # would be a third of this kernel's instructions
        v_inv = tl.math.div_rn(1.0, tl.load(VScale + bh * BLOCK_D + offs_d))
    if POOL:
        pool_shift = tl.load(PoolShift + bh * BLOCK_D + offs_d)
    for t in range(0, TILES_PER_PROGRAM):
        start_n = (group * TILES_PER_PROGRAM + t) * BLOCK_N
        if start_n < N_PAD:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            ok = offs_n < N_K
            if HAS_MASK:
                ok = ok & (tl.load(Mask + b * stride_mb + offs_n, mask=offs_n < N_K, other=0) != 0)
            tile_ok = ok[:, None] & d_ok[None, :]
            # Both loads first: one program per SM fits at d128 (the rotation's registers), so
            # the V load must be in flight while K is waited for, not issued after K's stores.
            row = start_n.to(tl.int64)  # the tile's first token in int64 (the token stride may be H·D)
            k16 = tl.load(k_head + row * stride_kn + offs_t[:, None] * stride_kn + offs_d[None, :],
                          mask=tile_ok, other=0.0)
            if FP8_V:
                v = tl.load(v_head + row * stride_vn + offs_t[:, None] * stride_vn + offs_d[None, :],
                            mask=tile_ok, other=0.0)
                v8 = (v.to(tl.float32) * v_inv[None, :]).to(tl.float8e4nv)
                # VQ is (B·H, BLOCK_D, N_PAD). Transpose the tile first so the store runs along N
                # (contiguous): storing the (N, D) tile at stride N_PAD wrote single bytes and cost
                # as much as all the other preparation work together.
                # Keys in the MMA operand's order (`mma_key_order`): both attention kernels reorder P
                # the same way, which makes P's conversion into the MMA operand free.
                v8_t = mma_key_order(tl.trans(v8))
                tl.store(VQ + bh * BLOCK_D * N_PAD + offs_d[:, None] * N_PAD + offs_n[None, :], v8_t)
            if POOL:
                # the tile as the selection pools it: smoothed, not rotated, padded keys left out
                pooled, count, similarity, spread = _pool_tile(k16.to(tl.float32) - pool_shift[None, :], ok,
                                                               POOL_SPREAD)
                tile = bh * (N_PAD // BLOCK_N) + start_n // BLOCK_N
                tl.store(KPoolMean + tile * BLOCK_D + offs_d, pooled)
                tl.store(KPoolSim + tile, similarity)
                tl.store(KPoolCount + tile, count)
                tl.store(KPoolSpread + tile, spread)
            if ROTATE:
                # (K − mean)·R = K·R − mean·R: rotate the 16-bit K on the tensor cores (±1 entries,
                # so the products are exact and the fp32 sums match an fp32 rotation).
                k = tl.dot(k16, rot.to(k16.dtype), out_dtype=tl.float32)
            else:
                k = k16.to(tl.float32)
            if SMOOTH_K:
                k = k - shift[None, :]
            if HAS_MASK or start_n + BLOCK_N > N_K:
                k = tl.where(ok[:, None], k, 0.0)  # masked keys: zero (after rotation every channel is live)
            codes, scale = _quantize_int8(k, 1.0, PER_TOKEN)
            # Buffers are padded to N_PAD (a multiple of BLOCK_N) and written in full, tails as
            # zeros, so the attention kernel loads whole tiles without masks.
            tl.store(KQ + bh * N_PAD * BLOCK_D + offs_n[:, None] * BLOCK_D + offs_d[None, :], codes)
            tl.store(KScale + bh * N_PAD + offs_n, scale)
            if TRACK_MAX:
                finite = tl.where(scale == scale, scale, 0.0)
                tl.atomic_max(KScaleMax + bh, tl.max(finite, axis=0).to(tl.int32, bitcast=True))


@triton.jit
def _quantize_q_tile(
    Q, mean, rot, b, h, start_m, offs_d,
    stride_qb, stride_qh, stride_qn,
    N_Q, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, ROTATE: tl.constexpr, PER_TOKEN: tl.constexpr,
    NEED_SHIFT: tl.constexpr,
):
    """INT8 codes (BLOCK_M, BLOCK_D), scales (BLOCK_M,) of one Q tile, in log2 score units
    (sm_scale·log2(e) folded in, and 1/BLOCK_D when rotated: R Rᵀ = BLOCK_D·I); rows past N_Q are
    zero. mean (BLOCK_D,) mean(K) when NEED_SHIFT; rot (BLOCK_D, BLOCK_D) when ROTATE.
    shift (BLOCK_M,): sm_scale·q·mean(K) when NEED_SHIFT (LSE), else zeros. Also returns the tile
    as loaded (16-bit, rows past N_Q zero), which the caller pools when selecting tiles."""
    rows = tl.arange(0, BLOCK_M)
    m_ok = start_m + rows < N_Q
    # the tile's first row in int64 (the token stride may be H·D); offsets within the tile in int32
    q_tile = Q + b * stride_qb + h * stride_qh + start_m.to(tl.int64) * stride_qn
    q16 = tl.load(q_tile + rows[:, None] * stride_qn + offs_d[None, :],
                  mask=m_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if NEED_SHIFT:
        shift = tl.sum(q16.to(tl.float32) * mean[None, :], axis=1) * sm_scale
    else:
        shift = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if ROTATE:
        # ±1 rotation of 16-bit Q on the tensor cores: exact products, fp32 sums.
        q = tl.dot(q16, rot.to(q16.dtype), out_dtype=tl.float32)
    else:
        q = q16.to(tl.float32)
    # qk_scale goes into the scale, not into each element (the codes of q and q·qk_scale are the
    # same up to rounding); fp32 even when a compiler passes the scalar as fp64
    codes, scale = _quantize_int8(q, tl.cast(qk_scale, tl.float32), PER_TOKEN, ROW_LOCAL_NONFINITE=True)
    return codes, scale, shift.to(tl.float32), q16


@triton.jit
def _quantize_q_kernel(
    Q, KMean, Rot, QQ, QScale, QShift, QPoolMean, QPoolSim,
    stride_qb, stride_qh, stride_qn,
    H, H_KV, N_Q, M_PAD, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, TILES_PER_PROGRAM: tl.constexpr,
    ROTATE: tl.constexpr, PER_TOKEN: tl.constexpr, STORE_SHIFT: tl.constexpr, POOL: tl.constexpr = False,
):
    """H_KV: K/V heads (mean(K) of query head h is K/V head h // (H // H_KV)'s).
    POOL: also write each tile's `_pool_tile_gram` statistics of Q (as given: not rotated, not scaled) to
    QPoolMean (bh, M_PAD/BLOCK_M, BLOCK_D) and QPoolSim (bh, M_PAD/BLOCK_M), fp32."""
    group = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64 bases: B·H·N·D may pass 2^31
    offs_d = tl.arange(0, BLOCK_D)
    # loaded once per program: the 32 KB rotation is twice a 64-row d128 Q tile
    rot = tl.load(Rot + offs_d[:, None] * BLOCK_D + offs_d[None, :]) if ROTATE else None
    bh_kv = (bh // H) * H_KV + (bh % H) // (H // H_KV)
    mean = tl.load(KMean + bh_kv * BLOCK_D + offs_d) if STORE_SHIFT else None
    for t in range(0, TILES_PER_PROGRAM):
        start_m = (group * TILES_PER_PROGRAM + t) * BLOCK_M
        offs_m = start_m + tl.arange(0, BLOCK_M)
        codes, scale, shift, q16 = _quantize_q_tile(
            Q, mean, rot, bh // H, bh % H, start_m, offs_d, stride_qb, stride_qh, stride_qn,
            N_Q, qk_scale, sm_scale, HEAD_DIM, BLOCK_M, ROTATE, PER_TOKEN, STORE_SHIFT,
        )
        in_pad = offs_m < M_PAD  # the last program's tiles may run past the padded buffer
        tl.store(QQ + bh * M_PAD * BLOCK_D + offs_m[:, None] * BLOCK_D + offs_d[None, :], codes, mask=in_pad[:, None])
        tl.store(QScale + bh * M_PAD + offs_m, scale, mask=in_pad)
        if STORE_SHIFT:
            tl.store(QShift + bh * M_PAD + offs_m, shift, mask=in_pad)
        if POOL:
            if start_m < M_PAD:
                pooled, _, similarity = _pool_tile_gram(q16, offs_m < N_Q)
                tile = bh * (M_PAD // BLOCK_M) + start_m // BLOCK_M
                tl.store(QPoolMean + tile * BLOCK_D + offs_d, pooled)
                tl.store(QPoolSim + tile, similarity)


@dataclass
class PooledTiles:
    """Per-tile statistics of Q and K for the tile selection (`tile_select_kernel`), as
    `tile_select.TileScores` pools them: Q as given, K minus its mean over valid keys, neither rotated.

    q_mean (bh, M_TILES, block_d) fp32: each query tile's mean token (over its tokens before Nq);
    q_similarity (bh, M_TILES) fp32: mean cosine of those tokens to it;
    k_mean (bh_kv, N_TILES, block_d), k_similarity (bh_kv, N_TILES) fp32: the same over valid keys;
    k_count (bh_kv, N_TILES) fp32: valid keys per tile (a tile with none: mean 0, similarity 1);
    k_spread (bh_kv, N_TILES) fp32: a key tile's largest distance from its mean over the mean distance.
    Channels past the head dim are 0."""

    q_mean: torch.Tensor
    q_similarity: torch.Tensor
    k_mean: torch.Tensor
    k_similarity: torch.Tensor
    k_count: torch.Tensor
    k_spread: torch.Tensor


@dataclass
class QuantizedInputs:
    """Kernel-ready tensors, padded to whole tiles; `bh` = B·H query heads, `bh_kv` = B·H_KV K/V
    heads (H_KV = H but for grouped-query attention).

    q_codes (bh, M_PAD, block_d) int8; q_scale (bh, M_PAD) fp32 (scores in log2 units);
    q_shift (bh, M_PAD) fp32 = sm_scale·q·mean(K), or None;
    k_codes (bh_kv, N_PAD, block_d) int8; k_scale (bh_kv, N_PAD) fp32; k_mean (bh_kv, block_d) fp32
    (zeros without smoothing); v_fp8_t (bh_kv, block_d, N_PAD) e4m3 with its keys in `mma_key_order`
    within each 32-key group, or None; v_scale (bh_kv, block_d) fp32 or None.
    v_range (bh_kv, 2, block_d) fp32: V's min and max per channel over the valid keys (+inf, -inf
    where a batch row has none); the attention kernels clamp their output to it (`bounds.py`).
    k_scale_max (bh_kv,) int32: bits of each head's largest K scale (fp32), or None (not tracked).
    pooled: the tile selection's per-tile statistics (`PooledTiles`), or None (not asked for).
    """

    q_codes: torch.Tensor
    q_scale: torch.Tensor
    q_shift: torch.Tensor | None
    k_codes: torch.Tensor
    k_scale: torch.Tensor
    k_mean: torch.Tensor
    v_fp8_t: torch.Tensor | None
    v_scale: torch.Tensor | None
    v_range: torch.Tensor
    k_scale_max: torch.Tensor | None = None
    pooled: PooledTiles | None = None


def _pooled_buffers(bh: int, bh_kv: int, m_tiles: int, n_tiles: int, block_d: int, dev) -> PooledTiles:
    def empty(*shape):
        return torch.empty(*shape, device=dev, dtype=torch.float32)

    return PooledTiles(empty(bh, m_tiles, block_d), empty(bh, m_tiles), empty(bh_kv, n_tiles, block_d),
                       empty(bh_kv, n_tiles), empty(bh_kv, n_tiles), empty(bh_kv, n_tiles))


def quantize_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    rotation: torch.Tensor | None,
    plan: KernelPlan,
    *,
    sm_scale: float,
    per_token: bool,
    smooth_k: bool,
    need_shift: bool,
    prep: PrepPlan | None = None,
    pool: bool = False,
    pool_spread: bool = False,
) -> QuantizedInputs:
    """Launch the preparation kernels. q/k/v HND views with unit stride on the head dim (k/v may have
    fewer heads than q, a divisor of them: grouped-query attention);
    key_mask (B', Nk) uint8 with B' in {1, B}; rotation (block_d, block_d) ±1 (16-bit or fp32) or
    None. prep: the launch shape (None: `plans.prep_plan(plan)`; benchmarks pass others). For a
    plain-kernel plan with scores_by_add, also each head's largest K scale (its guard reads it).
    pool: also the tile selection's per-tile statistics (`QuantizedInputs.pooled`), written by the
    same K and Q programs; the codes, scales and everything else are the same as without.
    pool_spread: with pool, the key tiles' spread too (1 without)."""
    prep = prep or prep_plan(plan)
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    bh, bh_kv = batch * heads, batch * kv_heads
    bd, bm, bn = plan.block_d, plan.block_m, plan.block_n
    m_pad = triton.cdiv(n_q, bm) * bm
    n_pad = triton.cdiv(n_k, bn) * bn
    fp8_v = plan.pv == "fp8"
    dev = q.device

    tokens_per_split = max(prep.stats_min_tokens, triton.cdiv(n_k, prep.max_splits))
    tokens_per_split = triton.cdiv(tokens_per_split, prep.stats_chunk) * prep.stats_chunk
    num_splits = triton.cdiv(n_k, tokens_per_split)
    k_sum = torch.empty(bh_kv * num_splits, bd, device=dev, dtype=torch.float32)
    k_count = torch.empty(bh_kv * num_splits, device=dev, dtype=torch.float32)
    v_lo = torch.empty(bh_kv * num_splits, bd, device=dev, dtype=torch.float32)
    v_hi = torch.empty(bh_kv * num_splits, bd, device=dev, dtype=torch.float32)
    k_mean = torch.zeros(bh_kv, bd, device=dev, dtype=torch.float32)
    # the selection pools K minus its mean even where the attention does not smooth: there the mean
    # goes to a buffer of its own (k_mean stays 0, which the LSE shift reads)
    stats_mean = smooth_k or pool
    pool_shift = k_mean if smooth_k or not pool else torch.zeros(bh_kv, bd, device=dev, dtype=torch.float32)
    pooled = _pooled_buffers(bh, bh_kv, m_pad // bm, n_pad // bn, bd, dev) if pool else None
    k_mean_rot = torch.empty(bh_kv, bd, device=dev, dtype=torch.float32) if rotation is not None else k_mean
    v_range = torch.empty(bh_kv, 2, bd, device=dev, dtype=torch.float32)
    v_scale = torch.empty(bh_kv, bd, device=dev, dtype=torch.float32) if fp8_v else None
    mask_arg = key_mask if key_mask is not None else k_count  # placeholder pointer, never read
    rot_arg = rotation if rotation is not None else k_count
    stride_mb = 0 if key_mask is None or key_mask.shape[0] == 1 else key_mask.stride(0)
    wrap_triton(_kv_stats_kernel)[(bh_kv, num_splits)](
        k, v, mask_arg, k_sum, k_count, v_lo, v_hi,
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        stride_mb,
        kv_heads, n_k, tokens_per_split, num_splits,
        HEAD_DIM=head_dim, BLOCK_D=bd, CHUNK=prep.stats_chunk,
        HAS_MASK=key_mask is not None, SMOOTH_K=stats_mean, num_warps=prep.stats_warps,
    )
    wrap_triton(_kv_stats_finalize_kernel)[(bh_kv,)](
        k_sum, k_count, v_lo, v_hi, rot_arg, pool_shift, k_mean_rot, v_range, v_scale if fp8_v else k_mean,
        num_splits,
        BLOCK_D=bd, SPLIT_CHUNK=prep.finalize_chunk,
        SMOOTH_K=stats_mean, ROTATE=rotation is not None, FP8_V=fp8_v,
    )

    k_codes = torch.empty(bh_kv, n_pad, bd, device=dev, dtype=torch.int8)
    k_scale = torch.empty(bh_kv, n_pad, device=dev, dtype=torch.float32)
    v_fp8_t = torch.empty(bh_kv, bd, n_pad, device=dev, dtype=torch.float8_e4m3fn) if fp8_v else None
    track_k_scale_max = plan.scores_by_add and not per_token and plan.kernel == "triton"
    k_scale_max = torch.zeros(bh_kv, device=dev, dtype=torch.int32) if track_k_scale_max else None
    kv_per_program = prep.tiles_per_program(n_pad // bn, prep.kv_tiles_per_program)
    wrap_triton(_quantize_kv_kernel)[(triton.cdiv(n_pad // bn, kv_per_program), bh_kv)](
        k, v, mask_arg, k_mean, k_mean_rot, v_scale if fp8_v else k_mean, rot_arg,
        k_codes, k_scale, v_fp8_t if fp8_v else k_codes, k_scale_max if track_k_scale_max else k_count,
        pool_shift,
        *((pooled.k_mean, pooled.k_similarity, pooled.k_count, pooled.k_spread) if pool else (k_count,) * 4),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        stride_mb,
        kv_heads, n_k, n_pad,
        HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_N=bn, TILES_PER_PROGRAM=kv_per_program,
        HAS_MASK=key_mask is not None, SMOOTH_K=smooth_k, ROTATE=rotation is not None,
        PER_TOKEN=per_token, FP8_V=fp8_v, TRACK_MAX=track_k_scale_max, POOL=pool, POOL_SPREAD=pool and pool_spread,
        num_warps=prep.kv_warps,
    )

    q_codes = torch.empty(bh, m_pad, bd, device=dev, dtype=torch.int8)
    q_scale = torch.empty(bh, m_pad, device=dev, dtype=torch.float32)
    q_shift = torch.empty(bh, m_pad, device=dev, dtype=torch.float32) if need_shift else None
    qk_scale = sm_scale * LOG2E / (bd if rotation is not None else 1)
    q_per_program = prep.tiles_per_program(m_pad // bm, prep.most_q_tiles(pool))
    wrap_triton(_quantize_q_kernel)[(triton.cdiv(m_pad // bm, q_per_program), bh)](
        q, k_mean, rot_arg, q_codes, q_scale, q_shift if need_shift else q_scale,
        *((pooled.q_mean, pooled.q_similarity) if pool else (q_scale,) * 2),
        q.stride(0), q.stride(1), q.stride(2),
        heads, kv_heads, n_q, m_pad, qk_scale, sm_scale,
        HEAD_DIM=head_dim, BLOCK_D=bd, BLOCK_M=bm, TILES_PER_PROGRAM=q_per_program,
        ROTATE=rotation is not None, PER_TOKEN=per_token, STORE_SHIFT=need_shift, POOL=pool,
        num_warps=prep.q_warps,
    )
    return QuantizedInputs(q_codes, q_scale, q_shift, k_codes, k_scale, k_mean, v_fp8_t, v_scale, v_range,
                           k_scale_max, pooled)
