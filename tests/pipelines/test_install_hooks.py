"""install()/remove() leave other people's hooks alone: diffusers' HookRegistry hooks (a custom one,
FasterCache's denoiser hook, group offloading) and accelerate's hooks on the transformer, registered
before or after install, keep running while installed and after remove(), for a dispatcher model
(SDPA interception: tiny Wan) and a processor-swap model (tiny CogVideoX). Also
`enable_model_cpu_offload` (accelerate hooks that the pipeline removes and re-adds every call)."""

from __future__ import annotations

import functools

import pytest
import torch
from tests.helpers.wan import WAN_ATTENTION_CALLS, run_wan, tiny_wan

import sagevideo


def _tiny_cogvideox():
    from diffusers import CogVideoXTransformer3DModel

    from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return CogVideoXTransformer3DModel(**TRANSFORMER_CONFIG).eval()


def _run_cogvideox(model) -> torch.Tensor:
    config = model.config
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 3, config.in_channels, config.sample_height, config.sample_width, generator=gen)
    text = torch.randn(1, 16, config.text_embed_dim, generator=gen)
    with torch.no_grad():
        return model(hidden_states=hidden, encoder_hidden_states=text, timestep=torch.tensor([10]),
                     return_dict=False)[0]


# model kind -> (build, run, attention calls per forward, FasterCache tensor format)
MODELS = {
    "wan": (tiny_wan, run_wan, WAN_ATTENTION_CALLS, "BCFHW"),
    "cogvideox": (_tiny_cogvideox, _run_cogvideox, 2, "BFCHW"),
}


class _Calls:
    """How often a hook ran on the transformer itself."""

    def __init__(self) -> None:
        self.n = 0


def _count_method(monkeypatch, cls, method: str, model, calls: _Calls) -> None:
    """Count `cls.method` calls made for `model` (patched on the class before the hook is made:
    HookRegistry keeps the bound methods of the hook it registers)."""
    original = getattr(cls, method)

    @functools.wraps(original)
    def counted(self, module, *args, **kwargs):
        if module is model:
            calls.n += 1
        return original(self, module, *args, **kwargs)

    monkeypatch.setattr(cls, method, counted)


def _add_registry_hook(model, calls, monkeypatch, tensor_format) -> None:
    from diffusers.hooks import HookRegistry, ModelHook

    class Counting(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            calls.n += 1
            return args, kwargs

    HookRegistry.check_if_exists_or_initialize(model).register_hook(Counting(), "sagevideo-test-counter")


def _add_faster_cache(model, calls, monkeypatch, tensor_format) -> None:
    from diffusers import FasterCacheConfig
    from diffusers.hooks.faster_cache import FasterCacheDenoiserHook

    _count_method(monkeypatch, FasterCacheDenoiserHook, "new_forward", model, calls)
    # Timestep 900 is outside the default skip range (-1, 681): every layer attends, deterministically.
    model.enable_cache(FasterCacheConfig(
        current_timestep_callback=lambda: 900, tensor_format=tensor_format, is_guidance_distilled=True,
        spatial_attention_block_skip_range=2,
    ))


def _add_group_offloading(model, calls, monkeypatch, tensor_format) -> None:
    from diffusers.hooks import apply_group_offloading
    from diffusers.hooks.group_offloading import GroupOffloadingHook

    _count_method(monkeypatch, GroupOffloadingHook, "pre_forward", model, calls)
    apply_group_offloading(model, onload_device=torch.device("cpu"), offload_type="block_level",
                           num_blocks_per_group=1)


def _add_accelerate_hook(model, calls, monkeypatch, tensor_format) -> None:
    from accelerate.hooks import ModelHook, add_hook_to_module

    class Counting(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            calls.n += 1
            return args, kwargs

    add_hook_to_module(model, Counting())


HOOKS = {
    "registry": _add_registry_hook,
    "faster_cache": _add_faster_cache,
    "group_offloading": _add_group_offloading,
    "accelerate": _add_accelerate_hook,
}


@pytest.mark.parametrize("order", ["before", "after"])
@pytest.mark.parametrize("hook", sorted(HOOKS))
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_hooks_on_the_transformer_survive_install_and_remove(kind, hook, order, monkeypatch):
    build, run, attention_calls, tensor_format = MODELS[kind]
    model, calls = build(), _Calls()
    if order == "before":
        HOOKS[hook](model, calls, monkeypatch, tensor_format)
    handle = sagevideo.install(model, backend="reference")
    if order == "after":
        HOOKS[hook](model, calls, monkeypatch, tensor_format)

    with sagevideo.record_backends() as log:
        run(model)
    assert calls.n == 1
    assert log.counts == {"reference/fp16": attention_calls}  # the first forward attends in every layer

    handle.remove()
    with sagevideo.record_backends() as log:
        run(model)
    assert calls.n == 2, f"the {hook} hook registered {order} install() no longer runs after remove()"
    assert log.counts == {}


def test_remove_restores_the_forward_a_hook_wrapped(monkeypatch):
    """Hooked before install: after remove() the transformer computes exactly what it did with the hook alone."""
    model, calls = tiny_wan(), _Calls()
    _add_accelerate_hook(model, calls, monkeypatch, None)
    forward_before = model.forward
    stock = run_wan(model)
    with sagevideo.install(model, backend="reference"):
        assert model.forward is forward_before  # install does not replace forward
    assert model.forward is forward_before
    assert torch.equal(run_wan(model), stock)


def _tiny_pipeline(kind: str):
    """(pipeline, run(pipe) -> latents, attention calls per call) with one denoiser."""
    if kind == "wan":
        from tests.helpers.wan import run_wan22, tiny_wan22_pipeline

        # 2 steps x (cond, uncond) forwards x 4 attention calls
        return tiny_wan22_pipeline(boundary_ratio=None), functools.partial(run_wan22, steps=2), 2 * 2 * 4
    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    run = functools.partial(
        pipe.__class__.__call__, prompt="a red panda", num_frames=9, num_inference_steps=2,
        generator=None, output_type="latent", max_sequence_length=32, return_dict=False,
    )

    def run_cogvideox(pipe):
        return run(pipe, generator=torch.Generator().manual_seed(0))[0]

    return pipe, run_cogvideox, 2 * 2  # 2 steps x 2 layers (cond and uncond in one batch)


@pytest.mark.parametrize("order", ["offload_first", "install_first"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_install_composes_with_model_cpu_offload(kind, order, monkeypatch):
    """enable_model_cpu_offload (accelerate hooks, which the pipeline removes and re-adds after each
    call) runs on CPU when given device="cpu": every call routes, and offloading still runs after remove()."""
    from accelerate.hooks import CpuOffload

    pipe, run, attention_calls = _tiny_pipeline(kind)
    stock = run(pipe)
    calls = _Calls()
    _count_method(monkeypatch, CpuOffload, "pre_forward", pipe.transformer, calls)
    if order == "offload_first":
        pipe.enable_model_cpu_offload(device="cpu")
    handle = sagevideo.install(pipe, backend="sdpa")
    if order == "install_first":
        pipe.enable_model_cpu_offload(device="cpu")
    for _ in range(2):  # the second call runs on the hooks that the first call's maybe_free_model_hooks re-added
        with sagevideo.record_backends() as log:
            assert torch.equal(run(pipe), stock)
        assert log.counts == {"sdpa": attention_calls}
    offloaded = calls.n
    assert offloaded > 0
    handle.remove()
    with sagevideo.record_backends() as log:
        assert torch.equal(run(pipe), stock)
    assert log.counts == {}
    assert calls.n > offloaded, "enable_model_cpu_offload's hook no longer runs after remove()"


def test_a_forward_that_raises_leaves_no_interception_behind():
    """The mode is left by an always-called forward hook: after a failing forward, SDPA elsewhere is plain."""
    model = tiny_wan()
    with sagevideo.install(model, backend="reference"):
        with pytest.raises(RuntimeError):
            model(torch.randn(1, 4, 3, 8, 8), torch.tensor([500]), torch.randn(1, 10, 7))  # text dim 7, not 16
        assert torch.overrides._get_current_function_mode_stack() == []
        q = torch.randn(1, 2, 8, 64)
        with sagevideo.record_backends() as log:
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        assert log.counts == {}
