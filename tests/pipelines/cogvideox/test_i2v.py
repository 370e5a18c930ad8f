"""CogVideoX image-to-video: the built-in tiny-cogvideox-i2v (diffusers' CogVideoXImageToVideoPipeline),
its folders, and a job's `image:` from the job file to the manifest, checked before anything loads."""

from __future__ import annotations

import hashlib
import json
import shutil
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import sagevideo
from sagevideo.cli.app import app
from sagevideo.errors import InputError
from sagevideo.generation.plan import plan_batch
from sagevideo.outputs.video import read_frames
from sagevideo.pipelines import families
from sagevideo.pipelines.loading import load_pipeline, resolve_model

I2V = "tiny-cogvideox-i2v"


@pytest.fixture(scope="module")
def i2v_pipe():
    from sagevideo.pipelines.cogvideox.tiny import tiny_pipeline

    pipe = tiny_pipeline(name=I2V)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def stills(tmp_path_factory):
    """Two different 64x64 stills, a byte copy of the first under another name, a 128x128 one."""
    root = tmp_path_factory.mktemp("stills")
    noise = (np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8)
    halves = np.zeros((64, 64, 3), np.uint8)
    halves[:, :32] = 255
    Image.fromarray(noise).save(root / "noise.png")
    Image.fromarray(halves).save(root / "halves.png")
    shutil.copy(root / "noise.png", root / "noise-copy.png")
    Image.fromarray(np.kron(halves, np.ones((2, 2, 1), np.uint8))).save(root / "big.png")
    return root


def write(path, text):
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def records(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


# --- the model --------------------------------------------------------------------------------


def test_tiny_i2v_is_diffusers_image_to_video_with_doubled_channels_and_ofs(i2v_pipe, tiny_pipe):
    from diffusers import CogVideoXImageToVideoPipeline

    assert isinstance(i2v_pipe, CogVideoXImageToVideoPipeline)
    cfg = i2v_pipe.transformer.config
    assert cfg.in_channels == 2 * tiny_pipe.transformer.config.in_channels == 8  # [noisy; image] latents
    assert cfg.out_channels == 4 and cfg.ofs_embed_dim == cfg.time_embed_dim
    assert i2v_pipe.transformer.ofs_embedding is not None
    # the VAE and text encoder are the text-to-video model's, weights included
    for name in ("vae", "text_encoder"):
        a, b = getattr(i2v_pipe, name).state_dict(), getattr(tiny_pipe, name).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_the_i2v_family_is_registered_and_takes_an_image():
    family = families.get("cogvideox")
    assert family.image_input(resolve_model(I2V)) == "required" and family.image_input(resolve_model("tiny")) is None
    assert families.for_tiny(I2V) is family
    assert families.for_pipeline_class("CogVideoXImageToVideoPipeline") is family
    assert "CogVideoXImageToVideoPipeline" in families.generated_pipeline_classes()
    source, tiny = resolve_model(I2V), resolve_model("tiny")
    assert source.family == "cogvideox" and source.pipeline_class == "CogVideoXImageToVideoPipeline"
    assert source.fingerprint != tiny.fingerprint
    assert source.attention_layers == tiny.attention_layers  # the same transformer blocks
    assert family.shardable(source) is None  # --gpus-per-job splits it like the text-to-video model


def test_a_saved_tiny_i2v_folder_loads_back_through_the_folder_path(tmp_path, i2v_pipe):
    i2v_pipe.save_pretrained(tmp_path / "i2v", safe_serialization=True)
    index = json.loads((tmp_path / "i2v" / "model_index.json").read_text())
    assert index["_class_name"] == "CogVideoXImageToVideoPipeline"
    source = resolve_model(str(tmp_path / "i2v"))
    assert source.family == "cogvideox" and not source.is_tiny
    assert (source.default_height, source.default_width, source.default_frames) == (64, 64, 9)
    pipe = load_pipeline(source, "cpu", torch.float32)
    assert type(pipe).__name__ == "CogVideoXImageToVideoPipeline"
    want, got = i2v_pipe.transformer.state_dict(), pipe.transformer.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_learned_positional_embeddings_allow_the_sample_size_only(tmp_path, stills, no_model_load):
    """CogVideoX-5B-I2V's transformer learned its positions for 720x480 (here, a small config of its
    kind: 48x32): any other size is refused before loading (diffusers would refuse it after)."""
    from safetensors.torch import save_file

    folder = tmp_path / "5b-i2v"
    for part in ("transformer", "vae", "text_encoder"):
        (folder / part).mkdir(parents=True)
        save_file({"w": torch.zeros(1)}, str(folder / part / "model.safetensors"))
    (folder / "model_index.json").write_text('{"_class_name": "CogVideoXImageToVideoPipeline"}')
    (folder / "transformer" / "config.json").write_text(json.dumps(
        {"_class_name": "CogVideoXTransformer3DModel", "in_channels": 32, "num_attention_heads": 48,
         "sample_height": 4, "sample_width": 6, "use_learned_positional_embeddings": True}))
    (folder / "vae" / "config.json").write_text('{"block_out_channels": [8, 8, 8, 8]}')
    with pytest.raises(InputError) as err:
        plan_batch(["x"], out=tmp_path / "out", model=str(folder), image=stills / "noise.png", width=64,
                   height=64)
    assert str(err.value) == (
        f"--width 64, --height 64: 64 px cannot be made by {folder}: its transformer has learned positional "
        "embeddings for 48x32 only (as CogVideoX-5B-I2V); use resolution 48x32"
    )
    Image.new("RGB", (90, 60)).save(tmp_path / "wide.png")
    plan = plan_batch(["x"], out=tmp_path / "out", model=str(folder), image=tmp_path / "wide.png", workers=1)
    assert (plan.jobs[0].job.width, plan.jobs[0].job.height) == (48, 32)
    assert "image wide.png (90x60) is resized to 48x32 for 1 job(s)" in plan.notes


# --- the image field: checked before loading -------------------------------------------------


def test_every_image_problem_is_a_clear_line_with_exit_2_before_loading(tmp_path, stills, no_model_load):
    (tmp_path / "notes.png").write_text("not a picture")
    Image.new("RGB", (100, 50)).save(tmp_path / "wide.png")
    shots = write(tmp_path / "shots.yaml", f"""\
        jobs:
          - prompt: one
            image: missing.png
          - prompt: two
            image: notes.png
          - prompt: three
            image: wide.png
          - prompt: four
          - prompt: five
            image: {stills / "noise.png"}
        """)
    result = CliRunner().invoke(app, ["generate", str(shots), "--model", I2V, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f"sagevideo generate: error: {shots} line 3 (job 1): image: {tmp_path / 'missing.png'} does not exist; "
        "give a PNG, JPEG or WebP file (relative paths are relative to the job file)",
        f"sagevideo generate: error: {shots} line 5 (job 2): image: {tmp_path / 'notes.png'} is not an image PIL or "
        "imageio can read (neither knows its format); give a PNG, JPEG or WebP file (relative paths are relative "
        "to the job file)",
        f"sagevideo generate: error: {shots} line 7 (job 3): image: wide.png is 100x50 (aspect 2) but the job makes "
        "64x64 (aspect 1), so resizing would stretch it; crop the image to 1:1, or set resolution to one of its "
        "shape, e.g. 128x64",
        f"sagevideo generate: error: {shots} line 8 (job 4): image: missing; tiny-cogvideox-i2v is an "
        "image-to-video model (CogVideoXImageToVideoPipeline): every job needs an image to start from (image: in "
        "the job file, or --image)",
    ]
    assert not (tmp_path / "out").exists()  # refused before the output folder is made

    t2v = CliRunner().invoke(app, ["generate", "-p", "a cat", "--image", str(stills / "noise.png"), "--out",
                                   str(tmp_path / "out")])
    assert t2v.exit_code == 2
    assert t2v.stderr.strip() == (
        f"sagevideo generate: error: --image {stills / 'noise.png'}: tiny is a text-to-video model "
        "(CogVideoXPipeline) and takes no image; leave image out, or use a model that takes one "
        f"({families.image_models_text()})"
    )
    with pytest.raises(InputError, match=r"job 1: image: missing; tiny-cogvideox-i2v is an image-to-video model"):
        sagevideo.generate("a cat", out=tmp_path / "out", model=I2V)


def test_identity_is_the_image_content_not_its_path(tmp_path, stills, no_model_load):
    def job_id(image, **options):
        return plan_batch([{"prompt": "a cat", "image": str(image)}], out=tmp_path, model=I2V, **options).jobs[0]

    first, copy, other = job_id(stills / "noise.png"), job_id(stills / "noise-copy.png"), job_id(stills / "halves.png")
    assert first.job_id == copy.job_id != other.job_id  # a moved or copied file is the same job
    assert first.image_sha256 == copy.image_sha256 != other.image_sha256
    assert first.job.image == str(stills / "noise.png")  # the path is kept (recorded, read where the job runs)
    # the same prompt without an image, on the text-to-video model: the id it always had
    assert plan_batch(["a cat"], out=tmp_path).jobs[0].job_id == "162ce1120328f0bc"
    both = plan_batch([{"prompt": "a cat", "image": str(stills / "noise.png")},
                       {"prompt": "a cat", "image": str(stills / "noise-copy.png")}], out=tmp_path, model=I2V)
    assert len(both.jobs) == 1 and "1 duplicate job(s) (same prompt and settings) will run once" in both.notes


# --- generation -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory, stills):
    """One batch in this process: the same prompt and seed from two images, plus the 128x128 one."""
    root = tmp_path_factory.mktemp("i2v")
    shots = write(root / "shots.yaml", f"""\
        defaults:
          steps: 2
        jobs:
          - prompt: the camera pulls back
            image: {stills / "noise.png"}
            output: noise
          - prompt: the camera pulls back
            image: {stills / "halves.png"}
            output: halves
          - prompt: the camera pulls back
            image: {stills / "big.png"}
            output: big
        """)
    result = CliRunner().invoke(app, ["generate", str(shots), "--model", I2V, "--out", str(root / "out"),
                                      "--no-progress"])
    return root / "out", result


def test_generate_starts_each_video_from_its_image_and_records_it(generated, stills):
    out, result = generated
    assert result.exit_code == 0, result.output
    assert "3 done, 0 skipped, 0 failed" in result.stdout
    assert "image big.png (128x128) is resized to 64x64 for 1 job(s)" in result.stderr
    recs = {r["outputs"][0]: r for r in records(out)}
    for name in ("noise", "halves", "big"):
        record = recs[f"{name}.mp4"]
        assert record["image"] == str(stills / f"{name}.png") and record["status"] == "done"
        assert record["image_sha256"] == hashlib.sha256((stills / f"{name}.png").read_bytes()).hexdigest()
        assert record["model"] == I2V
    videos = {name: read_frames(out / f"{name}.mp4") for name in ("noise", "halves", "big")}
    assert all(v.shape == (9, 64, 64, 3) for v in videos.values())
    def diff(a, b):
        return np.abs(videos[a].astype(int) - videos[b].astype(int)).mean()

    assert diff("noise", "halves") > 2  # another image, another video (same prompt and seed)
    # big.png is halves.png at twice the size: resized to the job's size, it makes a video closer to
    # halves.png's than to noise.png's (not the same: the resampling rings at the edge)
    assert diff("big", "halves") < 0.6 * diff("big", "noise")


def test_the_same_image_and_seed_make_the_same_video(generated, stills, tmp_path):
    out, _ = generated
    records = sagevideo.generate({"prompt": "the camera pulls back", "image": stills / "noise-copy.png"},
                                 out=tmp_path, model=I2V, steps=2, progress=False)
    again = read_frames(tmp_path / records[0].outputs[0])
    assert np.array_equal(again, read_frames(out / "noise.mp4"))
    assert records[0].image_sha256 == sagevideo.generate(
        {"prompt": "the camera pulls back", "image": stills / "noise.png"}, out=out, model=I2V, steps=2,
        progress=False)[0].image_sha256


def test_an_image_changed_after_planning_fails_its_job_only(tmp_path, stills):
    from sagevideo.generation.run import run_batch

    image = tmp_path / "still.png"
    shutil.copy(stills / "noise.png", image)
    plan = plan_batch([{"prompt": "a", "image": str(image)}, {"prompt": "b", "image": str(stills / "halves.png")}],
                      out=tmp_path / "out", model=I2V, steps=1, workers=1)
    shutil.copy(stills / "halves.png", image)
    report = run_batch(plan, progress=False)
    failed, done = report.records
    assert failed.status == "failed" and done.status == "done"
    assert failed.error.startswith(f"ImageError: {image} changed since the batch was planned")
