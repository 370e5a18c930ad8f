"""GPU-only checks (H200): kernels vs reference with tight FP8 and bf16, real sizes vs fp32 SDPA,
torch.compile through Inductor. Run on the GPU machine with `pytest -m gpu`."""

import pytest
import torch
import torch.nn.functional as F

from sagevideo import last_backend, sageattn
from sagevideo.eval.attention_error import error_stats
from sagevideo.eval.presets import make_inputs

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
@pytest.mark.parametrize("pv, floor", [("fp16", 0.999), ("fp8", 0.998)])
def test_real_sizes_meet_contract_vs_fp32_sdpa(shape, pv, floor):
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
