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


@pytest.mark.slow  # a 3-step calibration (about 10 s on CPU)
def test_sparse_is_written_into_the_calibrated_plan_after_the_first_fifth_and_first_layer(tmp_path):
    from sagevideo.pipelines.plans import AttentionPlan, Sparse

    out = tmp_path / "plan.json"
    result = calibrate(["a fox"], out=out, device="cpu", progress=False, capture_steps=[-1], steps=3,
                       sparse="static:0.3")
    plan = AttentionPlan.load(out)
    assert plan == result.plan and plan.version == 2
    sparse = Sparse(method="static", density=0.3)
    assert [plan.choice_for("transformer_blocks.1.attn1", s).sparse for s in range(3)] == [None, sparse, sparse]
    assert {plan.choice_for("transformer_blocks.0.attn1", s).sparse for s in range(3)} == {None}
    # the precisions calibration chose stay each layer's
    assert plan.choice_for("transformer_blocks.1.attn1", 2).mode == result.chosen["transformer_blocks.1.attn1"].mode


def test_sparse_with_no_step_left_to_be_sparse_is_refused_before_loading(tmp_path, no_model_load):
    with pytest.raises(InputError, match="--sparse static:0.3 with 1 step"):
        calibrate(["a fox"], out=tmp_path / "plan.json", device="cpu", progress=False, steps=1, sparse="static:0.3")
