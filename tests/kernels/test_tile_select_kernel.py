"""The device tile selection (`tile_select_kernel`) and the per-tile statistics the quantization pass
pools for it (`quantize_inputs(pool=True)`), against the PyTorch definition (`tile_select`), under
the CPU interpreter or on the GPU.

Exactness: the kernels compute the definition's formulas in fp32 in other summation orders, so a
threshold lying within rounding (~1e-6) of a mass the reference compares, or of a tile's
similarity, may decide a tile differently. The tests choose top_p at least MARGIN away from every
such mass (`TileScores.nearest_boundary`) and min_similarity at least MARGIN away from every tile's
similarity, and then require identical lists and counts. Ties (equal estimated masses) are exact in
both, and both rank the lower key tile first.
"""

import dataclasses
import functools
import math

import pytest
import torch
import triton
import triton.language as tl

from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs
from sagevideo.kernels import dispatch, tile_select, tile_select_kernel
from sagevideo.kernels.plans import plain_triton, prep_plan, select_plan
from sagevideo.kernels.quantize import quantize_inputs
from sagevideo.kernels.rotation import hadamard_pm1
from sagevideo.kernels.sparse_reference import TileLists
from sagevideo.kernels.tile_select import DynamicSelection, TileScores, _pool_tiles, grid_tile_order
from sagevideo.kernels.tile_select_kernel import probe_columns, select_lists, selection_probe

pytestmark = pytest.mark.kernels  # Triton kernels, interpreted on a CPU: make test-fast leaves them out

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MARGIN = 1e-4


def _plan(block_m=64, block_n=32, pv="fp16", head_dim=64):
    """A plain-kernel plan with the given tiles: small tiles give many tiles at the interpreter's sizes."""
    plan = plain_triton(select_plan(torch.device(DEVICE), head_dim, pv).plan)
    return dataclasses.replace(plan, block_m=block_m, block_n=block_n)


def _smoothed(k, key_mask):
    """K as `TileScores` pools it: minus its mean over valid keys, padded keys 0 (fp32)."""
    kf = k.float()
    keep = torch.ones_like(kf[..., :1], dtype=torch.bool) if key_mask is None else key_mask[:, None, :, None]
    mean = torch.where(keep, kf, 0.0).sum(dim=2, keepdim=True) / keep.sum(dim=2, keepdim=True).clamp(min=1)
    return torch.where(keep, kf - mean, 0.0)


def _tiled(batch, sharpness, n_q, n_k=None, *, seed, kv_heads=None, noisy=(), block_m=64, block_n=32, d=64):
    """fp16 q (B, H, Nq, d), k (B, H_kv, Nk, d), H = len(sharpness): each key tile's tokens share a centre,
    each query tile's a mix of three of its K head's key-tile centres (so it attends those most); tokens
    are their centre plus noise (self-similar tiles), queries scaled by their head's sharpness; but the token
    ranges `noisy`, which hold unrelated tokens (tiles there are not self-similar). K carries an offset
    every token shares (smoothing removes it)."""
    gen = torch.Generator().manual_seed(seed)
    heads, n_k = len(sharpness), n_k or n_q
    kv_heads = kv_heads or heads
    m_tiles, n_tiles = math.ceil(n_q / block_m), math.ceil(n_k / block_n)
    k_centres = torch.randn(kv_heads, n_tiles, d, generator=gen)
    picks = torch.randint(0, n_tiles, (heads, m_tiles, 3), generator=gen)
    weights = torch.rand(heads, m_tiles, 3, 1, generator=gen)
    mixes = [(k_centres[h * kv_heads // heads][picks[h]] * weights[h]).sum(dim=1) for h in range(heads)]
    q = torch.stack(mixes).repeat_interleave(block_m, dim=1)[None, :, :n_q]
    k = k_centres.repeat_interleave(block_n, dim=1)[None, :, :n_k]
    q = (q + 0.4 * torch.randn(batch, heads, n_q, d, generator=gen)) * torch.tensor(sharpness)[:, None, None]
    k = k + 0.4 * torch.randn(batch, kv_heads, n_k, d, generator=gen)
    for start, stop in noisy:
        q[:, :, start:stop] = 2 * torch.randn(batch, heads, stop - start, d, generator=gen)
        k[:, :, start:stop] = 2 * torch.randn(batch, kv_heads, stop - start, d, generator=gen)
    return q.to(DEVICE, torch.float16), (k + 1.5).to(DEVICE, torch.float16)


@dataclasses.dataclass
class Case:
    """Inputs, their settings and the reference's scores (fp16 q (B, H, Nq, D), k (B, H_kv, Nk, D))."""

    q: torch.Tensor
    k: torch.Tensor
    key_mask: torch.Tensor | None
    plan: object
    selection: DynamicSelection
    scores: TileScores

    def reference(self, top_p, **change):
        scores = self.scores if not change else _scores(self.q, self.k, self.key_mask, self.plan,
                                                         dataclasses.replace(self.selection, **change))
        return scores.keep(top_p).padded_lists()

    @functools.cached_property
    def pooled(self):
        """The fused path's statistics: the preparation with pooling, once per case."""
        q, k, plan = self.q, self.k, self.plan
        mask = None if self.key_mask is None else self.key_mask.to(torch.uint8)
        launch = dataclasses.replace(prep_plan(plan), kv_tiles_per_program=8, min_programs_per_head=1)
        return quantize_inputs(q, k, k, mask, None, plan, sm_scale=q.shape[-1] ** -0.5, per_token=False,
                               smooth_k=True, need_shift=False, pool=True, pool_spread=self.selection.uses_spread,
                               prep=launch).pooled

    def kernel(self, top_p, **change):
        """The selection kernel's (key tiles, counts) on the pooled statistics (and the probe's columns)."""
        return self._lists(dataclasses.replace(self.selection, top_p=top_p, **change))

    def kernel_per_row(self, density, **change):
        """The selection kernel's (key tiles, counts) at a per-row density."""
        return self._lists(dataclasses.replace(self.selection, density=density, **change))

    def _lists(self, selection):
        q, k, plan = self.q, self.k, self.plan
        mask = None if self.key_mask is None else self.key_mask.to(torch.uint8)
        probe = selection_probe(q, k, mask, selection, block_n=plan.block_n, sm_scale=q.shape[-1] ** -0.5)
        return select_lists(self.pooled, selection, batch=q.shape[0], heads=q.shape[1], kv_heads=k.shape[1],
                            n_q=q.shape[2], n_k=k.shape[2], block_m=plan.block_m, block_n=plan.block_n,
                            sm_scale=q.shape[-1] ** -0.5, probe=probe)

    def top_ps(self, wanted):
        """Per wanted value, the nearest top_p (in steps of 0.005) at least MARGIN from every boundary."""
        grid = [round(0.005 * i, 3) for i in range(1, 200)]
        usable = [p for p in grid if self.scores.nearest_boundary(p) > MARGIN]
        return [min(usable, key=lambda p, w=w: abs(p - w)) for w in wanted]


def _scores(q, k, key_mask, plan, selection=None, *, base=None, **change):
    """The reference's `TileScores` for `selection` (or `base` with `change`), K repeated for grouped KV."""
    selection = selection or dataclasses.replace(base, **change)
    group = q.shape[1] // k.shape[1]
    return TileScores(q, k.repeat_interleave(group, dim=1), block_m=plan.block_m, block_n=plan.block_n,
                      sm_scale=q.shape[-1] ** -0.5, key_mask=key_mask, **selection.scores_options())


def _with_margin(values, wanted, margin=MARGIN):
    """A threshold near `wanted` at least `margin` (relative above 1) from every value."""
    values = values.flatten().double()
    for step in range(400):
        for candidate in (wanted + 0.002 * step, wanted - 0.002 * step):
            if ((values - candidate).abs() / max(1.0, candidate)).min() > margin:
                return candidate
    raise AssertionError(f"no threshold near {wanted} with a margin")


def _case(q, k, key_mask, plan, selection, similarity_near=0.5, spread_near=None):
    """The inputs with min_similarity (and max_spread, where asked for) moved to a margin from every
    tile's similarity (spread)."""
    scores = _scores(q, k, key_mask, plan, selection)
    change = {"min_similarity": _with_margin(torch.cat([scores.q_similarity.flatten(),
                                                        scores.k_similarity.flatten()]), similarity_near)}
    if spread_near is not None:
        change["max_spread"] = _with_margin(scores.k_spread, spread_near)
    selection = dataclasses.replace(selection, **change)
    return Case(q, k, key_mask, plan, selection, _scores(q, k, key_mask, plan, selection))


@functools.cache
def _random_case():
    """2 x 3 heads of different sharpness, 384 tokens in 32 x 16 tiles (12 x 24), keys 330.. of batch row 1
    padded (key tiles 21-23 only padding, tile 20 partly), 20 text tokens first and 12 last, unrelated
    tokens (not self-similar) in query tile 3 and key tile 16, a sink tile and one local tile each side."""
    q, k = _tiled(2, (0.3, 1.0, 3.0), 384, seed=0, noisy=((96, 128), (256, 272)), block_m=32, block_n=16)
    key_mask = torch.ones(2, 384, dtype=torch.bool, device=DEVICE)
    key_mask[1, 330:] = False
    selection = DynamicSelection(local_tiles=1, sink_tiles=1, dense_prefix=20, dense_suffix=12)
    return _case(q, k, key_mask, _plan(32, 16), selection)


@functools.cache
def _planted_case():
    """Planted structure (3-D windows, a temporal-stripe head, sinks, global keys) on a 4 x 8 x 16 grid in
    32-token cells, 32 x 32 tiles, forced: the diagonal and the key tiles where one key stands out."""
    spec = PlantedSpec(1, 2, 4, 8, 16, 64, stripe_every=2, sinks=2, global_tokens=2, sharpness=6.0)
    x = planted_inputs(spec, order=grid_tile_order(4, 8, 16, 1, 4, 8), device=DEVICE)
    q, k = (t.to(torch.float16) for t in (x.q, x.k))
    return _case(q, k, None, _plan(32, 32), DynamicSelection(sink_tiles=0), similarity_near=0.3, spread_near=1.9)


@functools.cache
def _cross_case():
    """Cross-attention (320 queries, 448 keys: no diagonal) with 4 query heads on 2 K heads, text tokens first,
    the key tiles of the largest spreads kept."""
    q, k = _tiled(1, (0.5, 2.0, 1.0, 4.0), 320, 448, seed=1, kv_heads=2)
    return _case(q, k, None, _plan(64, 32), DynamicSelection(sink_tiles=2, dense_prefix=20), spread_near=1.2)


CASES = {"random": _random_case, "planted": _planted_case, "cross-gqa": _cross_case}


def _assert_same_lists(kernel, reference, rows=None):
    """Identical lists and counts (on the query tiles `rows`, bool (B, H, M), where given)."""
    (indices, counts), (want_indices, want_counts) = kernel, reference
    if rows is not None:
        indices, want_indices, counts, want_counts = indices[rows], want_indices[rows], counts[rows], want_counts[rows]
    differ = int((counts != want_counts).sum())
    assert differ == 0 and torch.equal(indices, want_indices), (
        f"{differ} query tiles keep another number of key tiles; lists differ in "
        f"{int((indices != want_indices).any(dim=-1).sum())} query tiles")


# --- the pooled statistics ----------------------------------------------------------------------


POOL_CLOSE = dict(rtol=1e-5, atol=2e-6)


def _assert_pools_as_defined(pooled, q, k, plan, key_mask):
    """The preparation's pooled Q and K means and similarities (`PooledTiles`) equal `_pool_tiles` of
    q and of k smoothed (key_mask (B, Nk) bool or None) in the plan's tiles, within POOL_CLOSE.
    Returns the reference's (k_count, k_similarity, k_spread)."""
    q_mean, _, q_similarity, _ = _pool_tiles(q.float(), plan.block_m, None)
    k_mean, k_count, k_similarity, k_spread = _pool_tiles(_smoothed(k, key_mask), plan.block_n, key_mask)
    for got, want in ((pooled.q_mean, q_mean), (pooled.q_similarity, q_similarity), (pooled.k_mean, k_mean),
                      (pooled.k_similarity, k_similarity)):
        torch.testing.assert_close(got.reshape(want.shape), want, **POOL_CLOSE)
    return k_count, k_similarity, k_spread


@pytest.mark.parametrize("case", ["rotated-key-padding", "unsmoothed-grouped-kv"])
def test_the_quantization_pass_pools_what_pool_tiles_defines(case):
    """Per tile: Q's mean token and mean cosine to it (rows past Nq left out), and K's (minus its mean
    over valid keys, before the rotation, also where the attention does not smooth K), valid-key
    counts; a tile of padding only: mean 0, similarity 1. Grouped K/V heads are pooled once each."""
    batch, heads, n = (2, 2, 200)
    q, k = _tiled(batch, (1.0, 2.0), n, seed=3, noisy=((64, 128),), block_m=128, block_n=64)
    v = torch.randn_like(k)
    key_mask = None
    if case == "rotated-key-padding":
        key_mask = torch.ones(batch, n, dtype=torch.bool, device=DEVICE)
        key_mask[1, 120:] = False  # batch row 1: key tiles 2.. (of 64) padding only
    else:
        q = torch.cat([q, 2 * q], dim=1)
    plan = _plan(128, 64)
    prepared = quantize_inputs(
        q, k, v, None if key_mask is None else key_mask.to(torch.uint8),
        hadamard_pm1(64, q.device, q.dtype) if case == "rotated-key-padding" else None, plan, sm_scale=0.125,
        per_token=False, smooth_k=case == "rotated-key-padding", need_shift=True, pool=True, pool_spread=True)
    pooled = prepared.pooled
    k_count, k_similarity, k_spread = _assert_pools_as_defined(pooled, q, k, plan, key_mask)
    torch.testing.assert_close(pooled.k_spread.reshape(k_spread.shape), k_spread, **POOL_CLOSE)
    assert torch.equal(pooled.k_count.reshape(batch, heads, -1), k_count.expand(batch, heads, -1))
    assert (k_similarity < 0.5).any() and (k_similarity > 0.9).any()  # both kinds of tile are there
    if key_mask is not None:
        assert (pooled.k_count.reshape(batch, heads, -1)[1, :, 2:] == 0).all()
        assert (pooled.k_similarity.reshape(batch, heads, -1)[1, :, 2:] == 1).all()
        assert (pooled.k_spread.reshape(batch, heads, -1)[1, :, 2:] == 1).all()
    else:
        assert (prepared.k_mean == 0).all()  # the attention's K stays unsmoothed; only the pooling subtracts


def test_pooling_leaves_every_other_output_of_the_preparation_bit_identical():
    """The POOL switch adds stores and changes nothing the attention reads (dense calls take POOL off):
    FP8 V, K and Q codes and scales, the LSE shift, with and without smoothing."""
    q, k = _tiled(2, (1.0, 2.0), 200, seed=4)
    v = torch.randn_like(q)
    key_mask = torch.ones(2, 200, dtype=torch.uint8, device=DEVICE)
    key_mask[0, 150:] = 0
    plan = plain_triton(select_plan(torch.device(DEVICE), 64, "fp8").plan)
    runs = [quantize_inputs(q, k, v, key_mask, hadamard_pm1(64, q.device, q.dtype), plan, sm_scale=0.125,
                            per_token=False, smooth_k=smooth, need_shift=True, pool=pool)
            for smooth in (True, False) for pool in (False, True)]
    for plain, pooled in (runs[:2], runs[2:]):
        assert plain.pooled is None and pooled.pooled is not None
        for field in dataclasses.fields(plain):
            a, b = getattr(plain, field.name), getattr(pooled, field.name)
            if field.name == "pooled" or a is None:
                continue
            if a.dtype == torch.float8_e4m3fn:
                a, b = a.view(torch.uint8), b.view(torch.uint8)
            assert torch.equal(a, b), field.name


# --- the selection ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_kernel_lists_equal_the_reference_selection(name):
    """Several top_p (with a margin to every boundary), 0 (forced tiles and each query tile's top one)
    and 1 (every tile with a valid key): the device lists equal `TileScores.keep`'s, entry for entry."""
    case = CASES[name]()
    densities = []
    for top_p in (0.0, *case.top_ps((0.3, 0.6, 0.85, 0.97)), 1.0):
        reference = case.reference(top_p)
        _assert_same_lists(case.kernel(top_p), reference)
        densities.append(float(reference[1].double().mean()) / reference[0].shape[-1])
    assert densities == sorted(densities) and densities[0] < densities[-2] < densities[-1]


@pytest.mark.slow  # the selection kernel twice more under the interpreter (4 s)
def test_rows_per_program_change_no_list(monkeypatch):
    """A selection program holds SELECT_ELEMENTS scores (fewer query tiles per program at longer
    sequences): one query tile per program gives the same lists."""

    case = _random_case()
    top_p = case.top_ps((0.7,))[0]
    many = case.kernel(top_p)
    monkeypatch.setattr(tile_select_kernel, "SELECT_ELEMENTS", 16)  # 24 key tiles: T_PAD 32, one row
    one = case.kernel(top_p)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


def test_forced_and_non_self_similar_tiles_are_kept():
    """top_p = 0 on the random case keeps the forced tiles: the diagonal ± 1, the sink, the text rows and
    columns, the rows and columns of the tiles that are not self-similar; never key tile 11 of batch
    row 1 (padding only), even in text rows; and nothing else but each query tile's top tile where
    nothing is forced (none here)."""
    case = _random_case()
    indices, counts = case.kernel(0.0)
    keep = TileLists.from_device(indices, counts, 32, 16, 384, 384).to_mask().keep
    assert keep[..., :, :2].all()  # the sink and the text prefix's key tiles
    assert keep[..., :, 16].all()  # the noisy key tile
    assert keep[0, ..., 23].all() and not keep[1, ..., 21:].any()  # the text suffix's key tile, where not padding
    for batch, valid in ((0, 24), (1, 21)):
        assert keep[batch, :, 0, :valid].all() and keep[batch, :, 11, :valid].all()  # text rows
        assert keep[batch, :, 3, :valid].all()  # the noisy query tile
        for i in range(12):  # query tile i: key tiles 2i, 2i+1 and one each side
            assert keep[batch, :, i, max(0, 2 * i - 1): min(valid, 2 * i + 3)].all()
    assert int(keep.sum()) == int(case.scores.forced.sum())  # nothing but forced tiles


def test_one_tile_off_fails_the_comparison():
    """Two top_p values a boundary apart: the reference keeps exactly one tile more at the second; the
    kernel follows it there, and its lists compared with the first's reference fail. A local window
    narrowed by one tile (forced tiles missing; at top_p = 0, where nothing else keeps them) fails too."""
    case = _random_case()
    grid = [p for p in (round(0.005 * i, 3) for i in range(1, 200)) if case.scores.nearest_boundary(p) > MARGIN]
    kept = {p: int(case.reference(p)[1].sum()) for p in grid}
    low, high = next((a, b) for a, b in zip(grid, grid[1:], strict=False) if kept[b] - kept[a] == 1)
    kernel = case.kernel(high)
    _assert_same_lists(kernel, case.reference(high))
    with pytest.raises(AssertionError, match="1 query tiles keep another number"):
        _assert_same_lists(kernel, case.reference(low))
    with pytest.raises(AssertionError, match="query tiles keep another number"):
        _assert_same_lists(case.kernel(0.0, local_tiles=0), case.reference(0.0))


def test_ties_rank_the_lower_key_tile_first():
    """Key tile 9 made a copy of key tile 3: every query tile scores them equally (an exact tie in both).
    At a top_p where the reference keeps one of the two, it keeps tile 3 (its stable sort), and so does
    the kernel (a prefix sum over the tied tiles in key order)."""
    q, k = _tiled(1, (1.0, 3.0), 384, seed=5)
    k[:, :, 9 * 32: 10 * 32] = k[:, :, 3 * 32: 4 * 32]
    case = _case(q, k, None, _plan(64, 32), DynamicSelection(sink_tiles=0))
    probs, forced = case.scores.probs, case.scores.forced
    assert torch.equal(probs[..., 3], probs[..., 9])
    decided = ~forced[..., 3] & ~forced[..., 9]  # not query tiles 1 and 4, whose diagonals hold them
    split = next((p for p in case.top_ps([0.01 * i for i in range(5, 100)])
                  if (case.scores.keep(p).keep[..., 3] & ~case.scores.keep(p).keep[..., 9] & decided).any()), None)
    assert split is not None, "no top_p keeps one of the tied tiles without the other"
    keep = case.scores.keep(split).keep
    assert not (keep[..., 9] & ~keep[..., 3] & decided).any()
    _assert_same_lists(case.kernel(split), case.reference(split))


# "random" runs in `make test` only, as above
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name == "random" else name
                                  for name in sorted(CASES)])
def test_the_kernel_lists_at_a_per_row_density_equal_the_reference(name):
    """BY_COUNT: per query tile the forced tiles and the most probable others up to max(1, ceil(density x
    valid key tiles)), entry for entry as `TileScores.keep_per_row` (no query tile has two free tiles
    within MARGIN of each other at its count's edge: `per_row_margins`), from a density below one tile
    (the forced tiles alone) to 1 (every tile with a valid key)."""
    case = CASES[name]()
    densities = []
    for density in (1e-3, 0.2, 0.35, 0.5, 0.8, 1.0):
        assert (case.scores.per_row_margins(density) > MARGIN).all()
        reference = case.scores.keep_per_row(density).padded_lists()
        _assert_same_lists(case.kernel_per_row(density), reference)
        densities.append(float(reference[1].double().mean()) / reference[0].shape[-1])
    assert densities == sorted(densities) and densities[0] < densities[3] < densities[-1]
    assert torch.equal(case.kernel_per_row(1e-3)[1], case.scores.forced.sum(dim=-1).int())


# --- the exact probe ------------------------------------------------------------------------------


def _probe_reference(q, k, key_mask, block_n):
    """`tile_select.probe_mass` of q against k's heads repeated for each query head (grouped KV)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return tile_select.probe_mass(q, k, block_n=block_n, sm_scale=q.shape[-1] ** -0.5, key_mask=key_mask)


def _columns_with_a_margin(mass, wanted):
    """The column count nearest `wanted` whose least kept mass exceeds the most dropped one by more than
    MARGIN (relative) in every head, so that rounding cannot swap them."""
    ranked = mass.sort(dim=-1, descending=True).values
    for columns in sorted(range(1, ranked.shape[-1]), key=lambda c: abs(c - wanted)):
        kept, dropped = ranked[..., columns - 1], ranked[..., columns]
        if ((kept - dropped) > MARGIN * kept).all():
            return columns
    raise AssertionError("no column count with a margin")


@pytest.mark.parametrize("name", ["random", "cross-gqa"])
def test_the_probe_kernel_forces_the_columns_probe_mass_defines(name):
    """`_probe_lse_kernel` and its reduction: per head the key tiles of most exact mass over the probe
    rows, as `probe_mass` and `top_columns` choose them (key padding and grouped KV included)."""
    case = CASES[name]()
    mass = _probe_reference(case.q, case.k, case.key_mask, case.plan.block_n)
    columns = _columns_with_a_margin(mass, 3)
    mask = None if case.key_mask is None else case.key_mask.to(torch.uint8)
    got = probe_columns(case.q, case.k, mask, columns=columns, block_n=case.plan.block_n,
                        sm_scale=case.q.shape[-1] ** -0.5)
    want = tile_select.top_columns(mass, columns)
    assert torch.equal(got.bool(), want), f"{int((got.bool() != want).sum())} columns differ"
    if case.key_mask is not None:  # key tiles of padding only (batch row 1) get no mass and come last
        assert mass[1, :, 21:].eq(0).all()


@pytest.mark.parametrize("name", ["planted", "cross-gqa"])
def test_the_kernel_lists_with_a_probe_equal_the_reference(name):
    """With probe_columns (the spread rule off: it finds the planted global keys itself), at a per-row
    density and a top_p: the lists are the reference's entry for entry; without the probe they are not
    (its columns decide)."""
    case = CASES[name]()
    columns = _columns_with_a_margin(_probe_reference(case.q, case.k, case.key_mask, case.plan.block_n), 2)
    change = {"probe_columns": columns, "max_spread": math.inf}
    scores = _scores(case.q, case.k, case.key_mask, case.plan, base=case.selection, **change)
    assert (scores.per_row_margins(0.3) > MARGIN).all()
    reference = scores.keep_per_row(0.3).padded_lists()
    _assert_same_lists(case.kernel_per_row(0.3, **change), reference)
    with pytest.raises(AssertionError, match="differ"):
        _assert_same_lists(case.kernel_per_row(0.3, max_spread=math.inf), reference)
    top_p = next(p for p in (0.5, 0.55, 0.45, 0.6) if scores.nearest_boundary(p) > MARGIN)
    _assert_same_lists(case.kernel(top_p, **change), scores.keep(top_p).padded_lists())


def test_select_lists_refuses_a_probe_it_was_not_given():
    case = _planted_case()
    with pytest.raises(ValueError, match="probe_columns=2 needs the probe"):
        select_lists(case.pooled, dataclasses.replace(case.selection, probe_columns=2), batch=1, heads=2,
                     kv_heads=2, n_q=512, n_k=512, block_m=32, block_n=32, sm_scale=0.125)


@pytest.mark.parametrize("off_by", [-1, 1])
def test_a_per_row_count_one_off_fails_the_comparison(monkeypatch, off_by):
    """The reference with k - 1 or k + 1 tiles per query tile: the kernel's lists no longer match it (in
    every query tile where the count is not held by the forced tiles or the valid tiles)."""
    case = _planted_case()
    kernel = case.kernel_per_row(0.5)
    _assert_same_lists(kernel, case.scores.keep_per_row(0.5).padded_lists())
    right = tile_select.tiles_at_density
    monkeypatch.setattr(tile_select, "tiles_at_density", lambda d, valid: right(d, valid) + off_by)
    with pytest.raises(AssertionError, match="query tiles keep another number"):
        _assert_same_lists(kernel, case.scores.keep_per_row(0.5).padded_lists())


@triton.jit
def _count_threshold_probe(Probs, Free, Budget, Out, ROWS: tl.constexpr, T: tl.constexpr):
    """Out (ROWS,) = `tile_select_kernel._count_threshold` of Probs (ROWS, T) fp32, Free (ROWS, T) uint8,
    Budget (ROWS,) int32."""
    rows, cols = tl.arange(0, ROWS), tl.arange(0, T)
    probs = tl.load(Probs + rows[:, None] * T + cols[None, :])
    free = tl.load(Free + rows[:, None] * T + cols[None, :]) != 0
    budget = tl.load(Budget + rows)
    tl.store(Out + rows, tile_select_kernel._count_threshold(probs, free, budget, ROWS))


def test_the_count_threshold_is_the_budget_th_largest_free_probability():
    """The per-row density's threshold search (a bisection that stops once one candidate is left) returns
    the budget-th largest free probability, 0 where fewer tiles are free, +inf at budget 0: with ties (at
    the cut and elsewhere), zeros, tiles that are not free, budgets from 0 to past the free tiles, a cut
    between two probabilities one ulp apart, a NaN (never ranked), values spread over 30 decades."""
    gen = torch.Generator().manual_seed(11)
    rows, width = 16, 32
    probs = torch.rand(rows, width, generator=gen) ** 4
    probs[1, 5:20] = probs[1, 3]  # a run of ties at the cut
    probs[2, :] = probs[2, 0]  # every tile tied
    probs[3, ::2] = 0.0  # zeros (an underflowed softmax)
    probs[4, 7] = probs[4, 3].nextafter(torch.zeros(()))  # one ulp below another probability...
    free = torch.rand(rows, width, generator=gen) > 0.2
    free[4, 3] = free[4, 7] = True
    free[5] = False  # nothing free
    n_free = free.sum(dim=1)
    budget = torch.randint(1, width, (rows,), generator=gen)
    budget[4] = int((free[4] & (probs[4] >= probs[4, 3])).sum())  # ...and the cut between the two
    budget[6], budget[7], budget[8], budget[9] = 0, 1, n_free[8], n_free[9] + 1
    probs[10, 0], free[10, 0] = math.nan, True
    probs[11, 1:] *= 1e-30  # one tile far above the rest
    free[11], budget[11] = True, 9
    n_free = (free & ~probs.isnan()).sum(dim=1)
    ranked = torch.where(free & ~probs.isnan(), probs, -1.0).sort(dim=1, descending=True).values
    want = torch.where(budget <= n_free, ranked.gather(1, (budget - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    want = torch.where(budget <= 0, torch.inf, want)
    out = torch.empty(rows, device=DEVICE)
    _count_threshold_probe[(1,)](probs.to(DEVICE), free.to(DEVICE, torch.uint8), budget.int().to(DEVICE), out,
                                 ROWS=rows, T=width)
    assert torch.equal(out.cpu(), want), out.cpu() - want


@triton.jit
def _threshold_probe(Probs, Free, ForcedMass, TopP, Out, ROWS: tl.constexpr, T: tl.constexpr,
                     ALL_STEPS: tl.constexpr):
    """Out (ROWS,) = `tile_select_kernel._threshold` of Probs (ROWS, T) fp32, Free (ROWS, T) uint8,
    ForcedMass (ROWS,) and TopP (ROWS,) fp32; ALL_STEPS: the plain 31-step bisection instead (the
    named reference: the same masked sum at every step, no early exit)."""
    rows, cols = tl.arange(0, ROWS), tl.arange(0, T)
    probs = tl.load(Probs + rows[:, None] * T + cols[None, :])
    free = tl.load(Free + rows[:, None] * T + cols[None, :]) != 0
    forced_mass = tl.load(ForcedMass + rows)
    top_p = tl.load(TopP + rows)
    if ALL_STEPS:
        lo = tl.zeros((ROWS,), dtype=tl.int32)
        hi = tl.full((ROWS,), 0x7F800000, dtype=tl.int32)
        for _ in range(31):
            mid = lo + (hi - lo) // 2
            over = free & (probs > mid.to(tl.float32, bitcast=True)[:, None])
            below = forced_mass + tl.sum(tl.where(over, probs, 0.0), axis=1) < top_p
            hi = tl.where(below, mid, hi)
            lo = tl.where(below, lo, mid + 1)
        # a row the forced tiles already settle overshoots +inf by one bit (NaN): both keep no free tile
        t = tl.minimum(lo, 0x7F800000).to(tl.float32, bitcast=True)
    else:
        t = tile_select_kernel._threshold(probs, free, forced_mass, top_p, ROWS)
    tl.store(Out + rows, t)


def test_the_top_p_threshold_stops_early_at_the_same_t():
    """The top-p threshold search (a bisection that stops once one candidate is left) returns what all
    31 steps return, bit for bit, and the float64 definition's answer (the smallest free probability,
    or 0, with forced mass + the free mass above it below top_p; +inf where the forced mass reaches
    top_p) where top_p lies clear of every partial sum: with ties, zeros, tiles that are not free, a
    cut between two probabilities one ulp apart, top_p 0 and 1, rows with nothing free."""
    gen = torch.Generator().manual_seed(12)
    rows, width = 32, 64
    probs = torch.rand(rows, width, generator=gen) ** 4
    probs[1, 5:30] = probs[1, 3]  # a run of ties
    probs[2, :] = probs[2, 0]  # every tile tied
    probs[3, ::2] = 0.0  # zeros (an underflowed softmax)
    probs[4, 7] = probs[4, 3].nextafter(torch.zeros(()))  # one ulp below another probability
    probs = probs / probs.sum(dim=1, keepdim=True)
    # from almost every tile free to one or two: the search's last steps differ with few candidates
    free = torch.rand(rows, width, generator=gen) < torch.linspace(0.9, 0.02, rows)[:, None]
    free[4, 3] = free[4, 7] = True
    free[5] = False  # nothing free
    free[9], free[10], free[11] = False, False, False
    free[9, 5] = True  # one free tile, top_p above all the mass: t = 0
    free[10, [2, 9]] = True  # two free tiles, top_p between them
    free[11, [1, 4, 6]] = True  # three
    forced_mass = torch.where(free, 0.0, probs).sum(dim=1)
    top_p = torch.rand(rows, generator=gen) * 0.9 + 0.05
    top_p[6], top_p[7], top_p[8] = 0.0, 1.0, forced_mass[8] * 0.5  # reached by the forced tiles alone
    top_p[9] = forced_mass[9] + probs[9, 5] + 1e-3
    top_p[10] = forced_mass[10] + probs[10, [2, 9]].max() + 1e-3 * probs[10, [2, 9]].min()
    top_p[11] = forced_mass[11] + probs[11, [1, 4, 6]].max() + 1e-3 * probs[11, [1, 4, 6]].min()
    # row 4: top_p right between keeping the upper of the two and keeping both
    ranked = torch.where(free[4], probs[4], -1.0).sort(descending=True).values
    upper = int((ranked > probs[4, 3]).sum()) + 1
    top_p[4] = forced_mass[4] + ranked[:upper].sum() - probs[4, 3] * 0.25
    out, full = torch.empty(rows, device=DEVICE), torch.empty(rows, device=DEVICE)
    args = (probs.to(DEVICE), free.to(DEVICE, torch.uint8), forced_mass.to(DEVICE), top_p.to(DEVICE))
    _threshold_probe[(1,)](*args, out, ROWS=rows, T=width, ALL_STEPS=False)
    _threshold_probe[(1,)](*args, full, ROWS=rows, T=width, ALL_STEPS=True)
    assert torch.equal(out.cpu(), full.cpu()), (out - full).cpu()

    checked = 0
    for row in range(rows):
        candidates = [0.0] + sorted({float(p) for p, f in zip(probs[row], free[row], strict=True) if f})
        p64, f = probs[row].double(), free[row]
        mass = [float(forced_mass[row]) + float(p64[f & (probs[row] > c)].sum()) for c in candidates]
        if min(abs(m - float(top_p[row])) for m in mass) < MARGIN:
            continue  # within rounding of a partial sum: fp32 may decide the other way
        below = [c for c, m in zip(candidates, mass, strict=True) if m < float(top_p[row])]
        want = min(below) if below else math.inf
        assert float(out[row]) == pytest.approx(want, rel=0, abs=0), row
        checked += 1
    assert checked >= rows // 2


def test_a_per_row_density_ranks_tied_tiles_by_key_tile():
    """Key tile 9 a copy of key tile 3: at a density where the reference keeps one of the two, it is
    tile 3, and the kernel's count bisection and prefix count over the tied tiles keep the same.
    Queries along one channel: each pooled score is then one product, the same for both copies in
    any summation order (the CPU interpreter's fp32 matmul rounds two equal columns differently by
    their position on some processors, which would split the tie before the selection sees it)."""
    q, k = _tiled(1, (1.0, 3.0), 384, seed=5)
    q[..., 1:] = 0.0
    k[:, :, 9 * 32: 10 * 32] = k[:, :, 3 * 32: 4 * 32]
    case = _case(q, k, None, _plan(64, 32), DynamicSelection(sink_tiles=0))
    decided = ~case.scores.forced[..., 3] & ~case.scores.forced[..., 9]
    split = next((d for d in (i / 32 for i in range(1, 32))
                  if (case.scores.keep_per_row(d).keep[..., 3] & ~case.scores.keep_per_row(d).keep[..., 9]
                      & decided).any()), None)
    assert split is not None, "no density keeps one of the tied tiles without the other"
    _assert_same_lists(case.kernel_per_row(split), case.scores.keep_per_row(split).padded_lists())


def test_batch_rows_without_a_valid_key_list_nothing():
    q, k = _tiled(2, (1.0, 1.0), 192, seed=6)
    key_mask = torch.ones(2, 192, dtype=torch.bool, device=DEVICE)
    key_mask[1] = False
    case = _case(q, k, key_mask, _plan(64, 32), DynamicSelection(local_tiles=1, dense_prefix=10))
    for top_p in (0.0, 0.5, 1.0):
        indices, counts = case.kernel(top_p)
        _assert_same_lists((indices, counts), case.reference(top_p))
        assert (counts[1] == 0).all() and (indices[1] == -1).all() and (counts[0] > 0).all()
    for density in (0.01, 0.5, 1.0):
        indices, counts = case.kernel_per_row(density)
        _assert_same_lists((indices, counts), case.scores.keep_per_row(density).padded_lists())
        assert (counts[1] == 0).all() and (indices[1] == -1).all() and (counts[0] > 0).all()


@pytest.mark.parametrize("rule", ["top_p", "per-row density"])
def test_the_selection_reads_nothing_on_the_host(monkeypatch, rule):
    """No tensor is read back in Python while selecting (item, bool, int, float, tolist raise here): the
    lists' width is the key tiles' count, known from the shapes; a per-row density's count is made on
    the device."""
    case = _random_case()

    def refuse(self, *args, **kwargs):
        raise AssertionError("a host read while selecting tiles")

    for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    selection = dataclasses.replace(case.selection, **({"top_p": 0.6} if rule == "top_p" else {"density": 0.5}))
    plan = _plan(128, 64)  # the device plan's tiles at d64 / fp16: the kernels' entry
    lists = dispatch.select_tiles(case.q, case.k, selection, pv=plan.pv, sm_scale=0.125, key_mask=case.key_mask)
    monkeypatch.undo()
    assert lists.indices.shape == (2, 3, 3, 6) and not lists.check_entries
    assert lists.to_mask().keep.any()


def test_selection_settings_are_checked_by_name():
    with pytest.raises(ValueError, match="top_p=1.5"):
        DynamicSelection(top_p=1.5)
    with pytest.raises(ValueError, match="local_tiles=-1"):
        DynamicSelection(local_tiles=-1)
    with pytest.raises(ValueError, match="max_spread=0"):
        DynamicSelection(max_spread=0)
    assert not DynamicSelection().uses_spread and DynamicSelection(max_spread=2.0).uses_spread
    with pytest.raises(ValueError, match="exceed the sequence"):
        DynamicSelection(dense_prefix=300).check_tokens(256, 256)


# --- selecting and attending in one call --------------------------------------------------------


def _one_go(q, k, v, plan, selection, key_mask=None):
    from sagevideo.kernels.op import sageattn_triton_select

    return sageattn_triton_select(q, k, v, plan, selection, sm_scale=q.shape[-1] ** -0.5, is_causal=False,
                                  key_mask=key_mask, per_token=False, smooth_k=True, rotate_qk=True, return_lse=True)


# Both rules take one path through the op (the rule is the selection kernel's, whose per-row lists are
# compared with the reference above): the second runs with the slow tests.
@pytest.mark.parametrize("rule", ["top_p", pytest.param("per-row density", marks=pytest.mark.slow)])
def test_the_op_selects_and_attends_in_one_call(rule):
    """`sageattn_fwd_select`: its lists are those the kernels' entry selects on the same inputs (the same
    pooling, in the same preparation), and its output and LSE are the block-sparse op's with those lists,
    bit for bit."""
    from sagevideo.kernels.op import sageattn_triton

    q, k = _tiled(2, (1.0, 3.0), 256, seed=8, block_m=128, block_n=64)
    v = torch.randn_like(k)
    key_mask = torch.ones(2, 256, dtype=torch.bool, device=DEVICE)
    key_mask[1, 200:] = False
    plan = plain_triton(select_plan(q.device, 64, "fp16").plan)
    selection = DynamicSelection(dense_prefix=16, **({"top_p": 0.5} if rule == "top_p"
                                                     else {"density": 0.4, "probe_columns": 1}))
    out, lse, _, (indices, counts) = _one_go(q, k, v, plan, selection, key_mask)
    lists = dispatch.select_tiles(q, k, selection, pv="fp16", sm_scale=0.125, key_mask=key_mask)
    assert torch.equal(indices, lists.indices) and torch.equal(counts, lists.counts)
    assert 0 < lists.density < 1
    want_out, want_lse, _ = sageattn_triton(q, k, v, plan, sm_scale=0.125, is_causal=False, key_mask=key_mask,
                                            per_token=False, smooth_k=True, rotate_qk=True, return_lse=True,
                                            tile_lists=(indices, counts))
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["top_p", "per-row density"])
def test_the_one_go_op_compiles_into_one_graph(rule):
    """torch.compile(fullgraph=True) traces the selecting op (no host read to break the graph) and
    computes the eager result."""
    from torch._dynamo.utils import counters

    q, k = _tiled(1, (1.0, 2.0), 192, seed=9, block_m=128, block_n=64)
    v = torch.randn_like(k)
    plan = plain_triton(select_plan(q.device, 64, "fp16").plan)
    # the per-row density with the probe's columns, as installed calls select
    selection = DynamicSelection(**({"top_p": 0.6} if rule == "top_p" else {"density": 0.5, "probe_columns": 1}))

    def attend(q, k, v):
        out, _, _, (indices, counts) = _one_go(q, k, v, plan, selection)
        return out * 2, counts

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attend, fullgraph=True, backend="eager" if DEVICE == "cpu" else "inductor")
    got, want = compiled(q, k, v), attend(q, k, v)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert dict(counters["graph_break"]) == {}
    torch._dynamo.reset()


# --- on the GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_the_kernel_lists_equal_the_reference_on_gpu(pv):
    """Planted inputs at 1 x 8 x 8,192 tokens (d128, the plan's own tiles, 8 x 16 x 64 grid in 2 x 8 x 8
    cells, global keys kept by max_spread): the fused path's lists equal the reference's on every query
    tile whose threshold lies MARGIN from its boundaries (with a thousand query tiles, some have a
    boundary near any top_p, or two tiles at its cut whose probabilities lie within MARGIN of each other,
    which rounding can swap at the same count: those are left out, and must be under a tenth)."""
    spec = PlantedSpec(1, 8, 8, 16, 64, 128)
    x = planted_inputs(spec, order=grid_tile_order(8, 16, 64, 2, 8, 8), device=DEVICE)
    q, k = (t.to(torch.float16) for t in (x.q, x.k))
    plan = plain_triton(select_plan(q.device, 128, pv).plan)
    case = _case(q, k, None, plan, DynamicSelection(local_tiles=1), spread_near=1.9)
    for top_p in (0.5, 0.8, 0.95):
        rows = (case.scores.row_margins(top_p) > MARGIN) & (case.scores.cut_gaps(top_p) > MARGIN)
        assert rows.float().mean() > 0.9
        _assert_same_lists(case.kernel(top_p), case.reference(top_p), rows)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_the_pooling_at_the_real_plans_with_the_rotation_is_what_pool_tiles_defines_on_gpu(pv, head_dim):
    """Installed sparse calls pool inside the preparation of the plan they run (its tiles, warps and the
    Hadamard rotation), not the small plans the interpreter tests use: per tile, the same statistics
    as `_pool_tiles` there too; bf16, 8,200 tokens (a partial last tile, and enough tiles that a Q
    program taking the plan's most tiles would loop over four). A Gram-product pooling of Q looping so
    matched on each program's first tile and was wrong on the others with the rotation on: pooling
    programs take one Q tile (`PrepPlan.most_q_tiles`)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 3, 8200, head_dim, generator=gen).to(DEVICE, torch.bfloat16) + 0.5 for _ in range(3))
    plan = select_plan(q.device, head_dim, pv).plan
    pooled = quantize_inputs(q, k, v, None, hadamard_pm1(plan.block_d, q.device, q.dtype), plan,
                             sm_scale=head_dim**-0.5, per_token=False, smooth_k=True, need_shift=False,
                             pool=True).pooled
    _assert_pools_as_defined(pooled, q, k, plan, None)


@pytest.mark.gpu
def test_selecting_and_attending_never_synchronize_on_gpu():
    """torch's sync debug mode raises on any device-to-host synchronization: none while selecting, nor in
    the call that selects and attends."""
    from sagevideo.kernels.op import sageattn_triton_select

    q, k = _tiled(1, (1.0,) * 8, 8192, seed=7, d=128)
    v = torch.randn_like(q)
    plan = plain_triton(select_plan(q.device, 128, "fp8").plan)
    selection = DynamicSelection(top_p=0.8, local_tiles=1)
    # kernels compiled and the rotation cached before the check (a first launch may read the device)
    dispatch.select_tiles(q, k, selection, pv="fp8", sm_scale=128**-0.5)
    _one_go(q, k, v, plan, selection)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        lists = dispatch.select_tiles(q, k, selection, pv="fp8", sm_scale=128**-0.5)
        out, _, _, _ = sageattn_triton_select(q, k, v, plan, selection, sm_scale=128**-0.5, is_causal=False,
                                              key_mask=None, per_token=False, smooth_k=True, rotate_qk=True,
                                              return_lse=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out).all() and 0 < lists.density < 1
