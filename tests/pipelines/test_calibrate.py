"""Calibration on the tiny CogVideoX: errors per layer and mode, the plan it chooses, peaky layers.
(The `sagevideo calibrate` command: tests/cli/test_calibrate.py.)"""

import pytest
import torch

from sagevideo.pipelines.calibrate import CANDIDATES, calibration_result, probing_router
from sagevideo.pipelines.install import install_router
from sagevideo.pipelines.plans import AttentionPlan, Mode


def calibrate_pipeline(pipe, *, threshold=0.999, capture_steps=None, num_steps=None):
    """Two denoising steps under the probing router, as `sagevideo.calibrate` runs its jobs (through
    a `PipelineHost` there), then the errors and the plan they choose."""
    probe = probing_router(pipe, capture_steps=capture_steps)
    with install_router(pipe, probe):
        pipe("a red panda", num_frames=9, num_inference_steps=2, generator=torch.Generator().manual_seed(0),
             output_type="latent", max_sequence_length=32)
    return calibration_result(probe, pipe, threshold=threshold, num_steps=num_steps)


def test_calibration_measures_every_layer_and_mode(tiny_pipe):
    result = calibrate_pipeline(tiny_pipe, threshold=0.999, num_steps=2)
    layers = [k.removesuffix(".processor") for k in tiny_pipe.transformer.attn_processors]
    assert list(result.errors) == layers
    for errs in result.errors.values():
        assert set(errs) == {c.label for c in CANDIDATES}
        assert all(w.calls == 2 and 0.99 < w.cos <= 1.0 for w in errs.values())  # 2 steps captured
        # 16-bit PV is more accurate than FP8 PV on the same inputs
        assert errs["int8-fp16/block"].cos > errs["int8-fp8/block"].cos
    assert result.plan.default.label == "int8-fp8/block"  # fastest mode meets 0.999 here
    name, worst = result.worst_layer()
    assert name in layers and worst.cos == min(e["int8-fp8/block"].cos for e in result.errors.values())
    assert name in result.table()
    assert "set_timesteps" not in vars(tiny_pipe.scheduler)  # probe removed


def test_threshold_decides_mode_and_full_precision_fallback(tiny_pipe):
    strict = calibrate_pipeline(tiny_pipe, threshold=1.0, num_steps=2)
    assert strict.plan.default.mode is Mode.full  # nothing is exact: every layer keeps full precision
    middle = calibrate_pipeline(tiny_pipe, threshold=0.9999, num_steps=2)
    assert {c.mode for c in middle.chosen.values()} <= {Mode.int8_fp16}
    # the written plan is valid for the model and round-trips
    again = AttentionPlan.from_json(middle.plan.to_json())
    assert again == middle.plan
    again.validate_for(list(middle.errors), num_steps=2)


def test_capture_steps_limit_what_is_measured(tiny_pipe):
    result = calibrate_pipeline(tiny_pipe, capture_steps={1}, num_steps=2)
    assert all(w.calls == 1 and w.step == 1 for errs in result.errors.values() for w in errs.values())
    with pytest.raises(RuntimeError, match="captured no attention call"):
        calibrate_pipeline(tiny_pipe, capture_steps={7}, num_steps=2)


def test_a_peaky_layer_is_flagged_by_name_and_kept_in_full_precision(tiny_pipe):
    """Attention past INT8's resolution (q, k x30: every mode near cosine 0.97) is named, with its
    score std, and kept in full precision; the other layers keep their quantized modes."""
    block = tiny_pipe.transformer.transformer_blocks[0].attn1
    scaled = [t for t in (block.norm_q.weight, block.norm_k.weight) if t is not None] if block.norm_q is not None \
        else [block.to_q.weight, block.to_k.weight]
    saved = [t.detach().clone() for t in scaled]
    try:
        with torch.no_grad():
            for t in scaled:
                t.mul_(30.0)
        result = calibrate_pipeline(tiny_pipe, threshold=0.999, num_steps=2)
    finally:
        with torch.no_grad():
            for t, s in zip(scaled, saved, strict=True):
                t.copy_(s)
    peaky = "transformer_blocks.0.attn1"
    assert list(result.peaky) == [peaky] and "peaky attention: score std" in result.peaky[peaky]
    assert result.chosen[peaky].mode is Mode.full
    assert result.score_std[peaky] > 10 * max(v for k, v in result.score_std.items() if k != peaky)
    assert all(c.mode is not Mode.full for name, c in result.chosen.items() if name != peaky)
    assert peaky in result.peaky_note() and "(peaky)" in result.table()


def test_the_probing_router_runs_torchs_sdpa_also_under_the_global_replacement(monkeypatch):
    """Its full-precision output and fp32 reference are torch's own SDPA, also where user code has
    replaced F.scaled_dot_product_attention with a quantized one (here sagevideo's, reference
    backend), which would otherwise be calibrated against itself."""
    import functools

    import torch.nn.functional as F

    import sagevideo
    from sagevideo.attention.functional import TORCH_SDPA
    from sagevideo.pipelines.calibrate import ProbingRouter

    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        functools.partial(sagevideo.scaled_dot_product_attention, backend="reference"))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=gen) for _ in range(3))
    router = ProbingRouter("reference", capture_steps=None)
    out = router("blocks.0.attn", q.half(), k.half(), v.half())
    assert torch.equal(out, TORCH_SDPA(q.half(), k.half(), v.half()))
    errors = router.errors["blocks.0.attn"]
    assert 0.99 < min(errors[c.label].cos for c in CANDIDATES) < 1.0  # measured against the fp32 reference


@pytest.mark.slow  # three steps with the sparse ladder (about 10 s on CPU)
def test_sparse_proposals_meet_the_budget_on_the_captured_calls_and_keep_the_rest_dense(tiny_pipe):
    """The ladder measured at the sparse steps (from ceil(3/5) = 1 on) on the tiny CogVideoX at 192 px
    (static selection: dynamic keeps every tile of random weights); backend "sdpa" computes each mode
    in full precision restricted to the tiles, so the error is the sparsity's alone, cheaply."""
    from sagevideo.pipelines.calibrate import sparse_ladder
    from sagevideo.pipelines.plans import Sparse

    setting = Sparse(method="static", density=0.2)
    assert [s.density for s in sparse_ladder(setting)] == [0.2, 0.4, 0.8]
    assert [s.density for s in sparse_ladder(Sparse(method="static", density=0.3))] == [0.3, 0.6]
    probe = probing_router(tiny_pipe, backend="sdpa", sparse=setting, num_steps=3)
    with install_router(tiny_pipe, probe):
        tiny_pipe("a red panda", num_frames=9, height=192, width=192, num_inference_steps=3, output_type="latent",
                  generator=torch.Generator().manual_seed(0), max_sequence_length=32)
    first, later = "transformer_blocks.0.attn1", "transformer_blocks.1.attn1"
    errors = probe.sparse_errors[later]
    assert set(errors) == {c.label for c in CANDIDATES}
    measured = errors["int8-fp8/block"]
    assert set(measured) == {0.2, 0.4, 0.8} and all(w.calls == 2 for w in measured.values())  # steps 1 and 2
    assert all(0.0 < w.density < 1.0 and w.cos < 1.0 for w in measured.values())
    assert measured[0.8].cos >= measured[0.2].cos  # denser keeps more (here the same window: a small grid)
    lax = measured[0.2].cos - 1e-6
    result = calibration_result(probe, tiny_pipe, num_steps=3, sparse_budget=lax)
    assert result.sparse.chosen == {later: setting}  # the sparsest density within the budget
    assert "first sparse layer" in result.sparse.dense[first]
    plan = result.plan
    assert [plan.choice_for(later, s).sparse for s in range(3)] == [None, setting, setting]
    assert {plan.choice_for(first, s).sparse for s in range(3)} == {None}
    assert result.sparse.worst()[0] == later and "1 layer(s) sparse (1 at 0.2)" in result.sparse.note()
    strict = calibration_result(probe, tiny_pipe, num_steps=3, sparse_budget=1.0)
    assert strict.sparse.chosen == {} and strict.sparse.dense[later].startswith("over budget: worst cosine")
    assert not strict.plan.uses_sparse  # over-budget layers stay dense: the plan is the dense one


def test_the_sparsest_density_within_the_budget_is_chosen_on_the_layers_own_mode():
    """choose_sparse on measured errors: per layer the chosen mode's ladder, sparsest first."""
    from sagevideo.pipelines.calibrate import ProbingRouter, SparseWorst, choose_sparse, sparse_ladder
    from sagevideo.pipelines.plans import Choice, Sparse

    probe = ProbingRouter("sdpa", None, ladder=sparse_ladder(Sparse(method="dynamic", density=0.1)))
    fp8, fp16 = CANDIDATES[0], CANDIDATES[1]

    def worst(cos, density):
        return SparseWorst(cos=cos, calls=1, density_sum=density)

    probe.sparse_errors = {
        "a": {fp8.label: {0.1: worst(0.95, 0.1), 0.2: worst(0.992, 0.2), 0.4: worst(0.999, 0.4)},
              fp16.label: {0.1: worst(0.995, 0.1), 0.2: worst(0.996, 0.2), 0.4: worst(0.999, 0.4)}},
        "b": {fp16.label: {0.1: worst(0.995, 0.1), 0.2: worst(0.996, 0.2), 0.4: worst(0.999, 0.4)}},
        "c": {fp8.label: {0.1: worst(0.9, 0.1), 0.2: worst(0.95, 0.2), 0.4: worst(0.98, 0.4)}},
        "d": {fp8.label: {0.1: worst(1.0, 1.0), 0.2: worst(1.0, 1.0), 0.4: worst(1.0, 1.0)}},
    }
    probe.not_sparse["e"] = "a layer its family never makes sparse (cross-attention or text only)"
    chosen = {"a": fp8, "b": fp16, "c": fp8, "d": fp8, "e": fp8, "f": Choice(mode=Mode.full), "g": fp8}
    proposal = choose_sparse(probe, chosen, 0.99, dense_layers=("g",))
    assert {name: s.density for name, s in proposal.chosen.items()} == {"a": 0.2, "b": 0.1}
    assert proposal.dense["c"] == "over budget: worst cosine 0.98000 < 0.99 even at density 0.4"
    assert proposal.dense["d"].startswith("nothing to skip") and proposal.dense["e"].startswith("a layer its family")
    assert proposal.dense["f"].startswith("full precision") and "first sparse layer" in proposal.dense["g"]
    assert proposal.worst()[0] == "a" and "2 layer(s) sparse (1 at 0.1, 1 at 0.2), 5 dense" in proposal.note()


def test_the_proposal_tells_how_unevenly_its_head_densities_would_load_ranks_and_what_the_order_does():
    from sagevideo.pipelines.calibrate import SparseProposal
    from sagevideo.pipelines.plans import Sparse

    proposal = SparseProposal(0.99, (), {})
    proposal.chosen = {"a": Sparse(method="dynamic", density=0.3, top_p=0.9, head_density=(0.9, 0.8, 0.1, 0.1)),
                       "b": Sparse(method="dynamic", density=0.3, top_p=0.9, head_density=(0.2, 0.2, 0.2, 0.2)),
                       "c": Sparse(method="dynamic", density=0.3)}  # no densities: not counted
    balance = proposal.rank_balance()
    assert set(balance) == {2, 4}  # 8 ranks do not split 4 heads
    assert balance[2] == (pytest.approx(1.7 / 0.95), pytest.approx(1.0 / 0.95))  # layer a is the worst
    assert balance[4] == (pytest.approx(0.9 / 0.475),) * 2  # one head a rank: no order helps


PLANTED_GRID = (4, 16, 32)


def _planted_call(sharpness: float, seed: int):
    """Planted q, k, v (1, 2, 2048, 64) on PLANTED_GRID (no text): raster tiles self-similar enough that
    the dynamic selection judges them; sharper attention reaches a lower density at the same top_p."""
    from sagevideo.eval.numerics.planted import PlantedSpec, planted_inputs

    spec = PlantedSpec(batch=1, heads=2, frames=PLANTED_GRID[0], height=PLANTED_GRID[1], width=PLANTED_GRID[2],
                       head_dim=64, stripe_every=2, lengthscale=(3.0, 32.0, 32.0), sharpness=sharpness, seed=seed)
    made = planted_inputs(spec)
    return made.q, made.k, made.v


def test_calibrated_top_ps_reach_the_proposed_density_on_the_captured_calls_and_their_error_is_measured():
    """A dynamic ladder in two passes over the same calls (two steps of planted attention, one sharper):
    the proposed plan's top_p is the grid top_p whose mean density over the captured calls is the
    target (within one grid step's change), the second pass measured exactly that rule (its error and
    density are those of the installed selection at that top_p), and the top_p adapts per call."""
    from sagevideo.attention.accuracy import error_stats
    from sagevideo.attention.functional import sageattn
    from sagevideo.attention.sparse import scores_at
    from sagevideo.pipelines.calibrate import (
        TOP_P_STEPS,
        ProbingRouter,
        choose_plan,
        choose_sparse,
        sparse_ladder,
        top_p_router,
    )
    from sagevideo.pipelines.plans import Sparse

    layer, target = "blocks.1.attn1", 0.5
    calls = {1: _planted_call(6.0, 0), 2: _planted_call(14.0, 1)}  # step 0 stays dense (ceil(3/5) = 1)
    probe = ProbingRouter("sdpa", None, ladder=sparse_ladder(Sparse(method="dynamic", density=target)),
                          sparse_from=1)

    def run(router):
        router.sparse.text[layer] = None  # what install gives a video-only layer, and each forward's grid
        router.sparse.grid = PLANTED_GRID
        for step, (q, k, v) in calls.items():
            router.clock.step = step
            router(layer, q, k, v)

    run(probe)
    assert probe.sparse_errors == {} and set(probe.curves[layer]) == {"fp8", "fp16"}  # no sparse run yet
    second = top_p_router(probe, threshold=0.999)
    assert top_p_router(probe, threshold=0.999, dense_layers=(layer,)).settings == {}
    run(second)
    _, chosen = choose_plan(probe.errors, 0.999, None, None)
    proposal = choose_sparse(probe, chosen, 0.5, dense_layers=())
    sparse = proposal.chosen[layer]
    assert sparse.method == "dynamic" and sparse.density == target and sparse.top_p is not None
    pv = chosen[layer].mode.pv
    masks = [scores_at(q, k, pv=pv).keep(sparse.top_p) for q, k, _ in calls.values()]
    reached = sum(m.density for m in masks) / len(masks)
    step_down = [scores_at(q, k, pv=pv).keep(sparse.top_p - 1 / TOP_P_STEPS).density for q, k, _ in calls.values()]
    assert abs(reached - target) <= abs(sum(step_down) / 2 - target) + 1e-9  # the closest on the grid
    assert abs(reached - target) < 0.02
    assert masks[0].density > masks[1].density + 0.02  # one top_p: the diffuse call keeps more
    # each head's mean density over the calls, for balancing sequence-parallel ranks (4 decimals)
    per_head = sum(m.density_per_head()[0] for m in masks) / len(masks)
    assert sparse.head_density == pytest.approx(per_head.tolist(), abs=5e-5) and len(sparse.head_density) == 2
    measured = proposal.errors[layer][proposal.modes[layer]][target]
    assert measured.top_p == sparse.top_p and measured.calls == 2 and measured.density == pytest.approx(reached)
    worst = 1.0
    for (q, k, v), mask in zip(calls.values(), masks, strict=True):
        kwargs = dict(pv=pv, qk_granularity=chosen[layer].granularity.value, backend="sdpa")
        sparse_out = sageattn(q, k, v, tile_mask=mask, **kwargs)
        worst = min(worst, error_stats(sageattn(q, k, v, **kwargs), sparse_out).cos_worst)
    assert measured.cos == pytest.approx(worst) and measured.cos < 1.0
    assert f"top_p {sparse.top_p:g}" in proposal.note() and f"{sparse.top_p:.6f}" in proposal.table()
    # the installed probe's columns: their mass per call and head, mean and worst, shown in the table
    column_masses = [scores_at(q, k, pv=pv).probe_column_mass for q, k, _ in calls.values()]
    mean, worst_head = sum(float(m.mean()) for m in column_masses) / 2, max(float(m.max()) for m in column_masses)
    assert proposal.column_mass[layer] == pytest.approx((mean, worst_head)) and 0 < mean <= worst_head < 1
    assert f"{mean:.3f}/{worst_head:.3f}" in proposal.table()


@pytest.mark.parametrize("reuse_meets_budget", [True, False])
def test_a_measured_reuse_runs_the_selecting_steps_lists_and_is_proposed_within_the_budget(reuse_meets_budget):
    """With reuse over 2 steps from sparse_from 1: step 1 selects, step 2 also attends on step 1's lists
    (the same forward's), and that error (against step 2's dense output) is what decides: within the
    budget the layer's proposal reuses (reuse_steps 2, '*' in the table), else it selects every step."""
    from sagevideo.attention.accuracy import error_stats
    from sagevideo.attention.functional import sageattn
    from sagevideo.pipelines.calibrate import ProbingRouter, choose_plan, choose_sparse, sparse_ladder, top_p_router
    from sagevideo.pipelines.plans import Sparse

    layer = "blocks.1.attn1"
    calls = {1: _planted_call(6.0, 0), 2: _planted_call(14.0, 1)}
    probe = ProbingRouter("sdpa", None, ladder=sparse_ladder(Sparse(method="dynamic", density=0.5)), sparse_from=1)

    def run(router):
        router.sparse.text[layer] = None
        router.sparse.grid = PLANTED_GRID
        for step, (q, k, v) in calls.items():
            router.clock.step = step
            router(layer, q, k, v)

    run(probe)
    second = top_p_router(probe, threshold=0.999, reuse_steps=2)
    run(second)
    _, chosen = choose_plan(probe.errors, 0.999, None, None)
    label = chosen[layer].label
    reused, fresh = probe.reuse_errors[layer][label][0.5], probe.sparse_errors[layer][label][0.5]
    budget = reused.cos if reuse_meets_budget else (reused.cos + fresh.cos) / 2  # fresh lists meet both
    proposal = choose_sparse(probe, chosen, budget, dense_layers=())
    kept_mask = second.kept[(layer, -1, 0.5)]  # step 1's selection (no forward hook here: forward -1)
    q, k, v = calls[2]
    kwargs = dict(pv=chosen[layer].mode.pv, qk_granularity=chosen[layer].granularity.value, backend="sdpa")
    want = error_stats(sageattn(q, k, v, **kwargs), sageattn(q, k, v, tile_mask=kept_mask, **kwargs)).cos_worst
    assert reused.calls == 1 and reused.step == 2 and reused.cos == pytest.approx(want)
    assert reused.cos < fresh.cos < 1.0  # stale lists cost more here
    assert proposal.chosen[layer].density == 0.5 and proposal.reused[layer] is reused
    if reuse_meets_budget:
        assert proposal.chosen[layer].reuse_steps == 2 and f"{reused.cos:.5f}*" in proposal.table()
        assert "1 of them reuse their lists for 2 steps" in proposal.note()
    else:
        assert proposal.chosen[layer].reuse_steps is None and f"{reused.cos:.5f} " in proposal.table()
        assert "0 of them reuse their lists" in proposal.note()
