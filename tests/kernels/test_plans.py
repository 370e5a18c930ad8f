"""Kernel plans: which kernel computes a call on each arch (CPU: the GPU is simulated by its capability)."""

import pytest
import torch

from sagevideo.kernels import plans
from sagevideo.kernels.op import gluon_runs

CUDA = torch.device("cuda", 0)


def test_auto_takes_gluon_only_where_it_measured_faster(hopper, monkeypatch):
    gluon = plans.select_plan(CUDA, 128, "fp8").plan  # default: auto
    assert gluon.kernel == "gluon" and "kernel=gluon" in gluon.describe()
    assert plans.select_plan(CUDA, 96, "fp8").plan.kernel == "gluon"  # padded to 128
    for head_dim, pv in ((64, "fp8"), (128, "fp16"), (64, "fp16")):  # slower or not implemented there
        assert plans.select_plan(CUDA, head_dim, pv).plan.kernel == "triton"
    plain = plans.plain_triton(gluon)
    # Same tiles (the same quantization groups and results); only the kernel and its launch differ.
    assert plain == plans.KernelPlan("sm90", 128, "fp8", 64, 128, 4, 3) == gluon.__class__(
        "sm90", 128, "fp8", gluon.block_m, gluon.block_n, 4, 3)
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "triton")
    assert plans.select_plan(CUDA, 128, "fp8").plan == plain


def test_gluon_choice_takes_every_fp8_shape(hopper, monkeypatch):
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "gluon")
    assert plans.select_plan(CUDA, 64, "fp8").plan.kernel == "gluon"
    assert plans.select_plan(CUDA, 128, "fp8").plan.kernel == "gluon"
    assert plans.select_plan(CUDA, 64, "fp16").plan.kernel == "triton"  # FP8 PV only


@pytest.mark.parametrize("choice", ["auto", "gluon"])
def test_only_hopper_gets_the_gluon_kernel(monkeypatch, choice):
    """Blackwell (10.x, 12.x) runs the sm90 plans, but the Gluon kernel's wgmma is Hopper-only."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, choice)
    monkeypatch.setattr(plans, "gluon_sm90_compile_problem", lambda block_d, stages: "")
    for capability in ((8, 9), (10, 0), (12, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability: c)
        assert plans.select_plan(CUDA, 128, "fp8").plan.kernel == "triton", capability
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert plans.select_plan(CUDA, 128, "fp8").plan.kernel == "gluon"


def test_a_misspelt_choice_is_refused(hopper, monkeypatch):
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "glun")
    with pytest.raises(ValueError, match=r"SAGEVIDEO_SM90_KERNEL='glun': use one of \('auto', 'triton', 'gluon'\)"):
        plans.select_plan(CUDA, 128, "fp8")


def test_without_the_gluon_api_the_plain_kernel_runs_and_says_why(hopper, monkeypatch):
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "gluon")
    monkeypatch.setattr(plans, "gluon_sm90_problem", lambda: "this Triton has no Gluon Hopper API (test)")
    choice = plans.select_plan(CUDA, 128, "fp8")
    assert choice.plan.kernel == "triton"
    assert choice.reason == ("Gluon sm90 kernel not used (SAGEVIDEO_SM90_KERNEL=gluon): "
                             "this Triton has no Gluon Hopper API (test)")


def test_a_kernel_that_does_not_compile_keeps_the_plain_kernel_and_says_why(hopper, monkeypatch):
    monkeypatch.setattr(plans, "gluon_sm90_compile_problem",
                        lambda block_d, stages: f"the Gluon kernel does not compile (d{block_d}, {stages} stages)")
    choice = plans.select_plan(CUDA, 128, "fp8")  # auto
    assert choice.plan.kernel == "triton"
    assert choice.reason == ("Gluon sm90 kernel not used (SAGEVIDEO_SM90_KERNEL=auto): "
                             "the Gluon kernel does not compile (d128, 2 stages)")


def test_the_compile_check_reports_a_failure_instead_of_raising(monkeypatch):
    from sagevideo.kernels import attention_sm90

    def broken(*args, **kwargs):
        raise RuntimeError("PassManager::run failed\nerror: unsupported layout")

    monkeypatch.setattr(attention_sm90, "compile_for_sm90", broken)
    plans.gluon_sm90_compile_problem.cache_clear()
    try:
        problem = plans.gluon_sm90_compile_problem(128, 2)
    finally:
        plans.gluon_sm90_compile_problem.cache_clear()
    assert problem.startswith("the Gluon kernel does not compile with triton ")
    assert problem.endswith("(RuntimeError: error: unsupported layout)")


def test_this_triton_has_the_gluon_api():
    assert plans.gluon_sm90_problem() == ""  # the pinned Triton; the GPU image's 3.6 is checked on the GPU


def test_gluon_takes_only_the_calls_it_implements(hopper, monkeypatch):
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, "gluon")
    plan = plans.select_plan(CUDA, 128, "fp8").plan
    plain = dict(is_causal=False, has_mask=False, per_token=False, return_lse=False)
    assert gluon_runs(plan, **plain)
    for feature in plain:
        assert not gluon_runs(plan, **{**plain, feature: True}), feature
    assert not gluon_runs(plans.plain_triton(plan), **plain)


def test_launch_can_differ_by_pv_mode_but_tiles_do_not(hopper):
    fp16, fp8 = (plans.select_plan(CUDA, 64, pv).plan for pv in ("fp16", "fp8"))
    assert (fp16.num_warps, fp8.num_warps) == (8, 4)  # the H200 sweep's best per mode
    assert (fp16.max_registers, fp8.max_registers) == (None, 128) and "maxnreg=128" in fp8.describe()
    assert plans.plain_triton(fp8) == fp8
    assert (fp16.block_m, fp16.block_n) == plans.tiles("fp16", 64)
    assert plans.plain_triton(fp16) == fp16


def test_scores_by_add_only_where_it_measured_faster(hopper, monkeypatch):
    d64 = plans.select_plan(CUDA, 64, "fp8").plan
    assert d64.scores_by_add and "scores-by-add" in d64.describe()
    gluon = plans.select_plan(CUDA, 128, "fp8").plan
    for plan in (gluon, plans.plain_triton(gluon), plans.select_plan(CUDA, 64, "fp16").plan):
        assert not plan.scores_by_add and "scores-by-add" not in plan.describe()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert not plans.select_plan(CUDA, 64, "fp8").plan.scores_by_add  # measured on sm90 only


def test_a_gluon_plan_takes_no_plain_kernel_knobs():
    with pytest.raises(ValueError, match="Gluon sm90 kernel runs FP8 PV with its own launch"):
        plans.KernelPlan("sm90", 64, "fp8", 64, 128, 4, 2, kernel="gluon", scores_by_add=True)
    with pytest.raises(ValueError, match="Gluon"):
        plans.KernelPlan("sm90", 64, "fp16", 128, 64, 4, 2, kernel="gluon")
    with pytest.raises(ValueError, match="kernel='cuda'"):
        plans.KernelPlan("sm90", 64, "fp8", 64, 128, 4, 2, kernel="cuda")


@pytest.mark.parametrize(
    "pv, block_d, stats",
    [("fp16", 64, (512, 32, 4)), ("fp8", 64, (512, 32, 4)), ("fp16", 128, (512, 32, 4)), ("fp8", 128, (256, 64, 4))],
)
def test_prep_plans_follow_the_tiles_and_pv_mode(hopper, pv, block_d, stats):
    """The preparation's launch shape per plan: the tables the sweeps chose (64-row stats chunks when K
    and V are read at d128; 4 warps for every quantization tile, measured on the H100)."""
    prep = plans.prep_plan(plans.select_plan(CUDA, block_d, pv).plan)
    assert (prep.stats_min_tokens, prep.stats_chunk, prep.stats_warps) == stats
    assert (prep.kv_warps, prep.q_warps) == (4, 4)
    assert (prep.kv_tiles_per_program, prep.q_tiles_per_program, prep.max_splits) == (1, 4, 128)


def test_tiles_per_program_keep_sixteen_programs_per_head():
    prep = plans.prep_plan(plans.KernelPlan("interpreter", 64, "fp16", 128, 64, 4, 1))
    assert [prep.tiles_per_program(n, 4) for n in (1, 16, 47, 48, 64, 1000)] == [1, 1, 2, 3, 4, 4]


@pytest.mark.parametrize("wanted", ["auto", "gluon", "triton"])
def test_select_plan_traces_into_one_graph_on_hopper(hopper, monkeypatch, wanted):
    """torch.compile traces `sageattn`, so `select_plan` too: the Gluon checks are taken as constants
    while tracing (`gluon_problem`), not traced into. Traced, the cached compile check (Dynamo looks
    through functools.cache) graph-broke in every FP8 call on Hopper and failed fullgraph=True; the
    stand-in below calls what Dynamo cannot trace, as the real check's Triton compile does."""
    import threading

    from torch._dynamo.utils import counters

    checked = []

    def untraceable_check(block_d, stages):
        checked.append((block_d, stages, threading.get_ident()))
        return ""

    monkeypatch.setattr(plans, "gluon_sm90_compile_problem", untraceable_check)
    monkeypatch.setenv(plans.SM90_KERNEL_ENV, wanted)

    def attend(x):
        plan = plans.select_plan(CUDA, x.shape[-1], "fp8").plan
        return x * (2.0 if plan.kernel == "gluon" else 3.0)

    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(attend, fullgraph=True, backend="eager")(torch.ones(2, 128))
    assert dict(counters["graph_break"]) == {}
    assert out.tolist() == [[3.0 if wanted == "triton" else 2.0] * 128] * 2
    assert [c[:2] for c in checked] == ([] if wanted == "triton" else [(128, 2)])
    torch._dynamo.reset()


def test_device_kernel_names_are_the_kernel_modules_jitted_kernels():
    """The names profilers attribute to attention are every jitted `*_kernel` of the kernel modules."""
    import importlib

    found = set()
    for module in ("attention_fwd", "attention_sm90", "quantize", "tile_select_kernel"):
        mod = importlib.import_module(f"sagevideo.kernels.{module}")
        for name, value in vars(mod).items():
            if name.endswith("_kernel") and hasattr(value, "fn"):  # a triton / gluon JITFunction
                found.add(name)
    assert found == set(plans.DEVICE_KERNELS)


def test_a_pooling_q_program_quantizes_one_tile():
    """The Gram pooling looping over Q tiles miscompiled for sm_90 (docs/sparse.md): with pool, one
    tile a program, whatever the plan allows; without, the plan's most."""
    prep = plans.prep_plan(plans.KernelPlan("interpreter", 64, "fp16", 128, 64, 4, 1))
    assert prep.most_q_tiles(pool=True) == 1 and prep.tiles_per_program(10_000, prep.most_q_tiles(True)) == 1
    assert prep.most_q_tiles(pool=False) == prep.q_tiles_per_program == 4
