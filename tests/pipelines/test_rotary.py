"""rotary_into is bit-equal to diffusers' apply_rotary_emb (use_real=True, unbind dim -1, sequence dim 2)."""

import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb

from sagevideo.pipelines.rotary import rotary_into


def _freqs(s, d, seed=0):
    angles = torch.rand(s, d, generator=torch.Generator().manual_seed(seed)) * 6.3
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_equals_diffusers(dtype, layout):
    b, h, s, d = 2, 3, 40, 64
    g = torch.Generator().manual_seed(1)
    if layout == "contiguous":
        x = torch.randn(b, h, s, d, generator=g).to(dtype)
    elif layout == "transposed":  # (B, S, H, D) memory, as the projections produce it
        x = torch.randn(b, s, h, d, generator=g).to(dtype).transpose(1, 2)
    else:  # the video tokens behind 7 text tokens
        x = torch.randn(b, h, 7 + s, d, generator=g).to(dtype)[:, :, 7:]
    freqs = _freqs(s, d)
    want = apply_rotary_emb(x, freqs)
    got = rotary_into(torch.empty_like(want), x, freqs)
    assert got.dtype == dtype
    assert torch.equal(got, want)


def test_writes_strided_destinations_and_in_place():
    x = torch.randn(2, 4, 24, 64).to(torch.bfloat16)
    freqs = _freqs(24, 64)
    want = apply_rotary_emb(x, freqs)
    # A destination with heads split (B, P, chunks, hc, S, D) and non-contiguous strides.
    buffer = torch.empty(2, 2, 1, 2, 30, 64, dtype=torch.bfloat16).transpose(0, 2)[:, :, :, :, 6:]
    dst = buffer.permute(2, 1, 0, 3, 4, 5)
    rotary_into(dst, x.unflatten(1, (2, 1, 2)), freqs)
    assert torch.equal(dst.flatten(1, 3), want)
    rotary_into(x, x, freqs)  # dst aliasing x
    assert torch.equal(x, want)


def test_empty_sequence():
    x = torch.randn(1, 2, 0, 64)
    cos, sin = _freqs(0, 64)
    dst = torch.empty_like(x)
    assert rotary_into(dst, x, (cos, sin)) is dst
