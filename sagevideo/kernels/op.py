"""The op boundary: two `torch.library` ops, one per attention kernel, each chaining the
preparation (smoothing, rotation, INT8/FP8 quantization) and the attention launch.

- `torch.ops.sagevideo.sageattn_fwd`, a `torch.library.triton_op`: the plain-Triton kernel, every
  call the kernels take, block-sparse ones too (optional tile-list tensors). `torch.compile(fullgraph=True)`
  traces through it, and Inductor sees its Triton kernels (`wrap_triton`), instead of graph-breaking on Python.
- `torch.ops.sagevideo.sageattn_fwd_select`, the same with the tile lists chosen on the device in
  one go (`tile_select.DynamicSelection`'s fields): the preparation also pools Q and K per tile, the
  selection kernel (`tile_select_kernel`) writes the lists, the block-sparse launch reads them; the
  lists come back too (for the record, or to reuse at a neighbouring step). No host sync.
- `torch.ops.sagevideo.sageattn_fwd_gluon`, a `torch.library.custom_op` with a fake (shapes only):
  the warp-specialized Gluon sm90 kernel (FP8 PV; no mask, causal, per-token K scales or LSE), dense
  or on given tile lists; `torch.ops.sagevideo.sageattn_fwd_select_gluon` the same with the lists
  chosen in the call, as `sageattn_fwd_select` does for the plain kernel.
  Opaque to torch.compile: Inductor calls them as extern kernels and does not trace into them. The
  Gluon launch cannot go through `wrap_triton`: Inductor re-emits a user kernel's source under
  `@triton.jit` (not `@gluon.jit`), and its arguments here are Gluon tensor descriptors with shared-
  memory layouts, which Inductor's TMA support does not model. Eager calls take the same op, so
  compiled and eager calls run the same kernels.

`sageattn_triton` is the thin Python entry used by `sagevideo.attention.functional`: it calls the
op `plan.kernel` names; `gluon_runs` says whether a call's plan may name the Gluon kernel.
"""

from __future__ import annotations

import inspect

import torch
from torch.library import triton_op

from sagevideo.kernels.attention_fwd import attention_forward
from sagevideo.kernels.guard_count import count_flagged_tiles
from sagevideo.kernels.plans import KernelPlan
from sagevideo.kernels.quantize import quantize_inputs
from sagevideo.kernels.rotation import hadamard_pm1
from sagevideo.kernels.tile_select import DynamicSelection
from sagevideo.kernels.tile_select_kernel import select_lists, selection_probe


def attention_kernel(prepared, v: torch.Tensor, key_mask: torch.Tensor | None, out: torch.Tensor,
                     lse: torch.Tensor | None, plan: KernelPlan, *, is_causal: bool, per_token: bool,
                     n_q: int, n_k: int, tile_lists: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """The attention kernel `plan.kernel` names, on prepared inputs (no quantization): the plain
    Triton one, or the Gluon sm90 one (callers ensure `gluon_runs`), dense or on tile_lists
    (block-sparse). Compiled code reaches the Gluon kernel through its opaque ops."""
    if plan.kernel == "gluon":
        from sagevideo.kernels import attention_sm90

        attention_sm90.attention_forward_sm90(prepared, out, block_n=plan.block_n, n_q=n_q, n_k=n_k,
                                              num_stages=plan.num_stages, tile_lists=tile_lists)
    else:
        attention_forward(prepared, v, key_mask, out, lse, plan, is_causal=is_causal, per_token=per_token,
                          n_q=n_q, n_k=n_k, tile_lists=tile_lists)


@triton_op("sagevideo::sageattn_fwd", mutates_args=())
def sageattn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    rotation: torch.Tensor | None,
    sm_scale: float,
    is_causal: bool,
    per_token: bool,
    smooth_k: bool,
    return_lse: bool,
    pv: str,
    arch: str,
    block_d: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    kernel: str,
    scores_by_add: bool,
    max_registers: int,
    key_tiles: torch.Tensor | None = None,
    tile_counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v (B, H, N, D) views with unit head-dim stride; key_mask (B', Nk) uint8.
    key_tiles/tile_counts (block-sparse, both or neither): a `sparse_reference.TileLists`' tensors in
    the plan's tiles, int32 (B or 1, H or 1, ceil(Nq/block_m), W) and (B or 1, H or 1, ceil(Nq/block_m));
    each query tile visits only its listed key tiles (indices below ceil(Nk/block_n), ascending,
    then -1: validated where the lists are built, not here, since that reads them).

    Returns (out like q, lse (B, H, Nq) fp32; an empty tensor unless return_lse, the run-time guard's
    count of query tiles past INT8's accuracy: int32 0-dim, `guard.flagged_tiles`).
    The plain-Triton kernel only: kernel must be "triton" (the Gluon one is `sageattn_fwd_gluon`,
    which Inductor does not trace into). The plan travels as its fields (the op schema takes no
    dataclass); max_registers 0 = no cap.
    """
    if kernel != "triton":
        raise ValueError(f"sageattn_fwd runs the plain-Triton kernel, not kernel={kernel!r}: the Gluon sm90 "
                         "kernel is torch.ops.sagevideo.sageattn_fwd_gluon")
    plan = KernelPlan(arch, block_d, pv, block_m, block_n, num_warps, num_stages, kernel, scores_by_add,
                      max_registers or None)
    tile_lists = _checked_lists(key_tiles, tile_counts, q, block_m)
    out, lse, flagged, _ = _forward(q, k, v, key_mask, rotation, plan, sm_scale=sm_scale, is_causal=is_causal,
                                    per_token=per_token, smooth_k=smooth_k, return_lse=return_lse,
                                    tile_lists=tile_lists)
    return out, lse, flagged


def _forward(q, k, v, key_mask, rotation, plan: KernelPlan, *, sm_scale: float, is_causal: bool, per_token: bool,
             smooth_k: bool, return_lse: bool, tile_lists=None, selection: DynamicSelection | None = None):
    """Preparation then the plain kernel: dense, with given lists, or with the lists `selection`
    makes from the preparation's pooled statistics. Returns (out, lse, flagged, the lists or None)."""
    batch, heads, n_q, _ = q.shape
    n_k = k.shape[2]
    prepared = quantize_inputs(
        q, k, v, key_mask, rotation, plan,
        sm_scale=sm_scale, per_token=per_token, smooth_k=smooth_k, need_shift=return_lse, pool=selection is not None,
        pool_spread=selection is not None and selection.uses_spread,
    )
    if selection is not None:
        probe = selection_probe(q, k, key_mask, selection, block_n=plan.block_n, sm_scale=sm_scale)
        tile_lists = select_lists(prepared.pooled, selection, batch=batch, heads=heads, kv_heads=k.shape[1],
                                  n_q=n_q, n_k=n_k, block_m=plan.block_m, block_n=plan.block_n, sm_scale=sm_scale,
                                  probe=probe)
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, n_q if return_lse else 0, device=q.device, dtype=torch.float32)
    attention_kernel(prepared, v, key_mask, out, lse if return_lse else None, plan,
                     is_causal=is_causal, per_token=per_token, n_q=n_q, n_k=n_k, tile_lists=tile_lists)
    return out, lse, _flagged(prepared, plan, q.shape[3], per_token), tile_lists


@triton_op("sagevideo::sageattn_fwd_select", mutates_args=())
def sageattn_fwd_select(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    rotation: torch.Tensor | None,
    sm_scale: float,
    is_causal: bool,
    per_token: bool,
    smooth_k: bool,
    return_lse: bool,
    pv: str,
    arch: str,
    block_d: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    kernel: str,
    scores_by_add: bool,
    max_registers: int,
    top_p: float,
    local_tiles: int,
    sink_tiles: int,
    min_similarity: float,
    dense_prefix: int,
    dense_suffix: int,
    max_spread: float,
    density: float | None = None,
    probe_columns: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sageattn_fwd` whose tile lists the call chooses itself, on the device: the dynamic selection
    (`tile_select.DynamicSelection`: top_p .. density) of these q and k in the plan's tiles.
    Returns (out, lse, flagged as `sageattn_fwd`, key tiles int32 (B, H, ceil(Nq/block_m),
    ceil(Nk/block_n)) ascending then -1, counts int32 (B, H, ceil(Nq/block_m))). The plain kernel only."""
    if kernel != "triton":
        raise ValueError(f"sageattn_fwd_select runs the plain-Triton kernel, not kernel={kernel!r}")
    plan = KernelPlan(arch, block_d, pv, block_m, block_n, num_warps, num_stages, kernel, scores_by_add,
                      max_registers or None)
    selection = DynamicSelection(top_p=top_p, local_tiles=local_tiles, sink_tiles=sink_tiles,
                                 min_similarity=min_similarity, dense_prefix=dense_prefix, dense_suffix=dense_suffix,
                                 max_spread=max_spread, density=density, probe_columns=probe_columns)
    out, lse, flagged, (indices, counts) = _forward(
        q, k, v, key_mask, rotation, plan, sm_scale=sm_scale, is_causal=is_causal, per_token=per_token,
        smooth_k=smooth_k, return_lse=return_lse, selection=selection,
    )
    return out, lse, flagged, indices, counts


def _checked_lists(key_tiles: torch.Tensor | None, tile_counts: torch.Tensor | None, q: torch.Tensor,
                   block_m: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(key_tiles, tile_counts), or None for dense attention; ValueError for lists that do not fit q's
    (B, H) or the plan's query tiles (shapes only: also while torch.compile traces)."""
    if key_tiles is None and tile_counts is None:
        return None
    if key_tiles is None or tile_counts is None:
        raise ValueError("sageattn_fwd: pass both key_tiles and tile_counts (block-sparse) or neither (dense)")
    batch, heads, n_q, _ = q.shape
    m_tiles = -(-n_q // block_m)
    for name, t, dims in (("key_tiles", key_tiles, 4), ("tile_counts", tile_counts, 3)):
        if t.dtype != torch.int32 or t.dim() != dims or t.device != q.device:
            raise ValueError(f"sageattn_fwd: {name} must be a {dims}-D int32 tensor on {q.device}, got "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}")
    b, h, m = key_tiles.shape[:3]
    if b not in (1, batch) or h not in (1, heads) or m != m_tiles or tuple(tile_counts.shape) != (b, h, m):
        raise ValueError(f"sageattn_fwd: tile lists of shape {tuple(key_tiles.shape)} with counts "
                         f"{tuple(tile_counts.shape)} do not fit {batch} x {heads} heads of {n_q} queries in "
                         f"{m_tiles} query tiles of {block_m}: expected (B or 1, H or 1, {m_tiles}, ·)")
    return key_tiles, tile_counts


def _flagged(prepared, plan: KernelPlan, head_dim: int, per_token: bool) -> torch.Tensor:
    """The guard's count on the scales the preparation wrote (one small launch, no sync)."""
    return count_flagged_tiles(prepared.q_scale, prepared.k_scale, block_m=plan.block_m, head_dim=head_dim,
                               granularity="token" if per_token else "block", pv=plan.pv, block_n=plan.block_n)


def sageattn_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: KernelPlan,
    *,
    sm_scale: float,
    is_causal: bool,
    key_mask: torch.Tensor | None,
    per_token: bool,
    smooth_k: bool,
    rotate_qk: bool,
    return_lse: bool,
    tile_lists: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Run the Triton path on HND views; copies only tensors whose head dim is not contiguous.
    Returns (out, lse or None, the guard's flagged query tiles: int32 0-dim on the device).
    tile_lists: (key tiles, counts) of a block-sparse call in the plan's tiles (`sageattn_fwd`).

    `plan.kernel` "gluon" runs `sageattn_fwd_gluon` and must already be checked against the call
    (`gluon_runs`); a call it does not implement raises here rather than run another kernel than
    the one recorded.
    """
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    rotation = hadamard_pm1(plan.block_d, q.device, q.dtype) if rotate_qk else None
    if plan.kernel == "gluon":
        _refuse_what_gluon_cannot("sageattn_triton", plan, is_causal=is_causal, has_mask=key_mask is not None,
                                  per_token=per_token, return_lse=return_lse)
        out, flagged = torch.ops.sagevideo.sageattn_fwd_gluon(
            q, k, v, rotation, sm_scale, smooth_k, plan.pv, plan.arch, plan.block_d, plan.block_m, plan.block_n,
            plan.num_warps, plan.num_stages, *(tile_lists or (None, None)),
        )
        return out, None, flagged
    mask = None if key_mask is None else key_mask.to(device=q.device, dtype=torch.uint8).contiguous()
    out, lse, flagged = torch.ops.sagevideo.sageattn_fwd(
        q, k, v, mask, rotation, sm_scale, is_causal, per_token, smooth_k, return_lse,
        plan.pv, plan.arch, plan.block_d, plan.block_m, plan.block_n, plan.num_warps, plan.num_stages, plan.kernel,
        plan.scores_by_add, plan.max_registers or 0, *(tile_lists or (None, None)),
    )
    return out, (lse if return_lse else None), flagged


def sageattn_triton_select(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: KernelPlan,
    selection: DynamicSelection,
    *,
    sm_scale: float,
    is_causal: bool,
    key_mask: torch.Tensor | None,
    per_token: bool,
    smooth_k: bool,
    rotate_qk: bool,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """`sageattn_triton` for a call that chooses its own tiles (`sageattn_fwd_select`, or
    `sageattn_fwd_select_gluon` on a Gluon plan, which `gluon_runs` must have allowed). Returns (out,
    lse or None, flagged, (key tiles, counts) as the selection made them)."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    rotation = hadamard_pm1(plan.block_d, q.device, q.dtype) if rotate_qk else None
    fields = (float(selection.top_p), selection.local_tiles, selection.sink_tiles, float(selection.min_similarity),
              selection.dense_prefix, selection.dense_suffix, float(selection.max_spread),
              None if selection.density is None else float(selection.density), selection.probe_columns)
    if plan.kernel == "gluon":
        _refuse_what_gluon_cannot("sageattn_triton_select", plan, is_causal=is_causal,
                                  has_mask=key_mask is not None, per_token=per_token, return_lse=return_lse)
        out, flagged, indices, counts = torch.ops.sagevideo.sageattn_fwd_select_gluon(
            q, k, v, rotation, sm_scale, smooth_k, plan.pv, plan.arch, plan.block_d, plan.block_m, plan.block_n,
            plan.num_warps, plan.num_stages, *fields,
        )
        return out, None, flagged, (indices, counts)
    mask = None if key_mask is None else key_mask.to(device=q.device, dtype=torch.uint8).contiguous()
    out, lse, flagged, indices, counts = torch.ops.sagevideo.sageattn_fwd_select(
        q, k, v, mask, rotation, sm_scale, is_causal, per_token, smooth_k, return_lse,
        plan.pv, plan.arch, plan.block_d, plan.block_m, plan.block_n, plan.num_warps, plan.num_stages, plan.kernel,
        plan.scores_by_add, plan.max_registers or 0, *fields,
    )
    return out, (lse if return_lse else None), flagged, (indices, counts)


def _refuse_what_gluon_cannot(caller: str, plan: KernelPlan, **call: bool) -> None:
    """ValueError where a Gluon plan reaches `caller` with a call the Gluon kernel does not implement
    (`attention_sm90.supports`): running another kernel would record the wrong one."""
    from sagevideo.kernels.attention_sm90 import supports

    problem = supports(pv=plan.pv, **call)
    if problem:
        raise ValueError(f"{caller}: a Gluon plan for a call the Gluon kernel does not take ({problem}); "
                         "check gluon_runs and pass plans.plain_triton(plan) instead")


def gluon_runs(plan: KernelPlan, *, is_causal: bool, has_mask: bool, per_token: bool, return_lse: bool) -> bool:
    """Whether the Gluon sm90 kernel computes this call under `plan` (else the plain-Triton one):
    the plan names it and the kernel implements the call (`attention_sm90.supports`), dense or
    block-sparse. The same answer eagerly and while torch.compile traces: compiled graphs call the
    Gluon kernel through its opaque ops, so the backend recorded ("gluon") is what the graph runs.
    """
    if plan.kernel != "gluon":
        return False
    from sagevideo.kernels.attention_sm90 import supports

    return not supports(pv=plan.pv, is_causal=is_causal, has_mask=has_mask, per_token=per_token,
                        return_lse=return_lse)


# Inductor must hand the Gluon op the strides it was traced with: its output is `empty_like(q)`, so
# inputs laid out otherwise would give an output unlike the fake's. That is this torch's default for
# custom ops (`torch._functorch.config.custom_op_default_layout_constraint`), said explicitly here
# where the tag and `custom_op(tags=)` exist.
_EXACT_STRIDES = (
    {"tags": (torch.Tag.needs_exact_strides,)}
    if hasattr(torch.Tag, "needs_exact_strides") and "tags" in inspect.signature(torch.library.custom_op).parameters
    else {}
)


@torch.library.custom_op("sagevideo::sageattn_fwd_gluon", mutates_args=(), **_EXACT_STRIDES)
def sageattn_fwd_gluon(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rotation: torch.Tensor | None,
    sm_scale: float,
    smooth_k: bool,
    pv: str,
    arch: str,
    block_d: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    key_tiles: torch.Tensor | None = None,
    tile_counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gluon sm90 kernel's call: q/k/v (B, H, N, D) views with unit head-dim stride (k/v may have
    fewer heads, a divisor of q's). Returns (out like q (`torch.empty_like`), the guard's flagged
    query tiles, int32 0-dim). key_tiles/tile_counts: block-sparse lists as `sageattn_fwd` takes them.

    Only what the kernel implements (`attention_sm90.supports`): FP8 PV (pv must be "fp8"), per-block K
    scales, no key mask, not causal, no LSE; the caller (`sageattn_triton`) checks. The plan travels
    as its fields, its kernel "gluon" (num_stages: the K/V ring stages). Opaque to torch.compile
    (a custom op, not a triton_op): its fake gives the output's shape, dtype and strides."""
    plan = KernelPlan(arch, block_d, pv, block_m, block_n, num_warps, num_stages, "gluon")
    tile_lists = _checked_lists(key_tiles, tile_counts, q, block_m)
    out, _, flagged, _ = _forward(q, k, v, None, rotation, plan, sm_scale=sm_scale, is_causal=False, per_token=False,
                                  smooth_k=smooth_k, return_lse=False, tile_lists=tile_lists)
    return out, flagged


@sageattn_fwd_gluon.register_fake
def _fake_sageattn_fwd_gluon(q, k, v, rotation, sm_scale, smooth_k, pv, arch, block_d, block_m, block_n, num_warps,
                             num_stages, key_tiles=None, tile_counts=None):
    _checked_lists(key_tiles, tile_counts, q, block_m)
    return torch.empty_like(q), q.new_empty((), dtype=torch.int32)


@torch.library.custom_op("sagevideo::sageattn_fwd_select_gluon", mutates_args=(), **_EXACT_STRIDES)
def sageattn_fwd_select_gluon(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rotation: torch.Tensor | None,
    sm_scale: float,
    smooth_k: bool,
    pv: str,
    arch: str,
    block_d: int,
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    top_p: float,
    local_tiles: int,
    sink_tiles: int,
    min_similarity: float,
    dense_prefix: int,
    dense_suffix: int,
    max_spread: float,
    density: float | None = None,
    probe_columns: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sageattn_fwd_gluon` whose tile lists the call chooses itself on the device, as
    `sageattn_fwd_select` does for the plain kernel. Returns (out, flagged, key tiles int32 (B, H,
    ceil(Nq/block_m), ceil(Nk/block_n)) ascending then -1, counts int32 (B, H, ceil(Nq/block_m)))."""
    plan = KernelPlan(arch, block_d, pv, block_m, block_n, num_warps, num_stages, "gluon")
    selection = DynamicSelection(top_p=top_p, local_tiles=local_tiles, sink_tiles=sink_tiles,
                                 min_similarity=min_similarity, dense_prefix=dense_prefix, dense_suffix=dense_suffix,
                                 max_spread=max_spread, density=density, probe_columns=probe_columns)
    out, _, flagged, (indices, counts) = _forward(q, k, v, None, rotation, plan, sm_scale=sm_scale, is_causal=False,
                                                  per_token=False, smooth_k=smooth_k, return_lse=False,
                                                  selection=selection)
    return out, flagged, indices, counts


@sageattn_fwd_select_gluon.register_fake
def _fake_sageattn_fwd_select_gluon(q, k, v, rotation, sm_scale, smooth_k, pv, arch, block_d, block_m, block_n,
                                    num_warps, num_stages, top_p, local_tiles, sink_tiles, min_similarity,
                                    dense_prefix, dense_suffix, max_spread, density=None, probe_columns=0):
    return (torch.empty_like(q), q.new_empty((), dtype=torch.int32), *_fake_lists(q, k, block_m, block_n))


def _fake_lists(q, k, block_m: int, block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The selecting ops' lists as fakes: key tiles int32 (B, H, M_TILES, N_TILES), counts (B, H, M_TILES)."""
    batch, heads, n_q, _ = q.shape
    m_tiles, n_tiles = -(-n_q // block_m), -(-k.shape[2] // block_n)
    return (q.new_empty(batch, heads, m_tiles, n_tiles, dtype=torch.int32),
            q.new_empty(batch, heads, m_tiles, dtype=torch.int32))


def _fake_sageattn_fwd(q, k, v, key_mask, rotation, sm_scale, is_causal, per_token, smooth_k, return_lse,
                       pv, arch, block_d, block_m, block_n, num_warps, num_stages, kernel, scores_by_add,
                       max_registers, key_tiles=None, tile_counts=None):
    _checked_lists(key_tiles, tile_counts, q, block_m)
    batch, heads, n_q, _ = q.shape
    lse = q.new_empty(batch, heads, n_q if return_lse else 0, dtype=torch.float32)
    return torch.empty_like(q), lse, q.new_empty((), dtype=torch.int32)


def _fake_sageattn_fwd_select(q, k, v, key_mask, rotation, sm_scale, is_causal, per_token, smooth_k, return_lse,
                              pv, arch, block_d, block_m, block_n, num_warps, num_stages, kernel, scores_by_add,
                              max_registers, top_p, local_tiles, sink_tiles, min_similarity, dense_prefix,
                              dense_suffix, max_spread, density=None, probe_columns=0):
    out, lse, flagged = _fake_sageattn_fwd(q, k, v, key_mask, rotation, sm_scale, is_causal, per_token, smooth_k,
                                           return_lse, pv, arch, block_d, block_m, block_n, num_warps, num_stages,
                                           kernel, scores_by_add, max_registers)
    return (out, lse, flagged, *_fake_lists(q, k, block_m, block_n))


def _register_interpreter_fake() -> None:
    """Under TRITON_INTERPRET the kernels are interpreted Python that reads data pointers, which fake
    tensors lack; give tracing an explicit fake so torch.compile tests can run on CPU."""
    from sagevideo.kernels.plans import interpreter_enabled

    if interpreter_enabled():
        sageattn_fwd.register_fake(_fake_sageattn_fwd)
        sageattn_fwd_select.register_fake(_fake_sageattn_fwd_select)


_register_interpreter_fake()
