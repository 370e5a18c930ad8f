"""The sm90 Gluon kernel (`kernels/attention_sm90.py`) against the plain-Triton kernel.

On any machine: both schedules compile for sm_90 (Gluon cannot run under TRITON_INTERPRET, so this is
where layout and type errors surface without a GPU). On an sm90 GPU (`pytest -m gpu`): on the same
quantized inputs it computes what the plain-Triton kernel computes (same tiles and numerics; only
fp32 summation order differs), and holds the FP8-PV floor of DESIGN §2 against fp32 SDPA.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

_COMPILE = """
import json, sys
from sagevideo.kernels import attention_sm90
kernel = attention_sm90.compile_for_sm90(int(sys.argv[1]), pipeline_qk=sys.argv[2] == "1", consumers=int(sys.argv[3]),
                                        v_mma_order=sys.argv[4] == "1", scores_by_add=sys.argv[5] == "1")
print(json.dumps({"ptx": kernel.asm["ptx"], "shared": kernel.metadata.shared}))
"""


@pytest.mark.parametrize(
    "head_d, pipeline_qk, consumers, v_mma_order, scores_by_add",
    [(64, False, 1, True, False), (64, True, 2, True, True), (128, True, 1, False, False), (128, False, 1, True, True)],
)
def test_compiles_for_sm90_on_any_machine(head_d, pipeline_qk, consumers, v_mma_order, scores_by_add):
    # A fresh process without TRITON_INTERPRET: under the CPU interpreter (root conftest) jit
    # functions are interpreted Python, which the Gluon compiler refuses.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    args = [str(head_d), str(int(pipeline_qk)), str(consumers), str(int(v_mma_order)), str(int(scores_by_add))]
    done = subprocess.run([sys.executable, "-c", _COMPILE, *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout)
    # Q·Kᵀ as INT8 and P·V as e4m3 warpgroup MMAs, K/V through TMA, registers moved to the consumers.
    assert "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8" in compiled["ptx"]
    assert f"wgmma.mma_async.sync.aligned.m64n{head_d}k32.f32.e4m3.e4m3" in compiled["ptx"]
    assert "cp.async.bulk.tensor" in compiled["ptx"] and "setmaxnreg.inc" in compiled["ptx"]
    assert compiled["shared"] <= 227 * 1024
    # scores_by_add: the int32 scores become fp32 by adding 1.5·2^23's bits (0x4B400000)
    assert ("1262485504" in compiled["ptx"]) == scores_by_add


_PIPELINED_SASS = """
import sys
sys.path.insert(0, sys.argv[2])
import json
from sass_loop_mix import disassemble, instructions
from sagevideo.kernels import attention_sm90
sass = disassemble(attention_sm90.compile_for_sm90(int(sys.argv[1]), pipeline_qk=True, consumers=1).asm["cubin"])
print(json.dumps([text for _, text in instructions(sass)]))
"""


@pytest.mark.parametrize("head_d", [64, 128])
def test_pipelined_schedule_overlaps_the_softmax_with_the_previous_pv_mma(head_d):
    """FA3's intra-warpgroup schedule overlaps only if the wait for P_{j-1}·V_{j-1} stays after tile
    j's softmax in the machine code; ptxas moved it up to S_j's wait until `_ordered_after` pinned
    it. In the SASS, a tile's exponentials lie between the two waits, with no spills there."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    scripts = str(Path(__file__).parents[2] / "scripts")
    done = subprocess.run([sys.executable, "-c", _PIPELINED_SASS, str(head_d), scripts], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    code = json.loads(done.stdout)  # instructions in order, guard predicates removed
    # The first wait that leaves one MMA group in flight (P_{j-1}·V_{j-1}), then the next wait.
    one = next(i for i, ins in enumerate(code) if ins.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1"))
    zero = next(i for i in range(one + 1, len(code)) if code[i].startswith("WARPGROUP.DEPBAR"))
    between = code[one:zero]
    exps = sum(ins.startswith("MUFU.EX2") for ins in between)
    assert exps >= 64, f"{exps} exponentials between the waits: P_(j-1)·V_(j-1) is waited for before the softmax"
    assert not [ins for ins in between if ins.startswith(("LDL", "STL"))], "the pipelined loop spills"


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _run_both(shape, dtype, pipeline_qk, consumers, scores_by_add=None):
    from sagevideo.kernels.attention_fwd import attention_forward
    from sagevideo.kernels.plans import plain_triton, select_plan
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
    from sagevideo.kernels.attention_sm90 import attention_forward_sm90

    gluon = torch.full_like(q, float("nan"))
    attention_forward_sm90(prepared, gluon, block_n=plan.block_n, n_q=n, n_k=n, pipeline_qk=pipeline_qk,
                           consumers=consumers, scores_by_add=plan.scores_by_add)
    return q, k, v, plain, gluon


def _worst_cosine(ref, out):
    return F.cosine_similarity(ref.float().flatten(2), out.float().flatten(2), dim=-1).min().item()


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("pipeline_qk, consumers", [(False, 1), (True, 1), (False, 2), (True, 2)])
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
def test_matches_plain_triton_kernel(shape, dtype, pipeline_qk, consumers):
    q, k, v, plain, gluon = _run_both(shape, dtype, pipeline_qk, consumers)
    assert torch.isfinite(gluon).all(), "rows or columns left unwritten"
    assert _worst_cosine(plain, gluon) >= 0.99999
    assert (gluon.float() - plain.float()).abs().max().item() <= 8e-3
    assert _worst_cosine(_fp32_sdpa(q, k, v), gluon) >= 0.998


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("pipeline_qk", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 1000, 64), (2, 3, 777, 128), (2, 30, 17776, 64)])
def test_scores_by_add_matches_i2f_in_both_kernels(shape, pipeline_qk):
    """Both kernels converting scores by an integer add agree with each other and with the I2F
    conversion (the plain kernel without it): the same numbers up to one rounding per row and tile."""
    q, k, v, plain_add, gluon_add = _run_both(shape, torch.bfloat16, pipeline_qk, 1, scores_by_add=True)
    *_, plain_i2f, _ = _run_both(shape, torch.bfloat16, pipeline_qk, 1, scores_by_add=False)
    for out in (plain_add, gluon_add):
        assert torch.isfinite(out).all()
        assert _worst_cosine(plain_i2f, out) >= 0.99999
        assert (out.float() - plain_i2f.float()).abs().max().item() <= 8e-3
    assert _worst_cosine(_fp32_sdpa(q, k, v), gluon_add) >= 0.998


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
