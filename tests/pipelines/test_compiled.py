"""Code compiled before `install` (`pipelines/compiled.py`): whatever a user compiled and ran first —
blocks (`.compile()`, diffusers' `compile_repeated_blocks()`, `torch.compile(block)` put back in
place), the whole model (`model.compile()`, a `torch.compile(model)` wrapper) or only some blocks —
every attention call routes through sagevideo after install, recorded, and `remove()` gives stock
outputs again. Compiled with the "eager" backend: Dynamo's tracing and guards are what matter."""

import warnings
from unittest import mock

import pytest
import torch

import sagevideo
from tests.helpers.wan import WAN_ATTENTION_CALLS, run_wan, tiny_wan, tiny_wan22_pipeline, wan_inputs

pytestmark = pytest.mark.slow  # torch.compile of tiny transformers


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


def _compile(model, style: str):
    """`model` compiled the way `style` names; returns what the user then calls."""
    blocks = model.transformer_blocks if hasattr(model, "transformer_blocks") else model.blocks
    if style == "block.compile":
        for block in blocks:
            block.compile(backend="eager")
    elif style == "compile_repeated_blocks":
        model.compile_repeated_blocks(backend="eager")
    elif style == "torch.compile(block)":
        for i, block in enumerate(blocks):
            blocks[i] = torch.compile(block, backend="eager")
    elif style == "model.compile":
        model.compile(backend="eager")
    elif style == "torch.compile(model)":
        return torch.compile(model, backend="eager")
    elif style == "some blocks":
        blocks[0].compile(backend="eager")
    return model


MODELS = {"wan": (tiny_wan, run_wan, WAN_ATTENTION_CALLS), "cogvideox": (_tiny_cogvideox, _run_cogvideox, 2)}
STYLES = ["block.compile", "compile_repeated_blocks", "torch.compile(block)", "model.compile", "torch.compile(model)",
          "some blocks"]


# Each style on the interception path (Wan); the processor path (CogVideoX) shares the retrace.
CASES = [("wan", style) for style in STYLES if style != "block.compile"] + [
    ("cogvideox", "block.compile"), ("cogvideox", "model.compile")]


@pytest.mark.parametrize(("kind", "style"), CASES)
def test_code_compiled_before_install_routes_every_call(kind, style):
    build, run, calls = MODELS[kind]
    torch._dynamo.reset()
    eager_model = build()
    with sagevideo.install(eager_model, backend="reference"):
        quantized = run(eager_model)
    model = build()
    stock = run(model)
    model = _compile(model, style)
    assert torch.equal(run(model), stock)  # compiled and run: Dynamo holds code traced without sagevideo

    with pytest.warns(UserWarning, match="compiled and run before install"):
        handle = sagevideo.install(model, backend="reference")
    with sagevideo.record_backends() as log:
        out = run(model)
    assert log.counts == {"reference/fp16": calls} and log.unrouted == {}
    assert torch.equal(out, quantized)
    handle.remove()
    with sagevideo.record_backends() as log:
        assert torch.equal(run(model), stock)
    assert log.counts == {}


def test_a_compiled_transformer_in_a_pipeline_is_installed_inside_its_wrapper():
    torch._dynamo.reset()
    pipe = tiny_wan22_pipeline(boundary_ratio=None)
    inputs = wan_inputs()
    stock = run_wan(pipe.transformer, inputs)
    pipe.transformer = torch.compile(pipe.transformer, backend="eager")
    run_wan(pipe.transformer, inputs)
    with pytest.warns(UserWarning, match="pipe.transformer was compiled"):
        handle = sagevideo.install(pipe, backend="reference")
    assert handle.transformer is pipe.transformer._orig_mod
    with sagevideo.record_backends() as log:
        assert not torch.equal(run_wan(pipe.transformer, inputs), stock)
    assert log.counts == {"reference/fp16": WAN_ATTENTION_CALLS}


def test_compiling_after_install_needs_no_retrace_and_warns_nothing():
    torch._dynamo.reset()
    model = tiny_wan()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = sagevideo.install(model, backend="reference")
    model.compile(backend="eager")
    with sagevideo.record_backends() as log:
        run_wan(model)
    assert log.counts == {"reference/fp16": WAN_ATTENTION_CALLS}
    handle.remove()  # the compiled code traced the hooks: remove() makes it trace again, stock
    with sagevideo.record_backends() as log:
        run_wan(model)
    assert log.counts == {}


def test_attention_that_bypassed_the_hooks_never_passes_for_a_cache_hit():
    """Compiled code install could not find (here: its detection switched off) runs attention stock:
    the forward is reported as unrouted, with what to do, not taken for a cache reusing the output."""
    torch._dynamo.reset()
    model = tiny_wan()
    for block in model.blocks:
        block.compile(backend="eager")
    run_wan(model)
    with mock.patch("sagevideo.pipelines.install.compiled_parts", lambda *args: []):
        handle = sagevideo.install(model, backend="reference")
    with pytest.warns(UserWarning, match="compiled before install|traced before install"), \
            sagevideo.record_backends() as log:
        run_wan(model)
    assert log.counts == {}
    (reason,) = log.unrouted
    assert "none of its attention layers" in reason and "torch._dynamo.reset()" in reason
    handle.remove()
