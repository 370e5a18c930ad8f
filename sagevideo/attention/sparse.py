"""Block-sparse calls at the user boundary (`sageattn(tile_mask=...)`, issue 36, docs/sparse.md):
the tile mask checked against the inputs before any launch, put in the tiles of the backend that
computes the call, and the full-precision fallback restricted to the same mask.

Every backend computes the mask as `kernels.sparse_reference` defines it: the Triton kernel takes
its compact lists in the plan's tiles, the reference its dense form in the same tiles, SDPA its
token mask combined with any attention mask and causality (never silently dense). Rows that visit
no valid key are 0 with LSE -inf on each. A mask of density 1 runs the dense path.

`select_tiles` is the attention room's entry to tile selection (`kernels.tile_select`) for the rooms
above it (installed models): a call's mask in the tiles of the kernel plan it will run.

A `DynamicSelection` in place of a mask has the call choose its tiles from its own q and k
(`kernels.tile_select`): the Triton kernels in one op, inside the preparation (no host sync, the
density not read); the reference and SDPA with the PyTorch selection, its definition, in the same
tiles. `select_tile_lists` makes the lists alone, to reuse or inspect.

An installed layer's calls add their density to its statistics on the device (`add_call`: sum,
calls, least, reused), which its router reads once per forward: nothing is read inside a call.
A layer whose plan reuses lists over steps keeps a selecting call's lists in a `KeptTiles`, which
later calls attend on.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from sagevideo.attention import backends
from sagevideo.attention.backends import AttentionCall, Backend
from sagevideo.kernels import plans
from sagevideo.kernels.compile_constant import constant_under_compile
from sagevideo.kernels.sparse_reference import (
    TileLists,
    TileMask,
    in_tiles,
    kernel_lists,
    masked_attention_exact,  # noqa: F401 - the sparse oracle for rooms above
)
from sagevideo.kernels.tile_select import (
    DynamicSelection,
    TileScores,
    select_dynamic_at_density,
    select_dynamic_per_row,
    select_static_at_density,
)


@dataclass(frozen=True)
class SparseCall:
    """A call's tile mask (a TileMask or TileLists that fits its q and k, or the DynamicSelection that
    makes one from them) and its density (visited / all key tiles) where known on the host without
    reading the mask (`TileMask.known_density`), else None — always inside a torch.compile graph
    (there the sparse path runs at any density, bit for bit the dense one at density 1), and for a
    dynamic selection and the mask it selected (`density_of` gives any call's on the device)."""

    tile_mask: TileMask | TileLists | DynamicSelection
    density: float | None

    @property
    def dynamic(self) -> bool:
        """The call selects its own tiles."""
        return isinstance(self.tile_mask, DynamicSelection)

    @property
    def dense(self) -> bool:
        """Every key tile kept: the dense path computes the call."""
        return self.density == 1.0


def sparse_call(tile_mask: object, q: torch.Tensor, k: torch.Tensor) -> SparseCall | None:
    """The call of `tile_mask` (None: dense attention) on HND q (B, H, Nq, D), k (B, H_kv, Nk, D);
    TypeError/ValueError, before any launch, for a mask that is not one or was built for other inputs.
    Its density is the mask's `known_density` (a full mask, a static selection), else None: not read
    on the host (a sync per call would leave the device idle while the next call is prepared); the
    record then takes it on the device (`density_of`), and a mask that happens to keep every tile
    runs the sparse path, whose full lists compute dense attention."""
    if tile_mask is None:
        return None
    if isinstance(tile_mask, DynamicSelection):
        tile_mask.check_tokens(q.shape[2], k.shape[2])
        return SparseCall(tile_mask, None)
    if not isinstance(tile_mask, TileMask | TileLists):
        raise TypeError(f"sageattn: tile_mask must be a TileMask or TileLists (sagevideo.kernels.sparse_reference) "
                        f"or a DynamicSelection (sagevideo.kernels.tile_select), got {type(tile_mask).__name__}")
    held = tile_mask.keep if isinstance(tile_mask, TileMask) else tile_mask.counts
    if held.device != q.device:
        raise ValueError(f"sageattn: tile_mask is on {held.device}, q on {q.device}")
    tile_mask.check_inputs(q, k)
    known = getattr(tile_mask, "known_density", None)
    return SparseCall(tile_mask, None if torch.compiler.is_compiling() else known)


def kernel_operand(call: SparseCall, block_m: int,
                   block_n: int) -> tuple[torch.Tensor, torch.Tensor] | DynamicSelection:
    """The Triton kernel's (key tiles, counts) in its plan's tiles (`sparse_reference.in_tiles`: a
    ValueError names both tile sizes where the plan's do not divide the mask's), or the selection the
    op makes them with."""
    if call.dynamic:
        return call.tile_mask
    return kernel_lists(in_tiles(call.tile_mask, block_m, block_n))


def selected(call: SparseCall, q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None, sm_scale: float,
             block_m: int, block_n: int) -> SparseCall:
    """A dynamic call's tiles from the PyTorch selection (the backends other than the kernels'), in
    (block_m, block_n) tiles: q (B, H, Nq, D), k (B, H_kv, Nk, D), key_mask (B', Nk) bool or None."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    selection = call.tile_mask
    scores = TileScores(q, k, block_m=block_m, block_n=block_n, sm_scale=sm_scale, key_mask=key_mask,
                        **selection.scores_options())
    # its density is not read (a host sync per call): `density_of` gives it on the device
    return SparseCall(selection.keep(scores), None)


def density_of(call: SparseCall) -> torch.Tensor:
    """A call's density on its device, float64 0-dim, nothing read on the host: kept key tiles / all key
    tiles over every (batch row, head, query tile), as `TileMask.density` and `TileLists.density` give
    it (text rows and columns count as the tiles they are; a partial last tile counts as one). The
    call's mask, not a DynamicSelection (`kernel_density` gives the kernels' selection's)."""
    mask = call.tile_mask
    if isinstance(mask, TileMask):
        return mask.keep.double().mean()
    return kernel_density(mask.counts, mask.n_tiles)


def kernel_density(counts: torch.Tensor, n_tiles: int) -> torch.Tensor:
    """The density of lists whose counts are `counts` (int32 (B, H, M_tiles)) of `n_tiles` key tiles each:
    float64 0-dim on their device (not read)."""
    return counts.double().mean() / n_tiles


# A layer's running block-sparse statistics (`add_call`): float64 (4,) on the model's device.
SPARSE_SUM, SPARSE_CALLS, SPARSE_MIN, SPARSE_REUSED = range(4)


def empty_stats(device: torch.device | str | None = None) -> torch.Tensor:
    """Statistics before any call: sum of densities 0, calls 0, least density +inf, reused calls 0."""
    return torch.tensor([0.0, 0.0, math.inf, 0.0], dtype=torch.float64, device=device)


def add_call(stats: torch.Tensor, density: torch.Tensor, reused: bool = False) -> None:
    """Add one sparse call of `density` (float64 0-dim, `density_of`) to `stats` (float64 (4,):
    [sum of the calls' densities, calls, least density, calls on reused lists]), on the device:
    nothing is read, so a compiled graph stays whole (an in-place update of its input, like the
    guard's counter)."""
    stats.copy_(torch.stack([stats[SPARSE_SUM] + density, stats[SPARSE_CALLS] + 1,
                             torch.minimum(stats[SPARSE_MIN], density), stats[SPARSE_REUSED] + float(reused)]))


class KeptTiles:
    """One layer's tile lists kept from a call that selected them, for its calls of later steps
    (`plans.Sparse.reuse_steps`): indices (B, H, M_tiles, N_tiles), ascending then -1, and int32 counts
    (B, H, M_tiles) on the device, in (block_m, block_n) tiles of a call of n_q queries and n_k keys.
    The indices are kept as int16 where the key tiles fit (half the memory: they are as wide as the key
    tiles; one conversion back per reusing call). Plain attributes only: a compiled call stores and
    reads them like a module's buffers (one graph for every layer), and nothing is read on the host."""

    def __init__(self) -> None:
        self.indices: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.tiles: tuple[int, int, int, int] = (0, 0, 0, 0)  # block_m, block_n, n_q, n_k

    def keep(self, indices: torch.Tensor, counts: torch.Tensor, block_m: int, block_n: int, n_q: int,
             n_k: int) -> None:
        narrow = indices.shape[-1] <= torch.iinfo(torch.int16).max
        self.indices = indices.to(torch.int16) if narrow else indices
        self.counts, self.tiles = counts, (block_m, block_n, n_q, n_k)

    def keep_mask(self, mask: TileMask) -> None:
        """Keep the lists of a `TileMask` (the PyTorch selection's form), made on the device."""
        self.keep(*mask.padded_lists(), mask.block_m, mask.block_n, mask.n_q, mask.n_k)

    def lists_for(self, q: torch.Tensor, k: torch.Tensor) -> TileLists | None:
        """The kept lists as a `TileLists` for HND q (B, H, Nq, D), k (B, H_kv, Nk, D), or None when none
        are kept or they were made for another shape or device (the call then selects afresh)."""
        if self.indices is None or self.indices.device != q.device:
            return None
        block_m, block_n, n_q, n_k = self.tiles
        if tuple(self.counts.shape[:2]) != tuple(q.shape[:2]) or (n_q, n_k) != (q.shape[2], k.shape[2]):
            return None
        return TileLists.from_device(self.indices.to(torch.int32), self.counts, block_m, block_n, n_q, n_k)


def select_tile_lists(q: torch.Tensor, k: torch.Tensor, selection: DynamicSelection, *, pv: str = "fp16",
                 sm_scale: float | None = None, key_mask: torch.Tensor | None = None) -> TileLists:
    """The tiles `selection` keeps for HND q (B, H, Nq, D) against k (B, H_kv, Nk, D) (key_mask (B', Nk)
    bool, True = valid), in the tiles of the plan that attends with `pv` (`plans.tiles`), as lists
    `sageattn(tile_mask=...)` takes: on the device without a host read where the Triton kernels run
    (`kernels.dispatch.select_tiles`), else the PyTorch selection (its definition). The lists are as
    wide as the key tiles. Use them for several calls (a layer's neighbouring steps, say); a single
    call that selects and attends is `sageattn(tile_mask=selection)`."""
    if not isinstance(selection, DynamicSelection):
        raise TypeError(f"select_tile_lists: selection must be a DynamicSelection, got {type(selection).__name__}")
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or (
            k.shape[1] == 0 or q.shape[1] % k.shape[1]):
        raise ValueError(f"select_tile_lists: q {tuple(q.shape)} and k {tuple(k.shape)} must be (B, H, N, D) with the "
                         "same B and D, K's heads dividing q's")
    selection.check_tokens(q.shape[2], k.shape[2])
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    if not backends.problem(Backend.TRITON, AttentionCall(q.device, q.dtype, q.shape[-1], pv=pv, rotate_qk=False)):
        from sagevideo.kernels.dispatch import select_tiles as on_device

        return on_device(q, k, selection, pv=pv, sm_scale=scale, key_mask=key_mask)
    block_m, block_n = plans.tiles(pv, q.shape[-1])
    call = selected(SparseCall(selection, None), q, k, key_mask, scale, block_m, block_n)
    indices, counts = call.tile_mask.padded_lists()
    return TileLists.from_device(indices, counts, block_m, block_n, q.shape[2], k.shape[2])


def reference_operand(call: SparseCall, block_m: int, block_n: int) -> torch.Tensor:
    """The reference's key tiles: bool (B or 1, H or 1, M_tiles, N_tiles) in its (block_m, block_n) tiles."""
    mask = in_tiles(call.tile_mask, block_m, block_n)
    return (mask if isinstance(mask, TileMask) else mask.to_mask()).keep


def sdpa_mask(attn_mask: torch.Tensor | None, call: SparseCall, n_q: int, n_k: int,
              is_causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA's mask for a sparse call: the tile mask's token mask (bool (B', H', Nq, Nk): B'·H'·Nq·Nk
    bytes), with causality (top-left) and with attn_mask (4-D; bool: both must allow, float: -inf
    where the tile mask drops a key). Returns (mask, has_key (B'', H'', Nq) bool): the rows with a key
    left; the others must come out 0 with LSE -inf, as the quantized backends give them."""
    tile_mask = call.tile_mask if isinstance(call.tile_mask, TileMask) else call.tile_mask.to_mask()
    allowed = tile_mask.token_mask()
    if is_causal:
        allowed = allowed & torch.ones(n_q, n_k, dtype=torch.bool, device=allowed.device).tril()
    if attn_mask is None:
        mask = allowed
    elif attn_mask.dtype == torch.bool:
        mask = allowed & attn_mask
    else:
        mask = attn_mask.masked_fill(~allowed, float("-inf"))
    has_key = (mask if mask.dtype == torch.bool else mask > float("-inf")).any(dim=-1)
    return mask, has_key


DYNAMIC_RULES = ("per-row", "global")
# Installed dynamic calls force, per head, one key tile in KEY_TILES_PER_PROBE_COLUMN (at least one)
# of most exact mass over the probe rows (`DynamicSelection.probe_columns`): global keys, which pooled
# scores average away. Wan 720p's 591 key tiles: 9 columns, a tenth of a 0.15 budget (89); on planted
# inputs at that shape 4-16 columns keep the same mass (docs/sparse.md, "Global columns by an exact probe").
KEY_TILES_PER_PROBE_COLUMN = 64


def probe_columns_for(key_tiles: int) -> int:
    """The key tiles per head an installed dynamic call's probe forces, of `key_tiles` in all."""
    return max(1, key_tiles // KEY_TILES_PER_PROBE_COLUMN)


def key_tiles_of(k: torch.Tensor, pv: str) -> int:
    """The key tiles of HND k (B, H, Nk, D) in the tiles of the kernel plan of PV mode `pv`."""
    return math.ceil(k.shape[2] / plans.tiles(pv, k.shape[-1])[1])


def select_tiles(q: torch.Tensor, k: torch.Tensor, *, method: str, density: float, pv: str, text_first: int = 0,
                 text_last: int = 0, grid: tuple[int, int, int] | None = None,
                 key_mask: torch.Tensor | None = None, rule: str = "per-row", top_p: float | None = None,
                 sm_scale: float | None = None) -> TileMask:
    """The tile mask of a block-sparse self-attention call on HND q, k (B, H, N, D), in the tiles of
    the kernel plan it runs (`plans.tiles(pv, D)`), chosen by `method` at a target `density`
    (kept / all key tiles): "dynamic" with `rule` "per-row" (`TileScores.keep_per_row`: each query
    tile keeps its forced tiles and its most probable others up to max(1, ceil(density · its valid
    key tiles)); no host read) or "global" (`tile_select.select_dynamic_at_density`: one top-p for
    every head found by bisection, a host read per try); with `top_p` given, "dynamic" keeps that
    estimated mass per query tile instead (`TileScores.keep`, no host read; `density` and `rule`
    unused: a calibrated plan's rule, `scores_at`); or "static" (`select_static_at_density` on
    the latent `grid` (frames, height, width) in raster order, the same for every batch row and head,
    computed once per setting and a constant to torch.compile). All keep the diagonal tiles, the
    first key tile (a sink) and every tile holding one of the `text_first` first or `text_last` last
    tokens (text), rows and columns. key_mask: bool (B' in {1, B}, N), True = a valid key (padding
    takes no part in the pooled scores; sm_scale: the dynamic scores' (None: D^-0.5). ValueError for a
    call that is not one. Installed models' dynamic calls pass `dynamic_selection` to the call
    instead, which selects on the device."""
    if q.dim() != 4 or q.shape != k.shape:
        raise ValueError(f"tile selection: q {tuple(q.shape)} and k {tuple(k.shape)} must be one self-attention's "
                         "(B, H, N, D)")
    block_m, block_n = plans.tiles(pv, q.shape[-1])
    if method == "dynamic":
        if rule not in DYNAMIC_RULES:
            raise ValueError(f"tile selection: rule={rule!r} is not one of {DYNAMIC_RULES}")
        if top_p is not None:
            return scores_at(q, k, pv=pv, text_first=text_first, text_last=text_last, key_mask=key_mask,
                             sm_scale=sm_scale).keep(top_p)
        options = dict(block_m=block_m, block_n=block_n, key_mask=key_mask, dense_prefix=text_first,
                       dense_suffix=text_last, sm_scale=sm_scale,
                       probe_columns=probe_columns_for(key_tiles_of(k, pv)))
        if rule == "per-row":
            return select_dynamic_per_row(q, k, density, **options)
        return select_dynamic_at_density(q, k, density, **options)
    if method != "static":
        raise ValueError(f"tile selection: method={method!r} is not 'dynamic' or 'static'")
    if grid is None:
        raise ValueError("tile selection: static selection needs the latent grid (frames, height, width)")
    video = math.prod(grid)
    if text_first + video + text_last != q.shape[2]:
        raise ValueError(f"tile selection: {text_first} + {video} ({'x'.join(map(str, grid))}) + {text_last} tokens "
                         f"do not make the call's {q.shape[2]}")
    keep = _static_constant(tuple(grid), float(density), block_m, block_n, text_first, text_last, q.device)
    known = None if torch.compiler.is_compiling() else _static_on_host(tuple(grid), float(density), block_m, block_n,
                                                                         text_first, text_last).density
    return TileMask(keep, block_m, block_n, q.shape[2], q.shape[2]).with_known_density(known)


def static_mask(grid: tuple[int, int, int], density: float, *, block_m: int, block_n: int,
                device: torch.device | str = "cpu") -> TileMask:
    """The static selection of a self-attention over the latent `grid` alone (raster order, no text):
    the 3-D window closest to `density` in block_m x block_n tiles, the diagonal and a sink tile kept;
    (1, 1, M, N), one for every batch row and head (`select_tiles`' static rule at chosen tiles)."""
    n = math.prod(grid)
    keep = _static_keep(tuple(grid), float(density), block_m, block_n, 0, 0, torch.device(device))
    known = _static_on_host(tuple(grid), float(density), block_m, block_n, 0, 0).density
    return TileMask(keep, block_m, block_n, n, n).with_known_density(known)


def dynamic_selection(density: float, *, key_tiles: int, top_p: float | None = None, text_first: int = 0,
                      text_last: int = 0) -> DynamicSelection:
    """What an installed model's dynamic call at `density` over `key_tiles` key tiles (of its plan)
    passes as `sageattn(tile_mask=...)`: the per-row density, or with `top_p` (a calibrated plan's)
    that top_p for every query tile, with the same forced tiles as `select_tiles` (the diagonal, one
    sink tile, the text rows and columns, the probe's `probe_columns_for(key_tiles)` columns). The
    call selects on the device in its own preparation where the Triton kernels run, else with the
    PyTorch definition: no host read either way, so compiled graphs stay whole."""
    forced = dict(sink_tiles=1, dense_prefix=text_first, dense_suffix=text_last,
                  probe_columns=probe_columns_for(key_tiles))
    if top_p is not None:
        return DynamicSelection(top_p=top_p, **forced)
    return DynamicSelection(density=density, **forced)


def scores_at(q: torch.Tensor, k: torch.Tensor, *, pv: str, text_first: int = 0, text_last: int = 0,
              key_mask: torch.Tensor | None = None, sm_scale: float | None = None) -> TileScores:
    """The `TileScores` of HND q, k (B, H, N, D) that an installed dynamic call selects from
    (`dynamic_selection`'s settings), in the tiles of the kernel plan of `pv`: `keep(top_p)` is that
    call's selection at a top_p, cheap to repeat (calibration searches the top_p of a density).
    key_mask: bool (B', N), True = a valid key; sm_scale: None for D^-0.5."""
    block_m, block_n = plans.tiles(pv, q.shape[-1])
    settings = dynamic_selection(1.0, key_tiles=key_tiles_of(k, pv), text_first=text_first, text_last=text_last)
    return TileScores(q, k, block_m=block_m, block_n=block_n, sm_scale=sm_scale, key_mask=key_mask,
                      **settings.scores_options())


@constant_under_compile  # no input decides it: a constant to torch.compile, no graph break
def _static_constant(grid: tuple[int, int, int], density: float, block_m: int, block_n: int, text_first: int,
                     text_last: int, device: torch.device) -> torch.Tensor:
    """`_static_keep`, which torch.compile calls while tracing and keeps as a constant (a cached function
    it would trace into instead, reading the density of each window it tries)."""
    return _static_keep(grid, density, block_m, block_n, text_first, text_last, device)


@functools.lru_cache(maxsize=32)
def _static_keep(grid: tuple[int, int, int], density: float, block_m: int, block_n: int, text_first: int,
                 text_last: int, device: torch.device) -> torch.Tensor:
    """The static selection's bool (1, 1, M, N) tiles on `device` (one per setting: it depends on no input)."""
    return _static_on_host(grid, density, block_m, block_n, text_first, text_last).keep.to(device)


@functools.lru_cache(maxsize=32)
def _static_on_host(grid: tuple[int, int, int], density: float, block_m: int, block_n: int, text_first: int,
                    text_last: int) -> TileMask:
    """The static selection's mask, made on the host (its density read there, without a device sync)."""
    mask, _ = select_static_at_density(grid, density, block_m=block_m, block_n=block_n, dense_prefix=text_first,
                                       dense_suffix=text_last, sink_tiles=1)
    return mask
