"""`sagevideo eval`, `sagevideo check-weights` and `sagevideo ab` on the command line: output and exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sagevideo.cli.app import app
from tests.helpers.evalkit import base_video, make_arm

pytestmark = pytest.mark.usefixtures("one_thread")

runner = CliRunner()


@pytest.fixture()
def no_model_loads(monkeypatch):
    """Any attempt to load a metric model or a pipeline fails the test."""
    from sagevideo.eval import clip_metrics, lpips
    from sagevideo.pipelines import loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for bad input")

    monkeypatch.setattr(clip_metrics, "load_clip", refuse)
    monkeypatch.setattr(lpips.LocalLPIPS, "__init__", refuse)
    monkeypatch.setattr(loading, "load_pipeline", refuse)


def test_check_weights_lists_missing_files_and_where_to_put_them(tmp_path):
    result = runner.invoke(app, ["check-weights", "--weights", str(tmp_path / "w")])
    assert result.exit_code == 1, result.output
    out = result.output
    assert f"weights folder: {tmp_path / 'w'} (--weights) (does not exist yet)" in out
    assert "psnr, ssim: no weights needed" in out
    assert f"MISSING  {tmp_path / 'w' / 'clip-vit-base-patch32' / 'config.json'}" in out
    assert "openai/clip-vit-base-patch32" in out
    assert "lpips/alexnet-owt-7be5be79.pth" in out and "inception/weights-inception-2015-12-05-6726825d.pth" in out
    assert "usable now: psnr, ssim; nothing is ever downloaded" in out


def test_check_weights_sees_present_files(weights_dir):
    result = runner.invoke(app, ["check-weights", "--weights", str(weights_dir)])
    out = result.output
    assert "clipsim, clip_t: ready" in out and "lpips: ready" in out
    assert f"present  {weights_dir / 'clip-vit-base-patch32' / 'model.safetensors'}" in out
    assert "usable now: psnr, ssim, lpips, clipsim, clip_t" in out
    assert result.exit_code == (0 if "fid, kid: ready" in out else 1)


def test_eval_cli_writes_metrics_and_report(arms, weights_dir, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "eval",
            str(arms["ref"]),
            str(arms["noise10"]),
            "--out",
            str(out),
            "--metrics",
            "psnr,ssim",
            "-m",
            "lpips",
            "--weights",
            str(weights_dir),
            "--noise-ref",
            str(arms["same"]),
            "--resamples",
            "200",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "PSNR: beyond the noise floor (worse)" in result.output
    assert "LPIPS: beyond the noise floor (worse)" in result.output
    assert f"wrote {out / 'metrics.json'}" in result.output
    assert "sagevideo eval: video 1/" in result.stderr  # progress, one line per video
    data = json.loads((out / "metrics.json").read_text())
    assert list(data["metrics"]) == ["psnr", "ssim", "lpips"] and data["skipped"] == {}


def test_eval_cli_bad_input_exits_2_before_any_model(arms, tmp_path, no_model_loads):
    cases = [
        (
            ["eval", str(arms["ref"]), str(arms["same"]), "--out", str(tmp_path / "o"), "--metrics", "psnr,bogus"],
            "unknown metric",
        ),
        (["eval", str(tmp_path / "nowhere"), str(arms["same"]), "--out", str(tmp_path / "o")], "no such folder"),
        (["eval", str(arms["ref"]), str(arms["same"]), "--out", str(arms["ref"] / "manifest.jsonl")], "is a file"),
    ]
    other = make_arm(tmp_path / "other", [("something else", 0, base_video(0))])
    cases.append((["eval", str(arms["ref"]), str(other), "--out", str(tmp_path / "o")], "do not pair"))
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "sagevideo eval: error:" in result.output


def test_ab_bad_input_exits_2_before_any_model(tmp_path, no_model_loads):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - prompt: a fox\n    attention: sage\n")
    plain = tmp_path / "jobs.txt"
    plain.write_text("a fox\n")
    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text('{"default": {"mode": "int4"}}')
    other_model = tmp_path / "other.json"  # made for a model with more layers than the tiny one
    other_model.write_text('{"overrides": [{"layers": ["transformer_blocks.9.attn1"], "mode": "full"}]}')
    cases = [
        (["ab", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")], "no such file"),
        (["ab", str(jobs), "--out", str(tmp_path / "o")], "sets job 1: attention"),
        (["ab", str(plain), "--out", str(tmp_path / "o"), "--plan", str(bad_plan)], "--plan"),
        (["ab", str(plain), "--out", str(tmp_path / "o"), "--plan", str(other_model)], "transformer does not have"),
        (["ab", str(plain), "--out", str(tmp_path / "o"), "--metrics", "fvd"], "unknown metric"),
        (["ab", str(plain), "--out", str(tmp_path / "o"), "--model", str(tmp_path / "no-model")], "no-model"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "arm ->" not in result.output and not (tmp_path / "o").exists(), args  # refused before any arm


def test_a_truncated_video_is_one_clear_line_without_ffmpegs_banner(tmp_path, no_model_loads):
    ref = make_arm(tmp_path / "ref", [("a fox", 0, base_video(0))])
    test = make_arm(tmp_path / "test", [("a fox", 0, base_video(0))])
    video = test / "video-0-0.mp4"
    video.write_bytes(video.read_bytes()[:3000])  # an interrupted copy
    result = runner.invoke(app, ["eval", str(ref), str(test), "--out", str(tmp_path / "o"), "--metrics", "psnr"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "sagevideo eval: error: the folders do not pair:",
        "sagevideo eval: error:   TEST_DIR: 'a fox' seed 0: video-0-0.mp4 cannot be decoded (moov atom not found); "
        "is it truncated (an interrupted copy or write) or not a video? Render or copy it again",
        "sagevideo eval: error: both arms must hold the same prompts and seeds, with equal frame counts and sizes",
    ]


def test_arms_that_differ_in_steps_are_called_unclean_on_the_console(tmp_path):
    ref = make_arm(tmp_path / "ref", [("a fox", 0, base_video(0))])
    test = make_arm(tmp_path / "test", [("a fox", 0, base_video(0))], steps=50)
    result = runner.invoke(app, ["eval", str(ref), str(test), "--out", str(tmp_path / "o"), "--metrics", "psnr"])
    assert result.exit_code == 0, result.output
    assert ("sagevideo eval: WARNING: arms differ in steps (ref 2, test 50, first at 'a fox' seed 0): not a clean A/B"
            in result.stderr.splitlines())


def broken_lpips(folder, content):
    from sagevideo.eval.weights import LPIPS_FILES

    (folder / "lpips").mkdir(parents=True)
    path = folder / "lpips" / LPIPS_FILES["alex"]
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        import torch

        torch.save(content, path)
    return path


def test_check_weights_tries_loading_and_never_calls_a_corrupt_file_ready(tmp_path):
    import argparse

    import torch

    for name, content, reason in [
        ("random", bytes(range(256)) * 20, "not a readable torch weights file: corrupt, truncated or another format"),
        ("objects", {"features.0.weight": torch.zeros(1), "args": argparse.Namespace(lr=1)},
         "it holds Python objects besides tensors, which are not unpickled here"),
    ]:
        path = broken_lpips(tmp_path / name, content)
        result = runner.invoke(app, ["check-weights", "--weights", str(tmp_path / name)])
        assert result.exit_code == 1
        assert "lpips: broken files" in result.output and "lpips: ready" not in result.output
        assert f"BROKEN   {path} ({reason}" in result.output
        assert "usable now: psnr, ssim;" in result.output and "weights_only" not in result.output


def test_eval_with_one_metrics_broken_weights_writes_the_others(arms, tmp_path):
    import torch

    for name, content in [
        ("truncated", bytes(range(256)) * 20),  # refused by the safe load up front
        ("wrong-model", {"features.0.weight": torch.zeros(3)}),  # loads, then does not fit AlexNet
    ]:
        weights = tmp_path / name
        broken_lpips(weights, content)
        out = tmp_path / f"out-{name}"
        result = runner.invoke(app, ["eval", str(arms["ref"]), str(arms["noise10"]), "--out", str(out),
                                     "--metrics", "psnr,lpips", "--weights", str(weights), "--resamples", "100"])
        assert result.exit_code == 1, result.output
        data = json.loads((out / "metrics.json").read_text())
        assert list(data["metrics"]) == ["psnr"] and list(data["failed"]) == ["lpips"]
        assert "PSNR:" in result.stdout and (out / "report.html").is_file()
        assert result.stderr.splitlines()[-1] == (
            "sagevideo eval: error: lpips: weights present but not loadable (see above); the other metrics are in "
            "metrics.json"
        )
        assert "weights_only" not in result.output and "Traceback" not in result.output


def test_check_weights_refuses_a_file_as_the_folder(tmp_path):
    (tmp_path / "weights.tar").write_bytes(b"not a folder")
    result = runner.invoke(app, ["check-weights", "--weights", str(tmp_path / "weights.tar")])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"sagevideo check-weights: error: --weights {tmp_path / 'weights.tar'}: is a file; give the folder that holds "
        "the weights"
    )


@pytest.mark.parametrize("failing", ["report", "videos"])
def test_eval_into_a_full_disk_keeps_metrics_json_and_names_what_was_not_written(arms, tmp_path, monkeypatch,
                                                                                   failing):
    """A full disk at the report or at the difference videos: metrics.json is still written (whole),
    one error line names what was not, exit 1, no traceback."""
    import errno
    import os
    from pathlib import Path

    from sagevideo.outputs import files, video

    if failing == "report":
        real = files.write_text_atomic

        def disk_full(path, text):
            if Path(path).name == "report.html":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real(path, text)

        monkeypatch.setattr(files, "write_text_atomic", disk_full, raising=False)  # (absent before it existed)
        what = "disk full (ENOSPC): report.html not written"
    else:
        def disk_full(frames, path, **kwargs):  # as write_mp4 reports an encoder cut short by ENOSPC
            raise video.VideoWriteError(f"{Path(path).name} not written: disk full (ENOSPC)", errno.ENOSPC)

        monkeypatch.setattr(video, "write_mp4", disk_full)
        what = "disk full (ENOSPC): the 3 difference videos videos/000-diff.mp4 to 002-diff.mp4 not written"
    out = tmp_path / "out"
    result = runner.invoke(app, ["eval", str(arms["ref"]), str(arms["noise10"]), "--out", str(out),
                                 "--metrics", "psnr", "--resamples", "100"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and "PSNR:" in result.stdout
    assert result.stderr.splitlines()[-1] == (
        f"sagevideo eval: error: {out}: {what}; the metrics are in {out / 'metrics.json'}; fix that (a full disk: "
        "free space) and run the same command again")
    data = json.loads((out / "metrics.json").read_text())
    assert list(data["metrics"]) == ["psnr"] and data["n_pairs"] == 3
    if failing == "videos":
        assert data["not_written"] == {f"videos/00{i}-diff.mp4": "disk full (ENOSPC)" for i in range(3)}
        assert [p["diff_video"] for p in data["pairs"]] == [None] * 3 and (out / "report.html").is_file()
    else:
        assert not (out / "report.html").exists() and data["not_written"] == {}
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no partial file left behind


def test_check_weights_on_an_unreadable_folder_is_one_line(tmp_path, monkeypatch):
    import errno

    from sagevideo.eval import weights

    def unreadable(folder, **kwargs):  # as scanning a folder without read permission fails
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "w"))

    monkeypatch.setattr(weights, "report_lines", unreadable)
    result = runner.invoke(app, ["check-weights", "--weights", str(tmp_path / "w")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.strip() == f"sagevideo check-weights: error: {tmp_path / 'w'}: Permission denied (EACCES)"
