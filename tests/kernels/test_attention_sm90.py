"""The sm90 Gluon kernel (`kernels/attention_sm90.py`) against the plain-Triton kernel.

On any machine: it compiles for sm_90 (Gluon cannot run under TRITON_INTERPRET, so this is where
layout and type errors surface without a GPU). On an sm90 GPU (`pytest -m gpu`): on the same
quantized inputs it computes what the plain-Triton kernel computes (same tiles and numerics; only
fp32 summation order differs), and holds the FP8-PV floor of DESIGN §2 against fp32 SDPA.
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

_COMPILE = """
import json, sys
from sagevideo.kernels import attention_sm90
kernel = attention_sm90.compile_for_sm90(int(sys.argv[1]), out_dtype=sys.argv[2], sparse=sys.argv[3] == "sparse")
print(json.dumps({"ptx": kernel.asm["ptx"], "shared": kernel.metadata.shared}))
"""


@pytest.mark.slow  # a fresh process compiles the Gluon kernel
@pytest.mark.parametrize("head_d, out_dtype, variant", [(64, "bf16", "dense"), (128, "fp16", "dense"),
                                                        (128, "bf16", "sparse")])
def test_compiles_for_sm90_on_any_machine(head_d, out_dtype, variant):
    # A fresh process without TRITON_INTERPRET: under the CPU interpreter (root conftest) jit
    # functions are interpreted Python, which the Gluon compiler refuses.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(head_d), out_dtype, variant], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout)
    # Q·Kᵀ as INT8 and P·V as e4m3 warpgroup MMAs, K/V through TMA, registers moved to the consumer.
    assert "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8" in compiled["ptx"]
    assert f"wgmma.mma_async.sync.aligned.m64n{head_d}k32.f32.e4m3.e4m3" in compiled["ptx"]
    assert "cp.async.bulk.tensor" in compiled["ptx"] and "setmaxnreg.inc" in compiled["ptx"]
    assert compiled["shared"] <= 227 * 1024


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _run_both(shape, dtype, scores_by_add=None):
    """(q, k, v, plain-Triton output, Gluon output) on the same prepared inputs; scores_by_add: the
    plain kernel's plan with the integer-add conversion forced on or off (None: as the plan has it)."""
    from sagevideo.kernels.attention_fwd import attention_forward
    from sagevideo.kernels.attention_sm90 import attention_forward_sm90
    from sagevideo.kernels.plans import gluon_stages, plain_triton, select_plan
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.rotation import hadamard_pm1

    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen).to(dtype) for _ in range(3))
    k[..., 3] += 8.0  # a K channel offset: smoothing matters
    b, h, n, d = shape
    plan = plain_triton(select_plan(q.device, d, "fp8").plan)
    if scores_by_add is not None:
        plan = dataclasses.replace(plan, scores_by_add=scores_by_add)
    rotation = hadamard_pm1(plan.block_d, q.device, q.dtype)

    prepared = quantize_inputs(q, k, v, None, rotation, plan, sm_scale=d**-0.5, per_token=False, smooth_k=True,
                               need_shift=False)
    plain = torch.empty_like(q)
    attention_forward(prepared, v, None, plain, None, plan, is_causal=False, per_token=False, n_q=n, n_k=n)
    gluon = torch.full_like(q, float("nan"))
    attention_forward_sm90(prepared, gluon, block_n=plan.block_n, n_q=n, n_k=n, num_stages=gluon_stages(plan.block_d))
    return q, k, v, plain, gluon


def _worst_cosine(ref, out):
    return F.cosine_similarity(ref.float().flatten(2), out.float().flatten(2), dim=-1).min().item()


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm90 GPU")
@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((1, 2, 1000, 64), torch.float16),  # partial last key tile, d64
        ((2, 3, 777, 128), torch.bfloat16),  # d128, rows past the last 64-row Q tile
        ((1, 2, 300, 80), torch.float16),  # head dim padded to 128: only 80 columns written
        ((1, 1, 100, 64), torch.float16),  # one key tile, shorter than a tile
        ((2, 30, 17776, 64), torch.bfloat16),  # CogVideoX-2B size
        ((1, 8, 32768, 128), torch.bfloat16),  # long d128
    ],
)
def test_matches_plain_triton_kernel(shape, dtype):
    q, k, v, plain, gluon = _run_both(shape, dtype)
    assert torch.isfinite(gluon).all(), "rows or columns left unwritten"
    assert _worst_cosine(plain, gluon) >= 0.99999
    assert (gluon.float() - plain.float()).abs().max().item() <= 8e-3
    assert _worst_cosine(_fp32_sdpa(q, k, v), gluon) >= 0.998


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("shape", [(1, 2, 1000, 64), (2, 3, 777, 128), (2, 30, 17776, 64)])
def test_scores_by_add_matches_i2f(shape):
    """The plain kernel converting scores by an integer add agrees with its I2F conversion and with
    the Gluon kernel (I2F): the same numbers up to one rounding per row and tile."""
    q, k, v, plain_add, gluon = _run_both(shape, torch.bfloat16, scores_by_add=True)
    *_, plain_i2f, _ = _run_both(shape, torch.bfloat16, scores_by_add=False)
    for out in (plain_add, gluon):
        assert torch.isfinite(out).all()
        assert _worst_cosine(plain_i2f, out) >= 0.99999
        assert (out.float() - plain_i2f.float()).abs().max().item() <= 8e-3
    assert _worst_cosine(_fp32_sdpa(q, k, v), plain_add) >= 0.998


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("shape, lists_batch", [((1, 2, 1000, 128), 1), ((2, 3, 777, 128), 2),
                                               ((2, 3, 777, 128), 1), ((1, 4, 8192, 128), 1)])
def test_block_sparse_matches_the_plain_kernel_on_the_same_lists(shape, lists_batch):
    """Tile lists (one per batch row, or one for every row): the Gluon kernel visits the listed key
    tiles as the plain kernel does, the partial last key tile listed or not, an empty list gives 0."""
    from sagevideo.kernels.attention_fwd import attention_forward
    from sagevideo.kernels.attention_sm90 import attention_forward_sm90
    from sagevideo.kernels.plans import gluon_stages, plain_triton, select_plan
    from sagevideo.kernels.quantize import quantize_inputs
    from sagevideo.kernels.rotation import hadamard_pm1
    from sagevideo.kernels.sparse_reference import TileMask

    gen = torch.Generator("cuda").manual_seed(2)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    b, h, n, d = shape
    plan = plain_triton(select_plan(q.device, d, "fp8").plan)
    m_tiles, n_tiles = -(-n // plan.block_m), -(-n // plan.block_n)
    keep = torch.rand(lists_batch, h, m_tiles, n_tiles, device="cuda", generator=gen) < 0.4
    keep[..., ::3, -1] = True  # the partial last key tile in some lists
    keep[..., 1::3, -1] = False  # and not in others
    keep[0, 0, 0] = False  # an empty list
    keep[0, -1, -1] = True  # a full one
    lists = TileMask(keep, plan.block_m, plan.block_n, n, n).padded_lists()
    prepared = quantize_inputs(q, k, v, None, hadamard_pm1(plan.block_d, q.device, q.dtype), plan, sm_scale=d**-0.5,
                               per_token=False, smooth_k=True, need_shift=False)
    plain = torch.empty_like(q)
    attention_forward(prepared, v, None, plain, None, plan, is_causal=False, per_token=False, n_q=n, n_k=n,
                      tile_lists=lists)
    gluon = torch.full_like(q, float("nan"))
    attention_forward_sm90(prepared, gluon, block_n=plan.block_n, n_q=n, n_k=n, num_stages=gluon_stages(d),
                           tile_lists=lists)
    assert torch.isfinite(gluon).all(), "rows or columns left unwritten"
    assert (gluon[0, 0, : plan.block_m] == 0).all() and (plain[0, 0, : plan.block_m] == 0).all()
    assert (gluon.float() - plain.float()).abs().max().item() <= 8e-3
    assert _worst_cosine(plain[:, :, plan.block_m:], gluon[:, :, plan.block_m:]) >= 0.99999
    dense = torch.empty_like(q)
    attention_forward_sm90(prepared, dense, block_n=plan.block_n, n_q=n, n_k=n, num_stages=gluon_stages(d))
    last_tile = slice((m_tiles - 1) * plan.block_m, n)
    assert (gluon[0, -1, last_tile].float() - dense[0, -1, last_tile].float()).abs().max().item() <= 8e-3  # full list
    assert (gluon.float() - dense.float()).abs().max().item() > 1e-2  # the lists do skip tiles


def _fp32_sdpa(q, k, v):
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    for h in range(q.shape[1]):  # one head at a time: bounded memory at 32k tokens
        out[:, h : h + 1] = F.scaled_dot_product_attention(*(t[:, h : h + 1].float() for t in (q, k, v)))
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm90 GPU")
def test_sageattn_runs_the_gluon_kernel_when_the_plan_names_it(monkeypatch):
    from sagevideo import last_backend, sageattn

    gen = torch.Generator("cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 4, 3000, 128, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", "gluon")
    out = sageattn(q, k, v, pv="fp8")
    assert last_backend().label == "gluon/fp8"
    sageattn(q, k, v, pv="fp8", is_causal=True)  # a call it does not implement: the plain kernel, recorded
    assert last_backend().label == "triton/fp8"
    monkeypatch.setenv("SAGEVIDEO_SM90_KERNEL", "triton")
    plain = sageattn(q, k, v, pv="fp8")
    assert last_backend().label == "triton/fp8"
    assert _worst_cosine(plain, out) >= 0.99999
    assert (out.float() - plain.float()).abs().max().item() <= 8e-3
