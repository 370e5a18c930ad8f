"""--gpus-per-job: the degree is checked against the model and every job before anything loads."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

import sagevideo
from sagevideo.cli.app import app
from sagevideo.jobs.specs import InputError, JobSpec
from sagevideo.pipelines.families import degree_problems
from sagevideo.pipelines.loading import resolve_model


@pytest.fixture
def no_loading(monkeypatch):
    import sagevideo.pipelines.loading as loading

    monkeypatch.setattr(loading, "load_pipeline", lambda *a, **k: pytest.fail("model loaded"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gpus-per-job", "4"], "--gpus-per-job 4: the 2 attention heads of tiny are not divisible by 4 "
         "(each rank attends over whole heads); use one of [1, 2]"),
        (["--gpus-per-job", "2", "--height", "48", "--width", "48"], "job 1, job 2: --gpus-per-job 2: 253 tokens "
         "(226 text + 27 video) are not divisible by 2; change frames/size or the degree (frames 9, 48x48 px)"),
        (["--gpus-per-job", "0"], "--gpus-per-job 0: give a whole number >= 1"),
    ],
)
def test_cli_refuses_a_degree_before_loading(tmp_path, no_loading, extra, message):
    args = ["generate", "--out", str(tmp_path), "--device", "cpu", "-p", "a cat", "-p", "a dog", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"sagevideo generate: error: {message}" in result.stderr
    assert not (tmp_path / "manifest.jsonl").exists()


def test_job_file_lines_and_python_api(tmp_path, no_loading):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - prompt: fine\n  - prompt: odd size\n    frames: 9\n    resolution: 48x48\n")
    refused = r"jobs.yaml line 4 \(job 2\): --gpus-per-job 2: 253 tokens \(226 text \+ 27 video\)"
    with pytest.raises(InputError, match=refused):
        sagevideo.generate(jobs, out=tmp_path / "out", device="cpu", gpus_per_job=2, progress=False)


def test_more_ranks_than_gpus_here(tmp_path, no_loading, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))  # --pv auto asks
    shows = r"--gpus-per-job 2: this machine shows 1 GPU\(s\); give at most 1, or --address"
    with pytest.raises(InputError, match=shows):
        sagevideo.generate(["a cat"], out=tmp_path, device="cuda", attention="full", gpus_per_job=2, progress=False)


def test_other_models_and_transformers_are_refused():
    tiny = resolve_model("tiny")
    job = [(tiny.resolve(JobSpec(prompt="a cat")), "job 1")]
    assert degree_problems(tiny, job, 1) == [] and degree_problems(tiny, job, 2) == []
    with pytest.raises(InputError, match="sequence parallelism splits CogVideoX transformers only; tiny is a "
                       "OpenSoraPipeline"):
        degree_problems(dataclasses.replace(tiny, pipeline_class="OpenSoraPipeline"), job, 2)


def test_cogvideox_1_5_counts_padded_latent_frames(tmp_path):
    """CogVideoX 1.5 groups latent frames in pairs (patch_size_t 2) and pads an odd count."""
    from sagevideo.pipelines.cogvideox.family import transformer_config

    folder = tmp_path / "model" / "transformer"
    folder.mkdir(parents=True)
    folder.joinpath("config.json").write_text('{"_class_name": "CogVideoXTransformer3DModel", "patch_size_t": 2}')
    source = dataclasses.replace(resolve_model("tiny"), path=tmp_path / "model", heads=48, patch=2, spatial=8)
    assert transformer_config(source).patch_size_t == 2
    # 81 frames -> 21 latent frames -> 11 pairs (the last one padded); 752x1360 px -> 47x85 patches.
    # 226 text + 11 x 3995 tokens do not split in 3; with 21 x 3995 they would: the padding is counted.
    job = [(JobSpec(prompt="x", frames=81, height=752, width=1360), "job 1")]
    assert degree_problems(source, job, 3) == [
        ("job 1", "--gpus-per-job 3: 44171 tokens (226 text + 43945 video) are not divisible by 3; change "
         "frames/size or the degree (frames 81, 1360x752 px)")
    ]
    thirteen_pairs = JobSpec(prompt="x", frames=97, height=752, width=1360)  # 226 + 13 x 3995 = 3 x 17387
    assert degree_problems(source, [(thirteen_pairs, "job 1")], 3) == []
