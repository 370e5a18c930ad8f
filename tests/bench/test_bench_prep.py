"""bench/bench_prep.py's sweep variants: PrepPlans derived from the plan's (no module state)."""

from bench import bench_prep
from sagevideo.kernels import plans


def test_variants_replace_the_plans_fields_and_auto_keeps_them():
    base = plans.prep_plan(plans.KernelPlan("sm90", 128, "fp8", 64, 128, 4, 2, kernel="gluon"))
    assert bench_prep.prep_variant(base, None, None, "auto", None) == base
    variant = bench_prep.prep_variant(base, 4, 2, "512:128:8", 1)
    assert (variant.kv_warps, variant.q_warps) == (4, 4)
    assert (variant.kv_tiles_per_program, variant.q_tiles_per_program) == (2, 1)
    assert (variant.stats_min_tokens, variant.stats_chunk, variant.stats_warps) == (512, 128, 8)
    assert plans.prep_plan(plans.KernelPlan("sm90", 128, "fp8", 64, 128, 4, 2, kernel="gluon")) == base  # untouched
