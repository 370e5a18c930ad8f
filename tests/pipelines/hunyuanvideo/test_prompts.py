"""HunyuanVideo's prompt template, against diffusers' own: cropped exactly (the prompt and the
closing <|eot_id|> reach the transformer, no template token and no prompt token lost), and the
token count the job check uses is what the pipeline's Llama reads."""


def test_template_is_diffusers_and_cropped_exactly(hunyuan_pipe):
    """As with the real tokenizer and diffusers' crop_start=95, for the tiny byte-level tokenizer."""
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


def test_the_count_is_what_the_pipeline_reads_and_cuts_silently(hunyuan_pipe):
    """diffusers truncates a longer prompt to 256 tokens without a warning: the reason the family
    refuses it before loading (tests/pipelines/hunyuanvideo/test_family.py)."""
    from sagevideo.pipelines.hunyuanvideo import prompts

    tok = hunyuan_pipe.tokenizer
    template = prompts.prompt_template(tok)
    for prompt, tokens in (("x" * 255, 256), ("x" * 300, 301)):
        assert prompts.prompt_tokens(tok, prompt) == tokens
        _, mask = hunyuan_pipe._get_llama_prompt_embeds(prompt, template, max_sequence_length=256)
        assert mask.sum().item() == min(tokens, 256)
