"""The guard's one-launch count (`kernels.guard_count`) against its definition (`kernels.guard.flagged_tiles`)."""

import pytest
import torch

from sagevideo.kernels.guard import ZERO_GROUP_SCALE, flagged_tiles, score_std_limit, score_std_per_scale
from sagevideo.kernels.guard_count import count_flagged_tiles

pytestmark = pytest.mark.kernels  # Triton kernels, interpreted on a CPU: make test-fast leaves them out

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _scales(rows: int, n: int, seed: int, *, top: float, group: int = 64, jitter: bool = True) -> torch.Tensor:
    """Row scales whose groups of `group` rows reach up to `top`·√(the d64 FP16 block limit's scale), one
    random level per group (so that some query tiles pass the limit and others do not); jitter: each row
    its own scale within the group (as per-token scales), else one per group (per-tile scales)."""
    g = torch.Generator().manual_seed(seed)
    root = (score_std_limit("block", "fp16") / score_std_per_scale(64)) ** 0.5
    level = torch.rand(rows, n // group, generator=g).repeat_interleave(group, dim=1)
    spread = 0.9 + 0.1 * torch.rand(rows, n, generator=g) if jitter else 1.0
    return (root * top * level * spread).to(DEVICE)


@pytest.mark.parametrize("granularity, pv", [("block", "fp16"), ("block", "fp8"), ("token", "fp16"), ("token", "fp8")])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_the_count_is_the_definitions(granularity, pv, heads, kv_heads):
    batch, block_m, m_pad, n_pad = 2, 64, 1280, 1536  # m_pad past one 1024-scale chunk
    q_scale = _scales(batch * heads, m_pad, 1, top=3.0)
    k_scale = _scales(batch * kv_heads, n_pad, 2, top=1.5)
    want = flagged_tiles(q_scale, k_scale, block_m=block_m, head_dim=64, granularity=granularity, pv=pv)
    got = count_flagged_tiles(q_scale, k_scale, block_m=block_m, head_dim=64, granularity=granularity, pv=pv)
    assert 0 < want.item() < batch * heads * m_pad // block_m  # the case tells counts apart
    assert got.dtype == torch.int32 and got.shape == () and got.item() == want.item()


@pytest.mark.parametrize("block_n", [64, 128])
def test_per_tile_k_scales_are_read_once_per_tile(block_n):
    """Under "block" the kernel reads one K scale per tile (its rows share it): the same count."""
    q_scale = _scales(8, 1280, 5, top=3.0)
    k_scale = _scales(4, 1536, 6, top=1.5, group=block_n, jitter=False)
    k_scale[1, block_n:2 * block_n] = ZERO_GROUP_SCALE
    kw = dict(block_m=64, head_dim=64, granularity="block", pv="fp8")
    want = flagged_tiles(q_scale, k_scale, **kw).item()
    assert 0 < want < 8 * 1280 // 64
    assert count_flagged_tiles(q_scale, k_scale, block_n=block_n, **kw).item() == want


def test_zero_groups_and_nan_scales_count_as_nothing():
    block_m = 64
    q_scale = _scales(2, 256, 3, top=40.0)
    k_scale = _scales(2, 512, 4, top=0.1)
    k_scale[0, :256] = ZERO_GROUP_SCALE  # masked/padded keys: exact whatever the scale
    k_scale[1, 7] = float("nan")
    q_scale[0, :block_m] = ZERO_GROUP_SCALE
    q_scale[1, block_m:2 * block_m] = float("nan")
    kw = dict(block_m=block_m, head_dim=64, granularity="block", pv="fp16")
    count = count_flagged_tiles(q_scale, k_scale, **kw).item()
    assert count == flagged_tiles(q_scale, k_scale, **kw).item() and count > 0
    k_scale[:] = ZERO_GROUP_SCALE
    assert count_flagged_tiles(q_scale, k_scale, **kw).item() == 0
