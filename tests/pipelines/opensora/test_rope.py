"""RoPE: the rotate-half convention of the released checkpoint (OPENSORA.md §5), not Flux's pairs."""

import pytest
import torch

from sagevideo.pipelines.opensora.rope import apply_rope, rope_tables
from tests.helpers.opensora import (
    TINY,
    cosine,
    interleaved_rope,
    ref_rope,
    ref_rope_angles,
    reference_forward,
    tiny_inputs,
)


def _ids():
    grid = [(0, 0, 0)] * 3 + [(t, h, w) for t in range(3) for h in range(4) for w in range(5)]  # 3 text tokens
    return torch.tensor(grid, dtype=torch.float32)[None].expand(2, -1, -1)


def test_tables_layout_and_values():
    ids = _ids()
    cos, sin = rope_tables(ids, TINY["axes_dim"], TINY["theta"])
    assert cos.shape == sin.shape == (1, ids.shape[1], 32) and cos.dtype == torch.float32
    # repeated twice along the last dim: entry j and j + D/2 carry the same angle
    assert torch.equal(cos[..., :16], cos[..., 16:]) and torch.equal(sin[..., :16], sin[..., 16:])
    angles = ref_rope_angles(ids[0], TINY["axes_dim"], TINY["theta"])  # [t: 4 | h: 6 | w: 6]
    torch.testing.assert_close(cos[0, :, :16], angles.cos(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sin[0, :, :16], angles.sin(), atol=1e-6, rtol=0)
    # the t-axis frequencies only see t: the token (t=2, h=3, w=4) has h/w-independent t columns
    last = ids.shape[1] - 1
    assert torch.allclose(cos[0, last, :4], torch.cos(2 * 10000 ** (-torch.arange(0, 8, 2) / 8.0)))


def test_apply_matches_the_formula_and_not_interleaved():
    ids = _ids()
    q = torch.randn(2, 2, ids.shape[1], 32)
    cos, sin = rope_tables(ids, TINY["axes_dim"], TINY["theta"])
    angles = ref_rope_angles(ids[0], TINY["axes_dim"], TINY["theta"])
    got = apply_rope(q, cos, sin)
    torch.testing.assert_close(got, ref_rope(q, angles), atol=2e-6, rtol=1e-5)
    wrong = interleaved_rope(q, angles)
    assert (got - wrong).abs().max() > 0.5  # the two conventions are different functions
    torch.testing.assert_close(got[:, :, :3], q[:, :, :3], atol=0, rtol=0)  # text tokens (position 0) unrotated


def test_equals_diffusers_rotate_half_form():
    """OPENSORA.md: diffusers' apply_rotary_emb(use_real=True, use_real_unbind_dim=-2) with cat(c, c)
    is the same math."""
    from diffusers.models.embeddings import apply_rotary_emb

    ids = _ids()
    q = torch.randn(1, 2, ids.shape[1], 32)
    cos, sin = rope_tables(ids, TINY["axes_dim"], TINY["theta"])
    want = apply_rotary_emb(q, (cos[0], sin[0]), use_real=True, use_real_unbind_dim=-2)
    torch.testing.assert_close(apply_rope(q, cos, sin), want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_computed_in_fp32_and_stored_in_q_dtype(dtype):
    ids = _ids()
    q = torch.randn(1, 2, ids.shape[1], 32).to(dtype)
    cos, sin = rope_tables(ids.to(dtype), TINY["axes_dim"], TINY["theta"])
    got = apply_rope(q, cos, sin)
    assert got.dtype == dtype
    want = ref_rope(q.float(), ref_rope_angles(ids[0], TINY["axes_dim"], TINY["theta"])).to(dtype)
    eps = torch.finfo(dtype).eps  # at most one rounding step apart (fp32 results a few ulp apart)
    torch.testing.assert_close(got.float(), want.float(), atol=eps, rtol=eps)


def test_only_batch_row_zero_positions_are_used():
    """As Liger's kernel: the table comes from row 0 for every batch element."""
    ids = _ids().clone()
    other = ids.clone()
    other[1] = other[1] + 7
    tables = rope_tables(ids, [8, 12, 12], 1e4), rope_tables(other, [8, 12, 12], 1e4)
    assert all(torch.equal(a, b) for a, b in zip(*tables, strict=True))


def test_interleaved_rope_on_the_same_weights_is_a_gross_error(tiny_model, official_sd):
    """Same weights, the other convention: the output moves about 1000x the numerical tolerance.

    (Tiny random model: the residual stream dilutes the attention error, so the cosine stays near
    0.998; the point is that it is a different function, not a rounding difference.)"""
    inputs = tiny_inputs(frames=3, h=4, w=4)
    with torch.no_grad():
        right = reference_forward(official_sd, TINY, **inputs)
        wrong = reference_forward(official_sd, TINY, **inputs, rope=interleaved_rope)
        ours = tiny_model(**inputs)
    assert cosine(ours, right) > 0.99999
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()
    assert rel(ours, right) < 1e-5
    assert rel(ours, wrong) > 2e-2
