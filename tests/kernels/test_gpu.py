"""GPU-only checks (H200): kernels vs reference with tight FP8 and bf16, real sizes vs fp32 SDPA,
torch.compile through Inductor. Run on the GPU machine with `pytest -m gpu`."""

import pytest
import torch
import torch.nn.functional as F

from sagevideo import last_backend, record_backends, sageattn
from sagevideo.attention.accuracy import error_stats
from sagevideo.eval.numerics.floors import CONTRACT
from sagevideo.eval.numerics.presets import make_inputs
from tests.helpers import extreme_v

pytestmark = pytest.mark.gpu


def _inputs(preset, shape, dtype=torch.float16, seed=0):
    x = make_inputs(preset, shape, seed)
    q, k, v = (t.to("cuda", dtype) for t in (x.q, x.k, x.v))
    mask = None if x.key_mask is None else x.key_mask.cuda()
    return q, k, v, mask


def _fp32_sdpa(q, k, v, mask=None):
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    for h in range(q.shape[1]):  # one head at a time: bounded memory at 75k tokens
        m = None if mask is None else mask[:, None, None, :]
        out[:, h : h + 1] = F.scaled_dot_product_attention(
            q[:, h : h + 1].float(), k[:, h : h + 1].float(), v[:, h : h + 1].float(), attn_mask=m
        )
    return out


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kernel_matches_reference_on_gpu(pv, dtype, head_dim):
    q, k, v, mask = _inputs("padded", (2, 4, 1000, head_dim), dtype)
    m = mask[:, None, None, :]
    out_t = sageattn(q, k, v, pv=pv, attn_mask=m, backend="triton")
    assert last_backend().ran == "triton"
    out_r = sageattn(q, k, v, pv=pv, attn_mask=m, backend="reference")
    e = error_stats(out_r, out_t)
    assert e.nonfinite == 0
    # FP8: the GPU's approximate exp2 moves a few P values across e4m3 rounding boundaries
    floor = {("fp16", torch.float16): 0.99999, ("fp16", torch.bfloat16): 0.9999}.get((pv, dtype), 0.9998)
    assert e.cos_worst > floor, e


@pytest.mark.parametrize(
    "shape", [(2, 30, 17776, 64), (1, 24, 32768, 128)], ids=["cogvideox-2b", "d128-32k"]
)
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_real_sizes_meet_contract_vs_fp32_sdpa(shape, pv):
    floor = CONTRACT[pv].cos_worst
    q, k, v, _ = _inputs("k-offset", shape)
    out = sageattn(q, k, v, pv=pv, backend="triton")
    e = error_stats(_fp32_sdpa(q, k, v), out)
    print(f"\n{shape} pv={pv}: {e}")
    assert e.nonfinite == 0
    assert e.cos_worst >= floor, e


@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_bf16_large_magnitude_is_finite(pv):
    q, k, v, _ = _inputs("large", (1, 8, 4096, 128), torch.bfloat16)
    assert torch.isfinite(sageattn(q, k, v, pv=pv, backend="triton")).all()


def test_torch_compile_fullgraph_inductor():
    q, k, v, _ = _inputs("random", (1, 4, 512, 64))

    def attend(q, k, v):
        return sageattn(q, k, v, backend="triton") * 2

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), attend(q, k, v), atol=2e-3, rtol=2e-3)
    with record_backends() as log:  # each run of the Inductor graph reports what it calls
        compiled(q, k, v)
        compiled(q, k, v)
    assert log.counts == {"triton/fp16": 2}


# Every plan the GPU can take: (head dim, PV, SAGEVIDEO_SM90_KERNEL). On sm90, "auto" runs the plain
# kernel at d64 (FP8 with scores by add) and for FP16 PV, and the Gluon one for FP8 at d128.
EVERY_PLAN = [(64, "fp16", "auto"), (64, "fp8", "auto"), (64, "fp8", "gluon"),
              (128, "fp16", "auto"), (128, "fp8", "auto"), (128, "fp8", "triton")]


@pytest.mark.parametrize("head_dim, pv, kernel", EVERY_PLAN)
@pytest.mark.parametrize("scale", [30.0, 100.0, 1000.0])
def test_large_q_and_k_give_finite_outputs_in_every_plan(head_dim, pv, kernel, scale, monkeypatch):
    """1000·randn q and k gave 608,256 non-finite outputs with FP8 PV at d64 (scores by add)."""
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", kernel)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, 8, 17776, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
               for _ in range(3))
    out = sageattn(q * scale, k * scale, v, pv=pv, backend="triton")
    if kernel == "gluon" or (kernel == "auto" and (head_dim, pv) == (128, "fp8")):
        assert last_backend().ran == "gluon"
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("head_dim, pv, kernel", EVERY_PLAN)
@pytest.mark.parametrize("granularity", ["block", "token"])
def test_a_nan_query_row_stays_in_its_row(head_dim, pv, kernel, granularity, monkeypatch):
    """SDPA: one NaN in q gives one NaN row. Not over the row's whole Q tile, which shares one scale."""
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", kernel)
    q, k, v, _ = _inputs("random", (1, 4, 4096, head_dim), torch.bfloat16)
    q[0, 2, 1000, 5] = float("nan")
    out = sageattn(q, k, v, pv=pv, qk_granularity=granularity, backend="triton")
    bad_rows = (~torch.isfinite(out)).any(dim=-1).nonzero().tolist()
    assert bad_rows == [[0, 2, 1000]]


def _sampled_rows_cosine(q, k, v, out, rows, keep=None):
    """Worst cosine of `out` against fp32 attention at `rows` (b, h, n) of HND tensors; keep: the
    valid keys (Nk,) bool or None."""
    worst = 1.0
    for b, h, n in rows:
        kh, vh = (k[b, h], v[b, h]) if keep is None else (k[b, h, keep], v[b, h, keep])
        ref = torch.softmax(kh.float() @ q[b, h, n].float() * q.shape[-1] ** -0.5, dim=0) @ vh.float()
        worst = min(worst, F.cosine_similarity(ref, out[b, h, n].float(), dim=0).item())
    return worst


@pytest.mark.parametrize(
    "shape, layout, pv, masked",
    [
        ((1, 66, 262144, 128), "HND", "fp8", False),  # Gluon; the shape (exactly 2^31 worked)
        ((1, 66, 262144, 128), "NHD", "fp8", False),  # token stride H·D: in-head offsets pass 2^31
        ((1, 66, 262144, 128), "NHD", "fp16", False),  # the same through the plain kernel's V rows
        ((2, 40, 262144, 128), "HND", "fp16", True),  # plain d128 with a key mask and the LSE
        ((1, 132, 262144, 64), "HND", "fp8", False),  # plain d64 with scores by add (two launches)
    ],
    ids=["gluon-hnd", "gluon-nhd", "plain-nhd", "plain-d128-mask-lse", "plain-d64"],
)
def test_more_than_2_31_elements_match_sdpa_on_sampled_rows(shape, layout, pv, masked):
    """Above 2^31 elements the int32 offsets overflowed (illegal memory access, CUDA context lost).
    Every output row is written and finite; sampled rows of the last heads match fp32 attention."""
    torch.cuda.empty_cache()
    b, h, n, d = shape
    gen = torch.Generator(device="cuda").manual_seed(2)
    dims = (b, h, n, d) if layout == "HND" else (b, n, h, d)
    q, k, v = (torch.randn(dims, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    assert q.numel() > 2**31
    mask = None
    if masked:
        mask = torch.ones(b, 1, 1, n, dtype=torch.bool, device="cuda")
        mask[..., n - 1000:] = False  # padded keys: the rows below attend to the others only
    result = sageattn(q, k, v, tensor_layout=layout, pv=pv, attn_mask=mask, return_lse=masked, backend="triton")
    out = result[0] if masked else result
    assert torch.isfinite(out).all()
    if layout == "NHD":  # HND views of the same memory
        q, k, v, out = (t.transpose(1, 2) for t in (q, k, v, out))
    keep = None if mask is None else mask[0, 0, 0]
    rows = [(b - 1, h - 1, 0), (b - 1, h - 1, n // 2 + 7), (b - 1, h - 1, n - 1), (0, h // 2, 12345)]
    floor = 0.998 if pv == "fp8" else 0.999
    assert _sampled_rows_cosine(q, k, v, out, rows, keep) >= floor
    if masked:
        kh = k[b - 1, h - 1, keep].float()
        want = torch.logsumexp(kh @ q[b - 1, h - 1, -1].float() * d**-0.5, dim=0)
        assert abs(result[1][b - 1, h - 1, -1].item() - want.item()) < 0.05


# The FP8 plans (head dim, SAGEVIDEO_SM90_KERNEL): d64 "auto" is the plain kernel with scores by add, d128
# "auto" the Gluon one; a key mask always runs the plain kernel (the Gluon one takes none).
FP8_PLANS = [(64, "auto"), (64, "gluon"), (128, "auto"), (128, "triton")]


@pytest.mark.parametrize("head_dim, kernel", FP8_PLANS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("values", ["constant", "near-max"])
@pytest.mark.parametrize("batch, heads, n, masked", [(2, 4, 1000, False), (2, 4, 1000, True), (1, 8, 17776, False)],
                         ids=["1000", "1000-key-mask", "cogvideox-2b"])
def test_fp8_pv_returns_v_at_the_16_bit_maximum_in_every_plan(head_dim, kernel, dtype, values, batch, heads, n,
                                                              masked, monkeypatch):
    """V constant per channel (50,000, ±max, ...): each channel's value comes back exactly; or
    ±max·(1 − j/512) per channel: every output finite and within its channel's [min V, max V] over the
    valid keys (`kernels.bounds`). Before, ±65,504 gave 15% inf on the H200."""
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", kernel)
    shape = (batch, heads, n, head_dim)
    q, k = extreme_v.qk(shape, dtype, seed=40, device="cuda")
    if values == "constant":
        v = extreme_v.constant_channels(shape, dtype, "cuda")
    else:
        v = extreme_v.near_max(shape, dtype, seed=41, device="cuda")
    mask = extreme_v.key_mask(n, "cuda") if masked else None
    if mask is not None:
        v = extreme_v.with_masked_keys(v, mask)
    m = None if mask is None else mask[:, None, None, :]
    out = sageattn(q, k, v, pv="fp8", attn_mask=m, backend="triton")
    gluon = not masked and (kernel == "gluon" or (kernel == "auto" and head_dim == 128))
    assert last_backend().ran == ("gluon" if gluon else "triton")
    assert extreme_v.outside_hull(out, v, mask) == 0
    if values == "constant":
        assert torch.equal(out, v[:, :, :1].expand_as(out))
