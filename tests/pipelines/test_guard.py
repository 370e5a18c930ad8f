"""The run-time guard in installed models (`pipelines/guard.py`): per layer, read at the end of each
forward; "warn" records and warns once per layer, "full" reruns the forward with those layers in full
precision (its output equals a plan that keeps them full), "fail" raises naming them. Both install
paths (interception: tiny Wan; processors: tiny CogVideoX), eager and regionally compiled; no alarm
on the families' tiny models at their released configs' statistics (random weights)."""

import warnings

import pytest
import torch

import sagevideo
from sagevideo.errors import PeakyAttentionError
from sagevideo.pipelines.plans import AttentionPlan, Mode, Override
from tests.helpers.wan import WAN_ATTENTION_CALLS, run_wan, tiny_wan, wan_inputs


def _peaky_wan():
    """Tiny Wan whose blocks.1.attn1 scores are ~1,600x the others' (its q/k norms scaled by 40)."""
    model = tiny_wan()
    with torch.no_grad():
        model.blocks[1].attn1.norm_q.weight.mul_(40)
        model.blocks[1].attn1.norm_k.weight.mul_(40)
    return model


def _peaky_cogvideox():
    from diffusers import CogVideoXTransformer3DModel

    from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = CogVideoXTransformer3DModel(**TRANSFORMER_CONFIG).eval()
    with torch.no_grad():
        attn = model.transformer_blocks[0].attn1
        for norm in (attn.norm_q, attn.norm_k):
            norm.weight.mul_(60)
    return model, "transformer_blocks.0.attn1"


def _run_cogvideox(model):
    config = model.config
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 3, config.in_channels, config.sample_height, config.sample_width, generator=gen)
    text = torch.randn(1, 16, config.text_embed_dim, generator=gen)
    with torch.no_grad():
        return model(hidden_states=hidden, encoder_hidden_states=text, timestep=torch.tensor([10]),
                     return_dict=False)[0]


def _models():
    wan = _peaky_wan()
    cog, cog_layer = _peaky_cogvideox()
    return {"wan": (wan, lambda m: run_wan(m, wan_inputs()), "blocks.1.attn1"),
            "cogvideox": (cog, _run_cogvideox, cog_layer)}


@pytest.mark.parametrize("kind", ["wan", "cogvideox"])
def test_warn_records_the_layer_per_forward_and_warns_once(kind):
    model, run, layer = _models()[kind]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sagevideo.install(model, backend="reference") as handle, sagevideo.record_backends() as log:
            run(model)
            run(model)
    (per_forward,) = set(handle.peaky.values())
    assert list(handle.peaky) == [layer] and per_forward > 0
    assert log.summary()["peaky"] == {layer: per_forward}
    guard_warnings = [w for w in caught if "past INT8's accuracy" in str(w.message)]
    assert len(guard_warnings) == 1 and layer in str(guard_warnings[0].message)


@pytest.mark.parametrize("kind", ["wan", "cogvideox"])
def test_full_reruns_the_forward_with_the_flagged_layers_in_full_precision(kind):
    model, run, layer = _models()[kind]
    layers = tuple(k.removesuffix(".processor") for k in model.attn_processors)
    kept_full = AttentionPlan(layers=layers, overrides=(Override(layers=(layer,), mode=Mode.int8_fp16),))
    kept_full = AttentionPlan(layers=layers, default=kept_full.default,
                              overrides=(Override(layers=(layer,), mode=Mode.full),))
    with sagevideo.install(model, kept_full, backend="reference"):
        expected = run(model)
    with sagevideo.install(model, backend="reference", guard="full") as handle, sagevideo.record_backends() as log:
        first, second = run(model), run(model)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert handle.router.forced_full == {layer}
    assert log.counts["sdpa"] == 2  # the rerun and the second forward: that layer in full precision


@pytest.mark.parametrize("kind", ["wan", "cogvideox"])
def test_fail_raises_naming_the_layers(kind):
    model, run, layer = _models()[kind]
    with sagevideo.install(model, backend="reference", guard="fail"):
        with pytest.raises(PeakyAttentionError, match=layer.replace(".", r"\.")):
            run(model)


def test_an_unknown_guard_is_refused():
    with pytest.raises(ValueError, match="guard='loud' is not supported"):
        sagevideo.install(tiny_wan(), guard="loud")


@pytest.mark.slow  # torch.compile of a tiny transformer
def test_regional_compile_counts_per_layer_in_one_graph():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _peaky_wan()
    with sagevideo.install(model, backend="reference") as handle, sagevideo.record_backends() as log:
        model.compile_repeated_blocks(backend="eager", fullgraph=True)
        for _ in range(2):
            run_wan(model, wan_inputs())
    assert counters["stats"]["unique_graphs"] == 1  # the counter is a graph input, like a buffer
    assert log.counts == {"reference/fp16": 2 * WAN_ATTENTION_CALLS}
    assert list(handle.peaky) == ["blocks.1.attn1"] and handle.peaky["blocks.1.attn1"] > 0


@pytest.mark.parametrize("name", ["tiny-cogvideox", "tiny-wan", "tiny-hunyuanvideo", "tiny-opensora"])
def test_no_alarm_on_the_families_tiny_models(name):
    from sagevideo.pipelines.forwards import build_step

    step = build_step(name, "cpu", torch.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sagevideo.install(step.model, backend="reference") as handle, sagevideo.record_backends() as log:
            step.run()
    assert sum(log.counts.values()) > 0 and handle.peaky == {} and "peaky" not in log.summary()
    assert not [w for w in caught if "past INT8's accuracy" in str(w.message)]
