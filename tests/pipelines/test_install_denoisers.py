"""install(pipe) covers every denoiser a pipeline holds: a Wan 2.2-style pipeline (`transformer` for
high-noise steps, `transformer_2` below `boundary_ratio`) routes every attention call, with unique
layer names, one plan, one step clock, and one handle whose remove() undoes both."""

from __future__ import annotations

import pytest
import torch
from tests.helpers.wan import WAN_ATTENTION_CALLS, run_wan22, tiny_wan22_pipeline

import sagevideo
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Override, PlanError

STEPS = 4
CALLS = STEPS * 2 * WAN_ATTENTION_CALLS  # steps x (cond, uncond) forwards x attention calls


@pytest.fixture(scope="module")
def wan22():
    return tiny_wan22_pipeline(boundary_ratio=0.5)


def test_every_attention_call_of_both_transformers_is_routed(wan22):
    stock = run_wan22(wan22, STEPS)
    with sagevideo.install(wan22, backend="reference") as handle, sagevideo.record_backends() as log:
        quantized = run_wan22(wan22, STEPS)
    assert log.counts == {"reference/fp16": CALLS}  # nothing left on stock SDPA
    assert not torch.equal(quantized, stock)
    assert [d.component for d in handle.denoisers] == ["transformer", "transformer_2"]
    assert torch.equal(run_wan22(wan22, STEPS), stock)  # remove() restored both


def test_layer_names_are_unique_and_reach_the_plan(wan22):
    first = [k.removesuffix(".processor") for k in wan22.transformer.attn_processors]
    second = ["transformer_2." + k.removesuffix(".processor") for k in wan22.transformer_2.attn_processors]
    plan = AttentionPlan(
        layers=tuple(first + second), default=Choice(mode=Mode.int8_fp16),
        overrides=(Override(layers=tuple(second), mode=Mode.full),),
    )
    with sagevideo.install(wan22, plan, backend="reference") as handle, sagevideo.record_backends() as log:
        assert [name.removesuffix(".processor") for name in handle.layers] == first + second
        run_wan22(wan22, STEPS)
    # boundary 0.5 of 4 steps: 2 steps on each transformer; transformer_2's layers run full precision.
    assert log.counts == {"reference/fp16": CALLS // 2, "sdpa": CALLS // 2}


def test_a_plan_is_validated_against_the_layers_of_all_denoisers(wan22):
    plan = AttentionPlan(overrides=(Override(layers=("transformer_2.blocks.0.attn1",), mode=Mode.full),))
    sagevideo.install(wan22, plan).remove()
    with pytest.raises(PlanError, match="transformer_2.blocks.0.attn1"):
        sagevideo.install(wan22.transformer, plan)  # only the first transformer: that layer is not there
    stray = AttentionPlan(overrides=(Override(layers=("transformer_3.blocks.0.attn1",), mode=Mode.full),))
    with pytest.raises(PlanError):
        sagevideo.install(wan22, stray)
    assert not hasattr(wan22.transformer, "_sagevideo_attention")
    assert not hasattr(wan22.transformer_2, "_sagevideo_attention")


def test_one_step_clock_counts_the_pipeline_steps_for_both(wan22):
    steps_of = {"transformer": set(), "transformer_2": set()}
    plan = AttentionPlan(overrides=(Override(steps=(3, None), mode=Mode.full),))  # only the last step: full
    with sagevideo.install(wan22, plan, backend="reference") as handle, sagevideo.record_backends() as log:
        hooks = [
            getattr(wan22, name).register_forward_pre_hook(
                lambda module, args, name=name: steps_of[name].add(handle.router.clock.step)
            )
            for name in steps_of
        ]
        try:
            run_wan22(wan22, STEPS)
        finally:
            for hook in hooks:
                hook.remove()
    assert steps_of == {"transformer": {0, 1}, "transformer_2": {2, 3}}
    assert log.counts == {"reference/fp16": CALLS * 3 // 4, "sdpa": CALLS // 4}


def test_installing_twice_is_refused_on_either_transformer(wan22):
    with sagevideo.install(wan22):
        with pytest.raises(RuntimeError, match="already installed"):
            sagevideo.install(wan22)
        with pytest.raises(RuntimeError, match="already installed"):
            sagevideo.install(wan22.transformer_2)
    with sagevideo.install(wan22.transformer_2):  # the second alone, as a transformer
        with pytest.raises(RuntimeError, match="already installed"):
            sagevideo.install(wan22)
        assert not hasattr(wan22.transformer, "_sagevideo_attention")  # refused before touching the first
    assert "forward" not in vars(wan22.transformer) and not wan22.transformer._forward_pre_hooks


def test_a_pipeline_with_a_denoiser_sagevideo_does_not_cover_is_refused():
    from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler
    from tests.helpers.wan import tiny_wan

    class ControlledPipeline(DiffusionPipeline):  # as diffusers' ControlNet pipelines hold theirs
        def __init__(self, transformer, controlnet, scheduler):
            super().__init__()
            self.register_modules(transformer=transformer, controlnet=controlnet, scheduler=scheduler)

    pipe = ControlledPipeline(tiny_wan(0), tiny_wan(1), FlowMatchEulerDiscreteScheduler())
    with pytest.raises(TypeError, match=r"controlnet.*install\(pipe\.transformer\)"):
        sagevideo.install(pipe)
    assert not hasattr(pipe.transformer, "_sagevideo_attention")
