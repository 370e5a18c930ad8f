"""Block-sparse attention's contract in PyTorch: the tile mask, exact masked attention, and the
quantized emulation restricted to the mask (the oracle of the sparse kernels to come).

A tile mask says, per (batch, head, query tile), which key tiles a query tile visits; a skipped
tile is never loaded, so its keys take no part in the softmax. Two forms of the same mask:
- `TileMask`: dense bool (B, H, M_tiles, N_tiles), what selection builds and tests read;
- `TileLists`: what the kernels take, per query tile the visited key tiles in ascending order
  (int32, padded with -1 to the longest list) and their count, (B, H, M_tiles, max_keep) and
  (B, H, M_tiles); the counts also give a longest-first schedule its work per query tile.
B and H may be 1 in either form (one mask for every batch row or head).

The tiles are the kernel plan's (`plans.tiles`): a mask belongs to one (block_m, block_n) and to
one sequence length, which both forms carry and every entry checks. `TileMask.at_tiles` refines a
mask to smaller tiles that divide its own (e.g. one selection at 128x128 for the FP8 plan's 64x128).

Rows that visit no valid key (every kept key padded, or no tile kept) come out 0, as the dense
kernels do for rows whose every key is masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from sagevideo.kernels.reference import sageattn_reference


def _check_block(name: str, value: object, unit: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"tile mask: {name}={value!r} must be a positive int{unit}")


def _check_geometry(block_m: object, block_n: object, n_q: object, n_k: object) -> None:
    """Both forms' tiles and sequence lengths: positive ints."""
    _check_block("block_m", block_m)
    _check_block("block_n", block_n)
    _check_block("n_q", n_q, " (tokens)")
    _check_block("n_k", n_k, " (tokens)")


def _check_fits(n_q: int, n_k: int, lead: tuple[int, ...], q: torch.Tensor, k: torch.Tensor) -> None:
    """Either form's fit to q (B, H, Nq, D) and k (B, H_kv, Nk, D): its lengths, its (B, H) broadcast."""
    if q.shape[2] != n_q or k.shape[2] != n_k:
        raise ValueError(f"tile mask: built for {n_q} query / {n_k} key tokens, the inputs have "
                         f"{q.shape[2]} / {k.shape[2]}")
    b, h = lead
    if b not in (1, q.shape[0]) or h not in (1, q.shape[1]):
        raise ValueError(f"tile mask: its (B, H) = ({b}, {h}) does not broadcast to ({q.shape[0]}, {q.shape[1]})")


@dataclass(frozen=True)
class TileMask:
    """Dense form. keep: bool (B or 1, H or 1, ceil(n_q/block_m), ceil(n_k/block_n)); block_m/block_n:
    tokens per query/key tile; n_q/n_k: sequence lengths (the last tile may be partial).
    known_density: its `density` where sagevideo made the mask and knows it without reading `keep`
    (`full`, a static selection made on the host; set by `with_known_density`, never by a caller, whose
    claim nothing would check): a call then needs no host sync to record it or to see density 1."""

    keep: torch.Tensor
    block_m: int
    block_n: int
    n_q: int
    n_k: int
    known_density: float | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_geometry(self.block_m, self.block_n, self.n_q, self.n_k)
        if not isinstance(self.keep, torch.Tensor) or self.keep.dtype != torch.bool:
            raise ValueError(f"tile mask: keep must be a bool tensor, got "
                             f"{getattr(self.keep, 'dtype', type(self.keep).__name__)}")
        want = (self.m_tiles, self.n_tiles)
        if self.keep.dim() != 4 or tuple(self.keep.shape[2:]) != want:
            raise ValueError(f"tile mask: keep has shape {tuple(self.keep.shape)}, expected (B, H, {want[0]}, "
                             f"{want[1]}) for {self.n_q} query / {self.n_k} key tokens in "
                             f"{self.block_m}x{self.block_n} tiles")

    @property
    def m_tiles(self) -> int:
        return math.ceil(self.n_q / self.block_m)

    @property
    def n_tiles(self) -> int:
        return math.ceil(self.n_k / self.block_n)

    @classmethod
    def full(cls, batch: int, heads: int, n_q: int, n_k: int, block_m: int, block_n: int,
             device: torch.device | str | None = None) -> TileMask:
        """Every tile visited (density 1, known without reading the mask)."""
        keep = torch.ones(batch, heads, math.ceil(n_q / block_m), math.ceil(n_k / block_n), dtype=torch.bool,
                          device=device)
        return cls(keep, block_m, block_n, n_q, n_k).with_known_density(1.0)

    @property
    def density(self) -> float:
        """Kept tiles / all tiles, over every (batch, head, query tile)."""
        return float(self.keep.float().mean())

    def density_per_head(self) -> torch.Tensor:
        """fp64 (B, H): kept / all tiles of each head (what balancing work across heads needs)."""
        return self.keep.double().mean(dim=(2, 3))

    def expand(self, batch: int, heads: int) -> TileMask:
        """The mask for (batch, heads); a B or H of 1 is broadcast."""
        b, h = self.keep.shape[:2]
        if b not in (1, batch) or h not in (1, heads):
            raise ValueError(f"tile mask: its (B, H) = ({b}, {h}) does not broadcast to ({batch}, {heads})")
        expanded = TileMask(self.keep.expand(batch, heads, -1, -1), self.block_m, self.block_n, self.n_q, self.n_k)
        return expanded.with_known_density(self.known_density)

    def with_known_density(self, density: float | None) -> TileMask:
        """This mask, carrying `density` as its known density: only for masks whose density their maker
        computed itself (a wrong value would make a call skip or keep tiles the mask does not say)."""
        object.__setattr__(self, "known_density", density)
        return self

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """ValueError unless the mask fits q (B, H, Nq, D) and k (B, H, Nk, D)."""
        _check_fits(self.n_q, self.n_k, tuple(self.keep.shape[:2]), q, k)

    def token_mask(self, rows: slice | None = None) -> torch.Tensor:
        """bool (B, H, rows, Nk): the mask per token pair, for query rows `rows` (all by default)."""
        rows = rows or slice(0, self.n_q)
        start, stop = rows.start or 0, min(rows.stop, self.n_q)
        first, last = start // self.block_m, (stop - 1) // self.block_m + 1
        keep = self.keep[:, :, first:last].repeat_interleave(self.block_m, dim=2)
        keep = keep[:, :, start - first * self.block_m: stop - first * self.block_m]
        return keep.repeat_interleave(self.block_n, dim=3)[..., : self.n_k]

    def at_tiles(self, block_m: int, block_n: int) -> TileMask:
        """The same token mask in smaller tiles that divide this mask's own."""
        _check_block("block_m", block_m)
        _check_block("block_n", block_n)
        if self.block_m % block_m or self.block_n % block_n:
            raise ValueError(f"tile mask: {block_m}x{block_n} tiles do not divide its {self.block_m}x{self.block_n}")
        keep = self.keep.repeat_interleave(self.block_m // block_m, dim=2)
        keep = keep.repeat_interleave(self.block_n // block_n, dim=3)
        m_tiles, n_tiles = math.ceil(self.n_q / block_m), math.ceil(self.n_k / block_n)
        return TileMask(keep[:, :, :m_tiles, :n_tiles].contiguous(), block_m, block_n, self.n_q, self.n_k)

    def to_lists(self) -> TileLists:
        """The compact form: visited key tiles ascending, padded with -1, and their counts."""
        indices, counts = self.padded_lists()
        max_keep = int(counts.max()) if counts.numel() else 0
        return TileLists(indices[..., :max_keep].contiguous(), counts, self.n_tiles, self.block_m, self.block_n,
                         self.n_q, self.n_k)

    def padded_lists(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The compact form's tensors padded to every key tile: indices int32 (B, H, M_tiles, N_tiles),
        counts int32 (B, H, M_tiles). Nothing is read on the host (the longest list is not looked
        for), so a torch.compile graph stays whole; the kernels read only `count` entries a row."""
        counts = self.keep.sum(dim=-1, dtype=torch.int32)
        # a stable sort of "skipped" puts the kept tiles first, in ascending order
        order = torch.sort((~self.keep).to(torch.int8), dim=-1, stable=True).indices
        slot = torch.arange(self.n_tiles, device=self.keep.device)
        return torch.where(slot < counts[..., None], order, -1).to(torch.int32).contiguous(), counts


@dataclass(frozen=True)
class TileLists:
    """Compact form. indices: int32 (B or 1, H or 1, M_tiles, max_keep), the visited key tiles of each
    query tile, strictly ascending, then -1; counts: int32 (B, H, M_tiles), how many are visited;
    n_tiles: key tiles in all (ceil(n_k/block_n)).
    check_entries: also check the entries (counts in range, padding, ascending), which reads them on
    the host; False for lists a selection made on the device (`from_device`): only shapes and dtypes."""

    indices: torch.Tensor
    counts: torch.Tensor
    n_tiles: int
    block_m: int
    block_n: int
    n_q: int
    n_k: int
    check_entries: bool = field(default=True, repr=False, compare=False)

    @classmethod
    def from_device(cls, indices: torch.Tensor, counts: torch.Tensor, block_m: int, block_n: int, n_q: int,
                    n_k: int) -> TileLists:
        """Lists built on the device (`tile_select_kernel`, `TileMask.padded_lists`), correct by
        construction: wrapped without reading them (no host sync)."""
        return cls(indices, counts, math.ceil(n_k / block_n), block_m, block_n, n_q, n_k, check_entries=False)

    def __post_init__(self) -> None:
        _check_geometry(self.block_m, self.block_n, self.n_q, self.n_k)
        if self.n_tiles != math.ceil(self.n_k / self.block_n):
            raise ValueError(f"tile lists: n_tiles={self.n_tiles} but {self.n_k} keys make "
                             f"{math.ceil(self.n_k / self.block_n)} tiles of {self.block_n}")
        for name, tensor in (("indices", self.indices), ("counts", self.counts)):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int32:
                raise ValueError(f"tile lists: {name} must be an int32 tensor, got "
                                 f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
        m_tiles = math.ceil(self.n_q / self.block_m)
        if self.indices.dim() != 4 or self.indices.shape[2] != m_tiles:
            raise ValueError(f"tile lists: indices has shape {tuple(self.indices.shape)}, expected "
                             f"(B, H, {m_tiles}, max_keep)")
        if tuple(self.counts.shape) != tuple(self.indices.shape[:3]):
            raise ValueError(f"tile lists: counts has shape {tuple(self.counts.shape)}, expected "
                             f"{tuple(self.indices.shape[:3])} (indices' first three dims)")
        if self.check_entries:
            self._check_entries()

    def _check_entries(self) -> None:
        max_keep = self.indices.shape[3]
        if self.counts.numel() and (int(self.counts.min()) < 0 or int(self.counts.max()) > max_keep):
            raise ValueError(f"tile lists: counts must lie in [0, {max_keep}] (max_keep)")
        slot = torch.arange(max_keep, device=self.indices.device)
        listed = slot < self.counts[..., None]
        if bool((torch.where(listed, -1, self.indices) != -1).any()):
            raise ValueError("tile lists: entries past a query tile's count must be -1 (padding)")
        if bool(((self.indices < 0) | (self.indices >= self.n_tiles))[listed].any()):
            raise ValueError(f"tile lists: a listed key tile lies outside [0, {self.n_tiles})")
        rising = self.indices[..., 1:] > self.indices[..., :-1]
        if bool((~rising & listed[..., 1:]).any()):
            raise ValueError("tile lists: each query tile's key tiles must be strictly ascending (no repeats)")

    @property
    def density(self) -> float:
        return float(self.counts.double().mean()) / self.n_tiles

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """ValueError unless the lists fit q (B, H, Nq, D) and k (B, H, Nk, D)."""
        _check_fits(self.n_q, self.n_k, tuple(self.counts.shape[:2]), q, k)

    def to_mask(self) -> TileMask:
        """The dense form."""
        *lead, max_keep = self.indices.shape
        keep = torch.zeros(*lead, self.n_tiles + 1, dtype=torch.bool, device=self.indices.device)
        # padding (-1) lands in a spare last column, dropped after
        column = torch.where(self.indices < 0, self.n_tiles, self.indices).long()
        keep.scatter_(-1, column, True)
        return TileMask(keep[..., : self.n_tiles].contiguous(), self.block_m, self.block_n, self.n_q, self.n_k)


def in_tiles(tile_mask: TileMask | TileLists, block_m: int, block_n: int) -> TileMask | TileLists:
    """`tile_mask` in a kernel plan's (block_m, block_n) tiles: itself where they are its own, refined
    (`TileMask.at_tiles`, as a TileMask) where they divide its own, else ValueError naming both."""
    if (tile_mask.block_m, tile_mask.block_n) == (block_m, block_n):
        return tile_mask
    if tile_mask.block_m % block_m or tile_mask.block_n % block_n:
        raise ValueError(f"tile mask: built in {tile_mask.block_m}x{tile_mask.block_n} tiles, but this call's "
                         f"kernel plan computes in {block_m}x{block_n} tiles, which do not divide them; build the "
                         f"mask in {block_m}x{block_n} tiles (or in multiples of both: `TileMask.at_tiles` refines "
                         "those)")
    mask = tile_mask if isinstance(tile_mask, TileMask) else tile_mask.to_mask()
    return mask.at_tiles(block_m, block_n)


def kernel_lists(tile_mask: TileMask | TileLists) -> tuple[torch.Tensor, torch.Tensor]:
    """What the kernels take, (key tiles int32 (B', H', M_tiles, W), counts int32 (B', H', M_tiles)):
    a TileLists' own tensors, a TileMask's `padded_lists` (no host read)."""
    if isinstance(tile_mask, TileLists):
        return tile_mask.indices, tile_mask.counts
    return tile_mask.padded_lists()


def masked_attention_exact(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tile_mask: TileMask,
    *,
    sm_scale: float | None = None,
    key_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    return_lse: bool = False,
    chunk_rows: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact attention (fp64, HND) over the key tiles the mask keeps: q (B, H, Nq, D), k/v (B, H, Nk, D),
    key_mask (B', Nk) bool (True = valid). Skipped tiles' scores are -inf; a row with no valid kept key
    is 0 (LSE -inf). Returns out fp64 (B, H, Nq, D) [, LSE fp64 (B, H, Nq)]. chunk_rows: query rows per
    step (memory: B·H·chunk_rows·Nk fp64), by default about 2^24 scores per step."""
    tile_mask.check_inputs(q, k)
    batch, heads, n_q, _ = q.shape
    n_k = k.shape[2]
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    step = chunk_rows or max(tile_mask.block_m, (1 << 24) // max(1, batch * heads * n_k))
    k64, v64 = k.double(), v.double()
    valid = None if key_mask is None else key_mask.to(device=q.device, dtype=torch.bool)[:, None, None, :]
    outs, lses = [], []
    for start in range(0, n_q, step):
        stop = min(start + step, n_q)
        s = (q[:, :, start:stop].double() @ k64.transpose(-1, -2)) * scale
        allowed = tile_mask.token_mask(slice(start, stop)).to(s.device)
        if valid is not None:
            allowed = allowed & valid
        if is_causal:
            rows = torch.arange(start, stop, device=s.device)[:, None]
            allowed = allowed & (torch.arange(n_k, device=s.device)[None, :] <= rows)
        s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        has_keys = torch.isfinite(lse)
        p = torch.exp(s - torch.where(has_keys, lse, 0.0)[..., None])
        outs.append(torch.where(has_keys[..., None], p @ v64, 0.0))
        lses.append(lse)
    out = torch.cat(outs, dim=2)
    return (out, torch.cat(lses, dim=2)) if return_lse else out


def sparse_sageattn_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tile_mask: TileMask,
    *,
    sm_scale: float | None = None,
    key_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    qk_granularity: str = "block",
    pv: str = "fp16",
    smooth_k: bool = True,
    rotate_qk: bool = False,
    return_lse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The quantized kernels' numerics (`reference.sageattn_reference`, same quantization over every
    valid key: smoothing mean, K/V scales, V's range) restricted to the mask's key tiles, in the mask's
    tiles (block_m x block_n = the quantization groups). Returns (out in q's dtype, LSE fp32 or None).
    A mask of density 1 gives the dense reference's result bit for bit."""
    tile_mask.check_inputs(q, k)
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    return sageattn_reference(
        q, k, v, sm_scale=scale, block_m=tile_mask.block_m, block_n=tile_mask.block_n, is_causal=is_causal,
        key_mask=key_mask, qk_granularity=qk_granularity, pv=pv, smooth_k=smooth_k, rotate_qk=rotate_qk,
        return_lse=return_lse, key_tiles=tile_mask.keep.to(q.device),
    )
