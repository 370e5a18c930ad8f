"""Triton attention forward: INT8 QK into int32, fp32 online softmax with exp2, FP16 or FP8 PV.

One kernel body with `tl.constexpr` switches (causal, key mask, FP8 PV, LSE, block-sparse lists) and
an inner-loop helper, after Triton's fused-attention tutorial. Grid: (query tiles, B·H); each program
streams the key/value tiles of its head. Block-sparse calls (`tile_lists`) run a persistent grid over
(B·H, query tile) items, longest list first, each visiting only its listed key tiles. Inputs come
from `quantize.quantize_inputs` (over every valid key, sparse or not); the 16-bit PV path reads V
directly from the caller's tensor (no copy).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from sagevideo.kernels import constants
from sagevideo.kernels.constants import WIDE_OFFSETS_FROM
from sagevideo.kernels.plans import KernelPlan
from sagevideo.kernels.quantize import QuantizedInputs, mma_key_order

LN2_CONST = tl.constexpr(constants.LN2)
MIN_ROW_SCALE_CONST = tl.constexpr(constants.MIN_ROW_SCALE)
LOG2_FP8_MAX = tl.constexpr(constants.LOG2_FP8_MAX)
SCORE_BIAS = tl.constexpr(constants.SCORE_BIAS)
SCORE_BIAS_BITS = tl.constexpr(constants.SCORE_BIAS_BITS)
SCORES_BY_ADD_MAX_SCALE = tl.constexpr(constants.SCORES_BY_ADD_MAX_SCALE)


@triton.jit
def _masked_scores(s, offs_n, offs_m, Mask, N_K, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    """Scores of keys past N_K, masked out by the key mask or (CAUSAL) after the query set to -inf.
    Returns (s, key_ok (BLOCK_N,): in bounds and kept by the key mask)."""
    key_ok = offs_n < N_K
    if HAS_MASK:
        key_ok = key_ok & (tl.load(Mask + offs_n, mask=offs_n < N_K, other=0) != 0)
    s = tl.where(key_ok[None, :], s, float("-inf"))
    if CAUSAL:
        s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
    return s, key_ok


@triton.jit
def _attn_tile(
    acc, l_i, m_i, q, q_scale,
    KQ, KScale, V, VQ, Mask,
    start_n, offs_m, offs_d, v_row_stride,
    N_K, N_PAD,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    PER_TOKEN_K: tl.constexpr, FP8_PV: tl.constexpr, SCORES_BY_ADD: tl.constexpr,
    WIDE_OFFSETS: tl.constexpr, KEYLESS_ROWS: tl.constexpr,
):
    """One key tile: scores, online-softmax update and the PV product. Returns (acc, l_i, m_i).
    WIDE_OFFSETS: offsets may pass 2^31 (int64 math; the host decides). KEYLESS_ROWS: a row may
    have seen no valid key yet after this tile (a key mask, or a sparse list under causality).

    MASKED tiles check key bounds, the key mask and causality; the others skip all checks.
    In FP8 mode P is computed pre-scaled by 448 (log2(448) folded into the max), so P fills the
    e4m3 range; l and acc carry the same factor and it cancels in acc / l.
    SCORES_BY_ADD (per-block K scales): s is the fp32 number SCORE_BIAS + score, made by an integer
    add (|score| <= 127²·128 < 2^22) instead of an I2F per score, and the bias leaves again in the
    exponent's FMA: s·c − (m + SCORE_BIAS·c). Faster where measured (plans._SCORES_BY_ADD). Exact
    only up to ~c log2 units: the kernel runs it only on query tiles `_add_is_safe` accepts.
    V and Mask point at this (batch, head)'s rows; offsets within a head stay in int32.
    """
    offs_n = start_n + tl.arange(0, BLOCK_N)
    # K codes are stored (N_PAD, BLOCK_D) row-major: load the tile transposed for Q·Kᵀ.
    k = tl.load(KQ + offs_n[None, :] * BLOCK_D + offs_d[:, None])
    s_int = tl.dot(q, k, out_dtype=tl.int32)
    if SCORES_BY_ADD and not PER_TOKEN_K:
        s = (s_int + SCORE_BIAS_BITS).to(tl.float32, bitcast=True)  # = SCORE_BIAS + s_int, exactly
    else:
        s = s_int.to(tl.float32)  # exact: |s| <= 127²·128 < 2^24
    if PER_TOKEN_K:
        s = s * (q_scale[:, None] * tl.load(KScale + offs_n)[None, :])
    if MASKED:
        s, key_ok = _masked_scores(s, offs_n, offs_m, Mask, N_K, CAUSAL, HAS_MASK)
    if PER_TOKEN_K:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
    else:
        # One K scale per tile: the row scale c = q_scale·k_scale is positive (floored at the
        # smallest normal fp32, so that a masked −inf never meets c = 0), hence max(s·c) = max(s)·c
        # exactly (rounding is monotone). Scaling after the max lets the exponent below be one
        # FMA, s·c − m, instead of a multiply per score and then a subtraction.
        row_scale = tl.maximum(q_scale * tl.load(KScale + start_n), MIN_ROW_SCALE_CONST,
                               propagate_nan=tl.PropagateNan.ALL)  # NaN inputs stay NaN
        if MASKED:
            tile_max = tl.max(s, axis=1)
            if SCORES_BY_ADD:
                tile_max = tile_max - SCORE_BIAS  # exact (an integer below 2^24); -inf stays -inf
        else:
            # the max of the exact integers, converted once per row: integer max takes three
            # operands per instruction on sm_90 (float max two), half the row-max instructions
            tile_max = tl.max(s_int, axis=1).to(tl.float32)
        m_new = tl.maximum(m_i, tile_max * row_scale)
    m_sub = m_new
    if KEYLESS_ROWS:
        # Rows that have seen no valid key yet keep m = -inf; subtract 0 there (no NaN). Without a
        # key mask every row sees key 0 in its first tile, so m is finite from then on (a sparse
        # list's first tile holds a valid key for every row too, unless causality masks it).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_sub)
    if FP8_PV:
        m_sub = m_sub - LOG2_FP8_MAX
    if PER_TOKEN_K:
        p = tl.math.exp2(s - m_sub[:, None])
    elif SCORES_BY_ADD:
        # (SCORE_BIAS + s)·c − (m + SCORE_BIAS·c): one FMA per score; the subtrahend is rounded once
        # per row, which moves the row's exponents together by up to ~c log2 units (half an ulp of
        # 1.5·2^23·c): negligible below SCORES_BY_ADD_MAX_SCALE, an overflow to inf for the large c
        # of peaky inputs
        p = tl.math.exp2(s * row_scale[:, None] - tl.fma(row_scale, SCORE_BIAS, m_sub)[:, None])
    else:
        p = tl.math.exp2(s * row_scale[:, None] - m_sub[:, None])  # fused: one rounding
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if FP8_PV:
        # VQ is (BLOCK_D, N_PAD), contiguous along keys: the K-major operand FP8 MMAs need.
        v = tl.load(VQ + offs_d[None, :] * N_PAD + offs_n[:, None])
        p8 = mma_key_order(p.to(tl.float8e4nv))  # VQ's keys are in the MMA operand's order: P's too
        acc += tl.dot(p8, v)  # fresh fp32 block product added into acc (two-level)
    else:
        v_ok = offs_d[None, :] < HEAD_DIM
        if MASKED:
            v_ok = v_ok & key_ok[:, None]
        if WIDE_OFFSETS:  # the tile's first row in int64: a row stride of H·D times a long sequence
            v_tile = V + tl.cast(start_n, tl.int64) * v_row_stride
            v = tl.load(v_tile + tl.arange(0, BLOCK_N)[:, None] * v_row_stride + offs_d[None, :], mask=v_ok, other=0.0)
        else:
            v = tl.load(V + offs_n[:, None] * v_row_stride + offs_d[None, :], mask=v_ok, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _listed_key_tiles(
    acc, l_i, m_i, q, q_scale, kq, k_scale, v, vq, mask, row, count, lo, hi,
    offs_m, offs_d, stride_vn, N_K, N_PAD,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PER_TOKEN_K: tl.constexpr, FP8_PV: tl.constexpr,
    WIDE_OFFSETS: tl.constexpr,
):
    """Block-sparse: the key tiles of one query tile's list (`row`: `count` ascending int32 tile
    indices); the others are never loaded. Returns (acc, l_i, m_i).

    The list ascends, so its tiles before `lo` (no checks needed) come first, then the checked ones
    below `hi`, then (causal) those wholly after the tile's last query, which are left out as the
    dense loops leave them. Counting the first two groups (a scalar pass over the list, far cheaper
    than one tile) keeps the dense path's two loops, checked and unchecked, with the same arithmetic
    per tile: a full list computes what the dense loops do, bit for bit."""
    unchecked = tl.zeros_like(count)
    visited = tl.zeros_like(count)
    for j in range(0, count):
        start_n = tl.load(row + j) * BLOCK_N
        unchecked += (start_n < lo).to(tl.int32)
        visited += (start_n < hi).to(tl.int32)
    for j in range(0, unchecked):
        acc, l_i, m_i = _attn_tile(
            acc, l_i, m_i, q, q_scale, kq, k_scale, v, vq, mask,
            tl.load(row + j) * BLOCK_N, offs_m, offs_d, stride_vn, N_K, N_PAD,
            HEAD_DIM, BLOCK_N, BLOCK_D, False, CAUSAL, HAS_MASK, PER_TOKEN_K, FP8_PV, False,
            WIDE_OFFSETS, HAS_MASK,
        )
    for j in range(unchecked, visited):
        # causal: a listed diagonal tile may hold no key at or before some of the rows, and it may
        # be their first (the tiles before it skipped): such rows still have m = -inf after it
        acc, l_i, m_i = _attn_tile(
            acc, l_i, m_i, q, q_scale, kq, k_scale, v, vq, mask,
            tl.load(row + j) * BLOCK_N, offs_m, offs_d, stride_vn, N_K, N_PAD,
            HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL, HAS_MASK, PER_TOKEN_K, FP8_PV, False,
            WIDE_OFFSETS, HAS_MASK or CAUSAL,
        )
    return acc, l_i, m_i


@triton.jit
def _query_tile(
    tile, bh, QQ, QScale, QShift, KQ, KScale, V, VQ, VScale, VRange, Mask, MaskPrefix, Out, Lse,
    KeyTiles, Counts,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om, mask_stride_b,
    stride_tb, stride_th, stride_tm, stride_cb, stride_ch, stride_cm,
    H, H_KV, N_Q, N_K, M_PAD, N_PAD,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PER_TOKEN_K: tl.constexpr, FP8_PV: tl.constexpr,
    STORE_LSE: tl.constexpr, SCORES_BY_ADD: tl.constexpr, WIDE_OFFSETS: tl.constexpr, SPARSE: tl.constexpr,
):
    """Query tile `tile` of head `bh` against every key tile (SPARSE: the key tiles of its list,
    KeyTiles/Counts at (b, h, tile) through their strides, 0 where one list serves every batch row
    or head), normalised and stored (with its LSE).
    Query head h reads K/V head h // (H // H_KV) (grouped-query attention when H_KV < H).
    WIDE_OFFSETS (B·H·N·D past 2^31: long videos, large batches): `bh` is int64, so are the
    per-(batch, head) bases and the row offsets that can pass 2^31; otherwise all int32."""
    b = bh // H
    h = bh % H
    h_kv = h // (H // H_KV)
    bh_kv = b * H_KV + h_kv
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(QQ + bh * M_PAD * BLOCK_D + offs_m[:, None] * BLOCK_D + offs_d[None, :])
    q_scale = tl.load(QScale + bh * M_PAD + offs_m)
    kq = KQ + bh_kv * N_PAD * BLOCK_D
    k_scale = KScale + bh_kv * N_PAD
    v = V + b * stride_vb + h_kv * stride_vh
    vq = VQ + bh_kv * BLOCK_D * N_PAD
    mask = Mask + b * mask_stride_b

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    # Key tiles [0, lo) need no checks; [lo, hi) are checked (the partial last tile, causal
    # diagonal tiles, and with a key mask every tile from the first that holds a masked key:
    # MaskPrefix is the number of leading valid keys per batch row, so a mask of padding at the
    # end, as video models' text padding is, leaves all but the last tiles unchecked).
    hi = N_K
    lo = (N_K // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(N_K, (tile + 1) * BLOCK_M)
        lo = tl.minimum(lo, (tile * BLOCK_M // BLOCK_N) * BLOCK_N)
    if HAS_MASK:
        lo = tl.minimum(lo, (tl.load(MaskPrefix + b) // BLOCK_N) * BLOCK_N)
    if SPARSE:
        count = tl.load(Counts + b * stride_cb + h * stride_ch + tile * stride_cm)
        acc, l_i, m_i = _listed_key_tiles(
            acc, l_i, m_i, q, q_scale, kq, k_scale, v, vq, mask,
            KeyTiles + b * stride_tb + h * stride_th + tile * stride_tm, count, lo, hi,
            offs_m, offs_d, stride_vn, N_K, N_PAD,
            HEAD_DIM, BLOCK_N, BLOCK_D, CAUSAL, HAS_MASK, PER_TOKEN_K, FP8_PV, WIDE_OFFSETS,
        )
    else:
        for start_n in range(0, lo, BLOCK_N):
            acc, l_i, m_i = _attn_tile(
                acc, l_i, m_i, q, q_scale, kq, k_scale, v, vq, mask,
                start_n, offs_m, offs_d, stride_vn, N_K, N_PAD,
                HEAD_DIM, BLOCK_N, BLOCK_D, False, CAUSAL, HAS_MASK, PER_TOKEN_K, FP8_PV, SCORES_BY_ADD,
                WIDE_OFFSETS, HAS_MASK,
            )
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _attn_tile(
                acc, l_i, m_i, q, q_scale, kq, k_scale, v, vq, mask,
                start_n, offs_m, offs_d, stride_vn, N_K, N_PAD,
                HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL, HAS_MASK, PER_TOKEN_K, FP8_PV, SCORES_BY_ADD,
                WIDE_OFFSETS, HAS_MASK,
            )

    # l = 0 exactly when a row has no valid key (output 0). A NaN l (NaN inputs) must reach the
    # output as NaN, not pass for "no key" and leave acc unnormalized.
    has_keys = l_i != 0.0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if FP8_PV:
        out = out * tl.load(VScale + bh_kv * BLOCK_D + offs_d)[None, :]
    # Each output channel is a convex combination of V's, but P is rounded for the P·V product and
    # l is not: kept inside V's range over the valid keys (`bounds.py`). Rows with no key stay 0;
    # comparisons keep a NaN.
    v_lo = tl.load(VRange + bh_kv * 2 * BLOCK_D + offs_d)[None, :]
    v_hi = tl.load(VRange + bh_kv * 2 * BLOCK_D + BLOCK_D + offs_d)[None, :]
    clamped = tl.where(out > v_hi, v_hi, tl.where(out < v_lo, v_lo, out))
    out = tl.where(has_keys[:, None], clamped, out)
    m_ok = offs_m < N_Q
    first_row = tile * BLOCK_M
    if WIDE_OFFSETS:
        first_row = first_row.to(tl.int64)
    o_tile = Out + b * stride_ob + h * stride_oh + first_row * stride_om
    offs_t = tl.arange(0, BLOCK_M)
    o_ptrs = o_tile + offs_t[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    if STORE_LSE:
        shift = tl.load(QShift + bh * M_PAD + offs_m)
        m_lse = m_i
        if FP8_PV:
            m_lse = m_i - LOG2_FP8_MAX  # l carries the factor 448 in FP8 mode
        lse = (m_lse + tl.log2(tl.where(has_keys, l_i, 1.0))) * LN2_CONST + shift
        lse = tl.where(has_keys, lse, float("-inf"))
        tl.store(Lse + bh * N_Q + offs_m, lse, mask=m_ok)


@triton.jit
def _attn_fwd_kernel(
    QQ, QScale, QShift, KQ, KScale, KScaleMax, Work, V, VQ, VScale, VRange, Mask, MaskPrefix, Out, Lse,
    KeyTiles, Counts, Order,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    mask_stride_b,
    stride_tb, stride_th, stride_tm, stride_cb, stride_ch, stride_cm,
    H, H_KV, N_Q, N_K, M_PAD, N_PAD, N_ITEMS,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, PER_TOKEN_K: tl.constexpr, FP8_PV: tl.constexpr,
    STORE_LSE: tl.constexpr, MODE: tl.constexpr, WIDE_OFFSETS: tl.constexpr,
):
    """MODE "exact": grid (query tiles, B·H), scores converted exactly. Plans with scores_by_add
    launch twice: "add", the same grid, converts by the add in every query tile whose row scales
    stay at most SCORES_BY_ADD_MAX_SCALE against its head (KScaleMax: the head's largest K scale,
    int32 bits) and appends the others to Work ([count, items...], item = bh·M_TILES + tile); then
    "worklist", a persistent grid, computes those exactly. No host sync: the second launch reads
    the count on the GPU (and returns at once when it is 0).
    "sparse" (block-sparse lists, exact conversion): a persistent grid; each program claims the next
    item of Order (N_ITEMS items, bh·M_TILES + tile, sorted longest list first on the device) with an
    atomic on Work (one int32, 0 at launch) until none is left, so the longest query tiles start
    first and the short ones fill the gaps, whatever each program's pace."""
    m_tiles = M_PAD // BLOCK_M
    if MODE == "sparse":
        i = tl.atomic_add(Work, 1)
        while i < N_ITEMS:
            item = tl.load(Order + i)
            if WIDE_OFFSETS:
                item = item.to(tl.int64)
            _query_tile(item % m_tiles, item // m_tiles, QQ, QScale, QShift, KQ, KScale, V, VQ, VScale, VRange, Mask,
                        MaskPrefix, Out, Lse, KeyTiles, Counts,
                        stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om, mask_stride_b,
                        stride_tb, stride_th, stride_tm, stride_cb, stride_ch, stride_cm,
                        H, H_KV, N_Q, N_K, M_PAD, N_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, CAUSAL, HAS_MASK,
                        PER_TOKEN_K, FP8_PV, STORE_LSE, False, WIDE_OFFSETS, True)
            i = tl.atomic_add(Work, 1)
    elif MODE == "worklist":
        count = tl.load(Work)
        for i in range(tl.program_id(0), count, tl.num_programs(0)):
            item = tl.load(Work + 1 + i)
            if WIDE_OFFSETS:
                item = item.to(tl.int64)
            _query_tile(item % m_tiles, item // m_tiles, QQ, QScale, QShift, KQ, KScale, V, VQ, VScale, VRange, Mask,
                        MaskPrefix, Out, Lse, KeyTiles, Counts,
                        stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om, mask_stride_b,
                        stride_tb, stride_th, stride_tm, stride_cb, stride_ch, stride_cm,
                        H, H_KV, N_Q, N_K, M_PAD, N_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, CAUSAL, HAS_MASK,
                        PER_TOKEN_K, FP8_PV, STORE_LSE, False, WIDE_OFFSETS, False)
    else:
        tile = tl.program_id(0)
        bh = tl.program_id(1)
        if WIDE_OFFSETS:
            bh = bh.to(tl.int64)
        add_ok = False
        if MODE == "add":
            # The tile's Q scale (its first row's: a NaN there, from a NaN input row, only sends the
            # tile to the exact path) times the head's largest K scale bounds every row scale c.
            bh_kv = (bh // H) * H_KV + (bh % H) // (H // H_KV)
            k_max = tl.load(KScaleMax + bh_kv).to(tl.float32, bitcast=True)
            add_ok = tl.load(QScale + bh * M_PAD + tile * BLOCK_M) * k_max <= SCORES_BY_ADD_MAX_SCALE
            if not add_ok:
                slot = tl.atomic_add(Work, 1)
                tl.store(Work + 1 + slot, (bh * m_tiles + tile).to(tl.int32))
        if MODE == "exact" or add_ok:
            _query_tile(tile, bh, QQ, QScale, QShift, KQ, KScale, V, VQ, VScale, VRange, Mask,
                        MaskPrefix, Out, Lse, KeyTiles, Counts,
                        stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om, mask_stride_b,
                        stride_tb, stride_th, stride_tm, stride_cb, stride_ch, stride_cm,
                        H, H_KV, N_Q, N_K, M_PAD, N_PAD, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, CAUSAL, HAS_MASK,
                        PER_TOKEN_K, FP8_PV, STORE_LSE, MODE == "add", WIDE_OFFSETS, False)


def attention_forward(
    prepared: QuantizedInputs,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    plan: KernelPlan,
    *,
    is_causal: bool,
    per_token: bool,
    n_q: int,
    n_k: int,
    tile_lists: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Launch the attention kernel, writing `out` (B, H, Nq, D) view and `lse` (B·H, Nq) fp32.
    A plan with scores_by_add launches it twice (see `_attn_fwd_kernel`'s MODE) and needs
    `prepared.k_scale_max`, which the preparation tracks for such plans.

    tile_lists (block-sparse; `sparse_reference.TileLists`' tensors in the plan's tiles): indices
    int32 (B or 1, H or 1, M_TILES, W), each query tile's key tiles ascending then -1, and counts
    int32 (B or 1, H or 1, M_TILES); every other key tile is never loaded. One persistent launch,
    longest list first (`_launch_sparse`)."""
    batch, heads, _, _ = out.shape
    m_pad = prepared.q_codes.shape[1]
    masks = None if key_mask is None else (key_mask, valid_prefix(key_mask, batch, n_k))
    shape = dict(is_causal=is_causal, per_token=per_token, n_q=n_q, n_k=n_k)
    if tile_lists is not None:
        _launch_sparse(prepared, v, masks, out, lse, plan, tile_lists, **shape)
        return
    if not (plan.scores_by_add and not per_token):
        _launch(prepared, v, masks, out, lse, plan, "exact", None, (m_pad // plan.block_m, batch * heads), **shape)
        return
    if prepared.k_scale_max is None:
        raise ValueError("a scores_by_add plan needs the K scales' maxima: quantize the inputs with that plan")
    items = m_pad // plan.block_m * batch * heads
    work = torch.zeros(1 + items, device=out.device, dtype=torch.int32)
    _launch(prepared, v, masks, out, lse, plan, "add", work, (m_pad // plan.block_m, batch * heads), **shape)
    _launch(prepared, v, masks, out, lse, plan, "worklist", work, (min(items, _persistent_programs(out)),), **shape)


def _launch_sparse(prepared: QuantizedInputs, v: torch.Tensor, masks: tuple[torch.Tensor, torch.Tensor] | None,
                   out: torch.Tensor, lse: torch.Tensor | None, plan: KernelPlan,
                   tile_lists: tuple[torch.Tensor, torch.Tensor], **shape) -> None:
    """The block-sparse launch: items (bh, query tile) ordered by their list's length, longest first,
    sorted on the device (no host sync; ties keep (b, h, tile) order, neighbours sharing K/V in L2).

    Scores are converted exactly even where the plan has scores_by_add: the add is a speed choice
    (+2% measured, FP8 d64 on the H200, dense) whose safety check sends peaky query tiles to a
    second, exact pass. Inside the persistent loop that would inline the whole tile loop twice (one
    copy per conversion) for a gain not measured under the sparse schedule; the exact conversion is
    also what the reference computes, so sparse results match it as the dense exact path does."""
    lists = scheduled_lists(tile_lists, *out.shape[:2], prepared.q_codes.shape[1] // plan.block_m)
    claimed = torch.zeros(1, device=out.device, dtype=torch.int32)
    _launch(prepared, v, masks, out, lse, plan, "sparse", claimed, (min(lists[2].numel(), _persistent_programs(out)),),
            lists=lists, **shape)


def scheduled_lists(tile_lists: tuple[torch.Tensor, torch.Tensor], batch: int, heads: int,
                    m_tiles: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a block-sparse launch (either kernel) reads, from (key tiles int32 (B or 1, H or 1, M_TILES, W),
    counts int32 (B or 1, H or 1, M_TILES)): the lists broadcast to (batch, heads, m_tiles, W or 1)
    with unit stride along W, the counts to (batch, heads, m_tiles), and the items' `item_order`."""
    indices, counts = tile_lists
    if indices.shape[-1] == 0:  # no query tile lists any key tile: the kernel loads no entry
        indices = torch.full((*indices.shape[:-1], 1), -1, device=indices.device, dtype=torch.int32)
    if indices.stride(-1) != 1:
        indices = indices.contiguous()
    indices = indices.expand(batch, heads, m_tiles, indices.shape[-1])
    counts = counts.expand(batch, heads, m_tiles)
    return indices, counts, item_order(counts.reshape(-1))


def item_order(counts: torch.Tensor) -> torch.Tensor:
    """The sparse launch's schedule of items (int32 counts (items,), item = bh·M_TILES + tile) as int32
    item ids: longest list first by classes of half an octave (lengths within a factor of sqrt 2 are
    one class), (b, h, tile) order within a class. Exact lengths would scatter a head's neighbouring
    query tiles across the schedule wherever their lengths differ by one (static windows do), and
    those neighbours share most key tiles: run together they read them from L2 once."""
    length_class = torch.floor(2.0 * torch.log2(counts.clamp(min=1).to(torch.float32)))
    return torch.argsort(length_class, descending=True, stable=True).to(torch.int32)


def valid_prefix(key_mask: torch.Tensor, batch: int, n_k: int) -> torch.Tensor:
    """(batch,) int32: how many leading keys of each row of `key_mask` ((B' in {1, batch}, >= n_k),
    nonzero = valid) are valid, n_k where all are. On the mask's device, no host sync."""
    invalid = key_mask[:, :n_k] == 0
    first = invalid.to(torch.int32).argmax(dim=1)  # the first maximum: the first masked key
    prefix = torch.where(invalid.any(dim=1), first, torch.full_like(first, n_k))
    return prefix.to(torch.int32).expand(batch).contiguous()


def _persistent_programs(t: torch.Tensor) -> int:
    """Programs of the work-list launch: enough to fill the GPU (4 per SM) when every tile is peaky."""
    return 4 * torch.cuda.get_device_properties(t.device).multi_processor_count if t.is_cuda else 2


def _extent(t: torch.Tensor) -> int:
    """1 + the largest element offset of `t` (a strided view's reach, not its numel)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _launch(prepared: QuantizedInputs, v: torch.Tensor, masks: tuple[torch.Tensor, torch.Tensor] | None,
            out: torch.Tensor, lse: torch.Tensor | None, plan: KernelPlan, mode: str, work: torch.Tensor | None,
            grid: tuple,
            *, is_causal: bool, per_token: bool, n_q: int, n_k: int,
            lists: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
    """One launch in `mode`; masks: (key mask (B', Nk) uint8, its `valid_prefix`) or None; lists
    ("sparse"): (indices (B, H, M_TILES, W), counts (B, H, M_TILES), order (B·H·M_TILES,)), int32."""
    batch, heads, _, head_dim = out.shape
    m_pad = prepared.q_codes.shape[1]
    n_pad = prepared.k_codes.shape[1]
    fp8_pv = plan.pv == "fp8"
    mask, prefix = masks if masks is not None else (prepared.k_scale, prepared.k_scale)  # never read
    mask_stride_b = 0 if masks is None or mask.shape[0] == 1 else mask.stride(0)
    registers = {} if plan.max_registers is None else {"maxnreg": plan.max_registers}
    placeholder = prepared.k_scale  # a pointer the mode never reads
    indices, counts, order = lists if lists is not None else (placeholder, placeholder, placeholder)
    list_strides = (*indices.stride()[:3], *counts.stride()) if lists is not None else (0,) * 6
    wrap_triton(_attn_fwd_kernel)[grid](
        prepared.q_codes, prepared.q_scale,
        prepared.q_shift if prepared.q_shift is not None else prepared.q_scale,
        prepared.k_codes, prepared.k_scale,
        prepared.k_scale_max if mode == "add" else placeholder, work if work is not None else placeholder, v,
        prepared.v_fp8_t if fp8_pv else prepared.k_codes,
        prepared.v_scale if fp8_pv else prepared.k_scale, prepared.v_range,
        mask, prefix, out, lse if lse is not None else prepared.q_scale,
        indices, counts, order,
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        mask_stride_b,
        *list_strides,
        heads, prepared.k_codes.shape[0] // batch, n_q, n_k, m_pad, n_pad, order.numel() if lists is not None else 0,
        HEAD_DIM=head_dim, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d,
        CAUSAL=is_causal, HAS_MASK=masks is not None, PER_TOKEN_K=per_token,
        FP8_PV=fp8_pv, STORE_LSE=lse is not None, MODE=mode,
        WIDE_OFFSETS=max(map(_extent, (v, out, prepared.q_codes, prepared.k_codes))) >= WIDE_OFFSETS_FROM,
        num_warps=plan.num_warps, num_stages=plan.num_stages, **registers,
    )
