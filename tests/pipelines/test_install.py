"""install()/remove(): every attention layer routed through sageattn, and undone exactly."""

import pytest
import torch

import sagevideo
from sagevideo.pipelines.cogvideox.processor import SageCogVideoXAttnProcessor


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter's variant; the GPU runs Inductor below")
def test_compile_fullgraph_with_sagevideo_installed(tiny_pipe):
    """(Kernels under the CPU interpreter here, so Dynamo's "eager" backend; Inductor on the GPU.)"""
    _compiled_matches_eager_and_records(tiny_pipe, torch.float16, "cpu", "eager", "fp16")


@pytest.mark.gpu
@pytest.mark.parametrize("pv", ["fp16", "fp8"])
def test_compiled_with_inductor_records_what_runs_on_gpu(tiny_pipe, pv):
    _compiled_matches_eager_and_records(tiny_pipe, torch.bfloat16, "cuda", "inductor", pv)
