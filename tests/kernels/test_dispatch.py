"""kernels/dispatch.py: the one entry that resolves a call to a kernel and its plan (CPU: Hopper
simulated by its capability: conftest's `hopper`)."""

import pytest
import torch

from sagevideo.kernels import plans
from sagevideo.kernels.dispatch import kernel_for

CUDA = torch.device("cuda", 0)
PLAIN_CALL = dict(is_causal=False, has_mask=False, per_token=False, return_lse=False)


def test_a_plain_fp8_call_at_d128_on_hopper_runs_the_gluon_kernel_under_its_plan(hopper):
    choice = kernel_for(CUDA, 128, "fp8", **PLAIN_CALL)
    assert choice.kernel == "gluon" and choice.plan == plans.select_plan(CUDA, 128, "fp8").plan


@pytest.mark.parametrize("feature", sorted(PLAIN_CALL))
def test_a_call_the_gluon_kernel_does_not_implement_runs_plain_triton_with_the_same_tiles(hopper, feature):
    gluon = plans.select_plan(CUDA, 128, "fp8").plan
    choice = kernel_for(CUDA, 128, "fp8", **{**PLAIN_CALL, feature: True})
    assert choice.kernel == "triton" and choice.plan == plans.plain_triton(gluon)
    assert (choice.plan.block_m, choice.plan.block_n) == (gluon.block_m, gluon.block_n)


def test_a_block_sparse_call_takes_the_plan_a_dense_one_takes(hopper):
    """Both kernels take tile lists in the plan's tiles: a sparse call needs no other plan."""
    assert kernel_for(CUDA, 128, "fp8", **PLAIN_CALL).kernel == "gluon"
    assert kernel_for(CUDA, 128, "fp8", has_mask=True).kernel == "triton"  # a key mask: the plain kernel


def test_plans_that_name_plain_triton_are_kept_and_say_why_not_gluon(hopper, monkeypatch):
    assert kernel_for(CUDA, 64, "fp16").plan == plans.select_plan(CUDA, 64, "fp16").plan
    monkeypatch.setattr(plans, "gluon_sm90_compile_problem", lambda block_d, stages: "no compiler here")
    choice = kernel_for(CUDA, 128, "fp8")
    assert choice.kernel == "triton" and "Gluon sm90 kernel not used" in choice.reason


def test_no_plan_is_a_clear_error():
    with pytest.raises(ValueError, match=r"no kernel plan for head dim 256, pv=fp16 on cuda:0: "):
        kernel_for(CUDA, 256, "fp16")
