"""The built-in tiny HunyuanVideo: offline, deterministic, real HunyuanVideo classes; its prompt
template is cropped exactly as the real pipeline's."""

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


def test_template_is_diffusers_and_cropped_exactly(hunyuan_pipe):
    """What the transformer gets is the prompt and the closing <|eot_id|> (no template token, no
    prompt token lost), as with the real tokenizer and diffusers' crop_start=95."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    from sagevideo.pipelines.hunyuanvideo import prompts

    assert prompts.TEMPLATE == DEFAULT_PROMPT_TEMPLATE["template"]
    assert prompts.DIFFUSERS_CROP_START == DEFAULT_PROMPT_TEMPLATE["crop_start"]
    tok = hunyuan_pipe.tokenizer
    template = prompts.prompt_template(tok)
    ids = tok(template["template"].format("a cat")).input_ids[template["crop_start"]:]
    assert tok.decode(ids) == "a cat<|eot_id|>"
    assert prompts.prompt_tokens(tok, "a cat") == len("a cat") + 1
    embeds, mask = hunyuan_pipe._get_llama_prompt_embeds("a cat", template, max_sequence_length=256)
    assert embeds.shape == (1, 256, 32) and mask.sum().item() == 6  # the prompt's bytes and <|eot_id|>
