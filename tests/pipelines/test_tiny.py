"""The built-in tiny model: offline, deterministic, real CogVideoX classes, prompt-sensitive."""

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


def test_tokenizer_keeps_prompts_apart(tiny_pipe):
    tok = tiny_pipe.tokenizer
    ids = tok(
        ["a cat", "a dog", "ein Hund 🐕"],
        padding="max_length",
        max_length=16,
        truncation=True,
        add_special_tokens=True,
        return_tensors="pt",
    ).input_ids
    assert ids.shape == (3, 16)
    assert len({tuple(row.tolist()) for row in ids}) == 3
    assert (ids == tok.eos_token_id).sum(dim=1).tolist() == [1, 1, 1]
    assert tok.batch_decode(tok(["ein Hund 🐕"]).input_ids, skip_special_tokens=True) == ["ein Hund 🐕"]

    embeds = tiny_pipe.encode_prompt(
        ["a cat", "a dog"],
        do_classifier_free_guidance=False,
        max_sequence_length=32,
        device=torch.device("cpu"),
    )[0]
    assert not torch.allclose(embeds[0], embeds[1])
