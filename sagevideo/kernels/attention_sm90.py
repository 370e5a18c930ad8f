"""Hopper (sm90) attention forward in Gluon: a TMA producer warp feeding a consumer warpgroup.

The same computation as `attention_fwd` (INT8 Q·Kᵀ into int32, fp32 online softmax with exp2,
FP8 P·V as a fresh fp32 product per key tile added into the accumulator), with FlashAttention-3's
Hopper machinery:
- a one-warp producer partition streams K-code tiles and Vᵀ (e4m3) tiles into a ring of
  NUM_STAGES shared-memory stages with TMA, signalling `ready[s]`; the consumer arrives on
  `empty[s]` once its MMAs have read the stage;
- one consumer warpgroup (the default partition) owns 64 query rows per CTA, two CTAs per SM;
  warpgroup MMAs for both products, registers moved to it with setmaxnreg;
- each key tile in order: S = Q·Kᵀ, softmax, P·V, each waited for;
- P's keys are put in the MMA operand's order (`_mma_key_order`; the preparation stores Vᵀ so), so
  P becomes the e4m3 operand without lane shuffles; full key tiles and the masked last one run in
  separate loops.
This is the configuration that measured fastest on the H200, and faster than the plain-Triton kernel
at head dim 128, not at 64; the schedules it was measured against (FA3's intra-warpgroup pipelining,
two consumer warpgroups per CTA, ring stages released in pairs) are in git history, their figures in
docs/benchmarks-history.md ("the pipelined schedule had never overlapped").

Block-sparse calls (`SPARSE`): one CTA per listed (batch·head, query tile) item, longest list first,
visiting only the key tiles of its list; the producer loads just those by TMA.

Numerics equal the plain-Triton kernel's for the same plan (bit for bit on the H200, and on the H100
with the same lists): the Q scale is per row (constant over the plan's BLOCK_M rows), K's per BLOCK_N
tile, V's per channel. Only what the video transformers run is implemented: FP8 PV, per-block K
scales, no causal mask, no key mask, no LSE, dense or on tile lists; the dispatch (`op.gluon_runs`)
sends anything else to the plain-Triton kernel (`supports`).

Gluon cannot run under TRITON_INTERPRET; `compile_for_sm90` compiles this kernel for sm90 on a
CPU-only machine (tests, `tools/gluon_compile_check.py`); the `gpu` tests check it against the
plain-Triton kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from sagevideo.kernels import constants
from sagevideo.kernels.attention_fwd import scheduled_lists
from sagevideo.kernels.quantize import QuantizedInputs

LOG2_FP8_MAX = gl.constexpr(constants.LOG2_FP8_MAX)
MIN_ROW_SCALE_CONST = gl.constexpr(constants.MIN_ROW_SCALE)
WG_ROWS = gl.constexpr(64)  # query rows per consumer warpgroup (one wgmma M=64) = per CTA
# Registers per thread at launch: 4 + 1 warps run as 2 warpgroups, 128 x 256 threads = half the SM
# (two CTAs per SM, as the plain-Triton kernel runs). Triton then gives the consumer partition 232
# with setmaxnreg, taken from the producer's PRODUCER_REGS.
MAXNREG = 128
PRODUCER_REGS = 24


@gluon.jit
def _key_tile_index(key_list, j, n_tiles, SPARSE: gl.constexpr):
    """The j-th key tile the CTA visits: j (dense), or entry j of its list (SPARSE; 0 past the count)."""
    if SPARSE:
        return gl.load(key_list + j, mask=j < n_tiles, other=0)
    else:
        return j


@gluon.jit
def _producer(q_desc, k_desc, v_desc, bufs, bars, ptrs, dims,
              BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, NUM_STAGES: gl.constexpr, SPARSE: gl.constexpr):
    """One warp: the CTA's Q tile once, then K/Vᵀ tiles into the ring, NUM_STAGES ahead."""
    q_smem, k_smem, v_smem = bufs
    q_bar, ready, empty = bars
    q_row, k_row, v_row, n_tiles = dims[0], dims[1], dims[2], dims[3]
    key_list = ptrs[5]
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    for j in range(n_tiles):
        start_n = _key_tile_index(key_list, j, n_tiles, SPARSE) * BLOCK_N
        stage = j % NUM_STAGES
        mbarrier.wait(empty.index(stage), ((j // NUM_STAGES) & 1) ^ 1)  # first pass through the ring: free
        bar = ready.index(stage)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [k_row + start_n, 0], bar, k_smem.index(stage))
        tma.async_copy_global_to_shared(v_desc, [v_row, start_n], bar, v_smem.index(stage))


@gluon.jit
def _mma_key_order(x):
    """`quantize.mma_key_order` in Gluon: P's keys in the 8-bit MMA operand's order, so that its
    conversion into the operand layout renames registers (no lane shuffles or byte permutes)."""
    R: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    x = gl.reshape(x, (R, N // 32, 2, 2, 4, 2))
    x = gl.permute(x, (0, 1, 2, 4, 3, 5))
    return gl.reshape(x, (R, N))


@gluon.jit
def _softmax(s, m_i, l_i, k_scale, q_scale, start_n, N_K, s_layout: gl.constexpr, MASKED: gl.constexpr):
    """Scores (int32 (64, BLOCK_N), s_layout) of one key tile -> (P fp32 in s_layout, m, l, alpha);
    `_p_operand` makes P the e4m3 MMA operand. MASKED: the partial last tile (keys past N_K -> -inf)."""
    # > 0 (NaN kept): see attention_fwd._attn_tile
    row_scale = gl.maximum(q_scale * k_scale, MIN_ROW_SCALE_CONST, propagate_nan=tl.PropagateNan.ALL)
    scores = s.to(gl.float32)  # exact: |s| <= 127²·128 < 2^24
    if MASKED:
        cols = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))
        scores = gl.where((cols < N_K)[None, :], scores, float("-inf"))
        tile_max = gl.max(scores, axis=1)
    else:
        tile_max = gl.max(s, axis=1).to(gl.float32)  # integer max: three operands per instruction
    # Scaled after the max (exact: the row scale is positive), so the exponent is one FMA; as in
    # attention_fwd._attn_tile.
    m_new = gl.maximum(m_i, tile_max * row_scale)
    alpha = gl.exp2(m_i - m_new)
    # P pre-scaled by 448 (log2 448 folded into the max) to fill the e4m3 range; cancels in acc / l.
    m_sub = m_new - LOG2_FP8_MAX
    p = gl.exp2(scores * row_scale[:, None] - m_sub[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_i, alpha


@gluon.jit
def _p_operand(p, p_layout: gl.constexpr):
    """P (fp32, s_layout) as the P·V MMA's e4m3 A operand: narrowed in the accumulator layout (F2FP
    packs each thread's key pairs), then its keys put in `_mma_key_order` (Vᵀ was stored so), which
    makes the conversion a renaming of registers. Called outside any branch: 8-bit P in the
    accumulator layout crossing an `if` gave non-finite outputs on the H200 (Triton 3.6)."""
    p8 = _mma_key_order(p.to(gl.float8e4nv))
    return gl.convert_layout(p8, p_layout)


@gluon.jit
def _next_k_scale(KScale, k_scale_row, key_list, j, n_tiles, BLOCK_N: gl.constexpr, SPARSE: gl.constexpr):
    """(the j-th visited key tile's first key, its K scale), loaded one tile ahead of their use: an L2
    round trip on the critical path of every tile otherwise (the mbarrier/wgmma waits are volatile, so
    the loads cannot move above them)."""
    start_n = _key_tile_index(key_list, j, n_tiles, SPARSE) * BLOCK_N
    return start_n, gl.load(KScale + k_scale_row + start_n, mask=j < n_tiles, other=0.0)


@gluon.jit
def _key_tile(j, acc, m_i, l_i, start_n, k_scale, q_tile, k_smem, v_smem, ready, empty, s_zero, o_zero, q_scale,
              KScale, k_scale_row, key_list, n_tiles, N_K, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
              s_layout: gl.constexpr, p_layout: gl.constexpr, o_rows: gl.constexpr, MASKED: gl.constexpr,
              SPARSE: gl.constexpr):
    """The j-th visited key tile (its first key start_n, its K scale): wait for its ring stage,
    S = Q·Kᵀ, softmax, P·V, each waited for; the stage handed back after it. Returns (acc, m, l,
    the (j+1)-th tile's first key and K scale)."""
    next_start, next_scale = _next_k_scale(KScale, k_scale_row, key_list, j + 1, n_tiles, BLOCK_N, SPARSE)
    stage = j % NUM_STAGES
    mbarrier.wait(ready.index(stage), (j // NUM_STAGES) & 1)
    s = warpgroup_mma(q_tile, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, m_i, l_i, alpha = _softmax(s, m_i, l_i, k_scale, q_scale, start_n, N_K, s_layout, MASKED)
    pv = warpgroup_mma(_p_operand(p, p_layout), v_smem.index(stage).permute((1, 0)), o_zero, use_acc=False,
                       is_async=True)
    pv = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
    acc = acc * gl.convert_layout(alpha, o_rows)[:, None] + pv  # two-level accumulation
    mbarrier.arrive(empty.index(stage), count=1)
    return acc, m_i, l_i, next_start, next_scale


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, bufs, bars, ptrs, dims,
              BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, NUM_STAGES: gl.constexpr, SPARSE: gl.constexpr):
    """One warpgroup: the CTA's 64 query rows against every key tile (SPARSE: its list's), then the
    normalised 16-bit store."""
    q_smem, k_smem, v_smem = bufs
    q_bar, ready, empty = bars
    QScale, KScale, VScale, Out, VRange, key_list = ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4], ptrs[5]
    n_tiles, N_Q, N_K = dims[3], dims[4], dims[5]
    scale_row, k_scale_row, o_offset, stride_om = dims[6], dims[7], dims[8], dims[9]
    v_scale_row, M_PAD, m_start, D_OUT = dims[10], dims[11], dims[12], dims[13]

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows = m_start + gl.arange(0, WG_ROWS, layout=row_layout)  # within the head
    q_scale = gl.load(QScale + scale_row + rows, mask=rows < M_PAD, other=0.0)
    m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([WG_ROWS], gl.float32, row_layout)
    acc = gl.zeros([WG_ROWS, HEAD_D], gl.float32, o_layout)
    s_zero = gl.zeros([WG_ROWS, BLOCK_N], gl.int32, s_layout)
    o_zero = gl.zeros([WG_ROWS, HEAD_D], gl.float32, o_layout)
    mbarrier.wait(q_bar, 0)
    # The partial last key tile (keys past N_K), visited last if at all (a list ascends).
    n_full = N_K // BLOCK_N
    if SPARSE:
        last = gl.load(key_list + gl.maximum(n_tiles - 1, 0))
        n_full = n_tiles - ((n_tiles > 0) & (last == n_full) & (N_K % BLOCK_N != 0)).to(gl.int32)

    # Full key tiles, then the partial last one (if any) in a loop of its own. With one loop and a
    # branch per tile between the two softmax paths, P (packed 8-bit values) crossed the branch's
    # merge point, which cost byte permutes, and the loop carried both paths.
    start_n, k_scale = _next_k_scale(KScale, k_scale_row, key_list, 0, n_tiles, BLOCK_N, SPARSE)
    for j in range(n_full):
        acc, m_i, l_i, start_n, k_scale = _key_tile(
            j, acc, m_i, l_i, start_n, k_scale, q_smem, k_smem, v_smem, ready, empty, s_zero, o_zero, q_scale,
            KScale, k_scale_row, key_list, n_tiles, N_K, BLOCK_N, NUM_STAGES, s_layout, p_layout, o_rows, False,
            SPARSE)
    for j in range(n_full, n_tiles):
        acc, m_i, l_i, start_n, k_scale = _key_tile(
            j, acc, m_i, l_i, start_n, k_scale, q_smem, k_smem, v_smem, ready, empty, s_zero, o_zero, q_scale,
            KScale, k_scale_row, key_list, n_tiles, N_K, BLOCK_N, NUM_STAGES, s_layout, p_layout, o_rows, True,
            SPARSE)

    o_cols: gl.constexpr = gl.SliceLayout(0, o_layout)
    d = gl.arange(0, HEAD_D, layout=o_cols)
    l_o = gl.convert_layout(l_i, o_rows)
    if SPARSE:
        # l = 0 exactly where a list is empty (output 0, as the plain kernel's); a NaN l stays NaN
        has_keys = (l_o != 0.0)[:, None]
        out = acc / gl.where(has_keys, l_o[:, None], 1.0) * gl.load(VScale + v_scale_row + d)[None, :]
    else:
        out = acc / l_o[:, None] * gl.load(VScale + v_scale_row + d)[None, :]
    # Kept inside V's per-channel range (P is rounded to e4m3 for P·V, l is not: `bounds.py`);
    # comparisons keep a NaN. Every row has keys in a dense call.
    v_lo = gl.load(VRange + 2 * v_scale_row + d)[None, :]
    v_hi = gl.load(VRange + 2 * v_scale_row + HEAD_D + d)[None, :]
    clamped = gl.where(out > v_hi, v_hi, gl.where(out < v_lo, v_lo, out))
    if SPARSE:
        out = gl.where(has_keys, clamped, out)
    else:
        out = clamped
    r = gl.arange(0, WG_ROWS, layout=o_rows)  # within the CTA (o_offset: its first row)
    ptrs_o = Out + o_offset + r[:, None] * stride_om + d[None, :]
    gl.store(ptrs_o, out.to(Out.dtype.element_ty), mask=(m_start + r < N_Q)[:, None] & (d < D_OUT)[None, :])


@gluon.jit
def _attn_fwd_sm90_kernel(
    q_desc, k_desc, v_desc, QScale, KScale, VScale, VRange, Out, KeyTiles, Counts, Order,
    stride_ob, stride_oh, stride_om,
    stride_tb, stride_th, stride_tm, stride_cb, stride_ch, stride_cm,
    H, H_KV, N_Q, N_K, M_PAD, N_PAD, D_OUT,
    BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, NUM_STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """Grid (query tiles of 64 rows, B·H): one consumer warpgroup and one producer warp per CTA.
    SPARSE (block-sparse lists in 64-row query tiles): grid (items,), CTA i takes item Order[i]
    (bh·M_TILES + tile, longest list first: `attention_fwd.item_order`) and visits the key tiles of
    its list, KeyTiles/Counts at (b, h, tile) through their strides (0: one list for every batch row
    or head); the others are never loaded."""
    if SPARSE:
        item = gl.load(Order + gl.program_id(0))
        bh = item // (M_PAD // WG_ROWS)
        tile = item % (M_PAD // WG_ROWS)
    else:
        tile = gl.program_id(0)
        bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    bh_kv = b * H_KV + h // (H // H_KV)  # grouped-query attention: the K/V head of query head h
    m_start = tile * WG_ROWS
    if SPARSE:
        key_list = KeyTiles + b * stride_tb + h * stride_th + tile * stride_tm
        n_tiles = gl.load(Counts + b * stride_cb + h * stride_ch + tile * stride_cm)
    else:
        key_list = KeyTiles  # never read
        n_tiles = gl.cdiv(N_K, BLOCK_N)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)

    bufs = (q_smem, k_smem, v_smem)
    bars = (q_bar, ready, empty)
    ptrs = (QScale, KScale, VScale, Out, VRange, key_list)
    # Scalars the partitions share, by position (worker partitions take no keyword structs):
    # 0 first Q-code row, 1 first K-code row, 2 first Vᵀ row, 3 key tiles visited, 4 N_Q, 5 N_K, 6 Q-scale
    # row, 7 K-scale row, 8 output offset of the CTA's first row, 9 output row stride, 10 V-scale row,
    # 11 M_PAD, 12 first query row of the CTA within the head, 13 head dim written.
    # The output offset is int64 (B·H·N·D may pass 2^31); TMA coordinates are rows, far below 2^31.
    o_offset = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh + m_start.to(gl.int64) * stride_om
    dims = (bh * M_PAD + m_start, bh_kv * N_PAD, bh_kv * HEAD_D, n_tiles, N_Q, N_K,
            bh * M_PAD, bh_kv * N_PAD, o_offset, stride_om, bh_kv * HEAD_D, M_PAD, m_start, D_OUT)
    # One argument list for both partitions (worker partitions must share a signature; spelled out
    # in each entry: a tuple assigned to a name first would turn the constexprs into tensors).
    gl.warp_specialize([
        (_consumer, (q_desc, k_desc, v_desc, bufs, bars, ptrs, dims, BLOCK_N, HEAD_D, NUM_STAGES, SPARSE)),
        (_producer, (q_desc, k_desc, v_desc, bufs, bars, ptrs, dims, BLOCK_N, HEAD_D, NUM_STAGES, SPARSE)),
    ], [1], [PRODUCER_REGS])


def supports(*, pv: str, is_causal: bool, has_mask: bool, per_token: bool, return_lse: bool) -> str:
    """'' when this kernel computes the call, else why the plain-Triton kernel must."""
    if pv != "fp8":
        return "the sm90 kernel implements FP8 PV only"
    if is_causal or has_mask or per_token or return_lse:
        return "the sm90 kernel takes no causal mask, key mask, per-token K scales or LSE"
    return ""


def _descriptor(t: torch.Tensor, block: list[int], dtype):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def attention_forward_sm90(prepared: QuantizedInputs, out: torch.Tensor, *, block_n: int, n_q: int, n_k: int,
                           num_stages: int = 2, tile_lists: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Launch on `prepared` (FP8 V, the plan's tiles) writing `out` (B, H, Nq, D), a view with unit
    head-dim stride in the inputs' 16-bit dtype. num_stages: K/V ring stages (the plan's).
    tile_lists (block-sparse, `sparse_reference.TileLists`' tensors in 64-row query tiles): key tiles
    int32 (B or 1, H or 1, M_TILES, W) ascending, then anything; counts int32 (B or 1, H or 1, M_TILES).
    Query tiles run longest list first (`attention_fwd.scheduled_lists`, on the device: no host sync)."""
    batch, heads, _, head_dim = out.shape
    bh, m_pad, block_d = prepared.q_codes.shape
    bh_kv, n_pad, _ = prepared.k_codes.shape
    q_desc = _descriptor(prepared.q_codes.view(bh * m_pad, block_d), [WG_ROWS.value, block_d], gl.int8)
    k_desc = _descriptor(prepared.k_codes.view(bh_kv * n_pad, block_d), [block_n, block_d], gl.int8)
    v_desc = _descriptor(prepared.v_fp8_t.view(bh_kv * block_d, n_pad), [block_d, block_n], gl.float8e4nv)
    m_tiles = m_pad // WG_ROWS.value
    if tile_lists is None:
        grid = (m_tiles, bh)
        indices = counts = order = prepared.q_scale  # never read
        list_strides = (0,) * 6
    else:
        if tile_lists[0].shape[-2] != m_tiles or m_pad % WG_ROWS.value:
            raise ValueError(f"the Gluon sm90 kernel takes lists in {WG_ROWS.value}-row query tiles: "
                             f"{m_tiles} of them here, not {tile_lists[0].shape[-2]}")
        indices, counts, order = scheduled_lists(tile_lists, batch, heads, m_tiles)
        grid = (order.numel(),)
        list_strides = (*indices.stride()[:3], *counts.stride())
    _attn_fwd_sm90_kernel[grid](
        q_desc, k_desc, v_desc, prepared.q_scale, prepared.k_scale, prepared.v_scale, prepared.v_range, out,
        indices, counts, order,
        out.stride(0), out.stride(1), out.stride(2), *list_strides,
        heads, bh_kv // batch, n_q, n_k, m_pad, n_pad, head_dim,
        BLOCK_N=block_n, HEAD_D=block_d, NUM_STAGES=num_stages, PRODUCER_REGS=PRODUCER_REGS,
        SPARSE=tile_lists is not None, num_warps=4, maxnreg=MAXNREG,
    )


def compile_for_sm90(head_d: int, *, block_n: int = 128, num_stages: int = 2, out_dtype: str = "bf16",
                     sparse: bool = False):
    """Compile the kernel for sm_90 without a GPU (no driver needed): the compiled kernel, with
    `.asm["ptx"]`, `.asm["cubin"]` and `.metadata.shared`. Layout and type errors surface here on any
    machine. out_dtype: "bf16" or "fp16", the output's (= the inputs') dtype; sparse: the block-sparse
    variant (tile lists)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    def desc_type(dtype: str, block: list[int], gl_dtype) -> str:
        layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
        return f"tensordesc<{dtype}[{','.join(map(str, block))}],{layout!r}>"

    signature = {
        "q_desc": desc_type("i8", [WG_ROWS.value, head_d], gl.int8),
        "k_desc": desc_type("i8", [block_n, head_d], gl.int8),
        "v_desc": desc_type("fp8e4nv", [head_d, block_n], gl.float8e4nv),
        "QScale": "*fp32", "KScale": "*fp32", "VScale": "*fp32", "VRange": "*fp32", "Out": f"*{out_dtype}",
        "KeyTiles": "*i32", "Counts": "*i32", "Order": "*i32",
        **dict.fromkeys(("stride_ob", "stride_oh", "stride_om", "stride_tb", "stride_th", "stride_tm", "stride_cb",
                         "stride_ch", "stride_cm", "H", "H_KV", "N_Q", "N_K", "M_PAD", "N_PAD", "D_OUT"), "i32"),
    }
    constexprs = {"BLOCK_N": block_n, "HEAD_D": head_d, "NUM_STAGES": num_stages, "PRODUCER_REGS": PRODUCER_REGS,
                  "SPARSE": sparse}
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    source = GluonASTSource(fn=_attn_fwd_sm90_kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": MAXNREG})
