"""Model checks before loading, and loading a local diffusers folder (safetensors, offline)."""

import json
import re

import pytest
import torch

from sagevideo.errors import InputError
from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.loading import load_pipeline, resolve_model


def test_tiny_source_defaults():
    src = resolve_model("tiny")
    assert src.is_tiny and (src.heads, src.head_dim) == (2, 64)
    job = src.resolve(JobSpec(prompt="x"))
    assert src.problems(job) == []
    assert (job.height, job.width, job.frames, job.steps) == (64, 64, 9, 2)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"frames": 10}, r"frames: 10 is not 1 \+ a multiple of 4 .* use 1 \+ a multiple of 8, e.g. 9 or 17"),
        ({"frames": 13}, r"frames: 13 makes 4 latent frames, and the VAE decodes an even number of latent frames "
                         r"into 16 frames, not 13; use 1 \+ a multiple of 8, e.g. 9 or 17"),
        ({"height": 72}, r"height: 72 px is not a multiple of 16 .* use e.g. 64 or 80"),
        ({"width": 8}, r"width: 8 px is not a multiple of 16 .* use e.g. 16"),
    ],
)
def test_sizes_the_model_cannot_make(fields, message):
    src = resolve_model("tiny")
    (problem,) = src.problems(src.resolve(JobSpec(prompt="x", **fields)))
    assert re.match(message, problem)


def test_missing_and_malformed_folders(tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        resolve_model(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        resolve_model(str(tmp_path / "file"))
    with pytest.raises(InputError, match="model_index.json is missing"):
        resolve_model(str(tmp_path))
    (tmp_path / "model_index.json").write_text("{not json")
    with pytest.raises(InputError, match="not readable JSON"):
        resolve_model(str(tmp_path))
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(InputError, match="names 'StableDiffusionPipeline'"):
        resolve_model(str(tmp_path))
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "CogVideoXPipeline"}))
    with pytest.raises(InputError, match="transformer/ has no .safetensors"):
        resolve_model(str(tmp_path))


def test_local_folder_round_trip(tmp_path, tiny_pipe, capfd):
    """A save_pretrained folder of the tiny model loads back with the same weights and defaults,
    without diffusers' loading bar (it would cut through the batch's bar), which stays as it was."""
    from diffusers.utils import logging as diffusers_logging

    tiny_pipe.save_pretrained(tmp_path / "tiny", safe_serialization=True)
    src = resolve_model(str(tmp_path / "tiny"))
    tiny = resolve_model("tiny")
    for field in (
        "heads",
        "head_dim",
        "spatial",
        "temporal",
        "patch",
        "text_tokens",
        "default_height",
        "default_width",
        "default_frames",
    ):
        assert getattr(src, field) == getattr(tiny, field), field
    assert src.default_steps == 50
    assert len(src.fingerprint) == 12 and src.fingerprint == resolve_model(str(tmp_path / "tiny")).fingerprint

    assert diffusers_logging.is_progress_bar_enabled()
    capfd.readouterr()
    pipe = load_pipeline(src, "cpu", torch.float32)
    assert "Loading pipeline components" not in capfd.readouterr().err
    assert diffusers_logging.is_progress_bar_enabled()
    want = tiny_pipe.transformer.state_dict()
    got = pipe.transformer.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert pipe.tokenizer("a cat").input_ids == tiny_pipe.tokenizer("a cat").input_ids

    (tmp_path / "tiny" / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(InputError, match="vae/ has no .safetensors"):
        resolve_model(str(tmp_path / "tiny"))


def test_a_job_without_guidance_takes_the_models_published_scale():
    job = JobSpec(prompt="a fox")
    assert resolve_model("tiny").resolve(job).guidance == 6.0  # CogVideoX's
    assert resolve_model("tiny-opensora").resolve(job).guidance == 7.5  # Open-Sora 2.0's official text guidance
    assert resolve_model("tiny-opensora").resolve(job.model_copy(update={"guidance": 1.0})).guidance == 1.0
