"""The Open-Sora 2.0 family through the product: the built-in tiny-opensora from configs, job
constraints checked before loading (aspect table, frames 1 + 4k, multiples of 16, the 512-token
prompt), mp4s at 24 fps, text- and image-to-video jobs through `sagevideo.generate` (records,
resume), `install` routing every attention call, the --gpus-per-job degree rule, calibrate and ab."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import sagevideo
from sagevideo.errors import InputError
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines import families
from sagevideo.pipelines.loading import resolve_model

TINY = "tiny-opensora"
LAYERS = ["transformer_blocks.0.attn", "single_transformer_blocks.0.attn"]  # official double_blocks.0, single_blocks.0


def released_source(**fields):
    """An Open-Sora 2.0 source of the released architecture (no 11B folder here: built by hand)."""
    base = dict(name="opensora", path=None, fingerprint="0" * 12, pipeline_class="OpenSoraPipeline", heads=24,
                head_dim=128, spatial=8, temporal=4, patch=2, text_tokens=512, default_height=192,
                default_width=336, default_frames=129, default_steps=50, layers=57, family="opensora",
                default_fps=24)
    return dataclasses.replace(resolve_model(TINY), **{**base, **fields})


@pytest.fixture(scope="module")
def still(tmp_path_factory):
    path = tmp_path_factory.mktemp("still") / "still.png"
    Image.fromarray((np.random.default_rng(0).random((90, 160, 3)) * 255).astype(np.uint8)).save(path)
    return path


def records(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


# --- the model, from configs ------------------------------------------------------------------


def test_tiny_opensora_is_known_from_configs_alone():
    source = resolve_model(TINY)
    assert source.model_family is families.get("opensora") and source.is_tiny
    assert (source.pipeline_class, source.heads, source.head_dim, source.layers) == ("OpenSoraPipeline", 2, 64, 2)
    assert (source.spatial, source.temporal, source.patch, source.text_tokens) == (8, 4, 2, 512)
    assert (source.default_width, source.default_height, source.default_frames, source.default_steps) == (
        112, 64, 9, 2)
    assert source.default_fps == 24  # the official fps_save
    assert source.attention_layers == LAYERS
    assert source.model_family.image_input(source) == "optional"
    assert TINY in families.image_tiny_models()


# --- job constraints, before loading ----------------------------------------------------------


@pytest.mark.slow  # a Python process of its own (4 s)
def test_planning_a_batch_does_not_import_diffusers(tmp_path):
    """The job checks (aspect table, prompt tokens, degree rule) run on the driver from configs."""
    code = (
        "import sys\n"
        "from sagevideo.generation.plan import plan_batch\n"
        f"plan = plan_batch(['a cat'], model='tiny-opensora', out={str(tmp_path)!r}, device='cpu', gpus_per_job=2)\n"
        "assert plan.jobs[0].job.frames == 9 and plan.settings.fps == 24\n"
        "assert 'diffusers' not in sys.modules, 'diffusers imported on the driver'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]



def test_the_released_model_makes_the_official_aspect_tables_sizes():
    source = released_source()
    for width, height in ((336, 192), (192, 336), (256, 256), (384, 160), (1024, 576), (768, 768), (1184, 496)):
        assert source.problems(JobSpec(prompt="x", frames=129, width=width, height=height)) == [], (width, height)
    (problem,) = source.problems(JobSpec(prompt="x", frames=129, width=448, height=256))
    assert problem == (
        "resolution: 448x256 is not a size of Open-Sora 2.0's official aspect table (the model was trained at those "
        "sizes only); nearest in aspect: 336x192 (256px 16:9) or 1024x576 (768px 16:9). The sizes (WxH): 256px: "
        "384x160, 352x176, 336x192, 304x208, 288x224, 256x256 and their transposes; 768px: 1184x496, 1072x544, "
        "1040x560, 1024x576, 992x592, 928x624, 880x656, 768x768 and their transposes")
    assert source.problems(JobSpec(prompt="x", frames=11, height=250, width=448)) == [
        "height: 250 px is not a multiple of 16 (VAE 8x times patch 2); use e.g. 240 or 256",
        "frames: 11 is not 1 + a multiple of 4 (the VAE compresses time 4x after the first frame); use e.g. 9 or 13",
    ]


def test_tiny_takes_any_multiple_of_16_and_frames_1_plus_4k():
    source = resolve_model(TINY)
    assert source.problems(JobSpec(prompt="x", frames=13, width=48, height=32)) == []
    assert source.problems(JobSpec(prompt="x", frames=8, width=40, height=32)) == [
        "width: 40 px is not a multiple of 16 (VAE 8x times patch 2); use e.g. 32 or 48",
        "frames: 8 is not 1 + a multiple of 4 (the VAE compresses time 4x after the first frame); use e.g. 5 or 9",
    ]


def test_prompts_longer_than_the_512_t5_tokens_are_refused_before_loading(tmp_path, no_model_load):
    """The tiny tokenizer has one token per byte and </s>; the official suffix ' 24 FPS. 4 motion score.' counts."""
    suffix = len(". 24 FPS. 4 motion score.")
    fits = "a" * (511 - suffix)  # + suffix + </s> = 512
    too_long = "a" * (512 - suffix)
    source = resolve_model(TINY)
    assert source.problems(source.resolve(JobSpec(prompt=fits))) == []
    with pytest.raises(InputError) as err:
        sagevideo.generate([too_long, "b" * 520], model=TINY, out=tmp_path, device="cpu", progress=False)
    assert str(err.value).splitlines() == [
        "job 1: prompt: 513 T5 tokens with the official suffix ' 24 FPS. 4 motion score.', but Open-Sora 2.0 reads "
        "512 (the rest would be cut, suffix included); shorten it by 1 tokens",
        "job 2: prompt: 546 T5 tokens with the official suffix ' 24 FPS. 4 motion score.', but Open-Sora 2.0 reads "
        "512 (the rest would be cut, suffix included); shorten it by 34 tokens",
    ]
    with pytest.raises(InputError, match=r"negative_prompt: 601 T5 tokens, but Open-Sora 2.0 reads 512"):
        sagevideo.generate([dict(prompt="a cat", negative_prompt="n" * 600)], model=TINY, out=tmp_path,
                           device="cpu", progress=False)


def test_the_gpus_per_job_degree_rule_is_checked_before_loading(tmp_path, no_model_load):
    family = families.get("opensora")
    fine = JobSpec(prompt="x", frames=129, height=192, width=336)  # the official 256px 16:9
    released = released_source()
    assert family.degree_problem(released, fine, 4) is None
    assert family.degree_problem(released, fine, 8) == (
        "8316 image tokens (33 latent frames x 12x21) are not divisible by 8 (each rank takes an equal share of "
        "them; the 512 text tokens are on every rank); change frames/size or the degree")
    with pytest.raises(InputError, match=r"--gpus-per-job 5: the 24 attention heads of opensora are not divisible "
                       r"by 5 \(each rank attends over whole heads\); use one of \[1, 2, 3, 4, 6, 8, 12, 24\]"):
        families.degree_problems(released, [(fine, "job 1")], 5)
    with pytest.raises(InputError) as err:  # 3 latent frames x 3 x 3 = 27 image tokens
        sagevideo.generate(["a cat"], model=TINY, out=tmp_path, device="cpu", gpus_per_job=2, height=48, width=48,
                           progress=False)
    assert str(err.value) == (
        "job 1: --gpus-per-job 2: 27 image tokens (3 latent frames x 3x3) are not divisible by 2 (each rank takes "
        "an equal share of them; the 512 text tokens are on every rank); change frames/size or the degree "
        "(frames 9, 48x48 px)")
    with pytest.raises(InputError, match="the 2 attention heads of tiny-opensora are not divisible by 4"):
        sagevideo.generate(["a cat"], model=TINY, out=tmp_path, device="cpu", gpus_per_job=4, progress=False)


# --- generation -------------------------------------------------------------------------------


@pytest.mark.slow  # two end-to-end batches (text and image jobs, then the resume)
def test_text_and_image_jobs_generate_record_their_family_and_resume(tmp_path, still):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "defaults:\n  resolution: 48x32\n  frames: 5\n"
        "jobs:\n"
        "  - prompt: a lighthouse at dusk\n    output: t2v\n"
        f"  - prompt: a lighthouse at dusk\n    output: i2v\n    image: {still}\n"
    )
    out = tmp_path / "out"
    first = sagevideo.generate(jobs, model=TINY, out=out, device="cpu", progress=False)
    assert [r["status"] for r in first] == ["done", "done"]
    t2v, i2v = records(out)
    for record in (t2v, i2v):
        assert record["family"] == "opensora" and record["model"] == TINY and record["fps"] == 24
        assert record["backends"]["counts"] == {"reference/fp16": 4}  # 2 layers x 2 steps, every call routed
        assert (record["frames"], record["width"], record["height"], record["steps"]) == (5, 48, 32, 2)
    assert t2v["image"] is None and i2v["image_sha256"] == hashlib.sha256(still.read_bytes()).hexdigest()
    assert t2v["job_id"] != i2v["job_id"]
    from sagevideo.outputs.video import read_frames

    a, b = read_frames(out / "t2v.mp4"), read_frames(out / "i2v.mp4")
    assert a.shape == b.shape == (5, 32, 48, 3) and np.abs(a.astype(int) - b).mean() > 1  # the image changed it
    again = sagevideo.generate(jobs, model=TINY, out=out, device="cpu", progress=False)
    assert [r["job_id"] for r in again] == [t2v["job_id"], i2v["job_id"]] and len(records(out)) == 2  # resumed


def test_the_job_image_reaches_the_pipeline_cropped_to_the_video(still):
    """A 160x90 still for a 48x32 video: resized to cover (57x32), center-cropped, as the official "resize_crop"."""
    family = families.get("opensora")
    source = resolve_model(TINY)
    job = source.resolve(JobSpec(prompt="x", width=48, height=32))
    from sagevideo.jobs.images import inspect_image, read_image

    info = inspect_image(still)
    assert family.image_problems(source, job, info) == []  # any aspect: cropped, never stretched
    picture = family.prepare_image(read_image(str(still), info.sha256), job)
    assert picture.size == (48, 32)
    want = Image.open(still).convert("RGB").resize((57, 32), Image.Resampling.BICUBIC).crop((4, 0, 52, 32))
    assert np.array_equal(np.asarray(picture), np.asarray(want))


def test_install_routes_every_attention_call_of_the_pipeline():
    from sagevideo.pipelines.opensora.processor import SageOpenSoraAttnProcessor
    from sagevideo.pipelines.opensora.tiny import tiny_pipeline

    pipe = tiny_pipeline()
    pipe.set_progress_bar_config(disable=True)
    with sagevideo.install(pipe, backend="reference") as handle, sagevideo.record_backends() as ran:
        processors = pipe.transformer.attn_processors
        assert set(processors) == {f"{layer}.processor" for layer in LAYERS}
        assert all(isinstance(p, SageOpenSoraAttnProcessor) for p in processors.values())
        pipe("a cat", height=32, width=32, num_frames=1, num_inference_steps=3, output_type="latent")
    assert handle is not None and ran.summary()["counts"] == {"reference/fp16": 2 * 3}
    assert not any(isinstance(p, SageOpenSoraAttnProcessor) for p in pipe.transformer.attn_processors.values())


def test_calibrate_names_the_layers_in_the_familys_module_names(tmp_path):
    from sagevideo.experiments.calibrate import calibrate

    result = calibrate(["a cat"], out=tmp_path / "plan.json", model=TINY, device="cpu", frames=1, height=32,
                       width=32, steps=1, progress=False)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["model"] == "OpenSoraTransformer3DModel" and plan["layers"] == LAYERS
    assert sorted(result.errors) == sorted(LAYERS)
    assert all(0.99 < errors[mode].cos <= 1.0 for errors in result.errors.values() for mode in errors)


@pytest.mark.slow  # four runs of the tiny model (three arms and the probe), then the evaluation
def test_ab_with_the_attention_probe(tmp_path):
    from sagevideo.experiments.ab import ab

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("defaults:\n  steps: 1\n  frames: 1\n  resolution: 32x32\njobs:\n  - prompt: a cat\n")
    from sagevideo.eval.evaluate import EvalOptions

    options = EvalOptions(metrics=["psnr"], weights=tmp_path / "no-weights")
    metrics = ab(jobs, out=tmp_path / "ab", model=TINY, device="cpu", attention_probe=True, progress=False,
                 options=options, echo=lambda line: None)
    probe = metrics["attention_probe"]
    assert [layer["layer"] for layer in probe["layers"]] == LAYERS
    assert all(layer["calls"] == 1 and 0.99 < layer["cos_worst"] <= 1.0 for layer in probe["layers"])
    assert probe["reproduced"]["all_identical"] is True, probe["reproduced"]["videos"]
    assert metrics["arms"]["test"]["settings"]["backends_ran"] == {"reference/fp16": 2}
