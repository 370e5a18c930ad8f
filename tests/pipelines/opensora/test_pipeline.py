"""The pipeline end to end on tiny models: its text-to-video and image-to-video samplers against the
official sampler's formulas written here, the prompt suffixes reaching the encoders, the reference image's crop."""

import numpy as np
import pytest
import torch
from PIL import Image

from sagevideo.pipelines.opensora.packing import pack_latents, unpack_latents
from sagevideo.pipelines.opensora.prompts import add_prompt_suffixes
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


def official_i2v_sampler(pipe, prompt, picture, noise, steps, g_txt=7.5, g_img=3.0, max_length=16):
    """The official I2VDenoiser with cond_type "i2v_head" (text_osci, image_osci and scale_temporal_osci
    on, as the 256px/768px configs), written from the official sampling code: reference = scale *
    VAE posterior sample of the first frame; cond = pack(cat(mask, masked_ref)) with frame 0 set,
    branches [cond, cond, 0]; g_img per latent frame linspace(1, linspace(g_img, 1, steps + 1)[i], T)
    while g_img > 1; x += (t_prev - t) * pred; latent frame 0 replaced by the reference at the end."""
    b, c, t_lat, h, w = noise.shape

    def encode(text):
        tok = dict(padding="max_length", truncation=True, return_tensors="pt")
        ids = pipe.tokenizer([text], max_length=max_length, **tok).input_ids
        ids2 = pipe.tokenizer_2([text], max_length=77, **tok).input_ids
        return pipe.text_encoder(ids).last_hidden_state, pipe.text_encoder_2(ids2).pooler_output

    pos, neg = encode(add_prompt_suffixes(prompt, 24, 4)), encode("")
    pixels = torch.from_numpy(np.asarray(picture, dtype=np.float32)).permute(2, 0, 1)[None, :, None] / 127.5 - 1
    generator = torch.Generator().manual_seed(7)
    reference = pipe.vae.encode(pixels).latent_dist.sample(generator=generator) * pipe.vae.config.scaling_factor
    masks, masked_ref = torch.zeros(b, 1, t_lat, h, w), torch.zeros(b, c, t_lat, h, w)
    masks[:, :, 0] = 1
    masked_ref[:, :, 0] = reference[:, :, 0]
    cond = pack_latents(torch.cat([masks, masked_ref], dim=1))
    conds = (cond, cond, torch.zeros_like(cond))
    tokens_per_frame = (h // 2) * (w // 2)
    alpha = (1 + (tokens_per_frame - 256) * 2 / 3840) * t_lat**0.5
    t = torch.linspace(1, 0, steps + 1)
    sigmas = alpha * t / (1 + (alpha - 1) * t)
    ids = torch.tensor([(f, i, j) for f in range(t_lat) for i in range(h // 2) for j in range(w // 2)],
                       dtype=torch.float32)
    x = noise
    with torch.no_grad():
        for i in range(steps):
            preds = [pipe.transformer(pack_latents(x), ids[None], txt, torch.zeros(1, max_length, 3),
                                      sigmas[i : i + 1], pooled, cond=k)
                     for (txt, pooled), k in zip((pos, neg, neg), conds, strict=True)]
            c_, u, u2 = preds
            text_gs = g_txt if i < 10 or i % 2 == 0 else 1.0
            image_gs = g_img if i < 10 or i % 2 == 0 else 1.0
            if image_gs > 1.0:
                upper = torch.linspace(image_gs, 1.0, steps + 1)[i]
                per_frame = torch.linspace(1.0, float(upper), t_lat)[None, None, :, None, None]
                image_gs = pack_latents(per_frame.repeat(b, c, 1, h, w))
            v = u2 + image_gs * (u - u2) + text_gs * (c_ - u)
            x = x + (sigmas[i + 1] - sigmas[i]) * unpack_latents(v, t_lat, h, w)
    x = x.clone()
    x[:, :, :1] = reference
    return x, reference


# 12: past step 10, where both scales oscillate (slow: twelve steps of both samplers)
@pytest.mark.parametrize("steps", [2, pytest.param(12, marks=pytest.mark.slow)])
def test_image_to_video_matches_the_official_i2v_sampler(pipe, steps):
    picture = Image.fromarray((np.random.default_rng(2).random((32, 48, 3)) * 255).astype(np.uint8))
    noise = torch.randn(1, 16, 3, 4, 6, generator=torch.Generator().manual_seed(1))
    want, reference = official_i2v_sampler(pipe, "a cat", picture, noise.clone(), steps)
    got = pipe("a cat", image=picture, height=32, width=48, num_frames=9, num_inference_steps=steps,
               latents=noise.clone(), generator=torch.Generator().manual_seed(7), output_type="latent",
               max_sequence_length=16).frames
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[:, :, :1], reference.float())  # the first frame is the image's latent
    t2v = pipe("a cat", height=32, width=48, num_frames=9, num_inference_steps=steps, latents=noise.clone(),
               output_type="latent", max_sequence_length=16).frames
    assert (got - t2v)[:, :, 1:].abs().mean() > 1e-3  # the condition reaches the other frames too


def test_the_reference_image_is_resized_to_cover_and_center_cropped():
    """The official "resize_crop": scale by the larger ratio (bicubic), crop the middle."""
    from sagevideo.pipelines.opensora.pipeline import reference_pixels, resize_crop_to_fill

    wide = Image.fromarray((np.random.default_rng(3).random((40, 100, 3)) * 255).astype(np.uint8))
    got = resize_crop_to_fill(wide, 32, 48)  # 100x40 -> 80x32, columns 16..64
    want = wide.resize((80, 32), Image.Resampling.BICUBIC).crop((16, 0, 64, 32))
    assert got.size == (48, 32) and np.array_equal(np.asarray(got), np.asarray(want))
    tall = wide.transpose(Image.Transpose.TRANSPOSE)  # 40x100 -> 48x120, rows 44..76
    want = tall.resize((48, 120), Image.Resampling.BICUBIC).crop((0, 44, 48, 76))
    assert np.array_equal(np.asarray(resize_crop_to_fill(tall, 32, 48)), np.asarray(want))
    assert np.array_equal(np.asarray(resize_crop_to_fill(want, 32, 48)), np.asarray(want))  # the size: unchanged
    pixels = reference_pixels(np.asarray(want), 32, 48)
    assert pixels.shape == (3, 32, 48) and pixels.min() >= -1 and pixels.max() <= 1
    torch.testing.assert_close(pixels[:, 0, 0], torch.tensor(np.asarray(want)[0, 0], dtype=torch.float32) / 127.5 - 1)


def test_images_are_one_for_all_prompts_or_one_per_prompt(pipe):
    picture = Image.new("RGB", (32, 32), (200, 30, 30))
    with pytest.raises(ValueError, match="2 images for 1 prompts; give one image, or one per prompt"):
        pipe("a cat", image=[picture, picture], height=32, width=32, num_frames=1, num_inference_steps=1)


def test_a_sparse_run_skips_image_tiles_and_keeps_the_text_first_dense(pipe, monkeypatch):
    """[text; image] in both block kinds: 32 text + 3x12x12 image tokens (issue 36 stage 4a)."""
    from tests.helpers.sparse import check_sparse_run, sparse_run

    summary, selections = sparse_run(pipe, monkeypatch, size=192)
    check_sparse_run(pipe, summary, selections, text_first=32, text_last=0)
