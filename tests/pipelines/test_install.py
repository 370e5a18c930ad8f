"""install()/remove() (`pipelines/install.py`): every attention layer routed through sageattn, and
undone exactly; every denoiser a pipeline holds (Wan 2.2's two transformers); the CogVideoX variants."""

import pytest
import torch

import sagevideo
from sagevideo.pipelines.cogvideox.processor import SageCogVideoXAttnProcessor
from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Override, PlanError
from tests.helpers.wan import WAN_ATTENTION_CALLS, run_wan22, tiny_wan22_pipeline


def _latents(pipe):
    return pipe(
        "a red panda",
        num_frames=9,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
        max_sequence_length=32,
        return_dict=False,
    )[0]


def test_install_then_remove_is_bit_identical(tiny_pipe):
    before = _latents(tiny_pipe)
    originals = tiny_pipe.transformer.attn_processors
    handle = sagevideo.install(tiny_pipe, pv="fp16", backend="reference")
    try:
        procs = tiny_pipe.transformer.attn_processors
        assert set(procs) == set(originals) and len(procs) == 2
        assert all(isinstance(p, SageCogVideoXAttnProcessor) for p in procs.values())
        assert handle.layers == list(originals)
        with sagevideo.record_backends() as log:
            quantized = _latents(tiny_pipe)
        assert log.counts == {"reference/fp16": 2 * 2}  # 2 layers x 2 steps (cond+uncond batched)
        assert not torch.equal(quantized, before)  # the quantized path really ran
    finally:
        handle.remove()
    after = tiny_pipe.transformer.attn_processors
    assert all(after[name] is originals[name] for name in originals)  # the very same objects
    assert torch.equal(_latents(tiny_pipe), before)
    handle.remove()  # a second remove does nothing


def test_sdpa_backend_gives_the_stock_result(tiny_pipe):
    before = _latents(tiny_pipe)
    with sagevideo.install(tiny_pipe.transformer, backend="sdpa"):
        assert torch.equal(_latents(tiny_pipe), before)


def test_double_install_raises(tiny_pipe):
    with sagevideo.install(tiny_pipe):
        with pytest.raises(RuntimeError, match="already installed"):
            sagevideo.install(tiny_pipe)
        with pytest.raises(RuntimeError, match="already installed"):
            sagevideo.install(tiny_pipe.transformer)
    sagevideo.install(tiny_pipe).remove()  # after remove, installing again works


def test_remove_refuses_after_processors_were_replaced(tiny_pipe):
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    originals = tiny_pipe.transformer.attn_processors
    handle = sagevideo.install(tiny_pipe)
    try:
        tiny_pipe.transformer.set_attn_processor(CogVideoXAttnProcessor2_0())
        with pytest.raises(RuntimeError, match="replaced after install"):
            handle.remove()
    finally:
        tiny_pipe.transformer.set_attn_processor(dict(originals))
        handle.router.clock.detach()  # the scheduler wrappers of the refused handle
        del tiny_pipe.transformer._sagevideo_attention


def test_fused_projections_are_refused():
    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    # A fresh pipeline: unfuse_qkv_projections() leaves the fused to_qkv weights behind (diffusers 0.42).
    pipe = tiny_pipeline()
    pipe.fuse_qkv_projections()
    with pytest.raises(TypeError, match="unfuse_qkv_projections"):
        sagevideo.install(pipe)
    assert not hasattr(pipe.transformer, "_sagevideo_attention")


def test_bad_arguments(tiny_pipe):
    with pytest.raises(TypeError, match="neither a diffusers pipeline"):
        sagevideo.install(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="pv='int4'"):
        sagevideo.install(tiny_pipe, pv="int4")
    assert not hasattr(tiny_pipe.transformer, "_sagevideo_attention")


def _transformer_inputs(pipe, transformer, dtype, device):
    gen = torch.Generator().manual_seed(0)
    config = transformer.config
    hidden = torch.randn(1, 3, config.in_channels, config.sample_height, config.sample_width, generator=gen)
    text = torch.randn(1, 32, config.text_embed_dim, generator=gen)
    rotary = pipe._prepare_rotary_positional_embeddings(
        config.sample_height * 8, config.sample_width * 8, 3, torch.device(device)
    ) if config.use_rotary_positional_embeddings else None
    return dict(hidden_states=hidden.to(device, dtype), encoder_hidden_states=text.to(device, dtype),
                timestep=torch.tensor([10], device=device), image_rotary_emb=rotary, return_dict=False)


def _compiled_matches_eager_and_records(pipe, dtype, device, compile_backend, pv):
    """The installed transformer compiles in one graph, computes what eager computes, and every run
    of the compiled graph records the calls it makes (a compiled forward used to record {})."""
    import copy

    transformer = torch.nn.Module.to(copy.deepcopy(pipe.transformer), device=device, dtype=dtype)
    kwargs = _transformer_inputs(pipe, transformer, dtype, device)
    with sagevideo.install(transformer, pv=pv, backend="triton"), torch.no_grad():
        with sagevideo.record_backends() as eager_log:
            eager = transformer(**kwargs)[0]
        torch._dynamo.reset()
        compiled = torch.compile(transformer, fullgraph=True, backend=compile_backend)
        first = compiled(**kwargs)[0]  # traced and compiled here
        with sagevideo.record_backends() as log:
            again = compiled(**kwargs)[0]
    # Inductor fuses the bf16 ops around attention differently: close in direction, not bit for bit
    cosine = torch.nn.functional.cosine_similarity(first.double().flatten(), eager.double().flatten(), dim=0)
    assert cosine > 0.9999, cosine
    assert torch.equal(again, first)
    assert sum(eager_log.counts.values()) == len(pipe.transformer.attn_processors)
    # what the compiled graph calls: the plain-Triton kernel (the Gluon launch is not traceable)
    assert log.counts == {f"triton/{pv}": sum(eager_log.counts.values())}


@pytest.mark.slow  # torch.compile of the tiny transformer
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter's variant; the GPU runs Inductor below")
def test_compile_fullgraph_with_sagevideo_installed(tiny_pipe):
    """(Kernels under the CPU interpreter here, so Dynamo's "eager" backend; Inductor on the GPU.)"""
    _compiled_matches_eager_and_records(tiny_pipe, torch.float16, "cpu", "eager", "fp16")


@pytest.mark.gpu
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_compiled_with_inductor_records_what_runs_on_gpu(tiny_pipe, pv):
    _compiled_matches_eager_and_records(tiny_pipe, torch.bfloat16, "cuda", "inductor", pv)


# ------------------------------------------------------------------------------------------------
# install(pipe) covers every denoiser a pipeline holds: a Wan 2.2-style pipeline (`transformer` for
# high-noise steps, `transformer_2` below `boundary_ratio`) routes every attention call, with unique
# layer names, one plan, one step clock, and one handle whose remove() undoes both.


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


@pytest.mark.parametrize("when", ["before the first run", "between runs"])
@pytest.mark.parametrize("scheduler", ["UniPCMultistepScheduler", "FlowMatchEulerDiscreteScheduler"])
def test_a_step_dependent_plan_follows_a_scheduler_swapped_in_after_install(when, scheduler):
    """`pipe.scheduler = X.from_config(pipe.scheduler.config)`, diffusers' idiom: the step clock counts
    the steps of the scheduler the pipeline runs with, whenever it was swapped."""
    import diffusers

    pipe = tiny_wan22_pipeline(boundary_ratio=None)
    plan = AttentionPlan(overrides=(Override(steps=(3, None), mode=Mode.full),))  # only the last step: full
    expected = {"reference/fp16": CALLS * 3 // 4, "sdpa": CALLS // 4}  # one transformer: as CALLS
    with sagevideo.install(pipe, plan, backend="reference"):
        if when == "between runs":
            with sagevideo.record_backends() as log:
                run_wan22(pipe, STEPS)
            assert log.counts == expected
        old = pipe.scheduler
        pipe.scheduler = getattr(diffusers, scheduler).from_config(pipe.scheduler.config)
        with sagevideo.record_backends() as log:
            run_wan22(pipe, STEPS)
        assert log.counts == expected
        assert "step" not in vars(old)  # the replaced scheduler is left as it was
    assert "step" not in vars(pipe.scheduler) and "set_timesteps" not in vars(pipe.scheduler)


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


class _Holder(torch.nn.Module):
    """A user's own container of a Wan 2.2 layout's denoisers: no diffusers pipeline."""

    def __init__(self, transformer, transformer_2):
        super().__init__()
        self.transformer, self.transformer_2 = transformer, transformer_2


@pytest.mark.parametrize("holder", ["namespace", "module"])
def test_an_object_holding_two_denoisers_gets_both_installed(holder):
    """Not a diffusers pipeline, but `.transformer` and `.transformer_2`: both are installed, the
    second's layers prefixed `transformer_2.` as in a pipeline."""
    from types import SimpleNamespace

    from tests.helpers.wan import run_wan, tiny_wan

    first, second = tiny_wan(0), tiny_wan(1)
    held = SimpleNamespace(transformer=first, transformer_2=second) if holder == "namespace" else _Holder(first, second)
    plan = AttentionPlan(overrides=(Override(layers=("transformer_2.blocks.0.attn1",), mode=Mode.full),))
    with sagevideo.install(held, plan, backend="reference") as handle:
        assert [d.component for d in handle.denoisers] == ["transformer", "transformer_2"]
        assert "transformer_2.blocks.1.attn2.processor" in handle.layers
        for model, counts in ((first, {"reference/fp16": 4}), (second, {"reference/fp16": 3, "sdpa": 1})):
            with sagevideo.record_backends() as log:
                run_wan(model)
            assert log.counts == counts
    assert not hasattr(second, "_sagevideo_attention") and not second._forward_pre_hooks


# Transformers without diffusers' AttentionMixin (no `attn_processors` of their own) whose attention
# modules run SDPA-calling processors: routed through the SDPA interception like any other. Calls per
# forward: (in the kernels, on SDPA); Framepack's token refiner masks queries too: SDPA, recorded.
NO_ATTENTION_MIXIN = {"framepack": (2, 1), "latte": (3, 0), "easyanimate": (1, 0)}


@pytest.mark.parametrize("name", sorted(NO_ATTENTION_MIXIN))
def test_transformers_without_attention_mixin_are_intercepted(name):
    from tests.helpers.video_models import run_model, tiny_model

    model = tiny_model(name)
    stock = run_model(model, name)
    kernels, sdpa = NO_ATTENTION_MIXIN[name]
    with sagevideo.install(model, backend="reference") as handle, sagevideo.record_backends() as log:
        quantized = run_model(model, name)
    assert handle.interception is not None and len(handle.layers) == kernels + sdpa
    assert log.counts == {"reference/fp16": kernels, **({"sdpa": sdpa} if sdpa else {})}
    assert all("is not a key-padding mask" in reason for reason in log.fallback_reasons)
    assert torch.nn.functional.cosine_similarity(stock.flatten(), quantized.flatten(), dim=0) > 0.999
    assert torch.equal(run_model(model, name), stock)


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


# ------------------------------------------------------------------------------------------------
# The CogVideoX variants install the same way: image-to-video (doubled input channels, learned
# positional embeddings off) and CogVideoX 1.5 (temporal patches, ofs embedding), transformer level.


VARIANTS = {
    "i2v": dict(TRANSFORMER_CONFIG, in_channels=8, use_learned_positional_embeddings=False),
    "1.5": dict(TRANSFORMER_CONFIG, patch_size_t=2, ofs_embed_dim=32, sample_frames=17,
                use_learned_positional_embeddings=False),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_installs_routes_and_restores(variant):
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    cfg = VARIANTS[variant]
    torch.manual_seed(0)
    model = CogVideoXTransformer3DModel(**cfg).eval()
    frames = 4 if cfg.get("patch_size_t") else 3
    h, w, p = cfg["sample_height"], cfg["sample_width"], cfg["patch_size"]
    gen = torch.Generator().manual_seed(1)
    rope_frames = frames // cfg.get("patch_size_t", 1) if cfg.get("patch_size_t") else frames
    rotary = get_3d_rotary_pos_embed(cfg["attention_head_dim"], ((0, 0), (h // p, w // p)), (h // p, w // p),
                                     rope_frames)
    kwargs = dict(
        hidden_states=torch.randn(1, frames, cfg["in_channels"], h, w, generator=gen),
        encoder_hidden_states=torch.randn(1, 16, cfg["text_embed_dim"], generator=gen),
        timestep=torch.tensor([10]), image_rotary_emb=rotary, return_dict=False,
    )
    if cfg.get("ofs_embed_dim"):
        kwargs["ofs"] = torch.tensor([2.0])
    with torch.no_grad():
        before = model(**kwargs)[0]
        with sagevideo.install(model, backend="reference") as handle, sagevideo.record_backends() as log:
            quant = model(**kwargs)[0]
        after = model(**kwargs)[0]
    assert handle.processors and log.counts == {"reference/fp16": cfg["num_layers"]}
    assert torch.nn.functional.cosine_similarity(before.flatten(), quant.flatten(), dim=0) > 0.9999
    assert torch.equal(after, before)


def test_install_lets_torchs_compile_cache_keep_graphs_with_sagevideo_attention(tiny_pipe):
    """The record op's with_effects operator is marked cacheable (a user's own marks kept), so a
    user who compiles the installed model gets torch's FX-graph cache (without the mark it bypassed
    every such graph: tests/pipelines/recipe/test_compile_cache.py shows the cache at work)."""
    import torch._inductor.config as inductor_config

    from sagevideo.attention.records import WITH_EFFECTS

    with inductor_config.patch(unsafe_marked_cacheable_functions={"torch.ops.mine.op": "1"}):
        handle = sagevideo.install(tiny_pipe)
        try:
            assert inductor_config.unsafe_marked_cacheable_functions == {"torch.ops.mine.op": "1",
                                                                         WITH_EFFECTS: torch.__version__}
        finally:
            handle.remove()


def test_install_warns_when_torchs_sdpa_was_replaced_process_wide(monkeypatch):
    """SageAttention's idiom `F.scaled_dot_product_attention = ...` takes the model's calls before the
    installed plan can see them: install says so instead of leaving the plan silently unapplied."""
    import torch.nn.functional as F

    from tests.helpers.wan import tiny_wan

    monkeypatch.setattr(F, "scaled_dot_product_attention", sagevideo.scaled_dot_product_attention)
    with pytest.warns(UserWarning, match="scaled_dot_product_attention was replaced"):
        sagevideo.install(tiny_wan()).remove()
