"""The block-sparse contract in PyTorch: tile masks and their compact lists, exact masked attention,
and the quantized emulation restricted to a mask (against the dense reference and fp64)."""

import math

import pytest
import torch

from sagevideo.attention.accuracy import attention_fp64, error_stats
from sagevideo.eval.numerics.presets import CONTRACT_PRESETS, make_inputs
from sagevideo.kernels.plans import tiles
from sagevideo.kernels.reference import sageattn_reference
from sagevideo.kernels.sparse_reference import (
    TileLists,
    TileMask,
    in_tiles,
    kernel_lists,
    masked_attention_exact,
    sparse_sageattn_reference,
)

SHAPE = (1, 2, 320, 64)  # 320 tokens: a partial last tile for both plans' tiles
FLOORS = {"fp16": 0.999, "fp8": 0.998}
BENIGN = ("random", "k-offset", "near-uniform", "padded")


def _random_mask(shape, block_m, block_n, density, seed, keep_diagonal=True):
    batch, heads, n, _ = shape
    gen = torch.Generator().manual_seed(seed)
    m_tiles, n_tiles = math.ceil(n / block_m), math.ceil(n / block_n)
    keep = torch.rand(batch, heads, m_tiles, n_tiles, generator=gen) < density
    if keep_diagonal:  # every query tile keeps the key tile holding its first row
        keep[:, :, torch.arange(m_tiles), torch.arange(m_tiles) * block_m // block_n] = True
    return TileMask(keep, block_m, block_n, n, n)


def _inputs(preset, dtype=torch.float16, shape=SHAPE, seed=1):
    x = make_inputs(preset, shape, seed=seed)
    return x.q.to(dtype), x.k.to(dtype), x.v.to(dtype), x.key_mask


# --- the mask and its compact form ---------------------------------------------------------------


def test_lists_round_trip_and_are_ascending_padded_with_minus_one():
    mask = _random_mask((2, 3, 300, 64), 64, 32, 0.3, seed=0, keep_diagonal=False)
    lists = mask.to_lists()
    assert lists.indices.dtype == torch.int32 and lists.counts.dtype == torch.int32
    assert torch.equal(lists.counts, mask.keep.sum(-1).int())
    assert lists.indices.shape[-1] == int(mask.keep.sum(-1).max())
    b, h, m = 1, 2, 3
    row = lists.indices[b, h, m]
    want = torch.nonzero(mask.keep[b, h, m]).flatten().int()
    assert torch.equal(row[: len(want)], want) and (row[len(want):] == -1).all()
    assert torch.equal(lists.to_mask().keep, mask.keep)
    assert lists.density == pytest.approx(mask.density)


def test_an_empty_query_tile_has_count_zero_and_round_trips():
    keep = torch.zeros(1, 1, 2, 3, dtype=torch.bool)
    keep[0, 0, 1, 2] = True
    lists = TileMask(keep, 64, 64, 128, 192).to_lists()
    assert lists.counts.flatten().tolist() == [0, 1] and lists.indices.flatten().tolist() == [-1, 2]
    assert torch.equal(lists.to_mask().keep, keep)


@pytest.mark.parametrize("change, message", [
    (lambda L: {"indices": L.indices.long()}, "indices must be an int32"),
    (lambda L: {"counts": L.counts + 5}, "counts must lie in"),
    (lambda L: {"indices": torch.where(L.indices == -1, 0, L.indices)}, "past a query tile's count must be -1"),
    (lambda L: {"indices": torch.tensor([[0, 2, -1], [2, 1, 0]], dtype=torch.int32)[None, None]},
     "strictly ascending"),
    (lambda L: {"indices": torch.where(L.indices == 2, 7, L.indices)}, "outside"),
    (lambda L: {"n_tiles": 4}, "n_tiles=4"),
    (lambda L: {"counts": L.counts[..., :1]}, "counts has shape"),
])
def test_malformed_lists_are_refused_by_name(change, message):
    keep = torch.tensor([[True, False, True], [True, True, True]])[None, None]
    lists = TileMask(keep, 64, 64, 128, 192).to_lists()
    fields = dict(indices=lists.indices, counts=lists.counts, n_tiles=lists.n_tiles, block_m=64, block_n=64,
                  n_q=128, n_k=192)
    with pytest.raises(ValueError, match=message):
        TileLists(**{**fields, **change(lists)})


@pytest.mark.parametrize("kwargs, message", [
    (dict(keep=torch.ones(1, 1, 2, 3)), "bool tensor"),
    (dict(keep=torch.ones(1, 1, 2, 2, dtype=torch.bool)), r"expected \(B, H, 2, 3\)"),
    (dict(block_m=0), "block_m=0"),
    (dict(n_k=-1), "n_k=-1"),
])
def test_malformed_masks_are_refused_by_name(kwargs, message):
    fields = dict(keep=torch.ones(1, 1, 2, 3, dtype=torch.bool), block_m=64, block_n=64, n_q=128, n_k=192)
    with pytest.raises(ValueError, match=message):
        TileMask(**{**fields, **kwargs})


def test_a_mask_for_other_inputs_is_refused():
    q = torch.randn(2, 4, 128, 16)
    with pytest.raises(ValueError, match="built for 128 query / 192 key tokens"):
        TileMask.full(1, 1, 128, 192, 64, 64).check_inputs(q, q)
    with pytest.raises(ValueError, match="does not broadcast"):
        TileMask.full(1, 3, 128, 128, 64, 64).check_inputs(q, q)
    TileMask.full(1, 4, 128, 128, 64, 64).check_inputs(q, q)  # B of 1 broadcasts


def test_refining_tiles_keeps_the_token_mask():
    mask = _random_mask((1, 2, 300, 64), 128, 128, 0.5, seed=3, keep_diagonal=False)
    fine = mask.at_tiles(64, 32)
    assert fine.keep.shape[2:] == (5, 10)
    assert torch.equal(fine.token_mask(), mask.token_mask())
    assert torch.equal(mask.token_mask(slice(70, 200)), mask.token_mask()[:, :, 70:200])
    with pytest.raises(ValueError, match="do not divide"):
        mask.at_tiles(48, 32)


# --- exact masked attention ----------------------------------------------------------------------


def test_exact_at_density_one_is_dense_attention_and_chunks_change_nothing():
    q, k, v, key_mask = _inputs("padded", torch.float32)
    full = TileMask.full(1, 1, SHAPE[2], SHAPE[2], 64, 64)
    dense = attention_fp64(q, k, v, key_mask=key_mask)
    out = masked_attention_exact(q, k, v, full, key_mask=key_mask)
    assert torch.allclose(out, dense, atol=1e-12)
    assert torch.allclose(masked_attention_exact(q, k, v, full, key_mask=key_mask, chunk_rows=37), out, atol=1e-14)


def test_exact_restricts_to_kept_tiles_and_rows_without_keys_are_zero():
    q, k, v, _ = _inputs("random", torch.float32, shape=(1, 1, 256, 32))
    keep = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    keep[0, 0, 0, 2] = True  # query tile 0 sees only key tile 2
    keep[0, 0, 1, :2] = True
    out, lse = masked_attention_exact(q, k, v, TileMask(keep, 64, 64, 256, 256), return_lse=True)
    only = attention_fp64(q[:, :, :64], k[:, :, 128:192], v[:, :, 128:192])
    assert torch.allclose(out[:, :, :64], only, atol=1e-12)
    assert torch.allclose(out[:, :, 64:128], attention_fp64(q[:, :, 64:128], k[:, :, :128], v[:, :, :128]), atol=1e-12)
    assert (out[:, :, 128:] == 0).all() and torch.isinf(lse[:, :, 128:]).all()


def test_exact_combines_the_key_padding_mask():
    q, k, v, _ = _inputs("random", torch.float32, shape=(1, 1, 128, 32))
    keep = torch.tensor([[True, False], [True, True]])[None, None]
    key_mask = torch.ones(1, 128, dtype=torch.bool)
    key_mask[0, :64] = False  # query tile 0's only key tile is all padding: its rows are 0
    out = masked_attention_exact(q, k, v, TileMask(keep, 64, 64, 128, 128), key_mask=key_mask)
    assert (out[:, :, :64] == 0).all()
    assert torch.allclose(out[:, :, 64:], attention_fp64(q[:, :, 64:], k[:, :, 64:], v[:, :, 64:]), atol=1e-12)


# --- the quantized emulation ---------------------------------------------------------------------


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
@pytest.mark.parametrize("preset, is_causal", [("random", False), ("padded", False), ("random", True)])
def test_density_one_equals_the_dense_reference_bit_for_bit(pv, preset, is_causal):
    q, k, v, key_mask = _inputs(preset)
    block_m, block_n = tiles(pv, SHAPE[3])
    kw = dict(sm_scale=SHAPE[3] ** -0.5, key_mask=key_mask, is_causal=is_causal, pv=pv, rotate_qk=True,
              return_lse=True)
    dense, dense_lse = sageattn_reference(q, k, v, block_m=block_m, block_n=block_n, **kw)
    full = TileMask.full(1, SHAPE[1], SHAPE[2], SHAPE[2], block_m, block_n)
    out, lse = sparse_sageattn_reference(q, k, v, full, **kw)
    assert torch.equal(out, dense) and torch.equal(lse, dense_lse)


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
@pytest.mark.parametrize("preset", CONTRACT_PRESETS)
def test_sparse_reference_meets_the_dense_floors_against_exact_masked_attention(pv, preset):
    q, k, v, key_mask = _inputs(preset)
    block_m, block_n = tiles(pv, SHAPE[3])
    mask = _random_mask(SHAPE, block_m, block_n, 0.4, seed=5)
    exact, exact_lse = masked_attention_exact(q, k, v, mask, key_mask=key_mask, return_lse=True)
    out, lse = sparse_sageattn_reference(q, k, v, mask, key_mask=key_mask, pv=pv, rotate_qk=True, return_lse=True)
    stats = error_stats(exact, out)  # per (batch, head): the worst is the contract
    assert stats.nonfinite == 0
    assert stats.cos_worst >= FLOORS[pv], stats
    has_keys = torch.isfinite(exact_lse)
    if preset in BENIGN:  # elsewhere INT8's score error (~1 % of the score range) reaches the LSE
        assert torch.allclose(lse[has_keys].double(), exact_lse[has_keys], atol=0.02)
    assert torch.isinf(lse[~has_keys]).all() and (out[~has_keys[..., None].expand_as(out)] == 0).all()


def test_rows_visiting_no_key_are_zero_even_outside_v_range():
    q, k, v, _ = _inputs("random", shape=(1, 1, 256, 64))
    v = v.abs() + 1  # V's range excludes 0: a clamp would move the empty rows off 0
    keep = torch.zeros(1, 1, 2, 4, dtype=torch.bool)
    keep[0, 0, 1, 1] = True
    out, _ = sparse_sageattn_reference(q, k, v, TileMask(keep, 128, 64, 256, 256), pv="fp16")
    assert (out[:, :, :128] == 0).all() and (out[:, :, 128:] >= 1).all()


def test_a_skipped_tile_is_never_read_whatever_it_holds():
    q, k, v, _ = _inputs("random", shape=(1, 1, 256, 64))
    block_m, block_n = tiles("fp16", 64)
    keep = torch.ones(1, 1, 2, 4, dtype=torch.bool)
    keep[0, 0, 0, 3] = False  # query tile 0 skips key tile 3, query tile 1 visits it
    mask = TileMask(keep, block_m, block_n, 256, 256)
    poisoned = v.clone()
    poisoned[:, :, 192:] = float("inf")
    out, _ = sparse_sageattn_reference(q, k, poisoned, mask, pv="fp16")
    exact = masked_attention_exact(q, k, v, mask)
    assert torch.isfinite(out[:, :, :block_m]).all()
    assert error_stats(exact[:, :, :block_m], out[:, :, :block_m]).cos_worst > 0.999


def _planted_tile_inputs(n=512, d=64, heads=1, seed=0):
    """Each 128-row query block i attends almost only to its planted 128-key block (i + 1) mod 4
    (scores ~8 above the rest), so which key tiles a mask keeps decides its output. The mask keeps
    the planted block and one other, at 128x128 tiles (refined to either plan's)."""
    gen = torch.Generator().manual_seed(seed)
    block = 128
    q = torch.randn(1, heads, n, d, generator=gen) * 0.3
    k = torch.randn(1, heads, n, d, generator=gen) * 0.3
    v = torch.randn(1, heads, n, d, generator=gen)
    blocks = n // block
    directions = torch.nn.functional.normalize(torch.randn(blocks, d, generator=gen), dim=-1) * 8.0
    keep = torch.zeros(1, heads, blocks, blocks, dtype=torch.bool)
    for i in range(blocks):
        j = (i + 1) % blocks
        q[:, :, i * block:(i + 1) * block] += directions[i]
        k[:, :, j * block:(j + 1) * block] += directions[i]
        keep[:, :, i, [j, (j + 2) % blocks]] = True
    return q.half(), k.half(), v.half(), TileMask(keep, block, block, n, n)


def _shift_one_tile(mask):
    """The mask with query tile 0's first kept key tile moved to a neighbour it does not keep."""
    keep = mask.keep.clone()
    first = int(torch.nonzero(keep[0, 0, 0]).flatten()[0])
    step = -1 if first > 0 and not keep[0, 0, 0, first - 1] else 1
    assert not keep[0, 0, 0, first + step]
    keep[:, :, 0, first] = False
    keep[:, :, 0, first + step] = True
    return TileMask(keep, mask.block_m, mask.block_n, mask.n_q, mask.n_k)


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_an_off_by_one_tile_mask_breaks_the_contract(pv):
    q, k, v, coarse = _planted_tile_inputs()
    mask = coarse.at_tiles(*tiles(pv, 64))
    exact = masked_attention_exact(q, k, v, mask)
    good = sparse_sageattn_reference(q, k, v, mask, pv=pv, rotate_qk=True)[0]
    assert error_stats(exact, good).cos_worst >= FLOORS[pv]
    bad = sparse_sageattn_reference(q, k, v, _shift_one_tile(mask), pv=pv, rotate_qk=True)[0]
    assert error_stats(exact, bad).cos_worst < FLOORS[pv] - 0.01


# --- the forms the kernels take ------------------------------------------------------------------


def test_padded_lists_are_the_lists_padded_to_every_key_tile():
    mask = _random_mask((2, 3, 300, 64), 64, 32, 0.3, seed=9, keep_diagonal=False)
    lists = mask.to_lists()
    indices, counts = mask.padded_lists()
    assert indices.shape == (2, 3, mask.m_tiles, mask.n_tiles) and indices.dtype == torch.int32
    assert torch.equal(counts, lists.counts)
    assert torch.equal(indices[..., : lists.indices.shape[-1]], lists.indices)
    assert (indices[..., lists.indices.shape[-1]:] == -1).all()
    assert kernel_lists(lists) == (lists.indices, lists.counts)
    assert all(torch.equal(a, b) for a, b in zip(kernel_lists(mask), (indices, counts), strict=True))


def test_in_tiles_keeps_matching_tiles_refines_dividing_ones_and_names_both_otherwise():
    mask = _random_mask((1, 2, 300, 64), 128, 128, 0.5, seed=10, keep_diagonal=False)
    lists = mask.to_lists()
    assert in_tiles(lists, 128, 128) is lists
    fine = in_tiles(lists, 64, 128)
    assert isinstance(fine, TileMask) and torch.equal(fine.token_mask(), mask.token_mask())
    with pytest.raises(ValueError, match=r"built in 128x128 tiles, but this call's kernel plan computes in 96x128"):
        in_tiles(mask, 96, 128)


def test_lists_for_other_inputs_are_refused():
    q = torch.randn(2, 4, 128, 16)
    lists = TileMask.full(1, 4, 128, 192, 64, 64).to_lists()
    with pytest.raises(ValueError, match="built for 128 query / 192 key tokens, the inputs have 128 / 128"):
        lists.check_inputs(q, q)
    with pytest.raises(ValueError, match=r"\(B, H\) = \(1, 3\) does not broadcast to \(2, 4\)"):
        TileMask.full(1, 3, 128, 128, 64, 64).to_lists().check_inputs(q, q)
    TileMask.full(1, 4, 128, 128, 64, 64).to_lists().check_inputs(q, q)
