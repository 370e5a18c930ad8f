"""bench/random_models.py: the random-weight folders the whole-video benchmarks write load through
sagevideo's folder path and as diffusers' pipeline (small configs here; the real ones on a GPU)."""

import pytest
import torch

from bench.random_models import WAN_720P_SCHEDULER, write_cogvideox_folder, write_wan_folder
from sagevideo.pipelines.loading import load_pipeline, resolve_model


@pytest.mark.slow  # builds, writes and loads a 2-layer text encoder of width 4096 (~80 MB)
@pytest.mark.parametrize("family", ["cogvideox", "wan"])
def test_a_written_folder_loads_through_sagevideo_and_diffusers(tmp_path, family):
    from diffusers import DiffusionPipeline

    if family == "wan":
        from sagevideo.pipelines.wan.tiny import TRANSFORMER_CONFIG, VAE_CONFIG

        write_wan_folder(tmp_path, dict(TRANSFORMER_CONFIG, text_dim=4096), VAE_CONFIG, device="cpu")
        want = ("WanPipeline", "UniPCMultistepScheduler")
    else:
        from sagevideo.pipelines.cogvideox.tiny import TRANSFORMER_CONFIG, VAE_CONFIG

        write_cogvideox_folder(tmp_path, dict(TRANSFORMER_CONFIG, text_embed_dim=4096), VAE_CONFIG, device="cpu")
        want = ("CogVideoXPipeline", "CogVideoXDDIMScheduler")
    source = resolve_model(str(tmp_path))
    assert not source.is_tiny and source.family == family and source.pipeline_class == want[0]
    ours = load_pipeline(source, "cpu", torch.float32)
    stock = DiffusionPipeline.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert (type(stock).__name__, type(stock.scheduler).__name__) == want
    assert stock.transformer.dtype == torch.bfloat16 and stock.text_encoder.config.d_model == 4096
    if family == "wan":
        assert stock.scheduler.config.flow_shift == WAN_720P_SCHEDULER["flow_shift"]
    # bf16 on disk: the float32 copy sagevideo loads holds the same values
    for name, tensor in stock.transformer.state_dict().items():
        assert torch.equal(ours.transformer.state_dict()[name], tensor.float()), name
