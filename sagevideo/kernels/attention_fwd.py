"""Triton attention forward: INT8 QK into int32, fp32 online softmax with exp2, FP16 or FP8 PV.

One kernel body with `tl.constexpr` switches (causal, key mask, FP8 PV, LSE) and an inner-loop
helper, after Triton's fused-attention tutorial. Grid: (query tiles, B·H); each program streams
the key/value tiles of its head. Inputs come from `quantize.quantize_inputs`; the 16-bit PV
path reads V directly from the caller's tensor (no copy).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from sagevideo.kernels.plans import KernelPlan
from sagevideo.kernels.quantize import QuantizedInputs
from sagevideo.kernels.reference import LN2

LN2_CONST = tl.constexpr(LN2)


@triton.jit
def _attn_tile(
    acc, l_i, m_i, q, q_scale,
    KQ, KScale, V, VQ, Mask, b, mask_stride_b,
    start_n, offs_m, offs_d, v_row_stride, v_col_stride,
    N_K, N_PAD,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, CHECK_KEYS: tl.constexpr, HAS_MASK: tl.constexpr, FP8_PV: tl.constexpr,
):
    """One key tile: scores, online-softmax update and the PV product. Returns (acc, l_i, m_i)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    # K codes are stored (N_PAD, BLOCK_D) row-major: load the tile transposed for Q·Kᵀ.
    k = tl.load(KQ + offs_n[None, :] * BLOCK_D + offs_d[:, None])
    k_scale = tl.load(KScale + offs_n)
    s = tl.dot(q, k, out_dtype=tl.int32).to(tl.float32) * q_scale[:, None] * k_scale[None, :]
    if CHECK_KEYS:
        key_ok = offs_n < N_K
        if HAS_MASK:
            key_ok = key_ok & (tl.load(Mask + b * mask_stride_b + offs_n, mask=offs_n < N_K, other=0) != 0)
        s = tl.where(key_ok[None, :], s, float("-inf"))
    if CAUSAL:
        s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # Rows that have seen no valid key yet keep m = -inf; subtract 0 there instead (no NaN).
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if FP8_PV:
        # VQ is (BLOCK_D, N_PAD), contiguous along keys: the K-major operand FP8 MMAs need.
        v = tl.load(VQ + offs_d[None, :] * N_PAD + offs_n[:, None])
        p8 = (p * 448.0).to(tl.float8e4nv)
        acc += tl.dot(p8, v)  # fresh fp32 block product added into acc: two-level accumulation
    else:
        v_ok = offs_d[None, :] < HEAD_DIM
        if CHECK_KEYS:
            v_ok = v_ok & key_ok[:, None]
        v = tl.load(V + offs_n[:, None] * v_row_stride + offs_d[None, :] * v_col_stride, mask=v_ok, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _attn_fwd_kernel(
    QQ, QScale, QShift, KQ, KScale, V, VQ, VScale, Mask, Out, Lse,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    mask_stride_b,
    H, N_Q, N_K, M_PAD, N_PAD,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, CHECK_KEYS: tl.constexpr, FP8_PV: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(QQ + bh * M_PAD * BLOCK_D + offs_m[:, None] * BLOCK_D + offs_d[None, :])
    q_scale = tl.load(QScale + bh * M_PAD + offs_m)
    kq = KQ + bh * N_PAD * BLOCK_D
    k_scale = KScale + bh * N_PAD
    v = V + b * stride_vb + h * stride_vh
    vq = VQ + bh * BLOCK_D * N_PAD

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    hi = N_K
    if CAUSAL:
        hi = tl.minimum(N_K, (tile + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        acc, l_i, m_i = _attn_tile(
            acc, l_i, m_i, q, q_scale, kq, k_scale, v, vq, Mask, b, mask_stride_b,
            start_n, offs_m, offs_d, stride_vn, 1, N_K, N_PAD,
            HEAD_DIM, BLOCK_N, BLOCK_D, CAUSAL, CHECK_KEYS, HAS_MASK, FP8_PV,
        )

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if FP8_PV:
        out = out * (tl.load(VScale + bh * BLOCK_D + offs_d) / 448.0)[None, :]
    m_ok = offs_m < N_Q
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    if STORE_LSE:
        shift = tl.load(QShift + bh * M_PAD + offs_m)
        lse = (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * LN2_CONST + shift
        lse = tl.where(has_keys, lse, float("-inf"))
        tl.store(Lse + bh * N_Q + offs_m, lse, mask=m_ok)


def attention_forward(
    prepared: QuantizedInputs,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    plan: KernelPlan,
    *,
    is_causal: bool,
    n_q: int,
    n_k: int,
) -> None:
    """Launch the attention kernel, writing `out` (B, H, Nq, D) view and `lse` (B·H, Nq) fp32."""
    batch, heads, _, head_dim = out.shape
    bh = batch * heads
    m_pad = prepared.q_codes.shape[1]
    n_pad = prepared.k_codes.shape[1]
    fp8_pv = plan.pv == "fp8"
    mask_arg = key_mask if key_mask is not None else prepared.k_scale
    mask_stride_b = 0 if key_mask is None or key_mask.shape[0] == 1 else key_mask.stride(0)
    wrap_triton(_attn_fwd_kernel)[(m_pad // plan.block_m, bh)](
        prepared.q_codes, prepared.q_scale,
        prepared.q_shift if prepared.q_shift is not None else prepared.q_scale,
        prepared.k_codes, prepared.k_scale, v,
        prepared.v_fp8_t if fp8_pv else prepared.k_codes,
        prepared.v_scale if fp8_pv else prepared.k_scale,
        mask_arg, out, lse if lse is not None else prepared.q_scale,
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        mask_stride_b,
        heads, n_q, n_k, m_pad, n_pad,
        HEAD_DIM=head_dim, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d,
        CAUSAL=is_causal, HAS_MASK=key_mask is not None,
        # key validity needs checking only with a mask or a partial last key tile
        CHECK_KEYS=key_mask is not None or n_k % plan.block_n != 0,
        FP8_PV=fp8_pv, STORE_LSE=lse is not None,
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
