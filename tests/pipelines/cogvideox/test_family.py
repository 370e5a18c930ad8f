"""The CogVideoX family: latent-frame counting for the --gpus-per-job degree rule (CogVideoX 1.5 pads odd pairs)."""

from __future__ import annotations

import dataclasses

from sagevideo.jobs.specs import JobSpec
from sagevideo.pipelines.families import degree_problems
from sagevideo.pipelines.loading import resolve_model


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


def test_a_sparse_run_skips_video_tiles_and_keeps_text_first_steps_and_first_layer_dense(tiny_pipe, monkeypatch):
    """[text; video]: 32 text + 3x12x12 video tokens in 128x64 tiles (issue 36 stage 4a)."""
    from tests.helpers.sparse import check_sparse_run, sparse_run

    summary, selections = sparse_run(tiny_pipe, monkeypatch, size=192)
    check_sparse_run(tiny_pipe, summary, selections, text_first=32, text_last=0)
