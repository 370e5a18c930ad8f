"""The built-in tiny CogVideoX: offline, deterministic, real CogVideoX classes."""

import torch


def test_tiny_pipeline_is_real_cogvideox_and_offline(tiny_pipe):
    from diffusers import AutoencoderKLCogVideoX, CogVideoXPipeline, CogVideoXTransformer3DModel
    from transformers import T5EncoderModel

    assert isinstance(tiny_pipe, CogVideoXPipeline)
    assert isinstance(tiny_pipe.transformer, CogVideoXTransformer3DModel)
    assert isinstance(tiny_pipe.vae, AutoencoderKLCogVideoX)
    assert isinstance(tiny_pipe.text_encoder, T5EncoderModel)
    cfg = tiny_pipe.transformer.config
    assert (cfg.num_attention_heads, cfg.attention_head_dim) == (2, 64)  # a native kernel head dim
    assert cfg.use_rotary_positional_embeddings


def test_tiny_weights_are_fixed_and_global_rng_untouched():
    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_pipeline()
    assert torch.equal(torch.rand(3), expected_next)  # building did not consume the global RNG
    b = tiny_pipeline()
    for name in ("transformer", "vae", "text_encoder"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), name
