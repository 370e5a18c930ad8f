"""The output range (`kernels/bounds.py`): each channel clamped to V's [min, max] over the valid keys,
what exact attention never leaves; rows that attend no key stay 0; NaN stays NaN."""

import torch

from sagevideo.kernels.bounds import clamp_to_v_hull, v_hull


def test_the_range_takes_only_valid_keys_and_leaves_keyless_rows_unbounded():
    v = torch.tensor([[1.0, 5.0, -9.0], [2.0, 2.0, 2.0]]).T.reshape(1, 1, 3, 2).repeat(2, 1, 1, 1)  # (2, 1, 3, 2)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.uint8)
    lo, hi = v_hull(v, mask)
    assert lo[0, 0, 0].tolist() == [1.0, 2.0] and hi[0, 0, 0].tolist() == [5.0, 2.0]  # -9 is masked
    assert lo[1].isneginf().all() and hi[1].isposinf().all()  # batch row 1 attends nothing


def test_clamping_only_removes_error_and_keeps_nan_and_keyless_rows():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 16, 8, generator=gen) for _ in range(3))
    exact = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
    noisy = exact * 1.05
    noisy[0, 0, 0, 0] = float("nan")
    clamped = clamp_to_v_hull(noisy.clone(), v, None, is_causal=False)
    assert torch.isnan(clamped[0, 0, 0, 0])
    keep = ~torch.isnan(clamped)
    assert ((clamped - exact).abs() <= (noisy - exact).abs())[keep].all()  # never further from exact
    assert torch.equal(clamp_to_v_hull(exact.clone(), v, None, is_causal=False), exact)  # exact is inside


def test_with_a_key_mask_and_causal_rows_that_attend_no_key_stay_zero():
    v = torch.full((1, 1, 4, 2), 3.0)  # every valid value 3: the range is the point 3 ...
    out = torch.zeros(1, 1, 4, 2)  # ... but rows before the first valid key attend nothing
    mask = torch.tensor([[0, 0, 1, 1]], dtype=torch.uint8)
    assert torch.equal(clamp_to_v_hull(out.clone(), v, mask, is_causal=True), out)
    assert (clamp_to_v_hull(out.clone(), v, mask, is_causal=False) == 3.0).all()


def test_grouped_query_heads_take_their_kv_heads_range():
    v = torch.stack([torch.zeros(4, 1), torch.ones(4, 1) * 10], dim=0)[None]  # (1, 2, 4, 1): heads 0 and 10
    out = torch.full((1, 4, 4, 1), 5.0)
    clamped = clamp_to_v_hull(out, v, None, is_causal=False)
    assert clamped[0, :2].eq(0.0).all() and clamped[0, 2:].eq(10.0).all()
