"""`sagevideo.calibrate` under a recipe: FP8 linears applied before the capture, compile noted and
not applied, a cache refused; the plan records the recipe; bad settings refused before loading."""

from __future__ import annotations

import json

import pytest

from sagevideo.errors import InputError
from sagevideo.experiments.calibrate import calibrate


@pytest.mark.parametrize(
    "options, message",
    [
        ({"linear": "fp8"}, "--linear fp8: float8 linears need a CUDA GPU with FP8 tensor cores (sm89+), not cpu; "
                            "or use --linear bf16"),
        ({"cache": "first-block"}, "--cache first-block: calibration measures each layer's attention in every "
                                   "forward, and a step cache skips the forwards whose attention it would measure"),
        ({"linear_keep": ["transformer_blocks.0.*"]}, "--linear-keep transformer_blocks.0.*: keeps layers in bf16 "
                                                      "only with --linear fp8"),
        ({"cache": "never"}, "--cache never: Input should be"),
    ],
)
def test_a_recipe_calibration_cannot_measure_is_refused_before_loading(tmp_path, no_model_load, options, message):
    with pytest.raises(InputError) as err:
        calibrate(["a fox"], out=tmp_path / "plan.json", device="cpu", progress=False, **options)
    assert message in str(err.value)
    assert not (tmp_path / "plan.json").exists()


def test_fp8_linears_are_applied_before_the_capture_and_the_plan_records_the_recipe(tmp_path, monkeypatch):
    """On CPU float8 cannot run: the machine check and torchao's quantize are stood in for, to see
    that calibration applies the linears on the pipeline it measures, before the first step."""
    import sagevideo.pipelines.recipe.apply as recipe_module
    from sagevideo.pipelines.calibrate import ProbingRouter

    routers, applied = [], []
    real_init = ProbingRouter.__init__

    def fp8_linears(denoisers, keep, state):
        applied.append((keep, sum(len(errors) for errors in routers[0].errors.values())))
        state.fp8_layers.append("transformer_blocks.1.attn1.to_q")

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        routers.append(self)

    monkeypatch.setattr(recipe_module, "fp8_linear_problem", lambda device, dtype: None)
    monkeypatch.setattr(recipe_module, "fp8_linears", fp8_linears)
    monkeypatch.setattr(ProbingRouter, "__init__", init)
    out = tmp_path / "plan.json"
    result = calibrate(["a fox"], out=out, device="cpu", progress=False, linear="fp8",
                       linear_keep="transformer_blocks.0.*", compile="regional", compile_backend="eager")
    assert applied == [(["transformer_blocks.0.*"], 0)]  # once, before anything was measured
    assert routers[0].errors  # and measured after
    recipe = json.loads(out.read_text())["recipe"]
    assert (recipe["linear"], recipe["linear_keep"], recipe["compile"], recipe["cache"]) == (
        "fp8", ["transformer_blocks.0.*"], "none", "none")  # measured eagerly, as said
    assert recipe["note"].startswith("--compile regional --compile-backend eager was not applied")
    assert result.plan.recipe == recipe


def test_a_plain_calibration_writes_the_plan_as_before(tmp_path):
    out = tmp_path / "plan.json"
    calibrate(["a fox"], out=out, device="cpu", progress=False, capture_steps=[-1])
    assert "recipe" not in json.loads(out.read_text())


@pytest.mark.slow  # a 3-step calibration with the sparse ladder at 192 px, then the plan generated (about 3 s)
def test_calibrate_sparse_proposes_per_layer_densities_and_the_plan_runs_through_generate(tmp_path):
    """Static selection (dynamic keeps every tile of random weights). A lax budget makes the second
    layer sparse from step 1 on (the first layer and step 0 stay dense); generate runs that plan and
    its manifest records the density reached per layer."""
    from sagevideo.generation.generate import generate
    from sagevideo.outputs.manifest import Manifest
    from sagevideo.pipelines.plans import AttentionPlan, Sparse

    out = tmp_path / "plan.json"
    size = {"height": 192, "width": 192, "frames": 9, "steps": 3}
    result = calibrate(["a fox"], out=out, device="cpu", progress=False, capture_steps=[-1], sparse="static:0.3",
                       sparse_budget=0.9, **size)
    plan = AttentionPlan.load(out)
    assert plan == result.plan and plan.version == 2
    first, later = "transformer_blocks.0.attn1", "transformer_blocks.1.attn1"
    sparse = Sparse(method="static", density=0.3)
    assert result.sparse.chosen == {later: sparse} and "first sparse layer" in result.sparse.dense[first]
    worst = result.sparse.errors[later][result.chosen[later].label][0.3]
    assert 0.9 <= worst.cos < 1.0 and worst.step == 2 and 0 < worst.density < 1  # met on the captured step
    assert [plan.choice_for(later, s).sparse for s in range(3)] == [None, sparse, sparse]
    assert {plan.choice_for(first, s).sparse for s in range(3)} == {None}
    assert plan.choice_for(later, 2).mode == result.chosen[later].mode  # the precision calibration chose
    generate(["a fox"], out=tmp_path / "videos", plan=out, device="cpu", progress=False, **size)
    (record,) = Manifest(tmp_path / "videos" / "manifest.jsonl").records()
    layers = record.backends["sparse"]["layers"]
    assert layers[first] == {"calls": 3, "density": 1.0, "min": 1.0}
    assert layers[later]["sparse_calls"] == 2 and 0 < layers[later]["sparse_density"] < 1


def test_sparse_budget_values_are_refused_before_loading(tmp_path, no_model_load):
    def run(**options):
        return calibrate(["a fox"], out=tmp_path / "plan.json", device="cpu", progress=False, steps=5, **options)

    for bad in (0, 1.5, -0.1, float("nan"), "high"):
        with pytest.raises(InputError, match="sparse-budget|sparse_budget"):
            run(sparse="static:0.3", sparse_budget=bad)
    with pytest.raises(InputError, match="--sparse-budget 0.95: only with --sparse METHOD:DENSITY"):
        run(sparse_budget=0.95)
    with pytest.raises(InputError, match=r"--capture-steps \[0\] with --sparse static:0.3: the plan is sparse from "
                                         r"step 1 on"):
        run(sparse="static:0.3", capture_steps=[0])
    with pytest.raises(InputError, match=r"only dynamic selection reuses its tiles over steps"):
        run(sparse="static:0.3:reuse2")
    with pytest.raises(InputError, match=r"--sparse dynamic:0.3:reuse2 with --capture-steps: a reusing step needs"):
        run(sparse="dynamic:0.3:reuse2", capture_steps=[1, 2])
    assert not (tmp_path / "plan.json").exists()


def test_sparse_with_no_step_left_to_be_sparse_is_refused_before_loading(tmp_path, no_model_load):
    with pytest.raises(InputError, match="--sparse static:0.3 with 1 step"):
        calibrate(["a fox"], out=tmp_path / "plan.json", device="cpu", progress=False, steps=1, sparse="static:0.3")


@pytest.mark.slow  # two passes of a 3-step calibration at 320 px, then the plan generated (a few seconds)
def test_calibrate_dynamic_writes_per_layer_top_ps_that_generate_runs(tmp_path, monkeypatch):
    """`--sparse dynamic:D`: calibrate runs the prompt twice and writes the layer's calibrated top_p into
    the plan; generate runs that top_p (one per call) and reaches the density calibrate reported. Random
    weights' tiles are not self-similar, so both calibrate and generate judge every tile here
    (min_similarity -1 in the installed settings, patched for both alike)."""
    import dataclasses

    import sagevideo.attention.sparse as attention_sparse
    import sagevideo.pipelines.sparse as pipelines_sparse
    from sagevideo.generation.generate import generate
    from sagevideo.outputs.manifest import Manifest
    from sagevideo.pipelines.plans import AttentionPlan

    installed = attention_sparse.dynamic_selection

    def judging_every_tile(*args, **kwargs):
        return dataclasses.replace(installed(*args, **kwargs), min_similarity=-1.0)

    monkeypatch.setattr(attention_sparse, "dynamic_selection", judging_every_tile)
    monkeypatch.setattr(pipelines_sparse, "dynamic_selection", judging_every_tile)
    out = tmp_path / "plan.json"
    size = {"height": 320, "width": 320, "frames": 9, "steps": 3}  # text and diagonal tiles under 0.4
    result = calibrate(["a fox"], out=out, device="cpu", progress=False, capture_steps=[-1], sparse="dynamic:0.4",
                       sparse_budget=0.5, **size)
    plan = AttentionPlan.load(out)
    first, later = "transformer_blocks.0.attn1", "transformer_blocks.1.attn1"
    sparse = result.sparse.chosen[later]
    assert plan == result.plan and plan.choice_for(later, 2).sparse == sparse and sparse.density == 0.4
    assert 0 < sparse.top_p < 1 and "first sparse layer" in result.sparse.dense[first]
    worst = result.sparse.errors[later][result.chosen[later].label][0.4]
    assert worst.top_p == sparse.top_p and worst.calls == 1 and worst.step == 2 and worst.cos < 1.0
    assert abs(worst.density - 0.4) < 0.05  # the captured call: the top_p found for 0.4 reaches it
    generate(["a fox"], out=tmp_path / "videos", plan=out, device="cpu", progress=False, **size)
    (record,) = Manifest(tmp_path / "videos" / "manifest.jsonl").records()
    layers = record.backends["sparse"]["layers"]
    assert layers[first] == {"calls": 3, "density": 1.0, "min": 1.0}
    assert layers[later]["sparse_calls"] == 2 and 0 < layers[later]["sparse_density"] < 1
    # generate's own run (quantized, sparse from step 1) sees other latents than calibrate's: near, not equal
    assert abs(layers[later]["sparse_density"] - 0.4) < 0.1
