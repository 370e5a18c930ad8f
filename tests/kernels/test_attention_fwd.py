"""The attention kernel (`kernels/attention_fwd.py`, through the Triton op) against the PyTorch
reference (same numerics), under the CPU interpreter or on GPU.

16-bit PV is compared tightly. FP8 PV under the interpreter is compared loosely: the
interpreter's in-kernel float8 cast does not round to nearest even (see ENVIRONMENT.md), so FP8
is checked tightly only on the GPU (test_gpu.py).
"""

import pytest
import torch
import torch.nn.functional as F

from sagevideo import last_backend, sageattn
from sagevideo.attention.accuracy import error_stats
from sagevideo.eval.numerics.presets import make_inputs
from sagevideo.kernels.plans import select_plan
from tests.helpers import extreme_v

pytestmark = pytest.mark.kernels  # Triton kernels, interpreted on a CPU: make test-fast leaves them out

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu"


def _inputs(preset, shape, seed=0, dtype=torch.float16):
    x = make_inputs(preset, shape, seed)
    q, k, v = (t.to(DEVICE, dtype) for t in (x.q, x.k, x.v))
    mask = None if x.key_mask is None else x.key_mask.to(DEVICE)
    return q, k, v, mask


def _both(q, k, v, **kw):
    out_t = sageattn(q, k, v, backend="triton", **kw)
    # A kernel ran, not a fallback: the plain one, or on sm90 the Gluon one where the plan names it
    # (same numerics; its own tests compare the two).
    assert last_backend().ran in ("triton", "gluon")
    out_r = sageattn(q, k, v, backend="reference", **kw)
    return out_t, out_r


def _assert_close_16bit(out_t, out_r):
    assert torch.isfinite(out_t).all()
    diff = (out_t.float() - out_r.float()).abs().max().item()
    assert diff < 2e-3, f"max |triton - reference| = {diff}"
    assert error_stats(out_r, out_t).cos_worst > 0.99999


@pytest.mark.parametrize("n", [17, 100, 257])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp16_pv_matches_reference_odd_lengths(n, head_dim):
    q, k, v, _ = _inputs("k-offset", (1, 2, n, head_dim), seed=n)
    _assert_close_16bit(*_both(q, k, v))


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_layouts_match_reference(layout):
    q, k, v, _ = _inputs("random", (2, 2, 100, 64), seed=5)
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    out_t, out_r = _both(q, k, v, tensor_layout=layout)
    assert out_t.shape == q.shape
    _assert_close_16bit(out_t, out_r)


def test_cross_attention_lengths_and_padded_head_dim():
    q = torch.randn(1, 2, 40, 80, device=DEVICE, dtype=torch.float16)
    k = torch.randn(1, 2, 130, 80, device=DEVICE, dtype=torch.float16)
    v = torch.randn(1, 2, 130, 80, device=DEVICE, dtype=torch.float16)
    out_t, out_r = _both(q, k, v)
    assert out_t.shape == (1, 2, 40, 80)
    _assert_close_16bit(out_t, out_r)


@pytest.mark.parametrize(
    "options",
    [
        {"is_causal": True},
        {"qk_granularity": "token"},
        {"rotate_qk": False},
        {"smooth_k": False},
        {"sm_scale": 0.3},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_switches_match_reference(options):
    q, k, v, _ = _inputs("q-outlier", (1, 2, 150, 64), seed=7)
    _assert_close_16bit(*_both(q, k, v, **options))


@pytest.mark.skipif(INTERPRETED, reason="Triton 3.8's interpreter computes bf16 tl.dot wrongly (1e10 errors on a "
                    "plain 16x16 product); bf16 is checked on the GPU")
def test_bfloat16_inputs():
    q, k, v, _ = _inputs("k-offset", (1, 2, 100, 64), seed=8, dtype=torch.bfloat16)
    out_t, out_r = _both(q, k, v)
    assert out_t.dtype == torch.bfloat16
    assert error_stats(out_r, out_t).cos_worst > 0.9999


@pytest.mark.parametrize("n", [100, 130])  # a partial last key tile, and one with a key mask
def test_tiny_scores_give_no_nan(n):
    """q and k so small (bf16, ~1e-25) that q_scale·k_scale underflows fp32: the kernels scale
    scores after the row max, so the row scale is floored, or a masked −inf would meet 0 (NaN)."""
    q, k, v, mask = _inputs("padded", (1, 2, n, 64), seed=14, dtype=torch.bfloat16)
    q, k = q * 1e-25, k * 1e-25
    m = mask[:, None, None, :] if n == 130 else None
    kw = dict(pv="fp8", rotate_qk=False, attn_mask=m)  # no rotation: the interpreter's bf16 tl.dot is wrong
    out_t, out_r = _both(q, k, v, **kw)
    # (A NaN row sum reads as "no valid key" and leaves the output unnormalized, not NaN: compare values.)
    assert torch.isfinite(out_t).all() and torch.isfinite(out_r).all()
    assert (out_t.float() - out_r.float()).abs().max() < 0.1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_non_finite_inputs_give_nan_outputs_where_the_reference_does(pv, where, bad):
    """A NaN or inf in q or k reaches the output as NaN (a q value: its own row; a k value: its whole
    head, through mean(K), as SDPA's every row of that head), as in the reference; it must not pass
    for a row without keys and come out finite."""
    q, k, v, _ = _inputs("k-offset", (1, 2, 100, 64), seed=15)
    (q if where == "q" else k)[0, 1, 37, 5] = bad
    out_t, out_r = _both(q, k, v, pv=pv)
    assert (out_t[0, 1, 37] if where == "q" else out_t[0, 1]).isnan().all()
    assert torch.equal(out_t.isnan(), out_r.isnan())
    assert not out_t[0, 0].isnan().any()  # the other head is untouched


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("granularity", ["block", "token"])
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_a_non_finite_query_row_spreads_to_no_other_row(pv, granularity, bad):
    """SDPA gives one non-finite row for one NaN or inf in q; so must the kernels and the reference
    (a Q tile's shared scale must not carry the NaN to all its 64 or 128 rows)."""
    q, k, v, _ = _inputs("k-offset", (1, 2, 200, 64), seed=16)
    q[0, 1, 70, 3] = bad
    expected = ~torch.isfinite(F.scaled_dot_product_attention(q.float(), k.float(), v.float()))
    assert expected.any(dim=-1).sum() == 1
    out_t, out_r = _both(q, k, v, pv=pv, qk_granularity=granularity)
    assert torch.equal(~torch.isfinite(out_t), expected)
    assert torch.equal(~torch.isfinite(out_r), expected)


def _with_scores_by_add(q, k, v, scores_by_add):
    """The FP8 d64 plan (the one that converts scores by an integer add on sm90), with the add on
    or off, through the op: the interpreter computes what the GPU's plan computes."""
    import dataclasses

    from sagevideo.kernels.op import sageattn_triton

    plan = dataclasses.replace(select_plan(q.device, 64, "fp8").plan, scores_by_add=scores_by_add)
    out, _, _ = sageattn_triton(q, k, v, plan, sm_scale=0.125, is_causal=False, key_mask=None, per_token=False,
                                smooth_k=True, rotate_qk=True, return_lse=False)
    return out


def test_scores_by_add_computes_ordinary_heads_and_leaves_peaky_ones_to_the_exact_conversion():
    """The add's exponent error grows with the row scale (q and k x1000 gave NaN): ordinary query
    tiles run it (their output differs from the exact conversion's by rounding only), peaky ones
    run the exact conversion (bit-identical to the plan without the add, and finite)."""
    q, k, v, _ = _inputs("random", (1, 2, 256, 64), seed=17)
    q[:, 1], k[:, 1] = q[:, 1] * 1000, k[:, 1] * 1000  # head 1 peaky, head 0 ordinary
    with_add, without = _with_scores_by_add(q, k, v, True), _with_scores_by_add(q, k, v, False)
    assert torch.isfinite(with_add).all()
    assert torch.equal(with_add[:, 1], without[:, 1])
    assert not torch.equal(with_add[:, 0], without[:, 0])  # the add path did run on head 0
    reference = sageattn(q[:, :1], k[:, :1], v[:, :1], pv="fp8", backend="reference")
    assert error_stats(reference, with_add[:, :1]).cos_worst > 0.99  # interpreter FP8 floor (see above)


def test_the_wide_row_offset_path_computes_what_the_narrow_one_does(monkeypatch):
    """Offsets switch to int64 past 2^31 (checked on the GPU at that size); here the switch is
    lowered so that the interpreter runs the same code on a small NHD input."""
    from sagevideo.kernels import attention_fwd

    q, k, v, _ = _inputs("k-offset", (1, 2, 150, 64), seed=18)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    narrow = sageattn(q, k, v, tensor_layout="NHD", backend="triton")
    monkeypatch.setattr(attention_fwd, "WIDE_OFFSETS_FROM", 0)
    assert torch.equal(sageattn(q, k, v, tensor_layout="NHD", backend="triton"), narrow)


def test_key_padding_mask_with_huge_padded_values():
    q, k, v, mask = _inputs("padded", (2, 2, 130, 64), seed=9)
    out_t, out_r = _both(q, k, v, attn_mask=mask[:, None, None, :])
    _assert_close_16bit(out_t, out_r)
    # the padded values must not matter at all: replace them and compare
    k2 = torch.where(mask[:, None, :, None], k, torch.zeros_like(k))
    v2 = torch.where(mask[:, None, :, None], v, torch.zeros_like(v))
    out_clean = sageattn(q, k2, v2, attn_mask=mask[:, None, None, :], backend="triton")
    assert torch.equal(out_t, out_clean)


def test_valid_prefix_counts_the_leading_valid_keys_of_each_row():
    from sagevideo.kernels.attention_fwd import valid_prefix

    mask = torch.ones(4, 10, dtype=torch.uint8)
    mask[1, 7:] = 0  # padding at the end
    mask[2, 3] = 0  # a hole: the keys after it do not count
    mask[3, 0] = 0  # nothing valid before the first masked key
    assert valid_prefix(mask, 4, 10).tolist() == [10, 7, 3, 0]
    assert valid_prefix(mask[1:2], 3, 10).tolist() == [7, 7, 7]  # one row for every batch entry
    assert valid_prefix(mask[1:2], 1, 6).tolist() == [6]  # only the first n_k keys are looked at
    assert valid_prefix(mask, 4, 10).dtype == torch.int32


def _mask_of(kind: str, batch: int, n: int) -> torch.Tensor:
    mask = torch.ones(batch, n, dtype=torch.bool)
    if kind == "padding":  # text padding at the end, a different length per batch row
        mask[0, 290:] = False
        mask[1, 130:] = False
    elif kind == "hole":  # valid keys after masked ones: checked from the hole's tile on
        mask[:, 70:80] = False
        mask[1, 200:] = False
    elif kind == "first-key":  # no valid key in the first tile's first column
        mask[:, 0] = False
    elif kind == "shared":  # one row for both batch entries
        mask = mask[:1].clone()
        mask[:, 260:] = False
    return mask.to(DEVICE)


@pytest.mark.parametrize("kind", ["padding", "hole", "first-key", "shared"])
def test_key_masks_match_reference_whatever_their_valid_prefix(kind):
    """The kernel skips the mask check on the tiles before each row's first masked key
    (`valid_prefix`); masks of every shape must still give the reference's output."""
    q, k, v, _ = _inputs("k-offset", (2, 2, 300, 64), seed=21)
    mask = _mask_of(kind, 2, 300)
    out_t, out_r = _both(q, k, v, attn_mask=mask[:, None, None, :])
    _assert_close_16bit(out_t, out_r)


def test_lse_matches_reference():
    q, k, v, _ = _inputs("k-offset", (1, 2, 100, 64), seed=10)
    (_, lse_t), (_, lse_r) = _both(q, k, v, return_lse=True)
    assert lse_t.shape == (1, 2, 100) and lse_t.dtype == torch.float32
    assert (lse_t - lse_r).abs().max() < 1e-3


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_pv_matches_reference(head_dim):
    q, k, v, _ = _inputs("k-offset", (1, 2, 100, head_dim), seed=12)
    out_t, out_r = _both(q, k, v, pv="fp8")
    assert torch.isfinite(out_t).all()
    # interpreter: its float8 cast is inexact; GPU: exp2 is approximate there, which moves a few
    # P values across e4m3 rounding boundaries (one e4m3 step is 6-12%)
    floor = 0.99 if INTERPRETED else 0.9998
    assert error_stats(out_r, out_t).cos_worst > floor


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
@pytest.mark.parametrize(
    "options",
    [{}, {"is_causal": True}, {"with_mask": True, "return_lse": True}],
    ids=["plain", "causal", "mask+lse"],
)
def test_scores_by_add_matches_the_reference(monkeypatch, pv, options):
    """A plan with `scores_by_add` (int32 scores to fp32 by an integer add of 1.5·2^23's bits, the
    bias taken out again in the exponent's FMA) against the reference, which converts exactly: the
    same output up to the subtrahend's one rounding. A bias left in the max or the exponent gives
    zeros or overflow, not small errors."""
    from sagevideo.kernels import op, plans

    monkeypatch.setattr(plans, "_SCORES_BY_ADD", {(a, d, p) for a in ("interpreter", "sm90", "sm89", "sm80")
                                                  for d in (64, 128) for p in ("fp16", "fp8")})
    launched = []

    def recording(*args, **kwargs):  # the plan the plain kernel was launched with
        launched.append(args[5].scores_by_add)
        return attention_forward(*args, **kwargs)

    attention_forward = op.attention_forward
    monkeypatch.setattr(op, "attention_forward", recording)
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "triton")  # on the H200: the plain kernel at d128 too
    q, k, v, _ = _inputs("k-offset", (1, 2, 150, 64), seed=29)
    kw = dict(options)
    if kw.pop("with_mask", False):
        mask = torch.ones(1, 150, dtype=torch.bool, device=DEVICE)
        mask[:, 100:] = False
        kw["attn_mask"] = mask[:, None, None, :]
    out_t, out_r = _both(q, k, v, pv=pv, **kw)
    assert launched == [True]
    if kw.get("return_lse"):
        (out_t, lse_t), (out_r, lse_r) = out_t, out_r
        # FP8's l sums the e4m3 P. The interpreter rounds P its own way (no round-to-even, lost carries): its
        # LSE sits up to ~0.05 below the reference's. On the GPU the approximate exp2 can move a P across an
        # e4m3 rounding boundary: one step of one P moves l by at most 1/16 (ln 1.0625 = 0.061).
        tolerance = 1e-3 if pv == "fp16" else 0.1 if INTERPRETED else 0.07
        assert (lse_t - lse_r).abs().max() < tolerance
    if pv == "fp16":
        _assert_close_16bit(out_t, out_r)
    else:
        assert torch.isfinite(out_t).all() and error_stats(out_r, out_t).cos_worst > (0.99 if INTERPRETED else 0.9998)


def _extreme_kw(dtype, masked, n):
    """FP8 PV, and the key mask of `extreme_v` (or none). Rotation off for bf16 under the interpreter (its
    bf16 tl.dot is wrong)."""
    mask = extreme_v.key_mask(n, DEVICE) if masked else None
    kw = dict(pv="fp8", rotate_qk=not (INTERPRETED and dtype == torch.bfloat16),
              attn_mask=None if mask is None else mask[:, None, None, :])
    return mask, kw


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "key-mask"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_pv_returns_a_constant_v(dtype, masked):
    """A constant V channel (50,000, ±the dtype's max, ...) comes back as itself, exactly: the output is
    clamped to V's per-channel range (`kernels.bounds`), a single value here. Before, 50,000 came back up
    to 1.3% high and ±65,504 as inf."""
    shape = (2, 1, 384, 64)
    q, k = extreme_v.qk(shape, dtype, seed=30, device=DEVICE)
    v = extreme_v.constant_channels(shape, dtype, DEVICE)
    mask, kw = _extreme_kw(dtype, masked, shape[2])
    out_t, out_r = _both(q, k, v if mask is None else extreme_v.with_masked_keys(v, mask), **kw)
    want = v[:, :, :1].expand_as(out_t)
    assert torch.equal(out_r, want) and torch.equal(out_t, want)


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "key-mask"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_pv_keeps_v_near_the_16_bit_maximum_finite_and_within_its_channel_bound(dtype, masked):
    """V = ±max·(1 − j/512) with one sign per channel: every output finite and within its channel's
    [min V, max V] over the valid keys, as in the reference."""
    shape = (2, 1, 384, 64)
    q, k = extreme_v.qk(shape, dtype, seed=31, device=DEVICE)
    v = extreme_v.near_max(shape, dtype, seed=32, device=DEVICE)
    mask, kw = _extreme_kw(dtype, masked, shape[2])
    if mask is not None:
        v = extreme_v.with_masked_keys(v, mask)
    out_t, out_r = _both(q, k, v, **kw)
    nonfinite = int((~torch.isfinite(out_t)).sum())
    excess = extreme_v.excess_over_bound(out_t, v, mask)
    assert nonfinite == 0 and excess <= 0.0, f"{nonfinite} non-finite outputs; worst max|out|/max|V| - 1 = {excess}"
    assert extreme_v.outside_hull(out_t, v, mask) == extreme_v.outside_hull(out_r, v, mask) == 0
