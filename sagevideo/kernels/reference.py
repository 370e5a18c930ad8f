"""Pure-PyTorch emulation of the Triton kernels' numerics, on any device.

It is the oracle for kernel tests (same groups, scales, rounding and block-wise online softmax,
so results differ from the kernels only by fp32 summation order and, on the GPU, by the
hardware's approximate exp2; under the CPU interpreter also by the FMAs of the exponent and of
the INT8 rounding, which numpy rounds as a multiply and an add: a code may then flip by one where
the product lies within an ulp of a tie) and the engine of `sagevideo simulate`.

Numerics, step by step (all tensors HND: (B, H, N, D)):
1. Smoothing: K ← K − mean(K over valid tokens) in fp32; invalid (masked) keys are set to 0.
2. Optional rotation (`rotate_qk`): Q and K zero-padded to the kernel head dim d' (64/128, else
   the next power of two) and multiplied by the ±1 Hadamard matrix R of `rotation.py` (fp32);
   the resulting factor d' is divided out of Q's scale.
   Q's scale carries qk_scale = sm_scale · log2(e) [/ d'], so scores come out in log2 units for exp2.
3. INT8 symmetric quantization per group of rows (a tile of BLOCK_M/BLOCK_N rows, or one row):
   x_q = round-half-even(x · (127 / max|x|)), the product rounded once; scale = max|x| / 127
   (1 where the group is all zero, NaN where it holds a NaN or inf; for Q, a row holding a NaN or
   inf gets the NaN scale alone, so the NaN stays in its row as with SDPA). Q's factor sm_scale·log2(e)
   goes into its scale only: q_scale = (max|q| · qk_scale) / 127.
4. Per key tile j: S = (Q_q · K_qᵀ in exact integers) · (q_scale · k_scale) (fp32), invalid keys → −inf,
   online softmax: m' = max(m, rowmax S), P = exp2(S − m'), l = l·exp2(m − m') + rowsum P.
   With one K scale per tile the kernels take the max on the integer scores and compute S − m'
   as one FMA of the integer score, the row's scale and −m' (a single rounding; emulated here);
   the row's scale q_scale·k_scale is floored at the smallest normal fp32 (MIN_ROW_SCALE).
5. PV, "fp16": acc = acc·α + P.to(t) @ V.to(t) with fp32 accumulation, t = V's dtype when 16-bit;
   wider inputs (reference only) round P to float16 and keep V as given.
   "fp8": V scaled per channel by max|V over valid tokens| / 448 to e4m3 once;
   P is computed as exp2(S − m + log2 448) (pre-scaled to fill e4m3; l carries the same factor),
   per tile a fresh fp32 block product P_e4m3 @ V_e4m3 is added into the running acc
   (two-level accumulation); the output acc / l is rescaled by v_scale.
   "fp32" (simulation only): P and V unquantized.
6. O = acc / l (0 where l = 0, i.e. every key masked); LSE = ln2 · (m + log2 l) + sm_scale · q·mean(K).
7. O clamped per channel to [min V, max V] over the valid keys (`bounds.clamp_to_v_hull`): attention
   is a convex combination of V's rows, and P's rounding (l sums the unrounded P) can carry it
   past them (a constant V would come back 1-2% off, V near the 16-bit maximum as inf).
"""

from __future__ import annotations

import math

import torch

from sagevideo.kernels.bounds import clamp_to_v_hull
from sagevideo.kernels.constants import FP8_MAX, LN2, LOG2_FP8_MAX, LOG2E, MIN_ROW_SCALE, TINY_AMAX
from sagevideo.kernels.guard import flagged_tiles
from sagevideo.kernels.plans import padded_head_dim
from sagevideo.kernels.rotation import hadamard_pm1

REFERENCE_PV_MODES = ("fp16", "fp8", "fp32")


def _div_fp32(a: torch.Tensor | float, b: torch.Tensor | float) -> torch.Tensor:
    """a / b correctly rounded to fp32, as the kernels' div_rn: in fp64 (53 ≥ 2·24 + 2 bits, so
    rounding twice equals rounding once). PyTorch's own fp32 division by or of a scalar multiplies
    by a rounded reciprocal (CPU and CUDA), which is off by an ulp in a fraction of groups."""
    a64 = a.double() if isinstance(a, torch.Tensor) else a
    b64 = b.double() if isinstance(b, torch.Tensor) else b
    return torch.as_tensor(a64 / b64).float()


def abs_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """max|x| along `dim`, NaN where the group holds a NaN or ±inf (as the kernels: NaN inputs
    must give NaN outputs, and an infinite scale would hide them)."""
    amax = x.abs().amax(dim=dim)
    return torch.where(torch.isinf(amax), torch.nan, amax)


def quantize_symmetric(
    x: torch.Tensor, group: int, bits: int = 8, scale_factor: float = 1.0, row_local_nonfinite: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric integer quantization with one scale per `group` consecutive rows.

    x: (B, H, N, D) fp32. Returns (codes as fp32 integers in [-qmax, qmax], scales (B, H, N) fp32),
    each row carrying its group's scale (what the kernels store and load).
    codes = round-half-even(x · (qmax / max|x|)) with the product rounded once (the kernels fuse
    it into the rounding add; fp64 holds it exactly); scale = (max|x| · fp32(scale_factor)) / qmax,
    1 for an all-zero group, NaN for a group holding a NaN or inf.
    row_local_nonfinite (Q): a row holding a NaN or inf gets a NaN scale alone and its group's scale
    comes from the other rows, so that the NaN reaches only that row's output (as in SDPA).
    """
    qmax = float(2 ** (bits - 1) - 1)
    batch, heads, n, d = x.shape
    n_groups = math.ceil(n / group)
    row_bad = ~torch.isfinite(x).all(dim=-1) if row_local_nonfinite else None
    if row_bad is not None:
        x = torch.where(row_bad[..., None], 0.0, x)
    padded = torch.nn.functional.pad(x, (0, 0, 0, n_groups * group - n))
    amax = abs_max(padded.reshape(batch, heads, n_groups, group * d), dim=-1)
    zero = amax == 0
    amax = torch.clamp(amax, min=TINY_AMAX)  # NaN stays NaN
    factor = torch.tensor(scale_factor, dtype=torch.float32, device=x.device)
    inv = torch.where(zero, 1.0, _div_fp32(qmax, amax))
    scale = torch.where(zero, 1.0, _div_fp32(amax * factor, qmax))
    row_inv = inv.repeat_interleave(group, dim=-1)[..., :n]
    codes = torch.round(x.double() * row_inv.double()[..., None]).float().clamp(-qmax, qmax)
    row_scale = scale.repeat_interleave(group, dim=-1)[..., :n]
    if row_bad is not None:
        row_scale = torch.where(row_bad, torch.nan, row_scale)
    return codes, row_scale


def smoothed_k(k: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(K − mean over valid tokens with invalid rows zeroed, mean (B, H, D)); fp32. Invalid rows
    take no part, whatever they hold (NaN included), as in the kernels, which never load them."""
    kf = k.float()
    if valid is None:
        mean = kf.mean(dim=2)
        return kf - mean[:, :, None], mean
    keep = valid[:, None, :, None]  # (B', 1, Nk, 1)
    kf = torch.where(keep, kf, 0.0)
    count = keep.to(torch.float32).sum(dim=2).clamp(min=1.0)
    mean = kf.sum(dim=2) / count
    return torch.where(keep, kf - mean[:, :, None], 0.0), mean


def quantize_v_fp8(v: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel FP8 e4m3 V: (codes as float8_e4m3fn (B, H, Nk, D), scales (B, H, D) fp32)."""
    vf = v.float()
    if valid is not None:
        vf = torch.where(valid[:, None, :, None], vf, 0.0)
    amax = vf.abs().amax(dim=2)
    scale = torch.where(amax > 0, _div_fp32(torch.clamp(amax, min=TINY_AMAX), FP8_MAX), 1.0)
    inv = _div_fp32(1.0, scale)  # the kernels multiply by the reciprocal
    return (vf * inv[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def mma_key_permutation(n: int) -> torch.Tensor:
    """Positions of `quantize.mma_key_order` (n a multiple of 32): x[..., mma_key_permutation(n)]
    puts x's keys in the order the kernels take FP8 Vᵀ in (`QuantizedInputs.v_fp8_t`);
    indexing with its argsort restores the natural order."""
    return torch.arange(n).reshape(n // 32, 2, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(n)


def _matmul_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 result of a @ b accumulated in fp64: one rounding, independent of TF32 settings and
    summation order, so the oracle is the same on every device."""
    return (a.double() @ b.double()).float()


def rotation_dim(head_dim: int) -> int:
    """Dimension Q and K are rotated in: the kernel's padded head dim, else the next power of two."""
    return padded_head_dim(head_dim) or 1 << (head_dim - 1).bit_length()


def _quantized_qk(
    q: torch.Tensor, ks: torch.Tensor, *, sm_scale: float, rotate_qk: bool, group_q: int, group_k: int, qk_bits: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q codes, q scales, k codes, k scales) of q and the smoothed K `ks`: `sm_scale·log2(e)` folded
    into Q's scale, both rotated by the same random-sign Hadamard matrix first with `rotate_qk`
    (the rotation's 1/dim folded into the scale too)."""
    qk_scale = sm_scale * LOG2E
    qf = q.float()
    if rotate_qk:
        dim = rotation_dim(q.shape[3])
        rot = hadamard_pm1(dim, q.device)
        pad = (0, dim - q.shape[3])
        qf = _matmul_fp32(torch.nn.functional.pad(qf, pad), rot)
        ks = _matmul_fp32(torch.nn.functional.pad(ks, pad), rot)
        qk_scale = qk_scale / dim
    q_codes, q_scale = quantize_symmetric(qf, group_q, qk_bits, scale_factor=qk_scale, row_local_nonfinite=True)
    k_codes, k_scale = quantize_symmetric(ks, group_k, qk_bits)
    return q_codes, q_scale, k_codes, k_scale


def _v_operand(
    v: torch.Tensor, valid: torch.Tensor | None, pv: str
) -> tuple[torch.Tensor, torch.Tensor | None, torch.dtype | None]:
    """(V as the P·V product reads it, fp32; per-channel FP8 scales or None; P's 16-bit dtype or None),
    padded keys' rows zeroed."""
    if pv == "fp8":
        v_codes, v_scale = quantize_v_fp8(v, valid)
        return v_codes.float(), v_scale, None
    if pv == "fp16":
        # 16-bit inputs: P in V's dtype, as the kernels. Wider inputs (which the kernels do not
        # take): P in fp16 (it lies in [0, 1]) and V as given, since fp16 would overflow past 65504.
        pv_dtype = v.dtype if v.dtype in (torch.float16, torch.bfloat16) else torch.float16
        v_kept = v if valid is None else torch.where(valid[:, None, :, None], v, 0.0)
        return (v_kept.to(pv_dtype) if v.dtype in (torch.float16, torch.bfloat16) else v_kept).float(), None, pv_dtype
    return (v.float() if valid is None else torch.where(valid[:, None, :, None], v.float(), 0.0)), None, None


def _p_operand(p: torch.Tensor, pv: str, pv_dtype: torch.dtype | None) -> torch.Tensor:
    """P rounded as the P·V product takes it (FP8 e4m3, the 16-bit dtype, or fp32), in fp32."""
    if pv == "fp8":
        # saturate like the GPU's cvt.satfinite: exp2(log2 448) may round just above 448
        return p.clamp(max=FP8_MAX).to(torch.float8_e4m3fn).float()
    if pv == "fp16":
        return p.to(pv_dtype).float()
    return p


def _rows_visiting(key_tiles: torch.Tensor, key_tile: int, block_m: int, n_q: int) -> torch.Tensor:
    """bool (B or 1, H or 1, Nq): the query rows whose tile visits `key_tile`."""
    return key_tiles[:, :, :, key_tile].repeat_interleave(block_m, dim=2)[:, :, :n_q]


def sageattn_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sm_scale: float,
    block_m: int,
    block_n: int,
    is_causal: bool = False,
    key_mask: torch.Tensor | None = None,
    qk_granularity: str = "block",
    pv: str = "fp16",
    smooth_k: bool = True,
    rotate_qk: bool = False,
    return_lse: bool = False,
    qk_bits: int = 8,
    count_flagged: bool = False,
    key_tiles: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None] | tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Emulated quantized attention. q (B, H, Nq, D), k/v (B, H, Nk, D) HND; key_mask (B', Nk) bool.

    key_tiles (block-sparse attention, `sparse_reference`): bool (B or 1, H or 1, ceil(Nq/block_m),
    ceil(Nk/block_n)), the key tiles each query tile visits; a skipped tile leaves its rows' softmax
    state as it was (never loaded), rows that visit no key are 0. None visits every tile.
    Returns (out in q's dtype, LSE fp32 (B, H, Nq) or None), and with `count_flagged` also the
    run-time guard's count of query tiles past INT8's accuracy (`guard.flagged_tiles`, int32 0-dim).
    """
    if pv not in REFERENCE_PV_MODES:
        raise ValueError(f"pv={pv!r} is not one of {REFERENCE_PV_MODES}")
    if qk_granularity not in ("block", "token"):
        raise ValueError(f"qk_granularity={qk_granularity!r} is not 'block' or 'token'")
    n_q, n_k = q.shape[2], k.shape[2]
    valid = None if key_mask is None else key_mask.to(device=q.device, dtype=torch.bool)

    if smooth_k:
        ks, k_mean = smoothed_k(k, valid)
    else:
        ks = k.float() if valid is None else torch.where(valid[:, None, :, None], k.float(), 0.0)
        k_mean = torch.zeros(k.shape[0], k.shape[1], k.shape[3], device=k.device)
    group_q, group_k = (block_m, block_n) if qk_granularity == "block" else (1, 1)
    q_codes, q_scale, k_codes, k_scale = _quantized_qk(q, ks, sm_scale=sm_scale, rotate_qk=rotate_qk,
                                                       group_q=group_q, group_k=group_k, qk_bits=qk_bits)
    v_operand, v_scale, pv_dtype = _v_operand(v, valid, pv)

    batch, heads = q.shape[0], q.shape[1]
    m = torch.full((batch, heads, n_q), float("-inf"), device=q.device)
    l = torch.zeros(batch, heads, n_q, device=q.device)
    acc = torch.zeros(batch, heads, n_q, v.shape[3], device=q.device)
    rows = torch.arange(n_q, device=q.device)
    # FP8: P is computed pre-scaled by 448 (log2 448 folded into the subtracted max) so it fills
    # the e4m3 range; l and acc carry the same factor, which cancels in acc / l.
    p_shift = LOG2_FP8_MAX if pv == "fp8" else 0.0
    for start in range(0, n_k, block_n):
        stop = min(start + block_n, n_k)
        visits = None if key_tiles is None else _rows_visiting(key_tiles, start // block_n, block_m, n_q)
        if visits is not None and not visits.any():
            continue
        # Integer products summed in fp64 are exact (|sum| < 2^53), like the int32 dot.
        s_int = (q_codes.double() @ k_codes[:, :, start:stop].double().transpose(-1, -2)).float()
        if qk_granularity == "block":  # one K scale per tile: one scale per row
            row_scale = (q_scale * k_scale[:, :, start:start + 1]).clamp(min=MIN_ROW_SCALE)
            s = s_int * row_scale[..., None]
        else:
            s = s_int * (q_scale[..., None] * k_scale[:, :, None, start:stop])
        cols = torch.arange(start, stop, device=q.device)
        if valid is not None:
            s = s.masked_fill(~valid[:, None, None, start:stop], float("-inf"))
        if is_causal:
            s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
        if visits is not None:
            s = s.masked_fill(~visits[..., None], float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows with no key yet
        alpha = torch.exp2(m - m_safe)
        m_sub = m_safe - p_shift
        if qk_granularity == "block":
            # The kernels scale after the max and fuse S − m into one FMA (one rounding): emulated
            # in fp64, exact for the product (int < 2^24 times fp32) before the final rounding.
            fused = s_int.double() * row_scale.double()[..., None] - m_sub.double()[..., None]
            p = torch.exp2(torch.where(torch.isinf(s), s, fused.float()))
        else:
            p = torch.exp2(s - m_sub[..., None])
        v_tile = v_operand[:, :, start:stop]
        l = l * alpha + p.sum(dim=-1)
        acc_new = acc * alpha[..., None] + _matmul_fp32(_p_operand(p, pv, pv_dtype), v_tile)
        # a row whose tile skips this one keeps its acc even where V is not finite (0 · inf)
        acc = acc_new if visits is None else torch.where(visits[..., None], acc_new, acc)
        m = m_new

    has_keys = l != 0  # NaN (NaN inputs) stays NaN, as in the kernels
    out = torch.where(has_keys[..., None], acc / torch.where(has_keys, l, 1.0)[..., None], 0.0)
    if pv == "fp8":
        out = out * v_scale[:, :, None, :]
    out = clamp_to_v_hull(out, v.float(), valid, is_causal=is_causal)
    if key_tiles is not None:  # the kernels clamp only rows that have keys: the others stay 0
        out = torch.where(has_keys[..., None], out, 0.0)
    lse = None
    if return_lse:
        lse2 = torch.where(has_keys, m - p_shift + torch.log2(torch.where(has_keys, l, 1.0)), float("-inf"))
        lse = lse2 * LN2 + sm_scale * _matmul_fp32(q.float(), k_mean[..., None]).squeeze(-1)
    if not count_flagged:
        return out.to(q.dtype), lse
    flagged = flagged_tiles(q_scale.flatten(0, 1), k_scale.flatten(0, 1), block_m=block_m, head_dim=q.shape[3],
                            granularity=qk_granularity, pv=pv)
    return out.to(q.dtype), lse, flagged


@torch.library.custom_op("sagevideo::reference_attention", mutates_args=())
def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    sm_scale: float,
    block_m: int,
    block_n: int,
    is_causal: bool,
    qk_granularity: str,
    pv: str,
    smooth_k: bool,
    rotate_qk: bool,
    return_lse: bool,
    key_tiles: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sageattn_reference` as one op: (out like q, LSE (B, H, Nq) fp32, empty unless return_lse,
    the guard's flagged query tiles, int32 0-dim). Opaque to torch.compile (its loop over key tiles
    would unroll per sequence length and recompile for every new one), and one named event for profilers.
    key_tiles: a block-sparse call's tile mask in (block_m, block_n) tiles (`sageattn_reference`)."""
    out, lse, flagged = sageattn_reference(
        q, k, v, sm_scale=sm_scale, block_m=block_m, block_n=block_n, is_causal=is_causal, key_mask=key_mask,
        qk_granularity=qk_granularity, pv=pv, smooth_k=smooth_k, rotate_qk=rotate_qk, return_lse=return_lse,
        count_flagged=True, key_tiles=key_tiles,
    )
    return out, lse if lse is not None else q.new_empty(0, dtype=torch.float32), flagged


@reference_attention.register_fake
def _(q, k, v, key_mask, sm_scale, block_m, block_n, is_causal, qk_granularity, pv, smooth_k, rotate_qk, return_lse,
      key_tiles=None):
    lse_shape = q.shape[:3] if return_lse else (0,)
    return (torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(lse_shape, dtype=torch.float32),
            q.new_empty((), dtype=torch.int32))
