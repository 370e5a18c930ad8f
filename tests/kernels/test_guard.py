"""The run-time guard's count (`kernels/guard.py`): query tiles past INT8's accuracy, from the scales
the preparation wrote. Named reference: fp64 attention (the accuracy contract's floors). No false
alarm on the accuracy suite's ordinary cases; every case below a floor is flagged; the Triton
kernels (CPU interpreter, or the GPU) count what the reference counts."""

import pytest
import torch

from sagevideo import last_backend, sageattn
from sagevideo.attention.accuracy import attention_fp64, error_stats
from sagevideo.eval.numerics.presets import CONTRACT_PRESETS, make_inputs, score_std_scaled
from sagevideo.kernels.guard import flagged_tiles, score_std_limit
from sagevideo.kernels.plans import tiles as plan_tiles

pytestmark = pytest.mark.kernels  # Triton kernels, interpreted on a CPU: make test-fast leaves them out

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOORS = {"fp16": 0.999, "fp8": 0.998}
MODES = [(g, pv) for g in ("block", "token") for pv in ("fp16", "fp8")]


def _count(q, k, v, backend="reference", **kw):
    out = sageattn(q, k, v, backend=backend, **kw)
    return out, last_backend().peaky_tiles


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("preset", CONTRACT_PRESETS)
def test_the_accuracy_suites_ordinary_cases_raise_no_alarm(preset, head_dim):
    x = make_inputs(preset, (1, 4, 512, head_dim), seed=1)
    mask = None if x.key_mask is None else x.key_mask[:, None, None, :]
    for granularity, pv in MODES:
        _, tiles = _count(x.q, x.k, x.v, attn_mask=mask, pv=pv, qk_granularity=granularity)
        assert tiles == 0, (preset, granularity, pv, tiles)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_case_below_the_contracts_floor_is_flagged_and_none_within_it(head_dim):
    """Gaussian q, k at score stds 1-300 (the accuracy table's): a mode whose worst cosine is under its
    floor counts query tiles; score std up to 3 (well inside the contract in every mode) counts none.
    (At 10, per-tile scales with 16-bit P·V sit on the floor: 0.99909 at d64, 0.99895 at d128.)"""
    for std in (1, 3, 10, 20, 30, 100, 300):
        x = score_std_scaled((1, 4, 512, head_dim), torch.Generator().manual_seed(2), std)
        ref = attention_fp64(x.q, x.k, x.v)
        for granularity, pv in MODES:
            out, tiles = _count(x.q, x.k, x.v, pv=pv, qk_granularity=granularity)
            cos = error_stats(ref, out).cos_worst
            if cos < FLOORS[pv]:
                assert tiles > 0, (std, granularity, pv, cos)
            if std <= 3:
                assert tiles == 0, (std, granularity, pv, cos, tiles)


def test_the_issues_peaky_calls_are_flagged():
    """q, k x1000 at d128 and q, k x30 at d64 (worst cosine 0.95-0.97), in every mode; SDPA counts nothing."""
    for head_dim, factor in ((128, 1000.0), (64, 30.0)):
        x = make_inputs("random", (1, 2, 256, head_dim), seed=3)
        for granularity, pv in MODES:
            _, tiles = _count(x.q * factor, x.k * factor, x.v, pv=pv, qk_granularity=granularity)
            every = 2 * 256 // plan_tiles(pv, head_dim)[0]  # every query tile of both heads
            assert tiles == every, (head_dim, granularity, pv, tiles)
    _, tiles = _count(x.q * 30, x.k * 30, x.v, backend="sdpa")
    assert tiles is None


def test_masked_and_padded_keys_raise_no_alarm():
    """Keys masked out are zeroed before quantizing (their groups get the scale 1, their codes 0):
    huge masked values and whole masked tiles must not count."""
    x = make_inputs("random", (2, 2, 300, 64), seed=4)
    k = x.k.clone()
    valid = torch.arange(300)[None] < torch.tensor([[120], [300]])
    k[~valid[:, None].expand_as(k[..., 0])] = 3e4
    _, tiles = _count(x.q, k, x.v, attn_mask=valid[:, None, None, :], pv="fp8")
    assert tiles == 0


def test_grouped_query_heads_are_set_against_their_own_kv_head():
    """Two K/V heads for four query heads: only K/V head 1 is peaky, so only query heads 2 and 3 count."""
    x = make_inputs("random", (1, 4, 128, 64), seed=5)
    k, v = x.k[:, :2].clone(), x.v[:, :2]
    k[:, 1] *= 1000
    _, tiles = _count(x.q, k, v, enable_gqa=True)
    assert tiles == 2 * 128 // plan_tiles("fp16", 64)[0]  # the query tiles of heads 2 and 3


def test_counts_are_int32_device_scalars_and_nan_scales_count_nothing():
    q_scale = torch.full((2, 256), 1e-3)
    k_scale = torch.full((2, 128), 1e-2)
    none = flagged_tiles(q_scale, k_scale, block_m=128, head_dim=64, granularity="block", pv="fp16")
    assert none.dtype == torch.int32 and none.shape == () and int(none) == 0
    q_scale[1, :128] = 10.0  # head 1's first tile far past the limit
    q_scale[0, 128:] = float("nan")
    hit = flagged_tiles(q_scale, k_scale, block_m=128, head_dim=64, granularity="block", pv="fp16")
    assert int(hit) == 1
    assert score_std_limit("block", "fp16") < score_std_limit("block", "fp8") < score_std_limit("token", "fp16")


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_the_triton_kernels_count_what_the_reference_counts(pv):
    """Same scales, same count: under the CPU interpreter (bf16 is not taken there) or on the GPU."""
    x = make_inputs("random", (1, 2, 256, 64), seed=6)
    q, k, v = (t.to(DEVICE, torch.float16) for t in (x.q, x.k, x.v))
    q[:, 1], k[:, 1] = q[:, 1] * 40, k[:, 1] * 40  # head 1 peaky
    _, triton_tiles = _count(q, k, v, backend="triton", pv=pv)
    assert last_backend().ran in ("triton", "gluon")
    _, reference_tiles = _count(q, k, v, pv=pv)
    assert triton_tiles == reference_tiles == 256 // plan_tiles(pv, 64)[0]  # head 1's query tiles
