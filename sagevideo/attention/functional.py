"""The attention calls users make: `scaled_dot_product_attention` (SDPA's exact signature, the
one-import switch) and `sageattn` (SageAttention's, with layout and quantization options).

This is the user-facing layer: it validates arguments (clear errors before any GPU work),
normalises layout and mask, picks the backend that can run through the registry (`backends`:
constraint checks with reasons, the auto/explicit policy), records the choice
(`sagevideo.last_backend()`, `sagevideo.record_backends()`, also from inside a torch.compile'd
graph), and calls
- the Triton op `torch.ops.sagevideo.sageattn_fwd` (INT8 QK, FP16/FP8 PV), or on Hopper, where the
  plan names it and the call allows it (`kernels.dispatch.kernel_for`), the Gluon sm90 kernel's op
  `torch.ops.sagevideo.sageattn_fwd_gluon` (recorded "gluon"; eagerly and under torch.compile),
- the pure-PyTorch reference that emulates the same numerics, or
- full-precision SDPA: torch's own (`TORCH_SDPA`), also where user code has replaced
  `torch.nn.functional.scaled_dot_product_attention` with sagevideo's.
Forward only: the quantized backends refuse backward with one error; "sdpa" differentiates as SDPA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sagevideo.attention import records, sparse
from sagevideo.attention.backends import CHOICES as BACKENDS
from sagevideo.attention.backends import GLUON, KEY_PADDING_MASK, AttentionCall, Backend, choose
from sagevideo.choices import GRANULARITIES, auto_pv
from sagevideo.kernels import plans
from sagevideo.kernels.sparse_reference import TileLists, TileMask
from sagevideo.kernels.tile_select import DynamicSelection

# torch's own SDPA, the builtin `torch.nn.functional.scaled_dot_product_attention` is bound to: every
# full-precision path calls it, so that `F.scaled_dot_product_attention = sagevideo.scaled_dot_product_attention`
# (SageAttention users' global replacement) does not recurse. The same object as F's until someone replaces
# F's: a TorchFunctionMode that intercepts `func is F.scaled_dot_product_attention` sees these calls as SDPA.
TORCH_SDPA = torch._C._nn.scaled_dot_product_attention
LAYOUTS = ("HND", "NHD")
REFERENCE_PROFILE_NAME = "sagevideo::reference_attention"  # the reference op: its name in profiles
BACKWARD_ERROR = (
    "sagevideo attention is forward-only: the quantized backends have no backward. Run inference under "
    "torch.no_grad() / torch.inference_mode(), or use backend='sdpa' (full precision) where gradients are needed"
)

def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    backend: str = "auto",
    pv: str = "auto",
    qk_granularity: str = "block",
    tile_mask: TileMask | TileLists | DynamicSelection | None = None,
    _guard_counter: torch.Tensor | None = None,
    _sparse_counter: torch.Tensor | None = None,
    _kept_tiles: sparse.KeptTiles | None = None,
) -> torch.Tensor:
    """`torch.nn.functional.scaled_dot_product_attention` with sagevideo's quantized attention.

    Same signature and semantics as SDPA, so model code switches with one import: query (..., Hq, L, E),
    key and value (..., H, S, E) of rank 3 or more, batch dims broadcast as SDPA's (ranks may
    differ; a size-1 dim of any of them broadcasts, heads included: one K/V head serves every query
    head); with enable_gqa, key/value heads may divide the query's instead. attn_mask broadcastable
    to (..., Hq, L, S) (bool: True = attend, or additive float), also with is_causal=True: both apply
    (causal aligned top-left), as torch's fused CPU, efficient and cuDNN kernels compute it (its
    docs call it an error, which its math kernel raises; where SDPA runs, SDPA decides); scale
    defaulting to 1/sqrt(E) (0 or negative computes as SDPA defines it: `_with_positive_scale`).
    Returns (..., Hq, L, E) in query's dtype, the broadcast batch dims leading.

    Keyword-only extras: backend ("auto", "triton", "reference", "sdpa"), pv ("auto": FP8 P·V on GPUs
    with FP8 tensor cores (sm89+), else "fp16"; or "fp16"/"fp8") and qk_granularity ("block"/"token").
    The kernels read broadcast K/V heads as grouped-query heads and broadcast batch dims as stride-0
    views (`_kernel_form`). What they cannot compute (dropout_p > 0, a float or non-key-padding
    mask, value's head dim unlike query's, a scale that is not finite, fp32 inputs, CPU tensors,
    shapes SDPA refuses) runs torch's SDPA on the arguments as given under backend="auto",
    recorded with its reason, so that it computes or raises exactly as SDPA; an explicit quantized
    backend raises instead.
    tile_mask: block-sparse attention as `sageattn`'s (its (B, H) those of the call in the kernels'
    form); every backend computes it, SDPA with its token mask. A call the kernels' form cannot take
    (dropout, shapes that do not broadcast) raises ValueError with it: it is never run dense silently.
    _sparse_counter: an installed layer's block-sparse statistics (`sparse.add_call`) a sparse call
    adds its density to, on the device. _kept_tiles: an installed layer's lists kept over steps: a call
    that selects (a `DynamicSelection`) keeps the lists it ran there; any other call is counted as one
    on reused lists.
    """
    _check_options("HND", qk_granularity, "fp16" if pv == "auto" else pv, backend)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"scaled_dot_product_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if pv == "auto":
        pv = auto_pv(query.device)
    query, scale = _with_positive_scale(query, scale)
    form = _kernel_form(query, key, value, attn_mask, enable_gqa)
    problem = form if isinstance(form, str) else _scale_problem(scale)
    if dropout_p or problem:
        call = AttentionCall(query.device, query.dtype, query.shape[-1] if query.dim() else 0, pv=pv,
                             dropout_p=dropout_p, shape_problem=problem)
    else:
        call = _kernel_call(form.q, form.mask, form.k.shape[2], pv, rotate_qk=True)
    chosen, reason = choose(backend, call)
    tiles = None
    if tile_mask is not None:
        if dropout_p or problem:
            raise ValueError(f"scaled_dot_product_attention: this call cannot be block-sparse (tile_mask): "
                             f"{problem or f'dropout_p={dropout_p}'}")
        tiles = sparse.sparse_call(tile_mask, form.q, form.k)
    if chosen is not Backend.SDPA:
        out, _ = _attend(form.q, form.k, form.v, form.mask, is_causal=is_causal,
                         scale=_check_scale(scale, form.q.shape[-1]), qk_granularity=qk_granularity, pv=pv,
                         smooth_k=True, return_lse=False, rotate_qk=True, requested=backend, chosen=chosen,
                         reason=reason, counter=_guard_counter, tiles=tiles, sparse_counter=_sparse_counter,
                         kept=_kept_tiles)
        return out.reshape(form.out_shape)
    if tiles is not None:  # full precision restricted to the same tiles (its token mask)
        selecting = tiles.dynamic
        tiles = _selected_for_sdpa(tiles, form, _check_scale(scale, form.q.shape[-1]), pv)
        out, _ = _sdpa(form.q, form.k, form.v, form.mask, is_causal, _check_scale(scale, form.q.shape[-1]), False,
                       form.k.shape[1] != form.q.shape[1], None if tiles.dense else tiles)
        if _kept_tiles is not None and selecting:
            _kept_tiles.keep_mask(tiles.tile_mask)
        density = _sparse_density(tiles, None, 0, _sparse_counter, reused=_kept_tiles is not None and not selecting)
        _record(backend, chosen.value, None, reason, density)
        return out.reshape(form.out_shape)
    if isinstance(attn_mask, torch.Tensor) and attn_mask.dim() < query.dim():
        # the same mask under broadcasting; torch's own kernels reject a 1-D one (IndexError)
        attn_mask = attn_mask[(None,) * (query.dim() - attn_mask.dim())]
    out = TORCH_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                     enable_gqa=enable_gqa)
    _record(backend, chosen.value, None, reason)  # after the call: one SDPA refuses records nothing
    return out


@dataclass(frozen=True)
class _KernelForm:
    """SDPA-signature inputs as the kernels' call: q (B, H, L, E), k/v (B, H_kv, S, E) with H_kv
    dividing H, mask None or (B' in {1, B}, ·, ·, S) (after `broadcast_dims_dropped`), and the shape
    the (B, H, L, E) output takes."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    out_shape: tuple[int, ...]


def _kernel_form(query, key, value, attn_mask, enable_gqa) -> _KernelForm | str:
    """`_KernelForm` of SDPA-signature inputs under SDPA's broadcasting, or why there is none (SDPA
    then computes the call, or raises as SDPA does). The inputs are right-aligned to one rank: dims
    before -3 (batch) broadcast; dim -3 (heads) broadcasts too, or with enable_gqa K/V heads divide
    the query's. Rank 3 (B, L, E) gets a head dim of 1 (its batch is what a key mask follows),
    unless K/V heads group the query's. Broadcast dims are stride-0 views (`expand`: the kernels
    read q/k/v through their strides, K/V of fewer heads as grouped-query heads); the batch dims
    merge into one (a copy only where no view can: rank 5 and up)."""
    problem = _inputs_problem(query, key, value, attn_mask)
    if problem:
        return problem
    rank = max(query.dim(), key.dim(), value.dim())
    h_q, h_k, h_v = (t.shape[-3] for t in (query, key, value))
    grouped = enable_gqa and not h_q == h_k == h_v
    if grouped and (h_q % h_k or h_q % h_v):
        return f"enable_gqa with {h_q} query heads, {h_k} key and {h_v} value heads: K/V heads must divide"
    fold = rank == 3 and not (grouped and max(h_k, h_v) > 1)

    def aligned(t):
        t = t[(None,) * (rank - t.dim())]
        return t.unsqueeze(-3) if fold else t[(None,) * (4 - min(rank, 4))]

    q, k, v = (aligned(t) for t in (query, key, value))
    try:
        lead = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
    except RuntimeError:
        return f"batch dims of {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)} do not broadcast"
    h_q, h_k, h_v = q.shape[-3], k.shape[-3], v.shape[-3]
    if grouped and not fold:
        heads = h_q
    elif {h_q, h_k, h_v} - {1, max(h_q, h_k, h_v)}:
        return f"heads {h_q}, {h_k}, {h_v} (query, key, value) do not broadcast; enable_gqa groups them"
    else:
        heads = max(h_q, h_k, h_v)
    if h_k != h_v and min(h_k, h_v) != 1:
        return f"{h_k} key heads and {h_v} value heads: the kernels take one K/V head count"
    h_kv = max(h_k, h_v)  # a single K or V head broadcasts to the other's count
    n_q, n_k, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    mask = None if attn_mask is None else _kernel_mask(attn_mask, aligned(attn_mask), (*lead, heads, n_q, n_k))
    if isinstance(mask, str):
        return mask

    def merged(t, h, n):
        return t.expand(*lead, h, n, head_dim).reshape(-1, h, n, head_dim)

    out_shape = (*lead, n_q, head_dim) if fold else (*lead, heads, n_q, head_dim)[-rank:]
    return _KernelForm(merged(q, heads, n_q), merged(k, h_kv, n_k), merged(v, h_kv, n_k), mask, out_shape)


def _inputs_problem(query, key, value, attn_mask) -> str:
    """Why SDPA-signature inputs are not the kernels' kind of call before any broadcasting ('' when
    they are): rank, dtype, device, head dims, empty tensors, the mask's type and rank."""
    ranks = (query.dim(), key.dim(), value.dim())
    if min(ranks) < 3:
        return f"rank {min(ranks)} inputs: the kernels take (..., L, E) of rank 3 or more"
    if not (query.dtype == key.dtype == value.dtype) or not query.is_floating_point():
        return f"dtypes {query.dtype}, {key.dtype}, {value.dtype}: the kernels take one floating dtype"
    if not (query.device == key.device == value.device):
        return f"query, key and value on {query.device}, {key.device}, {value.device}"
    if value.shape[-1] != query.shape[-1]:
        return f"value head dim {value.shape[-1]} differs from query's {query.shape[-1]}"
    if key.shape[-1] != query.shape[-1] or key.shape[-2] != value.shape[-2]:
        return f"key {tuple(key.shape)} does not match query {tuple(query.shape)} and value {tuple(value.shape)}"
    if 0 in (*query.shape, *key.shape, *value.shape):
        return "empty inputs"
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        return f"attn_mask of type {type(attn_mask).__name__}"
    if attn_mask is not None and attn_mask.dim() > max(ranks):
        return f"attn_mask of rank {attn_mask.dim()} above the inputs' {max(ranks)}"
    return ""


def _kernel_mask(attn_mask: torch.Tensor, aligned: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor | str:
    """The mask as the kernels take it, (B' in {1, B}, ·, ·, S) with the batch dims merged, from
    `aligned` (attn_mask right-aligned to the inputs' rank) and the attention's (*batch, H, L, S)
    `target`; or why it does not broadcast to it."""
    if any(got not in (1, want) for got, want in zip(aligned.shape, target, strict=True)):
        return f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the attention's {target}"
    m = broadcast_dims_dropped(aligned)
    rows, lead = m.shape[-3:], target[:-3]
    return m.reshape(1, *rows) if all(d == 1 for d in m.shape[:-3]) else m.expand(*lead, *rows).reshape(-1, *rows)


def _kernel_call(q: torch.Tensor, attn_mask: torch.Tensor | None, n_k: int, pv: str, rotate_qk: bool) -> AttentionCall:
    """The `AttentionCall` of a rank-4 HND call (attn_mask after `broadcast_dims_dropped`)."""
    return AttentionCall(q.device, q.dtype, q.shape[-1], pv=pv, rotate_qk=rotate_qk,
                         mask_dtype=None if attn_mask is None else attn_mask.dtype,
                         mask_shape=None if attn_mask is None else tuple(attn_mask.shape), n_k=n_k)


def _with_positive_scale(query: torch.Tensor, scale: float | None) -> tuple[torch.Tensor, float | None]:
    """(query, scale) of the same attention with a positive scale where SDPA's is 0 or negative:
    softmax(q·kᵀ·s) = softmax((−q)·kᵀ·|s|) exactly (negation is exact), and s = 0 is uniform
    attention, exactly that of q·0 (NaN and inf still give NaN) at scale 1. The kernels fold the
    scale into Q's INT8 scale, which must be positive; torch's flash and cuDNN kernels return NaN
    for such scales (16-bit CUDA inputs), its math and efficient kernels compute them."""
    if scale is None or not math.isfinite(float(scale)) or float(scale) > 0:
        return query, scale
    return (query * 0, 1.0) if float(scale) == 0 else (-query, -float(scale))


def _scale_problem(scale: float | None) -> str:
    if scale is not None and not math.isfinite(float(scale)):
        return f"scale={scale!r}: the kernels take a finite scale"
    return ""


def sageattn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: float | None = None,
    attn_mask: torch.Tensor | None = None,
    qk_granularity: str = "block",
    pv: str = "fp16",
    smooth_k: bool = True,
    return_lse: bool = False,
    backend: str = "auto",
    rotate_qk: bool = True,
    enable_gqa: bool = False,
    tile_mask: TileMask | TileLists | DynamicSelection | None = None,
    _guard_counter: torch.Tensor | None = None,
    _sparse_counter: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Quantized scaled-dot-product attention with SDPA semantics (SDPA's own signature:
    `sagevideo.scaled_dot_product_attention`).

    Shapes: "HND" q (B, H, Nq, D), k/v (B, H, Nk, D); "NHD" q (B, Nq, H, D), k/v (B, Nk, H, D).
    enable_gqa: k/v may have fewer heads, a divisor of q's (grouped-query attention, as SDPA's
    enable_gqa: query head h attends with K/V head h // (H // H_kv)); the kernels read each K/V head
    for its whole group, nothing is copied.
    Output has q's layout and dtype. With `return_lse`, also returns the natural-log
    log-sum-exp of the (unsmoothed) scaled scores, fp32 (B, H, Nq), so that attention over
    key shards merges exactly.

    Numerics (Triton and reference): K minus its mean over valid tokens; Q and K rotated by the
    same random-sign Hadamard matrix (`rotate_qk`, QKᵀ unchanged, spreads channel outliers);
    Q·sm_scale·log2(e) and K quantized to INT8 per tile ("block") or per token; scores from an int32 dot, softmax in
    fp32 with exp2; PV with 16-bit operands and fp32 accumulation ("fp16"; bf16 inputs keep bf16
    operands) or FP8 e4m3 P and per-channel-scaled V with two-level accumulation ("fp8").

    attn_mask: a boolean key-padding mask (True = attend) broadcastable as (B, 1, 1, Nk) runs in
    the kernels, also when it comes broadcast over heads or queries (a stride-0 view such as
    `key_mask[:, None, None].expand(B, H, Nq, Nk)`: `broadcast_dims_dropped`); any other mask runs
    on SDPA under backend="auto" and raises for "triton" or "reference". backend="auto" uses
    Triton when it can, else SDPA with a one-time warning; the backend that ran is readable
    through `sagevideo.last_backend()`.

    tile_mask (block-sparse attention, docs/sparse.md): a `TileMask` or `TileLists`
    (`sagevideo.kernels.sparse_reference`) for these q/k lengths, (B, H) or broadcast from 1, in the
    kernel plan's tiles (`plans.tiles(pv, head_dim)`) or in multiples of them (refined here). Each
    query tile attends only the key tiles it keeps; rows left with no valid key are 0 (LSE -inf).
    The Triton kernel never loads the skipped tiles; the reference emulates it; SDPA runs with the
    mask's token mask (B·H·Nq·Nk bytes). A mask known to keep every tile (`TileMask.full`,
    `known_density` 1) runs dense. The record carries the density (`BackendChoice.density`): the
    mask's `known_density`, else taken on the device and read only when the record is (a mask is
    never read on the host in the call).
    A `DynamicSelection` (`sagevideo.kernels.tile_select`) instead has the call choose its tiles from
    q and k in the plan's tiles (docs/sparse.md, stage 3): the Triton kernels select on the device
    inside the preparation, in the same op as the attention (no host sync; the record's density stays
    on the device until read, inside a compiled graph it is NaN); the reference and SDPA use the
    PyTorch selection. It selects by top_p or by a per-row density (`density=`: each
    query tile keeps about that share of its key tiles, compiled graphs stay whole). attn_mask may
    then only be a key-padding mask (padded keys never count).
    `sagevideo.attention.sparse.select_tile_lists` makes the lists alone.
    _sparse_counter: as `scaled_dot_product_attention`'s.
    """
    _check_options(tensor_layout, qk_granularity, pv, backend)
    _check_tensors(q, k, v, tensor_layout, enable_gqa)
    if tensor_layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    scale = _check_scale(sm_scale, head_dim)
    _check_mask(attn_mask, batch, heads, n_q, n_k)
    attn_mask = broadcast_dims_dropped(attn_mask)
    if is_causal and attn_mask is not None:
        raise ValueError("pass either is_causal=True or attn_mask, not both (SDPA semantics)")
    tiles = sparse.sparse_call(tile_mask, q, k)
    if tiles is not None and tiles.dynamic:
        _selection_padding(attn_mask, n_k, "sageattn")  # before any launch
    chosen, reason = choose(backend, _kernel_call(q, attn_mask, n_k, pv, rotate_qk))
    out, lse = _attend(q, k, v, attn_mask, is_causal=is_causal, scale=scale, qk_granularity=qk_granularity, pv=pv,
                       smooth_k=smooth_k, return_lse=return_lse, rotate_qk=rotate_qk, requested=backend,
                       chosen=chosen, reason=reason, counter=_guard_counter, tiles=tiles,
                       sparse_counter=_sparse_counter)
    if tensor_layout == "NHD":
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    *,
    is_causal: bool,
    scale: float,
    qk_granularity: str,
    pv: str,
    smooth_k: bool,
    return_lse: bool,
    rotate_qk: bool,
    requested: str,
    chosen: Backend,
    reason: str,
    counter: torch.Tensor | None = None,
    tiles: sparse.SparseCall | None = None,
    sparse_counter: torch.Tensor | None = None,
    kept: sparse.KeptTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The `chosen` backend's attention on validated HND q (B, H, Nq, D), k/v (B, H_kv, Nk, D) with
    H_kv dividing H, attn_mask after `broadcast_dims_dropped` (a key-padding one unless SDPA runs),
    recorded as asked for by `requested`. Returns (out (B, H, Nq, D) in q's dtype, LSE or None).
    counter: an installed layer's guard counter (int32 0-dim) the call adds its count to; None for a
    direct call, whose count its record keeps (`records.note_flagged`).
    tiles: a block-sparse call's tile mask (`sparse.sparse_call`), or None; sparse_counter: an
    installed layer's block-sparse statistics the call adds its density to (`sparse.add_call`); kept: an
    installed layer's lists kept over steps, where a selecting call keeps the lists it ran (any other
    sparse call counts as reusing them)."""
    heads, n_k, head_dim = q.shape[1], k.shape[2], q.shape[3]
    gqa = k.shape[1] != heads
    # the quantized backends take the mask as (B', Nk) key padding (their checks passed)
    key_mask = None if attn_mask is None or chosen is Backend.SDPA else _as_key_mask(attn_mask, n_k)
    selecting = tiles is not None and tiles.dynamic
    if tiles is not None and tiles.dynamic and chosen is not Backend.TRITON:
        # the PyTorch selection (the kernels' definition) in the tiles the backend computes in
        padding = _selection_padding(attn_mask, n_k, "sageattn")
        tiles = sparse.selected(tiles, q, k, padding, scale, *plans.tiles(pv, head_dim))
    plan, ran = _kernel_plan(chosen, q.device, head_dim, pv, is_causal=is_causal, has_mask=key_mask is not None,
                             per_token=qk_granularity == "token", return_lse=return_lse)
    # the mask in the backend's tiles: one the plan's tiles cannot take raises here (at any density),
    # before any launch
    operand = _sparse_operand(tiles, chosen, plan, pv, head_dim)
    made: list[tuple[torch.Tensor, torch.Tensor]] = []  # a dynamic selection's lists, as the kernels made them

    def compute(q, k, v):
        if chosen is Backend.SDPA:
            return (*_sdpa(q, k, v, attn_mask, is_causal, scale, return_lse, gqa, operand), None)
        if chosen is Backend.REFERENCE:
            from sagevideo.kernels.reference import reference_attention

            block_m, block_n = plans.tiles(pv, head_dim)
            k_all, v_all = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (k, v)) if gqa else (k, v)
            # One op: opaque to torch.compile (no recompile per sequence length), one event for profilers.
            out, lse, flagged = reference_attention(q, k_all, v_all, key_mask, scale, block_m, block_n, is_causal,
                                                    qk_granularity, pv, smooth_k, rotate_qk, return_lse, operand)
            return out, lse if return_lse else None, flagged
        from sagevideo.kernels.op import sageattn_triton, sageattn_triton_select

        call = dict(sm_scale=scale, is_causal=is_causal, key_mask=key_mask, per_token=qk_granularity == "token",
                    smooth_k=smooth_k, rotate_qk=rotate_qk, return_lse=return_lse)
        if isinstance(operand, DynamicSelection):
            out, lse, flagged, lists = sageattn_triton_select(q, k, v, plan, operand, **call)
            made.append(lists)
            return out, lse, flagged
        return sageattn_triton(q, k, v, plan, tile_lists=operand, **call)

    if chosen is not Backend.SDPA and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        out, lse, flagged = _ForwardOnly.apply(compute, return_lse, q, k, v)
        lse = lse if return_lse else None
    else:
        out, lse, flagged = compute(q, k, v)
    if kept is not None and selecting:
        if made:
            kept.keep(*made[0], plan.block_m, plan.block_n, q.shape[2], n_k)
        else:
            kept.keep_mask(tiles.tile_mask)
    density = _sparse_density(tiles, made[0][1] if made else None, -(-n_k // plan.block_n) if made else 0,
                              sparse_counter, reused=kept is not None and not selecting)
    _record(requested, ran, None if chosen is Backend.SDPA else pv, reason, density)
    if flagged is not None:
        # The guard's count stays on the device: an installed model's layer accumulates it and reads
        # it at the end of the forward; a direct call's is read at the next call.
        if counter is not None:
            counter.add_(flagged)
        records.note_flagged(flagged, None if counter is not None else _describe(q, pv, qk_granularity))
    return out, lse


def _sparse_density(tiles: sparse.SparseCall | None, counts: torch.Tensor | None, n_tiles: int,
                    counter: torch.Tensor | None, reused: bool = False) -> float | torch.Tensor | None:
    """A call's density for its record: None for dense attention, the float where the call read it
    (a mask, eagerly), else a float64 0-dim device tensor (from the kernels' `counts` of `n_tiles` key
    tiles each where they selected, else from the mask), not read. A sparse call adds it to an
    installed layer's `counter` on the device (`reused`: a call on lists kept from an earlier step)."""
    if tiles is None:
        return None
    density: float | torch.Tensor | None = tiles.density
    if counter is not None or (density is None and not torch.compiler.is_compiling()):
        on_device = sparse.kernel_density(counts, n_tiles) if counts is not None else sparse.density_of(tiles)
        if counter is not None:
            sparse.add_call(counter, on_device, reused)
        density = on_device if density is None else density
    return math.nan if density is None else density


def _kernel_plan(chosen: Backend, device: torch.device, head_dim: int, pv: str,
                 **call: bool) -> tuple[plans.KernelPlan | None, str]:
    """(the Triton plan or None, the backend recorded as ran): on a Gluon plan, the Gluon kernel
    computes the call where it takes it ("gluon"), dense or block-sparse (`dispatch.kernel_for`)."""
    if chosen is not Backend.TRITON:
        return None, chosen.value
    from sagevideo.kernels.dispatch import kernel_for

    choice = kernel_for(device, head_dim, pv, **call)
    # recorded: the warp-specialized sm90 kernel computed this call
    ran = GLUON if choice.plan.kernel == "gluon" else chosen.value
    return choice.plan, ran


def _sparse_operand(tiles: sparse.SparseCall | None, chosen: Backend, plan: plans.KernelPlan | None, pv: str,
                    head_dim: int):
    """What the backend takes of a block-sparse call: the Triton kernel's lists and the reference's key
    tiles in their plan's tiles, SDPA the call itself (its token mask); None for dense attention and
    density 1. A mask the plan's tiles do not fit is refused at any density (not only once it is sparse)."""
    if tiles is None:
        return None
    if chosen is Backend.TRITON:
        operand = sparse.kernel_operand(tiles, plan.block_m, plan.block_n)
    elif chosen is Backend.REFERENCE:
        operand = sparse.reference_operand(tiles, *plans.tiles(pv, head_dim))
    else:
        operand = tiles
    return None if tiles.dense else operand


def _check_options(layout: str, granularity: str, pv: str, backend: str) -> None:
    for name, value, allowed in (
        ("tensor_layout", layout, LAYOUTS),
        ("qk_granularity", granularity, GRANULARITIES),
        ("pv", pv, plans.PV_MODES),
        ("backend", backend, BACKENDS),
    ):
        if value not in allowed:
            raise ValueError(f"sageattn: {name}={value!r} is not supported; use one of {allowed}")


class _ForwardOnly(torch.autograd.Function):
    """Runs a quantized backend inside autograd so that a backward raises one clear error (the
    backends have none: the reference's autograd through its rounding gave wrong gradients)."""

    @staticmethod
    def forward(ctx, compute, return_lse, q, k, v):
        out, lse, flagged = compute(q, k, v)
        return out, (lse if return_lse else out.new_empty(0, dtype=torch.float32)), flagged

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(BACKWARD_ERROR)


def _record(requested: str, ran: str, pv: str | None, reason: str,
            density: float | torch.Tensor | None = None) -> None:
    """Report one dispatch decision (`records`), and warn once per fallback reason. Inside a graph
    torch.compile traces, an effectful op reports (and warns) each time the compiled graph runs.
    density: a block-sparse call's (`_sparse_density`; a device tensor is read when the record is asked,
    NaN inside a graph), None for dense attention."""
    if torch.compiler.is_compiling():
        records.report_from_graph(requested, ran, pv, reason,
                                  math.nan if isinstance(density, torch.Tensor) else density)
    else:
        flagged = records.FlaggedTiles() if pv is not None else None  # quantized calls count for the guard
        if isinstance(density, torch.Tensor):
            density = records.DeviceDensity(density)
        records.report(records.BackendChoice(requested, ran, pv, reason, flagged, density))
        records.warn_fallback_once(reason)


def _describe(q: torch.Tensor, pv: str, granularity: str) -> str:
    """A direct call as its guard warning names it: mode, and q's shape outside compiled graphs
    (a shape in a graph's constant would specialize it)."""
    mode = f"int8-{pv} ({granularity} scales)"
    return mode if torch.compiler.is_compiling() else f"{tuple(q.shape)} {mode}"


def _check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str, enable_gqa: bool = False) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"sageattn: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            dims = "(B, H, N, D)" if layout == "HND" else "(B, N, H, D)"
            raise ValueError(
                f"sageattn: {name} must have rank 4 {dims} for tensor_layout={layout!r}, "
                f"got shape {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise TypeError(f"sageattn: {name} must be a floating tensor, got {t.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"sageattn: q, k, v are on different devices ({q.device}, {k.device}, {v.device})")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"sageattn: q, k, v have different dtypes ({q.dtype}, {k.dtype}, {v.dtype}); cast them")
    n_axis, h_axis = (2, 1) if layout == "HND" else (1, 2)
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"sageattn: batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    q_heads, k_heads, v_heads = q.shape[h_axis], k.shape[h_axis], v.shape[h_axis]
    grouped = enable_gqa and k_heads == v_heads and k_heads > 0 and q_heads % k_heads == 0
    if not (q_heads == k_heads == v_heads or grouped):
        fix = ("K/V heads must divide q's for grouped-query attention" if enable_gqa
               else "pass enable_gqa=True for grouped-query attention (K/V heads dividing q's)")
        raise ValueError(
            f"sageattn: head counts differ: q {q_heads}, k {k_heads}, v {v_heads} "
            f"(layout {layout}: heads are axis {h_axis}); {fix}"
        )
    if q.shape[3] != k.shape[3] or v.shape[3] != q.shape[3]:
        raise ValueError(
            f"sageattn: head dims differ: q {q.shape[3]}, k {k.shape[3]}, v {v.shape[3]}; they must be equal"
        )
    if k.shape[n_axis] != v.shape[n_axis]:
        raise ValueError(f"sageattn: k and v sequence lengths differ: {k.shape[n_axis]} vs {v.shape[n_axis]}")
    if q.shape[n_axis] == 0 or k.shape[n_axis] == 0:
        raise ValueError(
            f"sageattn: empty sequence (q has {q.shape[n_axis]} tokens, k has {k.shape[n_axis]}); "
            "attention needs at least one query and one key"
        )
    if q.shape[0] == 0 or q.shape[h_axis] == 0 or q.shape[3] == 0:
        raise ValueError(f"sageattn: q has an empty batch, head or head-dim axis: {tuple(q.shape)}")


def _check_scale(sm_scale: float | None, head_dim: int) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(sm_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"sageattn: sm_scale must be a positive finite number, got {sm_scale!r}")
    return scale


def _check_mask(attn_mask: torch.Tensor | None, batch: int, heads: int, n_q: int, n_k: int) -> None:
    """Raise unless attn_mask is None or a tensor broadcastable to (B, H, Nq, Nk) (SDPA's rule).
    Whether the kernels can take it is the backends' key-padding check."""
    if attn_mask is None:
        return
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"sageattn: attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dim() > 4:
        raise ValueError(f"sageattn: attn_mask has rank {attn_mask.dim()}; at most 4 (B, H, Nq, Nk)")
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    target = (batch, heads, n_q, n_k)
    for got, want in zip(shape, target, strict=True):
        if got not in (1, want):
            raise ValueError(
                f"sageattn: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                f"(B, H, Nq, Nk) = {target}"
            )


def broadcast_dims_dropped(attn_mask: torch.Tensor | None) -> torch.Tensor | None:
    """attn_mask with every leading (batch, head, query) dim that is only broadcast, stride 0 over
    more than one entry (what `expand` makes), narrowed to size 1: the same mask under SDPA's
    broadcasting, as a view. A key-padding mask expanded to (B, H, Nq, Nk) so becomes the
    (B, 1, 1, Nk) the kernels take; a materialized mask (a copy per query) is left as it is."""
    if attn_mask is None:
        return None
    for dim in range(attn_mask.dim() - 1):
        if attn_mask.shape[dim] > 1 and attn_mask.stride(dim) == 0:
            attn_mask = attn_mask.narrow(dim, 0, 1)
    return attn_mask


def key_padding_problem(attn_mask: torch.Tensor | None, n_k: int) -> str:
    """Why the kernels cannot take `attn_mask` over n_k keys (not a boolean key-padding mask, also
    after `broadcast_dims_dropped`), or '' when they can (or there is no mask)."""
    if attn_mask is None:
        return ""
    mask = broadcast_dims_dropped(attn_mask)
    call = AttentionCall(mask.device, torch.float16, 64, mask_dtype=mask.dtype, mask_shape=tuple(mask.shape), n_k=n_k)
    return KEY_PADDING_MASK.check(call)


def _selected_for_sdpa(tiles: sparse.SparseCall, form: _KernelForm, scale: float, pv: str) -> sparse.SparseCall:
    """An SDPA-signature call's tiles where SDPA computes it: a `DynamicSelection`'s made by the PyTorch
    selection (the kernels' definition) in the tiles of `pv`'s plan, from the kernels' form of the call
    (q (B, H, Nq, D), k (B, H_kv, Nk, D), its mask, which must be key padding); a mask as it is."""
    if not tiles.dynamic:
        return tiles
    padding = _selection_padding(form.mask, form.k.shape[2], "scaled_dot_product_attention")
    return sparse.selected(tiles, form.q, form.k, padding, scale, *plans.tiles(pv, form.q.shape[-1]))


def _selection_padding(attn_mask: torch.Tensor | None, n_k: int, caller: str) -> torch.Tensor | None:
    """A `DynamicSelection` call's key padding, (B', Nk) bool or None; ValueError (naming `caller`) for
    a mask that is not key padding: the selection leaves padded keys out and can honour no other."""
    problem = key_padding_problem(attn_mask, n_k)
    if problem:
        raise ValueError(f"{caller}: a DynamicSelection tile_mask takes no attn_mask but a boolean key-padding one "
                         f"(the selection leaves padded keys out): {problem}")
    return None if attn_mask is None else _as_key_mask(attn_mask, n_k)


def _as_key_mask(attn_mask: torch.Tensor, n_k: int) -> torch.Tensor:
    """A boolean key-padding mask broadcastable as (B', 1, 1, Nk) -> its (B', Nk) view, B' in {1, B}."""
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    return attn_mask.reshape(shape[0], n_k)


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    return_lse: bool,
    gqa: bool = False,
    tiles: sparse.SparseCall | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Full-precision SDPA on HND q/k/v; the mask as SDPA's 4-D broadcast (a 1-D (Nk,) mask, which
    the kernels take, SDPA's kernels reject). tiles: a block-sparse call, run with its token mask
    (`sparse.sdpa_mask`); its rows with no key left are 0 with LSE -inf, as the kernels give them."""
    if attn_mask is not None and attn_mask.dim() < 4:
        attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
    has_key = None
    if tiles is not None:
        attn_mask, has_key = sparse.sdpa_mask(attn_mask, tiles, q.shape[2], k.shape[2], is_causal)
        is_causal = False  # in the mask
    out = TORCH_SDPA(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=gqa)
    if return_lse and gqa:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    lse = _lse_full_precision(q, k, attn_mask, is_causal, scale) if return_lse else None
    if has_key is not None:
        out = out.masked_fill(~has_key[..., None], 0)
        lse = None if lse is None else lse.masked_fill(~has_key, float("-inf"))
    return out, lse


def _lse_full_precision(
    q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool, scale: float,
    chunk: int = 1024,
) -> torch.Tensor:
    """fp32 log-sum-exp of the scaled scores, (B, H, Nq), in query chunks to bound memory."""
    n_q, n_k = q.shape[2], k.shape[2]
    kf = k.float()
    parts = []
    for start in range(0, n_q, chunk):
        stop = min(start + chunk, n_q)
        s = q[:, :, start:stop].float() @ kf.transpose(-1, -2) * scale
        if is_causal:
            rows = torch.arange(start, stop, device=q.device)[:, None]
            s = s.masked_fill(torch.arange(n_k, device=q.device)[None, :] > rows, float("-inf"))
        if attn_mask is not None:
            m = attn_mask if attn_mask.dim() == 4 else attn_mask.reshape((1,) * (4 - attn_mask.dim()) + attn_mask.shape)
            m = m[:, :, start:stop] if m.shape[2] != 1 else m
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
        parts.append(torch.logsumexp(s, dim=-1))
    return torch.cat(parts, dim=-1)
