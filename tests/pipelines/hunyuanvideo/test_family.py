"""The HunyuanVideo family: the built-in tiny model and folders from configs, job constraints
before loading, layer names, the degree rule, and a saved tiny model through the folder path."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from sagevideo.jobs.specs import InputError, JobSpec
from sagevideo.pipelines.families import degree_problems
from sagevideo.pipelines.loading import load_pipeline, resolve_model

TINY = "tiny-hunyuanvideo"


def test_tiny_source_and_defaults(no_model_load):
    src = resolve_model(TINY)
    assert (src.family, src.pipeline_class, src.is_tiny) == ("hunyuanvideo", "HunyuanVideoPipeline", True)
    assert (src.heads, src.head_dim, src.spatial, src.temporal, src.patch, src.text_tokens) == (2, 64, 8, 4, 2, 256)
    assert src.default_fps == 24 and src.layers == 4  # dual + single-stream blocks: the long calls
    job = src.resolve(JobSpec(prompt="x"))
    assert (job.height, job.width, job.frames, job.steps) == (64, 64, 9, 2)
    assert src.problems(job) == []


def test_layer_names_are_install_s(hunyuan_pipe):
    import sagevideo

    names = resolve_model(TINY).attention_layers
    assert names == [
        "context_embedder.token_refiner.refiner_blocks.0.attn", "context_embedder.token_refiner.refiner_blocks.1.attn",
        "transformer_blocks.0.attn", "transformer_blocks.1.attn",
        "single_transformer_blocks.0.attn", "single_transformer_blocks.1.attn",
    ]
    with sagevideo.install(hunyuan_pipe) as handle:
        assert [name.removesuffix(".processor") for name in handle.layers] == names


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"frames": 10}, r"frames: 10 is not 1 \+ a multiple of 4 .*; use e.g. 9 or 13"),
        ({"frames": 11}, r"frames: 11 is not 1 \+ a multiple of 4"),
        ({"height": 72}, r"height: 72 px is not a multiple of 16 .* use e.g. 64 or 80"),
        ({"negative_prompt": "blurry"}, r"negative_prompt: HunyuanVideo is guidance-distilled"),
        ({"prompt": "x" * 300}, r"prompt: 301 tokens \(with the closing <\|eot_id\|>\), and HunyuanVideo reads 256: "
                                r"the last 45 would be cut without a word; shorten the prompt"),
    ],
)
def test_jobs_the_model_cannot_make_are_refused_before_loading(fields, message, no_model_load):
    src = resolve_model(TINY)
    (problem,) = src.problems(src.resolve(JobSpec(**{"prompt": "x", **fields})))
    assert re.match(message, problem)
    assert src.problems(src.resolve(JobSpec(prompt="x" * 255))) == []  # 255 bytes + <|eot_id|> = 256


def test_generate_refuses_before_loading(tmp_path, no_model_load):
    from sagevideo.generation.plan import plan_batch

    with pytest.raises(InputError) as err:
        plan_batch(["x" * 300, "fine"], model=TINY, out=tmp_path / "out", frames=10, device="cpu")
    text = str(err.value)
    assert "--frames 10: 10 is not 1 + a multiple of 4" in text and "prompt: 301 tokens" in text
    plan = plan_batch("a cat", model=TINY, out=tmp_path / "out", device="cpu")
    assert plan.settings.fps == 24 and plan.context().fps == 24  # HunyuanVideo's frame rate, unless --fps
    assert plan_batch("a cat", model=TINY, out=tmp_path / "out", device="cpu", fps=12).settings.fps == 12
    assert plan_batch("a cat", out=tmp_path / "out", device="cpu").settings.fps == 8  # CogVideoX's


def test_degree_rule_heads_and_video_tokens(no_model_load):
    src = resolve_model(TINY)
    jobs = [(src.resolve(JobSpec(prompt="x")), "job 1"),  # 3 x 4 x 4 = 48 video tokens
            (src.resolve(JobSpec(prompt="x", height=48, width=48)), "job 2")]  # 3 x 3 x 3 = 27
    assert degree_problems(src, jobs, 2) == [
        ("job 2", "--gpus-per-job 2: 27 video tokens (the text is not split) are not divisible by 2; change "
                  "frames/size or the degree (frames 9, 48x48 px)")
    ]
    with pytest.raises(InputError, match=r"the 2 attention heads of tiny-hunyuanvideo are not divisible by 4"):
        degree_problems(src, jobs, 4)


def test_real_size_degree_rule(no_model_load):
    """HunyuanVideo 720p x 129 frames: 33 x 45 x 80 = 118,800 video tokens and 24 heads."""
    import dataclasses

    src = dataclasses.replace(resolve_model(TINY), heads=24)
    job = [(JobSpec(prompt="x", frames=129, height=720, width=1280, steps=50), "job 1")]
    for degree in (2, 3, 4, 6, 8):
        assert degree_problems(src, job, degree) == [], degree


@pytest.fixture(scope="module")
def saved(hunyuan_pipe, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hunyuan") / "tiny-hunyuanvideo"
    hunyuan_pipe.save_pretrained(folder, safe_serialization=True)
    return folder


def test_saved_tiny_model_loads_back_through_the_folder_path(saved, hunyuan_pipe):
    from sagevideo.pipelines import runner

    src = resolve_model(str(saved))
    tiny = resolve_model(TINY)
    assert src.family == "hunyuanvideo" and not src.is_tiny
    for field in ("heads", "head_dim", "spatial", "temporal", "patch", "text_tokens", "layers", "vae_channels"):
        assert getattr(src, field) == getattr(tiny, field), field
    assert (src.default_height, src.default_width, src.default_frames, src.default_steps) == (720, 1280, 129, 50)
    assert src.attention_layers == tiny.attention_layers
    pipe = load_pipeline(src, "cpu", torch.float32)
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        want, got = getattr(hunyuan_pipe, name).state_dict(), getattr(pipe, name).state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want), name
    # The same video from the folder as from the built-in model (tokenizers, scheduler and all).
    job = tiny.resolve(JobSpec(prompt="a red panda", steps=1))
    a = runner.run_job(pipe, job, text_tokens=src.text_tokens)
    b = runner.run_job(hunyuan_pipe, job, text_tokens=tiny.text_tokens)
    assert a.frames.shape == (9, 64, 64, 3) and (a.frames == b.frames).all()


def test_folders_missing_parts_are_named(saved, tmp_path, no_model_load):
    folder = tmp_path / "model"
    shutil.copytree(saved, folder)
    for weights in (folder / "text_encoder_2").glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(InputError, match=r"text_encoder_2/ has no .safetensors weights"):
        resolve_model(str(folder))
    shutil.rmtree(folder)
    shutil.copytree(saved, folder)
    shutil.rmtree(folder / "tokenizer")
    with pytest.raises(InputError, match=r"tokenizer/ is missing or empty in .*; a HunyuanVideoPipeline folder has"):
        resolve_model(str(folder))
    shutil.rmtree(folder)
    shutil.copytree(saved, folder)
    config = folder / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "image_condition_type": "token_replace"}))
    with pytest.raises(InputError, match=r"image_condition_type 'token_replace' \(image to video\)"):
        resolve_model(str(folder))
