"""The text-to-video pipeline end to end on tiny models, its sampler against the formulas, and the
official sampler's prompt text (FPS and motion-score suffixes)."""

import pytest
import torch

from sagevideo.pipelines.opensora.packing import pack_latents, unpack_latents
from sagevideo.pipelines.opensora.pipeline import add_prompt_suffixes
from tests.helpers.opensora import tiny_opensora_pipeline


@pytest.fixture(scope="module")
def pipe():
    return tiny_opensora_pipeline()


def test_two_steps_end_to_end(pipe):
    out = pipe("a red fox in snow", height=32, width=32, num_frames=5, num_inference_steps=2,
               generator=torch.Generator().manual_seed(0), output_type="np")
    frames = out.frames
    assert frames.shape == (1, 5, 32, 32, 3)
    assert frames.min() >= 0 and frames.max() <= 1


def test_sampler_matches_the_formulas(pipe):
    """Latents after 2 steps = shifted linspace Euler with u2 + g_img (u - u2) + g_txt (c - u), written here."""
    prompt, steps, g_txt, g_img = "a cat", 2, 7.5, 3.0
    noise = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    got = pipe(prompt, height=32, width=32, num_frames=5, num_inference_steps=steps, latents=noise.clone(),
               output_type="latent", max_sequence_length=16).frames

    def encode(text):
        tok = dict(padding="max_length", truncation=True, return_tensors="pt")
        ids = pipe.tokenizer([text], max_length=16, **tok).input_ids
        ids2 = pipe.tokenizer_2([text], max_length=77, **tok).input_ids
        return pipe.text_encoder(ids).last_hidden_state, pipe.text_encoder_2(ids2).pooler_output

    pos, neg = encode("a cat. 24 FPS. 4 motion score."), encode("")
    tokens_per_frame, t_lat = 2 * 2, 2
    alpha = (1 + (tokens_per_frame - 256) * 2 / 3840) * t_lat**0.5
    t = torch.linspace(1, 0, steps + 1)
    sigmas = alpha * t / (1 + (alpha - 1) * t)
    ids = torch.tensor([(f, i, j) for f in range(2) for i in range(2) for j in range(2)], dtype=torch.float32)
    x = noise
    with torch.no_grad():
        for i in range(steps):
            preds = []
            for txt, pooled in (pos, neg, neg):  # cond is zero for text-to-video in every branch
                preds.append(pipe.transformer(
                    pack_latents(x), ids[None], txt, torch.zeros(1, 16, 3), sigmas[i : i + 1], pooled,
                    cond=torch.zeros(1, 8, 68)))
            c, u, u2 = preds
            v = u2 + g_img * (u - u2) + g_txt * (c - u)
            x = x + (sigmas[i + 1] - sigmas[i]) * unpack_latents(v, 2, 4, 4)
    torch.testing.assert_close(got, x, atol=1e-5, rtol=1e-5)


def test_refuses_sizes_and_shifted_schedulers(pipe):
    with pytest.raises(ValueError, match="multiples of 16"):
        pipe("x", height=40, width=32, num_frames=5, num_inference_steps=1)
    with pytest.raises(ValueError, match="1 \\+ a multiple of 4"):
        pipe("x", height=32, width=32, num_frames=6, num_inference_steps=1)
    from diffusers import FlowMatchEulerDiscreteScheduler

    original = pipe.scheduler
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    try:
        with pytest.raises(ValueError, match="shift"):
            pipe("x", height=32, width=32, num_frames=5, num_inference_steps=1)
    finally:
        pipe.scheduler = original


def test_suffixes_reach_the_encoders(pipe, monkeypatch):
    seen = []
    real = pipe.encode_prompt

    def spy(prompts, device, max_sequence_length=512):
        seen.append(list(prompts))
        return real(prompts, device, max_sequence_length)

    monkeypatch.setattr(pipe, "encode_prompt", spy)
    pipe("a dog", negative_prompt="blurry", height=32, width=32, num_frames=1, num_inference_steps=1,
         output_type="latent", max_sequence_length=8, fps=24, motion_score=4)
    assert seen == [[add_prompt_suffixes("a dog", 24, 4)], ["blurry"]]


@pytest.mark.parametrize("oscillation", [True, False])
def test_guidance_oscillates_by_default(pipe, monkeypatch, oscillation):
    """The official 256px/768px configs (text_osci, image_osci): both scales are 1.0 on odd steps from step 10."""
    from sagevideo.pipelines.opensora import pipeline as module

    used = []
    real = module.combine_guidance

    def spy(c, u, u2, text_scale, image_scale):
        used.append((text_scale, image_scale))
        return real(c, u, u2, text_scale, image_scale)

    monkeypatch.setattr(module, "combine_guidance", spy)
    options = {} if oscillation else dict(text_oscillation=False, image_oscillation=False)
    pipe("a cat", height=32, width=32, num_frames=1, num_inference_steps=14, output_type="latent",
         max_sequence_length=8, **options)
    plain = [(7.5, 3.0)] * 14
    assert used == ([(7.5, 3.0)] * 11 + [(1.0, 1.0), (7.5, 3.0), (1.0, 1.0)] if oscillation else plain)


def test_prompt_text_of_the_official_sampler():
    assert add_prompt_suffixes("a cat playing piano", 24, 4) == "a cat playing piano. 24 FPS. 4 motion score."
    assert add_prompt_suffixes("  a cat.\n", 24, 4) == "a cat. 24 FPS. 4 motion score."  # stripped, one period
    assert add_prompt_suffixes("a cat at 30 FPS.", 24, 4) == "a cat at 30 FPS. 4 motion score."  # FPS given
    assert add_prompt_suffixes("a cat at 30 FPS", 24, 4) == "a cat at 30 FPS. 4 motion score."  # period first
    assert add_prompt_suffixes("a cat, FPS.", 24, 4) == "a cat, FPS. 24 FPS. 4 motion score."  # no number
    assert add_prompt_suffixes("a cat", 24, None) == "a cat. 24 FPS."
    assert add_prompt_suffixes("a cat", None, None) == "a cat"
