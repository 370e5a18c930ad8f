"""The Wan family (`pipelines/wan/family.py`): registry, folder detection, job constraints and the
--gpus-per-job rule (all before loading), loading (tiny and saved folders alike), and generation
through the family's denoise/decode compared with diffusers' own WanPipeline."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import sagevideo
from sagevideo.errors import InputError
from sagevideo.generation.plan import plan_batch
from sagevideo.jobs.specs import JobSpec
from sagevideo.outputs.video import read_frames
from sagevideo.pipelines import families
from sagevideo.pipelines.loading import load_pipeline, resolve_model
from sagevideo.pipelines.runner import run_job
from sagevideo.pipelines.wan.family import clean_prompt

ROOT = Path(__file__).resolve().parents[3]
# 2 blocks x (attn1 + attn2) per forward, 2 forwards per step (classifier-free guidance).
CALLS_PER_STEP = 2 * 2 * 2
SMALL = {"frames": 5, "height": 32, "width": 32, "steps": 2}  # 2 x 2 x 2 = 8 video tokens


def refused(match, prompts, **options):
    with pytest.raises(InputError) as err:
        plan_batch(prompts, **{"out": "/nonexistent/never-made", **options})
    assert str(err.value) == match
    return err


# --- registry ------------------------------------------------------------------------------------


def test_wan_is_registered_with_both_pipelines_and_four_tiny_models():
    wan = families.get("wan")
    assert families.for_pipeline_class("WanPipeline") is wan
    assert families.for_pipeline_class("WanImageToVideoPipeline") is wan
    assert {"WanPipeline", "WanImageToVideoPipeline"} <= set(families.generated_pipeline_classes())
    assert [families.for_tiny(n) for n in wan.tiny_models] == [wan] * 4
    takes = {name: wan.image_input(resolve_model(name)) for name in wan.tiny_models}
    assert takes == {"tiny-wan": None, "tiny-wan22": None, "tiny-wan-i2v": "required", "tiny-wan22-ti2v": "optional"}


def test_the_family_module_imports_neither_torch_nor_diffusers():
    """Detection runs on the driver before anything loads (the registry's contract)."""
    code = ("import sys, sagevideo.pipelines.wan.family as f; f.FAMILY.tiny_source('tiny-wan22');"
            "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


def test_layer_names_are_the_modules_of_every_denoiser(wan_pipes):
    for name in ("tiny-wan", "tiny-wan22"):
        pipe = wan_pipes[name]
        want = [f"blocks.{i}.attn{j}" for i in range(2) for j in (1, 2)]
        if name == "tiny-wan22":
            want += ["transformer_2." + layer for layer in want]
        assert resolve_model(name).attention_layers == want
        with sagevideo.install(pipe, backend="reference") as handle:
            # the names install gives them (processor keys without ".processor"): plans and records agree
            assert [key.removesuffix(".processor") for key in handle.layers] == want


# --- job constraints, before loading -------------------------------------------------------------


def test_frames_size_and_prompt_length_are_checked_before_loading(no_model_load):
    """The tiny tokenizer is byte-level: a prompt of n ASCII characters is n + 1 tokens (</s>)."""
    refused(
        "--height 72: 72 px is not a multiple of 16 (VAE 8x times patch 2); use e.g. 64 or 80\n"
        "--frames 10: 10 is not 1 + a multiple of 4 (the VAE compresses time 4x after the first frame); use "
        "e.g. 9 or 13",
        ["a cat"], model="tiny-wan", frames=10, height=72,
    )
    refused(
        "job 2: prompt: 513 umT5 tokens, but Wan reads 512 (the pipeline would drop the last 1 without a word); "
        "shorten it\n"
        "job 2: negative_prompt: 601 umT5 tokens, but Wan reads 512 (the pipeline would drop the last 89 without "
        "a word); shorten it",
        [{"prompt": "x" * 511}, {"prompt": "y" * 512, "negative_prompt": "z" * 600}], model="tiny-wan22",
    )
    # TI2V-5B's VAE compresses 16x (patchify 2, then 8x): sizes are multiples of 32
    refused("--width 48: 48 px is not a multiple of 32 (VAE 16x times patch 2); use e.g. 32 or 64",
            ["a cat"], model="tiny-wan22-ti2v", width=48)


def test_the_prompt_is_counted_after_the_pipelines_own_cleaning():
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    for text in ("  a\tcat \n on   a sofa ", "fish &amp;amp; chips", "caf\u00e9\u3000at\u00a0dusk", "&lt;b&gt;"):
        assert clean_prompt(text) == prompt_clean(text), text


def test_the_mp4_rate_defaults_to_the_release_rate(tmp_path, no_model_load):
    assert plan_batch(["a cat"], out=tmp_path, model="tiny-wan").settings.fps == 16
    assert plan_batch(["a cat"], out=tmp_path, model="tiny-wan22-ti2v").settings.fps == 24  # TI2V-5B: 24 fps
    assert plan_batch(["a cat"], out=tmp_path, model="tiny-wan", fps=30).settings.fps == 30


def test_gpus_per_job_needs_divisible_heads_and_video_tokens_before_loading(tmp_path, no_model_load):
    refused("--gpus-per-job 4: the 2 attention heads of tiny-wan are not divisible by 4 (each rank attends over "
            "whole heads); use one of [1, 2]", ["a cat"], model="tiny-wan", gpus_per_job=4, device="cpu")
    # 48x48 px, 9 frames: 3 latent frames x 3 x 3 patches = 27 video tokens
    refused("job 1: --gpus-per-job 2: 27 video tokens are not divisible by 2 (the 512 text tokens are not split: "
            "every rank keeps them); change frames/size or the degree (frames 9, 48x48 px)",
            ["a cat"], model="tiny-wan22", height=48, width=48, gpus_per_job=2, device="cpu")
    plan = plan_batch(["a cat"], out=tmp_path, model="tiny-wan22", gpus_per_job=2, device="cpu")  # 48 tokens
    assert plan.gpus_per_job == 2


# --- folders -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved22(tmp_path_factory):
    """tiny-wan22 written by save_pretrained: a Wan 2.2 A14B-style folder (two transformers)."""
    from sagevideo.pipelines.wan.tiny import tiny_pipeline

    folder = tmp_path_factory.mktemp("wan22") / "tiny-wan22"
    tiny_pipeline("tiny-wan22").save_pretrained(folder, safe_serialization=True)
    return folder


def test_a_saved_tiny_model_loads_back_through_the_folder_path(saved22, wan_pipes, tmp_path):
    tiny, source = resolve_model("tiny-wan22"), resolve_model(str(saved22))
    assert not source.is_tiny and source.family == "wan" and source.pipeline_class == "WanPipeline"
    for field in ("heads", "head_dim", "spatial", "temporal", "patch", "text_tokens", "layers", "default_fps"):
        assert getattr(source, field) == getattr(tiny, field), field
    assert source.attention_layers == tiny.attention_layers
    # a folder's defaults are the pipeline's (Wan 2.1 480p, 81 frames, 50 steps)
    assert (source.default_height, source.default_width, source.default_frames, source.default_steps) == (
        480, 832, 81, 50)
    pipe = load_pipeline(source, "cpu", torch.float32)
    assert type(pipe).__name__ == "WanPipeline" and pipe.config.boundary_ratio == 0.875
    for name in ("transformer", "transformer_2", "vae", "text_encoder"):
        want, got = getattr(wan_pipes["tiny-wan22"], name).state_dict(), getattr(pipe, name).state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want), name
    # the same model: the same video from the built-in and from the folder, recorded with its family
    jobs = [{"prompt": "a cat on a red sofa", **SMALL}, {"prompt": "a dog", "attention": "full", **SMALL}]
    built = sagevideo.generate(jobs, out=tmp_path / "tiny", model="tiny-wan22", progress=False)
    loaded = sagevideo.generate(jobs, out=tmp_path / "folder", model=str(saved22), progress=False)
    # Not byte for byte: safetensors' memory map leaves the loaded weights off 64-byte alignment, and on
    # some processors torch's CPU kernels then round differently (seen: up to 5 of 255, 0.14 on average);
    # another prompt's video differs by 1.6 on average, another seed's by 12
    for a, b in zip(built, loaded, strict=True):
        want, got = (read_frames(tmp_path / where / r.outputs[0]).astype(np.int16)
                     for where, r in (("tiny", a), ("folder", b)))
        assert want.shape == got.shape and np.abs(want - got).max() <= 8 and np.abs(want - got).mean() < 0.5
    sage, full = loaded
    assert {r.family for r in loaded} == {"wan"} and {r.fps for r in loaded} == {16}
    assert sage.status == full.status == "done" and sage.model == str(saved22)
    assert sage.backends == {"counts": {"reference/fp16": 2 * CALLS_PER_STEP}, "fallbacks": {}}  # both denoisers
    assert full.backends == {"counts": {}, "fallbacks": {}} and full.backend is None  # stock processors
    again = sagevideo.generate(jobs, out=tmp_path / "folder", model=str(saved22), progress=False)  # resumes
    assert [r.job_id for r in again] == [r.job_id for r in loaded]
    assert len((tmp_path / "folder" / "manifest.jsonl").read_text().splitlines()) == 2  # nothing ran again


def test_the_tiny_model_has_the_dtypes_from_pretrained_gives(saved22):
    """In bfloat16, diffusers keeps `_keep_in_fp32_modules` (time embedder, norms, scale-shift
    tables) in float32 and the rotary tables as built; transformers' umT5 keeps nothing."""
    from diffusers import WanTransformer3DModel
    from transformers import UMT5EncoderModel

    tiny = load_pipeline(resolve_model("tiny-wan22"), "cpu", torch.bfloat16)
    loaded = {"transformer": WanTransformer3DModel.from_pretrained(saved22, subfolder="transformer",
                                                                   torch_dtype=torch.bfloat16),
              "text_encoder": UMT5EncoderModel.from_pretrained(saved22, subfolder="text_encoder",
                                                               torch_dtype=torch.bfloat16)}
    for name, reference in loaded.items():
        module = getattr(tiny, name)
        want = {k: t.dtype for k, t in [*reference.named_parameters(), *reference.named_buffers()]}
        got = {k: t.dtype for k, t in [*module.named_parameters(), *module.named_buffers()]}
        assert got == want, name
    assert {torch.float32, torch.bfloat16} == {p.dtype for p in tiny.transformer.parameters()}
    assert tiny.transformer.rope.freqs_cos.dtype == torch.float32
    assert {p.dtype for p in tiny.vae.parameters()} == {torch.float32}  # as folders load the VAE


def broken(saved, tmp_path, edit):
    """A copy of the saved folder with `edit(folder, index)` applied to it and its model_index.json."""
    folder = tmp_path / "broken"
    shutil.copytree(saved, folder)
    index = json.loads((folder / "model_index.json").read_text())
    edit(folder, index)
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_folder_problems_name_what_is_missing(saved22, tmp_path, no_model_load):
    def config(folder, part, **changes):
        path = folder / part / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    cases = [
        (lambda f, i: i.pop("scheduler"), "model_index.json names no scheduler; a WanPipeline folder has tokenizer, "
         "text_encoder, vae, scheduler and transformer (and transformer_2 for Wan 2.2 A14B)"),
        (lambda f, i: shutil.rmtree(f / "tokenizer"), "the tokenizer/ folder is missing or empty in {folder}; "
         "model_index.json names it (copy the whole diffusers folder)"),
        (lambda f, i: (f / "transformer_2" / "diffusion_pytorch_model.safetensors").unlink(),
         "transformer_2/ has no .safetensors weights; sagevideo loads safetensors only (re-save with "
         "save_pretrained(..., safe_serialization=True))"),
        (lambda f, i: i.update(boundary_ratio=None), "model_index.json has transformer_2 but no boundary_ratio "
         "(WanPipeline would never run it); Wan 2.2 A14B folders have both, Wan 2.1 and TI2V-5B folders neither"),
        (lambda f, i: config(f, "transformer_2", num_attention_heads=4), "transformer_2's heads, head dim, patch "
         "size or inputs differ from transformer's (both denoise the same latents)"),
        (lambda f, i: config(f, "transformer", image_dim=32) or config(f, "transformer_2", image_dim=32),
         "transformer/ takes CLIP image embeddings (image_dim) but model_index.json names WanPipeline; such a "
         "transformer runs in WanImageToVideoPipeline folders"),
        (lambda f, i: config(f, "transformer_2", _class_name="WanVACETransformer3DModel"), "transformer_2/config.json "
         "is a WanVACETransformer3DModel; sagevideo generate runs WanPipeline folders with WanTransformer3DModel "
         "denoisers"),
    ]
    for number, (edit, message) in enumerate(cases):
        folder = broken(saved22, tmp_path / str(number), edit)
        with pytest.raises(InputError) as err:
            resolve_model(str(folder))
        assert str(err.value) == f"--model {folder}: " + message.format(folder=folder.resolve()), number


def test_an_original_wan_checkpoint_is_named_with_where_to_get_the_diffusers_one(tmp_path, no_model_load):
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"")
    (tmp_path / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    with pytest.raises(InputError) as err:
        resolve_model(str(tmp_path))
    assert str(err.value) == (
        f"--model {tmp_path}: {tmp_path} holds an original Wan checkpoint (Wan2.1_VAE.pth), not a diffusers folder; "
        "use its diffusers version (the Wan-AI/*-Diffusers repositories, e.g. Wan-AI/Wan2.1-T2V-1.3B-Diffusers) or "
        "convert it with diffusers' scripts/convert_wan_to_diffusers.py")


def test_a_rotary_table_shorter_than_the_video_is_refused(saved22, tmp_path, no_model_load):
    folder = broken(saved22, tmp_path, lambda f, i: None)
    for part in ("transformer", "transformer_2"):
        path = folder / part / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "rope_max_seq_len": 2}))
    refused("--frames 9: 9 makes 3 transformer patches along it, more than its rotary table's 2 (rope_max_seq_len); "
            "make it smaller", ["a cat"], model=str(folder), frames=9, height=32, width=32)


# --- generation: the family's denoise and decode against diffusers' WanPipeline -------------------


def test_denoise_and_decode_make_what_wan_pipeline_makes(wan_pipes):
    """Nothing installed, fp32 SDPA: the runner's frames (family denoise, then decode) are the
    frames WanPipeline itself returns, bit for bit; with sagevideo attention (the quantization
    emulation) they stay close. Both Wan 2.2 denoisers run (2 steps across boundary 0.875)."""
    pipe = wan_pipes["tiny-wan22"]
    job = resolve_model("tiny-wan22").resolve(JobSpec(prompt="a lighthouse at dusk", negative_prompt="blurry",
                                                      **SMALL))
    ran = []
    hooks = [getattr(pipe, n).register_forward_pre_hook(lambda m, a, n=n: ran.append(n))
             for n in ("transformer", "transformer_2")]
    try:
        ours = run_job(pipe, job, text_tokens=512).frames
    finally:
        for hook in hooks:
            hook.remove()
    assert ran == ["transformer"] * 2 + ["transformer_2"] * 2  # step 0 high noise, step 1 low noise (x cond/uncond)
    theirs = pipe(prompt=job.prompt, negative_prompt=job.negative_prompt, height=job.height, width=job.width,
                  num_frames=job.frames, num_inference_steps=job.steps, guidance_scale=job.guidance,
                  generator=torch.Generator().manual_seed(job.seed), output_type="np").frames[0]
    assert ours.shape == (5, 32, 32, 3) and np.array_equal(ours, np.round(theirs * 255).astype(np.uint8))
    with sagevideo.install(pipe, backend="reference"), sagevideo.record_backends() as log:
        quantized = run_job(pipe, job, text_tokens=512).frames
    assert log.summary() == {"counts": {"reference/fp16": 2 * CALLS_PER_STEP}, "fallbacks": {}}
    diff = np.abs(quantized.astype(int) - ours.astype(int))
    assert 0 < diff.mean() < 2.0


# --- calibrate and ab -----------------------------------------------------------------------------


def test_calibrate_names_the_layers_of_both_denoisers_and_its_plan_runs(tmp_path):
    from sagevideo.experiments.calibrate import calibrate

    result = calibrate(["a cat"], out=tmp_path / "plan.json", model="tiny-wan22", progress=False,
                       **{k: v for k, v in SMALL.items()})
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["layers"] == resolve_model("tiny-wan22").attention_layers and plan["model"] == "WanTransformer3DModel"
    assert list(result.errors) == plan["layers"]  # every layer measured, named as the plan names it
    for layer, errors in result.errors.items():
        assert all(0.99 < worst.cos <= 1.0 and worst.calls for worst in errors.values()), layer
    # the plan drives a batch; the record names it and what ran
    (record,) = sagevideo.generate([{"prompt": "a cat", **SMALL}], out=tmp_path / "out", model="tiny-wan22",
                                   plan=tmp_path / "plan.json", progress=False)
    assert record.plan == str(tmp_path / "plan.json") and len(record.plan_sha256) == 16
    chosen = {f"reference/{choice.mode.pv}" if choice.mode.pv else "sdpa" for choice in result.chosen.values()}
    assert set(record.backends["counts"]) == chosen and sum(record.backends["counts"].values()) == 2 * CALLS_PER_STEP


def test_ab_probes_every_layer_of_both_denoisers_at_the_steps_each_runs(tmp_path):
    from sagevideo.eval.evaluate import EvalOptions
    from sagevideo.experiments.ab import ab

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("defaults:\n  frames: 5\n  height: 32\n  width: 32\n  steps: 2\njobs:\n  - prompt: a red fox\n")
    ab(jobs, out=tmp_path / "ab", model="tiny-wan22", attention_probe=True, noise_floor=False, progress=False,
       echo=lambda line: None, options=EvalOptions(metrics=["psnr"], weights=tmp_path / "no-weights"))
    data = json.loads((tmp_path / "ab" / "metrics.json").read_text())
    probe = {layer["layer"]: layer for layer in data["attention_probe"]["layers"]}
    assert list(probe) == resolve_model("tiny-wan22").attention_layers
    for name, layer in probe.items():  # boundary 0.875 of 2 steps: transformer at step 0, transformer_2 at 1
        assert layer["steps"] == ([1] if name.startswith("transformer_2.") else [0]) and layer["calls"] == 2, name
        assert 0.99 < layer["cos_worst"] < 1.0
    assert data["arms"]["test"]["settings"]["backends_ran"] == {"reference/fp16": 2 * CALLS_PER_STEP}



def test_a_sparse_run_makes_self_attention_sparse_and_never_cross_attention(wan_pipes, monkeypatch):
    """Video-only self-attention (3x12x12 tokens) sparse after the first step and layer; attn2 dense."""
    from tests.helpers.sparse import check_sparse_run, sparse_run

    pipe = wan_pipes["tiny-wan"]
    summary, selections = sparse_run(pipe, monkeypatch, size=192)
    check_sparse_run(pipe, summary, selections, text_first=0, text_last=0,
                     never={"blocks.0.attn2", "blocks.1.attn2"})


def test_each_denoiser_keeps_its_first_self_attention_dense_under_sparse(wan_pipes):
    from sagevideo.pipelines.sparse import first_sparse_layers

    assert first_sparse_layers(wan_pipes["tiny-wan22"]) == ("blocks.0.attn1", "transformer_2.blocks.0.attn1")
