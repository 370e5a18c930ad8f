"""The HunyuanVideo family: the built-in tiny model and folders from configs, job constraints
before loading, layer names, the degree rule, and a saved tiny model through the folder path."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from sagevideo.errors import InputError
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.families import degree_problems
from sagevideo.pipelines.loading import load_pipeline, resolve_model
from tests.helpers.sp_tolerance import MEAN_LEVELS, frames

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
    with pytest.raises(InputError, match=r"--gpus-per-job 2: 27 video tokens \(the text is not split\) are not "
                                         r"divisible by 2"):
        plan_batch("a cat", model=TINY, out=tmp_path / "out", device="cpu", height=48, width=48, gpus_per_job=2)


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
    # Equal up to a rounding step of one pixel value: weights read from the safetensors file sit at
    # other memory alignments than freshly built ones, and the CPU's GEMMs round differently there.
    assert a.frames.shape == (9, 64, 64, 3)
    assert np.abs(a.frames.astype(np.int16) - b.frames.astype(np.int16)).max() <= 1


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
    (folder / "tokenizer" / "tokenizer.json").write_text("{not json")  # said by the folder check, naming the file
    with pytest.raises(InputError, match=r"tokenizer/tokenizer.json: not readable JSON \(Expecting property name"):
        resolve_model(str(folder))
    (folder / "tokenizer" / "tokenizer.json").write_text('{"model": {"type": "none"}}')  # JSON, not a tokenizer
    with pytest.raises(InputError, match=r"tokenizer/ cannot be read as a tokenizer"):
        src = resolve_model(str(folder))
        src.problems(src.resolve(JobSpec(prompt="a cat")))
    shutil.rmtree(folder)
    shutil.copytree(saved, folder)
    config = folder / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "image_condition_type": "token_replace"}))
    with pytest.raises(InputError, match=r"image_condition_type 'token_replace' \(image to video\)"):
        resolve_model(str(folder))


def test_tencent_s_original_release_is_named_with_how_to_convert_it(tmp_path, no_model_load):
    release = tmp_path / "HunyuanVideo"
    (release / "hunyuan-video-t2v-720p" / "transformers").mkdir(parents=True)
    (release / "hunyuan-video-t2v-720p" / "transformers" / "mp_rank_00_model_states.pt").write_bytes(b"")
    with pytest.raises(InputError, match=r"Tencent's original HunyuanVideo release, not a diffusers folder .*"
                                         r"convert_hunyuan_video_to_diffusers\.py"):
        resolve_model(str(release))
    with pytest.raises(InputError, match=r"model_index\.json is missing"):  # any other folder: the usual message
        resolve_model(str(tmp_path))


# ---- generation through the family, against diffusers' own pipeline -------------------------


def _diffusers_video(pipe, job):
    """Reference: diffusers' HunyuanVideoPipeline call with its own processors (fp32 SDPA), the
    job's settings and the same CPU-seeded noise, frames as the runner writes them (uint8)."""
    from sagevideo.pipelines.hunyuanvideo.prompts import prompt_template

    frames = pipe(
        prompt=job.prompt, height=job.height, width=job.width, num_frames=job.frames, num_inference_steps=job.steps,
        guidance_scale=job.guidance, generator=torch.Generator("cpu").manual_seed(job.seed), output_type="np",
        prompt_template=prompt_template(pipe.tokenizer), max_sequence_length=256,
    ).frames[0]
    return np.round(frames * 255).astype(np.uint8)


def test_installed_attention_equals_diffusers_on_sdpa_and_routes_every_call(hunyuan_pipe):
    """install covers the one denoiser (the transformer) and routes all of its attention calls:
    with the "sdpa" backend the video is diffusers' own exactly; quantized (reference), the 4 block
    calls run in the kernels with the text key-padding mask, the 2 token-refiner calls (their mask
    masks queries too) on SDPA, recorded as fallbacks with that reason, and the video stays close."""
    import sagevideo
    from sagevideo.pipelines import runner

    src = resolve_model(TINY)
    job = src.resolve(JobSpec(prompt="a red panda eating bamboo", steps=1, seed=3))
    want = _diffusers_video(hunyuan_pipe, job)
    with sagevideo.install(hunyuan_pipe, backend="sdpa"), sagevideo.record_backends() as log:
        got = runner.run_job(hunyuan_pipe, job, text_tokens=src.text_tokens).frames
    assert got.shape == (9, 64, 64, 3) and np.array_equal(got, want)
    assert log.summary() == {"counts": {"sdpa": 6}, "fallbacks": {}}
    with sagevideo.install(hunyuan_pipe, backend="reference"), sagevideo.record_backends() as log:
        quantized = runner.run_job(hunyuan_pipe, job, text_tokens=src.text_tokens).frames
    assert log.counts == {"reference/fp16": 4, "sdpa": 2}
    (reason,) = log.fallback_reasons
    assert reason.startswith("attn_mask of shape (1, 2, 256, 256) is not a key-padding mask")
    diff = np.abs(quantized.astype(int) - want.astype(int))
    assert diff.mean() < 0.1 and diff.max() <= 2  # measured: mean 0.006, max 1 level of 255


# ---- generate, calibrate and ab with the family ------------------------------------------------

JOBS = (
    "defaults:\n  steps: 2\njobs:\n"
    "  - prompt: a red panda eating bamboo in the rain\n    output: sage\n"
    "  - prompt: a paper boat on a stream\n    output: full\n    attention: full\n"
)
REFINER_REASON = ("attn_mask of shape (1, 2, 256, 256) is not a key-padding mask (B, 1, 1, Nk); only those run "
                  "in the kernels")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """JOBS made on CPU in this process through `sagevideo.generate(..., model=...)`."""
    import sagevideo

    root = tmp_path_factory.mktemp("generate")
    (root / "jobs.yaml").write_text(JOBS)
    records = sagevideo.generate(root / "jobs.yaml", model=TINY, out=root / "one", device="cpu", progress=False)
    return root, records


def test_generate_records_family_fps_and_what_ran_then_the_cli_resumes(generated):
    import imageio.v2 as imageio
    from typer.testing import CliRunner

    from sagevideo.cli.app import app

    root, records = generated
    by_name = {Path(r.outputs[0]).stem: r for r in records}
    assert {r.status for r in records} == {"done"}
    assert {(r.family, r.model, r.fps, r.frames, r.steps) for r in records} == {("hunyuanvideo", TINY, 24, 9, 2)}
    sage, full = by_name["sage"], by_name["full"]
    # 2 steps x (4 blocks in the kernels, with the text key-padding mask; 2 refiner layers on SDPA)
    assert (sage.attention, sage.backend) == ("sage", "reference")
    assert sage.backends == {"counts": {"reference/fp16": 8, "sdpa": 4}, "fallbacks": {REFINER_REASON: 4}}
    assert (full.attention, full.backend, full.backends) == ("full", None, {"counts": {}, "fallbacks": {}})
    assert imageio.get_reader(root / "one" / "sage.mp4").get_meta_data()["fps"] == 24
    args = ["generate", str(root / "jobs.yaml"), "--model", TINY, "--out", str(root / "one"), "--device", "cpu",
            "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "0 done, 2 skipped, 0 failed" in result.stdout


def test_calibrate_names_the_family_s_layers_and_keeps_the_refiner_in_full_precision(tmp_path):
    """The refiner's mask is not one the kernels take: no quantized mode is measured there, so the
    plan keeps it in full precision; the blocks get a quantized mode."""
    from sagevideo.experiments.calibrate import calibrate
    from sagevideo.pipelines.plans import Mode

    result = calibrate(["a red panda"], model=TINY, out=tmp_path / "plan.json", steps=1, device="cpu",
                       progress=False)
    names = resolve_model(TINY).attention_layers
    assert list(result.errors) == names and json.loads((tmp_path / "plan.json").read_text())["layers"] == names
    refiner, blocks = names[:2], names[2:]
    assert all(result.chosen[n].mode is Mode.full for n in refiner)
    assert all(result.chosen[n].mode is not Mode.full for n in blocks)
    assert all(0.999 < w.cos <= 1 for n in blocks for w in result.errors[n].values())


def test_ab_with_the_attention_probe(tmp_path):
    from sagevideo.eval.evaluate import EvalOptions
    from sagevideo.experiments.ab import ab
    from tests.helpers.evalkit import single_thread

    jobs = tmp_path / "jobs.txt"
    jobs.write_text("a red fox running through snow\n")
    options = EvalOptions(metrics=["psnr"], weights=tmp_path / "no-weights")
    with single_thread():
        data = ab(jobs, model=TINY, out=tmp_path / "out", device="cpu", attention_probe=True, progress=False,
                  options=options, echo=lambda line: None)
    settings = data["arms"]["test"]["settings"]
    assert settings["backends_ran"] == {"reference/fp16": 8, "sdpa": 4} and settings["fps"] == 24
    assert settings["fallbacks"] == {REFINER_REASON: 4}
    probe = data["attention_probe"]
    assert [layer["layer"] for layer in probe["layers"]] == resolve_model(TINY).attention_layers
    blocks = [layer for layer in probe["layers"] if not layer["layer"].startswith("context_embedder.")]
    assert len(blocks) == 4 and all(0.999 < layer["cos_worst"] < 1.0 for layer in blocks)
    assert probe["summary"]["worst_at"]["cos"]["layer"] in {layer["layer"] for layer in blocks}


@pytest.mark.slow  # two gloo ranks
def test_over_two_ranks_the_videos_are_one_process_s(generated, two_ranks):
    """The batch over 2 gloo ranks, as `--gpus-per-job 2 --device cpu` runs it in each rank
    (tests/helpers/torchrun_ranks.py: Ulysses), makes the videos this process made: within
    tests/helpers/sp_tolerance.py's bound (full attention byte-identical, quantized frames within a
    mean of 1.5 levels of 255; measured here: byte-identical too)."""
    from tests.helpers.torchrun_ranks import torchrun_on_two_ranks

    root, records = generated
    out = root / "sp"
    args = [str(root / "jobs.yaml"), "--model", TINY, "--out", str(out), "--device", "cpu", "--no-progress"]
    ranks = torchrun_on_two_ranks(two_ranks, args, root / "logs")
    assert [rank["code"] for rank in ranks] == [0, 0], ranks[0]["stderr"]
    assert "2 done, 0 skipped, 0 failed" in ranks[0]["stdout"]
    lines = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert {(r["family"], r["fps"]) for r in lines} == {("hunyuanvideo", 24)}
    for name in ("sage", "full"):
        a, b = frames(out / f"{name}.mp4"), frames(root / "one" / f"{name}.mp4")
        assert a.shape == b.shape == (9, 64, 64, 3), name
        if name == "full":
            assert (out / "full.mp4").read_bytes() == (root / "one" / "full.mp4").read_bytes()
        assert np.abs(a - b).mean() <= MEAN_LEVELS, name
    sharded = {r["name"] or Path(r["outputs"][0]).stem: r for r in lines}
    assert all(r["worker"]["ranks"] == 2 for r in sharded.values())
    # rank 0 records every call, as one process does: the quantized job's calls are the same
    assert sharded["sage"]["backends"] == next(r.backends for r in records if r.outputs == ["sage.mp4"])


def test_a_sparse_run_keeps_the_text_after_the_video_dense_and_the_refiner_never_sparse(hunyuan_pipe, monkeypatch):
    """[video; text]: 3x8x8 video + 32 text tokens; the token refiner's text-only layers stay dense."""
    from tests.helpers.sparse import check_sparse_run, sparse_run

    summary, selections = sparse_run(hunyuan_pipe, monkeypatch, size=128)
    refiner = {f"context_embedder.token_refiner.refiner_blocks.{i}.attn" for i in range(2)}
    check_sparse_run(hunyuan_pipe, summary, selections, text_first=0, text_last=32, never=refiner)
