"""The built-in tiny HunyuanVideo: offline, deterministic, real HunyuanVideo classes."""

import torch


def test_tiny_pipeline_is_real_hunyuanvideo_and_offline(hunyuan_pipe):
    from diffusers import AutoencoderKLHunyuanVideo, HunyuanVideoPipeline, HunyuanVideoTransformer3DModel
    from transformers import CLIPTextModel, LlamaModel

    assert isinstance(hunyuan_pipe, HunyuanVideoPipeline)
    assert isinstance(hunyuan_pipe.transformer, HunyuanVideoTransformer3DModel)
    assert isinstance(hunyuan_pipe.vae, AutoencoderKLHunyuanVideo)
    assert isinstance(hunyuan_pipe.text_encoder, LlamaModel)
    assert isinstance(hunyuan_pipe.text_encoder_2, CLIPTextModel)
    cfg = hunyuan_pipe.transformer.config
    assert (cfg.num_attention_heads, cfg.attention_head_dim) == (2, 64)  # a native kernel head dim
    assert sum(cfg.rope_axes_dim) == cfg.attention_head_dim and cfg.num_refiner_layers == 2
    assert (hunyuan_pipe.vae_scale_factor_temporal, hunyuan_pipe.vae_scale_factor_spatial) == (4, 8)


def test_tiny_weights_are_fixed_and_global_rng_untouched():
    from sagevideo.pipelines.hunyuanvideo.tiny import tiny_pipeline

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_pipeline()
    assert torch.equal(torch.rand(3), expected_next)  # building did not consume the global RNG
    b = tiny_pipeline()
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name
