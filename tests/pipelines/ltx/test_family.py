"""The LTX family (`pipelines/ltx/family.py`): LTX-Video's and LTX-2's text cross-attention masks
(0 / -10000 per head) run in the kernels as key masks; other float masks run SDPA, recorded."""

import pytest
import torch

import sagevideo
from sagevideo.pipelines import families
from sagevideo.pipelines.plans import AttentionPlan
from tests.helpers.video_models import VALID_TEXT, run_model, tiny_model

# model -> (text cross-attention layers, every attention layer)
LAYERS = {"ltx": (["transformer_blocks.0.attn2"], 2),
          "ltx2": (["transformer_blocks.0.attn2", "transformer_blocks.0.audio_attn2"], 6)}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_text_masks_run_in_the_kernels(name):
    model = tiny_model(name)
    text_layers, calls = LAYERS[name]
    assert sorted(families.key_padding_layers(model)) == text_layers
    stock = run_model(model, name)
    with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
        quantized = run_model(model, name)
    assert log.counts == {"reference/fp16": calls} and log.fallback_reasons == {}
    assert torch.nn.functional.cosine_similarity(stock.flatten(), quantized.flatten(), dim=0) > 0.9999
    with sagevideo.install(model, AttentionPlan.uniform("full")):
        assert (run_model(model, name) - stock).abs().max() < 1e-6  # SDPA on the key mask: SDPA's result
    assert torch.equal(run_model(model, name), stock)


def test_a_text_mask_with_weights_runs_sdpa_with_the_reason():
    """A prompt mask of weights (0.5), not padding: its additive mask is no key padding, so SDPA runs it."""
    model = tiny_model("ltx")
    weights = torch.zeros(1, 6)
    weights[:, :VALID_TEXT] = 0.5
    with sagevideo.install(model, backend="reference"), sagevideo.record_backends() as log:
        run_model(model, "ltx", encoder_attention_mask=weights)
    assert log.counts == {"reference/fp16": 1, "sdpa": 1}
    (reason,) = log.fallback_reasons
    assert "attn_mask of dtype torch.float32" in reason
