"""Choosing tiles: forced tiles, dynamic (pooled top-p) and static (3-D windows on the latent grid)
selection, and the token order that makes 3-D neighbourhoods contiguous tiles."""

import math

import pytest
import torch

from sagevideo.kernels import tile_select
from sagevideo.kernels.tile_select import (
    DynamicSelection,
    TileScores,
    forced_tiles,
    grid_coordinates,
    grid_tile_order,
    inverse_order,
    probe_mass,
    probe_rows,
    select_dynamic,
    select_dynamic_at_density,
    select_dynamic_per_row,
    select_static,
    select_static_at_density,
    tiles_at_density,
)


def _block_constant(mask, block_m, block_n):
    """Whether every block_m x block_n block of a token mask (N, N) is all True or all False."""
    n = mask.shape[0]
    blocks = mask.reshape(n // block_m, block_m, n // block_n, block_n)
    return bool((blocks.all(dim=(1, 3)) | ~blocks.any(dim=(1, 3))).all())


def _cell_neighbours(coords, cell):
    """Token mask (N, N): tokens whose (tile_t, tile_h, tile_w) cells touch (|Δcell| <= 1 per axis)."""
    cells = coords // torch.tensor(cell)
    return ((cells[:, None] - cells[None, :]).abs() <= 1).all(dim=-1)


# --- the token order -----------------------------------------------------------------------------


@pytest.mark.parametrize("grid, cell", [((4, 8, 8), (2, 4, 8)), ((3, 5, 7), (2, 2, 4))])
def test_permute_then_unpermute_is_the_identity(grid, cell):
    order = grid_tile_order(*grid, *cell)
    n = math.prod(grid)
    assert torch.equal(order.sort().values, torch.arange(n))  # a permutation
    x = torch.randn(1, 2, n, 4)
    assert torch.equal(x[:, :, order][:, :, inverse_order(order)], x)
    assert torch.equal(inverse_order(order)[order], torch.arange(n))


def test_cells_are_contiguous_in_the_order():
    order = grid_tile_order(4, 8, 8, 2, 4, 8)
    coords = grid_coordinates(4, 8, 8, order)
    cells = coords // torch.tensor([2, 4, 8])
    first = cells.reshape(-1, 64, 3)  # each run of 64 positions is one cell
    assert (first == first[:, :1]).all()
    assert torch.equal(grid_coordinates(4, 8, 8)[order], coords)


def test_with_the_order_a_3d_window_mask_is_block_structured():
    grid, cell = (4, 8, 32), (2, 4, 8)  # 64-token cells tile the grid
    order = grid_tile_order(*grid, *cell)
    ordered = _cell_neighbours(grid_coordinates(*grid, order), cell)
    raster = _cell_neighbours(grid_coordinates(*grid), cell)
    assert _block_constant(ordered, 64, 64) and _block_constant(ordered, 64, 32)
    assert not _block_constant(raster, 64, 64)


def test_grid_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="tile_h=0"):
        grid_tile_order(2, 4, 4, 1, 0, 4)
    with pytest.raises(ValueError, match="height=-1"):
        grid_coordinates(2, -1, 4)


# --- static selection ----------------------------------------------------------------------------


def _window_token_mask(coords, window):
    return ((coords[:, None] - coords[None, :]).abs() <= torch.tensor(window)).all(dim=-1)


def _tiles_of(token_mask, block_m, block_n):
    n_q, n_k = token_mask.shape
    padded = torch.nn.functional.pad(token_mask, (0, -n_k % block_n, 0, -n_q % block_m))
    return padded.reshape(padded.shape[0] // block_m, block_m, padded.shape[1] // block_n, block_n).any(dim=(1, 3))


def test_static_is_exact_on_whole_cells_and_a_superset_otherwise():
    grid, cell, window = (4, 8, 32), (2, 4, 8), (0, 1, 3)
    order = grid_tile_order(*grid, *cell)
    mask = select_static(grid, window, block_m=64, block_n=64, order=order)
    want = _tiles_of(_window_token_mask(grid_coordinates(*grid, order), window), 64, 64)
    assert torch.equal(mask.keep[0, 0], want)
    assert mask.density == pytest.approx(want.float().mean().item()) and mask.density < 1
    raster = select_static((3, 5, 12), window, block_m=64, block_n=32)  # tiles cross rows and frames
    exact = _tiles_of(_window_token_mask(grid_coordinates(3, 5, 12), window), 64, 32)
    assert (raster.keep[0, 0] | ~exact).all()  # never drops a tile holding a pair in the window


def test_static_keeps_text_dense():
    grid, window = (4, 8, 16), (1, 2, 2)
    mask = select_static(grid, window, block_m=64, block_n=64, dense_prefix=70, dense_suffix=10)
    n = 70 + 512 + 10
    assert (mask.n_q, mask.keep.shape[-1]) == (n, math.ceil(n / 64))
    assert mask.keep[0, 0, :2].all() and mask.keep[0, 0, :, :2].all()  # tokens 0..69: tiles 0 and 1
    assert mask.keep[0, 0, -1].all() and mask.keep[0, 0, :, -1].all()
    assert not mask.keep[0, 0, 2, 8]  # frame 0 against frame 3: beyond the window


def test_the_order_lowers_density_once_windows_are_about_a_cell_wide():
    """Raster tiles are rows (here one row of 64 columns): a window reaches every column; 8x8 cells
    cover the window's box with less waste. Windows smaller than a cell favour rows (docs/sparse.md)."""
    grid, window = (4, 16, 64), (1, 4, 8)
    raster = select_static(grid, window, block_m=64, block_n=64)
    cells = select_static(grid, window, block_m=64, block_n=64, order=grid_tile_order(*grid, 1, 8, 8))
    assert cells.density < 0.8 * raster.density
    small = (1, 1, 1)
    assert (select_static(grid, small, block_m=64, block_n=64).density
            < select_static(grid, small, block_m=64, block_n=64, order=grid_tile_order(*grid, 1, 8, 8)).density)


def test_static_at_density_picks_the_closest_window():
    grid = (8, 16, 32)
    mask, window = select_static_at_density(grid, 0.3, block_m=64, block_n=64,
                                            order=grid_tile_order(*grid, 2, 4, 8))
    assert abs(mask.density - 0.3) < 0.1
    assert mask.density == select_static(grid, window, block_m=64, block_n=64,
                                         order=grid_tile_order(*grid, 2, 4, 8)).density
    with pytest.raises(ValueError, match="window="):
        select_static(grid, (1, 2), block_m=64, block_n=64)


# --- forced tiles --------------------------------------------------------------------------------


def test_forced_tiles_diagonal_local_sinks_and_text():
    forced = forced_tiles(256, 256, 64, 32, local_tiles=1, sink_tiles=1)
    # query tile 1 holds tokens 64..127 = key tiles 2, 3; widened by one each side: 1..4; plus sink 0
    assert torch.nonzero(forced[1]).flatten().tolist() == [0, 1, 2, 3, 4]
    text = forced_tiles(256, 256, 64, 64, dense_prefix=65, dense_suffix=1)
    assert text[:2].all() and text[:, :2].all() and text[3].all() and text[:, 3].all()
    assert not forced_tiles(128, 256, 64, 64).any()  # cross-attention: no diagonal
    with pytest.raises(ValueError, match="exceed the sequence"):
        forced_tiles(128, 128, 64, 64, dense_prefix=100, dense_suffix=100)
    with pytest.raises(ValueError, match="sink_tiles=-1"):
        forced_tiles(128, 128, 64, 64, sink_tiles=-1)


# --- dynamic selection ---------------------------------------------------------------------------


def _clustered(n=512, d=32, heads=2, block=64, noise=0.3, seed=0):
    """Each 64-token tile is one cluster (self-similar tokens); query tile i's cluster matches key
    tile (i + 2) mod T strongly and the others weakly."""
    gen = torch.Generator().manual_seed(seed)
    tiles = n // block
    centres = torch.nn.functional.normalize(torch.randn(heads, tiles, d, generator=gen), dim=-1) * 4
    q = centres.repeat_interleave(block, dim=1)[None] + noise * torch.randn(1, heads, n, d, generator=gen)
    partner = centres.roll(2, dims=1)  # key tile j carries query tile (j - 2)'s centre
    k = partner.repeat_interleave(block, dim=1)[None] + noise * torch.randn(1, heads, n, d, generator=gen)
    return q, k


def test_dynamic_keeps_the_planted_partner_and_the_forced_tiles():
    q, k = _clustered()
    mask = select_dynamic(q, k, block_m=64, block_n=64, top_p=0.5, sink_tiles=1)
    tiles = mask.keep.shape[-1]
    for i in range(tiles):
        kept = set(torch.nonzero(mask.keep[0, 0, i]).flatten().tolist())
        assert {(i + 2) % tiles, i, 0} <= kept
    assert mask.density < 0.5


def test_top_p_one_keeps_every_tile_and_density_grows_with_top_p():
    q, k = _clustered()
    scores = TileScores(q, k, block_m=64, block_n=32)
    densities = [scores.keep(p).density for p in (0.0, 0.5, 0.9, 0.999)]
    assert densities == sorted(densities)
    assert scores.keep(1.0).density == 1.0
    assert (scores.keep(0.0).keep.sum(-1) >= 1).all()  # never an empty query tile


def test_the_density_curve_is_keep_at_every_top_p_of_its_grid():
    """density_curve(steps)[j] == keep(j / steps).density exactly, also at a mass that lies on the grid
    (kept only from the next step: keep compares mass before < top_p), with padding, text and sinks."""
    q, k = _clustered()
    key_mask = torch.ones(1, 512, dtype=torch.bool)
    key_mask[0, 448:] = False
    scores = TileScores(q, k, block_m=64, block_n=32, key_mask=key_mask, dense_prefix=40, min_similarity=0.0)
    steps = 256
    curve = scores.density_curve(steps)
    assert curve.shape == (steps + 1,) and curve.dtype == torch.float64
    for j in range(steps + 1):
        assert curve[j].item() == pytest.approx(scores.keep(j / steps).density, abs=1e-6), j
    assert curve[0] < curve[steps // 2] < curve[-1] and torch.all(curve.diff() >= 0)
    on_grid = scores._mass_before[..., 3].flatten()[0].item()  # a mass that is exactly a grid point
    scores._mass_before[..., 3] = math.floor(on_grid * steps) / steps
    assert scores.density_curve(steps)[math.floor(on_grid * steps)].item() == pytest.approx(
        scores.keep(math.floor(on_grid * steps) / steps).density, abs=1e-6)
    for bad in (0, 3, 2**25, True):
        with pytest.raises(ValueError, match="power of two"):
            scores.density_curve(bad)


def test_tiles_that_are_not_self_similar_are_kept_whole():
    gen = torch.Generator().manual_seed(1)
    q, k = _clustered()
    q[:, :, 64:128] = torch.randn(1, 2, 64, 32, generator=gen) * 4  # query tile 1: unrelated tokens
    k[:, :, 256:320] = torch.randn(1, 2, 64, 32, generator=gen) * 4  # key tile 4 likewise
    mask = select_dynamic(q, k, block_m=64, block_n=64, top_p=0.5)
    assert mask.keep[:, :, 1].all() and mask.keep[:, :, :, 4].all()
    assert not mask.keep[:, :, 2].all()
    assert select_dynamic(q, k, block_m=64, block_n=64, top_p=0.5, min_similarity=0.0).density < mask.density


def test_dynamic_never_keeps_a_tile_of_padding_and_keeps_text_dense():
    q, k = _clustered()
    key_mask = torch.ones(1, 512, dtype=torch.bool)
    key_mask[0, 448:] = False  # key tile 7 is padding only
    mask = select_dynamic(q, k, block_m=64, block_n=64, top_p=1.0, key_mask=key_mask, dense_suffix=64)
    assert not mask.keep[..., 7].any()  # even in the dense text rows
    assert mask.keep[..., 7, :7].all()
    text = select_dynamic(q, k, block_m=64, block_n=64, top_p=0.3, dense_prefix=100)
    assert text.keep[..., :2, :].all() and text.keep[..., :, :2].all()


def test_dynamic_at_density_stays_at_or_below_the_target():
    q, k = _clustered(n=1024)
    for density in (0.15, 0.3, 0.6):
        mask = select_dynamic_at_density(q, k, density, block_m=64, block_n=64, sink_tiles=0)
        assert mask.density <= density and mask.density > density - 0.1
    with pytest.raises(ValueError, match="density=0"):
        select_dynamic_at_density(q, k, 0, block_m=64, block_n=64)
    with pytest.raises(ValueError, match="top_p=1.5"):
        select_dynamic(q, k, block_m=64, block_n=64, top_p=1.5)


def test_top_p_one_keeps_every_tile_even_where_the_mass_sums_to_one_early():
    """With one key tile holding nearly all of a query tile's mass, the fp32 running sum reaches 1 before
    the last tiles; top_p = 1 still keeps every tile with a valid key (as documented, and as the device
    kernel does)."""
    q, k = _clustered()
    scores = TileScores(q * 20, k, block_m=64, block_n=64, sink_tiles=0)
    assert (scores.nearest_boundary(1.0) == 0.0) and scores.keep(0.999999).density < 1  # a mass of exactly 1
    assert scores.keep(1.0).density == 1.0


# --- a per-row density --------------------------------------------------------------------------


def _per_row_scores():
    """Scores of clustered q/k (2 heads, 8 x 16 tiles of 64 x 32), key tiles 14-15 padding only and tile 13
    partly, a text prefix of 40 tokens: forced and free tiles in every query tile."""
    q, k = _clustered(n=512)
    key_mask = torch.ones(1, 512, dtype=torch.bool)
    key_mask[0, 430:] = False
    return TileScores(q, k, block_m=64, block_n=32, key_mask=key_mask, sink_tiles=1, dense_prefix=40,
                      min_similarity=0.0)


def _assert_per_row_rule(scores, mask, density):
    """Each query tile keeps its forced tiles and max(forced, min(k, valid)) tiles in all, the kept free
    tiles of at least the mass of the dropped ones, never a tile of padding only."""
    keep, forced, valid = mask.keep, scores.forced, scores.has_keys
    k = tiles_at_density(density, valid.sum(dim=-1))
    want = torch.maximum(forced.sum(dim=-1), torch.minimum(k, valid.sum(dim=-1)))
    assert torch.equal(keep.sum(dim=-1), want), "a query tile keeps another count than the rule's"
    assert not (keep & ~valid).any() and (keep | ~forced).all()
    free = valid & ~forced
    least_kept = torch.where(keep & free, scores.probs, math.inf).amin(dim=-1)
    most_dropped = torch.where(~keep & free, scores.probs, -math.inf).amax(dim=-1)
    assert (least_kept >= most_dropped).all()


@pytest.mark.parametrize("density", [1e-3, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_a_per_row_density_keeps_forced_tiles_then_the_most_probable_up_to_its_count(density):
    scores = _per_row_scores()
    mask = scores.keep_per_row(density)
    _assert_per_row_rule(scores, mask, density)
    assert not mask.keep[..., 14:].any()  # padding only, even in the text rows
    if density == 1.0:
        assert torch.equal(mask.keep, scores.has_keys)
    if density == 1e-3:
        assert torch.equal(mask.keep, scores.forced)  # k = 1: the diagonal alone covers it


@pytest.mark.parametrize("off_by", [-1, 1])
def test_a_count_one_off_fails_the_rule(monkeypatch, off_by):
    """The rule's check is sharp: a selection with k - 1 or k + 1 tiles fails it."""
    scores = _per_row_scores()
    right = tiles_at_density
    monkeypatch.setattr(tile_select, "tiles_at_density", lambda d, valid: (right(d, valid) + off_by).clamp(min=0))
    with pytest.raises(AssertionError, match="another count"):
        _assert_per_row_rule(scores, scores.keep_per_row(0.5), 0.5)


def test_the_count_is_a_ceiling_with_at_least_one_tile():
    valid = torch.tensor([0, 1, 7, 20, 591, 4096])
    assert tiles_at_density(0.15, valid).tolist() == [1, 1, 2, 3, 89, 615]  # fp32(0.15) x 20 is 3.0000001
    assert tiles_at_density(1.0, valid).tolist() == [1, 1, 7, 20, 591, 4096]
    assert tiles_at_density(1e-6, valid).tolist() == [1] * 6
    assert tiles_at_density(0.5, torch.tensor([3, 4])).tolist() == [2, 2]


def test_a_per_row_density_breaks_ties_toward_the_lower_key_tile():
    """Key tile 9 a copy of key tile 3 (equal probabilities): where the count takes one of the two, it
    takes tile 3 (as the top-p path's stable sort)."""
    q, k = _clustered(n=512)
    k[:, :, 9 * 32:10 * 32] = k[:, :, 3 * 32:4 * 32]
    scores = TileScores(q, k, block_m=64, block_n=32, sink_tiles=0, min_similarity=0.0)
    assert torch.equal(scores.probs[..., 3], scores.probs[..., 9])
    free = ~scores.forced[..., 3] & ~scores.forced[..., 9]
    split = [d for d in (i / 16 for i in range(1, 16))
             if (scores.keep_per_row(d).keep[..., 3] ^ scores.keep_per_row(d).keep[..., 9])[free].any()]
    assert split, "no density keeps one of the tied tiles without the other"
    for density in split:
        keep = scores.keep_per_row(density).keep
        assert not (keep[..., 9] & ~keep[..., 3] & free).any()
    assert (scores.per_row_margins(split[0])[free & (scores.keep_per_row(split[0]).keep[..., 3]
                                                     ^ scores.keep_per_row(split[0]).keep[..., 9])] == 0).all()


def test_the_cut_gap_is_zero_where_top_p_keeps_one_of_two_tied_tiles():
    """Key tile 9 a copy of key tile 3: where a top_p keeps one of the two (tile 3: the stable sort), the
    query tile's cut gap is 0 (rounding could swap them); elsewhere it is the relative gap between the
    least probable kept and the most probable dropped tile it decides."""
    q, k = _clustered(n=512)
    k[:, :, 9 * 32:10 * 32] = k[:, :, 3 * 32:4 * 32]
    scores = TileScores(q, k, block_m=64, block_n=32, sink_tiles=0, min_similarity=0.0)
    free = ~scores.forced[..., 3] & ~scores.forced[..., 9]
    split = [p for p in (i / 32 for i in range(1, 32))
             if (scores.keep(p).keep[..., 3] ^ scores.keep(p).keep[..., 9])[free].any()]
    assert split, "no top_p keeps one of the tied tiles without the other"
    keep = scores.keep(split[0]).keep
    one_of_two = free & (keep[..., 3] ^ keep[..., 9])
    gaps = scores.cut_gaps(split[0])
    assert (gaps[one_of_two] == 0).all()
    # top_p keeps a query tile's decided tiles as a prefix of them in descending probability: the gap is
    # between the c-th and the (c+1)-th, c the count it keeps
    decided = scores.has_keys & ~scores.forced
    ranked = torch.where(decided, scores.probs, -1.0).sort(dim=-1, descending=True).values
    count = (decided & keep).sum(dim=-1, keepdim=True)
    cut = ((count > 0) & (count < decided.sum(dim=-1, keepdim=True))).squeeze(-1)  # kept some, dropped some
    kept = ranked.gather(-1, (count - 1).clamp(min=0))
    dropped = ranked.gather(-1, count.clamp(max=ranked.shape[-1] - 1))
    want = ((kept - dropped) / kept).squeeze(-1)
    both = cut & (kept > 0).squeeze(-1)
    assert both.any() and torch.allclose(gaps[both], want[both])
    assert (gaps[~cut] == math.inf).all()


def test_per_row_selection_settings():
    q, k = _clustered()
    selection = DynamicSelection(density=0.25, sink_tiles=0)
    assert selection.per_row and not DynamicSelection().per_row
    scores = TileScores(q, k, block_m=64, block_n=64, **selection.scores_options())
    assert torch.equal(selection.keep(scores).keep, select_dynamic_per_row(q, k, 0.25, block_m=64, block_n=64,
                                                                          sink_tiles=0).keep)
    assert torch.equal(DynamicSelection(top_p=0.5).keep(scores).keep, scores.keep(0.5).keep)
    for bad in (0, 1.5, True, "0.2"):
        with pytest.raises(ValueError, match="density="):
            DynamicSelection(density=bad)
    with pytest.raises(ValueError, match="top_p .* or density .* not both"):
        DynamicSelection(top_p=0.5, density=0.2)
    with pytest.raises(ValueError, match="density=0"):
        scores.keep_per_row(0)


# --- the exact probe -----------------------------------------------------------------------------


def test_probe_rows_spread_over_the_sequence_and_over_positions_within_a_cell():
    """64 distinct rows, in range, which fall on many positions within 128-token cells (rows at even
    strides would share one: they missed the planted global keys at Wan's shape)."""
    for n in (4096, 75600, 75856):
        rows = probe_rows(n)
        assert rows.shape == (tile_select.PROBE_ROWS,) and len(set(rows.tolist())) == tile_select.PROBE_ROWS
        assert 0 <= int(rows.min()) and int(rows.max()) < n
        assert len(set((rows % 128).tolist())) >= 48
    assert (probe_rows(3) < 3).all()


def test_the_probe_column_mass_shows_global_keys_beyond_the_columns_kept_anyway():
    """Planted inputs (small shape, 4 heads): with 4 global keys the probe's 2 columns carry about ten
    times the mass they carry without them; the sink tile, which every query tile keeps, is left out
    (counted when no sink tile is forced); None without a probe."""
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs

    def column_mass(global_tokens: int, sink_tiles: int = 1, probe_columns: int = 2):
        spec = PlantedSpec(1, 4, 8, 16, 32, 64, global_tokens=global_tokens)
        x = planted_inputs(spec, order=grid_tile_order(8, 16, 32, 1, 8, 8))
        return TileScores(x.q, x.k, block_m=64, block_n=64, sm_scale=x.sm_scale, sink_tiles=sink_tiles,
                          probe_columns=probe_columns).probe_column_mass

    local, global_ = column_mass(0), column_mass(4)
    assert local.shape == global_.shape == (1, 4)
    assert global_.min() > 5 * local.max() and local.max() < 0.005
    assert column_mass(0, sink_tiles=0).max() > 5 * local.max()  # the sinks' column, not kept anyway
    assert column_mass(4, probe_columns=0) is None


def test_probe_mass_is_the_median_exact_attention_mass_per_key_tile():
    """Against softmax attention of the probe rows in fp64 summed per key tile, the lower median over
    rows: padded keys get none, a tile of padding only 0."""
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 3, 300, 16, generator=gen), torch.randn(2, 3, 300, 16, generator=gen)
    key_mask = torch.ones(2, 300, dtype=torch.bool)
    key_mask[1, 250:] = False  # key tile 4 (256..299) of batch row 1: padding only
    mass = probe_mass(q, k, block_n=64, sm_scale=0.3, key_mask=key_mask)
    rows = q[:, :, probe_rows(300)].double()
    scores = (rows @ k.double().transpose(-1, -2) * 0.3).masked_fill(~key_mask[:, None, None, :], -math.inf)
    probs = torch.nn.functional.pad(torch.softmax(scores, dim=-1), (0, 20)).unflatten(-1, (5, 64)).sum(-1)
    torch.testing.assert_close(mass.double(), probs.sort(dim=2).values[:, :, 31], rtol=1e-5, atol=1e-6)
    assert mass[1, :, 4].eq(0).all() and mass[0, :, 4].gt(0).all()


def _with_a_global_key(n=1024, position=5 * 64 + 17):
    """`_clustered` in 31 channels plus one key every query attends strongly (the 32nd channel, which
    every query holds at 2 and only that key at 22): the key tile holding it carries much of each
    row's mass, but its pooled mean (1/64 of the key) looks like any other tile."""
    q, k = _clustered(n=n)
    q[..., -1], k[..., -1] = 2.0, 0.0
    k[:, :, position] = 0.0
    k[:, :, position, -1] = 22.0
    return q, k


def test_the_probe_keeps_a_global_key_that_pooling_averages_away():
    q, k = _with_a_global_key()
    options = dict(block_m=64, block_n=64, sink_tiles=0)
    exact = torch.softmax(q @ k.transpose(-1, -2) * 32**-0.5, dim=-1).unflatten(-1, (16, 64)).sum(-1)
    assert (exact[..., 5] > 0.3).all()  # the global key's tile: over 30 % of every row's mass
    plain = TileScores(q, k, **options).keep_per_row(0.2)
    probed = TileScores(q, k, probe_columns=1, **options)
    kept = probed.keep_per_row(0.2)
    assert plain.keep[..., 5].float().mean() < 0.5  # pooling keeps it where it is the diagonal or partner
    assert kept.keep[..., 5].all() and probed.forced[..., 5].all()
    assert torch.equal(kept.keep.sum(-1), plain.keep.sum(-1))  # forced columns count in the per-row budget
    token_mass = exact.unflatten(2, (16, 64))
    mass_kept = [(token_mass * m.keep[..., None, :]).sum(-1).mean() for m in (plain, kept)]
    assert mass_kept[1] > mass_kept[0] + 0.1


def test_probe_columns_setting_is_checked():
    assert DynamicSelection(probe_columns=8).scores_options()["probe_columns"] == 8
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match="probe_columns="):
            DynamicSelection(probe_columns=bad)


def test_the_probe_ranks_a_tile_every_row_attends_above_one_a_single_row_attends_much():
    """Key tile 3 holds a key every query gives about 1 % more than a uniform share; key tile 9 one that
    the first probe row alone attends (almost all its mass). The mean over probe rows would rank
    tile 9 first (that row's neighbourhood, not a global key); the median ranks tile 3 first."""
    gen = torch.Generator().manual_seed(0)
    n, d = 1024, 32
    q, k = torch.randn(1, 1, n, d, generator=gen) * 0.1, torch.randn(1, 1, n, d, generator=gen) * 0.1
    q[..., -1], k[..., -1] = 1.0, 0.0
    k[0, 0, 3 * 64 + 5, -1] = 14.0
    first = int(probe_rows(n)[0])
    k[0, 0, 9 * 64 + 7, :-1] = 150.0 * torch.nn.functional.normalize(q[0, 0, first, :-1], dim=0)
    per_row = torch.softmax(q[:, :, probe_rows(n)] @ k.transpose(-1, -2) * d**-0.5, -1).unflatten(-1, (16, 64)).sum(-1)
    assert int(per_row.mean(dim=2).argmax()) == 9
    mass = probe_mass(q, k, block_n=64, sm_scale=d**-0.5)
    assert int(mass.argmax()) == 3 and torch.equal(tile_select.top_columns(mass, 1)[0, 0].nonzero().flatten(),
                                                   torch.tensor([3]))
