"""Choosing the key tiles each query tile visits (block-sparse attention), in PyTorch.

Two ways, both returning a `sparse_reference.TileMask` (its `density` = kept / all tiles):
- dynamic (`select_dynamic`, `select_dynamic_at_density`): from the inputs. Q and K are pooled per
  tile (their mean tokens), each query tile scores every key tile by pooled q·k·sm_scale (plus the
  log of the tile's valid key count, so a partial or padded tile weighs what its keys do), a softmax
  over key tiles estimates the attention mass per tile, and a query tile keeps the fewest tiles
  whose estimated mass reaches `top_p`, or (`density`, `TileScores.keep_per_row`) its
  highest-mass tiles up to a count set by its own key tiles: a density that needs no search, so
  nothing is read on the host (compiled graphs stay whole). Always kept: the diagonal tiles (with `local_tiles`
  neighbours each side, in token order), the first `sink_tiles` key tiles, the text rows and columns
  of joint attention (`dense_prefix`/`dense_suffix` tokens), and the rows and columns of tiles whose
  tokens are not self-similar (mean cosine of a tile's tokens to its mean token below
  `min_similarity`): a mean misjudges such a tile, so it is not judged. Optionally (`max_spread`)
  also the columns of key tiles where one token stands out: its distance from the tile's mean token
  over the mean distance above `max_spread` (a single global key in a tile of 64-128 barely moves
  the mean, so mean pooling alone drops the mass every query gives it; docs/sparse.md). Or
  (`probe_columns`) the columns of each head's key tiles of most exact attention mass over a probe:
  PROBE_ROWS query rows at a fixed pseudo-random draw (`probe_rows`), attended exactly, the median
  over them of each key tile's mass (`probe_mass`): what pooling averages away, a probe sees. The
  median, not the mean: a tile most rows attend (a global key) ranks by what a typical row gives it,
  while a probe row's own neighbourhood, which only that row attends, ranks nowhere (with the mean,
  64 rows' neighbourhoods took the places of planted global keys at Wan's shape).
- static (`select_static`): spatio-temporal windows on the model's latent grid (frames, height,
  width): a query tile keeps the key tiles holding a token within the window of one of its own, with
  tiles in a token order that makes 3-D neighbourhoods contiguous (`grid_tile_order`).

K is pooled after smoothing (minus its mean over valid keys): the softmax over keys ignores a shared
offset, and an offset would make every key tile look self-similar.
Text positions per family (where `dense_prefix`/`dense_suffix` come from): CogVideoX and Open-Sora
put the text first, HunyuanVideo after the video, Wan's self-attention has none.

This is the definition. The device version (`tile_select_kernel`: pooling inside the quantization
pass, selection without a sort or a host sync) computes the same in fp32 in other summation orders.
Ties in the estimated mass are broken by key tile: the lower tile ranks first (a stable sort).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sagevideo.kernels.constants import COSINE_EPS
from sagevideo.kernels.sparse_reference import TileMask

GRID_AXES = 3
DEFAULT_TOP_P = 0.9
# The exact probe: PROBE_ROWS query rows, row i = hash(i + 1) mod Nq with a fixed 32-bit integer hash
# (`probe_rows`; the kernel computes the same): a pseudo-random draw with nothing to store or copy.
# Rows at even strides, or at golden-ratio steps (mod a 128-token cell they fell on 11 positions at
# Wan's 75,600 tokens), share few positions within the latent grid's cells and miss global keys
# (docs/sparse.md, "Global columns by an exact probe").
PROBE_ROWS = 64
PROBE_HASH_MUL = 0x45D9F3B
MASK_32 = 0xFFFFFFFF
# Per-row density's tile count is ceil(density · n · DENSITY_SLACK) in fp32: the slack absorbs the
# density's own rounding (fp32(0.15) · 20 = 3.0000001), so that a product meant as an integer gives it.
DENSITY_SLACK = 1.0 - 2.0**-20


def _pool_tiles(x: torch.Tensor, block: int, valid: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Per tile of `block` rows of x (B, H, N, D) fp32, over valid rows (valid (B', N) bool or None):
    (mean token (B, H, T, D), valid count (B' or 1, 1, T), mean cosine of tokens to the mean (B, H, T),
    spread (B, H, T): the largest distance of a token from the mean over the mean distance; 1 for a
    tile with no valid token, which is never kept for its own sake, or whose tokens are all equal)."""
    batch, heads, n, d = x.shape
    tiles = math.ceil(n / block)
    weight = torch.ones(1, n, device=x.device) if valid is None else valid.to(x.device, torch.float32)
    pad = tiles * block - n
    x = torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(batch, heads, tiles, block, d)
    weight = torch.nn.functional.pad(weight, (0, pad)).reshape(weight.shape[0], 1, tiles, block)
    count = weight.sum(dim=-1)
    mean = (x * weight[..., None]).sum(dim=3) / count.clamp(min=1)[..., None]
    cos = torch.nn.functional.cosine_similarity(x, mean[:, :, :, None], dim=-1, eps=COSINE_EPS)
    similarity = (cos * weight).sum(dim=-1) / count.clamp(min=1)
    distance = (x - mean[:, :, :, None]).norm(dim=-1)
    mean_distance = (distance * weight).sum(dim=-1) / count.clamp(min=1)
    spread = torch.where(weight > 0, distance, 0.0).amax(dim=-1) / mean_distance
    spread = torch.where((count > 0) & (mean_distance > 0), spread, 1.0)
    return mean, count, torch.where(count > 0, similarity, 1.0), spread


def _check_counts(**counts: int) -> None:
    """ValueError naming the first of `counts` (name=value) that is not an int >= 0."""
    for name, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"tile selection: {name}={value!r} must be an int >= 0")


def _check_text(dense_prefix: int, dense_suffix: int, n_q: int, n_k: int) -> None:
    if dense_prefix + dense_suffix > min(n_q, n_k):
        raise ValueError(f"tile selection: dense_prefix + dense_suffix = {dense_prefix + dense_suffix} text tokens "
                         f"exceed the sequence ({n_q} query / {n_k} key tokens)")


def forced_tiles(
    n_q: int, n_k: int, block_m: int, block_n: int, *, local_tiles: int = 0, sink_tiles: int = 0,
    dense_prefix: int = 0, dense_suffix: int = 0, device: torch.device | str | None = None,
) -> torch.Tensor:
    """bool (M_tiles, N_tiles): the tiles every selection keeps. Diagonal tiles (the key tiles
    holding a query tile's own positions, widened by `local_tiles` each side) only for self-attention
    (n_q == n_k); the first `sink_tiles` key tiles; every tile of a query or key tile that holds one
    of the first `dense_prefix` or last `dense_suffix` tokens (text), rows and columns."""
    _check_counts(local_tiles=local_tiles, sink_tiles=sink_tiles, dense_prefix=dense_prefix,
                  dense_suffix=dense_suffix)
    _check_text(dense_prefix, dense_suffix, n_q, n_k)
    m_tiles, n_tiles = math.ceil(n_q / block_m), math.ceil(n_k / block_n)
    forced = torch.zeros(m_tiles, n_tiles, dtype=torch.bool, device=device)
    if n_q == n_k:
        first = torch.arange(m_tiles, device=device) * block_m
        last = torch.clamp(first + block_m, max=n_q) - 1
        lo, hi = first // block_n - local_tiles, last // block_n + local_tiles
        cols = torch.arange(n_tiles, device=device)
        forced |= (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
    forced[:, :sink_tiles] = True
    for block, axis in ((block_m, 0), (block_n, 1)):
        if dense_prefix:
            forced.narrow(axis, 0, math.ceil(dense_prefix / block)).fill_(True)
    for tokens, block, axis, n in ((dense_suffix, block_m, 0, n_q), (dense_suffix, block_n, 1, n_k)):
        if tokens:
            first_tile = (n - tokens) // block
            forced.narrow(axis, first_tile, forced.shape[axis] - first_tile).fill_(True)
    return forced


def probe_rows(n_q: int, device: torch.device | str | None = None) -> torch.Tensor:
    """int64 (PROBE_ROWS,): the query rows the exact probe attends, hash(i + 1) mod n_q (`probe_hash`)."""
    return probe_hash(torch.arange(1, PROBE_ROWS + 1, device=device)) % n_q


def probe_hash(x):
    """A 32-bit integer mix (two multiply-xorshift rounds) of int64 x in [0, 2**32), elementwise (the
    kernel's `_probe_hash` is the same in Triton)."""
    x = ((x >> 16) ^ x) * PROBE_HASH_MUL & MASK_32
    x = ((x >> 16) ^ x) * PROBE_HASH_MUL & MASK_32
    return (x >> 16) ^ x


def probe_mass(q: torch.Tensor, k: torch.Tensor, *, block_n: int, sm_scale: float,
               key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 (B, H, N_tiles): per head, the median over the probe rows (`probe_rows`) of q (B, H, Nq, D)
    of the exact attention mass each key tile of k (B, H, Nk, D) receives (key_mask (B', Nk) bool,
    True = valid; a tile without a valid key receives 0). In fp32: each row's logsumexp per key tile,
    then a softmax over the tiles (what the device kernel computes)."""
    n_k = k.shape[2]
    tiles = math.ceil(n_k / block_n)
    rows = q[:, :, probe_rows(q.shape[2], q.device)].float()
    scores = (rows @ k.float().transpose(-1, -2)) * sm_scale
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask.to(scores.device, torch.bool)[:, None, None, :], -math.inf)
    scores = torch.nn.functional.pad(scores, (0, tiles * block_n - n_k), value=-math.inf)
    tile_lse = torch.logsumexp(scores.unflatten(-1, (tiles, block_n)), dim=-1)
    return mass_from_tile_lse(tile_lse)


def mass_from_tile_lse(tile_lse: torch.Tensor) -> torch.Tensor:
    """fp32 (..., N_tiles) from per-row, per-key-tile logsumexps (..., rows, N_tiles): the median over
    rows (the lower one of an even count) of the softmax over tiles (0 for a row without a valid key)."""
    return torch.nan_to_num(torch.softmax(tile_lse, dim=-1), nan=0.0).median(dim=-2).values


def top_columns(mass: torch.Tensor, columns: int) -> torch.Tensor:
    """bool like mass (..., N_tiles): the `columns` tiles of most mass, ties to the lower tile."""
    order = torch.argsort(mass, dim=-1, descending=True, stable=True)[..., :columns]
    return torch.zeros_like(mass, dtype=torch.bool).scatter_(-1, order, True)


@dataclass(frozen=True)
class DynamicSelection:
    """The dynamic selection's settings (`TileScores`; the device kernel takes the same).

    How many free (not forced) tiles a query tile keeps, one of:
    - top_p in [0, 1] (`TileScores.keep`): the fewest whose estimated mass, with the forced tiles',
      reaches it (1 keeps every tile with a valid key; 0 only the forced tiles and each query tile's
      top one); a density then needs a search over top_p (`select_dynamic_at_density`, host reads);
    - density in (0, 1] (`TileScores.keep_per_row`; it rules when given, and top_p must stay at its
      default): each query tile keeps its forced tiles and its highest-mass others up to
      max(1, ceil(density · its key tiles with a valid key)) tiles in all: no search, no host read.
    `local_tiles`/`sink_tiles`/`dense_prefix`/`dense_suffix` as `forced_tiles`, `min_similarity`:
    tiles whose mean token cosine is below it are kept, row and column, `max_spread` (inf: off):
    key tiles whose spread (`_pool_tiles`) is above it are kept, column, and `probe_columns` (0: off):
    per head, that many key tiles of most exact mass over the probe rows (`probe_mass`) are kept,
    column (forced: a per-row density counts them in its tiles)."""

    top_p: float = DEFAULT_TOP_P
    local_tiles: int = 0
    sink_tiles: int = 1
    min_similarity: float = 0.5
    dense_prefix: int = 0
    dense_suffix: int = 0
    max_spread: float = math.inf
    density: float | None = None
    probe_columns: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.top_p, int | float) or not 0 <= self.top_p <= 1:
            raise ValueError(f"tile selection: top_p={self.top_p!r} must lie in [0, 1]")
        if self.density is not None:
            if isinstance(self.density, bool) or not isinstance(self.density, int | float) or not 0 < self.density <= 1:
                raise ValueError(f"tile selection: density={self.density!r} must lie in (0, 1] (None: by top_p)")
            if self.top_p != DEFAULT_TOP_P:
                raise ValueError(f"tile selection: give top_p ({self.top_p!r}) or density ({self.density!r}), not "
                                 "both: a per-row density decides how many tiles each query tile keeps by itself")
        if not isinstance(self.min_similarity, int | float) or not math.isfinite(self.min_similarity):
            raise ValueError(f"tile selection: min_similarity={self.min_similarity!r} must be a finite number")
        if not isinstance(self.max_spread, int | float) or not self.max_spread > 0:
            raise ValueError(f"tile selection: max_spread={self.max_spread!r} must be a number > 0 (inf: off)")
        _check_counts(local_tiles=self.local_tiles, sink_tiles=self.sink_tiles, dense_prefix=self.dense_prefix,
                      dense_suffix=self.dense_suffix, probe_columns=self.probe_columns)

    @property
    def per_row(self) -> bool:
        """Whether a per-row density (not top_p) decides the free tiles."""
        return self.density is not None

    @property
    def uses_spread(self) -> bool:
        """Whether the key tiles' spread decides anything (max_spread finite)."""
        return math.isfinite(self.max_spread)

    def check_tokens(self, n_q: int, n_k: int) -> None:
        """ValueError unless the text fits n_q query and n_k key tokens."""
        _check_text(self.dense_prefix, self.dense_suffix, n_q, n_k)

    def scores_options(self) -> dict:
        """`TileScores`' keyword arguments for these settings (all but top_p and density)."""
        return {"local_tiles": self.local_tiles, "sink_tiles": self.sink_tiles, "min_similarity": self.min_similarity,
                "dense_prefix": self.dense_prefix, "dense_suffix": self.dense_suffix, "max_spread": self.max_spread,
                "probe_columns": self.probe_columns}

    def keep(self, scores: TileScores) -> TileMask:
        """The tiles these settings keep of `scores` (made with `scores_options()`): by density or top_p."""
        return scores.keep_per_row(self.density) if self.per_row else scores.keep(self.top_p)


def tiles_at_density(density: float, valid: torch.Tensor) -> torch.Tensor:
    """int64 like `valid` (a count of key tiles with a valid key, any int dtype and shape): the tiles a
    query tile keeps at a per-row density, max(1, ceil(density · valid · DENSITY_SLACK)), each product
    rounded to fp32 as the device kernel rounds it (the same count bit for bit)."""
    scaled = torch.tensor(density, dtype=torch.float32, device=valid.device) * valid.to(torch.float32)
    return torch.ceil(scaled * DENSITY_SLACK).to(torch.int64).clamp(min=1)


class TileScores:
    """The dynamic selection's estimate of each key tile's attention mass for q (B, H, Nq, D) and
    k (B, H, Nk, D) (key_mask (B', Nk) bool, True = valid), sorted per query tile with the forced
    tiles first; `keep(top_p)` is the selection at one threshold, cheap to repeat (a density is
    reached by trying several).

    probe_column_mass: with `probe_columns`, fp32 (B, H): the exact mass the probe's columns carry
    beyond the columns every query tile keeps anyway (sinks, text), summed over them, each its median
    over the probe rows: small where attention is local (0.1-0.2 % for 2 columns on the small planted
    inputs), about ten times that where a few keys draw every query (global keys); None without a probe."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, *, block_m: int, block_n: int,
                 sm_scale: float | None = None, key_mask: torch.Tensor | None = None, local_tiles: int = 0,
                 sink_tiles: int = 1, min_similarity: float = 0.5, dense_prefix: int = 0, dense_suffix: int = 0,
                 max_spread: float = math.inf, probe_columns: int = 0):
        if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
            raise ValueError(f"tile selection: q {tuple(q.shape)} and k {tuple(k.shape)} must be (B, H, N, D) "
                             "with the same B, H and D")
        self.n_q, self.n_k = q.shape[2], k.shape[2]
        self.block_m, self.block_n = block_m, block_n
        scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
        valid = None if key_mask is None else key_mask.to(device=k.device, dtype=torch.bool)
        kf = k.float()
        if valid is None:
            kf = kf - kf.mean(dim=2, keepdim=True)
        else:
            keep = valid[:, None, :, None]
            mean = torch.where(keep, kf, 0.0).sum(dim=2, keepdim=True) / keep.sum(dim=2, keepdim=True).clamp(min=1)
            kf = torch.where(keep, kf - mean, 0.0)
        q_mean, _, q_similarity, _ = _pool_tiles(q.float(), block_m, None)
        k_mean, k_count, k_similarity, k_spread = _pool_tiles(kf, block_n, valid)
        self.q_similarity, self.k_similarity, self.k_spread = q_similarity, k_similarity, k_spread
        scores = (q_mean @ k_mean.transpose(-1, -2)) * scale + torch.log(k_count)[:, :, None, :]
        probs = torch.softmax(scores, dim=-1)  # a tile with no valid key: log 0 = -inf, probability 0
        forced = forced_tiles(self.n_q, self.n_k, block_m, block_n, local_tiles=local_tiles, sink_tiles=sink_tiles,
                              dense_prefix=dense_prefix, dense_suffix=dense_suffix, device=q.device)
        forced = (forced | (q_similarity < min_similarity)[..., :, None]
                  | ((k_similarity < min_similarity) | (k_spread > max_spread))[..., None, :])
        self.probe_column_mass = None
        if probe_columns:
            mass = probe_mass(q, k, block_n=block_n, sm_scale=scale, key_mask=valid)
            probed = top_columns(mass, probe_columns)
            # what the probe adds: its columns that no rule keeps for every query tile already (sinks, text)
            added = probed & ~forced.all(dim=-2).expand_as(probed)
            self.probe_column_mass = (mass * added).sum(dim=-1)
            forced = forced | probed[..., None, :]
        has_keys = (k_count > 0)[:, :, None, :].expand_as(probs)
        forced = forced & has_keys  # a tile of padding only is never worth a visit
        self.probs = probs
        self.forced = forced
        self.has_keys = has_keys
        order = torch.argsort(probs + 2.0 * forced, dim=-1, descending=True, stable=True)
        sorted_probs = probs.gather(-1, order)
        self._mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # of the tiles ranked above
        self._forced_sorted = forced.gather(-1, order)
        self._useful_sorted = has_keys.gather(-1, order)
        self._order = order

    def keep(self, top_p: float) -> TileMask:
        """Per query tile the forced tiles, then the fewest others whose estimated mass (with the
        forced tiles') reaches top_p; at least its top tile (a query tile never goes empty).
        top_p >= 1 keeps every tile with a valid key (a sum in fp32 may reach 1 before the last tile)."""
        below = self._mass_before < top_p
        below[..., 0] = True
        if top_p >= 1:
            below[:] = True
        kept_sorted = (below & self._useful_sorted) | self._forced_sorted
        keep = torch.zeros_like(kept_sorted).scatter_(-1, self._order, kept_sorted)
        return TileMask(keep, self.block_m, self.block_n, self.n_q, self.n_k)

    def density_curve(self, steps: int) -> torch.Tensor:
        """fp64 (steps + 1,): entry j is `keep(j / steps).density`, for every j at once (one histogram
        instead of steps + 1 selections: what a search for the top_p of a density over many calls
        needs). steps: a power of two up to 2**24, so that j / steps is exact in fp32, where `keep`
        compares (mass before a tile < top_p), and floor(mass · steps) < j decides the same."""
        if not isinstance(steps, int) or isinstance(steps, bool) or not 0 < steps <= 2**24 or steps & (steps - 1):
            raise ValueError(f"tile selection: steps={steps!r} must be a power of two up to 2**24")
        decided = self._useful_sorted & ~self._forced_sorted
        decided[..., 0] = False  # each query tile's top tile is kept at any top_p
        always = self._forced_sorted.clone()
        always[..., 0] |= self._useful_sorted[..., 0]
        # a tile is kept from the first j above its mass before it: floor(mass · steps) + 1 (exact scaling)
        first_j = (self._mass_before[decided] * steps).floor().clamp(0, steps).to(torch.int64)
        joins = torch.bincount(first_j, minlength=steps + 1)[: steps + 1]
        kept = always.sum().double() + torch.cat([joins.new_zeros(1), joins.cumsum(0)[:-1]]).double()
        kept[-1] = (self._useful_sorted | self._forced_sorted).sum().double()  # top_p 1: every tile with a key
        return kept.cpu() / self.probs.numel()

    def _per_row_ranks(self, density: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(free: bool (B, H, M, N), each free tile's rank among its query tile's free tiles, int64 like
        free (0 = highest probability, ties to the lower key tile), how many free tiles each query
        tile keeps at `density`, int64 (B, H, M))."""
        if isinstance(density, bool) or not isinstance(density, int | float) or not 0 < density <= 1:
            raise ValueError(f"tile selection: density={density!r} must lie in (0, 1]")
        free = self.has_keys & ~self.forced
        budget = tiles_at_density(density, self.has_keys.sum(dim=-1)) - self.forced.sum(dim=-1)
        # tiles that are not free rank after every free one (a probability is >= 0, NaN only in rows
        # without a valid key, where nothing is free)
        order = torch.argsort(torch.where(free, self.probs, -1.0), dim=-1, descending=True, stable=True)
        ranks = torch.arange(order.shape[-1], device=order.device).expand_as(order)
        rank = torch.empty_like(order).scatter_(-1, order, ranks)
        return free, rank, budget.clamp(min=0)

    def keep_per_row(self, density: float) -> TileMask:
        """The selection at a per-row density in (0, 1]: each query tile keeps its forced tiles and
        then its free tiles (with a valid key, not forced) in descending estimated mass, ties to the
        lower key tile, until it holds k = max(1, ceil(density · n)) tiles in all, n its key tiles
        with a valid key (`tiles_at_density`); forced tiles are kept even beyond k. A query tile's
        count is therefore max(forced, min(k, n)) and depends on no other query tile or head: nothing
        to search, so the device kernel needs no host read."""
        free, rank, budget = self._per_row_ranks(density)
        keep = self.forced | (free & (rank < budget[..., None]))
        return TileMask(keep, self.block_m, self.block_n, self.n_q, self.n_k)

    def per_row_margins(self, density: float) -> torch.Tensor:
        """fp32 (B, H, M_tiles): per query tile at a per-row density, the relative gap (p_kept - p_next)
        / p_kept between the least probable free tile it keeps and the most probable one it drops; inf
        where it keeps none or drops none; 0 for a tie. A selection whose probabilities differ by rounding (the
        device kernel) agrees with `keep_per_row` on the query tiles where this exceeds it."""
        return self._cut_gaps(self.keep_per_row(density).keep)

    def row_margins(self, top_p: float) -> torch.Tensor:
        """fp32 (B, H, M_tiles): per query tile, how far top_p lies from the nearest mass its threshold
        compares with (over the tiles it decides: not forced, with a valid key, not the top one); inf
        where none. A selection that sums the same masses in another order (the device kernel) agrees
        with `keep(top_p)` on the query tiles where this exceeds their rounding difference."""
        decided = self._useful_sorted & ~self._forced_sorted
        decided[..., 0] = False
        gaps = torch.where(decided, (self._mass_before - top_p).abs(), math.inf)
        return gaps.amin(dim=-1) if gaps.shape[-1] else gaps.sum(dim=-1)

    def cut_gaps(self, top_p: float) -> torch.Tensor:
        """fp32 (B, H, M_tiles): per query tile at top_p, the relative gap (p_kept - p_dropped) / p_kept
        between the least probable tile it keeps of those it decides (not forced, with a valid key) and
        the most probable one it drops; inf where it keeps or drops none of them, 0 for a tie.
        `row_margins` says how far the count is from changing; this, how far two tiles at the cut are
        from swapping at the same count: probabilities that differ by rounding (the device kernel)
        can swap them where it is below their relative difference."""
        return self._cut_gaps(self.keep(top_p).keep)

    def _cut_gaps(self, keep: torch.Tensor) -> torch.Tensor:
        """`cut_gaps` and `per_row_margins` of the selection `keep` (bool like probs): over the free tiles
        (a valid key, not forced), (least kept - most dropped) / least kept; inf where none is kept or
        none dropped, 0 for a tie."""
        free = self.has_keys & ~self.forced
        least_kept = torch.where(free & keep, self.probs, math.inf).amin(dim=-1)
        most_dropped = torch.where(free & ~keep, self.probs, -math.inf).amax(dim=-1)
        gap = torch.where(least_kept > 0, (least_kept - most_dropped) / least_kept, 0.0)  # both 0: a tie
        return torch.where(least_kept.isinf() | most_dropped.isinf(), math.inf, gap)

    def nearest_boundary(self, top_p: float) -> float:
        """The smallest `row_margins` (inf where no query tile decides anything)."""
        margins = self.row_margins(top_p)
        return float(margins.min()) if margins.numel() else math.inf


def select_dynamic(q: torch.Tensor, k: torch.Tensor, *, top_p: float = 0.9, **options) -> TileMask:
    """Dynamic selection (module docstring); top_p in (0, 1]: the estimated mass each query tile
    keeps (1 keeps every tile with a valid key). options: `TileScores`' (block_m, block_n required)."""
    if not 0 < top_p <= 1:
        raise ValueError(f"tile selection: top_p={top_p} must lie in (0, 1]")
    return TileScores(q, k, **options).keep(top_p)


def select_dynamic_per_row(q: torch.Tensor, k: torch.Tensor, density: float, **options) -> TileMask:
    """Dynamic selection at a per-row density (`TileScores.keep_per_row`): each query tile keeps its
    forced tiles and its highest-mass others up to max(1, ceil(density · its valid key tiles)) in all.
    options: `TileScores`' (block_m, block_n required)."""
    return TileScores(q, k, **options).keep_per_row(density)


def select_dynamic_at_density(q: torch.Tensor, k: torch.Tensor, density: float, *, steps: int = 30,
                              **options) -> TileMask:
    """The dynamic selection whose one top_p (shared by every head) gives the highest density not
    above `density` (bisection), or the least it can keep (forced tiles and each query tile's
    first) where that already passes it. options: `TileScores`'."""
    if not 0 < density <= 1:
        raise ValueError(f"tile selection: density={density} must lie in (0, 1]")
    scores = TileScores(q, k, **options)
    lo, hi = 0.0, 1.0
    best = scores.keep(0.0)
    for _ in range(steps):
        mid = (lo + hi) / 2
        mask = scores.keep(mid)
        if mask.density <= density:
            lo, best = mid, mask
        else:
            hi = mid
    return best


def _check_grid(frames: int, height: int, width: int) -> None:
    for name, value in (("frames", frames), ("height", height), ("width", width)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"latent grid: {name}={value!r} must be a positive int")


def grid_tile_order(frames: int, height: int, width: int, tile_t: int, tile_h: int, tile_w: int) -> torch.Tensor:
    """int64 (frames·height·width,): order[p] = the raster (frame, row, column) index of the token at
    position p, tokens grouped in (tile_t, tile_h, tile_w) cells taken in raster order, raster inside
    a cell (cells at the grid's far edges are cut short). With tile_t·tile_h·tile_w = the attention
    tile and a grid the cells divide, every tile is one cell. x[..., order, :] permutes a raster
    sequence, x[..., inverse_order(order), :] restores it."""
    _check_grid(frames, height, width)
    for name, value in (("tile_t", tile_t), ("tile_h", tile_h), ("tile_w", tile_w)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"latent grid: {name}={value!r} must be a positive int")
    t, y, x = torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij")
    cells_y, cells_x = math.ceil(height / tile_h), math.ceil(width / tile_w)
    cell = ((t // tile_t) * cells_y + y // tile_h) * cells_x + x // tile_w
    inside = ((t % tile_t) * tile_h + y % tile_h) * tile_w + x % tile_w
    key = cell * (tile_t * tile_h * tile_w) + inside
    return torch.argsort(key.flatten(), stable=True)


def inverse_order(order: torch.Tensor) -> torch.Tensor:
    """The permutation undoing `order` (int64)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


def grid_coordinates(frames: int, height: int, width: int, order: torch.Tensor | None = None) -> torch.Tensor:
    """int64 (N, 3): (frame, row, column) of each video token, in `order` (raster when None)."""
    _check_grid(frames, height, width)
    t, y, x = torch.meshgrid(torch.arange(frames), torch.arange(height), torch.arange(width), indexing="ij")
    coords = torch.stack([t.flatten(), y.flatten(), x.flatten()], dim=-1)
    return coords if order is None else coords[order.cpu()]


def _tile_boxes(coords: torch.Tensor, n: int, block: int, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tile of a sequence of n tokens whose video tokens (coords (N_video, 3)) start at `prefix`:
    (lo, hi) (T, 3) fp64, the bounding box of its video tokens (lo = +inf for a tile without any)."""
    tiles = math.ceil(n / block)
    lo = torch.full((tiles * block, GRID_AXES), math.inf, dtype=torch.float64)
    hi = torch.full((tiles * block, GRID_AXES), -math.inf, dtype=torch.float64)
    lo[prefix:prefix + coords.shape[0]] = coords.double()
    hi[prefix:prefix + coords.shape[0]] = coords.double()
    return lo.reshape(tiles, block, GRID_AXES).amin(dim=1), hi.reshape(tiles, block, GRID_AXES).amax(dim=1)


def select_static(
    grid: tuple[int, int, int],
    window: tuple[int, int, int],
    *,
    block_m: int,
    block_n: int,
    order: torch.Tensor | None = None,
    dense_prefix: int = 0,
    dense_suffix: int = 0,
    sink_tiles: int = 0,
    device: torch.device | str | None = None,
) -> TileMask:
    """Static selection for self-attention over [dense_prefix text; video (grid = frames, height, width,
    in `order`, raster when None); dense_suffix text]: query tile i keeps key tile j when some video
    token of j lies within `window` = (frames, rows, columns) of some video token of i, each axis
    separately (|Δ| ≤ window), judged on the tiles' bounding boxes (exact for tiles that are whole
    cells of `grid_tile_order`, a superset otherwise); text tiles stay dense, the first `sink_tiles`
    key tiles are kept. Returns a (1, 1, M, N) mask (the same for every batch row and head)."""
    frames, height, width = grid
    if any(not isinstance(w, int) or w < 0 for w in window) or len(window) != GRID_AXES:
        raise ValueError(f"static selection: window={window!r} must be three ints >= 0 (frames, rows, columns)")
    coords = grid_coordinates(frames, height, width, order)
    n = dense_prefix + coords.shape[0] + dense_suffix
    q_lo, q_hi = _tile_boxes(coords, n, block_m, dense_prefix)
    k_lo, k_hi = _tile_boxes(coords, n, block_n, dense_prefix)
    # per axis, the gap between the boxes (0 where they overlap); inf where a tile has no video token
    gap = torch.maximum(k_lo[None] - q_hi[:, None], q_lo[:, None] - k_hi[None]).clamp(min=0)
    limit = torch.tensor(window, dtype=torch.float64)
    keep = (gap <= limit).all(dim=-1)
    keep |= forced_tiles(n, n, block_m, block_n, sink_tiles=sink_tiles, dense_prefix=dense_prefix,
                         dense_suffix=dense_suffix)
    return TileMask(keep[None, None].to(device), block_m, block_n, n, n)


def select_static_at_density(grid: tuple[int, int, int], density: float, *, block_m: int, block_n: int,
                             **options) -> tuple[TileMask, tuple[int, int, int]]:
    """(mask, window) of the static selection whose window gives the density closest to `density`;
    windows grow one latent unit at a time on the axis where the window is the smallest fraction of
    the grid (a window in proportion to the grid). options: those of `select_static` but window."""
    if not 0 < density <= 1:
        raise ValueError(f"static selection: density={density} must lie in (0, 1]")
    window = [0, 0, 0]
    best = None
    while True:
        mask = select_static(grid, tuple(window), block_m=block_m, block_n=block_n, **options)
        if best is None or abs(mask.density - density) < abs(best[0].density - density):
            best = (mask, tuple(window))
        growable = [axis for axis in range(GRID_AXES) if window[axis] < grid[axis] - 1]
        if mask.density >= density or not growable:
            return best
        axis = min(growable, key=lambda a: (window[a] + 1) / grid[a])
        window[axis] += 1
