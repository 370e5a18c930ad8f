"""The quantization kernels against the PyTorch reference: INT8 codes and scales, FP8 V in MMA key order."""

import pytest
import torch

from sagevideo import last_backend, sageattn
from sagevideo.attention.accuracy import error_stats
from sagevideo.eval.numerics.presets import make_inputs
from sagevideo.kernels.plans import select_plan
from sagevideo.kernels.reference import LOG2E, mma_key_permutation, quantize_symmetric, smoothed_k
from sagevideo.kernels.rotation import hadamard_pm1

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


# 2100: 33 key tiles and 17 query tiles, 2 per program (speed knobs): each last program half empty
@pytest.mark.parametrize("n", [200, 2100])
def test_quantized_codes_match_reference(n):
    """The quantization kernels themselves: INT8 codes equal the reference's (rare ±1 flips
    allowed where fp32 summation order moves a value across a rounding boundary)."""
    import dataclasses

    from sagevideo.kernels.plans import prep_plan
    from sagevideo.kernels.quantize import quantize_inputs

    q, k, v, _ = _inputs("k-offset", (1, 2, n, 64), seed=11)
    plan = select_plan(q.device, 64, "fp16").plan
    rot = hadamard_pm1(64, q.device)
    launch = prep_plan(plan)
    if n > 2000:
        launch = dataclasses.replace(launch, kv_tiles_per_program=2, q_tiles_per_program=2, min_programs_per_head=1)
    prep = quantize_inputs(q, k, v, None, rot, plan, sm_scale=0.125, per_token=False, smooth_k=True, need_shift=True,
                           prep=launch)
    got_q_codes, got_q_scale, got_q_shift = prep.q_codes, prep.q_scale, prep.q_shift
    def mm(a, b):  # fp64 accumulation: no TF32, no summation-order effects in the expectation
        return (a.double() @ b.double()).float()

    ks, mean = smoothed_k(k, None)
    k_codes, k_scale = quantize_symmetric(mm(ks, rot), plan.block_n)
    q_codes, q_scale = quantize_symmetric(mm(q.float(), rot), plan.block_m, scale_factor=0.125 * LOG2E / 64)
    got_k = prep.k_codes.reshape(1, 2, -1, 64)[:, :, :n].float()
    got_q = got_q_codes.reshape(1, 2, -1, 64)[:, :, :n].float()
    for got, want in ((got_k, k_codes), (got_q, q_codes)):
        off = (got - want).abs()
        assert off.max() <= 1 and (off > 0).float().mean() < 1e-3
    torch.testing.assert_close(prep.k_scale.reshape(1, 2, -1)[:, :, :n], k_scale, rtol=1e-5, atol=0)
    torch.testing.assert_close(got_q_scale.reshape(1, 2, -1)[:, :, :n], q_scale, rtol=1e-5, atol=0)
    torch.testing.assert_close(prep.k_mean.reshape(1, 2, -1), mean, rtol=1e-5, atol=1e-6)
    assert (prep.k_codes.reshape(1, 2, -1, 64)[:, :, n:] == 0).all()  # padded tail tiles written as zeros
    shift = got_q_shift.reshape(1, 2, -1)[:, :, :n]
    torch.testing.assert_close(shift, 0.125 * mm(q.float(), mean[..., None]).squeeze(-1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantization_kernels_equal_the_reference_bit_for_bit(dtype, per_token):
    """Without rotation and smoothing the kernels' inputs to quantization are exact, so scales must
    equal the reference's bit for bit, and codes too (on the GPU the rounding add is fused like the
    reference; the interpreter rounds the product first, which may flip a code at a near-tie).
    bf16 also gets a group of denormal-range values (max|x| below reference.TINY_AMAX)."""
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.reference import quantize_v_fp8

    q, k, v, _ = _inputs("k-offset", (1, 2, 300, 64), seed=21, dtype=dtype)
    if dtype == torch.bfloat16:
        q[0, 1, 128:256] *= 1e-36  # whole Q groups (and for per-token, their rows) tiny
    plan = select_plan(q.device, 64, "fp8").plan
    prep = quantize_inputs(q, k, v, None, None, plan, sm_scale=0.125, per_token=per_token, smooth_k=False,
                           need_shift=False)
    groups = (1, 1) if per_token else (plan.block_m, plan.block_n)
    for got_codes, got_scale, x, group, factor in (
        (prep.q_codes, prep.q_scale, q, groups[0], 0.125 * LOG2E),
        (prep.k_codes, prep.k_scale, k, groups[1], 1.0),
    ):
        want_codes, want_scale = quantize_symmetric(x.float(), group, scale_factor=factor)
        got_scale = got_scale.reshape(1, 2, -1)[:, :, :300]
        assert torch.equal(got_scale, want_scale)
        got = got_codes.reshape(1, 2, -1, 64)[:, :, :300].float()
        flipped = got != want_codes
        if INTERPRETED:  # only where the unrounded product is within 1e-5 of a tie
            inv = factor / want_scale.double()  # ≈ 127/max|x| (scale = max|x|·factor/127): locates near-ties
            distance = ((x.double() * inv[..., None]).abs() % 1 - 0.5).abs()
            assert (distance[flipped] < 1e-5).all() and (got - want_codes).abs().max() <= 1
        else:
            assert not flipped.any()
    if not INTERPRETED:  # the interpreter's float8 cast does not round to nearest even
        want_v, want_v_scale = quantize_v_fp8(v, None)
        assert torch.equal(prep.v_scale.reshape(1, 2, 64), want_v_scale)
        # keys in the MMA operand's order: restore the natural one
        natural = prep.v_fp8_t[..., mma_key_permutation(prep.v_fp8_t.shape[-1]).argsort().to(DEVICE)]
        got_v = natural.reshape(1, 2, 64, -1)[..., :300].transpose(-1, -2)
        assert torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_v_in_mma_key_order_is_a_permutation_of_the_per_channel_fp8_v(head_dim):
    """FP8 Vᵀ is stored with each 32-key group in `quantize.mma_key_order` (the kernels reorder P to
    match): restored to the natural order, it is the reference's per-channel FP8 V (all codes on the
    GPU; under the interpreter, whose float8 cast is off for a few values, nearly all: the unrestored
    order matches about a quarter), zeros past the last key; and the kernel's output is the
    reference's. A wrong permutation on either side pairs P values with other keys' V rows: errors
    of order one, on inputs whose keys differ as much as these."""
    from sagevideo.kernels.plans import plain_triton
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.reference import quantize_v_fp8

    q, k, v, _ = _inputs("k-offset", (1, 2, 300, head_dim), seed=23)
    plan = plain_triton(select_plan(q.device, head_dim, "fp8").plan)  # on the H200 d128 names Gluon
    rotation = hadamard_pm1(plan.block_d, q.device, q.dtype)
    prep = quantize_inputs(q, k, v, None, rotation, plan, sm_scale=head_dim**-0.5, per_token=False,
                           smooth_k=True, need_shift=False)
    restore = mma_key_permutation(prep.v_fp8_t.shape[-1]).argsort().to(DEVICE)
    natural = prep.v_fp8_t[..., restore].float().reshape(1, 2, plan.block_d, -1)
    want, _ = quantize_v_fp8(v, None)
    got = natural[:, :, :head_dim, :300].transpose(-1, -2)
    agree = (got == want.float()).float().mean().item()
    assert agree > 0.95 if INTERPRETED else agree == 1.0
    assert (natural[..., 300:] == 0).all()
    assert not torch.equal(prep.v_fp8_t.float(), prep.v_fp8_t[..., restore].float())  # really reordered
    v_peaky = v * torch.arange(300, device=DEVICE, dtype=v.dtype)[:, None] / 30  # every key's V distinct
    out_t, out_r = _both(q * 4, k, v_peaky, pv="fp8")  # peaky attention: each query picks few keys
    floor = 0.99 if INTERPRETED else 0.9998
    assert error_stats(out_r, out_t).cos_worst > floor
