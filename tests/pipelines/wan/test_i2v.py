"""Wan image-to-video (`pipelines/wan/family.py`'s image path): Wan 2.1 I2V (tiny-wan-i2v, CLIP image
tokens in cross-attention), TI2V-5B's optional image (tiny-wan22-ti2v, through WanImageToVideoPipeline
with expand_timesteps) and a Wan 2.2 A14B I2V folder (two transformers, no CLIP), each compared with
diffusers' own WanImageToVideoPipeline, and the `image:` field checked before anything loads."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import sagevideo
from sagevideo.cli.app import app
from sagevideo.errors import InputError
from sagevideo.jobs.images import read_image
from sagevideo.jobs.specs import JobSpec
from sagevideo.outputs.video import read_frames
from sagevideo.pipelines import families
from sagevideo.pipelines.loading import load_pipeline, resolve_model
from sagevideo.pipelines.runner import run_job

SMALL = {"frames": 5, "height": 32, "width": 32, "steps": 2}
WAN = families.get("wan")


def job_for(model: str, still, **fields) -> JobSpec:
    return resolve_model(model).resolve(JobSpec(prompt="the camera pulls back", image=str(still), **SMALL, **fields))


def diffusers_image_to_video(pipe, job, picture) -> np.ndarray:
    """diffusers' WanImageToVideoPipeline itself, from `prompt=`, as uint8 frames."""
    frames = pipe(image=picture, prompt=job.prompt, negative_prompt=job.negative_prompt or None, height=job.height,
                  width=job.width, num_frames=job.frames, num_inference_steps=job.steps, guidance_scale=job.guidance,
                  generator=torch.Generator().manual_seed(job.seed), output_type="np").frames[0]
    return np.round(frames * 255).astype(np.uint8)


def test_wan21_i2v_makes_what_diffusers_makes_and_routes_the_image_tokens_too(wan_pipes, still, stub_ftfy):
    """Nothing installed: bit-equal to WanImageToVideoPipeline from the same PIL image. Installed: every
    attention call runs sagevideo's, the cross-attention to CLIP's image tokens included (3 per block)."""
    pipe = wan_pipes["tiny-wan-i2v"]
    job = job_for("tiny-wan-i2v", still, negative_prompt="blurry")
    image = read_image(job.image)
    ours = run_job(pipe, job, text_tokens=512, family=WAN, image=image).frames
    assert np.array_equal(ours, diffusers_image_to_video(pipe, job, WAN.prepare_image(image, job)))
    with sagevideo.install(pipe, backend="reference"), sagevideo.record_backends() as log:
        quantized = run_job(pipe, job, text_tokens=512, family=WAN, image=image).frames
    # 2 steps x 2 forwards x 2 blocks x (self, text, image attention)
    assert log.summary() == {"counts": {"reference/fp16": 24}, "fallbacks": {}}
    assert 0 < np.abs(quantized.astype(int) - ours.astype(int)).mean() < 2.0


def test_ti2v_takes_an_image_through_wan_image_to_video(wan_pipes, still, stub_ftfy):
    """TI2V-5B's image-to-video is diffusers' WanImageToVideoPipeline(expand_timesteps=True) over the
    WanPipeline's components; the family builds it per job, so the installed attention and its step
    clock (on the shared transformer and scheduler) reach it."""
    from diffusers import WanImageToVideoPipeline

    pipe = wan_pipes["tiny-wan22-ti2v"]
    job = job_for("tiny-wan22-ti2v", still)
    image = read_image(job.image)
    ours = run_job(pipe, job, text_tokens=512, family=WAN, image=image).frames
    reference = WanImageToVideoPipeline(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae, scheduler=pipe.scheduler,
        transformer=pipe.transformer, expand_timesteps=True)
    reference.set_progress_bar_config(disable=True)
    assert np.array_equal(ours, diffusers_image_to_video(reference, job, WAN.prepare_image(image, job)))
    text_only = run_job(pipe, job.model_copy(update={"image": None}), text_tokens=512, family=WAN).frames
    assert np.abs(text_only.astype(int) - ours.astype(int)).mean() > 2  # the image made the video
    with sagevideo.install(pipe, backend="reference"), sagevideo.record_backends() as log:
        run_job(pipe, job, text_tokens=512, family=WAN, image=image)
    assert log.summary() == {"counts": {"reference/fp16": 16}, "fallbacks": {}}


def test_the_image_field_is_checked_against_what_each_model_takes(tmp_path, still, no_model_load):
    out = str(tmp_path / "out")
    t2v = CliRunner().invoke(app, ["generate", "-p", "a cat", "--model", "tiny-wan", "--image", str(still),
                                   "--out", out])
    assert t2v.exit_code == 2
    assert t2v.stderr.strip() == (
        f"sagevideo generate: error: --image {still}: tiny-wan is a text-to-video model (WanPipeline) and takes no "
        f"image; leave image out, or use a model that takes one ({families.image_models_text()})"
    )
    i2v = CliRunner().invoke(app, ["generate", "-p", "a cat", "--model", "tiny-wan-i2v", "--out", out])
    assert i2v.exit_code == 2 and i2v.stderr.strip() == (
        "sagevideo generate: error: job 1: image: missing; tiny-wan-i2v is an image-to-video model "
        "(WanImageToVideoPipeline): every job needs an image to start from (image: in the job file, or --image)"
    )
    plan = sagevideo.generation.plan.plan_batch(
        [{"prompt": "a cat"}, {"prompt": "a cat", "image": str(still)}], out=out, model="tiny-wan22-ti2v")
    assert [j.job.image for j in plan.jobs] == [None, str(still)]  # TI2V: with or without
    assert plan.jobs[0].job_id != plan.jobs[1].job_id


@pytest.fixture(scope="module")
def saved_i2v(tmp_path_factory):
    from sagevideo.pipelines.wan.tiny import tiny_pipeline

    folder = tmp_path_factory.mktemp("wan-i2v") / "tiny-wan-i2v"
    tiny_pipeline("tiny-wan-i2v").save_pretrained(folder, safe_serialization=True)
    return folder


def test_a_saved_i2v_folder_loads_back_and_makes_the_built_in_models_video(saved_i2v, wan_pipes, still, tmp_path):
    source = resolve_model(str(saved_i2v))
    assert source.pipeline_class == "WanImageToVideoPipeline" and WAN.image_input(source) == "required"
    pipe = load_pipeline(source, "cpu", torch.float32)
    assert {p.dtype for p in pipe.image_encoder.parameters()} == {torch.float32}
    want = wan_pipes["tiny-wan-i2v"].image_encoder.state_dict()
    assert all(torch.equal(pipe.image_encoder.state_dict()[k], want[k]) for k in want)
    shots = tmp_path / "shots.yaml"
    shots.write_text(json.dumps({"defaults": SMALL, "jobs": [{"prompt": "the camera pulls back", "image": str(still),
                                                              "output": "pull"}]}))
    for model, out in (("tiny-wan-i2v", "built"), (str(saved_i2v), "folder")):
        result = CliRunner().invoke(app, ["generate", str(shots), "--model", model, "--out", str(tmp_path / out),
                                          "--no-progress"])
        assert result.exit_code == 0, result.output
    built, folder = (json.loads((tmp_path / d / "manifest.jsonl").read_text()) for d in ("built", "folder"))
    assert built["image_sha256"] == hashlib.sha256(still.read_bytes()).hexdigest() == folder["image_sha256"]
    assert built["backends"] == folder["backends"] == {"counts": {"reference/fp16": 24}, "fallbacks": {}}
    assert built["family"] == "wan" and built["fps"] == 16
    assert np.array_equal(read_frames(tmp_path / "built" / "pull.mp4"), read_frames(tmp_path / "folder" / "pull.mp4"))


def test_a_wan22_a14b_i2v_folder_runs_both_denoisers_from_an_image(tmp_path, still, wan_pipes):
    """Wan 2.2 A14B I2V: WanImageToVideoPipeline with transformer_2 and boundary_ratio 0.9, no CLIP
    (the image enters through the latents only), saved and loaded as a folder."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel

    from sagevideo.pipelines.wan.tiny import TRANSFORMER_CONFIG

    base = wan_pipes["tiny-wan"]
    config = dict(TRANSFORMER_CONFIG, in_channels=16 + 4 + 16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        high, low = WanTransformer3DModel(**config), WanTransformer3DModel(**config)
    folder = tmp_path / "a14b-i2v"
    WanImageToVideoPipeline(tokenizer=base.tokenizer, text_encoder=base.text_encoder, vae=base.vae,
                            scheduler=base.scheduler, transformer=high, transformer_2=low,
                            boundary_ratio=0.9).save_pretrained(folder, safe_serialization=True)
    source = resolve_model(str(folder))
    assert WAN.image_input(source) == "required" and source.default_fps == 16
    assert source.attention_layers[-1] == "transformer_2.blocks.1.attn2" and len(source.attention_layers) == 8
    records = sagevideo.generate({"prompt": "a cat", "image": str(still), **SMALL}, out=tmp_path / "out",
                                 model=str(folder), progress=False)
    # step 0 on transformer, step 1 on transformer_2: every call of both routed
    assert records[0].status == "done" and records[0].backends["counts"] == {"reference/fp16": 16}


def test_a_wan21_i2v_folder_without_its_image_encoder_is_refused_by_name(saved_i2v, tmp_path, no_model_load):
    import shutil

    folder = tmp_path / "i2v"
    shutil.copytree(saved_i2v, folder)
    (folder / "image_encoder" / "model.safetensors").unlink()
    with pytest.raises(InputError, match=r"image_encoder/ has no \.safetensors weights; sagevideo loads safetensors"):
        resolve_model(str(folder))
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "image_encoder": [None, None]}))
    with pytest.raises(InputError) as err:
        resolve_model(str(folder))
    assert str(err.value) == (
        f"--model {folder}: model_index.json names no image_encoder, which a Wan 2.1 image-to-video transformer "
        "(image_dim set) needs; copy the whole diffusers folder")
