"""The built-in tiny-opensora: the classes a converted Open-Sora 2.0 folder loads, built offline
from configs, deterministic, with what it keeps of the real model."""

import torch


def test_tiny_opensora_is_the_real_pipeline_of_real_parts():
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler
    from transformers import CLIPTextModel, T5EncoderModel

    from sagevideo.pipelines.opensora import OpenSoraPipeline, OpenSoraTransformer3DModel
    from sagevideo.pipelines.opensora.tiny import tiny_pipeline

    pipe = tiny_pipeline()
    assert isinstance(pipe, OpenSoraPipeline) and isinstance(pipe.transformer, OpenSoraTransformer3DModel)
    assert isinstance(pipe.vae, AutoencoderKLHunyuanVideo)
    assert isinstance(pipe.scheduler, FlowMatchEulerDiscreteScheduler)
    assert isinstance(pipe.text_encoder, T5EncoderModel) and isinstance(pipe.text_encoder_2, CLIPTextModel)
    cfg, vae = pipe.transformer.config, pipe.vae.config
    assert (cfg.hidden_size // cfg.num_heads, cfg.depth, cfg.depth_single_blocks) == (64, 1, 1)  # a native head dim
    assert sum(cfg.axes_dim) == 64 and cfg.in_channels == 16 * 2 * 2 and cfg.cond_in_channels == 17 * 2 * 2
    assert (vae.latent_channels, vae.spatial_compression_ratio, vae.temporal_compression_ratio) == (16, 8, 4)
    assert vae.scaling_factor == 0.476986  # the official scale (shift 0)
    assert not any(m.training for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2))


def test_tiny_weights_are_fixed_and_the_global_rng_untouched():
    from sagevideo.pipelines.opensora.tiny import tiny_pipeline

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_pipeline()
    assert torch.equal(torch.rand(3), expected_next)
    b = tiny_pipeline()
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name
