"""The HunyuanVideo 1.5 family (`pipelines/hunyuanvideo15/family.py`): its layers' masks (query mask x
key mask over the padded text) run in the kernels as key masks, with SDPA's result for the rest."""

import torch

import sagevideo
from sagevideo.pipelines import families
from sagevideo.pipelines.plans import AttentionPlan
from tests.helpers.video_models import run_model, tiny_model

NAME = "hunyuanvideo15"
LAYERS = ["context_embedder.token_refiner.refiner_blocks.0.attn", "transformer_blocks.0.attn",
          "transformer_blocks.1.attn"]


def test_every_layer_is_declared_key_padding_and_no_other_model_is():
    model = tiny_model(NAME)
    assert sorted(families.key_padding_layers(model)) == sorted(LAYERS)
    assert families.key_padding_layers(tiny_model("framepack")) == {}
    assert families.get("hunyuanvideo15").pipeline_classes == ("HunyuanVideo15Pipeline",
                                                               "HunyuanVideo15ImageToVideoPipeline")


def test_every_masked_call_runs_in_the_kernels_as_sdpa_would_compute_it():
    """With padded text (4 of 6 prompt tokens, 2 of 5 ByT5 tokens), every call of the tiny model runs
    quantized, none on SDPA; full precision through the same path is SDPA's result bit for bit."""
    model = tiny_model(NAME)
    stock = run_model(model, NAME)
    with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
        quantized = run_model(model, NAME)
    assert log.counts == {"reference/fp16": len(LAYERS)} and log.fallback_reasons == {}
    assert torch.nn.functional.cosine_similarity(stock.flatten(), quantized.flatten(), dim=0) > 0.9999
    with sagevideo.install(model, AttentionPlan.uniform("full")):
        assert torch.equal(run_model(model, NAME), stock)
    assert torch.equal(run_model(model, NAME), stock)
