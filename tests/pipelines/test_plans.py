"""Attention plans: JSON round trip, validation, per-layer/per-step choices, and plans in a pipeline."""

import json

import pytest
import torch

import sagevideo
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Override, PlanError, Sparse, dense_steps

LAYERS = ("transformer_blocks.0.attn1", "transformer_blocks.1.attn1")


def _plan(**kw):
    base = {
        "model": "CogVideoXTransformer3DModel",
        "layers": list(LAYERS),
        "num_steps": 4,
        "default": {"mode": "int8-fp8"},
        "overrides": [
            {"layers": [LAYERS[0]], "mode": "full"},
            {"steps": [0, 1], "mode": "int8-fp16", "granularity": "token"},
        ],
    }
    base.update(kw)
    return base


def test_json_round_trip_is_identical(tmp_path):
    plan = AttentionPlan.model_validate(_plan())
    path = plan.save(tmp_path / "plan.json")
    loaded = AttentionPlan.load(path)
    assert loaded == plan
    assert json.loads(path.read_text())["default"] == {"mode": "int8-fp8", "granularity": "block"}


def test_choices_last_match_wins():
    plan = AttentionPlan.model_validate(_plan())
    assert plan.choice_for(LAYERS[1], 3) == Choice(mode=Mode.int8_fp8)
    assert plan.choice_for(LAYERS[0], 3).mode is Mode.full
    assert plan.choice_for(LAYERS[0], 0) == Choice(mode=Mode.int8_fp16, granularity="token")
    assert plan.choice_for(LAYERS[1], None) == Choice(mode=Mode.int8_fp8)  # step-ranged entries need a step


def test_reuse_steps_round_trips_and_one_is_the_default_left_unwritten(tmp_path):
    reusing = {**SPARSE, "reuse_steps": 3}
    plan = AttentionPlan.model_validate(_plan(default={"mode": "int8-fp8", "sparse": reusing}))
    loaded = AttentionPlan.load(plan.save(tmp_path / "reuse.json"))
    assert loaded == plan and loaded.default.sparse.reuse_steps == 3
    assert json.loads((tmp_path / "reuse.json").read_text())["default"]["sparse"] == reusing
    assert loaded.default.label == "int8-fp8/block+sparse dynamic:0.15:reuse3"
    assert Sparse.parse("dynamic:0.15:reuse3") == loaded.default.sparse
    once = AttentionPlan.model_validate(_plan(default={"mode": "int8-fp8", "sparse": {**SPARSE, "reuse_steps": 1}}))
    assert once.default.sparse == Sparse(**SPARSE) and "reuse_steps" not in once.to_json()


@pytest.mark.parametrize(
    "change, match",
    [
        ({"overrides": [{"layers": ["nope.attn1"], "mode": "full"}]}, "unknown layer"),
        ({"overrides": [{"steps": [5, 6], "mode": "full"}]}, "num_steps=4"),
        ({"overrides": [{"steps": [3, 1], "mode": "full"}]}, "start < stop"),
        ({"default": {"mode": "int4"}}, "default.mode"),
        ({"default": {"mode": "full", "extra": 1}}, "extra"),
        ({"version": 9}, "version 9"),
        ({"num_steps": 0}, "num_steps"),
    ],
)
def test_bad_plans_are_refused_with_the_field(tmp_path, change, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_plan(**change)))
    with pytest.raises(PlanError, match=match):
        AttentionPlan.load(path)


def test_not_json_and_missing_file():
    with pytest.raises(PlanError, match="not valid JSON"):
        AttentionPlan.from_json("{nope")
    with pytest.raises(PlanError, match="does not exist"):
        AttentionPlan.load("/nonexistent/plan.json")


def test_validate_for_another_model():
    plan = AttentionPlan.model_validate(_plan())
    with pytest.raises(PlanError, match="does not have"):
        plan.validate_for(["blocks.0.attn1"])
    with pytest.raises(PlanError, match="run has 1 steps"):
        AttentionPlan(overrides=(Override(steps=(2, None), mode=Mode.full),)).validate_for([], num_steps=1)


def _latents(pipe, steps=2):
    return pipe(
        "a red panda", num_frames=9, num_inference_steps=steps, generator=torch.Generator().manual_seed(0),
        output_type="latent", max_sequence_length=32, return_dict=False,
    )[0]


def test_plan_in_pipeline_follows_layers_and_steps(tiny_pipe):
    layers = [k.removesuffix(".processor") for k in tiny_pipe.transformer.attn_processors]
    plan = AttentionPlan(
        layers=tuple(layers),
        default=Choice(mode=Mode.int8_fp16),
        overrides=(
            Override(layers=(layers[0],), mode=Mode.full),
            Override(steps=(2, None), mode=Mode.int8_fp8),
        ),
    )
    with sagevideo.install(tiny_pipe, plan, backend="reference") as handle, sagevideo.record_backends() as log:
        _latents(tiny_pipe, steps=3)
        assert handle.router.clock.step == 3
    # steps 0,1: layer0 full, layer1 fp16; step 2: both fp8 (the later override wins)
    assert log.counts == {"sdpa": 2, "reference/fp16": 2, "reference/fp8": 2}
    assert "set_timesteps" not in vars(tiny_pipe.scheduler)  # scheduler wrappers removed


def test_plan_file_path_and_wrong_model_plan(tiny_pipe, tmp_path):
    path = AttentionPlan(default=Choice(mode=Mode.full)).save(tmp_path / "p.json")
    with sagevideo.install(tiny_pipe, path) as handle:
        assert handle.plan.default.mode is Mode.full
    bad = AttentionPlan(layers=("blocks.0.attn1",), overrides=(Override(layers=("blocks.0.attn1",), mode=Mode.full),))
    with pytest.raises(PlanError, match="does not have"):
        sagevideo.install(tiny_pipe, bad)
    assert not hasattr(tiny_pipe.transformer, "_sagevideo_attention")


def test_quantized_pipeline_output_stays_close_to_full_precision(tiny_pipe):
    """Bound: INT8 QK + FP16 PV errors are ~1e-4 in cosine per attention call (DESIGN §2); two
    layers x two steps of a random tiny model keep the latents above 0.999 cosine."""
    full = _latents(tiny_pipe)
    for pv in ("fp16", "fp8"):
        with sagevideo.install(tiny_pipe, pv=pv, backend="reference"):
            quant = _latents(tiny_pipe)
        cos = torch.nn.functional.cosine_similarity(full.flatten(), quant.flatten(), dim=0)
        assert cos > 0.999, (pv, cos)


# --- block-sparse choices (issue 36 stage 4a) ---

SPARSE = {"method": "dynamic", "density": 0.15}


def test_a_sparse_plan_round_trips_as_version_2_and_a_dense_one_stays_version_1(tmp_path):
    plan = AttentionPlan.model_validate(_plan(default={"mode": "int8-fp8", "sparse": SPARSE},
                                              overrides=[{"steps": [0, 1], "mode": "int8-fp8"},
                                                         {"layers": [LAYERS[1]], "mode": "int8-fp16",
                                                          "sparse": {"method": "static", "density": 0.5}}]))
    assert plan.version == 2 and plan.uses_sparse
    loaded = AttentionPlan.load(plan.save(tmp_path / "sparse.json"))
    assert loaded == plan
    assert json.loads((tmp_path / "sparse.json").read_text())["default"]["sparse"] == SPARSE
    assert plan.choice_for(LAYERS[0], 0).sparse is None  # the later override wins as a whole: dense
    assert plan.choice_for(LAYERS[0], 2).sparse == Sparse(method="dynamic", density=0.15)
    assert plan.choice_for(LAYERS[1], 2).label == "int8-fp16/block+sparse static:0.5"
    dense = AttentionPlan.model_validate(_plan())  # an old plan: loads and writes as it always did
    assert dense.version == 1 and not dense.uses_sparse
    assert "sparse" not in dense.to_json() and json.loads(dense.to_json())["version"] == 1


def test_a_calibrated_top_p_round_trips_in_version_2_and_plans_without_it_load_unchanged(tmp_path):
    calibrated = {**SPARSE, "top_p": 0.93125}
    plan = AttentionPlan.model_validate(_plan(overrides=[{"layers": [LAYERS[1]], "steps": [1, None],
                                                          "mode": "int8-fp8", "sparse": calibrated}]))
    assert plan.version == 2
    loaded = AttentionPlan.load(plan.save(tmp_path / "top_p.json"))
    assert loaded == plan and json.loads((tmp_path / "top_p.json").read_text())["overrides"][0]["sparse"] == calibrated
    chosen = loaded.choice_for(LAYERS[1], 2).sparse
    assert chosen == Sparse(method="dynamic", density=0.15, top_p=0.93125)
    assert loaded.choice_for(LAYERS[1], 2).label == "int8-fp8/block+sparse dynamic:0.15 top_p 0.93125"
    assert chosen.text == "dynamic:0.15"  # the --sparse form: a top_p comes from calibrate only
    old = AttentionPlan.model_validate(_plan(default={"mode": "int8-fp8", "sparse": SPARSE}))
    assert old.default.sparse.top_p is None and "top_p" not in old.to_json()


def test_per_head_densities_round_trip_and_must_match_their_layers_head_counts(tmp_path):
    """`head_density` (calibrate's, for balancing sequence-parallel ranks) is saved and read back as given,
    and `head_problems` names a layer whose head count differs (a plan made for another model)."""
    measured = {**SPARSE, "top_p": 0.9, "head_density": [0.31, 0.05, 0.12, 0.2]}
    plan = AttentionPlan.model_validate(_plan(overrides=[{"layers": [LAYERS[1]], "steps": [1, None],
                                                          "mode": "int8-fp8", "sparse": measured}]))
    loaded = AttentionPlan.load(plan.save(tmp_path / "heads.json"))
    assert loaded == plan and loaded.choice_for(LAYERS[1], 1).sparse.head_density == (0.31, 0.05, 0.12, 0.2)
    assert json.loads((tmp_path / "heads.json").read_text())["overrides"][0]["sparse"] == measured
    assert loaded.head_problems({LAYERS[0]: 2, LAYERS[1]: 4}) == []  # LAYERS[0] has no densities
    problems = loaded.head_problems({LAYERS[0]: 4, LAYERS[1]: 8})
    assert len(problems) == 1 and f"4 head densities for layer(s) with another head count, e.g. {LAYERS[1]} (8 heads)" \
        in problems[0] and "Re-run `sagevideo calibrate`" in problems[0]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"default": {"mode": "full", "sparse": SPARSE}}, r"default: sparse: a 'full' choice .* quantized mode"),
        ({"overrides": [{"mode": "full", "sparse": SPARSE}]}, r"overrides\.0: sparse: a 'full' choice"),
        ({"version": 1, "default": {"mode": "int8-fp8", "sparse": SPARSE}}, r"version 2; set \"version\": 2"),
        ({"default": {"mode": "int8-fp8", "sparse": {"method": "random", "density": 0.1}}},
         r"default\.sparse\.method: Input should be 'dynamic' or 'static'"),
        ({"default": {"mode": "int8-fp8", "sparse": {"method": "static", "density": 0}}},
         r"default\.sparse\.density: density 0\.0 must lie in \(0, 1\]"),
        ({"default": {"mode": "int8-fp8", "sparse": {"method": "static"}}},
         r"default\.sparse\.density: Field required"),
        ({"version": 3}, r"version 3 is not supported \(this sagevideo reads versions 1, 2\)"),
        ({"default": {"mode": "int8-fp8", "sparse": {**SPARSE, "top_p": 0}}},
         r"default\.sparse\.top_p: top_p 0\.0 must lie in \(0, 1\]"),
        ({"default": {"mode": "int8-fp8", "sparse": {**SPARSE, "top_p": 1.5}}},
         r"default\.sparse\.top_p: top_p 1\.5 must lie in \(0, 1\]"),
        ({"default": {"mode": "int8-fp8", "sparse": {"method": "static", "density": 0.3, "top_p": 0.9}}},
         r"default\.sparse: top_p: only dynamic selection takes a top_p"),
        ({"default": {"mode": "int8-fp8", "sparse": {**SPARSE, "reuse_steps": 0}}},
         r"default\.sparse\.reuse_steps: reuse_steps 0 must be at least 1"),
        ({"default": {"mode": "int8-fp8", "sparse": {"method": "static", "density": 0.3, "reuse_steps": 2}}},
         r"default\.sparse: reuse_steps: only dynamic selection takes a reuse_steps"),
        ({"default": {"mode": "int8-fp8", "sparse": {**SPARSE, "head_density": [0.2, 1.5]}}},
         r"default\.sparse\.head_density: head_density \[0\.2, 1\.5\] must list one density in \[0, 1\] per head"),
        ({"default": {"mode": "int8-fp8", "sparse": {**SPARSE, "head_density": []}}},
         r"default\.sparse\.head_density: head_density \[\] must list one density"),
        ({"default": {"mode": "int8-fp8", "sparse": {"method": "static", "density": 0.3, "head_density": [0.3]}}},
         r"default\.sparse: head_density: only dynamic selection takes a head_density"),
    ],
)
def test_bad_sparse_settings_name_the_field_and_the_fix(change, match):
    with pytest.raises(PlanError, match=match):
        AttentionPlan.from_json(json.dumps(_plan(**change)))


def test_the_sparse_default_plan_keeps_the_first_fifth_of_the_steps_and_the_given_layers_dense():
    sparse = Sparse.parse("static:0.25")
    plan = AttentionPlan.sparse_default(Choice(mode=Mode.int8_fp8, granularity="token"), sparse, steps=11,
                                        dense_layers=(LAYERS[0],))
    assert dense_steps(11) == 3 and dense_steps(5) == 1 and dense_steps(1) == 1
    assert [plan.choice_for(LAYERS[1], s).sparse for s in range(11)] == [None] * 3 + [sparse] * 8
    assert {plan.choice_for(LAYERS[0], s).sparse for s in range(11)} == {None}
    assert {plan.choice_for(LAYERS[1], s).granularity.value for s in range(11)} == {"token"}
    assert AttentionPlan.from_json(plan.to_json()) == plan


def test_with_sparse_adds_the_setting_to_each_quantized_layer_after_the_dense_steps():
    plan = AttentionPlan.model_validate(_plan(overrides=[{"layers": [LAYERS[0]], "mode": "full"}]))
    sparse = Sparse.parse("dynamic:0.2")
    made = plan.with_sparse(sparse, steps=4, dense_layers=())
    assert [made.choice_for(LAYERS[1], s).sparse for s in range(4)] == [None, sparse, sparse, sparse]
    assert {made.choice_for(LAYERS[0], s).label for s in range(4)} == {"full"}  # full precision stays dense
    assert made.choice_for(LAYERS[1], 3).mode is Mode.int8_fp8 and made.version == 2
    assert {plan.with_sparse(sparse, steps=4, dense_layers=(LAYERS[1],)).choice_for(LAYERS[1], 3).sparse} == {None}
    with pytest.raises(PlanError, match="none is sparse"):
        plan.with_sparse(sparse, steps=1)
    with pytest.raises(PlanError, match="without step ranges or sparse choices"):
        made.with_sparse(sparse, steps=4)


def test_a_sparse_plan_file_is_checked_like_any_plan_and_runs_through_install(tiny_pipe, tmp_path):
    from sagevideo.generation.plan import plan_batch

    plan = AttentionPlan(default=Choice(mode=Mode.int8_fp16, sparse=Sparse.parse("static:0.3")))
    path = plan.save(tmp_path / "p.json")
    planned = plan_batch(["a fox"], out=tmp_path / "out", plan=path)
    assert planned.jobs[0].plan_sha256 is not None and planned.jobs[0].job.sparse == "off"
    with sagevideo.install(tiny_pipe, path, backend="sdpa"), sagevideo.record_backends() as log:
        _latents(tiny_pipe, steps=2)
    layers = log.summary()["sparse"]["layers"]
    assert {name: d["calls"] for name, d in layers.items()} == {name: 2 for name in LAYERS}
