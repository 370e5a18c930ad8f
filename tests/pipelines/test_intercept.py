"""SDPA interception (`pipelines/intercept.py`) for dispatcher-based transformers (here a tiny Wan):
SDPA is intercepted only inside the transformer's forward, layer names reach the plan, and remove()
restores bit-identical outputs; a forward that routes no call is reported; other people's hooks
(diffusers, accelerate, CPU offload) keep working."""

import functools
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import sagevideo
from sagevideo.pipelines.plans import AttentionPlan, Choice, Mode, Override
from tests.helpers.wan import WAN_ATTENTION_CALLS, run_wan, tiny_wan, wan_inputs


@pytest.fixture(scope="module")
def wan():
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    ).eval()
    gen = torch.Generator().manual_seed(1)
    inputs = (torch.randn(1, 4, 3, 8, 8, generator=gen), torch.tensor([500]), torch.randn(1, 10, 16, generator=gen))
    return model, inputs


def _run(model, inputs):
    with torch.no_grad():
        return model(*inputs, return_dict=False)[0]


def test_interception_routes_every_layer_and_removes_cleanly(wan):
    model, inputs = wan
    before = _run(model, inputs)
    with sagevideo.install(model, backend="reference") as handle, sagevideo.record_backends() as log:
        assert handle.interception is not None and handle.processors == {}
        out = _run(model, inputs)
    assert log.counts == {"reference/fp16": 4}  # 2 blocks x (self + cross attention)
    assert torch.nn.functional.cosine_similarity(before.flatten(), out.flatten(), dim=0) > 0.9999
    assert not torch.equal(before, out)
    assert "forward" not in vars(model)
    assert torch.equal(_run(model, inputs), before)


def test_sdpa_outside_the_transformer_is_untouched(wan):
    model, _ = wan
    q = torch.randn(1, 2, 8, 64)
    with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
        F.scaled_dot_product_attention(q, q, q)  # e.g. a text encoder or VAE between transformer calls
    assert log.counts == {}


def test_plan_reaches_intercepted_layers_by_name(wan):
    model, inputs = wan
    layers = tuple(k.removesuffix(".processor") for k in model.attn_processors)
    plan = AttentionPlan(
        layers=layers, default=Choice(mode=Mode.int8_fp8),
        overrides=(Override(layers=("blocks.0.attn2", "blocks.1.attn2"), mode=Mode.full),),
    )
    with sagevideo.install(model, plan, backend="reference"), sagevideo.record_backends() as log:
        _run(model, inputs)
    assert log.counts == {"reference/fp8": 2, "sdpa": 2}


def test_the_global_sdpa_replacement_under_an_installed_interception_does_not_recurse(wan):
    """`F.scaled_dot_product_attention = sagevideo.scaled_dot_product_attention` with a handle
    installed: the layers' calls reach sagevideo's function directly (a Python function, which no
    TorchFunctionMode sees), whose fp32 fallback calls torch's own SDPA; the layer's mode lets that
    pass (it is not F's now). Each call computes once, as torch's SDPA; the fallback used to call
    F's, i.e. itself."""
    model, inputs = wan
    before = _run(model, inputs)
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = sagevideo.scaled_dot_product_attention
    try:
        with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log, \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = _run(model, inputs)
    finally:
        F.scaled_dot_product_attention = original
    assert torch.equal(out, before)
    assert [c.ran for c in log.choices] == ["sdpa"] * 4 and all("float32" in c.reason for c in log.choices)


def test_the_interception_sees_torchs_own_sdpa_as_F_s():
    """What sagevideo's fallbacks call reaches a TorchFunctionMode as `F.scaled_dot_product_attention`
    (the object the interception compares with), so capturing it changed nothing the mode sees."""
    from sagevideo.attention.functional import TORCH_SDPA

    seen = []

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func is F.scaled_dot_product_attention)
            return func(*args, **(kwargs or {}))

    q = torch.randn(1, 2, 8, 64)
    with Mode():
        TORCH_SDPA(q, q, q)
    assert seen == [True]


class _GroupedQueryModel(torch.nn.Module):
    """The least a dispatcher model has for install(): attention modules with processors; its
    attention calls SDPA with grouped-query heads, then with dropout."""

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.processor = object()

        def forward(self, q, k, v):
            grouped = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            dropped = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
            return grouped, dropped

    def __init__(self):
        super().__init__()
        self.attn = self.Attention()
        self.proj = torch.nn.Linear(4, 4)  # install() reads the model's device from its parameters

    @property
    def attn_processors(self):
        return {"attn.processor": self.attn.processor}

    def set_attn_processor(self, processors):
        self.attn.processor = processors["attn.processor"]

    def forward(self, q, k, v):
        return self.attn(q, k, v)


def test_intercepted_calls_keep_every_sdpa_argument(monkeypatch):
    """Grouped-query calls used to bypass sagevideo silently (0 routed); they now run in the kernels'
    index math, and dropout runs SDPA as asked, recorded as a fallback with its reason."""
    import sagevideo.attention.records
    from sagevideo.choices import auto_pv

    monkeypatch.setattr(sagevideo.attention.records, "_warned", set())  # each fallback reason warns once a process
    model = _GroupedQueryModel()
    gen = torch.Generator().manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU machine the kernels take CUDA tensors
    q = torch.randn(1, 4, 64, 64, generator=gen).half().to(device)
    k, v = (torch.randn(1, 2, 64, 64, generator=gen).half().to(device) for _ in range(2))
    with sagevideo.install(model), sagevideo.record_backends() as log, pytest.warns(UserWarning, match="dropout"):
        grouped, _ = model(q, k, v)
    kernel = "triton" if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1" else "sdpa"
    pv = auto_pv(q.device)  # install's pv="auto"
    assert log.counts == ({f"{kernel}/{pv}": 1, "sdpa": 1} if kernel == "triton" else {"sdpa": 2})
    assert "dropout_p=0.5: the kernels compute no dropout" in log.fallback_reasons
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    floor = 0.998 if pv == "fp8" else 0.999  # the contract's floor of the P·V mode that ran
    assert F.cosine_similarity(want.flatten(), grouped.float().flatten(), dim=0) > floor
    # an explicitly requested quantized backend refuses what it cannot compute
    with sagevideo.install(model, backend="reference"), pytest.raises(ValueError, match="dropout"):
        model(q, k, v)


# ------------------------------------------------------------------------------------------------
# A forward under an installed handle that routes no attention call is never silent: it warns once
# per handle, says why and how to fix, and `record_backends()` notes every such forward.


@pytest.fixture
def restore_dispatcher_backend():
    """set_attention_backend() also sets diffusers' process-wide backend, which
    reset_attention_backend() leaves as it is: put it back for the tests that follow."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    before = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry.set_active_backend(before)


class _AttentionWithoutSDPA:
    """A processor whose attention never reaches F.scaled_dot_product_attention (output: to_out(x))."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        return attn.to_out[0](hidden_states)


def _unrouted_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "routed no attention call" in str(w.message)
            or "routed none of its attention calls" in str(w.message)]


def test_flex_backend_warns_at_install_and_once_per_handle(restore_dispatcher_backend):
    model = tiny_wan()
    model.set_attention_backend("flex")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sagevideo.install(model, backend="reference"):
            with sagevideo.record_backends() as log:
                run_wan(model)
                run_wan(model)
    at_install = [str(w.message) for w in caught if str(w.message).startswith("sagevideo.install:")]
    assert len(at_install) == 1 and "'flex'" in at_install[0] and "set_attention_backend('native')" in at_install[0]
    forwards = _unrouted_warnings(caught)
    assert len(forwards) == 1, forwards  # two forwards, one warning
    assert "'flex'" in forwards[0] and "set_attention_backend('native')" in forwards[0]
    assert log.counts == {}
    (reason, forwards_noted), = log.summary()["unrouted"].items()
    assert "'flex'" in reason and forwards_noted == 2


def test_native_backend_again_routes_every_call(restore_dispatcher_backend):
    model = tiny_wan()
    model.set_attention_backend("flex")
    with pytest.warns(UserWarning, match="flex"), sagevideo.install(model, backend="reference"):
        model.set_attention_backend("native")  # the fix the warning names
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no unrouted warning now
            with sagevideo.record_backends() as log:
                run_wan(model)
    assert log.summary() == {"counts": {"reference/fp16": WAN_ATTENTION_CALLS}, "fallbacks": {}}


def test_processors_that_do_not_call_sdpa_are_reported():
    model = tiny_wan()
    model.set_attn_processor(_AttentionWithoutSDPA())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
            run_wan(model)
    (message,) = _unrouted_warnings(caught)
    assert "_AttentionWithoutSDPA" in message and "scaled_dot_product_attention" in message
    assert log.counts == {} and sum(log.unrouted.values()) == 1


def test_processors_replaced_after_install_are_reported():
    model = tiny_wan()
    with sagevideo.install(model, backend="reference"):
        run_wan(model)  # routes: the handle has seen these processors reach SDPA
        for module in model.modules():
            if hasattr(module, "processor"):
                module.processor = _AttentionWithoutSDPA()
        with pytest.warns(UserWarning, match="_AttentionWithoutSDPA"), sagevideo.record_backends() as log:
            run_wan(model)
    assert sum(log.unrouted.values()) == 1


def test_calls_the_router_declines_are_reported(monkeypatch):
    """SDPA calls that reached the interception but ran stock (e.g. dropout_p > 0)."""
    from sagevideo.pipelines import intercept

    model = tiny_wan()
    monkeypatch.setattr(intercept, "_route", lambda *args, **kwargs: None)
    with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
        with pytest.warns(UserWarning, match="routed none of its attention calls.*stock SDPA ran"):
            run_wan(model)
    assert log.counts == {} and sum(log.unrouted.values()) == 1


def test_a_routed_forward_notes_nothing():
    model = tiny_wan()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
            run_wan(model)
    assert log.unrouted == {}
    assert log.summary() == {"counts": {"reference/fp16": WAN_ATTENTION_CALLS}, "fallbacks": {}}


def test_a_forward_whose_layers_all_reuse_a_cache_is_not_reported():
    """After a routed forward, a forward where every attention module skips its processor (as attention
    caches do) is expected, not a silent fallback."""
    model = tiny_wan()
    attention = [m for m in model.modules() if hasattr(m, "processor")]
    with sagevideo.install(model, backend="reference"):
        run_wan(model)
        try:
            for m in attention:  # reuse: return the input as the output, never calling the processor
                m.forward = lambda hidden_states, *args, **kwargs: hidden_states
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with sagevideo.record_backends() as log:
                    run_wan(model)
        finally:
            for m in attention:
                del m.forward  # the class's forward shows through again
    assert log.counts == {} and log.unrouted == {}


# ------------------------------------------------------------------------------------------------
# install()/remove() leave other people's hooks alone: diffusers' HookRegistry hooks (a custom one,
# FasterCache's denoiser hook, group offloading) and accelerate's hooks on the transformer, registered
# before or after install, keep running while installed and after remove(), for a dispatcher model
# (SDPA interception: tiny Wan) and a processor-swap model (tiny CogVideoX). Also
# `enable_model_cpu_offload` (accelerate hooks that the pipeline removes and re-adds every call).


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


# ------------------------------------------------------------------------------------------------
# Regional compile (each block `.compile()`d) of dispatcher models with the interception installed:
# no recompile per block or call (the graph reads no layer name, step or counter), no graph break
# (Tensor.unflatten under the mode), records of every call of every run.


@pytest.mark.slow  # torch.compile of tiny transformers
# eager: outputs bit for bit; aot_eager: AOTAutograd over the blocks, which the inductor test below
# runs for tiny-wan already
@pytest.mark.parametrize("name, compile_backend", [("tiny-wan", "eager"), ("tiny-hunyuanvideo", "eager"),
                                                   ("tiny-hunyuanvideo", "aot_eager")])
def test_regional_compile_with_the_interception_is_clean(name, compile_backend):
    from tests.helpers.regional_compile import check_regional_compile

    check_regional_compile(name, compile_backend, exact=compile_backend == "eager")


@pytest.mark.slow
def test_regional_compile_with_the_interception_under_inductor_on_cpu():
    """Inductor's CPU codegen with the effectful record ops in the blocks' graph (it once freed buffers
    the fused reference kernel still read: UnboundLocalError in the generated code)."""
    from tests.helpers.regional_compile import check_regional_compile

    check_regional_compile("tiny-wan", "inductor", exact=False)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tiny-wan", "tiny-hunyuanvideo"])
def test_regional_compile_with_the_interception_under_inductor_on_gpu(name):
    from tests.helpers.regional_compile import check_regional_compile

    check_regional_compile(name, "inductor", exact=False, backend="triton", device="cuda", dtype=torch.bfloat16)


def test_step_dependent_plan_changes_the_choice_outside_the_graph(wan):
    """A plan entry for steps [1, ...) takes effect when the clock moves (the routes are re-resolved by
    the clock, not read from the step inside the forward)."""
    model, inputs = wan
    layers = tuple(k.removesuffix(".processor") for k in model.attn_processors)
    plan = AttentionPlan(layers=layers, default=Choice(mode=Mode.int8_fp16),
                         overrides=(Override(layers=("blocks.0.attn1",), steps=(1, None), mode=Mode.full),))
    with sagevideo.install(model, plan, backend="reference") as handle:
        with sagevideo.record_backends() as before:
            _run(model, inputs)
        handle.router.clock.step = 1
        with sagevideo.record_backends() as after:
            _run(model, inputs)
    assert before.counts == {"reference/fp16": 4}
    assert after.counts == {"reference/fp16": 3, "sdpa": 1}


def test_an_exception_inside_a_layer_leaves_no_mode_entered(wan):
    from torch.overrides import _get_current_function_mode_stack

    model, inputs = wan

    def boom(module, args, output):
        raise RuntimeError("boom")

    hook = model.blocks[0].attn1.register_forward_hook(boom, prepend=True)
    try:
        with sagevideo.install(model, backend="reference"), pytest.raises(RuntimeError, match="boom"):
            _run(model, inputs)
        assert _get_current_function_mode_stack() == []
    finally:
        hook.remove()


@pytest.mark.slow  # torch.compile of a tiny transformer
@pytest.mark.parametrize("whole", [True, False], ids=["model.compile", "compile_repeated_blocks"])
def test_compiled_after_install_never_recompiles(whole):
    """diffusers' own compile test (`error_on_recompile`): the second and later forwards reuse the first
    graph (the transformer's bookkeeping hooks are not compiled, so nothing they read is guarded); new
    sequence lengths with the reference backend go dynamic after the second, as stock code does."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = tiny_wan()
    hidden, timestep, text = wan_inputs()
    with sagevideo.install(model, backend="reference"):
        if whole:
            model.compile(backend="eager", fullgraph=True)
        else:
            model.compile_repeated_blocks(backend="eager", fullgraph=True)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(3):
                run_wan(model, (hidden, timestep, text))
        for frames in (5, 7, 9):
            run_wan(model, (torch.randn(1, 4, frames, 8, 8), timestep, text))
    assert counters["stats"]["unique_graphs"] == 2  # static, then one dynamic graph for every length


def test_a_layer_that_raises_outside_the_forward_leaves_no_mode_entered():
    """An installed attention layer called on its own (not inside the transformer's forward) that
    raises: SDPA elsewhere in the process stays plain and unrecorded."""
    from torch.overrides import _get_current_function_mode_stack

    model = tiny_wan()
    attention = model.blocks[0].attn1
    with sagevideo.install(model, backend="reference"):
        with sagevideo.record_backends() as log:
            attention(torch.randn(1, 12, 128))  # on its own, it still routes
        assert log.counts == {"reference/fp16": 1}
        with pytest.raises(RuntimeError):
            attention(torch.randn(1, 12, 7))  # hidden size 7, not 128
        assert _get_current_function_mode_stack() == []
        q = torch.randn(1, 2, 8, 64)
        with sagevideo.record_backends() as log:
            F.scaled_dot_product_attention(q, q, q)
        assert log.counts == {}
        assert len(attention._forward_hooks) == 1  # the one-off cleanup hooks removed themselves
