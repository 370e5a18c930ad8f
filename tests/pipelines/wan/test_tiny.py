"""The built-in tiny Wan models (`pipelines/wan/tiny.py`): offline, deterministic, the real diffusers
classes and layouts of Wan 2.1 (t2v, i2v) and Wan 2.2 (A14B, TI2V-5B)."""

from __future__ import annotations

import pytest
import torch

from sagevideo.pipelines.wan.tiny import BOUNDARY_RATIO, MODELS, tiny_pipeline


def states_equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_every_tiny_model_is_its_release_layout(wan_pipes):
    import diffusers
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import CLIPVisionModel, UMT5EncoderModel

    for name, spec in MODELS.items():
        pipe = wan_pipes[name]
        assert type(pipe) is getattr(diffusers, spec.pipeline_class), name
        assert isinstance(pipe.transformer, WanTransformer3DModel) and isinstance(pipe.vae, AutoencoderKLWan)
        assert isinstance(pipe.text_encoder, UMT5EncoderModel)
        cfg = pipe.transformer.config
        assert (cfg.num_attention_heads, cfg.attention_head_dim) == (2, 64), name  # a native kernel head dim
        assert pipe.config.boundary_ratio == spec.boundary_ratio
        assert bool(pipe.config.expand_timesteps) == spec.expand_timesteps
        assert (pipe.transformer_2 is not None) == (spec.boundary_ratio is not None)
        assert not any(m.training for m in (pipe.transformer, pipe.vae, pipe.text_encoder)), name
    a14b = wan_pipes["tiny-wan22"]
    assert a14b.config.boundary_ratio == BOUNDARY_RATIO
    assert not states_equal(a14b.transformer, a14b.transformer_2)  # two denoisers, two sets of weights
    assert states_equal(a14b.transformer, wan_pipes["tiny-wan"].transformer)  # per-component seeds
    i2v = wan_pipes["tiny-wan-i2v"]
    assert isinstance(i2v.image_encoder, CLIPVisionModel)
    assert i2v.transformer.config.in_channels == 16 + 4 + 16  # [noisy latents; mask; image latents]
    assert i2v.transformer.config.image_dim == i2v.image_encoder.config.hidden_size
    ti2v = wan_pipes["tiny-wan22-ti2v"]
    assert ti2v.vae_scale_factor_spatial == 16 and ti2v.vae.config.patch_size == 2 and ti2v.vae.config.is_residual


def test_weights_are_fixed_and_the_global_rng_untouched():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_pipeline("tiny-wan22")
    assert torch.equal(torch.rand(3), expected_next)  # building did not consume the global RNG
    b = tiny_pipeline("tiny-wan22")
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        assert states_equal(getattr(a, name), getattr(b, name)), name
    with pytest.raises(KeyError, match="no tiny Wan model 'tiny-wan3'; built in: "):
        tiny_pipeline("tiny-wan3")
