"""The PyTorch reference: its building blocks, and its error against fp64 attention."""

import math

import pytest
import torch

from sagevideo.attention.accuracy import attention_fp64, error_stats
from sagevideo.eval.numerics.presets import make_inputs
from sagevideo.kernels.plans import tiles
from sagevideo.kernels.reference import (
    quantize_symmetric,
    quantize_v_fp8,
    sageattn_reference,
    smoothed_k,
)
from sagevideo.kernels.rotation import hadamard_pm1
from tests.helpers import extreme_v


def test_codes_round_half_to_even_from_the_unrounded_product():
    # max|x| = 127: the factor is 1, so ties land exactly on .5
    x = torch.tensor([-2.5, -1.5, -0.5, -0.4, 0.0, 0.4, 0.5, 1.5, 2.5, 127.0]).reshape(1, 1, 1, 10)
    codes, scale = quantize_symmetric(x, group=1)
    assert codes.flatten().tolist() == [-2, -2, -0, -0, 0, 0, 0, 2, 2, 127] and scale.item() == 1.0
    # scale_factor goes into the scale only
    codes_scaled, scale_scaled = quantize_symmetric(x, group=1, scale_factor=0.25)
    assert torch.equal(codes_scaled, codes) and scale_scaled.item() == 0.25


def test_codes_and_scales_equal_exact_arithmetic_at_near_ties():
    """Per row, the reciprocal 127/max|x| and the scale are fp32 divisions rounded once (Fraction
    here), and a code rounds the exact product x·inv, ties to even (the kernels' FMA). The values
    are built within ~1e-8 of a tie, where rounding twice (a reciprocal of a reciprocal, or the
    product rounded to fp32 first) would flip codes."""
    from fractions import Fraction

    gen = torch.Generator().manual_seed(0)
    rows = 512
    amax = (torch.rand(rows, generator=gen) * 10 + 0.1).float()
    exact_inv = torch.tensor([float(_fp32(127 / Fraction(a))) for a in amax.tolist()], dtype=torch.float64)
    ties = torch.randint(0, 126, (rows, 15), generator=gen) + 0.5
    near = ties + (torch.rand(rows, 15, generator=gen, dtype=torch.float64) - 0.5) * 2e-6
    x = torch.cat([amax[:, None], (near / exact_inv[:, None]).float()], dim=1)  # max|row| = amax
    codes, scale = quantize_symmetric(x[None, None], group=1, scale_factor=0.18033688011112042)
    want = torch.round(x.double() * exact_inv[:, None])  # exact product in fp64, ties to even
    assert torch.equal(codes[0, 0].double(), want)
    factor = _fp32(Fraction(0.18033688011112042))
    want_scale = [float(_fp32(_fp32(Fraction(a) * factor) / 127)) for a in amax.tolist()]
    assert scale[0, 0].tolist() == want_scale


def _fp32(value):
    """Nearest fp32 to a positive normal-range Fraction, ties to even, exactly."""
    from fractions import Fraction

    exponent = math.floor(math.log2(value))
    while Fraction(2) ** exponent > value:  # log2 of a Fraction may be off by one
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= value:
        exponent += 1
    ulp = Fraction(2) ** (exponent - 23)
    return round(value / ulp) * ulp


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_group_gets_a_nan_scale(bad):
    x = torch.randn(1, 1, 8, 4)
    x[0, 0, 1, 2] = bad
    _, scale = quantize_symmetric(x, group=4)
    assert scale[0, 0, :4].isnan().all() and scale[0, 0, 4:].isfinite().all()


def test_quantize_symmetric_groups_and_scales():
    x = torch.randn(1, 2, 10, 8)
    x[0, 0, 3] *= 50  # one big row only inflates its own group's scale
    codes, scale = quantize_symmetric(x, group=4)
    assert codes.abs().max() <= 127 and torch.equal(codes, codes.round())
    assert torch.equal(scale[0, 0, :4], scale[0, 0, 0].expand(4))
    assert scale[0, 0, 0] > 10 * scale[0, 0, 4]
    # dequantization error bounded by half a step per element
    err = (codes * scale[..., None] - x).abs()
    assert torch.all(err <= scale[..., None] / 2 * (1 + 1e-6))


def test_quantize_all_zero_group_is_exact():
    codes, scale = quantize_symmetric(torch.zeros(1, 1, 4, 8), group=4)
    assert torch.all(codes == 0) and torch.all(scale == 1)


def test_smoothed_k_ignores_masked_tokens():
    k = torch.randn(2, 3, 6, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    huge = k.clone()
    huge[0, :, 3:] = 1e6
    ks, mean = smoothed_k(huge, mask)
    torch.testing.assert_close(mean[0], k[0, :, :3].mean(dim=1))
    assert torch.all(ks[0, :, 3:] == 0)


def test_v_fp8_scale_ignores_padding():
    v = torch.randn(1, 1, 8, 4)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    v[..., 4:, :] = 1e5
    codes, scale = quantize_v_fp8(v, mask)
    torch.testing.assert_close(scale[0, 0], v[0, 0, :4].abs().amax(0) / 448)
    assert torch.isfinite(codes.float()).all()


def test_hadamard_is_orthogonal_up_to_dim():
    r = hadamard_pm1(64)
    torch.testing.assert_close(r @ r.T, 64 * torch.eye(64))
    assert set(r.unique().tolist()) == {-1.0, 1.0}


@pytest.mark.parametrize("pv", ["fp16", "fp8", "fp32"])
def test_reference_smoothing_is_exact_in_exact_arithmetic(pv):
    """Adding the same vector to every key changes nothing (softmax shift invariance): with
    smoothing on, the quantized inputs are identical, so outputs agree to rounding."""
    x = make_inputs("random", (1, 2, 96, 64), seed=3)
    shifted = x.k + torch.linspace(-4, 4, 64)
    bm, bn = tiles("fp16", 64)
    a, _ = sageattn_reference(x.q, x.k, x.v, sm_scale=0.125, block_m=bm, block_n=bn, pv=pv)
    b, _ = sageattn_reference(x.q, shifted, x.v, sm_scale=0.125, block_m=bm, block_n=bn, pv=pv)
    assert error_stats(a, b).cos_worst > 0.99999


def test_seed_recipe_smoothing_halves_rel_l1():
    """The seed document: channel 7 of K offset by 8, B=1 H=8 N=1024 D=128, seed 0; smoothing
    roughly halves the INT8 QK path's rel-L1 (about 2.5% -> 1.3%)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8, 1024, 128) for _ in range(3))
    k[..., 7] += 8.0
    ref = attention_fp64(q, k, v)
    errs = {}
    for smooth in (False, True):
        out, _ = sageattn_reference(
            q, k, v, sm_scale=128**-0.5, block_m=64, block_n=64, pv="fp32", smooth_k=smooth, rotate_qk=False
        )
        errs[smooth] = error_stats(ref, out).rel_l1_mean
    assert 0.020 < errs[False] < 0.030
    assert 0.010 < errs[True] < 0.016
    assert errs[True] < 0.6 * errs[False]


def test_reference_lse_matches_fp64_logsumexp():
    x = make_inputs("k-offset", (1, 2, 70, 64), seed=1)
    _, lse = sageattn_reference(
        x.q, x.k, x.v, sm_scale=0.125, block_m=64, block_n=64, return_lse=True, rotate_qk=True
    )
    exact = torch.logsumexp((x.q.double() @ x.k.double().transpose(-1, -2)) * 0.125, dim=-1)
    assert (lse.double() - exact).abs().max() < 0.05


def test_fully_masked_keys_give_zero_output_and_minus_inf_lse():
    x = make_inputs("random", (2, 1, 8, 64), seed=0)
    mask = torch.tensor([[True] * 8, [False] * 8])
    out, lse = sageattn_reference(
        x.q, x.k, x.v, sm_scale=0.125, block_m=64, block_n=64, key_mask=mask, return_lse=True
    )
    assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))
    assert torch.isfinite(out[0]).all() and torch.isfinite(lse[0]).all()


def test_reference_causal_matches_fp64():
    x = make_inputs("random", (1, 2, 100, 64), seed=2)
    out, _ = sageattn_reference(x.q, x.k, x.v, sm_scale=0.125, block_m=64, block_n=64, is_causal=True)
    ref = attention_fp64(x.q, x.k, x.v, sm_scale=0.125, is_causal=True)
    assert error_stats(ref, out).cos_worst > 0.9995
    assert math.isclose(out[0, 0, 0].double().norm().item(), ref[0, 0, 0].norm().item(), rel_tol=0.02)


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_fp32_inputs_beyond_the_fp16_range_stay_finite(pv):
    """fp32 V past 65504 (what the kernels never take, but the reference accepts): the reference
    must not cast V to fp16 and turn it into inf/NaN."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 80, 64, generator=gen) for _ in range(3))
    v = v * 1e6
    bm, bn = tiles(pv, 64)
    out, _ = sageattn_reference(q, k, v, sm_scale=0.125, block_m=bm, block_n=bn, pv=pv)
    stats = error_stats(attention_fp64(q, k, v), out)
    assert stats.nonfinite == 0 and stats.cos_worst > 0.99, stats


def test_masked_keys_take_no_part_whatever_they_hold():
    """Padded keys and values holding NaN are never read by the kernels; the reference, their oracle,
    must ignore them too (a multiply by the mask made 0·NaN = NaN)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 96, 64, generator=gen) for _ in range(3))
    valid = torch.ones(1, 96, dtype=torch.bool)
    valid[:, 80:] = False
    bm, bn = tiles("fp16", 64)
    clean, _ = sageattn_reference(q, k, v, sm_scale=0.125, block_m=bm, block_n=bn, key_mask=valid)
    k[:, :, 85], v[:, :, 90] = float("nan"), float("nan")
    for pv in ("fp16", "fp8"):
        bm, bn = tiles(pv, 64)
        out, _ = sageattn_reference(q, k, v, sm_scale=0.125, block_m=bm, block_n=bn, key_mask=valid, pv=pv,
                                    rotate_qk=True)
        assert torch.isfinite(out).all()
    bm, bn = tiles("fp16", 64)
    out, _ = sageattn_reference(q, k, v, sm_scale=0.125, block_m=bm, block_n=bn, key_mask=valid)
    assert torch.equal(out, clean)


def _fp8_reference(q, k, v, mask=None, **kw):
    bm, bn = tiles("fp8", q.shape[-1])
    return sageattn_reference(q, k, v, sm_scale=q.shape[-1] ** -0.5, block_m=bm, block_n=bn, key_mask=mask, pv="fp8",
                              **kw)[0]


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "key-mask"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_pv_returns_a_constant_v_exactly(dtype, masked):
    """A constant V channel must come back exactly: attention is a convex combination of V's rows and
    the output is clamped to V's range (`kernels.bounds`). Before, 50,000 came back anywhere in
    49,632-50,304 (P rounded to e4m3, l summing the unrounded P), and ±65,504 as inf."""
    shape = (2, 2, 384, 64)
    q, k = extreme_v.qk(shape, dtype, seed=30)
    v = extreme_v.constant_channels(shape, dtype)
    mask = extreme_v.key_mask(shape[2]) if masked else None
    out = _fp8_reference(q, k, v if mask is None else extreme_v.with_masked_keys(v, mask), mask)
    want = v[:, :, :1].expand_as(out)
    worst = (out.float() - want.float()).abs().max().item()
    assert torch.equal(out, want), f"worst |out - V| = {worst}"


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "key-mask"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_pv_keeps_v_near_the_16_bit_maximum_finite_and_within_its_channel_bound(dtype, masked):
    """V = ±max·(1 − j/512) with a random sign per channel: outputs land near the max. Every one must be
    finite and within its channel's [min V, max V] over the valid keys (43% were inf at ±65,504)."""
    shape = (2, 2, 384, 64)
    q, k = extreme_v.qk(shape, dtype, seed=31)
    v = extreme_v.near_max(shape, dtype, seed=32)
    mask = extreme_v.key_mask(shape[2]) if masked else None
    if mask is not None:
        v = extreme_v.with_masked_keys(v, mask)
    out = _fp8_reference(q, k, v, mask)
    nonfinite = int((~torch.isfinite(out)).sum())
    excess = extreme_v.excess_over_bound(out, v, mask)
    assert nonfinite == 0 and excess <= 0.0, f"{nonfinite} non-finite outputs; worst max|out|/max|V| - 1 = {excess}"
    assert extreme_v.outside_hull(out, v, mask) == 0
